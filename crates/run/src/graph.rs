//! The online processing graph of `rdaq run` for JUNGFRAU (docs/processing.md):
//!
//! ```text
//! receiver ring --(dark)--> pedestal band 1 -> ... -> band k --publishes G0 pedestal--> process
//!               --(signal)-> process (n: convert, spots + veto, compress) -> reorder + write (1)
//! ```
//!
//! Frames move as pooled `Box<Work>` buffers. A process worker takes a signal frame through
//! every step on one core: conversion reads each module straight from its receiver slot and
//! writes keV into the assembled image (assembly and conversion in one pass) and gives the
//! slot back; spot finding and the veto read the image while it is still in that core's
//! caches, and compression turns it into the file's chunk. The workers need no lock per
//! frame, so they scale with the cores; the write stage puts their frames back into the
//! source's order. Dark frames go through the pedestal bands, which read the raw words from
//! the slot (each band its own pixels) and the last gives the slot back. Every stage runs on
//! the pipeline graph of `rdaq_process::pipeline`, with its counters in the summary.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver as ChanRx, Sender};
use indicatif::ProgressBar;
use rdaq_detector::jungfrau::ModuleCalibration;
use rdaq_detector::{as_words, Chopper, Geometry};
use rdaq_gpu::pedestal::DARK_IN_FLIGHT;
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::pipeline::{Emit, Failure, Pipeline, Policy, Port, StageId, StageStats, WhenFull, WorkerFn};
use rdaq_process::spots::{is_hit, LocalSnrParams, Spot};
use rdaq_process::{bytes_of, kev_to_photons, Calibration, Converter, G0Pedestal, InvalidGain};
use rdaq_receiver::{FrameReady, FrameStatus, Receiver};
use rdaq_sink::{NxmxWriter, PixelType, SharedChunk};

use crate::board::{incomplete_event, Board, Glance, ProcessCounts};
use crate::latency::FrameTimes;
use crate::stream::{ChunkDemand, Stream};
use serde::Serialize;

use crate::consume::{from_pool, missing_ranges, next_frame, ConsumeStats, OWN_FRAME};

mod dark;
pub mod deliver;
mod gpu;
mod process;

use crate::reorder::Reorder;
use dark::{Band, DarkTracker};
pub use gpu::GpuReport;


/// What the graph needs besides the receiver and the writer.
pub struct Setup {
    pub geometry: Geometry,
    pub calibration: Arc<Calibration>,
    pub invalid: InvalidGain,
    pub chopper: Chopper,
    pub photon_kev: f32,
    pub pixel: PixelType,
    pub codec: Codec,
    pub finder: LocalSnrParams,
    pub min_spots: usize,
    pub veto: bool,
    pub window: u32,
    pub publish: u32,
    /// Process workers (each takes a frame through every step; the GPU's compression
    /// workers), and pedestal bands (each tracks its pixels of every dark frame).
    pub workers: usize,
    pub pedestal_bands: usize,
    /// CPUs the workers are pinned to, in order (process workers first, then the bands);
    /// empty: not pinned.
    pub cpus: Vec<usize>,
    pub ring_frames: usize,
    /// The source waits this long per frame (testing: a consumer slower than the detector).
    pub consumer_delay: std::time::Duration,
    /// Conversion, spot finding and pedestal tracking on this GPU instead of the CPU: a
    /// process worker takes one of the device's lanes (one frame's buffers and stream) for
    /// a frame and does the rest of its work (spots from the strong pixels, compression).
    pub gpu: Option<GpuBackend>,
    /// Frames on the device at once, shared by the workers.
    pub gpu_lanes: usize,
    /// GPU workers that may process a frame on the CPU while every lane is busy.
    pub gpu_cpu_workers: usize,
    /// The detector of this process, whose send times start each frame's latency.
    pub sent: Option<Arc<rdaq_emulator::Control>>,
    /// Where the graph shows its stages, counts, latency and latest image while it runs.
    pub board: Arc<Board>,
    /// Where every written frame goes, with its photon counts, before its buffer returns
    /// to the pool (a program in this process reading the frames: [`deliver`]).
    pub deliver: Option<Sender<deliver::Processed>>,
    /// Results made once that the workers and the pedestal bands hand on instead of doing
    /// their work (CPU backend): what the graph's serial parts alone sustain
    /// (`rdaq bench pipeline --ceiling`). Never set for an acquisition.
    pub canned: Option<Arc<Canned>>,
}

/// A signal frame's results made once: its chunk and spots.
#[derive(Debug, Clone, Default)]
pub struct Canned {
    pub chunk: Vec<u8>,
    /// As the finder gives them (keV): the workers judge them as their own.
    pub spots: Vec<Spot>,
}

impl Canned {
    /// The results of one frame of module words (`words`, as a slot holds them) made by the
    /// graph's own steps with `setup`'s calibration, finder and file format.
    pub fn of(setup: &Setup, words: &[u16]) -> anyhow::Result<Canned> {
        let g = &setup.geometry;
        let conv = Converter::shared(setup.calibration.clone(), setup.invalid)?;
        let mut wk = Work::new(g.height() * g.width(), None);
        conv.to_kev_runs(&g.runs_in_image_order(), words, &mut wk.image);
        let mut spots = Vec::new();
        rdaq_process::spots::LocalSnr::new(setup.finder).find(&wk.image, g.width(), g.height(), &mut spots);
        ChunkMaker::new(setup).make(&mut wk);
        let chunk = std::mem::take(&mut *wk.chunk.make_mut());
        Ok(Canned { chunk, spots })
    }
}

/// Elements per compressed block of a chunk of `pixel`s: what the chunk maker cuts, and so
/// what the device must transpose for it.
fn chunk_block_elems(pixel: PixelType) -> usize {
    rdaq_process::bitshuffle::default_block_elems(pixel.bytes())
}

/// Makes the file's chunk of a frame: photon counts made from its keV image one compression
/// block at a time (no whole array of counts in memory), or keV as they are; or the photon
/// counts the device made (plain or already bitshuffled), as they are.
struct ChunkMaker {
    comp: Compressor,
    pixel: PixelType,
    photon_kev: f32,
    c16: Vec<i16>,
    c32: Vec<i32>,
}

impl ChunkMaker {
    fn new(setup: &Setup) -> ChunkMaker {
        ChunkMaker { comp: Compressor::new(setup.pixel.bytes(), chunk_block_elems(setup.pixel), setup.codec), pixel: setup.pixel, photon_kev: setup.photon_kev, c16: Vec::new(), c32: Vec::new() }
    }

    /// The chunk of `wk`'s pixels: its counts when they hold them, else made from its keV.
    fn make(&mut self, wk: &mut Work) {
        let mut chunk = wk.chunk.make_mut();
        let (image, chunk, n, e) = (&wk.image, &mut *chunk, wk.image.len(), self.photon_kev);
        match (self.pixel, wk.counts) {
            (PixelType::Photons16, Counts::Plain) => self.comp.compress(bytes_of(&wk.counts16), chunk),
            (PixelType::Photons32, Counts::Plain) => self.comp.compress(bytes_of(&wk.counts32), chunk),
            (PixelType::Photons16, Counts::Shuffled) => self.comp.compress_shuffled(bytes_of(&wk.counts16), chunk),
            (PixelType::Photons32, Counts::Shuffled) => self.comp.compress_shuffled(bytes_of(&wk.counts32), chunk),
            (PixelType::Photons16, _) => self.comp.compress_from(n, &mut self.c16, chunk, |at, b| kev_to_photons(&image[at..at + b.len()], e, b)),
            (PixelType::Photons32, _) => self.comp.compress_from(n, &mut self.c32, chunk, |at, b| kev_to_photons(&image[at..at + b.len()], e, b)),
            _ => self.comp.compress(bytes_of(image), chunk),
        }
    }
}

/// Where the GPU path's lanes run.
#[derive(Clone)]
pub enum GpuBackend {
    /// A CUDA device.
    Device(rdaq_gpu::Device),
    /// The CPU stand-in, failing as told: tests and benchmarks of the GPU path's scheduling
    /// on machines without a GPU (not a backend users choose).
    StandIn(rdaq_gpu::standin::Failures),
}

/// The calibration of the emulated detector in image coordinates: each module's synthetic
/// calibration at its place, gap pixels masked (NXmx bit 0).
pub fn emulated_calibration(seed: u64, g: &Geometry) -> Calibration {
    emulated_calibration_of(seed, g, &(0..g.modules).collect::<Vec<_>>())
}

/// [`emulated_calibration`] of an image whose m-th module is the emulated detector's
/// module `ids[m]` (a receiver that holds some of the modules).
pub fn emulated_calibration_of(seed: u64, g: &Geometry, ids: &[u16]) -> Calibration {
    assert_eq!(ids.len(), g.modules as usize, "one module id per module of the image");
    let px = g.height() * g.width();
    let mut cal = Calibration { pedestal: [vec![0.0; px], vec![0.0; px], vec![0.0; px]], gain: [vec![1.0; px], vec![1.0; px], vec![1.0; px]], mask: g.gap_mask() };
    for (m, &id) in (0..g.modules).zip(ids) {
        let mc = ModuleCalibration::synthetic(seed, id);
        g.module_runs(m, |from, at, run| {
            for s in 0..3 {
                cal.pedestal[s][at..at + run].copy_from_slice(&mc.pedestal[s][from..from + run]);
                cal.gain[s][at..at + run].copy_from_slice(&mc.gain[s][from..from + run]);
            }
        });
    }
    cal
}

/// A frame on its way through the graph (pooled: allocated once, reused).
struct Work {
    frame: u64,
    /// The signal frame's place in the source's order (the write stage keeps it).
    seq: u64,
    ready: Option<FrameReady>,
    missing: Vec<(usize, usize)>,
    image: Vec<f32>,
    /// `image` holds this frame's keV (the GPU path fetches it only for frames kept).
    image_valid: bool,
    spots: Vec<Spot>,
    hit: bool,
    /// Not a hit, and the veto is on: the write stage only counts it.
    vetoed: bool,
    /// Written out by an I/O thread after the write stage hands it on ([`SharedChunk`]).
    chunk: SharedChunk,
    /// `chunk` holds this frame's compressed image (not made for a vetoed frame, nor for
    /// one that neither a file nor a stream reader would take).
    chunked: bool,
    times: Option<FrameTimes>,
    /// Photon counts of the image in the file's type: made for frames delivered
    /// ([`deliver`]), or fetched from the device for a kept frame (`counts`).
    counts16: Vec<i16>,
    counts32: Vec<i32>,
    counts: Counts,
}

/// What a frame's counts hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counts {
    /// Nothing of this frame.
    Stale,
    /// Its pixels (the GPU path fetched them instead of its keV).
    Plain,
    /// Its pixels' bytes transposed in the chunk's blocks, ready for the codec (the GPU path,
    /// when nothing reads the counts themselves).
    Shuffled,
}

impl Work {
    /// A buffer for images of `pixels` pixels; with `counts` (the GPU path, whose kept
    /// frames come back as the file's photon counts), room for them too, made now so that
    /// it can be registered with the driver.
    fn new(pixels: usize, counts: Option<PixelType>) -> Work {
        let mut w = Work { frame: 0, seq: 0, ready: None, missing: Vec::new(), image: vec![f32::NAN; pixels], image_valid: false, spots: Vec::new(), hit: false, vetoed: false, chunk: SharedChunk::default(), chunked: false, times: None, counts16: Vec::new(), counts32: Vec::new(), counts: Counts::Stale };
        match counts {
            Some(PixelType::Photons16) => w.counts16.resize(pixels, 0),
            Some(PixelType::Photons32) => w.counts32.resize(pixels, 0),
            _ => {}
        }
        w
    }
}

/// Processing counts for the summary.
#[derive(Debug, Default, Serialize, Clone)]
pub struct ProcessReport {
    pub dark_frames: u64,
    /// Dark frames not tracked because data was missing.
    pub dark_incomplete: u64,
    pub pedestal_updates: u64,
    pub signal_frames: u64,
    pub hits: u64,
    pub vetoed: u64,
    pub vetoed_fraction: f64,
    pub spots_found: u64,
    pub frames_written: u64,
    /// Signal frames compressed: not those vetoed, nor those that neither a file nor a
    /// stream reader would take.
    pub frames_compressed: u64,
    /// Whether the veto was on (only hits written), and the spots that make a hit.
    pub veto: bool,
    pub min_spots: usize,
    /// Waits of the source for a free frame buffer (the graph's back-pressure).
    pub pool_waits: u64,
    pub stages: Vec<StageReport>,
    /// The process workers' time per signal frame in each step (CPU backend).
    pub steps: Vec<StepReport>,
    /// The most frames the write stage held back to keep the source's order.
    pub reorder_high_water: usize,
    /// The GPU path's counts (GPU backend only).
    pub gpu: Option<gpu::GpuReport>,
    /// The tracked pedestal at the end (G0), to be saved with the calibration.
    #[serde(skip)]
    pub calibration: Option<Arc<Calibration>>,
}

impl ProcessReport {
    /// The board's running counts into the report, and the share of signal frames vetoed.
    pub fn take_counts(&mut self, c: &ProcessCounts) {
        let get = ProcessCounts::get;
        (self.dark_frames, self.signal_frames, self.hits, self.vetoed) = (get(&c.dark_frames), get(&c.signal_frames), get(&c.hits), get(&c.vetoed));
        (self.spots_found, self.pedestal_updates, self.dark_incomplete) = (get(&c.spots_found), get(&c.pedestal_updates), get(&c.dark_incomplete));
        self.vetoed_fraction = if self.signal_frames > 0 { self.vetoed as f64 / self.signal_frames as f64 } else { 0.0 };
    }
}

#[derive(Debug, Serialize, Clone)]
pub struct StepReport {
    pub name: &'static str,
    pub frames: u64,
    pub ms_per_frame: f64,
}

#[derive(Debug, Serialize, Clone)]
pub struct StageReport {
    pub name: String,
    pub workers: usize,
    pub frames: u64,
    pub busy_s: f64,
    pub ms_per_frame: f64,
    pub blocked: u64,
    pub dropped: u64,
    pub discarded: u64,
    pub high_water: u64,
}

impl StageReport {
    fn of(s: &StageStats) -> StageReport {
        let frames = s.processed.load(Ordering::Relaxed);
        let busy_s = s.busy_ns.load(Ordering::Relaxed) as f64 / 1e9;
        StageReport {
            name: s.name.clone(),
            workers: s.workers,
            frames,
            busy_s,
            ms_per_frame: if frames > 0 { busy_s * 1e3 / frames as f64 } else { 0.0 },
            blocked: s.blocked(),
            dropped: s.dropped(),
            discarded: s.discarded.load(Ordering::Relaxed),
            high_water: s.high_water(),
        }
    }
}

/// The calibration the converters use: the run's, with the G0 pedestal replaced each time
/// the tracked one is published (the rest never changes, so only the pedestal is handed on).
struct SharedCal {
    base: Arc<Calibration>,
    g0: RwLock<G0Pedestal>,
    generation: AtomicU64,
    /// The gap pixels, which keep the base's placeholder pedestal (they are masked).
    gaps: Vec<usize>,
    /// The buffer of a pedestal no converter holds any more, for the next publication.
    spare: Mutex<Vec<f32>>,
}

impl SharedCal {
    fn new(base: Arc<Calibration>) -> anyhow::Result<SharedCal> {
        let g0 = G0Pedestal::new(base.pedestal[0].clone())?;
        let gaps = base.mask.iter().enumerate().filter(|(_, &m)| m & rdaq_detector::geometry::MASK_GAP != 0).map(|(p, _)| p).collect();
        Ok(SharedCal { base, g0: RwLock::new(g0), generation: AtomicU64::new(0), gaps, spare: Mutex::new(Vec::new()) })
    }

    /// Publishes the tracked G0 pedestal `mean` to the converters (gap pixels from the
    /// base), in a buffer of an earlier pedestal where no converter holds it any more.
    fn publish(&self, mean: &[f32]) {
        let mut g0 = std::mem::take(&mut *self.spare.lock().expect("not poisoned"));
        g0.clear();
        g0.extend_from_slice(mean);
        for &p in &self.gaps {
            g0[p] = self.base.pedestal[0][p];
        }
        let new = G0Pedestal::new(g0).expect("a mean of ADC values is finite");
        let old = std::mem::replace(&mut *self.g0.write().expect("not poisoned"), new);
        self.generation.fetch_add(1, Ordering::Release);
        if let Ok(buffer) = old.into_values() {
            *self.spare.lock().expect("not poisoned") = buffer;
        }
    }

    /// The G0 pedestal published last.
    fn g0(&self) -> G0Pedestal {
        self.g0.read().expect("not poisoned").clone()
    }

    /// `conv` following the pedestal published last, when `seen` (the generation it has)
    /// is not the latest; returns the latest generation.
    fn follow(&self, seen: u64, conv: &mut Converter) -> u64 {
        let gen = self.generation.load(Ordering::Acquire);
        if gen != seen {
            *conv = conv.with_g0(self.g0()).expect("the tracked pedestal has the image's pixels");
        }
        gen
    }
}

/// The pooled frame buffers: enough for every ring of the graph to be full.
fn work_pool(setup: &Setup) -> (Sender<Box<Work>>, ChanRx<Box<Work>>) {
    let pixels = setup.geometry.height() * setup.geometry.width();
    let pool_size = (setup.workers + setup.pedestal_bands + 2) * setup.ring_frames + 4;
    let (tx, rx) = bounded::<Box<Work>>(pool_size);
    let counts = setup.gpu.as_ref().map(|_| setup.pixel);
    for _ in 0..pool_size {
        tx.send(Box::new(Work::new(pixels, counts))).expect("pool has room");
    }
    (tx, rx)
}

/// The process workers' time in each step, summed over workers (nanoseconds).
#[derive(Default)]
struct StepTimes {
    convert: AtomicU64,
    spots: AtomicU64,
    compress: AtomicU64,
    frames: AtomicU64,
    compressed: AtomicU64,
}

/// What the stages share: the receiver they read, the settings, the calibration in use,
/// the file, the counts, and the pool their buffers go back to.
struct Graph<'a> {
    rx: &'a Receiver,
    setup: &'a Setup,
    cal: SharedCal,
    /// The tracked G0 pedestal as the bands last wrote it, for the next publication.
    dark_mean: Mutex<Vec<f32>>,
    steps: StepTimes,
    reorder_high_water: AtomicU64,
    stats: Mutex<ConsumeStats>,
    writer: Mutex<Option<&'a mut NxmxWriter>>,
    stream: Mutex<Option<&'a mut Stream>>,
    /// Whether the workers compress (set by the write stage as it publishes).
    demand: ChunkDemand,
    pool: Sender<Box<Work>>,
    /// Signal frames that left the write stage's reorder (written, vetoed or not saved):
    /// the rest of those handed on were lost in the graph when a worker panicked.
    delivered: AtomicU64,
}

/// Runs the graph until the receiver finishes (or `until` is set and no frame waits);
/// `on_frame` sees every frame as it comes. Without a writer, frames are processed and
/// streamed but not written.
pub fn run(
    rx: &Receiver,
    writer: Option<&mut NxmxWriter>,
    mut stream: Option<&mut Stream>,
    setup: Setup,
    bar: &ProgressBar,
    until: Option<&AtomicBool>,
    on_frame: &mut dyn FnMut(&FrameReady),
) -> anyhow::Result<(ConsumeStats, ProcessReport)> {
    let demand = ChunkDemand::new(writer.is_some(), stream.as_deref_mut());
    Converter::shared(setup.calibration.clone(), setup.invalid)?;
    anyhow::ensure!(setup.workers > 0 && setup.pedestal_bands > 0 && setup.ring_frames > 0, "the graph needs workers, pedestal bands and rings");
    let (pool, pool_rx) = work_pool(&setup);
    let pixels = setup.geometry.height() * setup.geometry.width();
    let g = Graph {
        rx,
        setup: &setup,
        cal: SharedCal::new(setup.calibration.clone())?,
        dark_mean: Mutex::new(vec![0.0; pixels]),
        steps: StepTimes::default(),
        reorder_high_water: AtomicU64::new(0),
        stats: Mutex::new(ConsumeStats { what: if writer.is_some() { "processing and writing frames" } else { "processing frames (no file)" }.to_string(), ..Default::default() }),
        demand,
        writer: Mutex::new(writer),
        stream: Mutex::new(stream),
        pool,
        delivered: AtomicU64::new(0),
    };
    // the device's lanes and the memory registered with it: dropped after the graph's
    // threads, before the pool and the receiver whose memory it registered
    let (offload, mut tracker) = match &setup.gpu {
        Some(backend) => {
            let images = pool_images(&g.pool, &pool_rx);
            let (o, t) = gpu::Offload::new(backend, &setup, rx, &images)?;
            (Some(o), Some(t))
        }
        None => (None, None),
    };
    let (stage_stats, source) = std::thread::scope(|s| {
        let mut p: Pipeline<Box<Work>> = Pipeline::default();
        let rf = setup.ring_frames;
        let write = p.stage("write", 1, rf, |_| g.write_worker());
        let (first, pedestal) = match (&offload, tracker.take()) {
            // the device converts and finds the strong pixels, several frames at once, and
            // tracks the pedestal; the CPU workers compress
            (Some(off), Some(tracker)) => {
                let pedestal = g.pedestal_chain(&mut p, vec![tracker]);
                let gpu = p.shared_stage("gpu", setup.workers, setup.workers * rf, |k| g.gpu_worker(off, k));
                p.connect(gpu, write, Policy::RoundRobin, WhenFull::Block);
                (gpu, pedestal)
            }
            _ => {
                let pedestal = match setup.canned {
                    Some(_) => g.pedestal_chain(&mut p, (0..setup.pedestal_bands).map(|_| dark::Counted::default()).collect()),
                    None => g.pedestal_chain(&mut p, Band::split(pixels, setup.pedestal_bands, setup.window)),
                };
                let process = p.shared_stage("process", setup.workers, setup.workers * rf, |k| g.process_worker(k));
                p.connect(process, write, Policy::RoundRobin, WhenFull::Block);
                (process, pedestal)
            }
        };
        let to_pedestal = p.source(pedestal, Policy::RoundRobin, WhenFull::Block);
        let to_process = p.source(first, Policy::LeastLoaded, WhenFull::Block);
        let failure = p.failure();
        if let Some(off) = &offload {
            off.watch(failure.clone());
        }
        let running = p.spawn(s);
        setup.board.set_stages(running.stats.clone());
        setup.board.set_consuming();
        let source = g.feed(&pool_rx, [to_pedestal, to_process], &failure, bar, until, on_frame);
        (running.join(), (source, failure))
    });
    let ((source, handed_on), failure) = source;
    g.stats.lock().expect("not poisoned").lost_in_graph(&failure, handed_on - g.delivered.load(Ordering::Relaxed));
    let mut report = g.report(stage_stats, source);
    report.1.gpu = offload.as_ref().map(|o| o.report(&setup.board));
    Ok(report)
}

/// Where the pooled frame buffers' images and counts lie (the GPU path registers them, so
/// that kept frames come back by DMA). Takes every buffer out of the pool and puts it back.
fn pool_images(pool: &Sender<Box<Work>>, rx: &ChanRx<Box<Work>>) -> Vec<(*const u8, usize)> {
    let all: Vec<Box<Work>> = rx.try_iter().collect();
    let span = |b: &[u8]| (b.as_ptr(), b.len());
    let images = all
        .iter()
        .flat_map(|w| [span(bytes_of(&w.image)), span(bytes_of(&w.counts16)), span(bytes_of(&w.counts32))])
        .filter(|&(_, len)| len > 0)
        .collect();
    for w in all {
        pool.send(w).expect("the pool has room for its own buffers");
    }
    images
}

/// Pins the calling worker to the `k`-th of the configured CPUs (if any), once.
fn pin_once(pinned: &mut bool, cpus: &[usize], k: usize) {
    if !*pinned && !cpus.is_empty() {
        // a CPU that cannot be had (a cpuset, say) leaves the worker unpinned: the run goes on
        let cpu = cpus[k % cpus.len()];
        if let Err(e) = rdaq_net::socket::pin_current_thread(cpu) {
            eprintln!("rdaq: process.cpus: cannot pin a worker to CPU {cpu} ({e}); it runs unpinned");
        }
    }
    *pinned = true;
}

impl Graph<'_> {
    /// The source: finished frames from the receiver, sent by the chopper to the pedestal
    /// (dark) or the processing (signal, numbered in order). Returns its own counts and the
    /// signal frames it handed on; the ports close when it returns. After a worker
    /// panicked, it gives every frame's slots back (a signal frame counted as not saved).
    fn feed(&self, pool: &ChanRx<Box<Work>>, [to_pedestal, to_process]: [Port<Box<Work>>; 2], failure: &Failure, bar: &ProgressBar, until: Option<&AtomicBool>, on_frame: &mut dyn FnMut(&FrameReady)) -> (ProcessReport, u64) {
        let mut source = ProcessReport::default();
        let mut seq = 0u64;
        while let Some(f) = next_frame(self.rx, until) {
            on_frame(&f);
            std::thread::sleep(self.setup.consumer_delay);
            bar.inc(1);
            let times = FrameTimes::of(&f, self.setup.sent.as_deref().map(|c| &c.sent));
            let dark = self.setup.chopper.is_dark(f.frame());
            {
                let mut st = self.stats.lock().expect("not poisoned");
                if !st.arrived(&f) || dark {
                    // dark frames end at the pedestal: nothing of them is processed or written
                    self.setup.board.record(&times, None);
                }
            }
            if f.status() != FrameStatus::Complete {
                self.setup.board.push_event(incomplete_event("receiver", &f));
            }
            if f.status() == FrameStatus::Discarded {
                continue;
            }
            let Some(mut wk) = from_pool(pool, Some(&self.setup.board), failure, || source.pool_waits += 1) else {
                if !dark {
                    self.stats.lock().expect("not poisoned").not_saved_after(failure);
                    self.setup.board.record(&times, None);
                }
                self.rx.release(f).expect(OWN_FRAME);
                continue;
            };
            wk.frame = f.frame();
            wk.missing = missing_ranges(self.rx, &self.setup.geometry, &f);
            wk.spots.clear();
            (wk.hit, wk.vetoed, wk.counts) = (false, false, Counts::Stale);
            wk.times = Some(times);
            wk.ready = Some(f);
            let process = &self.setup.board.process;
            if dark {
                ProcessCounts::add(&process.dark_frames, 1);
                to_pedestal.send(wk);
            } else {
                ProcessCounts::add(&process.signal_frames, 1);
                wk.seq = seq;
                seq += 1;
                to_process.send(wk);
            }
        }
        (source, seq)
    }

    /// The pedestal stages, one per tracker, chained: returns the first.
    fn pedestal_chain<'g, T: DarkTracker + 'g>(&'g self, p: &mut Pipeline<'g, Box<Work>>, trackers: Vec<T>) -> StageId {
        let k = trackers.len();
        let mut stages = Vec::with_capacity(k);
        for (i, t) in trackers.into_iter().enumerate() {
            let name = if k == 1 { "pedestal".to_string() } else { format!("pedestal {}/{k}", i + 1) };
            let mut t = Some(t);
            let cpu = self.setup.workers + i;
            stages.push(p.stage(&name, 1, self.setup.ring_frames, |_| self.pedestal_worker(t.take().expect("one worker per band"), i + 1 == k, cpu)));
        }
        for w in stages.windows(2) {
            p.connect(w[0], w[1], Policy::RoundRobin, WhenFull::Block);
        }
        stages[0]
    }

    /// Pedestal tracking of the dark frames' pixels of one band (raw words, read from the
    /// slot) by `tracker`. Every band writes its part of the pedestal once the window is full
    /// and then every `publish` dark frames; the `last` band then publishes it to the
    /// converters, gives the slots back and the buffers to the pool. A tracker that reads
    /// its frames late (the GPU's) keeps several in flight while more wait in the stage's
    /// ring, and all of them read when none waits (so at the end of the run).
    fn pedestal_worker<'g, T: DarkTracker + 'g>(&'g self, mut tracker: T, last: bool, cpu: usize) -> WorkerFn<'g, Box<Work>> {
        let g = self.setup.geometry;
        let (mut since_publish, mut pinned) = (0u32, false);
        let mut held: VecDeque<Box<Work>> = VecDeque::with_capacity(DARK_IN_FLIGHT);
        Box::new(move |wk: Box<Work>, e: &Emit<Box<Work>>| {
            pin_once(&mut pinned, &self.setup.cpus, cpu);
            let f = wk.ready.as_ref().expect("dark frames come with their slot");
            if f.status() == FrameStatus::Complete {
                // SAFETY: the frame, and so its slot, stays in `held` until the tracker no
                // longer reads it (below); the last message of the run sees no more waiting,
                // so none is held when the worker ends.
                unsafe { tracker.push_frame(&g, as_words(self.rx.data(f).expect(OWN_FRAME))) };
                since_publish += 1;
                held.push_back(wk);
            } else {
                if last {
                    ProcessCounts::add(&self.setup.board.process.dark_incomplete, 1);
                }
                self.hand_on_dark(wk, last, e);
            }
            let mut due = tracker.frames() >= self.setup.window as u64 && since_publish >= self.setup.publish;
            if due {
                since_publish = 0;
                due = tracker.mean_into(&mut self.dark_mean.lock().expect("not poisoned"));
            }
            let keep = if e.queued() > 0 { DARK_IN_FLIGHT - 1 } else { 0 };
            let reading = tracker.reading(keep);
            while held.len() > reading {
                self.hand_on_dark(held.pop_front().expect("more held than read"), last, e);
            }
            if due && last {
                self.publish_pedestal();
            }
        })
    }

    /// A dark frame whose words a band no longer reads: on to the next band, or (after the
    /// `last`) its slot back to the receiver and its buffer to the pool.
    fn hand_on_dark(&self, mut wk: Box<Work>, last: bool, e: &Emit<Box<Work>>) {
        if !last {
            e.send(0, wk);
            return;
        }
        self.rx.release(wk.ready.take().expect("still held")).expect(OWN_FRAME);
        let _ = self.pool.send(wk);
    }

    /// Replaces the converters' G0 pedestal with the one the bands wrote.
    fn publish_pedestal(&self) {
        self.cal.publish(&self.dark_mean.lock().expect("not poisoned"));
        ProcessCounts::add(&self.setup.board.process.pedestal_updates, 1);
    }

    /// The hit decision on a frame whose spots (found on keV) are in `wk.spots`: the spot
    /// list in the unit of the file's image, the counts, and the veto (a vetoed frame goes
    /// on to the write stage, which keeps the order, but is neither compressed nor written).
    pub(super) fn judge(&self, wk: &mut Work) {
        if self.decide(wk) {
            self.setup.board.show(self.glance(wk));
        }
    }

    /// [`Graph::judge`] but for showing the frame: returns whether a glance at it is due
    /// (the caller shows it once its image is there).
    pub(super) fn decide(&self, wk: &mut Work) -> bool {
        let (setup, counts) = (self.setup, &self.setup.board.process);
        // the finder sums keV; the file's spot list speaks the unit of its image
        if matches!(setup.pixel, PixelType::Photons16 | PixelType::Photons32) {
            wk.spots.iter_mut().for_each(|s| s.intensity /= setup.photon_kev);
        }
        wk.hit = is_hit(&wk.spots, setup.min_spots);
        if let Some(t) = wk.times.as_mut() {
            t.processed = Some(Instant::now());
        }
        ProcessCounts::add(&counts.spots_found, wk.spots.len() as u64);
        if wk.hit {
            ProcessCounts::add(&counts.hits, 1);
        } else if setup.veto {
            ProcessCounts::add(&counts.vetoed, 1);
            wk.vetoed = true;
        }
        if wk.hit {
            setup.board.glance_due()
        } else {
            setup.board.glance_due_without_hit()
        }
    }

    /// The file's chunk of a frame's image ([`ChunkMaker`]), made into `wk.chunk`.
    pub(super) fn compressor<'g>(&'g self) -> Box<dyn FnMut(&mut Work) + Send + 'g> {
        let mut c = ChunkMaker::new(self.setup);
        Box::new(move |wk: &mut Work| c.make(wk))
    }

    /// Compresses `wk`'s image unless the frame is vetoed or nobody would take its chunk.
    pub(super) fn compress_if_wanted(&self, compress: &mut dyn FnMut(&mut Work), wk: &mut Work) {
        // a frame whose image the GPU path did not fetch (nobody wanted it then) stays
        // without a chunk, as one that nobody wanted: the stream counts it as dropped
        wk.chunked = !wk.vetoed && (wk.image_valid || wk.counts != Counts::Stale) && self.demand.wanted();
        if wk.chunked {
            compress(wk);
            self.steps.compressed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The dashboard's look at a processed frame: the image (keV) and its spots.
    fn glance(&self, wk: &Work) -> Glance {
        let g = &self.setup.geometry;
        let spots = wk.spots.iter().map(|s| (s.x, s.y)).collect();
        Glance { frame: wk.frame, width: g.width(), height: g.height(), values: wk.image.clone(), spots, unit: "keV" }
    }

    /// Puts the frames back into the source's order, then publishes each chunk with its spot
    /// list on the stream and writes both; after a write error, frames are counted as not
    /// saved. Vetoed frames are only counted.
    fn write_worker<'g>(&'g self) -> WorkerFn<'g, Box<Work>> {
        let mut order = Reorder::new();
        Box::new(move |wk: Box<Work>, _: &Emit<Box<Work>>| {
            order.push(wk.seq, wk, |wk| self.write_one(wk));
            self.reorder_high_water.fetch_max(order.high_water as u64, Ordering::Relaxed);
        })
    }

    fn write_one(&self, wk: Box<Work>) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        if wk.vetoed {
            if let Some(t) = &wk.times {
                self.setup.board.record(t, None);
            }
            let _ = self.pool.send(wk);
            return;
        }
        if let Some(s) = self.stream.lock().expect("not poisoned").as_deref_mut() {
            self.demand.publish(s, wk.chunked, wk.frame, &wk.chunk.read(), &wk.missing, Some((&wk.spots, wk.hit)));
        }
        let frame_bytes = (self.setup.geometry.height() * self.setup.geometry.width() * self.setup.pixel.bytes()) as u64;
        let mut st = self.stats.lock().expect("not poisoned");
        let mut writer = self.writer.lock().expect("not poisoned");
        if st.write_error.is_some() {
            st.not_saved += 1;
        } else if let Some(wr) = writer.as_deref_mut() {
            let before = wr.bytes_written;
            match wr.write_shared(wk.frame, &wk.chunk, &wk.missing).and_then(|()| wr.write_spots(&wk.spots, wk.spots.len(), wk.hit)) {
                Ok(()) => {
                    st.written += 1;
                    st.bytes_out += wr.bytes_written - before;
                    (st.chunks_handed_on, st.io_waits) = (wr.chunks_handed_on, wr.io_waits);
                    st.bytes_in += frame_bytes;
                }
                Err(e) => st.write_failed(e),
            }
        }
        if let Some(t) = &wk.times {
            self.setup.board.record(t, Some(Instant::now()));
        }
        drop(st);
        drop(writer);
        match &self.setup.deliver {
            // a holder that went away takes no more frames: they go back to the pool
            Some(to) => {
                if let Err(e) = to.send(deliver::Processed::new(wk, self.setup.pixel, self.setup.photon_kev, self.pool.clone())) {
                    drop(e.into_inner());
                }
            }
            None => {
                let _ = self.pool.send(wk);
            }
        }
    }

    /// The process workers' time per frame in each step.
    fn step_report(&self) -> Vec<StepReport> {
        let st = &self.steps;
        let frames = st.frames.load(Ordering::Relaxed);
        if frames == 0 {
            return Vec::new();
        }
        let step = |name, ns: &AtomicU64| StepReport { name, frames, ms_per_frame: ns.load(Ordering::Relaxed) as f64 / 1e6 / frames as f64 };
        vec![step("convert", &st.convert), step("spots + veto", &st.spots), step("compress", &st.compress)]
    }

    /// The consumer's statistics and the processing report, from the source's counts, the
    /// stages' and the tracked calibration.
    fn report(self, stages: Vec<Arc<StageStats>>, mut r: ProcessReport) -> (ConsumeStats, ProcessReport) {
        r.take_counts(&self.setup.board.process);
        r.stages = stages.iter().map(|s| StageReport::of(s)).collect();
        r.steps = self.step_report();
        r.frames_compressed = self.steps.compressed.load(Ordering::Relaxed);
        r.reorder_high_water = self.reorder_high_water.load(Ordering::Relaxed) as usize;
        (r.veto, r.min_spots) = (self.setup.veto, self.setup.min_spots);
        let mut cal = (*self.cal.base).clone();
        cal.pedestal[0].copy_from_slice(self.cal.g0().values());
        r.calibration = Some(Arc::new(cal));
        let mut st = self.stats.into_inner().expect("not poisoned");
        st.latency = self.setup.board.latency();
        r.frames_written = st.written;
        (st, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publication_keeps_the_gaps_and_never_writes_a_pedestal_still_held() {
        let mask = vec![0, rdaq_detector::geometry::MASK_GAP, 0, 0];
        let base = Calibration { pedestal: [vec![7.0; 4], vec![0.0; 4], vec![0.0; 4]], gain: [vec![1.0; 4], vec![1.0; 4], vec![1.0; 4]], mask };
        let cal = SharedCal::new(Arc::new(base)).expect("a valid calibration");
        cal.publish(&[1.0, 2.0, 3.0, 4.0]);
        let held = cal.g0();
        assert_eq!(held.values(), [1.0, 7.0, 3.0, 4.0], "the gap pixel keeps the base's pedestal");
        // the first publication is held: the next two must not reuse its buffer
        cal.publish(&[5.0; 4]);
        cal.publish(&[6.0; 4]);
        assert_eq!(held.values(), [1.0, 7.0, 3.0, 4.0]);
        assert_eq!(cal.g0().values(), [6.0, 7.0, 6.0, 6.0]);
        assert_eq!(cal.generation.load(Ordering::Acquire), 3);
        // the second publication, held by nobody, leaves its buffer for the next one
        assert_eq!(cal.spare.lock().expect("not poisoned").len(), 4);
    }
}
