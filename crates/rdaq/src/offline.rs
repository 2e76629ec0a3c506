//! `rdaq process`: the command line of the processing stages on HDF5 files
//! ([`rdaq_offline`]: reprocessing, calibration from a dark run, spot finding), its options
//! turned into the stages' own.

use std::path::PathBuf;

use anyhow::Context;
use rdaq_offline::{ConvertOptions, Counts, Finder, PedestalOptions, Radius, Sums, Unit};
use rdaq_process::bitshuffle::Codec;
use rdaq_process::spots::{LocalSnrParams, Peakfinder8Params};
use rdaq_process::InvalidGain;
use rdaq_sink::FrameReader;

#[derive(clap::Subcommand)]
pub enum ProcessCmd {
    /// Convert raw JUNGFRAU frames to keV (float32) or photon counts (int16/int32).
    Convert(ConvertArgs),
    /// Pedestal (and its RMS and a bad-pixel mask) from dark frames: writes a calibration file.
    Pedestal(PedestalArgs),
    /// Find Bragg spots in converted frames (local SNR or peakfinder8).
    Spots(SpotsArgs),
}

#[derive(clap::Args)]
pub struct Input {
    /// HDF5 file with the frames.
    #[arg(long)]
    input: PathBuf,
    /// Dataset of (frames, rows, cols).
    #[arg(long, default_value = "entry/data/data")]
    dataset: String,
}

/// The file a processing step writes.
#[derive(clap::Args)]
pub struct Output {
    /// The HDF5 file to write (refused if it exists, unless --overwrite).
    #[arg(long)]
    output: PathBuf,
    /// Replace the --output file if it exists.
    #[arg(long)]
    overwrite: bool,
}

impl Output {
    /// The library's output, refused now if it exists (unless --overwrite) or is a link.
    fn checked(&self) -> anyhow::Result<rdaq_offline::Output> {
        let out = rdaq_offline::Output { path: self.output.clone(), overwrite: self.overwrite };
        out.check()?;
        Ok(out)
    }
}

#[derive(clap::Args)]
pub struct ConvertArgs {
    #[command(flatten)]
    input: Input,
    /// Calibration file (see docs/processing.md).
    #[arg(long)]
    calibration: PathBuf,
    #[command(flatten)]
    out: Output,
    /// Photon counts for this photon energy (keV) instead of keV.
    #[arg(long, value_parser = photon_kev)]
    photon_kev: Option<f32>,
    /// Photon count type: i16 or i32.
    #[arg(long, default_value = "i32")]
    counts: String,
    /// The invalid gain code 10: error, g0 (as aare) or g2.
    #[arg(long, default_value = "error")]
    invalid_gain: String,
    /// Chunk codec: lz4 or zstd.
    #[arg(long, default_value = "lz4")]
    codec: String,
    #[arg(long, default_value_t = 3)]
    zstd_level: i32,
}

#[derive(clap::Args)]
pub struct PedestalArgs {
    #[command(flatten)]
    input: Input,
    #[command(flatten)]
    out: Output,
    /// Gain stage of the dark run: 0, 1 or 2 (G1 and G2 need forced gain switching).
    #[arg(long, default_value_t = 0)]
    stage: u8,
    /// Running window in frames.
    #[arg(long, default_value_t = 128)]
    window: u32,
    /// Sums in f32 (as aare's Pedestal_f) or f64 (Pedestal_d).
    #[arg(long, default_value = "f64")]
    sums: String,
    /// Calibration whose gains and other stages' pedestals are kept (default: typical PSI
    /// values, with a note).
    #[arg(long)]
    base: Option<PathBuf>,
    /// Pixels with fewer frames than this are masked (default: the window).
    #[arg(long)]
    min_frames: Option<u32>,
    /// G0 pixels with a pedestal RMS above this (ADU) are masked.
    #[arg(long, default_value_t = 100.0)]
    max_rms: f32,
}

#[derive(clap::Args)]
pub struct SpotsArgs {
    #[command(flatten)]
    input: Input,
    #[command(flatten)]
    out: Output,
    /// local (local SNR) or peakfinder8.
    #[arg(long, default_value = "local")]
    finder: String,
    /// local: strong-pixel threshold in the unit of the image (keV for frames converted to
    /// keV), then SNR, box half-size, pixel counts.
    #[arg(long, default_value_t = 6.2, conflicts_with = "threshold_photons")]
    threshold: f32,
    /// local: the strong-pixel threshold in photons instead, for keV images: the threshold
    /// is this many photons of --photon-energy-kev.
    #[arg(long, requires = "photon_energy_kev")]
    threshold_photons: Option<f32>,
    /// The photon energy that --threshold-photons counts in.
    #[arg(long, value_parser = photon_kev)]
    photon_energy_kev: Option<f32>,
    #[arg(long, default_value_t = 3.0)]
    snr: f32,
    #[arg(long, default_value_t = 15)]
    box_half: usize,
    #[arg(long, default_value_t = 4)]
    min_pixels: u32,
    #[arg(long, default_value_t = 200)]
    max_pixels: u32,
    /// peakfinder8: ASIC size and count, thresholds, background radius, resolution limits,
    /// beam centre (pixel indices); the image must be nasics_y*asic_ny x nasics_x*asic_nx.
    #[arg(long, default_value_t = 256)]
    asic_nx: usize,
    #[arg(long, default_value_t = 256)]
    asic_ny: usize,
    #[arg(long, default_value_t = 4)]
    nasics_x: usize,
    #[arg(long, default_value_t = 2)]
    nasics_y: usize,
    #[arg(long, default_value_t = 800.0)]
    adc_threshold: f32,
    #[arg(long, default_value_t = 5.0)]
    min_snr: f32,
    #[arg(long, default_value_t = 2)]
    min_pixel_count: usize,
    #[arg(long, default_value_t = 200)]
    max_pixel_count: usize,
    #[arg(long, default_value_t = 3)]
    local_bg_radius: i32,
    #[arg(long, default_value_t = 0.0)]
    min_res: f32,
    #[arg(long, default_value_t = 1e9)]
    max_res: f32,
    #[arg(long, default_value_t = 2048)]
    max_num_peaks: usize,
    #[arg(long)]
    center_x: Option<f64>,
    #[arg(long)]
    center_y: Option<f64>,
    /// peakfinder8: the radius of each pixel from this HDF5 file (dataset --radius-dataset,
    /// float, the image's shape) instead of one computed from the beam centre.
    #[arg(long, conflicts_with_all = ["center_x", "center_y"])]
    radius_map: Option<PathBuf>,
    #[arg(long, default_value = "radius")]
    radius_dataset: String,
}

/// A photon energy from the command line, bounded as the configuration's.
fn photon_kev(s: &str) -> Result<f32, String> {
    rdaq_run::config::photon_kev_arg(s).map(|v| v as f32)
}

/// The local-SNR threshold in the unit of the image: --threshold, or --threshold-photons
/// photons of --photon-energy-kev.
fn local_threshold(a: &SpotsArgs) -> anyhow::Result<f32> {
    match (a.threshold_photons, a.photon_energy_kev) {
        (Some(p), Some(e)) if p > 0.0 && e > 0.0 => Ok(p * e),
        (Some(p), Some(e)) => anyhow::bail!("--threshold-photons {p} and --photon-energy-kev {e} must both be positive"),
        _ => Ok(a.threshold),
    }
}

pub fn process(cmd: ProcessCmd) -> anyhow::Result<()> {
    match cmd {
        ProcessCmd::Convert(a) => convert(a),
        ProcessCmd::Pedestal(a) => pedestal(a),
        ProcessCmd::Spots(a) => spots(a),
    }
}

/// Opens the frames named by `i`.
fn open_frames(i: &Input) -> anyhow::Result<FrameReader> {
    Ok(FrameReader::open(&i.input, &i.dataset)?)
}

fn convert(a: ConvertArgs) -> anyhow::Result<()> {
    let out = a.out.checked()?;
    let counts = Counts::parse(&a.counts).map_err(|e| anyhow::anyhow!("--counts: {e}"))?;
    let o = ConvertOptions {
        calibration: a.calibration,
        unit: a.photon_kev.map_or(Unit::Kev, |energy_kev| Unit::Photons { energy_kev, counts }),
        invalid_gain: InvalidGain::parse(&a.invalid_gain)?,
        codec: Codec::parse(&a.codec, a.zstd_level)?,
    };
    let frames = open_frames(&a.input)?;
    let n = rdaq_offline::convert(&frames, &o, &out)?;
    eprintln!("rdaq process convert: {n} frames -> {}", out.path.display());
    Ok(())
}

fn pedestal(a: PedestalArgs) -> anyhow::Result<()> {
    let out = a.out.checked()?;
    let sums = Sums::parse(&a.sums).map_err(|e| anyhow::anyhow!("--sums: {e}"))?;
    let o = PedestalOptions { stage: a.stage, window: a.window, sums, base: a.base, min_frames: a.min_frames, max_rms: a.max_rms };
    let frames = open_frames(&a.input)?;
    let p = rdaq_offline::pedestal(&frames, &o, &out)?;
    if p.typical_base {
        eprintln!("rdaq process pedestal: no --base calibration: gains and the other stages' pedestals are typical PSI values");
    }
    eprintln!("rdaq process pedestal: G{} from {} dark frames (window {}), {} of {} pixels masked -> {}", a.stage, p.frames, a.window, p.masked, p.pixels, out.path.display());
    Ok(())
}

fn spots(a: SpotsArgs) -> anyhow::Result<()> {
    let out = a.out.checked()?;
    let frames = open_frames(&a.input)?;
    let finder = finder(&a, &frames)?;
    let all = rdaq_offline::spots(&frames, finder, &out)?;
    eprintln!("rdaq process spots: {} frames, {} spots -> {}", all.len(), all.iter().map(Vec::len).sum::<usize>(), out.path.display());
    Ok(())
}

/// The finder the options name, for the images of `frames`.
fn finder(a: &SpotsArgs, frames: &FrameReader) -> anyhow::Result<Finder> {
    match a.finder.as_str() {
        "local" => Ok(Finder::Local(LocalSnrParams { threshold: local_threshold(a)?, snr: a.snr, box_half: a.box_half, min_pixels: a.min_pixels, max_pixels: a.max_pixels })),
        "peakfinder8" => {
            let p = Peakfinder8Params {
                max_num_peaks: a.max_num_peaks,
                asic_nx: a.asic_nx,
                asic_ny: a.asic_ny,
                nasics_x: a.nasics_x,
                nasics_y: a.nasics_y,
                adc_threshold: a.adc_threshold,
                minimum_snr: a.min_snr,
                min_pixel_count: a.min_pixel_count,
                max_pixel_count: a.max_pixel_count,
                local_bg_radius: a.local_bg_radius,
                min_res: a.min_res,
                max_res: a.max_res,
            };
            let radius = match &a.radius_map {
                Some(path) => Radius::Map(rdaq_offline::read_radius_map(path, &a.radius_dataset, (frames.rows, frames.cols)).context("--radius-map")?),
                None => Radius::Centre { x: a.center_x, y: a.center_y },
            };
            Ok(Finder::Peakfinder8(p, radius))
        }
        f => anyhow::bail!("--finder {f:?}: expected local or peakfinder8"),
    }
}
