//! The replicator: one volume over N replicas.
//!
//! - Writes, trims and flushes go to every RW and WO replica, enqueued under
//!   one lock so every replica's stream sees them in the same order; they
//!   complete when every RW replica answered. A replica that fails or does
//!   not answer within the timeout becomes ERR and gets no more I/O.
//! - Reads go to one RW replica, round robin; on failure the next is tried.
//! - A replica answering FENCED means a newer engine exists: this engine
//!   stops serving I/O at once.
//! - While a replica is out, the engine records which 1 MiB chunks were
//!   written (its dirty map) so a rebuild on its old store copies only those;
//!   without a trustworthy map, rebuilds compare per-chunk checksums, which
//!   also makes an interrupted rebuild resume instead of restarting.
//! - Rebuild (one at a time): at one point in the write stream every replica,
//!   the newcomer included, seals its head into a snapshot and the newcomer
//!   joins as WO, so live writes land in its head; the sealed layers are then
//!   made identical to the source's, checked by checksums, and the newcomer
//!   flips to RW.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::join_all;
use ironhorn_proto::replica::{
    ChecksumsRequest, CopyFromRequest, ExpandRequest, ExtentsRequest, InfoRequest, InfoResponse, IoOp, IoRequest,
    IoStatus, LayerInsertRequest, ReadLayerRequest, SetEpochRequest, SnapshotCreateRequest, SnapshotDeleteRequest,
    SnapshotListRequest, SnapshotRevertRequest, WithdrawStampRequest, WriteLayerRequest,
};
use serde::Serialize;
use thiserror::Error;

use crate::election::{self, Candidate};
use crate::limit::{Limiter, Limits};
use crate::metrics;
use crate::replica_conn::{ReplicaConn, ReplicaError, status_error, unary};

mod admin;
mod bookkeeping;
mod compare;
mod join_window;
mod read_choice;
mod rebuild;
mod repair;

use bookkeeping::{DirtyMap, Unflushed};
use compare::{content_digest, same_data};
pub use repair::ScrubStatus;
use repair::{Integrity, RepairJob};

pub const BLOCK: u64 = 4096;
/// Granularity of dirty maps and rebuild comparisons.
pub const CHUNK: u64 = 1 << 20;
/// Largest single read or write the volume takes.
pub const MAX_IO_BYTES: u64 = 4 << 20;
const REBUILD_PREFIX: &str = "ironhorn-rebuild-";

/// The origin of the beat held requests wake on (see `limit::on_the_beat`).
static BEAT_ORIGIN: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
const CHECKSUM_BATCH_CHUNKS: u64 = 256;
/// Copied chunks between flushes of a rebuild target: its durable
/// progress, what a rebuild interrupted by the target's death keeps (the
/// next one copies only chunks whose checksums differ). 64 copied faster
/// by a few per cent but lost up to 64 MiB of an interrupted rebuild's work
/// (`an_interrupted_rebuild_resumes_instead_of_starting_over` caught it).
const FLUSH_EVERY_CHUNKS: usize = 16;
/// Writes no client flush covers get one from the engine this long after
/// the first of them (see `spawn_background_flush`).
pub const BACKGROUND_FLUSH_AFTER: Duration = Duration::from_secs(5);
/// Chunks a rebuild copies at once.
const REBUILD_CHUNKS_IN_FLIGHT: usize = 8;

#[derive(Debug, Error)]
pub enum VolumeError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("I/O error: {0}")]
    Io(String),
    #[error("engine is fenced by a newer engine: {0}")]
    Fenced(String),
    #[error("out of space: {0}")]
    NoSpace(String),
    #[error("write refused: {0}")]
    NoQuorum(String),
    #[error("request too large: {0}")]
    TooLarge(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0} not found")]
    NotFound(String),
}

type Result<T> = std::result::Result<T, VolumeError>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Mode {
    RW,
    WO,
    ERR,
}

pub struct Replica {
    pub address: String,
    /// The replica's store id: dirty maps follow the store, not the address.
    store_id: u64,
    conn: ReplicaConn,
    state: Mutex<(Mode, String)>,
    /// Reads of this volume out on this replica now.
    reads_out: AtomicUsize,
}

impl Replica {
    fn new(address: &str, store_id: u64, conn: ReplicaConn, mode: Mode, why: String) -> Arc<Replica> {
        Arc::new(Replica {
            address: address.to_string(),
            store_id,
            conn,
            state: Mutex::new((mode, why)),
            reads_out: AtomicUsize::new(0),
        })
    }
    pub fn mode(&self) -> Mode {
        self.state.lock().expect("replica state").0
    }
    fn set(&self, mode: Mode, why: &str) {
        *self.state.lock().expect("replica state") = (mode, why.to_string());
    }
    fn error(&self) -> String {
        self.state.lock().expect("replica state").1.clone()
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RebuildStatus {
    pub replica: String,
    pub source: String,
    pub state: String,
    pub method: String,
    pub compared_bytes: u64,
    pub copied_bytes: u64,
    pub total_bytes: u64,
    pub error: String,
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    pub join_moves: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplicaStatus {
    pub address: String,
    pub mode: Mode,
    pub error: String,
    /// "tcp", "unix" (this node's local socket), or "" when not connected.
    pub transport: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct VolumeStatus {
    pub volume: String,
    pub size_bytes: u64,
    pub epoch: u64,
    pub frontends: Vec<String>,
    pub replicas: Vec<ReplicaStatus>,
    pub rebuilds: Vec<RebuildStatus>,
    pub fenced: bool,
    /// The last write was refused because every RW replica was out of
    /// space (cleared by the next write that lands).
    pub out_of_space: bool,
    /// Written chunks no completed flush covers yet, in bytes.
    pub unflushed_bytes: u64,
    pub scrub: ScrubStatus,
    pub bad_blocks_found: u64,
    pub bad_blocks_repaired: u64,
    pub limits: Limits,
    pub rebuild_bytes_per_sec: u64,
}

pub struct Volume {
    pub name: String,
    pub epoch: u64,
    size: AtomicU64,
    replicas: RwLock<Vec<Arc<Replica>>>,
    /// Held while enqueueing one request on every replica stream.
    dispatch: Mutex<()>,
    /// I/O holds it shared; snapshots and joins hold it exclusively, so
    /// they happen at one point in the write stream.
    pause: tokio::sync::RwLock<()>,
    /// The store id of the replica asked for the last read, and the reads
    /// so far (see `read_choice`).
    last_reader: AtomicU64,
    reads: AtomicU64,
    timeout: Duration,
    /// This node's directory of replica sockets (see `ironhorn_proto::local`).
    local_sockets: Option<std::path::PathBuf>,
    /// Dirty maps of replicas that are out, by store id.
    dirty: Mutex<HashMap<u64, DirtyMap>>,
    /// Chunks written since the last flush that every replica completed:
    /// a replica that crashes may have lost them, so they start its map.
    unflushed: Mutex<Unflushed>,
    /// Signalled by the first write completed after a flush was sent.
    unflushed_writes: Arc<tokio::sync::Notify>,
    rebuilds: Mutex<VecDeque<RebuildStatus>>,
    rebuild_lock: tokio::sync::Mutex<()>,
    rebuild_seq: AtomicU64,
    fenced: AtomicBool,
    /// See [`VolumeStatus::out_of_space`].
    out_of_space: AtomicBool,
    frontends: Mutex<Vec<String>>,
    /// Replicas given to the engine that it could not reach: (address, why).
    unreachable: Mutex<Vec<(String, String)>>,
    /// Rebuild copy rate limit, so rebuilds do not starve the workload.
    rebuild_bytes_per_sec: AtomicU64,
    /// Frontend requests (rebuild traffic is not counted here).
    metrics: metrics::IoMetrics,
    /// The last flush sequence number handed out in this epoch; RW replicas
    /// make `(epoch, sequence)` durable as their stamp with the flush.
    flush_sequence: AtomicU64,
    /// Writes and flushes fail unless at least this many RW replicas took
    /// them (0 or 1: any one suffices, as in Longhorn).
    min_write_acks: AtomicUsize,
    /// Bad blocks found and repaired, and the last scrub.
    integrity: Mutex<Integrity>,
    /// Ranges of replicas that read back bad, for the repair worker.
    repairs: tokio::sync::mpsc::Sender<RepairJob>,
    /// Frontend I/O limits; `limited` says whether any is set, so an
    /// unlimited volume's requests never take the lock.
    limiter: Mutex<Limiter>,
    limited: AtomicBool,
    /// The last request the limiter saw had to wait: the volume runs at its
    /// limit, and its replica requests say so (`IoRequest.paced`).
    paced: AtomicBool,
    /// Bytes written since a rebuild's join point, against the room its
    /// join snapshot may pin.
    join_window: join_window::JoinWindow,
}

/// A data request to a replica's stream (its id is set when enqueued).
fn io_request(op: IoOp, offset: u64, length: u64, data: Bytes, epoch: u64, fua: bool) -> IoRequest {
    IoRequest { id: 0, op: op as i32, offset, length, data, epoch, fua, flush_sequence: 0, paced: false }
}

pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn replica_error(address: &str, e: ReplicaError) -> VolumeError {
    match e {
        ReplicaError::Invalid(m) => VolumeError::Invalid(format!("replica {address}: {m}")),
        ReplicaError::Fenced(m) => VolumeError::Fenced(format!("replica {address}: {m}")),
        ReplicaError::NoSpace(m) => VolumeError::NoSpace(format!("replica {address}: {m}")),
        ReplicaError::Failed(m) | ReplicaError::Corrupt(m) => VolumeError::Io(format!("replica {address}: {m}")),
    }
}

impl Volume {
    /// A request carrying a client's I/O: stamped with this engine's epoch
    /// and marked paced while the volume's limiter holds clients back.
    fn client_request(&self, op: IoOp, offset: u64, length: u64, data: Bytes, fua: bool) -> IoRequest {
        let mut request = io_request(op, offset, length, data, self.epoch, fua);
        request.paced = self.paced.load(Ordering::Relaxed);
        request
    }

    /// Connects to the replicas, raises their epoch, and decides who serves:
    /// the replica with the newest revision, and every replica whose data
    /// matches it; the rest are listed ERR and returned for rebuild.
    pub async fn open(
        name: &str,
        size: u64,
        epoch: u64,
        addresses: &[String],
        timeout: Duration,
        local_sockets: Option<std::path::PathBuf>,
    ) -> Result<(Arc<Volume>, Vec<String>)> {
        if size == 0 || size % BLOCK != 0 {
            return Err(VolumeError::Invalid(format!("volume size {size} must be a positive multiple of {BLOCK}")));
        }
        let (repairs, repair_jobs) = repair::repair_queue();
        let volume = Arc::new(Volume {
            name: name.to_string(),
            epoch,
            size: AtomicU64::new(size),
            replicas: RwLock::new(Vec::new()),
            dispatch: Mutex::new(()),
            pause: tokio::sync::RwLock::new(()),
            last_reader: AtomicU64::new(u64::MAX),
            reads: AtomicU64::new(0),
            timeout,
            local_sockets,
            dirty: Mutex::new(HashMap::new()),
            unflushed: Mutex::new(Unflushed::default()),
            unflushed_writes: Arc::new(tokio::sync::Notify::new()),
            rebuilds: Mutex::new(VecDeque::new()),
            rebuild_lock: tokio::sync::Mutex::new(()),
            rebuild_seq: AtomicU64::new(0),
            fenced: AtomicBool::new(false),
            out_of_space: AtomicBool::new(false),
            frontends: Mutex::new(Vec::new()),
            unreachable: Mutex::new(Vec::new()),
            rebuild_bytes_per_sec: AtomicU64::new(0),
            metrics: metrics::IoMetrics::default(),
            flush_sequence: AtomicU64::new(0),
            min_write_acks: AtomicUsize::new(0),
            integrity: Mutex::new(Integrity::default()),
            repairs,
            limiter: Mutex::new(Limiter::default()),
            limited: AtomicBool::new(false),
            paced: AtomicBool::new(false),
            join_window: Default::default(),
        });
        volume.spawn_repairs(repair_jobs);
        let mut joined: Vec<(Arc<Replica>, InfoResponse)> = Vec::new();
        let mut rebuild = Vec::new();
        for address in addresses {
            match volume.prepare_replica(address).await {
                Ok((conn, info)) if info.size_bytes == size => {
                    let r = Replica::new(address, info.store_id, conn, Mode::ERR, String::new());
                    joined.push((r, info));
                }
                Ok((conn, info)) => {
                    let why = format!("replica holds {} bytes, volume is {size}", info.size_bytes);
                    tracing::warn!(replica = %address, "{why}");
                    let r = Replica::new(address, info.store_id, conn, Mode::ERR, why);
                    volume.replicas.write().expect("replicas").push(r);
                    rebuild.push(address.clone());
                }
                Err(VolumeError::Fenced(m)) => return Err(VolumeError::Fenced(m)),
                Err(e) => {
                    tracing::warn!(replica = %address, error = %e, "replica unavailable at start");
                    volume.unreachable.lock().expect("unreachable").push((address.clone(), e.to_string()));
                    rebuild.push(address.clone());
                }
            }
        }
        if joined.is_empty() {
            return Err(VolumeError::Io("no replica is reachable".into()));
        }
        let source_index = Self::elect_source(&joined, size, timeout).await?;
        let source = joined[source_index].0.clone();
        // Flushes of this engine are numbered past any stamp of this epoch
        // already on a replica (an engine restarted with the same epoch).
        let highest_sequence =
            joined.iter().filter(|(_, i)| i.stamp_epoch == epoch).map(|(_, i)| i.stamp_sequence).max().unwrap_or(0);
        volume.flush_sequence.store(highest_sequence, Ordering::SeqCst);
        tracing::info!(
            source = %source.address,
            stamp_epoch = joined[source_index].1.stamp_epoch,
            stamp_sequence = joined[source_index].1.stamp_sequence,
            "elected the replica with the newest flushed data as the source"
        );
        source.set(Mode::RW, "");
        for (i, (r, info)) in joined.iter().enumerate() {
            if i != source_index {
                match same_data(&source, r, size, timeout).await {
                    Ok(true) => r.set(Mode::RW, ""),
                    Ok(false) => {
                        tracing::info!(replica = %r.address, stamp_sequence = info.stamp_sequence, "replica differs from the source; will rebuild");
                        r.set(Mode::ERR, "differs from the newest replica at start");
                        rebuild.push(r.address.clone());
                    }
                    Err(e) => {
                        r.set(Mode::ERR, &e.to_string());
                        rebuild.push(r.address.clone());
                    }
                }
            }
            tracing::info!(
                replica = %r.address,
                stamp_epoch = info.stamp_epoch,
                stamp_sequence = info.stamp_sequence,
                revision = info.revision_counter,
                clean = info.clean_at_open,
                mode = ?r.mode(),
                "replica at start"
            );
            volume.replicas.write().expect("replicas").push(r.clone());
            volume.watch_stream(r);
        }
        volume.spawn_background_flush();
        Ok((volume, rebuild))
    }

    /// Picks the source among the reachable replicas (see `election`): the
    /// highest flush stamp; replicas tied on it are told apart by their
    /// content checksums, computed only for them.
    async fn elect_source(joined: &[(Arc<Replica>, InfoResponse)], size: u64, timeout: Duration) -> Result<usize> {
        let mut candidates: Vec<Candidate> = joined
            .iter()
            .map(|(r, info)| Candidate {
                stamp: (info.stamp_epoch, info.stamp_sequence),
                clean_at_open: info.clean_at_open,
                store_id: r.store_id,
                content: None,
            })
            .collect();
        let tied = election::tied_on_top(&candidates);
        if tied.len() > 1 {
            for i in tied {
                match content_digest(&joined[i].0, size, timeout).await {
                    Ok(digest) => candidates[i].content = Some(digest),
                    Err(e) => tracing::warn!(replica = %joined[i].0.address, error = %e, "content checksums failed"),
                }
            }
        }
        election::elect(&candidates).ok_or_else(|| VolumeError::Io("no replica is reachable".into()))
    }

    /// Writes and flushes fail unless `acks` RW replicas took them.
    pub fn set_min_write_acks(&self, acks: usize) {
        self.min_write_acks.store(acks, Ordering::SeqCst);
    }

    /// Connects and fences: the replica remembers our epoch from now on.
    async fn prepare_replica(&self, address: &str) -> Result<(ReplicaConn, InfoResponse)> {
        let conn = ReplicaConn::connect(address, self.timeout, self.local_sockets.as_deref())
            .await
            .map_err(|e| replica_error(address, e))?;
        let info = unary(self.timeout, conn.client().set_epoch(SetEpochRequest { epoch: self.epoch }))
            .await
            .map_err(|e| replica_error(address, e))?;
        Ok((conn, info))
    }

    /// Sets the frontend I/O limits (zeros: none), from now on.
    pub fn set_limits(&self, limits: Limits) {
        *self.limiter.lock().unwrap_or_else(|p| p.into_inner()) = Limiter::new(limits, Instant::now());
        self.limited.store(limits != Limits::default(), Ordering::SeqCst);
    }

    pub fn limits(&self) -> Limits {
        self.limiter.lock().unwrap_or_else(|p| p.into_inner()).limits()
    }

    /// Waits until the limits let a request of `bytes` go.
    async fn throttle(&self, bytes: u64) {
        if !self.limited.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        let wait = self.limiter.lock().unwrap_or_else(|p| p.into_inner()).admit(bytes, now);
        let wait = crate::limit::on_the_beat(now.saturating_duration_since(*BEAT_ORIGIN), wait);
        // While the limit holds requests back, neither this process nor
        // the replicas poll for them (see `busy_poll::keep_polling`).
        self.paced.store(!wait.is_zero(), Ordering::Relaxed);
        if !wait.is_zero() {
            let _paced = ironhorn_proto::busy_poll::Paced::new();
            // The same instant for every request of a beat: one timer slot.
            tokio::time::sleep_until((now + wait).into()).await;
        }
    }

    /// Limits rebuild copying to `bytes_per_sec` (0: unlimited).
    pub fn set_rebuild_rate(&self, bytes_per_sec: u64) {
        self.rebuild_bytes_per_sec.store(bytes_per_sec, Ordering::SeqCst);
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::SeqCst)
    }

    pub fn add_frontend(&self, description: String) {
        self.frontends.lock().expect("frontends").push(description);
    }

    /// Flushes every replica [`BACKGROUND_FLUSH_AFTER`] after the first
    /// write that no flush covers, when the client has not flushed by then.
    /// Writes a client never flushes stay in the unflushed set (a replica
    /// that crashes may have lost them, so a rebuild must copy them); this
    /// bounds that set to a few seconds of writes. Idle, the task sleeps on
    /// the signal: no timer runs.
    fn spawn_background_flush(self: &Arc<Self>) {
        let volume = Arc::downgrade(self);
        let signal = self.unflushed_writes.clone();
        tokio::spawn(async move {
            loop {
                signal.notified().await;
                tokio::time::sleep(BACKGROUND_FLUSH_AFTER).await;
                let Some(volume) = volume.upgrade() else { return };
                if volume.fenced.load(Ordering::SeqCst) {
                    return;
                }
                if volume.unflushed.lock().expect("unflushed").current.is_empty() {
                    continue;
                }
                if let Err(e) = volume.flush_replicas().await {
                    tracing::warn!(error = %e, "background flush failed");
                }
            }
        });
    }

    fn check_range(&self, offset: u64, length: u64) -> Result<()> {
        if length == 0 {
            return Err(VolumeError::Invalid(format!("zero-length request at {offset}")));
        }
        if offset % BLOCK != 0 || length % BLOCK != 0 {
            return Err(VolumeError::Invalid(format!(
                "offset {offset} and length {length} must be multiples of {BLOCK}"
            )));
        }
        if offset.checked_add(length).is_none_or(|end| end > self.size()) {
            return Err(VolumeError::Invalid(format!(
                "range {offset}+{length} ends past the volume size {}",
                self.size()
            )));
        }
        Ok(())
    }

    fn check_fenced(&self) -> Result<()> {
        if self.fenced.load(Ordering::SeqCst) {
            return Err(VolumeError::Fenced(format!("epoch {} is no longer current", self.epoch)));
        }
        Ok(())
    }

    fn replicas_in(&self, modes: &[Mode]) -> Vec<Arc<Replica>> {
        self.replicas.read().expect("replicas").iter().filter(|r| modes.contains(&r.mode())).cloned().collect()
    }

    /// Takes a replica out of service and starts its dirty map.
    /// Fails `replica` as soon as its data stream ends, I/O or not: an idle
    /// volume must not report a dead replica as healthy until its next
    /// write. The watcher holds neither the volume nor the replica.
    pub(super) fn watch_stream(self: &Arc<Self>, replica: &Arc<Replica>) {
        let closed = replica.conn.closed();
        let (volume, replica) = (Arc::downgrade(self), Arc::downgrade(replica));
        tokio::spawn(async move {
            closed.await;
            let (Some(volume), Some(replica)) = (volume.upgrade(), replica.upgrade()) else { return };
            let member = volume.replicas.read().expect("replicas").iter().any(|r| Arc::ptr_eq(r, &replica));
            if member {
                volume.fail_replica(&replica, "data stream closed");
            }
        });
    }

    fn fail_replica(&self, replica: &Replica, why: &str) {
        let mut dirty = self.dirty.lock().expect("dirty");
        let was = replica.mode();
        if was == Mode::ERR {
            return;
        }
        // It may have lost whatever it acknowledged but did not flush. A
        // replica failing mid-rebuild has an unknown amount left to copy.
        let chunks = self.unflushed.lock().expect("unflushed").missed_by(replica.store_id);
        dirty.insert(replica.store_id, DirtyMap { chunks, complete: was == Mode::RW });
        replica.set(Mode::ERR, why);
        tracing::error!(replica = %replica.address, was = ?was, reason = why, "replica failed");
    }

    fn mark_dirty(&self, offset: u64, length: u64, only: Option<u64>) {
        let chunks = offset / CHUNK..(offset + length).div_ceil(CHUNK);
        let mut dirty = self.dirty.lock().expect("dirty");
        for (store, map) in dirty.iter_mut() {
            if only.is_none_or(|s| s == *store) {
                map.chunks.extend(chunks.clone());
            }
        }
        if only.is_none() {
            self.unflushed.lock().expect("unflushed").start(chunks);
        }
    }

    /// Sends one request to every writable replica in the same stream
    /// order, and settles the outcome.
    async fn replicate(&self, op: IoOp, offset: u64, length: u64, data: Bytes, fua: bool) -> Result<()> {
        let _pause = self.pause.read().await;
        self.check_fenced()?;
        let (targets, pending, flush_id) = {
            let _order = self.dispatch.lock().expect("dispatch");
            // Book-keeping first, so a replica failing from now on finds
            // this request in its dirty map.
            let flush_id = if op == IoOp::Flush {
                Some(self.unflushed.lock().expect("unflushed").begin_flush())
            } else {
                self.mark_dirty(offset, length, None);
                None
            };
            // Numbered in stream order, under the dispatch lock.
            let sequence = if op == IoOp::Flush { self.flush_sequence.fetch_add(1, Ordering::SeqCst) + 1 } else { 0 };
            let targets: Vec<(Arc<Replica>, Mode)> = self
                .replicas
                .read()
                .expect("replicas")
                .iter()
                .filter_map(|r| {
                    let mode = r.mode();
                    (mode != Mode::ERR).then(|| (r.clone(), mode))
                })
                .collect();
            let pending: Vec<_> = targets
                .iter()
                .map(|(r, mode)| {
                    let mut request = self.client_request(op, offset, length, data.clone(), fua);
                    // Only a complete replica may claim the flush: a WO one
                    // (rebuilding) flushes without a stamp.
                    if *mode == Mode::RW {
                        request.flush_sequence = sequence;
                    }
                    r.conn.enqueue(request)
                })
                .collect();
            (targets, pending, flush_id)
        };
        // A replica's answer to a flush is recorded as it comes: if it
        // fails while a slower one is still flushing, what it made durable
        // is not counted as missed.
        let results = join_all(pending.into_iter().zip(&targets).map(|(p, (replica, _))| async move {
            let result = p.wait().await;
            if let (Some(id), Ok(_)) = (flush_id, &result) {
                self.unflushed.lock().expect("unflushed").flushed_on(id, replica.store_id);
            }
            result
        }))
        .await;
        if flush_id.is_none() {
            let chunks = offset / CHUNK..(offset + length).div_ceil(CHUNK);
            if self.unflushed.lock().expect("unflushed").complete(chunks) {
                self.unflushed_writes.notify_one();
            }
        }
        let mut rw_ok = 0;
        let mut last_error = String::from("no RW replica");
        // When every RW replica refused for lack of space, the request is
        // refused and no RW replica is failed: nothing changed on them and
        // they all still serve reads. A replica out of space while others
        // took the request fails on its own, and so does a WO replica that
        // took a request the RW ones refused (it would diverge from them).
        let refused_for_space = targets.iter().any(|(_, mode)| *mode == Mode::RW)
            && targets
                .iter()
                .zip(&results)
                .filter(|((_, mode), _)| *mode == Mode::RW)
                .all(|(_, r)| matches!(r, Err(ReplicaError::NoSpace(_))));
        for ((replica, mode), result) in targets.iter().zip(results) {
            let failure = match result {
                Ok(_) if refused_for_space => Some("took a request the RW replicas refused for lack of space".into()),
                Ok(_) => {
                    if *mode == Mode::RW {
                        rw_ok += 1;
                    }
                    None
                }
                Err(ReplicaError::Fenced(m)) => {
                    self.fenced.store(true, Ordering::SeqCst);
                    tracing::error!(replica = %replica.address, "fenced: {m}; this engine stops serving");
                    return Err(VolumeError::Fenced(m));
                }
                Err(ReplicaError::NoSpace(m)) if refused_for_space => {
                    last_error = format!("replica {}: {m}", replica.address);
                    None
                }
                Err(e) => {
                    last_error = format!("replica {}: {e}", replica.address);
                    Some(e.to_string())
                }
            };
            if let Some(why) = failure {
                self.fail_replica(replica, &why);
                if op != IoOp::Flush {
                    self.mark_dirty(offset, length, Some(replica.store_id));
                }
            }
        }
        if let Some(id) = flush_id {
            // Replicas that failed this flush captured its set above.
            self.unflushed.lock().expect("unflushed").end_flush(id, rw_ok > 0);
        }
        if refused_for_space {
            self.out_of_space.store(true, Ordering::SeqCst);
            return Err(VolumeError::NoSpace(format!("{op:?} at {offset}: {last_error}")));
        }
        if rw_ok == 0 {
            return Err(VolumeError::Io(format!("{op:?} at {offset}: no healthy replica took it ({last_error})")));
        }
        let needed = self.min_write_acks.load(Ordering::SeqCst);
        if rw_ok < needed {
            return Err(VolumeError::NoQuorum(format!(
                "{op:?} at {offset}: {rw_ok} replica(s) acknowledged it, {needed} required ({last_error})"
            )));
        }
        if op != IoOp::Flush {
            // Space again (a flush needs none, so it says nothing about it).
            self.out_of_space.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Counts a frontend request in the volume's metrics.
    fn counted<T>(&self, op: metrics::Op, bytes: u64, started: Instant, result: Result<T>) -> Result<T> {
        self.metrics.record(op, bytes, started, result.is_ok());
        result
    }

    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        let (started, length) = (Instant::now(), data.len() as u64);
        self.throttle(length).await;
        let result = self.write_uncounted(offset, data, fua).await;
        self.counted(metrics::Op::Write, length, started, result)
    }

    async fn write_uncounted(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        let length = data.len() as u64;
        self.check_range(offset, length)?;
        if length > MAX_IO_BYTES {
            return Err(VolumeError::TooLarge(format!("write of {length} bytes exceeds {MAX_IO_BYTES}")));
        }
        self.join_window.admit(length).await;
        self.replicate(IoOp::Write, offset, length, data, fua).await
    }

    pub async fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<()> {
        let started = Instant::now();
        // A trim counts as a request, not as bytes moved.
        self.throttle(0).await;
        let result = async {
            self.check_range(offset, length)?;
            self.replicate(IoOp::Trim, offset, length, Bytes::new(), fua).await
        }
        .await;
        self.counted(metrics::Op::Trim, length, started, result)
    }

    /// A client's flush: counted in the metrics.
    pub async fn flush(&self) -> Result<()> {
        let started = Instant::now();
        let result = self.flush_replicas().await;
        self.counted(metrics::Op::Flush, 0, started, result)
    }

    /// Flushes every writable replica (the engine's own flushes, and the
    /// client's through [`Volume::flush`]).
    async fn flush_replicas(&self) -> Result<()> {
        self.replicate(IoOp::Flush, 0, 0, Bytes::new(), false).await
    }

    pub async fn read(&self, offset: u64, length: u64) -> Result<Bytes> {
        let started = Instant::now();
        self.throttle(length).await;
        let result = self.read_uncounted(offset, length).await;
        self.counted(metrics::Op::Read, length, started, result)
    }

    /// Request counters of the frontends, by kind.
    pub fn metrics(&self) -> Vec<ironhorn_proto::engine::OpMetrics> {
        self.metrics.snapshot()
    }

    async fn read_uncounted(&self, offset: u64, length: u64) -> Result<Bytes> {
        self.check_range(offset, length)?;
        if length > MAX_IO_BYTES {
            return Err(VolumeError::TooLarge(format!("read of {length} bytes exceeds {MAX_IO_BYTES}")));
        }
        let _pause = self.pause.read().await;
        self.check_fenced()?;
        let healthy = self.replicas_in(&[Mode::RW]);
        if healthy.is_empty() {
            return Err(VolumeError::Io("no healthy replica".into()));
        }
        let loads: Vec<usize> = healthy.iter().map(|r| r.reads_out.load(Ordering::Relaxed)).collect();
        let last = self.last_reader.load(Ordering::Relaxed);
        let turn_over =
            self.reads.fetch_add(1, Ordering::Relaxed) % read_choice::READ_TURN == read_choice::READ_TURN - 1;
        let start = read_choice::first_reader(&loads, healthy.iter().position(|r| r.store_id == last), turn_over);
        let mut last_error = String::new();
        for i in 0..healthy.len() {
            let replica = &healthy[(start + i) % healthy.len()];
            self.last_reader.store(replica.store_id, Ordering::Relaxed);
            let request = self.client_request(IoOp::Read, offset, length, Bytes::new(), false);
            let _out = read_choice::ReadOut::new(&replica.reads_out);
            match replica.conn.enqueue(request).wait().await {
                Ok(data) if data.len() as u64 == length => return Ok(data),
                Ok(data) => {
                    let why = format!("read returned {} of {length} bytes", data.len());
                    self.fail_replica(replica, &why);
                    last_error = why;
                }
                Err(ReplicaError::Fenced(m)) => {
                    self.fenced.store(true, Ordering::SeqCst);
                    return Err(VolumeError::Fenced(m));
                }
                Err(ReplicaError::Corrupt(m)) => {
                    // A block of this copy fails its checksum: the next
                    // replica serves, and this one is repaired in place.
                    tracing::error!(replica = %replica.address, offset, length, "bad block read: {m}");
                    last_error = format!("replica {}: {m}", replica.address);
                    self.queue_repair(replica, offset, length);
                }
                Err(e) => {
                    // An I/O error: this copy is bad;
                    // the next replica serves and this one gets rebuilt,
                    // the failed range included (its metadata may look fine).
                    last_error = format!("replica {}: {e}", replica.address);
                    self.fail_replica(replica, &e.to_string());
                    self.mark_dirty(offset, length, Some(replica.store_id));
                }
            }
        }
        Err(VolumeError::Io(format!("read at {offset}: every replica failed ({last_error})")))
    }

    pub fn status(&self) -> VolumeStatus {
        let (bad_blocks_found, bad_blocks_repaired) = self.bad_blocks();
        let mut replicas: Vec<ReplicaStatus> = self
            .replicas
            .read()
            .expect("replicas")
            .iter()
            .map(|r| ReplicaStatus {
                address: r.address.clone(),
                mode: r.mode(),
                error: r.error(),
                transport: r.conn.transport.as_str(),
            })
            .collect();
        for (address, why) in self.unreachable.lock().expect("unreachable").iter() {
            replicas.push(ReplicaStatus {
                address: address.clone(),
                mode: Mode::ERR,
                error: why.clone(),
                transport: "",
            });
        }
        VolumeStatus {
            volume: self.name.clone(),
            size_bytes: self.size(),
            epoch: self.epoch,
            frontends: self.frontends.lock().expect("frontends").clone(),
            replicas,
            rebuilds: self.rebuilds.lock().expect("rebuilds").iter().cloned().collect(),
            fenced: self.fenced.load(Ordering::SeqCst),
            out_of_space: self.out_of_space.load(Ordering::SeqCst),
            unflushed_bytes: self.unflushed.lock().expect("unflushed").len() * CHUNK,
            scrub: self.scrub_status(),
            bad_blocks_found,
            bad_blocks_repaired,
            limits: self.limits(),
            rebuild_bytes_per_sec: self.rebuild_bytes_per_sec.load(Ordering::SeqCst),
        }
    }

    pub fn remove_replica(&self, address: &str) -> Result<()> {
        let mut replicas = self.replicas.write().expect("replicas");
        let Some(index) = replicas.iter().position(|r| r.address == address) else {
            let mut unreachable = self.unreachable.lock().expect("unreachable");
            let before = unreachable.len();
            unreachable.retain(|(a, _)| a != address);
            if unreachable.len() == before {
                return Err(VolumeError::NotFound(format!("replica {address}")));
            }
            return Ok(());
        };
        let healthy_others = replicas.iter().filter(|r| r.address != address && r.mode() == Mode::RW).count();
        if replicas[index].mode() == Mode::RW && healthy_others == 0 {
            return Err(VolumeError::Busy(format!("replica {address} is the last healthy one")));
        }
        let removed = replicas.remove(index);
        drop(replicas);
        // Its dirty map stays: if the same store comes back, it is a delta.
        self.fail_replica(&removed, "removed");
        Ok(())
    }
}
