//! The calibration an acquisition's processing starts with: a file of `rdaq process
//! pedestal` or of a pedestal run, a pedestal file of PSI's tools, or the emulated detector's own, with PSI's gain maps of its modules when given;
//! and the typical values a pedestal run starts from.

use anyhow::{bail, Context};
use rdaq_detector::Geometry;
use rdaq_process::psi_pedestal::{is_psi_pedestal, PsiPedestal};
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
        let cf = if is_psi_pedestal(&p.calibration) {
            PsiPedestal::load(&p.calibration, p.hg0).context("process.calibration")?.calibration(&g, ids, typical_calibration(&g)).context("process.calibration")?
        } else {
            rdaq_process::calfile::CalFile::load(&p.calibration)?
        };
        if (cf.rows, cf.cols) != (g.height(), g.width()) {
            bail!("process.calibration {} is {}x{} pixels, the detector image {}x{}", p.calibration.display(), cf.rows, cf.cols, g.height(), g.width());
        }
        refuse_masked(cfg, &g, &cf)?;
        cf.cal
    };
    with_gain_maps(cfg, g, ids, cal)
}

/// What the start says of a calibration file of PSI's tools: where its gains come from.
pub fn psi_said(cfg: &Config) -> Option<String> {
    let p = &cfg.process;
    if cfg.emulated_calibration() || !is_psi_pedestal(&p.calibration) {
        return None;
    }
    let gains = if p.gain_maps.is_empty() { "typical PSI gains (no process.gain_maps)" } else { "the gains of process.gain_maps" };
    Some(format!("calibration: {} is a PSI pedestal file (jungfrau_utils' layout): its pedestals and bad pixels, with {gains}", p.calibration.display()))
}

/// The share of each module's pixels that `cal` masks (gaps are not the modules' pixels).
pub fn masked_shares(g: &Geometry, cal: &Calibration) -> Vec<f64> {
    (0..g.modules)
        .map(|m| {
            let (mut masked, mut all) = (0usize, 0usize);
            g.module_runs(m, |_, at, run| {
                masked += cal.mask[at..at + run].iter().filter(|&&b| b != 0).count();
                all += run;
            });
            masked as f64 / all.max(1) as f64
        })
        .collect()
}

/// What the start says of a calibration: the share of each module's pixels it masks.
pub fn masked_said(g: &Geometry, cal: &Calibration) -> String {
    let shares: Vec<String> = masked_shares(g, cal).iter().map(|s| format!("{:.1}%", 100.0 * s)).collect();
    format!("calibration: pixels masked per module: {}", shares.join(", "))
}

/// Refuses a calibration file that masks more of a module than `process.max_masked`, naming
/// the gains its file measured from no frame (a pedestal run without forced G1 and G2 frames
/// masks every pixel, and every processed pixel would be the masked value).
fn refuse_masked(cfg: &Config, g: &Geometry, cf: &rdaq_process::calfile::CalFile) -> anyhow::Result<()> {
    let limit = cfg.process.max_masked;
    let shares = masked_shares(g, &cf.cal);
    let Some((m, share)) = shares.iter().enumerate().find(|(_, &s)| s > limit) else { return Ok(()) };
    let unmeasured: Vec<String> = cf.frames.iter().flat_map(|f| f.iter().enumerate()).filter(|(_, &n)| n == 0).map(|(s, _)| format!("G{s}")).collect();
    let why = if unmeasured.is_empty() { String::new() } else { format!(" (its pedestals of {} were measured from no frame: take dark frames in each gain, e.g. forceswitchg1 and forceswitchg2)", unmeasured.join(" and ")) };
    bail!(
        "process.calibration {}: module {m} has {:.1}% of its pixels masked, more than process.max_masked = {limit}{why}; set process.max_masked = 1 to use it anyway",
        cfg.process.calibration.display(),
        100.0 * share
    )
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
