//! Leader election among managers with a coordination.k8s.io/v1 Lease, the
//! way Kubernetes controllers do it: only the holder reconciles; every
//! manager serves the REST API (reads and writes go to the datastore).
//!
//! Timing (client-go's defaults): the holder renews every `retry`; it counts
//! itself leader only until `renew_deadline` after the start of its last
//! successful renewal, so a holder that cannot renew stops reconciling while
//! its lease still stands. Another manager takes the lease over when the
//! record it sees has not changed for `duration` by its own clock (no
//! comparison of two machines' clocks), and `renew_deadline < duration`
//! leaves a gap in which nobody reconciles rather than two.
//!
//! Every write carries the lease's resourceVersion, so two managers that
//! both decide to take over cannot both succeed: one gets a conflict.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

use crate::datastore::{self, Datastore};

/// The Lease the managers contend for.
pub const LEASE_NAME: &str = "ironhorn-manager-leader";

#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How long a lease record must stand unchanged before another takes over.
    pub duration: Duration,
    /// How long after its last renewal began the holder still acts.
    pub renew_deadline: Duration,
    /// Between attempts.
    pub retry: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

impl Timing {
    pub fn validate(&self) -> Result<(), String> {
        if self.retry >= self.renew_deadline || self.renew_deadline >= self.duration {
            return Err(format!(
                "leader election needs retry < renew deadline < lease duration (got {:?}, {:?}, {:?})",
                self.retry, self.renew_deadline, self.duration
            ));
        }
        Ok(())
    }
}

/// The part of a Lease the decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Empty: released.
    pub holder: String,
    pub renew_time: String,
    pub duration_secs: i64,
}

impl Record {
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.unwrap_or_default(),
            renew_time: spec.renew_time.map(|t| t.0.to_string()).unwrap_or_default(),
            duration_secs: spec.lease_duration_seconds.unwrap_or(0).into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No lease yet: create it, held by me.
    Create,
    /// I hold it: renew.
    Renew,
    /// Released, or unchanged for longer than its duration: take it.
    TakeOver,
    /// Someone else holds it.
    Follow { holder: String },
}

/// What to do, given the lease as read and how long this manager has seen
/// that same record unchanged.
pub fn decide(current: Option<&Record>, me: &str, unchanged_for: Duration) -> Decision {
    let Some(record) = current else { return Decision::Create };
    if record.holder == me {
        return Decision::Renew;
    }
    if record.holder.is_empty() {
        return Decision::TakeOver;
    }
    let duration = Duration::from_secs(record.duration_secs.max(1) as u64);
    if unchanged_for >= duration {
        return Decision::TakeOver;
    }
    Decision::Follow { holder: record.holder.clone() }
}

/// Whether this manager may reconcile now. Cheap to clone and to ask.
#[derive(Clone)]
pub struct Gate(Arc<Mutex<GateState>>);

enum GateState {
    /// One machine, one manager: always leader.
    Always,
    /// Leader until this instant (None: not leader).
    Until(Option<Instant>),
}

impl Gate {
    pub fn always() -> Self {
        Self(Arc::new(Mutex::new(GateState::Always)))
    }

    fn elected() -> Self {
        Self(Arc::new(Mutex::new(GateState::Until(None))))
    }

    pub fn is_leader(&self) -> bool {
        match *self.0.lock().expect("leader gate") {
            GateState::Always => true,
            GateState::Until(until) => until.is_some_and(|u| Instant::now() < u),
        }
    }

    fn set(&self, until: Option<Instant>) {
        *self.0.lock().expect("leader gate") = GateState::Until(until);
    }
}

/// Contends for the lease until `stop` resolves; the returned gate says
/// whether this manager leads. On stop a holder releases the lease, so the
/// next manager need not wait out its duration.
pub fn spawn<D: Datastore>(
    store: D,
    identity: String,
    timing: Timing,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (Gate, tokio::task::JoinHandle<()>) {
    let gate = Gate::elected();
    let task = tokio::spawn(run(store, identity, timing, gate.clone(), stop));
    (gate, task)
}

async fn run<D: Datastore>(
    store: D,
    identity: String,
    timing: Timing,
    gate: Gate,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    let mut seen: Option<(Record, Instant)> = None;
    let mut leading = false;
    loop {
        let started = Instant::now();
        match attempt(&store, &identity, &timing, &mut seen).await {
            Ok(true) => {
                gate.set(Some(started + timing.renew_deadline));
                if !leading {
                    tracing::info!(%identity, "became the leader");
                }
                leading = true;
            }
            Ok(false) => {
                if leading {
                    tracing::warn!(%identity, "lost the lease: stopped reconciling");
                }
                gate.set(None);
                leading = false;
            }
            Err(e) => {
                // The gate runs out by itself at the renew deadline.
                tracing::warn!(%identity, error = %e, "lease renewal failed");
                if leading && !gate.is_leader() {
                    tracing::warn!(%identity, "renew deadline passed: stopped reconciling");
                    leading = false;
                }
            }
        }
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(timing.retry) => {}
        }
    }
    gate.set(None);
    if leading && let Err(e) = release(&store, &identity).await {
        tracing::warn!(%identity, error = %e, "could not release the lease");
    }
}

fn micro_now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// One round: read, decide, write. Ok(true) when this manager holds the
/// lease after it.
async fn attempt<D: Datastore>(
    store: &D,
    identity: &str,
    timing: &Timing,
    seen: &mut Option<(Record, Instant)>,
) -> datastore::Result<bool> {
    let current: Option<Lease> = store.get(LEASE_NAME).await?;
    let record = current.as_ref().map(Record::of);
    let unchanged_for = match (&record, &*seen) {
        (Some(r), Some((s, since))) if r == s => since.elapsed(),
        _ => Duration::ZERO,
    };
    if let Some(r) = &record
        && seen.as_ref().is_none_or(|(s, _)| s != r)
    {
        *seen = Some((r.clone(), Instant::now()));
    }
    let duration_secs = timing.duration.as_secs().max(1) as i32;
    let result = match decide(record.as_ref(), identity, unchanged_for) {
        Decision::Follow { .. } => return Ok(false),
        Decision::Create => {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(LEASE_NAME.into()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(identity.into()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(micro_now()),
                    renew_time: Some(micro_now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            store.create(&lease).await
        }
        decision @ (Decision::Renew | Decision::TakeOver) => {
            let mut lease = current.expect("a lease to renew or take over was read");
            let spec = lease.spec.get_or_insert_default();
            if decision == Decision::TakeOver {
                spec.holder_identity = Some(identity.into());
                spec.acquire_time = Some(micro_now());
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.lease_duration_seconds = Some(duration_secs);
            spec.renew_time = Some(micro_now());
            store.replace(&lease).await
        }
    };
    match result {
        Ok(written) => {
            *seen = Some((Record::of(&written), Instant::now()));
            Ok(true)
        }
        // Someone else wrote first: they hold it.
        Err(datastore::Error::Conflict { .. } | datastore::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the lease up (holder cleared), if this manager still holds it.
async fn release<D: Datastore>(store: &D, identity: &str) -> datastore::Result<()> {
    let Some(mut lease) = store.get::<Lease>(LEASE_NAME).await? else { return Ok(()) };
    let spec = lease.spec.get_or_insert_default();
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(());
    }
    spec.holder_identity = Some(String::new());
    spec.renew_time = Some(micro_now());
    store.replace(&lease).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str) -> Record {
        Record { holder: holder.into(), renew_time: "2026-12-03T10:00:00Z".into(), duration_secs: 15 }
    }

    #[test]
    fn absent_lease_is_created_and_own_lease_renewed() {
        assert_eq!(decide(None, "a", Duration::ZERO), Decision::Create);
        assert_eq!(decide(Some(&record("a")), "a", Duration::from_secs(100)), Decision::Renew);
    }

    #[test]
    fn another_holder_is_followed_until_its_record_stands_still_for_the_duration() {
        let b = record("b");
        assert_eq!(decide(Some(&b), "a", Duration::from_secs(14)), Decision::Follow { holder: "b".into() });
        assert_eq!(decide(Some(&b), "a", Duration::from_secs(15)), Decision::TakeOver);
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        assert_eq!(decide(Some(&record("")), "a", Duration::ZERO), Decision::TakeOver);
    }

    #[test]
    fn timing_must_leave_the_holder_time_to_stop_before_takeover() {
        assert!(Timing::default().validate().is_ok());
        let bad = Timing { renew_deadline: Duration::from_secs(15), ..Timing::default() };
        assert!(bad.validate().is_err());
    }
}
