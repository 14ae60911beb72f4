//! When a FUSE ring gives its entries' payload pages back (the decision
//! only; `uring` does the `madvise`).
//!
//! An entry's payload has room for the largest request (256 KiB), and its
//! pages stay resident once a request or an answer filled them: after a
//! burst of large I/O every entry holds its whole payload, 16 MiB on two
//! CPUs. Once large payloads have stopped for [`QUIET`], the entries the
//! kernel holds give theirs back; small I/O goes on touching one page.

use std::time::{Duration, Instant};

/// Payload bytes one page holds: an entry that touched no more is left be.
pub const PAGE: usize = 4096;

/// How long the ring goes without a payload larger than a page before
/// entries are trimmed (a sequential stream keeps its pages).
pub const QUIET: Duration = Duration::from_secs(2);

/// After a look that trimmed nothing because work was pending, the next
/// look waits this long (small I/O keeps work pending; no busy loop).
pub const RETRY: Duration = Duration::from_millis(200);

/// What the ring knows of one entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Use {
    /// In the server's hands: reaped, and its answer not yet submitted.
    pub busy: bool,
    /// Payload bytes requests and answers wrote since the last trim.
    pub touched: usize,
}

/// What the ring saw since its last trim.
#[derive(Clone, Copy, Debug)]
pub struct Activity {
    /// When a payload larger than a page last went through an entry.
    pub last_large: Instant,
    /// Whether the reap just before this decision took any request.
    pub reaped: bool,
    /// Whether answers are pushed but not yet submitted.
    pub unsubmitted: bool,
    /// No look before this (see [`RETRY`]).
    pub not_before: Instant,
}

/// When to look again: the moment large payloads will have stopped for
/// [`QUIET`], if an entry the kernel holds has pages to give back (a busy
/// one is looked at when its answer wakes the ring anyway).
pub fn due(uses: &[Use], activity: &Activity) -> Option<Instant> {
    uses.iter().any(|u| !u.busy && u.touched > PAGE).then(|| (activity.last_large + QUIET).max(activity.not_before))
}

/// The entries whose payload pages go back now. Only entries the kernel
/// holds waiting for a request (not busy), only when nothing is pending
/// (no request just reaped, no answer unsubmitted), and only once large
/// payloads have stopped for [`QUIET`].
pub fn plan(uses: &[Use], activity: &Activity, now: Instant) -> Vec<usize> {
    if activity.reaped || activity.unsubmitted || now < activity.last_large + QUIET || now < activity.not_before {
        return Vec::new();
    }
    uses.iter().enumerate().filter(|(_, u)| !u.busy && u.touched > PAGE).map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses() -> Vec<Use> {
        vec![
            Use { busy: false, touched: 256 << 10 },
            Use { busy: true, touched: 256 << 10 },
            Use { busy: false, touched: PAGE },
            Use { busy: false, touched: 0 },
        ]
    }

    #[test]
    fn only_idle_entries_that_held_more_than_a_page_are_trimmed_once_quiet() {
        let t0 = Instant::now();
        let quiet = Activity { last_large: t0, reaped: false, unsubmitted: false, not_before: t0 };
        assert_eq!(plan(&uses(), &quiet, t0 + QUIET), vec![0]);
        assert_eq!(due(&uses(), &quiet), Some(t0 + QUIET));
    }

    #[test]
    fn nothing_is_trimmed_while_large_payloads_flow_or_work_is_pending() {
        let t0 = Instant::now();
        let quiet = Activity { last_large: t0, reaped: false, unsubmitted: false, not_before: t0 };
        assert!(plan(&uses(), &quiet, t0 + QUIET / 2).is_empty(), "a large payload went through just now");
        assert!(plan(&uses(), &Activity { reaped: true, ..quiet }, t0 + QUIET).is_empty(), "a request was reaped");
        assert!(plan(&uses(), &Activity { unsubmitted: true, ..quiet }, t0 + QUIET).is_empty(), "answers pending");
        let later = Activity { not_before: t0 + QUIET + RETRY, ..quiet };
        assert!(plan(&uses(), &later, t0 + QUIET).is_empty(), "a look that found work pending waits");
        assert_eq!(due(&uses(), &later), Some(t0 + QUIET + RETRY));
    }

    #[test]
    fn entries_that_touched_a_page_at_most_need_no_look() {
        let t0 = Instant::now();
        let quiet = Activity { last_large: t0, reaped: false, unsubmitted: false, not_before: t0 };
        let small = vec![Use { busy: false, touched: PAGE }, Use { busy: true, touched: 256 << 10 }, Use::default()];
        assert_eq!(due(&small, &quiet), None);
        assert!(plan(&small, &quiet, t0 + QUIET).is_empty());
    }
}
