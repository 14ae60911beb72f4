//! The quick chaos matrix: every scenario of `ironhorn-chaos`, with faults
//! held a few seconds, three clusters at a time. Each scenario runs its
//! fault under the checker's workload, waits for `robustness: healthy`
//! unaided, and reads every block back; the test fails on any lost block
//! (naming it, with what was expected and found) or any scenario that did
//! not heal. `ironhorn-chaos run` runs the same matrix by hand, longer.

use std::time::Duration;

use ironhorn_tests::chaos::run::{Outcome, RunConfig, report, run_all, run_one};
use ironhorn_tests::chaos::scenarios::SCENARIOS;
use ironhorn_tests::{require_root, require_tool};

#[test]
fn every_chaos_scenario_heals_and_loses_no_acknowledged_write() {
    require_root();
    require_tool("ip", "iproute2");
    require_tool("iptables", "iptables");
    require_tool("tc", "iproute2");
    let seed = std::env::var("IRONHORN_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let config = RunConfig { seed, duration: Duration::from_secs(5), parallel: 3, ..RunConfig::default() };
    let all: Vec<_> = SCENARIOS.iter().collect();
    let outcomes = run_all(&all, &config);
    let text = report(&outcomes);
    println!("seed {seed}\n{text}");
    let failed: Vec<&str> = outcomes.iter().filter(|o| !o.passed()).map(|o| o.name).collect();
    assert!(failed.is_empty(), "chaos scenarios failed: {failed:?}\n{text}");
    for o in &outcomes {
        assert!(o.acked > 0, "{}: no write was acknowledged", o.name);
        assert!(o.tally.good > 0, "{}: no block read back as written", o.name);
    }

    // One seed, one fault schedule: a scenario whose schedule is all
    // seeded choices (the order of the kills, the gaps between them) run
    // twice with the seed and once with the next one, side by side.
    let replay = SCENARIOS.iter().find(|s| s.name == "kill-each-replica").expect("kill-each-replica");
    let runs: Vec<Outcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = [seed, seed, seed + 1]
            .into_iter()
            .enumerate()
            .map(|(index, seed)| {
                let config = RunConfig { seed, ..config.clone() };
                scope.spawn(move || run_one(replay, index, &config))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("scenario thread")).collect()
    });
    for o in &runs {
        assert!(o.passed(), "replay of {}: {:?}", o.name, o.failure);
    }
    println!("replays: {:?} | {:?} | {:?}", runs[0].schedule, runs[1].schedule, runs[2].schedule);
    assert!(!runs[0].schedule.is_empty(), "kill-each-replica has a schedule");
    assert_eq!(runs[0].schedule, runs[1].schedule, "the same seed gives the same schedule");
    assert_ne!(runs[0].schedule, runs[2].schedule, "another seed gives another schedule");
}
