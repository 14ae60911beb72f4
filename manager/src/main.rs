//! `ironhorn`: the CLI (talks to the REST API), the manager, and `ironhorn up`.

use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use ironhorn_manager::client::{call, wait_for};
use ironhorn_manager::follow::{Stream, follow};
use ironhorn_manager::{cluster::GrpcCluster, crd, standalone};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(name = "ironhorn", version, about = "ironhorn: replicated block storage")]
struct Cli {
    /// REST API of the manager.
    #[arg(long, global = true, env = "IRONHORN_API", default_value = "http://127.0.0.1:9700")]
    api: String,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a standalone cluster on this machine (manager + N nodes) until Ctrl-C.
    Up {
        #[arg(long, default_value = "ironhorn-data")]
        data_dir: std::path::PathBuf,
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// API port; node I's instance manager listens on BASE+I.
        #[arg(long, default_value_t = 9700)]
        port_base: u16,
        /// Ports each node hands out, one per engine or replica it runs
        /// (node I's are BASE+N·I … BASE+N·I+N-1).
        #[arg(long, default_value_t = 100)]
        ports_per_node: u16,
        /// Size of each node's disk.
        #[arg(long, default_value = "8GiB", value_parser = ironhorn_proto::units::parse_size)]
        disk_size: u64,
        /// Use a directory of file stores per node even where LVM works.
        #[arg(long)]
        file_disks: bool,
        /// Put each node (its instance manager, engines and replicas) in its
        /// own network namespace on a bridge, for network faults (root).
        #[arg(long)]
        netns: bool,
        /// Start replicas with their fault-injection API on (chaos tests).
        #[arg(long)]
        fault_injection: bool,
        /// Leave a node's instance manager dead when it dies (by default `up`
        /// starts it again, as a DaemonSet would): the node stays down, as a
        /// machine that is gone.
        #[arg(long)]
        no_supervise: bool,
    },
    /// Remove what `up` made under a data dir (LVs, VGs, loop devices, files).
    Purge {
        #[arg(long)]
        data_dir: std::path::PathBuf,
    },
    /// Run the manager alone (controllers + API).
    Manager {
        /// Embedded datastore directory (one machine).
        #[arg(long, conflicts_with = "kubernetes")]
        data_dir: Option<std::path::PathBuf>,
        /// Use the Kubernetes apiserver as the datastore.
        #[arg(long)]
        kubernetes: bool,
        #[arg(long, default_value = "ironhorn-system", env = "POD_NAMESPACE")]
        namespace: String,
        #[arg(long, default_value = "127.0.0.1:9700")]
        listen: std::net::SocketAddr,
        /// This manager's name in the leader Lease (with --kubernetes, where
        /// several managers share the datastore; default: host name and pid).
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// Seconds a leader's lease stands unrenewed before another manager
        /// takes over; the leader stops reconciling 5 s before that.
        #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(8..))]
        lease_duration: u64,
    },
    /// Print the CRDs (what deploy/crds.yaml holds).
    Crds,
    /// Serve the CSI driver (driver.ironhorn.io) on a unix socket.
    Csi {
        /// unix:///PATH/csi.sock
        #[arg(long)]
        endpoint: String,
        /// This node's name (the manager's Node object); required unless
        /// --mode controller.
        #[arg(long, default_value = "")]
        node_id: String,
        #[arg(long, value_enum, default_value_t = ironhorn_manager::csi::Mode::All)]
        mode: ironhorn_manager::csi::Mode,
        /// Where ephemeral inline volumes are staged on this node.
        #[arg(long, default_value = "/var/lib/ironhorn-csi")]
        state_dir: std::path::PathBuf,
    },
    #[command(subcommand)]
    Volume(VolumeCommand),
    #[command(subcommand)]
    Node(ListOnly),
    #[command(subcommand)]
    Replica(ListOnly),
    #[command(subcommand)]
    Engine(ListOnly),
    #[command(subcommand)]
    Setting(SettingCommand),
    #[command(subcommand)]
    Event(EventCommand),
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Ask for a snapshot (taken by the engine while attached, on the
    /// replicas while detached).
    Create {
        volume: String,
        name: String,
    },
    List {
        volume: String,
    },
    Delete {
        volume: String,
        name: String,
    },
}

#[derive(Subcommand)]
enum EventCommand {
    /// What the controllers decided, oldest first.
    List {
        #[arg(long)]
        volume: Option<String>,
    },
}

#[derive(Subcommand)]
enum VolumeCommand {
    Create {
        name: String,
        #[arg(long)]
        size: String,
        #[arg(long)]
        replicas: Option<u32>,
        #[arg(long, value_enum)]
        frontend: Option<FrontendArg>,
        /// Replicas that must acknowledge a write: one, or a majority
        /// (default: the default-write-majority setting).
        #[arg(long, value_parser = ["one", "majority"])]
        write_quorum: Option<String>,
        /// Start from a snapshot (snapshot://NAME) or a copy of another
        /// volume (volume://NAME); copied before the first attach.
        #[arg(long)]
        from: Option<String>,
        /// Frontend requests per second the engine lets through (0: none).
        #[arg(long)]
        iops_limit: Option<u64>,
        /// Frontend bytes per second, e.g. 100MiB (0: none).
        #[arg(long)]
        bandwidth_limit: Option<String>,
    },
    List,
    Get {
        name: String,
        /// Keep showing the volume as it changes (state, robustness, each
        /// rebuild's progress) until interrupted: progress bars on a
        /// terminal, a line per change otherwise.
        #[arg(long, short = 'w')]
        watch: bool,
    },
    /// Attach to a node and print the endpoint once attached (progress on
    /// stderr while waiting).
    Attach {
        name: String,
        #[arg(long)]
        node: String,
        #[arg(long, value_enum)]
        frontend: Option<FrontendArg>,
        /// Also wait until every replica is rebuilt and the volume healthy,
        /// showing the rebuilds' progress.
        #[arg(long)]
        wait_healthy: bool,
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    Detach {
        name: String,
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Change the replica count (replicas are added or removed while the
    /// volume is attached) or the I/O limits (applied at once while
    /// attached; 0 removes a limit).
    Update {
        name: String,
        #[arg(long)]
        replicas: Option<u32>,
        #[arg(long)]
        iops_limit: Option<u64>,
        /// Bytes per second, e.g. 100MiB.
        #[arg(long)]
        bandwidth_limit: Option<String>,
    },
    /// Grow the volume (attached or detached) and wait until its data has
    /// the new size.
    Expand {
        name: String,
        #[arg(long)]
        size: String,
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Read back every block of every replica of an attached volume and
    /// repair bad ones from a healthy replica; waits until the scrub ended
    /// and prints what it found.
    Scrub {
        name: String,
        #[arg(long, default_value_t = 3600)]
        timeout_secs: u64,
    },
    /// Delete the volume, its engine, replicas and their stores.
    Delete {
        name: String,
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum FrontendArg {
    Nbd,
    Blockdev,
}

impl FrontendArg {
    fn as_str(self) -> &'static str {
        match self {
            Self::Nbd => "nbd",
            Self::Blockdev => "blockdev",
        }
    }
}

#[derive(Subcommand)]
enum ListOnly {
    List,
}

#[derive(Subcommand)]
enum SettingCommand {
    List,
    Get { name: String },
    Set { name: String, value: String },
}

fn print_table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<String>| {
        let text: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        ironhorn_proto::say!("{}", text.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row);
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn bytes(v: &Value) -> String {
    v.as_u64().map(ironhorn_proto::units::format_size).unwrap_or_else(|| s(v))
}

fn condition_message(volume: &Value, type_: &str) -> Option<(String, String)> {
    volume["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| (s(&c["status"]), s(&c["message"])))
}

fn volume_rows(volumes: &[Value]) -> Vec<Vec<String>> {
    volumes
        .iter()
        .map(|v| {
            let unscheduled = condition_message(v, "Scheduled").filter(|(st, _)| st == "False").map(|(_, m)| m);
            vec![
                s(&v["metadata"]["name"]),
                s(&v["status"]["state"]),
                s(&v["status"]["robustness"]),
                bytes(&v["spec"]["size"]),
                s(&v["spec"]["numberOfReplicas"]),
                s(&v["status"]["currentNodeID"]),
                s(&v["status"]["endpoint"]),
                unscheduled.unwrap_or_default(),
            ]
        })
        .collect()
}

const VOLUME_HEADERS: [&str; 8] = ["NAME", "STATE", "ROBUSTNESS", "SIZE", "REPLICAS", "NODE", "ENDPOINT", "MESSAGE"];

/// GETs a list and prints it as JSON or as a table of (header, dotted path).
async fn list_objects(api: &str, path: &str, json_out: bool, columns: &[(&str, &str)]) -> Result<(), String> {
    let v = call(api, "GET", path, None).await?;
    if json_out {
        ironhorn_proto::say!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    let field = |o: &Value, path: &str| s(path.split('.').fold(o, |v, key| &v[key]));
    let rows = v
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|o| columns.iter().map(|(_, path)| field(o, path)).collect())
        .collect();
    print_table(&columns.iter().map(|(h, _)| *h).collect::<Vec<_>>(), rows);
    Ok(())
}

async fn drive(cli: Cli) -> Result<(), String> {
    let api = cli.api.as_str();
    let json_out = cli.output == Output::Json;
    let print_json = |v: &Value| ironhorn_proto::say!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    match cli.command {
        Command::Up {
            data_dir,
            nodes,
            port_base,
            ports_per_node,
            disk_size,
            file_disks,
            netns,
            fault_injection,
            no_supervise,
        } => {
            let bin_dir =
                std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.to_path_buf())).unwrap_or_default();
            standalone::up(standalone::UpConfig {
                data_dir,
                nodes,
                port_base,
                ports_per_node,
                disk_size,
                file_disks,
                netns,
                fault_injection,
                supervise: !no_supervise,
                bin_dir,
            })
            .await
        }
        Command::Purge { data_dir } => standalone::purge(&data_dir),
        Command::Manager { data_dir, kubernetes, namespace, listen, identity, lease_duration } => {
            if kubernetes {
                let store = ironhorn_manager::datastore::kubernetes::KubeStore::connect(&namespace)
                    .await
                    .map_err(|e| e.to_string())?;
                let identity = identity.unwrap_or_else(default_identity);
                let timing = ironhorn_manager::leader::Timing {
                    duration: std::time::Duration::from_secs(lease_duration),
                    renew_deadline: std::time::Duration::from_secs(lease_duration - 5),
                    retry: std::time::Duration::from_secs(2),
                };
                let election = ironhorn_manager::Election { identity, timing };
                ironhorn_manager::serve(store, GrpcCluster::default(), listen, Some(election)).await
            } else {
                let dir = data_dir.ok_or("give --data-dir (embedded datastore) or --kubernetes")?;
                let store =
                    ironhorn_manager::datastore::embedded::EmbeddedStore::open(&dir).map_err(|e| e.to_string())?;
                // One directory has one manager: no election.
                ironhorn_manager::serve(store, GrpcCluster::default(), listen, None).await
            }
        }
        Command::Crds => {
            ironhorn_proto::say!("{}", crd::crds_yaml().trim_end());
            Ok(())
        }
        Command::Csi { endpoint, node_id, mode, state_dir } => {
            let config = ironhorn_manager::csi::Config { endpoint, node_id, mode, api: api.to_string(), state_dir };
            ironhorn_manager::csi::serve(config).await
        }
        Command::Volume(command) => match command {
            VolumeCommand::Create {
                name,
                size,
                replicas,
                frontend,
                write_quorum,
                from,
                iops_limit,
                bandwidth_limit,
            } => {
                let mut body = json!({ "name": name, "size": size });
                if let Some(n) = iops_limit {
                    body["iopsLimit"] = json!(n);
                }
                if let Some(b) = bandwidth_limit {
                    body["bandwidthLimit"] = json!(b);
                }
                if let Some(r) = replicas {
                    body["numberOfReplicas"] = json!(r);
                }
                if let Some(f) = frontend {
                    body["frontend"] = json!(f.as_str());
                }
                if let Some(q) = write_quorum {
                    body["writeQuorum"] = json!(q);
                }
                if let Some(source) = from {
                    body["dataSource"] = json!(source);
                }
                let v = call(api, "POST", "/v1/volumes", Some(&body)).await?;
                if json_out {
                    print_json(&v)
                } else {
                    ironhorn_proto::say!("volume {name} created")
                }
                Ok(())
            }
            VolumeCommand::List => {
                let v = call(api, "GET", "/v1/volumes", None).await?;
                if json_out {
                    print_json(&v);
                } else {
                    print_table(&VOLUME_HEADERS, volume_rows(v.as_array().map(Vec::as_slice).unwrap_or_default()));
                }
                Ok(())
            }
            VolumeCommand::Get { name, watch: true } => {
                follow(api, &name, Stream::Stdout, |_| false, None).await.map(drop)
            }
            VolumeCommand::Get { name, watch: false } => {
                let v = call(api, "GET", &format!("/v1/volumes/{name}"), None).await?;
                if json_out {
                    print_json(&v)
                } else {
                    print_table(&VOLUME_HEADERS, volume_rows(&[v]))
                }
                Ok(())
            }
            VolumeCommand::Attach { name, node, frontend, wait_healthy, timeout_secs } => {
                let mut body = json!({ "node": node });
                if let Some(f) = frontend {
                    body["frontend"] = json!(f.as_str());
                }
                call(api, "POST", &format!("/v1/volumes/{name}/attach"), Some(&body)).await?;
                let timeout = Some(Duration::from_secs(timeout_secs));
                let attached = |view: &ironhorn_manager::watch::View| {
                    view.state == "attached" && (!wait_healthy || (view.settled() && view.robustness == "healthy"))
                };
                follow(api, &name, Stream::Stderr, attached, timeout).await?;
                let v = wait_for(api, &name, Duration::from_secs(timeout_secs), |v| {
                    v.is_some_and(|v| v["status"]["state"] == "attached" && !s(&v["status"]["endpoint"]).is_empty())
                })
                .await?
                .expect("attached volumes exist");
                if json_out {
                    print_json(&v);
                } else {
                    let blockdev = s(&v["status"]["blockdev"]);
                    ironhorn_proto::say!(
                        "{}",
                        if blockdev.is_empty() { s(&v["status"]["endpoint"]) } else { blockdev }
                    );
                }
                Ok(())
            }
            VolumeCommand::Update { name, replicas, iops_limit, bandwidth_limit } => {
                let mut body = json!({});
                if let Some(r) = replicas {
                    body["numberOfReplicas"] = json!(r);
                }
                if let Some(n) = iops_limit {
                    body["iopsLimit"] = json!(n);
                }
                if let Some(b) = bandwidth_limit {
                    body["bandwidthLimit"] = json!(b);
                }
                let v = call(api, "POST", &format!("/v1/volumes/{name}/update"), Some(&body)).await?;
                if json_out {
                    print_json(&v)
                } else {
                    let spec = &v["spec"];
                    ironhorn_proto::say!(
                        "volume {name}: {} replicas wanted, iops limit {}, bandwidth limit {}",
                        spec["numberOfReplicas"],
                        spec["iopsLimit"].as_u64().filter(|n| *n > 0).map_or("none".to_string(), |n| n.to_string()),
                        spec["bandwidthLimit"]
                            .as_u64()
                            .filter(|n| *n > 0)
                            .map_or("none".to_string(), |n| format!("{}/s", ironhorn_proto::units::format_size(n)))
                    )
                }
                Ok(())
            }
            VolumeCommand::Expand { name, size, timeout_secs } => {
                let v =
                    call(api, "POST", &format!("/v1/volumes/{name}/expand"), Some(&json!({ "size": size }))).await?;
                let want = v["spec"]["size"].as_u64().unwrap_or(0);
                let v = wait_for(api, &name, Duration::from_secs(timeout_secs), |v| {
                    v.is_some_and(|v| v["status"]["currentSize"].as_u64().unwrap_or(0) >= want)
                })
                .await?
                .unwrap_or_default();
                if json_out {
                    print_json(&v)
                } else {
                    ironhorn_proto::say!("volume {name}: {want} bytes")
                }
                Ok(())
            }
            VolumeCommand::Scrub { name, timeout_secs } => {
                let v = call(api, "POST", &format!("/v1/volumes/{name}/scrub"), None).await?;
                let asked = v["spec"]["scrubRequested"].as_u64().unwrap_or(0);
                let v = wait_for(api, &name, Duration::from_secs(timeout_secs), |v| {
                    v.is_some_and(|v| {
                        let scrub = &v["status"]["scrub"];
                        scrub["requested"].as_u64() >= Some(asked)
                            && (scrub["state"] == "done" || scrub["state"] == "failed")
                    })
                })
                .await?
                .unwrap_or_default();
                let scrub = &v["status"]["scrub"];
                if json_out {
                    print_json(scrub)
                } else {
                    ironhorn_proto::say!(
                        "volume {name}: scrub {}: {} MiB read back, {} bad block(s), {} repaired{}",
                        s(&scrub["state"]),
                        scrub["checkedBytes"].as_u64().unwrap_or(0) >> 20,
                        scrub["badBlocks"].as_u64().unwrap_or(0),
                        scrub["repairedBlocks"].as_u64().unwrap_or(0),
                        if s(&scrub["error"]).is_empty() { String::new() } else { format!(": {}", s(&scrub["error"])) }
                    )
                }
                if scrub["state"] == "failed" {
                    return Err(format!("scrub of {name} failed: {}", s(&scrub["error"])));
                }
                Ok(())
            }
            VolumeCommand::Detach { name, timeout_secs } => {
                call(api, "POST", &format!("/v1/volumes/{name}/detach"), None).await?;
                wait_for(api, &name, Duration::from_secs(timeout_secs), |v| {
                    v.is_some_and(|v| v["status"]["state"] == "detached")
                })
                .await?;
                ironhorn_proto::say!("volume {name} detached");
                Ok(())
            }
            VolumeCommand::Delete { name, timeout_secs } => {
                call(api, "DELETE", &format!("/v1/volumes/{name}"), None).await?;
                wait_for(api, &name, Duration::from_secs(timeout_secs), |v| v.is_none()).await?;
                ironhorn_proto::say!("volume {name} deleted");
                Ok(())
            }
        },
        Command::Node(ListOnly::List) => {
            let v = call(api, "GET", "/v1/nodes", None).await?;
            if json_out {
                print_json(&v);
                return Ok(());
            }
            let mut rows = Vec::new();
            for node in v.as_array().map(Vec::as_slice).unwrap_or_default() {
                let ready = node["status"]["conditions"]
                    .as_array()
                    .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                    .map(|c| s(&c["status"]))
                    .unwrap_or_default();
                let disks = node["spec"]["disks"].as_object().cloned().unwrap_or_default();
                for (disk, spec) in disks {
                    let st = &node["status"]["diskStatus"][&disk];
                    rows.push(vec![
                        s(&node["metadata"]["name"]),
                        ready.clone(),
                        disk.clone(),
                        s(&spec["path"]),
                        bytes(&st["storageMaximum"]),
                        bytes(&st["storageScheduled"]),
                        bytes(&st["storageAvailable"]),
                    ]);
                }
            }
            print_table(&["NODE", "READY", "DISK", "PATH", "MAX", "SCHEDULED", "FREE"], rows);
            Ok(())
        }
        Command::Replica(ListOnly::List) => {
            let columns = [
                ("NAME", "metadata.name"),
                ("VOLUME", "spec.volumeName"),
                ("NODE", "spec.nodeID"),
                ("STORE", "spec.dataPath"),
                ("STATE", "status.currentState"),
                ("ADDRESS", "status.address"),
                ("RETRIES", "spec.rebuildRetryCount"),
                ("FAILED AT", "spec.failedAt"),
            ];
            list_objects(api, "/v1/replicas", json_out, &columns).await
        }
        Command::Engine(ListOnly::List) => {
            let columns = [
                ("NAME", "metadata.name"),
                ("VOLUME", "spec.volumeName"),
                ("NODE", "spec.nodeID"),
                ("EPOCH", "spec.epoch"),
                ("STATE", "status.currentState"),
                ("REPLICA MODES", "status.replicaModeMap"),
            ];
            list_objects(api, "/v1/engines", json_out, &columns).await
        }
        Command::Event(EventCommand::List { volume }) => {
            let path = match &volume {
                Some(v) => format!("/v1/events?volume={v}"),
                None => "/v1/events".to_string(),
            };
            let v = call(api, "GET", &path, None).await?;
            if json_out {
                print_json(&v);
            } else {
                let rows = v
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .map(|e| vec![s(&e["time"]), s(&e["volume"]), s(&e["type"]), s(&e["reason"]), s(&e["message"])])
                    .collect();
                print_table(&["TIME", "VOLUME", "TYPE", "REASON", "MESSAGE"], rows);
            }
            Ok(())
        }
        Command::Snapshot(command) => {
            let v = match command {
                SnapshotCommand::Create { volume, name } => {
                    let body = json!({ "name": name });
                    call(api, "POST", &format!("/v1/volumes/{volume}/snapshots"), Some(&body)).await?
                }
                SnapshotCommand::List { volume } => {
                    call(api, "GET", &format!("/v1/volumes/{volume}/snapshots"), None).await?
                }
                SnapshotCommand::Delete { volume, name } => {
                    call(api, "DELETE", &format!("/v1/volumes/{volume}/snapshots/{name}"), None).await?
                }
            };
            if json_out {
                print_json(&v);
            } else if v.is_array() || v.get("metadata").is_some() {
                let items = if v.is_array() { v.as_array().cloned().unwrap_or_default() } else { vec![v] };
                let rows = items
                    .iter()
                    .map(|i| {
                        let st = &i["status"];
                        vec![
                            s(&i["metadata"]["name"]),
                            s(&i["spec"]["volume"]),
                            st["readyToUse"].as_bool().unwrap_or(false).to_string(),
                            s(&st["creationTime"]),
                            s(&st["message"]),
                        ]
                    })
                    .collect();
                print_table(&["NAME", "VOLUME", "READY", "CREATED", "MESSAGE"], rows);
            } else {
                ironhorn_proto::say!("{v}");
            }
            Ok(())
        }
        Command::Setting(command) => {
            let v = match command {
                SettingCommand::List => call(api, "GET", "/v1/settings", None).await?,
                SettingCommand::Get { name } => call(api, "GET", &format!("/v1/settings/{name}"), None).await?,
                SettingCommand::Set { name, value } => {
                    call(api, "PUT", &format!("/v1/settings/{name}"), Some(&json!({ "value": value }))).await?
                }
            };
            if json_out {
                print_json(&v);
            } else {
                let items = if v.is_array() { v.as_array().cloned().unwrap_or_default() } else { vec![v] };
                let rows = items.iter().map(|i| vec![s(&i["name"]), s(&i["value"]), s(&i["default"])]).collect();
                print_table(&["NAME", "VALUE", "DEFAULT"], rows);
            }
            Ok(())
        }
    }
}

/// The host's name and this process's id: unique among managers.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

fn main() {
    ironhorn_proto::say::init_logging();
    let cli = Cli::parse();
    let runtime = ironhorn_proto::runtime::build().expect("tokio runtime");
    if let Err(e) = runtime.block_on(drive(cli)) {
        ironhorn_proto::say_err!("ironhorn: {e}");
        std::process::exit(1);
    }
}
