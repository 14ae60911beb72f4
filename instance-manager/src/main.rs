//! `ironhorn-instance-manager`: supervise one node's engine and replica processes.

use std::time::Duration;

use clap::{Parser, Subcommand};
use ironhorn_instance_manager::{Config, parse_port_range};

#[derive(Parser)]
#[command(name = "ironhorn-instance-manager", version, about = "Starts and watches one node's ironhorn processes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the instance-manager gRPC API until SIGTERM (instances keep running).
    Serve {
        /// Instance table and logs live here.
        #[arg(long)]
        data_dir: std::path::PathBuf,
        /// gRPC address of the instance manager (port 0 picks one; it is printed).
        #[arg(long, default_value = "127.0.0.1:8500")]
        listen: std::net::SocketAddr,
        /// The address engines and replicas listen on.
        #[arg(long, default_value = "127.0.0.1")]
        address: std::net::IpAddr,
        /// Ports handed to instances, START-END inclusive.
        #[arg(long, default_value = "10000-10999", value_parser = parse_port_range)]
        port_range: (u16, u16),
        /// Directory of ironhorn-engine and ironhorn-replica (default: beside this binary).
        #[arg(long)]
        bin_dir: Option<std::path::PathBuf>,
        /// Seconds between SIGTERM and SIGKILL when an instance is deleted.
        #[arg(long, default_value_t = 10)]
        stop_grace_secs: u64,
        /// On a cluster: register this node's Node object (address, disks,
        /// zone and region) and renew its heartbeat lease.
        #[arg(long, requires = "node_name")]
        kubernetes: bool,
        /// The Kubernetes node this runs on (the downward API's spec.nodeName).
        #[arg(long, env = "NODE_NAME")]
        node_name: Option<String>,
        /// The namespace of ironhorn's objects.
        #[arg(long, default_value = "ironhorn-system", env = "POD_NAMESPACE")]
        namespace: String,
        /// A disk this node offers: [NAME=]lvm:VG or [NAME=]file:DIR (repeat
        /// for more). The node annotation ironhorn.io/disks overrides these.
        #[arg(long = "disk")]
        disks: Vec<String>,
        /// Seconds between heartbeats.
        #[arg(long, default_value_t = 10)]
        heartbeat_interval: u64,
        /// Start replicas with their fault-injection API on (for chaos
        /// tests; never in production).
        #[arg(long)]
        replica_fault_injection: bool,
    },
}

/// Registers the node and keeps its heartbeat until the process ends.
async fn register(node: String, namespace: String, im_address: String, disks: Vec<String>, interval: u64) {
    use ironhorn_manager::registration::{Registrar, read_kubernetes_node};
    let client = loop {
        match kube::Client::try_default().await {
            Ok(client) => break client,
            Err(e) => {
                ironhorn_proto::say_err!("kubernetes client: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    let store = ironhorn_manager::datastore::kubernetes::KubeStore::new(client.clone(), &namespace);
    let registrar = Registrar::new(store, &node);
    let interval = Duration::from_secs(interval.max(1));
    let read = || read_kubernetes_node(&client, &node, &im_address, &disks);
    registrar.run(interval, interval * 4, read, std::future::pending()).await;
}

fn main() {
    ironhorn_proto::say::init_logging();
    let Command::Serve {
        data_dir,
        listen,
        address,
        port_range,
        bin_dir,
        stop_grace_secs,
        kubernetes,
        node_name,
        namespace,
        disks,
        heartbeat_interval,
        replica_fault_injection,
    } = Cli::parse().command;
    let bin_dir = bin_dir.unwrap_or_else(|| {
        std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.to_path_buf())).unwrap_or_default()
    });
    let config = Config {
        data_dir,
        listen,
        address,
        ports: port_range,
        bin_dir,
        stop_grace: Duration::from_secs(stop_grace_secs),
        replica_fault_injection,
    };
    let runtime = ironhorn_proto::runtime::build().expect("tokio runtime");
    if kubernetes {
        let node = node_name.expect("clap requires --node-name with --kubernetes");
        // Without --disk, every node must carry the ironhorn.io/disks annotation.
        if !disks.is_empty()
            && let Err(e) = ironhorn_manager::registration::parse_disks(&disks)
        {
            ironhorn_proto::say_err!("ironhorn-instance-manager: {e}");
            std::process::exit(2);
        }
        let im_address = std::net::SocketAddr::new(address, listen.port()).to_string();
        runtime.spawn(register(node, namespace, im_address, disks, heartbeat_interval));
    }
    if let Err(e) = runtime.block_on(ironhorn_instance_manager::serve(config)) {
        ironhorn_proto::say_err!("ironhorn-instance-manager: {e}");
        std::process::exit(1);
    }
}
