//! What the engine remembers about writes, without I/O: which chunks each
//! absent replica missed (its dirty map, for delta rebuilds) and which
//! chunks no completed flush covers yet (what a crashed replica may have
//! lost, so a rebuild copies them).

use std::collections::{BTreeSet, HashMap};

/// Chunks written while a replica was out. `complete` is false when the
/// map cannot be trusted (the replica failed mid-rebuild, a revert ran).
pub(super) struct DirtyMap {
    pub(super) chunks: BTreeSet<u64>,
    pub(super) complete: bool,
}

/// Chunks written but not yet covered by a completed flush: writes still in
/// flight, writes completed since the last flush was sent (`current`), and
/// one set per flush in flight. A flush covers only writes that completed
/// before it was sent, so only `current` moves into a flush's set.
#[derive(Default)]
pub(super) struct Unflushed {
    pub(super) in_flight: HashMap<u64, u32>,
    pub(super) current: BTreeSet<u64>,
    pub(super) flushing: HashMap<u64, BTreeSet<u64>>,
    pub(super) next_flush: u64,
}

impl Unflushed {
    pub(super) fn all(&self) -> BTreeSet<u64> {
        let mut out = self.current.clone();
        out.extend(self.in_flight.keys().copied());
        for set in self.flushing.values() {
            out.extend(set.iter().copied());
        }
        out
    }

    pub(super) fn start(&mut self, chunks: std::ops::Range<u64>) {
        for c in chunks {
            *self.in_flight.entry(c).or_default() += 1;
        }
    }

    /// Returns whether these are the first writes since the last flush was
    /// sent (`current` was empty).
    pub(super) fn complete(&mut self, chunks: std::ops::Range<u64>) -> bool {
        let first = self.current.is_empty();
        for c in chunks {
            let n = self.in_flight.get_mut(&c).expect("in-flight chunk");
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&c);
            }
            self.current.insert(c);
        }
        first && !self.current.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_covers_only_writes_completed_before_it_was_sent() {
        let mut u = Unflushed::default();
        u.start(0..2); // write A in flight
        u.start(5..6); // write B in flight
        u.complete(0..2); // A done
        // Flush sent now: it covers A, not B.
        let covered = std::mem::take(&mut u.current);
        u.flushing.insert(0, covered);
        assert_eq!(u.all(), BTreeSet::from([0, 1, 5]));
        u.flushing.remove(&0); // flush done
        assert_eq!(u.all(), BTreeSet::from([5]), "B is still unflushed");
        u.complete(5..6);
        assert_eq!(u.all(), BTreeSet::from([5]));
        assert!(u.in_flight.is_empty());
    }
}
