//! Local-SNR spot finding, GPU against CPU.
//!
//! `the_kernels_rule_finds_the_cpus_spots` runs everywhere: it replays the two kernels of
//! `kernels/spots.cu` on the CPU, line by line (the running column sums as each row sees
//! them, then each pixel's box sum left to right), groups the strong pixels with the CPU
//! finder's own code, and expects the CPU finder's spots. That checks the kernels' order of
//! operations and the grouping interface without a GPU. `the_gpu_finds_the_cpus_spots` runs
//! the kernels themselves and skips, saying why, without a GPU.

mod common;

use rdaq_detector::jungfrau::{MODULE_COLS, MODULE_PIXELS, MODULE_ROWS};
use rdaq_detector::synth::{ModuleSynth, SynthConfig};
use rdaq_gpu::GpuLocalSnr;
use rdaq_process::spots::{LocalSnr, LocalSnrParams, Spot};
use rdaq_process::{Calibration, Converter, InvalidGain};

/// Converted frames of the synthetic detector (keV), with a saturated and a masked pixel.
fn frames(n: u64) -> (Vec<Vec<f32>>, f32) {
    let cfg = SynthConfig::default();
    let e = cfg.photon_energy_kev;
    let mut synth = ModuleSynth::new(cfg, 0);
    let mc = synth.calibration();
    let conv = Converter::new(Calibration::unmasked(mc), InvalidGain::Error).unwrap();
    let mut raw = vec![0u16; MODULE_PIXELS];
    let out = (0..n)
        .map(|f| {
            synth.frame(f, &mut raw);
            let mut kev = vec![0f32; MODULE_PIXELS];
            conv.to_kev(&raw, &mut kev);
            kev[300 * MODULE_COLS + 500] = f32::INFINITY;
            kev[301 * MODULE_COLS + 500] = f32::NAN;
            kev
        })
        .collect();
    (out, e)
}

/// `colsum_running` on the CPU: the column sums each row sees, in the kernel's order.
fn colsum_running(image: &[f32], width: usize, height: usize, n: usize) -> (Vec<f64>, Vec<f64>, Vec<u32>) {
    let (mut sum, mut sum2, mut cnt) = (vec![0f64; image.len()], vec![0f64; image.len()], vec![0u32; image.len()]);
    for c in 0..width {
        let (mut s1, mut s2, mut k) = (0f64, 0f64, 0u32);
        let add = |v: f32, sign: f64, s1: &mut f64, s2: &mut f64, k: &mut u32| {
            let ok = v.is_finite();
            let x = if ok { v as f64 } else { 0.0 };
            *s1 += sign * x;
            *s2 += (sign * x) * x;
            *k = k.wrapping_add(if ok { if sign > 0.0 { 1 } else { u32::MAX } } else { 0 });
        };
        for r in 0..n.min(height) {
            add(image[r * width + c], 1.0, &mut s1, &mut s2, &mut k);
        }
        for r in 0..height {
            if r + n < height {
                add(image[(r + n) * width + c], 1.0, &mut s1, &mut s2, &mut k);
            }
            if r > n {
                add(image[(r - n - 1) * width + c], -1.0, &mut s1, &mut s2, &mut k);
            }
            let at = r * width + c;
            (sum[at], sum2[at], cnt[at]) = (s1, s2, k);
        }
    }
    (sum, sum2, cnt)
}

/// `strong_pixels` on the CPU.
fn strong_pixels(image: &[f32], width: usize, p: &LocalSnrParams, sums: &(Vec<f64>, Vec<f64>, Vec<u32>)) -> Vec<u32> {
    let (sum, sum2, cnt) = sums;
    let n = p.box_half;
    let snr2 = (p.snr as f64) * (p.snr as f64);
    let mut out = Vec::new();
    for (px, &v) in image.iter().enumerate() {
        if !(v >= p.threshold) {
            continue;
        }
        if v.is_infinite() {
            out.push(px as u32);
            continue;
        }
        let (r, c) = (px / width, px % width);
        let (lo, hi) = (c.saturating_sub(n), (c + n + 1).min(width));
        let (mut k, mut s, mut q) = (0u32, 0f64, 0f64);
        for j in lo..hi {
            k += cnt[r * width + j];
            s += sum[r * width + j];
            q += sum2[r * width + j];
        }
        k -= 1;
        if k == 0 {
            continue;
        }
        let x = v as f64;
        let (s, q, kd) = (s - x, q - x * x, k as f64);
        let mean = s / kd;
        let var = (q / kd - mean * mean).max(0.0);
        let d = x - mean;
        if d > 0.0 && d * d > snr2 * var {
            out.push(px as u32);
        }
    }
    out
}

#[test]
fn the_kernels_rule_finds_the_cpus_spots() {
    let (frames, e) = frames(4);
    let p = LocalSnrParams::for_photon_energy(e);
    let (mut cpu, mut host) = (LocalSnr::new(p), LocalSnr::new(p));
    let (mut want, mut got) = (Vec::<Spot>::new(), Vec::<Spot>::new());
    let mut total = 0;
    for kev in &frames {
        cpu.find(kev, MODULE_COLS, MODULE_ROWS, &mut want);
        let strong = strong_pixels(kev, MODULE_COLS, &p, &colsum_running(kev, MODULE_COLS, MODULE_ROWS, p.box_half));
        host.group_strong(kev, MODULE_COLS, &strong, &mut got);
        assert_eq!(got, want);
        total += want.len();
    }
    assert!(total > 50, "the frames have spots ({total})");
}

#[test]
fn the_gpu_finds_the_cpus_spots() {
    let Some(dev) = common::device() else { return };
    let (frames, e) = frames(4);
    let p = LocalSnrParams::for_photon_energy(e);
    let (mut cpu, mut gpu) = (LocalSnr::new(p), GpuLocalSnr::new(&dev, p).unwrap());
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for kev in &frames {
        cpu.find(kev, MODULE_COLS, MODULE_ROWS, &mut want);
        gpu.find(kev, MODULE_COLS, MODULE_ROWS, &mut got).unwrap();
        assert_eq!(got, want, "on {}", dev.name);
    }
}
