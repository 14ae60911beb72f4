//! The replica's block store: a chain of redirect-on-write layers over a raw
//! byte range, with a crc32 per 4 KiB block and a journaled, checkpointed map.
//!
//! Invariants (see `docs/on-disk-format.md`):
//! - A write never overwrites a block that durable metadata points at: new
//!   data always goes to a free physical block, and the block it replaces is
//!   freed only once the metadata that stops pointing at it is durable, and no
//!   read that looked it up earlier is still in flight (quarantine).
//! - FLUSH makes data durable first, then the journal records that point at
//!   it (two syncs), so durable metadata never points at non-durable data.
//! - Journal blocks count only with the superblock's generation and in index
//!   order; the first invalid block ends the replay. Every open writes a new
//!   checkpoint and starts a new generation, so stale blocks are never replayed.
//! - Concurrent writes to one block resolve in submission order on every
//!   replica (sequence numbers), whatever order the device completes them in.
//! - Every read block is checked against its crc; a mismatch is an error
//!   naming the volume offset, never data.

use std::sync::{Arc, Mutex, OnceLock, RwLock};

use thiserror::Error;

use crate::device::{Device, StoreLocation};
use crate::faults::Faults;
use crate::format::{
    self, BLOCK, BLOCK_SIZE, CheckpointImage, Entry, FlushStamp, JournalBlock, RECORDS_PER_JOURNAL_BLOCK, Record,
    SlotContent, Superblock, ZERO_PBA,
};
use crate::io::{AlignedBuf, BackendKind};

mod blockmap;
use blockmap::BlockMap;
mod fence;
mod meta;
mod scan;
mod scrub;
mod snapshots;

pub use scrub::{BadBlock, MAX_SCRUB_BYTES, ScrubReport};

use meta::{Allocator, Layer, Meta, WriteTicket};

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("fenced: request epoch {epoch} is older than epoch {highest} already seen")]
    Fenced { epoch: u64, highest: u64 },
    #[error("out of space: {needed} blocks needed, {free} free")]
    OutOfSpace { needed: u64, free: u64 },
    #[error("out of space: the device refused to {op}")]
    DeviceFull { op: &'static str },
    #[error("checksum mismatch reading volume offset {offset}")]
    Checksum { offset: u64 },
    #[error("{op} failed: {source}")]
    Io { op: &'static str, source: std::io::Error },
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("store is unusable after an earlier failure: {0}")]
    Failed(String),
    #[error("store metadata is corrupt: {0}")]
    Corrupt(String),
    #[error("store holds a {existing}-byte volume, not {requested} bytes (use expand to grow it)")]
    SizeMismatch { existing: u64, requested: u64 },
    #[error("{0}")]
    NotAStore(String),
}

type Result<T> = std::result::Result<T, StoreError>;

fn io_err(op: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| match source.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => StoreError::DeviceFull { op },
        _ => StoreError::Io { op, source },
    }
}

/// Largest single read: a stream read or a rebuild's layer read. Anything
/// bigger is refused before a buffer is allocated for it.
pub const MAX_READ_BYTES: u64 = 32 << 20;

/// Blocks a trim, allocation scan or checksum scan handles per hold of the
/// metadata lock; between slices other I/O on the store proceeds.
const SLICE_BLOCKS: u64 = 1 << 10;

/// Most checksums one request may ask for (16 MiB of answer).
pub const MAX_CHECKSUMS: u64 = 4 << 20;

/// Longest range one allocation scan may cover (NBD asks at most 4 GiB).
pub const MAX_ALLOCATION_BYTES: u64 = 4 << 30;

/// crc32 of an all-zero block: what unmapped and trimmed blocks read as.
pub fn zero_block_crc() -> u32 {
    static CRC: OnceLock<u32> = OnceLock::new();
    *CRC.get_or_init(|| format::crc32(&[0u8; BLOCK]))
}

#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub location: StoreLocation,
    pub volume_size: u64,
    /// Physical size of a store created now; `None` picks a default.
    pub capacity_bytes: Option<u64>,
    /// Journal length of a store created now; `None` picks a default.
    pub journal_blocks: Option<u64>,
    pub backend: BackendKind,
    /// Create the store when it does not exist.
    pub create: bool,
    /// Grow an existing store of a smaller volume to `volume_size` (an
    /// expansion made while this replica was not running). Never shrinks;
    /// off, any other size is refused.
    pub grow: bool,
}

impl StoreConfig {
    pub fn new(location: StoreLocation, volume_size: u64) -> Self {
        Self {
            location,
            volume_size,
            capacity_bytes: None,
            journal_blocks: None,
            backend: BackendKind::Uring,
            create: true,
            grow: false,
        }
    }
}

/// Largest single write: redirect-on-write needs this much free space at once.
pub const MAX_WRITE_BYTES: u64 = 4 << 20;

pub fn default_journal_blocks(volume_size: u64) -> u64 {
    (volume_size / BLOCK_SIZE / 256).clamp(256, 16384)
}

/// Checkpoint blocks needed for `entries` map entries over `layers` layers.
fn checkpoint_blocks_for(entries: u64, layers: u64) -> u64 {
    format::checkpoint_block_count((32 + entries * 20 + layers * 300) as usize) as u64
}

/// Default physical size: the volume, a quarter more for snapshots, the
/// journal, and room for two checkpoints.
pub fn default_capacity(volume_size: u64, journal_blocks: u64) -> u64 {
    let volume_blocks = volume_size / BLOCK_SIZE;
    let data = volume_blocks + (volume_blocks / 4).max(2 * MAX_WRITE_BYTES / BLOCK_SIZE);
    (format::SUPERBLOCK_SLOTS + journal_blocks + data + 2 * checkpoint_blocks_for(data, 8) + 16) * BLOCK_SIZE
}

/// Bytes a store for a volume of `volume_size` takes when created with the
/// defaults (what an LV for it is sized to): what schedulers count.
pub fn default_store_bytes(volume_size: u64) -> u64 {
    default_capacity(volume_size, default_journal_blocks(volume_size))
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn random_u64() -> u64 {
    let mut v = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into v.
    let n = unsafe { libc::getrandom(v.as_mut_ptr().cast(), 8, 0) };
    assert_eq!(n, 8, "getrandom failed");
    u64::from_le_bytes(v)
}

/// Public view of one snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub name: String,
    pub created_unix_ms: u64,
    pub allocated_bytes: u64,
    pub size_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreInfo {
    pub size_bytes: u64,
    pub revision: u64,
    pub highest_epoch: u64,
    pub clean_at_open: bool,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub layer_count: u32,
    pub location: String,
    pub store_id: u64,
    pub stamp: FlushStamp,
}

/// State of one block within one layer, as rebuilds see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    Unmapped = 0,
    Data = 1,
    Zero = 2,
}

/// A write placed in the write order whose data is not yet on the device.
/// It must be passed to [`Store::finish_write`]; one dropped instead (its
/// task cancelled) keeps its blocks allocated until the store is reopened.
pub struct StartedWrite {
    ticket: WriteTicket,
    _gate: tokio::sync::OwnedRwLockReadGuard<()>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
    pub zero: bool,
}

pub struct Store {
    device: RwLock<Arc<Device>>,
    /// Faults tests inject into the device at run time.
    faults: Arc<Faults>,
    meta: Mutex<Meta>,
    /// Serialises journal commits, checkpoints and superblock writes.
    commit: tokio::sync::Mutex<()>,
    /// Data I/O holds it shared; structural changes (snapshots, expand) hold
    /// it exclusively, so they happen at one point in the write stream.
    gate: Arc<tokio::sync::RwLock<()>>,
}

impl Store {
    /// Opens the store at `config.location`, creating it when allowed.
    pub async fn open(config: &StoreConfig) -> Result<Store> {
        if config.volume_size == 0 || config.volume_size % BLOCK_SIZE != 0 {
            return Err(StoreError::InvalidArgument(format!(
                "volume size {} must be a positive multiple of {BLOCK_SIZE}",
                config.volume_size
            )));
        }
        let journal_blocks = config.journal_blocks.unwrap_or_else(|| default_journal_blocks(config.volume_size));
        let exists = Device::exists(&config.location).map_err(io_err("look up store"))?;
        if !exists {
            if !config.create {
                return Err(StoreError::NotFound(format!("store {}", config.location)));
            }
            let capacity =
                config.capacity_bytes.unwrap_or_else(|| default_capacity(config.volume_size, journal_blocks));
            Device::create(&config.location, capacity).map_err(io_err("create store"))?;
        }
        let device = Device::open(&config.location, config.backend).map_err(io_err("open store"))?;
        let head = device.read(0, AlignedBuf::zeroed(2 * BLOCK)).await.map_err(io_err("read superblocks"))?;
        let slots = [Superblock::decode(&head[..BLOCK]), Superblock::decode(&head[BLOCK..])];
        let best = slots
            .iter()
            .filter_map(|s| match s {
                SlotContent::Valid(sb) => Some(sb.clone()),
                _ => None,
            })
            .max_by_key(|sb| sb.sequence);
        let store = match best {
            Some(sb) => {
                let grow = config.grow && sb.volume_size < config.volume_size;
                if sb.volume_size != config.volume_size && !grow {
                    return Err(StoreError::SizeMismatch { existing: sb.volume_size, requested: config.volume_size });
                }
                let epoch = sb.highest_epoch;
                let store = Self::load(device, sb).await?;
                if grow {
                    tracing::info!(to = config.volume_size, "growing the store to the volume's new size");
                    store.expand(epoch, config.volume_size).await?;
                }
                store
            }
            None if slots.iter().all(|s| *s == SlotContent::Empty) => {
                Self::format(device, config.volume_size, journal_blocks).await?
            }
            None if slots.contains(&SlotContent::Foreign) => {
                return Err(StoreError::NotAStore(format!(
                    "{} holds data that is not an ironhorn store; refusing to overwrite it",
                    config.location
                )));
            }
            None => {
                return Err(StoreError::Corrupt(format!(
                    "{}: no valid superblock ({:?} / {:?})",
                    config.location, slots[0], slots[1]
                )));
            }
        };
        // A new checkpoint on every open: the journal restarts in a new
        // generation and the store is marked not-clean until closed.
        store.checkpoint_now(false).await?;
        Ok(store)
    }

    async fn format(device: Device, volume_size: u64, journal_blocks: u64) -> Result<Store> {
        let capacity_blocks = device.size_bytes() / BLOCK_SIZE;
        let data_start = format::SUPERBLOCK_SLOTS + journal_blocks;
        let minimum = data_start + checkpoint_blocks_for(0, 1) * 2 + 16;
        if capacity_blocks < minimum {
            return Err(StoreError::InvalidArgument(format!(
                "store of {} bytes is too small: at least {} needed",
                device.size_bytes(),
                minimum * BLOCK_SIZE
            )));
        }
        // Stale journal blocks from an earlier store on the same space are
        // ignored because they carry another store id.
        let sb = Superblock {
            store_id: random_u64(),
            sequence: 0,
            volume_size,
            capacity_blocks,
            journal_start: format::SUPERBLOCK_SLOTS,
            journal_blocks,
            journal_generation: 0,
            checkpoint_head: ZERO_PBA,
            checkpoint_blocks: 0,
            checkpoint_len: 0,
            checkpoint_crc: 0,
            revision: 0,
            highest_epoch: 0,
            clean: true,
            stamp: FlushStamp::NONE,
        };
        let mut alloc = Allocator::new(capacity_blocks);
        for pba in 0..data_start {
            alloc.claim(pba);
        }
        let head = Layer {
            id: 1,
            name: String::new(),
            created_unix_ms: now_unix_ms(),
            size_bytes: volume_size,
            map: BlockMap::new(),
        };
        Ok(Self::assemble(device, Meta::new(sb, vec![head], 2, alloc, Vec::new(), 0, FlushStamp::NONE, true)))
    }

    fn assemble(device: Device, meta: Meta) -> Store {
        let faults = Arc::new(Faults::default());
        Store {
            device: RwLock::new(Arc::new(device.with_faults(faults.clone()))),
            faults,
            meta: Mutex::new(meta),
            commit: tokio::sync::Mutex::new(()),
            gate: Arc::new(tokio::sync::RwLock::new(())),
        }
    }

    /// Loads the checkpoint `sb` points at and replays the journal after it.
    async fn load(device: Device, sb: Superblock) -> Result<Store> {
        let corrupt = |what: String| StoreError::Corrupt(what);
        if sb.capacity_blocks * BLOCK_SIZE > device.size_bytes() {
            return Err(corrupt(format!(
                "superblock says {} blocks but the device holds {} bytes",
                sb.capacity_blocks,
                device.size_bytes()
            )));
        }
        let mut alloc = Allocator::new(sb.capacity_blocks);
        let data_start = sb.journal_start + sb.journal_blocks;
        if data_start >= sb.capacity_blocks {
            return Err(corrupt("journal extends past the store".into()));
        }
        for pba in 0..data_start {
            alloc.claim(pba);
        }

        // Checkpoint chain.
        let mut blob = Vec::with_capacity(sb.checkpoint_len as usize);
        let mut checkpoint_pbas = Vec::new();
        let mut pba = sb.checkpoint_head;
        for index in 0..sb.checkpoint_blocks {
            if pba < data_start || !alloc.claim(pba) {
                return Err(corrupt(format!("checkpoint block {index} at {pba} is out of place")));
            }
            checkpoint_pbas.push(pba);
            let block =
                device.read(pba * BLOCK_SIZE, AlignedBuf::zeroed(BLOCK)).await.map_err(io_err("read checkpoint"))?;
            let (next, payload) = format::decode_checkpoint_block(&block, sb.store_id, index)
                .ok_or_else(|| corrupt(format!("checkpoint block {index} at {pba} fails its checksum")))?;
            blob.extend_from_slice(payload);
            pba = next;
        }
        if blob.len() as u64 != sb.checkpoint_len || format::crc32(&blob) != sb.checkpoint_crc {
            return Err(corrupt("checkpoint does not match the superblock's length and checksum".into()));
        }
        let image = CheckpointImage::decode(&blob).ok_or_else(|| corrupt("checkpoint does not decode".into()))?;
        let mut layers = Vec::with_capacity(image.layers.len());
        for l in image.layers {
            for (lba, e) in &l.entries {
                if *lba >= sb.volume_size / BLOCK_SIZE {
                    return Err(corrupt(format!("layer {} maps block {lba} past the volume end", l.id)));
                }
                if e.pba != ZERO_PBA && (e.pba < data_start || !alloc.claim(e.pba)) {
                    return Err(corrupt(format!(
                        "layer {} maps block {lba} to used or reserved block {}",
                        l.id, e.pba
                    )));
                }
            }
            layers.push(Layer {
                id: l.id,
                name: l.name,
                created_unix_ms: l.created_unix_ms,
                size_bytes: l.size_bytes,
                map: l.entries.into_iter().collect(),
            });
        }

        // Journal replay: blocks of this generation, in index order.
        let journal = device
            .read(sb.journal_start * BLOCK_SIZE, AlignedBuf::zeroed((sb.journal_blocks * BLOCK_SIZE) as usize))
            .await
            .map_err(io_err("read journal"))?;
        let mut revision = image.revision;
        let mut stamp = sb.stamp;
        let volume_blocks = sb.volume_size / BLOCK_SIZE;
        let mut replayed = 0u64;
        for (index, raw) in journal.chunks(BLOCK).enumerate() {
            let Some(jb) = JournalBlock::decode(raw, sb.store_id) else {
                break;
            };
            if jb.generation != sb.journal_generation || jb.index != index as u64 {
                break;
            }
            let at = (sb.journal_start + index as u64) * BLOCK_SIZE;
            for record in jb.records {
                let (layer_id, lba, value) = match record {
                    Record::Stamp(s) => {
                        stamp = s;
                        continue;
                    }
                    Record::Map { layer, lba, pba, crc } => {
                        if pba < data_start || !alloc.claim(pba) {
                            return Err(corrupt(format!(
                                "journal block at byte {at} maps block {lba} to used or reserved block {pba}"
                            )));
                        }
                        (layer, lba, Some(Entry { pba, crc }))
                    }
                    Record::Zero { layer, lba } => (layer, lba, Some(Entry { pba: ZERO_PBA, crc: zero_block_crc() })),
                    Record::Unmap { layer, lba } => (layer, lba, None),
                };
                if lba >= volume_blocks {
                    return Err(corrupt(format!(
                        "journal block at byte {at} names block {lba}, past the volume's {volume_blocks} blocks"
                    )));
                }
                let layer = layers
                    .iter_mut()
                    .find(|l| l.id == layer_id)
                    .ok_or_else(|| corrupt(format!("journal block at byte {at} names unknown layer {layer_id}")))?;
                let old = match value {
                    Some(e) => layer.map.insert(lba, e),
                    None => layer.map.remove(lba),
                };
                if let Some(old) = old.filter(|o| o.pba != ZERO_PBA) {
                    alloc.release(old.pba);
                }
            }
            revision = jb.revision;
            replayed += 1;
        }
        tracing::info!(
            generation = sb.journal_generation,
            replayed_blocks = replayed,
            revision,
            stamp_epoch = stamp.epoch,
            stamp_sequence = stamp.sequence,
            clean = sb.clean,
            "store loaded"
        );
        let clean = sb.clean;
        let next_layer_id = image.next_layer_id;
        Ok(Self::assemble(device, Meta::new(sb, layers, next_layer_id, alloc, checkpoint_pbas, revision, stamp, clean)))
    }

    fn device(&self) -> Arc<Device> {
        self.device.read().expect("device lock").clone()
    }

    fn meta(&self) -> std::sync::MutexGuard<'_, Meta> {
        self.meta.lock().expect("store metadata lock poisoned")
    }

    /// The injected-fault switchboard of this store's device (tests).
    pub fn faults(&self) -> Arc<Faults> {
        self.faults.clone()
    }

    async fn write_superblock(&self, sb: &Superblock) -> Result<()> {
        let device = self.device();
        let slot = sb.sequence % format::SUPERBLOCK_SLOTS;
        let result = async {
            device.write(slot * BLOCK_SIZE, AlignedBuf::from_slice(&sb.encode())).await?;
            device.sync().await
        }
        .await;
        result.map_err(|e| self.meta().fail(format!("superblock write: {e}")))
    }

    fn check_write_length(length: u64) -> Result<()> {
        if length > MAX_WRITE_BYTES {
            return Err(StoreError::InvalidArgument(format!(
                "write of {length} bytes is larger than the {MAX_WRITE_BYTES}-byte maximum"
            )));
        }
        Ok(())
    }

    fn check_range(&self, meta: &Meta, offset: u64, length: u64) -> Result<()> {
        if length == 0 {
            return Err(StoreError::InvalidArgument(format!("zero-length request at offset {offset}")));
        }
        if offset % BLOCK_SIZE != 0 || length % BLOCK_SIZE != 0 {
            return Err(StoreError::InvalidArgument(format!(
                "offset {offset} and length {length} must be multiples of {BLOCK_SIZE}"
            )));
        }
        let end = offset.checked_add(length).ok_or_else(|| StoreError::InvalidArgument("range overflows".into()))?;
        if end > meta.sb.volume_size {
            return Err(StoreError::InvalidArgument(format!(
                "range {offset}+{length} ends past the volume size {}",
                meta.sb.volume_size
            )));
        }
        Ok(())
    }

    /// Writes `data` at `offset` into the head. With `fua` the write is
    /// durable before this returns.
    pub async fn write(&self, epoch: u64, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let started = self.start_write(epoch, "", offset, data.len() as u64).await?;
        self.finish_write(started, data).await?;
        if fua { self.flush().await } else { Ok(()) }
    }

    /// First half of a write: checks the request and places it in the write
    /// order (allocating its blocks). Requests started in some order resolve
    /// overlaps in that order, whatever order their data lands on the device;
    /// the gRPC server starts writes in stream order, so every replica fed
    /// the same stream ends up with the same blocks.
    pub async fn start_write(&self, epoch: u64, layer: &str, offset: u64, length: u64) -> Result<StartedWrite> {
        Self::check_write_length(length)?;
        let gate = self.admit(epoch).await?;
        let blocks = length / BLOCK_SIZE;
        let first_lba = offset / BLOCK_SIZE;
        let mut committed = false;
        loop {
            {
                let mut meta = self.meta();
                meta.check_usable()?;
                self.check_range(&meta, offset, length)?;
                let index = meta.layer_index(layer)?;
                let layer_id = meta.layers[index].id;
                let needed = blocks + meta.reserve_blocks(blocks);
                // Overwritten blocks come back only once a commit makes their
                // unmapping durable: commit early rather than run dry.
                let recyclable = (meta.pending_free.len() + meta.quarantined_blocks()) as u64;
                let room = meta.alloc.free >= needed && recyclable < (meta.alloc.free / 2).max(256);
                if room || committed {
                    if meta.alloc.free < needed {
                        return Err(StoreError::OutOfSpace { needed, free: meta.alloc.free });
                    }
                    let runs = meta.alloc.alloc(blocks).expect("free space was checked");
                    let ticket = meta.begin_write(layer_id, first_lba, blocks, runs);
                    return Ok(StartedWrite { ticket, _gate: gate });
                }
            }
            self.flush().await?;
            committed = true;
        }
    }

    /// Second half of a write: puts the data on the device and maps it.
    pub async fn finish_write(&self, started: StartedWrite, data: &[u8]) -> Result<()> {
        let mut result = if data.len() as u64 != started.ticket.blocks * BLOCK_SIZE {
            Err(StoreError::InvalidArgument(format!(
                "{} data bytes for a {}-byte write",
                data.len(),
                started.ticket.blocks * BLOCK_SIZE
            )))
        } else {
            Ok(())
        };
        let device = self.device();
        let mut crcs = Vec::with_capacity(started.ticket.blocks as usize);
        let mut at = 0usize;
        for &(pba, n) in &started.ticket.runs {
            if result.is_err() {
                break;
            }
            let len = n as usize * BLOCK;
            let buf = AlignedBuf::from_slice(&data[at..at + len]);
            crcs.extend(buf.chunks(BLOCK).map(format::crc32));
            if let Err(e) = device.write(pba * BLOCK_SIZE, buf).await {
                result = Err(io_err("write data")(e));
            }
            at += len;
        }
        let mut meta = self.meta();
        meta.settle_write(&started.ticket, result.is_ok().then_some(&crcs[..]));
        if result.is_ok() {
            meta.data_dirty = true;
        }
        result
    }
    /// Makes `[offset, offset+length)` read as zeroes and frees its blocks
    /// (TRIM and WRITE_ZEROES have the same effect here).
    pub async fn trim(&self, epoch: u64, offset: u64, length: u64) -> Result<()> {
        let _gate = self.admit(epoch).await?;
        self.zero_layer_range("", offset, length).await
    }

    /// Makes a range of one layer read as zeroes, a slice at a time so other
    /// requests get the metadata lock in between. The caller's stream starts
    /// nothing after this before it returns, so only requests started
    /// earlier run meanwhile; they are ordered before it (`applied_seq`).
    async fn zero_layer_range(&self, layer: &str, offset: u64, length: u64) -> Result<()> {
        let (layer_id, seq) = {
            let mut meta = self.meta();
            meta.check_usable()?;
            self.check_range(&meta, offset, length)?;
            let index = meta.layer_index(layer)?;
            let reserve = meta.reserve_blocks(length / BLOCK_SIZE);
            if meta.alloc.free < reserve {
                return Err(StoreError::OutOfSpace { needed: reserve, free: meta.alloc.free });
            }
            let seq = meta.next_write_seq;
            meta.next_write_seq += 1;
            (meta.layers[index].id, seq)
        };
        let end = (offset + length) / BLOCK_SIZE;
        let mut from = offset / BLOCK_SIZE;
        while from < end {
            let to = (from + SLICE_BLOCKS).min(end);
            {
                let mut meta = self.meta();
                meta.check_usable()?;
                let index = meta
                    .layers
                    .iter()
                    .position(|l| l.id == layer_id)
                    .ok_or_else(|| StoreError::NotFound(format!("layer {layer:?}")))?;
                for state in meta.lba_writes.iter_mut().filter(|((l, b), _)| *l == layer_id && (from..to).contains(b)) {
                    state.1.applied_seq = state.1.applied_seq.max(seq);
                }
                // Only blocks some layer up to this one maps can change.
                let mapped: std::collections::BTreeSet<u64> =
                    meta.layers[..=index].iter().flat_map(|l| l.map.range(from..to).map(|(k, _)| k)).collect();
                for lba in mapped {
                    let value = meta.zero_value(index, lba);
                    let current = meta.layers[index].map.get(lba);
                    if current.is_none() && value.is_none() || current == value {
                        continue;
                    }
                    meta.set_entry(index, lba, value);
                }
            }
            from = to;
            if from < end {
                tokio::task::yield_now().await;
            }
        }
        Ok(())
    }

    /// Reads `[offset, offset+length)` of the volume (all layers).
    pub async fn read(&self, epoch: u64, offset: u64, length: u64) -> Result<AlignedBuf> {
        let _gate = self.admit(epoch).await?;
        self.read_view(None, offset, length).await.map(|(buf, _)| buf)
    }

    /// Reads the volume as seen from snapshot `name` (its layer and older;
    /// empty: the head, i.e. the volume).
    pub async fn read_snapshot(&self, name: &str, offset: u64, length: u64) -> Result<AlignedBuf> {
        let _gate = self.gate.read().await;
        self.read_view(Some((name, false)), offset, length).await.map(|(buf, _)| buf)
    }

    /// Reads one layer's own blocks; the states say which are mapped.
    pub async fn read_layer(&self, name: &str, offset: u64, length: u64) -> Result<(AlignedBuf, Vec<BlockState>)> {
        let _gate = self.gate.read().await;
        self.read_view(Some((name, true)), offset, length).await
    }

    /// `view`: None = the whole chain; Some((layer, only)) = from that layer
    /// down, or that layer alone when `only`.
    async fn read_view(
        &self,
        view: Option<(&str, bool)>,
        offset: u64,
        length: u64,
    ) -> Result<(AlignedBuf, Vec<BlockState>)> {
        if length > MAX_READ_BYTES {
            return Err(StoreError::InvalidArgument(format!(
                "read of {length} bytes is larger than the {MAX_READ_BYTES}-byte maximum"
            )));
        }
        let first = offset / BLOCK_SIZE;
        let (ticket, entries) = {
            let mut meta = self.meta();
            meta.check_usable()?;
            self.check_range(&meta, offset, length)?;
            let (top, only) = match view {
                None => (meta.head_index(), false),
                Some((name, only)) => (meta.layer_index(name)?, only),
            };
            let entries: Vec<(BlockState, Option<Entry>)> = (first..first + length / BLOCK_SIZE)
                .map(|lba| {
                    if only {
                        match meta.layers[top].map.get(lba) {
                            None => (BlockState::Unmapped, None),
                            Some(e) if e.pba == ZERO_PBA => (BlockState::Zero, None),
                            Some(e) => (BlockState::Data, Some(e)),
                        }
                    } else {
                        match meta.resolve(top, lba) {
                            Some(e) => (BlockState::Data, Some(e)),
                            None => (BlockState::Zero, None),
                        }
                    }
                })
                .collect();
            (meta.begin_read(), entries)
        };
        let result = self.read_blocks(offset, length, &entries).await;
        self.meta().finish_read(ticket);
        result.map(|buf| (buf, entries.into_iter().map(|(s, _)| s).collect()))
    }

    async fn read_blocks(
        &self,
        offset: u64,
        length: u64,
        entries: &[(BlockState, Option<Entry>)],
    ) -> Result<AlignedBuf> {
        let device = self.device();
        // Made only when the range is not one contiguous run (a whole-run
        // read returns the device's buffer as it is).
        let mut out: Option<AlignedBuf> = None;
        let mut i = 0;
        while i < entries.len() {
            let Some(first) = entries[i].1 else {
                i += 1;
                continue;
            };
            let mut n = 1;
            while i + n < entries.len() && entries[i + n].1.map(|e| e.pba) == Some(first.pba + n as u64) {
                n += 1;
            }
            let whole = i == 0 && n == entries.len();
            let buf = device
                .read(first.pba * BLOCK_SIZE, AlignedBuf::zeroed(n * BLOCK))
                .await
                .map_err(io_err("read data"))?;
            for (k, block) in buf.chunks(BLOCK).enumerate() {
                let expected = entries[i + k].1.expect("mapped").crc;
                if format::crc32(block) != expected {
                    let at = offset + ((i + k) * BLOCK) as u64;
                    tracing::error!(offset = at, pba = first.pba + k as u64, "checksum mismatch");
                    return Err(StoreError::Checksum { offset: at });
                }
            }
            if whole {
                return Ok(buf);
            }
            let out = out.get_or_insert_with(|| AlignedBuf::zeroed(length as usize));
            out[i * BLOCK..(i + n) * BLOCK].copy_from_slice(&buf);
            i += n;
        }
        Ok(out.unwrap_or_else(|| AlignedBuf::zeroed(length as usize)))
    }

    /// Makes every completed write durable.
    pub async fn flush(&self) -> Result<()> {
        let _commit = self.commit.lock().await;
        self.commit_locked(false, false).await
    }

    /// Writes pending records to the journal, or a checkpoint when the
    /// journal is full or `checkpoint` is set. Caller holds `commit`.
    async fn commit_locked(&self, checkpoint: bool, clean: bool) -> Result<()> {
        let plan = {
            let mut meta = self.meta();
            meta.check_usable()?;
            let blocks = meta.pending.len().div_ceil(RECORDS_PER_JOURNAL_BLOCK) as u64;
            if checkpoint || meta.journal_next + blocks > meta.sb.journal_blocks {
                None
            } else {
                let records = std::mem::take(&mut meta.pending);
                let frees = std::mem::take(&mut meta.pending_free);
                let dirty = std::mem::take(&mut meta.data_dirty);
                let placement = (
                    meta.sb.journal_start + meta.journal_next,
                    meta.journal_next,
                    meta.sb.journal_generation,
                    meta.sb.store_id,
                );
                meta.journal_next += blocks;
                Some((records, frees, dirty, meta.revision, placement))
            }
        };
        let Some((records, frees, dirty, revision, placement)) = plan else {
            return self.checkpoint_locked(clean).await;
        };
        if records.is_empty() && !dirty {
            self.meta().quarantine(frees);
            return Ok(());
        }
        let device = self.device();
        let result = async {
            device.sync().await?;
            if !records.is_empty() {
                let (pba, first_index, generation, store_id) = placement;
                let mut buf = AlignedBuf::zeroed(records.len().div_ceil(RECORDS_PER_JOURNAL_BLOCK) * BLOCK);
                for (i, chunk) in records.chunks(RECORDS_PER_JOURNAL_BLOCK).enumerate() {
                    let jb =
                        JournalBlock { generation, index: first_index + i as u64, revision, records: chunk.to_vec() };
                    buf[i * BLOCK..(i + 1) * BLOCK].copy_from_slice(&jb.encode(store_id));
                }
                device.write(pba * BLOCK_SIZE, buf).await?;
                device.sync().await?;
            }
            Ok::<(), std::io::Error>(())
        }
        .await;
        let mut meta = self.meta();
        match result {
            Ok(()) => {
                meta.quarantine(frees);
                Ok(())
            }
            Err(e) => Err(meta.fail(format!("journal commit: {e}"))),
        }
    }

    async fn checkpoint_now(&self, clean: bool) -> Result<()> {
        let _commit = self.commit.lock().await;
        self.checkpoint_locked(clean).await
    }

    /// Writes the whole map as a new checkpoint and points a new superblock
    /// at it, starting a new journal generation. Caller holds `commit`.
    async fn checkpoint_locked(&self, clean: bool) -> Result<()> {
        let (blocks, new_sb, frees) = {
            let mut meta = self.meta();
            meta.check_usable()?;
            let blob = meta.image().encode();
            let count = format::checkpoint_block_count(blob.len()) as u64;
            // Nothing has changed yet: a full store refuses the checkpoint
            // (and what needed it) and stays usable; space freed later (a
            // snapshot deleted) lets the next one through.
            if meta.alloc.free < count {
                return Err(StoreError::OutOfSpace { needed: count, free: meta.alloc.free });
            }
            let runs = meta.alloc.alloc(count).expect("free space was checked");
            let pbas: Vec<u64> = runs.iter().flat_map(|&(s, n)| s..s + n).collect();
            let new_sb = Superblock {
                sequence: meta.sb.sequence + 1,
                journal_generation: meta.sb.journal_generation + 1,
                checkpoint_head: pbas[0],
                checkpoint_blocks: count,
                checkpoint_len: blob.len() as u64,
                checkpoint_crc: format::crc32(&blob),
                revision: meta.revision,
                stamp: meta.stamp,
                clean,
                ..meta.sb.clone()
            };
            let blocks = format::checkpoint_blocks(new_sb.store_id, &blob, &pbas);
            let old = std::mem::replace(&mut meta.checkpoint_pbas, pbas);
            let mut frees = std::mem::take(&mut meta.pending_free);
            frees.extend(old);
            meta.pending.clear();
            meta.data_dirty = false;
            meta.journal_next = 0;
            (blocks, new_sb, frees)
        };
        let device = self.device();
        let result = async {
            // Physically contiguous blocks go down as one write: a large
            // checkpoint is thousands of blocks, and one write each kept
            // the commit lock for hundreds of milliseconds.
            let mut i = 0;
            while i < blocks.len() {
                let mut run = 1;
                while i + run < blocks.len() && blocks[i + run].0 == blocks[i].0 + run as u64 && run < 256 {
                    run += 1;
                }
                let bytes: Vec<u8> = blocks[i..i + run].iter().flat_map(|(_, b)| b.iter().copied()).collect();
                device.write(blocks[i].0 * BLOCK_SIZE, AlignedBuf::from_slice(&bytes)).await?;
                i += run;
            }
            device.sync().await
        }
        .await;
        if let Err(e) = result {
            return Err(self.meta().fail(format!("checkpoint write: {e}")));
        }
        self.write_superblock(&new_sb).await?;
        let mut meta = self.meta();
        meta.sb = new_sb;
        meta.quarantine(frees);
        Ok(())
    }

    pub fn info(&self) -> StoreInfo {
        let meta = self.meta();
        let device = self.device();
        StoreInfo {
            size_bytes: meta.sb.volume_size,
            revision: meta.revision,
            highest_epoch: meta.sb.highest_epoch,
            clean_at_open: meta.clean_at_open,
            capacity_bytes: meta.sb.capacity_blocks * BLOCK_SIZE,
            used_bytes: (meta.alloc.capacity - meta.alloc.free) * BLOCK_SIZE,
            layer_count: meta.layers.len() as u32,
            location: device.location().to_string(),
            store_id: meta.sb.store_id,
            stamp: meta.stamp,
        }
    }

    /// Flushes, writes a checkpoint marked clean, and refuses further I/O.
    pub async fn close(&self) -> Result<()> {
        let _gate = self.gate.write().await;
        let _commit = self.commit.lock().await;
        self.checkpoint_locked(true).await?;
        self.meta().failed = Some("store closed".into());
        Ok(())
    }
}

fn snapshot_info(layer: &Layer) -> SnapshotInfo {
    SnapshotInfo {
        name: layer.name.clone(),
        created_unix_ms: layer.created_unix_ms,
        allocated_bytes: layer.map.values().filter(|e| e.pba != ZERO_PBA).count() as u64 * BLOCK_SIZE,
        size_bytes: layer.size_bytes,
    }
}
