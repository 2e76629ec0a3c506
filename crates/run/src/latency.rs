//! Latency per frame, stage by stage (NaNet style): first datagram sent -> first datagram
//! received -> frame complete -> processed -> written (or published). Histograms of each
//! step (hdrhistogram, microsecond resolution) give p50/p99/max for the summary and the JSON
//! summary, and the buckets of `/metrics`' histograms.
//!
//! "Sent" is known where the emulator runs in the same process (`rdaq run`): the first
//! module to start a frame stamps it. "Complete" is when the receiver finished the frame
//! (all datagrams placed, or given up under the policy). "Processed": conversion, spots and
//! the hit decision done (raw runs: assembled and compressed). Frames that are not written
//! (dark frames, vetoed frames) end at the last step they reached.

use std::time::Instant;

use hdrhistogram::Histogram;
use rdaq_emulator::clock::SendClock;
use rdaq_receiver::FrameReady;
use serde::Serialize;

/// The steps, in order.
pub const STEPS: [&str; 4] = ["sent -> received", "received -> complete", "complete -> processed", "processed -> written"];

/// When one frame passed each point (those it reached).
#[derive(Clone, Copy, Debug)]
pub struct FrameTimes {
    pub sent: Option<Instant>,
    pub received: Instant,
    pub complete: Instant,
    pub processed: Option<Instant>,
}

impl FrameTimes {
    /// The times a finished frame carries, with its send time if `sent` remembers it.
    pub fn of(f: &FrameReady, sent: Option<&SendClock>) -> FrameTimes {
        FrameTimes { sent: sent.and_then(|c| c.sent(f.frame())), received: f.first_datagram(), complete: f.finished(), processed: None }
    }
}

/// The steps as metric labels.
const LABELS: [&str; 4] = ["sent_to_received", "received_to_complete", "complete_to_processed", "processed_to_written"];

/// One step's frames per latency bucket ([`Latency::buckets`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StepBuckets {
    pub label: &'static str,
    /// Frames per bucket, the last one above every bound.
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum_s: f64,
}

/// One histogram per step.
#[derive(Clone, Debug)]
pub struct Latency {
    steps: [Histogram<u64>; 4],
}

impl Default for Latency {
    fn default() -> Self {
        // 1 us to 1 h, 3 significant digits
        let h = || Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
        Latency { steps: [h(), h(), h(), h()] }
    }
}

/// One step's distribution, in microseconds.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StepLatency {
    pub step: &'static str,
    pub frames: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl Latency {
    /// Records the steps frame `t` went through, ending `written` if it was.
    pub fn record(&mut self, t: &FrameTimes, written: Option<Instant>) {
        let points = [t.sent, Some(t.received), Some(t.complete), t.processed, written];
        for (i, h) in self.steps.iter_mut().enumerate() {
            if let (Some(a), Some(b)) = (points[i], points[i + 1]) {
                h.saturating_record(b.saturating_duration_since(a).as_micros().max(1) as u64);
            }
        }
    }

    /// Each step as a histogram over `bounds` (upper bounds in seconds, increasing): the
    /// frames in each bucket (not cumulative), then those above the last bound.
    pub fn buckets(&self, bounds: &[f64]) -> Vec<StepBuckets> {
        LABELS
            .iter()
            .zip(&self.steps)
            .map(|(l, h)| {
                let mut counts = vec![0u64; bounds.len() + 1];
                for v in h.iter_recorded() {
                    let s = v.value_iterated_to() as f64 / 1e6;
                    counts[bounds.partition_point(|b| *b < s)] += v.count_at_value();
                }
                StepBuckets { label: l, counts, count: h.len(), sum_s: h.mean() * h.len() as f64 / 1e6 }
            })
            .collect()
    }

    /// The steps that saw frames.
    pub fn report(&self) -> Vec<StepLatency> {
        STEPS
            .iter()
            .zip(&self.steps)
            .filter(|(_, h)| !h.is_empty())
            .map(|(step, h)| StepLatency { step, frames: h.len(), p50_us: h.value_at_quantile(0.5), p99_us: h.value_at_quantile(0.99), max_us: h.max() })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_step_is_the_time_between_its_points() {
        let t0 = Instant::now();
        let ms = |m| t0 + Duration::from_millis(m);
        let mut l = Latency::default();
        l.record(&FrameTimes { sent: Some(ms(0)), received: ms(1), complete: ms(3), processed: Some(ms(6)) }, Some(ms(10)));
        l.record(&FrameTimes { sent: None, received: ms(0), complete: ms(2), processed: None }, None);
        let r = l.report();
        let by = |s: &str| r.iter().find(|x| x.step == s).unwrap().clone();
        assert_eq!(by("sent -> received").frames, 1);
        assert_eq!(by("received -> complete").frames, 2);
        assert!((1990..=2010).contains(&by("received -> complete").p50_us));
        assert!((2990..=3010).contains(&by("complete -> processed").max_us));
        assert!((3990..=4010).contains(&by("processed -> written").p99_us));
        // the same frames in buckets of 1.5 ms and 3.5 ms
        let b = l.buckets(&[0.0015, 0.0035]);
        assert_eq!(b[1].label, "received_to_complete");
        assert_eq!((b[0].counts.clone(), b[1].counts.clone(), b[2].counts.clone(), b[3].counts.clone()), (vec![1, 0, 0], vec![0, 2, 0], vec![0, 1, 0], vec![0, 0, 1]));
        assert_eq!(b[1].count, 2);
        assert!((b[1].sum_s - 0.004).abs() < 1e-5, "{}", b[1].sum_s);
    }
}
