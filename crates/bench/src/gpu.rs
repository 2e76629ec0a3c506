//! `rdaq bench gpu`: for a JUNGFRAU 4M (8 modules) and 16M (32 modules) image of the
//! emulated detector, the GPU path against the limits of the same device measured in the
//! same run:
//! - copies: a device-to-device copy of the keV image (the memory's own speed); the frame's
//!   module words host-to-device from pinned (registered) memory and from pageable memory
//!   (a plain `cudaMemcpy`), and the keV image back both ways;
//! - every kernel alone on data already on the device (assembly + conversion, the older
//!   conversion of an assembled image, pedestal tracking, the strong-pixel search, the
//!   bitshuffle transposition, CSR compaction);
//! - end to end as the graph's GPU workers run it (module words from registered memory to
//!   the strong-pixel list on the host, spots grouped), by 1 and more worker threads, each
//!   with its own lane, with the keV image brought back for every frame (all kept) or for
//!   none (all vetoed); the host side of each frame runs on its worker's core;
//! - the CPU doing the same for one frame on one thread.
//!
//! Without a GPU it says why and exits 2.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use rdaq_detector::jungfrau::MODULE_PIXELS;
use rdaq_detector::{Geometry, ModuleSynth};
use rdaq_gpu::{probe, ChainSetup, Device, GpuConverter, GpuCsr, GpuPedestal, GpuShuffle, HostRegistration, Lane};
use rdaq_process::spots::{LocalSnr, LocalSnrParams};
use rdaq_process::{Calibration, Converter, InvalidGain};
use rdaq_run::config::Config;
use rdaq_run::graph::emulated_calibration;

#[derive(clap::Args)]
pub struct GpuBenchArgs {
    /// Frames per measurement.
    #[arg(long, default_value_t = 200)]
    frames: u32,
    /// Worker threads of the end-to-end rows, each with its own lane (the graph's GPU
    /// workers): the frames in flight on the device.
    #[arg(long, value_delimiter = ',', default_value = "1,4,14")]
    workers: Vec<usize>,
    /// Only the JF4M image (the 16M's rows take most of the time).
    #[arg(long)]
    only_4m: bool,
}

/// Milliseconds of `f` on `stream` per call, timed by two events around `n` calls.
fn timed(stream: &Arc<CudaStream>, n: u32, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    f()?;
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(flags)?;
    for _ in 0..n {
        f()?;
    }
    let end = stream.record_event(flags)?;
    end.synchronize()?;
    Ok(start.elapsed_ms(&end)? as f64 / n as f64)
}

/// Milliseconds per call of `f` by the host clock (its work is synchronous).
fn wall(n: u32, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    f()?;
    let t = Instant::now();
    for _ in 0..n {
        f()?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / n as f64)
}

/// One row: ms per frame, frames/s, GB/s of `bytes` per frame, and the share of `base`
/// (the bandwidth this row is held against) when given.
fn row(name: &str, ms: f64, bytes: f64, base_gbs: Option<f64>) {
    let gbs = bytes / ms / 1e6;
    let vs = base_gbs.map_or("-".to_string(), |b| format!("{:.0}%", 100.0 * gbs / b));
    println!("{name:<72} {ms:>9.4} {:>9.0} {gbs:>8.1} {vs:>8}", 1e3 / ms);
}

pub fn bench(a: GpuBenchArgs) -> anyhow::Result<ExitCode> {
    let dev = match probe() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rdaq bench gpu: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    anyhow::ensure!(a.frames > 0 && a.frames <= 100_000, "--frames must be 1..=100000");
    anyhow::ensure!(!a.workers.is_empty() && a.workers.iter().all(|&w| (1..=64).contains(&w)), "--workers: each count 1..=64");
    println!(
        "rdaq bench gpu on {} (driver CUDA {}.{}, NVRTC {:?}, waits: {:?}): {} frames per row; ms per frame, frames/s, GB/s of the bytes each row moves, and its share of the baseline named",
        dev.name, dev.driver.0, dev.driver.1, dev.nvrtc, dev.sync, a.frames
    );
    let images: &[(&str, u16, u16)] = if a.only_4m { &[("JF4M (8 modules)", 8, 2)] } else { &[("JF4M (8 modules)", 8, 2), ("JF16M (32 modules)", 32, 4)] };
    for &(label, modules, cols) in images {
        let g = Geometry::new(modules, cols, rdaq_detector::geometry::DEFAULT_GAP_X, rdaq_detector::geometry::DEFAULT_GAP_Y).context("geometry")?;
        Image::new(&dev, &g)?.rows(label, a.frames, &a.workers)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One image size: the emulated detector's frames, its calibration and the finder's settings.
struct Image<'a> {
    dev: &'a Device,
    g: Geometry,
    cal: Calibration,
    finder: LocalSnrParams,
    /// The registration of `frames`, declared first so that it is dropped before them.
    pinned: Option<HostRegistration>,
    /// A few frames' module words, one after the other, in registered memory.
    frames: Vec<u16>,
    words: usize,
}

/// Frames cycled through by the end-to-end rows (different data, as a detector sends).
const FRAMES: usize = 4;

impl<'a> Image<'a> {
    fn new(dev: &'a Device, g: &Geometry) -> anyhow::Result<Image<'a>> {
        let mut cfg = Config::default();
        cfg.detector.modules = g.modules;
        cfg.detector.chopper_dark = 0;
        let words = g.modules as usize * MODULE_PIXELS;
        let mut synths: Vec<ModuleSynth> = (0..g.modules).map(|m| ModuleSynth::new(cfg.synth(), m)).collect();
        let mut frames = vec![0u16; FRAMES * words];
        for (f, frame) in frames.chunks_exact_mut(words).enumerate() {
            for (m, s) in synths.iter_mut().enumerate() {
                s.frame(f as u64, &mut frame[m * MODULE_PIXELS..(m + 1) * MODULE_PIXELS]);
            }
        }
        // SAFETY: the registration is dropped before `frames` (the field declared first), and
        // a Vec's heap memory does not move when the Vec does
        let pinned = unsafe { HostRegistration::new(&dev.ctx, frames.as_ptr().cast(), std::mem::size_of_val(frames.as_slice())) }.ok();
        Ok(Image { dev, g: *g, cal: emulated_calibration(cfg.detector.seed, g), finder: rdaq_run::plan::finder_params(&cfg), pinned, frames, words })
    }

    fn frame(&self, k: usize) -> &[u16] {
        let k = k % FRAMES;
        &self.frames[k * self.words..(k + 1) * self.words]
    }

    fn pixels(&self) -> usize {
        self.g.height() * self.g.width()
    }

    fn lanes(&self, n: usize) -> anyhow::Result<Vec<Lane>> {
        let map = self.g.pixel_map();
        let setup = ChainSetup { width: self.g.width(), height: self.g.height(), words: self.words, src_of: &map, calibration: &self.cal, invalid: InvalidGain::Error, finder: self.finder };
        Ok(rdaq_gpu::chain::lanes(self.dev, &setup, n)?)
    }

    fn rows(&self, label: &str, frames: u32, workers: &[usize]) -> anyhow::Result<()> {
        let (px, words) = (self.pixels(), self.words);
        println!("-- {label}: {} x {} pixels, {} module words; the frames' words {}", self.g.height(), self.g.width(), words, if self.pinned.is_some() { "registered (pinned)" } else { "NOT registered: pinned rows are pageable" });
        println!("{:<72} {:>9} {:>9} {:>8} {:>8}", "row", "ms", "frames/s", "GB/s", "vs");
        let copies = self.copy_rows(frames)?;
        self.kernel_rows(frames, copies.device)?;
        self.end_to_end_rows(frames, workers, copies.h2d_pinned)?;
        self.cpu_rows(frames.min(20), px)?;
        Ok(())
    }
}

/// How far the end-to-end rows take each frame.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The device's part alone: the words in, the strong pixels back.
    DeviceOnly,
    /// As a vetoed frame: the spots grouped on the host too.
    Vetoed,
    /// As a kept frame: the keV image back as well.
    Kept,
}

/// The baselines the other rows are held against (GB/s).
struct Copies {
    device: f64,
    h2d_pinned: f64,
}

impl Image<'_> {
    fn copy_rows(&self, frames: u32) -> anyhow::Result<Copies> {
        let (px, s) = (self.pixels(), self.dev.ctx.new_stream()?);
        let (mut d_words, d_kev, mut d_copy): (CudaSlice<u16>, CudaSlice<f32>, CudaSlice<f32>) = (s.alloc_zeros(self.words)?, s.alloc_zeros(px)?, s.alloc_zeros(px)?);
        let kev_bytes = 4.0 * px as f64;
        let dev = timed(&s, frames, || Ok(s.memcpy_dtod(&d_kev, &mut d_copy)?))?;
        row("device copy of the keV image (read + write)", dev, 2.0 * kev_bytes, None);
        let device = 2.0 * kev_bytes / dev / 1e6;
        let words_bytes = 2.0 * self.words as f64;
        let pinned_src = self.frame(0);
        let h2d = timed(&s, frames, || {
            let (dst, _written) = d_words.device_ptr_mut(&s);
            // SAFETY: `dst` holds the frame's words; the words (registered memory) outlive
            // the timing, which waits for the stream
            Ok(unsafe { cudarc::driver::result::memcpy_htod_async(dst, pinned_src, s.cu_stream()) }?)
        })?;
        row("host-to-device, module words, pinned (registered)", h2d, words_bytes, None);
        let h2d_pinned = words_bytes / h2d / 1e6;
        let pageable = pinned_src.to_vec();
        let h2d_pageable = wall(frames, || Ok(s.memcpy_htod(&pageable, &mut d_words)?))?;
        row("host-to-device, module words, pageable (cudaMemcpy)", h2d_pageable, words_bytes, Some(h2d_pinned));
        let mut back = vec![0f32; px];
        // SAFETY: `back` outlives its registration, dropped at the end of this function
        let reg = unsafe { HostRegistration::new(&self.dev.ctx, back.as_ptr().cast(), 4 * px) }.ok();
        let d2h = wall(frames, || {
            s.memcpy_dtoh(&d_kev, &mut back)?;
            Ok(s.synchronize()?)
        })?;
        row(if reg.is_some() { "device-to-host, keV image, pinned (registered)" } else { "device-to-host, keV image (registration refused)" }, d2h, kev_bytes, None);
        let d2h_pinned = kev_bytes / d2h / 1e6;
        drop(reg);
        let d2h_pageable = wall(frames, || Ok(s.memcpy_dtoh(&d_kev, &mut back)?))?;
        row("device-to-host, keV image, pageable (cudaMemcpy)", d2h_pageable, kev_bytes, Some(d2h_pinned));
        Ok(Copies { device, h2d_pinned })
    }

    fn kernel_rows(&self, frames: u32, device: f64) -> anyhow::Result<()> {
        let px = self.pixels();
        let mut lane = self.lanes(1)?.pop().context("one lane")?;
        // SAFETY: the frame is registered memory that outlives the lane's wait below
        unsafe { lane.submit(self.frame(0)) }?;
        lane.strong_pixels(&mut Vec::new())?;
        let s = lane.stream().clone();
        // assembly + conversion reads 2 (words) + 4 (map) + 4 (mask) + 4 + 4 (pedestal, gain)
        // bytes a pixel and writes 4
        let conv = timed(&s, frames, || Ok(lane.launch_convert()?))?;
        row("kernel: assembly + conversion (jf_assemble_kev)", conv, 22.0 * px as f64, Some(device));
        // the column sums read the image twice and write 20 bytes a pixel
        let colsum = timed(&s, frames, || Ok(lane.launch_colsum()?))?;
        row("kernel: local-SNR running column sums (colsum_running)", colsum, 28.0 * px as f64, Some(device));
        // the test reads the image and its row's sums (the box's width, mostly from the
        // cache: counted once), writes a flag; the compaction reads the flags
        let list = timed(&s, frames, || Ok(lane.launch_strong_list()?))?;
        row("kernels: strong pixels listed in order (flags, offsets, compaction)", list, (4.0 + 20.0 + 2.0) * px as f64, Some(device));
        let conv_old = GpuConverter::new(self.dev, &self.cal, InvalidGain::Error)?;
        let d_raw: CudaSlice<u16> = s.clone_htod(&vec![0x0400u16; px])?;
        let mut d_kev: CudaSlice<f32> = s.alloc_zeros(px)?;
        let old = timed(&s, frames, || Ok(conv_old.launch_kev(&s, &d_raw, &mut d_kev)?))?;
        row("kernel: conversion of an assembled image (jf_convert_kev)", old, 18.0 * px as f64, Some(device));
        let mut ped = GpuPedestal::new(self.dev, px, 0, 128)?;
        let ps = self.dev.ctx.default_stream();
        let push = timed(&ps, frames, || Ok(ped.push_device(&d_raw)?))?;
        // per pixel: the word, and the f64 sums, the count and the wrong-gain count read and written
        row("kernel: pedestal tracking of a dark frame (pedestal_push)", push, (2.0 + 2.0 * 24.0) * px as f64, Some(device));
        // the graph's dark path: a frame's words from its (registered) slot, assembled and
        // tracked, waited for one at a time; and the tracked pedestal brought back to publish
        let mut tracker = GpuPedestal::new(self.dev, px, 0, 128)?.assembling(self.dev, &self.g.pixel_map(), self.words)?;
        let dark = wall(frames, || Ok(tracker.push_words(self.frame(0))?))?;
        row("dark frame from its slot, tracked, one at a time (push_words)", dark, 2.0 * self.words as f64, Some(device));
        let mean = wall(frames.min(50), || Ok(tracker.mean().map(drop)?))?;
        row("the tracked pedestal back for publication (mean)", mean, 4.0 * px as f64, Some(device));
        let shuffle = GpuShuffle::new(self.dev)?;
        let ss = shuffle.stream().clone();
        let d_src: CudaSlice<u8> = ss.alloc_zeros(2 * px)?;
        let mut d_dst: CudaSlice<u8> = ss.alloc_zeros(2 * px)?;
        let block = rdaq_process::bitshuffle::default_block_elems(2);
        let sh = timed(&ss, frames, || Ok(shuffle.launch(&d_src, &mut d_dst, 2, block)?))?;
        row("kernel: bitshuffle of int16 counts (bitshuffle_blocks)", sh, 4.0 * px as f64, Some(device));
        let csr = GpuCsr::new(self.dev)?;
        let mut out = rdaq_process::sparse::Csr::default();
        let kev = lane.kev();
        let c = wall(frames.min(50), || Ok(csr.fill(kev, self.g.height(), self.g.width(), 10.0f32, &mut out)?))?;
        row("CSR of the keV image above 10 keV (two kernels + host steps)", c, 4.0 * px as f64, Some(device));
        Ok(())
    }

    /// `frames` frames through `n` worker threads as the graph's GPU workers run them, each
    /// with its own lane: the frame's words to the device, the strong pixels back, then (by
    /// `mode`) spots grouped, and the keV image back. Returns ms per frame (wall clock over
    /// all workers) and the spots found.
    fn end_to_end(&self, frames: u32, n: usize, mode: Mode) -> anyhow::Result<(f64, usize)> {
        let lanes = self.lanes(n)?;
        let width = self.g.width();
        let t = Instant::now();
        let found = std::thread::scope(|s| {
            let hs: Vec<_> = lanes
                .into_iter()
                .enumerate()
                .map(|(w, mut lane)| {
                    s.spawn(move || -> anyhow::Result<usize> {
                        let mut finder = LocalSnr::new(self.finder);
                        let (mut strong, mut spots, mut found) = (Vec::new(), Vec::new(), 0usize);
                        let mut image = vec![0f32; self.pixels()];
                        // SAFETY: `image` outlives the registration, dropped when the thread ends
                        let _reg = unsafe { HostRegistration::new(&self.dev.ctx, image.as_ptr().cast(), 4 * image.len()) }.ok();
                        for k in (w..frames as usize).step_by(n) {
                            // SAFETY: the frames are registered memory that outlives the wait below
                            unsafe { lane.submit(self.frame(k)) }?;
                            lane.strong_pixels(&mut strong)?;
                            if mode == Mode::DeviceOnly {
                                continue;
                            }
                            finder.group_strong_pixels(width, strong.iter().copied(), &mut spots);
                            found += spots.len();
                            if mode == Mode::Kept {
                                lane.image_into(&mut image)?;
                            }
                        }
                        Ok(found)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("a bench worker panicked")).sum::<anyhow::Result<usize>>()
        })?;
        Ok((t.elapsed().as_secs_f64() * 1e3 / frames as f64, found))
    }

    fn end_to_end_rows(&self, frames: u32, workers: &[usize], h2d_pinned: f64) -> anyhow::Result<()> {
        let bytes = 2.0 * self.words as f64;
        for mode in [Mode::DeviceOnly, Mode::Vetoed, Mode::Kept] {
            for &n in workers {
                let (ms, spots) = self.end_to_end(frames, n, mode)?;
                let what = match mode {
                    Mode::DeviceOnly => "device only: strong pixels back, no spots".to_string(),
                    Mode::Vetoed => format!("vetoed: spots ({:.0}/frame)", spots as f64 / frames as f64),
                    Mode::Kept => "kept: spots and the keV image back".to_string(),
                };
                row(&format!("end to end, {n} worker(s), {what}"), ms, bytes, Some(h2d_pinned));
            }
        }
        Ok(())
    }

    fn cpu_rows(&self, frames: u32, px: usize) -> anyhow::Result<()> {
        let runs = self.g.runs_in_image_order();
        let conv = Converter::new(self.cal.clone(), InvalidGain::Error)?;
        let mut finder = LocalSnr::new(self.finder);
        let (mut image, mut spots) = (vec![f32::NAN; px], Vec::new());
        let mut k = 0usize;
        let cpu = wall(frames, || {
            let words = self.frame(k);
            k += 1;
            conv.to_kev_runs(&runs, words, &mut image);
            finder.find(&image, self.g.width(), self.g.height(), &mut spots);
            Ok(())
        })?;
        row("CPU, one thread: assembly + conversion + spots (same frames)", cpu, 2.0 * self.words as f64, None);
        Ok(())
    }
}
