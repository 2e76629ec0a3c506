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

use crossbeam_channel::bounded;
use indicatif::ProgressBar;
use rdaq_detector::jungfrau::{ModuleCalibration, MODULE_PIXELS};
use rdaq_detector::{as_words, Chopper, Geometry};
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::pedestal::Pedestal;
use rdaq_process::pipeline::{Emit, Pipeline, Policy, StageStats, WhenFull};
use rdaq_process::spots::{is_hit, LocalSnr, LocalSnrParams, Spot};
use rdaq_process::{bytes_of, kev_to_photons, Calibration, Converter, InvalidGain};
use rdaq_receiver::{FrameReady, FrameStatus};
use rdaq_receiver::Receiver;
use rdaq_sink::{NxmxWriter, PixelType};
use serde::Serialize;

/// What a stage expects of the frames it is given: taken from the receiver it reads.
const OWN_FRAME: &str = "a handed frame of this receiver";

use crate::consume::{missing_ranges, next_frame, ConsumeStats};

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

/// The calibration the converters use, replaced when the tracked pedestal is published.
struct SharedCal {
    cal: RwLock<Arc<Calibration>>,
    generation: AtomicU64,
}

/// Runs the graph until the receiver finishes (or `until` is set and no frame waits).
pub fn run(rx: &Receiver, writer: &mut NxmxWriter, setup: Setup, bar: &ProgressBar, until: Option<&AtomicBool>) -> anyhow::Result<(ConsumeStats, ProcessReport)> {
    let g = setup.geometry;
    let (h, w) = (g.height(), g.width());
    let shared = SharedCal { cal: RwLock::new(setup.calibration.clone()), generation: AtomicU64::new(0) };
    Converter::shared(shared.cal.read().expect("not poisoned").clone(), setup.invalid)?;
    let pool_size = (setup.workers.iter().sum::<usize>() + 2) * setup.ring_frames + 4;
    let (pool_tx, pool_rx) = bounded::<Box<Work>>(pool_size);
    for _ in 0..pool_size {
        let image = vec![f32::NAN; h * w];
        pool_tx.send(Box::new(Work { frame: 0, ready: None, missing: Vec::new(), image, spots: Vec::new(), hit: false, chunk: Vec::new() })).expect("pool has room");
    }
    let stats = Mutex::new(ConsumeStats { what: "processing and writing frames", ..Default::default() });
    let counts = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
    let [hits, vetoed, spots_found, updates, dark_incomplete] = &counts;
    let (shared_ref, stats_ref) = (&shared, &stats);
    let writer = Mutex::new(writer);
    let writer_ref = &writer;
    let setup = &setup;

    let (stage_stats, mut r) = std::thread::scope(|s| -> anyhow::Result<(Vec<Arc<StageStats>>, ProcessReport)> {
        let mut p: Pipeline<Box<Work>> = Pipeline::default();
        let rf = setup.ring_frames;

        let pool = pool_tx.clone();
        let pedestal = p.stage("pedestal", 1, rf, move |_| {
            let mut tracker = Pedestal::<f64>::new(h * w, 0, setup.window);
            let mut since_publish = 0u32;
            let pool = pool.clone();
            Box::new(move |mut wk: Box<Work>, _: &Emit<Box<Work>>| {
                let f = wk.ready.take().expect("dark frames come with their slot");
                if f.status() == FrameStatus::Complete {
                    let words = as_words(rx.data(&f).expect(OWN_FRAME));
                    for m in 0..g.modules {
                        let module = &words[m as usize * MODULE_PIXELS..(m as usize + 1) * MODULE_PIXELS];
                        g.module_runs(m, |from, at, run| tracker.push_at(at, &module[from..from + run]));
                    }
                    tracker.frame_done();
                    since_publish += 1;
                } else {
                    dark_incomplete.fetch_add(1, Ordering::Relaxed);
                }
                rx.release(f).expect(OWN_FRAME);
                // publish once the window is full, then every `publish` dark frames
                if tracker.frames() >= setup.window as u64 && since_publish >= setup.publish {
                    since_publish = 0;
                    let old = shared_ref.cal.read().expect("not poisoned").clone();
                    let mut cal = (*old).clone();
                    tracker.mean_into(&mut cal.pedestal[0]);
                    // gap pixels keep their placeholder pedestal (they are masked)
                    for (p, (&m, &o)) in cal.pedestal[0].iter_mut().zip(old.mask.iter().zip(&old.pedestal[0])) {
                        if m & rdaq_detector::geometry::MASK_GAP != 0 {
                            *p = o;
                        }
                    }
                    *shared_ref.cal.write().expect("not poisoned") = Arc::new(cal);
                    shared_ref.generation.fetch_add(1, Ordering::Release);
                    updates.fetch_add(1, Ordering::Relaxed);
                }
                let _ = pool.send(wk);
            })
        });

        let convert = p.stage("convert", setup.workers[0], rf, |_| {
            let mut conv = Converter::shared(shared_ref.cal.read().expect("not poisoned").clone(), setup.invalid).expect("checked above");
            let mut seen = 0u64;
            Box::new(move |mut wk: Box<Work>, e: &Emit<Box<Work>>| {
                let gen = shared_ref.generation.load(Ordering::Acquire);
                if gen != seen {
                    seen = gen;
                    conv = Converter::shared(shared_ref.cal.read().expect("not poisoned").clone(), setup.invalid).expect("the tracked pedestal is finite");
                }
                let f = wk.ready.take().expect("signal frames come with their slot");
                let words = as_words(rx.data(&f).expect(OWN_FRAME));
                let image = &mut wk.image;
                for m in 0..g.modules {
                    let module = &words[m as usize * MODULE_PIXELS..(m as usize + 1) * MODULE_PIXELS];
                    g.module_runs(m, |from, at, run| conv.to_kev_at(at, &module[from..from + run], &mut image[at..at + run]));
                }
                rx.release(f).expect(OWN_FRAME);
                e.send(0, wk);
            })
        });

        let pool = pool_tx.clone();
        let spots = p.stage("spots", setup.workers[1], rf, |_| {
            let mut finder = LocalSnr::new(setup.finder);
            let pool = pool.clone();
            Box::new(move |mut wk: Box<Work>, e: &Emit<Box<Work>>| {
                let mut found = std::mem::take(&mut wk.spots);
                finder.find(&wk.image, w, h, &mut found);
                wk.spots = found;
                wk.hit = is_hit(&wk.spots, setup.min_spots);
                spots_found.fetch_add(wk.spots.len() as u64, Ordering::Relaxed);
                if wk.hit {
                    hits.fetch_add(1, Ordering::Relaxed);
                } else if setup.veto {
                    vetoed.fetch_add(1, Ordering::Relaxed);
                    e.discard();
                    let _ = pool.send(wk);
                    return;
                }
                e.send(0, wk);
            })
        });

        let compress = p.stage("compress", setup.workers[2], rf, |_| {
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
        });

        let pool = pool_tx.clone();
        let write = p.stage("write", 1, rf, |_| {
            let pool = pool.clone();
            Box::new(move |wk: Box<Work>, _: &Emit<Box<Work>>| {
                let mut st = stats_ref.lock().expect("not poisoned");
                if st.write_error.is_some() {
                    st.not_saved += 1;
                } else {
                    let mut wr = writer_ref.lock().expect("not poisoned");
                    let before = wr.bytes_written;
                    match wr.write_chunk(wk.frame, &wk.chunk, &wk.missing).and_then(|()| wr.write_spots(&wk.spots, wk.spots.len(), wk.hit)) {
                        Ok(()) => {
                            st.written += 1;
                            st.bytes_out += wr.bytes_written - before;
                            st.bytes_in += (h * w * setup.pixel.bytes()) as u64;
                        }
                        Err(e) => st.write_failed(e),
                    }
                }
                drop(st);
                let _ = pool.send(wk);
            })
        });

        p.connect(convert, spots, Policy::LeastLoaded, WhenFull::Block);
        p.connect(spots, compress, Policy::LeastLoaded, WhenFull::Block);
        p.connect(compress, write, Policy::RoundRobin, WhenFull::Block);
        let to_pedestal = p.source(pedestal, Policy::RoundRobin, WhenFull::Block);
        let to_convert = p.source(convert, Policy::LeastLoaded, WhenFull::Block);
        let running = p.spawn(s);

        // the source: finished frames from the receiver, by the chopper to their stage
        // the source's own counts (one thread): dark, signal, waits for a buffer
        let mut source = ProcessReport::default();
        while let Some(f) = next_frame(rx, until) {
            std::thread::sleep(setup.consumer_delay);
            let now = Instant::now();
            {
                let mut st = stats_ref.lock().expect("not poisoned");
                st.first.get_or_insert(now);
                st.last = Some(now);
                match f.status() {
                    FrameStatus::Discarded => {
                        st.discarded += 1;
                        bar.inc(1);
                        continue;
                    }
                    FrameStatus::Complete => st.complete += 1,
                    FrameStatus::Incomplete => st.incomplete += 1,
                }
            }
            bar.inc(1);
            let mut wk = match pool_rx.try_recv() {
                Ok(wk) => wk,
                Err(_) => {
                    source.pool_waits += 1;
                    pool_rx.recv().expect("the pool outlives the graph")
                }
            };
            wk.frame = f.frame();
            wk.missing = missing_ranges(rx, &g, &f);
            wk.spots.clear();
            wk.hit = false;
            let dark = setup.chopper.is_dark(f.frame());
            wk.ready = Some(f);
            if dark {
                source.dark_frames += 1;
                to_pedestal.send(wk);
            } else {
                source.signal_frames += 1;
                to_convert.send(wk);
            }
        }
        drop(to_pedestal);
        drop(to_convert);
        Ok((running.join(), source))
    })?;

    r.hits = hits.load(Ordering::Relaxed);
    r.vetoed = vetoed.load(Ordering::Relaxed);
    r.spots_found = spots_found.load(Ordering::Relaxed);
    r.pedestal_updates = updates.load(Ordering::Relaxed);
    r.dark_incomplete = dark_incomplete.load(Ordering::Relaxed);
    r.vetoed_fraction = if r.signal_frames > 0 { r.vetoed as f64 / r.signal_frames as f64 } else { 0.0 };
    r.stages = stage_stats.iter().map(|s| StageReport::of(s)).collect();
    r.calibration = Some(shared.cal.into_inner().expect("not poisoned"));
    let st = stats.into_inner().expect("not poisoned");
    r.frames_written = st.written;
    Ok((st, r))
}
