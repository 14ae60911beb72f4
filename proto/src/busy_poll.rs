//! Bounded busy-polling of the runtime while I/O is in flight.
//!
//! A QD1 request crosses two processes more than it does with a local NBD
//! server (engine → replica → engine), and in a VM each time a process
//! sleeps in `epoll_wait` and is woken by the next packet costs a halted
//! vCPU's wake-up: tens of µs, more than the work itself. While a request
//! is outstanding, or just after one finished (a QD1 client sends its next
//! request a few µs after the reply), the poller keeps the runtime polling
//! the reactor without sleeping, so the answer is picked up the moment it
//! lands. After a quiet spell (see [`keep_polling`]) it stops, and an idle
//! process sleeps as before: idle CPU stays at zero.
//!
//! Mechanism: one task that yields in a loop. On tokio's current-thread
//! runtime a yielded task is woken only after the scheduler has polled the
//! reactor with a zero timeout, so each turn of the loop is one
//! `epoll_wait(0)` plus the tasks it made ready.
//!
//! Two rules keep the poller from taking CPU that others need: it gives
//! its core away (`sched_yield`) after every empty turn, but not after a
//! turn that ran other tasks (see [`busy_turn`]); and it does not poll
//! at all while the machine has more threads runnable than cores (see
//! [`may_poll`]).
//!
//! `IRONHORN_POLL_US=N` sets the window after the last request (default
//! [`DEFAULT_IDLE_WINDOW`]); `0` turns polling off.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long the poller goes on after the last activity with nothing in
/// flight: the time a QD1 client takes to send its next request.
pub const DEFAULT_IDLE_WINDOW: Duration = Duration::from_micros(50);
/// How long it goes on after the last activity while requests are in
/// flight: a 4 KiB write to a disk plus the way back, with room to spare.
/// A request slower than this (a busy disk) is waited for asleep.
pub const IN_FLIGHT_WINDOW: Duration = Duration::from_micros(500);

/// Above this many requests in flight the process does not poll. At depth
/// requests overlap, so one wake-up brings a batch of answers and its cost
/// is shared; polling there only takes CPU from the processes doing the
/// work (measured: 3 replicas on 2 cores, QD32 randwrite 21.6k → 17.0k
/// IOPS with polling at every depth). A lone request is where a wake-up
/// is the whole latency.
pub const MAX_POLLED_DEPTH: usize = 2;

/// Whether to go on polling, `quiet` after the last activity with
/// `in_flight` requests outstanding, given the idle window. Never while
/// `paced`: a request is being held to an I/O limit, so its client waits
/// for the limit, not for a wake-up (a volume held to 2000 IOPS kept its
/// replica polling through each disk write: 44 % of a core, against 10 %
/// asleep, taken from the volumes beside it).
pub fn keep_polling(quiet: Duration, in_flight: usize, idle_window: Duration, paced: bool) -> bool {
    if idle_window.is_zero() || in_flight > MAX_POLLED_DEPTH || paced {
        return false;
    }
    let window = if in_flight > 0 { IN_FLIGHT_WINDOW.max(idle_window) } else { idle_window };
    quiet < window
}

/// How often a polling process looks again at how many threads the
/// machine has runnable (one `pread` of `/proc/loadavg`, 2–4 µs).
pub const CROWD_CHECK: Duration = Duration::from_millis(1);

/// Whether a process may poll, with `runnable` threads runnable on the
/// whole machine (itself among them) and `cores` CPUs. A poller holds a
/// core: where more threads want to run than there are cores, the one
/// it holds is taken from another process, a neighbour's I/O or another
/// engine's poller, and on a crowded machine polling only moves the
/// wake-up cost from one request to another's. One over the cores is
/// allowed: the client that just sent the request is often still
/// runnable for a moment while it goes to sleep.
///
/// Measured (2 cores): an unlimited volume whose client paced itself to
/// 2000 IOPS at QD1 kept its engine and replica polling through every
/// request, and a CPU-bound neighbour volume beside it kept 0.74 of its
/// rate alone (0.89 beside the same rate held by the engine's limit, which
/// does not poll).
pub fn may_poll(runnable: usize, cores: usize) -> bool {
    runnable <= cores + 1
}

/// A turn of the poller's loop (one `yield_now`: the runtime runs its
/// queued tasks and polls the reactor once) that took longer than this
/// ran other tasks: an empty turn is one `epoll_wait(0)` and costs 1–3 µs.
pub const BUSY_TURN: Duration = Duration::from_micros(6);

/// Whether a turn that took `took` did work besides polling the reactor:
/// more work is then likely queued behind it, and the poller keeps the
/// core for one more turn instead of yielding it.
pub fn busy_turn(took: Duration) -> bool {
    took > BUSY_TURN
}

struct Poller {
    activity: AtomicU64,
    in_flight: AtomicUsize,
    /// Requests being held to an I/O limit (see [`Paced`]).
    paced: AtomicUsize,
    /// Most requests in flight at once since the poller last slept.
    peak: AtomicUsize,
    polling: AtomicBool,
    wake: tokio::sync::Notify,
    idle_window: Duration,
}

fn poller() -> &'static Poller {
    static POLLER: OnceLock<Poller> = OnceLock::new();
    POLLER.get_or_init(|| {
        let idle_window = std::env::var("IRONHORN_POLL_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(DEFAULT_IDLE_WINDOW, Duration::from_micros);
        Poller {
            activity: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            paced: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            // Until `start`, nobody polls: claim the flag so `touch` never
            // wakes a task that does not exist.
            polling: AtomicBool::new(true),
            wake: tokio::sync::Notify::new(),
            idle_window,
        }
    })
}

/// Marks activity (a request started or finished, leaving `depth` in
/// flight): the poller runs, if it was asleep, for at least one window
/// from now. Cheap: two atomics, and a wake-up only when the poller was
/// asleep and could poll at this depth. At depth it would look and go back
/// to sleep, and that wake-up on every turn of a busy runtime cost 3–5 %
/// of a process's CPU at QD32 (`perf`: the task's wake and its
/// `/proc/loadavg` read); it is woken instead by the first end of a
/// request that leaves the queue shallow.
fn touch(depth: usize) {
    let p = poller();
    p.activity.fetch_add(1, Ordering::Relaxed);
    if depth > MAX_POLLED_DEPTH {
        return;
    }
    if !p.polling.swap(true, Ordering::AcqRel) {
        p.wake.notify_one();
    }
}

/// Counts a request in flight until it drops; its start is activity, and
/// so is its end.
struct InFlight;

impl InFlight {
    fn new() -> Self {
        let p = poller();
        let depth = p.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        p.peak.fetch_max(depth, Ordering::Relaxed);
        touch(depth);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let depth = poller().in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        touch(depth);
    }
}

/// Marks a request as held to an I/O limit while it lives: the process
/// does not poll meanwhile (see [`keep_polling`]).
pub struct Paced(());

impl Paced {
    pub fn new() -> Self {
        poller().paced.fetch_add(1, Ordering::Relaxed);
        Paced(())
    }
}

impl Default for Paced {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        poller().paced.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Spawns the task that serves one request (through to queueing its
/// reply), counted in flight from now until it ends: the one way the data
/// paths (NBD, the block device, the replica's data stream) tell the poller
/// about their requests.
///
/// The request's future goes to the heap on its own and the task holds a
/// pointer to it: a task's cell holds its future by value, and tokio moves
/// the whole cell in at spawn and writes the whole stage again when the
/// task ends, so a request future of a few KiB (the engine's is 3.4 KiB)
/// cost two copies of that size per request (7–9 % of the engine's CPU at
/// depth, `perf`).
pub fn spawn_request<F>(request: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let counted = InFlight::new();
    let request = Box::pin(request);
    tokio::spawn(async move {
        let output = request.await;
        drop(counted);
        output
    })
}

/// Threads runnable on the machine now, from `/proc/loadavg` (its fourth
/// field, "running/total"); `None` where it cannot be read, and then
/// polling is not limited by it.
fn runnable_now() -> Option<usize> {
    use std::os::unix::fs::FileExt;
    static LOADAVG: OnceLock<Option<std::fs::File>> = OnceLock::new();
    let file = LOADAVG.get_or_init(|| std::fs::File::open("/proc/loadavg").ok()).as_ref()?;
    let mut buf = [0u8; 128];
    let n = file.read_at(&mut buf, 0).ok()?;
    parse_runnable(std::str::from_utf8(&buf[..n]).ok()?)
}

/// The running count of a `/proc/loadavg` line ("0.52 0.61 0.70 3/412 9876").
fn parse_runnable(loadavg: &str) -> Option<usize> {
    loadavg.split_whitespace().nth(3)?.split_once('/')?.0.parse().ok()
}

/// Whether this process may poll now (see [`may_poll`]).
fn room_to_poll() -> bool {
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    runnable_now().is_none_or(|runnable| may_poll(runnable, cores))
}

/// Spawns the poller on the current runtime (once per process; its data
/// path must run on a current-thread runtime for the polling to reach the
/// reactor). Does nothing when `IRONHORN_POLL_US=0`.
pub fn start() {
    let p = poller();
    if p.idle_window.is_zero() {
        return;
    }
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(async move {
        p.polling.store(false, Ordering::Release);
        loop {
            p.wake.notified().await;
            let mut seen = p.activity.load(Ordering::Relaxed);
            let mut since = Instant::now();
            // Whether the machine has a core to spare, looked at only once
            // the other rules would poll (a `pread` of `/proc/loadavg`),
            // and again every `CROWD_CHECK` while polling.
            let mut room: Option<(bool, Instant)> = None;
            loop {
                let now = p.activity.load(Ordering::Relaxed);
                if now != seen {
                    seen = now;
                    since = Instant::now();
                }
                // The deepest the queue was since the poller last slept:
                // a burst at depth stops it before it takes any CPU.
                let depth = p.peak.load(Ordering::Relaxed).max(p.in_flight.load(Ordering::Relaxed));
                let paced = p.paced.load(Ordering::Relaxed) > 0;
                let mut wanted = keep_polling(since.elapsed(), depth, p.idle_window, paced);
                if wanted {
                    if room.is_none_or(|(_, looked)| looked.elapsed() >= CROWD_CHECK) {
                        room = Some((room_to_poll(), Instant::now()));
                    }
                    wanted = room.is_some_and(|(spare, _)| spare);
                }
                if !wanted {
                    p.peak.store(p.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
                    p.polling.store(false, Ordering::Release);
                    // Activity between the last look and giving up the
                    // flag found it still set and woke nobody: go on.
                    if p.activity.load(Ordering::Relaxed) == seen || p.polling.swap(true, Ordering::AcqRel) {
                        break;
                    }
                    continue;
                }
                let turn = Instant::now();
                tokio::task::yield_now().await;
                // Give the core to any other runnable thread, but only
                // after an empty turn: on a machine with fewer cores than
                // busy processes a poller must not hold one against the
                // process it waits for, and it must not give it away
                // either while its own runtime has work queued. The task
                // a packet or a completion wakes runs after this one in
                // the same turn (it is queued behind the poller), so a
                // yield there put a round of context switches between a
                // request's arrival and its forwarding (40–70 µs per hop
                // in a `perf` trace, engine → replica and back).
                if !busy_turn(turn.elapsed()) {
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_longer_while_requests_are_in_flight() {
        let idle = Duration::from_micros(50);
        assert!(keep_polling(Duration::from_micros(10), 0, idle, false));
        assert!(!keep_polling(Duration::from_micros(60), 0, idle, false));
        assert!(keep_polling(Duration::from_micros(60), 1, idle, false), "an answer is due");
        assert!(!keep_polling(IN_FLIGHT_WINDOW, 1, idle, false), "a slow answer is waited for asleep");
    }

    #[test]
    fn a_paced_process_does_not_poll() {
        let idle = Duration::from_micros(50);
        assert!(!keep_polling(Duration::ZERO, 1, idle, true));
        assert!(!keep_polling(Duration::ZERO, 0, idle, true));
    }

    #[test]
    fn does_not_poll_at_depth() {
        let idle = Duration::from_micros(50);
        assert!(keep_polling(Duration::ZERO, MAX_POLLED_DEPTH, idle, false));
        assert!(!keep_polling(Duration::ZERO, MAX_POLLED_DEPTH + 1, idle, false));
    }

    #[test]
    fn a_turn_that_ran_tasks_keeps_the_core() {
        assert!(!busy_turn(Duration::from_micros(2)), "an empty turn gives the core away");
        assert!(busy_turn(Duration::from_micros(40)), "a turn that ran a request keeps it");
    }

    #[test]
    fn a_crowded_machine_is_not_polled_on() {
        assert!(may_poll(1, 2), "alone");
        assert!(may_poll(3, 2), "one over: a client going to sleep");
        assert!(!may_poll(4, 2), "two more threads want to run than there are cores");
        assert!(may_poll(2, 1) && !may_poll(3, 1), "one core");
    }

    #[test]
    fn the_running_count_is_read_from_loadavg() {
        assert_eq!(parse_runnable("0.52 0.61 0.70 3/412 9876\n"), Some(3));
        assert_eq!(parse_runnable("0.52 0.61 0.70"), None);
        assert_eq!(parse_runnable("0.52 0.61 0.70 x/412 9876"), None);
        assert!(runnable_now().is_some_and(|n| n >= 1), "this test's own thread runs");
    }

    #[test]
    fn a_zero_window_never_polls() {
        assert!(!keep_polling(Duration::ZERO, 3, Duration::ZERO, false));
    }
}
