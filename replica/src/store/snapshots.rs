//! Structural changes: snapshots (create, delete, revert), expansion, and
//! the layer operations rebuilds use. Each drains I/O through the gate and
//! ends in a checkpoint, so it is durable when it returns.

use super::*;

impl Store {
    pub(super) fn validate_snapshot_name(name: &str) -> Result<()> {
        let ok = !name.is_empty()
            && name.len() <= 200
            && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if ok {
            Ok(())
        } else {
            Err(StoreError::InvalidArgument(format!(
                "snapshot name {name:?} must be 1-200 characters of letters, digits, -_."
            )))
        }
    }

    /// Runs a structural change with I/O drained, then checkpoints it.
    pub(super) async fn structural<T>(&self, epoch: u64, change: impl FnOnce(&mut Meta) -> Result<T>) -> Result<T> {
        let _gate = self.gate.write().await;
        let _commit = self.commit.lock().await;
        self.raise_epoch_locked(epoch).await?;
        let out = {
            let mut meta = self.meta();
            meta.check_usable()?;
            // Room for the checkpoint first: the change is in memory only
            // until its checkpoint is durable.
            let needed = meta.reserve_blocks(0);
            if meta.alloc.free < needed {
                return Err(StoreError::OutOfSpace { needed, free: meta.alloc.free });
            }
            change(&mut meta)?
        };
        if let Err(e) = self.checkpoint_locked(false).await {
            // The change is in memory but not on the store: nothing more
            // may be served from this state.
            let mut meta = self.meta();
            return Err(match e {
                StoreError::Failed(_) => e,
                other => meta.fail(format!("checkpoint after a structural change: {other}")),
            });
        }
        Ok(out)
    }

    /// Seals the head as snapshot `name`; a new empty head goes on top.
    pub async fn snapshot_create(&self, epoch: u64, name: &str) -> Result<SnapshotInfo> {
        Self::validate_snapshot_name(name)?;
        self.structural(epoch, |meta| {
            if meta.layers.iter().any(|l| l.name == name) {
                return Err(StoreError::AlreadyExists(format!("snapshot {name:?}")));
            }
            let new_head = meta.new_layer("");
            let head = meta.layers.last_mut().expect("head");
            head.name = name.to_string();
            head.created_unix_ms = now_unix_ms();
            let info = snapshot_info(head);
            meta.layers.push(new_head);
            Ok(info)
        })
        .await
    }

    pub fn snapshot_list(&self) -> Vec<SnapshotInfo> {
        let meta = self.meta();
        meta.layers[..meta.head_index()].iter().map(snapshot_info).collect()
    }

    /// Removes snapshot `name`; its blocks that its child does not override
    /// move into the child, so every newer view reads the same afterwards.
    pub async fn snapshot_delete(&self, epoch: u64, name: &str) -> Result<()> {
        self.structural(epoch, |meta| {
            let index = meta.layer_index(name)?;
            if index == meta.head_index() {
                return Err(StoreError::InvalidArgument("the head is not a snapshot".into()));
            }
            let layer = meta.layers.remove(index);
            let mut freed = Vec::new();
            {
                let child = &mut meta.layers[index];
                for (lba, e) in layer.map.iter() {
                    if child.map.contains_key(lba) {
                        if e.pba != ZERO_PBA {
                            freed.push(e.pba);
                        }
                    } else {
                        child.map.insert(lba, e);
                    }
                }
                if index == 0 {
                    // Nothing lies below: zero markers are plain holes now.
                    child.map.retain(|_, e| e.pba != ZERO_PBA);
                }
            }
            meta.pending_free.extend(freed);
            meta.revision += 1;
            Ok(())
        })
        .await
    }

    /// Makes the volume read as snapshot `name` again. The head and every
    /// snapshot newer than `name` are discarded.
    pub async fn snapshot_revert(&self, epoch: u64, name: &str) -> Result<()> {
        self.structural(epoch, |meta| {
            let index = meta.layer_index(name)?;
            if index == meta.head_index() {
                return Err(StoreError::InvalidArgument("the head is not a snapshot".into()));
            }
            let dropped: Vec<Layer> = meta.layers.drain(index + 1..).collect();
            for layer in dropped {
                meta.pending_free.extend(layer.map.values().filter(|e| e.pba != ZERO_PBA).map(|e| e.pba));
            }
            let new_head = meta.new_layer("");
            meta.layers.push(new_head);
            meta.revision += 1;
            Ok(())
        })
        .await
    }

    /// Grows the volume to `size_bytes`, growing the store's byte range by as
    /// much again plus room for snapshots. Shrinking is refused.
    pub async fn expand(&self, epoch: u64, size_bytes: u64) -> Result<()> {
        let _gate = self.gate.write().await;
        let _commit = self.commit.lock().await;
        self.raise_epoch_locked(epoch).await?;
        let (old_size, capacity_blocks) = {
            let meta = self.meta();
            meta.check_usable()?;
            (meta.sb.volume_size, meta.sb.capacity_blocks)
        };
        if size_bytes % BLOCK_SIZE != 0 || size_bytes < old_size {
            return Err(StoreError::InvalidArgument(format!(
                "new size {size_bytes} must be a multiple of {BLOCK_SIZE} and at least the current {old_size}"
            )));
        }
        if size_bytes == old_size {
            return Ok(());
        }
        let growth_blocks = (size_bytes - old_size) / BLOCK_SIZE;
        let extra = growth_blocks + growth_blocks / 4 + 2 * checkpoint_blocks_for(growth_blocks, 1);
        let wanted = (capacity_blocks + extra) * BLOCK_SIZE;
        {
            let current = self.device();
            if current.size_bytes() < wanted {
                // All I/O is drained (gate) and commits are held (commit).
                let mut device = self.device.write().expect("device lock");
                let mut grown = Device::open(current.location(), current.backend_kind())
                    .map_err(io_err("reopen store"))?
                    .with_faults(self.faults.clone());
                grown.grow(wanted).map_err(io_err("grow store"))?;
                *device = Arc::new(grown);
            }
        }
        let device_blocks = self.device().size_bytes() / BLOCK_SIZE;
        {
            let mut meta = self.meta();
            meta.sb.volume_size = size_bytes;
            meta.sb.capacity_blocks = device_blocks;
            meta.alloc.grow(device_blocks);
            let head = meta.head_index();
            meta.layers[head].size_bytes = size_bytes;
            meta.revision += 1;
        }
        self.checkpoint_locked(false).await
    }

    /// Whether a write of `length` bytes at `offset` into `layer` under
    /// `epoch` would be refused for its epoch, range or layer; checked
    /// before a rebuild's copy fetches the data (the write checks again).
    pub fn check_layer_write(&self, epoch: u64, layer: &str, offset: u64, length: u64) -> Result<()> {
        self.is_newer_epoch(epoch)?;
        let meta = self.meta();
        meta.check_usable()?;
        self.check_range(&meta, offset, length)?;
        meta.layer_index(layer).map(drop)
    }

    /// Writes into any layer (a snapshot too): how rebuilds fill a replica.
    pub async fn write_layer(&self, epoch: u64, layer: &str, offset: u64, data: &[u8]) -> Result<()> {
        let started = self.start_write(epoch, layer, offset, data.len() as u64).await?;
        self.finish_write(started, data).await
    }

    pub async fn zero_layer(&self, epoch: u64, layer: &str, offset: u64, length: u64) -> Result<()> {
        let _gate = self.admit(epoch).await?;
        self.zero_layer_range(layer, offset, length).await
    }

    /// Inserts an empty sealed layer `name` directly below layer `below`
    /// (empty: the head). No other layer's view changes; rebuilds use it to
    /// give a replica a snapshot it missed.
    pub async fn layer_insert(&self, epoch: u64, name: &str, below: &str) -> Result<()> {
        Self::validate_snapshot_name(name)?;
        self.structural(epoch, |meta| {
            if meta.layers.iter().any(|l| l.name == name) {
                return Err(StoreError::AlreadyExists(format!("snapshot {name:?}")));
            }
            let index = meta.layer_index(below)?;
            let layer = meta.new_layer(name);
            meta.layers.insert(index, layer);
            Ok(())
        })
        .await
    }
}
