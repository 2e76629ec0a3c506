//! The receiver's core, independent of sockets: where a datagram goes (target), whether it
//! may go there (slot state, bitmap), placing it, and finishing frames.
//!
//! Slot state machine (one slot = one local buffer = one frame at a time):
//! `Free -> Filling(frame) -> Handed(frame) -> Free`. The receive thread owns Free and
//! Filling slots; the consumer owns Handed slots until it releases them. Payloads are only
//! ever written into Free or Filling slots, and only into cells whose bitmap bit is clear.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdaq_net::recv::MmsgReceiver;
use rdaq_proto::datagram::{checksum, DecodeError, Flags, Header, CHECKSUM_LEN, HEADER_LEN};
use rdaq_proto::nack::Missing;
use rdaq_proto::sls::{SlsHeader, SLS_HEADER_LEN};

use crate::arena::Arena;
use crate::counters::{Counters, DropReason};
use crate::grid::Grid;
use crate::ledger::Ledger;
use crate::window::{LossWindow, Seen};

/// Retransmission requests a source may queue before they are sent; beyond it ranges are
/// counted as dropped (a channel losing that much needs the frame timeout, not more NACKs).
pub const NACK_QUEUE: usize = 4 * rdaq_proto::nack::NACK_MAX_ENTRIES;
/// Loss reports kept between two reads by the engine.
const LOSS_LOG: usize = 4096;
/// How many frame timeouts a frame waits while every source is quiet (see
/// [`Placement::expire`]).
pub const QUIET_FACTOR: u32 = 10;

/// A run of sequence numbers a data channel's loss window declared missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loss {
    /// Global id of the module whose channel it is.
    pub module: u16,
    pub start: u32,
    /// Exclusive (wrapping).
    pub end: u32,
}

/// What happens to a frame that is still incomplete when its timeout expires, when a newer
/// frame needs its slot, or at the end of the acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncompletePolicy {
    /// Drop it; its slot is free again at once.
    Discard,
    /// Hand it on with every missing cell filled with [`MISSING_BYTE`] and its missing cells listed.
    Keep,
}

/// Byte written over missing cells under [`IncompletePolicy::Keep`]: 0xFFFF words are the
/// JUNGFRAU error word, so missing pixels can never be mistaken for data.
pub const MISSING_BYTE: u8 = 0xff;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameStatus {
    Complete,
    /// Handed on with missing cells marked.
    Incomplete,
    /// Dropped; the slot was not handed on and must not be read or released.
    Discarded,
}

/// A finished frame. For `Complete` and `Incomplete` the consumer owns the slot until it
/// releases it.
/// Not `Clone`: it stands for ownership of a handed slot, given back by `Receiver::release`.
#[derive(Debug, PartialEq, Eq)]
pub struct FrameReady {
    pub slot: u32,
    pub frame: u64,
    pub status: FrameStatus,
    pub received_cells: u32,
    pub total_cells: u32,
    /// Missing cells (empty when complete); cell `c` covers `Grid::cell_offset(c)`.
    pub missing: Vec<u32>,
    /// Immediate value of the frame's last datagram, if it carried one.
    pub imm: Option<u32>,
}

/// How datagrams on one socket are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// rdaq datagrams: the header names buffer, key, offset.
    Rdaq,
    /// Native JUNGFRAU packets of one module interface: packet `p` (expected in
    /// `first_packet..first_packet + packets`) of frame `f` goes to the slot of `f`, cell
    /// `module * cells_per_module + first_cell + p - first_packet`. A partial readout
    /// (`readnrows`) sends only the packets of the rows read, numbered as in a full frame.
    Sls { module: u16, first_cell: u32, first_packet: u32, packets: u32 },
}

impl SourceKind {
    /// The cells of a slot this source fills, given the local module it sends for.
    pub fn cells(self, module: u16, grid: &Grid) -> std::ops::Range<u32> {
        let base = module as u32 * grid.cells_per_module;
        match self {
            SourceKind::Rdaq => base..base + grid.cells_per_module,
            SourceKind::Sls { first_cell, packets, .. } => base + first_cell..base + first_cell + packets,
        }
    }
}

/// Packets an sls source received with a packet number it does not expect (another
/// interface's, or rows outside the readout): what the diagnosis of a wrong setting needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unexpected {
    pub packets: u64,
    pub lowest: u32,
    pub highest: u32,
}

impl Unexpected {
    fn record(&mut self, packet: u32) {
        if self.packets == 0 {
            (self.lowest, self.highest) = (packet, packet);
        }
        self.packets += 1;
        self.lowest = self.lowest.min(packet);
        self.highest = self.highest.max(packet);
    }
}

/// A socket's reading rules, its prediction of where the next datagram goes, and (for
/// rdaq channels) its loss window and the retransmission requests waiting to be sent.
#[derive(Clone, Debug)]
pub struct Source {
    pub kind: SourceKind,
    /// Position in the slot of the module sending on it, and its global id.
    pub module: u16,
    pub module_id: u16,
    next: Option<(u32, u32)>,
    window: Option<LossWindow>,
    /// Where its accepted datagrams last came from: where requests go.
    pub peer: Option<SocketAddr>,
    /// When it last delivered an accepted datagram.
    pub last_data: Option<Instant>,
    /// Its loss window was flushed since the last datagram.
    pub flushed: bool,
    /// The newest frame it delivered a datagram of.
    pub newest_frame: Option<u64>,
    /// Requests waiting to be sent (at most [`NACK_QUEUE`]).
    pub nacks: Vec<Missing>,
    /// Datagrams accepted from it.
    pub accepted: u64,
    /// sls packets it got with a packet number it does not expect.
    pub unexpected: Unexpected,
}

impl Source {
    /// A source whose first datagram is guessed to be local module `module`'s first cell of
    /// slot 0 (where a ring starting at frame 0 puts it); `window` is `(size, lag)` of its
    /// loss window (rdaq sources only).
    pub fn new(kind: SourceKind, module: u16, module_id: u16, grid: &Grid, window: Option<(u32, u32)>) -> Self {
        let first = match kind {
            SourceKind::Rdaq => 0,
            SourceKind::Sls { first_cell, .. } => first_cell,
        };
        let window = window.filter(|_| kind == SourceKind::Rdaq).map(|(size, lag)| LossWindow::new(size, lag));
        Source {
            kind,
            module,
            module_id,
            next: Some((0, module as u32 * grid.cells_per_module + first)),
            window,
            peer: None,
            last_data: None,
            flushed: false,
            newest_frame: None,
            nacks: Vec::with_capacity(NACK_QUEUE),
            accepted: 0,
            unexpected: Unexpected::default(),
        }
    }

    /// Whether this source still has frame `frame` to come: it is sending that frame or older
    /// ones (newest not past `frame`) and was heard from within `silence`. A module that is
    /// only late (a busy machine running its thread slowly, in the middle of the frame or
    /// before it) must not have its frame expired; one that went silent, or went on to later
    /// frames, may.
    pub fn on_its_way_to(&self, frame: u64, now: Instant, silence: Duration) -> bool {
        self.newest_frame.is_some_and(|n| n <= frame) && self.last_data.is_some_and(|t| now.duration_since(t) < silence)
    }

    /// Queues a request; false (and nothing queued) when the queue is full.
    pub fn request(&mut self, m: Missing) -> bool {
        if self.nacks.len() >= NACK_QUEUE {
            return false;
        }
        self.nacks.push(m);
        true
    }

    /// The channel went quiet: everything below the window's head that has not arrived is
    /// lost; queue requests for it.
    pub fn flush_window(&mut self, counters: &mut Counters, losses: &mut Vec<Loss>) {
        let Some(w) = self.window.as_mut() else { return };
        let (nacks, module) = (&mut self.nacks, self.module_id);
        w.flush(|a, b| declare_lost(counters, losses, nacks, module, a, b));
    }

    /// Forgets the channel's history (a new acquisition).
    pub fn reset(&mut self) {
        if let Some(w) = self.window.as_mut() {
            w.reset();
        }
        self.nacks.clear();
        self.last_data = None;
        self.flushed = false;
        self.newest_frame = None;
        self.accepted = 0;
        self.unexpected = Unexpected::default();
    }
}

/// The packet number of an sls header that was decoded before (so is long enough).
fn sls_packet_number(hdr: &[u8]) -> u32 {
    hdr.get(12..16).and_then(|b| b.try_into().ok()).map_or(u32::MAX, u32::from_le_bytes)
}

/// Records a run of lost sequence numbers: counted, reported, and queued as a request. A
/// burst is declared one number per arrival as the head moves on, so a run that continues
/// the previous one extends it.
fn declare_lost(counters: &mut Counters, losses: &mut Vec<Loss>, nacks: &mut Vec<Missing>, module: u16, a: u32, b: u32) {
    counters.seq_missing += b.wrapping_sub(a) as u64;
    if let Some(l) = losses.last_mut().filter(|l| l.module == module && l.end == a) {
        l.end = b;
    } else if losses.len() < LOSS_LOG {
        losses.push(Loss { module, start: a, end: b });
    } else {
        counters.loss_reports_dropped += 1;
    }
    if let Some(Missing::Seq { end, .. }) = nacks.last_mut().filter(|m| matches!(m, Missing::Seq { end, .. } if *end == a)) {
        *end = b;
    } else if nacks.len() < NACK_QUEUE {
        nacks.push(Missing::Seq { start: a, end: b });
    } else {
        counters.nack_ranges_dropped += 1;
    }
}

/// Where a datagram goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub slot: u32,
    pub cell: u32,
    pub frame: u64,
    pub imm: Option<u32>,
    /// The channel's sequence number (rdaq only).
    pub seq: u32,
    pub retransmit: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Free,
    Filling,
    Handed,
}

struct Slot {
    state: State,
    frame: u64,
    last_frame: Option<u64>,
    first_seen: Instant,
    received: u32,
    bitmap: Box<[u64]>,
    imm: Option<u32>,
    /// When a datagram was last placed into it.
    last_activity: Instant,
    last_nack: Option<Instant>,
    nacks: u32,
    retransmitted: u32,
    /// A frame refused because the slot was still held when its first datagram came: its
    /// other datagrams are refused too, even after the slot is free again, so that a frame
    /// is either received whole or not at all.
    refused: Option<u64>,
}

/// Where a payload of the current batch is before it is placed.
#[derive(Clone, Copy)]
enum Src {
    /// Already at its destination.
    InPlace,
    /// Somewhere else: scratch, or evacuated from a wrong prediction.
    At(*const u8),
}

pub struct Placement {
    arena: Arc<Arena>,
    grid: Grid,
    /// Global module id -> position in the slot (`u16::MAX`: not served here).
    module_index: Vec<u16>,
    buffer_base: u32,
    keys: Vec<u32>,
    slots: Vec<Slot>,
    policy: IncompletePolicy,
    /// Datagrams carry the checksum extension (and must).
    checksum: bool,
    hdr_len: usize,
    /// Source addresses accepted (empty: any).
    allowed: Vec<IpAddr>,
    pub counters: Counters,
    /// Frame numbers finished and refused.
    pub ledger: Ledger,
    /// Cells missing from every incomplete frame so far (for the diagnosis of a wrong
    /// setting: a pattern that repeats in every frame is not loss).
    pub always_missing: Option<Box<[u64]>>,
    ready: Vec<FrameReady>,
    /// Slots in the Filling state.
    filling: usize,
    /// Since when the sources have been sending without a pause of a frame timeout (`None`
    /// while they are quiet).
    active_since: Option<Instant>,
    /// Loss reports since the engine last took them.
    pub losses: Vec<Loss>,
    evac: Vec<u8>,
    pending: Vec<(Result<Target, DropReason>, Src, usize)>,
}

// SAFETY: the raw pointers in `pending` are only used within one `place_batch` call.
unsafe impl Send for Placement {}

impl Placement {
    /// `keys[i]` is the access key of local buffer `buffer_base + i` (slot `i`);
    /// `module_ids[i]` is the global id of the module at position `i` of a slot.
    pub fn new(
        arena: Arc<Arena>,
        grid: Grid,
        module_ids: &[u16],
        buffer_base: u32,
        keys: Vec<u32>,
        policy: IncompletePolicy,
        batch: usize,
    ) -> Self {
        assert_eq!(arena.slots(), keys.len(), "one key per slot");
        assert_eq!(module_ids.len(), grid.modules as usize, "one id per module of the grid");
        let mut module_index = vec![u16::MAX; module_ids.iter().max().map_or(0, |&m| m as usize + 1)];
        for (i, &m) in module_ids.iter().enumerate() {
            module_index[m as usize] = i as u16;
        }
        assert_eq!(arena.slot_bytes() as u64, grid.slot_bytes(), "slot size matches the grid");
        let words = grid.cells().div_ceil(64) as usize;
        let now = Instant::now();
        let slots = (0..arena.slots())
            .map(|_| Slot {
                state: State::Free,
                frame: 0,
                last_frame: None,
                first_seen: now,
                received: 0,
                bitmap: vec![0u64; words].into_boxed_slice(),
                imm: None,
                last_activity: now,
                last_nack: None,
                nacks: 0,
                retransmitted: 0,
                refused: None,
            })
            .collect();
        Placement {
            module_index,
            evac: vec![0; batch * grid.cell_bytes as usize],
            pending: Vec::with_capacity(batch),
            arena,
            grid,
            buffer_base,
            keys,
            slots,
            policy,
            checksum: false,
            hdr_len: HEADER_LEN,
            allowed: Vec::new(),
            counters: Counters::default(),
            ledger: Ledger::default(),
            always_missing: None,
            ready: Vec::new(),
            filling: 0,
            active_since: None,
            losses: Vec::with_capacity(LOSS_LOG),
        }
    }

    /// Requires every rdaq datagram to carry the checksum extension, and verifies it.
    pub fn with_checksum(mut self, on: bool) -> Self {
        self.checksum = on;
        self.hdr_len = HEADER_LEN + if on { CHECKSUM_LEN } else { 0 };
        self
    }

    /// Accepts datagrams only from these addresses (empty: from any).
    pub fn with_allowed_sources(mut self, allowed: Vec<IpAddr>) -> Self {
        self.allowed = allowed;
        self
    }

    /// Bytes before the payload of an rdaq datagram here: what the engine reads as header.
    pub fn header_len(&self) -> usize {
        self.hdr_len
    }

    /// Bytes before the payload of a datagram from a source of this kind.
    fn header_len_of(&self, kind: SourceKind) -> usize {
        match kind {
            SourceKind::Rdaq => self.hdr_len,
            SourceKind::Sls { .. } => SLS_HEADER_LEN,
        }
    }

    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    /// Frames finished since the last call.
    pub fn take_ready(&mut self) -> std::vec::Drain<'_, FrameReady> {
        self.ready.drain(..)
    }

    /// Where an rdaq datagram goes; checks everything that does not depend on slot state.
    /// `hdr` is the header area as read: [`Placement::header_len`] bytes (fewer if the
    /// datagram was shorter).
    pub fn target_rdaq(&self, hdr: &[u8], datagram_len: usize) -> Result<Target, DropReason> {
        if hdr.len() < self.hdr_len {
            return Err(DropReason::Truncated);
        }
        let hdr: &[u8; HEADER_LEN] = hdr[..HEADER_LEN].try_into().map_err(|_| DropReason::Truncated)?;
        let h = Header::decode(hdr, datagram_len).map_err(|e| match e {
            DecodeError::Truncated { .. } => DropReason::Truncated,
            DecodeError::BadMagic(_) => DropReason::BadMagic,
            DecodeError::BadVersion(_) => DropReason::BadVersion,
            DecodeError::ReservedFlags(_) | DecodeError::ReservedField(_) => DropReason::BadHeader,
            DecodeError::LengthMismatch { .. } => DropReason::LengthMismatch,
            DecodeError::OffsetOverflow { .. } => DropReason::OutOfBounds,
            DecodeError::BadChecksum => DropReason::BadChecksum,
        })?;
        if h.flags.contains(Flags::CHECKSUM) != self.checksum {
            return Err(DropReason::ChecksumMode);
        }
        let slot = h.buffer.wrapping_sub(self.buffer_base);
        if slot as usize >= self.keys.len() {
            return Err(DropReason::UnknownBuffer);
        }
        if self.keys[slot as usize] != h.key {
            return Err(DropReason::BadKey);
        }
        if h.end() > self.grid.slot_bytes() {
            return Err(DropReason::OutOfBounds);
        }
        let module = match self.module_index.get(h.module as usize) {
            Some(&i) if i != u16::MAX => i,
            _ => return Err(DropReason::UnknownModule),
        };
        if h.dataset != 0 {
            return Err(DropReason::UnknownDataset);
        }
        let cell = self.grid.cell_at(module, h.offset, h.length as u64).ok_or(DropReason::Misaligned)?;
        let imm = h.flags.contains(Flags::IMM).then_some(h.imm);
        Ok(Target { slot, cell, frame: h.frame, imm, seq: h.seq, retransmit: h.flags.contains(Flags::RETRANSMIT) })
    }

    /// Checks the checksum extension of an rdaq datagram whose target was found.
    fn verify(&self, hdr: &[u8], payload: &[u8]) -> Result<(), DropReason> {
        if !self.checksum {
            return Ok(());
        }
        let head: &[u8; HEADER_LEN] = hdr[..HEADER_LEN].try_into().map_err(|_| DropReason::Truncated)?;
        let stored = u32::from_le_bytes(hdr[HEADER_LEN..HEADER_LEN + CHECKSUM_LEN].try_into().map_err(|_| DropReason::Truncated)?);
        if checksum(head, payload) == stored {
            Ok(())
        } else {
            Err(DropReason::BadChecksum)
        }
    }

    /// Where a native JUNGFRAU packet read from an sls source goes.
    pub fn target_sls(&self, hdr: &[u8], datagram_len: usize, kind: SourceKind) -> Result<Target, DropReason> {
        let SourceKind::Sls { module, first_cell, first_packet, packets } = kind else {
            unreachable!("target_sls on an rdaq source")
        };
        let hdr: &[u8; SLS_HEADER_LEN] = hdr.try_into().map_err(|_| DropReason::Truncated)?;
        let h = SlsHeader::decode(hdr);
        h.check_jungfrau(datagram_len - SLS_HEADER_LEN, u32::MAX).map_err(|_| DropReason::BadSlsPacket)?;
        let k = h.packet_number.wrapping_sub(first_packet);
        if k >= packets {
            return Err(DropReason::UnexpectedPacket);
        }
        let slot = (h.frame_number % self.slots.len() as u64) as u32;
        let cell = module as u32 * self.grid.cells_per_module + first_cell + k;
        Ok(Target { slot, cell, frame: h.frame_number, imm: None, seq: 0, retransmit: false })
    }

    #[inline]
    fn dest(&self, t: &Target) -> *mut u8 {
        // SAFETY: cell < grid.cells() and slot < slots, so the offset lies inside the slot.
        unsafe { self.arena.slot_ptr(t.slot as usize).add(self.grid.cell_offset(t.cell) as usize) }
    }

    /// Predicted landings for the next batch on `src`, one per entry of `out`: the cells
    /// after the last one placed from it, each only if it may take a full landing's bytes (a
    /// full-size cell, bit clear, slot not handed); otherwise `None` (scratch). The walk
    /// stops before it comes round the ring to a cell it already named: two datagrams of one
    /// batch must never land in the same place (a batch can be longer than the ring).
    pub fn predict(&self, src: &Source, landing_len: usize, out: &mut [Option<*mut u8>]) {
        let span = match src.kind {
            SourceKind::Rdaq => self.grid.cells_per_module,
            SourceKind::Sls { packets, .. } => packets,
        } as usize;
        let distinct = span * self.slots.len();
        let mut next = src.next;
        for (k, o) in out.iter_mut().enumerate() {
            if k >= distinct {
                *o = None;
                continue;
            }
            *o = next.and_then(|(slot, cell)| {
                let s = &self.slots[slot as usize];
                let bit_set = s.state == State::Filling && s.bitmap[cell as usize / 64] & (1 << (cell % 64)) != 0;
                let usable = s.state != State::Handed && !bit_set && self.grid.cell_len(cell) as usize == landing_len;
                usable.then(|| self.dest(&Target { slot, cell, frame: 0, imm: None, seq: 0, retransmit: false }))
            });
            next = next.map(|(slot, cell)| self.successor(src.kind, slot, cell));
        }
    }

    fn successor(&self, kind: SourceKind, slot: u32, cell: u32) -> (u32, u32) {
        let cpm = self.grid.cells_per_module;
        let (lo, hi) = match kind {
            SourceKind::Rdaq => (0, cpm),
            SourceKind::Sls { first_cell, packets, .. } => (first_cell, first_cell + packets),
        };
        let m = cell / cpm;
        if cell % cpm + 1 < hi {
            (slot, cell + 1)
        } else {
            ((slot + 1) % self.slots.len() as u32, m * cpm + lo)
        }
    }

    /// Places the `n` datagrams of the receive engine's last batch, read from `src`.
    pub fn place_batch(&mut self, rx: &MmsgReceiver, n: usize, src: &mut Source, now: Instant) {
        self.counters.datagrams += n as u64;
        let cell_bytes = self.grid.cell_bytes as usize;
        // Pass 1 (stateless): targets, and move every payload that landed in a wrong
        // predicted cell out of the arena, so that pass 2 may write any cell of this batch.
        self.pending.clear();
        let hdr_len = self.header_len_of(src.kind);
        for i in 0..n {
            let len = rx.datagram_len(i);
            let payload = len.saturating_sub(hdr_len);
            let landed = rx.landed(i);
            let from = rx.source(i);
            let t = if rx.truncated(i) {
                Err(DropReason::Oversized)
            } else if !self.allowed.is_empty() && !from.is_some_and(|a| self.allowed.contains(&a.ip())) {
                Err(DropReason::UnknownSource)
            } else {
                match src.kind {
                    SourceKind::Rdaq => self.target_rdaq(rx.header(i), len).and_then(|t| {
                        // SAFETY: the datagram was not truncated, so its `payload` bytes lie
                        // at `landed`, written by the kernel during the last receive.
                        let p = unsafe { std::slice::from_raw_parts(landed, payload) };
                        self.verify(rx.header(i), p).map(|()| t)
                    }),
                    SourceKind::Sls { .. } => self.target_sls(rx.header(i), len, src.kind),
                }
            };
            match &t {
                Ok(_) => {
                    src.peer = from;
                    src.accepted += 1;
                }
                Err(DropReason::UnexpectedPacket) => src.unexpected.record(sls_packet_number(rx.header(i))),
                Err(_) => {}
            }
            let s = match &t {
                Ok(t) if self.dest(t) == landed => Src::InPlace,
                Ok(_) if self.arena.contains(landed, payload) => {
                    // SAFETY: `landed` holds `payload` bytes the kernel just wrote inside the
                    // arena; evac slot i is private and cell_bytes >= payload (target checked).
                    let e = unsafe { self.evac.as_mut_ptr().add(i * cell_bytes) };
                    unsafe { std::ptr::copy_nonoverlapping(landed, e, payload) };
                    Src::At(e)
                }
                _ => Src::At(landed),
            };
            self.pending.push((t, s, payload));
        }
        // Pass 2 (stateful, in arrival order).
        for k in 0..n {
            let (t, s, payload) = self.pending[k];
            if let Ok(t) = &t {
                src.last_data = Some(now);
                src.flushed = false;
                src.newest_frame = Some(src.newest_frame.map_or(t.frame, |n| n.max(t.frame)));
                self.observe(src, t.seq);
            }
            match t.and_then(|t| self.place(t, s, payload, now).map(|()| t)) {
                Ok(t) => src.next = Some(self.successor(src.kind, t.slot, t.cell)),
                Err(r) => self.count_drop(&t, r),
            }
        }
    }

    /// Feeds an accepted datagram's sequence number to its channel's loss window.
    fn observe(&mut self, src: &mut Source, seq: u32) {
        let Some(w) = src.window.as_mut() else { return };
        let (counters, losses, nacks, module) = (&mut self.counters, &mut self.losses, &mut src.nacks, src.module_id);
        match w.observe(seq, |a, b| declare_lost(counters, losses, nacks, module, a, b)) {
            Seen::Recovered => self.counters.seq_recovered += 1,
            Seen::Reordered => self.counters.seq_reordered += 1,
            Seen::New | Seen::Duplicate | Seen::TooOld => {}
        }
    }

    /// Places one contiguous datagram read from `src` (the path for tests and fuzzing; the
    /// engine uses [`Placement::place_batch`]). Returns the drop reason, if dropped.
    pub fn place_datagram(&mut self, datagram: &[u8], src: SourceKind, now: Instant) -> Result<Target, DropReason> {
        self.counters.datagrams += 1;
        let hl = self.header_len_of(src).min(datagram.len());
        let t = match src {
            SourceKind::Rdaq => self.target_rdaq(&datagram[..hl], datagram.len())
                .and_then(|t| self.verify(&datagram[..hl], &datagram[hl..]).map(|()| t)),
            SourceKind::Sls { .. } => self.target_sls(&datagram[..hl], datagram.len(), src),
        };
        let r = t.and_then(|t| self.place(t, Src::At(datagram[hl..].as_ptr()), datagram.len() - hl, now).map(|()| t));
        if let Err(reason) = r {
            self.count_drop(&t, reason);
        }
        r
    }

    /// Counts a datagram not placed: a retransmission that is no longer needed (its cell is
    /// filled or its frame finished) is redundant, not a fault; everything else is a drop.
    fn count_drop(&mut self, t: &Result<Target, DropReason>, r: DropReason) {
        match t {
            Ok(t) if t.retransmit && matches!(r, DropReason::Duplicate | DropReason::Stale) => self.counters.redundant += 1,
            _ => self.counters.drop(r),
        }
    }

    fn place(&mut self, t: Target, src: Src, payload: usize, now: Instant) -> Result<(), DropReason> {
        let si = t.slot as usize;
        if self.slots[si].refused == Some(t.frame) {
            return Err(DropReason::RingFull);
        }
        match self.slots[si].state {
            State::Free => {
                if self.slots[si].last_frame.is_some_and(|l| t.frame <= l) {
                    return Err(DropReason::Stale);
                }
                self.claim(si, t.frame, now);
            }
            State::Filling if t.frame == self.slots[si].frame => {}
            State::Filling if t.frame < self.slots[si].frame => return Err(DropReason::Stale),
            State::Filling => {
                // A newer frame wants the slot: the ring has wrapped past an unfinished frame.
                self.finish(si, false);
                if self.slots[si].state != State::Free {
                    return Err(self.refuse(si, t.frame));
                }
                self.claim(si, t.frame, now);
            }
            State::Handed if t.frame <= self.slots[si].frame => return Err(DropReason::Stale),
            State::Handed => return Err(self.refuse(si, t.frame)),
        }
        let (w, b) = (t.cell as usize / 64, 1u64 << (t.cell % 64));
        if self.slots[si].bitmap[w] & b != 0 {
            return Err(DropReason::Duplicate);
        }
        match src {
            Src::InPlace => self.counters.landed_in_place += 1,
            // SAFETY: the target was checked to be one cell of this slot, `payload` is that
            // cell's length, the slot is Filling (owned by this thread), and the source is
            // scratch, evacuation space or the caller's datagram, none of which overlap it.
            Src::At(p) => unsafe { std::ptr::copy_nonoverlapping(p, self.dest(&t), payload) },
        }
        let slot = &mut self.slots[si];
        slot.bitmap[w] |= b;
        slot.received += 1;
        slot.last_activity = now;
        if t.retransmit {
            slot.retransmitted += 1;
            self.counters.placed_retransmitted += 1;
        }
        if t.imm.is_some() {
            slot.imm = t.imm;
        }
        self.counters.placed += 1;
        self.counters.bytes_placed += payload as u64;
        if slot.received == self.grid.cells() {
            self.finish(si, true);
        }
        Ok(())
    }

    /// Refuses frame `frame`, whose slot `si` the consumer still holds: the ring is full.
    /// A refused frame is refused whole (see `Slot::refused`) and counted once.
    fn refuse(&mut self, si: usize, frame: u64) -> DropReason {
        let s = &mut self.slots[si];
        if s.refused.is_none_or(|r| r < frame) {
            s.refused = Some(frame);
            if self.ledger.refused.insert(frame) {
                self.counters.frames_refused += 1;
            }
        }
        DropReason::RingFull
    }

    fn claim(&mut self, si: usize, frame: u64, now: Instant) {
        let s = &mut self.slots[si];
        s.state = State::Filling;
        self.filling += 1;
        s.frame = frame;
        s.first_seen = now;
        s.received = 0;
        s.imm = None;
        s.bitmap.fill(0);
        s.last_activity = now;
        s.last_nack = None;
        s.nacks = 0;
        s.retransmitted = 0;
    }

    /// Finishes the frame in slot `si`: complete, or incomplete under the policy.
    fn finish(&mut self, si: usize, complete: bool) {
        let total = self.grid.cells();
        let s = &self.slots[si];
        let mut missing = Vec::new();
        if !complete {
            missing.extend((0..total).filter(|c| s.bitmap[*c as usize / 64] & (1 << (c % 64)) == 0));
            self.counters.cells_missing += missing.len() as u64;
            match self.always_missing.as_mut() {
                Some(always) => always.iter_mut().zip(s.bitmap.iter()).for_each(|(a, have)| *a &= !have),
                None => self.always_missing = Some(s.bitmap.iter().map(|have| !have).collect()),
            }
        }
        self.ledger.finished.insert(s.frame);
        let status = match (complete, self.policy) {
            (true, _) => FrameStatus::Complete,
            (false, IncompletePolicy::Keep) => FrameStatus::Incomplete,
            (false, IncompletePolicy::Discard) => FrameStatus::Discarded,
        };
        if status == FrameStatus::Incomplete {
            for &c in &missing {
                // SAFETY: the slot is Filling, owned by this thread; the cell lies inside it.
                unsafe {
                    let p = self.arena.slot_ptr(si).add(self.grid.cell_offset(c) as usize);
                    std::ptr::write_bytes(p, MISSING_BYTE, self.grid.cell_len(c) as usize);
                }
            }
        }
        let s = &mut self.slots[si];
        s.last_frame = Some(s.frame);
        s.state = if status == FrameStatus::Discarded { State::Free } else { State::Handed };
        self.filling -= 1;
        if complete && s.retransmitted > 0 {
            self.counters.frames_recovered += 1;
        }
        if !complete && s.nacks > 0 {
            self.counters.frames_given_up += 1;
        }
        match status {
            FrameStatus::Complete => self.counters.frames_complete += 1,
            FrameStatus::Incomplete => self.counters.frames_incomplete += 1,
            FrameStatus::Discarded => self.counters.frames_discarded += 1,
        }
        self.ready.push(FrameReady {
            slot: si as u32,
            frame: s.frame,
            status,
            received_cells: s.received,
            total_cells: total,
            missing,
            imm: s.imm,
        });
    }

    /// Finishes every frame whose first datagram is older than `timeout`, unless a source
    /// whose cells it lacks is still on its way to it ([`Source::on_its_way_to`]: sending
    /// this frame or older ones, heard from within `timeout`). A late module is waited for; a silent
    /// one is not, while the others go on sending (one never heard from is waited for
    /// [`QUIET_FACTOR`] timeouts: it may not have started). The timeout counts only time in
    /// which the sources have been sending for a whole timeout: when every source has been
    /// quiet for the timeout, the detector as a whole has stopped or stalled (a machine too
    /// busy to run its modules, which share a trigger), and frames wait [`QUIET_FACTOR`]
    /// times longer for it to resume; once it resumes, they get another timeout. A frame
    /// whose slot a newer frame needs is finished in any case. Without sources (tests of
    /// placement alone) only the age counts.
    pub fn expire(&mut self, now: Instant, timeout: Duration, sources: &[Source]) {
        let heard = sources.iter().filter_map(|s| s.last_data).max();
        let active = heard.is_some_and(|t| now.duration_since(t) < timeout);
        // the timeout runs while the detector sends: a frame begun before a pause (a slow
        // start, a stall) is given a whole timeout of sending after the pause
        match (active, self.active_since) {
            (false, _) => self.active_since = None,
            (true, None) => self.active_since = heard,
            (true, Some(_)) => {}
        }
        let sending = self.active_since.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        for si in 0..self.slots.len() {
            let s = &self.slots[si];
            let age = now.duration_since(s.first_seen);
            let due = if active || sources.is_empty() { age >= timeout && (sending >= timeout || sources.is_empty()) } else { age >= timeout * QUIET_FACTOR };
            if s.state != State::Filling || !due {
                continue;
            }
            // a source never heard from has not started yet (a module whose start was slow,
            // or whose packets a busy machine delivers late): it is waited for as long as a
            // stalled detector, not written off after one timeout
            let late = |src: &Source| src.on_its_way_to(s.frame, now, timeout) || (src.last_data.is_none() && age < timeout * QUIET_FACTOR);
            let waiting = sources.iter().any(|src| late(src) && src.kind.cells(src.module, &self.grid).any(|c| s.bitmap[c as usize / 64] & (1 << (c % 64)) == 0));
            if !waiting {
                self.finish(si, false);
            }
        }
    }

    /// Frames still filling that have had nothing placed for `quiet`: calls
    /// `out(local module, frame, first, end)` for each run of datagrams (indices within the
    /// module frame) they lack from the modules for which `past(module, frame)` says that
    /// the frame is behind them, at most `retries` times per frame and every `interval`.
    /// (The loss windows cannot see such a gap when nothing follows it on the channel.)
    pub fn stalled(
        &mut self,
        now: Instant,
        quiet: Duration,
        interval: Duration,
        retries: u32,
        past: impl Fn(u16, u64) -> bool,
        mut out: impl FnMut(u16, u64, u32, u32),
    ) {
        let cpm = self.grid.cells_per_module;
        for s in self.slots.iter_mut() {
            let due = s.state == State::Filling
                && s.nacks < retries
                && now.duration_since(s.last_activity) >= quiet
                && s.last_nack.is_none_or(|t| now.duration_since(t) >= interval);
            if !due {
                continue;
            }
            let mut asked = false;
            for m in (0..self.grid.modules).filter(|&m| past(m, s.frame)) {
                let mut run: Option<u32> = None;
                for k in 0..cpm {
                    let c = m as u32 * cpm + k;
                    let have = s.bitmap[c as usize / 64] & (1 << (c % 64)) != 0;
                    match (have, run) {
                        (false, None) => run = Some(k),
                        (true, Some(r)) => {
                            out(m, s.frame, r, k);
                            asked = true;
                            run = None;
                        }
                        _ => {}
                    }
                }
                if let Some(r) = run {
                    out(m, s.frame, r, cpm);
                    asked = true;
                }
            }
            if asked {
                s.nacks += 1;
                s.last_nack = Some(now);
            }
        }
    }

    /// Finishes every frame still filling, oldest frame first (end of acquisition).
    pub fn finish_all(&mut self) {
        let mut filling: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].state == State::Filling).collect();
        filling.sort_by_key(|&i| self.slots[i].frame);
        for si in filling {
            self.finish(si, false);
        }
    }

    /// Forgets which frames the slots held, so that a new acquisition may start its frame
    /// numbers again (frames in progress are finished first).
    pub fn reset_history(&mut self) {
        self.finish_all();
        for s in &mut self.slots {
            s.last_frame = None;
            s.refused = None;
        }
        self.ledger.clear();
        self.always_missing = None;
        self.active_since = None;
    }

    /// Gives a handed slot back. Returns false (and changes nothing) if the slot does not
    /// hold that frame in the handed state.
    pub fn release(&mut self, slot: u32, frame: u64) -> bool {
        match self.slots.get_mut(slot as usize) {
            Some(s) if s.state == State::Handed && s.frame == frame => {
                s.state = State::Free;
                true
            }
            _ => false,
        }
    }

    /// Frames currently filling.
    pub fn filling(&self) -> usize {
        self.filling
    }
}
