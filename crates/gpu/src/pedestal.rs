//! Pedestal tracking of one gain stage on the GPU (`kernels/pedestal.cu`), equal to the CPU
//! tracker `rdaq_process::pedestal::Pedestal<f64>`: the sums stay on the device, dark frames
//! are pushed, the mean comes back when it is published.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use crate::kernels::{compile, Kernels};
use crate::probe::{Device, GpuError};

/// The gain code (word bits 15..14) of each stage, as the CPU tracker's.
const STAGE_CODE: [u32; 3] = [0, 1, 3];

pub struct GpuPedestal {
    stream: Arc<CudaStream>,
    push: CudaFunction,
    mean: CudaFunction,
    sum: CudaSlice<f64>,
    sum2: CudaSlice<f64>,
    samples: CudaSlice<u32>,
    wrong: CudaSlice<u32>,
    code: u32,
    window: u32,
    pixels: usize,
    frames: u64,
}

impl GpuPedestal {
    /// Tracks gain stage `stage` (0..2) of `pixels` pixels over a window of `window` frames.
    pub fn new(dev: &Device, pixels: usize, stage: u8, window: u32) -> Result<GpuPedestal, GpuError> {
        if stage > 2 || window == 0 || i32::try_from(pixels).is_err() {
            return Err(GpuError::Input(format!("stage {stage} (0..2), window {window} (at least 1), {pixels} pixels")));
        }
        let module = compile(dev, Kernels::Pedestal)?;
        let stream = dev.ctx.default_stream();
        Ok(GpuPedestal {
            push: module.load_function("pedestal_push")?,
            mean: module.load_function("pedestal_mean")?,
            sum: stream.alloc_zeros(pixels)?,
            sum2: stream.alloc_zeros(pixels)?,
            samples: stream.alloc_zeros(pixels)?,
            wrong: stream.alloc_zeros(pixels)?,
            stream,
            code: STAGE_CODE[stage as usize],
            window,
            pixels,
            frames: 0,
        })
    }

    /// Dark frames pushed so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Adds one dark frame of raw words.
    pub fn push(&mut self, raw: &[u16]) -> Result<(), GpuError> {
        if raw.len() != self.pixels {
            return Err(GpuError::Input(format!("a frame of {} pixels for a tracker of {}", raw.len(), self.pixels)));
        }
        let d_raw = self.stream.memcpy_stod(raw)?;
        let n = self.pixels as i32;
        let mut b = self.stream.launch_builder(&self.push);
        b.arg(&d_raw).arg(&mut self.sum).arg(&mut self.sum2).arg(&mut self.samples).arg(&mut self.wrong).arg(&self.code).arg(&self.window).arg(&n);
        // SAFETY: every buffer holds n elements on the device, the parameters are pushed in
        // the kernel's order, and it touches no pixel at or beyond n.
        unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }?;
        self.frames += 1;
        Ok(())
    }

    /// The pedestal per pixel (0 where no frame of the stage arrived).
    pub fn mean(&self) -> Result<Vec<f32>, GpuError> {
        let n = self.pixels as i32;
        let mut out = self.stream.alloc_zeros::<f32>(self.pixels)?;
        let mut b = self.stream.launch_builder(&self.mean);
        b.arg(&self.sum).arg(&self.samples).arg(&mut out).arg(&n);
        // SAFETY: sum, samples and out hold n elements on the device, the parameters are
        // pushed in the kernel's order, and it touches no pixel at or beyond n.
        unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }?;
        Ok(self.stream.memcpy_dtov(&out)?)
    }

    /// Per pixel, the dark frames whose word was of another gain stage.
    pub fn wrong_gain(&self) -> Result<Vec<u32>, GpuError> {
        Ok(self.stream.memcpy_dtov(&self.wrong)?)
    }
}
