//! The replenish decision: what to do, on this pass, about a volume whose
//! engine runs and that has fewer healthy replicas than it should. A pure
//! function of a snapshot ([`VolumeView`]) and the settings ([`Policy`]), so
//! each rule is unit-tested over constructed states.
//!
//! Rules, in order (the first that decides wins):
//! 1. Act only on a current view: every replica the manager gave the engine
//!    must appear in the engine's report (and nothing else), else wait.
//! 2. Salvage: no replica is RW (the volume is faulted) → bring it back from
//!    every replica whose data still exists; the engine, restarted with them,
//!    serves from the newest durable state and rebuilds the rest.
//! 3. A rebuild is running (a WO replica) → nothing more: rebuilds are
//!    sequential per volume. Nor while the target node has reached its limit
//!    of concurrent rebuilds.
//! 4. Data locality (best-effort): a volume with enough healthy replicas,
//!    none on the node it is attached to, and a disk there with room → one
//!    more replica there. More healthy replicas than wanted (the replica
//!    count was lowered, or a local one was added) → remove one, a replica
//!    on an unusable node or disk first, never the attached node's while
//!    locality is on, then by name; one per pass, so the engine's view is
//!    current before the next. Enough → nothing (only stale cleanup).
//! 5. Reuse a failed replica whose node and disk are usable and whose data
//!    exists, most recently failed first, if its retry count is under the
//!    maximum and its backoff has passed since it failed. If such a replica is
//!    only waiting for its backoff, wait for it.
//! 6. Otherwise create a new replica, but only once the replenishment wait
//!    interval has passed since the volume became degraded, or at once when no
//!    failed replica could ever be reused (data known gone, or out of
//!    retries). A replica on an unreachable node could come back with its
//!    node, so it holds creation off for the wait interval.
//!
//! Independently: failed replicas that are not being reused and have been
//! failed for longer than the stale timeout are deleted (with their data).

use std::time::Duration;

use jiff::Timestamp;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaView {
    pub name: String,
    pub node: String,
    /// Node ready and schedulable, disk ready and schedulable.
    pub usable: bool,
    /// Its store exists on its disk, as the node's instance manager reports;
    /// None when the node cannot be asked (the data may come back with it).
    pub data_exists: Option<bool>,
    pub failed_at: Option<Timestamp>,
    pub rebuild_retry_count: u32,
    /// Mode the engine reports: "RW", "WO", "ERR"; None when the engine does
    /// not list it.
    pub mode: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeView {
    pub desired: usize,
    pub replicas: Vec<ReplicaView>,
    /// True when the engine's report and the replica set the manager gave it
    /// agree (rule 1).
    pub view_current: bool,
    /// When the volume last became degraded.
    pub degraded_since: Option<Timestamp>,
    /// Rebuilds currently running with their target on each node (all volumes).
    pub rebuilds_on_node: std::collections::HashMap<String, usize>,
    /// Best-effort data locality: the attached node, and whether a disk
    /// there can take a replica. None: locality off.
    pub local: Option<Local>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Local {
    pub node: String,
    pub room: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub now: Timestamp,
    pub replenishment_wait: Duration,
    pub retry_max: u32,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub stale_timeout: Duration,
    pub per_node_rebuild_limit: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do now; the reason says why.
    Wait(String),
    /// Healthy enough.
    Nothing,
    Reuse {
        replica: String,
        retry: u32,
    },
    Create,
    /// Best-effort locality: one more replica on this (the attached) node.
    CreateLocal {
        node: String,
    },
    /// Faulted: restart from these replicas (their data exists).
    Salvage {
        replicas: Vec<String>,
    },
    /// More healthy replicas than wanted: take this one out of the engine
    /// and delete it with its data.
    Remove {
        replica: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub action: Action,
    pub delete_stale: Vec<String>,
}

/// The wait before reuse attempt number `retry` (0-based) of one replica:
/// none for the first, then `initial` doubling up to `max`.
pub fn backoff(retry: u32, policy: &Policy) -> Duration {
    if retry == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32 << (retry - 1).min(16);
    policy.backoff_initial.saturating_mul(factor).min(policy.backoff_max)
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    let ns = now.as_nanosecond() - since.as_nanosecond();
    Duration::from_nanos(ns.max(0) as u64)
}

pub fn decide(volume: &VolumeView, policy: &Policy) -> Plan {
    let failed: Vec<&ReplicaView> = volume.replicas.iter().filter(|r| r.failed_at.is_some()).collect();
    let reusable_ever = |r: &ReplicaView| r.data_exists != Some(false) && r.rebuild_retry_count < policy.retry_max;
    let action = decide_action(volume, policy, &failed, &reusable_ever);
    // Stale cleanup: failed, not the one being reused, failed long enough.
    let keep = match &action {
        Action::Reuse { replica, .. } => vec![replica.clone()],
        Action::Salvage { replicas } => replicas.clone(),
        _ => vec![],
    };
    // A volume with no healthy replica keeps every failed one, whatever its
    // node's or disk's scheduling flags: they are what salvage needs.
    let any_healthy = volume.replicas.iter().any(|r| r.failed_at.is_none() && r.mode.as_deref() == Some("RW"));
    let delete_stale = failed
        .iter()
        .filter(|_| any_healthy)
        .filter(|r| !keep.contains(&r.name))
        .filter(|r| r.failed_at.is_some_and(|t| elapsed(t, policy.now) >= policy.stale_timeout))
        .map(|r| r.name.clone())
        .collect();
    Plan { action, delete_stale }
}

fn decide_action(
    volume: &VolumeView,
    policy: &Policy,
    failed: &[&ReplicaView],
    reusable_ever: &dyn Fn(&ReplicaView) -> bool,
) -> Action {
    if !volume.view_current {
        return Action::Wait("waiting for the engine to report the replica set it was given".into());
    }
    let rw = volume.replicas.iter().filter(|r| r.failed_at.is_none() && r.mode.as_deref() == Some("RW")).count();
    if rw == 0 {
        let mut from: Vec<String> = volume
            .replicas
            .iter()
            .filter(|r| r.data_exists == Some(true) && r.usable)
            .map(|r| r.name.clone())
            .collect();
        from.sort();
        return if from.is_empty() {
            Action::Wait("faulted, and no replica's data is reachable to salvage from".into())
        } else {
            Action::Salvage { replicas: from }
        };
    }
    if let Some(r) = volume.replicas.iter().find(|r| r.mode.as_deref() == Some("WO")) {
        return Action::Wait(format!("replica {} is rebuilding; rebuilds are sequential", r.name));
    }
    let healthy = volume.replicas.iter().filter(|r| r.failed_at.is_none()).count();
    let is_local = |r: &ReplicaView| volume.local.as_ref().is_some_and(|l| l.node == r.node);
    if let Some(local) = &volume.local
        && healthy >= volume.desired
        && local.room
        && !volume.replicas.iter().any(|r| r.failed_at.is_none() && is_local(r))
    {
        return Action::CreateLocal { node: local.node.clone() };
    }
    if healthy > volume.desired {
        let mut extra: Vec<&ReplicaView> = volume
            .replicas
            .iter()
            .filter(|r| r.failed_at.is_none() && r.mode.as_deref() == Some("RW"))
            .filter(|r| !(is_local(r) && r.usable))
            .collect();
        // Never the last RW replica.
        if !extra.is_empty() && rw > 1 {
            extra.sort_by(|a, b| a.usable.cmp(&b.usable).then_with(|| b.name.cmp(&a.name)));
            return Action::Remove { replica: extra[0].name.clone() };
        }
    }
    if healthy >= volume.desired {
        return Action::Nothing;
    }
    let node_full =
        |node: &str| volume.rebuilds_on_node.get(node).copied().unwrap_or(0) >= policy.per_node_rebuild_limit;

    // Reuse: most recently failed first, among those reusable now.
    let candidates: Vec<&&ReplicaView> = failed.iter().filter(|r| reusable_ever(r)).collect();
    let mut now_usable: Vec<&&&ReplicaView> =
        candidates.iter().filter(|r| r.usable && r.data_exists == Some(true)).collect();
    now_usable.sort_by(|a, b| b.failed_at.cmp(&a.failed_at).then_with(|| a.name.cmp(&b.name)));
    let mut waiting_for_backoff = None;
    for r in &now_usable {
        let due = r.failed_at.expect("failed") + backoff(r.rebuild_retry_count, policy);
        if policy.now < due {
            waiting_for_backoff.get_or_insert_with(|| format!("replica {} backs off until {due}", r.name));
            continue;
        }
        if node_full(&r.node) {
            waiting_for_backoff.get_or_insert_with(|| format!("node {} is at its rebuild limit", r.node));
            continue;
        }
        return Action::Reuse { replica: r.name.clone(), retry: r.rebuild_retry_count + 1 };
    }
    if let Some(why) = waiting_for_backoff {
        return Action::Wait(why);
    }
    // A new replica: at once when nothing could be reused, else after the
    // replenishment wait since the volume became degraded.
    if candidates.is_empty() {
        return Action::Create;
    }
    let since = volume.degraded_since.unwrap_or(policy.now);
    if elapsed(since, policy.now) >= policy.replenishment_wait {
        Action::Create
    } else {
        Action::Wait(format!("replenishment wait: a new replica after {:?} degraded", policy.replenishment_wait))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn policy(now: i64) -> Policy {
        Policy {
            now: t(now),
            replenishment_wait: Duration::from_secs(600),
            retry_max: 5,
            backoff_initial: Duration::from_secs(60),
            backoff_max: Duration::from_secs(180),
            stale_timeout: Duration::from_secs(2880 * 60),
            per_node_rebuild_limit: 5,
        }
    }

    fn rw(name: &str, node: &str) -> ReplicaView {
        ReplicaView {
            name: name.into(),
            node: node.into(),
            usable: true,
            data_exists: Some(true),
            failed_at: None,
            rebuild_retry_count: 0,
            mode: Some("RW".into()),
        }
    }

    fn failed(name: &str, node: &str, at: i64) -> ReplicaView {
        ReplicaView { failed_at: Some(t(at)), mode: None, ..rw(name, node) }
    }

    fn volume(replicas: Vec<ReplicaView>) -> VolumeView {
        VolumeView {
            desired: 3,
            replicas,
            view_current: true,
            degraded_since: Some(t(0)),
            rebuilds_on_node: Default::default(),
            local: None,
        }
    }

    #[test]
    fn waits_until_the_engine_reports_what_it_was_given() {
        let mut v = volume(vec![rw("a", "n1"), rw("b", "n2"), failed("c", "n3", 0)]);
        v.view_current = false;
        assert!(matches!(decide(&v, &policy(10)).action, Action::Wait(_)));
    }

    #[test]
    fn one_rebuild_at_a_time_per_volume() {
        let mut rebuilding = rw("c", "n3");
        rebuilding.mode = Some("WO".into());
        let v = volume(vec![rw("a", "n1"), failed("b", "n2", 0), rebuilding]);
        let plan = decide(&v, &policy(1000));
        assert!(matches!(&plan.action, Action::Wait(w) if w.contains("rebuilding")), "{plan:?}");
    }

    #[test]
    fn per_node_rebuild_limit_holds() {
        let mut v = volume(vec![rw("a", "n1"), rw("b", "n2"), failed("c", "n3", 0)]);
        v.rebuilds_on_node.insert("n3".into(), 5);
        assert!(matches!(&decide(&v, &policy(1)).action, Action::Wait(w) if w.contains("rebuild limit")));
        v.rebuilds_on_node.insert("n3".into(), 4);
        assert_eq!(decide(&v, &policy(1)).action, Action::Reuse { replica: "c".into(), retry: 1 });
    }

    #[test]
    fn reuses_the_most_recently_failed_usable_replica_first() {
        let mut v = volume(vec![rw("a", "n1"), failed("b", "n2", 5), failed("c", "n3", 9)]);
        v.desired = 3;
        assert_eq!(decide(&v, &policy(10)).action, Action::Reuse { replica: "c".into(), retry: 1 });
        // Unusable node or missing data: not a candidate.
        v.replicas[2].usable = false;
        assert_eq!(decide(&v, &policy(10)).action, Action::Reuse { replica: "b".into(), retry: 1 });
        v.replicas[1].data_exists = Some(false);
        // c may come back with its node: a new replica only after the wait...
        assert!(matches!(decide(&v, &policy(10)).action, Action::Wait(_)));
        // ...and at once when c's data is known gone too.
        v.replicas[2].data_exists = Some(false);
        assert_eq!(decide(&v, &policy(10)).action, Action::Create, "nothing reusable: a new replica at once");
    }

    #[test]
    fn retries_are_capped_and_spaced_by_a_growing_backoff() {
        let p = policy(0);
        let gaps: Vec<u64> = (0..6).map(|n| backoff(n, &p).as_secs()).collect();
        assert_eq!(gaps, [0, 60, 120, 180, 180, 180]);
        let mut c = failed("c", "n3", 100);
        c.rebuild_retry_count = 2; // third attempt: 120 s after its last failure
        let v = volume(vec![rw("a", "n1"), rw("b", "n2"), c.clone()]);
        assert!(matches!(&decide(&v, &policy(219)).action, Action::Wait(w) if w.contains("backs off")));
        assert_eq!(decide(&v, &policy(220)).action, Action::Reuse { replica: "c".into(), retry: 3 });
        // At the maximum, it is no longer a candidate: a new replica at once.
        c.rebuild_retry_count = 5;
        let v = volume(vec![rw("a", "n1"), rw("b", "n2"), c]);
        assert_eq!(decide(&v, &policy(10_000)).action, Action::Create);
    }

    #[test]
    fn new_replicas_wait_for_the_replenishment_interval_while_reuse_is_possible() {
        // c is reusable but its node is at the rebuild limit for now: a new
        // replica only after the wait interval.
        let mut v = volume(vec![rw("a", "n1"), rw("b", "n2"), failed("c", "n3", 0)]);
        v.rebuilds_on_node.insert("n3".into(), 5);
        assert!(matches!(decide(&v, &policy(599)).action, Action::Wait(_)));
        // Two replicas gone, one of them for good (data lost): reuse first.
        let mut gone = failed("d", "n4", 0);
        gone.data_exists = Some(false);
        let v = volume(vec![rw("a", "n1"), failed("c", "n3", 0), gone]);
        assert_eq!(decide(&v, &policy(1)).action, Action::Reuse { replica: "c".into(), retry: 1 });
        // A replica whose node is unreachable may come back with its node:
        // a new replica only after the wait interval.
        let mut away = failed("d", "n4", 0);
        away.usable = false;
        away.data_exists = None;
        let v = VolumeView { desired: 2, ..volume(vec![rw("a", "n1"), away.clone()]) };
        assert!(matches!(&decide(&v, &policy(599)).action, Action::Wait(w) if w.contains("replenishment wait")));
        assert_eq!(decide(&v, &policy(600)).action, Action::Create);
        // Its data known gone: nothing to wait for.
        away.data_exists = Some(false);
        let v = VolumeView { desired: 2, ..volume(vec![rw("a", "n1"), away]) };
        assert_eq!(decide(&v, &policy(1)).action, Action::Create);
    }

    #[test]
    fn a_reusable_replica_past_the_wait_interval_still_waits_for_reuse_but_not_forever() {
        // Backing off and past the replenishment interval: still the backoff
        // wait (reuse is preferred while it can happen).
        let mut c = failed("c", "n3", 590);
        c.rebuild_retry_count = 1;
        let v = volume(vec![rw("a", "n1"), rw("b", "n2"), c]);
        assert!(matches!(decide(&v, &policy(600)).action, Action::Wait(_)));
        assert_eq!(decide(&v, &policy(650)).action, Action::Reuse { replica: "c".into(), retry: 2 });
    }

    #[test]
    fn failed_replicas_not_reused_go_after_the_stale_timeout() {
        let mut p = policy(0);
        p.stale_timeout = Duration::from_secs(30);
        let mut old = failed("old", "n3", -100);
        old.rebuild_retry_count = 5; // never reused again
        let v = volume(vec![rw("a", "n1"), rw("b", "n2"), rw("c", "n4"), old]);
        let plan = decide(&v, &p);
        assert_eq!(plan.action, Action::Nothing);
        assert_eq!(plan.delete_stale, ["old"]);
        // Not yet stale: kept.
        p.now = t(-80);
        assert!(decide(&v, &p).delete_stale.is_empty());
        // The replica being reused is never deleted.
        let v = volume(vec![rw("a", "n1"), rw("b", "n2"), failed("c", "n3", -100)]);
        let plan = decide(&v, &policy(0));
        assert_eq!(plan.action, Action::Reuse { replica: "c".into(), retry: 1 });
        assert!(plan.delete_stale.is_empty());
    }

    #[test]
    fn stale_cleanup_never_deletes_a_replica_of_a_volume_with_no_healthy_one() {
        let mut p = policy(0);
        p.stale_timeout = Duration::from_secs(30);
        // Every replica failed long ago, and their nodes are unschedulable,
        // so salvage does not list them: still none may be deleted.
        let replicas: Vec<ReplicaView> = ["a", "b", "c"]
            .iter()
            .map(|n| ReplicaView { usable: false, ..failed(n, &format!("node-{n}"), -1000) })
            .collect();
        let plan = decide(&volume(replicas), &p);
        assert!(plan.delete_stale.is_empty(), "{plan:?}");
    }

    #[test]
    fn faulted_volumes_are_salvaged_from_every_replica_with_data() {
        let mut lost = failed("c", "n3", 3);
        lost.data_exists = Some(false);
        let v = volume(vec![failed("a", "n1", 1), failed("b", "n2", 2), lost]);
        assert_eq!(decide(&v, &policy(5)).action, Action::Salvage { replicas: vec!["a".into(), "b".into()] });
        // Nothing reachable: wait, never invent data.
        let mut v = v;
        for r in &mut v.replicas {
            r.usable = false;
        }
        assert!(matches!(decide(&v, &policy(5)).action, Action::Wait(_)));
    }

    #[test]
    fn a_lowered_replica_count_removes_one_healthy_replica_per_pass_unusable_first() {
        let mut v = volume(vec![rw("r-a", "n-1"), rw("r-b", "n-2"), rw("r-c", "n-3")]);
        v.desired = 1;
        assert_eq!(decide(&v, &policy(0)).action, Action::Remove { replica: "r-c".into() });
        v.replicas[0].usable = false;
        assert_eq!(decide(&v, &policy(0)).action, Action::Remove { replica: "r-a".into() }, "unusable goes first");
        // Never while a rebuild runs, never the last RW replica.
        v.replicas = vec![rw("r-a", "n-1"), ReplicaView { mode: Some("WO".into()), ..rw("r-b", "n-2") }];
        assert!(matches!(decide(&v, &policy(0)).action, Action::Wait(_)));
        v.replicas = vec![rw("r-a", "n-1")];
        assert_eq!(decide(&v, &policy(0)).action, Action::Nothing);
    }

    #[test]
    fn best_effort_locality_adds_a_replica_on_the_attached_node_then_removes_one_elsewhere() {
        let local = |room| Some(Local { node: "n3".into(), room });
        let v = VolumeView { desired: 2, local: local(true), ..volume(vec![rw("a", "n1"), rw("b", "n2")]) };
        assert_eq!(decide(&v, &policy(0)).action, Action::CreateLocal { node: "n3".into() });
        let v = VolumeView { desired: 2, local: local(false), ..volume(vec![rw("a", "n1"), rw("b", "n2")]) };
        assert_eq!(decide(&v, &policy(0)).action, Action::Nothing, "no room there: nothing");
        // The local one rebuilt: one elsewhere goes, never the local one.
        let v =
            VolumeView { desired: 2, local: local(true), ..volume(vec![rw("a", "n1"), rw("b", "n2"), rw("c", "n3")]) };
        assert_eq!(decide(&v, &policy(0)).action, Action::Remove { replica: "b".into() });
        let v = VolumeView { desired: 2, local: local(true), ..volume(vec![rw("a", "n1"), rw("c", "n3")]) };
        assert_eq!(decide(&v, &policy(0)).action, Action::Nothing, "settled");
        // One replica wanted: the local one replaces it.
        let v = VolumeView { desired: 1, local: local(true), ..volume(vec![rw("a", "n1"), rw("c", "n3")]) };
        assert_eq!(decide(&v, &policy(0)).action, Action::Remove { replica: "a".into() });
        // Degraded volumes heal first (the ordinary rules).
        let mut failed = rw("b", "n2");
        failed.failed_at = Some(t(0));
        failed.data_exists = Some(false);
        let v = VolumeView { desired: 2, local: local(true), ..volume(vec![rw("a", "n1"), failed]) };
        assert_eq!(decide(&v, &policy(10)).action, Action::Create);
    }
}
