//! Waiting for deadlines with sub-millisecond accuracy: sleep while far away, then spin.

use std::time::{Duration, Instant};

/// Below this distance to the deadline we spin instead of sleeping (timer slack is ~50 us).
const SPIN_BELOW: Duration = Duration::from_micros(200);

/// Blocks until `deadline`; returns at once if it has passed.
pub fn wait_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN_BELOW {
            std::thread::sleep(left - SPIN_BELOW);
        } else {
            std::hint::spin_loop();
        }
    }
}
