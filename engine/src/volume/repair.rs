//! Bad blocks on a healthy replica (bit rot, a misdirected write), repaired
//! in place: a read that fails its checksum is served by another replica and
//! queues the range for repair; a scrub reads back every block of every RW
//! replica. The replica names its bad blocks by layer (`Scrub`), and each is
//! rewritten into that layer from a healthy replica's view of it
//! (`ReadLayer` merged, `WriteLayer`), with I/O paused so no client write to
//! the block can land in between. The replica stays RW: nothing is rebuilt.

use ironhorn_proto::replica::{BadBlock, ScrubRequest};
use tokio::sync::mpsc;

use super::*;

/// Ranges one scrub call covers on a replica.
const SCRUB_STEP: u64 = 256 << 20;
/// Ranges waiting for repair; more are dropped (a scrub finds them).
const REPAIR_QUEUE: usize = 64;
/// Longest a replica may take to check one scrub step.
const SCRUB_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A range of one replica that read back bad.
pub(super) struct RepairJob {
    store_id: u64,
    offset: u64,
    length: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ScrubStatus {
    pub state: String,
    pub checked_bytes: u64,
    pub total_bytes: u64,
    pub bad_blocks: u64,
    pub repaired_blocks: u64,
    pub error: String,
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
}

/// What the engine found and mended since it started.
#[derive(Default)]
pub(super) struct Integrity {
    pub(super) scrub: ScrubStatus,
    pub(super) found: u64,
    pub(super) repaired: u64,
}

/// How one batch of bad blocks went.
#[derive(Default)]
struct Mended {
    found: u64,
    repaired: u64,
}

pub(super) fn repair_queue() -> (mpsc::Sender<RepairJob>, mpsc::Receiver<RepairJob>) {
    mpsc::channel(REPAIR_QUEUE)
}

impl Volume {
    /// Queues `[offset, offset+length)` of `replica` for repair (a read of it
    /// failed its checksum).
    pub(super) fn queue_repair(&self, replica: &Replica, offset: u64, length: u64) {
        let job = RepairJob { store_id: replica.store_id, offset, length };
        if self.repairs.try_send(job).is_err() {
            tracing::warn!(replica = %replica.address, offset, length, "repair queue full; a scrub will find it");
        }
    }

    /// The repair worker: one range at a time, for as long as the volume lives.
    pub(super) fn spawn_repairs(self: &Arc<Self>, mut jobs: mpsc::Receiver<RepairJob>) {
        let volume = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(job) = jobs.recv().await {
                let Some(volume) = volume.upgrade() else { return };
                let replica = volume.replicas_in(&[Mode::RW]).into_iter().find(|r| r.store_id == job.store_id);
                let Some(replica) = replica else { continue };
                if let Err(e) = volume.scrub_range(&replica, job.offset, job.length).await {
                    tracing::error!(replica = %replica.address, error = %e, "repair after a bad read failed");
                }
            }
        });
    }

    /// Asks `replica` which blocks of the range are bad and repairs them.
    async fn scrub_range(&self, replica: &Arc<Replica>, offset: u64, length: u64) -> Result<(u64, Mended)> {
        let mut client = replica.conn.client();
        let call = client.scrub(ScrubRequest { offset, length });
        let report = unary(SCRUB_CALL_TIMEOUT, call).await.map_err(|e| replica_error(&replica.address, e))?;
        let mended = self.repair_blocks(replica, report.bad).await?;
        Ok((report.checked_bytes, mended))
    }

    /// Rewrites each bad block of `target` into its layer from a healthy
    /// replica's view of that layer, with I/O paused; then flushes.
    async fn repair_blocks(&self, target: &Arc<Replica>, bad: Vec<BadBlock>) -> Result<Mended> {
        if bad.is_empty() {
            return Ok(Mended::default());
        }
        let mut mended = Mended::default();
        {
            let _pause = self.pause.write().await;
            if target.mode() != Mode::RW {
                return Err(VolumeError::Io(format!("replica {} left RW before its repair", target.address)));
            }
            // Checked again with I/O paused: a write or another repair may
            // have replaced the block since it was found.
            let bad = self.still_bad(target, bad).await?;
            mended.found = bad.len() as u64;
            self.integrity.lock().expect("integrity").found += mended.found;
            let sources: Vec<_> =
                self.replicas_in(&[Mode::RW]).into_iter().filter(|r| r.store_id != target.store_id).collect();
            for block in &bad {
                let Some(data) = self.good_copy(&sources, &block.layer, block.offset).await else {
                    tracing::error!(replica = %target.address, layer = %block.layer, offset = block.offset,
                        "bad block has no good copy on another replica");
                    continue;
                };
                let write = WriteLayerRequest {
                    layer: block.layer.clone(),
                    offset: block.offset,
                    length: BLOCK,
                    data,
                    zero: false,
                    epoch: self.epoch,
                };
                match unary(self.timeout, target.conn.client().write_layer(write)).await {
                    Ok(_) => mended.repaired += 1,
                    // The layer went away (a snapshot deleted meanwhile) or
                    // the store is full: left bad, found again by a read or
                    // the next scrub.
                    Err(e @ (ReplicaError::Invalid(_) | ReplicaError::NoSpace(_))) => {
                        tracing::error!(replica = %target.address, layer = %block.layer, offset = block.offset,
                            error = %e, "bad block not repaired");
                    }
                    Err(ReplicaError::Fenced(m)) => {
                        self.fenced.store(true, Ordering::SeqCst);
                        return Err(VolumeError::Fenced(m));
                    }
                    Err(e) => {
                        let why = format!("repair of a bad block failed: {e}");
                        self.fail_replica(target, &why);
                        return Err(VolumeError::Io(why));
                    }
                }
            }
        }
        if mended.found == 0 {
            return Ok(mended);
        }
        self.integrity.lock().expect("integrity").repaired += mended.repaired;
        tracing::warn!(replica = %target.address, found = mended.found, repaired = mended.repaired,
            "bad blocks repaired in place");
        // Make the repairs durable (the engine's own flush, not counted).
        self.flush_replicas().await?;
        Ok(mended)
    }

    /// Those of `bad` that `target` still reads back bad.
    async fn still_bad(&self, target: &Replica, bad: Vec<BadBlock>) -> Result<Vec<BadBlock>> {
        let offsets: BTreeSet<u64> = bad.iter().map(|b| b.offset).collect();
        let mut client = target.conn.client();
        let mut now = Vec::new();
        for offset in offsets {
            let call = client.scrub(ScrubRequest { offset, length: BLOCK });
            let report = unary(self.timeout, call).await.map_err(|e| replica_error(&target.address, e))?;
            now.extend(report.bad.into_iter().filter(|b| bad.contains(b)));
        }
        Ok(now)
    }

    /// The block at `offset` as `layer`'s view reads on the first source
    /// that has it good. A source that reads it bad too is queued for its
    /// own repair.
    pub(super) async fn good_copy(&self, sources: &[Arc<Replica>], layer: &str, offset: u64) -> Option<Bytes> {
        for source in sources {
            let read = ReadLayerRequest { layer: layer.to_string(), offset, length: BLOCK, merged: true };
            match unary(self.timeout, source.conn.client().read_layer(read)).await {
                Ok(r) if r.data.len() as u64 == BLOCK => return Some(r.data),
                Ok(r) => tracing::warn!(source = %source.address, bytes = r.data.len(), "short read of a block"),
                Err(ReplicaError::Corrupt(m)) => {
                    tracing::warn!(source = %source.address, layer, offset, "this copy is bad too: {m}");
                    self.queue_repair(source, offset, BLOCK);
                }
                Err(e) => tracing::warn!(source = %source.address, error = %e, "no good copy here"),
            }
        }
        None
    }

    pub fn scrub_status(&self) -> ScrubStatus {
        self.integrity.lock().expect("integrity").scrub.clone()
    }

    /// Found and repaired bad blocks since the engine started.
    pub fn bad_blocks(&self) -> (u64, u64) {
        let i = self.integrity.lock().expect("integrity");
        (i.found, i.repaired)
    }

    /// Starts a scrub of every RW replica unless one is running; returns
    /// the scrub's status.
    pub fn start_scrub(self: &Arc<Self>) -> Result<ScrubStatus> {
        self.check_fenced()?;
        let replicas = self.replicas_in(&[Mode::RW]);
        let status = {
            let mut integrity = self.integrity.lock().expect("integrity");
            if integrity.scrub.state == "running" {
                return Ok(integrity.scrub.clone());
            }
            integrity.scrub = ScrubStatus {
                state: "running".into(),
                total_bytes: self.size() * replicas.len() as u64,
                started_unix_ms: now_unix_ms(),
                ..Default::default()
            };
            integrity.scrub.clone()
        };
        tracing::info!(replicas = replicas.len(), "scrub started");
        let volume = self.clone();
        tokio::spawn(async move {
            let result = volume.scrub_replicas(&replicas).await;
            let mut integrity = volume.integrity.lock().expect("integrity");
            let s = &mut integrity.scrub;
            s.finished_unix_ms = now_unix_ms();
            match result {
                Ok(()) => s.state = "done".into(),
                Err(e) => {
                    s.state = "failed".into();
                    s.error = e.to_string();
                }
            }
            tracing::info!(state = %s.state, checked = s.checked_bytes, bad = s.bad_blocks,
                repaired = s.repaired_blocks, "scrub ended");
        });
        Ok(status)
    }

    async fn scrub_replicas(&self, replicas: &[Arc<Replica>]) -> Result<()> {
        for replica in replicas {
            let mut offset = 0;
            while offset < self.size() {
                if self.fenced.load(Ordering::SeqCst) {
                    return Err(VolumeError::Fenced(format!("epoch {} is no longer current", self.epoch)));
                }
                if replica.mode() != Mode::RW {
                    // Failed or removed meanwhile: a rebuild covers it.
                    break;
                }
                let length = SCRUB_STEP.min(self.size() - offset);
                let started = Instant::now();
                let (checked, mended) = self.scrub_range(replica, offset, length).await?;
                {
                    let mut integrity = self.integrity.lock().expect("integrity");
                    let s = &mut integrity.scrub;
                    s.checked_bytes += checked;
                    s.bad_blocks += mended.found;
                    s.repaired_blocks += mended.repaired;
                }
                self.pace(checked, started).await;
                offset += length;
            }
        }
        Ok(())
    }

    /// Holds a scrub to the rebuild rate limit, so it never starves the
    /// workload of the disk.
    async fn pace(&self, bytes: u64, started: Instant) {
        let rate = self.rebuild_bytes_per_sec.load(Ordering::SeqCst);
        if rate == 0 {
            return;
        }
        let due = Duration::from_secs_f64(bytes as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}
