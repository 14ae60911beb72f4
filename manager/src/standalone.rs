//! `ironhorn up`: a whole cluster on one machine. The manager runs in this
//! process on the embedded datastore; each simulated node is a real
//! `ironhorn-instance-manager` process with one disk: an LVM volume group on
//! a loop device over a sparse file under the data dir (as root, with lvm2),
//! or a directory of file stores otherwise.
//!
//! Layout of the data dir:
//!   store/                     the embedded datastore
//!   nodes/n-I/disk.img         the node's PV file (LVM disks)
//!   nodes/n-I/disk/            the node's file stores (file disks)
//!   nodes/n-I/im/              the instance manager's table and logs
//!   nodes/n-I/im.pid           pid of the instance manager `up` started
//!
//! Ports (from --port-base B and --ports-per-node P, 100 by default): API B,
//! node I's instance manager B+I, and its instances B+P·I … B+P·I+P-1 (each
//! replica and engine takes one: a node holding many volumes needs a larger
//! P).
//!
//! Stopping (Ctrl-C / SIGTERM): the controllers stop, every engine and then
//! every replica is stopped through its instance manager (data kept), the
//! instance managers get SIGTERM, and the loop devices are detached. The data
//! dir is reusable: `up` again brings the same volumes back (attached ones get
//! a new engine with a higher epoch). If `up` itself is killed (-9), the
//! instance managers and their engines and replicas keep running, and the
//! next `up` on the same data dir adopts them.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cluster::{Cluster, GrpcCluster};
use crate::crd::{DiskSpec, Node, NodeSpec};
use crate::datastore::Datastore;
use crate::datastore::embedded::EmbeddedStore;
use crate::simnet::{self, SimNet, SimNode};

/// Under the data dir when `up --netns` made a network: its port base and
/// node count, from which `simnet::plan` names every piece (for `purge`).
const SIMNET_FILE: &str = "simnet";

fn simnet_of(data_dir: &Path) -> Option<SimNet> {
    let text = std::fs::read_to_string(data_dir.join(SIMNET_FILE)).ok()?;
    let mut words = text.split_whitespace().map(str::parse::<usize>);
    let (Some(Ok(port_base)), Some(Ok(nodes))) = (words.next(), words.next()) else { return None };
    Some(simnet::plan(&dir_tag(data_dir), u16::try_from(port_base).ok()?, nodes))
}

pub struct UpConfig {
    pub data_dir: PathBuf,
    pub nodes: usize,
    pub port_base: u16,
    /// Ports each node hands out to its engines and replicas.
    pub ports_per_node: u16,
    pub disk_size: u64,
    /// Force file disks even where LVM would work.
    pub file_disks: bool,
    /// Each node in its own network namespace (see `simnet`).
    pub netns: bool,
    /// Replicas serve their fault-injection API (chaos tests).
    pub fault_injection: bool,
    /// Start a node's instance manager again when it dies.
    pub supervise: bool,
    pub bin_dir: PathBuf,
}

/// Node `index`'s ports (1-based): its instance manager's, and the first
/// and last it hands out.
pub fn node_ports(base: u16, per_node: u16, nodes: usize, index: usize) -> Result<(usize, usize, usize), String> {
    if (per_node as usize) <= nodes {
        return Err(format!(
            "--ports-per-node {per_node} must be more than the number of nodes ({nodes}): \
             the instance managers listen on the ports after --port-base"
        ));
    }
    let first = base as usize + per_node as usize * index;
    let last = first + per_node as usize - 1;
    if last > u16::MAX as usize {
        return Err(format!("--port-base {base} with --ports-per-node {per_node} leaves no ports for node {index}"));
    }
    Ok((base as usize + index, first, last))
}

struct NodeProcess {
    /// Its instance manager (name, directory and address are the node's).
    im: ImCommand,
    loop_device: Option<String>,
}

/// How one node's instance manager is started (and started again).
#[derive(Clone, Debug)]
struct ImCommand {
    node: String,
    dir: PathBuf,
    address: String,
    ip: std::net::Ipv4Addr,
    ports: (usize, usize),
    fault_injection: bool,
    binary: PathBuf,
    /// The node's network namespace (`up --netns`).
    netns: Option<String>,
}

impl ImCommand {
    /// Starts the instance manager, records its pid, and waits until it listens.
    async fn start(&self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("instance-manager.log"))
            .map_err(|e| e.to_string())?;
        let mut command = std::process::Command::new(&self.binary);
        command
            .args([
                "serve",
                "--data-dir",
                self.dir.join("im").to_str().ok_or("bad path")?,
                "--listen",
                &self.address,
                "--address",
                &self.ip.to_string(),
                "--port-range",
                &format!("{}-{}", self.ports.0, self.ports.1),
            ])
            .args(self.fault_injection.then_some("--replica-fault-injection"))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .process_group(0);
        // The node's namespace: the instance manager and every engine and
        // replica it starts live there.
        let netns = self.netns.as_deref().map(simnet::open).transpose().map_err(|e| e.to_string())?;
        if let Some(handle) = netns {
            // SAFETY: the closure only calls setns (async-signal-safe) on a
            // descriptor the parent keeps open until spawn returns.
            unsafe { command.pre_exec(move || simnet::enter(&handle)) };
        }
        let child = command.spawn().map_err(|e| format!("start ironhorn-instance-manager: {e}"))?;
        std::fs::write(self.dir.join("im.pid"), child.id().to_string()).map_err(|e| e.to_string())?;
        if !wait_listening_from(&self.address, self.netns.as_deref(), Duration::from_secs(15)).await {
            return Err(format!(
                "node {}: instance manager did not listen on {}; see {}",
                self.node,
                self.address,
                self.dir.join("instance-manager.log").display()
            ));
        }
        Ok(())
    }

    /// Whether the instance manager `up` recorded for this node is gone
    /// (reaped here when it was our child).
    fn gone(&self) -> bool {
        let Some(pid) =
            std::fs::read_to_string(self.dir.join("im.pid")).ok().and_then(|p| p.trim().parse::<i32>().ok())
        else {
            return true;
        };
        // SAFETY: waitpid with WNOHANG on one pid; no memory effects.
        let reaped = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        reaped == pid || (reaped < 0 && !Path::new(&format!("/proc/{pid}")).exists())
    }
}

/// Restarts any node's instance manager that died, as a node agent's
/// supervisor (a DaemonSet, systemd) would; the new one adopts the engines
/// and replicas still running on its node.
async fn supervise(nodes: Vec<ImCommand>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        for im in &nodes {
            if im.gone() {
                ironhorn_proto::say_err!("node {}: instance manager gone; starting it again", im.node);
                if let Err(e) = im.start().await {
                    ironhorn_proto::say_err!("node {}: {e}", im.node);
                }
            }
        }
    }
}

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn lvm_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Command::new("vgs").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// A short tag from the data dir's path, so clusters in different data dirs
/// get different VG names.
fn dir_tag(dir: &Path) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for b in dir.as_os_str().as_encoded_bytes() {
        hash = (hash ^ *b as u32).wrapping_mul(0x0100_0193);
    }
    format!("{:06x}", hash & 0xff_ffff)
}

pub fn vg_name(data_dir: &Path, node: &str) -> String {
    format!("ih{}-{node}", dir_tag(data_dir))
}

/// The loop device already backed by `file`, if any.
fn loop_of(file: &Path) -> Option<String> {
    let out = run("losetup", &["-j", file.to_str()?]).ok()?;
    out.lines().next().and_then(|l| l.split(':').next()).map(|d| d.trim().to_string()).filter(|d| !d.is_empty())
}

fn lvm(tool: &str, args: &[&str]) -> Result<String, String> {
    ironhorn_replica::lvm::tool(tool, args).map_err(|e| e.to_string())
}

/// Makes (or finds) node's LVM disk: returns (disk path, loop device).
fn lvm_disk(data_dir: &Path, node: &str, dir: &Path, size: u64) -> Result<(String, String), String> {
    let image = dir.join("disk.img");
    if !image.exists() {
        let f = std::fs::File::create(&image).map_err(|e| format!("{}: {e}", image.display()))?;
        f.set_len(size).map_err(|e| format!("{}: {e}", image.display()))?;
    }
    let device = match loop_of(&image) {
        Some(d) => d,
        None => run("losetup", &["--find", "--show", image.to_str().ok_or("bad path")?])?.trim().to_string(),
    };
    let vg = vg_name(data_dir, node);
    if ironhorn_replica::lvm::vg_info(&vg).is_err() {
        lvm("pvcreate", &["-y", &device])?;
        lvm("vgcreate", &[&vg, &device])?;
    }
    Ok((format!("lvm:{vg}"), device))
}

/// `wait_listening` from inside network namespace `netns` (when given):
/// a node whose link is down still has its instance manager listening.
async fn wait_listening_from(address: &str, netns: Option<&str>, timeout: Duration) -> bool {
    let Some(netns) = netns else { return wait_listening(address, timeout).await };
    let (Ok(handle), Ok(address)) = (simnet::open(netns), address.parse::<SocketAddr>()) else { return false };
    // A thread of its own: entering a namespace is per thread, and this one
    // ends with the wait.
    let waiter = std::thread::spawn(move || {
        if simnet::enter(&handle).is_err() {
            return false;
        }
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    tokio::task::spawn_blocking(move || waiter.join().unwrap_or(false)).await.unwrap_or(false)
}

async fn wait_listening(address: &str, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if tokio::net::TcpStream::connect(address).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn start_node(
    config: &UpConfig,
    index: usize,
    use_lvm: bool,
    net: Option<&SimNode>,
) -> Result<(NodeProcess, String), String> {
    let name = format!("n-{index}");
    let dir = config.data_dir.join("nodes").join(&name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (disk_path, loop_device) = if use_lvm {
        let (path, device) = lvm_disk(&config.data_dir, &name, &dir, config.disk_size)?;
        (path, Some(device))
    } else {
        let disk = dir.join("disk");
        std::fs::create_dir_all(&disk).map_err(|e| format!("{}: {e}", disk.display()))?;
        (format!("file:{}", disk.display()), None)
    };
    let (im_port, first, last) = node_ports(config.port_base, config.ports_per_node, config.nodes, index)?;
    let ip = net.map_or(std::net::Ipv4Addr::LOCALHOST, |n| n.ip);
    let im = ImCommand {
        node: name.clone(),
        dir,
        address: format!("{ip}:{im_port}"),
        ip,
        ports: (first, last),
        fault_injection: config.fault_injection,
        binary: config.bin_dir.join("ironhorn-instance-manager"),
        netns: net.map(|n| n.netns.clone()),
    };
    if wait_listening(&im.address, Duration::from_millis(200)).await {
        ironhorn_proto::say!("node {name}: instance manager already running at {} (adopted)", im.address);
    } else {
        im.start().await?;
    }
    Ok((NodeProcess { im, loop_device }, disk_path))
}

async fn register_node(
    store: &EmbeddedStore,
    name: &str,
    im_address: &str,
    disk_path: &str,
    cap: u64,
) -> Result<(), String> {
    match store.get::<Node>(name).await.map_err(|e| e.to_string())? {
        Some(existing) => {
            let disk_ok =
                existing.spec.disks.get("disk-1").is_some_and(|d| d.path == disk_path && d.storage_maximum == cap);
            if existing.spec.instance_manager_address != im_address || !disk_ok {
                let (address, path) = (im_address.to_string(), disk_path.to_string());
                crate::datastore::update::<Node, _>(store, name, |n| {
                    n.spec.instance_manager_address = address.clone();
                    n.spec.disks.entry("disk-1".into()).or_insert_with(|| DiskSpec {
                        path: path.clone(),
                        allow_scheduling: true,
                        storage_reserved: 0,
                        storage_maximum: cap,
                        tags: vec![],
                    });
                    let disk = n.spec.disks.get_mut("disk-1").expect("inserted");
                    disk.path = path.clone();
                    disk.storage_maximum = cap;
                    true
                })
                .await
                .map_err(|e| e.to_string())?;
            }
        }
        None => {
            let disk = DiskSpec {
                path: disk_path.to_string(),
                allow_scheduling: true,
                storage_reserved: 0,
                storage_maximum: cap,
                tags: vec![],
            };
            let spec = NodeSpec {
                allow_scheduling: true,
                tags: vec![],
                disks: [("disk-1".to_string(), disk)].into(),
                instance_manager_address: im_address.to_string(),
            };
            store.create(&Node::new(name, spec)).await.map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Stops engines, then replicas, then the instance managers; detaches loops.
async fn stop_nodes(nodes: &[NodeProcess]) {
    let cluster = GrpcCluster::default();
    for kind in [ironhorn_proto::instance::InstanceKind::Engine, ironhorn_proto::instance::InstanceKind::Replica] {
        for node in nodes {
            let Ok(instances) = cluster.instances(&node.im.address).await else { continue };
            for i in instances.iter().filter(|i| i.kind == kind as i32) {
                if let Err(e) = cluster.delete_instance(&node.im.address, &i.name, false).await {
                    ironhorn_proto::say_err!("stop {} on {}: {e}", i.name, node.im.node);
                }
            }
        }
    }
    for node in nodes {
        let pid_file = node.im.dir.join("im.pid");
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse::<i32>().ok()) {
            // Only our instance manager: the one listening at its address.
            // SAFETY: kill has no memory effects.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline && std::path::Path::new(&format!("/proc/{pid}")).exists() {
                // Reap it if it is our child (it is unless `up` was restarted).
                // SAFETY: waitpid on a pid with WNOHANG; no memory effects.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = std::fs::remove_file(&pid_file);
        }
        if let Some(device) = &node.loop_device {
            if let Err(e) = run("losetup", &["-d", device]) {
                ironhorn_proto::say_err!("detach {device}: {e}");
            }
        }
    }
}

pub async fn up(config: UpConfig) -> Result<(), String> {
    std::fs::create_dir_all(&config.data_dir).map_err(|e| format!("{}: {e}", config.data_dir.display()))?;
    let config = UpConfig { data_dir: config.data_dir.canonicalize().map_err(|e| e.to_string())?, ..config };
    if config.nodes == 0 || config.nodes > 9 {
        return Err("--nodes must be 1 to 9".into());
    }
    // The API's port first: taken, nothing is made.
    let listen: SocketAddr = format!("127.0.0.1:{}", config.port_base).parse().expect("address");
    let listener = crate::bind_api(listen).await?;
    let use_lvm = !config.file_disks && lvm_available();
    let store = EmbeddedStore::open(&config.data_dir.join("store")).map_err(|e| e.to_string())?;
    let net = if config.netns {
        let net = simnet::plan(&dir_tag(&config.data_dir), config.port_base, config.nodes);
        std::fs::write(config.data_dir.join(SIMNET_FILE), format!("{} {}\n", config.port_base, config.nodes))
            .map_err(|e| e.to_string())?;
        simnet::create(&net).map_err(|e| format!("the nodes' network: {e}"))?;
        ironhorn_proto::say!("network: bridge {} at {}, a namespace per node", net.bridge, net.gateway);
        Some(net)
    } else {
        None
    };
    let mut nodes = Vec::new();
    for index in 1..=config.nodes {
        let node_net = net.as_ref().map(|n| &n.nodes[index - 1]);
        match start_node(&config, index, use_lvm, node_net).await {
            Ok((node, disk_path)) => {
                // A file disk shares its filesystem: it counts against
                // --disk-size, as an LVM disk's VG is that size.
                let cap = if use_lvm { 0 } else { config.disk_size };
                register_node(&store, &node.im.node, &node.im.address, &disk_path, cap).await?;
                ironhorn_proto::say!("node {}: instance manager {} disk {disk_path}", node.im.node, node.im.address);
                nodes.push(node);
            }
            Err(e) => {
                stop_nodes(&nodes).await;
                remove_net(net.as_ref());
                return Err(e);
            }
        }
    }
    let api = format!("http://{listen}");
    ironhorn_proto::say!("ironhorn is up: {} nodes, API {api}, data {}", config.nodes, config.data_dir.display());
    ironhorn_proto::say!("  export IRONHORN_API={api}");
    ironhorn_proto::say!("  ironhorn volume create vol1 --size 1GiB --replicas 3");
    ironhorn_proto::say!(
        "  ironhorn volume attach vol1 --node n-1        # prints nbd://… to use with nbdinfo, qemu-io or fio"
    );
    ironhorn_proto::say!("  ironhorn volume list; ironhorn node list; ironhorn replica list");
    ironhorn_proto::say!("Ctrl-C stops everything; the data dir keeps the volumes for the next `ironhorn up`.");
    let ims = if config.supervise { nodes.iter().map(|n| n.im.clone()).collect() } else { Vec::new() };
    let supervisor = tokio::spawn(supervise(ims));
    let result = crate::serve_on(store, GrpcCluster::default(), listener, None).await;
    // Stopped for good before the nodes are: nothing restarts what stops.
    supervisor.abort();
    let _ = supervisor.await;
    ironhorn_proto::say!("stopping: engines, replicas, instance managers");
    stop_nodes(&nodes).await;
    remove_net(net.as_ref());
    result
}

fn remove_net(net: Option<&SimNet>) {
    if let Some(net) = net
        && let Err(e) = simnet::remove(net)
    {
        ironhorn_proto::say_err!("remove the nodes' network: {e}");
    }
}

/// Removes what `up` made under a data dir: LVs, VGs, PVs, loop devices and
/// the directory. Refuses while an instance manager of it still runs.
pub fn purge(data_dir: &Path) -> Result<(), String> {
    let data_dir = data_dir.canonicalize().map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let nodes_dir = data_dir.join("nodes");
    let entries = std::fs::read_dir(&nodes_dir).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
    for entry in &entries {
        if let Some(pid) =
            std::fs::read_to_string(entry.path().join("im.pid")).ok().and_then(|p| p.trim().parse::<u32>().ok())
            && Path::new(&format!("/proc/{pid}")).exists()
        {
            return Err(format!(
                "instance manager {pid} of {} still runs: stop `ironhorn up` first",
                entry.path().display()
            ));
        }
    }
    for entry in entries {
        let node = entry.file_name().to_string_lossy().into_owned();
        let image = entry.path().join("disk.img");
        if !image.exists() {
            continue;
        }
        let vg = vg_name(&data_dir, &node);
        if let Ok(lvs) = ironhorn_replica::lvm::lv_list(&vg) {
            for lv in lvs {
                ironhorn_replica::lvm::lv_remove(&vg, &lv).map_err(|e| e.to_string())?;
            }
            lvm("vgremove", &["-y", &vg])?;
        }
        if let Some(device) = loop_of(&image) {
            let _ = lvm("pvremove", &["-y", &device]);
            run("losetup", &["-d", &device])?;
        }
    }
    if let Some(net) = simnet_of(&data_dir) {
        simnet::remove(&net).map_err(|e| e.to_string())?;
    }
    std::fs::remove_dir_all(&data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))
}

#[cfg(test)]
mod tests {
    use super::node_ports;

    #[test]
    fn each_node_gets_its_own_range_after_the_instance_manager_ports() {
        assert_eq!(node_ports(9700, 100, 3, 1), Ok((9701, 9800, 9899)));
        assert_eq!(node_ports(9700, 100, 3, 3), Ok((9703, 10000, 10099)));
        assert_eq!(node_ports(17000, 200, 3, 2), Ok((17002, 17400, 17599)));
        assert!(node_ports(9700, 3, 3, 1).unwrap_err().contains("more than the number of nodes"));
        assert!(node_ports(65000, 300, 3, 3).unwrap_err().contains("leaves no ports"));
    }
}
