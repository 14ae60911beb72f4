//! When a volume's engine should start a scrub: a pure decision over what
//! the volume asks (spec.scrubRequested), what its status remembers and the
//! `scrub-interval-hours` setting.

use jiff::Timestamp;

/// What is known of one attached volume at one moment.
pub struct Input<'a> {
    /// spec.scrubRequested, and the value the last scrub answered.
    pub requested: u64,
    pub answered: u64,
    /// The engine reports a scrub running.
    pub running: bool,
    pub healthy: bool,
    /// When the last scrub started ("" = never), or else when the volume
    /// was created: the schedule counts from there.
    pub last_started: &'a str,
    pub created: Option<Timestamp>,
    /// 0 = no schedule.
    pub interval_hours: u64,
    pub now: Timestamp,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Asked for through spec.scrubRequested.
    Requested,
    /// The interval has passed since the last one.
    Scheduled,
}

pub fn decide(i: &Input) -> Option<Decision> {
    if i.running {
        return None;
    }
    if i.requested > i.answered {
        return Some(Decision::Requested);
    }
    // A scheduled scrub waits for a healthy volume: a degraded one is busy
    // rebuilding, and a missing replica would not be checked.
    if i.interval_hours == 0 || !i.healthy {
        return None;
    }
    let since = i.last_started.parse::<Timestamp>().ok().or(i.created)?;
    let interval = jiff::SignedDuration::from_hours(i.interval_hours.min(1 << 40) as i64);
    (i.now.duration_since(since) >= interval).then_some(Decision::Scheduled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn input(last: &str) -> Input<'_> {
        Input {
            requested: 0,
            answered: 0,
            running: false,
            healthy: true,
            last_started: last,
            created: Some(at("2026-12-01T00:00:00Z")),
            interval_hours: 24,
            now: at("2026-12-03T00:00:00Z"),
        }
    }

    #[test]
    fn a_scrub_starts_when_asked_or_when_the_interval_passed_and_never_twice() {
        assert_eq!(decide(&input("2026-12-02T01:00:00Z")), None, "23 h ago");
        assert_eq!(decide(&input("2026-12-01T23:00:00Z")), Some(Decision::Scheduled), "25 h ago");
        assert_eq!(decide(&input("")), Some(Decision::Scheduled), "never: counted from creation, 48 h ago");
        let mut asked = input("2026-12-02T23:00:00Z");
        asked.requested = 3;
        asked.answered = 2;
        assert_eq!(decide(&asked), Some(Decision::Requested));
        asked.running = true;
        assert_eq!(decide(&asked), None, "one at a time");
        let mut degraded = input("2026-11-01T00:00:00Z");
        degraded.healthy = false;
        assert_eq!(decide(&degraded), None, "a schedule waits for healthy");
        degraded.requested = 1;
        assert_eq!(decide(&degraded), Some(Decision::Requested), "a request does not");
        let mut off = input("2026-11-01T00:00:00Z");
        off.interval_hours = 0;
        assert_eq!(decide(&off), None);
    }
}
