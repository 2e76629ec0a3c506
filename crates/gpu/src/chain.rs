//! The GPU chain of the processing graph, built for throughput: a frame goes to the device as
//! the module words of its receiver slot (one copy, straight from the slot when the ring is
//! registered, [`crate::HostRegistration`]), is assembled and converted to keV in one kernel,
//! and its strong pixels are found there; only their list comes back, and for the frames that
//! are kept their photon counts, bitshuffled there for the chunk ([`Lane::photons_into`]), or
//! their keV image ([`Lane::image_into`]). Each [`Lane`] holds one frame's device
//! buffers and its own stream: with several lanes, frames are copied, converted and searched
//! at once, and the host queues a frame without waiting for the last.
//!
//! The results equal the CPU stages' bit for bit: the kernels are `jf_assemble_kev`
//! (`kernels/convert.cu`), the local-SNR column sums `colsum_running` and the strong pixels
//! listed in image order (`strong_flags`, `row_offsets`, `strong_compact` in
//! `kernels/spots.cu`); the host groups them with the CPU finder's own code.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtrMut, LaunchConfig, PinnedHostSlice, PushKernelArg};
use rdaq_process::spots::LocalSnrParams;
use rdaq_process::{Calibration, InvalidGain};

use crate::kernels::{check_pixel_map, compile, per_column, threads_for, Kernels};
use crate::pedestal::DevicePedestal;
use crate::probe::{Device, GpuError};

/// Strong pixels that come back with the frame's count, without a second copy (512 KiB;
/// the emulated detector's 4M frames have ~40,000, most of them single photons).
const LISTED_AT_ONCE: usize = 65536;

/// What the chain is made for: the image, where its pixels lie in a frame's module words,
/// its calibration and the spot finder's settings.
pub struct ChainSetup<'a> {
    pub width: usize,
    pub height: usize,
    /// Module words of one frame (modules x module pixels, as a slot holds them).
    pub words: usize,
    /// For each image pixel (row-major), the index of its word among the frame's module
    /// words, or -1 for a gap pixel.
    pub src_of: &'a [i32],
    pub calibration: &'a Calibration,
    pub invalid: InvalidGain,
    pub finder: LocalSnrParams,
}

/// What every lane reads and none writes: the kernels, the pixel map and the calibration
/// but the tracked G0 pedestal (each lane holds its own copy of that).
struct Shared {
    assemble_kev: CudaFunction,
    colsum: CudaFunction,
    flags: CudaFunction,
    offsets: CudaFunction,
    compact: CudaFunction,
    photons_i16: CudaFunction,
    photons_i32: CudaFunction,
    shuffle: CudaFunction,
    src_of: CudaSlice<i32>,
    ped12: CudaSlice<f32>,
    gain: CudaSlice<f32>,
    mask: CudaSlice<u32>,
    invalid: i32,
    width: i32,
    height: i32,
    pixels: usize,
    words: usize,
    box_half: i32,
    threshold: f32,
    snr2: f64,
    /// The most strong pixels a frame may have before the chain refuses its list.
    cap: usize,
}

/// How a frame's strong pixels came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// All of them, this many.
    Listed(usize),
    /// More than the chain lists (this many): the caller finds the spots on the keV image.
    TooMany(usize),
}

fn to_i32(what: &str, x: usize) -> Result<i32, GpuError> {
    i32::try_from(x).map_err(|_| GpuError::Input(format!("{what} {x} is more than one launch takes")))
}

/// The lanes of a chain for `setup`, `lanes` of them (at least one).
pub fn lanes(dev: &Device, setup: &ChainSetup, lanes: usize) -> Result<Vec<Lane>, GpuError> {
    let shared = Arc::new(shared(dev, setup)?);
    let ped0 = &setup.calibration.pedestal[0];
    (0..lanes.max(1)).map(|_| Lane::new(dev, shared.clone(), ped0)).collect()
}

fn shared(dev: &Device, s: &ChainSetup) -> Result<Shared, GpuError> {
    let pixels = s.width * s.height;
    let cal = s.calibration;
    cal.check(pixels).map_err(|e| GpuError::Input(e.to_string()))?;
    check_pixel_map(s.src_of, pixels, s.words)?;
    to_i32("an image of pixels", pixels)?;
    let convert = compile(dev, Kernels::Convert)?;
    let spots = compile(dev, Kernels::Spots)?;
    let stream = dev.ctx.default_stream();
    let ped12: Vec<f32> = cal.pedestal[1].iter().chain(&cal.pedestal[2]).copied().collect();
    let gain: Vec<f32> = cal.gain.iter().flatten().copied().collect();
    let shared = Shared {
        assemble_kev: convert.load_function("jf_assemble_kev")?,
        colsum: spots.load_function("colsum_running")?,
        flags: spots.load_function("strong_flags")?,
        offsets: spots.load_function("row_offsets")?,
        compact: spots.load_function("strong_compact")?,
        photons_i16: convert.load_function("kev_to_photons_i16")?,
        photons_i32: convert.load_function("kev_to_photons_i32")?,
        shuffle: compile(dev, Kernels::Bitshuffle)?.load_function("bitshuffle_blocks")?,
        src_of: stream.clone_htod(s.src_of)?,
        ped12: stream.clone_htod(&ped12)?,
        gain: stream.clone_htod(&gain)?,
        mask: stream.clone_htod(&cal.mask)?,
        invalid: match s.invalid {
            InvalidGain::Error => 0,
            InvalidGain::AsG0 => 1,
            InvalidGain::AsG2 => 2,
        },
        width: to_i32("a width", s.width)?,
        height: to_i32("a height", s.height)?,
        pixels,
        words: s.words,
        box_half: to_i32("a box", s.finder.box_half)?,
        threshold: s.finder.threshold,
        snr2: s.finder.snr as f64 * s.finder.snr as f64,
        cap: (pixels / 16).max(LISTED_AT_ONCE),
    };
    stream.synchronize()?;
    Ok(shared)
}

/// A lane as the graph drives it: the device's [`Lane`], or [`crate::standin::CpuLane`],
/// which does the same work on the CPU at the same moments (the graph's scheduling is
/// tested with it on machines without a GPU).
pub trait FrameLane: Send {
    /// Takes the tracked G0 pedestal of `generation` unless the lane already has it.
    fn set_pedestal(&mut self, g0: &[f32], generation: u64) -> Result<(), GpuError>;
    /// [`FrameLane::set_pedestal`] from a pedestal the device's tracker left there.
    fn set_pedestal_device(&mut self, g0: &DevicePedestal, generation: u64) -> Result<(), GpuError>;
    /// The generation of the pedestal the lane converts with (0: the calibration's own).
    fn pedestal_generation(&self) -> u64;
    /// Queues one frame's module words and returns at once.
    ///
    /// # Safety
    /// The lane reads `words` after this returns: the caller keeps them alive and unwritten
    /// until [`FrameLane::strong_pixels`] has returned `Ok` for this frame or the lane is
    /// dropped.
    unsafe fn submit(&mut self, words: &[u16]) -> Result<(), GpuError>;
    /// Waits for the frame and puts its strong pixels, `(index, keV)` ascending by index,
    /// into `out` (cleared first).
    fn strong_pixels(&mut self, out: &mut Vec<(u32, f32)>) -> Result<Found, GpuError>;
    /// The frame's keV image into `out` (one image long).
    fn image_into(&mut self, out: &mut [f32]) -> Result<(), GpuError>;
    /// The frame's photon counts into `out` (one image long), as
    /// [`rdaq_process::kev_to_photons`] makes them for photons of `photon_kev`; with
    /// `shuffle`, their bytes transposed in blocks of that many elements, as
    /// [`rdaq_process::bitshuffle::shuffle_blocks`] lays them out (what a chunk compresses).
    fn photons_into(&mut self, photon_kev: f32, shuffle: Option<usize>, out: Counts<'_>) -> Result<(), GpuError>;
}

/// Where a frame's photon counts go: the file's pixel type.
pub enum Counts<'a> {
    I16(&'a mut [i16]),
    I32(&'a mut [i32]),
}

impl Counts<'_> {
    pub fn len(&self) -> usize {
        match self {
            Counts::I16(c) => c.len(),
            Counts::I32(c) => c.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl FrameLane for Lane {
    fn set_pedestal(&mut self, g0: &[f32], generation: u64) -> Result<(), GpuError> {
        Lane::set_pedestal(self, g0, generation)
    }

    fn set_pedestal_device(&mut self, g0: &DevicePedestal, generation: u64) -> Result<(), GpuError> {
        Lane::set_pedestal_device(self, g0, generation)
    }

    fn pedestal_generation(&self) -> u64 {
        self.pedestal_generation
    }

    unsafe fn submit(&mut self, words: &[u16]) -> Result<(), GpuError> {
        // SAFETY: the same contract, passed on
        unsafe { Lane::submit(self, words) }
    }

    fn strong_pixels(&mut self, out: &mut Vec<(u32, f32)>) -> Result<Found, GpuError> {
        Lane::strong_pixels(self, out)
    }

    fn image_into(&mut self, out: &mut [f32]) -> Result<(), GpuError> {
        Lane::image_into(self, out)
    }

    fn photons_into(&mut self, photon_kev: f32, shuffle: Option<usize>, out: Counts<'_>) -> Result<(), GpuError> {
        Lane::photons_into(self, photon_kev, shuffle, out)
    }
}

/// One frame in flight: its device buffers, its stream, and the pinned host memory its
/// strong pixels come back to.
pub struct Lane {
    shared: Arc<Shared>,
    stream: Arc<CudaStream>,
    words: CudaSlice<u16>,
    ped0: CudaSlice<f32>,
    /// The device pedestal `ped0` was last copied from, kept while the copy may run.
    ped0_from: Option<DevicePedestal>,
    pedestal_generation: u64,
    kev: CudaSlice<f32>,
    sum: CudaSlice<f64>,
    sum2: CudaSlice<f64>,
    cnt: CudaSlice<u32>,
    flags: CudaSlice<u8>,
    row_count: CudaSlice<u32>,
    /// Each row's first place in the list; the last entry is the count.
    row_off: CudaSlice<u32>,
    index: CudaSlice<u32>,
    value: CudaSlice<f32>,
    host_count: PinnedHostSlice<u32>,
    host_index: PinnedHostSlice<u32>,
    host_value: PinnedHostSlice<f32>,
    /// The frame's photon counts and their transposition, made when asked for (the file's
    /// type only).
    counts16: Option<[CudaSlice<i16>; 2]>,
    counts32: Option<[CudaSlice<i32>; 2]>,
}

/// Pinned host memory that the host reads (not write-combined, which is slow to read),
/// zeroed.
fn pinned<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(dev: &Device, n: usize) -> Result<PinnedHostSlice<T>, GpuError> {
    // SAFETY: the memory is zeroed below before anything reads it.
    let mut p = unsafe { dev.ctx.alloc_pinned_with_flags::<T>(n, 0) }?;
    // SAFETY: the pointer is to the `n` elements just allocated, and all-zero bytes are a
    // valid T (ValidAsZeroBits).
    unsafe { std::ptr::write_bytes(p.as_mut_ptr()?, 0, n) };
    Ok(p)
}

impl Lane {
    fn new(dev: &Device, shared: Arc<Shared>, ped0: &[f32]) -> Result<Lane, GpuError> {
        let stream = dev.ctx.new_stream()?;
        let px = shared.pixels;
        let lane = Lane {
            words: stream.alloc_zeros(shared.words)?,
            ped0: stream.clone_htod(ped0)?,
            ped0_from: None,
            pedestal_generation: 0,
            kev: stream.alloc_zeros(px)?,
            sum: stream.alloc_zeros(px)?,
            sum2: stream.alloc_zeros(px)?,
            cnt: stream.alloc_zeros(px)?,
            flags: stream.alloc_zeros(px)?,
            row_count: stream.alloc_zeros(shared.height as usize)?,
            row_off: stream.alloc_zeros(shared.height as usize + 1)?,
            index: stream.alloc_zeros(shared.cap)?,
            value: stream.alloc_zeros(shared.cap)?,
            host_count: pinned(dev, 1)?,
            host_index: pinned(dev, LISTED_AT_ONCE)?,
            host_value: pinned(dev, LISTED_AT_ONCE)?,
            counts16: None,
            counts32: None,
            shared,
            stream,
        };
        lane.stream.synchronize()?;
        Ok(lane)
    }

    /// Takes the tracked G0 pedestal of `generation` unless the lane already has it (a
    /// blocking copy: the lane holds no frame when it is given one).
    pub fn set_pedestal(&mut self, g0: &[f32], generation: u64) -> Result<(), GpuError> {
        if !self.takes_pedestal(g0.len(), generation)? {
            return Ok(());
        }
        self.stream.memcpy_htod(g0, &mut self.ped0)?;
        self.stream.synchronize()?;
        (self.pedestal_generation, self.ped0_from) = (generation, None);
        Ok(())
    }

    /// [`Lane::set_pedestal`] from a pedestal on the device: a copy there, queued before the
    /// lane's next frame (the lane keeps the source until it takes another).
    pub fn set_pedestal_device(&mut self, g0: &DevicePedestal, generation: u64) -> Result<(), GpuError> {
        if !self.takes_pedestal(g0.len(), generation)? {
            return Ok(());
        }
        self.stream.memcpy_dtod(&*g0.0, &mut self.ped0)?;
        (self.pedestal_generation, self.ped0_from) = (generation, Some(g0.clone()));
        Ok(())
    }

    /// Whether a pedestal of `generation` and `pixels` is new to the lane; an error when it
    /// is not the image's size.
    fn takes_pedestal(&self, pixels: usize, generation: u64) -> Result<bool, GpuError> {
        if generation == self.pedestal_generation {
            return Ok(false);
        }
        if pixels != self.shared.pixels {
            return Err(GpuError::Input(format!("a pedestal of {pixels} pixels for an image of {}", self.shared.pixels)));
        }
        Ok(true)
    }

    /// Queues one frame: its module words to the device, assembly and conversion, the
    /// strong pixels, and their list back to the host. Returns at once.
    ///
    /// # Safety
    /// The device reads `words` after this returns: the caller keeps them alive and
    /// unwritten until [`Lane::strong_pixels`] has returned `Ok` for this frame or the lane
    /// is dropped (which waits for its stream).
    pub unsafe fn submit(&mut self, words: &[u16]) -> Result<(), GpuError> {
        let sh = self.shared.clone();
        if words.len() != sh.words {
            return Err(GpuError::Input(format!("a frame of {} words for a chain of {}", words.len(), sh.words)));
        }
        let s = self.stream.clone();
        // the raw copy below does not make the context current on this thread itself
        s.context().bind_to_thread()?;
        {
            let (dst, _written) = self.words.device_ptr_mut(&s);
            // SAFETY: `dst` holds `sh.words` words, as many as `words`; the caller keeps
            // `words` valid until the copy is known to be done (this function's contract).
            unsafe { cudarc::driver::result::memcpy_htod_async(dst, words, s.cu_stream()) }?;
        }
        self.launch_convert()?;
        self.launch_spots()?;
        let s = &self.stream;
        let listed = LISTED_AT_ONCE.min(sh.cap);
        let rows = sh.height as usize;
        s.memcpy_dtoh(&self.row_off.slice(rows..rows + 1), &mut self.host_count)?;
        s.memcpy_dtoh(&self.index.slice(0..listed), &mut self.host_index)?;
        s.memcpy_dtoh(&self.value.slice(0..listed), &mut self.host_value)?;
        Ok(())
    }

    /// Queues the assembly and conversion of the words on the device into the keV image
    /// (public for timing the kernel alone).
    pub fn launch_convert(&mut self) -> Result<(), GpuError> {
        let (sh, s) = (&self.shared, &self.stream);
        let n = sh.pixels as i32;
        let mut b = s.launch_builder(&sh.assemble_kev);
        b.arg(&self.words).arg(&sh.src_of).arg(&self.ped0).arg(&sh.ped12).arg(&sh.gain).arg(&sh.mask).arg(&sh.invalid).arg(&mut self.kev).arg(&n);
        // SAFETY: the parameters are jf_assemble_kev's, in order; src_of, ped0, mask and
        // kev hold n pixels, ped12 2n, gain 3n, and every src_of entry is -1 or below the
        // words' length (checked when the chain was made); no thread touches a pixel >= n.
        unsafe { b.launch(threads_for(sh.pixels)) }?;
        Ok(())
    }

    /// Queues the strong-pixel search on the keV image: the running column sums, then the
    /// strong pixels listed in image order (public for timing the kernels alone).
    pub fn launch_spots(&mut self) -> Result<(), GpuError> {
        self.launch_colsum()?;
        self.launch_strong_list()
    }

    /// Queues the running column sums of the local-SNR test (public for timing).
    pub fn launch_colsum(&mut self) -> Result<(), GpuError> {
        let (sh, s) = (&self.shared, &self.stream);
        let mut b = s.launch_builder(&sh.colsum);
        b.arg(&self.kev).arg(&sh.width).arg(&sh.height).arg(&sh.box_half).arg(&mut self.sum).arg(&mut self.sum2).arg(&mut self.cnt);
        // SAFETY: colsum_running's parameters in order; kev and the sums hold width x
        // height values and thread c touches column c < width only.
        unsafe { b.launch(per_column(sh.width as u32)) }?;
        Ok(())
    }

    /// Queues the strong pixels marked and counted per row, the rows' places, and the list
    /// in image order (public for timing).
    pub fn launch_strong_list(&mut self) -> Result<(), GpuError> {
        let (sh, s) = (&self.shared, &self.stream);
        s.memset_zeros(&mut self.row_count)?;
        let mut b = s.launch_builder(&sh.flags);
        b.arg(&self.kev).arg(&sh.width).arg(&sh.height).arg(&sh.box_half).arg(&sh.threshold).arg(&sh.snr2);
        b.arg(&self.sum).arg(&self.sum2).arg(&self.cnt).arg(&mut self.flags).arg(&mut self.row_count);
        // SAFETY: strong_flags' parameters in order; thread p reads pixel p < width x height
        // and the sums of its row, writes flags[p] and counts into its row's entry.
        unsafe { b.launch(threads_for(sh.pixels)) }?;
        let mut b = s.launch_builder(&sh.offsets);
        b.arg(&self.row_count).arg(&sh.height).arg(&mut self.row_off);
        // SAFETY: row_offsets' parameters in order, one block of 1024 threads (its shared
        // array's size); it reads `height` counts and writes height + 1 offsets.
        unsafe { b.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 }) }?;
        let cap = sh.cap as u32;
        let mut b = s.launch_builder(&sh.compact);
        b.arg(&self.kev).arg(&self.flags).arg(&sh.width).arg(&self.row_off).arg(&mut self.index).arg(&mut self.value).arg(&cap);
        // SAFETY: strong_compact's parameters in order, one block of 256 threads (a whole
        // number of warps, as its ballots need) per row; block r reads row r and writes list
        // entries below cap, the lists' length.
        unsafe { b.launch(LaunchConfig { grid_dim: (sh.height as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }) }?;
        Ok(())
    }

    /// Waits for the frame last submitted and puts its strong pixels, `(index, keV)`
    /// ascending by index, into `out` (cleared first).
    pub fn strong_pixels(&mut self, out: &mut Vec<(u32, f32)>) -> Result<Found, GpuError> {
        out.clear();
        // the whole frame's work is done once its stream is (which also covers a context
        // that records no events, having one stream)
        self.stream.synchronize()?;
        let n = self.host_count.as_slice()?[0] as usize;
        let (index, value) = (self.host_index.as_slice()?, self.host_value.as_slice()?);
        if n > self.shared.cap {
            return Ok(Found::TooMany(n));
        }
        let first = n.min(LISTED_AT_ONCE);
        out.extend(index[..first].iter().copied().zip(value[..first].iter().copied()));
        if n > first {
            // a frame with many strong pixels: the rest in a second (blocking) copy
            let rest_index = self.stream.clone_dtoh(&self.index.slice(first..n))?;
            let rest_value = self.stream.clone_dtoh(&self.value.slice(first..n))?;
            out.extend(rest_index.into_iter().zip(rest_value));
        }
        Ok(Found::Listed(n))
    }

    /// The frame's keV image into `out` (one image long), waiting for the copy. Fastest into
    /// registered memory.
    pub fn image_into(&mut self, out: &mut [f32]) -> Result<(), GpuError> {
        if out.len() != self.shared.pixels {
            return Err(GpuError::Input(format!("{} pixels out for an image of {}", out.len(), self.shared.pixels)));
        }
        self.stream.memcpy_dtoh(&self.kev, out)?;
        // registered (page-locked) memory is written asynchronously: wait for it
        self.stream.synchronize()?;
        Ok(())
    }

    /// The frame's photon counts into `out` (one image long), converted from the keV image
    /// on the device with the CPU's arithmetic (`kernels/convert.cu`); with `shuffle`, their
    /// bytes transposed there in blocks of that many elements (`kernels/bitshuffle.cu`), so
    /// that the host only compresses them. A kept frame's file pixels come back in half
    /// (int16) or the same (int32) bytes as its keV image. Fastest into registered memory.
    pub fn photons_into(&mut self, photon_kev: f32, shuffle: Option<usize>, out: Counts<'_>) -> Result<(), GpuError> {
        if out.len() != self.shared.pixels {
            return Err(GpuError::Input(format!("{} counts out for an image of {}", out.len(), self.shared.pixels)));
        }
        if shuffle.is_some_and(|b| b == 0 || !b.is_multiple_of(8)) {
            return Err(GpuError::Input(format!("bitshuffle blocks of {shuffle:?} elements (a multiple of 8)")));
        }
        let (sh, stream, kev) = (&self.shared, &self.stream, &self.kev);
        let shuffle = shuffle.map(|b| (&sh.shuffle, b));
        match out {
            Counts::I16(out) => Photons { stream, photons: &sh.photons_i16, shuffle, kev, photon_kev }.fetch(&mut self.counts16, out),
            Counts::I32(out) => Photons { stream, photons: &sh.photons_i32, shuffle, kev, photon_kev }.fetch(&mut self.counts32, out),
        }
    }

    /// The device's keV image of the frame, for checks and benchmarks.
    pub fn kev(&self) -> &CudaSlice<f32> {
        &self.kev
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// One frame's photon counts made on the device: by `photons` (kev_to_photons_i16 or _i32,
/// paired with the counts' type by the caller) from `kev`, then transposed by `shuffle` in
/// blocks of its elements if asked.
struct Photons<'a> {
    stream: &'a Arc<CudaStream>,
    photons: &'a CudaFunction,
    shuffle: Option<(&'a CudaFunction, usize)>,
    kev: &'a CudaSlice<f32>,
    photon_kev: f32,
}

impl Photons<'_> {
    /// Into the device buffers `dev` (made the first time), then `out`, waiting for the copy.
    fn fetch<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(self, dev: &mut Option<[CudaSlice<T>; 2]>, out: &mut [T]) -> Result<(), GpuError> {
        let (s, n) = (self.stream, self.kev.len());
        let [counts, shuffled] = match dev {
            Some(d) => d,
            None => dev.insert([s.alloc_zeros::<T>(n)?, s.alloc_zeros::<T>(n)?]),
        };
        let ni = to_i32("an image of pixels", n)?;
        let mut b = s.launch_builder(self.photons);
        b.arg(self.kev).arg(&self.photon_kev).arg(&mut *counts).arg(&ni);
        // SAFETY: kev_to_photons_i16/_i32's parameters in order, the output of the kernel's
        // element type (the caller pairs them); kev and counts hold n values and no thread
        // touches a pixel >= n.
        unsafe { b.launch(threads_for(n)) }?;
        let Some((kernel, block)) = self.shuffle else {
            s.memcpy_dtoh(&*counts, out)?;
            s.synchronize()?;
            return Ok(());
        };
        let size = std::mem::size_of::<T>();
        let (size32, block32) = (to_i32("an element size", size)?, to_i32("a block", block)?);
        let mut b = s.launch_builder(kernel);
        b.arg(&*counts).arg(&mut *shuffled).arg(&ni).arg(&size32).arg(&block32);
        // SAFETY: bitshuffle_blocks' parameters in order (its byte pointers are the buffers'
        // device addresses); counts and shuffled hold n elements of `size` bytes, block is a
        // positive multiple of 8 (checked by the caller), and each thread writes inside
        // shuffled: a group's bytes within its block, or one tail byte.
        unsafe { b.launch(threads_for((n / 8) * size + (n % 8) * size)) }?;
        s.memcpy_dtoh(&*shuffled, out)?;
        // registered (page-locked) memory is written asynchronously: wait for it
        s.synchronize()?;
        Ok(())
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // a frame's copy may still read the caller's words: wait for it (an error here is a
        // failed device, whose work has stopped)
        let _ = self.stream.synchronize();
    }
}
