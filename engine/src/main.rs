//! `ironhorn-engine`: serve a volume, or drive a running engine.

use std::time::Duration;

use clap::{Parser, Subcommand};
use ironhorn_engine::{ServeConfig, nbd, parse_size};
use ironhorn_proto::engine::engine_client::EngineClient;
use ironhorn_proto::engine::*;

#[derive(Parser)]
#[command(name = "ironhorn-engine", version, about = "The engine of one ironhorn volume")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a volume over NBD (and as a block device) from its replicas.
    Serve {
        #[arg(long)]
        volume: String,
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Fencing epoch; must be higher than any earlier engine's.
        #[arg(long)]
        epoch: u64,
        /// Replica gRPC address; repeat for each replica.
        #[arg(long = "replica", required = true)]
        replicas: Vec<String>,
        /// NBD listener: unix:PATH or tcp:HOST:PORT; repeatable.
        #[arg(long)]
        nbd: Vec<nbd::Listen>,
        /// Also expose the volume as /dev/ironhorn/<volume>.
        #[arg(long)]
        blockdev: bool,
        /// Read the block device's FUSE requests from /dev/fuse even where
        /// the kernel offers them over io_uring (to compare the two).
        #[arg(long)]
        no_fuse_uring: bool,
        /// Control gRPC address (port 0 picks one; it is printed).
        #[arg(long, default_value = "127.0.0.1:9600")]
        listen: std::net::SocketAddr,
        /// Seconds a replica may take to answer before it is dropped.
        #[arg(long, default_value_t = 8)]
        replica_timeout: u64,
        /// Limit rebuild copying to this many MiB/s (0: unlimited).
        #[arg(long, default_value_t = 0)]
        rebuild_mib_per_sec: u64,
        /// Refuse writes and flushes that fewer than a majority of the
        /// --replica list acknowledged (default: one healthy replica is
        /// enough). An engine cut off from most replicas then fails writes
        /// instead of acknowledging what a newer engine will never see.
        #[arg(long)]
        write_majority: bool,
        /// Frontend requests (reads, writes, trims) per second (0: unlimited).
        #[arg(long, default_value_t = 0)]
        iops_limit: u64,
        /// Frontend bytes per second, e.g. 100MiB (0: unlimited).
        #[arg(long, default_value = "0", value_parser = parse_size)]
        bandwidth_limit: u64,
        /// This node's directory of replica sockets (a replica started with
        /// the same --local-sockets is reached there instead of over TCP).
        #[arg(long, value_name = "DIR")]
        local_sockets: Option<std::path::PathBuf>,
    },
    /// Print the engine's status as JSON.
    Status {
        #[arg(long)]
        engine: String,
    },
    /// Print the frontend request counters (requests, errors, bytes,
    /// latency histogram per kind) as JSON.
    Metrics {
        #[arg(long)]
        engine: String,
    },
    /// Add or remove a replica.
    Replica {
        #[command(subcommand)]
        action: ReplicaAction,
    },
    /// Snapshot operations.
    Snapshot {
        #[command(subcommand)]
        action: SnapshotAction,
    },
    /// Read back every block of every RW replica and repair bad ones from
    /// a healthy replica; prints the scrub's state (with --wait, once it
    /// ended).
    Scrub {
        #[arg(long)]
        engine: String,
        #[arg(long)]
        wait: bool,
    },
    /// Grow the volume.
    Expand {
        #[arg(long)]
        engine: String,
        #[arg(long, value_parser = parse_size)]
        size: u64,
    },
    /// Replace the frontend I/O limits (0: unlimited).
    Limits {
        #[arg(long)]
        engine: String,
        #[arg(long, default_value_t = 0)]
        iops: u64,
        #[arg(long, default_value = "0", value_parser = parse_size)]
        bandwidth: u64,
    },
    /// Limit rebuild copying to this many MiB/s from now on (0: unlimited).
    RebuildRate {
        #[arg(long)]
        engine: String,
        #[arg(long)]
        mib_per_sec: u64,
    },
}

#[derive(Subcommand)]
enum ReplicaAction {
    /// Add a replica and rebuild it (waits until it is RW unless --no-wait).
    Add {
        #[arg(long)]
        engine: String,
        #[arg(long)]
        replica: String,
        #[arg(long)]
        no_wait: bool,
    },
    Remove {
        #[arg(long)]
        engine: String,
        #[arg(long)]
        replica: String,
    },
}

#[derive(Subcommand)]
enum SnapshotAction {
    Create {
        #[arg(long)]
        engine: String,
        name: String,
    },
    List {
        #[arg(long)]
        engine: String,
    },
    Delete {
        #[arg(long)]
        engine: String,
        name: String,
    },
    Revert {
        #[arg(long)]
        engine: String,
        name: String,
    },
}

async fn client(address: &str) -> Result<EngineClient<tonic::transport::Channel>, String> {
    EngineClient::connect(format!("http://{address}")).await.map_err(|e| format!("connect to engine {address}: {e}"))
}

fn print_status(s: StatusResponse) {
    let replicas: Vec<_> = s
        .replicas
        .iter()
        .map(|r| serde_json::json!({"address": r.address, "mode": r.mode, "error": r.error, "transport": r.transport}))
        .collect();
    let rebuilds: Vec<_> = s
        .rebuilds
        .iter()
        .map(|r| {
            serde_json::json!({
                "replica": r.replica, "source": r.source, "state": r.state, "method": r.method,
                "compared_bytes": r.compared_bytes, "copied_bytes": r.copied_bytes, "total_bytes": r.total_bytes,
                "error": r.error, "started_unix_ms": r.started_unix_ms, "finished_unix_ms": r.finished_unix_ms,
                "join_moves": r.join_moves,
            })
        })
        .collect();
    let json = serde_json::json!({
        "volume": s.volume, "size_bytes": s.size_bytes, "epoch": s.epoch, "frontends": s.frontends,
        "replicas": replicas, "rebuilds": rebuilds, "fenced": s.fenced, "out_of_space": s.out_of_space,
        "unflushed_bytes": s.unflushed_bytes, "scrub": s.scrub.map(scrub_json),
        "rebuild_bytes_per_sec": s.rebuild_bytes_per_sec,
        "limits": s.limits.map(|l| serde_json::json!({ "iops": l.iops, "bytes_per_sec": l.bytes_per_sec })),
        "bad_blocks_found": s.bad_blocks_found, "bad_blocks_repaired": s.bad_blocks_repaired,
    });
    ironhorn_proto::say!("{}", serde_json::to_string_pretty(&json).expect("json"));
}

fn scrub_json(s: ScrubStatus) -> serde_json::Value {
    serde_json::json!({
        "state": s.state, "checked_bytes": s.checked_bytes, "total_bytes": s.total_bytes,
        "bad_blocks": s.bad_blocks, "repaired_blocks": s.repaired_blocks, "error": s.error,
        "started_unix_ms": s.started_unix_ms, "finished_unix_ms": s.finished_unix_ms,
    })
}

fn print_snapshots(l: SnapshotListResponse) {
    let list: Vec<_> = l
        .snapshots
        .iter()
        .map(|s| serde_json::json!({"name": s.name, "created_unix_ms": s.created_unix_ms, "size_bytes": s.size_bytes}))
        .collect();
    ironhorn_proto::say!("{}", serde_json::to_string_pretty(&list).expect("json"));
}

async fn drive(command: Command) -> Result<(), String> {
    let fail = |e: tonic::Status| e.message().to_string();
    match command {
        Command::Serve {
            volume,
            size,
            epoch,
            replicas,
            nbd,
            blockdev,
            no_fuse_uring,
            listen,
            replica_timeout,
            rebuild_mib_per_sec,
            write_majority,
            iops_limit,
            bandwidth_limit,
            local_sockets,
        } => {
            ironhorn_engine::serve(ServeConfig {
                volume,
                size,
                epoch,
                replicas,
                nbd,
                blockdev,
                fuse_uring: !no_fuse_uring,
                listen,
                replica_timeout: Duration::from_secs(replica_timeout),
                rebuild_bytes_per_sec: rebuild_mib_per_sec << 20,
                write_majority,
                limits: ironhorn_engine::limit::Limits { iops: iops_limit, bytes_per_sec: bandwidth_limit },
                local_sockets,
            })
            .await
        }
        Command::Status { engine } => {
            let s = client(&engine).await?.status(StatusRequest {}).await.map_err(fail)?;
            print_status(s.into_inner());
            Ok(())
        }
        Command::Metrics { engine } => {
            let m = client(&engine).await?.metrics(MetricsRequest {}).await.map_err(fail)?.into_inner();
            let ops: Vec<_> = m
                .ops
                .iter()
                .map(|o| {
                    serde_json::json!({
                        "op": o.op, "requests": o.requests, "errors": o.errors, "bytes": o.bytes,
                        "latency_ns_total": o.latency_ns_total, "latency_buckets": o.latency_buckets,
                    })
                })
                .collect();
            let json = serde_json::json!({"volume": m.volume, "latency_bounds_us": m.latency_bounds_us, "ops": ops});
            ironhorn_proto::say!("{}", serde_json::to_string_pretty(&json).expect("json"));
            Ok(())
        }
        Command::Replica { action: ReplicaAction::Add { engine, replica, no_wait } } => {
            let req = ReplicaAddRequest { address: replica, wait: !no_wait };
            print_status(client(&engine).await?.replica_add(req).await.map_err(fail)?.into_inner());
            Ok(())
        }
        Command::Replica { action: ReplicaAction::Remove { engine, replica } } => {
            let req = ReplicaRemoveRequest { address: replica };
            print_status(client(&engine).await?.replica_remove(req).await.map_err(fail)?.into_inner());
            Ok(())
        }
        Command::Snapshot { action } => {
            let list = match action {
                SnapshotAction::Create { engine, name } => {
                    client(&engine).await?.snapshot_create(SnapshotRequest { name }).await
                }
                SnapshotAction::List { engine } => client(&engine).await?.snapshot_list(SnapshotListRequest {}).await,
                SnapshotAction::Delete { engine, name } => {
                    client(&engine).await?.snapshot_delete(SnapshotRequest { name }).await
                }
                SnapshotAction::Revert { engine, name } => {
                    client(&engine).await?.snapshot_revert(SnapshotRequest { name }).await
                }
            };
            print_snapshots(list.map_err(fail)?.into_inner());
            Ok(())
        }
        Command::Scrub { engine, wait } => {
            let mut c = client(&engine).await?;
            let mut s = c.scrub(ScrubRequest {}).await.map_err(fail)?.into_inner();
            while wait && s.state == "running" {
                tokio::time::sleep(Duration::from_millis(200)).await;
                s = c.status(StatusRequest {}).await.map_err(fail)?.into_inner().scrub.unwrap_or_default();
            }
            ironhorn_proto::say!("{}", serde_json::to_string_pretty(&scrub_json(s)).expect("json"));
            Ok(())
        }
        Command::Expand { engine, size } => {
            let s = client(&engine).await?.expand(ExpandRequest { size_bytes: size }).await.map_err(fail)?;
            print_status(s.into_inner());
            Ok(())
        }
        Command::Limits { engine, iops, bandwidth } => {
            let limits = IoLimits { iops, bytes_per_sec: bandwidth };
            let s = client(&engine).await?.set_limits(limits).await.map_err(fail)?;
            print_status(s.into_inner());
            Ok(())
        }
        Command::RebuildRate { engine, mib_per_sec } => {
            let rate = RebuildRate { bytes_per_sec: mib_per_sec << 20 };
            let s = client(&engine).await?.set_rebuild_rate(rate).await.map_err(fail)?;
            print_status(s.into_inner());
            Ok(())
        }
    }
}

fn main() {
    ironhorn_proto::say::init_logging();
    let cli = Cli::parse();
    let runtime = ironhorn_proto::runtime::build().expect("tokio runtime");
    if let Err(e) = runtime.block_on(drive(cli.command)) {
        ironhorn_proto::say_err!("ironhorn-engine: {e}");
        std::process::exit(1);
    }
}
