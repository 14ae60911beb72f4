//! `GET /metrics`: the cluster in Prometheus' text format, for scraping.
//!
//! From the datastore: each volume's size, state and robustness, each
//! replica's mode as its engine last reported it, each disk's maximum /
//! available / reserved / scheduled bytes. From every
//! running engine, asked at scrape time (bounded by [`ENGINE_TIMEOUT`], all
//! at once): its frontend request counters, bytes and latency histogram.
//! An engine that does not answer shows as `ironhorn_volume_metrics_up 0`
//! and the rest of the page is still served.

use std::fmt::Write;
use std::time::Duration;

use futures_util::future::join_all;
use ironhorn_proto::engine::engine_client::EngineClient;
use ironhorn_proto::engine::{MetricsRequest, MetricsResponse};
use kube::ResourceExt;

use crate::crd::{Engine, Node, Volume};
use crate::datastore::{self, Datastore};

pub const ENGINE_TIMEOUT: Duration = Duration::from_secs(2);

/// Longhorn's numbering, so existing dashboards read the same.
fn robustness_value(robustness: &str) -> u8 {
    match robustness {
        "healthy" => 1,
        "degraded" => 2,
        "faulted" => 3,
        _ => 0,
    }
}

fn state_value(state: &str) -> u8 {
    match state {
        "creating" => 1,
        "attached" => 2,
        "detached" => 3,
        "attaching" => 4,
        "detaching" => 5,
        "deleting" => 6,
        _ => 0,
    }
}

fn mode_value(mode: &str) -> u8 {
    match mode {
        "RW" => 1,
        "WO" => 2,
        "ERR" => 3,
        _ => 0,
    }
}

/// A label value with `\`, `"` and newlines escaped, as the format asks.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// What one engine answered, for the volume it serves.
pub type EngineMetrics = (String, Result<MetricsResponse, String>);

/// The page, from objects and engine answers already gathered.
pub fn render(volumes: &[Volume], nodes: &[Node], engine_objects: &[Engine], engines: &[EngineMetrics]) -> String {
    let mut out = String::new();
    header(&mut out, "ironhorn_volume_size_bytes", "gauge", "Volume size.");
    for v in volumes {
        let _ = writeln!(out, "ironhorn_volume_size_bytes{{volume=\"{}\"}} {}", label(&v.name_any()), v.spec.size);
    }
    header(
        &mut out,
        "ironhorn_volume_state",
        "gauge",
        "Volume state: 1 creating, 2 attached, 3 detached, 4 attaching, 5 detaching, 6 deleting, 0 other.",
    );
    header(
        &mut out,
        "ironhorn_volume_robustness",
        "gauge",
        "Volume robustness: 1 healthy, 2 degraded, 3 faulted, 0 unknown.",
    );
    for v in volumes {
        let status = v.status.clone().unwrap_or_default();
        let name = label(&v.name_any());
        let _ = writeln!(out, "ironhorn_volume_state{{volume=\"{name}\"}} {}", state_value(&status.state));
        let _ =
            writeln!(out, "ironhorn_volume_robustness{{volume=\"{name}\"}} {}", robustness_value(&status.robustness));
    }
    let integrity: [(&str, &str, fn(&crate::crd::VolumeStatus) -> u64); 4] = [
        (
            "ironhorn_volume_bad_blocks_found_total",
            "Blocks read back failing their checksum on a replica, as the running engine counts them.",
            |s| s.bad_blocks_found,
        ),
        (
            "ironhorn_volume_bad_blocks_repaired_total",
            "Bad blocks rewritten in place from a healthy replica, as the running engine counts them.",
            |s| s.bad_blocks_repaired,
        ),
        ("ironhorn_volume_scrub_checked_bytes", "Bytes the last (or running) scrub read back.", |s| {
            s.scrub.checked_bytes
        }),
        ("ironhorn_volume_scrub_bad_blocks", "Bad blocks the last (or running) scrub found.", |s| s.scrub.bad_blocks),
    ];
    for (metric, help, value) in integrity {
        let kind = if metric.ends_with("_total") { "counter" } else { "gauge" };
        header(&mut out, metric, kind, help);
        for v in volumes {
            let status = v.status.clone().unwrap_or_default();
            let _ = writeln!(out, "{metric}{{volume=\"{}\"}} {}", label(&v.name_any()), value(&status));
        }
    }
    header(
        &mut out,
        "ironhorn_replica_mode",
        "gauge",
        "Replica mode as its engine last reported it: 1 RW, 2 WO (rebuilding), 3 ERR, 0 other.",
    );
    for e in engine_objects {
        for (replica, mode) in e.status.as_ref().map(|s| &s.replica_mode_map).into_iter().flatten() {
            let _ = writeln!(
                out,
                "ironhorn_replica_mode{{volume=\"{}\",replica=\"{}\"}} {}",
                label(&e.spec.volume_name),
                label(replica),
                mode_value(mode)
            );
        }
    }
    let disk_gauges: [(&str, &str, fn(&crate::crd::DiskStatus, u64) -> u64); 4] = [
        ("ironhorn_disk_storage_maximum_bytes", "Disk size as measured.", |d, _| d.storage_maximum),
        ("ironhorn_disk_storage_available_bytes", "Disk space free as measured.", |d, _| d.storage_available),
        ("ironhorn_disk_storage_reserved_bytes", "Disk space kept from scheduling.", |_, reserved| reserved),
        ("ironhorn_disk_storage_scheduled_bytes", "Volume bytes of the replicas placed on the disk.", |d, _| {
            d.storage_scheduled
        }),
    ];
    for (name, help, value) in disk_gauges {
        header(&mut out, name, "gauge", help);
        for n in nodes {
            let status = n.status.clone().unwrap_or_default();
            for (disk, spec) in &n.spec.disks {
                let d = status.disk_status.get(disk).cloned().unwrap_or_default();
                let _ = writeln!(
                    out,
                    "{name}{{node=\"{}\",disk=\"{}\"}} {}",
                    label(&n.name_any()),
                    label(disk),
                    value(&d, spec.storage_reserved)
                );
            }
        }
    }
    header(&mut out, "ironhorn_volume_metrics_up", "gauge", "1 when the volume's engine answered this scrape.");
    for (volume, answer) in engines {
        let _ = writeln!(out, "ironhorn_volume_metrics_up{{volume=\"{}\"}} {}", label(volume), answer.is_ok() as u8);
    }
    let answered: Vec<(&String, &MetricsResponse)> =
        engines.iter().filter_map(|(v, a)| a.as_ref().ok().map(|m| (v, m))).collect();
    let counters: [(&str, &str, fn(&ironhorn_proto::engine::OpMetrics) -> u64); 3] = [
        ("ironhorn_volume_requests_total", "Frontend requests completed, failed ones included.", |o| o.requests),
        ("ironhorn_volume_request_errors_total", "Frontend requests that failed.", |o| o.errors),
        ("ironhorn_volume_bytes_total", "Bytes of the frontend requests that succeeded.", |o| o.bytes),
    ];
    for (name, help, value) in counters {
        header(&mut out, name, "counter", help);
        for (volume, m) in &answered {
            for o in &m.ops {
                let _ = writeln!(out, "{name}{{volume=\"{}\",op=\"{}\"}} {}", label(volume), label(&o.op), value(o));
            }
        }
    }
    let name = "ironhorn_volume_request_duration_seconds";
    header(&mut out, name, "histogram", "Frontend request latency in the engine.");
    for (volume, m) in &answered {
        for o in &m.ops {
            let labels = format!("volume=\"{}\",op=\"{}\"", label(volume), label(&o.op));
            for (bound, count) in m.latency_bounds_us.iter().zip(&o.latency_buckets) {
                let le = *bound as f64 / 1e6;
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {count}");
            }
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", o.requests);
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", o.latency_ns_total as f64 / 1e9);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}", o.requests);
        }
    }
    out
}

async fn engine_metrics(address: String) -> Result<MetricsResponse, String> {
    let ask = async {
        let mut client = EngineClient::connect(format!("http://{address}")).await.map_err(|e| e.to_string())?;
        client.metrics(MetricsRequest {}).await.map(|r| r.into_inner()).map_err(|s| s.message().to_string())
    };
    tokio::time::timeout(ENGINE_TIMEOUT, ask).await.map_err(|_| format!("no answer within {ENGINE_TIMEOUT:?}"))?
}

/// Gathers everything and renders the page.
pub async fn gather<D: Datastore>(store: &D) -> Result<String, datastore::Error> {
    let volumes = store.list::<Volume>().await?;
    let nodes = store.list::<Node>().await?;
    let engine_objects = store.list::<Engine>().await?;
    let running: Vec<(String, String)> = engine_objects
        .iter()
        .filter_map(|e| {
            let status = e.status.as_ref()?;
            (status.current_state == "running" && !status.address.is_empty())
                .then(|| (e.spec.volume_name.clone(), status.address.clone()))
        })
        .collect();
    let answers = join_all(running.iter().map(|(_, address)| engine_metrics(address.clone()))).await;
    let engines: Vec<EngineMetrics> = running.into_iter().map(|(v, _)| v).zip(answers).collect();
    Ok(render(&volumes, &nodes, &engine_objects, &engines))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironhorn_proto::engine::OpMetrics;

    #[test]
    fn renders_counters_histograms_and_unreachable_engines() {
        let mut v = Volume::new("v1", Default::default());
        v.spec.size = 1 << 30;
        v.status = Some(crate::crd::VolumeStatus {
            state: "attached".into(),
            robustness: "degraded".into(),
            bad_blocks_found: 3,
            bad_blocks_repaired: 2,
            ..Default::default()
        });
        let m = MetricsResponse {
            volume: "v1".into(),
            latency_bounds_us: vec![100, 1000],
            ops: vec![OpMetrics {
                op: "read".into(),
                requests: 5,
                errors: 1,
                bytes: 16384,
                latency_ns_total: 2_500_000,
                latency_buckets: vec![3, 4],
            }],
        };
        let mut e = Engine::new("v1-e", Default::default());
        e.spec.volume_name = "v1".into();
        e.status = Some(crate::crd::EngineStatus {
            replica_mode_map: [("v1-r-a".to_string(), "RW".to_string()), ("v1-r-b".to_string(), "ERR".to_string())]
                .into(),
            ..Default::default()
        });
        let page = render(&[v], &[], &[e], &[("v1".into(), Ok(m)), ("v\"2".into(), Err("down".into()))]);
        for line in [
            "ironhorn_volume_size_bytes{volume=\"v1\"} 1073741824",
            "ironhorn_volume_state{volume=\"v1\"} 2",
            "ironhorn_volume_robustness{volume=\"v1\"} 2",
            "ironhorn_volume_bad_blocks_found_total{volume=\"v1\"} 3",
            "ironhorn_volume_bad_blocks_repaired_total{volume=\"v1\"} 2",
            "ironhorn_volume_metrics_up{volume=\"v1\"} 1",
            "ironhorn_replica_mode{volume=\"v1\",replica=\"v1-r-a\"} 1",
            "ironhorn_replica_mode{volume=\"v1\",replica=\"v1-r-b\"} 3",
            "ironhorn_volume_metrics_up{volume=\"v\\\"2\"} 0",
            "ironhorn_volume_requests_total{volume=\"v1\",op=\"read\"} 5",
            "ironhorn_volume_request_errors_total{volume=\"v1\",op=\"read\"} 1",
            "ironhorn_volume_bytes_total{volume=\"v1\",op=\"read\"} 16384",
            "ironhorn_volume_request_duration_seconds_bucket{volume=\"v1\",op=\"read\",le=\"0.0001\"} 3",
            "ironhorn_volume_request_duration_seconds_bucket{volume=\"v1\",op=\"read\",le=\"0.001\"} 4",
            "ironhorn_volume_request_duration_seconds_bucket{volume=\"v1\",op=\"read\",le=\"+Inf\"} 5",
            "ironhorn_volume_request_duration_seconds_sum{volume=\"v1\",op=\"read\"} 0.0025",
            "ironhorn_volume_request_duration_seconds_count{volume=\"v1\",op=\"read\"} 5",
        ] {
            assert!(page.lines().any(|l| l == line), "missing {line:?} in\n{page}");
        }
        // Every sample line belongs to a metric announced by a TYPE line.
        let typed: Vec<&str> = page.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
        for l in page.lines().filter(|l| !l.starts_with('#')) {
            let metric = l.split(['{', ' ']).next().unwrap();
            let base = ["_bucket", "_sum", "_count"].iter().fold(metric, |m, s| m.strip_suffix(s).unwrap_or(m));
            assert!(typed.contains(&metric) || typed.contains(&base), "untyped sample {l:?}");
        }
    }
}
