//! Placing a new volume's replicas: the scheduler's inputs from a pass's
//! snapshot, and the Replica objects it decides on.

use super::*;

/// The space limits the settings give the scheduler.
pub fn limits(settings: &settings::Values) -> Limits {
    Limits {
        over_provisioning_percentage: settings.u64("storage-over-provisioning-percentage"),
        minimal_available_percentage: settings.u64("storage-minimal-available-percentage"),
    }
}

/// Every node's disks as the scheduler sees them, given which nodes are
/// ready (a pass asks the instance managers; the API reads the nodes'
/// Ready conditions).
pub fn disk_candidates(nodes: &[Node], replicas: &[Replica], node_ready: impl Fn(&str) -> bool) -> Vec<DiskCandidate> {
    let mut out = Vec::new();
    for node in nodes {
        let name = node.name_any();
        let status = node.status.clone().unwrap_or_default();
        let ready = node_ready(&name);
        for (disk_name, disk) in &node.spec.disks {
            let ds = status.disk_status.get(disk_name).cloned().unwrap_or_default();
            let disk_ready = condition(&ds.conditions, "Ready").is_some_and(|c| c.status == "True");
            let scheduled = replicas.iter().filter(|r| r.spec.node_id == name && r.spec.disk_id == *disk_name);
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

impl<D: Datastore, C: Cluster> Controller<D, C> {
    /// Disks as the scheduler sees them.
    pub fn candidates(snapshot: &Snapshot) -> Vec<DiskCandidate> {
        disk_candidates(&snapshot.nodes, &snapshot.replicas, |node| snapshot.node_ready(node))
    }

    pub(super) fn scheduling_request(
        settings: &settings::Values,
        volume: &Volume,
        placed: Vec<Placed>,
    ) -> scheduler::Request {
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

    /// A new volume gets all its replicas placed at once, or none. The
    /// initial replicas have fixed names (`VOLUME-r-0`, `-r-1`, …), so a
    /// second writer's create of the same slot fails instead of adding an
    /// extra replica; a pass interrupted between the creates (a crash, an
    /// apiserver error) is finished by the next one (`existing`: the slots
    /// already written), which places the missing slots beside them.
    pub(super) async fn schedule_new_volume(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        existing: &[&Replica],
    ) -> Outcome {
        let name = volume.name_any();
        let placed = Self::placed(snapshot, existing);
        let request = Self::scheduling_request(&snapshot.settings, volume, placed);
        let count = (volume.spec.number_of_replicas as usize).saturating_sub(existing.len());
        let limits = limits(&snapshot.settings);
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
                let taken: BTreeSet<String> = existing.iter().map(|r| r.name_any()).collect();
                let free_slots = (0..).map(|i| initial_replica_name(&name, i)).filter(|n| !taken.contains(n));
                for (p, replica_name) in placed.into_iter().zip(free_slots) {
                    match self.create_replica_object(snapshot, volume, &replica_name, &p.node, &p.disk).await {
                        Ok(()) => {}
                        // Another writer placed this slot: read again next pass.
                        Err(ReplicaCreate::Exists) => {
                            return Err(format!("replica {replica_name} was created by someone else; placing again"));
                        }
                        Err(ReplicaCreate::Failed(e)) => return Err(e),
                    }
                    tracing::info!(volume = %name, replica = %replica_name, node = %p.node, disk = %p.disk, "replica scheduled");
                }
                self.set_volume_status(&name, |s| {
                    set_condition(&mut s.conditions, "Scheduled", true, "", "", &now);
                })
                .await
            }
        }
    }

    /// A new replica (not one of the initial set) for `volume`; returns its name.
    pub(super) async fn create_added_replica(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        node: &str,
        disk: &str,
    ) -> Result<String, String> {
        let replica_name = format!("{}-r-{}", volume.name_any(), short_id());
        match self.create_replica_object(snapshot, volume, &replica_name, node, disk).await {
            Ok(()) => Ok(replica_name),
            Err(ReplicaCreate::Exists) => Err(format!("replica {replica_name} exists already")),
            Err(ReplicaCreate::Failed(e)) => Err(e),
        }
    }

    /// A new Replica object `replica_name` for `volume` on `node`'s `disk`.
    async fn create_replica_object(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        replica_name: &str,
        node: &str,
        disk: &str,
    ) -> Result<(), ReplicaCreate> {
        let name = volume.name_any();
        let vanished = |what: &str| ReplicaCreate::Failed(format!("scheduled on a {what} that vanished"));
        let node_object = snapshot.node(node).ok_or_else(|| vanished("node"))?;
        let disk_spec = node_object.spec.disks.get(disk).ok_or_else(|| vanished("disk"))?;
        let spec = ReplicaSpec {
            volume_name: name.clone(),
            node_id: node.to_string(),
            disk_id: disk.to_string(),
            data_path: data_path(&disk_spec.path, replica_name),
            volume_size: volume.spec.size,
            desire_state: "running".into(),
            ..Default::default()
        };
        let mut replica = Replica::new(replica_name, spec);
        replica.metadata.labels = Some([("ironhorn.io/volume".to_string(), name)].into());
        match self.store.create(&replica).await {
            Ok(_) => Ok(()),
            Err(datastore::Error::AlreadyExists { .. }) => Err(ReplicaCreate::Exists),
            Err(e) => Err(ReplicaCreate::Failed(ds(e))),
        }
    }
}

/// Why a Replica object was not created.
enum ReplicaCreate {
    /// The name is taken (another writer, or an earlier pass).
    Exists,
    Failed(String),
}

/// The name of slot `slot` of a volume's initial replica set.
pub fn initial_replica_name(volume: &str, slot: usize) -> String {
    format!("{volume}-r-{slot}")
}
