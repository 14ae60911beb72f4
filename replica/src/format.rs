//! On-store format: encoding and decoding of superblocks, journal blocks and
//! checkpoints. Pure functions over byte slices; every decoder checks magic,
//! store id and crc32 and returns `None` for anything it cannot trust.
//! See `docs/on-disk-format.md` for the layout and the crash rules.
//!
//! All integers are little-endian. Every structure is one or more 4 KiB
//! blocks whose last-written field is a crc32 over the rest of the block.

pub const BLOCK_SIZE: u64 = 4096;
pub const BLOCK: usize = BLOCK_SIZE as usize;
/// Version 2 added the flush stamp to the superblock; version-1 stores
/// open with no stamp (they claim no acknowledged flush).
pub const FORMAT_VERSION: u32 = 2;
const OLDEST_READABLE_VERSION: u32 = 1;
/// Physical block number that stands for "reads as zeroes" in a layer map.
pub const ZERO_PBA: u64 = u64::MAX;

const SUPER_MAGIC: u64 = u64::from_le_bytes(*b"IHRNSUPR");
const JOURNAL_MAGIC: u64 = u64::from_le_bytes(*b"IHRNJRNL");
const CHECKPOINT_MAGIC: u64 = u64::from_le_bytes(*b"IHRNCKPT");

/// Superblock blocks live at physical blocks 0 and 1 (written alternately).
pub const SUPERBLOCK_SLOTS: u64 = 2;

/// The superblock: where everything else is, and the durable counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Superblock {
    pub store_id: u64,
    /// Increases with every superblock write; the valid copy with the higher
    /// sequence wins at open.
    pub sequence: u64,
    pub volume_size: u64,
    pub capacity_blocks: u64,
    pub journal_start: u64,
    pub journal_blocks: u64,
    /// Journal blocks count only when they carry this generation.
    pub journal_generation: u64,
    pub checkpoint_head: u64,
    pub checkpoint_blocks: u64,
    pub checkpoint_len: u64,
    pub checkpoint_crc: u32,
    pub revision: u64,
    pub highest_epoch: u64,
    pub clean: bool,
    /// The newest engine flush this store made durable (see [`FlushStamp`]).
    pub stamp: FlushStamp,
}

/// Which acknowledged data a replica holds: the `(epoch, sequence)` of the
/// last engine flush it made durable while it was a complete member of the
/// volume. Every write an engine acknowledged before sending that flush is on
/// this store. Ordered by epoch, then sequence. `FlushStamp::NONE` claims
/// nothing: a new store, or one whose rebuild has not finished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlushStamp {
    pub epoch: u64,
    pub sequence: u64,
}

impl FlushStamp {
    pub const NONE: FlushStamp = FlushStamp { epoch: 0, sequence: 0 };
}

struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.buf[self.at] = v;
        self.at += 1;
    }
    fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.buf[self.at..self.at + v.len()].copy_from_slice(v);
        self.at += v.len();
    }
}

/// A bounds-checked reader: every getter returns `None` past the end.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let out = self.buf.get(self.at..end)?;
        self.at = end;
        Some(out)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
}

/// crc32 of a block with its trailing 4-byte crc field taken as zero.
fn block_crc(block: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&block[..block.len() - 4]);
    h.finalize()
}

fn seal(block: &mut [u8]) {
    let crc = block_crc(block);
    let n = block.len();
    block[n - 4..].copy_from_slice(&crc.to_le_bytes());
}

fn sealed(block: &[u8]) -> bool {
    let n = block.len();
    n == BLOCK && u32::from_le_bytes(block[n - 4..].try_into().expect("4 bytes")) == block_crc(block)
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut block = vec![0u8; BLOCK];
        let mut w = Writer { buf: &mut block, at: 0 };
        w.u64(SUPER_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u32(BLOCK_SIZE as u32);
        w.u64(self.store_id);
        w.u64(self.sequence);
        w.u64(self.volume_size);
        w.u64(self.capacity_blocks);
        w.u64(self.journal_start);
        w.u64(self.journal_blocks);
        w.u64(self.journal_generation);
        w.u64(self.checkpoint_head);
        w.u64(self.checkpoint_blocks);
        w.u64(self.checkpoint_len);
        w.u32(self.checkpoint_crc);
        w.u64(self.revision);
        w.u64(self.highest_epoch);
        w.u8(self.clean as u8);
        w.u64(self.stamp.epoch);
        w.u64(self.stamp.sequence);
        seal(&mut block);
        block
    }

    /// What a superblock slot holds.
    pub fn decode(block: &[u8]) -> SlotContent {
        if block.iter().all(|&b| b == 0) {
            return SlotContent::Empty;
        }
        if block.len() != BLOCK || block[..8] != SUPER_MAGIC.to_le_bytes() {
            return SlotContent::Foreign;
        }
        if !sealed(block) {
            return SlotContent::Corrupt;
        }
        let mut r = Reader { buf: block, at: 8 };
        let decoded = (|| {
            let version = r.u32()?;
            let block_size = r.u32()?;
            if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) || block_size as u64 != BLOCK_SIZE {
                return None;
            }
            let mut sb = Superblock {
                store_id: r.u64()?,
                sequence: r.u64()?,
                volume_size: r.u64()?,
                capacity_blocks: r.u64()?,
                journal_start: r.u64()?,
                journal_blocks: r.u64()?,
                journal_generation: r.u64()?,
                checkpoint_head: r.u64()?,
                checkpoint_blocks: r.u64()?,
                checkpoint_len: r.u64()?,
                checkpoint_crc: r.u32()?,
                revision: r.u64()?,
                highest_epoch: r.u64()?,
                clean: r.u8()? != 0,
                stamp: FlushStamp::NONE,
            };
            if version >= 2 {
                sb.stamp = FlushStamp { epoch: r.u64()?, sequence: r.u64()? };
            }
            Some(sb)
        })();
        match decoded {
            Some(sb) => SlotContent::Valid(sb),
            None => SlotContent::Unsupported,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum SlotContent {
    Empty,
    Foreign,
    Corrupt,
    Unsupported,
    Valid(Superblock),
}

/// One metadata change, as journaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// Layer maps `lba` to physical block `pba` whose content has crc32 `crc`.
    Map { layer: u64, lba: u64, pba: u64, crc: u32 },
    /// Layer maps `lba` to zeroes (hides older layers).
    Zero { layer: u64, lba: u64 },
    /// Layer no longer maps `lba` (reads fall through).
    Unmap { layer: u64, lba: u64 },
    /// The store's flush stamp from here on (journaled with the flush that
    /// earned it, after the data it covers was synced).
    Stamp(FlushStamp),
}

const RECORD_BYTES: usize = 32;
const JOURNAL_HEADER_BYTES: usize = 48;
/// Records that fit in one journal block.
pub const RECORDS_PER_JOURNAL_BLOCK: usize = (BLOCK - JOURNAL_HEADER_BYTES - 4) / RECORD_BYTES;

impl Record {
    fn encode(&self, w: &mut Writer<'_>) {
        let (kind, layer, lba, pba, crc) = match *self {
            Record::Map { layer, lba, pba, crc } => (1u8, layer, lba, pba, crc),
            Record::Zero { layer, lba } => (2, layer, lba, 0, 0),
            Record::Unmap { layer, lba } => (3, layer, lba, 0, 0),
            Record::Stamp(FlushStamp { epoch, sequence }) => (4, epoch, sequence, 0, 0),
        };
        w.u8(kind);
        w.bytes(&[0; 3]);
        w.u32(crc);
        w.u64(layer);
        w.u64(lba);
        w.u64(pba);
    }

    fn decode(r: &mut Reader<'_>) -> Option<Record> {
        let kind = r.u8()?;
        r.bytes(3)?;
        let crc = r.u32()?;
        let layer = r.u64()?;
        let lba = r.u64()?;
        let pba = r.u64()?;
        match kind {
            1 => Some(Record::Map { layer, lba, pba, crc }),
            2 => Some(Record::Zero { layer, lba }),
            3 => Some(Record::Unmap { layer, lba }),
            4 => Some(Record::Stamp(FlushStamp { epoch: layer, sequence: lba })),
            _ => None,
        }
    }
}

/// A decoded journal block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalBlock {
    pub generation: u64,
    pub index: u64,
    /// Store revision after applying this block's records.
    pub revision: u64,
    pub records: Vec<Record>,
}

impl JournalBlock {
    pub fn encode(&self, store_id: u64) -> Vec<u8> {
        assert!(self.records.len() <= RECORDS_PER_JOURNAL_BLOCK);
        let mut block = vec![0u8; BLOCK];
        let mut w = Writer { buf: &mut block, at: 0 };
        w.u64(JOURNAL_MAGIC);
        w.u64(store_id);
        w.u64(self.generation);
        w.u64(self.index);
        w.u64(self.revision);
        w.u16(self.records.len() as u16);
        w.bytes(&[0; 6]);
        for record in &self.records {
            record.encode(&mut w);
        }
        seal(&mut block);
        block
    }

    /// Decodes a journal block written for `store_id`, or `None`.
    pub fn decode(block: &[u8], store_id: u64) -> Option<JournalBlock> {
        if !sealed(block) {
            return None;
        }
        let mut r = Reader { buf: block, at: 0 };
        if r.u64()? != JOURNAL_MAGIC || r.u64()? != store_id {
            return None;
        }
        let generation = r.u64()?;
        let index = r.u64()?;
        let revision = r.u64()?;
        let count = r.u16()? as usize;
        r.bytes(6)?;
        if count > RECORDS_PER_JOURNAL_BLOCK {
            return None;
        }
        let records = (0..count).map(|_| Record::decode(&mut r)).collect::<Option<Vec<_>>>()?;
        Some(JournalBlock { generation, index, revision, records })
    }
}

/// One layer's map entry: physical block (or [`ZERO_PBA`]) and content crc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub pba: u64,
    pub crc: u32,
}

/// A layer as stored in a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerImage {
    pub id: u64,
    /// Empty for the writable head.
    pub name: String,
    pub created_unix_ms: u64,
    /// Volume size when the layer was sealed (snapshots) or now (head).
    pub size_bytes: u64,
    /// Sorted by lba.
    pub entries: Vec<(u64, Entry)>,
}

/// Everything a checkpoint holds: the whole metadata state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointImage {
    pub revision: u64,
    pub next_layer_id: u64,
    /// Oldest first; the last is the head.
    pub layers: Vec<LayerImage>,
}

const ENTRY_BYTES: usize = 20;
const CHECKPOINT_HEADER_BYTES: usize = 40;
/// Payload bytes carried by one checkpoint block.
pub const CHECKPOINT_PAYLOAD: usize = BLOCK - CHECKPOINT_HEADER_BYTES - 4;

impl CheckpointImage {
    pub fn encode(&self) -> Vec<u8> {
        let size = 16
            + self
                .layers
                .iter()
                .map(|l| 8 + 2 + l.name.len() + 8 + 8 + 8 + l.entries.len() * ENTRY_BYTES)
                .sum::<usize>()
            + 4;
        let mut out = vec![0u8; size];
        let mut w = Writer { buf: &mut out, at: 0 };
        w.u64(self.revision);
        w.u64(self.next_layer_id);
        w.u32(self.layers.len() as u32);
        for layer in &self.layers {
            w.u64(layer.id);
            w.u16(layer.name.len() as u16);
            w.bytes(layer.name.as_bytes());
            w.u64(layer.created_unix_ms);
            w.u64(layer.size_bytes);
            w.u64(layer.entries.len() as u64);
            for (lba, e) in &layer.entries {
                w.u64(*lba);
                w.u64(e.pba);
                w.u32(e.crc);
            }
        }
        out
    }

    pub fn decode(blob: &[u8]) -> Option<CheckpointImage> {
        let mut r = Reader { buf: blob, at: 0 };
        let revision = r.u64()?;
        let next_layer_id = r.u64()?;
        let count = r.u32()? as usize;
        let mut layers = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            let id = r.u64()?;
            let name_len = r.u16()? as usize;
            let name = String::from_utf8(r.bytes(name_len)?.to_vec()).ok()?;
            let created_unix_ms = r.u64()?;
            let size_bytes = r.u64()?;
            let n = r.u64()? as usize;
            if n > blob.len() / ENTRY_BYTES {
                return None;
            }
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                let lba = r.u64()?;
                let pba = r.u64()?;
                let crc = r.u32()?;
                entries.push((lba, Entry { pba, crc }));
            }
            layers.push(LayerImage { id, name, created_unix_ms, size_bytes, entries });
        }
        if layers.is_empty() {
            return None;
        }
        Some(CheckpointImage { revision, next_layer_id, layers })
    }
}

/// Splits an encoded checkpoint into blocks chained by `next` pointers;
/// `pbas[i]` is where block i goes. Returns (pba, block) pairs.
pub fn checkpoint_blocks(store_id: u64, blob: &[u8], pbas: &[u64]) -> Vec<(u64, Vec<u8>)> {
    assert_eq!(pbas.len(), checkpoint_block_count(blob.len()));
    blob.chunks(CHECKPOINT_PAYLOAD)
        .enumerate()
        .map(|(i, chunk)| {
            let mut block = vec![0u8; BLOCK];
            let mut w = Writer { buf: &mut block, at: 0 };
            w.u64(CHECKPOINT_MAGIC);
            w.u64(store_id);
            w.u64(i as u64);
            w.u64(pbas.get(i + 1).copied().unwrap_or(ZERO_PBA));
            w.u32(chunk.len() as u32);
            w.u32(0);
            w.bytes(chunk);
            seal(&mut block);
            (pbas[i], block)
        })
        .collect()
}

pub fn checkpoint_block_count(blob_len: usize) -> usize {
    blob_len.div_ceil(CHECKPOINT_PAYLOAD).max(1)
}

/// Decodes checkpoint block `index`: (next pba, payload), or `None`.
pub fn decode_checkpoint_block(block: &[u8], store_id: u64, index: u64) -> Option<(u64, &[u8])> {
    if !sealed(block) {
        return None;
    }
    let mut r = Reader { buf: block, at: 0 };
    if r.u64()? != CHECKPOINT_MAGIC || r.u64()? != store_id || r.u64()? != index {
        return None;
    }
    let next = r.u64()?;
    let len = r.u32()? as usize;
    r.u32()?;
    if len > CHECKPOINT_PAYLOAD {
        return None;
    }
    Some((next, r.bytes(len)?))
}

pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn superblock() -> Superblock {
        Superblock {
            store_id: 7,
            sequence: 3,
            volume_size: 1 << 30,
            capacity_blocks: 300_000,
            journal_start: 2,
            journal_blocks: 1024,
            journal_generation: 9,
            checkpoint_head: 5000,
            checkpoint_blocks: 3,
            checkpoint_len: 10_000,
            checkpoint_crc: 0xdead_beef,
            revision: 42,
            highest_epoch: 5,
            clean: true,
            stamp: FlushStamp { epoch: 4, sequence: 1234 },
        }
    }

    #[test]
    fn superblock_round_trip_and_torn_detection() {
        let sb = superblock();
        let mut block = sb.encode();
        assert_eq!(Superblock::decode(&block), SlotContent::Valid(sb));
        block[100] ^= 1;
        assert_eq!(Superblock::decode(&block), SlotContent::Corrupt);
        assert_eq!(Superblock::decode(&vec![0; BLOCK]), SlotContent::Empty);
        assert_eq!(Superblock::decode(&vec![1; BLOCK]), SlotContent::Foreign);
    }

    #[test]
    fn a_version_1_superblock_opens_without_a_stamp() {
        let sb = superblock();
        let mut block = sb.encode();
        block[8..12].copy_from_slice(&1u32.to_le_bytes());
        // Version 1 ended after the clean flag: no stamp bytes.
        let stamp_at = 8 + 4 + 4 + 8 * 10 + 4 + 8 + 8 + 1;
        block[stamp_at..stamp_at + 16].fill(0);
        seal(&mut block);
        assert_eq!(Superblock::decode(&block), SlotContent::Valid(Superblock { stamp: FlushStamp::NONE, ..sb }));
        block[8..12].copy_from_slice(&3u32.to_le_bytes());
        seal(&mut block);
        assert_eq!(Superblock::decode(&block), SlotContent::Unsupported);
    }

    fn record() -> impl Strategy<Value = Record> {
        prop_oneof![
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(layer, lba, pba, crc)| Record::Map {
                layer,
                lba,
                pba,
                crc
            }),
            (any::<u64>(), any::<u64>()).prop_map(|(layer, lba)| Record::Zero { layer, lba }),
            (any::<u64>(), any::<u64>()).prop_map(|(layer, lba)| Record::Unmap { layer, lba }),
            (any::<u64>(), any::<u64>()).prop_map(|(epoch, sequence)| Record::Stamp(FlushStamp { epoch, sequence })),
        ]
    }

    proptest! {
        #[test]
        fn journal_block_round_trip(
            records in proptest::collection::vec(record(), 0..RECORDS_PER_JOURNAL_BLOCK),
            generation: u64, index: u64, revision: u64, store_id: u64,
        ) {
            let jb = JournalBlock { generation, index, revision, records };
            let block = jb.encode(store_id);
            prop_assert_eq!(JournalBlock::decode(&block, store_id), Some(jb));
            prop_assert_eq!(JournalBlock::decode(&block, store_id ^ 1), None);
        }

        #[test]
        fn journal_block_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..=BLOCK)) {
            let _ = JournalBlock::decode(&bytes, 1);
            let _ = Superblock::decode(&bytes);
            let _ = decode_checkpoint_block(&bytes, 1, 0);
            let _ = CheckpointImage::decode(&bytes);
        }

        #[test]
        fn any_flipped_bit_is_detected(index in 0usize..BLOCK * 8) {
            let jb = JournalBlock { generation: 1, index: 2, revision: 3, records: vec![Record::Zero { layer: 1, lba: 2 }] };
            let mut block = jb.encode(1);
            block[index / 8] ^= 1 << (index % 8);
            prop_assert_eq!(JournalBlock::decode(&block, 1), None);
        }

        #[test]
        fn checkpoint_round_trip(
            layers in proptest::collection::vec(
                ("[a-z]{0,12}", proptest::collection::btree_map(any::<u64>(), (any::<u64>(), any::<u32>()), 0..600)),
                1..4),
            revision: u64,
        ) {
            let image = CheckpointImage {
                revision,
                next_layer_id: layers.len() as u64 + 1,
                layers: layers.into_iter().enumerate().map(|(i, (name, map))| LayerImage {
                    id: i as u64 + 1, name, created_unix_ms: 17, size_bytes: 1 << 20,
                    entries: map.into_iter().map(|(lba, (pba, crc))| (lba, Entry { pba, crc })).collect(),
                }).collect(),
            };
            let blob = image.encode();
            let n = checkpoint_block_count(blob.len());
            let pbas: Vec<u64> = (100..100 + n as u64).collect();
            let blocks = checkpoint_blocks(9, &blob, &pbas);
            let mut joined = Vec::new();
            for (i, (pba, block)) in blocks.iter().enumerate() {
                prop_assert_eq!(*pba, pbas[i]);
                let (next, payload) = decode_checkpoint_block(block, 9, i as u64).expect("valid block");
                prop_assert_eq!(next, pbas.get(i + 1).copied().unwrap_or(ZERO_PBA));
                joined.extend_from_slice(payload);
            }
            prop_assert_eq!(CheckpointImage::decode(&joined), Some(image));
        }
    }
}
