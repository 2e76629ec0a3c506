//! Raw JUNGFRAU frames converted with a calibration, frame by frame, into a new file of
//! compressed frames (`/entry/data/data`, one bitshuffle chunk per frame).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::calfile::CalFile;
use rdaq_process::{bytes_of, Converter, InvalidGain};
use rdaq_sink::FrameReader;

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
    let cal = CalFile::load(&o.calibration)?;
    if (cal.rows, cal.cols) != (frames.rows, frames.cols) {
        bail!("calibration is {}x{} pixels, the frames {}x{}", cal.rows, cal.cols, frames.rows, frames.cols);
    }
    let conv = Converter::new(cal.cal, o.invalid_gain)?;
    out.make(|path| convert_into(path, o, &conv, frames))?;
    Ok(frames.frames)
}

/// Writes the converted frames into the new file `path`.
fn convert_into(path: &Path, o: &ConvertOptions, conv: &Converter, frames: &FrameReader) -> anyhow::Result<()> {
    let out = hdf5::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
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
