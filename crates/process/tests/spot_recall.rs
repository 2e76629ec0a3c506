//! The local-SNR finder against the synthetic detector's ground truth: at least 95% of the
//! Bragg spots found within 0.5 pixel of their true centre, and frames without a crystal in
//! the beam vetoed.

use rdaq_detector::jungfrau::{MODULE_COLS, MODULE_PIXELS, MODULE_ROWS};
use rdaq_detector::synth::{ModuleSynth, SynthConfig};
use rdaq_process::spots::{is_hit, LocalSnr, LocalSnrParams};
use rdaq_process::{Calibration, Converter, InvalidGain};

fn converter(s: &ModuleSynth) -> Converter {
    let c = s.calibration();
    Converter::new(Calibration { pedestal: c.pedestal.clone(), gain: c.gain.clone(), mask: vec![0; MODULE_PIXELS] }, InvalidGain::Error).unwrap()
}

#[test]
fn local_snr_recall_is_at_least_95_percent_within_half_a_pixel() {
    let cfg = SynthConfig::default();
    let e = cfg.photon_energy_kev;
    let mut synth = ModuleSynth::new(cfg, 0);
    let conv = converter(&synth);
    let mut finder = LocalSnr::new(LocalSnrParams::for_photon_energy(e));
    let (mut raw, mut kev, mut found) = (vec![0u16; MODULE_PIXELS], vec![0f32; MODULE_PIXELS], Vec::new());
    let (mut truth, mut matched, mut extra) = (0usize, 0usize, 0usize);
    for frame in 0..20 {
        synth.frame(frame, &mut raw);
        conv.to_kev(&raw, &mut kev);
        finder.find(&kev, MODULE_COLS, MODULE_ROWS, &mut found);
        let spots = synth.spots(frame);
        truth += spots.len();
        let mut used = vec![false; found.len()];
        for s in &spots {
            let hit = found.iter().enumerate().position(|(i, f)| !used[i] && (f.x as f64 - s.x).hypot(f.y as f64 - s.y) <= 0.5);
            if let Some(i) = hit {
                used[i] = true;
                matched += 1;
            }
        }
        extra += used.iter().filter(|u| !**u).count();
    }
    let recall = matched as f64 / truth as f64;
    eprintln!("recall {matched}/{truth} = {recall:.4}, {extra} spots without a true one");
    assert!(recall >= 0.95, "recall {recall:.4} ({matched} of {truth})");
    assert!(extra * 20 <= truth, "too many spots without a true one: {extra} against {truth}");
}

#[test]
fn frames_without_spots_are_vetoed() {
    let cfg = SynthConfig { spots_per_frame: 0.0, ..SynthConfig::default() };
    let e = cfg.photon_energy_kev;
    let mut synth = ModuleSynth::new(cfg, 0);
    let conv = converter(&synth);
    let mut finder = LocalSnr::new(LocalSnrParams::for_photon_energy(e));
    let (mut raw, mut kev, mut found) = (vec![0u16; MODULE_PIXELS], vec![0f32; MODULE_PIXELS], Vec::new());
    let mut false_spots = 0;
    for frame in 0..20 {
        synth.frame(frame, &mut raw);
        conv.to_kev(&raw, &mut kev);
        finder.find(&kev, MODULE_COLS, MODULE_ROWS, &mut found);
        false_spots += found.len();
        assert!(!is_hit(&found, 10), "frame {frame}: {} spots from background alone", found.len());
    }
    eprintln!("{false_spots} spots from background photons in 20 empty frames");
}
