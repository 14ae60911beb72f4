//! The quick chaos matrix: every scenario of `ironhorn-chaos`, with faults
//! held a few seconds, three clusters at a time. Each scenario runs its
//! fault under the checker's workload, waits for `robustness: healthy`
//! unaided, and reads every block back; the test fails on any lost block
//! (naming it, with what was expected and found) or any scenario that did
//! not heal. `ironhorn-chaos run` runs the same matrix by hand, longer.

use std::time::Duration;

use ironhorn_tests::chaos::run::{RunConfig, report, run_all};
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
}
