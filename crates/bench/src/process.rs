//! `rdaq bench process`: each processing stage on one core, in pixels/s and GB/s, beside
//! baselines measured in the same run: single-core memory copy bandwidth (the floor for the
//! stage's byte traffic), and the reference libraries on the same frames (aare conversion
//! and pedestal, cfelpyutils peakfinder8, the bitshuffle package's LZ4 and Zstd, and the
//! local-SNR rule in numpy + scipy.ndimage), run through `bench/process_baselines.py` with
//! one thread. The spot finders' parameters go to the baselines with the frames, so both
//! sides run the same ones. The reference libraries allocate their outputs (their Python
//! APIs take no output buffer); rdaq's stages write into buffers made once.
//!
//! Byte traffic per pixel counts what the stage must read and write at least once:
//! conversion 2 (raw) + 4 (G0 pedestal) + 4 (G0 gain) + 1/8 (mask bit) + 4 (out) = 14.125
//! bytes for a G0 pixel; pedestal 2 + 2x8 (sums read and written) x2 + 4 (count read) = 38
//! once the window is full;
//! spot finding 4
//! (the keV image); compression 4 in (int32 counts or keV) or 2 (int16 counts) plus the chunk
//! out; counts made from keV inside the compressor ("keV->photons16+bslz4") 4 (the keV read);
//! the descramble stage 2 + 2 (data and reset words) + 3 x 2 (three int16 planes) = 10;
//! EIGER's 12-bit unpacking 1.5 + 2 = 3.5.

use std::hint::black_box;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::Context;
use rdaq_detector::jungfrau::{MODULE_COLS, MODULE_PIXELS, MODULE_ROWS};
use rdaq_detector::synth::{ModuleSynth, SynthConfig};
use rdaq_detector::{Description, ModuleLayout};
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::descramble::Descrambler;
use rdaq_process::pedestal::Pedestal;
use rdaq_process::sparse::Csr;
use rdaq_process::spots::{LocalSnr, LocalSnrParams, Peakfinder8, Peakfinder8Params};
use rdaq_process::{bytes_of, kev_to_photons, Calibration, Converter, InvalidGain};

#[derive(clap::Args)]
pub struct ProcessBenchArgs {
    /// Distinct module frames (1024 x 512) cycled through.
    #[arg(long, default_value_t = 16, value_parser = crate::distinct_frames::<usize>)]
    frames: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 1.0, value_parser = rdaq_run::config::seconds_arg)]
    seconds: f64,
    /// Python with aare, cfelpyutils and bitshuffle (the project venv by default).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Write the results as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Seconds per frame of `f` over the frames, run until `seconds` passed.
fn per_frame(seconds: f64, n: usize, mut f: impl FnMut(usize)) -> f64 {
    let t0 = Instant::now();
    let mut calls = 0usize;
    loop {
        for i in 0..n {
            f(i);
            calls += 1;
        }
        let dt = t0.elapsed().as_secs_f64();
        if dt >= seconds {
            return dt / calls as f64;
        }
    }
}

#[derive(serde::Serialize)]
struct Row {
    stage: String,
    ms_per_frame: f64,
    mpixel_per_s: f64,
    gb_per_s: f64,
    floor_ms: Option<f64>,
    baseline: Option<String>,
    baseline_ms: Option<f64>,
    speedup: Option<f64>,
}

/// The frames every stage and baseline runs on, and the settings they share.
struct Data {
    photon_kev: f32,
    cal: Calibration,
    conv: Converter,
    raw: Vec<Vec<u16>>,
    kev: Vec<Vec<f32>>,
    photons: Vec<Vec<i32>>,
    photons16: Vec<Vec<i16>>,
    lsnr: LocalSnrParams,
    p8: Peakfinder8Params,
}

impl Data {
    /// `n` synthetic module frames, converted to keV and photon counts.
    fn new(n: usize) -> anyhow::Result<Data> {
        let cfg = SynthConfig::default();
        let e = cfg.photon_energy_kev;
        let mut synth = ModuleSynth::new(cfg, 0);
        let mc = synth.calibration();
        let cal = Calibration::unmasked(mc);
        let conv = Converter::new(cal.clone(), InvalidGain::Error)?;
        let mut raw = vec![vec![0u16; MODULE_PIXELS]; n];
        for (i, r) in raw.iter_mut().enumerate() {
            synth.frame(i as u64, r);
        }
        let mut kev = vec![vec![0f32; MODULE_PIXELS]; n];
        let mut photons = vec![vec![0i32; MODULE_PIXELS]; n];
        let mut photons16 = vec![vec![0i16; MODULE_PIXELS]; n];
        for i in 0..n {
            conv.to_kev(&raw[i], &mut kev[i]);
            kev_to_photons(&kev[i], e, &mut photons[i]);
            kev_to_photons(&kev[i], e, &mut photons16[i]);
        }
        let lsnr = LocalSnrParams::for_photon_energy(e);
        let p8 = Peakfinder8Params { adc_threshold: 0.5 * e, ..Peakfinder8Params::jungfrau_module() };
        Ok(Data { photon_kev: e, cal, conv, raw, kev, photons, photons16, lsnr, p8 })
    }
}

/// The rows measured so far, with what they are compared with.
struct Table {
    seconds: f64,
    frames: usize,
    copy: f64,
    base: serde_json::Map<String, serde_json::Value>,
    rows: Vec<Row>,
}

impl Table {
    /// Seconds per frame of `f`, over the frames.
    fn time(&self, f: impl FnMut(usize)) -> f64 {
        per_frame(self.seconds, self.frames, f)
    }

    /// A stage's row: `t` seconds per frame, `bytes_px` its least byte traffic per pixel,
    /// and the baseline (its name and its key in the baselines' answer).
    fn row(&mut self, stage: &str, t: f64, bytes_px: f64, baseline: Option<(&str, &str)>) {
        let bt = baseline.and_then(|(_, k)| secs(&self.base, k));
        self.rows.push(Row {
            stage: stage.to_string(),
            ms_per_frame: t * 1e3,
            mpixel_per_s: MODULE_PIXELS as f64 / t / 1e6,
            gb_per_s: bytes_px * MODULE_PIXELS as f64 / t / 1e9,
            floor_ms: Some(bytes_px * MODULE_PIXELS as f64 / (2.0 * self.copy) * 1e3),
            baseline: baseline.map(|(name, _)| name.to_string()),
            baseline_ms: bt.map(|b| b * 1e3),
            speedup: bt.map(|b| b / t),
        });
    }
}

pub fn bench(a: ProcessBenchArgs) -> anyhow::Result<ExitCode> {
    rdaq_net::socket::pin_current_thread(0).context("pinning the bench to core 0")?;
    let n = a.frames.max(1);
    let d = Data::new(n)?;
    eprintln!("rdaq bench process: {n} module frames of {MODULE_COLS} x {MODULE_ROWS}, {} s per measurement, pinned to core 0", a.seconds);
    let copy = crate::copy_bandwidth(1, 256 << 20, a.seconds);
    let base = baselines(&a, &d)?;
    let mut t = Table { seconds: a.seconds, frames: n, copy, base, rows: Vec::new() };
    conversion(&d, &mut t);
    let found = spot_finding(&d, &mut t);
    let ratio_lz4 = compression(&d, &mut t);
    lz4_libraries(&d, &mut t);
    described(&d, &mut t)?;
    print_table(&t, found, ratio_lz4);
    if let Some(p) = a.json {
        let j = serde_json::json!({ "copy_gb_per_s": copy / 1e9, "rows": t.rows, "lz4_ratio_photons": ratio_lz4 });
        std::fs::write(&p, serde_json::to_string_pretty(&j)?).with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Conversion to keV and photon counts, and pedestal tracking.
fn conversion(d: &Data, t: &mut Table) {
    let mut out = vec![0f32; MODULE_PIXELS];
    let s = t.time(|i| d.conv.to_kev(black_box(&d.raw[i]), &mut out));
    t.row("convert keV", s, 14.125, Some(("aare apply_calibration", "aare_convert")));
    let mut counts = vec![0i32; MODULE_PIXELS];
    let s = t.time(|i| d.conv.to_photons(black_box(&d.raw[i]), d.photon_kev, &mut counts));
    t.row("convert photons32", s, 14.125, None);
    let mut ped = Pedestal::<f64>::new(MODULE_PIXELS, 0, 128);
    let s = t.time(|i| ped.push(black_box(&d.raw[i])));
    t.row("pedestal f64", s, 38.0, Some(("aare Pedestal_d.push", "aare_pedestal")));
}

/// Both spot finders; returns the spots each found over the frames.
fn spot_finding(d: &Data, t: &mut Table) -> [usize; 2] {
    let mut spots = Vec::new();
    let mut finder = LocalSnr::new(d.lsnr);
    let s = t.time(|i| finder.find(black_box(&d.kev[i]), MODULE_COLS, MODULE_ROWS, &mut spots));
    t.row("spots local SNR", s, 4.0, Some(("numpy+scipy local SNR (same rule)", "local_snr")));
    let lsnr: usize = d.kev.iter().map(|k| {
        finder.find(k, MODULE_COLS, MODULE_ROWS, &mut spots);
        spots.len()
    }).sum();
    let radius = Peakfinder8::radius_map(MODULE_COLS, MODULE_ROWS, MODULE_COLS as f64 / 2.0, MODULE_ROWS as f64 / 2.0);
    let mut pf8 = Peakfinder8::new(d.p8, radius, &vec![true; MODULE_PIXELS]);
    let s = t.time(|i| pf8.find(black_box(&d.kev[i]), &mut spots));
    t.row("spots peakfinder8", s, 4.0, Some(("cfelpyutils peakfinder8", "peakfinder8")));
    let pf8_spots: usize = d.kev.iter().map(|k| {
        pf8.find(k, &mut spots);
        spots.len()
    }).sum();
    [lsnr, pf8_spots]
}

/// The stages of detectors described as data, on module frames of the same size: the
/// descramble stage of the example integrating detector (percival-like: 8 interleaved ADCs,
/// three fields, reset subtracted) by its 8 x 8 transposes and by its table of readout
/// positions (the path of any other order), and EIGER's 12-bit unpacking with the flip.
fn described(d: &Data, t: &mut Table) -> anyhow::Result<()> {
    let desc = Description::load("percival-like")?;
    let s = Descrambler::for_description(&desc).map_err(anyhow::Error::msg)?.context("percival-like is descrambled")?;
    anyhow::ensure!(s.pixels() == MODULE_PIXELS, "the example's modules are JUNGFRAU-sized");
    let mut planes = vec![0i16; s.pixels() * s.planes()];
    let n = d.raw.len();
    let secs = t.time(|i| s.run(black_box(&d.raw[i]), Some(&d.raw[(i + 1) % n]), &mut planes));
    // data and reset words 2 + 2, three int16 planes out 6 (the readout table stays in L1)
    t.row("descramble 3 fields", secs, 10.0, None);
    // the same stage gathering through its table of readout positions (any order's path)
    let r = desc.descrambled().context("percival-like has a readout")?;
    let lay = ModuleLayout::new(&desc, 16, false).map_err(anyhow::Error::msg)?;
    let table = Descrambler::new(lay.segment_sources(), r.positions(lay.port_width()), &desc.pixel.fields, r.reset_frame).map_err(anyhow::Error::msg)?;
    let secs = t.time(|i| table.run(black_box(&d.raw[i]), Some(&d.raw[(i + 1) % n]), &mut planes));
    t.row("descramble (table)", secs, 10.0, None);
    let eiger = Description::load("eiger")?;
    let l = ModuleLayout::new(&eiger, 12, false).map_err(anyhow::Error::msg)?;
    let raw: Vec<Vec<u8>> = d.raw.iter().map(|r| bytes_of(r)[..l.raw_bytes()].to_vec()).collect();
    let mut image = vec![0u8; MODULE_PIXELS * l.pixel_bytes()];
    let secs = t.time(|i| l.decode(black_box(&raw[i]), &mut image));
    t.row("EIGER 12-bit unpack", secs, 1.5 + 2.0, None);
    Ok(())
}

/// Bitshuffle with LZ4 and Zstd, and the sparse form; returns the LZ4 ratio of the counts.
fn compression(d: &Data, t: &mut Table) -> f64 {
    let mut chunk = Vec::new();
    let mut c = Compressor::new(4, 0, Codec::Lz4);
    let s = t.time(|i| c.compress(black_box(bytes_of(&d.photons[i])), &mut chunk));
    t.row("bslz4 photons32", s, 4.0, Some(("bitshuffle.compress_lz4", "bitshuffle_lz4_photons")));
    let mut c16 = Compressor::new(2, 0, Codec::Lz4);
    let s = t.time(|i| c16.compress(black_box(bytes_of(&d.photons16[i])), &mut chunk));
    t.row("bslz4 photons16", s, 2.0, Some(("bitshuffle.compress_lz4 (int16)", "bitshuffle_lz4_photons16")));
    // what rdaq run does: counts made from keV one block at a time, straight into the compressor
    let mut staging = Vec::new();
    let s = t.time(|i| c16.compress_from(MODULE_PIXELS, &mut staging, &mut chunk, |at, b: &mut [i16]| kev_to_photons(&d.kev[i][at..at + b.len()], d.photon_kev, b)));
    t.row("keV->photons16+bslz4", s, 4.0, Some(("bitshuffle.compress_lz4 (int16)", "bitshuffle_lz4_photons16")));
    let s = t.time(|i| c.compress(black_box(bytes_of(&d.kev[i])), &mut chunk));
    t.row("bslz4 keV", s, 4.0, Some(("bitshuffle.compress_lz4", "bitshuffle_lz4_kev")));
    let s = t.time(|i| c16.compress(black_box(bytes_of(&d.raw[i])), &mut chunk));
    t.row("bslz4 raw", s, 2.0, Some(("bitshuffle.compress_lz4 (raw words)", "bitshuffle_lz4_raw")));
    let mut z = Compressor::new(4, 0, Codec::Zstd(3));
    let s = t.time(|i| z.compress(black_box(bytes_of(&d.photons[i])), &mut chunk));
    t.row("bszstd3 photons32", s, 4.0, Some(("bitshuffle.compress_zstd", "bitshuffle_zstd_photons")));
    let mut csr = Csr::default();
    let s = t.time(|i| csr.fill(black_box(&d.photons[i]), MODULE_ROWS, MODULE_COLS, 0));
    t.row("sparse CSR > 0", s, 4.0, None);
    let n = d.photons.len() as f64;
    d.photons.iter().map(|p| {
        c.compress(bytes_of(p), &mut chunk);
        (MODULE_PIXELS * 4) as f64 / chunk.len() as f64 / n
    }).sum()
}

/// The LZ4 step alone, by `lz4_flex` (what the compressor uses) and by the C library
/// (liblz4, through the `lz4` crate), on the same bitshuffled blocks of a module frame: the
/// int16 photon counts and the raw words. The C library's time is the row's baseline.
fn lz4_libraries(d: &Data, t: &mut Table) {
    let block = rdaq_process::bitshuffle::default_block_elems(2) * 2;
    let shuffled = |frames: Vec<&[u8]>| -> Vec<Vec<u8>> {
        frames.iter().map(|f| {
            let mut out = vec![0u8; f.len() / block * block];
            for (src, dst) in f.chunks_exact(block).zip(out.chunks_exact_mut(block)) {
                rdaq_process::bitshuffle::shuffle_block(src, dst, 2);
            }
            out
        }).collect()
    };
    let sets = [("photons16", shuffled(d.photons16.iter().map(|p| bytes_of(p)).collect())), ("raw", shuffled(d.raw.iter().map(|r| bytes_of(r)).collect()))];
    let mut out = vec![0u8; lz4_flex::block::get_maximum_output_size(block).max(lz4::block::compress_bound(block).expect("block fits"))];
    for (name, frames) in &sets {
        let c_lib = t.time(|i| {
            for b in frames[i].chunks_exact(block) {
                black_box(lz4::block::compress_to_buffer(b, Some(lz4::block::CompressionMode::DEFAULT), false, &mut out).expect("room for the worst case"));
            }
        });
        let key = format!("liblz4_{name}");
        t.base.insert(key.clone(), c_lib.into());
        let flex = t.time(|i| {
            for b in frames[i].chunks_exact(block) {
                black_box(lz4_flex::block::compress_into(b, &mut out).expect("room for the worst case"));
            }
        });
        let stage = format!("lz4_flex {name}");
        t.row(&stage, flex, 2.0, Some(("liblz4 (lz4 crate), same blocks", &key)));
    }
}

fn print_table(t: &Table, [lsnr_spots, pf8_spots]: [usize; 2], ratio_lz4: f64) {
    println!("copy bandwidth (one core, 256 MiB buffers): {:.2} GB/s copied ({:.2} GB/s of traffic)", t.copy / 1e9, 2.0 * t.copy / 1e9);
    println!("{:<20} {:>9} {:>9} {:>8} {:>9} {:>7}   {:<34} {:>9} {:>8}", "stage", "ms/frame", "Mpx/s", "GB/s", "floor ms", "/floor", "baseline (same data)", "ms/frame", "speedup");
    for r in &t.rows {
        let fl = r.floor_ms.map_or("-".into(), |f| format!("{f:.3}"));
        let over = r.floor_ms.map_or("-".into(), |f| format!("{:.2}x", r.ms_per_frame / f));
        let (bn, bm, sp) = match (&r.baseline, r.baseline_ms, r.speedup) {
            (Some(n), Some(m), Some(s)) => (n.clone(), format!("{m:.3}"), format!("{s:.2}x")),
            (Some(n), _, _) => (n.clone(), "n/a".into(), "-".into()),
            _ => ("-".into(), "-".into(), "-".into()),
        };
        println!("{:<20} {:>9.3} {:>9.1} {:>8.2} {:>9} {:>7}   {:<34} {:>9} {:>8}", r.stage, r.ms_per_frame, r.mpixel_per_s, r.gb_per_s, fl, over, bn, bm, sp);
    }
    println!("bitshuffle+LZ4 ratio of the photon counts: {ratio_lz4:.1}");
    let count = |k: &str| t.base.get(k).and_then(|v| v.as_u64()).map_or("n/a".into(), |v| v.to_string());
    println!(
        "spots found in the {} frames: local SNR rdaq {lsnr_spots}, numpy+scipy {}; peakfinder8 rdaq {pf8_spots}, cfelpyutils {}",
        t.frames,
        count("local_snr_spots"),
        count("peakfinder8_spots")
    );
    println!("baselines: aare, cfelpyutils and bitshuffle allocate their outputs (their APIs take none); the");
    println!("local-SNR baseline is rdaq's rule over the whole image in numpy (summed-area box sums, scipy labels).");
}

/// The reference libraries on the same frames, in a Python process pinned to the same core.
fn baselines(a: &ProcessBenchArgs, d: &Data) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let (raw, kev, photons, cal, lsnr, p8) = (&d.raw, &d.kev, &d.photons, &d.cal, d.lsnr, d.p8);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = a.python.clone().unwrap_or_else(|| root.join(".venv/bin/python"));
    let script = root.join("bench/process_baselines.py");
    if !python.exists() || !script.exists() {
        eprintln!("rdaq bench process: no {} or {}: baselines skipped (run make setup)", python.display(), script.display());
        return Ok(Default::default());
    }
    let dir = std::env::temp_dir().join(format!("rdaq-bench-process-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let f = hdf5::File::create(dir.join("bench_inputs.h5"))?;
    let n = raw.len();
    f.new_dataset::<u16>().shape((n, MODULE_ROWS, MODULE_COLS)).create("raw")?.write_raw(&flat(raw))?;
    f.new_dataset::<f32>().shape((n, MODULE_ROWS, MODULE_COLS)).create("kev")?.write_raw(&flat(kev))?;
    f.new_dataset::<i32>().shape((n, MODULE_ROWS, MODULE_COLS)).create("photons")?.write_raw(&flat(photons))?;
    let stack = |a: &[Vec<f32>; 3]| a.iter().flatten().copied().collect::<Vec<f32>>();
    f.new_dataset::<f32>().shape((3, MODULE_ROWS, MODULE_COLS)).create("pedestal")?.write_raw(&stack(&cal.pedestal))?;
    f.new_dataset::<f32>().shape((3, MODULE_ROWS, MODULE_COLS)).create("gain")?.write_raw(&stack(&cal.gain))?;
    let lsnr = [lsnr.threshold as f64, lsnr.snr as f64, lsnr.box_half as f64, lsnr.min_pixels as f64, lsnr.max_pixels as f64];
    f.new_attr::<f64>().shape(lsnr.len()).create("local_snr")?.write_raw(&lsnr)?;
    let p8 = [
        p8.max_num_peaks as f64,
        p8.asic_nx as f64,
        p8.asic_ny as f64,
        p8.nasics_x as f64,
        p8.nasics_y as f64,
        p8.adc_threshold as f64,
        p8.minimum_snr as f64,
        p8.min_pixel_count as f64,
        p8.max_pixel_count as f64,
        p8.local_bg_radius as f64,
        p8.min_res as f64,
        p8.max_res as f64,
    ];
    f.new_attr::<f64>().shape(p8.len()).create("peakfinder8")?.write_raw(&p8)?;
    drop(f);
    eprintln!("rdaq bench process: baselines in {} (aare, cfelpyutils, bitshuffle; one thread)", python.display());
    let out = Command::new("taskset").arg("-c").arg("0").arg(&python).arg(&script).arg(&dir).arg(a.seconds.to_string())
        .env("OMP_NUM_THREADS", "1").output();
    let out = match out {
        Ok(o) => o,
        // no taskset: run unpinned
        Err(_) => Command::new(&python).arg(&script).arg(&dir).arg(a.seconds.to_string()).env("OMP_NUM_THREADS", "1").output()?,
    };
    std::fs::remove_dir_all(&dir).ok();
    if !out.status.success() {
        eprintln!("rdaq bench process: baselines failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        return Ok(Default::default());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("baseline output")?;
    Ok(v.as_object().cloned().unwrap_or_default())
}

fn flat<T: Copy>(v: &[Vec<T>]) -> Vec<T> {
    v.iter().flatten().copied().collect()
}

fn secs(base: &serde_json::Map<String, serde_json::Value>, k: &str) -> Option<f64> {
    base.get(k).and_then(|v| v.as_f64())
}
