//! Applying a volume's Snapshot objects (the decision is
//! `crate::snapshots`): through its running engine while attached, or
//! directly on its replicas while detached — only when every healthy
//! replica runs and all hold the same newest flush stamp, so each takes the
//! snapshot of the same data (nothing writes to a detached volume).

use super::*;

/// Where a volume's snapshots are taken and deleted.
pub(super) enum Holder<'a> {
    Engine(&'a str),
    /// The replicas of a detached volume (data addresses), at this epoch.
    Replicas(Vec<String>, u64),
}

impl<D: Datastore, C: Cluster> Controller<D, C> {
    /// Applies the volume's Snapshot objects to its running engine (see
    /// `snapshots`).
    pub(super) async fn reconcile_snapshots(&self, snapshot: &Snapshot, volume: &str, holder: Holder<'_>) -> Outcome {
        let objects: Vec<&crate::crd::Snapshot> =
            snapshot.snapshots.iter().filter(|s| s.spec.volume == volume).collect();
        if objects.is_empty() {
            return Ok(());
        }
        let held = self.held(&holder).await?;
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
                    match self.snapshot_op(&holder, SnapshotOp::Create(name.clone())).await {
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
                    self.snapshot_op(&holder, SnapshotOp::Delete(name.clone())).await?;
                    let message = format!("snapshot {name} deleted");
                    events::record(&self.store, volume, Normal, "SnapshotDeleted", &message).await;
                }
                snapshots::Action::Release(name) => self.release_snapshot(&name).await?,
            }
        }
        Ok(())
    }

    /// What the holder holds: the engine's list, or the snapshots every
    /// replica holds (one missing it has not taken it yet).
    async fn held(&self, holder: &Holder<'_>) -> Result<snapshots::Held, String> {
        match holder {
            Holder::Engine(engine) => {
                let list = self.cluster.engine_snapshot(engine, SnapshotOp::List).await?;
                Ok(list.into_iter().map(|s| (s.name, (s.created_unix_ms, s.size_bytes))).collect())
            }
            Holder::Replicas(replicas, epoch) => {
                let mut common: Option<snapshots::Held> = None;
                for r in replicas {
                    let list = self.cluster.replica_snapshot(r, SnapshotOp::List, *epoch).await?;
                    let here: snapshots::Held =
                        list.into_iter().map(|s| (s.name, (s.created_unix_ms, s.size_bytes))).collect();
                    common = Some(match common {
                        None => here,
                        Some(c) => c.into_iter().filter(|(name, _)| here.contains_key(name)).collect(),
                    });
                }
                Ok(common.unwrap_or_default())
            }
        }
    }

    /// Takes or deletes a snapshot on the holder (every replica, for a
    /// detached volume; each op is idempotent there).
    async fn snapshot_op(&self, holder: &Holder<'_>, op: SnapshotOp) -> Result<(), String> {
        match holder {
            Holder::Engine(engine) => self.cluster.engine_snapshot(engine, op).await.map(drop),
            Holder::Replicas(replicas, epoch) => {
                for r in replicas {
                    let list = self.cluster.replica_snapshot(r, SnapshotOp::List, *epoch).await?;
                    let has = |name: &str| list.iter().any(|s| s.name == name);
                    let needed = match &op {
                        SnapshotOp::Create(name) => !has(name),
                        SnapshotOp::Delete(name) => has(name),
                        SnapshotOp::List => false,
                    };
                    if needed {
                        self.cluster.replica_snapshot(r, op.clone(), *epoch).await?;
                    }
                }
                Ok(())
            }
        }
    }

    /// A detached volume's replicas that can take its snapshots: every
    /// healthy replica running, all at the same newest flush stamp (else
    /// None: the snapshots wait for the next attach).
    pub(super) async fn detached_holder(&self, snapshot: &Snapshot, volume: &Volume) -> Option<Holder<'static>> {
        let name = volume.name_any();
        if !snapshot.snapshots.iter().any(|s| s.spec.volume == name) {
            return None;
        }
        let healthy: Vec<&Replica> =
            snapshot.replicas_of(&name).into_iter().filter(|r| r.spec.failed_at.is_empty()).collect();
        let mut addresses = Vec::new();
        let mut stamps = BTreeSet::new();
        for r in &healthy {
            let i = snapshot.instance(&r.spec.node_id, &r.name_any())?;
            if i.state != InstanceState::Running as i32 {
                return None;
            }
            let info = self.cluster.replica_info(&i.address).await.ok()?;
            stamps.insert((info.stamp_epoch, info.stamp_sequence));
            addresses.push(i.address.clone());
        }
        if addresses.is_empty() || stamps.len() != 1 {
            return None;
        }
        let epoch =
            snapshot.engines.iter().find(|e| e.name_any() == engine_name(&name)).map(|e| e.spec.epoch).unwrap_or(0);
        Some(Holder::Replicas(addresses, epoch))
    }

    /// Lets a Snapshot object being deleted go (drops the finalizer).
    pub(super) async fn release_snapshot(&self, name: &str) -> Outcome {
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
}
