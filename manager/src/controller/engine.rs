//! A volume's engine: started (with a freshly minted epoch) where the
//! volume is attached, its report read into status, robustness and
//! conditions; healing and snapshots follow from the report.

use super::*;

impl<D: Datastore, C: Cluster> Controller<D, C> {
    pub(super) async fn reconcile_engine(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        replicas: &[&Replica],
    ) -> Outcome {
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

        // An engine of this volume on yet another node: one that could not
        // be stopped when the volume moved (its node did not answer). The
        // new engine's epoch fenced it from the replicas; now that its node
        // answers, it is stopped too.
        let current = engine.map(|e| e.spec.node_id.as_str());
        for node_name in stray_engine_nodes(&snapshot.instances, &engine_name, &want_node, current) {
            if let Some(node) = snapshot.node(&node_name) {
                self.cluster.delete_instance(&node.spec.instance_manager_address, &engine_name, false).await?;
                let message = format!("stopped a stale engine of this volume left on {node_name}");
                events::record(&self.store, &name, Normal, "StaleEngineStopped", &message).await;
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
            // Snapshots of a detached volume, on its replicas (once no
            // engine of it runs anywhere).
            let engine_gone = engine.is_none_or(|e| snapshot.instance(&e.spec.node_id, &engine_name).is_none());
            if all_up
                && engine_gone
                && let Some(holder) = self.detached_holder(snapshot, volume).await
            {
                self.reconcile_snapshots(snapshot, &name, holder).await?;
            }
            self.set_replica_modes(replicas, &BTreeMap::new(), &BTreeMap::new()).await?;
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

        // The engine's own node does not answer (its instance manager is
        // down, restarting or cut off): whether its engine serves is unknown,
        // and it usually does. Nothing is started, failed or minted for it
        // until the node answers again; the volume says so meanwhile.
        if !snapshot.instances_known(&want_node) && engine.is_some_and(|e| e.spec.node_id == want_node) {
            return self
                .set_volume_status(&name, |s| {
                    set_condition(
                        &mut s.conditions,
                        "EngineReachable",
                        false,
                        "NodeUnreachable",
                        &format!("node {want_node} does not answer; its engine is left as it was"),
                        &now,
                    )
                })
                .await;
        }

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
                // The engine starts from the next snapshot: take it now.
                self.again.notify_one();
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
                    rebuild_mib_per_sec: rebuild_rate(snapshot.settings.u64("replica-rebuild-max-mib-per-sec")) >> 20,
                    iops_limit: volume.spec.iops_limit,
                    bandwidth_limit: volume.spec.bandwidth_limit,
                    write_majority: match volume.spec.write_quorum {
                        WriteQuorum::One => false,
                        WriteQuorum::Majority => true,
                        WriteQuorum::Default => snapshot.settings.bool("default-write-majority"),
                    },
                })),
            };
            self.cluster.create_instance(&im, request).await?;
            tracing::info!(volume = %name, node = %want_node, epoch, "engine started");
            // An engine that was meant to run and is replaced: a crash, a
            // lost node, a manager that found it gone. (A first attach or
            // an attach after a detach is no event.)
            if let Some(previous) = engine.filter(|e| e.spec.epoch > 0 && e.spec.desire_state == "running") {
                let why = match instance {
                    None if previous.spec.node_id != want_node => "could not be reached to stop it".to_string(),
                    None => "was not running".to_string(),
                    Some(i) if i.state == InstanceState::Error as i32 => format!("had failed: {}", i.error_message),
                    Some(i) if instance_epoch != Some(previous.spec.epoch) => {
                        format!("was a stale instance ({})", i.name)
                    }
                    Some(_) => "was not serving".to_string(),
                };
                let message = format!(
                    "engine of epoch {} on {} {why}; restarted on {want_node} at epoch {epoch}",
                    previous.spec.epoch, previous.spec.node_id
                );
                events::record(&self.store, &name, Warning, "EngineRestarted", &message).await;
            }
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
        let mut progress = BTreeMap::new();
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
                    let replica = by_address.get(r.replica.as_str()).copied().unwrap_or(r.replica.as_str());
                    progress.insert(replica.to_string(), rebuild_progress(r));
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
                s.rebuild_progress = progress.clone();
            }
            s.error = error.clone();
            *s != before
        })
        .await
        .map_err(ds)?;

        if let Ok(engine_status) = &status {
            let rate = rebuild_rate(snapshot.settings.u64("replica-rebuild-max-mib-per-sec"));
            if engine_status.rebuild_bytes_per_sec != rate {
                self.cluster.engine_set_rebuild_rate(&instance.address, rate).await?;
                tracing::info!(volume = %name, bytes_per_sec = rate, "rebuild rate set");
            }
            if let Some(limits) = limits_to_set(&volume.spec, engine_status.limits.as_ref()) {
                self.cluster.engine_set_limits(&instance.address, limits).await?;
                tracing::info!(volume = %name, iops = limits.iops, bytes_per_sec = limits.bytes_per_sec, "I/O limits set");
            }
            self.set_replica_modes(replicas, &modes, &progress).await?;
            self.heal(snapshot, volume, engine, &instance.address, engine_status, replicas).await?;
            self.reconcile_snapshots(snapshot, &name, volume_snapshots::Holder::Engine(&instance.address)).await?;
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
        if let Ok(report) = &status {
            self.reconcile_scrub(snapshot, volume, &instance.address, report, robustness == "healthy").await?;
        }
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
            if condition(&s.conditions, "EngineReachable").is_some() {
                set_condition(&mut s.conditions, "EngineReachable", true, "", "", &now);
            }
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
}

/// The engine's rebuild rate in bytes/s for the setting's MiB/s (bounded,
/// so the product cannot overflow).
fn rebuild_rate(mib_per_sec: u64) -> u64 {
    mib_per_sec.min(1 << 20) << 20
}

/// The limits to give a running engine whose status reports `reported`,
/// when they differ from the volume's spec.
fn limits_to_set(
    spec: &VolumeSpec,
    reported: Option<&ironhorn_proto::engine::IoLimits>,
) -> Option<ironhorn_proto::engine::IoLimits> {
    let want = ironhorn_proto::engine::IoLimits { iops: spec.iops_limit, bytes_per_sec: spec.bandwidth_limit };
    (reported.cloned().unwrap_or_default() != want).then_some(want)
}

fn rebuild_progress(r: &ironhorn_proto::engine::RebuildStatus) -> RebuildProgress {
    let at = unix_ms_text;
    RebuildProgress {
        state: r.state.clone(),
        method: r.method.clone(),
        source: r.source.clone(),
        compared_bytes: r.compared_bytes,
        copied_bytes: r.copied_bytes,
        total_bytes: r.total_bytes,
        started_at: at(r.started_unix_ms),
        finished_at: at(r.finished_unix_ms),
        error: r.error.clone(),
    }
}

/// Nodes (that answered this pass: `instances`) running an instance of
/// engine `engine` where neither the volume wants it (`want_node`) nor its
/// Engine object says it runs (`current`): strays to stop.
fn stray_engine_nodes(
    instances: &HashMap<String, Result<Vec<pb::Instance>, String>>,
    engine: &str,
    want_node: &str,
    current: Option<&str>,
) -> Vec<String> {
    let mut nodes: Vec<String> = instances
        .iter()
        .filter(|(node, list)| {
            node.as_str() != want_node
                && Some(node.as_str()) != current
                && list.as_ref().is_ok_and(|l| l.iter().any(|i| i.name == engine))
        })
        .map(|(node, _)| node.clone())
        .collect();
    nodes.sort();
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(names: &[&str]) -> Result<Vec<pb::Instance>, String> {
        Ok(names.iter().map(|n| pb::Instance { name: n.to_string(), ..Default::default() }).collect())
    }

    #[test]
    fn limits_go_to_the_engine_only_when_they_differ_from_the_spec() {
        use ironhorn_proto::engine::IoLimits;
        let spec = VolumeSpec { iops_limit: 500, bandwidth_limit: 10 << 20, ..Default::default() };
        let want = IoLimits { iops: 500, bytes_per_sec: 10 << 20 };
        assert_eq!(limits_to_set(&spec, None), Some(want));
        assert_eq!(limits_to_set(&spec, Some(&IoLimits { iops: 500, bytes_per_sec: 0 })), Some(want));
        assert_eq!(limits_to_set(&spec, Some(&want)), None);
        // An engine reporting no limits and a spec asking none: nothing.
        assert_eq!(limits_to_set(&VolumeSpec::default(), None), None);
        assert_eq!(limits_to_set(&VolumeSpec::default(), Some(&want)), Some(IoLimits::default()));
    }

    #[test]
    fn the_rebuild_rate_is_the_setting_in_bytes_and_bounded() {
        assert_eq!(rebuild_rate(0), 0);
        assert_eq!(rebuild_rate(4), 4 << 20);
        assert_eq!(rebuild_rate(u64::MAX), 1 << 40);
    }

    #[test]
    fn an_engine_left_on_a_node_the_volume_moved_from_is_a_stray_once_that_node_answers() {
        let mut instances = HashMap::new();
        instances.insert("n-1".to_string(), with(&["v-e", "v-r-0"]));
        instances.insert("n-2".to_string(), with(&["v-e", "v-r-1"]));
        instances.insert("n-3".to_string(), with(&["w-e"]));
        // Moved from n-1 to n-2: the one on n-1 is a stray.
        assert_eq!(stray_engine_nodes(&instances, "v-e", "n-2", Some("n-2")), vec!["n-1".to_string()]);
        // Its node does not answer: nothing to do yet.
        instances.insert("n-1".to_string(), Err("unreachable".into()));
        assert!(stray_engine_nodes(&instances, "v-e", "n-2", Some("n-2")).is_empty());
        // Detaching: the engine where the object says it runs is not a
        // stray (it is stopped as the detach), others are.
        instances.insert("n-1".to_string(), with(&["v-e"]));
        assert_eq!(stray_engine_nodes(&instances, "v-e", "", Some("n-2")), vec!["n-1".to_string()]);
    }
}
