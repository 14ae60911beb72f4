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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use thiserror::Error;

use crate::device::{Device, StoreLocation};
use crate::faults::Faults;
use crate::format::{
    self, BLOCK, BLOCK_SIZE, CheckpointImage, Entry, FlushStamp, JournalBlock, LayerImage, RECORDS_PER_JOURNAL_BLOCK,
    Record, SlotContent, Superblock, ZERO_PBA,
};
use crate::io::{AlignedBuf, BackendKind};

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

/// Free-space map over physical blocks.
struct Allocator {
    used: Vec<u64>,
    capacity: u64,
    free: u64,
    hint: u64,
}

impl Allocator {
    fn new(capacity: u64) -> Self {
        Self { used: vec![0; capacity.div_ceil(64) as usize], capacity, free: capacity, hint: 0 }
    }
    fn grow(&mut self, capacity: u64) {
        assert!(capacity >= self.capacity);
        self.used.resize(capacity.div_ceil(64) as usize, 0);
        self.free += capacity - self.capacity;
        self.capacity = capacity;
    }
    fn is_used(&self, pba: u64) -> bool {
        self.used[(pba / 64) as usize] & (1 << (pba % 64)) != 0
    }
    /// Marks a free block used; false when it is out of range or already used.
    fn claim(&mut self, pba: u64) -> bool {
        if pba >= self.capacity || self.is_used(pba) {
            return false;
        }
        self.used[(pba / 64) as usize] |= 1 << (pba % 64);
        self.free -= 1;
        true
    }
    fn release(&mut self, pba: u64) {
        assert!(pba < self.capacity && self.is_used(pba), "double free of block {pba}");
        self.used[(pba / 64) as usize] &= !(1 << (pba % 64));
        self.free += 1;
    }
    /// Allocates up to `max` contiguous blocks: (first, count), next-fit.
    fn alloc_run(&mut self, max: u64) -> Option<(u64, u64)> {
        if self.free == 0 || max == 0 {
            return None;
        }
        let mut pba = self.hint % self.capacity;
        for _ in 0..self.capacity {
            if pba % 64 == 0 && pba + 64 <= self.capacity && self.used[(pba / 64) as usize] == u64::MAX {
                pba = (pba + 64) % self.capacity;
                continue;
            }
            if !self.is_used(pba) {
                let mut n = 0;
                while n < max && pba + n < self.capacity && !self.is_used(pba + n) {
                    self.claim(pba + n);
                    n += 1;
                }
                self.hint = pba + n;
                return Some((pba, n));
            }
            pba = (pba + 1) % self.capacity;
        }
        None
    }
    fn alloc(&mut self, count: u64) -> Option<Vec<(u64, u64)>> {
        if self.free < count {
            return None;
        }
        let mut runs = Vec::new();
        let mut left = count;
        while left > 0 {
            let (start, n) = self.alloc_run(left)?;
            runs.push((start, n));
            left -= n;
        }
        Some(runs)
    }
}

struct Layer {
    id: u64,
    name: String,
    created_unix_ms: u64,
    size_bytes: u64,
    map: BTreeMap<u64, Entry>,
}

#[derive(Default)]
struct LbaWrites {
    applied_seq: u64,
    in_flight: u32,
}

struct Meta {
    /// The superblock as last made durable (plus size changes in progress).
    sb: Superblock,
    layers: Vec<Layer>,
    next_layer_id: u64,
    alloc: Allocator,
    checkpoint_pbas: Vec<u64>,
    journal_next: u64,
    /// Applied records not yet in the journal.
    pending: Vec<Record>,
    /// Blocks unreferenced by `pending` records: free once those are durable.
    pending_free: Vec<u64>,
    /// Blocks whose unmapping is durable, waiting for older reads to finish.
    quarantine: VecDeque<(u64, Vec<u64>)>,
    next_read_ticket: u64,
    reads_in_flight: BTreeMap<u64, u32>,
    next_write_seq: u64,
    lba_writes: HashMap<(u64, u64), LbaWrites>,
    revision: u64,
    /// The newest flush stamp applied (durable once its record is).
    stamp: FlushStamp,
    data_dirty: bool,
    failed: Option<String>,
    clean_at_open: bool,
}

impl Meta {
    fn check_usable(&self) -> Result<()> {
        match &self.failed {
            Some(why) => Err(StoreError::Failed(why.clone())),
            None => Ok(()),
        }
    }

    fn head_index(&self) -> usize {
        self.layers.len() - 1
    }

    fn layer_index(&self, name: &str) -> Result<usize> {
        if name.is_empty() {
            return Ok(self.head_index());
        }
        self.layers[..self.head_index()]
            .iter()
            .position(|l| l.name == name)
            .ok_or_else(|| StoreError::NotFound(format!("snapshot {name:?}")))
    }

    fn entry_count(&self) -> u64 {
        self.layers.iter().map(|l| l.map.len() as u64).sum()
    }

    /// Blocks kept back so a checkpoint can always be written.
    fn reserve_blocks(&self, extra_entries: u64) -> u64 {
        checkpoint_blocks_for(self.entry_count() + extra_entries, self.layers.len() as u64) + 2
    }

    /// What `lba` reads as from layer `top` down: an entry, or zeroes.
    fn resolve(&self, top: usize, lba: u64) -> Option<Entry> {
        self.layers[..=top].iter().rev().find_map(|l| l.map.get(&lba).copied()).filter(|e| e.pba != ZERO_PBA)
    }

    /// Sets one layer's mapping of `lba` and journals it.
    fn set_entry(&mut self, index: usize, lba: u64, value: Option<Entry>) {
        let layer = &mut self.layers[index];
        let id = layer.id;
        let old = match value {
            Some(e) => layer.map.insert(lba, e),
            None => layer.map.remove(&lba),
        };
        if let Some(old) = old.filter(|o| o.pba != ZERO_PBA) {
            self.pending_free.push(old.pba);
        }
        self.pending.push(match value {
            Some(Entry { pba: ZERO_PBA, .. }) => Record::Zero { layer: id, lba },
            Some(Entry { pba, crc }) => Record::Map { layer: id, lba, pba, crc },
            None => Record::Unmap { layer: id, lba },
        });
        self.revision += 1;
    }

    /// The value that makes `lba` of layer `index` read as zeroes.
    fn zero_value(&self, index: usize, lba: u64) -> Option<Entry> {
        let below = self.layers[..index].iter().any(|l| l.map.contains_key(&lba));
        below.then_some(Entry { pba: ZERO_PBA, crc: zero_block_crc() })
    }

    /// Maps a finished write's blocks (`crcs` given) or frees them (failed or
    /// abandoned); blocks superseded by a later-started request are freed.
    fn settle_write(&mut self, w: &StartedWrite, crcs: Option<&[u32]>) {
        let index = self.layers.iter().position(|l| l.id == w.layer_id);
        let mut pbas = w.runs.iter().flat_map(|&(start, n)| start..start + n);
        for (i, lba) in (w.first_lba..w.first_lba + w.blocks).enumerate() {
            let pba = pbas.next().expect("one block per lba");
            let state = self.lba_writes.get_mut(&(w.layer_id, lba)).expect("registered write");
            state.in_flight -= 1;
            let newest = w.seq > state.applied_seq;
            if newest {
                state.applied_seq = w.seq;
            }
            if state.in_flight == 0 {
                self.lba_writes.remove(&(w.layer_id, lba));
            }
            match (index, crcs) {
                (Some(index), Some(crcs)) if newest => self.set_entry(index, lba, Some(Entry { pba, crc: crcs[i] })),
                // Superseded, failed, or the layer is gone: the block was
                // never referenced, so it is free at once.
                _ => self.alloc.release(pba),
            }
        }
    }

    /// A new empty layer named `name` (empty: a head), with a fresh id.
    fn new_layer(&mut self, name: &str) -> Layer {
        let id = self.next_layer_id;
        self.next_layer_id += 1;
        Layer {
            id,
            name: name.to_string(),
            created_unix_ms: now_unix_ms(),
            size_bytes: self.sb.volume_size,
            map: BTreeMap::new(),
        }
    }

    fn quarantined_blocks(&self) -> usize {
        self.quarantine.iter().map(|(_, b)| b.len()).sum()
    }

    fn finish_read(&mut self, ticket: u64) {
        let n = self.reads_in_flight.get_mut(&ticket).expect("read ticket");
        *n -= 1;
        if *n == 0 {
            self.reads_in_flight.remove(&ticket);
        }
        self.release_quarantine();
    }

    fn quarantine(&mut self, blocks: Vec<u64>) {
        if !blocks.is_empty() {
            self.quarantine.push_back((self.next_read_ticket, blocks));
            self.release_quarantine();
        }
    }

    fn release_quarantine(&mut self) {
        let oldest = self.reads_in_flight.keys().next().copied().unwrap_or(u64::MAX);
        while let Some((ticket, _)) = self.quarantine.front() {
            if *ticket > oldest {
                break;
            }
            let (_, blocks) = self.quarantine.pop_front().expect("front");
            for pba in blocks {
                self.alloc.release(pba);
            }
        }
    }

    fn image(&self) -> CheckpointImage {
        CheckpointImage {
            revision: self.revision,
            next_layer_id: self.next_layer_id,
            layers: self
                .layers
                .iter()
                .map(|l| LayerImage {
                    id: l.id,
                    name: l.name.clone(),
                    created_unix_ms: l.created_unix_ms,
                    size_bytes: l.size_bytes,
                    entries: l.map.iter().map(|(k, v)| (*k, *v)).collect(),
                })
                .collect(),
        }
    }

    fn fail(&mut self, why: String) -> StoreError {
        tracing::error!("store failed: {why}");
        self.failed.get_or_insert(why.clone());
        StoreError::Failed(why)
    }
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
    layer_id: u64,
    seq: u64,
    runs: Vec<(u64, u64)>,
    first_lba: u64,
    blocks: u64,
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
                if sb.volume_size != config.volume_size {
                    return Err(StoreError::SizeMismatch { existing: sb.volume_size, requested: config.volume_size });
                }
                Self::load(device, sb).await?
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
            map: BTreeMap::new(),
        };
        Ok(Self::assemble(device, sb, vec![head], 2, alloc, Vec::new(), 0, FlushStamp::NONE, true))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        device: Device,
        sb: Superblock,
        layers: Vec<Layer>,
        next_layer_id: u64,
        alloc: Allocator,
        checkpoint_pbas: Vec<u64>,
        revision: u64,
        stamp: FlushStamp,
        clean_at_open: bool,
    ) -> Store {
        let meta = Meta {
            sb,
            layers,
            next_layer_id,
            alloc,
            checkpoint_pbas,
            journal_next: 0,
            pending: Vec::new(),
            pending_free: Vec::new(),
            quarantine: VecDeque::new(),
            next_read_ticket: 1,
            reads_in_flight: BTreeMap::new(),
            next_write_seq: 1,
            lba_writes: HashMap::new(),
            revision,
            stamp,
            data_dirty: false,
            failed: None,
            clean_at_open,
        };
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
                    None => layer.map.remove(&lba),
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
        Ok(Self::assemble(device, sb, layers, next_layer_id, alloc, checkpoint_pbas, revision, stamp, clean))
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

    /// Whether `epoch` is newer than the highest seen; an older one is
    /// refused.
    fn is_newer_epoch(&self, epoch: u64) -> Result<bool> {
        let highest = self.meta().sb.highest_epoch;
        if epoch < highest {
            return Err(StoreError::Fenced { epoch, highest });
        }
        Ok(epoch > highest)
    }

    /// Raises the fencing epoch to `epoch`, durable before it returns. It
    /// first drains every request admitted under the older epoch (they hold
    /// the gate shared), so once this returns nothing of an older engine
    /// can still land. An older epoch is refused. (SetEpoch.)
    pub async fn raise_epoch(&self, epoch: u64) -> Result<()> {
        if !self.is_newer_epoch(epoch)? {
            return Ok(());
        }
        let _gate = self.gate.write().await;
        let _commit = self.commit.lock().await;
        self.raise_epoch_locked(epoch).await
    }

    /// The check and the raise, with the gate held exclusively and `commit`.
    async fn raise_epoch_locked(&self, epoch: u64) -> Result<()> {
        let sb = {
            let meta = self.meta();
            meta.check_usable()?;
            if epoch < meta.sb.highest_epoch {
                return Err(StoreError::Fenced { epoch, highest: meta.sb.highest_epoch });
            }
            if epoch == meta.sb.highest_epoch {
                return Ok(());
            }
            Superblock { sequence: meta.sb.sequence + 1, highest_epoch: epoch, ..meta.sb.clone() }
        };
        self.write_superblock(&sb).await?;
        tracing::info!(epoch, "fencing epoch raised");
        self.meta().sb = sb;
        Ok(())
    }

    /// Admits one data request of `epoch`: returns the gate held shared with
    /// the epoch checked under it, so an epoch raise (which takes the gate
    /// exclusively) either waits for this request to finish or is seen by
    /// it. A newer epoch is raised first.
    async fn admit(&self, epoch: u64) -> Result<tokio::sync::OwnedRwLockReadGuard<()>> {
        loop {
            let gate = self.gate.clone().read_owned().await;
            if !self.is_newer_epoch(epoch)? {
                return Ok(gate);
            }
            drop(gate);
            self.raise_epoch(epoch).await?;
        }
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
                    let seq = meta.next_write_seq;
                    meta.next_write_seq += 1;
                    for lba in first_lba..first_lba + blocks {
                        meta.lba_writes.entry((layer_id, lba)).or_default().in_flight += 1;
                    }
                    return Ok(StartedWrite { layer_id, seq, runs, first_lba, blocks, _gate: gate });
                }
            }
            self.flush().await?;
            committed = true;
        }
    }

    /// Second half of a write: puts the data on the device and maps it.
    pub async fn finish_write(&self, started: StartedWrite, data: &[u8]) -> Result<()> {
        let mut result = if data.len() as u64 != started.blocks * BLOCK_SIZE {
            Err(StoreError::InvalidArgument(format!(
                "{} data bytes for a {}-byte write",
                data.len(),
                started.blocks * BLOCK_SIZE
            )))
        } else {
            Ok(())
        };
        let device = self.device();
        let mut crcs = Vec::with_capacity(started.blocks as usize);
        let mut at = 0usize;
        for &(pba, n) in &started.runs {
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
        meta.settle_write(&started, result.is_ok().then_some(&crcs[..]));
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
                    meta.layers[..=index].iter().flat_map(|l| l.map.range(from..to).map(|(k, _)| *k)).collect();
                for lba in mapped {
                    let value = meta.zero_value(index, lba);
                    let current = meta.layers[index].map.get(&lba).copied();
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
                        match meta.layers[top].map.get(&lba) {
                            None => (BlockState::Unmapped, None),
                            Some(e) if e.pba == ZERO_PBA => (BlockState::Zero, None),
                            Some(e) => (BlockState::Data, Some(*e)),
                        }
                    } else {
                        match meta.resolve(top, lba) {
                            Some(e) => (BlockState::Data, Some(e)),
                            None => (BlockState::Zero, None),
                        }
                    }
                })
                .collect();
            let ticket = meta.next_read_ticket;
            meta.next_read_ticket += 1;
            *meta.reads_in_flight.entry(ticket).or_default() += 1;
            (ticket, entries)
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
        let mut out = AlignedBuf::zeroed(length as usize);
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
            let buf = if whole {
                std::mem::replace(&mut out, AlignedBuf::zeroed(BLOCK))
            } else {
                AlignedBuf::zeroed(n * BLOCK)
            };
            let buf = device.read(first.pba * BLOCK_SIZE, buf).await.map_err(io_err("read data"))?;
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
            out[i * BLOCK..(i + n) * BLOCK].copy_from_slice(&buf);
            i += n;
        }
        Ok(out)
    }

    /// An engine's flush: every write completed before it is made durable,
    /// and with `stamp` the store records that it holds everything the
    /// engine acknowledged before sending that flush. The stamp is journaled
    /// after the data it covers is synced, so a durable stamp never claims
    /// data that is not. `FlushStamp::NONE` withdraws the claim (a rebuild
    /// target, until it is complete).
    pub async fn flush_stamped(&self, epoch: u64, stamp: Option<FlushStamp>) -> Result<()> {
        let _gate = self.admit(epoch).await?;
        let _commit = self.commit.lock().await;
        if let Some(stamp) = stamp {
            let mut meta = self.meta();
            meta.check_usable()?;
            if meta.stamp != stamp {
                meta.stamp = stamp;
                meta.pending.push(Record::Stamp(stamp));
            }
        }
        self.commit_locked(false, false).await
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
            let Some(runs) = meta.alloc.alloc(count) else {
                return Err(meta.fail(format!("no room for a {count}-block checkpoint")));
            };
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

    fn validate_snapshot_name(name: &str) -> Result<()> {
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
    async fn structural<T>(&self, epoch: u64, change: impl FnOnce(&mut Meta) -> Result<T>) -> Result<T> {
        let _gate = self.gate.write().await;
        let _commit = self.commit.lock().await;
        self.raise_epoch_locked(epoch).await?;
        let out = {
            let mut meta = self.meta();
            meta.check_usable()?;
            change(&mut meta)?
        };
        self.checkpoint_locked(false).await?;
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
                for (lba, e) in layer.map {
                    if child.map.contains_key(&lba) {
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

    /// Allocation of the volume as read within `[offset, offset+length)`:
    /// coalesced ranges, `zero` where it reads as zeroes without data.
    /// A large range is scanned a slice at a time (other I/O runs between).
    pub async fn allocation(&self, offset: u64, length: u64) -> Result<Vec<Extent>> {
        self.check_range(&self.meta(), offset, length)?;
        if length > MAX_ALLOCATION_BYTES {
            return Err(StoreError::InvalidArgument(format!(
                "allocation of {length} bytes asked; at most {MAX_ALLOCATION_BYTES} per request"
            )));
        }
        let mut out: Vec<Extent> = Vec::new();
        let end = (offset + length) / BLOCK_SIZE;
        let mut from = offset / BLOCK_SIZE;
        while from < end {
            let to = (from + SLICE_BLOCKS).min(end);
            {
                let meta = self.meta();
                let head = meta.head_index();
                for lba in from..to {
                    let zero = meta.resolve(head, lba).is_none();
                    match out.last_mut() {
                        Some(last) if last.zero == zero => last.length += BLOCK_SIZE,
                        _ => out.push(Extent { offset: lba * BLOCK_SIZE, length: BLOCK_SIZE, zero }),
                    }
                }
            }
            from = to;
            if from < end {
                tokio::task::yield_now().await;
            }
        }
        Ok(out)
    }

    /// A layer's mapped ranges, coalesced.
    pub fn extents(&self, layer: &str) -> Result<Vec<Extent>> {
        let meta = self.meta();
        let index = meta.layer_index(layer)?;
        let mut out: Vec<Extent> = Vec::new();
        for (&lba, e) in &meta.layers[index].map {
            let zero = e.pba == ZERO_PBA;
            let offset = lba * BLOCK_SIZE;
            match out.last_mut() {
                Some(last) if last.offset + last.length == offset && last.zero == zero => last.length += BLOCK_SIZE,
                _ => out.push(Extent { offset, length: BLOCK_SIZE, zero }),
            }
        }
        Ok(out)
    }

    /// One crc32 per `chunk` bytes of `[offset, offset+length)`, computed from
    /// the per-block checksums (no data is read). `layer` empty with `merged`
    /// covers the volume as read; otherwise one layer's own mapping.
    /// A large range is scanned a slice at a time (other I/O runs between).
    pub async fn checksums(&self, layer: &str, merged: bool, offset: u64, length: u64, chunk: u64) -> Result<Vec<u32>> {
        if chunk == 0 || chunk % BLOCK_SIZE != 0 || length % chunk != 0 {
            return Err(StoreError::InvalidArgument(format!(
                "chunk size {chunk} must be a positive multiple of {BLOCK_SIZE} dividing the length {length}"
            )));
        }
        if length / chunk > MAX_CHECKSUMS {
            return Err(StoreError::InvalidArgument(format!(
                "{} checksums asked; at most {MAX_CHECKSUMS} per request",
                length / chunk
            )));
        }
        let layer_id = {
            let meta = self.meta();
            self.check_range(&meta, offset, length)?;
            meta.layers[meta.layer_index(layer)?].id
        };
        let per_chunk = chunk / BLOCK_SIZE;
        let first = offset / BLOCK_SIZE;
        let chunks = length / chunk;
        let chunks_per_slice = (SLICE_BLOCKS / per_chunk).max(1);
        let mut out = Vec::with_capacity(chunks.min(1 << 20) as usize);
        let mut c = 0;
        while c < chunks {
            let until = (c + chunks_per_slice).min(chunks);
            {
                let meta = self.meta();
                let index = meta
                    .layers
                    .iter()
                    .position(|l| l.id == layer_id)
                    .ok_or_else(|| StoreError::NotFound(format!("layer {layer:?}")))?;
                for c in c..until {
                    let mut h = crc32fast::Hasher::new();
                    for lba in first + c * per_chunk..first + (c + 1) * per_chunk {
                        let (state, crc) = if merged {
                            (1u8, meta.resolve(index, lba).map_or(zero_block_crc(), |e| e.crc))
                        } else {
                            match meta.layers[index].map.get(&lba) {
                                None => (0, 0),
                                Some(e) => (1, e.crc),
                            }
                        };
                        h.update(&[state]);
                        h.update(&crc.to_le_bytes());
                    }
                    out.push(h.finalize());
                }
            }
            c = until;
            if c < chunks {
                tokio::task::yield_now().await;
            }
        }
        Ok(out)
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
