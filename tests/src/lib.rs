//! Helpers for ironhorn's multi-process tests: start the real binaries with a
//! log file each, stop them with TERM then KILL, make loop devices and LVM
//! volume groups with unique names and remove exactly those, and talk to
//! replicas over their gRPC data stream.

pub mod bidi;
pub mod chaos;
pub mod nbd_wire;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ironhorn_proto::replica::replica_client::ReplicaClient;
use ironhorn_proto::replica::{IoOp, IoRequest, IoResponse, IoStatus};
use tokio::sync::oneshot;
use tonic::transport::Channel;

pub const BLOCK: usize = 4096;

/// A name unique to this process and call, for files, VGs and LVs.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}{}x{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

/// Fails the test with a clear message when a required tool is missing.
pub fn require_tool(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(tool).is_file()))
        .unwrap_or(false);
    assert!(found, "required tool {tool} is missing: install the {package} package (scripts/test.sh does)");
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root (loop devices, LVM); run it as root");
}

/// Directory holding the workspace's built binaries (target/<profile>).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test binary>, or target/<profile>/<binary>
    // (ironhorn-chaos).
    let dir = exe.parent().expect("the executable's directory");
    if dir.ends_with("deps") { dir.parent().expect("target dir").to_path_buf() } else { dir.to_path_buf() }
}

pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A scratch directory for one test, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> Self {
        let base = std::env::var_os("IRONHORN_TEST_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let path = base.join(unique(prefix));
        std::fs::create_dir_all(&path).expect("create test dir");
        Self(path)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running ironhorn process. Its stderr goes to a log file; its stdout
/// is scanned for the `listening on ADDR` line.
pub struct Process {
    pub name: String,
    child: Option<Child>,
    pub address: String,
    pub log: PathBuf,
}

impl Process {
    /// Starts `binary args...` and waits (bounded) for its listening line.
    pub fn start(name: &str, binary: &Path, args: &[String], log_dir: &Path) -> Result<Process, String> {
        let log = log_dir.join(format!("{name}.log"));
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
        let mut child = Command::new(binary)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(log_file)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", binary.display()))?;
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent {
                    if let Some(addr) = line.strip_prefix("listening on ") {
                        let _ = tx.send(addr.trim().to_string());
                        sent = true;
                    }
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(address) = rx.recv_timeout(Duration::from_millis(50)) {
                return Ok(Process { name: name.into(), child: Some(child), address, log });
            }
            if let Ok(Some(status)) = child.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("{name} exited with {status} before listening:\n{text}"));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{name} did not start listening within 60 s"));
            }
        }
    }

    /// Starts `binary args...` with stdout and stderr both going to `output`
    /// (a file, or a device such as /dev/full), without waiting for it to
    /// listen: the caller knows `address` and polls it.
    pub fn start_with_output(
        name: &str,
        binary: &Path,
        args: &[String],
        output: &Path,
        address: &str,
    ) -> Result<Process, String> {
        let open = || std::fs::OpenOptions::new().write(true).open(output);
        let (out, err) = (open(), open());
        let (Ok(out), Ok(err)) = (out, err) else { return Err(format!("open {}", output.display())) };
        let child = Command::new(binary)
            .args(args)
            .stdout(out)
            .stderr(err)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", binary.display()))?;
        Ok(Process { name: name.into(), child: Some(child), address: address.into(), log: output.to_path_buf() })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Whether the process is still running (not exited, not reaped).
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit code.
    pub fn stop(&mut self, timeout: Duration) -> Option<i32> {
        let mut child = self.child.take()?;
        // SAFETY: signalling a child we spawned and have not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// The log, when it went to a regular file (not a device like /dev/full).
    pub fn log_text(&self) -> String {
        if !std::fs::metadata(&self.log).is_ok_and(|m| m.is_file()) {
            return format!("(output went to {}, not kept)", self.log.display());
        }
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// Runs a command to completion; Err carries its stderr.
pub fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A loop device over a sparse file, detached (by its own name) on drop.
pub struct LoopDevice {
    pub device: String,
    pub file: PathBuf,
}

impl LoopDevice {
    pub fn new(dir: &Path, size_bytes: u64) -> LoopDevice {
        require_tool("losetup", "mount");
        let file = dir.join(unique("pv") + ".img");
        std::fs::File::create(&file).and_then(|f| f.set_len(size_bytes)).expect("backing file");
        let device = run("losetup", &["--find", "--show", file.to_str().unwrap()]).expect("losetup").trim().to_string();
        LoopDevice { device, file }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = run("losetup", &["-d", &self.device]);
        let _ = std::fs::remove_file(&self.file);
    }
}

/// An LVM volume group on its own loop device, removed on drop.
pub struct VolumeGroup {
    pub name: String,
    pv: LoopDevice,
}

impl VolumeGroup {
    pub fn new(dir: &Path, size_bytes: u64) -> VolumeGroup {
        require_root();
        require_tool("lvcreate", "lvm2");
        let pv = LoopDevice::new(dir, size_bytes);
        let name = unique("ihvg");
        run("pvcreate", &["-y", &pv.device]).expect("pvcreate");
        run("vgcreate", &[&name, &pv.device]).expect("vgcreate");
        VolumeGroup { name, pv }
    }

    pub fn lv_names(&self) -> Vec<String> {
        run("lvs", &["--noheadings", "-o", "lv_name", &self.name])
            .unwrap_or_default()
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    pub fn segment_count(&self, lv: &str) -> usize {
        run("lvs", &["--noheadings", "-o", "seg_start_pe", &format!("{}/{lv}", self.name)])
            .expect("lvs")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
    }

    pub fn create_lv(&self, lv: &str, size: &str) {
        run("lvcreate", &["--driverloaded", "n", "-y", "-Zn", "-n", lv, "-L", size, &self.name]).expect("lvcreate");
    }

    pub fn pv_device(&self) -> &str {
        &self.pv.device
    }
}

impl Drop for VolumeGroup {
    fn drop(&mut self) {
        for lv in self.lv_names() {
            let _ = run("lvremove", &["--driverloaded", "n", "-y", &format!("{}/{lv}", self.name)]);
        }
        let _ = run("vgremove", &["--driverloaded", "n", "-y", &self.name]);
        let _ = run("pvremove", &["-y", &self.pv.device]);
    }
}

/// The block content a test writes: derived from (block, version) so any
/// block read back names which write it came from.
pub fn pattern(block: u64, version: u64) -> Vec<u8> {
    let mut out = vec![0u8; BLOCK];
    out[..8].copy_from_slice(&block.to_le_bytes());
    out[8..16].copy_from_slice(&version.to_le_bytes());
    let mut x = block.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
    for chunk in out[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    out
}

/// Which version of `block` a read returned: Some(0) for zeroes, Some(v)
/// for an intact pattern, None for anything else.
pub fn version_of(block: u64, data: &[u8]) -> Option<u64> {
    if data.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let version = u64::from_le_bytes(data[8..16].try_into().ok()?);
    (pattern(block, version) == data).then_some(version)
}

/// A pipelined client for a replica's data stream: many requests in
/// flight, responses matched by id.
#[derive(Clone)]
pub struct DataStream {
    client: std::sync::Arc<ironhorn_proto::data::Client>,
}

pub async fn connect(address: &str) -> ReplicaClient<Channel> {
    let endpoint = format!("http://{address}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match ReplicaClient::connect(endpoint.clone()).await {
            Ok(c) => {
                return c.max_decoding_message_size(64 << 20).max_encoding_message_size(64 << 20);
            }
            Err(e) if Instant::now() > deadline => panic!("connect {endpoint}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

impl DataStream {
    /// Connects to the replica at `address` (retrying for 20 s while it
    /// starts) and opens its data stream.
    pub async fn open(address: &str) -> DataStream {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match ironhorn_proto::data::Client::connect(address, None, Duration::from_secs(10)).await {
                Ok(client) => return DataStream { client: std::sync::Arc::new(client) },
                Err(e) if Instant::now() > deadline => panic!("open data stream to {address}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Sends one request; the returned receiver yields its response, or an
    /// error when the stream broke first.
    pub fn send(&self, op: IoOp, offset: u64, length: u64, data: Bytes, epoch: u64) -> oneshot::Receiver<IoResponse> {
        let req = IoRequest {
            id: 0,
            op: op as i32,
            offset,
            length,
            data,
            epoch,
            fua: false,
            flush_sequence: 0,
            paced: false,
        };
        self.send_request(req)
    }

    /// Sends `req` as it is (any op number, any field), with its id set.
    pub fn send_request(&self, req: IoRequest) -> oneshot::Receiver<IoResponse> {
        self.client.enqueue(req)
    }

    pub async fn call(
        &self,
        op: IoOp,
        offset: u64,
        length: u64,
        data: Bytes,
        epoch: u64,
    ) -> Result<IoResponse, String> {
        self.send(op, offset, length, data, epoch).await.map_err(|_| "stream closed".to_string())
    }

    pub async fn write(&self, offset: u64, data: Vec<u8>, epoch: u64) -> Result<(), String> {
        let len = data.len() as u64;
        check(self.call(IoOp::Write, offset, len, data.into(), epoch).await?).map(drop)
    }

    pub async fn read(&self, offset: u64, length: u64, epoch: u64) -> Result<Bytes, String> {
        check(self.call(IoOp::Read, offset, length, Bytes::new(), epoch).await?)
    }

    pub async fn flush(&self, epoch: u64) -> Result<(), String> {
        check(self.call(IoOp::Flush, 0, 0, Bytes::new(), epoch).await?).map(drop)
    }
}

/// Ok(data) for a successful response, Err("STATUS: message") otherwise.
pub fn check(resp: IoResponse) -> Result<Bytes, String> {
    if resp.status == IoStatus::Ok as i32 {
        Ok(resp.data)
    } else {
        let name = IoStatus::try_from(resp.status).map(|s| s.as_str_name()).unwrap_or("UNKNOWN");
        let name = name.strip_prefix("IO_STATUS_").unwrap_or(name);
        Err(format!("{name}: {}", resp.message))
    }
}

/// Starts `ironhorn-replica serve` on a free port.
pub fn start_replica(name: &str, store: &str, size: &str, dir: &Path, extra: &[&str]) -> Result<Process, String> {
    let mut args: Vec<String> =
        ["serve", "--store", store, "--size", size, "--listen", "127.0.0.1:0"].iter().map(|s| s.to_string()).collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    Process::start(name, &binary("ironhorn-replica"), &args, dir)
}

/// Starts `ironhorn-engine serve` for `volume` over `replicas`, with an NBD
/// unix socket at `socket`.
pub fn start_engine(
    name: &str,
    volume: &str,
    size: &str,
    epoch: u64,
    replicas: &[&str],
    socket: &Path,
    dir: &Path,
    extra: &[&str],
) -> Result<Process, String> {
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--volume".into(),
        volume.into(),
        "--size".into(),
        size.into(),
        "--epoch".into(),
        epoch.to_string(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--nbd".into(),
        format!("unix:{}", socket.display()),
    ];
    for r in replicas {
        args.push("--replica".into());
        args.push(r.to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Process::start(name, &binary("ironhorn-engine"), &args, dir)
}

/// Runs `ironhorn-engine ARGS...` (a CLI subcommand) and returns stdout.
pub fn engine_cli(args: &[&str]) -> Result<String, String> {
    run(binary("ironhorn-engine").to_str().unwrap(), args)
}

/// The engine's status as JSON.
pub fn engine_status(engine: &Process) -> serde_json::Value {
    let out = engine_cli(&["status", "--engine", &engine.address]).expect("engine status");
    serde_json::from_str(&out).expect("status JSON")
}

/// Mode of each replica address in an engine status.
pub fn replica_modes(status: &serde_json::Value) -> HashMap<String, String> {
    status["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| (r["address"].as_str().unwrap().to_string(), r["mode"].as_str().unwrap().to_string()))
        .collect()
}

/// Reads a replica's whole volume directly over its gRPC stream.
pub async fn replica_image(address: &str, size: u64, epoch: u64) -> Vec<u8> {
    let s = DataStream::open(address).await;
    let mut out = Vec::with_capacity(size as usize);
    let step = 4u64 << 20;
    let mut at = 0;
    while at < size {
        let n = step.min(size - at);
        out.extend_from_slice(&s.read(at, n, epoch).await.expect("read replica"));
        at += n;
    }
    out
}

/// `nbd+unix` URI of an engine's socket.
/// SIGKILL to one exact pid (an instance found through the instance
/// manager that started it, or a process the test started).
pub fn kill9(pid: u32) {
    // SAFETY: kill(2) of one pid; no memory is involved.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

pub fn nbd_uri(volume: &str, socket: &Path) -> String {
    format!("nbd+unix:///{volume}?socket={}", socket.display())
}

/// A minimal NBD client for protocol tests over the engine's unix socket
/// (see `nbd_wire`).
pub struct NbdClient {
    pub stream: std::os::unix::net::UnixStream,
    pub size: u64,
}

impl NbdClient {
    pub fn connect(socket: &Path, export: &str) -> std::io::Result<NbdClient> {
        let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        let size = nbd_wire::handshake(&mut stream, export)?;
        Ok(NbdClient { stream, size })
    }

    /// Sends one request; returns the reply's error code and read data.
    pub fn request(&mut self, kind: u16, offset: u64, length: u32, data: &[u8]) -> std::io::Result<(u32, Vec<u8>)> {
        nbd_wire::request(&mut self.stream, 42, kind, offset, length, data)
    }
}

/// `ironhorn up` in a temp data dir: a manager and N node processes on
/// their own port range. Dropping it stops `up` (which stops engines,
/// replicas and instance managers), stops by exact pid any instance manager
/// left by a killed `up`, and purges the data dir (LVs, VGs, loop devices).
pub struct StandaloneCluster {
    pub dir: TempDir,
    pub api: String,
    pub port_base: u16,
    pub nodes: usize,
    disk_size: String,
    extra: Vec<String>,
    /// Where `up` writes stdout and stderr; None: a pipe and a log file.
    output: Option<PathBuf>,
    up: Option<Process>,
}

/// `up` listens on `port_base` and gives node i the ports
/// `port_base + 100 i ..= port_base + 100 i + 99`. A test's ports must sit
/// below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), or
/// any outgoing connection on the machine may hold one of them first: CI
/// once failed with "Address already in use" on a base of 33000.
fn assert_below_ephemeral_ports(port_base: u16, nodes: usize) {
    let last = port_base as usize + 100 * nodes + 99;
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let first_ephemeral: usize = range.split_whitespace().next().and_then(|w| w.parse().ok()).unwrap_or(32768);
    assert!(
        last < first_ephemeral,
        "port base {port_base} with {nodes} nodes uses ports up to {last}, inside the ephemeral range from \
         {first_ephemeral}: pick a base below it"
    );
}

impl StandaloneCluster {
    pub fn start(tag: &str, nodes: usize, port_base: u16, disk_size: &str) -> StandaloneCluster {
        Self::start_with(tag, nodes, port_base, disk_size, &[])
    }

    /// `start` with more arguments for `ironhorn up` (e.g. `--file-disks`).
    pub fn start_with(tag: &str, nodes: usize, port_base: u16, disk_size: &str, extra: &[&str]) -> StandaloneCluster {
        Self::start_full(tag, nodes, port_base, disk_size, extra, None)
    }

    /// `start` with `up`'s stdout and stderr going to `output`.
    pub fn start_with_output(
        tag: &str,
        nodes: usize,
        port_base: u16,
        disk_size: &str,
        output: &Path,
    ) -> StandaloneCluster {
        Self::start_full(tag, nodes, port_base, disk_size, &[], Some(output.to_path_buf()))
    }

    fn start_full(
        tag: &str,
        nodes: usize,
        port_base: u16,
        disk_size: &str,
        extra: &[&str],
        output: Option<PathBuf>,
    ) -> StandaloneCluster {
        require_root();
        require_tool("lvcreate", "lvm2");
        require_tool("losetup", "mount");
        assert_below_ephemeral_ports(port_base, nodes);
        let dir = TempDir::new(tag);
        let mut cluster = StandaloneCluster {
            dir,
            api: format!("http://127.0.0.1:{port_base}"),
            port_base,
            nodes,
            disk_size: disk_size.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            output,
            up: None,
        };
        cluster.start_up();
        cluster
    }

    /// Starts `ironhorn up` on the cluster's data dir (again) and waits until
    /// every node is ready.
    pub fn start_up(&mut self) {
        assert!(self.up.is_none(), "up already running");
        self.up = Some(self.spawn_up().expect("ironhorn up"));
        if self.output.is_some() {
            // No "listening on" line to wait for: poll the API.
            self.wait(Duration::from_secs(30), "the API answers", || self.cli(&["node", "list"]).is_ok());
        }
        // Nodes report ready within a reconcile pass or two.
        self.wait(Duration::from_secs(30), "every node ready with its disk measured", || {
            let nodes = self.json(&["node", "list"]);
            let nodes = nodes.as_array().cloned().unwrap_or_default();
            nodes.len() == self.nodes
                && nodes.iter().all(|n| {
                    n["status"]["diskStatus"]["disk-1"]["storageMaximum"].as_u64().unwrap_or(0) > 0
                        && n["status"]["conditions"]
                            .as_array()
                            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
                })
        });
    }

    fn spawn_up(&self) -> Result<Process, String> {
        let args: Vec<String> = [
            "up",
            "--data-dir",
            self.dir.path().join("data").to_str().unwrap(),
            "--nodes",
            &self.nodes.to_string(),
            "--port-base",
            &self.port_base.to_string(),
            "--disk-size",
            &self.disk_size,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(self.extra.iter().cloned())
        .collect();
        match &self.output {
            Some(output) => Process::start_with_output("up", &binary("ironhorn"), &args, output, &self.api),
            None => Process::start("up", &binary("ironhorn"), &args, self.dir.path()),
        }
    }

    /// Whether `up` is still running.
    pub fn up_alive(&mut self) -> bool {
        self.up.as_mut().is_some_and(Process::alive)
    }

    pub fn up_pid(&self) -> u32 {
        self.up.as_ref().expect("up running").pid()
    }

    /// Reaps an `up` that exited on its own (after a signal this test sent).
    pub fn forget_up(&mut self) {
        if let Some(mut up) = self.up.take() {
            up.stop(Duration::from_secs(30));
        }
    }

    /// SIGKILL the manager (`up`); nodes and their processes keep running.
    pub fn kill9_up(&mut self) {
        self.up.take().expect("up running").kill9();
    }

    /// Runs the CLI against this cluster.
    pub fn cli(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["--api", &self.api];
        all.extend_from_slice(args);
        let out = Command::new(binary("ironhorn")).args(&all).output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// `GET path` on the manager's HTTP API: the body of a 200 answer.
    pub fn http_get(&self, path: &str) -> Result<String, String> {
        use std::io::{Read, Write};
        let host = self.api.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(host).map_err(|e| format!("connect {host}: {e}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
        write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).map_err(|e| format!("read {path}: {e}"))?;
        let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(|| format!("no HTTP header: {answer}"))?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("GET {path}: {head}\n{body}"));
        }
        Ok(body.to_string())
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-o", "json"]);
        let text = self.cli(&all).unwrap_or_else(|e| panic!("ironhorn {args:?}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("ironhorn {args:?}: {e}: {text}"))
    }

    /// Polls `check` every 250 ms until it holds; panics after `timeout`.
    pub fn wait(&self, timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !check() {
            if Instant::now() > deadline {
                let log = self.up.as_ref().map(|p| p.log_text()).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "timed out after {timeout:?} waiting for: {what}\nup log (last lines, newest first):\n{}",
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    pub fn volume(&self, name: &str) -> serde_json::Value {
        self.json(&["volume", "get", name])
    }

    /// (pid, state) of an instance, from its node's instance manager.
    pub fn instance(&self, node: &str, name: &str) -> Option<(u32, i32)> {
        use ironhorn_proto::instance::ListRequest;
        use ironhorn_proto::instance::instance_manager_client::InstanceManagerClient;
        let nodes = self.json(&["node", "list"]);
        let im = nodes.as_array()?.iter().find(|n| n["metadata"]["name"] == node)?["spec"]["instanceManagerAddress"]
            .as_str()?
            .to_string();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        runtime.block_on(async {
            let mut c = InstanceManagerClient::connect(format!("http://{im}")).await.ok()?;
            let list = c.list(ListRequest {}).await.ok()?.into_inner();
            list.instances.into_iter().find(|i| i.name == name).map(|i| (i.pid, i.state))
        })
    }

    /// The control address of `volume`'s engine, from its Engine object.
    pub fn engine_address(&self, volume: &str) -> String {
        let engines = self.json(&["engine", "list"]);
        let engine = engines.as_array().unwrap().iter().find(|e| e["spec"]["volumeName"] == volume).expect("engine");
        engine["status"]["address"].as_str().expect("engine address").to_string()
    }

    pub fn replicas_of(&self, volume: &str) -> Vec<serde_json::Value> {
        let all = self.json(&["replica", "list"]);
        all.as_array().cloned().unwrap_or_default().into_iter().filter(|r| r["spec"]["volumeName"] == volume).collect()
    }

    /// Node name → its disk (`lvm:VG` or `file:DIR`).
    pub fn disks(&self) -> HashMap<String, String> {
        let nodes = self.json(&["node", "list"]);
        nodes
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|n| {
                (
                    n["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                    n["spec"]["disks"]["disk-1"]["path"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// LV names in a node's VG.
    pub fn lvs(&self, node: &str) -> Vec<String> {
        let disk = self.disks().remove(node).expect("node");
        let vg = disk.strip_prefix("lvm:").expect("an LVM disk");
        run("lvs", &["--noheadings", "-o", "lv_name", vg])
            .expect("lvs")
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }
}

impl Drop for StandaloneCluster {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        match self.up.take() {
            Some(mut up) => {
                up.stop(Duration::from_secs(60));
            }
            None => {
                // `up` was killed: start it once more so it stops the nodes
                // it adopts, the way a user would.
                if let Ok(mut up) = self.spawn_up() {
                    // Let it adopt the nodes before it stops them.
                    std::thread::sleep(Duration::from_secs(2));
                    up.stop(Duration::from_secs(60));
                }
            }
        }
        // Any instance manager still running (by the exact pid `up` recorded).
        if let Ok(entries) = std::fs::read_dir(data.join("nodes")) {
            for e in entries.flatten() {
                if let Some(pid) =
                    std::fs::read_to_string(e.path().join("im.pid")).ok().and_then(|p| p.trim().parse::<i32>().ok())
                {
                    // SAFETY: signalling one exact pid.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        if let Err(e) = run(binary("ironhorn").to_str().unwrap(), &["purge", "--data-dir", data.to_str().unwrap()]) {
            eprintln!("purge {}: {e}", data.display());
        }
    }
}

/// Write requests the engine at control address `engine` has completed.
pub fn engine_writes(engine: &str) -> u64 {
    let out = engine_cli(&["metrics", "--engine", engine]).expect("engine metrics");
    let m: serde_json::Value = serde_json::from_str(&out).expect("metrics JSON");
    m["ops"].as_array().expect("ops").iter().find(|o| o["op"] == "write").expect("write counters")["requests"]
        .as_u64()
        .expect("write requests")
}

/// Waits until the engine at `engine` has completed `more` write requests
/// beyond those it had at the call, with `io` (the client issuing them)
/// still running: the point at which a fault hits I/O observably in
/// flight. Fails if the client ended first or nothing moved in `timeout`.
pub fn wait_for_writes_in_flight(engine: &str, io: &mut std::process::Child, more: u64, timeout: Duration) -> u64 {
    let target = engine_writes(engine) + more;
    let deadline = Instant::now() + timeout;
    loop {
        assert!(io.try_wait().expect("poll the I/O client").is_none(), "the I/O ended before the fault could hit it");
        let done = engine_writes(engine);
        if done >= target {
            return done;
        }
        assert!(Instant::now() < deadline, "only {done} of {target} writes completed within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A gRPC channel over a unix socket (a CSI plugin's endpoint), the way
/// the kubelet and the sidecars reach it.
pub async fn unix_channel(socket: &Path) -> Channel {
    let path = socket.to_path_buf();
    tonic::transport::Endpoint::try_from("http://csi.invalid")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()))
}
