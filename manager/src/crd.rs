//! The custom resources of group `ironhorn.io`, version `v1alpha1`. Field
//! names follow Longhorn's where the meaning is the same (numberOfReplicas,
//! staleReplicaTimeout, replicaAddressMap, replicaModeMap, healthyAt,
//! failedAt, rebuildRetryCount, storageReserved, allowScheduling, tags), so
//! people who run Longhorn feel at home. Sizes are bytes; times are RFC 3339
//! strings ("" = never).
//!
//! `deploy/crds.yaml` is generated from these types (`ironhorn crds`); a test
//! fails when the file and the types drift apart.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "ironhorn.io";
pub const FINALIZER: &str = "ironhorn.io";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub last_transition_time: String,
}

/// Sets a condition, keeping its transition time when nothing changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &str,
) {
    let status = if status { "True" } else { "False" };
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.last_transition_time = now.to_string();
        }
        c.status = status.to_string();
        c.reason = reason.to_string();
        c.message = message.to_string();
        return;
    }
    conditions.push(Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time: now.to_string(),
    });
}

pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Frontend {
    #[default]
    Nbd,
    Blockdev,
}

/// Anti-affinity strength; `Default` defers to the cluster setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SoftAntiAffinity {
    #[default]
    Default,
    Enabled,
    Disabled,
}

/// Whether a volume keeps one replica on the node it is attached to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DataLocality {
    #[default]
    Disabled,
    /// While attached, one replica on the attached node where a disk there
    /// has room: one is added there, then one elsewhere removed.
    BestEffort,
}

/// How many replicas must acknowledge a write before the engine does.
/// `Default` defers to the `default-write-majority` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WriteQuorum {
    #[default]
    Default,
    /// One healthy replica is enough (Longhorn's behaviour): the volume
    /// keeps serving with a single replica left, and an engine partitioned
    /// from all but one replica keeps acknowledging writes a new engine on
    /// the other side will not see.
    One,
    /// A majority of the replicas the engine started with: an engine cut
    /// off from most of its replicas returns errors instead.
    Majority,
}

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ironhorn.io", version = "v1alpha1", kind = "Volume", namespaced, status = "VolumeStatus")]
#[kube(
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Robustness","type":"string","jsonPath":".status.robustness"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.size"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.numberOfReplicas"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.currentNodeID"}"#,
    printcolumn = r#"{"name":"Frontend","type":"string","jsonPath":".spec.frontend","priority":1}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    /// Bytes, a multiple of 4096. Only grows: an apiserver refuses a
    /// smaller value (editing the object with kubectl expands the volume).
    #[schemars(extend(
        "minimum" = 4096,
        "multipleOf" = 4096,
        "x-kubernetes-validations" = [{ "rule": "self >= oldSelf", "message": "a volume's size only grows" }]
    ))]
    pub size: u64,
    pub number_of_replicas: u32,
    #[serde(default)]
    pub frontend: Frontend,
    /// The node to attach to; "" = detached.
    #[serde(default, rename = "nodeID")]
    pub node_id: String,
    /// Minutes a failed replica is kept for reuse before it is deleted;
    /// 0 = the `stale-replica-timeout` setting.
    #[serde(default)]
    pub stale_replica_timeout: u64,
    #[serde(default)]
    pub replica_soft_anti_affinity: SoftAntiAffinity,
    #[serde(default)]
    pub replica_zone_soft_anti_affinity: SoftAntiAffinity,
    #[serde(default)]
    pub replica_disk_soft_anti_affinity: SoftAntiAffinity,
    /// Node tags every replica's node must carry.
    #[serde(default)]
    pub node_selector: Vec<String>,
    /// Disk tags every replica's disk must carry.
    #[serde(default)]
    pub disk_selector: Vec<String>,
    /// Applies from the next engine start.
    #[serde(default)]
    pub write_quorum: WriteQuorum,
    /// Where a new volume's data comes from: `snapshot://NAME` (a restore)
    /// or `volume://NAME` (a clone); "" = empty. Copied before the first
    /// attach (status.restore).
    #[serde(default)]
    pub data_source: String,
    #[serde(default)]
    pub data_locality: DataLocality,
    /// Raised by one to ask for a scrub now (`ironhorn volume scrub`): the
    /// engine reads back every block of every replica and repairs bad ones.
    #[serde(default)]
    pub scrub_requested: u64,
    /// Frontend requests (reads, writes, trims) per second the engine lets
    /// through; 0 = unlimited. Applies at once while attached.
    #[serde(default)]
    pub iops_limit: u64,
    /// Frontend bytes per second (reads and writes); 0 = unlimited.
    #[serde(default)]
    pub bandwidth_limit: u64,
    /// The PersistentVolumeClaim the volume was made for (from the CSI
    /// provisioner's `--extra-create-metadata`); "" when made otherwise.
    /// Labels its metrics, as Longhorn's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pvc_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pvc_namespace: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    /// creating, detached, attaching, attached, detaching, deleting, error
    #[serde(default)]
    pub state: String,
    /// unknown, healthy, degraded, faulted
    #[serde(default)]
    pub robustness: String,
    #[serde(default, rename = "currentNodeID")]
    pub current_node_id: String,
    #[serde(default)]
    pub frontend: String,
    /// nbd://HOST:PORT/NAME once attached.
    #[serde(default)]
    pub endpoint: String,
    /// /dev/ironhorn/NAME when attached with the blockdev frontend.
    #[serde(default)]
    pub blockdev: String,
    /// Bytes the volume's data has now (its engine's, or else its
    /// replicas'); below spec.size while an expansion is under way.
    #[serde(default)]
    pub current_size: u64,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// When robustness last turned degraded ("" = not degraded).
    #[serde(default)]
    pub last_degraded_at: String,
    /// Filling the volume from its dataSource.
    #[serde(default)]
    pub restore: RestoreStatus,
    /// The last (or running) scrub.
    #[serde(default)]
    pub scrub: ScrubStatus,
    /// Blocks found failing their checksum on a replica, and repaired in
    /// place from a healthy one, as the running engine counts them.
    #[serde(default)]
    pub bad_blocks_found: u64,
    #[serde(default)]
    pub bad_blocks_repaired: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScrubStatus {
    /// "" (never ran), running, done, failed
    #[serde(default)]
    pub state: String,
    /// The spec.scrubRequested value this scrub answered.
    #[serde(default)]
    pub requested: u64,
    #[serde(default)]
    pub checked_bytes: u64,
    #[serde(default)]
    pub total_bytes: u64,
    #[serde(default)]
    pub bad_blocks: u64,
    #[serde(default)]
    pub repaired_blocks: u64,
    #[serde(default)]
    pub started_at: String,
    #[serde(default)]
    pub finished_at: String,
    #[serde(default)]
    pub error: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// "" (no source), waiting, copying, done, error
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub bytes_done: u64,
    #[serde(default)]
    pub bytes_total: u64,
    #[serde(default)]
    pub message: String,
}

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ironhorn.io", version = "v1alpha1", kind = "Engine", namespaced, status = "EngineStatus")]
#[kube(
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.currentState"}"#,
    printcolumn = r#"{"name":"Volume","type":"string","jsonPath":".spec.volumeName"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeID"}"#,
    printcolumn = r#"{"name":"Epoch","type":"integer","jsonPath":".spec.epoch"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EngineSpec {
    pub volume_name: String,
    #[serde(rename = "nodeID")]
    pub node_id: String,
    pub volume_size: u64,
    #[serde(default)]
    pub frontend: Frontend,
    /// Replica name → address the engine was started with.
    #[serde(default)]
    pub replica_address_map: BTreeMap<String, String>,
    /// Fencing epoch; raised (and stored) before every engine start.
    pub epoch: u64,
    /// running or stopped
    pub desire_state: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineStatus {
    /// starting, running, stopping, stopped, error, unknown
    #[serde(default)]
    pub current_state: String,
    #[serde(default)]
    pub instance_manager_name: String,
    /// Engine control gRPC address.
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub endpoint: String,
    /// Replica name → RW / WO / ERR, as the engine reports it.
    #[serde(default)]
    pub replica_mode_map: BTreeMap<String, String>,
    /// Rebuilds as the engine reports them (replica address → state).
    #[serde(default)]
    pub rebuild_status: BTreeMap<String, String>,
    /// Replica name → its latest rebuild's progress, as the engine reports
    /// it (updated every pass while it runs).
    #[serde(default)]
    pub rebuild_progress: BTreeMap<String, RebuildProgress>,
    #[serde(default)]
    pub error: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebuildProgress {
    /// running, done, failed
    #[serde(default)]
    pub state: String,
    /// dirty-map or checksums
    #[serde(default)]
    pub method: String,
    #[serde(default)]
    pub source: String,
    /// Bytes compared and copied so far, of total_bytes.
    #[serde(default)]
    pub compared_bytes: u64,
    #[serde(default)]
    pub copied_bytes: u64,
    #[serde(default)]
    pub total_bytes: u64,
    #[serde(default)]
    pub started_at: String,
    #[serde(default)]
    pub finished_at: String,
    #[serde(default)]
    pub error: String,
}

impl RebuildProgress {
    /// Bytes of the rebuild's work done: a dirty-map rebuild knows what to
    /// copy up front (its total is that), one by checksums compares the
    /// whole volume and copies what differs (its total is the volume).
    pub fn done_bytes(&self) -> u64 {
        if self.method == "checksums" { self.compared_bytes } else { self.copied_bytes }
    }

    /// Percent of the work done, 0..=100 (100 once it is done).
    pub fn percent(&self) -> u32 {
        if self.state == "done" {
            return 100;
        }
        match self.total_bytes {
            0 => 0,
            total => (self.done_bytes().min(total) as u128 * 100 / total as u128) as u32,
        }
    }

    /// Bytes copied per second since it started, until `now` or its end.
    pub fn rate(&self, now: jiff::Timestamp) -> u64 {
        let Ok(start) = self.started_at.parse::<jiff::Timestamp>() else { return 0 };
        let end = self.finished_at.parse::<jiff::Timestamp>().unwrap_or(now);
        let ms = end.as_millisecond() - start.as_millisecond();
        if ms <= 0 { 0 } else { (self.copied_bytes as u128 * 1000 / ms as u128) as u64 }
    }
}

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ironhorn.io", version = "v1alpha1", kind = "Replica", namespaced, status = "ReplicaStatus")]
#[kube(
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.currentState"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".status.mode"}"#,
    printcolumn = r#"{"name":"Rebuilt%","type":"integer","jsonPath":".status.rebuildPercent"}"#,
    printcolumn = r#"{"name":"Volume","type":"string","jsonPath":".spec.volumeName"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeID"}"#,
    printcolumn = r#"{"name":"Disk","type":"string","jsonPath":".spec.diskID"}"#,
    printcolumn = r#"{"name":"Failed At","type":"string","jsonPath":".spec.failedAt","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSpec {
    pub volume_name: String,
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// The disk's name on its node.
    #[serde(rename = "diskID")]
    pub disk_id: String,
    /// The store: lvm:VG/LV or file:PATH.
    pub data_path: String,
    pub volume_size: u64,
    /// running or stopped
    pub desire_state: String,
    #[serde(default)]
    pub healthy_at: String,
    #[serde(default)]
    pub failed_at: String,
    #[serde(default)]
    pub rebuild_retry_count: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// starting, running, stopping, stopped, error, unknown
    #[serde(default)]
    pub current_state: String,
    #[serde(default)]
    pub instance_manager_name: String,
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub error: String,
    /// RW, WO (rebuilding) or ERR as the volume's engine last reported it;
    /// "" while no engine serves the volume.
    #[serde(default)]
    pub mode: String,
    /// Percent done of the replica's running rebuild (absent when none runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild_percent: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskSpec {
    /// lvm:VG or file:DIRECTORY
    pub path: String,
    #[serde(default = "yes")]
    pub allow_scheduling: bool,
    /// Bytes kept free for other uses.
    #[serde(default)]
    pub storage_reserved: u64,
    /// Use at most this many bytes of the source (0 = all of it): a file disk
    /// on a shared filesystem counts its stores against this cap.
    #[serde(default)]
    pub storage_maximum: u64,
    #[serde(default)]
    pub tags: Vec<String>,
}

fn yes() -> bool {
    true
}

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ironhorn.io", version = "v1alpha1", kind = "Node", namespaced, status = "NodeStatus")]
#[kube(
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"AllowScheduling","type":"boolean","jsonPath":".spec.allowScheduling"}"#,
    printcolumn = r#"{"name":"Tags","type":"string","jsonPath":".spec.tags","priority":1}"#,
    printcolumn = r#"{"name":"Zone","type":"string","jsonPath":".status.zone"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    #[serde(default = "yes")]
    pub allow_scheduling: bool,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Disk name → disk.
    #[serde(default)]
    pub disks: BTreeMap<String, DiskSpec>,
    /// gRPC address of this node's instance manager.
    pub instance_manager_address: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskStatus {
    #[serde(default)]
    pub storage_maximum: u64,
    #[serde(default)]
    pub storage_available: u64,
    #[serde(default)]
    pub storage_scheduled: u64,
    /// Replica name → size, for the replicas placed on this disk.
    #[serde(default)]
    pub scheduled_replica: BTreeMap<String, u64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub disk_status: BTreeMap<String, DiskStatus>,
    /// From the node's `topology.kubernetes.io/zone` label.
    #[serde(default)]
    pub zone: String,
}

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ironhorn.io",
    version = "v1alpha1",
    kind = "InstanceManager",
    namespaced,
    status = "InstanceManagerStatus"
)]
#[kube(
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.currentState"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeID"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct InstanceManagerSpec {
    #[serde(rename = "nodeID")]
    pub node_id: String,
    pub address: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceManagerStatus {
    /// running, unknown
    #[serde(default)]
    pub current_state: String,
    /// Instance name → state, as last seen.
    #[serde(default)]
    pub instances: BTreeMap<String, String>,
}

/// A cluster setting. Longhorn keeps `value` at the top level; kube-derive
/// needs a spec, so here it is `spec.value`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ironhorn.io", version = "v1alpha1", kind = "Setting", namespaced)]
#[kube(printcolumn = r#"{"name":"Value","type":"string","jsonPath":".spec.value"}"#)]
#[serde(rename_all = "camelCase")]
pub struct SettingSpec {
    pub value: String,
}

/// A snapshot of a volume, taken by its engine at one point in the write
/// stream on every replica. The object's name is the snapshot's name.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ironhorn.io", version = "v1alpha1", kind = "Snapshot", namespaced, status = "SnapshotStatus")]
#[kube(
    printcolumn = r#"{"name":"Volume","type":"string","jsonPath":".spec.volume"}"#,
    printcolumn = r#"{"name":"Ready","type":"boolean","jsonPath":".status.readyToUse"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.size"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSpec {
    pub volume: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// Taken on every replica of the volume.
    #[serde(default)]
    pub ready_to_use: bool,
    /// When the engine took it (RFC 3339).
    #[serde(default)]
    pub creation_time: String,
    /// The volume's size when it was taken.
    #[serde(default)]
    pub size: u64,
    /// Why it is not ready (yet).
    #[serde(default)]
    pub message: String,
}

/// Every CRD, in the order `deploy/crds.yaml` lists them.
pub fn all_crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    use kube::CustomResourceExt;
    vec![
        Volume::crd(),
        Engine::crd(),
        Replica::crd(),
        Node::crd(),
        InstanceManager::crd(),
        Setting::crd(),
        Snapshot::crd(),
    ]
}

/// `deploy/crds.yaml` as generated from the types.
pub fn crds_yaml() -> String {
    let mut out = String::from("# Generated by `ironhorn crds` from manager/src/crd.rs; do not edit.\n");
    for crd in all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd).expect("CRDs serialize"));
    }
    out
}
