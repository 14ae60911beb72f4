//! Replica processes and objects: started while their volume exists,
//! marked failed, restarted on their store, deleted with their data.

use super::*;

impl<D: Datastore, C: Cluster> Controller<D, C> {
    pub(super) async fn reconcile_replica(&self, snapshot: &Snapshot, replica: &Replica) -> Outcome {
        let name = replica.name_any();
        let Some(node) = snapshot.node(&replica.spec.node_id) else {
            return self.set_replica_state(replica, "unknown", "", "node not found").await;
        };
        if snapshot.unanswered.contains(&replica.spec.node_id) {
            // Its node has not answered yet: its state is left as it was.
            return Ok(());
        }
        if !snapshot.node_ready(&replica.spec.node_id) {
            return self.set_replica_state(replica, "unknown", "", "node unreachable").await;
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
                self.set_replica_state(replica, "error", "", &i.error_message).await
            }
            Some(i) => self.set_replica_state(replica, state_name(i.state), &i.address, "").await,
            None if failed => self.set_replica_state(replica, "stopped", "", "").await,
            None => {
                let created = self.cluster.create_instance(im, replica_instance_request(replica)).await?;
                tracing::info!(replica = %name, node = %replica.spec.node_id, store = %replica.spec.data_path, "replica started");
                self.set_replica_state(replica, state_name(created.state), &created.address, "").await
            }
        }
    }

    pub(super) async fn mark_replica_failed(&self, name: &str) -> Outcome {
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

    /// Each replica's mode and running rebuild's percent as the volume's
    /// engine reported them (empty maps: no engine serves it), for
    /// `kubectl get replicas.ironhorn.io`. Written only when they change.
    pub(super) async fn set_replica_modes(
        &self,
        replicas: &[&Replica],
        modes: &BTreeMap<String, String>,
        progress: &BTreeMap<String, RebuildProgress>,
    ) -> Outcome {
        for replica in replicas {
            let name = replica.name_any();
            let mode = modes.get(&name).cloned().unwrap_or_default();
            let rebuild = progress.get(&name).filter(|p| p.state == "running").map(RebuildProgress::percent);
            let status = replica.status.clone().unwrap_or_default();
            if status.mode == mode && status.rebuild_percent == rebuild {
                continue;
            }
            update_status::<Replica, D>(&self.store, &name, |r| {
                let s = r.status.get_or_insert_default();
                let changed = s.mode != mode || s.rebuild_percent != rebuild;
                s.mode = mode.clone();
                s.rebuild_percent = rebuild;
                changed
            })
            .await
            .map_err(ds)?;
        }
        Ok(())
    }

    /// Writes a replica's state, address and error where they changed.
    /// `replica` is the pass's snapshot of it: where that already says so,
    /// the object is not even read (a read of every replica every pass was
    /// most of an idle pass's work).
    pub(super) async fn set_replica_state(
        &self,
        replica: &Replica,
        state: &str,
        address: &str,
        error: &str,
    ) -> Outcome {
        let says = |s: &ReplicaStatus| s.current_state == state && s.address == address && s.error == error;
        if replica.status.as_ref().is_some_and(says) {
            return Ok(());
        }
        update_status::<Replica, D>(&self.store, &replica.name_any(), |r| {
            let s = r.status.get_or_insert_default();
            let changed = !says(s);
            s.current_state = state.to_string();
            s.address = address.to_string();
            s.error = error.to_string();
            changed
        })
        .await
        .map(drop)
        .map_err(ds)
    }

    /// Starts a replica's process again on its old store (data kept). One
    /// still running is stopped first: a failed replica's process may hold
    /// a store that refused to go on after an I/O error (it stays unusable
    /// for that process's life), and a fresh open replays and checks the
    /// store from its durable state. The store id survives, so the engine's
    /// dirty map still makes the rebuild a delta.
    pub(super) async fn restart_replica_instance(&self, snapshot: &Snapshot, replica: &Replica) -> Outcome {
        let name = replica.name_any();
        let node = snapshot.node(&replica.spec.node_id).ok_or("replica's node vanished")?;
        let im = &node.spec.instance_manager_address;
        if snapshot.instance(&replica.spec.node_id, &name).is_some() {
            self.cluster.delete_instance(im, &name, false).await?;
        }
        self.cluster.create_instance(im, replica_instance_request(replica)).await.map(drop)
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
