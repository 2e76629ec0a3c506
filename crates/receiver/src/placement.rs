//! The receiver's core, independent of sockets: whether a datagram may go where its header
//! says ([`crate::target`]; slot state, bitmap), placing it, and finishing frames.
//!
//! Slot state machine (one slot = one local buffer = one frame at a time):
//! `Free -> Filling(frame) -> Handed(frame) -> Free`. The receive thread owns Free and
//! Filling slots; the consumer owns Handed slots until it releases them. Payloads are only
//! ever written into Free or Filling slots, and only into cells whose bitmap bit is clear.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::arena::Arena;
use crate::batch::Batch;
use crate::counters::{Counters, DropReason};
use crate::frame::{FrameError, FrameReady, FrameStatus, IncompletePolicy, Owner, MISSING_BYTE};
use crate::grid::Grid;
use crate::ledger::Ledger;
use crate::source::{declare_lost, sls_packet_number, Loss, PortGrid, Source, SourceKind, LOSS_LOG};
use crate::target::{Target, Targets};
use crate::window::Seen;

/// How many frame timeouts a frame waits while every source is quiet (see
/// [`Placement::expire`]).
pub const QUIET_FACTOR: u32 = 10;

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
enum Payload {
    /// Already at its destination.
    InPlace,
    /// Somewhere else: scratch, or the caller's datagram.
    At(*const u8),
    /// Moved out of a wrongly predicted cell of the ring into evacuation space.
    Evacuated(*const u8),
}

pub struct Placement {
    /// Whose frame tokens are these.
    owner: Owner,
    arena: Arc<Arena>,
    grid: Grid,
    targets: Targets,
    slots: Vec<Slot>,
    policy: IncompletePolicy,
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
    /// Datagrams one batch may hold: the bound of `evac` and `pending`.
    batch: usize,
    /// Where payloads that landed in a wrong cell of the ring wait during a batch: one cell's
    /// bytes for each datagram of the batch.
    evac: Vec<u8>,
    pending: Vec<(Result<Target, DropReason>, Payload, usize)>,
}

// SAFETY: the raw pointers in `pending` are only used within one `place_batch` call.
unsafe impl Send for Placement {}

/// The most datagrams a batch may hold ([`Placement::new`]).
pub const MAX_BATCH: usize = 1024;

impl Placement {
    /// `keys[i]` is the access key of local buffer `buffer_base + i` (slot `i`);
    /// `module_ids[i]` is the global id of the module at position `i` of a slot; `batch`
    /// (1..=[`MAX_BATCH`]) is the most datagrams [`Placement::place_batch`] is given at once.
    ///
    /// # Panics
    /// When the arguments disagree with each other or `batch` is out of range (a
    /// [`crate::ReceiverConfig`] is checked for these before it gets here).
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
        assert!((1..=MAX_BATCH).contains(&batch), "batch {batch} must be 1..={MAX_BATCH}");
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
            owner: Owner::new(),
            targets: Targets::new(grid, module_ids, buffer_base, keys),
            batch,
            evac: vec![0; batch * grid.cell_bytes as usize],
            pending: Vec::with_capacity(batch),
            arena,
            grid,
            slots,
            policy,
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
        self.targets.set_checksum(on);
        self
    }

    /// Accepts datagrams only from these addresses (empty: from any).
    pub fn with_allowed_sources(mut self, allowed: Vec<IpAddr>) -> Self {
        self.allowed = allowed;
        self
    }

    /// Bytes before the payload of an rdaq datagram here: what the engine reads as header.
    pub fn header_len(&self) -> usize {
        self.targets.hdr_len
    }

    /// The identity frame tokens of this placement carry.
    pub(crate) fn owner(&self) -> Owner {
        self.owner
    }

    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    /// Frames finished since the last call.
    pub fn take_ready(&mut self) -> std::vec::Drain<'_, FrameReady> {
        self.ready.drain(..)
    }

    #[inline]
    fn dest(&self, t: &Target) -> *mut u8 {
        assert!(t.cell < self.grid.cells(), "cell {} of a {}-cell slot", t.cell, self.grid.cells());
        // SAFETY: slot_ptr checks slot < slots, and cell < grid.cells() (checked above), so
        // the cell's offset lies inside the slot.
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
            SourceKind::Sls { packets, .. } | SourceKind::SlsByHeader { grid: PortGrid { packets, .. }, .. } => packets,
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
        let m = cell / cpm;
        let (lo, hi) = match kind {
            SourceKind::Rdaq => (0, cpm),
            SourceKind::Sls { first_cell, packets, .. } => (first_cell, first_cell + packets),
            // the port of the cell placed last: the header, not the socket, said which
            SourceKind::SlsByHeader { grid, .. } => {
                let lo = cell % cpm / grid.packets * grid.packets;
                (lo, lo + grid.packets)
            }
        };
        if cell % cpm + 1 < hi {
            (slot, cell + 1)
        } else {
            ((slot + 1) % self.slots.len() as u32, m * cpm + lo)
        }
    }

    /// Places the datagrams of a batch read from `src`.
    ///
    /// # Panics
    /// When the batch holds more datagrams than announced to [`Placement::new`].
    pub fn place_batch(&mut self, batch: &impl Batch, src: &mut Source, now: Instant) {
        let n = batch.count();
        assert!(n <= self.batch, "a batch of {n} datagrams, where at most {} were announced", self.batch);
        self.counters.datagrams += n as u64;
        // Pass 1 (stateless): targets, and move every payload that landed in a wrong
        // predicted cell out of the arena, so that pass 2 may write any cell of this batch.
        self.pending.clear();
        for i in 0..n {
            let payload = batch.payload(i);
            let t = self.accept(batch, i, payload, src);
            let s = self.stage(&t, payload, i);
            self.pending.push((t, s, payload.len()));
        }
        // Pass 2 (stateful, in arrival order).
        for k in 0..n {
            let (t, s, payload) = self.pending[k];
            if let Ok(t) = &t {
                src.last_data = Some(now);
                src.flushed = false;
                src.newest_frame = Some(src.newest_frame.map_or(t.frame, |n| n.max(t.frame)));
                src.oldest_frame = Some(src.oldest_frame.map_or(t.frame, |n| n.min(t.frame)));
                self.observe(src, t.seq);
            }
            match t.and_then(|t| self.place(t, s, payload, now).map(|()| t)) {
                Ok(t) => src.next = Some(self.successor(src.kind, t.slot, t.cell)),
                Err(r) => self.count_drop(&t, r),
            }
        }
    }

    /// Where datagram `i` of the batch goes, with the checks that need its source; notes
    /// on the source where it came from (or what unexpected packet it was).
    fn accept(&self, batch: &impl Batch, i: usize, payload: &[u8], src: &mut Source) -> Result<Target, DropReason> {
        let from = batch.source(i);
        let t = if batch.truncated(i) {
            Err(DropReason::Oversized)
        } else if !self.allowed.is_empty() && !from.is_some_and(|a| self.allowed.contains(&a.ip())) {
            Err(DropReason::UnknownSource)
        } else {
            self.targets.find(src.kind, batch.header(i), batch.datagram_len(i), payload)
        };
        match &t {
            Ok(_) => {
                src.peer = from;
                src.accepted += 1;
            }
            Err(DropReason::UnexpectedPacket) => src.unexpected.record(sls_packet_number(batch.header(i))),
            Err(DropReason::BadSlsPacket) => src.foreign.record(batch.header(i), Some(payload.len())),
            Err(DropReason::Oversized) if !matches!(src.kind, SourceKind::Rdaq) => src.foreign.record(batch.header(i), None),
            Err(_) => {}
        }
        t
    }

    /// Where the payload of datagram `i` of the batch waits for pass 2: at its destination,
    /// in `evac` when it landed in another cell of the ring (which pass 2 may write), or
    /// where it is (scratch).
    fn stage(&mut self, t: &Result<Target, DropReason>, payload: &[u8], i: usize) -> Payload {
        let landed = payload.as_ptr();
        match t {
            Ok(t) if self.dest(t).cast_const() == landed => Payload::InPlace,
            Ok(_) if self.arena.contains(landed, payload.len()) => {
                let at = i * self.grid.cell_bytes as usize;
                assert!(at + payload.len() <= self.evac.len(), "the batch fits the space `new` set aside for it");
                // Raw pointers from `as_mut_ptr` (no reference to the whole buffer is made),
                // so that the pointers of earlier datagrams of the batch stay valid for pass 2.
                // SAFETY: `at + payload.len()` lies inside `evac` (checked above), which
                // nothing else uses during the batch; `payload` is the caller's slice, not
                // part of `evac`.
                let e = unsafe {
                    let e = self.evac.as_mut_ptr().add(at);
                    std::ptr::copy_nonoverlapping(payload.as_ptr(), e, payload.len());
                    e
                };
                Payload::Evacuated(e)
            }
            _ => Payload::At(landed),
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
        let hl = self.targets.header_len(src).min(datagram.len());
        let (hdr, payload) = datagram.split_at(hl);
        let t = self.targets.find(src, hdr, datagram.len(), payload);
        let r = t.and_then(|t| self.place(t, Payload::At(payload.as_ptr()), payload.len(), now).map(|()| t));
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

    fn place(&mut self, t: Target, from: Payload, payload: usize, now: Instant) -> Result<(), DropReason> {
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
        if payload != self.grid.cell_len(t.cell) as usize {
            return Err(DropReason::LengthMismatch);
        }
        match from {
            Payload::InPlace => self.counters.landed_in_place += 1,
            Payload::At(p) | Payload::Evacuated(p) => {
                self.counters.copied += 1;
                self.counters.evacuated += matches!(from, Payload::Evacuated(_)) as u64;
                // SAFETY: `dest` checks that the target is one cell of this slot, `payload`
                // is that cell's length (checked above), the slot is Filling (owned by this
                // thread), and the source is scratch, evacuation space or the caller's
                // datagram, none of which overlap it, holding `payload` bytes.
                unsafe { std::ptr::copy_nonoverlapping(p, self.dest(&t), payload) }
            }
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
            owner: self.owner,
            slot: si as u32,
            frame: s.frame,
            status,
            received_cells: s.received,
            total_cells: total,
            missing,
            imm: s.imm,
            first_datagram: s.first_seen,
            finished: Instant::now(),
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

    /// Slots being filled and slots held by the consumer, of all the ring's slots.
    pub fn ring_fill(&self) -> (u32, u32, u32) {
        let count = |st: State| self.slots.iter().filter(|s| s.state == st).count() as u32;
        (count(State::Filling), count(State::Handed), self.slots.len() as u32)
    }

    /// Gives the slot of a handed frame back (a discarded frame has none: nothing to do).
    /// A frame of another placement is refused and changes nothing.
    pub fn release(&mut self, f: FrameReady) -> Result<(), FrameError> {
        f.check_owner(self.owner)?;
        if f.status == FrameStatus::Discarded {
            return Ok(());
        }
        let s = &mut self.slots[f.slot as usize];
        // a token of this placement is the one claim on its handed slot (it cannot be
        // copied, forged or given back twice)
        assert!(s.state == State::Handed && s.frame == f.frame, "frame {} is not handed in slot {}", f.frame, f.slot);
        s.state = State::Free;
        Ok(())
    }

    /// The bytes of a handed frame (complete, or incomplete with its missing cells marked).
    pub fn data<'a>(&'a self, f: &'a FrameReady) -> Result<&'a [u8], FrameError> {
        f.check_owner(self.owner)?;
        if f.status == FrameStatus::Discarded {
            return Err(FrameError::Discarded { frame: f.frame });
        }
        // SAFETY: `f` is this placement's token of a handed slot: nothing writes a handed
        // slot, and the slice borrows `f`, which `release` consumes, so it cannot outlive
        // the consumer's ownership.
        Ok(unsafe { self.arena.slot(f.slot as usize) })
    }

    /// Frames currently filling.
    pub fn filling(&self) -> usize {
        self.filling
    }
}
