//! Emulated detector modules. Each module runs a RASHPA controller (RC) in its own thread:
//! it synthesizes its frames ([`rdaq_detector::synth`]), sends each to the destinations its
//! data transfer process names ([`ModuleDtp`]), cut into rdaq datagrams ([`packetize`]) and
//! paced over the frame period (or as fast as possible), and records a manifest of what it
//! sent.

pub mod packetize;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdaq_detector::synth::{as_bytes, ModuleSynth, SynthConfig};
use rdaq_detector::{MODULE_BYTES, MODULE_PIXELS};
use rdaq_net::send::{BatchSender, SendStats};
use rdaq_proto::events::{Event, EventLog};
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
    /// For throughput benchmarks: synthesize this many frames once and send them in turn
    /// (frame `f` carries the content of frame `f % pool`; the manifest records what was
    /// sent). 0: every frame is synthesized (the default; distinct frames).
    pub frame_pool: usize,
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
            frame_pool: 0,
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
    #[error("DTP {0} is for module {1}: DTPs must come in module order")]
    ModuleOrder(u16, u16),
    #[error("a DTP update must apply from a later frame than the last one, not from {0}")]
    UpdateOrder(u64),
    #[error("a DTP update from frame {from_frame} comes too late: frames up to {frontier} have started")]
    UpdateTooLate { from_frame: u64, frontier: u64 },
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

/// Events kept for readers of a running emulator.
const EVENT_LOG: usize = 1 << 16;

/// Shared state of a running emulator: progress, stop, DTP updates and events.
pub struct Control {
    /// Module frames fully sent.
    pub module_frames: AtomicU64,
    pub stop: AtomicBool,
    /// DTP sets with the frame they apply from, in increasing order of that frame.
    plans: RwLock<Vec<(u64, Arc<Vec<ModuleDtp>>)>>,
    /// One past the highest frame any module has started (taken under the plans' lock, so
    /// an update can never apply to a frame already on its way).
    frontier: AtomicU64,
    pub events: Mutex<EventLog>,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            module_frames: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            plans: RwLock::new(Vec::new()),
            frontier: AtomicU64::new(0),
            events: Mutex::new(EventLog::new(EVENT_LOG)),
        }
    }
}

impl Control {
    /// Makes `dtps` apply to frames `from_frame` and later (the frames before keep the DTPs
    /// they had). Fails if `from_frame` is not after the newest update's, or if a module has
    /// already started that frame ([`Control::frontier`] says the first frame still free).
    pub fn update(&self, from_frame: u64, dtps: Vec<ModuleDtp>) -> Result<(), EmulatorError> {
        check_dtps(dtps.len() as u16, &dtps)?;
        let mut plans = self.plans.write().unwrap_or_else(|e| e.into_inner());
        if plans.last().is_some_and(|(f, _)| *f >= from_frame) {
            return Err(EmulatorError::UpdateOrder(from_frame));
        }
        let frontier = self.frontier.load(Ordering::Acquire);
        if from_frame < frontier {
            return Err(EmulatorError::UpdateTooLate { from_frame, frontier });
        }
        plans.push((from_frame, Arc::new(dtps)));
        Ok(())
    }

    /// The first frame no module has started yet.
    pub fn frontier(&self) -> u64 {
        self.frontier.load(Ordering::Acquire)
    }

    /// The DTPs for `frame`, marking it started.
    fn start_frame(&self, frame: u64) -> Option<Arc<Vec<ModuleDtp>>> {
        let plans = self.plans.read().unwrap_or_else(|e| e.into_inner());
        self.frontier.fetch_max(frame + 1, Ordering::AcqRel);
        plans.iter().rev().find(|(from, _)| *from <= frame).map(|(_, d)| d.clone())
    }

    fn event(&self, e: Event) {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push(e);
    }

}

fn check_dtps(modules: u16, dtps: &[ModuleDtp]) -> Result<(), EmulatorError> {
    if dtps.len() != modules as usize {
        return Err(EmulatorError::ModuleCount { dtps: dtps.len(), want: modules });
    }
    for (m, d) in dtps.iter().enumerate() {
        if d.module != m as u16 {
            return Err(EmulatorError::ModuleOrder(m as u16, d.module));
        }
        if d.module_bytes != MODULE_BYTES as u64 {
            return Err(EmulatorError::ModuleBytes(m as u16, d.module_bytes));
        }
        if d.routes.is_empty() || d.routes.iter().any(|r| r.buffers.is_empty()) {
            return Err(EmulatorError::NoRoute(m as u16));
        }
    }
    Ok(())
}

/// Runs every module's RC to completion (or until `control.stop`); `dtps[m]` is module
/// `m`'s data transfer process from the first frame on (later ones through
/// [`Control::update`]).
pub fn run(cfg: &EmulatorConfig, dtps: &[ModuleDtp], control: Arc<Control>) -> Result<EmulatorReport, EmulatorError> {
    check_dtps(cfg.modules, dtps)?;
    {
        // updates made before the start for later frames stay
        let mut plans = control.plans.write().unwrap_or_else(|e| e.into_inner());
        plans.retain(|(from, _)| *from > cfg.first_frame);
        plans.insert(0, (cfg.first_frame, Arc::new(dtps.to_vec())));
    }
    let start = Instant::now();
    let handles: Vec<_> = (0..cfg.modules)
        .map(|m| {
            let (cfg, control) = (cfg.clone(), control.clone());
            std::thread::Builder::new()
                .name(format!("rdaq-rc{m}"))
                .spawn(move || run_module(&cfg, m, start, &control))
                .expect("spawn an RC thread")
        })
        .collect();
    let mut report = EmulatorReport::default();
    for h in handles {
        let r = h.join().expect("RC thread panicked")?;
        report.manifest.extend(r.manifest);
        report.sent.add(&r.sent);
        report.gso = r.gso;
        report.late_frames += r.late_frames;
    }
    report.manifest.sort_by_key(|e| (e.frame, e.module));
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Datagrams per paced send: one GSO group.
const CHUNK: usize = 7;

/// A data channel: one connected socket and its sequence, per destination address.
type Channels = HashMap<SocketAddr, (BatchSender, Packetizer)>;

fn channel<'a>(channels: &'a mut Channels, cfg: &EmulatorConfig, dtp: &ModuleDtp, data: SocketAddr) -> io::Result<&'a mut (BatchSender, Packetizer)> {
    if !channels.contains_key(&data) {
        let local = SocketAddr::new(if data.is_ipv4() { [0, 0, 0, 0].into() } else { [0u16; 8].into() }, 0);
        let tx = BatchSender::connect(local, data, cfg.gso, cfg.send_buffer)?;
        channels.insert(data, (tx, Packetizer::new(dtp.module, dtp.module_bytes, dtp.payload_bytes)));
    }
    Ok(channels.get_mut(&data).expect("inserted above"))
}

fn run_module(cfg: &EmulatorConfig, module: u16, start: Instant, control: &Control) -> Result<EmulatorReport, EmulatorError> {
    let err = |source| EmulatorError::Send { module, source };
    let mut channels = Channels::new();
    let mut synth = ModuleSynth::new(cfg.synth.clone(), module);
    let mut words = vec![0u16; MODULE_PIXELS];
    let pool: Vec<Vec<u16>> = (0..cfg.frame_pool as u64)
        .map(|f| {
            let mut w = vec![0u16; MODULE_PIXELS];
            synth.frame(f, &mut w);
            w
        })
        .collect();
    let mut report = EmulatorReport { gso: true, ..Default::default() };
    let period = cfg.rate_hz.map(|r| Duration::from_secs_f64(1.0 / r));
    let mut dests: Vec<(SocketAddr, u64, LocalBufferInfo)> = Vec::new();
    for i in 0..cfg.frames {
        if control.stop.load(Ordering::Relaxed) {
            break;
        }
        let frame = cfg.first_frame + i;
        let Some(dtps) = control.start_frame(frame) else {
            continue;
        };
        let dtp = &dtps[module as usize];
        let bytes = if pool.is_empty() {
            synth.frame(frame, &mut words);
            as_bytes(&words)
        } else {
            as_bytes(&pool[(frame % pool.len() as u64) as usize])
        };
        report.manifest.push(ManifestEntry { frame, module, xxh3: xxhash_rust::xxh3::xxh3_64(bytes) });
        let frame_start = period.map(|p| start + p.mul_f64(i as f64));
        if let (Some(t0), Some(p)) = (frame_start, period) {
            if Instant::now() > t0 + p {
                report.late_frames += 1;
            }
        }
        dests.clear();
        dtp.destinations(frame, |r, b| dests.push((dtp.routes[r].data, dtp.routes[r].offset, *b)));
        // the packets of all destinations spread over the frame period
        let per_dest = dtp.module_bytes.div_ceil(dtp.payload_bytes as u64) as usize;
        let total = dests.len() * per_dest;
        let mut sent_in_frame = 0;
        for &(data, offset, buf) in &dests {
            let (tx, pk) = channel(&mut channels, cfg, dtp, data).map_err(err)?;
            let n = pk.frame(frame, &buf, offset);
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
        control.event(Event::EndOfFrame { module, frame, imm: frame as u32 });
        control.module_frames.fetch_add(1, Ordering::Relaxed);
    }
    for (tx, _) in channels.values() {
        report.sent.add(&tx.stats);
        report.gso &= tx.gso();
    }
    if report.late_frames > 0 {
        control.event(Event::SourceOverflow { module, late_frames: report.late_frames });
    }
    control.event(Event::EndOfTransfer { module, frames: report.manifest.len() as u64, datagrams: report.sent.datagrams });
    Ok(report)
}
