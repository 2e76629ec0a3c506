//! When the first datagram of each recent frame went out: the start of a frame's latency,
//! read by a receiver in the same process (`rdaq run`) to time each frame end to end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Frames remembered: a frame's entry is overwritten this many frames later.
pub const FRAMES_KEPT: usize = 8192;

/// Per-frame send times, lock-free: the first module to start a frame stamps it.
pub struct SendClock {
    epoch: Instant,
    /// Frame number + 1 whose time the entry holds (0: none).
    tags: Box<[AtomicU64]>,
    /// Nanoseconds after `epoch`.
    ns: Box<[AtomicU64]>,
}

impl Default for SendClock {
    fn default() -> Self {
        SendClock { epoch: Instant::now(), tags: (0..FRAMES_KEPT).map(|_| AtomicU64::new(0)).collect(), ns: (0..FRAMES_KEPT).map(|_| AtomicU64::new(0)).collect() }
    }
}

impl SendClock {
    /// Notes that frame `frame` starts going out now, unless a module already did.
    pub fn mark(&self, frame: u64) {
        let i = (frame % FRAMES_KEPT as u64) as usize;
        if self.tags[i].load(Ordering::Acquire) == frame + 1 {
            return;
        }
        self.ns[i].store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.tags[i].store(frame + 1, Ordering::Release);
    }

    /// When frame `frame` started going out, if it is still remembered.
    pub fn sent(&self, frame: u64) -> Option<Instant> {
        let i = (frame % FRAMES_KEPT as u64) as usize;
        (self.tags[i].load(Ordering::Acquire) == frame + 1).then(|| self.epoch + Duration::from_nanos(self.ns[i].load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_keeps_its_first_stamp_until_overwritten() {
        let c = SendClock::default();
        assert_eq!(c.sent(5), None);
        c.mark(5);
        let t = c.sent(5).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        c.mark(5);
        assert_eq!(c.sent(5), Some(t), "the second module does not move the stamp");
        c.mark(5 + FRAMES_KEPT as u64);
        assert_eq!(c.sent(5), None, "overwritten by a frame FRAMES_KEPT later");
    }
}
