//! JUNGFRAU conversion of an assembled image on the GPU (`kernels/convert.cu`): raw words to
//! keV, keV to photon counts. The calibration lives on the device; frames go in and out
//! through plain copies here (checks and benchmarks: the graph's path is [`crate::chain`]).

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, PushKernelArg};
use rdaq_process::{Calibration, InvalidGain};

use crate::kernels::{compile, threads_for, Kernels};
use crate::probe::{Device, GpuError};

/// The conversion kernels with one module's (or image's) calibration on the device.
pub struct GpuConverter {
    stream: Arc<CudaStream>,
    kev: CudaFunction,
    photons_i32: CudaFunction,
    pedestal: CudaSlice<f32>,
    gain: CudaSlice<f32>,
    mask: CudaSlice<u32>,
    invalid: i32,
    pixels: usize,
}

/// The three gain stages' arrays one after the other, as the kernel indexes them (3 x n).
fn planes(p: &[Vec<f32>; 3]) -> Vec<f32> {
    p.iter().flatten().copied().collect()
}

impl GpuConverter {
    /// Compiles the kernels and copies the calibration to the device.
    pub fn new(dev: &Device, cal: &Calibration, invalid: InvalidGain) -> Result<GpuConverter, GpuError> {
        let pixels = cal.mask.len();
        cal.check(pixels).map_err(|e| GpuError::Input(e.to_string()))?;
        let module = compile(dev, Kernels::Convert)?;
        let stream = dev.ctx.default_stream();
        Ok(GpuConverter {
            kev: module.load_function("jf_convert_kev")?,
            photons_i32: module.load_function("kev_to_photons_i32")?,
            pedestal: stream.clone_htod(&planes(&cal.pedestal))?,
            gain: stream.clone_htod(&planes(&cal.gain))?,
            mask: stream.clone_htod(&cal.mask)?,
            invalid: match invalid {
                InvalidGain::Error => 0,
                InvalidGain::AsG0 => 1,
                InvalidGain::AsG2 => 2,
            },
            stream,
            pixels,
        })
    }

    fn check(&self, n: usize) -> Result<i32, GpuError> {
        if n != self.pixels {
            return Err(GpuError::Input(format!("a frame of {n} pixels for a calibration of {}", self.pixels)));
        }
        i32::try_from(n).map_err(|_| GpuError::Input(format!("{n} pixels is more than one launch takes")))
    }

    /// One frame to keV on the device; the result stays there.
    pub fn kev_on_device(&self, raw: &[u16]) -> Result<CudaSlice<f32>, GpuError> {
        let d_raw = self.stream.clone_htod(raw)?;
        let mut out = self.stream.alloc_zeros::<f32>(raw.len())?;
        self.launch_kev(&self.stream, &d_raw, &mut out)?;
        Ok(out)
    }

    /// Queues the conversion of the device frame `raw` into `out` on `stream` (cudarc makes
    /// the stream wait for the buffers' earlier work on other streams).
    pub fn launch_kev(&self, stream: &Arc<CudaStream>, raw: &CudaSlice<u16>, out: &mut CudaSlice<f32>) -> Result<(), GpuError> {
        let n = self.check(raw.len())?;
        if out.len() != raw.len() {
            return Err(GpuError::Input(format!("{} pixels out for {} in", out.len(), raw.len())));
        }
        let mut b = stream.launch_builder(&self.kev);
        b.arg(raw).arg(&self.pedestal).arg(&self.gain).arg(&self.mask).arg(&self.invalid).arg(out).arg(&n);
        // SAFETY: the kernel's parameters are, in order, the device buffers and values pushed
        // above (raw, mask and out of n pixels, pedestal and gain of 3n), and it touches no
        // pixel at or beyond n.
        unsafe { b.launch(threads_for(n as usize)) }?;
        Ok(())
    }

    /// One frame to keV, back in host memory.
    pub fn to_kev(&self, raw: &[u16]) -> Result<Vec<f32>, GpuError> {
        let d = self.kev_on_device(raw)?;
        Ok(self.stream.clone_dtoh(&d)?)
    }

    /// One frame to photon counts (int32) for photons of `photon_kev`.
    pub fn to_photons(&self, raw: &[u16], photon_kev: f32) -> Result<Vec<i32>, GpuError> {
        let kev = self.kev_on_device(raw)?;
        let n = self.check(raw.len())?;
        let mut out = self.stream.alloc_zeros::<i32>(raw.len())?;
        let mut b = self.stream.launch_builder(&self.photons_i32);
        b.arg(&kev).arg(&photon_kev).arg(&mut out).arg(&n);
        // SAFETY: kev and out hold n elements on the device, the kernel's parameters are the
        // values pushed above in order, and it touches no element at or beyond n.
        unsafe { b.launch(threads_for(n as usize)) }?;
        Ok(self.stream.clone_dtoh(&out)?)
    }
}
