//! Growing volumes: the view `expansion::decide` needs from a pass's
//! snapshot, and the effects of its actions.

use super::*;
use crate::expansion::{self, EngineView, ReplicaView};

impl<D: Datastore, C: Cluster> Controller<D, C> {
    fn expansion_view(snapshot: &Snapshot, volume: &Volume, replicas: &[&Replica]) -> expansion::View {
        let name = volume.name_any();
        let engine_name = engine_name(&name);
        let engine = snapshot.engines.iter().find(|e| e.name_any() == engine_name);
        let instance = engine.and_then(|e| snapshot.instance(&e.spec.node_id, &engine_name));
        let attached = volume.status.as_ref().is_some_and(|s| s.state == "attached");
        let engine_view = match (engine, instance) {
            (Some(e), Some(i))
                if attached && i.state == InstanceState::Running as i32 && e.spec.node_id == volume.spec.node_id =>
            {
                EngineView::Running { address: i.address.clone(), size: e.spec.volume_size }
            }
            (_, Some(_)) => EngineView::Busy,
            (_, None) if !volume.spec.node_id.is_empty() => EngineView::Busy,
            (_, None) => EngineView::Absent,
        };
        let replicas = replicas
            .iter()
            .map(|r| {
                let running = snapshot
                    .instance(&r.spec.node_id, &r.name_any())
                    .filter(|i| i.state == InstanceState::Running as i32 && r.spec.failed_at.is_empty());
                ReplicaView {
                    name: r.name_any(),
                    size: r.spec.volume_size,
                    address: running.map(|i| i.address.clone()),
                }
            })
            .collect();
        expansion::View {
            volume_size: volume.spec.size,
            epoch: engine.map(|e| e.spec.epoch).unwrap_or(0),
            engine: engine_view,
            replicas,
        }
    }

    async fn record_replica_size(&self, replica: &str, size: u64) -> Outcome {
        update::<Replica, D>(&self.store, replica, |r| {
            let changed = r.spec.volume_size < size;
            r.spec.volume_size = r.spec.volume_size.max(size);
            changed
        })
        .await
        .map_err(ds)?;
        Ok(())
    }

    /// Moves the volume's data toward its spec size and reports where it is
    /// (status.currentSize).
    pub(super) async fn reconcile_expansion(
        &self,
        snapshot: &Snapshot,
        volume: &Volume,
        replicas: &[&Replica],
    ) -> Outcome {
        let name = volume.name_any();
        let mut view = Self::expansion_view(snapshot, volume, replicas);
        for action in expansion::decide(&view) {
            match action {
                expansion::Action::ExpandEngine { address, size } => {
                    if let Err(e) = self.cluster.engine_expand(&address, size).await {
                        events::record(&self.store, &name, Warning, "ExpandFailed", &format!("engine: {e}")).await;
                        return Err(format!("expand {name} to {size} through its engine: {e}"));
                    }
                    update::<Engine, D>(&self.store, &engine_name(&name), |e| {
                        let changed = e.spec.volume_size < size;
                        e.spec.volume_size = e.spec.volume_size.max(size);
                        changed
                    })
                    .await
                    .map_err(ds)?;
                    for r in replicas {
                        self.record_replica_size(&r.name_any(), size).await?;
                    }
                    if let EngineView::Running { size: s, .. } = &mut view.engine {
                        *s = size;
                    }
                    events::record(&self.store, &name, Normal, "Expanded", &format!("grown to {size} bytes")).await;
                    tracing::info!(volume = %name, size, "volume expanded through its engine");
                }
                expansion::Action::ExpandReplica { name: replica, address, size, epoch } => {
                    if let Err(e) = self.cluster.replica_expand(&address, size, epoch).await {
                        events::record(&self.store, &name, Warning, "ExpandFailed", &format!("{replica}: {e}")).await;
                        return Err(format!("expand replica {replica} to {size}: {e}"));
                    }
                    self.record_replica_size(&replica, size).await?;
                    if let Some(r) = view.replicas.iter_mut().find(|r| r.name == replica) {
                        r.size = size;
                    }
                    tracing::info!(volume = %name, replica = %replica, size, "replica expanded");
                }
                expansion::Action::RecordReplicaSize { name: replica, size } => {
                    self.record_replica_size(&replica, size).await?;
                    if let Some(r) = view.replicas.iter_mut().find(|r| r.name == replica) {
                        r.size = size;
                    }
                }
            }
        }
        let current = expansion::current_size(&view);
        self.set_volume_status(&name, |s| s.current_size = current).await
    }
}
