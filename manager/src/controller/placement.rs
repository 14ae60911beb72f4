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

    /// A new volume gets all its replicas placed at once, or none.
    pub(super) async fn schedule_new_volume(&self, snapshot: &Snapshot, volume: &Volume) -> Outcome {
        let name = volume.name_any();
        let request = Self::scheduling_request(&snapshot.settings, volume, Vec::new());
        let count = volume.spec.number_of_replicas as usize;
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
    pub(super) async fn create_replica_object(
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
}
