//! PSI's JUNGFRAU gain map files (`gainMaps_M<module>.bin`), one per module, as PSI's
//! calibration delivers them and aare (`load_calibration`) and jungfrau_utils read them:
//! little-endian float64 maps of 512 x 1024 pixels (row-major), in the order G0, G1, G2,
//! then HG0, HG1, HG2 (the high-gain mode's), in ADU/keV with G1 and G2 negative, the
//! convention of [`crate::Calibration`]. A file holds 3 to 6 maps; the high-gain G0 map
//! (the fourth) replaces G0 for a detector run in fixed high gain (`hg0`), as aare's
//! `load_calibration(fname, hg0=True)` does.

use std::path::{Path, PathBuf};

use rdaq_detector::jungfrau::{MODULE_COLS, MODULE_ROWS};
use thiserror::Error;

/// Pixels of one map.
const MAP: usize = MODULE_ROWS * MODULE_COLS;

#[derive(Debug, Error)]
pub enum GainMapError {
    #[error("gain map {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("gain map {path}: {bytes} bytes is not 3 to 6 maps of 512 x 1024 float64 (4194304 bytes each)")]
    Size { path: PathBuf, bytes: u64 },
    #[error("gain map {path}: no HG0 map (the file holds {maps} maps; hg0 needs at least 4)")]
    NoHg0 { path: PathBuf, maps: usize },
    #[error("gain map {path}: map {map}, pixel {pixel}: {value} is not a usable gain (finite, not 0)")]
    Value { path: PathBuf, map: usize, pixel: usize, value: f64 },
}

/// A module's gains of the three stages (ADU/keV, as float32: what the conversion uses).
#[derive(Debug)]
pub struct GainMap {
    pub gain: [Vec<f32>; 3],
}

impl GainMap {
    /// Reads the gain map file `path`; with `hg0`, G0 is the high-gain map.
    pub fn load(path: &Path, hg0: bool) -> Result<GainMap, GainMapError> {
        let io = |source| GainMapError::Io { path: path.to_owned(), source };
        let bytes = std::fs::metadata(path).map_err(io)?.len();
        let map_bytes = (MAP * 8) as u64;
        if bytes % map_bytes != 0 || !(3..=6).contains(&(bytes / map_bytes)) {
            return Err(GainMapError::Size { path: path.to_owned(), bytes });
        }
        let maps = (bytes / map_bytes) as usize;
        if hg0 && maps < 4 {
            return Err(GainMapError::NoHg0 { path: path.to_owned(), maps });
        }
        let raw = std::fs::read(path).map_err(io)?;
        let map = |k: usize| -> Result<Vec<f32>, GainMapError> {
            let at = k * MAP * 8;
            raw[at..at + MAP * 8]
                .chunks_exact(8)
                .enumerate()
                .map(|(pixel, b)| {
                    let value = f64::from_le_bytes(b.try_into().expect("8 bytes"));
                    if value.is_finite() && value != 0.0 {
                        Ok(value as f32)
                    } else {
                        Err(GainMapError::Value { path: path.to_owned(), map: k, pixel, value })
                    }
                })
                .collect()
        };
        Ok(GainMap { gain: [map(if hg0 { 3 } else { 0 })?, map(1)?, map(2)?] })
    }

    /// The gains of module row `row` (0..512) in stage `stage`.
    pub fn row(&self, stage: usize, row: usize) -> &[f32] {
        &self.gain[stage][row * MODULE_COLS..(row + 1) * MODULE_COLS]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, maps: usize, f: impl Fn(usize, usize) -> f64) {
        let bytes: Vec<u8> = (0..maps).flat_map(|k| (0..MAP).map(move |p| (k, p))).flat_map(|(k, p)| f(k, p).to_le_bytes()).collect();
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn maps_are_read_in_psi_order_and_checked() {
        let dir = std::env::temp_dir().join(format!("rdaq-gainmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("gainMaps_M001.bin");
        write(&p, 6, |k, p| (k + 1) as f64 * 10.0 + (p % 7) as f64 * 0.5);
        let g = GainMap::load(&p, false).unwrap();
        assert_eq!((g.gain[0][3], g.gain[1][3], g.gain[2][3]), (11.5, 21.5, 31.5));
        assert_eq!(GainMap::load(&p, true).unwrap().gain[0][3], 41.5, "HG0 is the fourth map");
        write(&p, 3, |_, _| 1.0);
        assert!(matches!(GainMap::load(&p, true), Err(GainMapError::NoHg0 { maps: 3, .. })));
        std::fs::write(&p, [0u8; 100]).unwrap();
        assert!(GainMap::load(&p, false).unwrap_err().to_string().contains("100 bytes"));
        write(&p, 3, |k, p| if k == 1 && p == 5 { 0.0 } else { 1.0 });
        assert!(GainMap::load(&p, false).unwrap_err().to_string().contains("map 1, pixel 5"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
