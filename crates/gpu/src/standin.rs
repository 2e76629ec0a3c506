//! A stand-in for the device's lanes on the CPU, so that the graph's GPU path (frames in
//! flight, their order, when slots are given back, device errors) is tested on machines
//! without a GPU. A [`CpuLane`] does what a [`crate::Lane`] does, at the same moments: it
//! reads the frame's words only when its results are asked for (as the device's copy may
//! run until then), converts them with the CPU converter and finds the strong pixels with
//! the CPU finder. It can be told to fail at the n-th submit or wait, as a device can.
//! It is not a backend: only tests and benchmarks make it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdaq_process::spots::{LocalSnr, LocalSnrParams};
use rdaq_process::bitshuffle::shuffle_blocks;
use rdaq_process::convert::Count;
use rdaq_process::{bytes_of, bytes_of_mut, kev_to_photons, Calibration, Converter, InvalidGain, Plain};

use crate::chain::{Counts, FrameLane, Found};
use crate::error::GpuError;
use crate::pedestal::DevicePedestal;

/// When the stand-in fails: at the n-th submit, wait for results, or copy of an image back
/// (each counted from 1 over all its lanes); `None`: never.
#[derive(Debug, Default, Clone, Copy)]
pub struct Failures {
    pub submit: Option<u64>,
    pub wait: Option<u64>,
    pub image: Option<u64>,
}

/// What the lanes of one stand-in share.
struct Shared {
    base: Arc<Calibration>,
    invalid: InvalidGain,
    runs: Vec<(usize, usize, usize)>,
    width: usize,
    height: usize,
    words: usize,
    /// More strong pixels than this: [`Found::TooMany`], as the device's list overflows.
    cap: usize,
    fail: Failures,
    submits: AtomicU64,
    waits: AtomicU64,
    images: AtomicU64,
}

/// The words of the frame in flight, read when its results are asked for.
struct Pending(*const u16, usize);

// SAFETY: the pointer is only read by the lane's owner, within the lifetime the caller of
// `submit` guarantees (until the results or the lane's drop), whichever thread holds it.
unsafe impl Send for Pending {}

pub struct CpuLane {
    shared: Arc<Shared>,
    conv: Converter,
    generation: u64,
    finder: LocalSnr,
    pending: Option<Pending>,
    kev: Vec<f32>,
    /// The counts before their transposition (grown once).
    scratch: Vec<u8>,
}

/// `n` stand-in lanes for an image of `width x height` whose pixels are the runs `runs`
/// (word in a frame's `words` module words, image pixel, length), with `calibration`.
#[allow(clippy::too_many_arguments)]
pub fn lanes(n: usize, width: usize, height: usize, words: usize, runs: Vec<(usize, usize, usize)>, calibration: Arc<Calibration>, invalid: InvalidGain, finder: LocalSnrParams, cap: usize, fail: Failures) -> Result<Vec<CpuLane>, GpuError> {
    let conv = || Converter::shared(calibration.clone(), invalid).map_err(|e| GpuError::Input(e.to_string()));
    let convs: Vec<Converter> = (0..n.max(1)).map(|_| conv()).collect::<Result<_, _>>()?;
    let shared = Arc::new(Shared { base: calibration.clone(), invalid, runs, width, height, words, cap, fail, submits: AtomicU64::new(0), waits: AtomicU64::new(0), images: AtomicU64::new(0) });
    Ok(convs.into_iter().map(|conv| CpuLane { shared: shared.clone(), conv, generation: 0, finder: LocalSnr::new(finder), pending: None, kev: vec![f32::NAN; width * height], scratch: Vec::new() }).collect())
}

/// Whether the `k`-th call (from 1) is the one told to fail.
fn due(counter: &AtomicU64, at: Option<u64>) -> bool {
    let k = counter.fetch_add(1, Ordering::Relaxed) + 1;
    at == Some(k)
}

impl FrameLane for CpuLane {
    fn set_pedestal(&mut self, g0: &[f32], generation: u64) -> Result<(), GpuError> {
        if generation == self.generation {
            return Ok(());
        }
        let mut cal = (*self.shared.base).clone();
        cal.pedestal[0].copy_from_slice(g0);
        self.conv = Converter::shared(Arc::new(cal), self.shared.invalid).map_err(|e| GpuError::Input(e.to_string()))?;
        self.generation = generation;
        Ok(())
    }

    fn set_pedestal_device(&mut self, _: &DevicePedestal, _: u64) -> Result<(), GpuError> {
        Err(GpuError::Input("the CPU stand-in's lanes take the pedestal from the host".into()))
    }

    fn pedestal_generation(&self) -> u64 {
        self.generation
    }

    unsafe fn submit(&mut self, words: &[u16]) -> Result<(), GpuError> {
        if words.len() != self.shared.words {
            return Err(GpuError::Input(format!("a frame of {} words for lanes of {}", words.len(), self.shared.words)));
        }
        if due(&self.shared.submits, self.shared.fail.submit) {
            return Err(GpuError::Input("the stand-in's planned failure at submit".into()));
        }
        self.pending = Some(Pending(words.as_ptr(), words.len()));
        Ok(())
    }

    fn strong_pixels(&mut self, out: &mut Vec<(u32, f32)>) -> Result<Found, GpuError> {
        out.clear();
        let Some(Pending(p, len)) = self.pending.take() else {
            return Err(GpuError::Input("no frame submitted".into()));
        };
        if due(&self.shared.waits, self.shared.fail.wait) {
            return Err(GpuError::Input("the stand-in's planned failure at wait".into()));
        }
        // SAFETY: `submit`'s caller keeps the words alive and unwritten until this returns Ok
        // (its contract), and `p` and `len` are that slice's.
        let words = unsafe { std::slice::from_raw_parts(p, len) };
        self.conv.to_kev_runs(&self.shared.runs, words, &mut self.kev);
        let mut spots = Vec::new();
        self.finder.find(&self.kev, self.shared.width, self.shared.height, &mut spots);
        out.extend(self.finder.last_strong());
        Ok(if out.len() > self.shared.cap { Found::TooMany(out.len()) } else { Found::Listed(out.len()) })
    }

    fn image_into(&mut self, out: &mut [f32]) -> Result<(), GpuError> {
        if out.len() != self.kev.len() {
            return Err(GpuError::Input(format!("{} pixels out for an image of {}", out.len(), self.kev.len())));
        }
        if due(&self.shared.images, self.shared.fail.image) {
            return Err(GpuError::Input("the stand-in's planned failure at an image's copy".into()));
        }
        out.copy_from_slice(&self.kev);
        Ok(())
    }

    fn photons_into(&mut self, photon_kev: f32, shuffle: Option<usize>, out: Counts<'_>) -> Result<(), GpuError> {
        if out.len() != self.kev.len() {
            return Err(GpuError::Input(format!("{} counts out for an image of {}", out.len(), self.kev.len())));
        }
        if due(&self.shared.images, self.shared.fail.image) {
            return Err(GpuError::Input("the stand-in's planned failure at an image's copy".into()));
        }
        match out {
            Counts::I16(c) => counts_into(&self.kev, photon_kev, shuffle, &mut self.scratch, c),
            Counts::I32(c) => counts_into(&self.kev, photon_kev, shuffle, &mut self.scratch, c),
        }
        Ok(())
    }
}

/// What the device's photons and bitshuffle kernels make, on the CPU (`scratch` holds the
/// counts before their transposition).
fn counts_into<T: Count + Plain>(kev: &[f32], photon_kev: f32, shuffle: Option<usize>, scratch: &mut Vec<u8>, out: &mut [T]) {
    kev_to_photons(kev, photon_kev, out);
    if let Some(block) = shuffle {
        scratch.clear();
        scratch.extend_from_slice(bytes_of(out));
        shuffle_blocks(scratch, std::mem::size_of::<T>(), block, bytes_of_mut(out));
    }
}
