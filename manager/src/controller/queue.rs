//! The volume work queue: each volume is reconciled in a task of its own,
//! at most one task per volume at a time. A pass takes the snapshot and
//! starts the volumes that are due; it does not wait for them, so a volume
//! whose reconcile hangs on a call (a frozen engine, an instance manager
//! that stopped mid-call) holds only itself, and the next pass reconciles
//! every other volume as usual.
//!
//! One rule keeps a volume's decisions on facts that include its own last
//! effects: a volume is started from a snapshot only if its previous
//! reconcile ended before that snapshot began. A volume still running when
//! a pass wants it is marked wanted, and another pass is asked for when it
//! ends; one that ended while the snapshot was being taken is asked for at
//! once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What a pass does with a volume that is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Start its reconcile now.
    Go,
    /// Its reconcile is still running; it is wanted again when that ends.
    Later,
    /// Its reconcile ended after this pass's snapshot began: decide on a
    /// newer snapshot (ask for another pass).
    Again,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub running: bool,
    /// A pass wanted it while it ran.
    pub wanted: bool,
    /// Snapshots begun when its last reconcile ended.
    pub ended_after: u64,
}

/// The decision for a volume in `entry` and a snapshot numbered `snapshot`
/// (the count of snapshots begun, this one included), and the entry after it.
pub fn start(entry: Entry, snapshot: u64) -> (Start, Entry) {
    if entry.running {
        (Start::Later, Entry { wanted: true, ..entry })
    } else if entry.ended_after >= snapshot {
        (Start::Again, entry)
    } else {
        (Start::Go, Entry { running: true, wanted: false, ..entry })
    }
}

/// The entry once its reconcile ended, with `begun` snapshots begun so far,
/// and whether another pass is wanted for it.
pub fn end(entry: Entry, begun: u64) -> (Entry, bool) {
    (Entry { running: false, wanted: false, ended_after: begun }, entry.wanted)
}

#[derive(Default)]
struct State {
    begun: u64,
    volumes: HashMap<String, Entry>,
}

#[derive(Default)]
pub struct Queue(Mutex<State>);

impl Queue {
    /// A snapshot begins: its number, for [`Queue::start`].
    pub fn snapshot_begins(&self) -> u64 {
        let mut state = self.0.lock().expect("queue");
        state.begun += 1;
        state.begun
    }

    /// Whether `volume` starts now from the snapshot numbered `snapshot`;
    /// on [`Start::Go`] the caller holds a [`Running`] until it ends.
    pub fn start(&self, volume: &str, snapshot: u64) -> Start {
        let mut state = self.0.lock().expect("queue");
        let entry = state.volumes.get(volume).copied().unwrap_or_default();
        let (decision, after) = start(entry, snapshot);
        state.volumes.insert(volume.to_string(), after);
        decision
    }

    /// `volume`'s reconcile ended: whether a pass wanted it meanwhile.
    fn end(&self, volume: &str) -> bool {
        let mut state = self.0.lock().expect("queue");
        let begun = state.begun;
        let entry = state.volumes.get(volume).copied().unwrap_or_default();
        let (after, wanted) = end(entry, begun);
        state.volumes.insert(volume.to_string(), after);
        wanted
    }

    /// Forgets volumes that no longer exist and are not running.
    pub fn retain(&self, exists: impl Fn(&str) -> bool) {
        self.0.lock().expect("queue").volumes.retain(|v, e| e.running || exists(v));
    }
}

/// A volume's reconcile in progress: ends it in the queue however the task
/// ends (done, failed, panicked or dropped), and asks for another pass if
/// one wanted the volume meanwhile.
pub struct Running {
    pub queue: Arc<Queue>,
    pub volume: String,
    pub again: Arc<tokio::sync::Notify>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.queue.end(&self.volume) {
            self.again.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_runs_once_at_a_time_and_is_wanted_again_if_asked_meanwhile() {
        let idle = Entry::default();
        let (d, running) = start(idle, 1);
        assert_eq!(d, Start::Go);
        assert!(running.running);
        let (d, wanted) = start(running, 2);
        assert_eq!(d, Start::Later, "a second task for the volume is not started");
        assert!(wanted.wanted);
        let (ended, again) = end(wanted, 2);
        assert!(again, "the pass that was turned away gets another");
        assert!(!ended.running && !ended.wanted);
        let (_, again) = end(running, 2);
        assert!(!again, "nobody asked meanwhile");
    }

    #[test]
    fn a_snapshot_older_than_the_volumes_last_reconcile_is_not_used_for_it() {
        // Its reconcile ended when 3 snapshots had begun: snapshot 3 may
        // have been read before that reconcile's writes.
        let ended = Entry { ended_after: 3, ..Entry::default() };
        assert_eq!(start(ended, 3).0, Start::Again);
        assert_eq!(start(ended, 2).0, Start::Again);
        assert_eq!(start(ended, 4).0, Start::Go, "snapshot 4 began after it ended");
    }

    #[test]
    fn the_queue_keeps_each_volume_apart() {
        let queue = Arc::new(Queue::default());
        let again = Arc::new(tokio::sync::Notify::new());
        let s1 = queue.snapshot_begins();
        assert_eq!(queue.start("a", s1), Start::Go);
        assert_eq!(queue.start("b", s1), Start::Go);
        let a = Running { queue: queue.clone(), volume: "a".into(), again: again.clone() };
        drop(Running { queue: queue.clone(), volume: "b".into(), again: again.clone() });
        let s2 = queue.snapshot_begins();
        assert_eq!(queue.start("a", s2), Start::Later, "a still runs");
        assert_eq!(queue.start("b", s2), Start::Go, "b ended before snapshot 2 began");
        let s3 = queue.snapshot_begins();
        drop(a);
        assert_eq!(queue.start("a", s3), Start::Again, "a ended while snapshot 3 was taken");
        queue.retain(|v| v == "a");
        assert_eq!(queue.0.lock().unwrap().volumes.len(), 2, "b runs still, so it is kept");
    }
}
