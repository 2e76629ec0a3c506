//! `rdaq process`: the command line of the processing stages on HDF5 files
//! ([`rdaq_offline`]: reprocessing, calibration from a dark run, spot finding), its options
//! turned into the stages' own.

use std::path::{Path, PathBuf};

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
    /// The invalid gain code 10: error, g0 (as aare) or g2 (default: the run's, for a raw
    /// run's master that keeps it, else error).
    #[arg(long)]
    invalid_gain: Option<String>,
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
    /// local (local SNR) or peakfinder8. The local finder's settings default to those of the
    /// run that wrote an rdaq master (its finder and parameters), else to the values shown.
    #[arg(long)]
    finder: Option<String>,
    /// local: strong-pixel threshold in the unit of the image (keV for frames converted to
    /// keV, photons for counts) [default: 6.2], then SNR [3], box half-size [15], pixel
    /// counts [4, 200].
    #[arg(long, conflicts_with = "threshold_photons")]
    threshold: Option<f32>,
    /// local: the strong-pixel threshold in photons instead, for keV images: the threshold
    /// is this many photons of --photon-energy-kev.
    #[arg(long, requires = "photon_energy_kev")]
    threshold_photons: Option<f32>,
    /// The photon energy that --threshold-photons counts in.
    #[arg(long, value_parser = photon_kev)]
    photon_energy_kev: Option<f32>,
    #[arg(long)]
    snr: Option<f32>,
    #[arg(long)]
    box_half: Option<usize>,
    #[arg(long)]
    min_pixels: Option<u32>,
    #[arg(long)]
    max_pixels: Option<u32>,
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

/// The local finder's settings when neither the options nor the file say otherwise.
const LOCAL_DEFAULTS: LocalSnrParams = LocalSnrParams { threshold: 6.2, snr: 3.0, box_half: 15, min_pixels: 4, max_pixels: 200 };

/// The local-SNR finder's settings: each option given, else the run's that made the file
/// (`run`: its settings in the unit of the file's image), else [`LOCAL_DEFAULTS`].
fn local_params(a: &SpotsArgs, run: Option<LocalSnrParams>) -> anyhow::Result<LocalSnrParams> {
    let base = run.unwrap_or(LOCAL_DEFAULTS);
    let threshold = match (a.threshold_photons, a.photon_energy_kev) {
        (Some(p), Some(e)) if p > 0.0 && e > 0.0 => p * e,
        (Some(p), Some(e)) => anyhow::bail!("--threshold-photons {p} and --photon-energy-kev {e} must both be positive"),
        _ => a.threshold.unwrap_or(base.threshold),
    };
    Ok(LocalSnrParams {
        threshold,
        snr: a.snr.unwrap_or(base.snr),
        box_half: a.box_half.unwrap_or(base.box_half),
        min_pixels: a.min_pixels.unwrap_or(base.min_pixels),
        max_pixels: a.max_pixels.unwrap_or(base.max_pixels),
    })
}

/// The local finder's settings of the run that wrote the master `path`, with a line that
/// says where they come from; `None` for a file rdaq did not process.
fn run_settings(path: &Path) -> Option<(LocalSnrParams, String)> {
    let r = rdaq_offline::run_finder(path)?;
    let p = r.params;
    let threshold = match r.unit {
        "photons" => format!("{} photons", p.threshold),
        unit => format!("{} {unit} ({} photons)", p.threshold, r.threshold_photons),
    };
    let line = format!(
        "rdaq process spots: defaults from the run that wrote {}: local SNR, threshold {threshold}, snr {}, box half-size {}, {}-{} pixels (options given override them)",
        path.display(),
        p.snr,
        p.box_half,
        p.min_pixels,
        p.max_pixels
    );
    Some((p, line))
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
    let series = rdaq_offline::raw_run(&a.input.input);
    let run_gain = series.as_ref().and_then(|m| m.processing.as_ref()).map(|p| p.invalid_gain.clone());
    if let (None, Some(gain)) = (&a.invalid_gain, &run_gain) {
        eprintln!("rdaq process convert: defaults from the run that wrote {}: invalid gain {gain}; its finder's settings go with the frames for rdaq process spots (options given override them)", a.input.input.display());
    }
    let gain = a.invalid_gain.or(run_gain).unwrap_or_else(|| "error".into());
    let o = ConvertOptions {
        calibration: a.calibration,
        unit: a.photon_kev.map_or(Unit::Kev, |energy_kev| Unit::Photons { energy_kev, counts }),
        invalid_gain: InvalidGain::parse(&gain).map_err(|e| anyhow::anyhow!("--invalid-gain: {e}"))?,
        codec: Codec::parse(&a.codec, a.zstd_level)?,
        series,
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
    let counted = rdaq_offline::counted(&a.input.input);
    if counted.is_some() {
        eprintln!("rdaq process spots: a counting detector's counts: the series' masked and saturated pixels are left out, as online");
    }
    let all = rdaq_offline::spots(&frames, finder, counted.as_ref(), &out)?;
    eprintln!("rdaq process spots: {} frames, {} spots -> {}", all.len(), all.iter().map(Vec::len).sum::<usize>(), out.path.display());
    Ok(())
}

/// The finder the options name, for the images of `frames` (the local one by default, with
/// the settings of the run that wrote the file where it is an rdaq master).
fn finder(a: &SpotsArgs, frames: &FrameReader) -> anyhow::Result<Finder> {
    if a.finder.is_none() {
        if let Some((p, [x, y])) = rdaq_offline::run_peakfinder8(&a.input.input) {
            eprintln!(
                "rdaq process spots: the run that wrote {} found its spots with peakfinder8: ADC threshold {} counts, SNR {}, {}-{} pixels, background ring {}, radii from ({x}, {y}) (--finder chooses another)",
                a.input.input.display(),
                p.adc_threshold,
                p.minimum_snr,
                p.min_pixel_count,
                p.max_pixel_count,
                p.local_bg_radius
            );
            return Ok(Finder::Peakfinder8(p, Radius::Centre { x: Some(x), y: Some(y) }));
        }
    }
    match a.finder.as_deref().unwrap_or("local") {
        "local" => {
            let run = run_settings(&a.input.input).map(|(params, line)| {
                eprintln!("{line}");
                params
            });
            Ok(Finder::Local(local_params(a, run)?))
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Spots {
        #[command(flatten)]
        a: SpotsArgs,
    }

    fn args(extra: &[&str]) -> SpotsArgs {
        let base = ["spots", "--input", "m.h5", "--output", "s.h5"];
        Spots::try_parse_from(base.iter().chain(extra)).expect("valid options").a
    }

    #[test]
    fn the_options_given_override_the_runs_settings_which_override_the_defaults() {
        let run = LocalSnrParams { threshold: 8.0, snr: 4.0, box_half: 10, min_pixels: 3, max_pixels: 100 };
        assert_eq!(local_params(&args(&[]), None).expect("defaults"), LOCAL_DEFAULTS);
        assert_eq!(local_params(&args(&[]), Some(run)).expect("the run's"), run);
        let mixed = local_params(&args(&["--snr", "2.5", "--min-pixels", "6"]), Some(run)).expect("mixed");
        assert_eq!(mixed, LocalSnrParams { snr: 2.5, min_pixels: 6, ..run });
        let photons = local_params(&args(&["--threshold-photons", "2", "--photon-energy-kev", "12.4"]), Some(run)).expect("photons");
        assert_eq!(photons.threshold, 2.0 * 12.4);
    }
}
