//! The instance table and the gRPC service over it.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ironhorn_proto::instance::instance_manager_server::InstanceManager;
use ironhorn_proto::instance::{self as pb, InstanceKind, InstanceState};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, broadcast};
use tonic::{Request, Response, Status};

use crate::{Config, disk, process};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Spec {
    Replica {
        store: String,
        size_bytes: u64,
    },
    Engine {
        volume: String,
        size_bytes: u64,
        epoch: u64,
        replicas: Vec<String>,
        blockdev: bool,
        replica_timeout_secs: u32,
        rebuild_mib_per_sec: u64,
        #[serde(default)]
        write_majority: bool,
        #[serde(default)]
        iops_limit: u64,
        #[serde(default)]
        bandwidth_limit: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum State {
    Starting,
    Running,
    Stopping,
    Stopped,
    Error,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Record {
    name: String,
    spec: Spec,
    state: State,
    pid: u32,
    /// Kernel start time of `pid`: tells our process from a reused pid.
    start_ticks: u64,
    ports: Vec<u16>,
    exited: bool,
    exit_code: Option<i32>,
    exit_signal: Option<i32>,
    error_message: String,
    address: String,
    nbd_endpoint: String,
    blockdev_path: String,
    log_path: PathBuf,
    started_at_unix_ms: u64,
    stop_requested: bool,
}

impl Record {
    fn alive(&self) -> bool {
        matches!(self.state, State::Starting | State::Running | State::Stopping)
    }

    fn to_proto(&self) -> pb::Instance {
        let (kind, spec) = match &self.spec {
            Spec::Replica { store, size_bytes } => (
                InstanceKind::Replica,
                pb::instance::Spec::Replica(pb::ReplicaSpec { store: store.clone(), size_bytes: *size_bytes }),
            ),
            Spec::Engine {
                volume,
                size_bytes,
                epoch,
                replicas,
                blockdev,
                replica_timeout_secs,
                rebuild_mib_per_sec,
                write_majority,
                iops_limit,
                bandwidth_limit,
            } => (
                InstanceKind::Engine,
                pb::instance::Spec::Engine(pb::EngineSpec {
                    volume: volume.clone(),
                    size_bytes: *size_bytes,
                    epoch: *epoch,
                    replicas: replicas.clone(),
                    blockdev: *blockdev,
                    replica_timeout_secs: *replica_timeout_secs,
                    rebuild_mib_per_sec: *rebuild_mib_per_sec,
                    write_majority: *write_majority,
                    iops_limit: *iops_limit,
                    bandwidth_limit: *bandwidth_limit,
                }),
            ),
        };
        let state = match self.state {
            State::Starting => InstanceState::Starting,
            State::Running => InstanceState::Running,
            State::Stopping => InstanceState::Stopping,
            State::Stopped => InstanceState::Stopped,
            State::Error => InstanceState::Error,
        };
        pb::Instance {
            name: self.name.clone(),
            kind: kind as i32,
            state: state as i32,
            pid: self.pid,
            exited: self.exited,
            exit_code: self.exit_code.unwrap_or(0),
            exit_signal: self.exit_signal.unwrap_or(0),
            error_message: self.error_message.clone(),
            address: self.address.clone(),
            nbd_endpoint: self.nbd_endpoint.clone(),
            blockdev_path: self.blockdev_path.clone(),
            log_path: self.log_path.display().to_string(),
            started_at_unix_ms: self.started_at_unix_ms,
            spec: Some(spec),
        }
    }
}

fn spec_from_request(request: &pb::CreateRequest) -> Result<Spec, Status> {
    match &request.spec {
        Some(pb::create_request::Spec::Replica(r)) => {
            r.store.parse::<ironhorn_replica::device::StoreLocation>().map_err(Status::invalid_argument)?;
            if r.size_bytes == 0 || r.size_bytes % 4096 != 0 {
                return Err(Status::invalid_argument(format!(
                    "size {} is not a positive multiple of 4096",
                    r.size_bytes
                )));
            }
            Ok(Spec::Replica { store: r.store.clone(), size_bytes: r.size_bytes })
        }
        Some(pb::create_request::Spec::Engine(e)) => {
            if e.replicas.is_empty() {
                return Err(Status::invalid_argument("an engine needs at least one replica"));
            }
            if e.size_bytes == 0 || e.size_bytes % 4096 != 0 || e.epoch == 0 || !valid_name(&e.volume) {
                return Err(Status::invalid_argument(
                    "engine needs a volume name, a size in 4 KiB units and epoch > 0",
                ));
            }
            Ok(Spec::Engine {
                volume: e.volume.clone(),
                size_bytes: e.size_bytes,
                epoch: e.epoch,
                replicas: e.replicas.clone(),
                blockdev: e.blockdev,
                replica_timeout_secs: if e.replica_timeout_secs == 0 { 8 } else { e.replica_timeout_secs },
                rebuild_mib_per_sec: e.rebuild_mib_per_sec,
                write_majority: e.write_majority,
                iops_limit: e.iops_limit,
                bandwidth_limit: e.bandwidth_limit,
            })
        }
        None => Err(Status::invalid_argument("create needs a replica or an engine spec")),
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn last_log_line(path: &PathBuf) -> String {
    let line = tail(path, 4096).lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_string();
    ironhorn_proto::say::plain(&line).trim().to_string()
}

fn tail(path: &PathBuf, max_bytes: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max_bytes)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

struct Inner {
    records: BTreeMap<String, Record>,
}

#[derive(Clone)]
pub struct InstanceManagerService {
    config: Arc<Config>,
    inner: Arc<Mutex<Inner>>,
    changes: broadcast::Sender<pb::Instance>,
    disks: Arc<disk::StatusCache>,
}

impl InstanceManagerService {
    fn table_path(config: &Config) -> PathBuf {
        config.data_dir.join("instances.json")
    }

    /// Loads the instance table and re-adopts the processes still running.
    pub async fn open(config: Config) -> Result<Self, String> {
        let path = Self::table_path(&config);
        let mut records: BTreeMap<String, Record> = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let mut adopted = Vec::new();
        for record in records.values_mut() {
            if !record.alive() {
                continue;
            }
            if process::start_ticks(record.pid) == Some(record.start_ticks) {
                // Still our process. It was starting or stopping when we went
                // away; it has had time since, so it is running (a stop that
                // was in progress is carried on by the caller's retry).
                record.state = if record.stop_requested { State::Stopping } else { State::Running };
                adopted.push((record.name.clone(), record.pid));
            } else {
                record.state = if record.stop_requested { State::Stopped } else { State::Error };
                record.exited = true;
                if !record.stop_requested {
                    record.error_message = "exited while the instance manager was down (exit status unknown)".into();
                }
            }
        }
        let (changes, _) = broadcast::channel(1024);
        let service = Self {
            config: Arc::new(config),
            inner: Arc::new(Mutex::new(Inner { records })),
            changes,
            disks: Arc::default(),
        };
        for (name, pid) in adopted {
            tracing::info!(instance = %name, pid, "re-adopted running instance");
            let svc = service.clone();
            tokio::spawn(async move {
                let result = process::wait_foreign_exit(pid).await;
                svc.exited(&name, pid, None, result.err().map(|e| e.to_string())).await;
            });
        }
        service.persist().await;
        Ok(service)
    }

    /// Writes the table atomically (temp file, fsync, rename).
    pub async fn persist(&self) {
        let inner = self.inner.lock().await;
        self.persist_locked(&inner);
    }

    fn persist_locked(&self, inner: &Inner) {
        let path = Self::table_path(&self.config);
        let tmp = path.with_extension("json.tmp");
        let result = (|| -> std::io::Result<()> {
            let bytes = serde_json::to_vec_pretty(&inner.records).map_err(std::io::Error::other)?;
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = result {
            tracing::error!(path = %path.display(), error = %e, "could not persist the instance table");
        }
    }

    fn publish(&self, inner: &Inner, name: &str) {
        self.persist_locked(inner);
        self.disks.changed();
        if let Some(record) = inner.records.get(name) {
            let _ = self.changes.send(record.to_proto());
        }
    }

    /// Records a process exit. `status` is None when it is unknown.
    async fn exited(&self, name: &str, pid: u32, status: Option<std::process::ExitStatus>, note: Option<String>) {
        use std::os::unix::process::ExitStatusExt;
        let mut inner = self.inner.lock().await;
        let Some(record) = inner.records.get_mut(name) else { return };
        if record.pid != pid || record.exited {
            return;
        }
        record.exited = true;
        record.exit_code = status.and_then(|s| s.code());
        record.exit_signal = status.and_then(|s| s.signal());
        if record.stop_requested {
            record.state = State::Stopped;
        } else {
            record.state = State::Error;
            let how = match (record.exit_code, record.exit_signal) {
                (Some(code), _) => format!("exited with code {code}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                _ => "exited (exit status unknown: adopted after an instance-manager restart)".to_string(),
            };
            let last = last_log_line(&record.log_path);
            record.error_message = match (last.is_empty(), note) {
                (_, Some(note)) => format!("{how}; {note}"),
                (true, None) => how,
                (false, None) => format!("{how}: {last}"),
            };
            tracing::warn!(instance = %name, pid, error = %record.error_message, "instance failed");
        }
        self.publish(&inner, name);
    }

    fn allocate_ports(&self, inner: &Inner, count: usize) -> Result<Vec<u16>, Status> {
        let used: std::collections::HashSet<u16> =
            inner.records.values().filter(|r| r.alive()).flat_map(|r| r.ports.iter().copied()).collect();
        let mut ports = Vec::new();
        for port in self.config.ports.0..=self.config.ports.1 {
            if used.contains(&port) {
                continue;
            }
            // Free on this host right now (another program may hold it).
            if std::net::TcpListener::bind((self.config.address, port)).is_ok() {
                ports.push(port);
                if ports.len() == count {
                    return Ok(ports);
                }
            }
        }
        Err(Status::resource_exhausted(format!("no free port left in {}-{}", self.config.ports.0, self.config.ports.1)))
    }

    /// Engines and replicas this instance manager starts share its node's
    /// socket directory: an engine reaches a replica of its own node there
    /// instead of over TCP (see `ironhorn_proto::local`).
    fn local_sockets(&self) -> [String; 2] {
        ["--local-sockets".into(), self.config.data_dir.join("sockets").display().to_string()]
    }

    fn command(&self, spec: &Spec, ports: &[u16]) -> (PathBuf, Vec<String>, String, String, String) {
        let ip = self.config.address;
        match spec {
            Spec::Replica { store, size_bytes } => {
                let address = format!("{ip}:{}", ports[0]);
                let args = vec![
                    "serve".into(),
                    "--store".into(),
                    store.clone(),
                    "--size".into(),
                    size_bytes.to_string(),
                    // The manager's size is the volume's: a store left
                    // smaller by an expansion it missed grows to it.
                    "--grow".into(),
                    "--listen".into(),
                    address.clone(),
                ];
                let mut args = args;
                args.extend(self.local_sockets());
                if self.config.replica_fault_injection {
                    args.push("--fault-injection".into());
                }
                (self.config.bin_dir.join("ironhorn-replica"), args, address, String::new(), String::new())
            }
            Spec::Engine {
                volume,
                size_bytes,
                epoch,
                replicas,
                blockdev,
                replica_timeout_secs,
                rebuild_mib_per_sec,
                write_majority,
                iops_limit,
                bandwidth_limit,
            } => {
                let address = format!("{ip}:{}", ports[0]);
                let nbd = format!("{ip}:{}", ports[1]);
                let mut args = vec![
                    "serve".into(),
                    "--volume".into(),
                    volume.clone(),
                    "--size".into(),
                    size_bytes.to_string(),
                    "--epoch".into(),
                    epoch.to_string(),
                    "--nbd".into(),
                    format!("tcp:{nbd}"),
                    "--listen".into(),
                    address.clone(),
                    "--replica-timeout".into(),
                    replica_timeout_secs.to_string(),
                    "--rebuild-mib-per-sec".into(),
                    rebuild_mib_per_sec.to_string(),
                    "--iops-limit".into(),
                    iops_limit.to_string(),
                    "--bandwidth-limit".into(),
                    bandwidth_limit.to_string(),
                ];
                if *write_majority {
                    args.push("--write-majority".into());
                }
                args.extend(self.local_sockets());
                for replica in replicas {
                    args.push("--replica".into());
                    args.push(replica.clone());
                }
                let blockdev_path = if *blockdev {
                    args.push("--blockdev".into());
                    format!("/dev/ironhorn/{volume}")
                } else {
                    String::new()
                };
                (
                    self.config.bin_dir.join("ironhorn-engine"),
                    args,
                    address,
                    format!("nbd://{nbd}/{volume}"),
                    blockdev_path,
                )
            }
        }
    }

    async fn create(&self, request: pb::CreateRequest) -> Result<pb::Instance, Status> {
        if !valid_name(&request.name) {
            return Err(Status::invalid_argument(format!("instance name {:?} is not valid", request.name)));
        }
        let spec = spec_from_request(&request)?;
        let mut inner = self.inner.lock().await;
        if let Some(existing) = inner.records.get(&request.name) {
            if existing.alive() {
                return if existing.spec == spec {
                    Ok(existing.to_proto())
                } else {
                    Err(Status::already_exists(format!("instance {} runs with another spec", request.name)))
                };
            }
            // Stopped or failed: the caller asks for it to run again.
        }
        if let Spec::Replica { store, .. } = &spec
            && let Some(user) = inner.records.values().find(|r| {
                r.alive() && r.name != request.name && matches!(&r.spec, Spec::Replica { store: s, .. } if s == store)
            })
        {
            return Err(Status::already_exists(format!("store {store} is in use by instance {}", user.name)));
        }
        let ports = self.allocate_ports(&inner, if matches!(spec, Spec::Engine { .. }) { 2 } else { 1 })?;
        let (binary, args, address, nbd_endpoint, blockdev_path) = self.command(&spec, &ports);
        let log_path = self.config.data_dir.join("logs").join(format!("{}.log", request.name));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| Status::internal(format!("log {}: {e}", log_path.display())))?;
        let log_err = log.try_clone().map_err(|e| Status::internal(e.to_string()))?;
        let mut command = tokio::process::Command::new(&binary);
        command
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .kill_on_drop(false);
        let mut child = command.spawn().map_err(|e| Status::internal(format!("start {}: {e}", binary.display())))?;
        let pid = child.id().unwrap_or(0);
        let record = Record {
            name: request.name.clone(),
            spec,
            state: State::Starting,
            pid,
            start_ticks: process::start_ticks(pid).unwrap_or(0),
            ports,
            exited: false,
            exit_code: None,
            exit_signal: None,
            error_message: String::new(),
            address: address.clone(),
            nbd_endpoint,
            blockdev_path,
            log_path,
            started_at_unix_ms: now_ms(),
            stop_requested: false,
        };
        tracing::info!(instance = %request.name, pid, binary = %binary.display(), ?args, "started");
        inner.records.insert(request.name.clone(), record.clone());
        self.publish(&inner, &request.name);
        drop(inner);

        let svc = self.clone();
        let name = request.name.clone();
        tokio::spawn(async move {
            let status = child.wait().await.ok();
            svc.exited(&name, pid, status, None).await;
        });
        let svc = self.clone();
        let name = request.name.clone();
        tokio::spawn(async move { svc.await_ready(&name, pid, &address).await });
        Ok(record.to_proto())
    }

    /// Starting → running once the process accepts connections on its port.
    async fn await_ready(&self, name: &str, pid: u32, address: &str) {
        loop {
            if tokio::net::TcpStream::connect(address).await.is_ok() {
                let mut inner = self.inner.lock().await;
                if let Some(r) = inner.records.get_mut(name)
                    && r.pid == pid
                    && r.state == State::Starting
                {
                    r.state = State::Running;
                    self.publish(&inner, name);
                }
                return;
            }
            {
                let inner = self.inner.lock().await;
                match inner.records.get(name) {
                    Some(r) if r.pid == pid && r.state == State::Starting => {}
                    _ => return,
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn delete(&self, request: pb::DeleteRequest) -> Result<pb::Instance, Status> {
        let pid = {
            let mut inner = self.inner.lock().await;
            let Some(record) = inner.records.get_mut(&request.name) else {
                return Err(Status::not_found(format!("no instance named {:?}", request.name)));
            };
            let pid = record.pid;
            if record.alive() {
                record.stop_requested = true;
                record.state = State::Stopping;
                self.publish(&inner, &request.name);
                let _ = process::signal(pid, libc::SIGTERM);
            }
            pid
        };
        let deadline = tokio::time::Instant::now() + self.config.stop_grace;
        let mut killed = false;
        loop {
            {
                let inner = self.inner.lock().await;
                match inner.records.get(&request.name) {
                    Some(r) if r.pid == pid && !r.alive() => break,
                    Some(r) if r.pid == pid => {}
                    _ => return Err(Status::aborted(format!("instance {} changed while being deleted", request.name))),
                }
            }
            if !killed && tokio::time::Instant::now() >= deadline {
                tracing::warn!(instance = %request.name, pid, "did not stop in time; SIGKILL");
                let _ = process::signal(pid, libc::SIGKILL);
                killed = true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut inner = self.inner.lock().await;
        let record = inner.records.get(&request.name).cloned().expect("checked above");
        if request.remove_data
            && let Spec::Replica { store, .. } = &record.spec
        {
            let store = store.clone();
            let removed = tokio::task::spawn_blocking(move || disk::delete_store(&store)).await;
            self.disks.changed();
            removed.map_err(|e| Status::internal(e.to_string()))?.map_err(Status::internal)?;
        }
        inner.records.remove(&request.name);
        self.persist_locked(&inner);
        let mut gone = record.to_proto();
        gone.state = InstanceState::Stopped as i32;
        self.disks.changed();
        let _ = self.changes.send(gone.clone());
        tracing::info!(instance = %request.name, remove_data = request.remove_data, "deleted");
        Ok(gone)
    }
}

type WatchStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Instance, Status>> + Send>>;

#[tonic::async_trait]
impl InstanceManager for InstanceManagerService {
    async fn create(&self, request: Request<pb::CreateRequest>) -> Result<Response<pb::Instance>, Status> {
        InstanceManagerService::create(self, request.into_inner()).await.map(Response::new)
    }

    async fn delete(&self, request: Request<pb::DeleteRequest>) -> Result<Response<pb::Instance>, Status> {
        InstanceManagerService::delete(self, request.into_inner()).await.map(Response::new)
    }

    async fn get(&self, request: Request<pb::GetRequest>) -> Result<Response<pb::Instance>, Status> {
        let name = request.into_inner().name;
        let inner = self.inner.lock().await;
        inner
            .records
            .get(&name)
            .map(|r| Response::new(r.to_proto()))
            .ok_or_else(|| Status::not_found(format!("no instance named {name:?}")))
    }

    async fn list(&self, _: Request<pb::ListRequest>) -> Result<Response<pb::ListResponse>, Status> {
        let inner = self.inner.lock().await;
        let own = process::usage(std::process::id()).unwrap_or_default();
        let usage = inner
            .records
            .values()
            .filter(|r| r.pid != 0 && !r.exited)
            .filter_map(|r| process::usage(r.pid))
            .fold(own, |sum, u| sum + u);
        Ok(Response::new(pb::ListResponse {
            instances: inner.records.values().map(Record::to_proto).collect(),
            usage: Some(pb::ResourceUsage { cpu_time_ms: usage.cpu_ms, rss_bytes: usage.rss_bytes }),
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, _: Request<pb::WatchRequest>) -> Result<Response<WatchStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let mut changes = self.changes.subscribe();
        let snapshot: Vec<pb::Instance> = self.inner.lock().await.records.values().map(Record::to_proto).collect();
        tokio::spawn(async move {
            for instance in snapshot {
                if tx.send(Ok(instance)).await.is_err() {
                    return;
                }
            }
            loop {
                let item = match changes.recv().await {
                    Ok(instance) => Ok(instance),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        Err(Status::data_loss(format!("watcher fell {n} changes behind; list and watch again")))
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let end = item.is_err();
                if tx.send(item).await.is_err() || end {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn log(&self, request: Request<pb::LogRequest>) -> Result<Response<pb::LogResponse>, Status> {
        let request = request.into_inner();
        let path = {
            let inner = self.inner.lock().await;
            inner
                .records
                .get(&request.name)
                .map(|r| r.log_path.clone())
                .ok_or_else(|| Status::not_found(format!("no instance named {:?}", request.name)))?
        };
        let max = if request.max_bytes == 0 { 64 * 1024 } else { request.max_bytes as u64 };
        Ok(Response::new(pb::LogResponse { text: tail(&path, max) }))
    }

    async fn disk_status(
        &self,
        request: Request<pb::DiskStatusRequest>,
    ) -> Result<Response<pb::DiskStatusResponse>, Status> {
        let disk_name = request.into_inner().disk;
        let disks = self.disks.clone();
        let status = tokio::task::spawn_blocking(move || disks.status(&disk_name))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(Status::failed_precondition)?;
        Ok(Response::new(pb::DiskStatusResponse {
            total_bytes: status.total_bytes,
            free_bytes: status.free_bytes,
            stores: status.stores,
            stores_bytes: status.stores_bytes,
        }))
    }

    async fn delete_store(
        &self,
        request: Request<pb::DeleteStoreRequest>,
    ) -> Result<Response<pb::DeleteStoreResponse>, Status> {
        let store = request.into_inner().store;
        {
            let inner = self.inner.lock().await;
            if let Some(user) = inner
                .records
                .values()
                .find(|r| r.alive() && matches!(&r.spec, Spec::Replica { store: s, .. } if *s == store))
            {
                return Err(Status::failed_precondition(format!("store {store} is in use by instance {}", user.name)));
            }
        }
        let deleted = tokio::task::spawn_blocking(move || disk::delete_store(&store)).await;
        self.disks.changed();
        deleted.map_err(|e| Status::internal(e.to_string()))?.map_err(Status::internal)?;
        Ok(Response::new(pb::DeleteStoreResponse {}))
    }
}
