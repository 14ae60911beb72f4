//! Faults, each a real one: iptables rules, qdiscs and link state inside a
//! node's network namespace, signals to exact pids. Rules are only ever
//! added inside a simulated node's namespace (which `up` removes whole), and
//! `heal` flushes exactly that namespace's filter table and qdisc.

use std::process::Command;

/// The node's link inside its namespace (see ironhorn_manager::simnet).
pub const NODE_LINK: &str = "eth0";

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn iptables(netns: &str, rule: &[&str]) -> Result<(), String> {
    let mut args = vec!["netns", "exec", netns, "iptables", "-w"];
    args.extend_from_slice(rule);
    run("ip", &args).map(drop)
}

/// The network namespace process `pid` lives in (by `ip netns identify`).
pub fn netns_of(pid: u32) -> Result<String, String> {
    let name = run("ip", &["netns", "identify", &pid.to_string()])?.trim().to_string();
    if name.is_empty() { Err(format!("process {pid} is in no named network namespace")) } else { Ok(name) }
}

/// Drops everything between `netns` and `peer` both ways (done inside
/// `netns`: the peer sees silence, as across a broken switch).
pub fn partition(netns: &str, peer: &str) -> Result<(), String> {
    iptables(netns, &["-A", "INPUT", "-s", peer, "-j", "DROP"])?;
    iptables(netns, &["-A", "OUTPUT", "-d", peer, "-j", "DROP"])
}

/// Drops what `netns` sends to `peer`; what `peer` sends still arrives.
pub fn partition_one_way(netns: &str, peer: &str) -> Result<(), String> {
    iptables(netns, &["-A", "OUTPUT", "-d", peer, "-j", "DROP"])
}

/// Drops `percent` % of packets in and out of `netns`, at random.
pub fn packet_loss(netns: &str, percent: u32) -> Result<(), String> {
    let p = format!("{:.2}", percent as f64 / 100.0);
    for chain in ["INPUT", "OUTPUT"] {
        iptables(netns, &["-A", chain, "-m", "statistic", "--mode", "random", "--probability", &p, "-j", "DROP"])?;
    }
    Ok(())
}

/// A slow link out of `netns`: a token bucket at `kbit` kbit/s whose queue
/// holds up to `latency_ms` of data, so traffic waits in it. (This kernel
/// has no netem, so a fixed added delay cannot be made; a narrow link
/// delays every packet behind a queue instead.)
pub fn slow_link(netns: &str, kbit: u32, latency_ms: u32) -> Result<(), String> {
    run(
        "ip",
        &[
            "netns",
            "exec",
            netns,
            "tc",
            "qdisc",
            "replace",
            "dev",
            NODE_LINK,
            "root",
            "tbf",
            "rate",
            &format!("{kbit}kbit"),
            "burst",
            "16kb",
            "latency",
            &format!("{latency_ms}ms"),
        ],
    )
    .map(drop)
}

pub fn link(netns: &str, up: bool) -> Result<(), String> {
    run("ip", &["-n", netns, "link", "set", NODE_LINK, if up { "up" } else { "down" }]).map(drop)
}

/// Removes every rule and qdisc a fault put in `netns` and brings its link up.
pub fn heal(netns: &str) -> Result<(), String> {
    iptables(netns, &["-F"])?;
    // No root qdisc of ours is not an error here.
    let _ = run("ip", &["netns", "exec", netns, "tc", "qdisc", "del", "dev", NODE_LINK, "root"]);
    link(netns, true)
}

pub fn signal(pid: u32, signal: i32) -> Result<(), String> {
    // SAFETY: one exact pid, found through the instance manager or `up`.
    if unsafe { libc::kill(pid as i32, signal) } == 0 {
        Ok(())
    } else {
        Err(format!("kill -{signal} {pid}: {}", std::io::Error::last_os_error()))
    }
}

pub fn kill9(pid: u32) -> Result<(), String> {
    signal(pid, libc::SIGKILL)
}
