//! `ironhorn-instance-manager`: supervise one node's engine and replica processes.

use std::time::Duration;

use clap::{Parser, Subcommand};
use ironhorn_instance_manager::{Config, parse_port_range};

#[derive(Parser)]
#[command(name = "ironhorn-instance-manager", about = "Starts and watches one node's ironhorn processes")]
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
    },
}

fn main() {
    ironhorn_proto::say::init_logging();
    let Command::Serve { data_dir, listen, address, port_range, bin_dir, stop_grace_secs } = Cli::parse().command;
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
    };
    let runtime = ironhorn_proto::runtime::build().expect("tokio runtime");
    if let Err(e) = runtime.block_on(ironhorn_instance_manager::serve(config)) {
        ironhorn_proto::say_err!("ironhorn-instance-manager: {e}");
        std::process::exit(1);
    }
}
