//! The checker's workload: threads that write stamped 4 KiB blocks to a
//! volume over NBD, flush at intervals, and remember what was acknowledged
//! and what was flushed; it rides through errors and dropped connections
//! (reconnecting to wherever the manager says the volume's endpoint now
//! is), and at the end every block is read back and judged.
//!
//! Each thread owns the blocks congruent to its index, so no two writes to
//! one block are ever in flight together and a block's history is in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::nbd::{Conn, NbdError};
use super::rng::Rng;
use super::stamp::{self, Found, History, Verdict};
use crate::BLOCK;

/// Tells the workload where the volume is served now (None: not yet).
pub type Endpoint = Arc<dyn Fn() -> Option<String> + Send + Sync>;

#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Blocks 0..blocks of the volume are written.
    pub blocks: u64,
    pub threads: u64,
    /// Each thread flushes after this many of its writes.
    pub flush_every: u64,
    pub seed: u64,
    /// The network namespace the client runs in (the engine's node), if any.
    pub netns: Option<String>,
    /// How long one request may take before the connection is given up.
    pub io_timeout: Duration,
    /// Each thread first writes every one of its blocks once, in order
    /// (`Counters::filled` counts them), then goes on at random.
    pub fill_first: bool,
}

#[derive(Default, Debug)]
pub struct Counters {
    pub acked: AtomicU64,
    pub errors: AtomicU64,
    pub reconnects: AtomicU64,
    pub flushes: AtomicU64,
    /// Blocks written by the fill (`WorkloadConfig::fill_first`).
    pub filled: AtomicU64,
}

pub struct Workload {
    stop: Arc<AtomicBool>,
    pub counters: Arc<Counters>,
    threads: Vec<JoinHandle<HashMap<u64, History>>>,
}

/// Moves the calling thread into network namespace `name`.
pub fn enter_netns(name: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let handle = std::fs::File::open(format!("/run/netns/{name}"))?;
    // SAFETY: setns on an open namespace descriptor; only this thread moves.
    if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Connects to the volume's current endpoint, retrying until `stop`.
fn reconnect(endpoint: &Endpoint, timeout: Duration, stop: &AtomicBool) -> Option<Conn> {
    while !stop.load(Ordering::Relaxed) {
        if let Some(uri) = endpoint()
            && let Ok(c) = Conn::connect(&uri, timeout)
        {
            return Some(c);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

fn writer(
    index: u64,
    config: WorkloadConfig,
    endpoint: Endpoint,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    seq: Arc<AtomicU64>,
) -> HashMap<u64, History> {
    if let Some(ns) = &config.netns {
        enter_netns(ns).unwrap_or_else(|e| panic!("enter network namespace {ns}: {e}"));
    }
    let mut rng = Rng::derive(config.seed, &format!("writer-{index}"));
    let mut histories: HashMap<u64, History> = HashMap::new();
    let mut unflushed: Vec<u64> = Vec::new();
    let mine = config.blocks.div_ceil(config.threads);
    let mut conn: Option<Conn> = None;
    let mut since_flush = 0;
    let mut next_fill = if config.fill_first { 0 } else { mine };
    while !stop.load(Ordering::Relaxed) {
        let Some(c) = conn.as_mut() else {
            conn = reconnect(&endpoint, config.io_timeout, &stop);
            if conn.is_some() {
                counters.reconnects.fetch_add(1, Ordering::Relaxed);
            }
            // A flush covers the writes its own connection saw completed:
            // those acknowledged on a lost connection stay unflushed (a
            // crash of every replica may roll them back).
            unflushed.clear();
            since_flush = 0;
            continue;
        };
        let filling = next_fill < mine;
        let block = index + config.threads * if filling { next_fill } else { rng.below(mine) };
        if block >= config.blocks {
            next_fill += u64::from(filling);
            continue;
        }
        let s = seq.fetch_add(1, Ordering::Relaxed);
        let history = histories.entry(block).or_default();
        let result = c.write(block * BLOCK as u64, &stamp::stamp(block, s));
        history.writes.push((s, result.is_ok()));
        match result {
            Ok(()) => {
                counters.acked.fetch_add(1, Ordering::Relaxed);
                if filling {
                    next_fill += 1;
                    counters.filled.fetch_add(1, Ordering::Relaxed);
                }
                unflushed.push(block);
                since_flush += 1;
            }
            Err(e) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                if matches!(e, NbdError::Connection(_)) {
                    conn = None;
                } else {
                    std::thread::sleep(Duration::from_millis(50));
                }
                continue;
            }
        }
        if since_flush >= config.flush_every {
            match c.flush() {
                Ok(()) => {
                    counters.flushes.fetch_add(1, Ordering::Relaxed);
                    for b in unflushed.drain(..) {
                        let h = histories.get_mut(&b).expect("written");
                        h.flushed = h.last_acked();
                    }
                    since_flush = 0;
                }
                Err(e) => {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    if matches!(e, NbdError::Connection(_)) {
                        conn = None;
                    }
                }
            }
        }
    }
    histories
}

impl Workload {
    /// Starts the writers. `endpoint` is asked from a thread of its own that
    /// stays in this namespace (it may run the CLI against the manager,
    /// which the writers' namespace may not reach); writers read its answer.
    pub fn start(config: WorkloadConfig, endpoint: Endpoint) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let current: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        {
            let (stop, current) = (stop.clone(), current.clone());
            std::thread::Builder::new()
                .name("endpoint".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let now = endpoint();
                        *current.lock().expect("endpoint lock") = now;
                        std::thread::sleep(Duration::from_millis(300));
                    }
                })
                .expect("spawn the endpoint watcher");
        }
        let endpoint: Endpoint = Arc::new(move || current.lock().expect("endpoint lock").clone());
        let counters = Arc::new(Counters::default());
        let seq = Arc::new(AtomicU64::new(1));
        let threads = (0..config.threads)
            .map(|i| {
                let (config, endpoint, stop, counters, seq) =
                    (config.clone(), endpoint.clone(), stop.clone(), counters.clone(), seq.clone());
                std::thread::Builder::new()
                    .name(format!("writer-{i}"))
                    .spawn(move || writer(i, config, endpoint, stop, counters, seq))
                    .expect("spawn a writer")
            })
            .collect();
        Workload { stop, counters, threads }
    }

    /// A workload with no writers (a placeholder until one starts).
    pub fn idle() -> Workload {
        Workload { stop: Arc::new(AtomicBool::new(true)), counters: Arc::default(), threads: vec![] }
    }

    pub fn acked(&self) -> u64 {
        self.counters.acked.load(Ordering::Relaxed)
    }

    pub fn errors(&self) -> u64 {
        self.counters.errors.load(Ordering::Relaxed)
    }

    /// Waits until `more` writes beyond those acknowledged now are
    /// acknowledged, every writer still running: the workload is
    /// observably in flight. An error if a writer ended or `timeout` passed.
    pub fn wait_acked(&self, more: u64, timeout: Duration) -> Result<u64, String> {
        let target = self.acked() + more;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(i) = self.threads.iter().position(|t| t.is_finished()) {
                return Err(format!("writer {i} ended before {target} writes were acknowledged"));
            }
            let done = self.acked();
            if done >= target {
                return Ok(done);
            }
            if Instant::now() > deadline {
                return Err(format!("only {done} of {target} writes acknowledged within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the writers; every block's history.
    pub fn finish(mut self) -> Result<HashMap<u64, History>, String> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = HashMap::new();
        for (i, t) in std::mem::take(&mut self.threads).into_iter().enumerate() {
            all.extend(t.join().map_err(|_| format!("writer {i} panicked"))?);
        }
        Ok(all)
    }
}

impl Drop for Workload {
    /// Writers of an abandoned run stop at their next request.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Blocks judged, by verdict; `lost` names each lost block.
#[derive(Debug, Default)]
pub struct Tally {
    pub good: u64,
    pub unacked_landed: u64,
    pub rolled_back: u64,
    pub lost: Vec<(u64, String, String)>,
}

/// Reads blocks 0..blocks from `uri` (inside `netns`) and judges each.
pub fn verify(
    uri: &str,
    netns: Option<&str>,
    blocks: u64,
    histories: &HashMap<u64, History>,
    crash_all: bool,
) -> Result<Tally, String> {
    let (uri, netns) = (uri.to_string(), netns.map(str::to_string));
    let histories = histories.clone();
    // A thread of its own: entering the namespace is per thread.
    std::thread::spawn(move || {
        if let Some(ns) = &netns {
            enter_netns(ns).map_err(|e| format!("enter {ns}: {e}"))?;
        }
        let mut c = Conn::connect(&uri, Duration::from_secs(60)).map_err(|e| format!("connect {uri}: {e}"))?;
        let mut tally = Tally::default();
        let empty = History::default();
        const CHUNK: u64 = 64;
        for first in (0..blocks).step_by(CHUNK as usize) {
            let n = CHUNK.min(blocks - first);
            let data = c
                .read(first * BLOCK as u64, (n * BLOCK as u64) as u32)
                .map_err(|e| format!("read blocks {first}..{}: {e}", first + n))?;
            for (i, block_data) in data.chunks(BLOCK).enumerate() {
                let block = first + i as u64;
                let found: Found = stamp::parse(block_data);
                match stamp::classify(block, histories.get(&block).unwrap_or(&empty), &found, crash_all) {
                    Verdict::Good => tally.good += 1,
                    Verdict::UnackedLanded => tally.unacked_landed += 1,
                    Verdict::RolledBack => tally.rolled_back += 1,
                    Verdict::Lost { expected, found } => tally.lost.push((block, expected, found)),
                }
            }
        }
        Ok(tally)
    })
    .join()
    .map_err(|_| "the verifier panicked".to_string())?
}
