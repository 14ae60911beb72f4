//! Which replica an engine serves from when it starts: a pure function of
//! what each replica reports.
//!
//! The rule (docs/rebuild-and-fencing.md, "Start after a crash"):
//! 1. The highest flush stamp `(epoch, sequence)` wins. A replica's stamp is
//!    the last engine flush it made durable while it was a complete member
//!    of the volume (RW, or a rebuild target only after its rebuild was
//!    verified); it holds every write acknowledged before that flush was
//!    sent. A write acknowledged and then flushed by flush `s` is therefore
//!    on every replica stamped `s` or later in that epoch, and engines of
//!    later epochs started from such a replica. So the highest stamp never
//!    lacks a flushed write another replica has. Counters of applied map
//!    entries (the revision) say nothing about that and are not compared.
//! 2. Replicas tied on the highest stamp hold the same flushed data; they may
//!    differ in writes after the flush, which no client was promised. Among
//!    them, identical content counts: the largest group of replicas whose
//!    content checksums agree wins (the fewest rebuilds, and the content most
//!    replicas hold).
//! 3. Then a replica closed cleanly (everything it took is durable), then
//!    the lowest store id: a stable choice, never the order addresses were
//!    given in.

use std::collections::HashMap;

/// What the election knows of one reachable replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// (epoch, sequence) of its durable flush stamp; (0, 0) claims nothing.
    pub stamp: (u64, u64),
    pub clean_at_open: bool,
    pub store_id: u64,
    /// Digest of its whole content (every layer's checksums), when it was
    /// needed to break a tie; `None` when not computed.
    pub content: Option<u64>,
}

/// Indices of the candidates tied on the highest stamp: the ones whose
/// content must be compared before [`elect`] can choose.
pub fn tied_on_top(candidates: &[Candidate]) -> Vec<usize> {
    let Some(top) = candidates.iter().map(|c| c.stamp).max() else { return Vec::new() };
    (0..candidates.len()).filter(|&i| candidates[i].stamp == top).collect()
}

/// The index of the source replica, or `None` with no candidates.
pub fn elect(candidates: &[Candidate]) -> Option<usize> {
    let tied = tied_on_top(candidates);
    let mut group_size: HashMap<Option<u64>, usize> = HashMap::new();
    for &i in &tied {
        *group_size.entry(candidates[i].content).or_default() += 1;
    }
    tied.into_iter().max_by_key(|&i| {
        let c = &candidates[i];
        // An unknown content digest groups with nothing.
        let group = if c.content.is_some() { group_size[&c.content] } else { 1 };
        (group, c.clean_at_open, std::cmp::Reverse(c.store_id))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(stamp: (u64, u64), store_id: u64) -> Candidate {
        Candidate { stamp, clean_at_open: false, store_id, content: None }
    }

    #[test]
    fn the_highest_stamp_wins_whatever_the_order() {
        let a = c((1, 40), 1);
        let b = c((2, 3), 2);
        let z = c((0, 0), 3);
        assert_eq!(elect(&[a.clone(), b.clone(), z.clone()]), Some(1));
        assert_eq!(elect(&[b, z, a]), Some(0));
        assert_eq!(elect(&[]), None);
    }

    #[test]
    fn a_newer_epoch_beats_a_longer_history() {
        assert_eq!(elect(&[c((3, 1_000_000), 1), c((4, 1), 2)]), Some(1));
    }

    #[test]
    fn a_tie_goes_to_the_largest_group_of_identical_content() {
        let mut v = vec![c((5, 9), 1), c((5, 9), 2), c((5, 9), 3)];
        v[0].content = Some(7);
        v[1].content = Some(8);
        v[2].content = Some(8);
        assert_eq!(elect(&v), Some(1), "the pair that agrees, and of it the lower store id");
    }

    #[test]
    fn then_clean_shutdown_then_the_lowest_store_id() {
        let mut v = vec![c((5, 9), 30), c((5, 9), 20), c((5, 9), 10)];
        assert_eq!(elect(&v), Some(2), "lowest store id");
        v[0].clean_at_open = true;
        assert_eq!(elect(&v), Some(0), "clean beats store id");
        let reversed: Vec<_> = v.iter().rev().cloned().collect();
        assert_eq!(elect(&reversed), Some(2), "the same replica, wherever it is listed");
    }

    #[test]
    fn only_replicas_tied_on_top_are_compared() {
        let v = vec![c((5, 9), 1), c((5, 8), 2), c((5, 9), 3)];
        assert_eq!(tied_on_top(&v), vec![0, 2]);
    }
}
