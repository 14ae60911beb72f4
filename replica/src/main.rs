//! `ironhorn-replica`: serve or delete one replica store.

use clap::{Parser, Subcommand};
use ironhorn_replica::device::StoreLocation;
use ironhorn_replica::io::BackendKind;
use ironhorn_replica::store::StoreConfig;
use ironhorn_replica::{ServeConfig, parse_size};

#[derive(Parser)]
#[command(name = "ironhorn-replica", version, about = "One replica of one ironhorn volume")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Open the store (creating it if missing) and serve it over gRPC.
    Serve {
        /// file:PATH or lvm:VG/LV
        #[arg(long)]
        store: StoreLocation,
        /// Volume size, e.g. 1GiB. Must match an existing store (see --grow).
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Grow an existing store of a smaller volume to --size (the volume
        /// was expanded while this replica was down). Never shrinks.
        #[arg(long)]
        grow: bool,
        /// Address for the gRPC server (port 0 picks one; it is printed).
        #[arg(long, default_value = "127.0.0.1:9500")]
        listen: std::net::SocketAddr,
        /// Also listen on DIR/<listen address>.sock, for an engine on this
        /// node given the same directory (faster than TCP on loopback).
        #[arg(long, value_name = "DIR")]
        local_sockets: Option<std::path::PathBuf>,
        /// Physical size of a new store (default: size × 1.25 + metadata).
        #[arg(long, value_parser = parse_size)]
        capacity: Option<u64>,
        /// I/O backend: uring (io_uring, O_DIRECT) or pread.
        #[arg(long, default_value = "uring")]
        io: BackendKind,
        /// Serve the Faults gRPC service, which fails this replica's disk on
        /// request. For tests only.
        #[arg(long)]
        fault_injection: bool,
    },
    /// Delete a store: remove the file or the LV.
    Delete {
        #[arg(long)]
        store: StoreLocation,
    },
}

fn main() {
    ironhorn_proto::say::init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve { store, size, grow, listen, local_sockets, capacity, io, fault_injection } => {
            let mut config = StoreConfig::new(store, size);
            config.grow = grow;
            config.capacity_bytes = capacity;
            config.backend = io;
            let runtime = ironhorn_proto::runtime::build().expect("tokio runtime");
            runtime.block_on(ironhorn_replica::serve(ServeConfig {
                store: config,
                listen,
                local_sockets,
                fault_injection,
            }))
        }
        Command::Delete { store } => ironhorn_replica::delete(&store),
    };
    if let Err(e) = result {
        ironhorn_proto::say_err!("ironhorn-replica: {e}");
        std::process::exit(1);
    }
}
