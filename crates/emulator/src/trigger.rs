//! The common trigger of an emulated detector. Real modules start every frame on the same
//! trigger signal, so one module never runs ahead of another; emulated modules are threads
//! that a busy machine can hold up one at a time. Each module's RC waits before its frame `i`
//! until every module has finished frame `i - lead - 1`: a module that falls behind holds the
//! others back (and the detector's frames start late, which the report says) instead of
//! drifting away from them, which a receiver would have to take for loss.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// How long a waiting module sleeps before it looks at the stop flag again.
const RECHECK: Duration = Duration::from_millis(5);

pub struct Trigger {
    /// Frames each module has finished (the index of its next frame); `u64::MAX` once it
    /// left (ended or failed), so that it holds nobody back.
    done: Vec<AtomicU64>,
    lead: u64,
    lock: Mutex<()>,
    moved: Condvar,
}

impl Trigger {
    /// A trigger for `modules` modules, none more than `lead` frames ahead of the slowest.
    pub fn new(modules: u16, lead: u64) -> Trigger {
        Trigger { done: (0..modules).map(|_| AtomicU64::new(0)).collect(), lead, lock: Mutex::new(()), moved: Condvar::new() }
    }

    fn slowest(&self) -> u64 {
        self.done.iter().map(|d| d.load(Ordering::Acquire)).min().unwrap_or(u64::MAX)
    }

    /// Whether frame `i` may start: every module has finished the frames before `i - lead`.
    fn ready(&self, i: u64) -> bool {
        self.slowest().saturating_add(self.lead) >= i
    }

    /// Waits until frame `i` (counted from the first frame of the run) may start, or until
    /// `stop`; returns whether it had to wait for a slower module.
    pub fn wait(&self, i: u64, stop: &AtomicBool) -> bool {
        if self.ready(i) {
            return false;
        }
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        while !self.ready(i) && !stop.load(Ordering::Relaxed) {
            guard = self.moved.wait_timeout(guard, RECHECK).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }

    /// Module `m` finished its frame `i`.
    pub fn finished(&self, m: u16, i: u64) {
        self.set(m, i + 1);
    }

    /// Module `m` sends no more frames: it holds nobody back any more.
    pub fn leave(&self, m: u16) {
        self.set(m, u64::MAX);
    }

    fn set(&self, m: u16, done: u64) {
        self.done[m as usize].store(done, Ordering::Release);
        // taking the lock orders the store before a waiter's check and its sleep
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.moved.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn no_module_runs_more_than_lead_frames_ahead() {
        let t = Arc::new(Trigger::new(2, 2));
        let stop = AtomicBool::new(false);
        for i in 0..3 {
            assert!(!t.wait(i, &stop), "frames 0..=2 start at once");
            t.finished(0, i);
        }
        // module 0 wants frame 3: module 1 has finished nothing
        let t2 = t.clone();
        let waiter = std::thread::spawn(move || t2.wait(3, &AtomicBool::new(false)));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!waiter.is_finished(), "held back by module 1");
        t.finished(1, 0);
        assert!(waiter.join().unwrap(), "released, and it says it waited");
        t.leave(1);
        assert!(!t.wait(5, &stop), "a module that left holds nobody back: module 0 has finished 3 frames");
    }

    #[test]
    fn stop_ends_a_wait() {
        let t = Trigger::new(2, 0);
        let stop = AtomicBool::new(true);
        assert!(t.wait(5, &stop));
    }
}
