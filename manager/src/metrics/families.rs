//! What the `/metrics` page says, as metric families computed from one
//! [`Scrape`] (pure; `encode` writes them out). Longhorn's names and labels
//! under the `ironhorn_` prefix where the meaning is the same, so its
//! dashboards and alerts read ironhorn; ironhorn's own counters and
//! histograms beside them.

use std::collections::BTreeMap;

use ironhorn_proto::engine::{MetricsResponse, OpMetrics};
use kube::ResourceExt;

use super::rates::Delta;
use crate::crd::{Condition, Engine, InstanceManager, Node, Replica, Volume};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    /// Written with a `_total` suffix.
    Counter,
    Histogram,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    /// Per-bucket (not cumulative) counts by upper bound, the last +Inf.
    Histogram {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
}

pub type Labels = Vec<(&'static str, String)>;

#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// Without the `ironhorn_` prefix (and a counter without `_total`).
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub samples: Vec<(Labels, Value)>,
}

/// Everything a scrape gathered.
#[derive(Default)]
pub struct Scrape {
    pub volumes: Vec<Volume>,
    pub nodes: Vec<Node>,
    pub engines: Vec<Engine>,
    pub replicas: Vec<Replica>,
    pub instance_managers: Vec<InstanceManager>,
    /// Volume → what its running engine answered.
    pub engine_answers: BTreeMap<String, Result<MetricsResponse, String>>,
    /// Volume → its engine's counters' change over the last interval, in
    /// [`IO_COUNTERS`] order.
    pub io: BTreeMap<String, Delta>,
    /// Replica → bytes its store holds, as the replica answered.
    pub replica_used: BTreeMap<String, u64>,
    /// Instance manager → its processes' CPU time change (ms) over the
    /// last interval, and their resident memory now.
    pub im_usage: BTreeMap<String, (Option<Delta>, u64)>,
    /// Reconcile passes of this manager process and the seconds they took.
    pub passes: (u64, f64),
    pub now: jiff::Timestamp,
}

/// The engine counters sampled for rates, in this order.
pub const IO_COUNTERS: [&str; 6] =
    ["read requests", "write requests", "read bytes", "write bytes", "read latency ns", "write latency ns"];

/// The counters of [`IO_COUNTERS`] from an engine's answer.
pub fn io_counters(m: &MetricsResponse) -> Vec<u64> {
    let op = |name: &str| m.ops.iter().find(|o| o.op == name).cloned().unwrap_or_default();
    let (r, w) = (op("read"), op("write"));
    vec![r.requests, w.requests, r.bytes, w.bytes, r.latency_ns_total, w.latency_ns_total]
}

/// IOPS, throughput (bytes/s) and latency (ns) of reads and writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IoRates {
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_throughput: f64,
    pub write_throughput: f64,
    pub read_latency_ns: f64,
    pub write_latency_ns: f64,
}

impl IoRates {
    pub fn from_delta(d: &Delta) -> Self {
        IoRates {
            read_iops: d.per_second(0),
            write_iops: d.per_second(1),
            read_throughput: d.per_second(2),
            write_throughput: d.per_second(3),
            read_latency_ns: d.ratio(4, 0),
            write_latency_ns: d.ratio(5, 1),
        }
    }
}

/// Longhorn's numbering, so existing dashboards read the same.
fn robustness_value(robustness: &str) -> i64 {
    match robustness {
        "healthy" => 1,
        "degraded" => 2,
        "faulted" => 3,
        _ => 0,
    }
}

fn state_value(state: &str) -> i64 {
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

fn mode_value(mode: &str) -> i64 {
    match mode {
        "RW" => 1,
        "WO" => 2,
        "ERR" => 3,
        _ => 0,
    }
}

fn family(name: &'static str, kind: Kind, help: &'static str, samples: Vec<(Labels, Value)>) -> Family {
    Family { name, help, kind, samples }
}

fn int(v: u64) -> Value {
    Value::Int(v.min(i64::MAX as u64) as i64)
}

/// Longhorn's volume labels: volume, the node it is attached to, and its
/// claim.
fn volume_labels(v: &Volume) -> Labels {
    let node = v.status.as_ref().map(|s| s.current_node_id.clone()).unwrap_or_default();
    vec![
        ("volume", v.name_any()),
        ("node", node),
        ("pvc", v.spec.pvc_name.clone()),
        ("pvc_namespace", v.spec.pvc_namespace.clone()),
    ]
}

fn conditions(labels: Labels, conditions: &[Condition]) -> impl Iterator<Item = (Labels, Value)> + '_ {
    conditions.iter().map(move |c| {
        let mut l = labels.clone();
        l.push(("condition", c.type_.to_ascii_lowercase()));
        l.push(("condition_reason", c.reason.clone()));
        (l, Value::Int((c.status == "True") as i64))
    })
}

pub fn families(s: &Scrape) -> Vec<Family> {
    let mut out = Vec::new();
    volume_families(s, &mut out);
    replica_families(s, &mut out);
    node_families(s, &mut out);
    instance_manager_families(s, &mut out);
    engine_families(s, &mut out);
    manager_families(s, &mut out);
    out
}

fn manager_families(s: &Scrape, out: &mut Vec<Family>) {
    use Kind::*;
    let (passes, seconds) = s.passes;
    out.push(family(
        "manager_reconcile_passes",
        Counter,
        "Reconcile passes this manager made (over every node and volume).",
        vec![(vec![], int(passes))],
    ));
    out.push(family(
        "manager_reconcile_seconds",
        Counter,
        "Seconds this manager's reconcile passes took.",
        vec![(vec![], Value::Float(seconds))],
    ));
}

fn volume_families(s: &Scrape, out: &mut Vec<Family>) {
    use Kind::*;
    let each = |f: &dyn Fn(&Volume) -> Value| -> Vec<(Labels, Value)> {
        s.volumes.iter().map(|v| (volume_labels(v), f(v))).collect()
    };
    let status = |v: &Volume| v.status.clone().unwrap_or_default();
    out.push(family(
        "volume_capacity_bytes",
        Gauge,
        "Configured size in bytes for this volume.",
        each(&|v| int(v.spec.size)),
    ));
    out.push(family(
        "volume_state",
        Gauge,
        "State of this volume: 1=creating, 2=attached, 3=detached, 4=attaching, 5=detaching, 6=deleting, 0=other.",
        each(&|v| Value::Int(state_value(&status(v).state))),
    ));
    out.push(family(
        "volume_robustness",
        Gauge,
        "Robustness of this volume: 0=unknown, 1=healthy, 2=degraded, 3=faulted.",
        each(&|v| Value::Int(robustness_value(&status(v).robustness))),
    ));
    // Each replica's store use, labelled with the replica's node.
    let actual = s
        .volumes
        .iter()
        .flat_map(|v| {
            s.replicas.iter().filter(move |r| r.spec.volume_name == v.name_any()).filter_map(move |r| {
                let used = s.replica_used.get(&r.name_any())?;
                let mut labels = volume_labels(v);
                labels[1].1 = r.spec.node_id.clone();
                Some((labels, int(*used)))
            })
        })
        .collect();
    out.push(family(
        "volume_actual_size_bytes",
        Gauge,
        "Actual space used by each replica of the volume on the corresponding node.",
        actual,
    ));
    let rates = |f: fn(&IoRates) -> f64| -> Vec<(Labels, Value)> {
        s.volumes
            .iter()
            .filter_map(|v| Some((volume_labels(v), Value::Float(f(&IoRates::from_delta(s.io.get(&v.name_any())?))))))
            .collect()
    };
    let io: [(&'static str, &'static str, fn(&IoRates) -> f64); 6] = [
        ("volume_read_throughput", "Read throughput of this volume (bytes/s).", |r| r.read_throughput),
        ("volume_write_throughput", "Write throughput of this volume (bytes/s).", |r| r.write_throughput),
        ("volume_read_iops", "Read IOPS of this volume.", |r| r.read_iops),
        ("volume_write_iops", "Write IOPS of this volume.", |r| r.write_iops),
        ("volume_read_latency", "Read latency of this volume (ns).", |r| r.read_latency_ns),
        ("volume_write_latency", "Write latency of this volume (ns).", |r| r.write_latency_ns),
    ];
    for (name, help, f) in io {
        out.push(family(name, Gauge, help, rates(f)));
    }
    // ironhorn's own, labelled by volume alone.
    let by_name = |f: &dyn Fn(&Volume) -> u64| -> Vec<(Labels, Value)> {
        s.volumes.iter().map(|v| (vec![("volume", v.name_any())], int(f(v)))).collect()
    };
    out.push(family("volume_size_bytes", Gauge, "Volume size.", by_name(&|v| v.spec.size)));
    out.push(family(
        "volume_bad_blocks_found",
        Counter,
        "Blocks read back failing their checksum on a replica, as the running engine counts them.",
        by_name(&|v| status(v).bad_blocks_found),
    ));
    out.push(family(
        "volume_bad_blocks_repaired",
        Counter,
        "Bad blocks rewritten in place from a healthy replica, as the running engine counts them.",
        by_name(&|v| status(v).bad_blocks_repaired),
    ));
    out.push(family(
        "volume_scrub_checked_bytes",
        Gauge,
        "Bytes the last (or running) scrub read back.",
        by_name(&|v| status(v).scrub.checked_bytes),
    ));
    out.push(family(
        "volume_scrub_bad_blocks",
        Gauge,
        "Bad blocks the last (or running) scrub found.",
        by_name(&|v| status(v).scrub.bad_blocks),
    ));
}

fn replica_families(s: &Scrape, out: &mut Vec<Family>) {
    use Kind::*;
    let node_of = |replica: &str| {
        s.replicas.iter().find(|r| r.name_any() == replica).map(|r| r.spec.node_id.clone()).unwrap_or_default()
    };
    let mut modes = Vec::new();
    let mut percent = Vec::new();
    let mut rate = Vec::new();
    let mut copied = Vec::new();
    for e in &s.engines {
        let Some(status) = &e.status else { continue };
        for (replica, mode) in &status.replica_mode_map {
            modes.push((
                vec![("volume", e.spec.volume_name.clone()), ("replica", replica.clone())],
                Value::Int(mode_value(mode)),
            ));
        }
        for (replica, p) in status.rebuild_progress.iter().filter(|(_, p)| p.state == "running") {
            let labels =
                vec![("volume", e.spec.volume_name.clone()), ("replica", replica.clone()), ("node", node_of(replica))];
            percent.push((labels.clone(), Value::Int(p.percent() as i64)));
            rate.push((labels.clone(), int(p.rate(s.now))));
            copied.push((labels, int(p.copied_bytes)));
        }
    }
    out.push(family(
        "replica_mode",
        Gauge,
        "Replica mode as its engine last reported it: 1 RW, 2 WO (rebuilding), 3 ERR, 0 other.",
        modes,
    ));
    out.push(family("replica_rebuild_progress_percent", Gauge, "Percent done of a running rebuild.", percent));
    out.push(family(
        "replica_rebuild_rate_bytes_per_second",
        Gauge,
        "Bytes a running rebuild copied per second since it started.",
        rate,
    ));
    out.push(family("replica_rebuild_copied_bytes", Gauge, "Bytes a running rebuild copied so far.", copied));
}

fn node_families(s: &Scrape, out: &mut Vec<Family>) {
    use Kind::*;
    let mut status = Vec::new();
    let (mut capacity, mut usage, mut reservation) = (Vec::new(), Vec::new(), Vec::new());
    let (mut disk_capacity, mut disk_usage, mut disk_reservation, mut disk_status) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut disk_gauges: [Vec<(Labels, Value)>; 4] = Default::default();
    for n in &s.nodes {
        let node = n.name_any();
        let ns = n.status.clone().unwrap_or_default();
        status.extend(conditions(vec![("node", node.clone())], &ns.conditions));
        let (mut cap, mut used, mut reserved) = (0u64, 0u64, 0u64);
        for (disk, spec) in &n.spec.disks {
            let d = ns.disk_status.get(disk).cloned().unwrap_or_default();
            let labels: Labels = vec![("node", node.clone()), ("disk", disk.clone())];
            let disk_used = d.storage_maximum.saturating_sub(d.storage_available);
            cap += d.storage_maximum;
            used += disk_used;
            reserved += spec.storage_reserved;
            disk_capacity.push((labels.clone(), int(d.storage_maximum)));
            disk_usage.push((labels.clone(), int(disk_used)));
            disk_reservation.push((labels.clone(), int(spec.storage_reserved)));
            disk_status.extend(conditions(labels.clone(), &d.conditions));
            let values = [d.storage_maximum, d.storage_available, spec.storage_reserved, d.storage_scheduled];
            for (gauge, value) in disk_gauges.iter_mut().zip(values) {
                gauge.push((labels.clone(), int(value)));
            }
        }
        capacity.push((vec![("node", node.clone())], int(cap)));
        usage.push((vec![("node", node.clone())], int(used)));
        reservation.push((vec![("node", node)], int(reserved)));
    }
    out.push(family(
        "node_count_total",
        Gauge,
        "Total number of nodes in the ironhorn system.",
        vec![(vec![], int(s.nodes.len() as u64))],
    ));
    out.push(family("node_status", Gauge, "Status of this node's conditions: 1=true, 0=false.", status));
    out.push(family("node_storage_capacity_bytes", Gauge, "The storage capacity of this node.", capacity));
    out.push(family("node_storage_usage_bytes", Gauge, "The used storage of this node.", usage));
    out.push(family(
        "node_storage_reservation_bytes",
        Gauge,
        "The reserved storage for other applications and system on this node.",
        reservation,
    ));
    out.push(family("disk_capacity_bytes", Gauge, "The storage capacity of this disk.", disk_capacity));
    out.push(family("disk_usage_bytes", Gauge, "The used storage of this disk.", disk_usage));
    out.push(family(
        "disk_reservation_bytes",
        Gauge,
        "The reserved storage for other applications and system on this disk.",
        disk_reservation,
    ));
    out.push(family("disk_status", Gauge, "Status of this disk's conditions: 1=true, 0=false.", disk_status));
    let names: [(&'static str, &'static str); 4] = [
        ("disk_storage_maximum_bytes", "Disk size as measured."),
        ("disk_storage_available_bytes", "Disk space free as measured."),
        ("disk_storage_reserved_bytes", "Disk space kept from scheduling."),
        ("disk_storage_scheduled_bytes", "Volume bytes of the replicas placed on the disk."),
    ];
    for ((name, help), samples) in names.into_iter().zip(disk_gauges) {
        out.push(family(name, Gauge, help, samples));
    }
}

fn instance_manager_families(s: &Scrape, out: &mut Vec<Family>) {
    use Kind::*;
    let (mut cpu, mut memory) = (Vec::new(), Vec::new());
    for im in &s.instance_managers {
        let Some((delta, rss)) = s.im_usage.get(&im.name_any()) else { continue };
        let labels: Labels = vec![
            ("instance_manager", im.name_any()),
            ("node", im.spec.node_id.clone()),
            ("instance_manager_type", "aio".to_string()),
        ];
        // CPU milliseconds per second = millicores.
        if let Some(d) = delta {
            cpu.push((labels.clone(), Value::Float(d.per_second(0))));
        }
        memory.push((labels, int(*rss)));
    }
    out.push(family(
        "instance_manager_cpu_usage_millicpu",
        Gauge,
        "CPU use of this instance manager and the engines and replicas it runs (millicores).",
        cpu,
    ));
    out.push(family(
        "instance_manager_memory_usage_bytes",
        Gauge,
        "Resident memory of this instance manager and the engines and replicas it runs.",
        memory,
    ));
}

fn engine_families(s: &Scrape, out: &mut Vec<Family>) {
    use Kind::*;
    out.push(family(
        "volume_metrics_up",
        Gauge,
        "1 when the volume's engine answered this scrape.",
        s.engine_answers.iter().map(|(v, a)| (vec![("volume", v.clone())], Value::Int(a.is_ok() as i64))).collect(),
    ));
    let answered: Vec<(&String, &MetricsResponse)> =
        s.engine_answers.iter().filter_map(|(v, a)| a.as_ref().ok().map(|m| (v, m))).collect();
    let per_op = |f: fn(&OpMetrics) -> u64| -> Vec<(Labels, Value)> {
        answered
            .iter()
            .flat_map(|(v, m)| {
                m.ops.iter().map(move |o| (vec![("volume", (*v).clone()), ("op", o.op.clone())], int(f(o))))
            })
            .collect()
    };
    out.push(family(
        "volume_requests",
        Counter,
        "Frontend requests completed, failed ones included.",
        per_op(|o| o.requests),
    ));
    out.push(family("volume_request_errors", Counter, "Frontend requests that failed.", per_op(|o| o.errors)));
    out.push(family("volume_bytes", Counter, "Bytes of the frontend requests that succeeded.", per_op(|o| o.bytes)));
    let histograms = answered
        .iter()
        .flat_map(|(v, m)| {
            m.ops.iter().map(move |o| {
                // The engine's buckets are cumulative; the encoder wants each
                // bucket's own count.
                let mut buckets = Vec::new();
                let mut below = 0;
                for (bound, cumulative) in m.latency_bounds_us.iter().zip(&o.latency_buckets) {
                    buckets.push((*bound as f64 / 1e6, cumulative.saturating_sub(below)));
                    below = *cumulative;
                }
                buckets.push((f64::INFINITY, o.requests.saturating_sub(below)));
                let value = Value::Histogram { sum: o.latency_ns_total as f64 / 1e9, count: o.requests, buckets };
                (vec![("volume", (*v).clone()), ("op", o.op.clone())], value)
            })
        })
        .collect();
    out.push(family(
        "volume_request_duration_seconds",
        Histogram,
        "Frontend request latency in the engine.",
        histograms,
    ));
}
