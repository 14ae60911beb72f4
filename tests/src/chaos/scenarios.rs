//! The matrix: each scenario is a fault done to a running volume under the
//! checker's workload. The runner starts the workload, waits until writes
//! are observably in flight, calls the scenario's `fault` (which injects the
//! fault, holds it, and lifts it), then waits for `robustness: healthy`
//! with no human help, writes more, and reads every block back.
//!
//! Targets (which replica, which moment) come from the scenario's seeded
//! generator, so one seed replays one fault schedule.

use std::time::Duration;

use ironhorn_proto::replica::{FaultAction, FaultOp};

use std::sync::atomic::Ordering;

use super::ctx::{Ctx, ENGINE_NODE, RELAY_NODE, Replica};
use super::faults;
use super::relay::Delay;

pub type Fault = fn(&mut Ctx) -> Result<(), String>;

pub struct Scenario {
    pub name: &'static str,
    /// What passing it shows.
    pub proves: &'static str,
    /// Every replica (or the whole cluster) dies at once: acknowledged but
    /// unflushed writes may roll back.
    pub crash_all: bool,
    /// The engine's connections to `RELAY_NODE` go through a delay relay
    /// (`ctx.relay`) from before the volume attaches.
    pub relay: bool,
    /// The workload writes every block once before it writes at random.
    pub fill: bool,
    pub fault: Fault,
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "kill-replica",
        proves: "a replica's process killed under load: I/O goes on, the replica is reused and rebuilt",
        crash_all: false,
        relay: false,
        fill: false,
        fault: kill_one_replica,
    },
    Scenario {
        name: "kill-two-replicas",
        proves: "two of three replicas killed at once: the last one serves alone, both come back",
        crash_all: false,
        relay: false,
        fill: false,
        fault: kill_two_replicas,
    },
    Scenario {
        name: "kill-each-replica",
        proves: "every replica killed one after another: the volume faults, is salvaged, and keeps every flushed write",
        crash_all: true,
        relay: false,
        fill: false,
        fault: kill_each_replica,
    },
    Scenario {
        name: "kill-engine",
        proves: "the engine killed: the manager starts a new one at a higher epoch and the client reconnects",
        crash_all: false,
        relay: false,
        fill: false,
        fault: kill_engine,
    },
    Scenario {
        name: "kill-instance-manager",
        proves: "the engine node's instance manager killed: the serving engine is neither replaced nor re-epoched",
        crash_all: false,
        relay: false,
        fill: false,
        fault: kill_instance_manager,
    },
    Scenario {
        name: "instance-manager-hung",
        proves: "the engine node's instance manager frozen (SIGSTOP) for a while: the engine keeps serving, unreplaced",
        crash_all: false,
        relay: false,
        fill: false,
        fault: instance_manager_hung,
    },
    Scenario {
        name: "kill-manager",
        proves: "the manager killed and restarted: the data path never notices, the new manager adopts everything",
        crash_all: false,
        relay: false,
        fill: false,
        fault: kill_manager,
    },
    Scenario {
        name: "kill-node",
        proves: "a replica node dies whole (every process, link down) and comes back: its replica is rebuilt",
        crash_all: false,
        relay: false,
        fill: false,
        fault: kill_node,
    },
    Scenario {
        name: "partition-replica",
        proves: "engine and one replica cut apart, then healed: the replica is reused with a delta rebuild",
        crash_all: false,
        relay: false,
        fill: false,
        fault: partition_replica,
    },
    Scenario {
        name: "manager-cut",
        proves: "the engine's node cut from the manager: the volume keeps serving writes all along",
        crash_all: false,
        relay: false,
        fill: false,
        fault: manager_cut,
    },
    Scenario {
        name: "one-way-partition",
        proves: "a replica's node can hear the engine but not answer: the replica is failed, then rebuilt",
        crash_all: false,
        relay: false,
        fill: false,
        fault: one_way_partition,
    },
    Scenario {
        name: "slow-link",
        proves: "one replica's link narrowed to a queue of hundreds of ms: writes go on, nothing is lost",
        crash_all: false,
        relay: false,
        fill: false,
        fault: slow_link,
    },
    Scenario {
        name: "link-latency",
        proves: "one replica's answers delayed 200 ms ± 50 ms (jittered) on its link: writes go on, the replica stays, nothing is lost",
        crash_all: false,
        relay: true,
        fill: false,
        fault: link_latency,
    },
    Scenario {
        name: "packet-loss",
        proves: "10 % of packets dropped on one replica's node: TCP rides it or the replica is rebuilt",
        crash_all: false,
        relay: false,
        fill: false,
        fault: packet_loss,
    },
    Scenario {
        name: "link-flap",
        proves: "a replica's link flapping every few seconds: retries back off, the volume ends healthy",
        crash_all: false,
        relay: false,
        fill: false,
        fault: link_flap,
    },
    Scenario {
        name: "replica-disk-eio",
        proves: "one replica's disk fails writes with EIO: that replica alone is failed and rebuilt",
        crash_all: false,
        relay: false,
        fill: false,
        fault: replica_disk_eio,
    },
    Scenario {
        name: "replica-disk-full",
        proves: "one replica's disk answers ENOSPC: that replica alone is failed, nothing acknowledged is lost",
        crash_all: false,
        relay: false,
        fill: false,
        fault: replica_disk_full,
    },
    Scenario {
        name: "replica-disk-slow",
        proves: "one replica's disk answers after 50-250 ms (jittered): writes go on, nothing is lost",
        crash_all: false,
        relay: false,
        fill: false,
        fault: replica_disk_slow,
    },
    Scenario {
        name: "replica-torn-write",
        proves: "a replica's write lands half and fails: the replica is failed and rebuilt, the half never shows",
        crash_all: false,
        relay: false,
        fill: false,
        fault: replica_torn_write,
    },
    Scenario {
        name: "bit-rot-at-rest",
        proves: "flipped bits in a snapshot of one replica (data nobody reads): a scrub finds every one, \
                 repairs each in place from a healthy replica, the replica stays RW, events say so",
        crash_all: false,
        relay: false,
        fill: false,
        fault: bit_rot_at_rest,
    },
    Scenario {
        name: "bit-rot-live",
        proves: "flipped bits in the live data of one replica under load: no wrong byte is ever returned, \
                 reads and a scrub repair them in place, the replica stays RW, nothing bad is left",
        crash_all: false,
        relay: false,
        fill: false,
        fault: bit_rot_live,
    },
    Scenario {
        name: "kill-rebuilding-replica",
        proves: "a replica killed during its own rebuild: it is rebuilt again",
        crash_all: false,
        relay: false,
        fill: false,
        fault: kill_rebuilding_replica,
    },
    Scenario {
        name: "kill-rebuild-source",
        proves: "the rebuild's source killed mid-rebuild: the rebuild finishes from another or restarts",
        crash_all: false,
        relay: false,
        fill: false,
        fault: kill_rebuild_source,
    },
    Scenario {
        name: "rebuild-under-rewrite",
        proves: "a new replica rebuilt slowly while the workload rewrites the full volume: no write fails for space",
        crash_all: false,
        relay: false,
        fill: true,
        fault: rebuild_under_rewrite,
    },
    Scenario {
        name: "manager-restart-during-rebuild",
        proves: "the manager killed and restarted while a replica rebuilds: the rebuild finishes",
        crash_all: false,
        relay: false,
        fill: false,
        fault: manager_restart_during_rebuild,
    },
    Scenario {
        name: "old-engine-fenced",
        proves: "an engine frozen (SIGSTOP) and cut off while the volume moves to a new engine elsewhere, then \
                 woken: whatever it still sends is refused or repaired, nothing lands over newer data",
        crash_all: false,
        relay: false,
        fill: false,
        fault: old_engine_fenced,
    },
    Scenario {
        name: "power-loss",
        proves: "every process of the cluster killed at once, then `up` again: every flushed write is there",
        crash_all: true,
        relay: false,
        fill: false,
        fault: power_loss,
    },
];

pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

fn kill_replica(ctx: &mut Ctx, r: &Replica) -> Result<(), String> {
    ctx.note(format!("kill -9 {} on {}", r.name, r.node));
    faults::kill9(ctx.pid(&r.node, &r.name)?)
}

fn first_remote(ctx: &mut Ctx) -> Result<Replica, String> {
    let r = ctx.remote_replicas().into_iter().next().ok_or_else(|| "no replica off the engine's node".to_string())?;
    ctx.note(format!("target {} on {}", r.name, r.node));
    Ok(r)
}

fn kill_one_replica(ctx: &mut Ctx) -> Result<(), String> {
    let r = first_remote(ctx)?;
    kill_replica(ctx, &r)?;
    ctx.wait_degraded()?;
    ctx.in_flight(100).map(drop)
}

fn kill_two_replicas(ctx: &mut Ctx) -> Result<(), String> {
    let remote = ctx.remote_replicas();
    for r in remote.iter().take(2).collect::<Vec<_>>() {
        kill_replica(ctx, r)?;
    }
    ctx.wait_degraded()?;
    ctx.in_flight(100).map(drop)
}

fn kill_each_replica(ctx: &mut Ctx) -> Result<(), String> {
    let mut all = ctx.replicas();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    ctx.shuffle(&mut all);
    for r in &all {
        kill_replica(ctx, r)?;
        ctx.pause_between(200, 1500);
    }
    ctx.wait_degraded()
}

fn kill_engine(ctx: &mut Ctx) -> Result<(), String> {
    let (name, pid) = ctx.engine()?;
    let before = ctx.engine_epoch(&name)?;
    faults::kill9(pid)?;
    ctx.until(Duration::from_secs(60), "a new engine serving at a higher epoch", |c| {
        c.engine().is_ok_and(|(n, p)| p != pid && c.engine_epoch(&n).is_ok_and(|e| e > before))
    })?;
    ctx.until(Duration::from_secs(10), "an EngineRestarted event", |c| {
        c.events().iter().any(|e| e["reason"] == "EngineRestarted")
    })?;
    ctx.in_flight(100).map(drop)
}

fn kill_instance_manager(ctx: &mut Ctx) -> Result<(), String> {
    let (name, pid) = ctx.engine()?;
    let epoch = ctx.engine_epoch(&name)?;
    let im = ctx.im_pid(ENGINE_NODE)?;
    faults::kill9(im)?;
    // Writes go on while the instance manager is away and after `up`
    // brought it back.
    ctx.in_flight(200)?;
    ctx.until(Duration::from_secs(30), "the instance manager back", |c| c.im_pid(ENGINE_NODE).is_ok_and(|p| p != im))?;
    ctx.hold();
    ctx.in_flight(100)?;
    same_engine(ctx, &name, pid, epoch)
}

fn instance_manager_hung(ctx: &mut Ctx) -> Result<(), String> {
    let (name, pid) = ctx.engine()?;
    let epoch = ctx.engine_epoch(&name)?;
    let im = ctx.im_pid(ENGINE_NODE)?;
    faults::signal(im, libc::SIGSTOP)?;
    let served = ctx.in_flight(100);
    std::thread::sleep(ctx.duration * 2);
    let more = ctx.in_flight(100);
    faults::signal(im, libc::SIGCONT)?;
    served.and(more).map_err(|e| format!("writes stopped while the instance manager was frozen: {e}"))?;
    ctx.hold();
    ctx.in_flight(100)?;
    same_engine(ctx, &name, pid, epoch)
}

/// The serving engine is still `name` at `pid` and `epoch`.
fn same_engine(ctx: &Ctx, name: &str, pid: u32, epoch: u64) -> Result<(), String> {
    let (now, now_pid) = ctx.engine()?;
    if now != name || now_pid != pid {
        return Err(format!("the serving engine {name} (pid {pid}) was replaced by {now} (pid {now_pid})"));
    }
    let now_epoch = ctx.engine_epoch(&now)?;
    if now_epoch != epoch {
        return Err(format!("engine {name} went from epoch {epoch} to {now_epoch} without being restarted"));
    }
    Ok(())
}

fn kill_manager(ctx: &mut Ctx) -> Result<(), String> {
    ctx.cluster.kill9_up();
    ctx.in_flight(200)?;
    ctx.hold();
    ctx.cluster.start_up();
    ctx.in_flight(100).map(drop)
}

fn replica_node(ctx: &mut Ctx) -> Result<(Replica, String), String> {
    let r = first_remote(ctx)?;
    let ns = ctx.netns(&r.node)?;
    Ok((r, ns))
}

fn kill_node(ctx: &mut Ctx) -> Result<(), String> {
    let (r, ns) = replica_node(ctx)?;
    let im = ctx.im_pid(&r.node)?;
    let pids: Vec<u32> = ctx.instances(&r.node)?.iter().filter(|i| i.pid > 0).map(|i| i.pid).collect();
    faults::link(&ns, false)?;
    faults::kill9(im)?;
    for pid in pids {
        faults::kill9(pid)?;
    }
    ctx.wait_degraded()?;
    ctx.in_flight(100)?;
    ctx.hold();
    faults::heal(&ns)?;
    ctx.in_flight(100).map(drop)
}

/// Puts a network fault on one replica's node (`fault` gets its namespace
/// and the engine node's address), holds it under load — from when the
/// volume shows it, when it `degrades` the volume — and lifts it.
fn on_replica_node(
    ctx: &mut Ctx,
    degrades: bool,
    fault: impl FnOnce(&mut Ctx, &str, &str) -> Result<(), String>,
) -> Result<Replica, String> {
    let (r, ns) = replica_node(ctx)?;
    let engine_ip = ctx.node_ip(ENGINE_NODE)?;
    fault(ctx, &ns, &engine_ip)?;
    if degrades {
        ctx.wait_degraded()?;
    }
    ctx.in_flight(100)?;
    ctx.hold();
    faults::heal(&ns)?;
    Ok(r)
}

fn partition_replica(ctx: &mut Ctx) -> Result<(), String> {
    let r = on_replica_node(ctx, true, |_, ns, engine| faults::partition(ns, engine))?;
    // The replica comes back with a delta rebuild: only what was written
    // while it was away is copied, not the volume.
    ctx.wait_healthy(Duration::from_secs(120))?;
    let events = ctx.events();
    let finished = events
        .iter()
        .filter_map(|e| e["message"].as_str())
        .filter(|m| m.starts_with(&format!("rebuild of {} finished", r.name)))
        .next_back()
        .ok_or_else(|| format!("no RebuildFinished event for {}", r.name))?;
    if !finished.contains("dirty-map") {
        return Err(format!("the rebuild after the partition was not a delta rebuild: {finished}"));
    }
    Ok(())
}

fn manager_cut(ctx: &mut Ctx) -> Result<(), String> {
    let ns = ctx.netns(ENGINE_NODE)?;
    let manager = ctx.manager_ip()?;
    let (name, pid) = ctx.engine()?;
    let epoch = ctx.engine_epoch(&name)?;
    faults::partition(&ns, &manager)?;
    // The volume keeps serving while the manager cannot reach its node.
    let served = ctx.workload.wait_acked(1, Duration::from_secs(30));
    ctx.hold();
    let more = ctx.in_flight(100);
    faults::heal(&ns)?;
    served.and(more).map_err(|e| format!("writes stopped while the manager was cut off: {e}"))?;
    ctx.hold();
    same_engine(ctx, &name, pid, epoch)
}

fn one_way_partition(ctx: &mut Ctx) -> Result<(), String> {
    on_replica_node(ctx, true, |_, ns, engine| faults::partition_one_way(ns, engine)).map(drop)
}

fn slow_link(ctx: &mut Ctx) -> Result<(), String> {
    on_replica_node(ctx, false, |c, ns, _| {
        let latency = c.rng.between(150, 250) as u32;
        c.note(format!("link queue {latency} ms"));
        faults::slow_link(ns, 20_000, latency)
    })
    .map(drop)
}

fn link_latency(ctx: &mut Ctx) -> Result<(), String> {
    // 200 ms ± 50 ms, each read's delay drawn from the relay's seeded
    // generator.
    let delay = Delay { lo_ms: 150, hi_ms: 250 };
    ctx.note(format!("{RELAY_NODE}'s answers delayed {}-{} ms", delay.lo_ms, delay.hi_ms));
    let modes = ctx.replica_modes();
    let relay = ctx.relay.as_ref().ok_or("link-latency needs the relay (Scenario.relay)")?;
    let connections = relay.counters().connections.load(Ordering::Relaxed);
    if connections == 0 {
        return Err(format!("no connection of the engine to {RELAY_NODE} went through the relay"));
    }
    let delayed_before = relay.counters().delayed.load(Ordering::Relaxed);
    relay.set_delay(Some(delay));
    // The fault is in effect once answers are observably being held back.
    let held = ctx.until(Duration::from_secs(30), "the relay delaying the replica's answers", |c| {
        c.relay.as_ref().is_some_and(|r| r.counters().delayed.load(Ordering::Relaxed) >= delayed_before + 50)
    });
    let served = held.and_then(|()| {
        ctx.hold();
        ctx.in_flight(100)
    });
    let relay = ctx.relay.as_ref().ok_or("relay gone")?;
    relay.set_delay(None);
    served.map_err(|e| format!("writes under latency: {e}"))?;
    let c = relay.counters();
    let (n, total) = (c.delayed.load(Ordering::Relaxed) - delayed_before, c.delay_ms.load(Ordering::Relaxed));
    ctx.note(format!("{n} answers delayed, {:.0} ms on average", total as f64 / n.max(1) as f64));
    // Latency is not a failure: no replica may have left RW for it.
    let after = ctx.replica_modes();
    if after != modes {
        return Err(format!("replicas changed under latency: {modes:?} -> {after:?}"));
    }
    Ok(())
}

fn packet_loss(ctx: &mut Ctx) -> Result<(), String> {
    on_replica_node(ctx, false, |_, ns, _| faults::packet_loss(ns, 10)).map(drop)
}

fn link_flap(ctx: &mut Ctx) -> Result<(), String> {
    let (_, ns) = replica_node(ctx)?;
    let count = |c: &Ctx, reason: &str| c.events().iter().filter(|e| e["reason"] == reason).count();
    let (failed, rebuilt) = (count(ctx, "ReplicaFailed"), count(ctx, "RebuildStarted"));
    // As many flaps as the seeded pauses fit in twice the hold: the count
    // comes from the seed, not the clock, so a seed replays it exactly.
    let mut budget = ctx.duration.as_millis() as u64 * 2;
    let mut flaps = 0;
    while budget > 0 {
        faults::link(&ns, false)?;
        let down = ctx.pause_between(500, 1500);
        faults::link(&ns, true)?;
        let up = ctx.pause_between(1500, 3000);
        budget = budget.saturating_sub(down + up);
        flaps += 1;
    }
    faults::heal(&ns)?;
    // Outages shorter than the engine's replica timeout are ridden out:
    // at most one failure and one rebuild for the whole flapping, not one
    // per flap.
    let (failed, rebuilt) = (count(ctx, "ReplicaFailed") - failed, count(ctx, "RebuildStarted") - rebuilt);
    ctx.note(format!("{flaps} flaps: {failed} replica failure(s), {rebuilt} rebuild(s)"));
    if failed > 1 || rebuilt > 1 {
        return Err(format!("a failure storm: {failed} failures and {rebuilt} rebuilds over {flaps} flaps"));
    }
    Ok(())
}

fn disk_fault(ctx: &mut Ctx, action: FaultAction, times: u64, delay_ms: u64) -> Result<Replica, String> {
    let r = first_remote(ctx)?;
    let before = ctx.faults_fired(&r.address)?;
    ctx.arm_fault(&r.address, &[FaultOp::Write], action, times, delay_ms)?;
    ctx.until(Duration::from_secs(60), "the armed disk fault fired under the workload", |c| {
        c.faults_fired(&r.address).is_ok_and(|n| n > before)
    })?;
    ctx.wait_degraded()?;
    Ok(r)
}

fn replica_disk_eio(ctx: &mut Ctx) -> Result<(), String> {
    disk_fault(ctx, FaultAction::Eio, 1, 0)?;
    ctx.in_flight(100).map(drop)
}

fn replica_disk_full(ctx: &mut Ctx) -> Result<(), String> {
    disk_fault(ctx, FaultAction::NoSpace, 1, 0)?;
    ctx.in_flight(100).map(drop)
}

fn replica_torn_write(ctx: &mut Ctx) -> Result<(), String> {
    disk_fault(ctx, FaultAction::Torn, 1, 0)?;
    ctx.in_flight(100).map(drop)
}

fn replica_disk_slow(ctx: &mut Ctx) -> Result<(), String> {
    let r = first_remote(ctx)?;
    // Jitter: a run of faults of seeded delays, each for some writes; two
    // rounds per second of the hold (a count, so a seed replays it).
    for _ in 0..(ctx.duration.as_secs() * 2).max(1) {
        let delay = ctx.rng.between(50, 250);
        ctx.note(format!("disk delay {delay} ms x5"));
        let before = ctx.faults_fired(&r.address)?;
        ctx.arm_fault(&r.address, &[FaultOp::Write, FaultOp::Sync], FaultAction::Delay, 5, delay)?;
        ctx.until(Duration::from_secs(30), "the delay fired", |c| {
            c.faults_fired(&r.address).is_ok_and(|n| n >= before + 5)
        })?;
    }
    ctx.clear_faults(&r.address)?;
    ctx.in_flight(100).map(drop)
}

/// Asks the manager for a scrub under load and waits for its end; while it
/// runs the volume must stay healthy (no replica failed for a bad block).
/// Returns the volume object after it, checked: every bad block the engine
/// found was repaired, the target replica reads back clean by itself, and
/// the events tell of the repair and the scrub.
fn scrub_and_check(ctx: &mut Ctx, target: &Replica) -> Result<serde_json::Value, String> {
    let mut scrub = std::process::Command::new(crate::binary("ironhorn"))
        .args(["--api", &ctx.cluster.api, "volume", "scrub", &ctx.volume])
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("ironhorn volume scrub: {e}"))?;
    let ended = loop {
        if let Some(status) = scrub.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        // (A manager that does not answer one poll proves nothing.)
        if let Ok(v) = ctx.volume_object()
            && v["status"]["robustness"] != "healthy"
        {
            let _ = scrub.kill();
            let _ = scrub.wait();
            return Err(format!("the volume left healthy during the scrub: {}", v["status"]));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !ended.success() {
        return Err(format!("ironhorn volume scrub failed ({ended}): {}", ctx.volume_object()?["status"]["scrub"]));
    }
    let v = ctx.volume_object()?;
    let status = &v["status"];
    if status["scrub"]["state"] != "done" {
        return Err(format!("scrub did not end done: {}", status["scrub"]));
    }
    if status["badBlocksFound"] != status["badBlocksRepaired"] {
        return Err(format!("found and repaired differ: {status}"));
    }
    let left = ctx.replica_bad_blocks(&target.address)?;
    if left != 0 {
        return Err(format!("replica {} still reads back {left} bad block(s) after the scrub", target.name));
    }
    let reasons: Vec<String> = ctx.events().iter().filter_map(|e| e["reason"].as_str().map(String::from)).collect();
    for want in ["BadBlocksRepaired", "ScrubStarted", "ScrubFinished"] {
        if !reasons.iter().any(|r| r == want) {
            return Err(format!("no {want} event: {reasons:?}"));
        }
    }
    if reasons.iter().any(|r| r == "ReplicaFailed" || r == "RebuildStarted") {
        return Err(format!("a replica was failed or rebuilt for bad blocks: {reasons:?}"));
    }
    Ok(v)
}

fn bit_rot_at_rest(ctx: &mut Ctx) -> Result<(), String> {
    let r = first_remote(ctx)?;
    ctx.cluster.cli(&["snapshot", "create", &ctx.volume, "at-rest"])?;
    let blocks = ctx.rng.between(8, 32) as u32;
    let seed = ctx.rng.between(1, 1 << 30);
    ctx.note(format!("flip {blocks} blocks of the snapshot, seed {seed}"));
    // Retried until the snapshot reached the replica (it has sealed blocks).
    let mut flipped = Vec::new();
    ctx.until(Duration::from_secs(60), "the snapshot on the replica, its blocks flipped", |c| {
        match c.flip_bits(&r.address, blocks, seed, true) {
            Ok(f) => {
                flipped = f;
                true
            }
            Err(_) => false,
        }
    })?;
    if flipped.len() != blocks as usize || flipped.iter().any(|(layer, _)| layer != "at-rest") {
        return Err(format!("flipped {flipped:?}, not {blocks} blocks of the snapshot"));
    }
    ctx.in_flight(100)?;
    let v = scrub_and_check(ctx, &r)?;
    let scrub = &v["status"]["scrub"];
    if scrub["badBlocks"].as_u64() != Some(blocks as u64) || scrub["repairedBlocks"].as_u64() != Some(blocks as u64) {
        return Err(format!(
            "the scrub found/repaired {} / {}, {blocks} were flipped",
            scrub["badBlocks"], scrub["repairedBlocks"]
        ));
    }
    ctx.cluster.cli(&["snapshot", "delete", &ctx.volume, "at-rest"]).map(drop)
}

fn bit_rot_live(ctx: &mut Ctx) -> Result<(), String> {
    let r = first_remote(ctx)?;
    let blocks = ctx.rng.between(8, 32) as u32;
    let seed = ctx.rng.between(1, 1 << 30);
    ctx.note(format!("flip {blocks} live blocks, seed {seed}"));
    let flipped = ctx.flip_bits(&r.address, blocks, seed, false)?;
    if flipped.len() != blocks as usize {
        return Err(format!("flipped {flipped:?}, not {blocks} blocks"));
    }
    ctx.in_flight(100)?;
    // Writes replace some flipped blocks before anything reads them; the
    // rest are found by reads or the scrub, and all of them repaired.
    let v = scrub_and_check(ctx, &r)?;
    let found = v["status"]["badBlocksFound"].as_u64().unwrap_or(0);
    if found == 0 || found > blocks as u64 {
        return Err(format!("{found} bad blocks found of {blocks} flipped"));
    }
    ctx.note(format!("{found} of {blocks} found before a write replaced them"));
    Ok(())
}

/// Waits until some replica of the volume is rebuilding (WO); its name.
fn rebuilding(ctx: &Ctx) -> Result<String, String> {
    let mut found = None;
    ctx.until(Duration::from_secs(120), "a replica rebuilding (WO)", |c| {
        found = c.replica_modes().into_iter().find(|(_, m)| m == "WO").map(|(n, _)| n);
        found.is_some()
    })?;
    Ok(found.expect("found"))
}

/// Kills a replica and waits until it is rebuilding. The other replicas'
/// reads (only a rebuild reads: the workload writes) are slowed first, each
/// by 500 ms until cleared, so the rebuild lasts until the scenario has
/// seen it and hit it: a rebuild copies a chunk straight from replica to
/// replica in milliseconds, and one that finished between two looks at the
/// replica modes was never seen (a fixed count of delayed reads sufficed
/// while the engine relayed each chunk). Returns the rebuilding replica's
/// name and the slowed replicas, for [`end_rebuild_delay`] once the fault
/// is in.
fn start_rebuild(ctx: &mut Ctx) -> Result<(String, Vec<Replica>), String> {
    let r = first_remote(ctx)?;
    let sources: Vec<Replica> = ctx.replicas().into_iter().filter(|o| o.name != r.name).collect();
    for s in &sources {
        ctx.arm_fault(&s.address, &[FaultOp::Read], FaultAction::Delay, 0, 500)?;
    }
    kill_replica(ctx, &r)?;
    match rebuilding(ctx) {
        Ok(target) => Ok((target, sources)),
        Err(e) => {
            end_rebuild_delay(ctx, &sources);
            Err(e)
        }
    }
}

/// Clears the read delays `start_rebuild` armed.
fn end_rebuild_delay(ctx: &Ctx, sources: &[Replica]) {
    for s in sources {
        // A source killed meanwhile has no faults to clear.
        let _ = ctx.clear_faults(&s.address);
    }
}

fn kill_rebuilding_replica(ctx: &mut Ctx) -> Result<(), String> {
    let (target, sources) = start_rebuild(ctx)?;
    let killed = match ctx.replicas().into_iter().find(|r| r.name == target) {
        Some(r) => kill_replica(ctx, &r),
        None => Err("the rebuilding replica vanished".to_string()),
    };
    end_rebuild_delay(ctx, &sources);
    killed?;
    ctx.in_flight(100).map(drop)
}

fn kill_rebuild_source(ctx: &mut Ctx) -> Result<(), String> {
    let (target, slowed) = start_rebuild(ctx)?;
    let modes = ctx.replica_modes();
    let sources: Vec<Replica> = ctx
        .replicas()
        .into_iter()
        .filter(|r| r.name != target && modes.iter().any(|(n, m)| *n == r.name && m == "RW"))
        .collect();
    // The engine's own node's replica is kept: one RW is left to serve.
    let source = sources.iter().find(|r| r.node != ENGINE_NODE).or(sources.first()).cloned();
    let killed = match source {
        _ if sources.len() < 2 => Err(format!("only {} RW replica(s) during the rebuild", sources.len())),
        None => Err("no RW replica to kill".to_string()),
        Some(source) => kill_replica(ctx, &source),
    };
    end_rebuild_delay(ctx, &slowed);
    killed?;
    ctx.in_flight(100).map(drop)
}

/// The volume full (the workload's fill), one replica dropped and a new
/// one added, copied at 4 MiB/s while the workload rewrites blocks all over
/// the volume: the rebuild's join snapshot would pin far more than the
/// stores' spare quarter. No write may fail.
fn rebuild_under_rewrite(ctx: &mut Ctx) -> Result<(), String> {
    let blocks = super::run::BLOCKS;
    ctx.until(Duration::from_secs(120), "the workload's fill of every block", |c| {
        c.workload.counters.filled.load(Ordering::Relaxed) >= blocks
    })?;
    ctx.cluster.cli(&["setting", "set", "replica-rebuild-max-mib-per-sec", "4"])?;
    let errors = ctx.workload.errors();
    let volume = ctx.volume.clone();
    ctx.cluster.cli(&["volume", "update", &volume, "--replicas", "2"])?;
    ctx.until(Duration::from_secs(60), "one replica removed", |c| c.replica_modes().len() == 2)?;
    ctx.cluster.cli(&["volume", "update", &volume, "--replicas", "3"])?;
    ctx.until(Duration::from_secs(60), "a new replica rebuilding (WO)", |c| {
        c.replica_modes().iter().any(|(_, m)| m == "WO")
    })?;
    let rewritten = ctx.workload.acked();
    ctx.until(Duration::from_secs(180), "the rebuild done, three replicas RW", |c| {
        let modes = c.replica_modes();
        modes.len() == 3 && modes.iter().all(|(_, m)| m == "RW")
    })?;
    let during = ctx.workload.acked() - rewritten;
    ctx.note(format!("{during} writes acknowledged during the rebuild"));
    if during < blocks / 4 {
        return Err(format!("only {during} writes during the rebuild: not a rewrite"));
    }
    let failed = ctx.workload.errors() - errors;
    if failed > 0 {
        return Err(format!("{failed} I/O errors during the rebuild"));
    }
    Ok(())
}

fn manager_restart_during_rebuild(ctx: &mut Ctx) -> Result<(), String> {
    let (_, slowed) = start_rebuild(ctx)?;
    ctx.cluster.kill9_up();
    end_rebuild_delay(ctx, &slowed);
    ctx.in_flight(50)?;
    ctx.cluster.start_up();
    ctx.in_flight(100).map(drop)
}

fn power_loss(ctx: &mut Ctx) -> Result<(), String> {
    let mut pids = Vec::new();
    for node in ctx.nodes() {
        pids.extend(ctx.instances(&node)?.iter().filter(|i| i.pid > 0).map(|i| i.pid));
        pids.push(ctx.im_pid(&node)?);
    }
    // Everything at once: `up` first so nothing restarts what dies.
    ctx.cluster.kill9_up();
    for pid in pids {
        faults::kill9(pid)?;
    }
    ctx.crash_all = true;
    ctx.cluster.start_up();
    ctx.in_flight(100).map(drop)
}

fn old_engine_fenced(ctx: &mut Ctx) -> Result<(), String> {
    let (name, pid) = ctx.engine()?;
    let epoch = ctx.engine_epoch(&name)?;
    let ns = ctx.netns(ENGINE_NODE)?;
    let manager = ctx.manager_ip()?;
    let to = ctx.nodes().into_iter().find(|n| n != ENGINE_NODE).ok_or("no other node")?;
    ctx.note(format!("move the volume to {to}"));
    // Frozen with the workload's requests in it, and out of the manager's
    // reach (so it cannot be stopped: only fencing keeps it out).
    faults::signal(pid, libc::SIGSTOP)?;
    faults::partition(&ns, &manager)?;
    let moved = (|| {
        // Detach returns at once here (it would wait for the old engine).
        let _ = ctx.cluster.cli(&["volume", "detach", &ctx.volume, "--timeout-secs", "1"]);
        ctx.cluster.cli(&["volume", "attach", &ctx.volume, "--node", &to, "--timeout-secs", "120"])?;
        let mut seen = String::new();
        ctx.until(Duration::from_secs(120), "a new engine serving on the other node at a higher epoch", |c| {
            let now = c.engine_placement();
            seen = format!("{now:?}");
            now.is_ok_and(|(node, e)| node == to && e > epoch)
        })
        .map_err(|e| format!("{e} (last seen: {seen})"))?;
        // The writers give up on the frozen engine and find the new one.
        ctx.in_flight(200).map(drop)
    })();
    // Woken while cut off: it goes on with what it held, at its old epoch.
    faults::signal(pid, libc::SIGCONT)?;
    moved?;
    ctx.in_flight(200)?;
    faults::heal(&ns)?;
    // Back in reach, the old engine is stopped by the manager.
    ctx.until(Duration::from_secs(60), "the old engine stopped", |_| {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    })?;
    ctx.in_flight(100).map(drop)
}
