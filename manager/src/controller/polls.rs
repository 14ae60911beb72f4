//! How long a reconcile pass waits for each node's instance manager. Every
//! node is asked at once, each from a task of its own, so a pass waits for
//! the slowest answer, not the sum, and never longer than [`PASS_WAIT`]: a
//! node that has not answered by then is left "not answering yet" for this
//! pass while its poll goes on (up to its own timeout); a late answer
//! starts another pass. A node whose poll is still out when the next pass
//! starts is not asked again, nor waited for. A node that did not answer its
//! last poll (frozen, cut off) is asked with a short timeout; every so
//! often it gets the full timeout again, so a node that is merely slow is
//! not taken for dead for ever.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ironhorn_proto::instance as pb;
use tokio::sync::Notify;

/// Longer than the client's own request timeout: that one applies.
pub const FULL: Duration = Duration::from_secs(6);
/// For a node that did not answer its last poll.
pub const SUSPECT: Duration = Duration::from_millis(500);
/// A node that keeps failing gets a full-length poll this often.
pub const FULL_RETRY_EVERY: Duration = Duration::from_secs(15);
/// The longest a pass waits for any node; the poll itself may go on.
pub const PASS_WAIT: Duration = Duration::from_millis(1500);

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

/// What a pass does about one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Ask it with `timeout`, and wait for the answer up to `wait`.
    Ask { timeout: Duration, wait: Duration },
    /// An earlier pass's poll is still out: go on without the node.
    StillAsking,
}

/// The plan for a node in state `state`, with a poll out or not.
pub fn plan(state: NodePoll, poll_out: bool, now: Instant) -> Plan {
    if poll_out {
        return Plan::StillAsking;
    }
    let timeout = timeout(state, now);
    Plan::Ask { timeout, wait: timeout.min(PASS_WAIT) }
}

/// What one poll of a node found: its instances and each disk's status (or
/// why not).
#[derive(Clone, Debug)]
pub struct NodeView {
    pub instances: Result<Vec<pb::Instance>, String>,
    pub disks: Vec<(String, Result<pb::DiskStatusResponse, String>)>,
}

impl NodeView {
    /// A node that did not answer: every disk shares its error.
    pub fn unanswered<'a>(why: String, disks: impl Iterator<Item = &'a String>) -> NodeView {
        NodeView { disks: disks.map(|d| (d.clone(), Err(why.clone()))).collect(), instances: Err(why) }
    }
}

/// A poll that is out: since when. (Its answer goes to the pass that sent
/// it, and to the node's state through `ended`.)
struct Out {
    since: Instant,
}

/// Every node's poll state, kept between passes (in memory: a restarted
/// manager starts with full timeouts).
#[derive(Default)]
pub struct Polls {
    states: Mutex<HashMap<String, NodePoll>>,
    out: Mutex<HashMap<String, Out>>,
    /// Woken when a poll a pass stopped waiting for answers.
    pub late_answer: Notify,
}

impl Polls {
    /// The plan for `node`; for `Ask`, the poll counts as out from now.
    /// `StillAsking` carries how long the poll has been out.
    pub fn plan(&self, node: &str, now: Instant) -> (Plan, Duration) {
        let out = self.out.lock().expect("polls");
        let state = self.states.lock().expect("polls").get(node).copied().unwrap_or_default();
        let since = out.get(node).map(|o| now.duration_since(o.since)).unwrap_or_default();
        (plan(state, out.contains_key(node), now), since)
    }

    /// A poll of `node` went out.
    pub fn sent(&self, node: &str, now: Instant) {
        self.out.lock().expect("polls").insert(node.to_string(), Out { since: now });
    }

    /// The poll of `node`, asked with `used`, ended.
    pub fn ended(&self, node: &str, used: Duration, answered: bool, now: Instant) {
        self.out.lock().expect("polls").remove(node);
        let mut map = self.states.lock().expect("polls");
        let state = map.entry(node.to_string()).or_default();
        *state = after(*state, used, answered, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_waits_at_most_pass_wait_and_not_at_all_for_a_poll_already_out() {
        let now = Instant::now();
        assert_eq!(plan(NodePoll::default(), false, now), Plan::Ask { timeout: FULL, wait: PASS_WAIT });
        let failing = after(NodePoll::default(), FULL, false, now);
        let later = now + Duration::from_secs(1);
        assert_eq!(plan(failing, false, later), Plan::Ask { timeout: SUSPECT, wait: SUSPECT });
        assert_eq!(plan(failing, true, later), Plan::StillAsking);
        assert_eq!(plan(NodePoll::default(), true, now), Plan::StillAsking);
    }

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
