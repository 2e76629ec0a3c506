//! `rdaq bench pipeline`: the processing graph of `rdaq run` without the network, over 1..N
//! process workers, beside the copy bandwidth of as many cores measured in the same run.
//!
//! Frames come from an in-memory receiver (`rdaq_receiver::memory`): its ring is filled once
//! with synthetic frames of the emulated detector (`rdaq run`'s defaults: the chopper's dark
//! and signal frames, the hit fraction, the background), and each slot is handed on again as
//! the next frame as soon as the graph gives it back, without writing it again. Placing the
//! bytes (a NIC's DMA, or the receive thread) is therefore not part of what is measured, on a
//! core or in memory traffic. Everything after is `rdaq run`'s graph as it runs: pedestal
//! bands for the dark frames, process workers (conversion, spots + veto, compression) for the
//! signal frames, the reorder and the NXmx writer (a file in the temporary directory).
//!
//! With `--raw`, the same for a raw run's chain (`rdaq run --raw`): the assemble workers
//! (assembly and bitshuffle-LZ4 of the raw words), the reorder and the writer.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rdaq_detector::jungfrau::{MODULE_BYTES, MODULE_PIXELS};
use rdaq_detector::synth::ModuleSynth;
use rdaq_detector::Chopper;
use rdaq_receiver::memory::{Placer, Released};
use rdaq_receiver::Receiver;
use rdaq_run::config::Config;
use rdaq_run::board::Board;
use rdaq_run::consume;
use rdaq_run::graph::{self, ProcessReport};
use rdaq_sink::NxmxWriter;

mod ceiling;

#[derive(clap::Args)]
pub struct PipelineArgs {
    /// JUNGFRAU modules per frame (rdaq run's default: 2).
    #[arg(long, default_value_t = 2)]
    pub(crate) modules: u16,
    /// Seconds per number of workers.
    #[arg(long, default_value_t = 3.0, value_parser = rdaq_run::config::seconds_arg)]
    pub(crate) seconds: f64,
    /// The most process workers measured (default: every core of the machine).
    #[arg(long)]
    pub(crate) max_workers: Option<usize>,
    /// The worker counts measured, e.g. 1,4,8,16 (default: 1..=max-workers).
    #[arg(long, value_delimiter = ',')]
    pub(crate) workers: Vec<usize>,
    /// Where conversion, spots and the pedestal run: cpu, gpu (the CPU workers then
    /// compress), or gpu-standin (the GPU path's scheduling with its lanes done on the CPU:
    /// what the path costs besides the device).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "gpu", "gpu-standin"])]
    pub(crate) backend: String,
    /// Frames on the GPU at once (process.gpu_lanes).
    #[arg(long)]
    pub(crate) gpu_lanes: Option<usize>,

    /// Pixels written: auto (rdaq run's default: int16 photon counts where they fit), photons16,
    /// photons32 or kev.
    #[arg(long, default_value = "auto")]
    pub(crate) output: String,
    /// Pedestal bands (default: the thread budget's proportion beside each point's workers, one per two with the chopper).
    #[arg(long)]
    pub(crate) pedestal_bands: Option<usize>,
    /// GPU workers that may process a frame on the CPU while every lane is busy
    /// (process.gpu_cpu_workers).
    #[arg(long)]
    pub(crate) gpu_cpu_workers: Option<usize>,
    /// Dark frames between publications of the tracked pedestal (process.pedestal_publish).
    #[arg(long)]
    pub(crate) pedestal_publish: Option<u32>,
    /// Frames queued per worker in the workers' shared ring (process.ring_frames; the pool
    /// of frame buffers grows with it).
    #[arg(long)]
    pub(crate) ring_frames: Option<usize>,
    /// Pin process worker k to CPU k (and the bands to the CPUs after them).
    #[arg(long)]
    pub(crate) pin: bool,
    /// No dark frames (no chopper): every frame goes through the process workers, so the
    /// table shows their scaling alone.
    #[arg(long)]
    pub(crate) no_dark: bool,
    /// A raw run's chain instead of the processing graph: the workers assemble and
    /// compress the raw frames (no dark frames).
    #[arg(long)]
    pub(crate) raw: bool,
    /// The serial ceiling: the workers and the pedestal bands hand on results made once (a
    /// chunk and spots of the usual sizes) instead of doing their work, so the table shows
    /// what the serial parts alone sustain (source, pool, hand-offs, reorder, writer); with
    /// one real worker measured too, it prints the serial fraction and Amdahl's prediction.
    #[arg(long)]
    pub(crate) ceiling: bool,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub(crate) json: Option<std::path::PathBuf>,
}

#[derive(serde::Serialize)]
pub(crate) struct Point {
    pub(crate) workers: usize,
    pub(crate) pedestal_bands: usize,
    pub(crate) frames: u64,
    pub(crate) seconds: f64,
    pub(crate) module_frames_per_s: f64,
    pub(crate) module_frames_per_s_per_worker: f64,
    pub(crate) raw_gb_per_s: f64,
    pub(crate) copy_gb_per_s: f64,
    pub(crate) convert_ms: f64,
    pub(crate) spots_ms: f64,
    pub(crate) compress_ms: f64,
    pub(crate) pedestal_ms_per_dark: f64,
    pub(crate) pool_waits: u64,
    pub(crate) reorder_high_water: usize,
    /// The share of the point's time its process, GPU or assemble workers were busy, 0 to 1:
    /// below 1, they waited for frames.
    pub(crate) workers_busy: Option<f64>,
    /// The GPU path's stages (ms per frame each) and counts, for the gpu backends.
    pub(crate) gpu: Option<String>,
}

pub fn bench(a: PipelineArgs) -> anyhow::Result<ExitCode> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let max = a.max_workers.unwrap_or(cores).max(1);
    let counts: Vec<usize> = if a.workers.is_empty() { (1..=max).collect() } else { a.workers.clone() };
    anyhow::ensure!(counts.iter().all(|&w| (1..=1024).contains(&w)), "--workers: each count 1..=1024");
    anyhow::ensure!(a.pedestal_bands.is_none_or(|b| b <= 1024), "--pedestal-bands: 0 (the thread budget's) to 1024");
    let mut cfg = Config::default();
    cfg.process.backend = if a.backend == "gpu" { "gpu".into() } else { "cpu".into() };
    if let Some(n) = a.pedestal_publish {
        cfg.process.pedestal_publish = n;
    }
    if let Some(n) = a.gpu_cpu_workers {
        cfg.process.gpu_cpu_workers = n;
    }
    if let Some(l) = a.gpu_lanes {
        cfg.process.gpu_lanes = l;
    }
    if let Some(rf) = a.ring_frames {
        cfg.process.ring_frames = rf;
    }
    cfg.detector.modules = a.modules;
    cfg.process.output = a.output.clone();
    if a.no_dark || a.raw {
        cfg.detector.chopper_dark = 0;
    }
    if a.raw {
        cfg.process.mode = "raw".into();
    }
    cfg.check().context("the bench's configuration")?;
    let pool = Pool::new(&cfg, 32);
    let dir = std::env::temp_dir().join(format!("rdaq-bench-pipeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let dark = if a.raw { "raw frames" } else if a.no_dark { "no dark frames" } else { "chopper 1 dark : 1 signal" };
    eprintln!("rdaq bench pipeline: {} module(s) per frame, {dark}, {} output, {} backend, {} s per point, process workers {counts:?} on {cores} cores", a.modules, a.output, a.backend, a.seconds);
    cfg.process.cpus = if a.pin { (0..cores).collect() } else { Vec::new() };
    if a.ceiling {
        anyhow::ensure!(a.backend == "cpu", "--ceiling measures the CPU backend's graph (--backend cpu)");
        return ceiling::bench(&a, &mut cfg, &pool, &dir, &counts);
    }
    let mut points = Vec::new();
    for &w in &counts {
        set_workers(&mut cfg, &a, w);
        let work = if a.backend == "gpu-standin" { Work::GpuStandIn } else { Work::Real };
        let p = measure_point(&cfg, &pool, &dir, a.seconds, work)?;
        eprintln!("  {w} worker(s): {:.0} module frames/s", p.module_frames_per_s);
        points.push(p);
    }
    let limits = if a.raw { Some(raw_limits(&mut cfg, &a, &pool, &dir, &counts)?) } else { None };
    std::fs::remove_dir_all(&dir).ok();
    print_table(&points, a.modules, cores, a.raw);
    if let Some(l) = limits {
        print_raw_limit(&points, l);
    }
    if let Some(path) = a.json {
        std::fs::write(&path, serde_json::to_string_pretty(&points)?).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Sets a point's process workers, and its pedestal bands as asked or as the thread
/// budget would give them beside that many workers.
pub(crate) fn set_workers(cfg: &mut Config, a: &PipelineArgs, workers: usize) {
    let dark = rdaq_run::budget::ThreadBudget::dark_share(cfg.detector.chopper_dark, cfg.detector.chopper_signal);
    cfg.process.workers = workers;
    cfg.process.pedestal_bands = a.pedestal_bands.unwrap_or_else(|| rdaq_run::budget::ThreadBudget::bands_beside(workers, dark));
}

/// One point in its own directory under `dir`, removed when the point ends: its dirty pages
/// would otherwise be written back during the next point, on its cores and its disk.
pub(crate) fn measure_point(cfg: &Config, pool: &Pool, dir: &std::path::Path, seconds: f64, work: Work) -> anyhow::Result<Point> {
    let kind = match work {
        Work::Real => "real",
        Work::GpuStandIn => "standin",
        Work::Canned(_) => "canned",
    };
    let d = dir.join(format!("w{}-{kind}", cfg.process.workers));
    std::fs::create_dir_all(&d)?;
    let p = measure(cfg, pool, &d, seconds, work);
    std::fs::remove_dir_all(&d).ok();
    p
}

/// What the workers do at a point.
#[derive(Clone, Copy)]
pub(crate) enum Work<'a> {
    /// Their steps.
    Real,
    /// The GPU path with its lanes done on the CPU.
    GpuStandIn,
    /// Hand on these results made once (the serial ceiling; the raw chain hands on the
    /// chunk alone).
    Canned(&'a std::sync::Arc<graph::Canned>),
}

/// The results the workers hand on in the serial ceiling, made once from the first signal
/// frame: the graph's own steps, or for the raw chain the image assembled and compressed as
/// the assemble workers do.
pub(crate) fn canned(cfg: &Config, pool: &Pool) -> anyhow::Result<graph::Canned> {
    let (meta, setup) = rdaq_run::plan::plan(cfg, cfg.geometry().context("geometry")?, None)?;
    match setup {
        Some(s) => graph::Canned::of(&s, pool.signal_frame()),
        None => Ok(graph::Canned { chunk: raw_chunk(&meta, pool), spots: Vec::new() }),
    }
}

fn raw_chunk(meta: &rdaq_sink::NxmxMeta, pool: &Pool) -> Vec<u8> {
    let mut asm = rdaq_run::assemble::Assembler::new(meta.geometry, None);
    let mut comp = rdaq_process::bitshuffle::Compressor::new(asm.pixel_bytes(), 0, meta.codec);
    let (mut staging, mut chunk) = (Vec::new(), Vec::new());
    asm.compress_words(rdaq_process::bytes_of(pool.signal_frame()), &mut comp, &mut staging, &mut chunk);
    chunk
}

/// Synthetic frames of the emulated detector (all modules), numbered 0.., with whether each is
/// dark by the chopper.
pub(crate) struct Pool {
    frames: Vec<Vec<u16>>,
    chopper: Chopper,
}

impl Pool {
    fn new(cfg: &Config, n: usize) -> Pool {
        let modules = cfg.detector.modules as usize;
        let mut synths: Vec<ModuleSynth> = (0..cfg.detector.modules).map(|m| ModuleSynth::new(cfg.synth(), m)).collect();
        let frames = (0..n as u64)
            .map(|f| {
                let mut words = vec![0u16; modules * MODULE_PIXELS];
                for (m, s) in synths.iter_mut().enumerate() {
                    s.frame(f, &mut words[m * MODULE_PIXELS..(m + 1) * MODULE_PIXELS]);
                }
                words
            })
            .collect();
        Pool { frames, chopper: cfg.chopper() }
    }

    fn is_dark(&self, frame: u64) -> bool {
        self.chopper.is_dark(frame)
    }

    /// The words of the first signal frame.
    pub(crate) fn signal_frame(&self) -> &[u16] {
        let k = (0..self.frames.len()).find(|&k| !self.is_dark(k as u64)).unwrap_or(0);
        &self.frames[k]
    }
}

/// One point: the graph with `cfg`'s workers for `seconds`, and the copy bandwidth of as
/// many threads.
fn measure(cfg: &Config, pool: &Pool, dir: &std::path::Path, seconds: f64, work: Work) -> anyhow::Result<Point> {
    let geometry = cfg.geometry().context("geometry")?;
    let (mut meta, mut setup) = rdaq_run::plan::plan(cfg, geometry, None)?;
    match (setup.as_mut(), work) {
        (Some(s), Work::GpuStandIn) => s.gpu = Some(graph::GpuBackend::StandIn(rdaq_gpu::standin::Failures::default())),
        (Some(s), Work::Canned(c)) => s.canned = Some(c.clone()),
        _ => {}
    }
    let raw_chunk = match (&setup, work) {
        (None, Work::Canned(c)) => Some(rdaq_sink::SharedChunk::new(c.chunk.clone())),
        _ => None,
    };
    rdaq_run::plan::emulated_series(cfg, &mut meta);
    let (workers, bands, rings) = match &setup {
        Some(s) => (s.workers, s.pedestal_bands, s.ring_frames),
        None => (cfg.workers(), 0, cfg.process.ring_frames),
    };
    let slots = (workers + bands + 2) * rings + 8;
    let (rx, mut placer) = Receiver::in_memory(cfg.detector.modules, MODULE_BYTES as u64, slots)?;
    let kinds = fill(&mut placer, pool);
    let mut writer = NxmxWriter::create(&dir.join(format!("w{workers}_master.h5")), &meta, true)?;
    let bar = indicatif::ProgressBar::hidden();
    let raw_board = rdaq_run::board::Board::default();
    let board = setup.as_ref().map(|s| s.board.clone());
    let watch = board.as_deref().unwrap_or(&raw_board);
    let ended = AtomicBool::new(false);
    let (report, fed) = std::thread::scope(|s| {
        let feeder = s.spawn(|| feed(placer, pool, &kinds, Duration::from_secs_f64(seconds), watch, &ended));
        let r = match setup {
            Some(setup) => graph::run(&rx, Some(&mut writer), None, setup, &bar, None, &mut |_| {}),
            None => {
                let sinks = consume::Sinks { geometry, writer: Some(&mut writer), stream: None, sent: None, board: Some(&raw_board), decoder: None, pedestal_run: None, workers: cfg.raw_workers(), canned: raw_chunk.as_ref(), finding: None, deliver: None };
                consume::consume(&rx, sinks, &bar, None, |_| {}).map(|st| (st, ProcessReport::default()))
            }
        };
        // a graph that failed before taking frames leaves the feeder waiting: the consumer
        // has ended, which wakes it
        ended.store(true, Ordering::Relaxed);
        watch.set_consuming();
        (r, feeder.join().expect("feeder"))
    });
    let (stats, report) = report?;
    // a point whose writer failed measured nothing worth a row
    if let Some(e) = stats.write_error {
        anyhow::bail!("{workers} workers: the writer failed, the point is void: {e}");
    }
    writer.finish()?;
    let (from, to) = fed.window.with_context(|| format!("{workers} workers: the graph ran too briefly to measure (--seconds)"))?;
    let elapsed = (to.at - from.at).as_secs_f64();
    let frames = to.frames - from.frames;
    let module_frames = frames as f64 * cfg.detector.modules as f64;
    Ok(Point {
        workers,
        pedestal_bands: bands,
        frames: fed.handed,
        seconds: elapsed,
        module_frames_per_s: module_frames / elapsed,
        module_frames_per_s_per_worker: module_frames / elapsed / workers as f64,
        raw_gb_per_s: module_frames * MODULE_BYTES as f64 / elapsed / 1e9,
        copy_gb_per_s: crate::copy_bandwidth(workers, 64 << 20, 0.5) / 1e9,
        convert_ms: step(&report, "convert"),
        spots_ms: step(&report, "spots + veto"),
        compress_ms: step(&report, "compress"),
        pedestal_ms_per_dark: pedestal_ms(&report),
        pool_waits: report.pool_waits,
        reorder_high_water: report.reorder_high_water,
        // a frame counts when it ends: one in progress at the first sample is counted whole
        workers_busy: from.busy_s.zip(to.busy_s).map(|(a, b)| ((b - a) / (workers as f64 * elapsed)).min(1.0)),
        gpu: gpu_line(&report),
    })
}

/// Fills every slot with a pool frame (slot i: frame i of the pool, cycled); returns
/// whether each slot holds a dark frame.
fn fill(placer: &mut Placer, pool: &Pool) -> Vec<bool> {
    (0..placer.slots())
        .map(|i| {
            let k = i % pool.frames.len();
            let bytes = placer.slot_mut(i as u32);
            for (b, w) in bytes.chunks_exact_mut(2).zip(&pool.frames[k]) {
                b.copy_from_slice(&w.to_le_bytes());
            }
            pool.is_dark(k as u64)
        })
        .collect()
}

/// What the feeder saw: the frames it handed on, and the graph's progress sampled once it
/// had warmed up and again when the feeder stopped (none: the graph ended first).
struct Fed {
    handed: u64,
    window: Option<(Progress, Progress)>,
}

/// The frames the graph finished (dark and signal) and its workers' busy time, at a moment.
#[derive(Clone, Copy)]
struct Progress {
    at: Instant,
    frames: u64,
    /// The process, GPU or assemble workers' busy seconds (none: not reported).
    busy_s: Option<f64>,
}

impl Progress {
    fn of(board: &Board) -> Progress {
        let workers = board.stages().into_iter().find(|s| matches!(s.name.as_str(), "process" | "gpu" | "assemble"));
        let busy_s = workers.map(|s| s.busy_ns.load(Ordering::Relaxed) as f64 / 1e9);
        Progress { at: Instant::now(), frames: board.frames_done().0, busy_s }
    }
}

/// Hands frames 0, 1, ... on, each in a free slot of its kind (dark or signal), for
/// `seconds` from when the graph takes frames, or until `ended`. The point's rate is
/// measured between two samples of the graph's progress: after a warm-up (a quarter of the
/// time, at most half a second: its first frames, buffers touched for the first time) and
/// when the feeding stops, so neither the graph's setup, nor its drain, nor its teardown
/// (freeing, unregistering memory) is in it.
fn feed(mut placer: Placer, pool: &Pool, kinds: &[bool], seconds: Duration, board: &Board, ended: &AtomicBool) -> Fed {
    let poll = Duration::from_millis(20);
    board.wait_consuming();
    if ended.load(Ordering::Relaxed) {
        return Fed { handed: 0, window: None };
    }
    let mut free: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    for s in placer.free().collect::<Vec<_>>() {
        free[kinds[s as usize] as usize].push(s);
    }
    let start = Instant::now();
    let warm = start + (seconds / 4).min(Duration::from_millis(500));
    let mut first = None;
    let mut n = 0u64;
    while start.elapsed() < seconds {
        if first.is_none() && Instant::now() >= warm {
            first = Some(Progress::of(board));
        }
        let want = pool.is_dark(n) as usize;
        let slot = loop {
            if let Some(s) = free[want].pop() {
                break s;
            }
            match placer.wait_released_for(poll) {
                Released::Slot(s) => free[kinds[s as usize] as usize].push(s),
                Released::NotYet if !ended.load(Ordering::Relaxed) => {}
                Released::NotYet | Released::Gone => return Fed { handed: n, window: None },
            }
        };
        placer.hand(slot, n);
        n += 1;
    }
    Fed { handed: n, window: first.map(|f| (f, Progress::of(board))) }
}

/// The GPU path's stage times and counts in one line.
fn gpu_line(r: &ProcessReport) -> Option<String> {
    let g = r.gpu.as_ref()?;
    let stages: Vec<String> = r.stages.iter().map(|s| format!("{} {:.3} ms x{}", s.name, s.ms_per_frame, s.workers)).collect();
    Some(format!(
        "{} ({} lanes, ring {}registered): {}; waits for a lane {}, images back {}, frames on the CPU while the lanes were busy {}, device errors {}",
        g.device,
        g.lanes,
        if g.ring_registered { "" } else { "not " },
        stages.join(", "),
        g.lane_waits,
        g.images_copied_back,
        g.frames_shared_with_cpu,
        g.device_errors
    ))
}

fn step(r: &ProcessReport, name: &str) -> f64 {
    r.steps.iter().find(|s| s.name == name).map_or(0.0, |s| s.ms_per_frame)
}

/// Busy time of every pedestal band per dark frame (ms of CPU).
fn pedestal_ms(r: &ProcessReport) -> f64 {
    let busy: f64 = r.stages.iter().filter(|s| s.name.starts_with("pedestal")).map(|s| s.busy_s).sum();
    if r.dark_frames > 0 {
        busy * 1e3 / r.dark_frames as f64
    } else {
        0.0
    }
}

/// What the raw chain's limits are on this machine, measured in the same run: a plain
/// sequential write of the same chunks, and the serial parts alone (the workers handing on a
/// chunk made once, at the most workers measured: the source, the reorder and the writer).
struct RawLimits {
    plain_write: f64,
    serial: f64,
    serial_workers: usize,
}

fn raw_limits(cfg: &mut Config, a: &PipelineArgs, pool: &Pool, dir: &std::path::Path, counts: &[usize]) -> anyhow::Result<RawLimits> {
    let canned = std::sync::Arc::new(canned(cfg, pool)?);
    let plain_write = ceiling::plain_write(cfg, &canned.chunk, dir, a.seconds)?;
    let serial_workers = counts.iter().copied().max().unwrap_or(1);
    set_workers(cfg, a, serial_workers);
    let serial = measure_point(cfg, pool, dir, a.seconds, Work::Canned(&canned))?.module_frames_per_s;
    Ok(RawLimits { plain_write, serial, serial_workers })
}

/// What limits the raw chain at its best point: the write (most of what a plain sequential
/// write of the same chunks sustains on this file system), the serial parts (most of what
/// they sustain alone: the one HDF5 writer, below a plain write), the copy bandwidth, or the
/// workers.
fn print_raw_limit(points: &[Point], l: RawLimits) {
    let Some(best) = points.iter().max_by(|a, b| a.module_frames_per_s.total_cmp(&b.module_frames_per_s)) else { return };
    let rate = best.module_frames_per_s;
    let limit = if rate >= 0.8 * l.plain_write {
        "the write (one HDF5 writer: a faster disk, or the frames split over more series, would take more)".to_string()
    } else if rate >= 0.8 * l.serial {
        format!("the serial parts, the one HDF5 writer foremost: alone they sustain {:.0}, {:.2} of a plain write (more series, each with its writer, would take more)", l.serial, l.serial / l.plain_write)
    } else if best.raw_gb_per_s >= 0.8 * best.copy_gb_per_s {
        "the copy bandwidth".to_string()
    } else {
        "the workers (more of them, or faster ones)".to_string()
    };
    println!("plain sequential write of the same chunks (one file, fdatasync): {:.0} module frames/s; the serial parts alone ({} workers handing on a chunk made once): {:.0}; the best point ({} workers) is {:.2} of the write and {:.2} of the serial parts",
        l.plain_write, l.serial_workers, l.serial, best.workers, rate / l.plain_write, rate / l.serial);
    println!("limit: {limit}");
}

fn print_table(points: &[Point], modules: u16, cores: usize, raw: bool) {
    let chain = if raw { "raw chain of rdaq run --raw (assemble workers: assembly + bitshuffle-LZ4 of the raw words; no steps timed, no pedestal)" } else { "processing graph of rdaq run" };
    println!("{chain} without the network: {modules} JUNGFRAU module(s) per frame, frames handed from a pre-filled ring ({cores} cores)");
    println!("{:>7} {:>5} {:>10} {:>12} {:>9} {:>11} {:>8}   {:>8} {:>8} {:>9} {:>10}   {:>6} {:>7} {:>6}",
        "workers", "bands", "mod.fr/s", "per worker", "raw GB/s", "copy GB/s", "raw/copy", "convert", "spots", "compress", "pedestal", "waits", "held", "busy");
    for p in points {
        let busy = p.workers_busy.map_or("-".to_string(), |b| format!("{:.0}%", 100.0 * b));
        println!("{:>7} {:>5} {:>10.0} {:>12.0} {:>9.2} {:>11.2} {:>7.0}%   {:>8.3} {:>8.3} {:>9.3} {:>10.3}   {:>6} {:>7} {:>6}",
            p.workers, p.pedestal_bands, p.module_frames_per_s, p.module_frames_per_s_per_worker, p.raw_gb_per_s, p.copy_gb_per_s,
            100.0 * p.raw_gb_per_s / p.copy_gb_per_s, p.convert_ms, p.spots_ms, p.compress_ms, p.pedestal_ms_per_dark, p.pool_waits, p.reorder_high_water, busy);
    }
    for p in points.iter().filter(|p| p.gpu.is_some()) {
        println!("  {} workers: {}", p.workers, p.gpu.as_deref().unwrap_or_default());
    }
    println!("mod.fr/s: JUNGFRAU module frames (1 MiB raw) through the graph per second, dark and signal, from a quarter of the point");
    println!("  (at most 0.5 s) after the graph took its first frame to the end of the feeding (no setup, warm-up, drain or teardown); raw GB/s their bytes;");
    println!("copy GB/s: as many threads as workers copying 64 MiB buffers, measured in the same run (bytes copied);");
    println!("convert / spots / compress: ms per signal frame in each step of a process worker; pedestal: ms of the bands per dark frame;");
    println!("waits: times the source waited for a free frame buffer; held: most frames the writer held back to keep the order;");
    println!("busy: the share of the point's time the workers were busy (the rest they waited for frames).");
    println!("Placing the frames in the ring (DMA or the receive thread) is not measured; on a loaded machine busy times include time descheduled.");
}
