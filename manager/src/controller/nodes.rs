//! Nodes: each node's readiness from its instance manager, and its disks'
//! capacity and conditions.

use super::*;

impl<D: Datastore, C: Cluster> Controller<D, C> {
    pub(super) async fn reconcile_node(&self, snapshot: &Snapshot, node: &Node) -> Outcome {
        let name = node.name_any();
        if snapshot.unanswered.contains(&name) {
            // Asked and not answering yet: judged when its poll ends.
            return Ok(());
        }
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
        let (ready, reason, ready_message) = match (&reachable, snapshot.heartbeat_problem(&name)) {
            (Err(e), _) => (false, "InstanceManagerUnreachable", e.clone()),
            (Ok(_), Some(problem)) => (false, "HeartbeatExpired", problem),
            (Ok(_), None) => (true, "", String::new()),
        };
        update_status::<Node, D>(&self.store, &name, |n| {
            let status = n.status.get_or_insert_default();
            let before = status.clone();
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
}
