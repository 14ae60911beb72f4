//! Applying a volume's Snapshot objects to its running engine (the
//! decision is `crate::snapshots`).

use super::*;

impl<D: Datastore, C: Cluster> Controller<D, C> {
    /// Applies the volume's Snapshot objects to its running engine (see
    /// `snapshots`).
    pub(super) async fn reconcile_snapshots(&self, snapshot: &Snapshot, volume: &str, engine: &str) -> Outcome {
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
