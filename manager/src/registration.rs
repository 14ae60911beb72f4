//! A node registers itself: on a cluster, each node's instance manager
//! creates or updates its Node object (its address, its disks, its zone and
//! region) and renews a heartbeat Lease; the manager marks a node whose
//! heartbeat is older than the `node-heartbeat-timeout` setting not Ready,
//! and the healing rules treat its replicas as those of any unreachable
//! node.
//!
//! Which disks a node offers: the instance manager's `--disk` flags (the
//! DaemonSet's config, the same on every node), unless the Kubernetes Node
//! carries the annotation [`DISKS_ANNOTATION`], which then wins for that
//! node — Longhorn's default-disk setting does the same with a label.
//!
//! The decisions ([`parse_disks`], [`desired_node`], [`heartbeat`]) are pure;
//! [`Registrar`] applies them through the datastore.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::ResourceExt;

use crate::crd::{DiskSpec, Node, NodeSpec};
use crate::datastore::{self, Datastore};

/// On a Kubernetes Node: the disks this node offers, comma separated, each
/// `[NAME=]lvm:VG` or `[NAME=]file:DIR` (overrides `--disk`).
pub const DISKS_ANNOTATION: &str = "ironhorn.io/disks";
/// The Kubernetes labels copied onto the ironhorn Node (the scheduler's
/// zone anti-affinity reads the zone).
pub const TOPOLOGY_LABELS: [&str; 2] = ["topology.kubernetes.io/zone", "topology.kubernetes.io/region"];
/// Heartbeat leases are named this plus the node's name.
pub const HEARTBEAT_PREFIX: &str = "ironhorn-node-";

pub fn heartbeat_lease_name(node: &str) -> String {
    format!("{HEARTBEAT_PREFIX}{node}")
}

/// `[NAME=]lvm:VG` / `[NAME=]file:DIR`, in order; unnamed disks are
/// `disk-1`, `disk-2`… by position.
pub fn parse_disks(specs: &[String]) -> Result<Vec<(String, String)>, String> {
    let mut disks: Vec<(String, String)> = Vec::new();
    for (i, spec) in specs.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).enumerate() {
        let (name, path) = match spec.split_once('=') {
            Some((name, path)) => (name.trim().to_string(), path.trim().to_string()),
            None => (format!("disk-{}", i + 1), spec.to_string()),
        };
        let valid_name = !name.is_empty()
            && name.len() <= 63
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid_name {
            return Err(format!("disk {spec:?}: name {name:?} must be lowercase letters, digits and '-'"));
        }
        let ok = match (path.strip_prefix("lvm:"), path.strip_prefix("file:")) {
            (Some(vg), _) => !vg.is_empty() && !vg.contains('/'),
            (_, Some(dir)) => dir.starts_with('/'),
            _ => false,
        };
        if !ok {
            return Err(format!("disk {spec:?}: expected lvm:VG or file:/ABSOLUTE/DIR"));
        }
        if disks.iter().any(|(n, p)| *n == name || *p == path) {
            return Err(format!("disk {spec:?}: name or path given twice"));
        }
        disks.push((name, path));
    }
    if disks.is_empty() {
        return Err("no disk: give --disk lvm:VG or --disk file:DIR (or the node annotation ironhorn.io/disks)".into());
    }
    Ok(disks)
}

/// What a node reports about itself.
#[derive(Clone, Debug, PartialEq)]
pub struct Registration {
    pub node: String,
    /// gRPC address of its instance manager.
    pub instance_manager_address: String,
    /// (name, path) as from [`parse_disks`].
    pub disks: Vec<(String, String)>,
    /// Topology labels from the Kubernetes Node.
    pub labels: BTreeMap<String, String>,
}

/// The Node object to write, or None when `existing` already says it all.
/// What people set on the object stays theirs: scheduling flags, tags,
/// reserved and maximum bytes of a disk whose path did not change, and
/// disks no longer offered (removing a disk that holds replicas is a
/// decision for a person, who first disables scheduling on it).
pub fn desired_node(existing: Option<&Node>, reg: &Registration) -> Option<Node> {
    let mut node = match existing {
        Some(n) => n.clone(),
        None => Node::new(
            &reg.node,
            NodeSpec {
                allow_scheduling: true,
                tags: vec![],
                disks: BTreeMap::new(),
                instance_manager_address: String::new(),
            },
        ),
    };
    node.spec.instance_manager_address = reg.instance_manager_address.clone();
    for (name, path) in &reg.disks {
        let disk = node.spec.disks.entry(name.clone()).or_insert_with(|| DiskSpec {
            path: path.clone(),
            allow_scheduling: true,
            storage_reserved: 0,
            storage_maximum: 0,
            tags: vec![],
        });
        disk.path = path.clone();
    }
    let labels = node.metadata.labels.get_or_insert_default();
    for key in TOPOLOGY_LABELS {
        match reg.labels.get(key) {
            Some(value) => labels.insert(key.to_string(), value.clone()),
            None => labels.remove(key),
        };
    }
    if node.metadata.labels.as_ref().is_some_and(|l| l.is_empty()) {
        node.metadata.labels = None;
    }
    let unchanged = existing.is_some_and(|e| e.spec == node.spec && e.metadata.labels == node.metadata.labels);
    (!unchanged).then_some(node)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heartbeat {
    /// The node has no heartbeat lease (a standalone node: its instance
    /// manager's reachability says it all).
    Untracked,
    Fresh,
    /// Not renewed for longer than the timeout.
    Expired {
        seconds: i64,
    },
}

/// Judges a node's heartbeat lease at `now`.
pub fn heartbeat(lease: Option<&Lease>, now: jiff::Timestamp, timeout: Duration) -> Heartbeat {
    let Some(lease) = lease else { return Heartbeat::Untracked };
    let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
    let Some(renewed) = renewed else { return Heartbeat::Expired { seconds: i64::MAX } };
    let age = now.as_second() - renewed.as_second();
    if age > timeout.as_secs() as i64 { Heartbeat::Expired { seconds: age } } else { Heartbeat::Fresh }
}

/// Registers a node and renews its heartbeat through a datastore.
pub struct Registrar<D> {
    store: D,
    node: String,
    /// The heartbeat lease as last written (its resourceVersion lets a
    /// renewal be one request).
    lease: Option<Lease>,
}

impl<D: Datastore> Registrar<D> {
    pub fn new(store: D, node: &str) -> Self {
        Self { store, node: node.to_string(), lease: None }
    }

    /// Creates or updates the Node object; true when something was written.
    pub async fn register(&self, reg: &Registration) -> datastore::Result<bool> {
        for _ in 0..8 {
            let existing: Option<Node> = self.store.get(&reg.node).await?;
            let Some(node) = desired_node(existing.as_ref(), reg) else { return Ok(false) };
            let written = match existing {
                Some(_) => self.store.replace(&node).await,
                None => self.store.create(&node).await,
            };
            match written {
                Ok(_) => {
                    tracing::info!(node = %reg.node, address = %reg.instance_manager_address, "node registered");
                    return Ok(true);
                }
                Err(datastore::Error::Conflict { .. } | datastore::Error::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(datastore::Error::Conflict { kind: "Node".into(), name: reg.node.clone() })
    }

    /// Renews the heartbeat lease (creating it the first time).
    pub async fn beat(&mut self, duration: Duration) -> datastore::Result<()> {
        let name = heartbeat_lease_name(&self.node);
        let now = MicroTime(jiff::Timestamp::now());
        let mut lease = match self.lease.take() {
            Some(lease) => lease,
            None => match self.store.get::<Lease>(&name).await? {
                Some(lease) => lease,
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
                        spec: Some(LeaseSpec {
                            holder_identity: Some(self.node.clone()),
                            lease_duration_seconds: Some(duration.as_secs() as i32),
                            renew_time: Some(now),
                            ..Default::default()
                        }),
                    };
                    self.lease = Some(self.store.create(&lease).await?);
                    return Ok(());
                }
            },
        };
        let spec = lease.spec.get_or_insert_default();
        spec.holder_identity = Some(self.node.clone());
        spec.lease_duration_seconds = Some(duration.as_secs() as i32);
        spec.renew_time = Some(now);
        // On an error the lease is not kept: the next beat reads it afresh.
        self.lease = Some(self.store.replace(&lease).await?);
        Ok(())
    }

    /// Registers, then renews every `interval` (leases of `lease_duration`)
    /// until `stop`; re-registers every tenth beat (an annotation or label
    /// may have changed), through `read` which reads the Registration afresh.
    pub async fn run<F, Fut>(
        mut self,
        interval: Duration,
        lease_duration: Duration,
        mut read: F,
        stop: impl std::future::Future<Output = ()>,
    ) where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Registration, String>>,
    {
        let mut stop = std::pin::pin!(stop);
        let mut beats = 0u64;
        let mut registered = false;
        loop {
            if !registered || beats.is_multiple_of(10) {
                match read().await {
                    Ok(reg) => match self.register(&reg).await {
                        Ok(_) => registered = true,
                        Err(e) => tracing::warn!(node = %self.node, error = %e, "node registration failed"),
                    },
                    Err(e) => tracing::warn!(node = %self.node, error = %e, "cannot read this node's registration"),
                }
            }
            if registered && let Err(e) = self.beat(lease_duration).await {
                tracing::warn!(node = %self.node, error = %e, "heartbeat failed");
            }
            beats += 1;
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// Reads this node's registration from the Kubernetes Node object: its
/// topology labels and, when annotated, its disks.
pub async fn read_kubernetes_node(
    client: &kube::Client,
    node: &str,
    instance_manager_address: &str,
    default_disks: &[String],
) -> Result<Registration, String> {
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let k8s_node = api.get(node).await.map_err(|e| format!("Kubernetes Node {node}: {e}"))?;
    let disks = match k8s_node.annotations().get(DISKS_ANNOTATION) {
        Some(list) => {
            let specs: Vec<String> = list.split(',').map(str::to_string).collect();
            parse_disks(&specs).map_err(|e| format!("annotation {DISKS_ANNOTATION} on {node}: {e}"))?
        }
        None => parse_disks(default_disks)?,
    };
    let labels = k8s_node
        .labels()
        .iter()
        .filter(|(k, _)| TOPOLOGY_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(Registration {
        node: node.to_string(),
        instance_manager_address: instance_manager_address.to_string(),
        disks,
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(disks: &[(&str, &str)], zone: Option<&str>) -> Registration {
        Registration {
            node: "n1".into(),
            instance_manager_address: "10.0.0.1:8500".into(),
            disks: disks.iter().map(|(n, p)| (n.to_string(), p.to_string())).collect(),
            labels: zone.map(|z| (TOPOLOGY_LABELS[0].to_string(), z.to_string())).into_iter().collect(),
        }
    }

    #[test]
    fn disks_parse_named_and_by_position_and_refuse_nonsense() {
        let parsed = parse_disks(&["lvm:vg0".into(), "fast=file:/mnt/nvme".into()]).unwrap();
        assert_eq!(parsed, [("disk-1".into(), "lvm:vg0".into()), ("fast".into(), "file:/mnt/nvme".into())]);
        for bad in ["vg0", "file:relative", "lvm:", "Big=lvm:vg", "lvm:vg/lv"] {
            assert!(parse_disks(&[bad.into()]).is_err(), "{bad} accepted");
        }
        assert!(parse_disks(&["lvm:a".into(), "lvm:a".into()]).is_err());
        assert!(parse_disks(&[]).is_err());
    }

    #[test]
    fn first_registration_creates_and_a_second_identical_one_writes_nothing() {
        let r = reg(&[("disk-1", "lvm:vg0")], Some("z1"));
        let node = desired_node(None, &r).expect("created");
        assert_eq!(node.spec.instance_manager_address, "10.0.0.1:8500");
        assert_eq!(node.spec.disks["disk-1"].path, "lvm:vg0");
        assert!(node.spec.allow_scheduling && node.spec.disks["disk-1"].allow_scheduling);
        assert_eq!(node.labels()[TOPOLOGY_LABELS[0]], "z1");
        assert!(desired_node(Some(&node), &r).is_none());
    }

    #[test]
    fn reregistration_keeps_what_people_set_and_follows_address_and_zone() {
        let mut node = desired_node(None, &reg(&[("disk-1", "lvm:vg0"), ("old", "file:/old")], Some("z1"))).unwrap();
        node.spec.allow_scheduling = false;
        node.spec.tags = vec!["ssd".into()];
        let d = node.spec.disks.get_mut("disk-1").unwrap();
        d.allow_scheduling = false;
        d.storage_reserved = 7;
        let mut r = reg(&[("disk-1", "lvm:vg0"), ("disk-2", "file:/new")], Some("z2"));
        r.instance_manager_address = "10.0.0.9:8500".into();
        let updated = desired_node(Some(&node), &r).expect("changed");
        assert!(!updated.spec.allow_scheduling);
        assert_eq!(updated.spec.tags, ["ssd"]);
        assert!(!updated.spec.disks["disk-1"].allow_scheduling);
        assert_eq!(updated.spec.disks["disk-1"].storage_reserved, 7);
        assert!(updated.spec.disks.contains_key("old"), "a disk no longer offered stays until a person removes it");
        assert_eq!(updated.spec.disks["disk-2"].path, "file:/new");
        assert_eq!(updated.spec.instance_manager_address, "10.0.0.9:8500");
        assert_eq!(updated.labels()[TOPOLOGY_LABELS[0]], "z2");
    }

    #[test]
    fn heartbeat_expires_after_the_timeout_and_nodes_without_one_are_untracked() {
        let now: jiff::Timestamp = "2026-12-03T10:00:40Z".parse().unwrap();
        let lease = |at: &str| Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec { renew_time: Some(MicroTime(at.parse().unwrap())), ..Default::default() }),
        };
        let timeout = Duration::from_secs(30);
        assert_eq!(heartbeat(None, now, timeout), Heartbeat::Untracked);
        assert_eq!(heartbeat(Some(&lease("2026-12-03T10:00:15Z")), now, timeout), Heartbeat::Fresh);
        assert_eq!(heartbeat(Some(&lease("2026-12-03T10:00:05Z")), now, timeout), Heartbeat::Expired { seconds: 35 });
    }
}
