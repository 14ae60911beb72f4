//! Restoring the replica count of an attached volume (the decision is
//! `crate::replenish`): reuse, replacement, removal, salvage.

use super::*;

impl<D: Datastore, C: Cluster> Controller<D, C> {
    /// Restores the replica count of an attached volume (see `replenish`).
    pub(super) async fn heal(
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
            local: (volume.spec.data_locality == DataLocality::BestEffort).then(|| replenish::Local {
                node: engine.spec.node_id.clone(),
                room: self.local_pick(snapshot, volume, replicas, &engine.spec.node_id).is_ok(),
            }),
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
            Action::CreateLocal { node } => {
                let pick = self.local_pick(snapshot, volume, replicas, &node).map_err(|e| e.to_string())?;
                let replica_name = self.create_added_replica(snapshot, volume, &pick.node, &pick.disk).await?;
                let message =
                    format!("created replica {replica_name} on {node}, where the volume is attached (data locality)");
                events::record(&self.store, &name, Normal, "ReplicaCreated", &message).await;
                Ok(())
            }
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

    /// A disk on `node` for one more replica of the volume (data locality).
    fn local_pick(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        replicas: &[&Replica],
        node: &str,
    ) -> Result<Placed, scheduler::Unschedulable> {
        let placed = Self::placed(snapshot, replicas);
        let request = Self::scheduling_request(&snapshot.settings, volume, placed);
        let here: Vec<DiskCandidate> = Self::candidates(snapshot).into_iter().filter(|c| c.node == node).collect();
        scheduler::schedule_replica(&request, &here, limits(&snapshot.settings)).map(|c| Placed {
            node: c.node.clone(),
            disk: c.disk.clone(),
            zone: c.zone.clone(),
        })
    }

    /// Where the volume's healthy replicas are.
    pub(super) fn placed(snapshot: &Snapshot, replicas: &[&Replica]) -> Vec<Placed> {
        replicas
            .iter()
            .filter(|r| r.spec.failed_at.is_empty())
            .map(|r| {
                let zone = snapshot.node(&r.spec.node_id).and_then(|n| n.status.as_ref()).map(|s| s.zone.clone());
                Placed { node: r.spec.node_id.clone(), disk: r.spec.disk_id.clone(), zone: zone.unwrap_or_default() }
            })
            .collect()
    }

    pub(super) async fn create_replacement(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        replicas: &[&Replica],
    ) -> Outcome {
        let name = volume.name_any();
        let placed = Self::placed(snapshot, replicas);
        let request = Self::scheduling_request(&snapshot.settings, volume, placed);
        let limits = limits(&snapshot.settings);
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
                let replica_name = self.create_added_replica(snapshot, volume, &pick.node, &pick.disk).await?;
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
    pub(super) async fn salvage(
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
}
