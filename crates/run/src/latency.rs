//! Latency per frame, stage by stage (NaNet style): first datagram sent -> first datagram
//! received -> frame complete -> processed -> written (or published). Histograms of each
//! step (hdrhistogram, microsecond resolution) give p50/p99/max for the summary, the JSON
//! summary and `/metrics`.
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

/// One step as a Prometheus summary: (quantile, seconds) pairs, count, sum of seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct StepSummary {
    /// The step as a metric label (`received_to_complete`).
    pub label: &'static str,
    pub quantiles: [(f64, f64); 3],
    pub count: u64,
    pub sum_s: f64,
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

    /// Each step as a Prometheus summary.
    pub fn summaries(&self) -> Vec<StepSummary> {
        const LABELS: [&str; 4] = ["sent_to_received", "received_to_complete", "complete_to_processed", "processed_to_written"];
        LABELS
            .iter()
            .zip(&self.steps)
            .filter(|(_, h)| !h.is_empty())
            .map(|(l, h)| {
                let q = |x: f64| (x, h.value_at_quantile(x) as f64 / 1e6);
                StepSummary { label: l, quantiles: [q(0.5), q(0.99), (1.0, h.max() as f64 / 1e6)], count: h.len(), sum_s: h.mean() * h.len() as f64 / 1e6 }
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
    }
}
