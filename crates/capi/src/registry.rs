//! The open receivers and the frames they handed out, by handle: the caller holds numbers,
//! never pointers into librdaq, so a wrong or stale one is found here and refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use rdaq_receiver::{FrameReady, FrameStatus, ReceiverConfig};

use crate::error::{Failure, RdaqStatus};
use crate::{RdaqCounters, RdaqFrame};

/// One open receiver and the frames the caller holds.
pub struct Station {
    pub rx: rdaq_receiver::Receiver,
    held: Mutex<HashMap<u64, FrameReady>>,
    next_id: AtomicU64,
    modules: u16,
}

static RECEIVERS: Mutex<Option<HashMap<u64, Arc<Station>>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// A poisoned lock (a panic caught at the boundary) still holds a consistent map.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts a receiver; returns its handle.
pub fn open(cfg: ReceiverConfig) -> Result<u64, Failure> {
    let modules = cfg.modules;
    let rx = rdaq_receiver::Receiver::start(cfg).map_err(|e| Failure::new(RdaqStatus::Start, format!("cannot start the receiver: {e}")))?;
    let h = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    let st = Arc::new(Station { rx, held: Mutex::default(), next_id: AtomicU64::new(1), modules });
    lock(&RECEIVERS).get_or_insert_with(HashMap::new).insert(h, st);
    Ok(h)
}

pub fn station(h: u64) -> Result<Arc<Station>, Failure> {
    lock(&RECEIVERS).as_ref().and_then(|m| m.get(&h).cloned()).ok_or_else(|| Failure::new(RdaqStatus::BadHandle, format!("handle {h}: no such receiver (never opened, or closed)")))
}

/// Forgets the receiver: its frames go back, and it stops; it is freed when the last call
/// still using it returns.
pub fn close(h: u64) -> Result<(), Failure> {
    let st = lock(&RECEIVERS).as_mut().and_then(|m| m.remove(&h)).ok_or_else(|| Failure::new(RdaqStatus::BadHandle, format!("handle {h}: no such receiver (never opened, or closed)")))?;
    st.rx.stop();
    for (_, f) in lock(&st.held).drain() {
        st.rx.release(f).expect("a frame of this receiver");
    }
    Ok(())
}

impl Station {
    /// The next frame within `timeout_ms` (negative: until the receiver finishes), now
    /// held by the caller.
    pub fn next(&self, timeout_ms: i64) -> Result<RdaqFrame, Failure> {
        let got = if timeout_ms < 0 {
            self.rx.frames().recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
            self.rx.frames().recv_deadline(deadline)
        };
        let f = match got {
            Ok(f) => f,
            Err(RecvTimeoutError::Timeout) => return Err(Failure::new(RdaqStatus::Timeout, format!("no frame within {timeout_ms} ms"))),
            Err(RecvTimeoutError::Disconnected) => return Err(Failure::new(RdaqStatus::Finished, "the receiver has finished: no more frames")),
        };
        let (data, len) = match self.rx.data(&f) {
            Ok(d) => (d.as_ptr(), d.len()),
            Err(_) => (std::ptr::null(), 0),
        };
        let status = match f.status() {
            FrameStatus::Complete => 0,
            FrameStatus::Incomplete => 1,
            FrameStatus::Discarded => 2,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = RdaqFrame { id, number: f.frame(), status, data, len, modules: self.modules, missing_cells: f.missing().len() as u32 };
        lock(&self.held).insert(id, f);
        Ok(frame)
    }

    fn unknown(id: u64) -> Failure {
        Failure::new(RdaqStatus::BadFrame, format!("frame id {id}: not held (never handed out, or released already)"))
    }

    pub fn release(&self, id: u64) -> Result<(), Failure> {
        let f = lock(&self.held).remove(&id).ok_or_else(|| Self::unknown(id))?;
        self.rx.release(f).expect("a frame of this receiver");
        Ok(())
    }

    /// One byte per pixel of frame `id`: 1 where its datagram never arrived.
    pub fn missing(&self, id: u64, out: &mut [u8]) -> Result<(), Failure> {
        let held = lock(&self.held);
        let f = held.get(&id).ok_or_else(|| Self::unknown(id))?;
        let pixels = self.rx.grid().frame_pixels();
        if out.len() < pixels {
            return Err(Failure::new(RdaqStatus::Buffer, format!("mask: {} bytes, the frame has {pixels} pixels", out.len())));
        }
        self.rx.missing_mask(f, out).expect("a frame of this receiver");
        Ok(())
    }

    pub fn counters(&self) -> RdaqCounters {
        let c = self.rx.counters();
        RdaqCounters {
            datagrams: c.datagrams,
            placed: c.placed,
            bytes_placed: c.bytes_placed,
            frames_complete: c.frames_complete,
            frames_incomplete: c.frames_incomplete,
            frames_discarded: c.frames_discarded,
            frames_refused: c.frames_refused,
            dropped: c.dropped_total(),
            nacks_sent: c.nacks_sent,
            placed_retransmitted: c.placed_retransmitted,
            frames_recovered: c.frames_recovered,
        }
    }
}
