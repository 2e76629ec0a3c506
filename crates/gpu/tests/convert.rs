//! The GPU conversion against the CPU stage on the synthetic detector's frames: equal bit
//! for bit. Skips, saying why, on a machine without a usable GPU.

mod common;

use rdaq_detector::jungfrau::MODULE_PIXELS;
use rdaq_detector::synth::{ModuleSynth, SynthConfig};
use rdaq_gpu::GpuConverter;
use rdaq_process::{kev_to_photons, Calibration, Converter, InvalidGain};

#[test]
fn conversion_equals_the_cpu_bit_for_bit() {
    let Some(dev) = common::device() else { return };
    let cfg = SynthConfig::default();
    let e = cfg.photon_energy_kev;
    let mut synth = ModuleSynth::new(cfg, 0);
    let mc = synth.calibration();
    let mut cal = Calibration::unmasked(mc);
    cal.mask[1000] = 1;
    for invalid in [InvalidGain::Error, InvalidGain::AsG0, InvalidGain::AsG2] {
        let cpu = Converter::new(cal.clone(), invalid).unwrap();
        let gpu = GpuConverter::new(&dev, &cal, invalid).unwrap();
        let mut raw = vec![0u16; MODULE_PIXELS];
        for f in 0..4 {
            synth.frame(f, &mut raw);
            // every special word and gain code somewhere in the frame
            raw[..6].copy_from_slice(&[0xffff, 0xc000, 0x4000, 0x8123, 0x4567, 0xc321]);
            let mut want = vec![0f32; MODULE_PIXELS];
            cpu.to_kev(&raw, &mut want);
            let got = gpu.to_kev(&raw).unwrap();
            assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "keV differ ({}, {invalid:?}, frame {f})", dev.name);
            let mut want_n = vec![0i32; MODULE_PIXELS];
            kev_to_photons(&want, e, &mut want_n);
            assert_eq!(gpu.to_photons(&raw, e).unwrap(), want_n, "photon counts differ ({invalid:?}, frame {f})");
        }
    }
}

/// The exactness checks `rdaq check` runs (the chain's assembly, conversion and strong
/// pixels with frames in flight in several lanes, pedestal, photons, bitshuffle, CSR), here
/// as a test on a machine with a GPU.
#[test]
fn every_builtin_check_equals_the_cpu() {
    let Some(dev) = common::device() else { return };
    let checks = rdaq_gpu::selfcheck::all(&dev);
    for c in &checks {
        println!("{}: {:?}", c.name, c.result);
    }
    assert!(checks.iter().all(|c| c.result.is_ok()), "on {}", dev.name);
}
