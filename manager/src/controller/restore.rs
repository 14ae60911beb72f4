//! Filling new volumes from a snapshot or another volume: the view
//! `restore::decide` needs from a pass's snapshot, and its effects. The copy
//! runs as a task of this manager, recording its progress in
//! status.restore; a manager that restarts resumes from that offset.

use super::*;
use crate::restore::{self, Source, Step};

impl<D: Datastore, C: Cluster> Controller<D, C> {
    fn restore_view(snapshot: &Snapshot, volume: &Volume, source: Source, copying: bool) -> restore::View {
        let name = volume.name_any();
        let snapshot_name = restore::snapshot_to_read(&name, &source);
        let object = snapshot.snapshots.iter().find(|s| s.name_any() == snapshot_name);
        let running = |r: &Replica| {
            snapshot
                .instance(&r.spec.node_id, &r.name_any())
                .filter(|i| i.state == InstanceState::Running as i32)
                .map(|i| i.address.clone())
        };
        let source_replicas = object
            .map(|s| {
                snapshot
                    .replicas_of(&s.spec.volume)
                    .into_iter()
                    .filter(|r| r.spec.failed_at.is_empty())
                    .filter_map(|r| running(r))
                    .collect()
            })
            .unwrap_or_default();
        restore::View {
            volume: name.clone(),
            source,
            done: volume.status.as_ref().is_some_and(|s| s.restore.state == "done"),
            copying,
            snapshot: object.map(|s| restore::SnapshotView {
                volume: s.spec.volume.clone(),
                ready: s.status.as_ref().is_some_and(|st| st.ready_to_use),
                size: s.status.as_ref().map(|st| st.size).unwrap_or(0),
            }),
            source_replicas,
            targets: snapshot.replicas_of(&name).into_iter().map(running).collect(),
        }
    }

    async fn set_restore(&self, name: &str, change: impl Fn(&mut RestoreStatus)) -> Outcome {
        self.set_volume_status(name, |s| change(&mut s.restore)).await
    }

    /// Whether the volume may attach: it has no source, or its copy is done.
    /// Moves the copy along otherwise.
    pub(super) async fn reconcile_restore(&self, snapshot: &Snapshot, volume: &Volume) -> Result<bool, String> {
        let name = volume.name_any();
        let source = match Source::parse(&volume.spec.data_source) {
            Ok(Some(source)) => source,
            Ok(None) => return Ok(true),
            Err(e) => {
                self.set_restore(&name, |r| {
                    r.state = "error".into();
                    r.message = e.to_string();
                })
                .await?;
                return Ok(false);
            }
        };
        let copying = self.restoring.lock().unwrap_or_else(|e| e.into_inner()).contains(&name);
        let view = Self::restore_view(snapshot, volume, source, copying);
        match restore::decide(&view) {
            Step::Nothing => {}
            Step::Wait(why) => {
                self.set_restore(&name, |r| {
                    r.state = "waiting".into();
                    r.message = why.clone();
                })
                .await?;
            }
            Step::Failed(why) => {
                self.set_restore(&name, |r| {
                    r.state = "error".into();
                    r.message = why.clone();
                })
                .await?;
            }
            Step::TakeCloneSnapshot { name: snap, of } => {
                let mut object = crate::crd::Snapshot::new(&snap, SnapshotSpec { volume: of.clone() });
                object.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
                match self.store.create(&object).await {
                    Ok(mut created) => {
                        // Status is written through the status call only.
                        created.status = Some(SnapshotStatus {
                            message: format!("taken for the clone {name}"),
                            ..Default::default()
                        });
                        self.store.replace_status(&created).await.map_err(ds)?;
                    }
                    Err(datastore::Error::AlreadyExists { .. }) => {}
                    Err(e) => return Err(ds(e)),
                }
                self.set_restore(&name, |r| {
                    r.state = "waiting".into();
                    r.message = format!("waiting for snapshot {snap} of volume {of}");
                })
                .await?;
            }
            Step::DeleteCloneSnapshot { name: snap } => match self.store.delete::<crate::crd::Snapshot>(&snap).await {
                Ok(()) | Err(datastore::Error::NotFound { .. }) => {}
                Err(e) => return Err(ds(e)),
            },
            Step::Copy { source, snapshot: snap, targets, bytes } => {
                let from = volume.status.as_ref().map(|s| s.restore.bytes_done).unwrap_or(0);
                self.restoring.lock().unwrap_or_else(|e| e.into_inner()).insert(name.clone());
                self.set_restore(&name, |r| {
                    r.state = "copying".into();
                    r.bytes_total = bytes;
                    r.message = format!("copying snapshot {snap}");
                })
                .await?;
                tracing::info!(volume = %name, snapshot = %snap, from, bytes, "copy started");
                let controller = self.clone();
                tokio::spawn(async move { controller.run_copy(name, source, snap, targets, bytes, from).await });
            }
        }
        Ok(view.done)
    }

    async fn run_copy(&self, name: String, source: String, snap: String, targets: Vec<String>, bytes: u64, from: u64) {
        // Progress lands in status every 32 MiB (and at the end).
        let (tx, mut rx) = tokio::sync::watch::channel(from);
        let recorder = {
            let controller = self.clone();
            let name = name.clone();
            async move {
                let mut last = 0;
                while rx.changed().await.is_ok() {
                    let done = *rx.borrow_and_update();
                    if done >= last + (32 << 20) {
                        last = done;
                        let _ = controller.set_restore(&name, |r| r.bytes_done = done).await;
                    }
                }
            }
        };
        let recorder = tokio::spawn(recorder);
        // A manager that loses the lease stops copying; the new leader
        // carries on from the progress recorded in status.
        let gate = self.gate.clone();
        let result = crate::copy::copy_snapshot(&source, &snap, &targets, bytes, from, |done| {
            let _ = tx.send(done);
            gate.is_leader()
        })
        .await;
        drop(tx);
        let _ = recorder.await;
        let written = match &result {
            Ok(()) => {
                events::record(&self.store, &name, Normal, "Restored", &format!("copied {bytes} bytes of {snap}"))
                    .await;
                self.set_restore(&name, |r| {
                    r.state = "done".into();
                    r.bytes_done = bytes;
                    r.message.clear();
                })
                .await
            }
            Err(crate::copy::CopyError::Stopped { at }) => {
                tracing::info!(volume = %name, at, "copy stopped: no longer the leader");
                self.set_restore(&name, |r| r.bytes_done = r.bytes_done.max(*at)).await
            }
            Err(crate::copy::CopyError::Failed(e)) => {
                events::record(&self.store, &name, Warning, "RestoreFailed", e).await;
                self.set_restore(&name, |r| {
                    r.state = "error".into();
                    r.message = e.clone();
                })
                .await
            }
        };
        if let Err(e) = written {
            tracing::warn!(volume = %name, error = %e, "could not record the copy's outcome");
        }
        self.restoring.lock().unwrap_or_else(|e| e.into_inner()).remove(&name);
    }
}
