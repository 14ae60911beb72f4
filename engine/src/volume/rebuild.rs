//! The rebuild driver: a replica joins as WO at one point in the write
//! stream, its sealed layers are made identical to the source's (by dirty
//! map or checksum comparison), checked, and it flips to RW. One at a time.

use super::*;

impl Volume {
    pub(super) fn record_rebuild(&self, status: RebuildStatus) {
        let mut list = self.rebuilds.lock().expect("rebuilds");
        if let Some(first) = list.front_mut() {
            if first.replica == status.replica && first.started_unix_ms == status.started_unix_ms {
                *first = status;
                return;
            }
        }
        list.push_front(status);
        list.truncate(16);
    }

    /// Brings `address` in as WO, copies what it lacks from an RW replica,
    /// verifies, and flips it to RW. One rebuild at a time per volume.
    pub async fn add_replica(self: &Arc<Self>, address: &str) -> Result<RebuildStatus> {
        let _one = self.rebuild_lock.lock().await;
        self.check_fenced()?;
        if self.replicas_in(&[Mode::RW, Mode::WO]).iter().any(|r| r.address == address) {
            return Err(VolumeError::Invalid(format!("replica {address} is already in the volume")));
        }
        let size = self.size();
        let (conn, info) = self.prepare_replica(address).await?;
        if info.size_bytes > size {
            return Err(VolumeError::Invalid(format!(
                "replica {address} holds {} bytes, more than the volume's {size}",
                info.size_bytes
            )));
        }
        if info.size_bytes < size {
            unary(self.timeout, conn.client().expand(ExpandRequest { size_bytes: size, epoch: self.epoch }))
                .await
                .map_err(|e| replica_error(address, e))?;
        }
        // Until it is verified complete the target claims no flushed data
        // (durably: a crash mid-rebuild must not leave its old stamp). The
        // first flush after it turns RW stamps it again.
        unary(self.timeout, conn.client().withdraw_stamp(WithdrawStampRequest { epoch: self.epoch }))
            .await
            .map_err(|e| replica_error(address, e))?;
        let snapshot = self.rebuild_snapshot_name();
        let target = Replica::new(address, info.store_id, conn, Mode::WO, String::new());

        // Join at one point in the write stream.
        let dirty = {
            let _pause = self.pause.write().await;
            let epoch = self.epoch;
            let joined = match self.create_snapshot_on_all("rebuild snapshot", &snapshot).await {
                Ok(()) => unary(
                    self.timeout,
                    target.conn.client().snapshot_create(SnapshotCreateRequest { name: snapshot.clone(), epoch }),
                )
                .await
                .map_err(|e| replica_error(address, e)),
                Err(e) => Err(e),
            };
            if let Err(e) = joined {
                // Whichever replicas took the join snapshot give its space back.
                self.drop_rebuild_snapshots().await;
                return Err(e);
            }
            let mut replicas = self.replicas.write().expect("replicas");
            replicas.retain(|r| r.address != address);
            replicas.push(target.clone());
            drop(replicas);
            self.watch_stream(&target);
            self.unreachable.lock().expect("unreachable").retain(|(a, _)| a != address);
            self.dirty.lock().expect("dirty").remove(&info.store_id)
        };
        let dirty = dirty.filter(|d| d.complete).map(|d| d.chunks);
        // Chosen after the join: a replica that died unnoticed failed the
        // join snapshot and is out by now.
        let source = match self.replicas_in(&[Mode::RW]).into_iter().next() {
            Some(source) => source,
            None => {
                let e = VolumeError::Io("no healthy replica to rebuild from".into());
                self.fail_replica(&target, &e.to_string());
                return Err(e);
            }
        };
        let mut status = RebuildStatus {
            replica: address.to_string(),
            source: source.address.clone(),
            state: "running".into(),
            method: if dirty.is_some() { "dirty-map".into() } else { "checksums".into() },
            started_unix_ms: now_unix_ms(),
            ..Default::default()
        };
        self.record_rebuild(status.clone());
        tracing::info!(replica = %address, source = %source.address, method = %status.method, "rebuild started");
        let result = self.copy_layers(&source, &target, &snapshot, dirty, &mut status).await;
        status.finished_unix_ms = now_unix_ms();
        match result {
            Ok(()) => {
                target.set(Mode::RW, "");
                // Everything written before now becomes durable on every
                // replica, so a replica that fails later gets a dirty map of
                // what was written after this, not of all that was ever
                // written without a client flush (a filled volume that was
                // never flushed would otherwise be rebuilt whole each time).
                if let Err(e) = self.flush_replicas().await {
                    tracing::warn!(error = %e, "flush after rebuild failed");
                }
                status.state = "done".into();
                tracing::info!(
                    replica = %address,
                    copied_bytes = status.copied_bytes,
                    compared_bytes = status.compared_bytes,
                    seconds = (status.finished_unix_ms - status.started_unix_ms) as f64 / 1000.0,
                    "rebuild finished"
                );
                self.record_rebuild(status.clone());
                self.drop_rebuild_snapshots().await;
                Ok(status)
            }
            Err(e) => {
                self.fail_replica(&target, &format!("rebuild: {e}"));
                status.state = "failed".into();
                status.error = e.to_string();
                self.record_rebuild(status);
                // The join snapshot held the source's overwritten blocks for
                // the copy; with no copy going on they go back to free space.
                self.drop_rebuild_snapshots().await;
                Err(e)
            }
        }
    }

    /// Makes the target's sealed layers identical to the source's.
    pub(super) async fn copy_layers(
        &self,
        source: &Replica,
        target: &Replica,
        snapshot: &str,
        dirty: Option<BTreeSet<u64>>,
        status: &mut RebuildStatus,
    ) -> Result<()> {
        let timeout = self.timeout;
        let names = |r: &Replica| {
            let client = r.conn.client();
            async move {
                let mut client = client;
                unary(timeout, client.snapshot_list(SnapshotListRequest {}))
                    .await
                    .map(|l| l.snapshots.into_iter().map(|s| s.name).collect::<Vec<_>>())
            }
        };
        let source_names = names(source).await.map_err(|e| replica_error(&source.address, e))?;
        let target_before = names(target).await.map_err(|e| replica_error(&target.address, e))?;
        let same_chain = source_names == target_before;
        let epoch = self.epoch;
        let mut t = target.conn.client();
        for name in target_before.iter().filter(|n| !source_names.contains(n)) {
            unary(timeout, t.snapshot_delete(SnapshotDeleteRequest { name: name.clone(), epoch }))
                .await
                .map_err(|e| replica_error(&target.address, e))?;
        }
        let target_names = names(target).await.map_err(|e| replica_error(&target.address, e))?;
        for (i, name) in source_names.iter().enumerate() {
            if !target_names.contains(name) {
                let below =
                    source_names[i + 1..].iter().find(|n| target_names.contains(n)).cloned().unwrap_or_default();
                unary(timeout, t.layer_insert(LayerInsertRequest { name: name.clone(), below, epoch }))
                    .await
                    .map_err(|e| replica_error(&target.address, e))?;
            }
        }
        let target_names = names(target).await.map_err(|e| replica_error(&target.address, e))?;
        if target_names != source_names {
            return Err(VolumeError::Io(format!(
                "snapshot chains differ after alignment: {source_names:?} vs {target_names:?}"
            )));
        }

        let size = self.size();
        let chunks = size.div_ceil(CHUNK);
        let plan: Vec<(String, Vec<u64>)> = match (&dirty, same_chain) {
            (Some(d), true) => vec![(snapshot.to_string(), d.iter().copied().filter(|c| *c < chunks).collect())],
            _ => source_names.iter().map(|n| (n.clone(), (0..chunks).collect())).collect(),
        };
        status.total_bytes = plan.iter().map(|(_, c)| c.len() as u64 * CHUNK).sum();
        self.record_rebuild(status.clone());
        // The join snapshot pins what the writes replace: they get a budget
        // from the replicas' free room, and the join point moves forward
        // before they use it up (see join_window.rs).
        let free = self.free_room().await?;
        self.join_window.open(join_window::budget(&free));
        let _window = CloseWindow(&self.join_window);
        let mut join = snapshot.to_string();
        let started = std::time::Instant::now();
        let direct = AtomicBool::new(true);
        for (layer, wanted) in &plan {
            let current = |join: &str| if layer == snapshot { join.to_string() } else { layer.clone() };
            for batch in wanted.chunks(CHECKSUM_BATCH_CHUNKS as usize) {
                // Chunks a dirty map names are copied as they are: one may
                // hold a block that failed its checksum on the target while
                // its metadata still matches the source's.
                let differing = if dirty.is_some() && same_chain {
                    batch.to_vec()
                } else {
                    self.differing_chunks(source, target, &current(&join), batch).await?
                };
                status.compared_bytes += batch.len() as u64 * CHUNK;
                // Several chunks in flight, so the source reads the next
                // while the target writes the last (one at a time, each
                // disk idled half the time). The join point moves only
                // with none in flight.
                let mut pending = differing.into_iter();
                let mut copies = futures_util::stream::FuturesUnordered::new();
                // The target's progress is made durable while the copy goes
                // on, one flush at a time (waiting for each emptied the
                // pipeline every FLUSH_EVERY_CHUNKS chunks).
                let mut flushes = futures_util::stream::FuturesUnordered::new();
                let mut done = 0;
                let mut account = |copied: Result<u64>, status: &mut RebuildStatus| -> Result<bool> {
                    status.copied_bytes += copied?;
                    done += 1;
                    self.record_rebuild(status.clone());
                    Ok(done % FLUSH_EVERY_CHUNKS == 0)
                };
                loop {
                    if self.join_window.wants_move() {
                        while let Some(copied) = copies.next().await {
                            if account(copied, status)? {
                                self.flush_target(target).await?;
                            }
                        }
                        drain(&mut flushes).await?;
                        if let Some(moved) = self.move_join(source, target, &join).await? {
                            join = moved;
                            status.join_moves += 1;
                            self.record_rebuild(status.clone());
                        }
                        continue;
                    }
                    // The rate limit: nothing more goes out before its time
                    // (a move wanted meanwhile is made first).
                    if let Some(wait) = self.rebuild_pace(status.copied_bytes, started) {
                        tokio::select! {
                            () = tokio::time::sleep(wait) => {}
                            () = self.join_window.move_wanted() => {}
                        }
                        if copies.is_empty() {
                            continue;
                        }
                    } else {
                        while copies.len() < REBUILD_CHUNKS_IN_FLIGHT {
                            let Some(chunk) = pending.next() else { break };
                            let layer = current(&join);
                            let direct = &direct;
                            copies.push(async move { self.copy_chunk(source, target, &layer, chunk, direct).await });
                        }
                    }
                    if copies.is_empty() {
                        break;
                    }
                    tokio::select! {
                        copied = copies.next() => {
                            if let Some(copied) = copied && account(copied, status)? {
                                drain(&mut flushes).await?;
                                flushes.push(self.flush_target(target));
                            }
                        }
                        Some(flushed) = flushes.next(), if !flushes.is_empty() => flushed?,
                        () = self.join_window.move_wanted() => {}
                    }
                }
                drain(&mut flushes).await?;
                self.flush_target(target).await?;
                self.record_rebuild(status.clone());
            }
        }
        // Verify every layer, whatever the plan was.
        for layer in &source_names {
            let layer = if layer == snapshot { join.clone() } else { layer.clone() };
            let all: Vec<u64> = (0..chunks).collect();
            for batch in all.chunks(CHECKSUM_BATCH_CHUNKS as usize) {
                let differing = self.differing_chunks(source, target, &layer, batch).await?;
                if !differing.is_empty() {
                    return Err(VolumeError::Io(format!(
                        "verification: layer {layer} still differs in {} chunk(s) starting at {}",
                        differing.len(),
                        differing[0] * CHUNK
                    )));
                }
            }
        }
        Ok(())
    }

    /// How long the copy must wait before sending more, to keep to the
    /// rebuild rate limit (None: it may go now).
    fn rebuild_pace(&self, copied: u64, started: std::time::Instant) -> Option<Duration> {
        let rate = self.rebuild_bytes_per_sec.load(Ordering::SeqCst);
        if rate == 0 {
            return None;
        }
        let due = Duration::from_secs_f64(copied as f64 / rate as f64);
        due.checked_sub(started.elapsed()).filter(|w| !w.is_zero())
    }

    pub(super) fn rebuild_snapshot_name(&self) -> String {
        format!("{REBUILD_PREFIX}{}-{}-{}", self.epoch, now_unix_ms(), self.rebuild_seq.fetch_add(1, Ordering::SeqCst))
    }

    /// Free room of every RW replica, in bytes.
    async fn free_room(&self) -> Result<Vec<u64>> {
        let mut free = Vec::new();
        for r in self.replicas_in(&[Mode::RW]) {
            let info = unary(self.timeout, r.conn.client().info(InfoRequest {}))
                .await
                .map_err(|e| replica_error(&r.address, e))?;
            free.push(info.capacity_bytes.saturating_sub(info.used_bytes));
        }
        Ok(free)
    }

    /// Moves the rebuild's join point forward: with I/O paused, every RW
    /// replica and the target seal their heads into a new rebuild snapshot;
    /// then the old one is deleted, merging into the new one, which frees
    /// every block the writes since the old join replaced. The target's
    /// copied chunks stay valid: it took the same writes since the old join,
    /// so its view of the new snapshot matches the source's wherever its
    /// view of the old one did. Moved only while the join snapshot is the
    /// newest layer: a user snapshot taken since sits on it, and merging the
    /// join snapshot into that one would change that snapshot's view on the
    /// target where no chunk was copied yet. Then the budget is dropped
    /// instead (writes may meet a full store, as before the budget) and
    /// None is returned.
    async fn move_join(&self, source: &Replica, target: &Replica, old: &str) -> Result<Option<String>> {
        let new = self.rebuild_snapshot_name();
        {
            // Under the pause, as a user snapshot is taken: none can come
            // between this look and the new join snapshot.
            let _pause = self.pause.write().await;
            let list = unary(self.timeout, source.conn.client().snapshot_list(SnapshotListRequest {}))
                .await
                .map_err(|e| replica_error(&source.address, e))?;
            if list.snapshots.last().map(|s| s.name.as_str()) != Some(old) {
                tracing::warn!(join = old, "a snapshot was taken on the rebuild's join point; it is not moved");
                self.join_window.close();
                return Ok(None);
            }
            self.create_snapshot_on_all("rebuild snapshot", &new).await?;
            self.join_window.reset();
        }
        self.delete_snapshot_on_all("merge of the old rebuild snapshot", old).await?;
        if target.mode() != Mode::WO {
            return Err(VolumeError::Io(format!("replica {} failed while the join point moved", target.address)));
        }
        tracing::info!(old, new = %new, "rebuild join point moved");
        Ok(Some(new))
    }

    /// Makes the target's copied data durable, so a crash of the target
    /// does not undo it and a retry resumes from there.
    pub(super) async fn flush_target(&self, target: &Replica) -> Result<()> {
        target
            .conn
            .enqueue(io_request(IoOp::Flush, 0, 0, Bytes::new(), self.epoch, false))
            .wait()
            .await
            .map(drop)
            .map_err(|e| replica_error(&target.address, e))
    }

    /// Chunks (from `batch`) whose merged view at `layer` differs.
    pub(super) async fn differing_chunks(
        &self,
        source: &Replica,
        target: &Replica,
        layer: &str,
        batch: &[u64],
    ) -> Result<Vec<u64>> {
        let size = self.size();
        let mut out = Vec::new();
        // Contiguous runs of the batch are compared in one call each.
        let mut i = 0;
        while i < batch.len() {
            let mut n = 1;
            while i + n < batch.len() && batch[i + n] == batch[i] + n as u64 {
                n += 1;
            }
            let offset = batch[i] * CHUNK;
            let length = (n as u64 * CHUNK).min(size - offset);
            let chunk_size = if length % CHUNK == 0 { CHUNK } else { BLOCK };
            let request = ChecksumsRequest { layer: layer.to_string(), merged: true, offset, length, chunk_size };
            let (mut sc, mut tc) = (source.conn.client(), target.conn.client());
            let (a, b) = tokio::join!(
                unary(self.timeout, sc.checksums(request.clone())),
                unary(self.timeout, tc.checksums(request)),
            );
            let a = a.map_err(|e| replica_error(&source.address, e))?.crc32;
            let b = b.map_err(|e| replica_error(&target.address, e))?.crc32;
            if chunk_size == CHUNK {
                out.extend((0..n).filter(|k| a[*k] != b[*k]).map(|k| batch[i + k]));
            } else {
                // The volume's last, partial chunk: compared block by block.
                let blocks_per_chunk = (CHUNK / BLOCK) as usize;
                for k in 0..n {
                    let range = k * blocks_per_chunk..((k + 1) * blocks_per_chunk).min(a.len());
                    if a[range.clone()] != b[range] {
                        out.push(batch[i + k]);
                    }
                }
            }
            i += n;
        }
        Ok(out)
    }

    /// Copies one chunk of `layer`'s view from source to target; returns the
    /// bytes moved (zero runs are sent as marks, not data). The target
    /// fetches the chunk from the source itself (`CopyFrom`), so the data
    /// crosses the network once and the engine only directs. The engine
    /// moves the chunk itself when the source's side of that failed (a bad
    /// block there is read from another copy, see `read_chunk_for_copy`),
    /// and for the rest of the copy once the target turns out to predate
    /// `CopyFrom` (`direct` is cleared).
    pub(super) async fn copy_chunk(
        &self,
        source: &Replica,
        target: &Replica,
        layer: &str,
        chunk: u64,
        direct: &AtomicBool,
    ) -> Result<u64> {
        let offset = chunk * CHUNK;
        let range = CopyRange { source, target, layer, offset, length: CHUNK.min(self.size() - offset) };
        if direct.load(Ordering::Relaxed) {
            match self.copy_direct(&range).await? {
                Direct::Copied(bytes) => return Ok(bytes),
                Direct::SourceFailed(IoStatus::DataLoss, message) => {
                    tracing::warn!(replica = %target.address, offset, "a bad block at the source; the engine copies the chunk: {message}");
                }
                Direct::SourceFailed(_, message) => {
                    // The target cannot reach or read the source (a firewall
                    // between the nodes, say): every chunk would wait for it,
                    // so the engine relays the rest of the copy.
                    tracing::warn!(replica = %target.address, offset, "the target cannot copy from the source; the engine relays the copy: {message}");
                    direct.store(false, Ordering::Relaxed);
                }
                Direct::Unsupported => {
                    tracing::info!(replica = %target.address, "the target has no CopyFrom; the engine relays the copy");
                    direct.store(false, Ordering::Relaxed);
                }
            }
        }
        self.relay_chunk(&range).await
    }

    /// Asks the target to copy `[offset, offset+length)` of `layer` from the
    /// source. An error is the target's own failure.
    async fn copy_direct(&self, range: &CopyRange<'_>) -> Result<Direct> {
        let CopyRange { source, target, layer, offset, length } = *range;
        let request = CopyFromRequest {
            source: source.address.clone(),
            layer: layer.to_string(),
            offset,
            length,
            epoch: self.epoch,
            // Half the engine's wait: a silent source is reported by the
            // target before the engine gives up on the target.
            timeout_ms: u32::try_from((self.timeout / 2).as_millis()).unwrap_or(u32::MAX),
        };
        let mut client = target.conn.client();
        let answer = match tokio::time::timeout(self.timeout, client.copy_from(request)).await {
            Err(_) => Err(ReplicaError::Failed(format!("no answer within {:?}", self.timeout))),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => return Ok(Direct::Unsupported),
            Ok(Err(status)) => Err(status_error(status)),
            Ok(Ok(answer)) => Ok(answer.into_inner()),
        };
        let answer = answer.map_err(|e| replica_error(&target.address, e))?;
        Ok(match IoStatus::try_from(answer.source_status) {
            Ok(IoStatus::Ok) => Direct::Copied(answer.copied_bytes),
            Ok(status) => Direct::SourceFailed(status, answer.source_message),
            Err(_) => Direct::SourceFailed(IoStatus::Unavailable, answer.source_message),
        })
    }

    /// Copies a range with the data passing through the engine: read from
    /// the source (or, block by block, from other copies where the source
    /// reads bad), written to the target run by run.
    async fn relay_chunk(&self, range: &CopyRange<'_>) -> Result<u64> {
        let CopyRange { target, layer, offset, .. } = *range;
        let data = self.read_chunk_for_copy(range).await?;
        let mut t = target.conn.client();
        let mut copied = 0;
        for run in ironhorn_proto::blocks::runs(&data, BLOCK as usize) {
            let request = WriteLayerRequest {
                layer: layer.to_string(),
                offset: offset + run.start as u64,
                data: if run.zero { Bytes::new() } else { data.slice(run.start..run.start + run.len) },
                zero: run.zero,
                length: run.len as u64,
                epoch: self.epoch,
            };
            if !run.zero {
                copied += run.len as u64;
            }
            unary(self.timeout, t.write_layer(request)).await.map_err(|e| replica_error(&target.address, e))?;
        }
        Ok(copied)
    }

    /// `layer`'s view of `[offset, offset+length)` as the source holds it.
    /// A block of the source that fails its checksum does not fail the
    /// rebuild: the chunk is then read block by block, each bad block from
    /// another RW replica's view of the same layer (every RW replica's
    /// layers read the same; the rebuild verifies the target's), and the
    /// source's range is queued for repair in place. Only a block no
    /// replica holds good fails the copy.
    async fn read_chunk_for_copy(&self, range: &CopyRange<'_>) -> Result<Bytes> {
        let CopyRange { source, target, layer, offset, length } = *range;
        let read = |offset: u64, length: u64| {
            let request = ReadLayerRequest { layer: layer.to_string(), offset, length, merged: true };
            let mut client = source.conn.client();
            async move { unary(self.timeout, client.read_layer(request)).await.map(|r| r.data) }
        };
        match read(offset, length).await {
            Ok(data) => return Ok(data),
            Err(ReplicaError::Corrupt(m)) => {
                tracing::error!(replica = %source.address, layer, offset, length, "rebuild source read a bad block: {m}");
            }
            Err(e) => return Err(replica_error(&source.address, e)),
        }
        let others: Vec<Arc<Replica>> = self
            .replicas_in(&[Mode::RW])
            .into_iter()
            .filter(|r| r.store_id != source.store_id && r.store_id != target.store_id)
            .collect();
        let mut chunk = bytes::BytesMut::with_capacity(length as usize);
        for at in (offset..offset + length).step_by(BLOCK as usize) {
            let data = match read(at, BLOCK).await {
                Ok(data) => data,
                Err(ReplicaError::Corrupt(_)) => self.good_copy(&others, layer, at).await.ok_or_else(|| {
                    VolumeError::Io(format!(
                        "replica {}: the block at {at} of layer {layer} reads bad and no other replica holds it good",
                        source.address
                    ))
                })?,
                Err(e) => return Err(replica_error(&source.address, e)),
            };
            chunk.extend_from_slice(&data);
        }
        self.queue_repair(source, offset, length);
        Ok(chunk.freeze())
    }

    /// Removes rebuild snapshots from every writable replica (their data
    /// merges into the head; no view changes). Best effort.
    pub(super) async fn drop_rebuild_snapshots(&self) {
        for replica in self.replicas_in(&[Mode::RW, Mode::WO]) {
            let mut client = replica.conn.client();
            let Ok(list) = unary(self.timeout, client.snapshot_list(SnapshotListRequest {})).await else { continue };
            for s in list.snapshots.into_iter().filter(|s| s.name.starts_with(REBUILD_PREFIX)) {
                let call = client.snapshot_delete(SnapshotDeleteRequest { name: s.name.clone(), epoch: self.epoch });
                if let Err(e) = unary(self.timeout, call).await {
                    tracing::warn!(replica = %replica.address, snapshot = %s.name, error = %e, "could not drop rebuild snapshot");
                }
            }
        }
    }

    /// Rebuilds the given replicas one after another (used at start).
    pub async fn rebuild_all(self: Arc<Self>, addresses: Vec<String>) {
        for address in addresses {
            if let Err(e) = self.add_replica(&address).await {
                tracing::error!(replica = %address, error = %e, "rebuild at start failed");
            }
        }
    }
}

/// One range of a layer a rebuild copies from source to target.
#[derive(Clone, Copy)]
struct CopyRange<'a> {
    source: &'a Replica,
    target: &'a Replica,
    layer: &'a str,
    offset: u64,
    length: u64,
}

/// Waits for the target flushes in flight; the first failure is returned.
async fn drain<F: std::future::Future<Output = Result<()>>>(
    flushes: &mut futures_util::stream::FuturesUnordered<F>,
) -> Result<()> {
    while let Some(flushed) = flushes.next().await {
        flushed?;
    }
    Ok(())
}

/// How a copy the target was asked to make itself ended.
enum Direct {
    /// Done: this many data bytes written.
    Copied(u64),
    /// The target could not read the range from the source; nothing written.
    SourceFailed(IoStatus, String),
    /// The target has no `CopyFrom` (an older replica).
    Unsupported,
}

/// Drops the join window's budget when the copy ends, however it ends.
struct CloseWindow<'a>(&'a join_window::JoinWindow);

impl Drop for CloseWindow<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}
