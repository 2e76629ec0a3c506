//! `rdaq process`: the processing stages on HDF5 files (reprocessing, calibration from a
//! dark run, and the exactness checks against independent implementations).
//!
//! Inputs are 3-D datasets (frames, rows, cols): plain HDF5 datasets, or rdaq's own
//! bitshuffle chunks (read raw and decoded here, so no HDF5 plugin is needed).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use hdf5::Dataset;
use rdaq_detector::jungfrau::{TYPICAL_GAIN, TYPICAL_PEDESTAL};
use rdaq_process::bitshuffle::{decompress, Codec, Compressor};
use rdaq_process::calfile::CalFile;
use rdaq_process::pedestal::{Pedestal, Sum};
use rdaq_process::spots::{LocalSnr, LocalSnrParams, Peakfinder8, Peakfinder8Params, Spot};
use rdaq_process::{bytes_of, Calibration, Converter, InvalidGain, Plain};

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

#[derive(clap::Args)]
pub struct ConvertArgs {
    #[command(flatten)]
    input: Input,
    /// Calibration file (see docs/processing.md).
    #[arg(long)]
    calibration: PathBuf,
    #[arg(long)]
    output: PathBuf,
    /// Photon counts for this photon energy (keV) instead of keV.
    #[arg(long)]
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
    #[arg(long)]
    output: PathBuf,
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
    #[arg(long)]
    output: PathBuf,
    /// local (local SNR) or peakfinder8.
    #[arg(long, default_value = "local")]
    finder: String,
    /// local: strong-pixel threshold (image units) and SNR, box half-size, pixel counts.
    #[arg(long, default_value_t = 6.2)]
    threshold: f32,
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
    center_x: Option<f32>,
    #[arg(long)]
    center_y: Option<f32>,
}

pub fn process(cmd: ProcessCmd) -> anyhow::Result<()> {
    match cmd {
        ProcessCmd::Convert(a) => convert(a),
        ProcessCmd::Pedestal(a) => pedestal(a),
        ProcessCmd::Spots(a) => spots(a),
    }
}

pub fn parse_invalid_gain(s: &str) -> anyhow::Result<InvalidGain> {
    Ok(match s {
        "error" => InvalidGain::Error,
        "g0" => InvalidGain::AsG0,
        "g2" => InvalidGain::AsG2,
        _ => bail!("invalid gain policy {s:?}: expected error, g0 or g2"),
    })
}

pub fn parse_codec(s: &str, level: i32) -> anyhow::Result<Codec> {
    Ok(match s {
        "lz4" => Codec::Lz4,
        "zstd" => Codec::Zstd(level),
        _ => bail!("codec {s:?}: expected lz4 or zstd"),
    })
}

/// Frames of a 3-D dataset, one at a time.
struct Frames {
    ds: Dataset,
    n: usize,
    rows: usize,
    cols: usize,
    /// The dataset's bitshuffle codec when its chunks are rdaq's (one frame per chunk).
    bitshuffle: Option<Codec>,
}

impl Frames {
    fn open(i: &Input) -> anyhow::Result<(hdf5::File, Frames)> {
        let f = hdf5::File::open(&i.input).with_context(|| format!("cannot open {}", i.input.display()))?;
        let ds = f.dataset(&i.dataset).with_context(|| format!("{}: no dataset {}", i.input.display(), i.dataset))?;
        let s = ds.shape();
        if s.len() != 3 {
            bail!("{}: {} has shape {s:?}, expected (frames, rows, cols)", i.input.display(), i.dataset);
        }
        let bitshuffle = bitshuffle_codec(&ds);
        Ok((f, Frames { n: s[0], rows: s[1], cols: s[2], ds, bitshuffle }))
    }

    fn read<T: hdf5::H5Type + Plain + Default>(&self, i: usize, out: &mut Vec<T>) -> anyhow::Result<()> {
        let px = self.rows * self.cols;
        if let Some(codec) = self.bitshuffle {
            let raw = read_raw_chunk(&self.ds, i).with_context(|| format!("reading chunk of frame {i}"))?;
            let bytes = decompress(&raw, std::mem::size_of::<T>(), codec).with_context(|| format!("decoding frame {i}"))?;
            anyhow::ensure!(bytes.len() == px * std::mem::size_of::<T>(), "frame {i} decodes to {} bytes", bytes.len());
            out.clear();
            out.resize(px, T::default());
            // SAFETY: `out` holds `px` elements of a `Plain` type (no padding, any byte
            // pattern valid) and `bytes` is exactly that long (checked above); the host is
            // little-endian like the file.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().cast::<u8>(), bytes.len()) };
        } else {
            let a: ndarray::Array3<T> = self.ds.read_slice(ndarray::s![i..i + 1, .., ..]).with_context(|| format!("reading frame {i}"))?;
            out.clear();
            out.extend(a.iter().copied());
        }
        Ok(())
    }
}

/// The codec of filter 32008 when the dataset has it (cd_values[4]: 2 LZ4, 3 Zstd).
fn bitshuffle_codec(ds: &Dataset) -> Option<Codec> {
    let dcpl = ds.dcpl().ok()?;
    let mut flags = 0u32;
    let mut n: usize = 8;
    let mut cd = [0u32; 8];
    let mut name = [0 as std::os::raw::c_char; 16];
    let mut config = 0u32;
    // SAFETY: every out-pointer points at a live local of the declared size; `n` says how
    // many cd values fit.
    let rc = hdf5::sync::sync(|| unsafe {
        hdf5_sys::h5p::H5Pget_filter_by_id2(dcpl.id(), rdaq_sink::nxmx::BSHUF_FILTER, &mut flags, &mut n, cd.as_mut_ptr(), name.len(), name.as_mut_ptr(), &mut config)
    });
    if rc < 0 {
        return None;
    }
    Some(if n > 4 && cd[4] == 3 { Codec::Zstd(if n > 5 { cd[5] as i32 } else { 0 }) } else { Codec::Lz4 })
}

fn read_raw_chunk(ds: &Dataset, i: usize) -> anyhow::Result<Vec<u8>> {
    let info = ds.chunk_info(i).with_context(|| format!("no chunk {i}"))?;
    let mut buf = vec![0u8; info.size as usize];
    let mut filter_mask = 0u32;
    // SAFETY: the offset has one entry per dimension and `buf` is the chunk's stored size.
    let rc = hdf5::sync::sync(|| unsafe {
        hdf5_sys::h5d::H5Dread_chunk(ds.id(), hdf5_sys::h5p::H5P_DEFAULT, info.offset.as_ptr(), &mut filter_mask, buf.as_mut_ptr().cast())
    });
    anyhow::ensure!(rc >= 0, "H5Dread_chunk failed");
    Ok(buf)
}

fn convert(a: ConvertArgs) -> anyhow::Result<()> {
    let cal = CalFile::load(&a.calibration)?;
    let (_f, frames) = Frames::open(&a.input)?;
    if (cal.rows, cal.cols) != (frames.rows, frames.cols) {
        bail!("calibration is {}x{} pixels, the frames {}x{}", cal.rows, cal.cols, frames.rows, frames.cols);
    }
    let conv = Converter::new(cal.cal, parse_invalid_gain(&a.invalid_gain)?)?;
    let codec = parse_codec(&a.codec, a.zstd_level)?;
    let out = hdf5::File::create(&a.output).with_context(|| format!("cannot create {}", a.output.display()))?;
    let g = out.create_group("entry")?.create_group("data")?;
    let (r, c) = (frames.rows, frames.cols);
    let ds = match (a.photon_kev, a.counts.as_str()) {
        (None, _) => rdaq_sink::frame_stack::<f32>(&g, "data", r, c, codec)?,
        (Some(_), "i16") => rdaq_sink::frame_stack::<i16>(&g, "data", r, c, codec)?,
        (Some(_), "i32") => rdaq_sink::frame_stack::<i32>(&g, "data", r, c, codec)?,
        (Some(_), t) => bail!("count type {t:?}: expected i16 or i32"),
    };
    ds.resize((frames.n, r, c))?;
    let elem = if a.photon_kev.is_some() && a.counts == "i16" { 2 } else { 4 };
    let mut comp = Compressor::new(elem, 0, codec);
    let (mut raw, mut chunk) = (Vec::<u16>::new(), Vec::new());
    let (mut kev, mut c16, mut c32) = (vec![0f32; r * c], vec![0i16; r * c], vec![0i32; r * c]);
    for i in 0..frames.n {
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
    eprintln!("rdaq process convert: {} frames -> {}", frames.n, a.output.display());
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
    let (_f, frames) = Frames::open(&a.input)?;
    let px = frames.rows * frames.cols;
    let mut p = Pedestal::<S>::new(px, a.stage, a.window);
    let mut raw = Vec::<u16>::new();
    for i in 0..frames.n {
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
    n[g] = frames.n as u32;
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
    base.save(&a.output)?;
    eprintln!("rdaq process pedestal: G{} from {} dark frames (window {}), {masked} of {px} pixels masked -> {}", a.stage, frames.n, a.window, a.output.display());
    Ok(())
}

fn spots(a: SpotsArgs) -> anyhow::Result<()> {
    let (_f, frames) = Frames::open(&a.input)?;
    let (r, c) = (frames.rows, frames.cols);
    enum Finder {
        Local(LocalSnr),
        Pf8(Box<Peakfinder8>),
    }
    let mut finder = match a.finder.as_str() {
        "local" => Finder::Local(LocalSnr::new(LocalSnrParams { threshold: a.threshold, snr: a.snr, box_half: a.box_half, min_pixels: a.min_pixels, max_pixels: a.max_pixels })),
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
            let radius = Peakfinder8::radius_map(c, r, a.center_x.unwrap_or(c as f32 / 2.0), a.center_y.unwrap_or(r as f32 / 2.0));
            Finder::Pf8(Box::new(Peakfinder8::new(p, radius, &vec![true; r * c])))
        }
        f => bail!("finder {f:?}: expected local or peakfinder8"),
    };
    let (mut img, mut found) = (Vec::<f32>::new(), Vec::<Spot>::new());
    let mut all: Vec<Vec<Spot>> = Vec::with_capacity(frames.n);
    for i in 0..frames.n {
        frames.read(i, &mut img)?;
        match &mut finder {
            Finder::Local(f) => f.find(&img, c, r, &mut found),
            Finder::Pf8(f) => f.find(&img, &mut found),
        }
        all.push(found.clone());
    }
    write_spot_file(&a.output, &all)?;
    eprintln!("rdaq process spots: {} frames, {} spots -> {}", frames.n, all.iter().map(Vec::len).sum::<usize>(), a.output.display());
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
