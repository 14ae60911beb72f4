//! Per-volume I/O counters: requests, errors, bytes and a latency histogram
//! for each kind of request the frontends send (read, write, trim, flush),
//! counted where every frontend meets the replicator, so NBD and the block
//! device add up in one place. Lock-free (relaxed atomics: a reader may see
//! one counter a request ahead of another, never a torn value), cheap
//! enough for every request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ironhorn_proto::engine::OpMetrics;

/// Upper bounds of the latency buckets, in microseconds; a last, unbounded
/// bucket is implied (the request count).
pub const LATENCY_BOUNDS_US: [u64; 16] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    10_000_000,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Trim,
    Flush,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Read, Op::Write, Op::Trim, Op::Flush];

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Trim => "trim",
            Op::Flush => "flush",
        }
    }
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    latency_ns: AtomicU64,
    /// Requests per bucket (not cumulative).
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len()],
}

#[derive(Default)]
pub struct IoMetrics {
    ops: [Counters; 4],
}

impl IoMetrics {
    /// Counts one finished request that started at `started`.
    pub fn record(&self, op: Op, bytes: u64, started: Instant, ok: bool) {
        let c = &self.ops[op as usize];
        let elapsed = started.elapsed();
        let us = elapsed.as_micros() as u64;
        c.requests.fetch_add(1, Ordering::Relaxed);
        if ok {
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        c.latency_ns.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        if let Some(i) = LATENCY_BOUNDS_US.iter().position(|&bound| us <= bound) {
            c.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counters as they are now, in their wire form; `latency_buckets`
    /// is cumulative (requests that took at most `LATENCY_BOUNDS_US[i]`).
    pub fn snapshot(&self) -> Vec<OpMetrics> {
        Op::ALL
            .iter()
            .map(|&op| {
                let c = &self.ops[op as usize];
                let mut running = 0;
                let latency_buckets = c
                    .buckets
                    .iter()
                    .map(|b| {
                        running += b.load(Ordering::Relaxed);
                        running
                    })
                    .collect();
                OpMetrics {
                    op: op.name().to_string(),
                    requests: c.requests.load(Ordering::Relaxed),
                    errors: c.errors.load(Ordering::Relaxed),
                    bytes: c.bytes.load(Ordering::Relaxed),
                    latency_ns_total: c.latency_ns.load(Ordering::Relaxed),
                    latency_buckets,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn counts_bytes_errors_and_cumulative_latency_buckets() {
        let m = IoMetrics::default();
        let now = Instant::now();
        m.record(Op::Write, 4096, now, true);
        m.record(Op::Write, 8192, now, true);
        m.record(Op::Write, 4096, now, false);
        m.record(Op::Read, 4096, now - Duration::from_millis(3), true);
        let snap = m.snapshot();
        let write = snap.iter().find(|s| s.op == "write").unwrap();
        assert_eq!((write.requests, write.errors, write.bytes), (3, 1, 12288));
        let read = snap.iter().find(|s| s.op == "read").unwrap();
        assert_eq!((read.requests, read.errors, read.bytes), (1, 0, 4096));
        assert!(read.latency_ns_total >= 3_000_000);
        // 3 ms: above the 2.5 ms bound, within 5 ms, and every bound after.
        let at = |us| LATENCY_BOUNDS_US.iter().position(|&b| b == us).unwrap();
        assert_eq!(read.latency_buckets[at(2_500)], 0);
        assert_eq!(read.latency_buckets[at(5_000)], 1);
        assert_eq!(*read.latency_buckets.last().unwrap(), 1);
        assert!(write.latency_buckets.windows(2).all(|w| w[0] <= w[1]), "cumulative");
        let flush = snap.iter().find(|s| s.op == "flush").unwrap();
        assert_eq!(flush.requests, 0);
    }
}
