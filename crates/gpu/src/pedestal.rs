//! Pedestal tracking of one gain stage on the GPU (`kernels/pedestal.cu`), equal to the CPU
//! tracker `rdaq_process::pedestal::Pedestal<f64>`: the sums stay on the device, dark frames
//! are pushed (as an assembled image, or as a slot's module words that the device assembles),
//! the mean comes back when it is published.
//!
//! Dark frames of module words may be queued several at once ([`GpuPedestal::submit_words`]):
//! their copies wait in the copy engine behind the frame lanes' copies, so a tracker that
//! waited for each frame would track far fewer dark frames per second than the device can.

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtrMut, PushKernelArg};

use crate::kernels::{check_pixel_map, compile, threads_for, Kernels};
use crate::probe::{Device, GpuError};

/// The gain code (word bits 15..14) of each stage, as the CPU tracker's.
const STAGE_CODE: [u32; 3] = [0, 1, 3];

pub struct GpuPedestal {
    stream: Arc<CudaStream>,
    mean: CudaFunction,
    sums: Sums,
    /// The frame's assembled raw words on the device.
    raw: CudaSlice<u16>,
    /// Set by [`GpuPedestal::assembling`]: the assembly kernel, the pixel map and room for
    /// one frame's module words.
    assembly: Option<Assembly>,
    pixels: usize,
    /// Frames of module words whose copy may not be done yet, oldest first: each an event
    /// recorded after its copy, an index into `events`.
    copying: VecDeque<usize>,
    events: Vec<CudaEvent>,
}

/// A G0 pedestal the tracker computed, complete and left on the device, so that frame
/// lanes take it there instead of each copying it from the host.
#[derive(Clone)]
pub struct DevicePedestal(pub(crate) Arc<CudaSlice<f32>>);

impl DevicePedestal {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
}

/// Dark frames of module words queued on the device at most ([`GpuPedestal::submit_words`]).
pub const DARK_IN_FLIGHT: usize = 8;

/// The tracked window's sums on the device and the kernel that adds a frame to them.
struct Sums {
    push: CudaFunction,
    sum: CudaSlice<f64>,
    sum2: CudaSlice<f64>,
    samples: CudaSlice<u32>,
    wrong: CudaSlice<u32>,
    code: u32,
    window: u32,
    frames: u64,
}

impl Sums {
    /// Queues the addition of the assembled frame `raw` (as many pixels as the sums).
    fn push(&mut self, stream: &CudaStream, raw: &CudaSlice<u16>) -> Result<(), GpuError> {
        if raw.len() != self.sum.len() {
            return Err(GpuError::Input(format!("a frame of {} pixels for a tracker of {}", raw.len(), self.sum.len())));
        }
        let n = self.sum.len() as i32;
        let mut b = stream.launch_builder(&self.push);
        b.arg(raw).arg(&mut self.sum).arg(&mut self.sum2).arg(&mut self.samples).arg(&mut self.wrong).arg(&self.code).arg(&self.window).arg(&n);
        // SAFETY: every buffer holds n elements on the device, the parameters are pushed in
        // the kernel's order, and it touches no pixel at or beyond n.
        unsafe { b.launch(threads_for(n as usize)) }?;
        self.frames += 1;
        Ok(())
    }
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
        // a stream of its own: the frame lanes' work neither waits for it nor it for theirs
        let stream = dev.ctx.new_stream()?;
        let sums = Sums {
            push: module.load_function("pedestal_push")?,
            sum: stream.alloc_zeros(pixels)?,
            sum2: stream.alloc_zeros(pixels)?,
            samples: stream.alloc_zeros(pixels)?,
            wrong: stream.alloc_zeros(pixels)?,
            code: STAGE_CODE[stage as usize],
            window,
            frames: 0,
        };
        let events = (0..DARK_IN_FLIGHT).map(|_| dev.ctx.new_event(None)).collect::<Result<_, _>>()?;
        let raw = stream.alloc_zeros(pixels)?;
        Ok(GpuPedestal { mean: module.load_function("pedestal_mean")?, sums, raw, assembly: None, stream, pixels, copying: VecDeque::new(), events })
    }

    /// Dark frames pushed so far.
    pub fn frames(&self) -> u64 {
        self.sums.frames
    }

    /// Takes dark frames as module words too ([`GpuPedestal::push_words`]): `src_of` maps
    /// each image pixel to its word among a frame's `words` module words (-1: a gap).
    pub fn assembling(mut self, dev: &Device, src_of: &[i32], words: usize) -> Result<GpuPedestal, GpuError> {
        check_pixel_map(src_of, self.pixels, words)?;
        let module = compile(dev, Kernels::Convert)?;
        self.assembly = Some(Assembly { kernel: module.load_function("assemble_words")?, src_of: self.stream.clone_htod(src_of)?, words: self.stream.alloc_zeros(words)? });
        Ok(self)
    }

    /// Adds one dark frame of raw words (the assembled image).
    pub fn push(&mut self, raw: &[u16]) -> Result<(), GpuError> {
        if raw.len() != self.pixels {
            return Err(GpuError::Input(format!("a frame of {} pixels for a tracker of {}", raw.len(), self.pixels)));
        }
        self.stream.memcpy_htod(raw, &mut self.raw)?;
        self.sums.push(&self.stream, &self.raw)
    }

    /// Adds one dark frame given as a slot's module words: copied (straight from the slot
    /// where it is registered memory), assembled and tracked on the device. Returns once the
    /// words are no longer needed.
    pub fn push_words(&mut self, words: &[u16]) -> Result<(), GpuError> {
        // SAFETY: the words are borrowed until this returns, after their copy is done.
        unsafe { self.submit_words(words) }?;
        self.reading(0).map(|_| ())
    }

    /// Queues one dark frame given as a slot's module words (copied straight from the slot
    /// where it is registered memory, assembled and tracked on the device) and returns;
    /// first waits while [`DARK_IN_FLIGHT`] frames are still being copied. Frames are
    /// tracked in the order submitted.
    ///
    /// # Safety
    /// The device reads `words` after this returns: the caller keeps them alive and
    /// unwritten until [`GpuPedestal::reading`] no longer counts this frame or the tracker is
    /// dropped (which waits for its stream).
    pub unsafe fn submit_words(&mut self, words: &[u16]) -> Result<(), GpuError> {
        let Some(a) = self.assembly.as_mut() else {
            return Err(GpuError::Input("a tracker made without a pixel map takes assembled frames".into()));
        };
        if words.len() != a.words.len() {
            return Err(GpuError::Input(format!("a frame of {} words for a tracker of {}", words.len(), a.words.len())));
        }
        let s = self.stream.clone();
        // the raw copy below does not make the context current on this thread itself
        s.context().bind_to_thread()?;
        {
            let (dst, _written) = a.words.device_ptr_mut(&s);
            // SAFETY: `dst` holds as many words as `words`; the caller keeps `words` valid
            // until the copy is known to be done (this function's contract). The copy of a
            // later frame into the same device words is queued after this frame's assembly
            // on the same stream.
            unsafe { cudarc::driver::result::memcpy_htod_async(dst, words, s.cu_stream()) }?;
        }
        self.copied()?;
        let n = self.pixels as i32;
        let a = self.assembly.as_ref().expect("checked above");
        let mut b = s.launch_builder(&a.kernel);
        b.arg(&a.words).arg(&a.src_of).arg(&mut self.raw).arg(&n);
        // SAFETY: assemble_words' parameters in order; src_of and raw hold n pixels and
        // every src_of entry is -1 or below the words' length (checked in `assembling`).
        unsafe { b.launch(threads_for(n as usize)) }?;
        self.sums.push(&s, &self.raw)
    }

    /// Records that the frame just queued has been copied once the stream gets here, after
    /// making room among the events.
    fn copied(&mut self) -> Result<(), GpuError> {
        self.reading(DARK_IN_FLIGHT - 1)?;
        let next = self.copying.back().map_or(0, |&i| (i + 1) % DARK_IN_FLIGHT);
        self.events[next].record(&self.stream)?;
        self.copying.push_back(next);
        Ok(())
    }

    /// Waits until at most `keep` of the frames submitted are still being copied from the
    /// caller's memory; returns how many are (the last ones submitted).
    pub fn reading(&mut self, keep: usize) -> Result<usize, GpuError> {
        while let Some(&oldest) = self.copying.front() {
            if self.copying.len() > keep {
                self.events[oldest].synchronize()?;
            } else if !self.events[oldest].try_is_complete()? {
                break;
            }
            self.copying.pop_front();
        }
        Ok(self.copying.len())
    }

    /// Adds the assembled frame `raw`, already on the device, to the sums (queued on the
    /// tracker's stream; public for timing the kernel alone).
    pub fn push_device(&mut self, raw: &CudaSlice<u16>) -> Result<(), GpuError> {
        self.sums.push(&self.stream, raw)
    }

    /// The pedestal per pixel (0 where no frame of the stage arrived).
    pub fn mean(&self) -> Result<Vec<f32>, GpuError> {
        let mut out = vec![0f32; self.pixels];
        self.mean_into(&mut out)?;
        Ok(out)
    }

    /// [`GpuPedestal::mean`] into `out` (one image long), and the same values left on the
    /// device for frame lanes to take there ([`crate::Lane::set_pedestal_device`]).
    pub fn mean_into(&self, out: &mut [f32]) -> Result<DevicePedestal, GpuError> {
        if out.len() != self.pixels {
            return Err(GpuError::Input(format!("{} pixels out for a tracker of {}", out.len(), self.pixels)));
        }
        let n = self.pixels as i32;
        let mut mean = self.stream.alloc_zeros::<f32>(self.pixels)?;
        let mut b = self.stream.launch_builder(&self.mean);
        b.arg(&self.sums.sum).arg(&self.sums.samples).arg(&mut mean).arg(&n);
        // SAFETY: sum, samples and mean hold n elements on the device, the parameters are
        // pushed in the kernel's order, and it touches no pixel at or beyond n.
        unsafe { b.launch(threads_for(n as usize)) }?;
        self.stream.memcpy_dtoh(&mean, out)?;
        // `out` may be registered memory, written asynchronously; and once the copy is done,
        // so is the kernel whose values the lanes take
        self.stream.synchronize()?;
        Ok(DevicePedestal(Arc::new(mean)))
    }

    /// Per pixel, the dark frames whose word was of another gain stage.
    pub fn wrong_gain(&self) -> Result<Vec<u32>, GpuError> {
        Ok(self.stream.clone_dtoh(&self.sums.wrong)?)
    }
}

impl Drop for GpuPedestal {
    /// Waits for the copies still reading the callers' memory ([`GpuPedestal::submit_words`]).
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}
