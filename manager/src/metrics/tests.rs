//! The page read back with a Prometheus text parser (prometheus-parse).

use std::collections::BTreeMap;

use ironhorn_proto::engine::{MetricsResponse, OpMetrics};
use prometheus_parse::Value as Parsed;

use super::families::{self, Scrape};
use super::rates::Delta;
use crate::crd::*;

fn parse(page: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_string()))).expect("the page parses")
}

/// The value of the sample `name` whose labels include `labels`.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(found.len(), 1, "one {name} {labels:?}, found {found:?}");
    match &found[0].value {
        Parsed::Gauge(v) | Parsed::Counter(v) | Parsed::Untyped(v) => *v,
        other => panic!("{name}: not a number: {other:?}"),
    }
}

fn scrape() -> Scrape {
    let mut v = Volume::new(
        "v1",
        VolumeSpec {
            size: 1 << 30,
            number_of_replicas: 2,
            pvc_name: "data".into(),
            pvc_namespace: "db".into(),
            ..Default::default()
        },
    );
    v.status = Some(VolumeStatus {
        state: "attached".into(),
        robustness: "degraded".into(),
        current_node_id: "n-1".into(),
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
    let mut e = Engine::new("v1-e", EngineSpec { volume_name: "v1".into(), ..Default::default() });
    e.status = Some(EngineStatus {
        replica_mode_map: [("v1-r-a".to_string(), "RW".to_string()), ("v1-r-b".to_string(), "WO".to_string())].into(),
        rebuild_progress: [(
            "v1-r-b".to_string(),
            RebuildProgress {
                state: "running".into(),
                method: "dirty-map".into(),
                copied_bytes: 100 << 20,
                total_bytes: 400 << 20,
                started_at: "2026-12-05T10:00:00Z".into(),
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    });
    let replica = |name: &str, node: &str| {
        Replica::new(name, ReplicaSpec { volume_name: "v1".into(), node_id: node.into(), ..Default::default() })
    };
    let mut node = Node::new("n-1", NodeSpec::default());
    node.spec
        .disks
        .insert("disk-1".into(), DiskSpec { path: "lvm:vg".into(), storage_reserved: 1 << 20, ..Default::default() });
    node.status = Some(NodeStatus {
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Heartbeat".into(),
            ..Default::default()
        }],
        disk_status: [(
            "disk-1".to_string(),
            DiskStatus {
                storage_maximum: 10 << 30,
                storage_available: 6 << 30,
                storage_scheduled: 2 << 30,
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    });
    let im = InstanceManager::new("im-n-1", InstanceManagerSpec { node_id: "n-1".into(), address: "x".into() });
    Scrape {
        volumes: vec![v],
        nodes: vec![node],
        engines: vec![e],
        replicas: vec![replica("v1-r-a", "n-1"), replica("v1-r-b", "n-2")],
        instance_managers: vec![im],
        engine_answers: BTreeMap::from([("v1".to_string(), Ok(m)), ("v\"2".to_string(), Err("down".to_string()))]),
        // 2 s: 200 reads and 100 writes, 800 KiB read, 400 KiB written,
        // 200 µs per read and 1 ms per write.
        io: BTreeMap::from([(
            "v1".to_string(),
            Delta { seconds: 2.0, counters: vec![200, 100, 800 << 10, 400 << 10, 200 * 200_000, 100 * 1_000_000] },
        )]),
        replica_used: BTreeMap::from([("v1-r-a".to_string(), 300 << 20), ("v1-r-b".to_string(), 100 << 20)]),
        im_usage: BTreeMap::from([(
            "im-n-1".to_string(),
            (Some(Delta { seconds: 2.0, counters: vec![500] }), 64 << 20),
        )]),
        passes: (42, 1.5),
        now: "2026-12-05T10:00:10Z".parse().unwrap(),
    }
}

#[test]
fn longhorns_names_and_labels_read_back_through_a_prometheus_parser() {
    let page = super::encode::text(families::families(&scrape()));
    let p = parse(&page);
    let vol = [("volume", "v1"), ("node", "n-1"), ("pvc", "data"), ("pvc_namespace", "db")];
    assert_eq!(value(&p, "ironhorn_volume_capacity_bytes", &vol), (1u64 << 30) as f64);
    assert_eq!(value(&p, "ironhorn_volume_state", &vol), 2.0, "attached");
    assert_eq!(value(&p, "ironhorn_volume_robustness", &vol), 2.0, "degraded");
    assert_eq!(value(&p, "ironhorn_volume_read_iops", &vol), 100.0);
    assert_eq!(value(&p, "ironhorn_volume_write_iops", &vol), 50.0);
    assert_eq!(value(&p, "ironhorn_volume_read_throughput", &vol), (400 << 10) as f64);
    assert_eq!(value(&p, "ironhorn_volume_write_throughput", &vol), (200 << 10) as f64);
    assert_eq!(value(&p, "ironhorn_volume_read_latency", &vol), 200_000.0);
    assert_eq!(value(&p, "ironhorn_volume_write_latency", &vol), 1_000_000.0);
    // Each replica's use, on its own node.
    let actual = |node| value(&p, "ironhorn_volume_actual_size_bytes", &[("volume", "v1"), ("node", node)]);
    assert_eq!(actual("n-1"), (300u64 << 20) as f64);
    assert_eq!(actual("n-2"), (100u64 << 20) as f64);

    assert_eq!(value(&p, "ironhorn_node_count_total", &[]), 1.0);
    assert_eq!(value(&p, "ironhorn_manager_reconcile_passes_total", &[]), 42.0);
    assert_eq!(value(&p, "ironhorn_manager_reconcile_seconds_total", &[]), 1.5);
    let ready = [("node", "n-1"), ("condition", "ready"), ("condition_reason", "Heartbeat")];
    assert_eq!(value(&p, "ironhorn_node_status", &ready), 1.0);
    assert_eq!(value(&p, "ironhorn_node_storage_capacity_bytes", &[("node", "n-1")]), (10u64 << 30) as f64);
    assert_eq!(value(&p, "ironhorn_node_storage_usage_bytes", &[("node", "n-1")]), (4u64 << 30) as f64);
    assert_eq!(value(&p, "ironhorn_node_storage_reservation_bytes", &[("node", "n-1")]), (1u64 << 20) as f64);
    let disk = [("node", "n-1"), ("disk", "disk-1")];
    assert_eq!(value(&p, "ironhorn_disk_capacity_bytes", &disk), (10u64 << 30) as f64);
    assert_eq!(value(&p, "ironhorn_disk_usage_bytes", &disk), (4u64 << 30) as f64);
    assert_eq!(value(&p, "ironhorn_disk_reservation_bytes", &disk), (1u64 << 20) as f64);
    assert_eq!(value(&p, "ironhorn_disk_storage_scheduled_bytes", &disk), (2u64 << 30) as f64);
    let im = [("instance_manager", "im-n-1"), ("node", "n-1")];
    assert_eq!(value(&p, "ironhorn_instance_manager_cpu_usage_millicpu", &im), 250.0);
    assert_eq!(value(&p, "ironhorn_instance_manager_memory_usage_bytes", &im), (64u64 << 20) as f64);

    // The rebuild: a quarter done, 100 MiB in 10 s.
    let rebuild = [("volume", "v1"), ("replica", "v1-r-b"), ("node", "n-2")];
    assert_eq!(value(&p, "ironhorn_replica_rebuild_progress_percent", &rebuild), 25.0);
    assert_eq!(value(&p, "ironhorn_replica_rebuild_rate_bytes_per_second", &rebuild), (10u64 << 20) as f64);
    assert_eq!(value(&p, "ironhorn_replica_mode", &[("replica", "v1-r-a")]), 1.0);
    assert_eq!(value(&p, "ironhorn_replica_mode", &[("replica", "v1-r-b")]), 2.0);

    // ironhorn's own counters and histogram; an engine that did not answer.
    assert_eq!(value(&p, "ironhorn_volume_metrics_up", &[("volume", "v1")]), 1.0);
    // The label's quote is escaped on the page (the parser keeps escapes
    // as written, so the line itself is checked).
    assert!(page.lines().any(|l| l == r#"ironhorn_volume_metrics_up{volume="v\"2"} 0"#), "{page}");
    let read = [("volume", "v1"), ("op", "read")];
    assert_eq!(value(&p, "ironhorn_volume_requests_total", &read), 5.0);
    assert_eq!(value(&p, "ironhorn_volume_request_errors_total", &read), 1.0);
    assert_eq!(value(&p, "ironhorn_volume_bytes_total", &read), 16384.0);
    assert_eq!(value(&p, "ironhorn_volume_bad_blocks_found_total", &[("volume", "v1")]), 3.0);
    assert_eq!(value(&p, "ironhorn_volume_bad_blocks_repaired_total", &[("volume", "v1")]), 2.0);
    let histogram = p
        .samples
        .iter()
        .find(|s| s.metric == "ironhorn_volume_request_duration_seconds" && s.labels.get("op") == Some("read"))
        .unwrap_or_else(|| panic!("no histogram in\n{page}"));
    let Parsed::Histogram(buckets) = &histogram.value else { panic!("not a histogram: {histogram:?}") };
    let cumulative: Vec<(f64, f64)> = buckets.iter().map(|b| (b.less_than, b.count)).collect();
    assert_eq!(cumulative, vec![(0.0001, 3.0), (0.001, 4.0), (f64::INFINITY, 5.0)]);
    assert!(page.contains("ironhorn_volume_request_duration_seconds_sum{volume=\"v1\",op=\"read\"} 0.0025"), "{page}");
    assert!(page.contains("ironhorn_volume_request_duration_seconds_count{volume=\"v1\",op=\"read\"} 5"), "{page}");
    // Every family says what it is.
    for name in ["ironhorn_volume_capacity_bytes", "ironhorn_volume_requests_total", "ironhorn_node_status"] {
        assert!(p.docs.contains_key(name), "no HELP for {name}");
    }
}

#[test]
fn a_detached_volume_has_no_io_figures_and_no_engine_counters() {
    let mut s = scrape();
    s.io.clear();
    s.engine_answers.clear();
    let p = parse(&super::encode::text(families::families(&s)));
    assert!(!p.samples.iter().any(|x| x.metric == "ironhorn_volume_read_iops"));
    assert!(!p.samples.iter().any(|x| x.metric == "ironhorn_volume_requests_total"));
    assert_eq!(value(&p, "ironhorn_volume_capacity_bytes", &[("volume", "v1")]), (1u64 << 30) as f64);
}
