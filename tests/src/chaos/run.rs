//! Runs scenarios: each on a cluster of its own (three nodes in network
//! namespaces, replicas with fault injection), several at once, and judges
//! each by the checker. A scenario passes when its fault was done under
//! load, the volume came back to `healthy` unaided, writes went on after,
//! and no block was lost.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::ctx::{Ctx, ENGINE_NODE, RELAY_NODE, endpoint_of};
use super::relay::Relay;
use super::rng::Rng;
use super::scenarios::Scenario;
use super::workload::{self, Tally, Workload, WorkloadConfig};
use crate::StandaloneCluster;

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub seed: u64,
    /// How long a fault is held.
    pub duration: Duration,
    /// Scenarios run at once.
    pub parallel: usize,
    /// Ports from here up, 400 per scenario.
    pub port_base: u16,
    /// Longest wait for `healthy` after a fault.
    pub heal_timeout: Duration,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            seed: 1,
            duration: Duration::from_secs(10),
            parallel: 3,
            port_base: 20000,
            heal_timeout: Duration::from_secs(240),
        }
    }
}

/// One scenario's result: the row of the table.
#[derive(Debug)]
pub struct Outcome {
    pub name: &'static str,
    pub acked: u64,
    pub errors: u64,
    pub reconnects: u64,
    /// Seconds from the fault's end to `healthy`.
    pub to_healthy: Option<f64>,
    pub tally: Tally,
    /// Why it failed (None: passed).
    pub failure: Option<String>,
    pub seconds: f64,
    /// Where the cluster's logs were kept when it failed.
    pub logs: Option<std::path::PathBuf>,
    /// The seeded fault schedule it ran.
    pub schedule: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.failure.is_none() && self.tally.lost.is_empty()
    }
}

/// Blocks the workload writes: a 64 MiB volume, all of it.
pub const BLOCKS: u64 = 64 * 256;
const VOLUME: &str = "chaos";

/// Seconds to healthy past which a scenario's logs are kept (and named in
/// the report) although it passed.
const SLOW_HEAL_SECS: f64 = 60.0;

/// Settings that keep healing quick enough for a test run; a reuse is
/// still preferred to a new replica, as in production.
const SETTINGS: &[(&str, &str)] = &[
    ("replica-replenishment-wait-interval", "30"),
    ("replica-rebuild-backoff-initial", "2"),
    ("replica-rebuild-backoff-max", "8"),
];

fn setup(scenario: &Scenario, index: usize, config: &RunConfig) -> Result<Ctx, String> {
    let port_base = config.port_base + 400 * index as u16;
    let cluster = StandaloneCluster::start_with(
        &format!("chaos-{}-", scenario.name),
        3,
        port_base,
        "1GiB",
        &["--netns", "--fault-injection"],
    );
    for (name, value) in SETTINGS {
        cluster.cli(&["setting", "set", name, value])?;
    }
    let api = cluster.api.clone();
    let mut ctx = Ctx {
        cluster,
        volume: VOLUME.to_string(),
        rng: Rng::derive(config.seed, scenario.name),
        duration: config.duration,
        workload: Workload::idle(),
        crash_all: false,
        schedule: Vec::new(),
        relay: None,
    };
    if scenario.relay {
        // Node I's instances get ports port_base + 100 I ..= + 99 (`up`).
        let first = port_base as u32 + 100 * RELAY_NODE[2..].parse::<u32>().map_err(|e| e.to_string())?;
        let ports = format!("{first}:{}", first + 99);
        let engine_ip = ctx.node_ip(ENGINE_NODE)?;
        let relay_rng = Rng::derive(config.seed, &format!("{}-relay", scenario.name));
        ctx.relay = Some(Relay::start(&ctx.netns(RELAY_NODE)?, &engine_ip, &ports, relay_rng)?);
    }
    ctx.cluster.cli(&["volume", "create", VOLUME, "--size", "64MiB", "--replicas", "3"])?;
    ctx.cluster.cli(&["volume", "attach", VOLUME, "--node", ENGINE_NODE])?;
    ctx.wait_healthy(Duration::from_secs(60))?;
    let netns = ctx.netns(ENGINE_NODE)?;
    ctx.workload = Workload::start(
        WorkloadConfig {
            blocks: BLOCKS,
            threads: 4,
            flush_every: 32,
            seed: config.seed,
            netns: Some(netns),
            io_timeout: Duration::from_secs(30),
            fill_first: scenario.fill,
        },
        Arc::new(move || endpoint_of(&api, VOLUME)),
    );
    Ok(ctx)
}

/// The scenario from its fault to the verdict; fills `out` as it goes.
fn drive(ctx: &mut Ctx, scenario: &Scenario, config: &RunConfig, out: &mut Outcome) -> Result<(), String> {
    ctx.in_flight(200).map_err(|e| format!("before the fault: {e}"))?;
    (scenario.fault)(ctx).map_err(|e| format!("fault: {e}"))?;
    out.to_healthy = Some(ctx.wait_healthy(config.heal_timeout)?.as_secs_f64());
    ctx.in_flight(100).map_err(|e| format!("after healing: {e}"))?;
    // What the volume's events told the operator is plain text.
    if let Some(e) = ctx.events().iter().find(|e| e["message"].as_str().is_some_and(|m| m.contains('\u{1b}'))) {
        return Err(format!("an event carries terminal escape codes: {}", e["message"]));
    }
    Ok(())
}

fn finish(mut ctx: Ctx, scenario: &Scenario, out: &mut Outcome) -> Result<(), String> {
    let counters = ctx.workload.counters.clone();
    let histories = std::mem::replace(&mut ctx.workload, Workload::idle()).finish()?;
    out.acked = counters.acked.load(std::sync::atomic::Ordering::Relaxed);
    out.errors = counters.errors.load(std::sync::atomic::Ordering::Relaxed);
    out.reconnects = counters.reconnects.load(std::sync::atomic::Ordering::Relaxed);
    ctx.until(Duration::from_secs(60), "the volume's endpoint, to read every block back", |c| c.endpoint().is_some())?;
    let uri = ctx.endpoint().ok_or("the volume has no endpoint to read back from")?;
    let netns = ctx.netns(ENGINE_NODE)?;
    out.tally = workload::verify(&uri, Some(&netns), BLOCKS, &histories, ctx.crash_all || scenario.crash_all)?;
    Ok(())
}

pub fn run_one(scenario: &'static Scenario, index: usize, config: &RunConfig) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome {
        name: scenario.name,
        acked: 0,
        errors: 0,
        reconnects: 0,
        to_healthy: None,
        tally: Tally::default(),
        failure: None,
        seconds: 0.0,
        logs: None,
        schedule: Vec::new(),
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<(), String> {
        let mut ctx = setup(scenario, index, config)?;
        let driven = drive(&mut ctx, scenario, config, &mut out);
        out.schedule = ctx.schedule.clone();
        // A slow heal is worth reading about even when it passed.
        if driven.is_err() || out.to_healthy.is_some_and(|s| s > SLOW_HEAL_SECS) {
            out.logs = save_logs(ctx.cluster.dir.path(), scenario.name, config.seed);
        }
        if driven.is_err() {
            // A fault left in place would keep `up` from stopping what runs
            // behind it: lift every one before the cluster goes.
            ctx.lift_all_faults();
        }
        // The blocks are read back even when the scenario failed: a loss
        // is worth knowing about either way.
        let finished = if ctx.healthy() || driven.is_ok() { finish(ctx, scenario, &mut out) } else { Ok(()) };
        driven.and(finished)
    }));
    out.failure = match result {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(panic) => Some(
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into()),
        ),
    };
    if out.failure.is_none() && !out.tally.lost.is_empty() {
        let (block, expected, found) = &out.tally.lost[0];
        out.failure =
            Some(format!("{} block(s) lost; block {block}: expected {expected}, found {found}", out.tally.lost.len()));
    }
    out.seconds = start.elapsed().as_secs_f64();
    out
}

/// Copies every log of the failed cluster under `dir` (the manager's, each
/// instance manager's and instance's) to a directory of its own that
/// outlives the cluster; that directory.
fn save_logs(dir: &Path, name: &str, seed: u64) -> Option<PathBuf> {
    let to = std::env::temp_dir().join(format!("ironhorn-chaos-logs/{name}-seed{seed}"));
    let _ = std::fs::remove_dir_all(&to);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                let target = to.join(path.strip_prefix(dir).ok()?);
                std::fs::create_dir_all(target.parent()?).ok()?;
                std::fs::copy(&path, &target).ok()?;
            }
        }
    }
    Some(to)
}

/// Runs `scenarios`, `config.parallel` at once; outcomes in the given order.
pub fn run_all(scenarios: &[&'static Scenario], config: &RunConfig) -> Vec<Outcome> {
    let next = Arc::new(Mutex::new(0usize));
    let results: Arc<Mutex<Vec<Option<Outcome>>>> = Arc::new(Mutex::new((0..scenarios.len()).map(|_| None).collect()));
    let workers: Vec<_> = (0..config.parallel.max(1))
        .map(|_| {
            let (next, results, config) = (next.clone(), results.clone(), config.clone());
            let scenarios = scenarios.to_vec();
            std::thread::spawn(move || {
                loop {
                    let i = {
                        let mut n = next.lock().expect("lock");
                        let i = *n;
                        *n += 1;
                        i
                    };
                    let Some(scenario) = scenarios.get(i) else { break };
                    eprintln!("chaos: {} starts", scenario.name);
                    let outcome = run_one(scenario, i, &config);
                    eprintln!("chaos: {}", row(&outcome));
                    results.lock().expect("lock")[i] = Some(outcome);
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let results = std::mem::take(&mut *results.lock().expect("lock"));
    results.into_iter().map(|o| o.expect("every scenario ran")).collect()
}

pub const HEADER: &str =
    "SCENARIO                        RESULT  ACKED   IO-ERR  CONNECT HEALTHY-S  LOST  ROLLED-BACK  SECS";

pub fn row(o: &Outcome) -> String {
    format!(
        "{:<31} {:<7} {:<7} {:<7} {:<7} {:<10} {:<5} {:<12} {:.0}",
        o.name,
        if o.passed() { "pass" } else { "FAIL" },
        o.acked,
        o.errors,
        o.reconnects,
        o.to_healthy.map_or("-".to_string(), |s| format!("{s:.1}")),
        o.tally.lost.len(),
        o.tally.rolled_back,
        o.seconds,
    )
}

/// The table, then each failure with its reason.
pub fn report(outcomes: &[Outcome]) -> String {
    let mut text = format!("{HEADER}\n");
    for o in outcomes {
        text.push_str(&row(o));
        text.push('\n');
    }
    text.push_str("\nschedules:\n");
    for o in outcomes {
        text.push_str(&format!("  {}: {}\n", o.name, o.schedule.join("; ")));
    }
    for o in outcomes.iter().filter(|o| o.passed() && o.logs.is_some()) {
        let logs = o.logs.as_ref().expect("checked");
        text.push_str(&format!("\n{} healed slowly; logs: {}\n", o.name, logs.display()));
    }
    for o in outcomes.iter().filter(|o| !o.passed()) {
        text.push_str(&format!("\n{} failed: {}\n", o.name, o.failure.as_deref().unwrap_or("")));
        if let Some(logs) = &o.logs {
            text.push_str(&format!("  logs: {}\n", logs.display()));
        }
        for (block, expected, found) in o.tally.lost.iter().take(10) {
            text.push_str(&format!("  block {block}: expected {expected}, found {found}\n"));
        }
    }
    text
}
