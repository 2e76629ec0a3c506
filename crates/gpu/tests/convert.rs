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

#[test]
fn the_overlapped_pipeline_hands_back_every_frame_in_order() {
    let Some(dev) = common::device() else { return };
    let mut synth = ModuleSynth::new(SynthConfig::default(), 0);
    let mc = synth.calibration();
    let cal = Calibration::unmasked(mc);
    let cpu = Converter::new(cal.clone(), InvalidGain::Error).unwrap();
    let mut pipe = rdaq_gpu::Overlapped::new(&dev, GpuConverter::new(&dev, &cal, InvalidGain::Error).unwrap(), MODULE_PIXELS).unwrap();
    let frames: Vec<Vec<u16>> = (0..6)
        .map(|f| {
            let mut raw = vec![0u16; MODULE_PIXELS];
            synth.frame(f, &mut raw);
            raw
        })
        .collect();
    let mut out = vec![0f32; MODULE_PIXELS];
    let check = |tag: u64, got: &[f32]| {
        let mut want = vec![0f32; MODULE_PIXELS];
        cpu.to_kev(&frames[tag as usize], &mut want);
        assert!(want.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()), "frame {tag}");
        tag
    };
    let mut seen = Vec::new();
    for (i, raw) in frames.iter().enumerate() {
        if let Some(tag) = pipe.submit(raw, i as u64, &mut out).unwrap() {
            seen.push(check(tag, &out));
        }
    }
    while let Some(tag) = pipe.finish_oldest(&mut out).unwrap() {
        seen.push(check(tag, &out));
    }
    assert_eq!(seen, (0..6).collect::<Vec<u64>>());
}
