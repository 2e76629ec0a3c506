//! `rdaq bench gpu` (issue 13, in progress; written without a GPU and not yet run on one):
//! for a JUNGFRAU 4M (8 modules) and 16M (32 modules) image, the GPU stages against the
//! device's own limits measured in the same run: the conversion kernel's time and effective
//! bandwidth beside a device-to-device copy of the same bytes; pinned host-to-device and
//! device-to-host copies; frames/s end to end (host frame -> keV back in host memory) one
//! frame at a time and with the three-stream overlap; and the CPU conversion on this
//! machine's cores (one thread) for comparison. Without a GPU it says why and exits 2.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use rdaq_detector::Geometry;
use rdaq_gpu::{probe, GpuConverter, Overlapped};
use rdaq_process::{Converter, InvalidGain};
use rdaq_run::graph::emulated_calibration;

#[derive(clap::Args)]
pub struct GpuBenchArgs {
    /// Frames per measurement.
    #[arg(long, default_value_t = 200)]
    frames: u32,
}

/// Milliseconds of `f` on `stream`, timed by two events around it, per call of `n`.
fn timed(stream: &std::sync::Arc<cudarc::driver::CudaStream>, n: u32, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(flags)?;
    for _ in 0..n {
        f()?;
    }
    let end = stream.record_event(flags)?;
    end.synchronize()?;
    Ok(start.elapsed_ms(&end)? as f64 / n as f64)
}

fn row(name: &str, ms: f64, bytes: f64, base_ms: Option<f64>) {
    let vs = base_ms.map_or("-".to_string(), |b| format!("{:.0}%", 100.0 * b / ms));
    println!("{name:<46} {ms:>10.4} {:>10.0} {:>9.1} {vs:>9}", 1e3 / ms, bytes / ms / 1e6);
}

pub fn bench(a: GpuBenchArgs) -> anyhow::Result<ExitCode> {
    let dev = match probe() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rdaq bench gpu: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    println!("rdaq bench gpu on {}: {} frames per row; ms per frame, frames/s, GB/s of the bytes each row moves", dev.name, a.frames);
    for (label, modules, cols) in [("JF4M (8 modules)", 8u16, 2u16), ("JF16M (32 modules)", 32, 4)] {
        let g = Geometry::new(modules, cols, rdaq_detector::geometry::DEFAULT_GAP_X, rdaq_detector::geometry::DEFAULT_GAP_Y).context("geometry")?;
        image_rows(&dev, label, &g, a.frames)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The rows of one image size.
fn image_rows(dev: &rdaq_gpu::Device, label: &str, g: &Geometry, frames: u32) -> anyhow::Result<()> {
    let px = g.height() * g.width();
    let cal = emulated_calibration(1, g);
    let raw: Vec<u16> = (0..px).map(|i| 1000 + (i % 97) as u16).collect();
    let conv = GpuConverter::new(dev, &cal, InvalidGain::Error)?;
    let s = dev.ctx.default_stream();
    let d_raw = s.memcpy_stod(&raw)?;
    let mut d_kev = s.alloc_zeros::<f32>(px)?;
    let mut d_copy = s.alloc_zeros::<f32>(px)?;
    println!("-- {label}: {} x {} pixels", g.height(), g.width());
    println!("{:<46} {:>10} {:>10} {:>9} {:>9}", "row", "ms", "frames/s", "GB/s", "vs copy");
    let copy = timed(&s, frames, || Ok(s.memcpy_dtod(&d_kev, &mut d_copy)?))?;
    // conversion moves 2 (raw) + 4 (out) + 4 + 4 (G0 pedestal, gain) + 4 (mask) bytes a pixel
    row("device copy of the keV image (baseline)", copy, 8.0 * px as f64, None);
    let kernel = timed(&s, frames, || Ok(conv.launch_kev(&s, &d_raw, &mut d_kev)?))?;
    row("conversion kernel (bytes it reads and writes)", kernel, 18.0 * px as f64, Some(copy * 18.0 / 8.0));
    let mut host = vec![0f32; px];
    let t = Instant::now();
    for _ in 0..frames {
        conv.to_kev_into(&raw, &mut host)?;
    }
    row("end to end, one frame at a time", t.elapsed().as_secs_f64() * 1e3 / frames as f64, 6.0 * px as f64, None);
    let mut pipe = Overlapped::new(dev, GpuConverter::new(dev, &cal, InvalidGain::Error)?, px)?;
    let t = Instant::now();
    for f in 0..frames {
        pipe.submit(&raw, f as u64, &mut host)?;
    }
    while pipe.finish_oldest(&mut host)?.is_some() {}
    row("end to end, three streams overlapped", t.elapsed().as_secs_f64() * 1e3 / frames as f64, 6.0 * px as f64, None);
    let cpu = Converter::new(cal, InvalidGain::Error)?;
    let t = Instant::now();
    for _ in 0..frames.min(20) {
        cpu.to_kev(&raw, &mut host);
    }
    row("CPU conversion, one thread (same frame)", t.elapsed().as_secs_f64() * 1e3 / frames.min(20) as f64, 18.0 * px as f64, None);
    Ok(())
}
