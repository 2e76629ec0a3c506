//! The online processing graph of `rdaq run` for JUNGFRAU (docs/processing.md):
//!
//! ```text
//! receiver ring --(dark)--> pedestal (1) --publishes G0 pedestal--> convert workers
//!               --(signal)-> convert (n) -> spots + veto (n) -> compress (n) -> write (1)
//! ```
//!
//! Frames move as pooled `Box<Work>` buffers. Conversion reads each module straight from
//! its receiver slot and writes keV into the assembled image (assembly and conversion in
//! one pass), then gives the slot back; dark frames go to the pedestal tracker, which
//! reads the raw words and gives the slot back. Every stage runs on the pipeline graph of
//! `rdaq_process::pipeline`, with its counters in the summary.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver as ChanRx, Sender};
use indicatif::ProgressBar;
use rdaq_detector::jungfrau::{ModuleCalibration, MODULE_PIXELS};
use rdaq_detector::{as_words, Chopper, Geometry};
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::pedestal::Pedestal;
use rdaq_process::pipeline::{Emit, Pipeline, Policy, Port, StageStats, WhenFull, WorkerFn};
use rdaq_process::spots::{is_hit, LocalSnr, LocalSnrParams, Spot};
use rdaq_process::{bytes_of, kev_to_photons, Calibration, Converter, InvalidGain};
use rdaq_receiver::{FrameReady, FrameStatus, Receiver};
use rdaq_sink::{NxmxWriter, PixelType};

use crate::board::{incomplete_event, Board, Glance, ProcessCounts};
use crate::latency::FrameTimes;
use crate::stream::Stream;
use serde::Serialize;

use crate::consume::{missing_ranges, next_frame, ConsumeStats};

mod gpu;

/// What a stage expects of the frames it is given: taken from the receiver it reads.
const OWN_FRAME: &str = "a handed frame of this receiver";

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
    pub workers: [usize; 3],
    pub ring_frames: usize,
    /// The source waits this long per frame (testing: a consumer slower than the detector).
    pub consumer_delay: std::time::Duration,
    /// Conversion and spot finding on this GPU instead of the CPU (issue 13, in progress).
    pub gpu: Option<rdaq_gpu::Device>,
    /// The detector of this process, whose send times start each frame's latency.
    pub sent: Option<Arc<rdaq_emulator::Control>>,
    /// Where the graph shows its stages, counts, latency and latest image while it runs.
    pub board: Arc<Board>,
}

/// The calibration of the emulated detector in image coordinates: each module's synthetic
/// calibration at its place, gap pixels masked (NXmx bit 0).
pub fn emulated_calibration(seed: u64, g: &Geometry) -> Calibration {
    let px = g.height() * g.width();
    let mut cal = Calibration { pedestal: [vec![0.0; px], vec![0.0; px], vec![0.0; px]], gain: [vec![1.0; px], vec![1.0; px], vec![1.0; px]], mask: g.gap_mask() };
    for m in 0..g.modules {
        let mc = ModuleCalibration::synthetic(seed, m);
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
    ready: Option<FrameReady>,
    missing: Vec<(usize, usize)>,
    image: Vec<f32>,
    spots: Vec<Spot>,
    hit: bool,
    chunk: Vec<u8>,
    times: Option<FrameTimes>,
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
    /// Waits of the source for a free frame buffer (the graph's back-pressure).
    pub pool_waits: u64,
    pub stages: Vec<StageReport>,
    /// The tracked pedestal at the end (G0), to be saved with the calibration.
    #[serde(skip)]
    pub calibration: Option<Arc<Calibration>>,
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

/// What the pedestal stage tracks dark frames with: the CPU's tracker, or the GPU's.
trait DarkTracker: Send {
    /// Adds one complete dark frame, the slot's module words.
    fn push_frame(&mut self, g: &Geometry, words: &[u16]);
    /// Dark frames added so far.
    fn frames(&self) -> u64;
    /// The G0 pedestal per image pixel (gap pixels, never sampled, are replaced on publishing).
    fn mean_into(&mut self, out: &mut [f32]);
}

impl DarkTracker for Pedestal<f64> {
    fn push_frame(&mut self, g: &Geometry, words: &[u16]) {
        for m in 0..g.modules {
            let module = &words[m as usize * MODULE_PIXELS..(m as usize + 1) * MODULE_PIXELS];
            g.module_runs(m, |from, at, run| self.push_at(at, &module[from..from + run]));
        }
        self.frame_done();
    }

    fn frames(&self) -> u64 {
        Pedestal::frames(self)
    }

    fn mean_into(&mut self, out: &mut [f32]) {
        Pedestal::mean_into(self, out);
    }
}

/// The calibration the converters use, replaced when the tracked pedestal is published.
struct SharedCal {
    cal: RwLock<Arc<Calibration>>,
    generation: AtomicU64,
}

/// The pooled frame buffers: enough for every ring of the graph to be full.
fn work_pool(setup: &Setup) -> (Sender<Box<Work>>, ChanRx<Box<Work>>) {
    let pixels = setup.geometry.height() * setup.geometry.width();
    let pool_size = (setup.workers.iter().sum::<usize>() + 2) * setup.ring_frames + 4;
    let (tx, rx) = bounded::<Box<Work>>(pool_size);
    for _ in 0..pool_size {
        let image = vec![f32::NAN; pixels];
        tx.send(Box::new(Work { frame: 0, ready: None, missing: Vec::new(), image, spots: Vec::new(), hit: false, chunk: Vec::new(), times: None })).expect("pool has room");
    }
    (tx, rx)
}

/// What the stages share: the receiver they read, the settings, the calibration in use,
/// the file, the counts, and the pool their buffers go back to.
struct Graph<'a> {
    rx: &'a Receiver,
    setup: &'a Setup,
    cal: SharedCal,
    stats: Mutex<ConsumeStats>,
    writer: Mutex<&'a mut NxmxWriter>,
    stream: Mutex<Option<&'a mut Stream>>,
    pool: Sender<Box<Work>>,
}

/// Runs the graph until the receiver finishes (or `until` is set and no frame waits).
pub fn run(rx: &Receiver, writer: &mut NxmxWriter, stream: Option<&mut Stream>, setup: Setup, bar: &ProgressBar, until: Option<&AtomicBool>) -> anyhow::Result<(ConsumeStats, ProcessReport)> {
    Converter::shared(setup.calibration.clone(), setup.invalid)?;
    let (pool, pool_rx) = work_pool(&setup);
    let g = Graph {
        rx,
        setup: &setup,
        cal: SharedCal { cal: RwLock::new(setup.calibration.clone()), generation: AtomicU64::new(0) },
        stats: Mutex::new(ConsumeStats { what: "processing and writing frames", ..Default::default() }),
        writer: Mutex::new(writer),
        stream: Mutex::new(stream),
        pool,
    };
    let mut gpu = match &setup.gpu {
        Some(dev) => Some(gpu::GpuParts::new(dev, &setup)?),
        None => None,
    };
    let (stage_stats, source) = std::thread::scope(|s| {
        let mut p: Pipeline<Box<Work>> = Pipeline::default();
        let rf = setup.ring_frames;
        let pixels = setup.geometry.height() * setup.geometry.width();
        let pedestal = match gpu.as_mut().map(gpu::GpuParts::take_pedestal) {
            Some(tracker) => {
                let mut tracker = Some(tracker);
                p.stage("pedestal", 1, rf, |_| g.pedestal_worker(tracker.take().expect("one pedestal worker")))
            }
            None => p.stage("pedestal", 1, rf, |_| g.pedestal_worker(Pedestal::<f64>::new(pixels, 0, setup.window))),
        };
        let compress = p.stage("compress", setup.workers[2], rf, |_| g.compress_worker());
        let write = p.stage("write", 1, rf, |_| g.write_worker());
        let first = match gpu.take() {
            // one stage converts and finds the strong pixels on the device
            Some(parts) => {
                let mut parts = Some(parts);
                let gpu = p.stage("gpu", 1, rf, |_| g.gpu_worker(parts.take().expect("one GPU worker")));
                p.connect(gpu, compress, Policy::LeastLoaded, WhenFull::Block);
                gpu
            }
            None => {
                let convert = p.stage("convert", setup.workers[0], rf, |_| g.convert_worker());
                let spots = p.stage("spots", setup.workers[1], rf, |_| g.spots_worker());
                p.connect(convert, spots, Policy::LeastLoaded, WhenFull::Block);
                p.connect(spots, compress, Policy::LeastLoaded, WhenFull::Block);
                convert
            }
        };
        p.connect(compress, write, Policy::RoundRobin, WhenFull::Block);
        let to_pedestal = p.source(pedestal, Policy::RoundRobin, WhenFull::Block);
        let to_convert = p.source(first, Policy::LeastLoaded, WhenFull::Block);
        let running = p.spawn(s);
        setup.board.set_stages(running.stats.clone());
        let source = g.feed(&pool_rx, [to_pedestal, to_convert], bar, until);
        (running.join(), source)
    });
    Ok(g.report(stage_stats, source))
}

impl Graph<'_> {
    /// The source: finished frames from the receiver, sent by the chopper to the pedestal
    /// (dark) or the conversion (signal). Returns its own counts; the ports close when it
    /// returns.
    fn feed(&self, pool: &ChanRx<Box<Work>>, [to_pedestal, to_convert]: [Port<Box<Work>>; 2], bar: &ProgressBar, until: Option<&AtomicBool>) -> ProcessReport {
        let mut source = ProcessReport::default();
        while let Some(f) = next_frame(self.rx, until) {
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
            let mut wk = match pool.try_recv() {
                Ok(wk) => wk,
                Err(_) => {
                    source.pool_waits += 1;
                    pool.recv().expect("the pool outlives the graph")
                }
            };
            wk.frame = f.frame();
            wk.missing = missing_ranges(self.rx, &self.setup.geometry, &f);
            wk.spots.clear();
            wk.hit = false;
            wk.times = Some(times);
            wk.ready = Some(f);
            let process = &self.setup.board.process;
            if dark {
                ProcessCounts::add(&process.dark_frames, 1);
                to_pedestal.send(wk);
            } else {
                ProcessCounts::add(&process.signal_frames, 1);
                to_convert.send(wk);
            }
        }
        source
    }

    /// Pedestal tracking of the dark frames (raw words, read from the slot) by `tracker`,
    /// published to the converters once the window is full and then every `publish` dark
    /// frames.
    fn pedestal_worker<'g, T: DarkTracker + 'g>(&'g self, mut tracker: T) -> WorkerFn<'g, Box<Work>> {
        let g = self.setup.geometry;
        let mut since_publish = 0u32;
        Box::new(move |mut wk: Box<Work>, _: &Emit<Box<Work>>| {
            let f = wk.ready.take().expect("dark frames come with their slot");
            if f.status() == FrameStatus::Complete {
                tracker.push_frame(&g, as_words(self.rx.data(&f).expect(OWN_FRAME)));
                since_publish += 1;
            } else {
                ProcessCounts::add(&self.setup.board.process.dark_incomplete, 1);
            }
            self.rx.release(f).expect(OWN_FRAME);
            if tracker.frames() >= self.setup.window as u64 && since_publish >= self.setup.publish {
                since_publish = 0;
                self.publish_pedestal(&mut tracker);
            }
            let _ = self.pool.send(wk);
        })
    }

    /// Replaces the converters' G0 pedestal with the one `tracker` holds.
    fn publish_pedestal(&self, tracker: &mut impl DarkTracker) {
        let old = self.cal.cal.read().expect("not poisoned").clone();
        let mut cal = (*old).clone();
        tracker.mean_into(&mut cal.pedestal[0]);
        // gap pixels keep their placeholder pedestal (they are masked)
        for (p, (&m, &o)) in cal.pedestal[0].iter_mut().zip(old.mask.iter().zip(&old.pedestal[0])) {
            if m & rdaq_detector::geometry::MASK_GAP != 0 {
                *p = o;
            }
        }
        *self.cal.cal.write().expect("not poisoned") = Arc::new(cal);
        self.cal.generation.fetch_add(1, Ordering::Release);
        ProcessCounts::add(&self.setup.board.process.pedestal_updates, 1);
    }

    /// Conversion to keV, module by module straight from the slot into the assembled
    /// image; the slot goes back to the receiver at once.
    fn convert_worker<'g>(&'g self) -> WorkerFn<'g, Box<Work>> {
        let (g, setup, cal) = (self.setup.geometry, self.setup, &self.cal);
        let mut conv = Converter::shared(cal.cal.read().expect("not poisoned").clone(), setup.invalid).expect("checked by run");
        let mut seen = 0u64;
        Box::new(move |mut wk: Box<Work>, e: &Emit<Box<Work>>| {
            let gen = cal.generation.load(Ordering::Acquire);
            if gen != seen {
                seen = gen;
                conv = Converter::shared(cal.cal.read().expect("not poisoned").clone(), setup.invalid).expect("the tracked pedestal is finite");
            }
            let f = wk.ready.take().expect("signal frames come with their slot");
            let words = as_words(self.rx.data(&f).expect(OWN_FRAME));
            let image = &mut wk.image;
            for m in 0..g.modules {
                let module = &words[m as usize * MODULE_PIXELS..(m as usize + 1) * MODULE_PIXELS];
                g.module_runs(m, |from, at, run| conv.to_kev_at(at, &module[from..from + run], &mut image[at..at + run]));
            }
            self.rx.release(f).expect(OWN_FRAME);
            e.send(0, wk);
        })
    }

    /// Spot finding and the hit veto: a vetoed frame goes back to the pool here.
    fn spots_worker<'g>(&'g self) -> WorkerFn<'g, Box<Work>> {
        let setup = self.setup;
        let (w, h) = (setup.geometry.width(), setup.geometry.height());
        let mut finder = LocalSnr::new(setup.finder);
        Box::new(move |mut wk: Box<Work>, e: &Emit<Box<Work>>| {
            let mut found = std::mem::take(&mut wk.spots);
            finder.find(&wk.image, w, h, &mut found);
            wk.spots = found;
            self.judge(wk, e);
        })
    }

    /// The hit decision on a frame whose spots (found on keV) are in `wk.spots`: the spot
    /// list in the unit of the file's image, the counts, and the veto (a vetoed frame goes
    /// back to the pool here).
    fn judge(&self, mut wk: Box<Work>, e: &Emit<Box<Work>>) {
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
        let glance = if wk.hit { setup.board.glance_due() } else { setup.board.glance_due_without_hit() };
        if glance {
            setup.board.show(self.glance(&wk));
        }
        if wk.hit {
            ProcessCounts::add(&counts.hits, 1);
        } else if setup.veto {
            ProcessCounts::add(&counts.vetoed, 1);
            if let Some(t) = &wk.times {
                setup.board.record(t, None);
            }
            e.discard();
            let _ = self.pool.send(wk);
            return;
        }
        e.send(0, wk);
    }

    /// The file's pixel type (photon counts, or keV as they are), compressed into a chunk.
    fn compress_worker<'g>(&'g self) -> WorkerFn<'g, Box<Work>> {
        let setup = self.setup;
        let mut comp = Compressor::new(setup.pixel.bytes(), 0, setup.codec);
        let (mut c16, mut c32) = (Vec::<i16>::new(), Vec::<i32>::new());
        Box::new(move |mut wk: Box<Work>, e: &Emit<Box<Work>>| {
            let mut chunk = std::mem::take(&mut wk.chunk);
            match setup.pixel {
                PixelType::Photons16 => {
                    c16.resize(wk.image.len(), 0);
                    kev_to_photons(&wk.image, setup.photon_kev, &mut c16);
                    comp.compress(bytes_of(&c16), &mut chunk);
                }
                PixelType::Photons32 => {
                    c32.resize(wk.image.len(), 0);
                    kev_to_photons(&wk.image, setup.photon_kev, &mut c32);
                    comp.compress(bytes_of(&c32), &mut chunk);
                }
                _ => comp.compress(bytes_of(&wk.image), &mut chunk),
            }
            wk.chunk = chunk;
            e.send(0, wk);
        })
    }

    /// The dashboard's look at a processed frame: the image (keV) and its spots.
    fn glance(&self, wk: &Work) -> Glance {
        let g = &self.setup.geometry;
        let spots = wk.spots.iter().map(|s| (s.x, s.y)).collect();
        Glance { frame: wk.frame, width: g.width(), height: g.height(), values: wk.image.clone(), spots, unit: "keV" }
    }

    /// Publishes the chunk with its spot list on the stream, and writes both; after a
    /// write error, frames are counted as not saved.
    fn write_worker<'g>(&'g self) -> WorkerFn<'g, Box<Work>> {
        let frame_bytes = (self.setup.geometry.height() * self.setup.geometry.width() * self.setup.pixel.bytes()) as u64;
        Box::new(move |wk: Box<Work>, _: &Emit<Box<Work>>| {
            if let Some(s) = self.stream.lock().expect("not poisoned").as_deref_mut() {
                s.image(wk.frame, &wk.chunk, &wk.missing, Some((&wk.spots, wk.hit)));
            }
            let mut st = self.stats.lock().expect("not poisoned");
            if st.write_error.is_some() {
                st.not_saved += 1;
            } else {
                let mut wr = self.writer.lock().expect("not poisoned");
                let before = wr.bytes_written;
                match wr.write_chunk(wk.frame, &wk.chunk, &wk.missing).and_then(|()| wr.write_spots(&wk.spots, wk.spots.len(), wk.hit)) {
                    Ok(()) => {
                        st.written += 1;
                        st.bytes_out += wr.bytes_written - before;
                        st.bytes_in += frame_bytes;
                    }
                    Err(e) => st.write_failed(e),
                }
            }
            if let Some(t) = &wk.times {
                self.setup.board.record(t, Some(Instant::now()));
            }
            drop(st);
            let _ = self.pool.send(wk);
        })
    }

    /// The consumer's statistics and the processing report, from the source's counts, the
    /// stages' and the tracked calibration.
    fn report(self, stages: Vec<Arc<StageStats>>, mut r: ProcessReport) -> (ConsumeStats, ProcessReport) {
        let c = &self.setup.board.process;
        let get = ProcessCounts::get;
        (r.dark_frames, r.signal_frames, r.hits, r.vetoed) = (get(&c.dark_frames), get(&c.signal_frames), get(&c.hits), get(&c.vetoed));
        (r.spots_found, r.pedestal_updates, r.dark_incomplete) = (get(&c.spots_found), get(&c.pedestal_updates), get(&c.dark_incomplete));
        r.vetoed_fraction = if r.signal_frames > 0 { r.vetoed as f64 / r.signal_frames as f64 } else { 0.0 };
        r.stages = stages.iter().map(|s| StageReport::of(s)).collect();
        r.calibration = Some(self.cal.cal.into_inner().expect("not poisoned"));
        let mut st = self.stats.into_inner().expect("not poisoned");
        st.latency = self.setup.board.latency();
        r.frames_written = st.written;
        (st, r)
    }
}
