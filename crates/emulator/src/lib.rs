//! Emulated detector modules. Each module runs a RASHPA controller (RC) in its own thread:
//! it synthesizes its frames ([`rdaq_detector::synth`]), cuts them into rdaq datagrams
//! addressed by the receiver's buffer map ([`packetize`]), paces them over the frame period
//! (or sends as fast as possible), and records a manifest of what it sent.

pub mod packetize;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdaq_detector::synth::{as_bytes, ModuleSynth, SynthConfig};
use rdaq_detector::{MODULE_BYTES, MODULE_PIXELS};
use rdaq_net::send::{BatchSender, SendStats};
use rdaq_proto::telegram::BufferMap;
use thiserror::Error;

pub use packetize::Packetizer;

#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    pub modules: u16,
    pub frames: u64,
    pub first_frame: u64,
    /// Frames per second; `None` sends as fast as possible.
    pub rate_hz: Option<f64>,
    /// Receiver data address (the ports come from the buffer map).
    pub target: IpAddr,
    pub gso: bool,
    pub send_buffer: usize,
    pub synth: SynthConfig,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig {
            modules: 1,
            frames: 100,
            first_frame: 0,
            rate_hz: Some(100.0),
            target: IpAddr::from([127, 0, 0, 1]),
            gso: true,
            send_buffer: 8 << 20,
            synth: SynthConfig::default(),
        }
    }
}

#[derive(Debug, Error)]
pub enum EmulatorError {
    #[error("the buffer map serves {map} modules, the emulator has {want}")]
    ModuleCount { map: u16, want: u16 },
    #[error("the buffer map expects {0}-byte module frames; a JUNGFRAU module frame is {MODULE_BYTES} bytes")]
    ModuleBytes(u64),
    #[error("the buffer map has no buffers")]
    NoBuffers,
    #[error("module {module}: {source}")]
    Send { module: u16, source: io::Error },
}

/// One line of the manifest: what a module sent for a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestEntry {
    pub frame: u64,
    pub module: u16,
    /// xxh3-64 of the raw module frame (little-endian 16-bit words).
    pub xxh3: u64,
}

#[derive(Debug, Default)]
pub struct EmulatorReport {
    pub manifest: Vec<ManifestEntry>,
    pub sent: SendStats,
    pub gso: bool,
    pub elapsed: Duration,
    /// Frames that started later than their scheduled time by more than one frame period.
    pub late_frames: u64,
}

/// Shared progress of a running emulator.
#[derive(Default)]
pub struct Progress {
    /// Module frames fully sent.
    pub module_frames: AtomicU64,
    pub stop: AtomicBool,
}

/// Runs every module's RC to completion (or until `progress.stop`).
pub fn run(cfg: &EmulatorConfig, map: &BufferMap, progress: Arc<Progress>) -> Result<EmulatorReport, EmulatorError> {
    if map.modules != cfg.modules || map.data_ports.len() != cfg.modules as usize {
        return Err(EmulatorError::ModuleCount { map: map.modules, want: cfg.modules });
    }
    if map.module_bytes != MODULE_BYTES as u64 {
        return Err(EmulatorError::ModuleBytes(map.module_bytes));
    }
    if map.buffers.is_empty() {
        return Err(EmulatorError::NoBuffers);
    }
    let start = Instant::now();
    let handles: Vec<_> = (0..cfg.modules)
        .map(|m| {
            let (cfg, map, progress) = (cfg.clone(), map.clone(), progress.clone());
            std::thread::Builder::new()
                .name(format!("rdaq-rc{m}"))
                .spawn(move || run_module(&cfg, &map, m, start, &progress))
                .expect("spawn an RC thread")
        })
        .collect();
    let mut report = EmulatorReport::default();
    for h in handles {
        let r = h.join().expect("RC thread panicked")?;
        report.manifest.extend(r.manifest);
        report.sent.datagrams += r.sent.datagrams;
        report.sent.bytes += r.sent.bytes;
        report.sent.syscalls += r.sent.syscalls;
        report.sent.refused += r.sent.refused;
        report.sent.retries += r.sent.retries;
        report.gso = r.gso;
        report.late_frames += r.late_frames;
    }
    report.manifest.sort_by_key(|e| (e.frame, e.module));
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Datagrams per paced send: one GSO group.
const CHUNK: usize = 7;

fn run_module(cfg: &EmulatorConfig, map: &BufferMap, module: u16, start: Instant, progress: &Progress) -> Result<EmulatorReport, EmulatorError> {
    let err = |source| EmulatorError::Send { module, source };
    let dest = SocketAddr::new(cfg.target, map.data_ports[module as usize]);
    let local = SocketAddr::new(if cfg.target.is_ipv4() { [0, 0, 0, 0].into() } else { [0u16; 8].into() }, 0);
    let mut tx = BatchSender::connect(local, dest, cfg.gso, cfg.send_buffer).map_err(err)?;
    let mut synth = ModuleSynth::new(cfg.synth.clone(), module);
    let mut pk = Packetizer::new(map, module);
    let mut words = vec![0u16; MODULE_PIXELS];
    let mut report = EmulatorReport { gso: tx.gso(), ..Default::default() };
    let period = cfg.rate_hz.map(|r| Duration::from_secs_f64(1.0 / r));
    for i in 0..cfg.frames {
        if progress.stop.load(Ordering::Relaxed) {
            break;
        }
        let frame = cfg.first_frame + i;
        synth.frame(frame, &mut words);
        let bytes = as_bytes(&words);
        report.manifest.push(ManifestEntry { frame, module, xxh3: xxhash_rust::xxh3::xxh3_64(bytes) });
        let n = pk.frame(frame);
        let frame_start = period.map(|p| start + p.mul_f64(i as f64));
        if let (Some(t0), Some(p)) = (frame_start, period) {
            if Instant::now() > t0 + p {
                report.late_frames += 1;
            }
        }
        let mut k = 0;
        while k < n {
            let m = CHUNK.min(n - k);
            if let (Some(t0), Some(p)) = (frame_start, period) {
                rdaq_net::pace::wait_until(t0 + p.mul_f64(k as f64 / n as f64));
            }
            tx.send(m, |j| pk.datagram(k + j, bytes)).map_err(err)?;
            k += m;
        }
        progress.module_frames.fetch_add(1, Ordering::Relaxed);
    }
    report.sent = tx.stats;
    Ok(report)
}
