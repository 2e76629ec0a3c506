//! The receive thread and its handle: binds one UDP socket per data channel, receives in
//! batches through the configured engine (`recvmmsg`, io_uring or AF_XDP) with predicted
//! landing, places, expires incomplete frames, and hands finished frames to the consumer
//! over a channel (at most `slots` frames can be handed at once, so it never blocks the
//! receive thread).

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver as ChanRx, Sender as ChanTx};
use rdaq_net::batch::Subset;
use rdaq_net::engine::{Engine, EngineSpec};
use rdaq_net::socket;
use rdaq_proto::nack::{self, Missing, NACK_ENTRY_LEN, NACK_HEADER_LEN, NACK_MAX_ENTRIES};
use rdaq_net::roce::responder::{QpConfig, Region};
use rdaq_net::xdp::RoceSpec;
use rdaq_proto::telegram::{BufferMap, LocalBufferInfo, RoceQp, TELEGRAM_VERSION};

use crate::arena::Arena;
use crate::coalesce::{Coalesce, Next};
use crate::counters::Counters;
use crate::diagnose;
use crate::frame::{FrameError, FrameReady, FrameStatus, Owner};
use crate::grid::Grid;
use crate::ledger::Ledger;
use crate::placement::Placement;
use crate::source::{Loss, Source, SourceKind};

pub use crate::config::{sls_sources, Format, NackConfig, ReceiverConfig, ReceiverError, JUNGFRAU_ROWS, MAX_BATCH, ROCE_MTUS};
pub use crate::frame::IncompletePolicy;

/// What a receiver made of an acquisition beyond its counters: which frames it finished or
/// refused, and hints at a wrong setting (see [`crate::diagnose`]).
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub ledger: Ledger,
    pub hints: Vec<String>,
}

/// A running data receiver.
pub struct Receiver {
    arena: Arc<Arena>,
    map: BufferMap,
    grid: Grid,
    ports: Vec<u16>,
    frames: ChanRx<FrameReady>,
    release_tx: ChanTx<FrameReady>,
    /// Whose frame tokens this receiver takes.
    owner: Owner,
    flush_tx: ChanTx<(Control, ChanTx<Counters>)>,
    losses: ChanRx<Loss>,
    stop: Arc<AtomicU8>,
    counters: Arc<Mutex<Counters>>,
    outcome: Arc<Mutex<Outcome>>,
    thread: Option<JoinHandle<Result<Counters, ReceiverError>>>,
    recv_buffer_granted: usize,
    engine: String,
    tuning: Vec<rdaq_net::tuning::Finding>,
}

/// The host's transport settings for this receiver, as found at start.
fn tuning(cfg: &ReceiverConfig, datagram_bytes: usize, granted: usize, arena: &Arena) -> Vec<rdaq_net::tuning::Finding> {
    rdaq_net::tuning::check(&rdaq_net::tuning::Setup {
        engine: cfg.engine,
        bind: cfg.bind,
        datagram_bytes,
        recv_buffer_asked: cfg.recv_buffer,
        recv_buffer_granted: granted,
        recv_cpu: cfg.cpu,
        ring_bytes: arena.slots() * arena.slot_bytes(),
        ring_huge_bytes: arena.huge_bytes(),
    })
}

/// Access keys of `n` local buffers: derived from `seed` (reproducible runs and tests), or
/// from the system's randomness.
fn keys(n: usize, seed: Option<u64>) -> Vec<u32> {
    let seed = seed.unwrap_or_else(|| {
        let mut b = [0u8; 8];
        // SAFETY: writes at most 8 bytes into `b`.
        let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
        if got == 8 {
            u64::from_le_bytes(b)
        } else {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
        }
    });
    // key i: a hash of i under the seed (never 0, which no buffer has)
    (0..n as u64).map(|i| (xxhash_rust::xxh3::xxh3_64_with_seed(&i.to_le_bytes(), seed) as u32).max(1)).collect()
}

/// The data channels of a receiver: one socket each, bound in port order, with its source
/// state; the ports the kernel gave, and the smallest receive buffer it granted.
struct Bound {
    sockets: Vec<UdpSocket>,
    sources: Vec<Source>,
    ports: Vec<u16>,
    granted: usize,
}

/// Binds a socket per source (`data_port + i`, or any port when `data_port` is 0).
fn bind(cfg: &ReceiverConfig, grid: &Grid, ids: &[u16], kinds: &[(u16, SourceKind)]) -> Result<Bound, ReceiverError> {
    let mut b = Bound { sockets: Vec::with_capacity(kinds.len()), sources: Vec::with_capacity(kinds.len()), ports: Vec::with_capacity(kinds.len()), granted: usize::MAX };
    for (i, (module, kind)) in kinds.iter().enumerate() {
        let port = if cfg.data_port == 0 { 0 } else { cfg.data_port + i as u16 };
        let addr = SocketAddr::new(cfg.bind, port);
        let (s, g) = socket::bind_receiver(addr, cfg.recv_buffer).map_err(|source| ReceiverError::Bind { addr, source })?;
        b.granted = b.granted.min(g);
        b.ports.push(s.local_addr()?.port());
        b.sockets.push(s);
        b.sources.push(Source::new(*kind, *module, ids[*module as usize], grid, Some(cfg.loss_window)));
    }
    Ok(b)
}

/// What senders need to know of the receiver's buffers: ids, keys, sizes, data ports.
fn buffer_map(cfg: &ReceiverConfig, grid: &Grid, keys: &[u32], ports: &[u16], arena: &Arena) -> BufferMap {
    let qps = roce_qps(cfg, keys);
    let va = |i: usize| if qps.is_empty() { 0 } else { arena.slot_ptr(i) as u64 };
    BufferMap {
        version: TELEGRAM_VERSION,
        modules: cfg.modules,
        module_bytes: cfg.module_bytes,
        payload_bytes: grid.cell_bytes as u32,
        data_ports: ports.to_vec(),
        buffers: keys.iter().enumerate().map(|(i, &key)| LocalBufferInfo { id: cfg.buffer_base + i as u32, key, size: grid.slot_bytes(), va: va(i) }).collect(),
        checksum: cfg.checksum,
        roce: qps,
    }
}

/// The queue pair of each module of a RoCEv2 receiver (none for other formats): numbers
/// 0x100 + m (the module's own 0x200 + m), a first PSN drawn like the keys.
fn roce_qps(cfg: &ReceiverConfig, keys: &[u32]) -> Vec<RoceQp> {
    let Format::Roce { mtu, first_frame, frame_stride } = cfg.format else { return Vec::new() };
    let seed = keys.first().copied().unwrap_or(0) as u64;
    (0..cfg.modules as u32)
        .map(|m| {
            let start_psn = xxhash_rust::xxh3::xxh3_64_with_seed(&m.to_le_bytes(), seed) as u32 & 0xFF_FFFF;
            RoceQp { qpn: 0x100 + m, peer_qpn: 0x200 + m, start_psn, mtu, first_frame, frame_stride }
        })
        .collect()
}

/// What the AF_XDP engine needs to be the RoCEv2 target of `map` (none for other formats).
fn roce_spec(map: &BufferMap, ids: &[u16]) -> Option<RoceSpec> {
    let mtu = map.roce.first()?.mtu;
    let qps = map.roce.iter().map(|q| QpConfig { qpn: q.qpn, peer_qpn: q.peer_qpn, start_psn: q.start_psn, first_frame: q.first_frame, frame_stride: q.frame_stride }).collect();
    let regions = map.buffers.iter().map(|b| Region { va: b.va, len: b.size, rkey: b.key, buffer: b.id }).collect();
    Some(RoceSpec { qps, modules: ids.to_vec(), regions, mtu })
}

impl Receiver {
    /// Allocates the ring, binds the data ports and starts the receive thread.
    pub fn start(cfg: ReceiverConfig) -> Result<Receiver, ReceiverError> {
        let (grid, source_kinds) = cfg.check()?;
        let slot_bytes = grid.slot_bytes() as usize;
        let arena = Arc::new(
            Arena::new(cfg.slots, slot_bytes)
                .map_err(|source| ReceiverError::Memory { bytes: (cfg.slots * slot_bytes) as u64, source })?,
        );
        let ids: Vec<u16> = if cfg.module_ids.is_empty() { (0..cfg.modules).collect() } else { cfg.module_ids.clone() };
        let Bound { sockets, sources, ports, granted } = bind(&cfg, &grid, &ids, &source_kinds)?;
        let keys = keys(cfg.slots, cfg.key_seed);
        let map = buffer_map(&cfg, &grid, &keys, &ports, &arena);
        let placement = Placement::new(arena.clone(), grid, &ids, cfg.buffer_base, keys, cfg.policy, cfg.batch)
            .with_checksum(cfg.checksum)
            .with_allowed_sources(cfg.sources.clone());
        let placement_owner = placement.owner();
        let hdr_len = match cfg.format {
            Format::Rdaq | Format::Roce { .. } => placement.header_len(),
            Format::Sls { .. } | Format::SlsByHeader(_) => rdaq_proto::SLS_HEADER_LEN,
        };
        let spec = EngineSpec { sockets: &sockets, bind: cfg.bind, batch: cfg.batch, hdr_len, landing_len: grid.cell_bytes as usize, buffer_bytes: cfg.recv_buffer, roce: roce_spec(&map, &ids) };
        let engine = Engine::open(cfg.engine, &spec)?;
        let engine_line = engine.describe();
        let tuning = tuning(&cfg, hdr_len + grid.cell_bytes as usize, granted, &arena);
        // Unbounded: at most `slots` frames can be handed at once; what else queues are
        // small notices of discarded frames, and losing a handed frame would leak its slot.
        let (frames_tx, frames) = crossbeam_channel::unbounded();
        let (release_tx, release_rx) = crossbeam_channel::unbounded();
        let (flush_tx, flush_rx) = crossbeam_channel::unbounded();
        let (losses_tx, losses) = crossbeam_channel::bounded(LOSS_REPORTS);
        let stop = Arc::new(AtomicU8::new(RUNNING));
        let counters = Arc::new(Mutex::new(Counters::default()));
        let outcome = Arc::new(Mutex::new(Outcome::default()));
        let ctx = Loop {
            cfg: cfg.clone(),
            engine,
            placement,
            progress: Vec::with_capacity(sources.len()),
            sockets,
            sources,
            frames_tx,
            release_rx,
            flush_rx,
            losses_tx,
            stop: stop.clone(),
            shared: counters.clone(),
            outcome: outcome.clone(),
            ports: ports.clone(),
            tokens: 0.0,
            last_refill: Instant::now(),
        };
        let thread = std::thread::Builder::new().name("rdaq-recv".into()).spawn(move || ctx.run())?;
        Ok(Receiver {
            arena,
            map,
            grid,
            ports,
            frames,
            release_tx,
            owner: placement_owner,
            flush_tx,
            losses,
            stop,
            counters,
            outcome,
            thread: Some(thread),
            recv_buffer_granted: granted,
            engine: engine_line,
            tuning,
        })
    }

    /// A receiver whose frames come from elsewhere in this process (see `crate::memory`):
    /// no data ports, no receive thread.
    pub(crate) fn without_thread(arena: Arc<Arena>, grid: Grid, owner: Owner, frames: ChanRx<FrameReady>, release_tx: ChanTx<FrameReady>) -> Receiver {
        let map = BufferMap {
            version: TELEGRAM_VERSION,
            modules: grid.modules,
            module_bytes: grid.module_bytes,
            payload_bytes: grid.cell_bytes as u32,
            data_ports: Vec::new(),
            buffers: Vec::new(),
            checksum: false,
            roce: Vec::new(),
        };
        Receiver {
            arena,
            map,
            grid,
            ports: Vec::new(),
            frames,
            release_tx,
            owner,
            flush_tx: crossbeam_channel::unbounded().0,
            losses: crossbeam_channel::bounded(1).1,
            stop: Arc::new(AtomicU8::new(RUNNING)),
            counters: Arc::default(),
            outcome: Arc::default(),
            thread: None,
            recv_buffer_granted: 0,
            engine: "in memory (no network)".into(),
            tuning: Vec::new(),
        }
    }

    /// The counters the receive thread (or an in-memory placer) publishes into.
    pub(crate) fn shared_counters(&self) -> Arc<Mutex<Counters>> {
        self.counters.clone()
    }

    /// The buffer map to give the senders (ids, keys, sizes, layout).
    pub fn buffer_map(&self) -> &BufferMap {
        &self.map
    }

    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    /// The bound data ports, one per data channel (module, or module interface for sls).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The receive engine that runs, as the summary names it (for AF_XDP: interface and mode).
    pub fn engine(&self) -> &str {
        &self.engine
    }

    /// Whether the transport sends again what is dropped below placement (RoCEv2: the RC
    /// sender goes back to the first packet the responder missed).
    pub fn recovers_drops_below(&self) -> bool {
        !self.map.roce.is_empty()
    }

    /// The host's transport settings as found at start, with warnings for known-bad ones.
    pub fn tuning(&self) -> &[rdaq_net::tuning::Finding] {
        &self.tuning
    }

    /// Receive buffer the kernel granted per data port.
    pub fn recv_buffer_granted(&self) -> usize {
        self.recv_buffer_granted
    }

    /// Finished frames, in the order they finished.
    pub fn frames(&self) -> &ChanRx<FrameReady> {
        &self.frames
    }

    /// Runs of sequence numbers the channels' loss windows declared missing, as found (at
    /// most [`LOSS_REPORTS`] wait; beyond that they are counted in
    /// [`Counters::loss_reports_dropped`]).
    pub fn losses(&self) -> &ChanRx<Loss> {
        &self.losses
    }

    /// The bytes of a handed frame (complete, or incomplete with missing cells marked).
    /// A discarded frame, or one of another receiver, has none here.
    pub fn data<'a>(&'a self, f: &'a FrameReady) -> Result<&'a [u8], FrameError> {
        f.check_owner(self.owner)?;
        if f.status() == FrameStatus::Discarded {
            return Err(FrameError::Discarded { frame: f.frame() });
        }
        // SAFETY: `f` is this receiver's token of a handed slot (checked above; tokens
        // cannot be forged or copied): the receive thread does not write a handed slot, and
        // the slice borrows `f`, which `release` consumes, so it cannot outlive the
        // ownership. `slot` checks the index.
        Ok(unsafe { self.arena.slot(f.slot() as usize) })
    }

    /// Marks in `mask` (one byte per pixel of the frame's modules, in slot order) the pixels
    /// whose datagram never arrived with 1, the others with 0. `mask` must hold at least
    /// [`Grid::frame_pixels`] bytes.
    pub fn missing_mask(&self, f: &FrameReady, mask: &mut [u8]) -> Result<(), FrameError> {
        f.check_owner(self.owner)?;
        let pixels = self.grid.frame_pixels();
        assert!(mask.len() >= pixels, "a mask of {} bytes for {pixels} pixels", mask.len());
        mask[..pixels].fill(0);
        for &c in f.missing() {
            let (off, len) = (self.grid.cell_offset(c) as usize / 2, self.grid.cell_len(c) as usize / 2);
            mask[off..off + len].fill(1);
        }
        Ok(())
    }

    /// Gives the frame's slot back to the receiver (nothing to give for a discarded frame).
    /// A frame of another receiver is refused and changes nothing.
    pub fn release(&self, f: FrameReady) -> Result<(), FrameError> {
        f.check_owner(self.owner)?;
        if f.status() != FrameStatus::Discarded {
            // the receive thread may have exited; then the slot is not needed any more
            let _ = self.release_tx.send(f);
        }
        Ok(())
    }

    /// Counters as last published by the receive thread (at most ~10 ms old).
    pub fn counters(&self) -> Counters {
        *self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Which frames were finished or refused, and hints at a wrong setting: as of the end
    /// of the receive thread, or of the last [`Receiver::flush`].
    pub fn outcome(&self) -> Outcome {
        self.outcome.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Places what has already arrived, then finishes every frame in progress, under the
    /// policy (the end of an acquisition whose receiver stays up for the next); returns the
    /// counters after it. Frames finished by the flush are in [`Receiver::frames`] before
    /// this returns. `None` if the receive thread has ended.
    pub fn flush(&self) -> Option<Counters> {
        self.control(Control::Flush)
    }

    /// Like [`Receiver::flush`], and forgets which frames the slots held: a new acquisition
    /// may number its frames from 0 again without its frames counting as stale.
    pub fn reset(&self) -> Option<Counters> {
        self.control(Control::Reset)
    }

    fn control(&self, c: Control) -> Option<Counters> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.flush_tx.send((c, tx)).ok()?;
        rx.recv().ok()
    }

    /// Asks the receive thread to finish: it keeps receiving until the ports are quiet for
    /// the linger time, then finishes the frames in progress under the policy.
    pub fn stop(&self) {
        self.stop.fetch_max(WHEN_QUIET, Ordering::Relaxed);
    }

    /// Asks the receive thread to finish at once (a deadline, a drop): what is in progress is
    /// finished under the policy without waiting for the ports to go quiet.
    pub fn stop_now(&self) {
        self.stop.store(NOW, Ordering::Relaxed);
    }

    /// Where the ring's slots lie in this process's memory: `[start, end)` as addresses
    /// (for checks that a frame was handed without a copy).
    pub fn ring_span(&self) -> (usize, usize) {
        let start = self.arena.slot_ptr(0) as usize;
        (start, start + self.arena.slots() * self.arena.slot_bytes())
    }

    /// True when both guard regions around the ring are untouched.
    pub fn guards_intact(&self) -> bool {
        self.arena.guards_intact()
    }

    /// Waits for the receive thread and returns the final counters.
    pub fn join(&mut self) -> Result<Counters, ReceiverError> {
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| ReceiverError::Io(io::Error::other("receive thread panicked")))?,
            None => Ok(self.counters()),
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop_now();
        let _ = self.join();
    }
}

struct Loop {
    cfg: ReceiverConfig,
    engine: Engine,
    placement: Placement,
    /// One socket per data channel, and the channel's source state beside it.
    sockets: Vec<UdpSocket>,
    sources: Vec<Source>,
    /// Newest frame and last datagram of each source, reused by every request round.
    progress: Vec<(Option<u64>, Option<Instant>)>,
    frames_tx: ChanTx<FrameReady>,
    release_rx: ChanRx<FrameReady>,
    flush_rx: ChanRx<(Control, ChanTx<Counters>)>,
    losses_tx: ChanTx<Loss>,
    stop: Arc<AtomicU8>,
    shared: Arc<Mutex<Counters>>,
    outcome: Arc<Mutex<Outcome>>,
    ports: Vec<u16>,
    /// Retransmission requests that may be sent now (token bucket).
    tokens: f64,
    last_refill: Instant,
}

/// What the receive thread is asked: go on, stop once the ports are quiet for the linger
/// time, stop now.
const RUNNING: u8 = 0;
const WHEN_QUIET: u8 = 1;
const NOW: u8 = 2;

/// Loss reports waiting for the consumer.
pub const LOSS_REPORTS: usize = 4096;

/// Requests to the receive thread between batches.
enum Control {
    Flush,
    Reset,
}

/// Batches read from one socket before looking at the others.
const BATCHES_PER_TURN: usize = 16;
const PUBLISH_EVERY: Duration = Duration::from_millis(10);
const EXPIRE_EVERY: Duration = Duration::from_millis(2);
/// Longest a flush goes on placing what keeps arriving before it finishes the frames.
const DRAIN_AT_MOST: Duration = Duration::from_millis(200);
/// Shortest sleep between two reads of a running stream.
const COALESCE_MIN: Duration = Duration::from_millis(1);
/// Longest wait for data while nothing is in progress (the stop flag is read between).
const IDLE_WAIT: Duration = Duration::from_millis(20);

impl Loop {
    fn run(mut self) -> Result<Counters, ReceiverError> {
        if let Some(cpu) = self.cfg.cpu {
            socket::pin_current_thread(cpu)?;
        }
        let mut landings = Landings::new(self.sources.len(), self.engine.batch());
        let mut pace = Coalesce::new(COALESCE_MIN, self.cfg.coalesce, 2 * self.engine.batch());
        let mut pollfds = self.engine.pollfds();
        let mut last_data = Instant::now();
        let mut last_expire = Instant::now();
        let mut last_publish = Instant::now();
        loop {
            self.serve_consumer(&mut landings)?;
            let (got, more) = self.receive_round(&mut landings)?;
            let now = Instant::now();
            if got > 0 {
                last_data = now;
            }
            if now.duration_since(last_expire) >= EXPIRE_EVERY {
                // RoCEv2 recovers losses itself (the responder's NAKs)
                if let Some(nc) = self.cfg.nack.filter(|_| !matches!(self.cfg.format, Format::Roce { .. })) {
                    self.request_retransmissions(now, nc);
                }
                self.placement.expire(now, self.cfg.frame_timeout, &self.sources);
                last_expire = now;
            }
            self.hand_on();
            if now.duration_since(last_publish) >= PUBLISH_EVERY {
                self.publish();
                last_publish = now;
            }
            let c = &self.placement.counters;
            let limit_reached = self.cfg.frames.is_some_and(|n| c.frames_finished() + c.frames_refused >= n);
            let stopping = match self.stop.load(Ordering::Relaxed) {
                RUNNING => false,
                WHEN_QUIET => now.duration_since(last_data) >= self.cfg.linger,
                _ => true,
            };
            if limit_reached || stopping {
                break;
            }
            match pace.next(got, more, self.placement.filling() > 0) {
                Next::Now => {}
                Next::Sleep(d) => {
                    std::thread::sleep(d);
                    self.placement.counters.recv_waits += 1;
                }
                Next::Idle => {
                    socket::wait_readable(&mut pollfds, self.idle_wait_ms())?;
                    self.placement.counters.recv_waits += 1;
                }
            }
        }
        self.placement.finish_all();
        self.hand_on();
        self.placement.counters.kernel_drops = self.sockets.iter().filter_map(socket::kernel_drops).sum::<u64>() + self.engine.drops_below();
        self.placement.counters.cpu_time = socket::thread_cpu_time();
        self.placement.counters.sleeps = socket::thread_waits();
        self.publish();
        self.publish_outcome();
        Ok(self.counters())
    }

    /// Placement's counters with what the engine dropped before placement (RoCEv2).
    fn counters(&self) -> Counters {
        match self.engine.roce_stats() {
            Some(r) => self.placement.counters.with_roce(&r),
            None => self.placement.counters,
        }
    }

    /// Takes the slots the consumer gave back, and its flush and reset requests.
    fn serve_consumer(&mut self, landings: &mut Landings) -> Result<(), ReceiverError> {
        while let Ok(f) = self.release_rx.try_recv() {
            // `Receiver::release` sends only this placement's tokens
            self.placement.release(f).expect("a token of this receiver");
        }
        while let Ok((c, ack)) = self.flush_rx.try_recv() {
            match c {
                Control::Flush => {
                    // what already arrived belongs to the acquisition being finished (a
                    // sender still streaming cannot keep the flush going for long)
                    let until = Instant::now() + DRAIN_AT_MOST;
                    while self.receive_round(landings)?.0 > 0 && Instant::now() < until {}
                    self.placement.finish_all();
                    self.publish_outcome();
                }
                Control::Reset => {
                    self.placement.reset_history();
                    for src in self.sources.iter_mut() {
                        src.reset();
                    }
                }
            }
            self.hand_on();
            self.publish();
            let _ = ack.send(self.counters());
        }
        Ok(())
    }

    fn publish_outcome(&mut self) {
        let c = &self.placement.counters;
        let seen = diagnose::Seen {
            format: self.cfg.format,
            grid: self.placement.grid(),
            sources: &self.sources,
            ports: &self.ports,
            always_missing: self.placement.always_missing.as_deref(),
            frames_complete: c.frames_complete,
            frames_incomplete: c.frames_incomplete + c.frames_discarded,
        };
        let outcome = Outcome { ledger: self.placement.ledger.clone(), hints: diagnose::hints(&seen) };
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = outcome;
    }

    /// Reads every queue of the engine, up to [`BATCHES_PER_TURN`] batches each, and places
    /// what came; returns the datagrams read and whether a queue had more waiting.
    fn receive_round(&mut self, landings: &mut Landings) -> Result<(usize, bool), ReceiverError> {
        let (mut got, mut more) = (0, false);
        for q in 0..self.engine.queues() {
            let mut full = 0;
            while full < BATCHES_PER_TURN {
                let n = self.receive_batch(q, landings)?;
                got += n;
                if n < self.engine.batch() {
                    break;
                }
                full += 1;
            }
            more |= full == BATCHES_PER_TURN;
        }
        Ok((got, more))
    }

    /// Predicts the landings of the channels queue `q` serves, receives one batch and
    /// places it, channel by channel.
    fn receive_batch(&mut self, q: usize, landings: &mut Landings) -> Result<usize, ReceiverError> {
        let one = self.engine.serves(q);
        let channels = one.map_or(0..self.sources.len(), |ch| ch..ch + 1);
        let landing = self.placement.grid().cell_bytes as usize;
        for ch in channels.clone() {
            landings.next[ch] = 0;
            if self.cfg.predict {
                self.placement.predict(&self.sources[ch], landing, &mut landings.cells[ch]);
            } else {
                landings.cells[ch].fill(None);
            }
        }
        let Landings { cells, next, .. } = landings;
        // SAFETY: predicted landings are full cells of Free or Filling slots with their bits
        // clear, owned by this thread and read by no one until place_batch has looked at the
        // headers; distinct within the batch and across channels (different modules' cells).
        let n = unsafe {
            self.engine.recv(q, |ch| {
                let k = next[ch];
                next[ch] += 1;
                cells[ch].get(k).copied().flatten()
            })
        }?;
        if n == 0 {
            return Ok(0);
        }
        let now = Instant::now();
        if let Some(ch) = one {
            self.placement.place_batch(&self.engine, &mut self.sources[ch], now);
            return Ok(n);
        }
        for ch in channels {
            landings.picked.clear();
            landings.picked.extend((0..n).filter(|&i| self.engine.channel(i) == ch).map(|i| i as u16));
            if !landings.picked.is_empty() {
                let part = Subset { batch: &self.engine, indices: &landings.picked };
                self.placement.place_batch(&part, &mut self.sources[ch], now);
            }
        }
        Ok(n)
    }

    /// How long to wait for data when none came: briefly while frames are in progress
    /// (their timeouts and retransmission requests are due in milliseconds), longer when
    /// the receiver is idle.
    fn idle_wait_ms(&self) -> i32 {
        if self.placement.filling() > 0 || self.sources.iter().any(|s| !s.nacks.is_empty()) {
            EXPIRE_EVERY.as_millis() as i32
        } else {
            IDLE_WAIT.as_millis() as i32
        }
    }

    fn hand_on(&mut self) {
        for f in self.placement.take_ready() {
            // a consumer that went away needs no more frames; the counters still count them
            let _ = self.frames_tx.send(f);
        }
        for l in self.placement.losses.drain(..) {
            if self.losses_tx.try_send(l).is_err() {
                self.placement.counters.loss_reports_dropped += 1;
            }
        }
    }

    /// Finds what quiet channels and stalled frames lack, and asks the senders for it.
    fn request_retransmissions(&mut self, now: Instant, nc: NackConfig) {
        let Loop { placement, sources, progress, .. } = self;
        for src in sources.iter_mut() {
            if !src.flushed && src.last_data.is_some_and(|t| now.duration_since(t) >= nc.quiet) {
                src.flush_window(&mut placement.counters, &mut placement.losses);
                src.flushed = true;
            }
        }
        if self.cfg.format == Format::Rdaq {
            let mut full = 0;
            // rdaq sources are one per local module, in module order. A module is asked only
            // for what it has sent: a frame behind its newest one, or its newest frame once it
            // went quiet (a lost tail); never for a frame it has not started (it may be late).
            progress.clear();
            progress.extend(sources.iter().map(|s| (s.newest_frame, s.last_data)));
            let is_past = |m: u16, frame: u64| {
                let (newest, last) = progress[m as usize];
                newest.is_some_and(|n| n > frame || (n == frame && last.is_some_and(|t| now.duration_since(t) >= nc.quiet)))
            };
            placement.stalled(now, nc.quiet, nc.interval, nc.retries, is_past, |m, frame, start, end| {
                if !sources[m as usize].request(Missing::Frame { frame, start, end }) {
                    full += 1;
                }
            });
            placement.counters.nack_ranges_dropped += full;
        }
        let elapsed = now.duration_since(self.last_refill).as_secs_f64();
        self.last_refill = now;
        self.tokens = (self.tokens + elapsed * nc.rate as f64).min((nc.rate as f64 / 10.0).max(1.0));
        let mut buf = [0u8; NACK_HEADER_LEN + NACK_MAX_ENTRIES * NACK_ENTRY_LEN];
        let counters = &mut self.placement.counters;
        for (sock, src) in self.sockets.iter().zip(self.sources.iter_mut()) {
            let Some(peer) = src.peer else {
                // nobody to ask: nothing of this channel ever arrived
                counters.nack_ranges_dropped += src.nacks.len() as u64;
                src.nacks.clear();
                continue;
            };
            for chunk in src.nacks.chunks(NACK_MAX_ENTRIES) {
                if self.tokens < 1.0 {
                    counters.nack_ranges_dropped += chunk.len() as u64;
                    continue;
                }
                let n = nack::encode(src.module_id, chunk, &mut buf);
                match sock.send_to(&buf[..n], peer) {
                    Ok(_) => {
                        self.tokens -= 1.0;
                        counters.nacks_sent += 1;
                        counters.nack_ranges += chunk.len() as u64;
                    }
                    Err(_) => counters.nack_ranges_dropped += chunk.len() as u64,
                }
            }
            src.nacks.clear();
        }
    }

    fn publish(&mut self) {
        self.placement.counters.recv_syscalls = self.engine.stats().syscalls;
        (self.placement.counters.slots_filling, self.placement.counters.slots_handed, self.placement.counters.slots) = self.placement.ring_fill();
        *self.shared.lock().unwrap_or_else(|e| e.into_inner()) = self.counters();
    }
}

/// Where the next datagrams of each channel should land: the prediction per channel, and
/// how many of each the engine has asked for during the current call.
struct Landings {
    cells: Vec<Vec<Option<*mut u8>>>,
    next: Vec<usize>,
    /// The datagrams of one channel in the current batch (AF_XDP serves all from one queue).
    picked: Vec<u16>,
}

impl Landings {
    fn new(channels: usize, batch: usize) -> Landings {
        Landings { cells: vec![vec![None; batch]; channels], next: vec![0; channels], picked: Vec::with_capacity(batch) }
    }
}
