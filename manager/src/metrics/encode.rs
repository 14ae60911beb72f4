//! Metric families written in Prometheus' text format (0.0.4) by
//! prometheus-client: its encoder escapes label values, names the counter
//! and histogram series, and writes the HELP and TYPE lines.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::families::{Family, Kind, Value};

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug)]
struct Families(Vec<Family>);

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let kind = match f.kind {
                Kind::Gauge => MetricType::Gauge,
                Kind::Counter => MetricType::Counter,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut metric = encoder.encode_descriptor(f.name, f.help, None, kind)?;
            for (labels, value) in &f.samples {
                let sample = metric.encode_family(labels)?;
                encode_value(sample, f.kind, value)?;
            }
        }
        Ok(())
    }
}

fn encode_value(
    mut m: prometheus_client::encoding::MetricEncoder,
    kind: Kind,
    value: &Value,
) -> Result<(), std::fmt::Error> {
    match (kind, value) {
        (Kind::Counter, Value::Int(v)) => m.encode_counter::<NoLabelSet, _, u64>(&(*v as u64), None),
        (Kind::Counter, Value::Float(v)) => m.encode_counter::<NoLabelSet, _, f64>(v, None),
        (_, Value::Int(v)) => m.encode_gauge(v),
        (_, Value::Float(v)) => m.encode_gauge(v),
        (_, Value::Histogram { sum, count, buckets }) => m.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None),
    }
}

/// The page: every family under the `ironhorn_` prefix.
pub fn text(families: Vec<Family>) -> String {
    let mut registry = Registry::with_prefix("ironhorn");
    registry.register_collector(Box::new(Families(families)));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    out
}
