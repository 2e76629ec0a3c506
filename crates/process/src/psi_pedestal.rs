//! Pedestal files of PSI's own tools (jungfrau_utils and SwissFEL's sf-daq, the layout
//! `jungfrau_utils.JFDataHandler.pedestal_file` reads): one HDF5 file for the whole
//! detector, its modules stacked along the rows in module order, each 512 x 1024 pixels in
//! the order the module sends them.
//!
//! | dataset | shape | meaning |
//! |---|---|---|
//! | `/gains` | (3 or 4, modules * 512, 1024), float | pedestal (ADU) of G0, G1, G2, then HG0 |
//! | `/gainsRMS` | the same, optional | the pedestals' RMS (ADU) |
//! | `/pixel_mask` | (modules * 512, 1024), integer | non-zero: PSI's procedure found the pixel bad |
//!
//! (`/gains` holds pedestals here; PSI's gain files use the same name for their gains.) The
//! file has no gains: they come from PSI's gain maps, else typical values.

use std::path::{Path, PathBuf};

use rdaq_detector::jungfrau::{MODULE_COLS, MODULE_ROWS};
use rdaq_detector::Geometry;
use thiserror::Error;

use crate::calfile::CalFile;
use crate::pedestal::mask_bits;
use crate::Calibration;

/// Pixels of one module in the file.
const MODULE: usize = MODULE_ROWS * MODULE_COLS;

#[derive(Debug, Error)]
pub enum PsiPedestalError {
    #[error("PSI pedestal file {path}: {source}")]
    Hdf5 { path: PathBuf, source: hdf5::Error },
    #[error("PSI pedestal file {path}: /{name} has shape {got:?}, expected {want}")]
    Shape { path: PathBuf, name: &'static str, got: Vec<usize>, want: String },
    #[error("PSI pedestal file {path}: no HG0 pedestal (/gains holds {stages} stages; hg0 needs 4)")]
    NoHg0 { path: PathBuf, stages: usize },
    #[error("PSI pedestal file {path}: it holds {modules} modules; the image's module {m} is the detector's module {id}")]
    NoModule { path: PathBuf, modules: usize, m: usize, id: u16 },
    #[error("PSI pedestal file {path}: stage {stage}, pixel {pixel}: pedestal {value} is not finite")]
    Value { path: PathBuf, stage: usize, pixel: usize, value: f32 },
}

/// A PSI pedestal file's contents, module after module.
#[derive(Debug)]
pub struct PsiPedestal {
    pub path: PathBuf,
    pub modules: usize,
    /// Pedestals of G0 (HG0 with `hg0`), G1, G2.
    pub pedestal: [Vec<f32>; 3],
    pub rms: Option<[Vec<f32>; 3]>,
    pub bad: Vec<bool>,
}

/// Whether `path` is laid out as a PSI pedestal file (`/gains` and `/pixel_mask`, none of
/// rdaq's `/pedestal`), so that a calibration given by path can be either.
pub fn is_psi_pedestal(path: &Path) -> bool {
    hdf5::File::open(path).is_ok_and(|f| f.link_exists("gains") && f.link_exists("pixel_mask") && !f.link_exists("pedestal"))
}

impl PsiPedestal {
    /// Reads and checks the file; with `hg0`, G0's pedestal is HG0's (a detector in fixed
    /// high gain).
    pub fn load(path: &Path, hg0: bool) -> Result<PsiPedestal, PsiPedestalError> {
        let err = |source| PsiPedestalError::Hdf5 { path: path.to_owned(), source };
        let shape = |name: &'static str, got: Vec<usize>, want: &str| PsiPedestalError::Shape { path: path.to_owned(), name, got, want: want.into() };
        let f = hdf5::File::open(path).map_err(err)?;
        let gains = f.dataset("gains").map_err(err)?;
        let s = gains.shape();
        if s.len() != 3 || !(3..=4).contains(&s[0]) || s[1] == 0 || s[1] % MODULE_ROWS != 0 || s[2] != MODULE_COLS {
            return Err(shape("gains", s, "(3 or 4, modules x 512, 1024)"));
        }
        let (stages, modules) = (s[0], s[1] / MODULE_ROWS);
        if hg0 && stages < 4 {
            return Err(PsiPedestalError::NoHg0 { path: path.to_owned(), stages });
        }
        let px = modules * MODULE;
        let take = |all: Vec<f32>| -> [Vec<f32>; 3] {
            let stage = |k: usize| all[k * px..(k + 1) * px].to_vec();
            [stage(if hg0 { 3 } else { 0 }), stage(1), stage(2)]
        };
        let pedestal = take(gains.read_raw::<f32>().map_err(err)?);
        for (stage, p) in pedestal.iter().enumerate() {
            if let Some((pixel, &value)) = p.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                return Err(PsiPedestalError::Value { path: path.to_owned(), stage, pixel, value });
            }
        }
        let rms = match f.dataset("gainsRMS") {
            Ok(d) if d.shape() == gains.shape() => Some(take(d.read_raw::<f32>().map_err(err)?)),
            Ok(d) => return Err(shape("gainsRMS", d.shape(), "the shape of /gains")),
            Err(_) => None,
        };
        let mask = f.dataset("pixel_mask").map_err(err)?;
        if mask.shape() != [s[1], s[2]] {
            return Err(shape("pixel_mask", mask.shape(), "(modules x 512, 1024)"));
        }
        let bad = mask.read_raw::<i64>().map_err(err)?.into_iter().map(|v| v != 0).collect();
        Ok(PsiPedestal { path: path.to_owned(), modules, pedestal, rms, bad })
    }

    /// The calibration of the image `g` whose m-th module is the detector's module `ids[m]`:
    /// `base` (its gains and gap mask) with this file's pedestals, RMS and bad pixels at each
    /// module's place. A partial readout takes each module's central rows, as it sends them.
    pub fn calibration(&self, g: &Geometry, ids: &[u16], base: Calibration) -> Result<CalFile, PsiPedestalError> {
        if g.module_width != MODULE_COLS || g.module_height > MODULE_ROWS {
            return Err(PsiPedestalError::Shape { path: self.path.clone(), name: "gains", got: vec![MODULE_ROWS, MODULE_COLS], want: format!("modules of {} x {}", g.module_height, g.module_width) });
        }
        let mut cal = base;
        let mut rms = self.rms.as_ref().map(|_| [vec![0.0; cal.mask.len()], vec![0.0; cal.mask.len()], vec![0.0; cal.mask.len()]]);
        let first_row = (MODULE_ROWS - g.module_height) / 2;
        for (m, &id) in ids.iter().enumerate() {
            if id as usize >= self.modules {
                return Err(PsiPedestalError::NoModule { path: self.path.clone(), modules: self.modules, m, id });
            }
            g.module_runs(m as u16, |from, at, run| {
                let src = id as usize * MODULE + first_row * MODULE_COLS + from;
                for s in 0..3 {
                    cal.pedestal[s][at..at + run].copy_from_slice(&self.pedestal[s][src..src + run]);
                    if let (Some(to), Some(of)) = (rms.as_mut(), self.rms.as_ref()) {
                        to[s][at..at + run].copy_from_slice(&of[s][src..src + run]);
                    }
                }
                for (k, &bad) in self.bad[src..src + run].iter().enumerate() {
                    if bad {
                        cal.mask[at + k] |= mask_bits::WRONG_GAIN;
                    }
                }
            });
        }
        Ok(CalFile { rows: g.height(), cols: g.width(), cal, rms, frames: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, stages: usize, modules: usize) -> Vec<f32> {
        let px = modules * MODULE;
        let ped: Vec<f32> = (0..stages * px).map(|i| (i % 9973) as f32 + 0.5).collect();
        let f = hdf5::File::create(path).unwrap();
        f.new_dataset::<f64>().shape((stages, modules * MODULE_ROWS, MODULE_COLS)).create("gains").unwrap().write_raw(&ped.iter().map(|&v| v as f64).collect::<Vec<_>>()).unwrap();
        let mut mask = vec![0i64; px];
        mask[px - MODULE + 5] = 4;
        f.new_dataset::<i64>().shape((modules * MODULE_ROWS, MODULE_COLS)).create("pixel_mask").unwrap().write_raw(&mask).unwrap();
        ped
    }

    fn base(g: &Geometry) -> Calibration {
        let px = g.height() * g.width();
        Calibration { pedestal: [vec![0.0; px], vec![0.0; px], vec![0.0; px]], gain: [vec![1.0; px], vec![1.0; px], vec![1.0; px]], mask: g.gap_mask() }
    }

    #[test]
    fn modules_go_to_their_places_and_bad_pixels_are_masked() {
        let dir = std::env::temp_dir().join(format!("rdaq-psi-pedestal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("pedestal.h5");
        let ped = write(&p, 4, 2);
        assert!(is_psi_pedestal(&p));
        let g = Geometry::new(2, 2, 4, 0).unwrap();
        // the image's module 0 is the detector's module 1, and G0 is HG0's
        let cf = PsiPedestal::load(&p, true).unwrap().calibration(&g, &[1, 0], base(&g)).unwrap();
        let hg0 = 3 * 2 * MODULE;
        assert_eq!(cf.cal.pedestal[0][7], ped[hg0 + MODULE + 7]);
        assert_eq!(cf.cal.pedestal[2][g.width() + 3], ped[2 * 2 * MODULE + MODULE + MODULE_COLS + 3]);
        assert_eq!(cf.cal.pedestal[1][1024 + 4 + 2], ped[2 * MODULE + 2], "module 1 sits right of the 4-pixel gap");
        assert_eq!(cf.cal.mask[5], mask_bits::WRONG_GAIN);
        assert_eq!(cf.cal.mask.iter().filter(|&&m| m == mask_bits::WRONG_GAIN).count(), 1);
        let e = PsiPedestal::load(&p, false).unwrap().calibration(&g, &[0, 2], base(&g)).unwrap_err().to_string();
        assert!(e.contains("holds 2 modules; the image's module 1 is the detector's module 2"), "{e}");
        write(&p, 3, 1);
        assert!(PsiPedestal::load(&p, true).unwrap_err().to_string().contains("no HG0 pedestal"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
