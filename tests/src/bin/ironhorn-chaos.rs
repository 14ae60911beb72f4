//! `ironhorn-chaos run [--scenario NAME]... [--seed N] [--duration S]
//! [--parallel N] [--port-base P]`: runs the chaos matrix (or the named
//! scenarios) against real `ironhorn up` clusters and prints the table.
//! `ironhorn-chaos list` names the scenarios and what each proves.
//! Exits 1 when a scenario failed. Needs root and the built binaries.

use std::time::Duration;

use ironhorn_tests::chaos::run::{RunConfig, report, run_all};
use ironhorn_tests::chaos::scenarios::{SCENARIOS, Scenario, find};

const USAGE: &str = "usage: ironhorn-chaos run [--scenario NAME]... [--seed N] [--duration SECS] [--parallel N] \
                     [--port-base P]\n       ironhorn-chaos list";

fn parse<T: std::str::FromStr>(flag: &str, value: Option<String>) -> Result<T, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    value.parse().map_err(|_| format!("{flag}: not a number: {value}"))
}

fn main() {
    match real_main() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("ironhorn-chaos: {e}\n{USAGE}");
            std::process::exit(2);
        }
    }
}

fn real_main() -> Result<bool, String> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("list") => {
            for s in SCENARIOS {
                println!("{:<31} {}", s.name, s.proves);
            }
            return Ok(true);
        }
        Some("run") => {}
        _ => return Err("a command: run or list".into()),
    }
    let mut config = RunConfig::default();
    let mut chosen: Vec<&'static Scenario> = Vec::new();
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--scenario" => {
                let name = args.next().ok_or("--scenario needs a name")?;
                chosen.push(find(&name).ok_or_else(|| format!("no scenario {name} (see `ironhorn-chaos list`)"))?);
            }
            "--seed" => config.seed = parse(&flag, args.next())?,
            "--duration" => config.duration = Duration::from_secs(parse(&flag, args.next())?),
            "--parallel" => config.parallel = parse(&flag, args.next())?,
            "--port-base" => config.port_base = parse(&flag, args.next())?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if chosen.is_empty() {
        chosen = SCENARIOS.iter().collect();
    }
    let last = config.port_base as usize + 400 * chosen.len();
    if last > 32_000 {
        return Err(format!("--port-base {} leaves no room for {} scenarios", config.port_base, chosen.len()));
    }
    println!("seed {} · fault held {:?} · {} at once", config.seed, config.duration, config.parallel);
    let outcomes = run_all(&chosen, &config);
    print!("{}", report(&outcomes));
    Ok(outcomes.iter().all(|o| o.passed()))
}
