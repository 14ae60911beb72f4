//! Per-volume backoff: a volume whose reconcile failed is left alone for a
//! while (doubling with each failure in a row, capped), so one volume that
//! keeps failing (a node it needs is away, an apiserver conflict loop)
//! neither floods its processes with retries nor takes the pass's time from
//! the others. A change to the volume (its spec or its deletion) ends the
//! wait at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const FIRST: Duration = Duration::from_millis(500);
pub const MAX: Duration = Duration::from_secs(8);

/// What identifies a version of the volume the user asked for: its
/// generation and whether it is being deleted.
pub type Version = (i64, bool);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failing {
    pub failures: u32,
    pub until: Instant,
    pub version: Version,
}

/// The wait after `failures` failures in a row.
pub fn delay(failures: u32) -> Duration {
    let doubled = FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled.min(MAX)
}

/// Whether a volume in `state` is reconciled at `now`, at `version`.
pub fn due(state: Option<&Failing>, version: Version, now: Instant) -> bool {
    state.is_none_or(|f| f.version != version || now >= f.until)
}

/// The state after a reconcile that failed or not.
pub fn after(state: Option<Failing>, failed: bool, version: Version, now: Instant) -> Option<Failing> {
    if !failed {
        return None;
    }
    let failures = match state {
        Some(f) if f.version == version => f.failures + 1,
        _ => 1,
    };
    Some(Failing { failures, until: now + delay(failures), version })
}

/// Every volume's backoff, kept between passes (in memory).
#[derive(Default)]
pub struct Backoff(Mutex<HashMap<String, Failing>>);

impl Backoff {
    pub fn due(&self, volume: &str, version: Version, now: Instant) -> bool {
        due(self.0.lock().expect("backoff").get(volume), version, now)
    }

    pub fn record(&self, volume: &str, failed: bool, version: Version, now: Instant) {
        let mut map = self.0.lock().expect("backoff");
        match after(map.get(volume).copied(), failed, version, now) {
            Some(f) => {
                map.insert(volume.to_string(), f);
            }
            None => {
                map.remove(volume);
            }
        }
    }

    /// Forgets volumes that no longer exist.
    pub fn retain(&self, exists: impl Fn(&str) -> bool) {
        self.0.lock().expect("backoff").retain(|v, _| exists(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_with_each_failure_up_to_the_cap() {
        assert_eq!(delay(1), FIRST);
        assert_eq!(delay(2), FIRST * 2);
        assert_eq!(delay(4), FIRST * 8);
        assert_eq!(delay(5), MAX);
        assert_eq!(delay(40), MAX);
    }

    #[test]
    fn a_failing_volume_waits_unless_it_changed_and_success_forgets() {
        let t0 = Instant::now();
        let v1 = (1, false);
        let s = after(None, true, v1, t0);
        assert_eq!(s.map(|f| f.failures), Some(1));
        assert!(!due(s.as_ref(), v1, t0 + Duration::from_millis(100)));
        assert!(due(s.as_ref(), v1, t0 + FIRST), "waited long enough");
        assert!(due(s.as_ref(), (2, false), t0), "its spec changed: at once");
        assert!(due(s.as_ref(), (1, true), t0), "being deleted: at once");
        let s2 = after(s, true, v1, t0 + FIRST);
        assert_eq!(s2.map(|f| (f.failures, f.until)), Some((2, t0 + FIRST + FIRST * 2)));
        assert_eq!(after(s2, true, (2, false), t0).map(|f| f.failures), Some(1), "a new version starts afresh");
        assert_eq!(after(s2, false, v1, t0), None);
        assert!(due(None, v1, t0));
    }
}
