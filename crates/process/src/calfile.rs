//! Calibration files (HDF5): what [`crate::Calibration`] holds, for an image of
//! `rows x cols` pixels.
//!
//! | dataset | type | shape | meaning |
//! |---|---|---|---|
//! | `/pedestal` | float32 | (3, rows, cols) | pedestal per gain stage G0, G1, G2 (ADU) |
//! | `/gain` | float32 | (3, rows, cols) | gain per stage (ADU/keV; G1 and G2 negative) |
//! | `/pixel_mask` | uint32 | (rows, cols) | NXmx pixel_mask bits; non-zero: not converted |
//! | `/pedestal_rms` | float32 | (3, rows, cols) | optional: pedestal RMS (ADU) |
//! | `/pedestal_frames` | uint32 | (3,) | optional: dark frames that made each stage |
//!
//! The pedestal and gain layout is the one of aare's `apply_calibration` (stage, row, col).

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::chunk_size;
use crate::convert::{Calibration, CalibrationError};

#[derive(Debug, Error)]
pub enum CalFileError {
    #[error("calibration file {path}: {source}")]
    Hdf5 { path: PathBuf, source: hdf5::Error },
    #[error("calibration file {path}: /{name} has shape {got:?}, expected {want:?}")]
    Shape { path: PathBuf, name: &'static str, got: Vec<usize>, want: Vec<usize> },
    #[error("calibration file {path}: {source}")]
    Values { path: PathBuf, source: CalibrationError },
}

/// A calibration with its image shape and, when known, the pedestal RMS.
#[derive(Clone, Debug)]
pub struct CalFile {
    pub rows: usize,
    pub cols: usize,
    pub cal: Calibration,
    pub rms: Option<[Vec<f32>; 3]>,
    pub frames: Option<[u32; 3]>,
}

fn stack3(a: &[Vec<f32>; 3]) -> Vec<f32> {
    a.iter().flat_map(|v| v.iter().copied()).collect()
}

fn split3(v: Vec<f32>, pixels: usize) -> [Vec<f32>; 3] {
    [v[..pixels].to_vec(), v[pixels..2 * pixels].to_vec(), v[2 * pixels..].to_vec()]
}

impl CalFile {
    pub fn save(&self, path: &Path) -> Result<(), CalFileError> {
        let err = |source| CalFileError::Hdf5 { path: path.to_owned(), source };
        let (r, c) = (self.rows, self.cols);
        let f = hdf5::File::create(path).map_err(err)?;
        f.new_dataset::<f32>().shape((3, r, c)).create("pedestal").and_then(|d| d.write_raw(&stack3(&self.cal.pedestal))).map_err(err)?;
        f.new_dataset::<f32>().shape((3, r, c)).create("gain").and_then(|d| d.write_raw(&stack3(&self.cal.gain))).map_err(err)?;
        f.new_dataset::<u32>().shape((r, c)).create("pixel_mask").and_then(|d| d.write_raw(&self.cal.mask)).map_err(err)?;
        if let Some(rms) = &self.rms {
            f.new_dataset::<f32>().shape((3, r, c)).create("pedestal_rms").and_then(|d| d.write_raw(&stack3(rms))).map_err(err)?;
        }
        if let Some(n) = &self.frames {
            f.new_dataset::<u32>().shape(3).create("pedestal_frames").and_then(|d| d.write_raw(n)).map_err(err)?;
        }
        f.flush().map_err(err)
    }

    /// Loads and checks a calibration file (shapes agree, values finite, gains non-zero).
    pub fn load(path: &Path) -> Result<CalFile, CalFileError> {
        let err = |source| CalFileError::Hdf5 { path: path.to_owned(), source };
        let f = hdf5::File::open(path).map_err(err)?;
        let mask = f.dataset("pixel_mask").map_err(err)?;
        let shape = mask.shape();
        if shape.len() != 2 {
            return Err(CalFileError::Shape { path: path.to_owned(), name: "pixel_mask", got: shape, want: vec![0, 0] });
        }
        let (rows, cols) = (shape[0], shape[1]);
        let pixels = rows * cols;
        let read3 = |name: &'static str| -> Result<[Vec<f32>; 3], CalFileError> {
            let d = f.dataset(name).map_err(err)?;
            if d.shape() != [3, rows, cols] {
                return Err(CalFileError::Shape { path: path.to_owned(), name, got: d.shape(), want: vec![3, rows, cols] });
            }
            Ok(split3(chunk_size::reading(&d, || d.read_raw::<f32>()).map_err(err)?, pixels))
        };
        let cal = Calibration { pedestal: read3("pedestal")?, gain: read3("gain")?, mask: chunk_size::reading(&mask, || mask.read_raw::<u32>()).map_err(err)? };
        cal.check(pixels).map_err(|source| CalFileError::Values { path: path.to_owned(), source })?;
        let rms = if f.link_exists("pedestal_rms") { Some(read3("pedestal_rms")?) } else { None };
        let frames = if f.link_exists("pedestal_frames") {
            let v = f.dataset("pedestal_frames").and_then(|d| d.read_raw::<u32>()).map_err(err)?;
            (v.len() == 3).then(|| [v[0], v[1], v[2]])
        } else {
            None
        };
        Ok(CalFile { rows, cols, cal, rms, frames })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_roundtrip_and_shape_errors() {
        let dir = std::env::temp_dir().join(format!("rdaq-calfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (rows, cols) = (4, 6);
        let n = rows * cols;
        let ramp = |k: f32| (0..n).map(|i| k + i as f32).collect::<Vec<f32>>();
        let cf = CalFile {
            rows,
            cols,
            cal: Calibration { pedestal: [ramp(2400.0), ramp(13000.0), ramp(14000.0)], gain: [ramp(40.0), ramp(-30.0), ramp(-50.0)], mask: (0..n as u32).map(|i| i % 3).collect() },
            rms: Some([ramp(1.0), ramp(2.0), ramp(3.0)]),
            frames: Some([128, 0, 0]),
        };
        let p = dir.join("cal.h5");
        cf.save(&p).unwrap();
        let back = CalFile::load(&p).unwrap();
        assert_eq!((back.rows, back.cols), (rows, cols));
        assert_eq!(back.cal.pedestal, cf.cal.pedestal);
        assert_eq!(back.cal.gain, cf.cal.gain);
        assert_eq!(back.cal.mask, cf.cal.mask);
        assert_eq!(back.rms, cf.rms);
        assert_eq!(back.frames, cf.frames);

        let f = hdf5::File::create(dir.join("bad.h5")).unwrap();
        f.new_dataset::<u32>().shape((4, 6)).create("pixel_mask").unwrap();
        f.new_dataset::<f32>().shape((2, 4, 6)).create("pedestal").unwrap();
        drop(f);
        let e = CalFile::load(&dir.join("bad.h5")).unwrap_err().to_string();
        assert!(e.contains("/pedestal has shape [2, 4, 6], expected [3, 4, 6]"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
