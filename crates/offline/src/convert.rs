//! Raw JUNGFRAU frames converted with a calibration, frame by frame, into a new file of
//! compressed frames (`/entry/data/data`, one bitshuffle chunk per frame).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::calfile::CalFile;
use rdaq_process::{bytes_of, Converter, InvalidGain};
use rdaq_sink::{FrameReader, NxmxMeta, PixelType};

use crate::Output;

/// The integer type of photon counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counts {
    I16,
    I32,
}

/// What the frames are converted to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unit {
    Kev,
    /// Photon counts of this energy (keV).
    Photons { energy_kev: f32, counts: Counts },
}

pub struct ConvertOptions {
    /// The calibration file (pedestals, gains, mask).
    pub calibration: PathBuf,
    pub unit: Unit,
    /// What the invalid gain code 10 means.
    pub invalid_gain: InvalidGain,
    pub codec: Codec,
    /// The raw run's series (its master's `rdaq_series`), kept in the new file with the
    /// converted pixel type, so that `rdaq process spots` takes the run's finder settings.
    pub series: Option<NxmxMeta>,
}

impl Counts {
    /// `i16` or `i32`.
    pub fn parse(s: &str) -> Result<Counts, String> {
        match s {
            "i16" => Ok(Counts::I16),
            "i32" => Ok(Counts::I32),
            t => Err(format!("count type {t:?}: expected i16 or i32")),
        }
    }
}

/// Converts `frames` into `out`; returns the frames converted.
pub fn convert(frames: &FrameReader, o: &ConvertOptions, out: &Output) -> anyhow::Result<usize> {
    if rdaq_process::psi_pedestal::is_psi_pedestal(&o.calibration) {
        bail!("--calibration {} is a PSI pedestal file, which holds no gains and has no gaps: an acquisition takes it (process.calibration, with process.gain_maps), this command takes rdaq's calibration files only", o.calibration.display());
    }
    let cal = CalFile::load(&o.calibration)?;
    if (cal.rows, cal.cols) != (frames.rows, frames.cols) {
        bail!("calibration is {}x{} pixels, the frames {}x{}", cal.rows, cal.cols, frames.rows, frames.cols);
    }
    let conv = Converter::new(cal.cal, o.invalid_gain)?;
    out.make(|path| convert_into(path, o, &conv, frames))?;
    Ok(frames.frames)
}

/// The invalid-gain rule of the run that wrote the rdaq master `path` (a processed run's, or
/// a raw JUNGFRAU run's that it would have converted with); `None` for a file without it.
pub fn run_invalid_gain(path: &Path) -> Option<String> {
    rdaq_sink::master::read_series(path).ok()?.processing.map(|p| p.invalid_gain)
}

/// The series' metadata of a raw run's master at `path`, when rdaq wrote it raw and kept
/// the settings it would have processed with; `None` otherwise.
pub fn raw_run(path: &Path) -> Option<NxmxMeta> {
    let meta = rdaq_sink::master::read_series(path).ok()?;
    (meta.pixel == PixelType::Raw && meta.processing.is_some()).then_some(meta)
}

/// The series `o.series` as the converted file holds it: its new pixel type, photon energy
/// and codec.
fn converted_series(o: &ConvertOptions) -> Option<NxmxMeta> {
    let mut meta = o.series.clone()?;
    meta.pixel = match o.unit {
        Unit::Kev => PixelType::Kev,
        Unit::Photons { counts: Counts::I16, .. } => PixelType::Photons16,
        Unit::Photons { counts: Counts::I32, .. } => PixelType::Photons32,
    };
    if let Unit::Photons { energy_kev, .. } = o.unit {
        meta.photon_energy_kev = energy_kev as f64;
    }
    meta.codec = o.codec;
    Some(meta)
}

/// Writes the converted frames into the new file `path`.
fn convert_into(path: &Path, o: &ConvertOptions, conv: &Converter, frames: &FrameReader) -> anyhow::Result<()> {
    let out = hdf5::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    if let Some(meta) = converted_series(o) {
        rdaq_sink::master::write_series(&out, &meta)?;
    }
    let g = out.create_group("entry")?.create_group("data")?;
    let (r, c) = (frames.rows, frames.cols);
    let ds = match o.unit {
        Unit::Kev => rdaq_sink::frame_stack::<f32>(&g, "data", r, c, o.codec)?,
        Unit::Photons { counts: Counts::I16, .. } => rdaq_sink::frame_stack::<i16>(&g, "data", r, c, o.codec)?,
        Unit::Photons { counts: Counts::I32, .. } => rdaq_sink::frame_stack::<i32>(&g, "data", r, c, o.codec)?,
    };
    ds.resize((frames.frames, r, c))?;
    let elem = if matches!(o.unit, Unit::Photons { counts: Counts::I16, .. }) { 2 } else { 4 };
    let mut comp = Compressor::new(elem, 0, o.codec);
    let (mut raw, mut chunk) = (Vec::<u16>::new(), Vec::new());
    let (mut kev, mut c16, mut c32) = (vec![0f32; r * c], vec![0i16; r * c], vec![0i32; r * c]);
    for i in 0..frames.frames {
        frames.read(i, &mut raw)?;
        let bytes = match o.unit {
            Unit::Kev => {
                conv.to_kev(&raw, &mut kev);
                bytes_of(&kev)
            }
            Unit::Photons { energy_kev, counts: Counts::I16 } => {
                conv.to_photons(&raw, energy_kev, &mut c16);
                bytes_of(&c16)
            }
            Unit::Photons { energy_kev, counts: Counts::I32 } => {
                conv.to_photons(&raw, energy_kev, &mut c32);
                bytes_of(&c32)
            }
        };
        comp.compress(bytes, &mut chunk);
        rdaq_sink::write_chunk(&ds, i, &chunk)?;
    }
    out.flush()?;
    Ok(())
}
