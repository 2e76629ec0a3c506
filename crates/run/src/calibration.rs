//! The calibration an acquisition's processing starts with: a file of `rdaq process
//! pedestal`, or the emulated detector's own, with PSI's gain maps of its modules when given;
//! and the typical values a pedestal run starts from.

use anyhow::{bail, Context};
use rdaq_detector::Geometry;
use rdaq_process::Calibration;

use crate::config::Config;
use crate::graph;

/// The calibration the processing starts with: `process.calibration`, or the emulated
/// detector's own, with the gains of `process.gain_maps` (one file per module) when given.
pub fn calibration(cfg: &Config, g: Geometry) -> anyhow::Result<Calibration> {
    let maps = cfg.process.gain_maps.len();
    if maps > 0 && maps != g.modules as usize {
        bail!("process.gain_maps: {maps} files for {} modules (one per module, in module order)", g.modules);
    }
    calibration_of(cfg, g, &(0..g.modules).collect::<Vec<_>>())
}

/// [`calibration`] of an image whose m-th module is the detector's module `ids[m]` (a
/// receiver that holds some of the modules): the emulated calibration and the gain maps of
/// those modules.
pub fn calibration_of(cfg: &Config, g: Geometry, ids: &[u16]) -> anyhow::Result<Calibration> {
    let p = &cfg.process;
    let cal = if cfg.emulated_calibration() {
        graph::emulated_calibration_of(cfg.detector.seed, &g, ids)
    } else {
        let cf = rdaq_process::calfile::CalFile::load(&p.calibration)?;
        if (cf.rows, cf.cols) != (g.height(), g.width()) {
            bail!("process.calibration {} is {}x{} pixels, the detector image {}x{}", p.calibration.display(), cf.rows, cf.cols, g.height(), g.width());
        }
        cf.cal
    };
    with_gain_maps(cfg, g, ids, cal)
}

/// Typical PSI pedestals and gains over the image `g`, gaps masked: the base of a
/// calibration whose pedestals are measured (a pedestal run).
pub fn typical_calibration(g: &Geometry) -> Calibration {
    use rdaq_detector::jungfrau::{TYPICAL_GAIN, TYPICAL_PEDESTAL};
    let px = g.height() * g.width();
    Calibration { pedestal: TYPICAL_PEDESTAL.map(|v| vec![v; px]), gain: TYPICAL_GAIN.map(|v| vec![v; px]), mask: g.gap_mask() }
}

/// `cal` with the gains of `process.gain_maps` of the modules `ids` (the image's m-th module
/// is the detector's `ids[m]`), when the configuration has gain maps.
pub fn with_gain_maps(cfg: &Config, g: Geometry, ids: &[u16], mut cal: Calibration) -> anyhow::Result<Calibration> {
    let p = &cfg.process;
    if p.gain_maps.is_empty() {
        return Ok(cal);
    }
    if g.module_width != rdaq_detector::jungfrau::MODULE_COLS || g.module_height > rdaq_detector::jungfrau::MODULE_ROWS {
        bail!("process.gain_maps are JUNGFRAU's (1024 x 512 per module); these modules are {} x {}", g.module_width, g.module_height);
    }
    for (m, &id) in ids.iter().enumerate() {
        let path = p.gain_maps.get(id as usize).with_context(|| format!("process.gain_maps: no file for module {id} ({} files)", p.gain_maps.len()))?;
        let map = rdaq_process::gainmap::GainMap::load(path, p.hg0).context("process.gain_maps")?;
        place_gains(&g, m as u16, &map, &mut cal);
    }
    Ok(cal)
}

/// Puts module `m`'s gain map at its place in the image: its rows around the module centre
/// when the detector reads fewer than 512 (the rows a partial readout sends).
fn place_gains(g: &Geometry, m: u16, map: &rdaq_process::gainmap::GainMap, cal: &mut Calibration) {
    let (w, h) = (g.module_width, g.module_height);
    let first_row = (rdaq_detector::jungfrau::MODULE_ROWS - h) / 2;
    g.module_runs(m, |from, at, run| {
        let (row, col) = (from / w, from % w);
        for (s, gain) in cal.gain.iter_mut().enumerate() {
            gain[at..at + run].copy_from_slice(&map.row(s, first_row + row)[col..col + run]);
        }
    });
}
