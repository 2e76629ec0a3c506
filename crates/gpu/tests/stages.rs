//! The GPU pedestal tracker and bitshuffle transposition against the CPU's: equal. Skip,
//! saying why, on a machine without a usable GPU.

mod common;

use rdaq_detector::jungfrau::MODULE_PIXELS;
use rdaq_detector::synth::{ModuleSynth, SynthConfig};
use rdaq_gpu::{GpuPedestal, GpuShuffle};
use rdaq_process::bitshuffle::{default_block_elems, shuffle_block};
use rdaq_process::pedestal::Pedestal;

use common::device;

#[test]
fn pedestal_tracking_equals_the_cpu() {
    let Some(dev) = device() else { return };
    let mut synth = ModuleSynth::new(SynthConfig::default(), 0);
    // a window of 4 over 10 frames: the filling and the running update
    let (mut cpu, mut gpu) = (Pedestal::<f64>::new(MODULE_PIXELS, 0, 4), GpuPedestal::new(&dev, MODULE_PIXELS, 0, 4).unwrap());
    let mut raw = vec![0u16; MODULE_PIXELS];
    for f in 0..10 {
        synth.frame(f, &mut raw);
        raw[7] = 0x4123; // a word of another gain stage
        cpu.push(&raw);
        gpu.push(&raw).unwrap();
    }
    let mut want = vec![0f32; MODULE_PIXELS];
    cpu.mean_into(&mut want);
    let got = gpu.mean().unwrap();
    assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "pedestals differ on {}", dev.name);
    assert_eq!(gpu.wrong_gain().unwrap(), cpu.wrong_gain());
}

#[test]
fn bitshuffle_transposition_equals_the_cpu() {
    let Some(dev) = device() else { return };
    let gpu = GpuShuffle::new(&dev).unwrap();
    for (size, n) in [(2usize, MODULE_PIXELS), (4, MODULE_PIXELS), (4, 5000 * 8 + 5), (2, 13)] {
        let data: Vec<u8> = (0..n * size).map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8).collect();
        let block = default_block_elems(size);
        let mut want = vec![0u8; data.len()];
        for b0 in (0..n).step_by(block) {
            let whole = (n - b0).min(block) / 8 * 8;
            let (s, d) = (b0 * size, (b0 + whole) * size);
            shuffle_block(&data[s..d], &mut want[s..d], size);
        }
        let tail = n / 8 * 8 * size;
        want[tail..].copy_from_slice(&data[tail..]);
        assert_eq!(gpu.shuffle(&data, size, block).unwrap(), want, "{n} elements of {size} bytes");
    }
}

#[test]
fn csr_compaction_equals_the_cpu() {
    let Some(dev) = device() else { return };
    let gpu = rdaq_gpu::GpuCsr::new(&dev).unwrap();
    let (rows, cols) = (37, 1024);
    let mut img: Vec<f32> = (0..rows * cols).map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 24) as f32 / 16.0).collect();
    img[5] = f32::NAN;
    img[6] = f32::INFINITY;
    let (mut want, mut got) = (rdaq_process::sparse::Csr::default(), rdaq_process::sparse::Csr::default());
    want.fill(&img, rows, cols, 12.0);
    gpu.fill_host(&img, rows, cols, 12.0, &mut got).unwrap();
    assert_eq!(got.row_ptr, want.row_ptr);
    assert_eq!(got.cols, want.cols);
    assert!(got.values.iter().zip(&want.values).all(|(a, b)| a.to_bits() == b.to_bits()));
    let counts: Vec<i32> = img.iter().map(|v| if v.is_finite() { *v as i32 } else { -1 }).collect();
    let (mut want, mut got) = (rdaq_process::sparse::Csr::default(), rdaq_process::sparse::Csr::default());
    want.fill(&counts, rows, cols, 0);
    gpu.fill_host(&counts, rows, cols, 0, &mut got).unwrap();
    assert_eq!(got, want);
}
