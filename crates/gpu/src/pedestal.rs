//! Pedestal tracking of one gain stage on the GPU (`kernels/pedestal.cu`), equal to the CPU
//! tracker `rdaq_process::pedestal::Pedestal<f64>`: the sums stay on the device, dark frames
//! are pushed (as an assembled image, or as a slot's module words that the device assembles),
//! the mean comes back when it is published.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, PushKernelArg};

use crate::kernels::{compile, threads_for, Kernels};
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
    /// The frame's assembled raw words on the device (taken out while it is pushed).
    raw_slot: Option<CudaSlice<u16>>,
    /// Set by [`GpuPedestal::assembling`]: the assembly kernel, the pixel map and room for
    /// one frame's module words.
    assembly: Option<Assembly>,
    code: u32,
    window: u32,
    pixels: usize,
    frames: u64,
}

struct Assembly {
    kernel: CudaFunction,
    src_of: CudaSlice<i32>,
    words: CudaSlice<u16>,
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
            raw_slot: Some(stream.alloc_zeros(pixels)?),
            assembly: None,
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

    /// Takes dark frames as module words too ([`GpuPedestal::push_words`]): `src_of` maps
    /// each image pixel to its word among a frame's `words` module words (-1: a gap).
    pub fn assembling(mut self, dev: &Device, src_of: &[i32], words: usize) -> Result<GpuPedestal, GpuError> {
        if src_of.len() != self.pixels || src_of.iter().any(|&i| i >= 0 && i as usize >= words) {
            return Err(GpuError::Input(format!("a pixel map of {} entries for {} pixels, each below {words} words", src_of.len(), self.pixels)));
        }
        let module = compile(dev, Kernels::Convert)?;
        self.assembly = Some(Assembly { kernel: module.load_function("assemble_words")?, src_of: self.stream.clone_htod(src_of)?, words: self.stream.alloc_zeros(words)? });
        Ok(self)
    }

    /// Adds one dark frame of raw words (the assembled image).
    pub fn push(&mut self, raw: &[u16]) -> Result<(), GpuError> {
        if raw.len() != self.pixels {
            return Err(GpuError::Input(format!("a frame of {} pixels for a tracker of {}", raw.len(), self.pixels)));
        }
        let dst = self.raw_slot.as_mut().expect("put back after each push");
        self.stream.memcpy_htod(raw, dst)?;
        self.launch_push()
    }

    /// Adds one dark frame given as a slot's module words: copied (straight from the slot
    /// where it is registered memory), assembled and tracked on the device. Returns once the
    /// words are no longer needed.
    pub fn push_words(&mut self, words: &[u16]) -> Result<(), GpuError> {
        let Some(a) = self.assembly.as_mut() else {
            return Err(GpuError::Input("a tracker made without a pixel map takes assembled frames".into()));
        };
        if words.len() != a.words.len() {
            return Err(GpuError::Input(format!("a frame of {} words for a tracker of {}", words.len(), a.words.len())));
        }
        self.stream.memcpy_htod(words, &mut a.words)?;
        let n = self.pixels as i32;
        let mut b = self.stream.launch_builder(&a.kernel);
        b.arg(&a.words).arg(&a.src_of).arg(self.raw_slot.as_mut().expect("put back after each push")).arg(&n);
        // SAFETY: assemble_words' parameters in order; src_of and raw hold n pixels and
        // every src_of entry is -1 or below the words' length (checked in `assembling`).
        unsafe { b.launch(threads_for(n as usize)) }?;
        self.launch_push()?;
        // the copy from the caller's memory may be asynchronous (registered memory)
        self.stream.synchronize()?;
        Ok(())
    }

    /// Adds the frame in `raw` to the sums.
    fn launch_push(&mut self) -> Result<(), GpuError> {
        let raw = std::mem::take(&mut self.raw_slot);
        let out = raw.as_ref().map_or(Ok(()), |r| self.push_device(r));
        self.raw_slot = raw;
        out
    }

    /// Adds the assembled frame `raw`, already on the device, to the sums (queued on the
    /// tracker's stream; public for timing the kernel alone).
    pub fn push_device(&mut self, raw: &CudaSlice<u16>) -> Result<(), GpuError> {
        if raw.len() != self.pixels {
            return Err(GpuError::Input(format!("a frame of {} pixels for a tracker of {}", raw.len(), self.pixels)));
        }
        let n = self.pixels as i32;
        let mut b = self.stream.launch_builder(&self.push);
        b.arg(raw).arg(&mut self.sum).arg(&mut self.sum2).arg(&mut self.samples).arg(&mut self.wrong).arg(&self.code).arg(&self.window).arg(&n);
        // SAFETY: every buffer holds n elements on the device, the parameters are pushed in
        // the kernel's order, and it touches no pixel at or beyond n.
        unsafe { b.launch(threads_for(n as usize)) }?;
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
        unsafe { b.launch(threads_for(n as usize)) }?;
        Ok(self.stream.clone_dtoh(&out)?)
    }

    /// Per pixel, the dark frames whose word was of another gain stage.
    pub fn wrong_gain(&self) -> Result<Vec<u32>, GpuError> {
        Ok(self.stream.clone_dtoh(&self.wrong)?)
    }
}
