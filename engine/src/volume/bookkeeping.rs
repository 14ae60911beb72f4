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
    flushing: HashMap<u64, Flushing>,
    next_flush: u64,
}

/// A flush in flight: the chunks it covers, and the stores that have
/// already made them durable (they answered it; others may still be slow).
struct Flushing {
    chunks: BTreeSet<u64>,
    durable_on: Vec<u64>,
}

impl Unflushed {
    /// What the replica with store `store` may lose if it crashes now:
    /// everything unflushed, less the flushes in flight it has answered.
    pub(super) fn missed_by(&self, store: u64) -> BTreeSet<u64> {
        self.unflushed_except(|f| f.durable_on.contains(&store))
    }

    /// Written chunks, less those of the flushes in flight `skip` picks.
    fn unflushed_except(&self, skip: impl Fn(&Flushing) -> bool) -> BTreeSet<u64> {
        let mut out = self.current.clone();
        out.extend(self.in_flight.keys().copied());
        for f in self.flushing.values().filter(|f| !skip(f)) {
            out.extend(f.chunks.iter().copied());
        }
        out
    }

    /// How many chunks no completed flush covers.
    pub(super) fn len(&self) -> u64 {
        self.unflushed_except(|_| false).len() as u64
    }

    /// A flush is sent: it covers the writes completed so far.
    pub(super) fn begin_flush(&mut self) -> u64 {
        let id = self.next_flush;
        self.next_flush += 1;
        let chunks = std::mem::take(&mut self.current);
        self.flushing.insert(id, Flushing { chunks, durable_on: Vec::new() });
        id
    }

    /// The replica with store `store` answered flush `id`.
    pub(super) fn flushed_on(&mut self, id: u64, store: u64) {
        if let Some(f) = self.flushing.get_mut(&id) {
            f.durable_on.push(store);
        }
    }

    /// Flush `id` is over. When no RW replica took it, what it covered is
    /// unflushed again.
    pub(super) fn end_flush(&mut self, id: u64, took_effect: bool) {
        let covered = self.flushing.remove(&id).map(|f| f.chunks).unwrap_or_default();
        if !took_effect {
            self.current.extend(covered);
        }
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
        let id = u.begin_flush();
        assert_eq!(u.missed_by(7), BTreeSet::from([0, 1, 5]));
        u.end_flush(id, true);
        assert_eq!(u.missed_by(7), BTreeSet::from([5]), "B is still unflushed");
        u.complete(5..6);
        assert_eq!(u.missed_by(7), BTreeSet::from([5]));
        assert!(u.in_flight.is_empty());
    }

    /// A replica that answered a flush still waiting on a slower one has
    /// those writes durable: failing it now does not mark them as missed.
    /// The slow one has not, and a flush no RW replica took covers nothing.
    #[test]
    fn a_flush_answered_by_one_replica_covers_it_before_the_others_answer() {
        let mut u = Unflushed::default();
        u.start(0..3);
        u.complete(0..3);
        let id = u.begin_flush();
        u.flushed_on(id, 1);
        assert_eq!(u.missed_by(1), BTreeSet::new());
        assert_eq!(u.missed_by(2), BTreeSet::from([0, 1, 2]));
        u.end_flush(id, false);
        assert_eq!(u.missed_by(1), BTreeSet::from([0, 1, 2]), "not taken: unflushed again");
    }
}
