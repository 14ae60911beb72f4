//! How long a reconcile pass waits for each node's instance manager. Every
//! node is asked at once, so a pass waits for the slowest answer, not the
//! sum. A node that did not answer its last poll (frozen, cut off) is asked
//! with a short timeout, so one dead node does not add the full timeout to
//! every pass and stall every other volume's healing and attaching; every
//! so often it gets the full timeout again, so a node that is merely slow
//! is not taken for dead for ever.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longer than the client's own request timeout: that one applies.
pub const FULL: Duration = Duration::from_secs(6);
/// For a node that did not answer its last poll.
pub const SUSPECT: Duration = Duration::from_millis(500);
/// A node that keeps failing gets a full-length poll this often.
pub const FULL_RETRY_EVERY: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodePoll {
    /// Set while the node's polls fail.
    pub failing: bool,
    /// When the node last got a full-length poll.
    pub last_full: Option<Instant>,
}

/// The timeout for a node's next poll.
pub fn timeout(state: NodePoll, now: Instant) -> Duration {
    let full_due = state.last_full.is_none_or(|at| now.duration_since(at) >= FULL_RETRY_EVERY);
    if !state.failing || full_due { FULL } else { SUSPECT }
}

/// The node's state after a poll with `used` that answered or not.
pub fn after(state: NodePoll, used: Duration, answered: bool, now: Instant) -> NodePoll {
    NodePoll { failing: !answered, last_full: if used == FULL { Some(now) } else { state.last_full } }
}

/// Every node's poll state, kept between passes (in memory: a restarted
/// manager starts with full timeouts).
#[derive(Default)]
pub struct Polls(Mutex<HashMap<String, NodePoll>>);

impl Polls {
    pub fn timeout(&self, node: &str, now: Instant) -> Duration {
        timeout(self.0.lock().expect("polls").get(node).copied().unwrap_or_default(), now)
    }

    pub fn record(&self, node: &str, used: Duration, answered: bool, now: Instant) {
        let mut map = self.0.lock().expect("polls");
        let state = map.entry(node.to_string()).or_default();
        *state = after(*state, used, answered, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_that_answers_gets_the_full_timeout() {
        let now = Instant::now();
        assert_eq!(timeout(NodePoll::default(), now), FULL);
        let answered = after(NodePoll::default(), FULL, true, now);
        assert_eq!(timeout(answered, now + Duration::from_secs(1)), FULL);
    }

    #[test]
    fn a_node_that_failed_is_asked_briefly_then_fully_again_every_so_often() {
        let t0 = Instant::now();
        let failed = after(NodePoll::default(), FULL, false, t0);
        assert_eq!(timeout(failed, t0 + Duration::from_secs(2)), SUSPECT);
        let still = after(failed, SUSPECT, false, t0 + Duration::from_secs(2));
        assert_eq!(still.last_full, Some(t0), "a short poll does not count as a full one");
        assert_eq!(timeout(still, t0 + Duration::from_secs(10)), SUSPECT);
        assert_eq!(timeout(still, t0 + FULL_RETRY_EVERY), FULL, "a slow node gets its chance");
        let back = after(still, SUSPECT, true, t0 + Duration::from_secs(3));
        assert_eq!(timeout(back, t0 + Duration::from_secs(4)), FULL, "answered: full timeouts again");
    }
}
