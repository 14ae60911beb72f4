//! The controllers: node, volume (with its engine and replicas) and instance
//! manager. One loop makes passes, on every datastore change and on a timer;
//! each pass reads a fresh snapshot (objects from the datastore, processes
//! from every node's instance manager), reconciles the nodes, and starts each
//! volume that is due in a task of its own (see `queue`), which decides,
//! applies through [`Cluster`], then writes status. Nothing is assumed about why a pass ran,
//! so a manager killed at any point and started again simply carries on: the
//! processes it started are found in the instance managers' lists and kept.
//!
//! Fencing: an engine is started only after its Engine object holds an epoch
//! higher than any it was started with before (written first, then the
//! process is created), so two engines of a volume never share an epoch.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
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
use crate::{registration, settings, snapshots};

mod backoff;
mod engine;
mod expand;
mod heal;
mod nodes;
mod placement;
mod polls;
mod queue;
mod replicas;
mod restore;
mod scrub;
mod volume_snapshots;

pub use placement::{disk_candidates, limits};

pub const ENGINE_SUFFIX: &str = "-e";

pub fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// Unix milliseconds as RFC 3339 ("" for 0), as times are in status.
fn unix_ms_text(ms: u64) -> String {
    if ms == 0 {
        return String::new();
    }
    jiff::Timestamp::from_millisecond(ms as i64).map(|t| t.to_string()).unwrap_or_default()
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
    /// Node name → its heartbeat as judged at the pass's start.
    pub heartbeats: HashMap<String, registration::Heartbeat>,
    /// Nodes asked and not answering yet (their poll is still out): not
    /// ready for this pass, but not judged down either (their status and
    /// their replicas' states are left as they were).
    pub unanswered: HashSet<String>,
}

impl Snapshot {
    fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name_any() == name)
    }

    /// Its instance manager answers, and its heartbeat (if it keeps one)
    /// is fresh.
    fn node_ready(&self, name: &str) -> bool {
        matches!(self.instances.get(name), Some(Ok(_))) && self.heartbeat_problem(name).is_none()
    }

    fn heartbeat_problem(&self, name: &str) -> Option<String> {
        match self.heartbeats.get(name) {
            Some(registration::Heartbeat::Expired { seconds }) => {
                Some(format!("heartbeat lease not renewed for {seconds} s"))
            }
            _ => None,
        }
    }

    /// Whether `node`'s instance manager answered this pass (its instance
    /// list is known).
    fn instances_known(&self, node: &str) -> bool {
        matches!(self.instances.get(node), Some(Ok(_)))
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

    /// Whether some process is starting or stopping: its next state is
    /// worth a look soon (an engine's Running is what an attach waits for).
    fn in_transition(&self) -> bool {
        self.instances
            .values()
            .flatten()
            .flatten()
            .any(|i| matches!(InstanceState::try_from(i.state), Ok(InstanceState::Starting | InstanceState::Stopping)))
    }
}

#[derive(Clone)]
pub struct Controller<D: Datastore, C: Cluster> {
    pub store: D,
    pub cluster: C,
    /// Volume → since when its engine's report has disagreed with the
    /// replica set it was given (in memory: a restart just waits afresh).
    view_stale_since: Arc<Mutex<HashMap<String, std::time::Instant>>>,
    /// Volumes a copy task of this manager is filling (see `restore`).
    restoring: Arc<Mutex<HashSet<String>>>,
    /// Whether this manager leads (only the leader reconciles).
    gate: crate::leader::Gate,
    /// How long each node's instance manager is waited for (see `polls`).
    polls: Arc<polls::Polls>,
    /// Volumes whose last reconcile failed, waiting to try again.
    backoff: Arc<backoff::Backoff>,
    /// Asks for another pass at once (a step changed objects no watch
    /// reports, and the next step needs a fresh snapshot).
    again: Arc<tokio::sync::Notify>,
    /// Volumes being reconciled, each in a task of its own (see `queue`).
    queue: Arc<queue::Queue>,
    /// Volume reconciles at work at once (a slow one gives its slot up).
    slots: Arc<tokio::sync::Semaphore>,
    /// The newest pass's snapshot: a volume's task that waited for a slot
    /// decides on it.
    latest: Arc<Mutex<Option<Arc<Snapshot>>>>,
}

/// Reconcile passes this process has made and the time they took, for the
/// metrics page (`ironhorn_manager_reconcile_*`). Process-wide: a manager
/// process runs one controller.
pub static PASSES: PassCounter = PassCounter { passes: AtomicU64::new(0), micros: AtomicU64::new(0) };

pub struct PassCounter {
    passes: AtomicU64,
    micros: AtomicU64,
}

impl PassCounter {
    fn record(&self, took: Duration) {
        self.micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        self.passes.fetch_add(1, Ordering::Relaxed);
    }

    /// (passes, seconds they took) so far.
    pub fn read(&self) -> (u64, f64) {
        let passes = self.passes.load(Ordering::Relaxed);
        (passes, self.micros.load(Ordering::Relaxed) as f64 / 1e6)
    }
}

/// How long an engine may disagree with the replica set it was given before
/// the missing replicas are taken as failed (a `replica add` that failed
/// before the replica ever showed up).
const VIEW_STALE_LIMIT: Duration = Duration::from_secs(30);

type Outcome = Result<(), String>;

/// Volume reconciles at work at once.
const VOLUMES_AT_ONCE: usize = 8;

/// How long a volume's reconcile holds its slot: one that takes longer (a
/// call waiting for its timeout) goes on without one.
const SLOT_HOLD: Duration = Duration::from_secs(1);

/// How soon a pass looks again at processes on their way up or down (no
/// watch reports an instance manager's processes).
const LOOK_AGAIN: Duration = Duration::from_millis(150);

/// The least time between the starts of two passes: volume tasks change
/// objects as they go, and each change would otherwise start a pass (every
/// node asked, every object listed).
const PASS_GAP: Duration = Duration::from_millis(100);

/// The version of a volume its backoff is kept for.
fn version(volume: &Volume) -> backoff::Version {
    (volume.metadata.generation.unwrap_or(0), volume.metadata.deletion_timestamp.is_some())
}

fn ds(e: datastore::Error) -> String {
    e.to_string()
}

impl<D: Datastore, C: Cluster> Controller<D, C> {
    pub fn new(store: D, cluster: C) -> Self {
        Self {
            store,
            cluster,
            view_stale_since: Arc::default(),
            restoring: Arc::default(),
            gate: crate::leader::Gate::always(),
            polls: Arc::default(),
            backoff: Arc::default(),
            again: Arc::default(),
            queue: Arc::default(),
            slots: Arc::new(tokio::sync::Semaphore::new(VOLUMES_AT_ONCE)),
            latest: Arc::default(),
        }
    }

    /// Reconciles only while `gate` says this manager leads.
    pub fn with_gate(mut self, gate: crate::leader::Gate) -> Self {
        self.gate = gate;
        self
    }

    /// Reconciles until `stop` resolves: on every change, and at least every
    /// `resync`.
    pub async fn run(&self, resync: Duration, stop: impl std::future::Future<Output = ()>) {
        let mut volumes = self.store.watch::<Volume>().await.ok();
        let mut nodes = self.store.watch::<Node>().await.ok();
        let mut stop = std::pin::pin!(stop);
        loop {
            let started = tokio::time::Instant::now();
            if !self.gate.is_leader() {
                tracing::debug!("not the leader: no reconcile");
            } else if let Err(e) = self.pass().await {
                tracing::warn!(error = %e, "reconcile pass failed");
            }
            // A process on its way up or down: its next state is looked at
            // soon, not at the resync.
            let in_transition =
                self.latest.lock().expect("latest snapshot").as_ref().is_some_and(|s| s.in_transition());
            let wait = if in_transition { LOOK_AGAIN } else { resync };
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
                _ = tokio::time::sleep(wait) => {}
                // A node a pass stopped waiting for answered.
                _ = self.polls.late_answer.notified() => {}
                _ = self.again.notified() => {}
                _ = changed => {
                    // Let a burst of changes settle into one pass.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    if let Some(v) = &mut volumes { while v.try_recv().is_ok() {} }
                    if let Some(n) = &mut nodes { while n.try_recv().is_ok() {} }
                }
            }
            tokio::time::sleep_until(started + PASS_GAP).await;
        }
    }

    pub async fn snapshot(&self) -> Result<Snapshot, String> {
        let nodes: Vec<Node> = self.store.list().await.map_err(ds)?;
        let settings = settings::Values::load(&self.store).await.map_err(ds)?;
        let leases: Vec<k8s_openapi::api::coordination::v1::Lease> = self.store.list().await.map_err(ds)?;
        let timeout = Duration::from_secs(settings.u64("node-heartbeat-timeout"));
        let now = jiff::Timestamp::now();
        let heartbeats = nodes
            .iter()
            .map(|n| {
                let lease_name = registration::heartbeat_lease_name(&n.name_any());
                let lease = leases.iter().find(|l| l.metadata.name.as_deref() == Some(lease_name.as_str()));
                (n.name_any(), registration::heartbeat(lease, now, timeout))
            })
            .collect();
        // Every node at once, each from a task of its own (see `polls`).
        let polled = join_all(nodes.iter().map(|node| self.poll_node(node))).await;
        let mut instances = HashMap::new();
        let mut disks = HashMap::new();
        let mut unanswered = HashSet::new();
        for (name, view) in polled {
            let view = match view {
                Some(view) => view,
                None => {
                    unanswered.insert(name.clone());
                    let node = nodes.iter().find(|n| n.name_any() == name).expect("polled node");
                    let why = format!("instance manager {}: no answer yet", node.spec.instance_manager_address);
                    polls::NodeView::unanswered(why, node.spec.disks.keys())
                }
            };
            for (disk, status) in view.disks {
                disks.insert((name.clone(), disk), status);
            }
            instances.insert(name, view.instances);
        }
        Ok(Snapshot {
            nodes,
            instances,
            disks,
            volumes: self.store.list().await.map_err(ds)?,
            engines: self.store.list().await.map_err(ds)?,
            replicas: self.store.list().await.map_err(ds)?,
            snapshots: self.store.list().await.map_err(ds)?,
            settings,
            heartbeats,
            unanswered,
        })
    }

    /// One node's view for this pass: asked now and answered within the
    /// pass's wait, or None (not answering yet; an earlier poll may still be
    /// out). The poll runs in a task of its own and ends by its own timeout.
    async fn poll_node(&self, node: &Node) -> (String, Option<polls::NodeView>) {
        let name = node.name_any();
        let now = std::time::Instant::now();
        let (timeout, wait) = match self.polls.plan(&name, now) {
            (polls::Plan::StillAsking, out_for) => {
                tracing::debug!(node = %name, ?out_for, "instance manager still not answering");
                return (name, None);
            }
            (polls::Plan::Ask { timeout, wait }, _) => (timeout, wait),
        };
        let (answer, mut answered) = tokio::sync::watch::channel(None);
        self.polls.sent(&name, now);
        let (cluster, polls, node_name, im) =
            (self.cluster.clone(), self.polls.clone(), name.clone(), node.spec.instance_manager_address.clone());
        let node_disks: Vec<(String, String)> =
            node.spec.disks.iter().map(|(d, disk)| (d.clone(), disk.path.clone())).collect();
        tokio::spawn(async move {
            let disk_names: Vec<String> = node_disks.iter().map(|(d, _)| d.clone()).collect();
            let view = tokio::time::timeout(timeout, async {
                let instances = cluster.instances(&im).await;
                let mut disks = Vec::new();
                for (disk, path) in node_disks {
                    let status = match &instances {
                        Ok(_) => cluster.disk_status(&im, &path).await,
                        Err(e) => Err(e.clone()),
                    };
                    disks.push((disk, status));
                }
                polls::NodeView { instances, disks }
            })
            .await
            .unwrap_or_else(|_| {
                polls::NodeView::unanswered(
                    format!("instance manager {im}: no answer within {timeout:?}"),
                    disk_names.iter(),
                )
            });
            polls.ended(&node_name, timeout, view.instances.is_ok(), std::time::Instant::now());
            // No receiver left: the pass stopped waiting, so start another.
            if answer.send(Some(view)).is_err() {
                polls.late_answer.notify_one();
            }
        });
        match tokio::time::timeout(wait, answered.wait_for(Option::is_some)).await {
            Ok(Ok(view)) => (name, view.clone()),
            _ => (name, None),
        }
    }

    /// One pass, then waits for the volume reconciles it started (for a
    /// caller that looks at the outcome next, as tests do).
    pub async fn reconcile_all(&self) -> Outcome {
        let started = self.pass().await?;
        join_all(started).await;
        Ok(())
    }

    /// One pass; the volume reconciles it started go on without it.
    async fn pass(&self) -> Result<Vec<tokio::task::JoinHandle<()>>, String> {
        let started = std::time::Instant::now();
        let outcome = self.reconcile_pass().await;
        PASSES.record(started.elapsed());
        outcome
    }

    async fn reconcile_pass(&self) -> Result<Vec<tokio::task::JoinHandle<()>>, String> {
        let number = self.queue.snapshot_begins();
        let snapshot = Arc::new(self.snapshot().await?);
        *self.latest.lock().expect("latest snapshot") = Some(snapshot.clone());
        for node in &snapshot.nodes {
            if !self.gate.is_leader() {
                return Err("no longer the leader: pass abandoned".into());
            }
            if let Err(e) = self.reconcile_node(&snapshot, node).await {
                tracing::warn!(node = %node.name_any(), error = %e, "node reconcile failed");
            }
        }
        // Each volume in a task of its own (see `queue`), not waited for:
        // one whose reconcile waits on a slow call holds itself up, not the
        // pass; one that keeps failing backs off (see `backoff`).
        let now = std::time::Instant::now();
        let exists = |v: &str| snapshot.volumes.iter().any(|x| x.name_any() == v);
        self.backoff.retain(exists);
        self.queue.retain(exists);
        let mut started = Vec::new();
        for volume in snapshot.volumes.iter().filter(|v| self.backoff.due(&v.name_any(), version(v), now)) {
            let name = volume.name_any();
            match self.queue.start(&name, number) {
                queue::Start::Go => {
                    let running = queue::Running { queue: self.queue.clone(), volume: name, again: self.again.clone() };
                    started.push(tokio::spawn(self.clone().reconcile_one(running)));
                }
                queue::Start::Later => {}
                queue::Start::Again => self.again.notify_one(),
            }
        }
        Ok(started)
    }

    /// One volume's reconcile, once a slot is free, on the newest snapshot
    /// (it holds the volume's own last effects: its reconcile started from
    /// an older one that did); its outcome goes to its backoff.
    async fn reconcile_one(self, running: queue::Running) {
        let slot = self.slots.clone().acquire_owned().await;
        let snapshot = self.latest.lock().expect("latest snapshot").clone();
        let (Ok(slot), Some(snapshot)) = (slot, snapshot) else { return };
        let name = running.volume.clone();
        let Some(volume) = snapshot.volumes.iter().find(|v| v.name_any() == name) else { return };
        if !self.gate.is_leader() {
            return;
        }
        let mut reconcile = std::pin::pin!(self.reconcile_volume(&snapshot, volume));
        let outcome = tokio::select! {
            outcome = &mut reconcile => outcome,
            _ = tokio::time::sleep(SLOT_HOLD) => {
                drop(slot);
                reconcile.await
            }
        };
        if let Err(e) = &outcome {
            tracing::warn!(volume = %name, error = %e, "volume reconcile failed");
        }
        self.backoff.record(&name, outcome.is_err(), version(volume), std::time::Instant::now());
        drop(running);
    }

    // ---------------------------------------------------------------- nodes

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
        // Until the initial set is complete (a pass may have stopped between
        // its creates), nothing else happens to the volume.
        let scheduled = volume
            .status
            .as_ref()
            .and_then(|s| condition(&s.conditions, "Scheduled"))
            .is_some_and(|c| c.status == "True");
        if replicas.is_empty() || (!scheduled && replicas.len() < volume.spec.number_of_replicas as usize) {
            return self.schedule_new_volume(snapshot, volume, &replicas).await;
        }
        if !scheduled {
            // All placed, but the pass that placed them stopped before saying so.
            let now = now();
            self.set_volume_status(&name, |s| set_condition(&mut s.conditions, "Scheduled", true, "", "", &now))
                .await?;
        }
        // Each replica's process runs while its volume exists.
        for replica in &replicas {
            self.reconcile_replica(snapshot, replica).await?;
        }
        if let Err(e) = self.reconcile_expansion(snapshot, volume, &replicas).await {
            tracing::warn!(volume = %name, error = %e, "expansion not done yet");
        }
        // A volume filled from a source attaches once the copy is done.
        match self.reconcile_restore(snapshot, volume).await {
            Ok(true) => {}
            Ok(false) => return self.set_volume_status(&name, |s| s.state = "restoring".into()).await,
            Err(e) => {
                tracing::warn!(volume = %name, error = %e, "restore not done yet");
                return Ok(());
            }
        }
        self.reconcile_engine(snapshot, volume, &replicas).await
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
