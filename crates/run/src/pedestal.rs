//! A JUNGFRAU pedestal run recorded into a calibration file ([`rdaq_process::pedestal_run`]),
//! for the next acquisition's calibration: `rdaq receive --pedestal-run FILE`, and a pedestal
//! dataset of the acquisition service.

use std::path::Path;

use anyhow::bail;
use rdaq_detector::jungfrau::TYPICAL_PEDESTAL;
use rdaq_detector::Geometry;
use rdaq_process::pedestal_run::PedestalRun;
use crate::acquisition::Chain;
use crate::config::Config;

/// Pixels whose G0 pedestal RMS is above this (ADU) are masked (as `rdaq process pedestal`).
const MAX_RMS_G0: f32 = 100.0;

/// The pedestal run of an acquisition whose frames take `chain`: JUNGFRAU's raw frames.
pub fn start(chain: &Chain) -> anyhow::Result<PedestalRun> {
    if chain.processing.is_some() || chain.decoder.is_some() {
        bail!("--pedestal-run takes a JUNGFRAU's raw frames: drop --calibration (or set process.mode = \"raw\"), and no --detector other than jungfrau");
    }
    let g = chain.geometry;
    // each frame in as many bands of pixels as the chain has workers
    Ok(PedestalRun::new(g.height(), g.width(), chain.workers.count))
}

/// Writes the run's calibration to `path`: the gains of `process.gain_maps`, else typical
/// PSI values; gaps and pixels without a frame in a stage masked. Returns what to say of
/// it, warnings first word "warning:".
pub fn save(cfg: &Config, g: Geometry, run: &PedestalRun, path: &Path, overwrite: bool) -> anyhow::Result<Vec<String>> {
    if run.frames() == 0 {
        bail!("--pedestal-run: no complete frame came ({} incomplete left out); {} is not written", run.left_out(), path.display());
    }
    let mut said = Vec::new();
    if cfg.process.gain_maps.is_empty() {
        said.push(format!("pedestal run: no process.gain_maps: the gains in {} are typical PSI values", path.display()));
    }
    let typical = crate::calibration::typical_calibration(&g);
    let gain = crate::calibration::with_gain_maps(cfg, g, &(0..g.modules).collect::<Vec<_>>(), typical)?.gain;
    let cf = run.calibration(gain, g.gap_mask(), TYPICAL_PEDESTAL, 1, MAX_RMS_G0);
    let masked = cf.cal.mask.iter().filter(|&&m| m != 0).count();
    rdaq_sink::claim::claim(path, overwrite)?;
    cf.save(path)?;
    let n = cf.frames.unwrap_or_default();
    said.push(format!(
        "pedestal run of {} frames ({} incomplete left out): G0 {}, G1 {}, G2 {} frames at most per pixel, {masked} pixels masked -> {}",
        run.frames(),
        run.left_out(),
        n[0],
        n[1],
        n[2],
        path.display()
    ));
    said.extend(unmeasured(run));
    Ok(said)
}

/// Warns of the gain stages most pixels never showed: a pedestal run needs dark frames in
/// each, and pixels without one are masked (a calibration masking many is refused when used).
fn unmeasured(run: &PedestalRun) -> Vec<String> {
    const SWITCH: [&str; 3] = ["dynamic gain", "forceswitchg1", "forceswitchg2"];
    let mut said = Vec::new();
    for (s, share) in run.measured_shares().into_iter().enumerate() {
        if share < 0.99 {
            said.push(format!(
                "warning: G{s} was measured in {:.1}% of the pixels: take dark frames with the detector in {} (slsDetectorPackage's gainmode) in the same run; the others are masked, and process.max_masked refuses such a calibration",
                100.0 * share,
                SWITCH[s]
            ));
        }
    }
    said
}
