//! A receiver without a network, for measuring what consumes frames: its ring is filled
//! once by the caller, and a [`Placer`] hands its slots on as finished frames, as the receive
//! thread would once a frame's datagrams had been placed (by a NIC's DMA, say), but without
//! writing them again. What the consumer sees (the frame channel, `data`, `release`,
//! `missing_mask`) is the [`Receiver`]'s own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver as ChanRx, RecvTimeoutError, Sender as ChanTx};

use crate::arena::Arena;
use crate::counters::Counters;
use crate::engine::{Receiver, ReceiverError};
use crate::frame::{FrameReady, FrameStatus, Owner};
use crate::grid::Grid;

/// What [`Placer::wait_released_for`] saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Released {
    Slot(u32),
    /// None was given back in time.
    NotYet,
    /// The receiver is gone.
    Gone,
}

/// Hands the slots of an in-memory receiver on as frames (the receive thread's part).
/// Dropping it ends the receiver's frames.
pub struct Placer {
    arena: Arc<Arena>,
    grid: Grid,
    owner: Owner,
    frames_tx: ChanTx<FrameReady>,
    release_rx: ChanRx<FrameReady>,
    /// Per slot: handed on, not yet given back.
    handed: Vec<bool>,
    counters: Arc<std::sync::Mutex<Counters>>,
}

impl Receiver {
    /// A receiver of `modules` modules of `module_bytes` each, with a ring of `slots` frames
    /// and no data ports, and the [`Placer`] that hands its frames on.
    pub fn in_memory(modules: u16, module_bytes: u64, slots: usize) -> Result<(Receiver, Placer), ReceiverError> {
        if modules == 0 || module_bytes == 0 || slots == 0 {
            return Err(ReceiverError::Config(format!("an in-memory receiver needs modules, bytes and slots ({modules}, {module_bytes}, {slots})")));
        }
        let grid = Grid::new(modules, module_bytes, module_bytes.min(8192));
        let slot_bytes = grid.slot_bytes() as usize;
        let arena = Arc::new(Arena::new(slots, slot_bytes).map_err(|source| ReceiverError::Memory { bytes: (slots * slot_bytes) as u64, source })?);
        let (frames_tx, frames) = crossbeam_channel::unbounded();
        let (release_tx, release_rx) = crossbeam_channel::unbounded();
        let owner = Owner::new();
        let rx = Receiver::without_thread(arena.clone(), grid, owner, frames, release_tx);
        let counters = rx.shared_counters();
        Ok((rx, Placer { arena, grid, owner, frames_tx, release_rx, handed: vec![false; slots], counters }))
    }
}

impl Placer {
    pub fn slots(&self) -> usize {
        self.handed.len()
    }

    /// The bytes of `slot`, to fill: only while it is not handed on (panics otherwise, as
    /// the consumer may be reading it; a slot given back counts once [`Placer::wait_released`]
    /// or [`Placer::free`] has seen it).
    pub fn slot_mut(&mut self, slot: u32) -> &mut [u8] {
        assert!(!self.handed[slot as usize], "slot {slot} is handed on");
        // SAFETY: slot_ptr checks the index; the slot is not handed on (checked above), so
        // no frame token gives the consumer its bytes, and `&mut self` keeps this the only
        // reference the placer gives out until it is handed.
        unsafe { std::slice::from_raw_parts_mut(self.arena.slot_ptr(slot as usize), self.arena.slot_bytes()) }
    }

    /// Hands `slot` on as complete frame `frame` (panics if it is already handed on, as
    /// [`Placer::slot_mut`]).
    pub fn hand(&mut self, slot: u32, frame: u64) {
        assert!(!self.handed[slot as usize], "slot {slot} is handed on");
        self.handed[slot as usize] = true;
        let now = Instant::now();
        let cells = self.grid.cells();
        let f = FrameReady { owner: self.owner, slot, frame, status: FrameStatus::Complete, received_cells: cells, total_cells: cells, missing: Vec::new(), imm: None, first_datagram: now, finished: now };
        let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        c.frames_complete += 1;
        c.bytes_placed += self.grid.slot_bytes();
        drop(c);
        // the consumer may have gone: the slot then stays handed, which nothing reads
        let _ = self.frames_tx.send(f);
    }

    /// Waits for the consumer to give a slot back and returns it (`None` once the receiver
    /// is gone).
    pub fn wait_released(&mut self) -> Option<u32> {
        let f = self.release_rx.recv().ok()?;
        self.handed[f.slot as usize] = false;
        Some(f.slot)
    }

    /// [`Placer::wait_released`], waiting at most `timeout`.
    pub fn wait_released_for(&mut self, timeout: Duration) -> Released {
        match self.release_rx.recv_timeout(timeout) {
            Ok(f) => {
                self.handed[f.slot as usize] = false;
                Released::Slot(f.slot)
            }
            Err(RecvTimeoutError::Timeout) => Released::NotYet,
            Err(RecvTimeoutError::Disconnected) => Released::Gone,
        }
    }

    /// Slots that are not handed on, with those given back since last seen.
    pub fn free(&mut self) -> impl Iterator<Item = u32> + '_ {
        self.take_released();
        self.handed.iter().enumerate().filter(|(_, &h)| !h).map(|(i, _)| i as u32)
    }

    fn take_released(&mut self) {
        while let Ok(f) = self.release_rx.try_recv() {
            self.handed[f.slot as usize] = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_go_round_the_ring() {
        let (rx, mut placer) = Receiver::in_memory(2, 4096, 2).unwrap();
        placer.slot_mut(0).fill(7);
        placer.slot_mut(1).fill(9);
        placer.hand(0, 10);
        placer.hand(1, 11);
        let f = rx.frames().recv().unwrap();
        assert_eq!((f.frame(), f.status()), (10, FrameStatus::Complete));
        assert!(rx.data(&f).unwrap().iter().all(|&b| b == 7) && rx.data(&f).unwrap().len() == 8192);
        rx.release(f).unwrap();
        assert_eq!(placer.wait_released(), Some(0));
        assert_eq!(placer.free().collect::<Vec<_>>(), vec![0]);
        placer.hand(0, 12);
        drop(placer);
        let numbers: Vec<u64> = rx.frames().iter().map(|f| f.frame()).collect();
        assert_eq!(numbers, vec![11, 12]);
        assert_eq!(rx.counters().frames_complete, 3);
    }

    #[test]
    fn waiting_for_a_slot_can_stop() {
        let (rx, mut placer) = Receiver::in_memory(1, 4096, 1).unwrap();
        placer.hand(0, 0);
        assert_eq!(placer.wait_released_for(Duration::from_millis(1)), Released::NotYet);
        rx.release(rx.frames().recv().unwrap()).unwrap();
        assert_eq!(placer.wait_released_for(Duration::from_secs(60)), Released::Slot(0));
        drop(rx);
        assert_eq!(placer.wait_released_for(Duration::from_secs(60)), Released::Gone);
    }

    #[test]
    #[should_panic(expected = "handed on")]
    fn a_handed_slot_cannot_be_written() {
        let (_rx, mut placer) = Receiver::in_memory(1, 4096, 1).unwrap();
        placer.hand(0, 0);
        placer.slot_mut(0);
    }
}
