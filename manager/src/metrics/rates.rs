//! Rates from counters: the engines count requests, bytes and latency since
//! they started, and the instance managers count CPU time; IOPS,
//! throughput, latency and CPU use are the change of those counters over
//! the last interval. The [`Sampler`] keeps one sample per series and, once
//! at least [`MIN_INTERVAL`] has passed since it, the change to the next:
//! every reader (Prometheus, the UI's charts) gets the rate of the latest
//! whole interval, however often it asks.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Rates are taken over at least this long.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// A series nobody asked for this long is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// How counters changed over an interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Delta {
    pub seconds: f64,
    pub counters: Vec<u64>,
}

impl Delta {
    /// Counter `i`'s change per second.
    pub fn per_second(&self, i: usize) -> f64 {
        if self.seconds <= 0.0 { 0.0 } else { self.counters.get(i).copied().unwrap_or(0) as f64 / self.seconds }
    }

    /// Counter `num`'s change per unit of counter `den`'s (0 when `den`
    /// did not move): e.g. latency nanoseconds per request.
    pub fn ratio(&self, num: usize, den: usize) -> f64 {
        match self.counters.get(den).copied().unwrap_or(0) {
            0 => 0.0,
            d => self.counters.get(num).copied().unwrap_or(0) as f64 / d as f64,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Series {
    at: Instant,
    counters: Vec<u64>,
    last: Option<Delta>,
}

/// The next state of a series given a new reading: a new delta once
/// [`MIN_INTERVAL`] has passed; a counter that went down (the process
/// restarted) starts the series over.
fn advance(series: Option<Series>, at: Instant, counters: Vec<u64>) -> Series {
    let Some(old) = series else { return Series { at, counters, last: None } };
    let restarted = old.counters.len() != counters.len() || old.counters.iter().zip(&counters).any(|(a, b)| b < a);
    if restarted {
        return Series { at, counters, last: None };
    }
    let elapsed = at.saturating_duration_since(old.at);
    if elapsed < MIN_INTERVAL {
        return old;
    }
    let delta = Delta {
        seconds: elapsed.as_secs_f64(),
        counters: old.counters.iter().zip(&counters).map(|(a, b)| b - a).collect(),
    };
    Series { at, counters, last: Some(delta) }
}

#[derive(Default)]
pub struct Sampler {
    series: Mutex<HashMap<String, Series>>,
}

impl Sampler {
    /// Records a reading of series `key` and answers its latest whole
    /// interval (None until two readings [`MIN_INTERVAL`] apart were seen).
    pub fn observe(&self, key: &str, counters: Vec<u64>, at: Instant) -> Option<Delta> {
        let mut all = self.series.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|_, s| at.saturating_duration_since(s.at) < FORGET_AFTER);
        let next = advance(all.remove(key), at, counters);
        let delta = next.last.clone();
        all.insert(key.to_string(), next);
        delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_the_change_over_the_last_whole_interval() {
        let s = Sampler::default();
        let t0 = Instant::now();
        assert_eq!(s.observe("v", vec![100, 4096], t0), None, "one reading is no rate");
        assert_eq!(s.observe("v", vec![150, 8192], t0 + Duration::from_millis(300)), None, "too soon");
        let d = s.observe("v", vec![300, 12288], t0 + Duration::from_secs(2)).expect("a delta");
        assert_eq!(d.counters, vec![200, 8192]);
        assert_eq!(d.per_second(0), 100.0);
        assert_eq!(d.ratio(1, 0), 40.96);
        // Asked again soon after: the same interval's answer.
        assert_eq!(s.observe("v", vec![310, 12288], t0 + Duration::from_millis(2500)), Some(d));
    }

    #[test]
    fn a_counter_going_down_starts_the_series_over() {
        let s = Sampler::default();
        let t0 = Instant::now();
        s.observe("v", vec![500], t0);
        assert_eq!(s.observe("v", vec![10], t0 + Duration::from_secs(2)), None);
        let d = s.observe("v", vec![40], t0 + Duration::from_secs(5)).unwrap();
        assert_eq!(d.per_second(0), 10.0);
        assert_eq!(Delta { seconds: 1.0, counters: vec![0, 0] }.ratio(1, 0), 0.0, "no requests, no latency");
    }
}
