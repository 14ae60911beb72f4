//! The simulated network of `ironhorn up --netns`: every node in its own
//! network namespace, joined by a veth pair to one bridge in the root
//! namespace, on a private /24 the cluster makes for itself. The manager
//! stays in the root namespace and reaches the nodes through the bridge's
//! address (.1); node I is .(10+I). Faults are then real: iptables rules and
//! qdiscs inside a node's namespace, or its link taken down.
//!
//! Names come from the data dir's tag and the node's index, so two clusters
//! never share one, and everything is removed by exact name.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

/// Where a simulated network's pieces are, computed from the cluster's tag
/// and port base alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimNet {
    pub bridge: String,
    /// The bridge's address: the manager's on this network.
    pub gateway: Ipv4Addr,
    pub nodes: Vec<SimNode>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimNode {
    /// The network namespace (`ip netns` name, /run/netns/NAME).
    pub netns: String,
    /// The veth end in the root namespace (on the bridge); the other end is
    /// `eth0` in the node's namespace.
    pub veth: String,
    pub ip: Ipv4Addr,
}

/// The node's link inside its namespace.
pub const NODE_LINK: &str = "eth0";

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{command}: {message}")]
    Command { command: String, message: String },
    #[error("open {path}: {source}")]
    Open { path: String, source: std::io::Error },
}

/// The network for `nodes` nodes of the cluster tagged `tag` whose ports
/// start at `port_base`: subnet 10.(100 + n/256).(n%256).0/24, n = port_base/100,
/// so clusters on different port ranges get different subnets.
pub fn plan(tag: &str, port_base: u16, nodes: usize) -> SimNet {
    let n = port_base / 100;
    let (a, b) = (100 + (n / 256) as u8, (n % 256) as u8);
    SimNet {
        bridge: format!("ihb{tag}"),
        gateway: Ipv4Addr::new(10, a, b, 1),
        nodes: (1..=nodes)
            .map(|i| SimNode {
                netns: format!("ih{tag}-n-{i}"),
                veth: format!("ih{tag}v{i}"),
                ip: Ipv4Addr::new(10, a, b, 10 + i as u8),
            })
            .collect(),
    }
}

fn ip(args: &[&str]) -> Result<(), NetError> {
    let out = Command::new("ip").args(args).output().map_err(|e| NetError::Command {
        command: format!("ip {}", args.join(" ")),
        message: format!("{e} (install iproute2)"),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError::Command {
            command: format!("ip {}", args.join(" ")),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

pub fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Makes whatever of `net` is missing; what exists is kept (a restarted
/// `up` adopts nodes whose processes still run in their namespaces).
pub fn create(net: &SimNet) -> Result<(), NetError> {
    if !link_exists(&net.bridge) {
        ip(&["link", "add", &net.bridge, "type", "bridge"])?;
    }
    ip(&["addr", "replace", &format!("{}/24", net.gateway), "dev", &net.bridge])?;
    ip(&["link", "set", &net.bridge, "up"])?;
    for node in &net.nodes {
        if !netns_exists(&node.netns) {
            ip(&["netns", "add", &node.netns])?;
        }
        if !link_exists(&node.veth) {
            ip(&["link", "add", &node.veth, "type", "veth", "peer", "name", NODE_LINK, "netns", &node.netns])?;
        }
        ip(&["link", "set", &node.veth, "master", &net.bridge, "up"])?;
        ip(&["-n", &node.netns, "addr", "replace", &format!("{}/24", node.ip), "dev", NODE_LINK])?;
        ip(&["-n", &node.netns, "link", "set", NODE_LINK, "up"])?;
        ip(&["-n", &node.netns, "link", "set", "lo", "up"])?;
    }
    Ok(())
}

/// Removes every namespace, veth and the bridge of `net`, by name; what is
/// already gone is skipped. Rules and qdiscs inside a namespace go with it.
pub fn remove(net: &SimNet) -> Result<(), NetError> {
    let mut first_error = None;
    for node in &net.nodes {
        // The veth first: deleting the namespace would take its pair away
        // behind our back.
        if link_exists(&node.veth)
            && let Err(e) = ip(&["link", "del", &node.veth])
        {
            first_error.get_or_insert(e);
        }
        if netns_exists(&node.netns)
            && let Err(e) = ip(&["netns", "del", &node.netns])
        {
            first_error.get_or_insert(e);
        }
    }
    if link_exists(&net.bridge)
        && let Err(e) = ip(&["link", "del", &net.bridge])
    {
        first_error.get_or_insert(e);
    }
    first_error.map_or(Ok(()), Err)
}

/// The namespace's handle, for `setns` in a child about to exec.
pub fn open(netns: &str) -> Result<std::fs::File, NetError> {
    let path = Path::new("/run/netns").join(netns);
    std::fs::File::open(&path).map_err(|source| NetError::Open { path: path.display().to_string(), source })
}

/// Moves the calling thread into the namespace behind `handle`.
pub fn enter(handle: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: setns on an open namespace file descriptor; affects only the
    // calling thread's network namespace.
    if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_interface_limits_and_subnets_follow_the_port_base() {
        let net = plan("a1b2c3", 21000, 3);
        assert_eq!(net.bridge, "ihba1b2c3");
        assert_eq!(net.gateway, Ipv4Addr::new(10, 100, 210, 1));
        assert_eq!(net.nodes[2].ip, Ipv4Addr::new(10, 100, 210, 13));
        assert_eq!(net.nodes[0].netns, "iha1b2c3-n-1");
        for name in std::iter::once(&net.bridge).chain(net.nodes.iter().map(|n| &n.veth)) {
            assert!(name.len() <= 15, "{name} is longer than IFNAMSIZ-1");
        }
        assert_ne!(plan("a1b2c3", 21100, 1).gateway, net.gateway, "another port range, another subnet");
        assert_eq!(plan("a1b2c3", 65500, 1).gateway, Ipv4Addr::new(10, 102, 143, 1));
    }
}
