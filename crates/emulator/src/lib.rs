//! Emulated detector modules. Each module runs a RASHPA controller (RC) in its own thread:
//! it synthesizes its frames ([`rdaq_detector::synth`]), sends each to the destinations its
//! data transfer process names ([`ModuleDtp`]), cut into rdaq datagrams ([`packetize`]) and
//! paced over the frame period (or as fast as possible), and records a manifest of what it
//! sent. It keeps the frames it sent in a bounded history (the sender's memory) and resends
//! what receivers ask for ([`rdaq_proto::nack`]); [`faults`] can spoil its sending on purpose.
//! The modules share a [`trigger`]: none runs more than [`TRIGGER_LEAD`] frames ahead of the
//! slowest, as real modules on one trigger signal.

#![forbid(unsafe_code)]

pub mod faults;
pub mod packetize;
pub mod trigger;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdaq_detector::rng;
use rdaq_detector::synth::{as_bytes, ModuleSynth, SynthConfig};
use rdaq_detector::MODULE_BYTES;
use rdaq_net::send::{BatchSender, SendStats};
use rdaq_proto::events::{Event, EventLog};
use rdaq_proto::nack::{self, Missing};
use rdaq_proto::seq::distance;
use rdaq_proto::telegram::{LocalBufferInfo, ModuleDtp, Route};
use thiserror::Error;

pub use faults::{Fate, FaultConfig, FaultStats, Faults, Slow};
pub use packetize::{Packetizer, MAX_HEADER};
pub use trigger::Trigger;

/// Frames a module may run ahead of the slowest module of the detector.
pub const TRIGGER_LEAD: u64 = 2;

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
    /// Bytes of a module frame. A JUNGFRAU module frame (the default) carries synthetic
    /// detector images; any other (even) size carries a pseudo-random test pattern, which
    /// soak tests use for small frames.
    pub module_bytes: u64,
    /// Memory per module for the retransmission history: the last
    /// `history_bytes / module_bytes` frames can be sent again. 0: no retransmission.
    pub history_bytes: u64,
    /// After the last frame, keep answering retransmission requests until none came for
    /// this long.
    pub linger: Duration,
    /// Spoil the sending on purpose (testing only).
    pub faults: Option<FaultConfig>,
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
            module_bytes: MODULE_BYTES as u64,
            history_bytes: 64 << 20,
            linger: Duration::from_millis(200),
            faults: None,
        }
    }
}

#[derive(Debug, Error)]
pub enum EmulatorError {
    #[error("{dtps} data transfer processes for {want} modules")]
    ModuleCount { dtps: usize, want: u16 },
    #[error("module {0}: the DTP expects {1}-byte module frames; the emulator makes {2}-byte frames")]
    ModuleBytes(u16, u64, u64),
    #[error("invalid emulator configuration: {0}")]
    Config(String),
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

/// The manifest as CSV: frame, module, xxh3 of the raw module frame (hex).
pub fn manifest_csv(m: &[ManifestEntry]) -> String {
    let mut s = String::from("frame,module,xxh3\n");
    for e in m {
        s.push_str(&format!("{},{},{:016x}\n", e.frame, e.module, e.xxh3));
    }
    s
}

#[derive(Debug, Default)]
pub struct EmulatorReport {
    pub manifest: Vec<ManifestEntry>,
    pub sent: SendStats,
    pub gso: bool,
    pub elapsed: Duration,
    /// Frames that started later than their scheduled time by more than one frame period.
    pub late_frames: u64,
    /// Frames a module started only after waiting for a slower module (the common trigger).
    pub held_back: u64,
    /// Sends refused (nothing listened at the destination port) while frames were being sent;
    /// `sent.refused` also counts the tail probes and answers after the last frame, which a
    /// receiver that has all its frames and closed its ports refuses harmlessly.
    pub refused_in_frames: u64,
    pub retransmit: RetransmitStats,
    pub faults: FaultStats,
}

/// What the controllers did for retransmission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetransmitStats {
    /// Requests received, and the malformed ones or ones for another module among them.
    pub nacks: u64,
    pub bad_nacks: u64,
    /// Datagrams asked for, and sent again.
    pub requested: u64,
    pub resent: u64,
    /// Datagrams asked for that were no longer (or never) in the history.
    pub history_misses: u64,
    /// Last datagrams sent again after the end so that receivers can see a lost tail.
    pub probes: u64,
}

impl RetransmitStats {
    pub fn add(&mut self, o: &RetransmitStats) {
        self.nacks += o.nacks;
        self.bad_nacks += o.bad_nacks;
        self.requested += o.requested;
        self.resent += o.resent;
        self.history_misses += o.history_misses;
        self.probes += o.probes;
    }
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
        let module_bytes = dtps.first().map_or(MODULE_BYTES as u64, |d| d.module_bytes);
        check_dtps(dtps.len() as u16, module_bytes, &dtps)?;
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

fn check_dtps(modules: u16, module_bytes: u64, dtps: &[ModuleDtp]) -> Result<(), EmulatorError> {
    if dtps.len() != modules as usize {
        return Err(EmulatorError::ModuleCount { dtps: dtps.len(), want: modules });
    }
    for (m, d) in dtps.iter().enumerate() {
        if d.module != m as u16 {
            return Err(EmulatorError::ModuleOrder(m as u16, d.module));
        }
        if d.module_bytes != module_bytes {
            return Err(EmulatorError::ModuleBytes(m as u16, d.module_bytes, module_bytes));
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
    check_dtps(cfg.modules, cfg.module_bytes, dtps)?;
    if cfg.module_bytes == 0 || cfg.module_bytes % 2 != 0 {
        return Err(EmulatorError::Config(format!("module_bytes {} must be even and positive", cfg.module_bytes)));
    }
    if let Some(f) = &cfg.faults {
        f.check().map_err(EmulatorError::Config)?;
        if f.slow.is_some_and(|s| s.module >= cfg.modules) {
            return Err(EmulatorError::Config(format!("faults: the slow module must be below {}", cfg.modules)));
        }
    }
    {
        // updates made before the start for later frames stay
        let mut plans = control.plans.write().unwrap_or_else(|e| e.into_inner());
        plans.retain(|(from, _)| *from > cfg.first_frame);
        plans.insert(0, (cfg.first_frame, Arc::new(dtps.to_vec())));
    }
    let start = Instant::now();
    let trigger = Arc::new(Trigger::new(cfg.modules, TRIGGER_LEAD));
    let handles: Vec<_> = (0..cfg.modules)
        .map(|m| {
            let (cfg, control, trigger) = (cfg.clone(), control.clone(), trigger.clone());
            std::thread::Builder::new()
                .name(format!("rdaq-rc{m}"))
                .spawn(move || {
                    let r = run_module(&cfg, m, start, &control, &trigger);
                    trigger.leave(m);
                    r
                })
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
        report.held_back += r.held_back;
        report.refused_in_frames += r.refused_in_frames;
        report.retransmit.add(&r.retransmit);
        report.faults.add(&r.faults);
    }
    report.manifest.sort_by_key(|e| (e.frame, e.module));
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Datagrams per paced send: one GSO group.
const CHUNK: usize = 7;
/// Tail probes after the last frame, and the time between them.
const PROBES: u32 = 3;
const PROBE_EVERY: Duration = Duration::from_millis(50);

/// A frame sent on a channel, kept while its bytes are in the history.
#[derive(Clone, Copy)]
struct Record {
    frame: u64,
    first_seq: u32,
    buf: LocalBufferInfo,
    offset: u64,
}

/// A datagram held back by the fault injector: sent after the channel's `after`-th
/// datagram, or at `at`.
struct Held {
    bytes: Vec<u8>,
    after: u64,
    at: Option<Instant>,
}

/// The sending side of a channel, with the fault injector's state.
struct Link {
    tx: BatchSender,
    /// Datagrams handed to the kernel on this channel.
    sent: u64,
    /// Retransmitted datagrams so far (varies the fate of each resend).
    resends: u64,
    held: Vec<Held>,
    spare: Vec<Vec<u8>>,
}

/// A data channel: one connected socket, its packetizer (and sequence), the frames it sent.
struct Channel {
    link: Link,
    pk: Packetizer,
    records: VecDeque<Record>,
}

type Channels = HashMap<SocketAddr, Channel>;

/// One datagram to send: header, payload, sequence number, attempt (0: first sending).
type Part<'a> = (&'a [u8], &'a [u8], u32, u64);

impl Link {
    fn owned(&mut self, h: &[u8], p: &[u8]) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        b.extend_from_slice(h);
        b.extend_from_slice(p);
        b
    }

    /// Sends up to [`CHUNK`] datagrams through the fault injector (if any).
    fn send(&mut self, parts: &[Part], faults: Option<&Faults>, delay: Duration, stats: &mut FaultStats) -> io::Result<()> {
        let Some(faults) = faults else {
            self.tx.send(parts.len(), |j| (parts[j].0, parts[j].1))?;
            self.sent += parts.len() as u64;
            return Ok(());
        };
        debug_assert!(parts.len() <= CHUNK);
        let mut pass: [(&[u8], &[u8]); 2 * CHUNK] = [(&[], &[]); 2 * CHUNK];
        let mut np = 0;
        let mut corrupted: [Option<Vec<u8>>; CHUNK] = Default::default();
        for (j, &(h, p, seq, attempt)) in parts.iter().enumerate() {
            let fate = faults.fate(seq, attempt);
            stats.count(fate);
            match fate {
                Fate::Pass | Fate::Duplicate => {
                    pass[np] = (h, p);
                    np += 1;
                    if fate == Fate::Duplicate {
                        pass[np] = (h, p);
                        np += 1;
                    }
                }
                Fate::Drop => {}
                Fate::Corrupt { byte, bit } => {
                    let mut b = self.owned(h, p);
                    let i = byte as usize % b.len();
                    b[i] ^= 1 << bit;
                    corrupted[j] = Some(b);
                }
                Fate::Reorder(d) => {
                    let bytes = self.owned(h, p);
                    self.held.push(Held { bytes, after: self.sent + np as u64 + d as u64, at: None });
                }
                Fate::Delay => {
                    let bytes = self.owned(h, p);
                    self.held.push(Held { bytes, after: u64::MAX, at: Some(Instant::now() + delay) });
                }
            }
        }
        self.tx.send(np, |j| pass[j])?;
        self.sent += np as u64;
        for b in corrupted.iter_mut().filter_map(Option::take) {
            self.tx.send(1, |_| (&b[..], &[]))?;
            self.sent += 1;
            self.spare.push(b);
        }
        self.release(false)
    }

    /// Sends the held datagrams that are due (all of them with `all`).
    fn release(&mut self, all: bool) -> io::Result<()> {
        let now = Instant::now();
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            if all || h.after <= self.sent || h.at.is_some_and(|t| t <= now) {
                let h = self.held.swap_remove(i);
                self.tx.send(1, |_| (&h.bytes[..], &[]))?;
                self.sent += 1;
                self.spare.push(h.bytes);
            } else {
                i += 1;
            }
        }
        Ok(())
    }
}

/// The module's frames: the pool (benchmarks) or the history ring that the frames are made
/// in, so that the history costs no copy.
struct Store {
    pool: Vec<Vec<u16>>,
    ring: Vec<Vec<u16>>,
    tags: Vec<Option<u64>>,
}

impl Store {
    fn bytes(&self, frame: u64) -> Option<&[u8]> {
        if !self.pool.is_empty() {
            return Some(as_bytes(&self.pool[(frame % self.pool.len() as u64) as usize]));
        }
        let i = (frame % self.ring.len() as u64) as usize;
        (self.tags[i] == Some(frame)).then(|| as_bytes(&self.ring[i]))
    }
}

/// The content of a module frame: a synthetic JUNGFRAU image, or a test pattern of any
/// size that depends only on (seed, module, frame).
enum Content {
    Jungfrau(Box<ModuleSynth>),
    Pattern { seed: u64, module: u16 },
}

impl Content {
    fn make(&mut self, frame: u64, out: &mut [u16]) {
        match self {
            Content::Jungfrau(s) => s.frame(frame, out),
            Content::Pattern { seed, module } => {
                let key = rng::key(&[*seed, *module as u64, frame, 0x7e57]);
                for (i, c) in out.chunks_mut(4).enumerate() {
                    let w = rng::at(key, i as u64);
                    for (j, x) in c.iter_mut().enumerate() {
                        *x = (w >> (16 * j)) as u16;
                    }
                }
            }
        }
    }
}

fn channel<'a>(channels: &'a mut Channels, cfg: &EmulatorConfig, dtp: &ModuleDtp, route: &Route) -> io::Result<&'a mut Channel> {
    let data = route.data;
    if !channels.contains_key(&data) {
        let local = SocketAddr::new(if data.is_ipv4() { [0, 0, 0, 0].into() } else { [0u16; 8].into() }, 0);
        let tx = BatchSender::connect(local, data, cfg.gso, cfg.send_buffer)?;
        let link = Link { tx, sent: 0, resends: 0, held: Vec::new(), spare: Vec::new() };
        let pk = Packetizer::new(dtp.module, dtp.module_bytes, dtp.payload_bytes, route.checksum);
        channels.insert(data, Channel { link, pk, records: VecDeque::new() });
    }
    Ok(channels.get_mut(&data).expect("inserted above"))
}

/// The sending state of one RC shared by its frame loop and its request service.
struct Rc<'a> {
    module: u16,
    store: Store,
    faults: Option<Faults>,
    delay: Duration,
    history: usize,
    report: EmulatorReport,
    control: &'a Control,
}

/// Sends the channel's current frame in chunks, calling `pace` before each.
fn send_frame(
    ch: &mut Channel,
    bytes: &[u8],
    faults: Option<&Faults>,
    delay: Duration,
    stats: &mut FaultStats,
    pace: impl Fn(usize),
) -> io::Result<()> {
    let n = ch.pk.datagrams();
    let seq0 = ch.pk.first_seq();
    let mut k = 0;
    while k < n {
        let m = CHUNK.min(n - k);
        pace(m);
        let mut parts: [Part; CHUNK] = [(&[], &[], 0, 0); CHUNK];
        for (j, p) in parts.iter_mut().enumerate().take(m) {
            let (h, pl) = ch.pk.datagram(k + j, bytes);
            *p = (h, pl, seq0.wrapping_add((k + j) as u32), 0);
        }
        ch.link.send(&parts[..m], faults, delay, stats)?;
        k += m;
    }
    Ok(())
}

impl Rc<'_> {
    /// Sends datagram `k` of a recorded frame again, marked as retransmitted.
    fn resend(&mut self, ch: &mut Channel, rec: Record, k: usize) -> io::Result<()> {
        let Some(bytes) = self.store.bytes(rec.frame) else {
            self.report.retransmit.history_misses += 1;
            return Ok(());
        };
        let mut hdr = [0u8; MAX_HEADER];
        let seq = rec.first_seq.wrapping_add(k as u32);
        let hl = ch.pk.encode(rec.frame, &rec.buf, rec.offset, k, seq, true, bytes, &mut hdr);
        ch.link.resends += 1;
        let part = [(&hdr[..hl], ch.pk.payload(k, bytes), seq, ch.link.resends)];
        ch.link.send(&part, self.faults.as_ref(), self.delay, &mut self.report.faults)?;
        self.report.retransmit.resent += 1;
        Ok(())
    }

    /// Answers every request waiting on the channel; true if there was one.
    fn serve(&mut self, ch: &mut Channel) -> io::Result<bool> {
        let mut buf = [0u8; 2048];
        let mut any = false;
        while let Some(len) = ch.link.tx.try_recv(&mut buf)? {
            any = true;
            self.report.retransmit.nacks += 1;
            let entries = match nack::decode(&buf[..len]) {
                Ok((m, e)) if m == self.module => e,
                _ => {
                    self.report.retransmit.bad_nacks += 1;
                    continue;
                }
            };
            let n = ch.pk.datagrams();
            for e in entries {
                match e {
                    Missing::Seq { start, end } => {
                        let want = end.wrapping_sub(start) as u64;
                        self.report.retransmit.requested += want;
                        // only the part of the range the records cover is walked
                        let Some(first) = ch.records.front().map(|r| r.first_seq) else {
                            self.report.retransmit.history_misses += want;
                            continue;
                        };
                        let covered = (ch.records.len() * n) as i64;
                        let lo = (distance(first, start) as i64).max(0);
                        let hi = (distance(first, start) as i64 + want as i64).min(covered);
                        self.report.retransmit.history_misses += want - (hi - lo).max(0) as u64;
                        for rel in lo..hi {
                            let rec = ch.records[rel as usize / n];
                            self.resend(ch, rec, rel as usize % n)?;
                        }
                    }
                    Missing::Frame { frame, start, end } => {
                        let want = (end - start) as u64;
                        self.report.retransmit.requested += want;
                        let found = ch.records.binary_search_by_key(&frame, |r| r.frame).ok().map(|i| ch.records[i]);
                        let Some(rec) = found.filter(|_| (end as usize) <= n) else {
                            self.report.retransmit.history_misses += want;
                            continue;
                        };
                        for k in start..end {
                            self.resend(ch, rec, k as usize)?;
                        }
                    }
                }
            }
        }
        Ok(any)
    }

    /// After the last frame: flush what the fault injector holds, probe each channel's tail
    /// and answer requests until none came for `linger`.
    fn linger(&mut self, channels: &mut Channels, linger: Duration) -> io::Result<()> {
        for ch in channels.values_mut() {
            ch.link.release(true)?;
        }
        if self.history == 0 {
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> =
            channels.values().map(|c| libc::pollfd { fd: c.link.tx.socket().as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
        let mut last = Instant::now();
        let mut next_probe = Instant::now();
        let mut probes = 0;
        while !self.control.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if probes < PROBES && now >= next_probe {
                for ch in channels.values_mut() {
                    if let Some(&rec) = ch.records.back() {
                        let k = ch.pk.datagrams() - 1;
                        self.resend(ch, rec, k)?;
                        self.report.retransmit.probes += 1;
                    }
                }
                probes += 1;
                next_probe = now + PROBE_EVERY;
                last = now;
            }
            for ch in channels.values_mut() {
                if self.serve(ch)? {
                    last = Instant::now();
                }
                ch.link.release(false)?;
            }
            if probes >= PROBES && last.elapsed() >= linger {
                break;
            }
            rdaq_net::socket::wait_readable(&mut fds, 5)?;
        }
        for ch in channels.values_mut() {
            ch.link.release(true)?;
        }
        Ok(())
    }
}

fn run_module(cfg: &EmulatorConfig, module: u16, start: Instant, control: &Control, trigger: &Trigger) -> Result<EmulatorReport, EmulatorError> {
    let err = |source| EmulatorError::Send { module, source };
    let words = (cfg.module_bytes / 2) as usize;
    let mut content = if cfg.module_bytes == MODULE_BYTES as u64 {
        Content::Jungfrau(Box::new(ModuleSynth::new(cfg.synth.clone(), module)))
    } else {
        Content::Pattern { seed: cfg.synth.seed, module }
    };
    let pool: Vec<Vec<u16>> = (0..cfg.frame_pool as u64)
        .map(|f| {
            let mut w = vec![0u16; words];
            content.make(f, &mut w);
            w
        })
        .collect();
    let history = (cfg.history_bytes / cfg.module_bytes) as usize;
    let ring_len = if pool.is_empty() { history.max(1) } else { 0 };
    let mut rc = Rc {
        module,
        store: Store { pool, ring: vec![vec![0u16; words]; ring_len], tags: vec![None; ring_len] },
        faults: cfg.faults.as_ref().map(|f| Faults::new(f, module)),
        delay: cfg.faults.as_ref().map_or(Duration::ZERO, |f| f.delay_time),
        history,
        report: EmulatorReport { gso: true, ..Default::default() },
        control,
    };
    let mut channels = Channels::new();
    let period = cfg.rate_hz.map(|r| Duration::from_secs_f64(1.0 / r));
    let mut dests: Vec<(usize, LocalBufferInfo)> = Vec::new();
    for i in 0..cfg.frames {
        if control.stop.load(Ordering::Relaxed) {
            break;
        }
        if history > 0 {
            for ch in channels.values_mut() {
                rc.serve(ch).map_err(err)?;
            }
        }
        let frame = cfg.first_frame + i;
        if let Some(slow) = cfg.faults.as_ref().and_then(|f| f.slow).filter(|s| s.module == module) {
            std::thread::sleep(slow.per_frame);
        }
        if trigger.wait(i, &control.stop) {
            rc.report.held_back += 1;
        }
        let Some(dtps) = control.start_frame(frame) else {
            trigger.finished(module, i);
            continue;
        };
        let dtp = &dtps[module as usize];
        if rc.store.pool.is_empty() {
            let slot = (frame % ring_len as u64) as usize;
            content.make(frame, &mut rc.store.ring[slot]);
            rc.store.tags[slot] = Some(frame);
        }
        let bytes = rc.store.bytes(frame).expect("the frame was just made");
        rc.report.manifest.push(ManifestEntry { frame, module, xxh3: xxhash_rust::xxh3::xxh3_64(bytes) });
        let frame_start = period.map(|p| start + p.mul_f64(i as f64));
        if let (Some(t0), Some(p)) = (frame_start, period) {
            if Instant::now() > t0 + p {
                rc.report.late_frames += 1;
            }
        }
        dests.clear();
        dtp.destinations(frame, |r, b| dests.push((r, *b)));
        // the packets of all destinations spread over the frame period
        let per_dest = dtp.module_bytes.div_ceil(dtp.payload_bytes as u64) as usize;
        let total = dests.len() * per_dest;
        let sent_in_frame = std::cell::Cell::new(0usize);
        for &(r, buf) in &dests {
            let route = &dtp.routes[r];
            let ch = channel(&mut channels, cfg, dtp, route).map_err(err)?;
            ch.pk.frame(frame, &buf, route.offset, bytes);
            if history > 0 {
                if ch.records.len() >= history {
                    ch.records.pop_front();
                }
                ch.records.push_back(Record { frame, first_seq: ch.pk.first_seq(), buf, offset: route.offset });
            }
            let pace = |m: usize| {
                if let (Some(t0), Some(p)) = (frame_start, period) {
                    rdaq_net::pace::wait_until(t0 + p.mul_f64(sent_in_frame.get() as f64 / total as f64));
                }
                sent_in_frame.set(sent_in_frame.get() + m);
            };
            send_frame(ch, bytes, rc.faults.as_ref(), rc.delay, &mut rc.report.faults, pace).map_err(err)?;
        }
        control.event(Event::EndOfFrame { module, frame, imm: frame as u32 });
        control.module_frames.fetch_add(1, Ordering::Relaxed);
        trigger.finished(module, i);
    }
    trigger.leave(module);
    rc.report.refused_in_frames = channels.values().map(|c| c.link.tx.stats.refused).sum();
    rc.linger(&mut channels, cfg.linger).map_err(err)?;
    let mut report = rc.report;
    for ch in channels.values() {
        report.sent.add(&ch.link.tx.stats);
        report.gso &= ch.link.tx.gso();
    }
    if report.late_frames > 0 {
        control.event(Event::SourceOverflow { module, late_frames: report.late_frames });
    }
    control.event(Event::EndOfTransfer { module, frames: report.manifest.len() as u64, datagrams: report.sent.datagrams });
    Ok(report)
}
