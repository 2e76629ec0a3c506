//! `rdaq bench join`: `rdaq write` joining the parts of a spatial plan's receivers into whole
//! images (decompress each part, place its modules, compress the whole image), beside what
//! any re-compressing joiner must do at least, measured in the same run: compressing the
//! whole image once. The images are the synthetic detector's frames converted to photon
//! counts (int16, as the graph writes them), one part per receiver.

use std::process::ExitCode;
use std::time::Instant;

use rdaq_detector::jungfrau::MODULE_PIXELS;
use rdaq_detector::synth::{ModuleSynth, SynthConfig};
use rdaq_detector::geometry::{DEFAULT_GAP_X, DEFAULT_GAP_Y};
use rdaq_detector::Geometry;
use rdaq_process::bitshuffle::{self, Codec, Compressor};
use rdaq_process::{bytes_of, kev_to_photons, Calibration, Converter, InvalidGain};
use rdaq_run::parts::PartJoiner;
use rdaq_sink::{DetectorPart, PixelType};
use rdaq_stream::Image;

#[derive(clap::Args)]
pub struct JoinBenchArgs {
    /// Modules of the detector (one column).
    #[arg(long, default_value_t = 4)]
    modules: u16,
    /// Receivers, each holding an equal run of the modules.
    #[arg(long, default_value_t = 2)]
    receivers: u16,
    /// Whole images per measurement.
    #[arg(long, default_value_t = 100)]
    images: u32,
}

/// Photon counts of module `m` (int16, the graph's pixels), little-endian.
fn module_photons(m: u16) -> anyhow::Result<Vec<i16>> {
    let cfg = SynthConfig::default();
    let e = cfg.photon_energy_kev;
    let mut synth = ModuleSynth::new(cfg, m);
    let conv = Converter::new(Calibration::unmasked(synth.calibration()), InvalidGain::Error)?;
    let (mut raw, mut kev, mut photons) = (vec![0u16; MODULE_PIXELS], vec![0f32; MODULE_PIXELS], vec![0i16; MODULE_PIXELS]);
    synth.frame(1, &mut raw);
    conv.to_kev(&raw, &mut kev);
    kev_to_photons(&kev, e, &mut photons);
    Ok(photons)
}

/// Each receiver's part of the detector and its compressed image.
fn parts(detector: Geometry, receivers: u16) -> anyhow::Result<Vec<(DetectorPart, Vec<u8>)>> {
    let per = detector.modules / receivers;
    let no_data = PixelType::Photons16.no_data();
    (0..receivers)
        .map(|r| {
            let part = DetectorPart { module_ids: (r * per..(r + 1) * per).collect(), detector };
            let g = part.geometry();
            let mut image = no_data.repeat(g.height() * g.width());
            for (i, &m) in part.module_ids.iter().enumerate() {
                let px = module_photons(m)?;
                g.module_runs(i as u16, |from, at, len| image[at * 2..(at + len) * 2].copy_from_slice(bytes_of(&px[from..from + len])));
            }
            let mut chunk = Vec::new();
            Compressor::new(2, 0, Codec::Lz4).compress(&image, &mut chunk);
            Ok((part, chunk))
        })
        .collect()
}

pub fn bench(a: JoinBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.images > 0, "--images must be positive");
    anyhow::ensure!(a.receivers > 0 && a.modules > 0 && a.modules % a.receivers == 0 && a.modules <= 64, "--modules (1 to 64) must be a multiple of --receivers (at least 1)");
    let detector = Geometry::new(a.modules, 1, DEFAULT_GAP_X, DEFAULT_GAP_Y).expect("one column");
    let parts = parts(detector, a.receivers)?;
    let mut joiner = PartJoiner::new(detector, PixelType::Photons16);
    // the parts as they come from the stream: their chunks copied outside the timing
    let take = || parts.iter().map(|(d, c)| (d, Image { elem: 2, chunk: c.clone(), ..Image::default() })).collect::<Vec<_>>();
    let whole = joiner.join(&take())?;
    let pixels = bitshuffle::decompress(&whole.chunk, 2, Codec::Lz4)?;
    println!("rdaq bench join: {} modules ({} x {} int16 photon counts), {} receivers' parts, {} images per row, one thread", a.modules, detector.height(), detector.width(), a.receivers, a.images);
    let mut compressor = Compressor::new(2, 0, Codec::Lz4);
    let mut out = Vec::new();
    let t = Instant::now();
    for _ in 0..a.images {
        compressor.compress(&pixels, &mut out);
    }
    let floor = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..a.images {
        for (_, c) in &parts {
            std::hint::black_box(bitshuffle::decompress(c, 2, Codec::Lz4)?);
        }
    }
    let unpack = t.elapsed().as_secs_f64();
    let mut joined = 0.0;
    for _ in 0..a.images {
        let taken = take();
        let t = Instant::now();
        std::hint::black_box(joiner.join(&taken)?);
        joined += t.elapsed().as_secs_f64();
    }
    println!("{:<46} {:>10} {:>14} {:>8}", "row", "images/s", "module frames/s", "vs floor");
    for (name, secs) in [("compress the whole image once (the floor)", floor), ("decompress the parts", unpack), ("join (decompress, place, compress)", joined)] {
        let rate = a.images as f64 / secs;
        println!("{name:<46} {rate:>10.0} {:>14.0} {:>7.0}%", rate * a.modules as f64, 100.0 * floor / secs);
    }
    Ok(ExitCode::SUCCESS)
}
