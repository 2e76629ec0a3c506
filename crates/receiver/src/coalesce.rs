//! When the receive thread reads next. Every wake-up of a thread costs CPU of its own (on a
//! virtual machine tens of microseconds, more than receiving a packet), so the thread reads
//! in rounds: when a round found data and frames are in progress, it sleeps and lets the next
//! datagrams gather in the socket buffer; when it found none, or every frame is complete, it
//! waits until something arrives. The sleep adapts so that a round finds about the target
//! given to [`Coalesce::new`] (in datagrams). A detector at 100 frames/s is read in about two
//! rounds per frame (the wake-up at its first datagram, one after a sleep), one at kHz rates
//! about every millisecond, and a stream faster than one round can take without sleeping.

use std::time::Duration;

/// What the receive thread does after a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Read again at once: a socket had more waiting than one round takes.
    Now,
    /// Sleep this long, then read what gathered.
    Sleep(Duration),
    /// Nothing came: wait until a socket is readable.
    Idle,
}

#[derive(Clone, Debug)]
pub struct Coalesce {
    min: Duration,
    max: Duration,
    target: usize,
    sleep: Duration,
    /// The round just ended followed a sleep of ours (so its yield measures the rate).
    after_sleep: bool,
}

impl Coalesce {
    /// Sleeps between `min` and `max` (a zero `max`: never sleep), aiming at `target`
    /// datagrams a round.
    pub fn new(min: Duration, max: Duration, target: usize) -> Coalesce {
        let min = min.min(max);
        Coalesce { min, max, target: target.max(1), sleep: min, after_sleep: false }
    }

    /// After a round that read `got` datagrams; `more` when a socket still had data,
    /// `busy` when frames are in progress (more of them is due). A round that completed
    /// every frame goes idle at once: at low frame rates each frame is then read soon after
    /// it arrived (while its bytes are still in the caches), in two rounds.
    pub fn next(&mut self, got: usize, more: bool, busy: bool) -> Next {
        if self.after_sleep {
            // the round after a sleep tells how fast data comes: sleep longer when it found
            // few datagrams (or none: the stream paused), shorter when it found many
            if got < self.target / 2 {
                self.sleep = (self.sleep * 2).min(self.max);
            } else if got > 2 * self.target {
                self.sleep = (self.sleep / 2).max(self.min);
            }
        }
        self.after_sleep = false;
        if more {
            return Next::Now;
        }
        if got == 0 || !busy || self.max.is_zero() {
            return Next::Idle;
        }
        self.after_sleep = true;
        Next::Sleep(self.sleep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_slow_stream_is_read_about_once_per_target() {
        let mut c = Coalesce::new(MS, 10 * MS, 128);
        // a frame of 128 datagrams every 10 ms: the first datagram wakes the thread
        assert_eq!(c.next(1, false, true), Next::Sleep(MS));
        assert_eq!(c.next(127, false, true), Next::Sleep(MS), "a good round keeps the sleep");
        assert_eq!(c.next(0, false, true), Next::Idle, "the pause makes the next sleep longer");
        assert_eq!(c.next(1, false, true), Next::Sleep(2 * MS));
        for _ in 0..4 {
            c.next(0, false, true);
            c.next(1, false, true);
        }
        assert_eq!(c.next(128, false, true), Next::Sleep(10 * MS), "bounded by the maximum");
    }

    #[test]
    fn a_fast_stream_sleeps_less_and_a_flood_not_at_all() {
        let mut c = Coalesce::new(MS, 10 * MS, 128);
        c.next(1, false, true);
        c.next(0, false, true);
        c.next(1, false, true);
        assert_eq!(c.next(1000, false, true), Next::Sleep(MS), "halved, down to the minimum");
        assert_eq!(c.next(5000, true, true), Next::Now);
        assert_eq!(Coalesce::new(MS, Duration::ZERO, 128).next(5, false, true), Next::Idle, "a zero maximum never sleeps");
    }

    #[test]
    fn a_round_that_completed_every_frame_goes_idle() {
        let mut c = Coalesce::new(MS, 10 * MS, 128);
        assert_eq!(c.next(1, false, true), Next::Sleep(MS));
        assert_eq!(c.next(127, false, false), Next::Idle);
    }
}
