//! `rdaq bench pipeline --ceiling`: the serial ceiling of the processing graph (with `--raw`,
//! of the raw chain). The workers and the pedestal bands hand on results made once (a signal
//! frame's chunk and spots, made by the graph's own steps) instead of doing their work, so
//! each point's rate is what the serial parts alone sustain: the source's hand-off, the pool
//! of frame buffers, the rings, the chain of bands and the publication of the pedestal, the
//! reorder and the writer. One point with one real worker gives a worker's time per module
//! frame; with the ceiling's (the serial part's), Amdahl's law predicts N workers' rate.
//! With `--raw`, a plain sequential write of the same bytes (one file, fdatasync), measured
//! in the same run, is the writer's floor. The most workers' point is measured again with the
//! data files' chunks written by the writer thread itself under HDF5's lock, as before the I/O
//! threads took them ([`rdaq_sink::deferred`]), and then once more by the I/O threads.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use rdaq_run::config::Config;

use super::{measure_point, PipelineArgs, Point, Pool, Work};

/// Worker counts of the Amdahl table.
const PREDICTED: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

pub(crate) fn bench(a: &PipelineArgs, cfg: &mut Config, pool: &Pool, dir: &Path, counts: &[usize]) -> anyhow::Result<ExitCode> {
    super::set_workers(cfg, a, 1);
    let canned = std::sync::Arc::new(super::canned(cfg, pool)?);
    let real = measure_point(cfg, pool, dir, a.seconds, Work::Real)?;
    eprintln!("  1 real worker: {:.0} module frames/s", real.module_frames_per_s);
    let mut points = Vec::new();
    for &w in counts {
        super::set_workers(cfg, a, w);
        let p = measure_point(cfg, pool, dir, a.seconds, Work::Canned(&canned))?;
        eprintln!("  {w} worker(s) handing on results: {:.0} module frames/s", p.module_frames_per_s);
        points.push(p);
    }
    let most = counts.iter().copied().max().unwrap_or(1);
    super::set_workers(cfg, a, most);
    rdaq_sink::deferred::set_handing_on(false);
    let locked = measure_point(cfg, pool, dir, a.seconds, Work::Canned(&canned));
    rdaq_sink::deferred::set_handing_on(true);
    let locked = locked?;
    eprintln!("  {most} worker(s) handing on results, chunks written under HDF5's lock: {:.0} module frames/s", locked.module_frames_per_s);
    // once more by the I/O threads: a machine that speeds up or slows down during the run
    // (a VM's memory first touched, another job) then biases neither side
    let again = measure_point(cfg, pool, dir, a.seconds, Work::Canned(&canned))?;
    eprintln!("  {most} worker(s) handing on results, again by the I/O threads: {:.0} module frames/s", again.module_frames_per_s);
    let chunk = &canned.chunk;
    let plain = if a.raw { Some(plain_write(cfg, chunk, dir, a.seconds)?) } else { None };
    std::fs::remove_dir_all(dir).ok();
    println!("results handed on: a chunk of {} bytes a frame ({:.0} bytes a module frame)", chunk.len(), chunk.len() as f64 / cfg.detector.modules as f64);
    print(a, &real, &points, plain);
    print_locked(&points, &locked, &again);
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&serde_json::json!({ "real": real, "ceiling": points, "chunks_under_hdf5_lock": locked, "chunks_by_io_threads_again": again, "plain_write_module_frames_per_s": plain }))?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Module frames/s a plain sequential write of `chunk` sustains: written again and again to
/// one file for `seconds`, then fdatasync.
pub(crate) fn plain_write(cfg: &Config, chunk: &[u8], dir: &Path, seconds: f64) -> anyhow::Result<f64> {
    let path = dir.join("plain.bin");
    let mut f = std::fs::File::create(&path)?;
    let (t0, mut n) = (Instant::now(), 0u64);
    while t0.elapsed().as_secs_f64() < seconds {
        f.write_all(chunk)?;
        n += 1;
    }
    f.sync_data()?;
    let rate = n as f64 * cfg.detector.modules as f64 / t0.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    Ok(rate)
}

/// The most workers' point with the chunks written by the I/O threads (before and after)
/// against the same with the writer thread writing them itself (between the two).
fn print_locked(points: &[Point], locked: &Point, again: &Point) {
    let Some(p) = points.iter().find(|p| p.workers == locked.workers) else { return };
    let (handed, waited) = rdaq_sink::deferred::counters();
    let (first, second, under) = (p.module_frames_per_s, again.module_frames_per_s, locked.module_frames_per_s);
    println!("{} workers, chunks written by {} I/O threads: {first:.0} and {second:.0} module frames/s (before and after); by the writer thread under HDF5's lock: {under:.0} ({:.2}x of their mean)",
        p.workers, rdaq_sink::deferred::IO_THREADS, (first + second) / 2.0 / under);
    println!("  chunks handed to the I/O threads in this run: {handed}; the writer waited for a place among a file's writes in flight {waited} times");
}

fn print(a: &PipelineArgs, real: &Point, points: &[Point], plain: Option<f64>) {
    let what = if a.raw { "raw chain" } else if a.no_dark { "graph, no dark frames" } else { "graph, chopper 1 dark : 1 signal" };
    println!("serial ceiling of the {what}: {} module(s) per frame, workers and bands handing on results made once", a.modules);
    println!("{:>7} {:>5} {:>10} {:>8} {:>6}", "workers", "bands", "mod.fr/s", "waits", "held");
    for p in points {
        println!("{:>7} {:>5} {:>10.0} {:>8} {:>6}", p.workers, p.pedestal_bands, p.module_frames_per_s, p.pool_waits, p.reorder_high_water);
    }
    let ceiling = points.iter().map(|p| p.module_frames_per_s).fold(0.0, f64::max);
    let (t1, ts) = (1e6 / real.module_frames_per_s, 1e6 / ceiling);
    let s = (ts / t1).min(1.0);
    println!("one real worker: {:.0} module frames/s, {t1:.1} us a module frame; the ceiling: {ceiling:.0} module frames/s, {ts:.1} us of serial work a module frame", real.module_frames_per_s);
    println!("serial fraction: {s:.4} of a worker's time (1/{:.1})", 1.0 / s);
    println!("Amdahl's law with it: {:>7} {:>12} {:>8}", "workers", "mod.fr/s", "speedup");
    for n in PREDICTED {
        let rate = 1e6 / (ts + (t1 - ts) / n as f64);
        println!("                      {n:>7} {rate:>12.0} {:>8.1}", rate / real.module_frames_per_s);
    }
    if let Some(w) = plain {
        println!("plain sequential write of the same chunks (one file, fdatasync): {w:.0} module frames/s; the ceiling is {:.2} of it", ceiling / w);
    }
}
