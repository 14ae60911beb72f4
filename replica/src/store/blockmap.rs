//! A layer's map from volume block (LBA) to [`Entry`]: a two-level table.
//!
//! Every data write sets one entry per block, under the store's metadata
//! lock, so this is on the data path. A `BTreeMap` made that a walk of
//! four or five tree nodes per block, and it was the replica's largest
//! user-space cost at QD32 random writes (`Meta::set_entry`, 6.7 % of the
//! replica's samples). Here a block's entry is two array lookups away.
//!
//! Three levels, each allocated only while something below it is mapped:
//! a chunk of 8 KiB holds the entries of [`CHUNK`] blocks (2 MiB of
//! volume); a directory of 32 KiB points to [`DIR`] chunks (8 GiB); the
//! top holds one pointer per directory up to the highest block written
//! (64 KiB for a 64 TiB volume). A fully written volume costs about 16
//! bytes a block, less than a `BTreeMap` (a node per 11 entries); a sparse
//! one 8 KiB per 2 MiB region touched, plus 32 KiB per 8 GiB.

use std::ops::Range;

use crate::format::Entry;

const CHUNK_SHIFT: u32 = 9;
/// Blocks per chunk.
const CHUNK: usize = 1 << CHUNK_SHIFT;
const WORDS: usize = CHUNK / 64;
const DIR_SHIFT: u32 = 12;
/// Chunks per directory.
const DIR: usize = 1 << DIR_SHIFT;

struct Chunk {
    /// Which entries are mapped, one bit each.
    present: [u64; WORDS],
    entries: [Entry; CHUNK],
    count: usize,
}

impl Chunk {
    fn new() -> Box<Self> {
        Box::new(Self { present: [0; WORDS], entries: [Entry { pba: 0, crc: 0 }; CHUNK], count: 0 })
    }

    fn has(&self, i: usize) -> bool {
        self.present[i / 64] & (1 << (i % 64)) != 0
    }
}

struct Dir {
    chunks: Box<[Option<Box<Chunk>>]>,
    count: usize,
}

#[derive(Default)]
pub(crate) struct BlockMap {
    dirs: Vec<Option<Dir>>,
    len: usize,
}

/// (directory, chunk in it, entry in that chunk) of `lba`.
fn split(lba: u64) -> (usize, usize, usize) {
    let c = lba >> CHUNK_SHIFT;
    ((c >> DIR_SHIFT) as usize, (c as usize) & (DIR - 1), (lba as usize) & (CHUNK - 1))
}

impl BlockMap {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Mapped blocks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn chunk(&self, d: usize, c: usize) -> Option<&Chunk> {
        self.dirs.get(d)?.as_ref()?.chunks[c].as_deref()
    }

    pub(crate) fn get(&self, lba: u64) -> Option<Entry> {
        let (d, c, i) = split(lba);
        let chunk = self.chunk(d, c)?;
        chunk.has(i).then(|| chunk.entries[i])
    }

    pub(crate) fn contains_key(&self, lba: u64) -> bool {
        self.get(lba).is_some()
    }

    /// Maps `lba` to `entry`; returns what it was mapped to before.
    pub(crate) fn insert(&mut self, lba: u64, entry: Entry) -> Option<Entry> {
        let (d, c, i) = split(lba);
        if d >= self.dirs.len() {
            self.dirs.resize_with(d + 1, || None);
        }
        let dir = self.dirs[d].get_or_insert_with(|| Dir { chunks: (0..DIR).map(|_| None).collect(), count: 0 });
        let slot = &mut dir.chunks[c];
        if slot.is_none() {
            dir.count += 1;
        }
        let chunk = slot.get_or_insert_with(Chunk::new);
        let old = chunk.has(i).then(|| chunk.entries[i]);
        chunk.entries[i] = entry;
        if old.is_none() {
            chunk.present[i / 64] |= 1 << (i % 64);
            chunk.count += 1;
            self.len += 1;
        }
        old
    }

    /// Unmaps `lba`; returns what it was mapped to.
    pub(crate) fn remove(&mut self, lba: u64) -> Option<Entry> {
        let (d, c, i) = split(lba);
        let dir_slot = self.dirs.get_mut(d)?;
        let dir = dir_slot.as_mut()?;
        let slot = &mut dir.chunks[c];
        let chunk = slot.as_mut()?;
        if !chunk.has(i) {
            return None;
        }
        chunk.present[i / 64] &= !(1 << (i % 64));
        chunk.count -= 1;
        self.len -= 1;
        let old = chunk.entries[i];
        if chunk.count == 0 {
            *slot = None;
            dir.count -= 1;
            if dir.count == 0 {
                *dir_slot = None;
            }
        }
        Some(old)
    }

    /// The mapped blocks in `lbas`, in LBA order.
    pub(crate) fn range(&self, lbas: Range<u64>) -> impl Iterator<Item = (u64, Entry)> + '_ {
        // Chunk numbers over the whole volume; absent directories are
        // skipped whole, so a sparse volume costs only what is mapped.
        let first = lbas.start >> CHUNK_SHIFT;
        let end = if lbas.is_empty() { first } else { ((lbas.end - 1) >> CHUNK_SHIFT) + 1 };
        let dirs = (first >> DIR_SHIFT) as usize..(end.div_ceil(DIR as u64) as usize).min(self.dirs.len());
        self.dirs[dirs.start.min(dirs.end)..dirs.end]
            .iter()
            .enumerate()
            .filter_map(move |(k, dir)| Some((dirs.start + k, dir.as_ref()?)))
            .flat_map(move |(d, dir)| {
                let from = ((d as u64) << DIR_SHIFT).max(first);
                let to = ((d as u64 + 1) << DIR_SHIFT).min(end);
                (from..to).filter_map(move |n| Some((n, dir.chunks[(n as usize) & (DIR - 1)].as_deref()?)))
            })
            .flat_map(move |(n, chunk)| {
                let base = n << CHUNK_SHIFT;
                chunk.present.iter().enumerate().flat_map(move |(w, &bits)| {
                    Bits(bits).map(move |b| w * 64 + b).map(move |i| (base + i as u64, chunk.entries[i]))
                })
            })
            .filter(move |(lba, _)| lbas.contains(lba))
    }

    /// Every mapped block, in LBA order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, Entry)> + '_ {
        self.range(0..u64::MAX)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = Entry> + '_ {
        self.iter().map(|(_, e)| e)
    }

    /// Keeps the blocks for which `keep` is true.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64, &Entry) -> bool) {
        let dropped: Vec<u64> = self.iter().filter(|(lba, e)| !keep(*lba, e)).map(|(lba, _)| lba).collect();
        for lba in dropped {
            self.remove(lba);
        }
    }
}

impl FromIterator<(u64, Entry)> for BlockMap {
    fn from_iter<I: IntoIterator<Item = (u64, Entry)>>(entries: I) -> Self {
        let mut map = Self::new();
        for (lba, e) in entries {
            map.insert(lba, e);
        }
        map
    }
}

/// The set bits of a word, lowest first.
struct Bits(u64);

impl Iterator for Bits {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let b = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn e(pba: u64) -> Entry {
        Entry { pba, crc: pba as u32 ^ 0x5a5a }
    }

    /// Random inserts, removes and range reads against a `BTreeMap`, over
    /// blocks that cross chunk boundaries, sit far apart, and empty whole
    /// chunks.
    #[test]
    fn behaves_as_an_ordered_map() {
        let mut model = BTreeMap::new();
        let mut map = BlockMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..20_000u64 {
            let r = next();
            let lba = match r % 4 {
                0 => r >> 8 & 2047,
                1 => (CHUNK as u64 - 2) + (r >> 8 & 3),
                2 => 1_000_000 + (r >> 8 & 15),
                _ => r >> 8 & 63,
            };
            match r >> 4 & 3 {
                0 | 1 => assert_eq!(map.insert(lba, e(step)), model.insert(lba, e(step)), "insert {lba}"),
                2 => assert_eq!(map.remove(lba), model.remove(&lba), "remove {lba}"),
                _ => assert_eq!(map.get(lba), model.get(&lba).copied(), "get {lba}"),
            }
            assert_eq!(map.len(), model.len());
            if step % 500 == 0 {
                let (a, b) = (next() % 3000, next() % 3000);
                let lbas = a.min(b)..a.max(b);
                let want: Vec<_> = model.range(lbas.clone()).map(|(&k, &v)| (k, v)).collect();
                assert_eq!(map.range(lbas.clone()).collect::<Vec<_>>(), want, "range {lbas:?}");
                let all: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
                assert_eq!(map.iter().collect::<Vec<_>>(), all);
            }
        }
        for lba in model.keys().copied().collect::<Vec<_>>() {
            assert_eq!(map.remove(lba), model.remove(&lba));
        }
        assert!(map.is_empty());
        assert!(map.dirs.iter().all(Option::is_none), "emptied chunks and directories are given back");
    }

    #[test]
    fn ranges_at_the_edges() {
        // The last block of a 64 TiB volume, past the first directory.
        let far = (64u64 << 40) / 4096 - 1;
        let map: BlockMap = [(0, e(1)), (511, e(2)), (512, e(3)), (far, e(4))].into_iter().collect();
        assert_eq!(map.range(0..0).count(), 0);
        assert_eq!(map.range(511..513).map(|(l, _)| l).collect::<Vec<_>>(), [511, 512]);
        assert_eq!(map.range(1..511).count(), 0);
        assert_eq!(map.range(600..u64::MAX).map(|(l, _)| l).collect::<Vec<_>>(), [far]);
        assert_eq!(map.get(far), Some(e(4)));
        assert_eq!(map.get(far + 1), None);
        assert_eq!(map.get(u64::MAX), None);
        assert_eq!(map.dirs.len(), (far >> (CHUNK_SHIFT + DIR_SHIFT)) as usize + 1);
        assert_eq!(map.dirs.iter().filter(|d| d.is_some()).count(), 2);
        let mut kept = map;
        kept.retain(|lba, _| lba % 2 == 0);
        assert_eq!(kept.iter().map(|(l, _)| l).collect::<Vec<_>>(), [0, 512]);
    }
}
