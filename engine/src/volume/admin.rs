//! Volume-wide operations on every replica at one point in the write
//! stream: snapshots, revert, expansion, and the allocation map.

use super::*;

impl Volume {
    /// Allocation of `[offset, offset+length)`: (offset, length, zero) runs.
    pub async fn allocation(&self, offset: u64, length: u64) -> Result<Vec<(u64, u64, bool)>> {
        self.check_range(offset, length)?;
        let healthy = self.replicas_in(&[Mode::RW]);
        let replica = healthy.first().ok_or_else(|| VolumeError::Io("no healthy replica".into()))?;
        let extents = unary(
            self.timeout,
            replica.conn.client().extents(ExtentsRequest { layer: String::new(), merged: true, offset, length }),
        )
        .await
        .map_err(|e| replica_error(&replica.address, e))?;
        Ok(extents.extents.into_iter().map(|e| (e.offset, e.length, e.zero)).collect())
    }

    /// Runs a unary operation on every writable replica; replicas that fail
    /// it leave the volume. Fails when no RW replica succeeded.
    pub(super) async fn on_all<T, F, Fut>(&self, what: &str, call: F) -> Result<Vec<T>>
    where
        F: Fn(Arc<Replica>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, ReplicaError>>,
    {
        let targets = self.replicas_in(&[Mode::RW, Mode::WO]);
        let results = join_all(targets.iter().map(|r| call(r.clone()))).await;
        let mut out = Vec::new();
        let mut first_invalid = None;
        let mut no_space = None;
        for (replica, result) in targets.iter().zip(results) {
            match result {
                Ok(v) => {
                    if replica.mode() == Mode::RW {
                        out.push(v);
                    }
                }
                Err(ReplicaError::Invalid(m)) => first_invalid = first_invalid.or(Some(m)),
                // A full store refused a structural change: its data is
                // intact and it still serves; the change fails, not it.
                Err(ReplicaError::NoSpace(m)) => no_space = no_space.or(Some(format!("{}: {m}", replica.address))),
                Err(ReplicaError::Fenced(m)) => {
                    self.fenced.store(true, Ordering::SeqCst);
                    return Err(VolumeError::Fenced(m));
                }
                Err(e) => self.fail_replica(replica, &format!("{what}: {e}")),
            }
        }
        if let Some(m) = first_invalid {
            return Err(VolumeError::Invalid(m));
        }
        if let Some(m) = no_space {
            return Err(VolumeError::NoSpace(format!("{what}: {m}")));
        }
        if out.is_empty() {
            return Err(VolumeError::Io(format!("{what}: no healthy replica")));
        }
        Ok(out)
    }

    pub async fn snapshot_create(&self, name: &str) -> Result<()> {
        let _pause = self.pause.write().await;
        self.check_fenced()?;
        self.create_snapshot_on_all("snapshot create", name).await
    }

    /// Snapshot `name` on every writable replica (the caller holds what
    /// the snapshot needs: the pause for a point in the write stream).
    pub(super) async fn create_snapshot_on_all(&self, what: &str, name: &str) -> Result<()> {
        let epoch = self.epoch;
        self.on_all(what, |r| {
            let name = name.to_string();
            async move {
                unary(r.conn.timeout(), r.conn.client().snapshot_create(SnapshotCreateRequest { name, epoch })).await
            }
        })
        .await
        .map(drop)
    }

    /// Deletes snapshot `name` on every writable replica (merged into its
    /// child: no view changes).
    pub(super) async fn delete_snapshot_on_all(&self, what: &str, name: &str) -> Result<()> {
        let epoch = self.epoch;
        self.on_all(what, |r| {
            let name = name.to_string();
            async move {
                unary(r.conn.timeout(), r.conn.client().snapshot_delete(SnapshotDeleteRequest { name, epoch })).await
            }
        })
        .await
        .map(drop)
    }

    pub async fn snapshot_list(&self) -> Result<Vec<ironhorn_proto::replica::Snapshot>> {
        let healthy = self.replicas_in(&[Mode::RW]);
        let replica = healthy.first().ok_or_else(|| VolumeError::Io("no healthy replica".into()))?;
        let list = unary(self.timeout, replica.conn.client().snapshot_list(SnapshotListRequest {}))
            .await
            .map_err(|e| replica_error(&replica.address, e))?;
        Ok(list.snapshots.into_iter().filter(|s| !s.name.starts_with(REBUILD_PREFIX)).collect())
    }

    pub async fn snapshot_delete(&self, name: &str) -> Result<()> {
        let _one = self.rebuild_lock.lock().await;
        self.check_fenced()?;
        self.delete_snapshot_on_all("snapshot delete", name).await
    }

    pub async fn snapshot_revert(&self, name: &str) -> Result<()> {
        let _one = self.rebuild_lock.lock().await;
        let _pause = self.pause.write().await;
        self.check_fenced()?;
        let epoch = self.epoch;
        self.on_all("snapshot revert", |r| {
            let name = name.to_string();
            async move {
                unary(r.conn.timeout(), r.conn.client().snapshot_revert(SnapshotRevertRequest { name, epoch })).await
            }
        })
        .await?;
        // Replicas that are out missed the revert: their maps say nothing.
        for map in self.dirty.lock().expect("dirty").values_mut() {
            map.complete = false;
        }
        drop(_pause);
        // A new stamp on every replica that has the revert, so one that
        // missed it can never be elected over them.
        self.flush_replicas().await
    }

    /// Grows every replica, or none: the first refusal stops it before any
    /// replica grew; a replica failing after others grew leaves the volume.
    pub async fn expand(&self, size: u64) -> Result<()> {
        let _one = self.rebuild_lock.lock().await;
        let _pause = self.pause.write().await;
        self.check_fenced()?;
        if size % BLOCK != 0 || size < self.size() {
            return Err(VolumeError::Invalid(format!(
                "new size {size} must be a multiple of {BLOCK} and at least {}",
                self.size()
            )));
        }
        let targets = self.replicas_in(&[Mode::RW, Mode::WO]);
        let mut grown = 0;
        for replica in &targets {
            let mut client = replica.conn.client();
            let call = client.expand(ExpandRequest { size_bytes: size, epoch: self.epoch });
            match unary(self.timeout, call).await {
                Ok(_) => grown += 1,
                Err(e) if grown == 0 => return Err(replica_error(&replica.address, e)),
                Err(e) => self.fail_replica(replica, &format!("expand: {e}")),
            }
        }
        self.size.store(size, Ordering::SeqCst);
        drop(_pause);
        self.flush_replicas().await
    }
}
