//! `rdaq process`: the processing stages on HDF5 files (reprocessing, calibration from a
//! dark run, and the exactness checks against independent implementations).
//!
//! Inputs are 3-D datasets (frames, rows, cols): plain HDF5 datasets, or rdaq's own
//! bitshuffle chunks (read raw and decoded here, so no HDF5 plugin is needed).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rdaq_sink::FrameReader;
use rdaq_detector::jungfrau::{TYPICAL_GAIN, TYPICAL_PEDESTAL};
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::calfile::CalFile;
use rdaq_process::pedestal::{Pedestal, Sum};
use rdaq_process::spots::{LocalSnr, LocalSnrParams, Peakfinder8, Peakfinder8Params, Spot};
use rdaq_process::{bytes_of, Calibration, Converter, InvalidGain};

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
    /// Refuses, before any work, an output that exists (unless --overwrite) or is a link.
    fn check(&self) -> anyhow::Result<()> {
        rdaq_run::outputs::refuse_existing([self.output.as_path()], self.overwrite)
    }

    /// Makes the output with `make`, which creates the file at the path it is given: a hidden
    /// staging name beside the output, renamed to it once `make` succeeded and removed when it
    /// failed. A failed step leaves no output, and an output it was to overwrite as it was. The
    /// output's name is claimed first when it is new (never through a link).
    fn make<T>(&self, make: impl FnOnce(&Path) -> anyhow::Result<T>) -> anyhow::Result<T> {
        use rdaq_sink::claim;
        if self.overwrite {
            if claim::is_link(&self.output) {
                return Err(claim::ClaimError::Link(self.output.clone()).into());
            }
        } else {
            claim::claim(&self.output, false)?;
        }
        let tmp = claim::claim_staging(&self.output)?;
        match make(&tmp) {
            Ok(v) => {
                std::fs::rename(&tmp, &self.output).with_context(|| format!("cannot rename {} to {}", tmp.display(), self.output.display()))?;
                Ok(v)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                if !self.overwrite {
                    let _ = std::fs::remove_file(&self.output);
                }
                Err(e)
            }
        }
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
        (Some(p), Some(e)) => bail!("--threshold-photons {p} and --photon-energy-kev {e} must both be positive"),
        _ => Ok(a.threshold),
    }
}

/// peakfinder8's radius map: from --radius-map, or computed around the beam centre (the
/// image's centre by default).
fn radius_map(a: &SpotsArgs, rows: usize, cols: usize) -> anyhow::Result<Vec<f32>> {
    let Some(path) = &a.radius_map else {
        return Ok(Peakfinder8::radius_map(cols, rows, a.center_x.unwrap_or(cols as f64 / 2.0), a.center_y.unwrap_or(rows as f64 / 2.0)));
    };
    let what = || format!("--radius-map {}:{}", path.display(), a.radius_dataset);
    let f = hdf5::File::open(path).with_context(what)?;
    let ds = f.dataset(&a.radius_dataset).with_context(what)?;
    if ds.shape() != [rows, cols] {
        bail!("{}: shape {:?}, the image is {rows}x{cols}", what(), ds.shape());
    }
    let radius: Vec<f32> = rdaq_process::chunk_size::reading(&ds, || ds.read_raw()).with_context(what)?;
    if radius.iter().any(|r| !r.is_finite() || *r < 0.0) {
        bail!("{}: radii must be finite and not negative", what());
    }
    Ok(radius)
}

pub fn process(cmd: ProcessCmd) -> anyhow::Result<()> {
    match &cmd {
        ProcessCmd::Convert(a) => a.out.check()?,
        ProcessCmd::Pedestal(a) => a.out.check()?,
        ProcessCmd::Spots(a) => a.out.check()?,
    }
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
    let cal = CalFile::load(&a.calibration)?;
    let frames = open_frames(&a.input)?;
    if (cal.rows, cal.cols) != (frames.rows, frames.cols) {
        bail!("calibration is {}x{} pixels, the frames {}x{}", cal.rows, cal.cols, frames.rows, frames.cols);
    }
    let conv = Converter::new(cal.cal, InvalidGain::parse(&a.invalid_gain)?)?;
    let codec = Codec::parse(&a.codec, a.zstd_level)?;
    a.out.make(|path| convert_into(path, &a, &conv, &frames, codec))?;
    eprintln!("rdaq process convert: {} frames -> {}", frames.frames, a.out.output.display());
    Ok(())
}

/// Writes the converted frames into the new file `path`.
fn convert_into(path: &Path, a: &ConvertArgs, conv: &Converter, frames: &FrameReader, codec: Codec) -> anyhow::Result<()> {
    let out = hdf5::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let g = out.create_group("entry")?.create_group("data")?;
    let (r, c) = (frames.rows, frames.cols);
    let ds = match (a.photon_kev, a.counts.as_str()) {
        (None, _) => rdaq_sink::frame_stack::<f32>(&g, "data", r, c, codec)?,
        (Some(_), "i16") => rdaq_sink::frame_stack::<i16>(&g, "data", r, c, codec)?,
        (Some(_), "i32") => rdaq_sink::frame_stack::<i32>(&g, "data", r, c, codec)?,
        (Some(_), t) => bail!("count type {t:?}: expected i16 or i32"),
    };
    ds.resize((frames.frames, r, c))?;
    let elem = if a.photon_kev.is_some() && a.counts == "i16" { 2 } else { 4 };
    let mut comp = Compressor::new(elem, 0, codec);
    let (mut raw, mut chunk) = (Vec::<u16>::new(), Vec::new());
    let (mut kev, mut c16, mut c32) = (vec![0f32; r * c], vec![0i16; r * c], vec![0i32; r * c]);
    for i in 0..frames.frames {
        frames.read(i, &mut raw)?;
        let bytes = match (a.photon_kev, elem) {
            (None, _) => {
                conv.to_kev(&raw, &mut kev);
                bytes_of(&kev)
            }
            (Some(e), 2) => {
                conv.to_photons(&raw, e, &mut c16);
                bytes_of(&c16)
            }
            (Some(e), _) => {
                conv.to_photons(&raw, e, &mut c32);
                bytes_of(&c32)
            }
        };
        comp.compress(bytes, &mut chunk);
        rdaq_sink::write_chunk(&ds, i, &chunk)?;
    }
    out.flush()?;
    Ok(())
}

fn pedestal(a: PedestalArgs) -> anyhow::Result<()> {
    match a.sums.as_str() {
        "f32" => pedestal_with::<f32>(a),
        "f64" => pedestal_with::<f64>(a),
        s => bail!("sums {s:?}: expected f32 or f64"),
    }
}

fn pedestal_with<S: Sum>(a: PedestalArgs) -> anyhow::Result<()> {
    if a.stage > 2 || a.window == 0 {
        bail!("--stage must be 0, 1 or 2 and --window at least 1");
    }
    let frames = open_frames(&a.input)?;
    let px = frames.rows * frames.cols;
    let mut p = Pedestal::<S>::new(px, a.stage, a.window);
    let mut raw = Vec::<u16>::new();
    for i in 0..frames.frames {
        frames.read(i, &mut raw)?;
        p.push(&raw);
    }
    let mut base = match &a.base {
        Some(b) => {
            let cf = CalFile::load(b)?;
            if (cf.rows, cf.cols) != (frames.rows, frames.cols) {
                bail!("base calibration is {}x{} pixels, the frames {}x{}", cf.rows, cf.cols, frames.rows, frames.cols);
            }
            cf
        }
        None => {
            eprintln!("rdaq process pedestal: no --base calibration: gains and the other stages' pedestals are typical PSI values");
            CalFile {
                rows: frames.rows,
                cols: frames.cols,
                cal: Calibration { pedestal: TYPICAL_PEDESTAL.map(|v| vec![v; px]), gain: TYPICAL_GAIN.map(|v| vec![v; px]), mask: vec![0; px] },
                rms: None,
                frames: Some([0; 3]),
            }
        }
    };
    let g = a.stage as usize;
    p.mean_into(&mut base.cal.pedestal[g]);
    let mut rms = base.rms.take().unwrap_or_else(|| [vec![0.0; px], vec![0.0; px], vec![0.0; px]]);
    p.rms_into(&mut rms[g]);
    base.rms = Some(rms);
    let mut n = base.frames.unwrap_or([0; 3]);
    n[g] = frames.frames as u32;
    base.frames = Some(n);
    // pixels that never arrived get the typical value, so the file stays convertible; the
    // mask says they are bad
    for (ped, &s) in base.cal.pedestal[g].iter_mut().zip(p.samples()) {
        if s == 0 {
            *ped = TYPICAL_PEDESTAL[g];
        }
    }
    p.mask(a.min_frames.unwrap_or(a.window), a.max_rms, &mut base.cal.mask);
    let masked = base.cal.mask.iter().filter(|&&m| m != 0).count();
    a.out.make(|path| Ok(base.save(path)?))?;
    eprintln!("rdaq process pedestal: G{} from {} dark frames (window {}), {masked} of {px} pixels masked -> {}", a.stage, frames.frames, a.window, a.out.output.display());
    Ok(())
}

fn spots(a: SpotsArgs) -> anyhow::Result<()> {
    let frames = open_frames(&a.input)?;
    let (r, c) = (frames.rows, frames.cols);
    enum Finder {
        Local(LocalSnr),
        Pf8(Box<Peakfinder8>),
    }
    if a.min_pixels == 0 || a.min_pixels > a.max_pixels {
        bail!("--min-pixels {} must be at least 1 and at most --max-pixels {}", a.min_pixels, a.max_pixels);
    }
    let mut finder = match a.finder.as_str() {
        "local" => Finder::Local(LocalSnr::new(LocalSnrParams { threshold: local_threshold(&a)?, snr: a.snr, box_half: a.box_half, min_pixels: a.min_pixels, max_pixels: a.max_pixels })),
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
            if (p.asic_ny * p.nasics_y, p.asic_nx * p.nasics_x) != (r, c) {
                bail!("peakfinder8: {}x{} ASICs of {}x{} do not tile the {r}x{c} image", p.nasics_y, p.nasics_x, p.asic_ny, p.asic_nx);
            }
            let radius = radius_map(&a, r, c)?;
            Finder::Pf8(Box::new(Peakfinder8::new(p, radius, &vec![true; r * c])))
        }
        f => bail!("finder {f:?}: expected local or peakfinder8"),
    };
    let (mut img, mut found) = (Vec::<f32>::new(), Vec::<Spot>::new());
    let mut all: Vec<Vec<Spot>> = Vec::with_capacity(frames.frames);
    for i in 0..frames.frames {
        frames.read(i, &mut img)?;
        match &mut finder {
            Finder::Local(f) => f.find(&img, c, r, &mut found),
            Finder::Pf8(f) => f.find(&img, &mut found),
        }
        all.push(found.clone());
    }
    a.out.make(|path| write_spot_file(path, &all))?;
    eprintln!("rdaq process spots: {} frames, {} spots -> {}", frames.frames, all.iter().map(Vec::len).sum::<usize>(), a.out.output.display());
    Ok(())
}

/// Spot lists in the CXI peak-list layout (`/entry/result_1`), as `rdaq run` writes them.
fn write_spot_file(path: &Path, all: &[Vec<Spot>]) -> anyhow::Result<()> {
    let f = hdf5::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let g = f.create_group("entry")?.create_group("result_1")?;
    let n = all.len();
    let m = all.iter().map(Vec::len).max().unwrap_or(0);
    let table = |get: &dyn Fn(&Spot) -> f32| -> Vec<f32> { all.iter().flat_map(|s| (0..m).map(move |k| s.get(k).map_or(0.0, get))).collect() };
    g.new_dataset::<u32>().shape(n).create("nPeaks")?.write_raw(&all.iter().map(|s| s.len() as u32).collect::<Vec<_>>())?;
    g.new_dataset::<f32>().shape((n, m)).create("peakXPosRaw")?.write_raw(&table(&|s| s.x))?;
    g.new_dataset::<f32>().shape((n, m)).create("peakYPosRaw")?.write_raw(&table(&|s| s.y))?;
    g.new_dataset::<f32>().shape((n, m)).create("peakTotalIntensity")?.write_raw(&table(&|s| s.intensity))?;
    g.new_dataset::<f32>().shape((n, m)).create("peakNPixels")?.write_raw(&table(&|s| s.pixels as f32))?;
    f.flush()?;
    Ok(())
}
