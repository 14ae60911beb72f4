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

/// After a look that found work pending, the next look on an idle ring
/// waits this long (small I/O keeps work pending; no busy loop).
pub const RETRY: Duration = Duration::from_millis(200);

/// What the ring knows of one entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Use {
    /// In the server's hands: reaped, and its answer not yet submitted.
    pub busy: bool,
    /// Payload bytes requests and answers wrote since the last trim.
    pub touched: usize,
}

/// What the ring saw up to this look.
#[derive(Clone, Copy, Debug)]
pub struct Activity {
    /// When a payload larger than a page last went through an entry.
    pub last_large: Instant,
    /// Whether the reap just before this look took any request.
    pub reaped: bool,
    /// Whether answers are pushed but not yet submitted.
    pub unsubmitted: bool,
}

/// What one look decides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// The entries whose payload pages go back now.
    pub trim: Vec<usize>,
    /// When an otherwise idle ring looks again (none: only when woken).
    pub look_again: Option<Instant>,
}

/// Only entries the kernel holds waiting for a request (not busy) that
/// held more than a page are trimmed, only once large payloads have
/// stopped for [`QUIET`], and only when nothing is pending (no request just
/// reaped, no answer unsubmitted). A busy entry is looked at again when its
/// answer wakes the ring.
pub fn decide(uses: &[Use], activity: &Activity, now: Instant) -> Decision {
    let holds_pages = |u: &Use| !u.busy && u.touched > PAGE;
    if !uses.iter().any(holds_pages) {
        return Decision::default();
    }
    let quiet_from = activity.last_large + QUIET;
    if now < quiet_from {
        return Decision { trim: Vec::new(), look_again: Some(quiet_from) };
    }
    if activity.reaped || activity.unsubmitted {
        return Decision { trim: Vec::new(), look_again: Some(now + RETRY) };
    }
    let trim = uses.iter().enumerate().filter(|(_, u)| holds_pages(u)).map(|(i, _)| i).collect();
    Decision { trim, look_again: None }
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

    fn quiet(t0: Instant) -> Activity {
        Activity { last_large: t0, reaped: false, unsubmitted: false }
    }

    #[test]
    fn only_idle_entries_that_held_more_than_a_page_are_trimmed_once_quiet() {
        let t0 = Instant::now();
        assert_eq!(decide(&uses(), &quiet(t0), t0 + QUIET), Decision { trim: vec![0], look_again: None });
    }

    #[test]
    fn nothing_is_trimmed_while_large_payloads_flow_or_work_is_pending() {
        let t0 = Instant::now();
        let early = decide(&uses(), &quiet(t0), t0 + QUIET / 2);
        assert_eq!(
            early,
            Decision { trim: vec![], look_again: Some(t0 + QUIET) },
            "a large payload went through just now"
        );
        let later = t0 + QUIET;
        let retry = Decision { trim: vec![], look_again: Some(later + RETRY) };
        assert_eq!(decide(&uses(), &Activity { reaped: true, ..quiet(t0) }, later), retry, "a request was reaped");
        assert_eq!(decide(&uses(), &Activity { unsubmitted: true, ..quiet(t0) }, later), retry, "answers pending");
    }

    #[test]
    fn entries_that_touched_a_page_at_most_need_no_look() {
        let t0 = Instant::now();
        let small = vec![Use { busy: false, touched: PAGE }, Use { busy: true, touched: 256 << 10 }, Use::default()];
        assert_eq!(decide(&small, &quiet(t0), t0 + QUIET), Decision::default());
    }
}
