//! The controllers: node, volume (with its engine and replicas) and instance
//! manager. One loop reconciles everything, on every datastore change and on a
//! timer; each pass reads a fresh snapshot (objects from the datastore,
//! processes from every node's instance manager), decides, applies through
//! [`Cluster`], then writes status. Nothing is assumed about why a pass ran,
//! so a manager killed at any point and started again simply carries on: the
//! processes it started are found in the instance managers' lists and kept.
//!
//! Fencing: an engine is started only after its Engine object holds an epoch
//! higher than any it was started with before (written first, then the
//! process is created), so two engines of a volume never share an epoch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ironhorn_proto::instance::{self as pb, InstanceState};
use ironhorn_replica::store::default_store_bytes;
use kube::ResourceExt;

use crate::cluster::{Cluster, SnapshotOp};
use crate::crd::*;
use crate::datastore::{self, Datastore, update, update_status};
use crate::epoch;
use crate::events::{self, Kind::*};
use crate::replenish::{self, Action};
use crate::scheduler::{self, DiskCandidate, Limits, Placed};
use crate::{settings, snapshots};

pub const ENGINE_SUFFIX: &str = "-e";

pub fn now() -> String {
    jiff::Timestamp::now().to_string()
}

pub fn engine_name(volume: &str) -> String {
    format!("{volume}{ENGINE_SUFFIX}")
}

fn state_name(state: i32) -> &'static str {
    match InstanceState::try_from(state).unwrap_or(InstanceState::Unspecified) {
        InstanceState::Starting => "starting",
        InstanceState::Running => "running",
        InstanceState::Stopping => "stopping",
        InstanceState::Stopped => "stopped",
        InstanceState::Error => "error",
        InstanceState::Unspecified => "unknown",
    }
}

/// The store of a replica named `replica` on a disk at `disk_path`.
pub fn data_path(disk_path: &str, replica: &str) -> String {
    match disk_path.strip_prefix("lvm:") {
        Some(vg) => format!("lvm:{vg}/{replica}"),
        None => format!("{}/{replica}.img", disk_path.trim_end_matches('/')),
    }
}

/// What one pass sees.
pub struct Snapshot {
    pub nodes: Vec<Node>,
    /// Node name → its instances, or the error reaching its instance manager.
    pub instances: HashMap<String, Result<Vec<pb::Instance>, String>>,
    /// (node, disk) → the disk's size, free space and stores, or the error.
    pub disks: HashMap<(String, String), Result<pb::DiskStatusResponse, String>>,
    pub volumes: Vec<Volume>,
    pub engines: Vec<Engine>,
    pub replicas: Vec<Replica>,
    /// Snapshot objects (the CRD; this struct is the pass's snapshot).
    pub snapshots: Vec<crate::crd::Snapshot>,
    pub settings: settings::Values,
}

impl Snapshot {
    fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name_any() == name)
    }

    fn node_ready(&self, name: &str) -> bool {
        matches!(self.instances.get(name), Some(Ok(_)))
    }

    fn instance(&self, node: &str, name: &str) -> Option<&pb::Instance> {
        match self.instances.get(node) {
            Some(Ok(list)) => list.iter().find(|i| i.name == name),
            _ => None,
        }
    }

    /// Node ready and schedulable, and the replica's disk ready and schedulable.
    fn replica_usable(&self, replica: &Replica) -> bool {
        let Some(node) = self.node(&replica.spec.node_id) else { return false };
        let status = node.status.clone().unwrap_or_default();
        let is_true = |c: &[Condition], t: &str| condition(c, t).is_some_and(|c| c.status == "True");
        let disk = status.disk_status.get(&replica.spec.disk_id);
        self.node_ready(&replica.spec.node_id)
            && node.spec.allow_scheduling
            && node.spec.disks.get(&replica.spec.disk_id).is_some_and(|d| d.allow_scheduling)
            && disk.is_some_and(|d| is_true(&d.conditions, "Ready"))
    }

    /// Whether the replica's store exists; None when its node cannot say.
    fn data_exists(&self, replica: &Replica) -> Option<bool> {
        match self.disks.get(&(replica.spec.node_id.clone(), replica.spec.disk_id.clone()))? {
            Ok(status) => Some(status.stores.contains(&replica.spec.data_path)),
            Err(_) => None,
        }
    }

    fn replicas_of(&self, volume: &str) -> Vec<&Replica> {
        self.replicas.iter().filter(|r| r.spec.volume_name == volume).collect()
    }
}

#[derive(Clone)]
pub struct Controller<D: Datastore, C: Cluster> {
    pub store: D,
    pub cluster: C,
    /// Volume → since when its engine's report has disagreed with the
    /// replica set it was given (in memory: a restart just waits afresh).
    view_stale_since: Arc<Mutex<HashMap<String, std::time::Instant>>>,
}

/// How long an engine may disagree with the replica set it was given before
/// the missing replicas are taken as failed (a `replica add` that failed
/// before the replica ever showed up).
const VIEW_STALE_LIMIT: Duration = Duration::from_secs(30);

type Outcome = Result<(), String>;

fn ds(e: datastore::Error) -> String {
    e.to_string()
}

impl<D: Datastore, C: Cluster> Controller<D, C> {
    pub fn new(store: D, cluster: C) -> Self {
        Self { store, cluster, view_stale_since: Arc::default() }
    }

    /// Reconciles until `stop` resolves: on every change, and at least every
    /// `resync`.
    pub async fn run(&self, resync: Duration, stop: impl std::future::Future<Output = ()>) {
        let mut volumes = self.store.watch::<Volume>().await.ok();
        let mut nodes = self.store.watch::<Node>().await.ok();
        let mut stop = std::pin::pin!(stop);
        loop {
            if let Err(e) = self.reconcile_all().await {
                tracing::warn!(error = %e, "reconcile pass failed");
            }
            let changed = async {
                match (&mut volumes, &mut nodes) {
                    (Some(v), Some(n)) => {
                        tokio::select! { _ = v.recv() => {}, _ = n.recv() => {} }
                    }
                    _ => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(resync) => {}
                _ = changed => {
                    // Let a burst of changes settle into one pass.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    if let Some(v) = &mut volumes { while v.try_recv().is_ok() {} }
                    if let Some(n) = &mut nodes { while n.try_recv().is_ok() {} }
                }
            }
        }
    }

    pub async fn snapshot(&self) -> Result<Snapshot, String> {
        let nodes: Vec<Node> = self.store.list().await.map_err(ds)?;
        let mut instances = HashMap::new();
        let mut disks = HashMap::new();
        for node in &nodes {
            let im = &node.spec.instance_manager_address;
            let list = self.cluster.instances(im).await;
            for (disk_name, disk) in &node.spec.disks {
                let status = match &list {
                    Ok(_) => self.cluster.disk_status(im, &disk.path).await,
                    Err(e) => Err(e.clone()),
                };
                disks.insert((node.name_any(), disk_name.clone()), status);
            }
            instances.insert(node.name_any(), list);
        }
        Ok(Snapshot {
            nodes,
            instances,
            disks,
            volumes: self.store.list().await.map_err(ds)?,
            engines: self.store.list().await.map_err(ds)?,
            replicas: self.store.list().await.map_err(ds)?,
            snapshots: self.store.list().await.map_err(ds)?,
            settings: settings::Values::load(&self.store).await.map_err(ds)?,
        })
    }

    pub async fn reconcile_all(&self) -> Outcome {
        let snapshot = self.snapshot().await?;
        for node in &snapshot.nodes {
            if let Err(e) = self.reconcile_node(&snapshot, node).await {
                tracing::warn!(node = %node.name_any(), error = %e, "node reconcile failed");
            }
        }
        for volume in &snapshot.volumes {
            if let Err(e) = self.reconcile_volume(&snapshot, volume).await {
                tracing::warn!(volume = %volume.name_any(), error = %e, "volume reconcile failed");
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- nodes

    async fn reconcile_node(&self, snapshot: &Snapshot, node: &Node) -> Outcome {
        let name = node.name_any();
        let now = now();
        let im = &node.spec.instance_manager_address;
        let reachable = snapshot.instances.get(&name).cloned().unwrap_or(Err("not listed".into()));
        let mut disk_status = BTreeMap::new();
        for (disk_name, disk) in &node.spec.disks {
            let mut status = DiskStatus::default();
            for r in snapshot.replicas.iter().filter(|r| r.spec.node_id == name && r.spec.disk_id == *disk_name) {
                status.scheduled_replica.insert(r.name_any(), r.spec.volume_size);
            }
            status.storage_scheduled = status.scheduled_replica.values().sum();
            let previous = node.status.as_ref().and_then(|s| s.disk_status.get(disk_name));
            let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
            let disk_reply =
                snapshot.disks.get(&(name.clone(), disk_name.clone())).cloned().unwrap_or(Err("not listed".into()));
            match disk_reply {
                Ok(reply) => {
                    let (maximum, available) = disk_capacity(&reply, disk.storage_maximum);
                    status.storage_maximum = maximum;
                    status.storage_available = available;
                    set_condition(&mut conditions, "Ready", true, "", "", &now);
                    let usable = reply.total_bytes.saturating_sub(disk.storage_reserved);
                    let schedulable = disk.allow_scheduling && usable > 0;
                    let why = if disk.allow_scheduling { "" } else { "SchedulingDisabled" };
                    set_condition(&mut conditions, "Schedulable", schedulable, why, "", &now);
                }
                Err(e) => {
                    if let Some(p) = previous {
                        status.storage_maximum = p.storage_maximum;
                        status.storage_available = p.storage_available;
                    }
                    set_condition(&mut conditions, "Ready", false, "DiskUnreachable", &e, &now);
                    set_condition(&mut conditions, "Schedulable", false, "DiskUnreachable", &e, &now);
                }
            }
            status.conditions = conditions;
            disk_status.insert(disk_name.clone(), status);
        }
        let zone = node.labels().get("topology.kubernetes.io/zone").cloned().unwrap_or_default();
        let (ready, ready_message) = match &reachable {
            Ok(_) => (true, String::new()),
            Err(e) => (false, e.clone()),
        };
        update_status::<Node, D>(&self.store, &name, |n| {
            let status = n.status.get_or_insert_default();
            let before = status.clone();
            let reason = if ready { "" } else { "InstanceManagerUnreachable" };
            set_condition(&mut status.conditions, "Ready", ready, reason, &ready_message, &now);
            let schedulable = ready && n.spec.allow_scheduling;
            let why = if !ready {
                "NodeNotReady"
            } else if !n.spec.allow_scheduling {
                "SchedulingDisabled"
            } else {
                ""
            };
            set_condition(&mut status.conditions, "Schedulable", schedulable, why, "", &now);
            status.disk_status = disk_status.clone();
            status.zone = zone.clone();
            *status != before
        })
        .await
        .map_err(ds)?;

        // The node's instance manager, as an object people can list.
        let im_name = format!("im-{name}");
        let instances: BTreeMap<String, String> = match &reachable {
            Ok(list) => list.iter().map(|i| (i.name.clone(), state_name(i.state).to_string())).collect(),
            Err(_) => BTreeMap::new(),
        };
        let state = if ready { "running" } else { "unknown" };
        if self.store.get::<InstanceManager>(&im_name).await.map_err(ds)?.is_none() {
            let spec = InstanceManagerSpec { node_id: name.clone(), address: im.clone() };
            self.store.create(&InstanceManager::new(&im_name, spec)).await.map_err(ds)?;
        }
        update_status::<InstanceManager, D>(&self.store, &im_name, |o| {
            let s = o.status.get_or_insert_default();
            let changed = s.current_state != state || s.instances != instances;
            s.current_state = state.to_string();
            s.instances = instances.clone();
            changed
        })
        .await
        .map_err(ds)?;
        Ok(())
    }

    // -------------------------------------------------------------- volumes

    async fn set_volume_status(&self, name: &str, change: impl Fn(&mut VolumeStatus)) -> Outcome {
        update_status::<Volume, D>(&self.store, name, |v| {
            let status = v.status.get_or_insert_default();
            let before = status.clone();
            change(status);
            *status != before
        })
        .await
        .map(drop)
        .map_err(ds)
    }

    async fn reconcile_volume(&self, snapshot: &Snapshot, volume: &Volume) -> Outcome {
        let name = volume.name_any();
        if volume.metadata.deletion_timestamp.is_some() {
            return self.delete_volume(snapshot, volume).await;
        }
        // However the Volume was created (REST, kubectl, the CSI driver), its
        // deletion must wait for its engine, replicas and LVs to be removed.
        if !volume.finalizers().iter().any(|f| f == FINALIZER) {
            update::<Volume, D>(&self.store, &name, |v| {
                let finalizers = v.metadata.finalizers.get_or_insert_default();
                let missing = v.metadata.deletion_timestamp.is_none() && !finalizers.iter().any(|f| f == FINALIZER);
                if missing {
                    finalizers.push(FINALIZER.to_string());
                }
                missing
            })
            .await
            .map_err(ds)?;
        }
        let replicas = snapshot.replicas_of(&name);
        if replicas.is_empty() {
            return self.schedule_new_volume(snapshot, volume).await;
        }
        // Each replica's process runs while its volume exists.
        for replica in &replicas {
            self.reconcile_replica(snapshot, replica).await?;
        }
        self.reconcile_engine(snapshot, volume, &replicas).await
    }

    fn limits(settings: &settings::Values) -> Limits {
        Limits {
            over_provisioning_percentage: settings.u64("storage-over-provisioning-percentage"),
            minimal_available_percentage: settings.u64("storage-minimal-available-percentage"),
        }
    }

    /// Disks as the scheduler sees them.
    pub fn candidates(snapshot: &Snapshot) -> Vec<DiskCandidate> {
        let mut out = Vec::new();
        for node in &snapshot.nodes {
            let name = node.name_any();
            let status = node.status.clone().unwrap_or_default();
            let ready = snapshot.node_ready(&name);
            for (disk_name, disk) in &node.spec.disks {
                let ds = status.disk_status.get(disk_name).cloned().unwrap_or_default();
                let disk_ready = condition(&ds.conditions, "Ready").is_some_and(|c| c.status == "True");
                let scheduled =
                    snapshot.replicas.iter().filter(|r| r.spec.node_id == name && r.spec.disk_id == *disk_name);
                out.push(DiskCandidate {
                    node: name.clone(),
                    disk: disk_name.clone(),
                    zone: status.zone.clone(),
                    node_ready: ready,
                    node_allow_scheduling: node.spec.allow_scheduling,
                    disk_ready,
                    disk_allow_scheduling: disk.allow_scheduling,
                    node_tags: node.spec.tags.clone(),
                    disk_tags: disk.tags.clone(),
                    maximum: ds.storage_maximum,
                    available: ds.storage_available,
                    reserved: disk.storage_reserved,
                    scheduled: scheduled.map(|r| default_store_bytes(r.spec.volume_size)).sum(),
                });
            }
        }
        out
    }

    fn scheduling_request(settings: &settings::Values, volume: &Volume, placed: Vec<Placed>) -> scheduler::Request {
        let soft = |choice: SoftAntiAffinity, default: bool| match choice {
            SoftAntiAffinity::Enabled => true,
            SoftAntiAffinity::Disabled => false,
            SoftAntiAffinity::Default => default,
        };
        let node_soft = settings.bool("replica-soft-anti-affinity");
        let zone_soft = settings.bool("replica-zone-soft-anti-affinity");
        let disk_soft = settings.bool("replica-disk-soft-anti-affinity");
        scheduler::Request {
            size: default_store_bytes(volume.spec.size),
            node_selector: volume.spec.node_selector.clone(),
            disk_selector: volume.spec.disk_selector.clone(),
            node_soft: soft(volume.spec.replica_soft_anti_affinity, node_soft),
            zone_soft: soft(volume.spec.replica_zone_soft_anti_affinity, zone_soft),
            disk_soft: soft(volume.spec.replica_disk_soft_anti_affinity, disk_soft),
            placed,
        }
    }

    /// A new volume gets all its replicas placed at once, or none.
    async fn schedule_new_volume(&self, snapshot: &Snapshot, volume: &Volume) -> Outcome {
        let name = volume.name_any();
        let request = Self::scheduling_request(&snapshot.settings, volume, Vec::new());
        let count = volume.spec.number_of_replicas as usize;
        let limits = Self::limits(&snapshot.settings);
        let now = now();
        match scheduler::schedule_replicas(&request, count, &Self::candidates(snapshot), limits) {
            Err(why) => {
                tracing::info!(volume = %name, reason = %why, "cannot schedule replicas");
                self.set_volume_status(&name, |s| {
                    s.state = "creating".into();
                    s.robustness = "unknown".into();
                    set_condition(&mut s.conditions, "Scheduled", false, why.reason(), &why.to_string(), &now);
                })
                .await
            }
            Ok(placed) => {
                for p in placed {
                    let replica_name = self.create_replica_object(snapshot, volume, &p.node, &p.disk).await?;
                    tracing::info!(volume = %name, replica = %replica_name, node = %p.node, disk = %p.disk, "replica scheduled");
                }
                self.set_volume_status(&name, |s| {
                    set_condition(&mut s.conditions, "Scheduled", true, "", "", &now);
                })
                .await
            }
        }
    }

    /// A new Replica object for `volume` on `node`'s `disk`; returns its name.
    async fn create_replica_object(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        node: &str,
        disk: &str,
    ) -> Result<String, String> {
        let name = volume.name_any();
        let replica_name = format!("{name}-r-{}", short_id());
        let node_object = snapshot.node(node).ok_or("scheduled on a node that vanished")?;
        let disk_spec = node_object.spec.disks.get(disk).ok_or("scheduled on a disk that vanished")?;
        let spec = ReplicaSpec {
            volume_name: name.clone(),
            node_id: node.to_string(),
            disk_id: disk.to_string(),
            data_path: data_path(&disk_spec.path, &replica_name),
            volume_size: volume.spec.size,
            desire_state: "running".into(),
            ..Default::default()
        };
        let mut replica = Replica::new(&replica_name, spec);
        replica.metadata.labels = Some([("ironhorn.io/volume".to_string(), name)].into());
        self.store.create(&replica).await.map_err(ds)?;
        Ok(replica_name)
    }

    async fn reconcile_replica(&self, snapshot: &Snapshot, replica: &Replica) -> Outcome {
        let name = replica.name_any();
        let Some(node) = snapshot.node(&replica.spec.node_id) else {
            return self.set_replica_state(&name, "unknown", "", "node not found").await;
        };
        if !snapshot.node_ready(&replica.spec.node_id) {
            return self.set_replica_state(&name, "unknown", "", "node unreachable").await;
        }
        let im = &node.spec.instance_manager_address;
        let instance = snapshot.instance(&replica.spec.node_id, &name);
        let failed = !replica.spec.failed_at.is_empty();
        match instance {
            Some(i) if i.state == InstanceState::Error as i32 => {
                // Reported, never restarted here behind the engine's back:
                // the replica is marked failed; healing decides what next.
                if !failed {
                    self.mark_replica_failed(&name).await?;
                    let message = format!("replica {name} failed: its process {}", i.error_message);
                    events::record(&self.store, &replica.spec.volume_name, Warning, "ReplicaFailed", &message).await;
                }
                self.set_replica_state(&name, "error", "", &i.error_message).await
            }
            Some(i) => self.set_replica_state(&name, state_name(i.state), &i.address, "").await,
            None if failed => self.set_replica_state(&name, "stopped", "", "").await,
            None => {
                let created = self.cluster.create_instance(im, replica_instance_request(replica)).await?;
                tracing::info!(replica = %name, node = %replica.spec.node_id, store = %replica.spec.data_path, "replica started");
                self.set_replica_state(&name, state_name(created.state), &created.address, "").await
            }
        }
    }

    async fn mark_replica_failed(&self, name: &str) -> Outcome {
        let now = now();
        update::<Replica, D>(&self.store, name, |r| {
            if !r.spec.failed_at.is_empty() {
                return false;
            }
            r.spec.failed_at = now.clone();
            true
        })
        .await
        .map(drop)
        .map_err(ds)
    }

    async fn set_replica_state(&self, name: &str, state: &str, address: &str, error: &str) -> Outcome {
        update_status::<Replica, D>(&self.store, name, |r| {
            let s = r.status.get_or_insert_default();
            let changed = s.current_state != state || s.address != address || s.error != error;
            s.current_state = state.to_string();
            s.address = address.to_string();
            s.error = error.to_string();
            changed
        })
        .await
        .map(drop)
        .map_err(ds)
    }

    async fn reconcile_engine(&self, snapshot: &Snapshot, volume: &Volume, replicas: &[&Replica]) -> Outcome {
        let name = volume.name_any();
        let engine_name = engine_name(&name);
        let engine = snapshot.engines.iter().find(|e| e.name_any() == engine_name);
        let want_node = volume.spec.node_id.clone();
        let now = now();

        // An engine running where it should not: stop it first. (One on an
        // unreachable node cannot be stopped; the new engine's higher epoch
        // fences it out of the replicas.)
        if let Some(e) = engine {
            let running_elsewhere = e.spec.node_id != want_node || want_node.is_empty();
            if running_elsewhere && let Some(node) = snapshot.node(&e.spec.node_id) {
                if snapshot.instance(&e.spec.node_id, &engine_name).is_some() {
                    self.set_volume_status(&name, |s| s.state = "detaching".into()).await?;
                    self.cluster.delete_instance(&node.spec.instance_manager_address, &engine_name, false).await?;
                    tracing::info!(volume = %name, node = %e.spec.node_id, "engine stopped");
                }
            }
        }

        let healthy: Vec<&&Replica> = replicas.iter().filter(|r| r.spec.failed_at.is_empty()).collect();
        let running: Vec<(&str, String)> = healthy
            .iter()
            .filter_map(|r| {
                let i = snapshot.instance(&r.spec.node_id, &r.name_any())?;
                (i.state == InstanceState::Running as i32)
                    .then(|| (r.metadata.name.as_deref().unwrap_or(""), i.address.clone()))
            })
            .collect();

        if want_node.is_empty() {
            if let Some(e) = engine
                && e.spec.desire_state != "stopped"
            {
                update::<Engine, D>(&self.store, &engine_name, |e| {
                    let changed = e.spec.desire_state != "stopped";
                    e.spec.desire_state = "stopped".into();
                    changed
                })
                .await
                .map_err(ds)?;
            }
            let all_up = running.len() == healthy.len() && !healthy.is_empty();
            return self
                .set_volume_status(&name, |s| {
                    s.state = if all_up { "detached".into() } else { "creating".into() };
                    s.robustness = "unknown".into();
                    s.current_node_id.clear();
                    s.endpoint.clear();
                    s.blockdev.clear();
                    s.frontend.clear();
                })
                .await;
        }

        let Some(node) = snapshot.node(&want_node) else {
            return self
                .set_volume_status(&name, |s| {
                    s.state = "error".into();
                    set_condition(
                        &mut s.conditions,
                        "Attached",
                        false,
                        "NodeNotFound",
                        &format!("no node {want_node}"),
                        &now,
                    );
                })
                .await;
        };
        let im = node.spec.instance_manager_address.clone();
        let instance = snapshot.instance(&want_node, &engine_name);
        let alive = instance.is_some_and(|i| {
            matches!(InstanceState::try_from(i.state), Ok(InstanceState::Starting | InstanceState::Running))
        });
        let current_epoch = engine.map(|e| e.spec.epoch).unwrap_or(0);
        let instance_epoch = instance.and_then(|i| match &i.spec {
            Some(pb::instance::Spec::Engine(e)) => Some(e.epoch),
            _ => None,
        });

        if !(alive && instance_epoch == Some(current_epoch) && engine.is_some_and(|e| e.spec.node_id == want_node)) {
            if healthy.is_empty() && !replicas.is_empty() {
                // Every replica failed: nothing to start an engine with.
                return self.salvage(snapshot, volume, replicas, None).await;
            }
            // A healthy replica on an unreachable node would hold the volume
            // back for as long as the node is away: it is failed instead (its
            // data may come back for a delta rebuild). Healthy replicas were
            // all in step when last seen, so any of them serves current data.
            let away: Vec<&&Replica> =
                healthy.iter().filter(|r| !snapshot.node_ready(&r.spec.node_id)).copied().collect();
            if !away.is_empty() && away.len() < healthy.len() {
                for r in away {
                    self.mark_replica_failed(&r.name_any()).await?;
                    let message = format!(
                        "replica {} failed: node {} unreachable while the engine starts",
                        r.name_any(),
                        r.spec.node_id
                    );
                    events::record(&self.store, &name, Warning, "ReplicaFailed", &message).await;
                }
                return Ok(());
            }
            // (Re)start the engine: every healthy replica must be up first.
            if running.is_empty() || running.len() < healthy.len() {
                return self
                    .set_volume_status(&name, |s| {
                        s.state = "attaching".into();
                        s.current_node_id = want_node.clone();
                    })
                    .await;
            }
            // Whatever status said before (a manager restart reads the last
            // one written), the volume is attaching now, with no endpoint.
            self.set_volume_status(&name, |s| {
                s.state = "attaching".into();
                s.current_node_id = want_node.clone();
                s.endpoint.clear();
                s.blockdev.clear();
            })
            .await?;
            if let Some(i) = instance {
                // A dead or stale engine instance: clear it before the new one.
                self.cluster.delete_instance(&im, &i.name, false).await?;
            }
            let address_map: BTreeMap<String, String> =
                running.iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
            let spec = EngineSpec {
                volume_name: name.clone(),
                node_id: want_node.clone(),
                volume_size: volume.spec.size,
                frontend: volume.spec.frontend,
                replica_address_map: address_map.clone(),
                epoch: 0, // minted below
                desire_state: "running".into(),
            };
            // The epoch is stored before any process can use it, by
            // compare-and-swap against the epoch this pass saw.
            let epoch =
                match epoch::mint(&self.store, &engine_name, engine.map(|e| e.spec.epoch), spec).await.map_err(ds)? {
                    epoch::Mint::Minted(epoch) => epoch,
                    epoch::Mint::Lost => {
                        tracing::info!(volume = %name, "engine object changed meanwhile; the next pass decides again");
                        return Ok(());
                    }
                };
            let timeout = snapshot.settings.u64("engine-replica-timeout");
            let request = pb::CreateRequest {
                name: engine_name.clone(),
                spec: Some(pb::create_request::Spec::Engine(pb::EngineSpec {
                    volume: name.clone(),
                    size_bytes: volume.spec.size,
                    epoch,
                    replicas: address_map.values().cloned().collect(),
                    blockdev: volume.spec.frontend == Frontend::Blockdev,
                    replica_timeout_secs: timeout.clamp(1, 600) as u32,
                    rebuild_mib_per_sec: 0,
                    write_majority: match volume.spec.write_quorum {
                        WriteQuorum::One => false,
                        WriteQuorum::Majority => true,
                        WriteQuorum::Default => snapshot.settings.bool("default-write-majority"),
                    },
                })),
            };
            self.cluster.create_instance(&im, request).await?;
            tracing::info!(volume = %name, node = %want_node, epoch, "engine started");
            return self
                .set_volume_status(&name, |s| {
                    s.state = "attaching".into();
                    s.current_node_id = want_node.clone();
                })
                .await;
        }

        let instance = instance.expect("alive");
        if instance.state != InstanceState::Running as i32 {
            return self.set_volume_status(&name, |s| s.state = "attaching".into()).await;
        }
        let engine = engine.expect("checked above");
        let status = self.cluster.engine_status(&instance.address).await;
        let by_address: HashMap<&str, &str> =
            engine.spec.replica_address_map.iter().map(|(n, a)| (a.as_str(), n.as_str())).collect();
        let mut modes = BTreeMap::new();
        let mut rebuilds = BTreeMap::new();
        let mut error = String::new();
        match &status {
            Ok(s) => {
                for r in &s.replicas {
                    let replica = by_address.get(r.address.as_str()).copied().unwrap_or(r.address.as_str());
                    modes.insert(replica.to_string(), r.mode.clone());
                }
                // Newest last, so each address keeps its latest rebuild:
                // "state@start_ms" (tells one rebuild from the next).
                for r in s.rebuilds.iter().rev() {
                    rebuilds.insert(r.replica.clone(), format!("{}@{}", r.state, r.started_unix_ms));
                }
            }
            Err(e) => error = e.clone(),
        }
        let endpoint = instance.nbd_endpoint.clone();
        let blockdev = instance.blockdev_path.clone();
        let address = instance.address.clone();
        update_status::<Engine, D>(&self.store, &engine_name, |e| {
            let s = e.status.get_or_insert_default();
            let before = s.clone();
            s.current_state = "running".into();
            s.instance_manager_name = format!("im-{want_node}");
            s.address = address.clone();
            s.endpoint = endpoint.clone();
            if status.is_ok() {
                s.replica_mode_map = modes.clone();
                s.rebuild_status = rebuilds.clone();
            }
            s.error = error.clone();
            *s != before
        })
        .await
        .map_err(ds)?;

        if let Ok(engine_status) = &status {
            self.heal(snapshot, volume, engine, &instance.address, engine_status, replicas).await?;
            self.reconcile_snapshots(snapshot, &name, &instance.address).await?;
        }
        let rw = modes.values().filter(|m| *m == "RW").count();
        let robustness = if status.is_err() {
            "unknown"
        } else if rw == 0 {
            "faulted"
        } else if rw >= volume.spec.number_of_replicas as usize {
            "healthy"
        } else {
            "degraded"
        };
        let healthy_now: Vec<String> = modes.iter().filter(|(_, m)| *m == "RW").map(|(r, _)| r.clone()).collect();
        for r in replicas.iter().filter(|r| healthy_now.contains(&r.name_any()) && r.spec.healthy_at.is_empty()) {
            let t = now.clone();
            update::<Replica, D>(&self.store, &r.name_any(), |r| {
                r.spec.healthy_at = t.clone();
                true
            })
            .await
            .map_err(ds)?;
        }
        let frontend = match volume.spec.frontend {
            Frontend::Nbd => "nbd",
            Frontend::Blockdev => "blockdev",
        };
        // Out of space: every RW replica refused the last write. The replicas
        // are not failed (nothing changed on them; reads go on); the volume
        // says so until a write lands again.
        let out_of_space = status.as_ref().ok().map(|s| s.out_of_space);
        let was_out_of_space = volume
            .status
            .as_ref()
            .and_then(|s| condition(&s.conditions, "OutOfSpace"))
            .is_some_and(|c| c.status == "True");
        if out_of_space == Some(true) && !was_out_of_space {
            let message = "every replica refused a write for lack of space; writes fail with ENOSPC, reads go on";
            events::record(&self.store, &name, Warning, "OutOfSpace", message).await;
        }
        self.set_volume_status(&name, |s| {
            match out_of_space {
                Some(true) => set_condition(
                    &mut s.conditions,
                    "OutOfSpace",
                    true,
                    "ReplicasOutOfSpace",
                    "every replica refused the last write for lack of space",
                    &now,
                ),
                Some(false) => set_condition(&mut s.conditions, "OutOfSpace", false, "", "", &now),
                None => {}
            }
            s.state = "attached".into();
            s.current_node_id = want_node.clone();
            s.endpoint = endpoint.clone();
            s.blockdev = blockdev.clone();
            s.frontend = frontend.into();
            if robustness == "degraded" && s.robustness != "degraded" {
                s.last_degraded_at = now.clone();
            } else if robustness != "degraded" {
                s.last_degraded_at.clear();
            }
            s.robustness = robustness.into();
            set_condition(&mut s.conditions, "Attached", true, "", "", &now);
        })
        .await
    }

    /// Applies the volume's Snapshot objects to its running engine (see
    /// `snapshots`).
    async fn reconcile_snapshots(&self, snapshot: &Snapshot, volume: &str, engine: &str) -> Outcome {
        let objects: Vec<&crate::crd::Snapshot> =
            snapshot.snapshots.iter().filter(|s| s.spec.volume == volume).collect();
        if objects.is_empty() {
            return Ok(());
        }
        let held = |list: Vec<ironhorn_proto::engine::Snapshot>| -> snapshots::Held {
            list.into_iter().map(|s| (s.name, (s.created_unix_ms, s.size_bytes))).collect()
        };
        let held = held(self.cluster.engine_snapshot(engine, SnapshotOp::List).await?);
        let views: Vec<snapshots::Object> = objects
            .iter()
            .map(|s| snapshots::Object {
                name: s.name_any(),
                deleting: s.metadata.deletion_timestamp.is_some(),
                ready: s.status.as_ref().is_some_and(|st| st.ready_to_use),
            })
            .collect();
        for action in snapshots::decide(&views, &held) {
            match action {
                snapshots::Action::Take(name) => {
                    match self.cluster.engine_snapshot(engine, SnapshotOp::Create(name.clone())).await {
                        Ok(_) => {
                            let message = format!("snapshot {name} taken");
                            events::record(&self.store, volume, Normal, "SnapshotTaken", &message).await;
                        }
                        Err(e) => {
                            update_status::<crate::crd::Snapshot, D>(&self.store, &name, |s| {
                                let st = s.status.get_or_insert_default();
                                let changed = st.message != e;
                                st.message = e.clone();
                                changed
                            })
                            .await
                            .map_err(ds)?;
                        }
                    }
                }
                snapshots::Action::MarkReady { name, created_unix_ms, size } => {
                    let created = jiff::Timestamp::from_millisecond(created_unix_ms as i64)
                        .map(|t| t.to_string())
                        .unwrap_or_default();
                    update_status::<crate::crd::Snapshot, D>(&self.store, &name, |s| {
                        let st = s.status.get_or_insert_default();
                        st.ready_to_use = true;
                        st.creation_time = created.clone();
                        st.size = size;
                        st.message.clear();
                        true
                    })
                    .await
                    .map_err(ds)?;
                }
                snapshots::Action::Delete(name) => {
                    self.cluster.engine_snapshot(engine, SnapshotOp::Delete(name.clone())).await?;
                    let message = format!("snapshot {name} deleted");
                    events::record(&self.store, volume, Normal, "SnapshotDeleted", &message).await;
                }
                snapshots::Action::Release(name) => self.release_snapshot(&name).await?,
            }
        }
        Ok(())
    }

    /// Lets a Snapshot object being deleted go (drops the finalizer).
    async fn release_snapshot(&self, name: &str) -> Outcome {
        update::<crate::crd::Snapshot, D>(&self.store, name, |s| {
            let finalizers = s.metadata.finalizers.get_or_insert_default();
            let before = finalizers.len();
            finalizers.retain(|f| f != FINALIZER);
            finalizers.len() != before
        })
        .await
        .map(drop)
        .map_err(ds)
    }

    /// Restores the replica count of an attached volume (see `replenish`).
    async fn heal(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        engine: &Engine,
        engine_address: &str,
        report: &ironhorn_proto::engine::StatusResponse,
        replicas: &[&Replica],
    ) -> Outcome {
        let name = volume.name_any();
        let engine_name = engine.name_any();
        let by_address: HashMap<&str, &str> =
            engine.spec.replica_address_map.iter().map(|(n, a)| (a.as_str(), n.as_str())).collect();

        // Rebuilds that finished since the last pass (the engine keeps its
        // recent history; the Engine status remembers what was seen).
        let seen = engine.status.as_ref().map(|s| s.rebuild_status.clone()).unwrap_or_default();
        let mut reported_done = BTreeSet::new();
        for done in report.rebuilds.iter().filter(|b| b.state == "done") {
            if !reported_done.insert(done.replica.clone()) {
                continue; // an older rebuild of the same address
            }
            let key = format!("done@{}", done.started_unix_ms);
            if seen.get(&done.replica) == Some(&key) {
                continue;
            }
            let replica = by_address.get(done.replica.as_str()).copied().unwrap_or(done.replica.as_str());
            let seconds = done.finished_unix_ms.saturating_sub(done.started_unix_ms) as f64 / 1000.0;
            let message = format!(
                "rebuild of {replica} finished in {seconds:.1} s, copied {:.1} MiB ({}, {:.1} MiB compared)",
                done.copied_bytes as f64 / (1 << 20) as f64,
                done.method,
                done.compared_bytes as f64 / (1 << 20) as f64,
            );
            events::record(&self.store, &name, Normal, "RebuildFinished", &message).await;
        }

        // Replicas the engine dropped, or the manager saw fail: failed, and
        // out of the engine, so the engine's report and its spec agree.
        let mut removed = Vec::new();
        for r in &report.replicas {
            if r.mode != "ERR" {
                continue;
            }
            if let Some(replica) = by_address.get(r.address.as_str())
                && replicas.iter().any(|x| x.name_any() == *replica && x.spec.failed_at.is_empty())
            {
                self.mark_replica_failed(replica).await?;
                let message =
                    format!("replica {replica} failed: {}", if r.error.is_empty() { "error" } else { &r.error });
                events::record(&self.store, &name, Warning, "ReplicaFailed", &message).await;
            }
            self.cluster.engine_replica_remove(engine_address, &r.address).await?;
            removed.push(r.address.clone());
        }
        for r in replicas.iter().filter(|r| !r.spec.failed_at.is_empty()) {
            if let Some(address) = engine.spec.replica_address_map.get(&r.name_any())
                && !removed.contains(address)
            {
                if report.replicas.iter().any(|x| x.address == *address)
                    && let Err(e) = self.cluster.engine_replica_remove(engine_address, address).await
                {
                    // The engine refuses to drop its last healthy replica
                    // (it has not seen it die yet): the decision below sees
                    // no healthy replica and salvages.
                    tracing::info!(volume = %name, replica = %r.name_any(), error = %e, "engine kept a failed replica");
                    continue;
                }
                removed.push(address.clone());
            }
        }
        if !removed.is_empty() {
            update::<Engine, D>(&self.store, &engine_name, |e| {
                let before = e.spec.replica_address_map.len();
                e.spec.replica_address_map.retain(|_, a| !removed.contains(a));
                e.spec.replica_address_map.len() != before
            })
            .await
            .map_err(ds)?;
            return Ok(()); // the next pass sees the new view
        }

        // 1. Only on a current view.
        let reported: BTreeSet<&str> = report.replicas.iter().map(|r| r.address.as_str()).collect();
        let given: BTreeSet<&str> = engine.spec.replica_address_map.values().map(String::as_str).collect();
        let view_current = reported == given;
        let stale_too_long = {
            let mut stale = self.view_stale_since.lock().expect("view map");
            if view_current {
                stale.remove(&name);
                false
            } else {
                let since = *stale.entry(name.clone()).or_insert_with(std::time::Instant::now);
                let expired = since.elapsed() > VIEW_STALE_LIMIT;
                if expired {
                    stale.remove(&name);
                }
                expired
            }
        };
        if stale_too_long {
            let missing: Vec<String> = engine
                .spec
                .replica_address_map
                .iter()
                .filter(|(_, a)| !reported.contains(a.as_str()))
                .map(|(n, _)| n.clone())
                .collect();
            for replica in &missing {
                self.mark_replica_failed(replica).await?;
                let message = format!("replica {replica} never joined the engine; marked failed");
                events::record(&self.store, &name, Warning, "ReplicaFailed", &message).await;
            }
            update::<Engine, D>(&self.store, &engine_name, |e| {
                e.spec.replica_address_map.retain(|n, _| !missing.contains(n));
                true
            })
            .await
            .map_err(ds)?;
            return Ok(());
        }

        let rebuilding = report.replicas.iter().any(|r| r.mode == "WO");
        let mut rebuilds_on_node: HashMap<String, usize> = HashMap::new();
        for e in &snapshot.engines {
            for (replica, mode) in e.status.as_ref().map(|s| s.replica_mode_map.clone()).unwrap_or_default() {
                if mode == "WO"
                    && let Some(r) = snapshot.replicas.iter().find(|r| r.name_any() == replica)
                {
                    *rebuilds_on_node.entry(r.spec.node_id.clone()).or_default() += 1;
                }
            }
        }
        let limit = snapshot.settings.u64("concurrent-replica-rebuild-per-node-limit") as usize;

        // A healthy replica the engine does not have yet (reused, created or
        // salvaged): bring it in, one rebuild at a time.
        if view_current && !rebuilding {
            for r in replicas.iter().filter(|r| r.spec.failed_at.is_empty()) {
                let replica = r.name_any();
                if engine.spec.replica_address_map.contains_key(&replica) {
                    continue;
                }
                let Some(i) = snapshot.instance(&r.spec.node_id, &replica) else { continue };
                if i.state != InstanceState::Running as i32 {
                    continue;
                }
                if rebuilds_on_node.get(&r.spec.node_id).copied().unwrap_or(0) >= limit {
                    tracing::info!(volume = %name, %replica, node = %r.spec.node_id, "rebuild waits: node at its rebuild limit");
                    return Ok(());
                }
                let address = i.address.clone();
                let n = replica.clone();
                update::<Engine, D>(&self.store, &engine_name, |e| {
                    e.spec.replica_address_map.insert(n.clone(), address.clone());
                    true
                })
                .await
                .map_err(ds)?;
                self.cluster.engine_replica_add(engine_address, &i.address).await?;
                let message = format!("rebuild of {replica} on {} started", r.spec.node_id);
                events::record(&self.store, &name, Normal, "RebuildStarted", &message).await;
                return Ok(());
            }
        }

        // The decision.
        let now_ts = jiff::Timestamp::now();
        let parse = |t: &str| t.parse::<jiff::Timestamp>().ok();
        let view = replenish::VolumeView {
            desired: volume.spec.number_of_replicas as usize,
            replicas: replicas
                .iter()
                .map(|r| replenish::ReplicaView {
                    name: r.name_any(),
                    node: r.spec.node_id.clone(),
                    usable: snapshot.replica_usable(r),
                    data_exists: snapshot.data_exists(r),
                    failed_at: parse(&r.spec.failed_at),
                    rebuild_retry_count: r.spec.rebuild_retry_count,
                    mode: engine
                        .spec
                        .replica_address_map
                        .get(&r.name_any())
                        .and_then(|a| report.replicas.iter().find(|x| x.address == *a))
                        .map(|x| x.mode.clone()),
                })
                .collect(),
            view_current,
            degraded_since: volume.status.as_ref().and_then(|s| parse(&s.last_degraded_at)),
            rebuilds_on_node,
        };
        let secs = |v: u64| Duration::from_secs(v);
        let stale_timeout = if volume.spec.stale_replica_timeout > 0 {
            secs(volume.spec.stale_replica_timeout * 60)
        } else {
            secs(snapshot.settings.u64("stale-replica-timeout"))
        };
        let policy = replenish::Policy {
            now: now_ts,
            replenishment_wait: secs(snapshot.settings.u64("replica-replenishment-wait-interval")),
            retry_max: snapshot.settings.u64("replica-rebuild-retry-max") as u32,
            backoff_initial: secs(snapshot.settings.u64("replica-rebuild-backoff-initial")),
            backoff_max: secs(snapshot.settings.u64("replica-rebuild-backoff-max")),
            stale_timeout,
            per_node_rebuild_limit: limit,
        };
        let plan = replenish::decide(&view, &policy);
        for stale in &plan.delete_stale {
            if let Some(r) = replicas.iter().find(|r| r.name_any() == *stale) {
                match self.delete_replica(snapshot, r).await {
                    Ok(()) => {
                        let message =
                            format!("deleted stale replica {stale} (failed at {}) and its data", r.spec.failed_at);
                        events::record(&self.store, &name, Normal, "StaleReplicaDeleted", &message).await;
                    }
                    Err(e) => {
                        tracing::warn!(volume = %name, replica = %stale, error = %e, "stale replica not deleted yet")
                    }
                }
            }
        }
        match plan.action {
            Action::Nothing => Ok(()),
            Action::Wait(why) => {
                tracing::debug!(volume = %name, "heal waits: {why}");
                Ok(())
            }
            Action::Reuse { replica, retry } => {
                let r = replicas.iter().find(|r| r.name_any() == replica).expect("decided from these");
                self.restart_replica_instance(snapshot, r).await?;
                update::<Replica, D>(&self.store, &replica, |r| {
                    r.spec.failed_at.clear();
                    r.spec.rebuild_retry_count = retry;
                    true
                })
                .await
                .map_err(ds)?;
                let message = format!("reused replica {replica} (retry {retry})");
                events::record(&self.store, &name, Normal, "ReplicaReused", &message).await;
                Ok(())
            }
            Action::Create => self.create_replacement(snapshot, volume, replicas).await,
            Action::Salvage { .. } => self.salvage(snapshot, volume, replicas, Some((engine, engine_address))).await,
            Action::Remove { replica } => {
                // Out of the engine first (it refuses to drop its last RW
                // replica), then out of its view, then the process and data.
                let r = replicas.iter().find(|r| r.name_any() == replica).expect("decided from these");
                if let Some(address) = engine.spec.replica_address_map.get(&replica) {
                    self.cluster.engine_replica_remove(engine_address, address).await?;
                }
                update::<Engine, D>(&self.store, &engine_name, |e| {
                    e.spec.replica_address_map.remove(&replica).is_some()
                })
                .await
                .map_err(ds)?;
                self.delete_replica(snapshot, r).await?;
                let message = format!(
                    "removed replica {replica} on {}: {} replicas wanted",
                    r.spec.node_id, volume.spec.number_of_replicas
                );
                events::record(&self.store, &name, Normal, "ReplicaRemoved", &message).await;
                Ok(())
            }
        }
    }

    /// Starts a replica's process again on its old store (data kept).
    async fn restart_replica_instance(&self, snapshot: &Snapshot, replica: &Replica) -> Outcome {
        let name = replica.name_any();
        let node = snapshot.node(&replica.spec.node_id).ok_or("replica's node vanished")?;
        let im = &node.spec.instance_manager_address;
        if let Some(i) = snapshot.instance(&replica.spec.node_id, &name) {
            if matches!(InstanceState::try_from(i.state), Ok(InstanceState::Running | InstanceState::Starting)) {
                return Ok(());
            }
            self.cluster.delete_instance(im, &name, false).await?;
        }
        self.cluster.create_instance(im, replica_instance_request(replica)).await.map(drop)
    }

    async fn create_replacement(&self, snapshot: &Snapshot, volume: &Volume, replicas: &[&Replica]) -> Outcome {
        let name = volume.name_any();
        let placed = replicas
            .iter()
            .filter(|r| r.spec.failed_at.is_empty())
            .map(|r| {
                let zone = snapshot.node(&r.spec.node_id).and_then(|n| n.status.as_ref()).map(|s| s.zone.clone());
                Placed { node: r.spec.node_id.clone(), disk: r.spec.disk_id.clone(), zone: zone.unwrap_or_default() }
            })
            .collect();
        let request = Self::scheduling_request(&snapshot.settings, volume, placed);
        let limits = Self::limits(&snapshot.settings);
        let now = now();
        match scheduler::schedule_replica(&request, &Self::candidates(snapshot), limits) {
            Err(why) => {
                let was = volume.status.as_ref().and_then(|s| condition(&s.conditions, "Scheduled").cloned());
                if was.is_none_or(|c| c.status != "False" || c.reason != why.reason()) {
                    let message = format!("cannot place a new replica: {why}");
                    events::record(&self.store, &name, Warning, "ReplicaUnschedulable", &message).await;
                }
                self.set_volume_status(&name, |s| {
                    set_condition(&mut s.conditions, "Scheduled", false, why.reason(), &why.to_string(), &now);
                })
                .await
            }
            Ok(pick) => {
                let replica_name = self.create_replica_object(snapshot, volume, &pick.node, &pick.disk).await?;
                self.set_volume_status(&name, |s| set_condition(&mut s.conditions, "Scheduled", true, "", "", &now))
                    .await?;
                let message = format!("created replica {replica_name} on node {}", pick.node);
                events::record(&self.store, &name, Normal, "ReplicaCreated", &message).await;
                Ok(())
            }
        }
    }

    /// Every replica failed: clear their failed marks, start them again on
    /// their old stores, and restart the engine with all of them. The engine
    /// serves from the one with the newest durable state (revision counter,
    /// epoch) and rebuilds the others from it; it never serves older data
    /// when newer exists.
    async fn salvage(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        replicas: &[&Replica],
        engine: Option<(&Engine, &str)>,
    ) -> Outcome {
        let name = volume.name_any();
        let usable: Vec<&&Replica> =
            replicas.iter().filter(|r| snapshot.replica_usable(r) && snapshot.data_exists(r) == Some(true)).collect();
        if usable.is_empty() {
            return self
                .set_volume_status(&name, |s| {
                    s.robustness = "faulted".into();
                })
                .await;
        }
        if let Some((engine, _)) = engine
            && let Some(node) = snapshot.node(&engine.spec.node_id)
        {
            // An engine with no healthy replica serves nothing; a new one
            // (new epoch) starts once the replicas run.
            self.cluster.delete_instance(&node.spec.instance_manager_address, &engine.name_any(), false).await?;
        }
        let names: Vec<String> = usable.iter().map(|r| r.name_any()).collect();
        for r in &usable {
            self.restart_replica_instance(snapshot, r).await?;
            update::<Replica, D>(&self.store, &r.name_any(), |r| {
                let changed = !r.spec.failed_at.is_empty();
                r.spec.failed_at.clear();
                changed
            })
            .await
            .map_err(ds)?;
        }
        let message = format!(
            "all replicas failed; salvaging from {}: the engine restarts from the newest durable state and rebuilds the others",
            names.join(", ")
        );
        events::record(&self.store, &name, Warning, "Salvage", &message).await;
        self.set_volume_status(&name, |s| {
            s.robustness = "faulted".into();
            s.state = "attaching".into();
            s.endpoint.clear();
        })
        .await
    }

    async fn delete_volume(&self, snapshot: &Snapshot, volume: &Volume) -> Outcome {
        let name = volume.name_any();
        self.set_volume_status(&name, |s| s.state = "deleting".into()).await?;
        let engine_name = engine_name(&name);
        if let Some(engine) = snapshot.engines.iter().find(|e| e.name_any() == engine_name) {
            if let Some(node) = snapshot.node(&engine.spec.node_id)
                && snapshot.instance(&engine.spec.node_id, &engine_name).is_some()
            {
                self.cluster.delete_instance(&node.spec.instance_manager_address, &engine_name, false).await?;
            }
            self.store.delete::<Engine>(&engine_name).await.map_err(ds)?;
        }
        for replica in snapshot.replicas_of(&name) {
            self.delete_replica(snapshot, replica).await?;
        }
        // Its snapshots went with its replicas.
        for s in snapshot.snapshots.iter().filter(|s| s.spec.volume == name) {
            self.store.delete::<crate::crd::Snapshot>(&s.name_any()).await.map_err(ds)?;
            self.release_snapshot(&s.name_any()).await?;
        }
        update::<Volume, D>(&self.store, &name, |v| {
            let finalizers = v.metadata.finalizers.get_or_insert_default();
            let before = finalizers.len();
            finalizers.retain(|f| f != FINALIZER);
            finalizers.len() != before
        })
        .await
        .map_err(ds)?;
        tracing::info!(volume = %name, "volume deleted");
        Ok(())
    }

    /// Stops a replica's process and removes its store, then its object.
    pub async fn delete_replica(&self, snapshot: &Snapshot, replica: &Replica) -> Outcome {
        let name = replica.name_any();
        let node = snapshot.node(&replica.spec.node_id).ok_or_else(|| format!("replica {name}: node not found"))?;
        if !snapshot.node_ready(&replica.spec.node_id) {
            return Err(format!(
                "replica {name}: node {} unreachable; its store stays until it is back",
                replica.spec.node_id
            ));
        }
        let im = &node.spec.instance_manager_address;
        if snapshot.instance(&replica.spec.node_id, &name).is_some() {
            self.cluster.delete_instance(im, &name, true).await?;
        } else {
            self.cluster.delete_store(im, &replica.spec.data_path).await?;
        }
        self.store.delete::<Replica>(&name).await.map_err(ds)?;
        tracing::info!(replica = %name, store = %replica.spec.data_path, "replica and its store deleted");
        Ok(())
    }
}

/// A disk's (maximum, available) bytes: its source's, or within its cap.
pub fn disk_capacity(reply: &pb::DiskStatusResponse, cap: u64) -> (u64, u64) {
    if cap == 0 || cap >= reply.total_bytes {
        return (reply.total_bytes, reply.free_bytes);
    }
    (cap, reply.free_bytes.min(cap.saturating_sub(reply.stores_bytes)))
}

/// The instance that serves a replica: its store, its size.
fn replica_instance_request(replica: &Replica) -> pb::CreateRequest {
    pb::CreateRequest {
        name: replica.name_any(),
        spec: Some(pb::create_request::Spec::Replica(pb::ReplicaSpec {
            store: replica.spec.data_path.clone(),
            size_bytes: replica.spec.volume_size,
        })),
    }
}

/// Four hex digits, different on every call in practice.
fn short_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = jiff::Timestamp::now().as_nanosecond() as u64 ^ COUNTER.fetch_add(0x9e37_79b9, Ordering::Relaxed);
    let mixed = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("{:04x}", (mixed >> 48) as u16)
}
