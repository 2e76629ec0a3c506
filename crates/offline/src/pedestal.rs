//! A calibration from a dark run: the running pedestal of one gain stage over the frames,
//! its RMS, and a mask of pixels too noisy or too rarely seen, written over a base
//! calibration (its gains and other stages kept) or over typical PSI values.

use std::path::PathBuf;

use anyhow::bail;
use rdaq_detector::jungfrau::{TYPICAL_GAIN, TYPICAL_PEDESTAL};
use rdaq_process::calfile::CalFile;
use rdaq_process::pedestal::{Pedestal, Sum};
use rdaq_process::Calibration;
use rdaq_sink::FrameReader;

use crate::Output;

/// The sums' float type: f32 (as aare's `Pedestal_f`) or f64 (`Pedestal_d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sums {
    F32,
    F64,
}

pub struct PedestalOptions {
    /// Gain stage of the dark run: 0, 1 or 2 (G1 and G2 need forced gain switching).
    pub stage: u8,
    /// Running window in frames (at least 1).
    pub window: u32,
    pub sums: Sums,
    /// Calibration whose gains and other stages' pedestals are kept (none: typical values).
    pub base: Option<PathBuf>,
    /// Pixels with fewer frames than this are masked (none: the window).
    pub min_frames: Option<u32>,
    /// Pixels of stage 0 with a pedestal RMS above this (ADU) are masked.
    pub max_rms: f32,
}

/// What a pedestal run came to.
pub struct Pedestalled {
    pub frames: usize,
    pub pixels: usize,
    pub masked: usize,
    /// Whether the gains and other stages are typical values (no base was given).
    pub typical_base: bool,
}

impl Sums {
    /// `f32` or `f64`.
    pub fn parse(s: &str) -> Result<Sums, String> {
        match s {
            "f32" => Ok(Sums::F32),
            "f64" => Ok(Sums::F64),
            s => Err(format!("sums {s:?}: expected f32 or f64")),
        }
    }
}

/// The calibration of `o.stage` from the dark `frames`, written to `out`.
pub fn pedestal(frames: &FrameReader, o: &PedestalOptions, out: &Output) -> anyhow::Result<Pedestalled> {
    if o.stage > 2 || o.window == 0 {
        bail!("stage must be 0, 1 or 2 and window at least 1 (stage {}, window {})", o.stage, o.window);
    }
    match o.sums {
        Sums::F32 => pedestal_with::<f32>(frames, o, out),
        Sums::F64 => pedestal_with::<f64>(frames, o, out),
    }
}

fn pedestal_with<S: Sum>(frames: &FrameReader, o: &PedestalOptions, out: &Output) -> anyhow::Result<Pedestalled> {
    let px = frames.rows * frames.cols;
    let mut p = Pedestal::<S>::new(px, o.stage, o.window);
    let mut raw = Vec::<u16>::new();
    for i in 0..frames.frames {
        frames.read(i, &mut raw)?;
        p.push(&raw);
    }
    let mut base = base(frames, o)?;
    let g = o.stage as usize;
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
    p.mask(o.min_frames.unwrap_or(o.window), o.max_rms, &mut base.cal.mask);
    let masked = base.cal.mask.iter().filter(|&&m| m != 0).count();
    out.make(|path| Ok(base.save(path)?))?;
    Ok(Pedestalled { frames: frames.frames, pixels: px, masked, typical_base: o.base.is_none() })
}

/// The calibration the dark run is written over: `o.base`, or typical PSI values.
fn base(frames: &FrameReader, o: &PedestalOptions) -> anyhow::Result<CalFile> {
    let px = frames.rows * frames.cols;
    let Some(b) = &o.base else {
        return Ok(CalFile {
            rows: frames.rows,
            cols: frames.cols,
            cal: Calibration { pedestal: TYPICAL_PEDESTAL.map(|v| vec![v; px]), gain: TYPICAL_GAIN.map(|v| vec![v; px]), mask: vec![0; px] },
            rms: None,
            frames: Some([0; 3]),
        });
    };
    let cf = CalFile::load(b)?;
    if (cf.rows, cf.cols) != (frames.rows, frames.cols) {
        bail!("base calibration is {}x{} pixels, the frames {}x{}", cf.rows, cf.cols, frames.rows, frames.cols);
    }
    Ok(cf)
}
