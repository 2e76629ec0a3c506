//! `/metrics` in the Prometheus text format, encoded by `prometheus-client`: the daemon's
//! counters and gauges as they are at the scrape (snapshots of what the receive thread
//! publishes), families with a label per reason or step, and latency histograms.

use std::fmt;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use rdaq_receiver::Counters;
use rdaq_run::board::Board;

/// Upper bounds, in seconds, of the latency histograms' buckets.
pub const LATENCY_BOUNDS: [f64; 14] = [1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// One scrape's metrics, all named `rdaq_*` and labelled with the daemon.
pub struct Scrape {
    registry: Registry,
}

impl Scrape {
    /// Metrics labelled `label="value"` (e.g. `receiver="dr0"`).
    pub fn new(label: &'static str, value: &str) -> Scrape {
        Scrape { registry: Registry::with_prefix_and_labels("rdaq", [(label.into(), value.to_string().into())].into_iter()) }
    }

    /// A counter; `name` without `_total`, which the encoder adds.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.registry.register(name, help, ConstCounter::new(value));
    }

    pub fn gauge(&mut self, name: &str, help: &str, value: i64) {
        self.registry.register(name, help, ConstGauge::new(value));
    }

    /// Counters that differ by one label (`reason`, `step`, ...).
    pub fn counters_by(&mut self, name: &str, help: &str, label: &'static str, values: Vec<(String, u64)>) {
        self.registry.register(name, help, CounterFamily { label, values });
    }

    /// Histograms that differ by one label: per label value, the counts per bucket of
    /// `bounds` (not cumulative, one more for +Inf), the count and the sum.
    pub fn histograms_by(&mut self, name: &str, help: &str, label: &'static str, bounds: &[f64], values: Vec<HistogramValue>) {
        self.registry.register(name, help, HistogramFamily { label, bounds: bounds.to_vec(), values });
    }

    /// A receiver's counters `c`, its drops by reason, the ring's occupancy, and its
    /// acquisition's processing counts and latency (from `board`).
    pub fn receiver(&mut self, c: &Counters, board: &Board) {
        for f in &rdaq_receiver::counters::FIELDS {
            self.counter(f.name, f.help, (f.get)(c));
        }
        let drops = rdaq_receiver::DropReason::ALL.iter().map(|r| (r.name().to_string(), c.dropped(*r))).collect();
        self.counters_by("dropped", "Datagrams dropped, by reason", "reason", drops);
        if let Some(p) = crate::dashboard::process_view(board) {
            self.counter("process_dark_frames", "Dark frames the processing tracked the pedestal on (this acquisition)", p.dark_frames);
            self.counter("process_signal_frames", "Signal frames processed (this acquisition)", p.signal_frames);
            self.counter("process_hits", "Signal frames with enough Bragg spots to be hits (this acquisition)", p.hits);
            self.counter("process_vetoed", "Signal frames not written by the hit veto (this acquisition)", p.vetoed);
            self.counter("process_spots", "Bragg spots found (this acquisition)", p.spots_found);
            self.counter("process_pedestal_updates", "Tracked pedestals published to the converters (this acquisition)", p.pedestal_updates);
            self.counter("process_device_errors", "GPU errors; the GPU backend then processes on the CPU (this acquisition)", p.device_errors);
        }
        let (handed, waits) = rdaq_sink::deferred::counters();
        self.counter("writer_chunks_handed_on", "Data-file chunks written out by the writers' I/O threads (since the process started)", handed);
        self.counter("writer_io_waits", "Times a writer waited for a place among the chunk writes in flight of a data file, or in the I/O threads' queue (since the process started)", waits);
        self.counter("consumer_buffer_waits", "Times the consumer waited for a free frame buffer: back-pressure from its workers and the writer (this acquisition)", board.buffer_waits());
        self.gauge("ring_slots", "Frame slots of the receiver's ring", c.slots.into());
        self.gauge("ring_slots_filling", "Ring slots being filled by the receive thread", c.slots_filling.into());
        self.gauge("ring_slots_handed", "Ring slots held by the consumer (processing, writing)", c.slots_handed.into());
        let steps = board.latency().buckets(&LATENCY_BOUNDS);
        let hist = steps.into_iter().map(|b| HistogramValue { label: b.label.into(), counts: b.counts, count: b.count, sum: b.sum_s }).collect();
        self.histograms_by("frame_latency_seconds", "Per-frame latency of each step (received, complete, processed, written) of the current or last acquisition", "step", &LATENCY_BOUNDS, hist);
    }

    /// The scrape as `GET /metrics` answers it.
    pub fn answer(&self) -> ([(axum::http::HeaderName, &'static str); 1], String) {
        ([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], self.encode())
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String does not fail");
        out
    }
}

#[derive(Debug)]
struct CounterFamily {
    label: &'static str,
    values: Vec<(String, u64)>,
}

impl EncodeMetric for CounterFamily {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for (l, v) in &self.values {
            let labels = [(self.label, l.as_str())];
            encoder.encode_family(&labels)?.encode_counter::<NoLabelSet, _, u64>(v, None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// One histogram of a [`Scrape::histograms_by`] family.
#[derive(Clone, Debug)]
pub struct HistogramValue {
    pub label: String,
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

#[derive(Debug)]
struct HistogramFamily {
    label: &'static str,
    bounds: Vec<f64>,
    values: Vec<HistogramValue>,
}

impl EncodeMetric for HistogramFamily {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for h in &self.values {
            let buckets: Vec<(f64, u64)> = self.bounds.iter().copied().chain([f64::INFINITY]).zip(h.counts.iter().copied()).collect();
            let labels = [(self.label, h.label.as_str())];
            encoder.encode_family(&labels)?.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_families_and_histograms_encode_with_escaped_labels() {
        let mut s = Scrape::new("receiver", "dr\"0\\\n");
        s.counter("placed", "Datagrams placed", 7);
        s.gauge("slots_handed", "Slots held by the consumer", 3);
        s.counters_by("dropped", "Datagrams dropped, by reason", "reason", vec![("bad_key".into(), 2), ("stale".into(), 0)]);
        s.histograms_by("latency_seconds", "Latency", "step", &[0.001, 0.01], vec![HistogramValue { label: "a".into(), counts: vec![1, 2, 3], count: 6, sum: 0.5 }]);
        let text = s.encode();
        let l = r#"receiver="dr\"0\\\n""#;
        for line in [
            format!("# TYPE rdaq_placed counter\nrdaq_placed_total{{{l}}} 7"),
            format!("rdaq_slots_handed{{{l}}} 3"),
            format!("rdaq_dropped_total{{{l},reason=\"bad_key\"}} 2"),
            format!("rdaq_latency_seconds_bucket{{{l},le=\"0.01\",step=\"a\"}} 3"),
            format!("rdaq_latency_seconds_bucket{{{l},le=\"+Inf\",step=\"a\"}} 6"),
            format!("rdaq_latency_seconds_count{{{l},step=\"a\"}} 6"),
        ] {
            assert!(text.contains(&line), "{line}\nin\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
