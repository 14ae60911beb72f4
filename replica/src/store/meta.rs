//! The store's metadata state machine: layers and their maps, the free-space
//! map, the records waiting for the journal, the quarantine of freed blocks,
//! and the ordering of concurrent writes to one block. No I/O happens here:
//! [`super::Store`] decides when to commit and what to put on the device,
//! and calls these under its metadata lock. Tested on its own below.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::blockmap::BlockMap;
use super::{Result, StoreError, checkpoint_blocks_for, now_unix_ms, zero_block_crc};
use crate::format::{CheckpointImage, Entry, FlushStamp, LayerImage, Record, Superblock, ZERO_PBA};

/// A write's claim on metadata between its start and its end: the blocks it
/// was given and its place in the order of writes.
#[derive(Debug)]
pub(super) struct WriteTicket {
    pub(super) layer_id: u64,
    pub(super) seq: u64,
    pub(super) runs: Vec<(u64, u64)>,
    pub(super) first_lba: u64,
    pub(super) blocks: u64,
}

/// Free-space map over physical blocks.
pub(super) struct Allocator {
    pub(super) used: Vec<u64>,
    pub(super) capacity: u64,
    pub(super) free: u64,
    pub(super) hint: u64,
}

impl Allocator {
    pub(super) fn new(capacity: u64) -> Self {
        Self { used: vec![0; capacity.div_ceil(64) as usize], capacity, free: capacity, hint: 0 }
    }
    pub(super) fn grow(&mut self, capacity: u64) {
        assert!(capacity >= self.capacity);
        self.used.resize(capacity.div_ceil(64) as usize, 0);
        self.free += capacity - self.capacity;
        self.capacity = capacity;
    }
    pub(super) fn is_used(&self, pba: u64) -> bool {
        self.used[(pba / 64) as usize] & (1 << (pba % 64)) != 0
    }
    /// Marks a free block used; false when it is out of range or already used.
    pub(super) fn claim(&mut self, pba: u64) -> bool {
        if pba >= self.capacity || self.is_used(pba) {
            return false;
        }
        self.used[(pba / 64) as usize] |= 1 << (pba % 64);
        self.free -= 1;
        true
    }
    pub(super) fn release(&mut self, pba: u64) {
        assert!(pba < self.capacity && self.is_used(pba), "double free of block {pba}");
        self.used[(pba / 64) as usize] &= !(1 << (pba % 64));
        self.free += 1;
    }
    /// Allocates up to `max` contiguous blocks: (first, count), next-fit.
    pub(super) fn alloc_run(&mut self, max: u64) -> Option<(u64, u64)> {
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
    pub(super) fn alloc(&mut self, count: u64) -> Option<Vec<(u64, u64)>> {
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

pub(super) struct Layer {
    pub(super) id: u64,
    pub(super) name: String,
    pub(super) created_unix_ms: u64,
    pub(super) size_bytes: u64,
    pub(super) map: BlockMap,
}

#[derive(Default)]
pub(super) struct LbaWrites {
    pub(super) applied_seq: u64,
    pub(super) in_flight: u32,
}

pub(super) struct Meta {
    /// The superblock as last made durable (plus size changes in progress).
    pub(super) sb: Superblock,
    pub(super) layers: Vec<Layer>,
    pub(super) next_layer_id: u64,
    pub(super) alloc: Allocator,
    pub(super) checkpoint_pbas: Vec<u64>,
    pub(super) journal_next: u64,
    /// Applied records not yet in the journal.
    pub(super) pending: Vec<Record>,
    /// Blocks unreferenced by `pending` records: free once those are durable.
    pub(super) pending_free: Vec<u64>,
    /// Blocks whose unmapping is durable, waiting for older reads to finish.
    pub(super) quarantine: VecDeque<(u64, Vec<u64>)>,
    pub(super) next_read_ticket: u64,
    pub(super) reads_in_flight: BTreeMap<u64, u32>,
    pub(super) next_write_seq: u64,
    pub(super) lba_writes: HashMap<(u64, u64), LbaWrites>,
    pub(super) revision: u64,
    /// The newest flush stamp applied (durable once its record is).
    pub(super) stamp: FlushStamp,
    pub(super) data_dirty: bool,
    pub(super) failed: Option<String>,
    pub(super) clean_at_open: bool,
}

impl Meta {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        sb: Superblock,
        layers: Vec<Layer>,
        next_layer_id: u64,
        alloc: Allocator,
        checkpoint_pbas: Vec<u64>,
        revision: u64,
        stamp: FlushStamp,
        clean_at_open: bool,
    ) -> Meta {
        Meta {
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
        }
    }

    /// Registers a write of `blocks` blocks at `first_lba` of layer
    /// `layer_id` into the physical `runs` it was given; it takes the next
    /// place in the order of writes.
    pub(super) fn begin_write(
        &mut self,
        layer_id: u64,
        first_lba: u64,
        blocks: u64,
        runs: Vec<(u64, u64)>,
    ) -> WriteTicket {
        let seq = self.next_write_seq;
        self.next_write_seq += 1;
        for lba in first_lba..first_lba + blocks {
            self.lba_writes.entry((layer_id, lba)).or_default().in_flight += 1;
        }
        WriteTicket { layer_id, seq, runs, first_lba, blocks }
    }
    pub(super) fn check_usable(&self) -> Result<()> {
        match &self.failed {
            Some(why) => Err(StoreError::Failed(why.clone())),
            None => Ok(()),
        }
    }

    pub(super) fn head_index(&self) -> usize {
        self.layers.len() - 1
    }

    pub(super) fn layer_index(&self, name: &str) -> Result<usize> {
        if name.is_empty() {
            return Ok(self.head_index());
        }
        self.layers[..self.head_index()]
            .iter()
            .position(|l| l.name == name)
            .ok_or_else(|| StoreError::NotFound(format!("snapshot {name:?}")))
    }

    pub(super) fn entry_count(&self) -> u64 {
        self.layers.iter().map(|l| l.map.len() as u64).sum()
    }

    /// Blocks kept back so a checkpoint can always be written, even one
    /// with a snapshot more (the rebuild snapshot a full store may be asked
    /// for) and with the entries of writes started but not yet mapped
    /// (each admission counts only its own): 1 % and 4096 entries of slack.
    pub(super) fn reserve_blocks(&self, extra_entries: u64) -> u64 {
        let entries = self.entry_count() + extra_entries;
        checkpoint_blocks_for(entries + entries / 100 + 4096, self.layers.len() as u64 + 2) + 4
    }

    /// What `lba` reads as from layer `top` down: an entry, or zeroes.
    pub(super) fn resolve(&self, top: usize, lba: u64) -> Option<Entry> {
        self.layers[..=top].iter().rev().find_map(|l| l.map.get(lba)).filter(|e| e.pba != ZERO_PBA)
    }

    /// Sets one layer's mapping of `lba` and journals it.
    pub(super) fn set_entry(&mut self, index: usize, lba: u64, value: Option<Entry>) {
        let layer = &mut self.layers[index];
        let id = layer.id;
        let old = match value {
            Some(e) => layer.map.insert(lba, e),
            None => layer.map.remove(lba),
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
    pub(super) fn zero_value(&self, index: usize, lba: u64) -> Option<Entry> {
        let below = self.layers[..index].iter().any(|l| l.map.contains_key(lba));
        below.then_some(Entry { pba: ZERO_PBA, crc: zero_block_crc() })
    }

    /// Maps a finished write's blocks (`crcs` given) or frees them (failed or
    /// abandoned); blocks superseded by a later-started request are freed.
    pub(super) fn settle_write(&mut self, w: &WriteTicket, crcs: Option<&[u32]>) {
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
    pub(super) fn new_layer(&mut self, name: &str) -> Layer {
        let id = self.next_layer_id;
        self.next_layer_id += 1;
        Layer {
            id,
            name: name.to_string(),
            created_unix_ms: now_unix_ms(),
            size_bytes: self.sb.volume_size,
            map: BlockMap::new(),
        }
    }

    pub(super) fn quarantined_blocks(&self) -> usize {
        self.quarantine.iter().map(|(_, b)| b.len()).sum()
    }

    /// A read that looked up its blocks: none of them is reused until
    /// [`Meta::finish_read`] of the ticket.
    pub(super) fn begin_read(&mut self) -> u64 {
        let ticket = self.next_read_ticket;
        self.next_read_ticket += 1;
        *self.reads_in_flight.entry(ticket).or_default() += 1;
        ticket
    }

    pub(super) fn finish_read(&mut self, ticket: u64) {
        let n = self.reads_in_flight.get_mut(&ticket).expect("read ticket");
        *n -= 1;
        if *n == 0 {
            self.reads_in_flight.remove(&ticket);
        }
        self.release_quarantine();
    }

    pub(super) fn quarantine(&mut self, blocks: Vec<u64>) {
        if !blocks.is_empty() {
            self.quarantine.push_back((self.next_read_ticket, blocks));
            self.release_quarantine();
        }
    }

    pub(super) fn release_quarantine(&mut self) {
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

    pub(super) fn image(&self) -> CheckpointImage {
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
                    entries: l.map.iter().collect(),
                })
                .collect(),
        }
    }

    pub(super) fn fail(&mut self, why: String) -> StoreError {
        tracing::error!("store failed: {why}");
        self.failed.get_or_insert(why.clone());
        StoreError::Failed(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head over one snapshot, on 64 free physical blocks.
    fn meta() -> Meta {
        let sb = Superblock { volume_size: 64 * 4096, ..Superblock::default() };
        let mut m = Meta::new(sb, Vec::new(), 1, Allocator::new(64), Vec::new(), 0, FlushStamp::NONE, true);
        let snapshot = m.new_layer("snap");
        let head = m.new_layer("");
        m.layers = vec![snapshot, head];
        m
    }

    fn entry(pba: u64, crc: u32) -> Option<Entry> {
        Some(Entry { pba, crc })
    }

    fn write(m: &mut Meta, lba: u64) -> WriteTicket {
        let runs = m.alloc.alloc(1).expect("free block");
        let head = m.layers[1].id;
        m.begin_write(head, lba, 1, runs)
    }

    #[test]
    fn the_write_started_last_wins_whatever_order_they_finish_in() {
        let mut m = meta();
        let first = write(&mut m, 5);
        let second = write(&mut m, 5);
        let (first_pba, second_pba) = (first.runs[0].0, second.runs[0].0);
        m.settle_write(&second, Some(&[2]));
        m.settle_write(&first, Some(&[1]));
        assert_eq!(m.layers[1].map.get(5), entry(second_pba, 2), "the later-started write is kept");
        assert!(!m.alloc.is_used(first_pba), "the superseded block is free at once (nothing pointed at it)");
        assert!(m.alloc.is_used(second_pba));
        assert!(m.lba_writes.is_empty(), "no write left in flight");
        assert_eq!(m.pending.len(), 1, "one map record, for the winner");
    }

    #[test]
    fn a_failed_write_frees_its_blocks_and_maps_nothing() {
        let mut m = meta();
        let w = write(&mut m, 7);
        let pba = w.runs[0].0;
        m.settle_write(&w, None);
        assert!(m.layers[1].map.is_empty());
        assert!(!m.alloc.is_used(pba));
        assert!(m.pending.is_empty());
    }

    #[test]
    fn zeroing_over_a_snapshot_maps_zeroes_and_elsewhere_unmaps() {
        let mut m = meta();
        m.layers[0].map.insert(3, Entry { pba: 10, crc: 1 });
        m.layers[1].map.insert(3, Entry { pba: 11, crc: 2 });
        m.layers[1].map.insert(4, Entry { pba: 12, crc: 3 });
        let z3 = m.zero_value(1, 3);
        assert_eq!(z3.map(|e| e.pba), Some(ZERO_PBA), "the snapshot's block must be hidden");
        m.set_entry(1, 3, z3);
        let z4 = m.zero_value(1, 4);
        assert_eq!(z4, None, "nothing below: the entry just goes");
        m.set_entry(1, 4, z4);
        assert_eq!(m.resolve(1, 3), None, "reads as zeroes from the head");
        assert_eq!(m.resolve(0, 3).map(|e| e.pba), Some(10), "the snapshot still reads its block");
        assert_eq!(m.pending_free, vec![11, 12], "replaced blocks wait for the commit");
        let head = m.layers[1].id;
        assert!(matches!(m.pending[0], Record::Zero { layer, lba: 3 } if layer == head));
        assert!(matches!(m.pending[1], Record::Unmap { layer, lba: 4 } if layer == head));
    }

    #[test]
    fn quarantined_blocks_wait_for_reads_that_started_before() {
        let mut m = meta();
        for pba in [20, 21] {
            assert!(m.alloc.claim(pba));
        }
        let read = m.begin_read();
        m.quarantine(vec![20, 21]);
        assert!(m.alloc.is_used(20), "a read that looked the block up may still be reading it");
        let later = m.begin_read();
        m.finish_read(read);
        assert!(!m.alloc.is_used(20) && !m.alloc.is_used(21), "free once older reads are done");
        m.finish_read(later);
        assert_eq!(m.quarantined_blocks(), 0);
    }

    #[test]
    fn the_allocator_hands_out_each_block_once() {
        let mut a = Allocator::new(16);
        let runs = a.alloc(10).expect("room");
        let blocks: Vec<u64> = runs.iter().flat_map(|&(s, n)| s..s + n).collect();
        assert_eq!(blocks.len(), 10);
        assert!(a.alloc(7).is_none(), "only 6 left");
        let more: Vec<u64> = a.alloc(6).expect("the rest").iter().flat_map(|&(s, n)| s..s + n).collect();
        assert!(more.iter().all(|b| !blocks.contains(b)));
        a.release(blocks[0]);
        assert_eq!(a.free, 1);
        assert!(a.claim(blocks[0]) && !a.claim(blocks[0]), "a block is claimed once");
    }
}
