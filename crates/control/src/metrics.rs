//! `/metrics` in the Prometheus text format, encoded by `prometheus-client`: the daemon's
//! counters and gauges as they are at the scrape (snapshots of what the receive thread
//! publishes), families with a label per reason or step, and latency histograms.

use std::fmt;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

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
