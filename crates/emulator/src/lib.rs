//! Emulated detector modules. Each module runs a RASHPA controller (RC) in its own thread:
//! it synthesizes its frames ([`rdaq_detector::synth`]), sends each to the destinations its
//! data transfer process names ([`ModuleDtp`]), cut into rdaq datagrams ([`packetize`]) and
//! paced over the frame period (or as fast as possible), and records a manifest of what it
//! sent.

pub mod packetize;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdaq_detector::synth::{as_bytes, ModuleSynth, SynthConfig};
use rdaq_detector::{MODULE_BYTES, MODULE_PIXELS};
use rdaq_net::send::{BatchSender, SendStats};
use rdaq_proto::telegram::{LocalBufferInfo, ModuleDtp};
use thiserror::Error;

pub use packetize::Packetizer;

#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    pub modules: u16,
    pub frames: u64,
    pub first_frame: u64,
    /// Frames per second; `None` sends as fast as possible.
    pub rate_hz: Option<f64>,
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
            gso: true,
            send_buffer: 8 << 20,
            synth: SynthConfig::default(),
        }
    }
}

#[derive(Debug, Error)]
pub enum EmulatorError {
    #[error("{dtps} data transfer processes for {want} modules")]
    ModuleCount { dtps: usize, want: u16 },
    #[error("module {0}: the DTP expects {1}-byte module frames; a JUNGFRAU module frame is {MODULE_BYTES} bytes")]
    ModuleBytes(u16, u64),
    #[error("module {0}: the DTP has no route, or a route without buffers")]
    NoRoute(u16),
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

/// Runs every module's RC to completion (or until `progress.stop`); `dtps[m]` is module
/// `m`'s data transfer process.
pub fn run(cfg: &EmulatorConfig, dtps: &[ModuleDtp], progress: Arc<Progress>) -> Result<EmulatorReport, EmulatorError> {
    if dtps.len() != cfg.modules as usize {
        return Err(EmulatorError::ModuleCount { dtps: dtps.len(), want: cfg.modules });
    }
    for (m, d) in dtps.iter().enumerate() {
        if d.module_bytes != MODULE_BYTES as u64 {
            return Err(EmulatorError::ModuleBytes(m as u16, d.module_bytes));
        }
        if d.routes.is_empty() || d.routes.iter().any(|r| r.buffers.is_empty()) {
            return Err(EmulatorError::NoRoute(m as u16));
        }
    }
    let start = Instant::now();
    let handles: Vec<_> = dtps
        .iter()
        .map(|dtp| {
            let (cfg, dtp, progress) = (cfg.clone(), dtp.clone(), progress.clone());
            std::thread::Builder::new()
                .name(format!("rdaq-rc{}", dtp.module))
                .spawn(move || run_module(&cfg, &dtp, start, &progress))
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

fn run_module(cfg: &EmulatorConfig, dtp: &ModuleDtp, start: Instant, progress: &Progress) -> Result<EmulatorReport, EmulatorError> {
    let module = dtp.module;
    let err = |source| EmulatorError::Send { module, source };
    // one data channel per route: its own socket and sequence
    let mut channels = dtp
        .routes
        .iter()
        .map(|r| {
            let local = SocketAddr::new(if r.data.is_ipv4() { [0, 0, 0, 0].into() } else { [0u16; 8].into() }, 0);
            let tx = BatchSender::connect(local, r.data, cfg.gso, cfg.send_buffer)?;
            Ok((tx, Packetizer::new(module, dtp.module_bytes, dtp.payload_bytes)))
        })
        .collect::<io::Result<Vec<_>>>()
        .map_err(err)?;
    let mut synth = ModuleSynth::new(cfg.synth.clone(), module);
    let mut words = vec![0u16; MODULE_PIXELS];
    let mut report = EmulatorReport { gso: channels.iter().all(|(tx, _)| tx.gso()), ..Default::default() };
    let period = cfg.rate_hz.map(|r| Duration::from_secs_f64(1.0 / r));
    let mut dests: Vec<(usize, LocalBufferInfo)> = Vec::with_capacity(dtp.routes.len());
    for i in 0..cfg.frames {
        if progress.stop.load(Ordering::Relaxed) {
            break;
        }
        let frame = cfg.first_frame + i;
        synth.frame(frame, &mut words);
        let bytes = as_bytes(&words);
        report.manifest.push(ManifestEntry { frame, module, xxh3: xxhash_rust::xxh3::xxh3_64(bytes) });
        let frame_start = period.map(|p| start + p.mul_f64(i as f64));
        if let (Some(t0), Some(p)) = (frame_start, period) {
            if Instant::now() > t0 + p {
                report.late_frames += 1;
            }
        }
        dests.clear();
        dtp.destinations(frame, |r, b| dests.push((r, *b)));
        // the packets of all destinations spread over the frame period
        let total = dests.len() * channels.first().map_or(0, |(_, pk)| pk.datagrams());
        let mut sent_in_frame = 0;
        for &(r, buf) in &dests {
            let (tx, pk) = &mut channels[r];
            let n = pk.frame(frame, &buf, dtp.routes[r].offset);
            let mut k = 0;
            while k < n {
                let m = CHUNK.min(n - k);
                if let (Some(t0), Some(p)) = (frame_start, period) {
                    rdaq_net::pace::wait_until(t0 + p.mul_f64(sent_in_frame as f64 / total as f64));
                }
                tx.send(m, |j| pk.datagram(k + j, bytes)).map_err(err)?;
                k += m;
                sent_in_frame += m;
            }
        }
        progress.module_frames.fetch_add(1, Ordering::Relaxed);
    }
    for (tx, _) in &channels {
        report.sent.datagrams += tx.stats.datagrams;
        report.sent.bytes += tx.stats.bytes;
        report.sent.syscalls += tx.stats.syscalls;
        report.sent.refused += tx.stats.refused;
        report.sent.retries += tx.stats.retries;
    }
    Ok(report)
}
