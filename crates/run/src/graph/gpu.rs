//! The graph's GPU path (docs/processing.md):
//!
//! ```text
//! signal -> gpu (n workers, sharing the device's lanes) -> write (reorders)
//! dark   -> pedestal (1, tracked on the device)
//! ```
//!
//! The device's frames in flight are its *lanes* ([`FrameLane`]: one frame's device buffers
//! and its own stream), fewer than the workers: a GPU worker takes a free lane, sends a
//! signal frame's module words from the receiver slot to the device (one copy, from
//! registered memory), waits for the strong pixels, groups them into spots, judges the frame,
//! brings its keV image back only when the frame is kept (written, streamed, delivered or
//! shown), and gives the lane back; then it gives the slot back and compresses. Frames take
//! the lanes in the order they come, so none waits behind many others on the device, and the
//! host's part of each frame (grouping, compression) runs on as many cores as there are
//! workers; the write stage puts the frames back in order.
//!
//! A device error is counted and reported; that frame and every later one are then
//! processed on the CPU by the same workers (the same results, more slowly), and the dark
//! frames by a CPU tracker that starts over. The run goes on.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver as ChanRx, Sender};

use rdaq_detector::{as_words, Geometry};
use rdaq_gpu::pedestal::DARK_IN_FLIGHT;
use rdaq_gpu::{ChainSetup, Counts as LaneCounts, Device, DevicePedestal, FrameLane, Found, GpuError, GpuPedestal, HostRegistration};
use rdaq_process::pipeline::{Emit, Failure, WorkerFn};
use rdaq_process::spots::LocalSnr;
use rdaq_process::Converter;
use rdaq_receiver::Receiver;
use rdaq_sink::PixelType;
use serde::Serialize;

use super::{Counts, DarkTracker, GpuBackend, Graph, Setup, Work, OWN_FRAME};
use crate::board::{Board, ProcessCounts};
use rdaq_proto::events::Event;

/// What the GPU path reports in the summary.
#[derive(Debug, Default, Serialize, Clone)]
pub struct GpuReport {
    pub device: String,
    /// Frames the device holds at once (process.gpu_lanes).
    pub lanes: usize,
    /// Times a GPU worker waited for a free lane (the device was the limit).
    pub lane_waits: u64,
    /// Whether the receiver's ring could be registered (page-locked) with the driver, so
    /// that frames are copied from their slots by DMA.
    pub ring_registered: bool,
    /// Frames whose pixels came back: a kept frame's photon counts when the file holds
    /// counts, else (and for glances) its keV image.
    pub images_copied_back: u64,
    /// Frames with more strong pixels than the device lists: found on the host.
    pub strong_overflow: u64,
    /// Device errors; after the first the frames are processed on the CPU.
    pub device_errors: u64,
    pub frames_on_cpu: u64,
    /// Frames a worker processed on the CPU while every lane was busy
    /// (process.gpu_cpu_workers), beside those after a device error.
    pub frames_shared_with_cpu: u64,
    pub first_error: Option<String>,
}

/// The GPU's pedestal tracker as the pedestal stage drives it, several dark frames queued
/// at once; after a device error, a CPU tracker of the whole image that starts over. The
/// stand-in's CPU tracker reads its frames as late as the device does.
pub(super) struct GpuTracker {
    gpu: Option<GpuPedestal>,
    cpu: Option<Box<dyn DarkTracker>>,
    /// The image's pixels, and the window, for the CPU tracker that may take over.
    pixels: usize,
    window: u32,
    /// The pedestal last computed on the device, for the lanes to take there.
    published: Arc<Published>,
    counts: Arc<Board>,
    errors: Arc<Errors>,
}

impl GpuTracker {
    /// After a device error: a CPU tracker of the image takes over, from nothing (dropping
    /// the device's tracker waits for the copies it was making).
    fn fail(&mut self, e: GpuError) {
        self.errors.record(&self.counts, "pedestal", &e);
        self.gpu = None;
        *self.published.lock().expect("not poisoned") = None;
        self.cpu = Some(Box::new(super::dark::Band::split(self.pixels, 1, self.window).pop().expect("an image has pixels")));
    }

    fn cpu(&mut self) -> &mut dyn DarkTracker {
        self.cpu.as_deref_mut().expect("a CPU tracker after a device error")
    }
}

impl DarkTracker for GpuTracker {
    unsafe fn push_frame(&mut self, g: &Geometry, words: &[u16]) {
        if let Some(t) = self.gpu.as_mut() {
            // SAFETY: this function's contract is the device tracker's: the caller keeps the
            // words until `reading` no longer counts the frame or this tracker is dropped.
            match unsafe { t.submit_words(words) } {
                Ok(()) => return,
                Err(e) => self.fail(e),
            }
        }
        // SAFETY: the same contract, passed on.
        unsafe { self.cpu().push_frame(g, words) }
    }

    fn reading(&mut self, keep: usize) -> usize {
        if let Some(t) = self.gpu.as_mut() {
            match t.reading(keep) {
                Ok(n) => return n,
                Err(e) => self.fail(e),
            }
        }
        self.cpu().reading(keep)
    }

    fn frames(&self) -> u64 {
        match (&self.gpu, &self.cpu) {
            (Some(t), _) => t.frames(),
            (None, Some(c)) => c.frames(),
            (None, None) => 0,
        }
    }

    fn mean_into(&mut self, out: &mut [f32]) -> bool {
        if let Some(t) = self.gpu.as_ref() {
            match t.mean_into(out) {
                Ok(on_device) => {
                    *self.published.lock().expect("not poisoned") = Some(on_device);
                    return true;
                }
                // the CPU tracker that takes over has no frames yet: nothing to publish
                Err(e) => {
                    self.fail(e);
                    return false;
                }
            }
        }
        self.cpu().mean_into(out)
    }
}

/// Where the device's tracker leaves the pedestal it computed before the graph publishes it
/// (the lanes then copy it there; `None` while the pedestal comes from the host).
type Published = std::sync::Mutex<Option<DevicePedestal>>;

/// The device errors of the run, shared by the GPU stages: counted on the board (the
/// summary, `/metrics`), the first kept for the summary.
#[derive(Default)]
pub(super) struct Errors {
    first: std::sync::Mutex<Option<String>>,
}

impl Errors {
    fn record(&self, board: &Board, stage: &str, e: &GpuError) {
        ProcessCounts::add(&board.process.device_errors, 1);
        let line = format!("{stage}: {e}");
        board.push_event(Event::Error { source: "gpu".into(), message: line.clone() });
        let mut first = self.first.lock().expect("not poisoned");
        if first.is_none() {
            eprintln!("rdaq: GPU {line}; the run goes on on the CPU");
            *first = Some(line);
        }
    }
}

/// The receiver's ring and the frame buffers' images registered with the driver: the ring
/// first (an empty list: the ring could not be registered, and nothing else is tried).
fn register(dev: &Device, rx: &Receiver, images: &[(*const u8, usize)]) -> Vec<HostRegistration> {
    let (start, end) = rx.ring_span();
    // SAFETY: the ring is mapped for the receiver's life, which outlasts the graph and so
    // this registration (dropped with the Offload, inside `graph::run`).
    let Ok(ring) = (unsafe { HostRegistration::new(&dev.ctx, start as *const u8, end - start) }) else {
        return Vec::new();
    };
    let mut registered = vec![ring];
    for &(p, len) in images {
        // SAFETY: the frame buffers' images live as long as the pool, which `graph::run`
        // drops after the Offload; their length never changes.
        registered.extend(unsafe { HostRegistration::new(&dev.ctx, p, len) }.ok());
    }
    registered
}

/// Where a GPU worker processes its frame ([`Offload::take`]).
enum Take<'a> {
    Lane(Box<dyn FrameLane>),
    /// On the CPU while every lane is busy.
    Shared(CpuTurn<'a>),
    /// On the CPU since a device error.
    AfterError,
}

/// A worker's turn at processing a frame on the CPU while the lanes are busy: counted when it
/// ends.
struct CpuTurn<'a>(&'a Offload);

impl Drop for CpuTurn<'_> {
    fn drop(&mut self) {
        self.0.shared.fetch_add(1, Ordering::Relaxed);
        self.0.cpu_now.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the GPU workers share: the free lanes, the memory registered with the driver, and
/// the counts.
pub(super) struct Offload {
    device: String,
    free: (Sender<Box<dyn FrameLane>>, ChanRx<Box<dyn FrameLane>>),
    lanes: usize,
    lane_waits: AtomicU64,
    /// Set at the first device error: every worker then processes on the CPU.
    failed: AtomicBool,
    /// The graph's: a worker that panicked holding a lane took it with it, so once it is
    /// set no worker waits for a lane any more.
    graph_failure: OnceLock<Arc<Failure>>,
    published: Arc<Published>,
    errors: Arc<Errors>,
    images: AtomicU64,
    overflow: AtomicU64,
    on_cpu: AtomicU64,
    /// Workers that may process a frame on the CPU at once while every lane is busy, those
    /// doing so now, and the frames they processed.
    cpu_max: usize,
    cpu_now: AtomicUsize,
    shared: AtomicU64,
    ring_registered: bool,
    /// Dropped last (after the lanes, whose drop waits for their copies).
    _registered: Vec<HostRegistration>,
}

impl Offload {
    /// The lanes and the pedestal tracker for `setup` on `backend`; on a device,
    /// registers the receiver's ring and the frame buffers' images, so that copies run as
    /// DMA (where registration is refused, the driver stages them: slower, the same results).
    pub(super) fn new(backend: &GpuBackend, setup: &Setup, rx: &Receiver, images: &[(*const u8, usize)]) -> anyhow::Result<(Offload, GpuTracker)> {
        let g = setup.geometry;
        let (pixels, words, n) = (g.height() * g.width(), g.modules as usize * g.module_pixels(), setup.gpu_lanes.max(1));
        let (errors, published) = (Arc::new(Errors::default()), Arc::new(Published::default()));
        let mut tracker = GpuTracker { gpu: None, cpu: None, pixels, window: setup.window, published: published.clone(), counts: setup.board.clone(), errors: errors.clone() };
        let mut registered = Vec::new();
        let (device, lanes): (String, Vec<Box<dyn FrameLane>>) = match backend {
            GpuBackend::Device(dev) => {
                let map = g.pixel_map();
                let chain = ChainSetup { width: g.width(), height: g.height(), words, src_of: &map, calibration: &setup.calibration, invalid: setup.invalid, finder: setup.finder };
                let lanes = rdaq_gpu::chain::lanes(dev, &chain, n)?;
                tracker.gpu = Some(GpuPedestal::new(dev, pixels, 0, setup.window)?.assembling(dev, &map, words)?);
                registered = register(dev, rx, images);
                (dev.name.clone(), lanes.into_iter().map(|l| Box::new(l) as Box<dyn FrameLane>).collect())
            }
            GpuBackend::StandIn(fail) => {
                let runs = g.runs_in_image_order();
                let lanes = rdaq_gpu::standin::lanes(n, g.width(), g.height(), words, runs, setup.calibration.clone(), setup.invalid, setup.finder, pixels / 16, *fail)?;
                let band = super::dark::Band::split(pixels, 1, setup.window).pop().expect("an image has pixels");
                tracker.cpu = Some(Box::new(super::dark::Deferred::new(band, g, DARK_IN_FLIGHT)));
                ("CPU stand-in".to_string(), lanes.into_iter().map(|l| Box::new(l) as Box<dyn FrameLane>).collect())
            }
        };
        let ring_registered = !registered.is_empty();
        let count = lanes.len();
        let free = crossbeam_channel::bounded(count);
        for l in lanes {
            free.0.send(l).expect("room for every lane");
        }
        let offload = Offload {
            device,
            free,
            lanes: count,
            lane_waits: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            graph_failure: OnceLock::new(),
            published,
            errors,
            images: AtomicU64::new(0),
            overflow: AtomicU64::new(0),
            on_cpu: AtomicU64::new(0),
            cpu_max: setup.gpu_cpu_workers,
            cpu_now: AtomicUsize::new(0),
            shared: AtomicU64::new(0),
            ring_registered,
            _registered: registered,
        };
        Ok((offload, tracker))
    }

    /// Where a worker's next frame goes: a free lane; while all are in use, the CPU if fewer
    /// than `cpu_max` workers process a frame there; else the next lane to come free,
    /// waiting (counted). The CPU once the device has failed.
    fn take(&self) -> Take<'_> {
        if self.failed.load(Ordering::Relaxed) {
            return Take::AfterError;
        }
        if let Ok(l) = self.free.1.try_recv() {
            return Take::Lane(l);
        }
        let turn = self.cpu_now.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.cpu_max).then_some(n + 1));
        if turn.is_ok() {
            return Take::Shared(CpuTurn(self));
        }
        self.lane().map_or(Take::AfterError, Take::Lane)
    }

    /// Where the GPU workers learn that one of the graph's workers panicked.
    pub(super) fn watch(&self, failure: Arc<Failure>) {
        let _ = self.graph_failure.set(failure);
    }

    /// The next lane to come free, waiting (counted); `None` once the device has failed (a
    /// failed frame's lane is not given back) or a worker panicked (and may have held one).
    fn lane(&self) -> Option<Box<dyn FrameLane>> {
        self.lane_waits.fetch_add(1, Ordering::Relaxed);
        let graph_failed = || self.graph_failure.get().is_some_and(|f| f.is_set());
        while !self.failed.load(Ordering::Relaxed) && !graph_failed() {
            if let Ok(l) = self.free.1.recv_timeout(Duration::from_millis(20)) {
                return Some(l);
            }
        }
        None
    }

    fn fail(&self, board: &Board, e: &GpuError) {
        self.failed.store(true, Ordering::Relaxed);
        self.errors.record(board, "gpu", e);
    }

    pub(super) fn report(&self, board: &Board) -> GpuReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        GpuReport {
            device: self.device.clone(),
            lanes: self.lanes,
            lane_waits: get(&self.lane_waits),
            ring_registered: self.ring_registered,
            images_copied_back: get(&self.images),
            strong_overflow: get(&self.overflow),
            device_errors: ProcessCounts::get(&board.process.device_errors),
            frames_on_cpu: get(&self.on_cpu),
            frames_shared_with_cpu: get(&self.shared),
            first_error: self.errors.first.lock().expect("not poisoned").clone(),
        }
    }
}

impl Graph<'_> {
    /// A GPU worker (the `k`-th): each signal frame through a free lane, or on the CPU once
    /// the device has failed; then compressed.
    pub(super) fn gpu_worker<'g>(&'g self, off: &'g Offload, k: usize) -> WorkerFn<'g, Box<Work>> {
        let runs = self.setup.geometry.runs_in_image_order();
        let mut finder = LocalSnr::new(self.setup.finder);
        let (mut strong, mut compress) = (Vec::new(), self.compressor());
        let mut cpu: Option<(u64, Converter)> = None;
        let mut pinned = false;
        Box::new(move |mut wk: Box<Work>, e: &Emit<Box<Work>>| {
            super::pin_once(&mut pinned, &self.setup.cpus, k);
            match off.take() {
                #[cfg(test)]
                Take::Lane(_) if wk.frame == crate::fault::PANIC_FRAME => crate::fault::bug_at(wk.frame),
                Take::Lane(mut l) => match self.spots_on_device(off, l.as_mut(), &mut finder, &mut strong, &mut wk) {
                    Ok(()) => {
                        self.judge_and_fetch(off, &mut l, &mut cpu, &runs, &mut wk);
                        if !off.failed.load(Ordering::Relaxed) {
                            // the free queue has room for every lane: this send does not wait
                            let _ = off.free.0.send(l);
                        }
                    }
                    Err(err) => {
                        off.fail(&self.setup.board, &err);
                        // dropping the lane waits for its copies: the slot is then free to go
                        drop(l);
                        self.frame_on_cpu(&mut cpu, &runs, &mut finder, &mut wk);
                        off.on_cpu.fetch_add(1, Ordering::Relaxed);
                    }
                },
                Take::Shared(turn) => {
                    self.frame_on_cpu(&mut cpu, &runs, &mut finder, &mut wk);
                    drop(turn);
                }
                Take::AfterError => {
                    self.frame_on_cpu(&mut cpu, &runs, &mut finder, &mut wk);
                    off.on_cpu.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.rx.release(wk.ready.take().expect("signal frames come with their slot")).expect(OWN_FRAME);
            self.compress_if_wanted(&mut compress, &mut wk);
            e.send(0, wk);
        })
    }

    /// The whole frame on the CPU, as a process worker does it: its image, its spots, the
    /// decision.
    fn frame_on_cpu(&self, cpu: &mut Option<(u64, Converter)>, runs: &[(usize, usize, usize)], finder: &mut LocalSnr, wk: &mut Work) {
        self.image_on_cpu(cpu, runs, wk);
        let mut spots = std::mem::take(&mut wk.spots);
        let g = &self.setup.geometry;
        finder.find(&wk.image, g.width(), g.height(), &mut spots);
        wk.spots = spots;
        self.judge(wk);
    }

    /// The frame's spots through `lane`: its words to the device, the strong pixels back,
    /// grouped (or, when the device lists too many, the image back and searched here).
    fn spots_on_device(&self, off: &Offload, lane: &mut dyn FrameLane, finder: &mut LocalSnr, strong: &mut Vec<(u32, f32)>, wk: &mut Work) -> Result<(), GpuError> {
        let gen = self.cal.generation.load(Ordering::Acquire);
        if gen != lane.pedestal_generation() {
            // the device's own pedestal, where its tracker made it (the one the graph
            // publishes, or a later one), rather than the host's copy through every lane
            let on_device = off.published.lock().expect("not poisoned").clone();
            match on_device {
                Some(p) => lane.set_pedestal_device(&p, gen)?,
                None => lane.set_pedestal(self.cal.g0().values(), gen)?,
            }
        }
        let f = wk.ready.as_ref().expect("signal frames come with their slot");
        let words = as_words(self.rx.data(f).expect(OWN_FRAME));
        // SAFETY: the words are the slot's, held in `wk.ready` until after the lane's results
        // are in (below) or the lane is dropped (on an error), which waits for its copies.
        unsafe { lane.submit(words) }?;
        let (width, height) = (self.setup.geometry.width(), self.setup.geometry.height());
        wk.image_valid = false;
        let mut spots = std::mem::take(&mut wk.spots);
        let found = lane.strong_pixels(strong);
        match found {
            Ok(Found::Listed(_)) => finder.group_strong_pixels(width, strong.iter().copied(), &mut spots),
            Ok(Found::TooMany(_)) => {
                off.overflow.fetch_add(1, Ordering::Relaxed);
                lane.image_into(&mut wk.image)?;
                wk.image_valid = true;
                finder.find(&wk.image, width, height, &mut spots);
            }
            Err(_) => {}
        }
        wk.spots = spots;
        found.map(drop)
    }

    /// The hit decision on the spots found, then the keV image from `lane` if the frame is
    /// kept or shown; if the device fails now, the image is converted on the CPU (with the
    /// pedestal in use then) and the frame is not judged again.
    fn judge_and_fetch(&self, off: &Offload, lane: &mut Box<dyn FrameLane>, cpu: &mut Option<(u64, Converter)>, runs: &[(usize, usize, usize)], wk: &mut Work) {
        let glance = self.decide(wk);
        if !wk.image_valid && (glance || self.image_kept(wk)) {
            match self.fetch(lane.as_mut(), glance, wk) {
                Ok(()) => {
                    off.images.fetch_add(1, Ordering::Relaxed);
                }
                Err(err) => {
                    off.fail(&self.setup.board, &err);
                    self.image_on_cpu(cpu, runs, wk);
                }
            }
        }
        if glance {
            self.setup.board.show(self.glance(wk));
        }
    }

    /// A kept frame's pixels from `lane`: its photon counts when the file holds counts and
    /// no glance wants its keV (half the bytes back for int16, and nothing to convert
    /// here), bitshuffled there too unless a program in this process reads them; else its
    /// keV image.
    fn fetch(&self, lane: &mut dyn FrameLane, glance: bool, wk: &mut Work) -> Result<(), GpuError> {
        let e = self.setup.photon_kev;
        let (shuffle, held) = match self.setup.deliver {
            Some(_) => (None, Counts::Plain),
            None => (Some(super::chunk_block_elems(self.setup.pixel)), Counts::Shuffled),
        };
        match self.setup.pixel {
            PixelType::Photons16 if !glance => lane.photons_into(e, shuffle, LaneCounts::I16(&mut wk.counts16)).map(|()| wk.counts = held),
            PixelType::Photons32 if !glance => lane.photons_into(e, shuffle, LaneCounts::I32(&mut wk.counts32)).map(|()| wk.counts = held),
            _ => lane.image_into(&mut wk.image).map(|()| wk.image_valid = true),
        }
    }

    /// Whether anything downstream reads the frame's image: the chunk of a frame that is not
    /// vetoed (for the file or the stream), or a program in this process reading frames.
    fn image_kept(&self, wk: &Work) -> bool {
        !wk.vetoed && (self.demand.wanted() || self.setup.deliver.is_some())
    }

    /// The frame's keV image converted on the CPU from its slot (after a device error), as
    /// a process worker does; the converter follows the published pedestal.
    fn image_on_cpu(&self, cpu: &mut Option<(u64, Converter)>, runs: &[(usize, usize, usize)], wk: &mut Work) {
        let (seen, conv) = cpu.get_or_insert_with(|| (0, Converter::shared(self.cal.base.clone(), self.setup.invalid).expect("the calibration was checked when the run started")));
        *seen = self.cal.follow(*seen, conv);
        let f = wk.ready.as_ref().expect("signal frames come with their slot");
        let words = as_words(self.rx.data(f).expect(OWN_FRAME));
        conv.to_kev_runs(runs, words, &mut wk.image);
        wk.image_valid = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::graph::deliver::{Pixels, Processed};
    use rdaq_detector::jungfrau::{MODULE_BYTES, MODULE_PIXELS};
    use rdaq_detector::ModuleSynth;
    use rdaq_gpu::standin::Failures;
    use rdaq_process::kev_to_photons;
    use rdaq_process::pipeline::{Pipeline, Policy, WhenFull};
    use rdaq_process::spots::Spot;

    /// What the graph delivered of one frame: number, pixels, spots, hit.
    type Seen = (u64, Vec<i64>, Vec<Spot>, bool);

    /// The graph over `frames` frames of two emulated modules (a dark frame, then a signal
    /// frame, no veto: every signal frame is delivered) from a ring of only 6 slots, which
    /// the feeder refills as soon as they are given back: a slot given back before the lane
    /// read it would change what the lane sees.
    /// Two emulated modules, three workers and two lanes, no veto.
    fn two_modules() -> Config {
        let mut cfg = Config::default();
        (cfg.detector.modules, cfg.process.veto, cfg.process.workers, cfg.process.gpu_lanes) = (2, false, 3, 2);
        cfg
    }

    /// With `file`, the frames go to that file (master) instead of being delivered.
    fn run_graph(gpu: Option<GpuBackend>, frames: u64, file: Option<&std::path::Path>) -> (Vec<Seen>, crate::graph::ProcessReport) {
        run_graph_of(two_modules(), gpu, frames, file)
    }

    fn run_graph_of(cfg: Config, gpu: Option<GpuBackend>, frames: u64, file: Option<&std::path::Path>) -> (Vec<Seen>, crate::graph::ProcessReport) {
        let (seen, _, report) = run_graph_from(cfg, gpu, 0, frames, file);
        (seen, report)
    }

    /// Frames `first..first + frames` through the graph; also what the source counted.
    fn run_graph_from(cfg: Config, gpu: Option<GpuBackend>, first: u64, frames: u64, file: Option<&std::path::Path>) -> (Vec<Seen>, crate::consume::ConsumeStats, crate::graph::ProcessReport) {
        let g = cfg.geometry().expect("two modules");
        let (meta, setup) = crate::plan::plan(&cfg, g, None).expect("a plan");
        let (tx, delivered) = crossbeam_channel::bounded::<Processed>(4);
        let mut writer = file.map(|p| rdaq_sink::NxmxWriter::create(p, &meta, true).expect("a file"));
        let setup = crate::graph::Setup { gpu, deliver: file.is_none().then_some(tx), ..setup.expect("processing") };
        let (rx, mut placer) = Receiver::in_memory(2, MODULE_BYTES as u64, 6).expect("an in-memory receiver");
        let mut synths: Vec<ModuleSynth> = (0..2).map(|m| ModuleSynth::new(cfg.synth(), m)).collect();
        let bar = indicatif::ProgressBar::hidden();
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut words = vec![0u16; 2 * MODULE_PIXELS];
                for f in first..first + frames {
                    let free = placer.free().next();
                    let slot = free.unwrap_or_else(|| placer.wait_released().expect("the graph gives slots back"));
                    for (m, syn) in synths.iter_mut().enumerate() {
                        syn.frame(f, &mut words[m * MODULE_PIXELS..(m + 1) * MODULE_PIXELS]);
                    }
                    for (b, w) in placer.slot_mut(slot).chunks_exact_mut(2).zip(&words) {
                        b.copy_from_slice(&w.to_le_bytes());
                    }
                    placer.hand(slot, f);
                }
            });
            let seen = s.spawn(move || {
                delivered
                    .iter()
                    .map(|p| {
                        let pixels: Vec<i64> = match p.pixels() {
                            Pixels::I16(v) => v.iter().map(|&x| x as i64).collect(),
                            Pixels::I32(v) => v.iter().map(|&x| x as i64).collect(),
                            Pixels::F32(v) => v.iter().map(|&x| x.to_bits() as i64).collect(),
                            Pixels::Counts { bytes, .. } => bytes.iter().map(|&x| x as i64).collect(),
                        };
                        let (spots, hit) = p.spots();
                        (p.frame(), pixels, spots.to_vec(), hit)
                    })
                    .collect::<Vec<Seen>>()
            });
            let (consumed, report) = crate::graph::run(&rx, writer.as_mut(), None, setup, &bar, None, &mut |_| {}).expect("the graph runs");
            if let Some(w) = writer {
                w.finish().expect("the file closes");
            }
            (seen.join().expect("the reader"), consumed, report)
        })
    }

    #[test]
    fn a_worker_that_panics_ends_the_graph_and_every_frame_not_delivered_is_counted() {
        // even frames dark: the panic frame is the fourth signal frame of the twelve
        let first = crate::fault::PANIC_FRAME - 7;
        for gpu in [None, Some(GpuBackend::StandIn(Failures::default()))] {
            let mut cfg = two_modules();
            // on the GPU path the worker that panics holds the only lane
            cfg.process.gpu_lanes = 1;
            let what = if gpu.is_some() { "gpu" } else { "cpu" };
            let (seen, consumed, _) = run_graph_from(cfg, gpu, first, 24, None);
            let why = consumed.stage_failure.expect("the panic is reported");
            assert!(why.contains("panicked") && why.contains("a bug met frame 7777777"), "{what}: {why}");
            let delivered: Vec<u64> = seen.iter().map(|s| s.0).collect();
            assert_eq!(delivered, [first + 1, first + 3, first + 5], "{what}: the frames before it, in order");
            assert_eq!(consumed.not_saved, 9, "{what}: the frame and every signal frame after it counted");
        }
    }

    #[test]
    fn the_gpu_path_writes_the_frames_the_cpu_graph_writes() {
        let dir = std::env::temp_dir().join(format!("rdaq-gpu-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let cfg = two_modules();
        let (meta, _) = crate::plan::plan(&cfg, cfg.geometry().expect("two modules"), None).expect("a plan");
        let written = |name: &str, gpu: Option<GpuBackend>| {
            let master = dir.join(format!("{name}_master.h5"));
            let (_, report) = run_graph(gpu, 24, Some(&master));
            let data = rdaq_sink::FrameReader::open(&dir.join(rdaq_sink::data_file_name(&master, 1)), "entry/data/data").expect("the data file");
            let frames: Vec<Vec<u8>> = (0..data.frames).map(|i| data.read_bytes(i, meta.pixel).expect("a frame")).collect();
            (frames, report)
        };
        let (want, _) = written("cpu", None);
        let (got, report) = written("standin", Some(GpuBackend::StandIn(Failures::default())));
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(want.len(), 12, "every signal frame written");
        assert!(got == want, "the frames written differ from the CPU graph's");
        assert!(report.gpu.expect("the GPU path's report").images_copied_back > 0, "kept frames came back from the lanes");
    }

    #[test]
    fn a_worker_takes_the_cpu_while_every_lane_is_busy_up_to_the_limit() {
        let mut cfg = two_modules();
        (cfg.process.gpu_lanes, cfg.process.gpu_cpu_workers) = (1, 1);
        let (_, setup) = crate::plan::plan(&cfg, cfg.geometry().expect("two modules"), None).expect("a plan");
        let setup = setup.expect("processing");
        let (rx, _placer) = Receiver::in_memory(2, MODULE_BYTES as u64, 2).expect("an in-memory receiver");
        let (off, _tracker) = Offload::new(&GpuBackend::StandIn(Failures::default()), &setup, &rx, &[]).expect("the stand-in's lanes");
        let Take::Lane(lane) = off.take() else { panic!("the free lane first") };
        let Take::Shared(turn) = off.take() else { panic!("the CPU while the only lane is busy") };
        // the one turn on the CPU is taken too: the next worker waits for the lane
        let waited = std::thread::scope(|s| {
            let next = s.spawn(|| matches!(off.take(), Take::Lane(_)));
            while off.lane_waits.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            off.free.0.send(lane).expect("room for the lane");
            next.join().expect("the waiting worker")
        });
        assert!(waited, "the lane given back goes to the worker waiting for it");
        assert_eq!(off.shared.load(Ordering::Relaxed), 0, "counted when the turn ends");
        drop(turn);
        assert_eq!((off.shared.load(Ordering::Relaxed), off.cpu_now.load(Ordering::Relaxed)), (1, 0));
    }

    #[test]
    fn no_worker_waits_for_a_lane_once_a_worker_panicked() {
        let mut cfg = two_modules();
        cfg.process.gpu_lanes = 1;
        let (_, setup) = crate::plan::plan(&cfg, cfg.geometry().expect("two modules"), None).expect("a plan");
        let (rx, _placer) = Receiver::in_memory(2, MODULE_BYTES as u64, 2).expect("an in-memory receiver");
        let (off, _tracker) = Offload::new(&GpuBackend::StandIn(Failures::default()), &setup.expect("processing"), &rx, &[]).expect("the stand-in's lanes");
        // the worker that panicked held the only lane
        let Take::Lane(held) = off.take() else { panic!("the free lane first") };
        std::thread::scope(|s| {
            let mut p: Pipeline<()> = Pipeline::default();
            let bug = p.stage("bug", 1, 1, |_| Box::new(|(), _: &Emit<()>| panic!("a bug")));
            let src = p.source(bug, Policy::RoundRobin, WhenFull::Block);
            off.watch(p.failure());
            let waiting = s.spawn(|| off.lane().is_none());
            let running = p.spawn(s);
            src.send(());
            drop(src);
            running.join();
            assert!(waiting.join().expect("the waiting worker"), "a worker waiting for a lane gives up once the graph failed");
        });
        drop(held);
    }

    #[test]
    fn frames_shared_with_the_cpu_are_the_ones_the_cpu_graph_delivers() {
        let (want, _) = run_graph(None, 24, None);
        let mut cfg = two_modules();
        (cfg.process.gpu_lanes, cfg.process.gpu_cpu_workers) = (1, 2);
        let (got, report) = run_graph_of(cfg, Some(GpuBackend::StandIn(Failures::default())), 24, None);
        assert!(got == want, "the frames delivered differ from the CPU graph's");
        let gpu = report.gpu.expect("the GPU path's report");
        assert_eq!(gpu.images_copied_back + gpu.frames_shared_with_cpu, 12, "every frame's image came from the lane or the CPU");
        assert_eq!((gpu.device_errors, gpu.frames_on_cpu), (0, 0));
    }

    #[test]
    fn the_gpu_path_delivers_what_the_cpu_graph_does_in_order_and_survives_device_errors() {
        let frames = 24;
        let (want, cpu) = run_graph(None, frames, None);
        assert_eq!(want.len(), 12, "every signal frame");
        assert!(want.windows(2).all(|w| w[0].0 < w[1].0), "in frame order");
        assert!(want.iter().any(|s| !s.2.is_empty()), "the frames have spots");
        assert!(cpu.gpu.is_none());
        let fails = [Failures::default(), Failures { submit: Some(3), ..Default::default() }, Failures { wait: Some(5), ..Default::default() }, Failures { image: Some(4), ..Default::default() }];
        for fail in fails {
            let (got, report) = run_graph(Some(GpuBackend::StandIn(fail)), frames, None);
            assert!(got == want, "{fail:?}: the frames delivered differ from the CPU graph's");
            let gpu = report.gpu.as_ref().expect("the GPU path's report");
            let failing = fail.submit.is_some() || fail.wait.is_some() || fail.image.is_some();
            assert_eq!(gpu.device_errors, failing as u64, "{fail:?}");
            assert_eq!(gpu.frames_on_cpu > 0, failing, "{fail:?}: frames after the error go to the CPU");
            let lost_image = fail.image.is_some() as u64;
            assert_eq!(gpu.images_copied_back + gpu.frames_on_cpu + lost_image, 12, "{fail:?}: every delivered frame's image came from its lane, or the CPU");
            let counts = |r: &crate::graph::ProcessReport| (r.signal_frames, r.hits, r.vetoed, r.spots_found);
            assert_eq!(counts(&report), counts(&cpu), "{fail:?}: each frame judged once");
        }
    }

    #[test]
    fn counts_from_the_device_plain_or_bitshuffled_make_the_chunk_the_kev_image_makes() {
        let mut cfg = Config::default();
        cfg.detector.modules = 1;
        let g = cfg.geometry().expect("one module");
        let (_, setup) = crate::plan::plan(&cfg, g, None).expect("a plan");
        let mut setup = setup.expect("processing");
        let n = g.height() * g.width();
        let kev = |i: usize| match i % 997 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            k => (k as f32 - 40.0) * 1.37,
        };
        for pixel in [PixelType::Photons16, PixelType::Photons32] {
            setup.pixel = pixel;
            let mut wk = Work::new(n, Some(pixel));
            wk.image.iter_mut().enumerate().for_each(|(i, v)| *v = kev(i));
            let mut maker = crate::graph::ChunkMaker::new(&setup);
            maker.make(&mut wk);
            let from_kev = std::mem::take(&mut *wk.chunk.make_mut());
            match pixel {
                PixelType::Photons16 => kev_to_photons(&wk.image, setup.photon_kev, &mut wk.counts16),
                _ => kev_to_photons(&wk.image, setup.photon_kev, &mut wk.counts32),
            }
            wk.image.fill(f32::NAN);
            wk.counts = Counts::Plain;
            maker.make(&mut wk);
            assert!(*wk.chunk.read() == from_kev, "{pixel:?}: the chunk of the counts differs");
            let block = crate::graph::chunk_block_elems(pixel);
            match pixel {
                PixelType::Photons16 => shuffle_in_place(&mut wk.counts16, block),
                _ => shuffle_in_place(&mut wk.counts32, block),
            }
            wk.counts = Counts::Shuffled;
            maker.make(&mut wk);
            assert!(*wk.chunk.read() == from_kev, "{pixel:?}: the chunk of the bitshuffled counts differs");
        }
    }

    /// What the device's bitshuffle makes of `v`, on the CPU.
    fn shuffle_in_place<T: rdaq_process::Plain>(v: &mut [T], block: usize) {
        let plain = rdaq_process::bytes_of(v).to_vec();
        rdaq_process::bitshuffle::shuffle_blocks(&plain, std::mem::size_of::<T>(), block, rdaq_process::bytes_of_mut(v));
    }
}
