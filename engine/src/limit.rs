//! A volume's I/O limits: IOPS and bytes per second over its frontend
//! reads, writes and trims (flushes are free), each a token bucket. A
//! request takes its tokens when it arrives, in arrival order, and waits
//! until the bucket has paid for it (a request larger than the burst still
//! passes, after its time). Bursts are bounded to [`BURST`] of the rate.
//! Pure arithmetic over the instants it is given; the volume sleeps.

use std::time::{Duration, Instant};

/// The longest burst a bucket holds: this long at its rate.
pub const BURST: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// Requests per second (0: unlimited).
    pub iops: u64,
    /// Bytes per second (0: unlimited).
    pub bytes_per_sec: u64,
}

#[derive(Clone, Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    /// May go below zero: requests that took tokens not yet earned.
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: u64, now: Instant) -> Bucket {
        let rate = rate as f64;
        // At least one request (or one byte) of burst, so a low rate still
        // lets a request through at once when it has been idle.
        let burst = (rate * BURST.as_secs_f64()).max(1.0);
        Bucket { rate, burst, tokens: burst, at: now }
    }

    /// Takes `n` tokens at `now`: how long the request waits.
    fn take(&mut self, n: f64, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = self.at.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst) - n;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.rate) }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Limiter {
    limits: Limits,
    iops: Option<Bucket>,
    bytes: Option<Bucket>,
}

impl Limiter {
    pub fn new(limits: Limits, now: Instant) -> Limiter {
        Limiter {
            limits,
            iops: (limits.iops > 0).then(|| Bucket::new(limits.iops, now)),
            bytes: (limits.bytes_per_sec > 0).then(|| Bucket::new(limits.bytes_per_sec, now)),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A request of `bytes` arriving at `now`: how long it waits.
    pub fn admit(&mut self, bytes: u64, now: Instant) -> Duration {
        let by_count = self.iops.as_mut().map_or(Duration::ZERO, |b| b.take(1.0, now));
        let by_bytes = self.bytes.as_mut().map_or(Duration::ZERO, |b| b.take(bytes as f64, now));
        by_count.max(by_bytes)
    }
}

/// Requests a limit holds back are let go on a common beat of this period.
pub const TICK: Duration = Duration::from_millis(4);

/// How long a request that the limiter told to wait `wait` sleeps, `since`
/// being the time from a fixed instant of the process (the beat's origin)
/// to now: until the beat nearest the time it was told. At depth, the held
/// requests then wake together (a few hundred times a second instead of
/// once per request, each wake a preemption of whatever else runs on these
/// cores) and go to the replicas as one batch. The bucket took their
/// tokens on arrival, so waking up to half a beat early or late moves a
/// request, not the rate: the next one's wait carries the difference.
pub fn on_the_beat(since: Duration, wait: Duration) -> Duration {
    if wait.is_zero() {
        return Duration::ZERO;
    }
    let tick = TICK.as_nanos();
    let due = since.as_nanos() + wait.as_nanos();
    let beat = (due + tick / 2) / tick * tick;
    Duration::from_nanos(beat.saturating_sub(since.as_nanos()) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests back to back for `secs`, each sent when the previous one's
    /// wait is over: how many went.
    fn run(limiter: &mut Limiter, bytes: u64, secs: f64) -> (u64, f64) {
        let start = Instant::now();
        let mut now = start;
        let mut sent = 0;
        loop {
            now += limiter.admit(bytes, now);
            if now.duration_since(start).as_secs_f64() >= secs {
                return (sent, now.duration_since(start).as_secs_f64());
            }
            sent += 1;
        }
    }

    #[test]
    fn an_iops_limit_holds_over_time_after_a_bounded_burst() {
        let mut l = Limiter::new(Limits { iops: 1000, bytes_per_sec: 0 }, Instant::now());
        let (sent, secs) = run(&mut l, 4096, 10.0);
        let rate = sent as f64 / secs;
        // The burst is 100 requests: at most 1 % over 10 s.
        assert!((1000.0..=1011.0).contains(&rate), "{rate}");
    }

    #[test]
    fn a_bandwidth_limit_holds_and_big_requests_wait_their_time() {
        let mut l = Limiter::new(Limits { iops: 0, bytes_per_sec: 10 << 20 }, Instant::now());
        // 4 MiB requests, bigger than the 1 MiB burst.
        let (sent, secs) = run(&mut l, 4 << 20, 10.0);
        let rate = (sent * (4 << 20)) as f64 / secs;
        assert!(rate <= (10u64 << 20) as f64 * 1.01 && rate >= (10u64 << 20) as f64 * 0.95, "{rate}");
    }

    #[test]
    fn the_tighter_limit_wins_and_no_limit_never_waits() {
        let now = Instant::now();
        let mut l = Limiter::new(Limits { iops: 100, bytes_per_sec: 1 << 20 }, now);
        let (sent, secs) = run(&mut l, 64 << 10, 5.0);
        let iops = sent as f64 / secs;
        assert!((15.0..=17.0).contains(&iops), "1 MiB/s of 64 KiB requests is 16 a second: {iops}");
        let mut free = Limiter::new(Limits::default(), now);
        assert!((0..10_000).all(|_| free.admit(1 << 20, now).is_zero()));
    }

    #[test]
    fn held_requests_wake_on_the_nearest_beat_and_the_rate_still_holds() {
        let ms = Duration::from_millis;
        assert_eq!(on_the_beat(ms(10), Duration::ZERO), Duration::ZERO, "a request not held is not delayed");
        assert_eq!(on_the_beat(ms(10), ms(1)), ms(2), "due at 11 ms: the beat at 12");
        assert_eq!(on_the_beat(ms(10), ms(3)), ms(2), "due at 13 ms: the beat at 12");
        assert_eq!(on_the_beat(ms(11), ms(0) + Duration::from_micros(900)), ms(1), "due at 11.9: 12");
        assert_eq!(on_the_beat(ms(12), Duration::from_micros(1500)), Duration::ZERO, "due at 13.5: the beat now");

        // A client at depth 32 against 2000 IOPS: each request sleeps to
        // its beat, the rate over 10 s holds, and the wake-ups are beats.
        let start = Instant::now();
        let mut l = Limiter::new(Limits { iops: 2000, bytes_per_sec: 0 }, start);
        let mut in_flight: Vec<Duration> = vec![Duration::ZERO; 32];
        let (mut done, mut wakes) = (0u64, std::collections::BTreeSet::new());
        loop {
            // The earliest finished request comes back at once as a new one.
            in_flight.sort();
            let now = in_flight.remove(0);
            if now >= Duration::from_secs(10) {
                break;
            }
            let wake = now + on_the_beat(now, l.admit(4096, start + now));
            wakes.insert(wake);
            in_flight.push(wake);
            done += 1;
        }
        let rate = done as f64 / 10.0;
        assert!((1990.0..=2030.0).contains(&rate), "{rate}");
        assert!(wakes.len() <= 10 * 260, "{} distinct wake-ups in 10 s", wakes.len());
    }

    #[test]
    fn an_idle_bucket_saves_no_more_than_its_burst() {
        let start = Instant::now();
        let mut l = Limiter::new(Limits { iops: 100, bytes_per_sec: 0 }, start);
        let later = start + Duration::from_secs(60);
        let at_once = (0..1000).take_while(|_| l.admit(0, later).is_zero()).count();
        assert_eq!(at_once, 10, "100 ms of 100 IOPS");
    }
}
