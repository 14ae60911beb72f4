//! Which replica serves a read. Reads go to the replica with the fewest
//! reads out, so a slow or distant copy is asked less and at depth the
//! reads spread over every copy. Among equals, the one that served the last
//! read goes on serving for [`READ_TURN`] reads before the next takes over.
//! At queue depth 1 every replica has none out, and taking turns on every
//! read (as reads did until now) left each replica two reads of quiet
//! between its own, long enough for its poller to stop and its thread to
//! sleep, so every read paid a wake-up on the far side. 3 replicas, QD1
//! randread, ad hoc A/B runs alternating binaries: 183–198 µs a read with a
//! new replica every read; staying with one, 141 / 151 / 175 / 205 µs
//! against 174 / 181 / 251 / 200 with turns of 16 (which moved the work
//! between processes every 2–3 ms). The turns bring every copy's blocks
//! under reads, so a bad block on any of them is met and repaired without
//! waiting for a scrub.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Reads the same replica serves in a row while none is out elsewhere.
pub(super) const READ_TURN: u64 = 256;

/// Index into `loads` (each replica's reads out) of the replica to ask
/// first: of those with the fewest out, the first from the one asked last
/// (`last`, where it is still among them), or from the one after it when
/// its turn is over (`turn_over`). `loads` must not be empty.
pub(super) fn first_reader(loads: &[usize], last: Option<usize>, turn_over: bool) -> usize {
    let n = loads.len();
    let least = loads.iter().copied().min().unwrap_or(0);
    let from = match last {
        Some(i) if i < n => i + usize::from(turn_over),
        _ => 0,
    };
    (0..n).map(|k| (from + k) % n).find(|&i| loads[i] == least).unwrap_or(0)
}

/// Counts a read out on a replica while it lives.
pub(super) struct ReadOut<'a>(&'a AtomicUsize);

impl<'a> ReadOut<'a> {
    pub(super) fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        ReadOut(count)
    }
}

impl Drop for ReadOut<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_reader_serves_on_until_its_turn_is_over() {
        assert_eq!(first_reader(&[0, 0, 0], Some(2), false), 2);
        assert_eq!(first_reader(&[0, 0, 0], Some(2), true), 0, "the next one, wrapping round");
        assert_eq!(first_reader(&[0, 0, 0], Some(0), true), 1);
        assert_eq!(first_reader(&[0, 0, 0], None, false), 0);
        assert_eq!(first_reader(&[0, 0], Some(5), false), 0, "a last reader no longer in the list is ignored");
    }

    #[test]
    fn the_replica_with_fewest_reads_out_comes_first() {
        assert_eq!(first_reader(&[3, 1, 2], Some(0), false), 1);
        assert_eq!(first_reader(&[2, 2, 1], Some(0), false), 2);
        assert_eq!(first_reader(&[1, 0, 0], Some(2), false), 2, "among equals, the last reader");
        assert_eq!(first_reader(&[0, 1, 0], Some(1), false), 2, "among equals, the first after the last reader");
        assert_eq!(first_reader(&[0, 0, 1], Some(0), true), 1);
    }

    #[test]
    fn at_queue_depth_1_each_replica_serves_a_turn() {
        let loads = [0usize; 3];
        let mut last = None;
        let mut served = Vec::new();
        for read in 0..3 * READ_TURN {
            let i = first_reader(&loads, last, read > 0 && read % READ_TURN == 0);
            served.push(i);
            last = Some(i);
        }
        for (k, turn) in served.chunks(READ_TURN as usize).enumerate() {
            assert!(turn.iter().all(|&i| i == k), "turn {k}: {turn:?}");
        }
    }

    #[test]
    fn at_depth_reads_spread_evenly() {
        // 30 reads issued with none finishing: each copy gets 10.
        let mut loads = [0usize; 3];
        let mut last = None;
        for read in 0..30 {
            let i = first_reader(&loads, last, read % READ_TURN == 0);
            loads[i] += 1;
            last = Some(i);
        }
        assert_eq!(loads, [10, 10, 10]);
    }

    #[test]
    fn a_read_out_counts_while_it_lives() {
        let count = AtomicUsize::new(0);
        {
            let _a = ReadOut::new(&count);
            let _b = ReadOut::new(&count);
            assert_eq!(count.load(Ordering::Relaxed), 2);
        }
        assert_eq!(count.load(Ordering::Relaxed), 0, "a finished or cancelled read is no longer out");
    }
}
