//! `rdaq bench write`: the NXmx series writer's sustained rate (direct chunk write into SWMR
//! data files, the per-frame tables, the flush every second, the master at both ends) beside
//! a plain sequential `write` of the same chunk bytes into one file, in the same run and the
//! same directory, both ending with fdatasync of everything written. The chunks are real: a
//! JUNGFRAU module frame of the synthetic detector, raw words, bitshuffle-LZ4 compressed, a
//! different frame per image. The rounds alternate, so that both see the same disk.
//!
//! Then the master's rewrite, which the writer does after every flush (at least once a
//! second): the time of one, with the pixel mask deflated once per series as the writer
//! does, beside the same master with the mask deflated for each write, in the same run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use rdaq_detector::jungfrau::MODULE_PIXELS;
use rdaq_detector::synth::{ModuleSynth, SynthConfig};
use rdaq_detector::Geometry;
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::bytes_of;
use rdaq_sink::{NxmxMeta, NxmxWriter};

#[derive(clap::Args)]
pub struct WriteBenchArgs {
    /// Images per measurement.
    #[arg(long, default_value_t = 2000)]
    images: u64,
    /// Distinct frames cycled through.
    #[arg(long, default_value_t = 32, value_parser = crate::distinct_frames::<u64>)]
    frames: u64,
    /// Where to write (on the disk to measure); the files are removed afterwards.
    #[arg(long, default_value = "bench-write")]
    dir: PathBuf,
    #[arg(long, default_value_t = 1000)]
    images_per_file: usize,
    /// Measurements of each kind, alternating.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
}

fn chunks(n: u64) -> Vec<Vec<u8>> {
    let mut synth = ModuleSynth::new(SynthConfig::default(), 0);
    let mut raw = vec![0u16; MODULE_PIXELS];
    let mut c = Compressor::new(2, 0, Codec::Lz4);
    (0..n)
        .map(|f| {
            synth.frame(f, &mut raw);
            let mut out = Vec::new();
            c.compress(bytes_of(&raw), &mut out);
            out
        })
        .collect()
}

/// Seconds to write the chunks `n` times in turn to one file and fdatasync it.
fn plain(dir: &Path, chunks: &[Vec<u8>], n: u64) -> anyhow::Result<f64> {
    let path = dir.join("plain.bin");
    let t0 = Instant::now();
    let mut f = std::fs::File::create(&path)?;
    for i in 0..n {
        f.write_all(&chunks[(i % chunks.len() as u64) as usize])?;
    }
    f.sync_data()?;
    let secs = t0.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    Ok(secs)
}

/// Seconds to write the chunks as a series and fdatasync its files.
fn series(dir: &Path, chunks: &[Vec<u8>], n: u64, per_file: usize) -> anyhow::Result<f64> {
    let mut meta = NxmxMeta::jungfrau(Geometry::new(1, 1, 0, 0).expect("one module"), 12.4, 0.001);
    meta.images_per_file = per_file;
    meta.number_of_images = Some(n);
    let master = dir.join("bench_master.h5");
    let t0 = Instant::now();
    let mut w = NxmxWriter::create(&master, &meta, true)?;
    for i in 0..n {
        w.write_chunk(i, &chunks[(i % chunks.len() as u64) as usize], &[])?;
    }
    let closed = w.finish()?;
    for p in closed.data_files.iter().chain([&closed.path]) {
        std::fs::File::open(p)?.sync_data()?;
    }
    let secs = t0.elapsed().as_secs_f64();
    for p in closed.data_files.iter().chain([&closed.path]) {
        std::fs::remove_file(p)?;
    }
    Ok(secs)
}

pub fn bench(a: WriteBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.images > 0 && a.frames > 0 && a.images_per_file > 0 && a.rounds > 0, "--images, --frames, --images-per-file and --rounds must be positive");
    std::fs::create_dir_all(&a.dir).with_context(|| format!("cannot create {}", a.dir.display()))?;
    let chunks = chunks(a.frames);
    let bytes: u64 = (0..a.images).map(|i| chunks[(i % a.frames) as usize].len() as u64).sum();
    println!(
        "rdaq bench write: {} images ({:.1} MB compressed, {:.0} KB each on average) into {}, {} per data file, each measurement ending with fdatasync",
        a.images,
        bytes as f64 / 1e6,
        bytes as f64 / a.images as f64 / 1e3,
        a.dir.display(),
        a.images_per_file
    );
    println!("{:<48} {:>6} {:>10} {:>9} {:>9}", "row", "round", "images/s", "MB/s", "vs plain");
    let (mut best_plain, mut best_series) = (f64::MAX, f64::MAX);
    for round in 1..=a.rounds {
        let p = plain(&a.dir, &chunks, a.images)?;
        let s = series(&a.dir, &chunks, a.images, a.images_per_file)?;
        best_plain = best_plain.min(p);
        best_series = best_series.min(s);
        for (name, secs) in [("plain sequential write of the same bytes", p), ("rdaq NXmx series (master + SWMR data files)", s)] {
            println!("{name:<48} {round:>6} {:>10.0} {:>9.1} {:>8.0}%", a.images as f64 / secs, bytes as f64 / 1e6 / secs, 100.0 * p / secs);
        }
    }
    println!("best: plain {:.1} MB/s, rdaq {:.1} MB/s ({:.0}%)", bytes as f64 / 1e6 / best_plain, bytes as f64 / 1e6 / best_series, 100.0 * best_plain / best_series);
    master_rewrites(&a.dir)?;
    let _ = std::fs::remove_dir(&a.dir);
    Ok(ExitCode::SUCCESS)
}

/// Milliseconds per master write of a series listing `frames` frames over data files of 1000,
/// for detectors of 2 and 8 modules with spot lists: as the writer rewrites it (the mask
/// deflated once) beside the mask deflated on every write.
fn master_rewrites(dir: &Path) -> anyhow::Result<()> {
    use rdaq_sink::instrument::MaskChunk;
    use rdaq_sink::master::{write_master, Contents, Part};
    const WRITES: u32 = 10;
    println!("{:<48} {:>10} {:>20} {:>9}", "master rewrite", "frames", "mask deflated once", "each time");
    for (modules, cols, frames) in [(2u16, 1u16, 1000u64), (8, 2, 20_000)] {
        let mut meta = NxmxMeta::jungfrau(Geometry::new(modules, cols, 8, 36).expect("whole rows"), 12.4, 0.001);
        meta.max_spots = 100;
        let parts: Vec<Part> = (1..=frames / 1000).map(|k| Part { file: rdaq_sink::data_file_name(&dir.join("m_master.h5"), k as usize), frames: 1000, incomplete: 0 }).collect();
        let numbers: Vec<u64> = (0..frames).collect();
        let c = Contents { parts: &parts, incomplete: &[], frames: &numbers, end_time: None };
        let path = dir.join("m_master.h5");
        let once = MaskChunk::new(&meta);
        let timed = |each: bool| -> anyhow::Result<f64> {
            let t0 = Instant::now();
            for _ in 0..WRITES {
                let fresh = each.then(|| MaskChunk::new(&meta));
                write_master(&path, &meta, fresh.as_ref().unwrap_or(&once), &c)?;
            }
            Ok(t0.elapsed().as_secs_f64() * 1e3 / WRITES as f64)
        };
        let (cached, each) = (timed(false)?, timed(true)?);
        let label = format!("{modules} modules ({} x {} pixels), spot lists", meta.geometry.height(), meta.geometry.width());
        println!("{label:<48} {frames:>10} {cached:>17.1} ms {each:>6.1} ms");
    }
    std::fs::remove_file(dir.join("m_master.h5"))?;
    Ok(())
}
