//! Local-SNR spot finding on the GPU (`kernels/spots.cu`): the strong pixels are found on
//! the device by the CPU finder's rule, with its sums formed in its order; grouping them
//! into spots runs on the host with the CPU finder's own code
//! ([`rdaq_process::spots::LocalSnr::group_strong`]), so the spots are the CPU's by
//! construction once the strong pixels are. Which side should group is to be measured.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, PushKernelArg};
use rdaq_process::spots::{LocalSnr, LocalSnrParams, Spot};

use crate::kernels::{compile, per_column, threads_for, Kernels};
use crate::probe::{Device, GpuError};

pub struct GpuLocalSnr {
    stream: Arc<CudaStream>,
    colsum: CudaFunction,
    strong: CudaFunction,
    host: LocalSnr,
    p: LocalSnrParams,
    list: Vec<u32>,
}

impl GpuLocalSnr {
    pub fn new(dev: &Device, p: LocalSnrParams) -> Result<GpuLocalSnr, GpuError> {
        let module = compile(dev, Kernels::Spots)?;
        Ok(GpuLocalSnr {
            stream: dev.ctx.default_stream(),
            colsum: module.load_function("colsum_running")?,
            strong: module.load_function("strong_pixels")?,
            host: LocalSnr::new(p),
            p,
            list: Vec::new(),
        })
    }

    /// The strong pixels of a row-major `height x width` image, as row-major indices.
    pub fn strong_pixels(&mut self, image: &[f32], width: usize, height: usize) -> Result<&[u32], GpuError> {
        let px = width * height;
        if image.len() != px || px == 0 {
            return Err(GpuError::Input(format!("an image of {} values for {width} x {height}", image.len())));
        }
        let to_i32 = |x: usize| i32::try_from(x).map_err(|_| GpuError::Input(format!("{x} is more than one launch takes")));
        let (w, h, n) = (to_i32(width)?, to_i32(height)?, to_i32(self.p.box_half)?);
        to_i32(px)?;
        let d_image = self.stream.clone_htod(image)?;
        let mut sum = self.stream.alloc_zeros::<f64>(px)?;
        let mut sum2 = self.stream.alloc_zeros::<f64>(px)?;
        let mut cnt = self.stream.alloc_zeros::<u32>(px)?;
        let mut b = self.stream.launch_builder(&self.colsum);
        b.arg(&d_image).arg(&w).arg(&h).arg(&n).arg(&mut sum).arg(&mut sum2).arg(&mut cnt);
        // SAFETY: the image and the three sum arrays hold width x height elements on the
        // device, the parameters are pushed in the kernel's order, and thread c touches
        // column c < width only.
        unsafe { b.launch(per_column(width as u32)) }?;
        let mut flags = self.stream.alloc_zeros::<u8>(px)?;
        let snr2 = (self.p.snr as f64) * (self.p.snr as f64);
        let mut b = self.stream.launch_builder(&self.strong);
        b.arg(&d_image).arg(&w).arg(&h).arg(&n).arg(&self.p.threshold).arg(&snr2).arg(&sum).arg(&sum2).arg(&cnt).arg(&mut flags);
        // SAFETY: as above, and flags holds width x height bytes; thread p touches pixel
        // p < width x height and reads the sums of its own row.
        unsafe { b.launch(threads_for(px)) }?;
        let flags = self.stream.clone_dtoh(&flags)?;
        self.list.clear();
        self.list.extend(flags.iter().enumerate().filter(|(_, &f)| f != 0).map(|(i, _)| i as u32));
        Ok(&self.list)
    }

    /// The spots of the image (`spots` cleared first), as the CPU finder finds them.
    pub fn find(&mut self, image: &[f32], width: usize, height: usize, spots: &mut Vec<Spot>) -> Result<(), GpuError> {
        self.strong_pixels(image, width, height)?;
        self.host.group_strong(image, width, &self.list, spots);
        Ok(())
    }
}
