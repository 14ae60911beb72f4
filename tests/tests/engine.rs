//! The engine as a real process over real replica processes, driven by real
//! NBD clients (fio with verify, qemu-io, nbdinfo) and a raw protocol client.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ironhorn_tests::*;

const SIZE: &str = "256MiB";
const SIZE_BYTES: u64 = 256 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

struct Cluster {
    dir: TempDir,
    replicas: Vec<Process>,
    engine: Option<Process>,
    socket: std::path::PathBuf,
}

impl Cluster {
    fn new(prefix: &str, replicas: usize) -> Cluster {
        let dir = TempDir::new(prefix);
        let socket = dir.path().join("vol.sock");
        let mut c = Cluster { dir, replicas: Vec::new(), engine: None, socket };
        for i in 0..replicas {
            c.add_replica_process(i);
        }
        c
    }

    fn store(&self, i: usize) -> String {
        format!("file:{}", self.dir.path().join(format!("r{i}.img")).display())
    }

    /// Starts replica `i` on its store (creating it when new).
    fn add_replica_process(&mut self, i: usize) {
        let p = start_replica(&format!("replica-{i}"), &self.store(i), SIZE, self.dir.path(), &[]).unwrap();
        if i < self.replicas.len() {
            self.replicas[i] = p;
        } else {
            self.replicas.push(p);
        }
    }

    fn addresses(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.address.clone()).collect()
    }

    fn start_engine(&mut self, epoch: u64, extra: &[&str]) {
        let addresses = self.addresses();
        let refs: Vec<&str> = addresses.iter().map(String::as_str).collect();
        self.engine =
            Some(start_engine("engine", "vol", SIZE, epoch, &refs, &self.socket, self.dir.path(), extra).unwrap());
    }

    fn engine(&self) -> &Process {
        self.engine.as_ref().expect("engine")
    }

    fn uri(&self) -> String {
        nbd_uri("vol", &self.socket)
    }
}

fn fio(uri: &str, extra: &[&str]) -> std::process::Child {
    require_tool("fio", "fio");
    Command::new("fio")
        .args(["--name=verify", "--ioengine=nbd", &format!("--uri={uri}"), "--bs=4k", "--iodepth=16"])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn fio")
}

fn finish(child: std::process::Child, what: &str) -> String {
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}

fn images(addresses: &[String], epoch: u64) -> Vec<Vec<u8>> {
    let rt = runtime();
    addresses.iter().map(|a| rt.block_on(replica_image(a, SIZE_BYTES, epoch))).collect()
}

fn assert_identical(images: &[Vec<u8>], names: &[String]) {
    for (i, img) in images.iter().enumerate().skip(1) {
        if img != &images[0] {
            let first = img.iter().zip(&images[0]).position(|(a, b)| a != b).unwrap();
            panic!("replica {} differs from {} at byte {first}", names[i], names[0]);
        }
    }
}

#[test]
fn fio_qemu_io_and_nbdinfo_over_three_replicas() {
    require_tool("qemu-io", "qemu-utils");
    require_tool("nbdinfo", "libnbd-bin");
    let mut c = Cluster::new("eng-basic", 3);
    c.start_engine(1, &[]);
    let info = run("nbdinfo", &["--size", &c.uri()]).unwrap();
    assert_eq!(info.trim(), SIZE_BYTES.to_string());
    let list = run("nbdinfo", &["--list", &format!("nbd+unix://?socket={}", c.socket.display())]).unwrap();
    assert!(list.contains("export=\"vol\""), "{list}");
    finish(
        fio(
            &c.uri(),
            &[
                "--rw=randwrite",
                "--size=32M",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--do_verify=1",
                "--verify_state_save=0",
            ],
        ),
        "fio randwrite verify",
    );
    let out =
        run("qemu-io", &["-f", "raw", &c.uri(), "-c", "write -P 0x5a 8M 1M", "-c", "read -P 0x5a 8M 1M"]).unwrap();
    assert!(out.contains("read 1048576/1048576"), "{out}");
    assert!(!out.contains("Pattern verification failed"), "{out}");
    let images = images(&c.addresses(), 1);
    assert_identical(&images, &c.addresses());
    assert!(images[0][8 << 20..9 << 20].iter().all(|&b| b == 0x5a));
}

#[test]
fn replica_failure_rebuild_and_delta_rebuild() {
    let mut c = Cluster::new("eng-heal", 3);
    c.start_engine(1, &[]);
    // Fill part of the volume first so the delta rebuild has a contrast.
    finish(fio(&c.uri(), &["--rw=write", "--bs=1M", "--size=128M", "--end_fsync=1"]), "fio fill");

    // 1. SIGKILL a replica during a verify run: fio still passes.
    let mut run = fio(
        &c.uri(),
        &[
            "--rw=randwrite",
            "--size=64M",
            "--offset=128M",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--verify_state_save=0",
        ],
    );
    // Kill once fio's writes are observably flowing (64 MiB is 16384 writes).
    wait_for_writes_in_flight(&c.engine().address, &mut run, 1000, Duration::from_secs(60));
    let killed = c.replicas[1].address.clone();
    c.replicas[1].kill9();
    finish(run, "fio verify with a replica killed");
    let status = engine_status(c.engine());
    assert_eq!(replica_modes(&status)[&killed], "ERR", "{status}");
    let healthy: Vec<String> = c.addresses().into_iter().filter(|a| *a != killed).collect();
    assert_identical(&images(&healthy, 1), &healthy);

    // 2. An empty replica added: rebuilt to RW, byte-identical.
    c.add_replica_process(3);
    let fresh = c.replicas[3].address.clone();
    engine_cli(&["replica", "add", "--engine", &c.engine().address, "--replica", &fresh]).expect("replica add");
    let status = engine_status(c.engine());
    assert_eq!(replica_modes(&status)[&fresh], "RW", "{status}");
    let full = &status["rebuilds"][0];
    assert_eq!(full["state"], "done", "{status}");
    assert!(full["copied_bytes"].as_u64().unwrap() >= 128 << 20, "full rebuild copies the data: {full}");
    let mut three = healthy.clone();
    three.push(fresh.clone());
    assert_identical(&images(&three, 1), &three);

    // 3. The killed replica restarted on its old store: only what changed.
    c.add_replica_process(1);
    let back = c.replicas[1].address.clone();
    engine_cli(&["replica", "remove", "--engine", &c.engine().address, "--replica", &killed])
        .expect("remove old entry");
    finish(fio(&c.uri(), &["--rw=randwrite", "--size=4M", "--offset=200M"]), "fio small writes");
    engine_cli(&["replica", "add", "--engine", &c.engine().address, "--replica", &back]).expect("re-add");
    let status = engine_status(c.engine());
    assert_eq!(replica_modes(&status)[&back], "RW", "{status}");
    let delta = &status["rebuilds"][0];
    let copied = delta["copied_bytes"].as_u64().unwrap();
    assert_eq!(delta["method"], "dirty-map", "{delta}");
    assert!(copied > 0 && copied <= 96 << 20, "delta rebuild copies a fraction of the 256 MiB volume: {delta}");
    eprintln!("delta rebuild copied {copied} bytes of {SIZE_BYTES}: {delta}");
    let mut all = three.clone();
    all.push(back);
    assert_identical(&images(&all, 1), &all);
}

#[test]
fn a_replica_that_stops_answering_is_dropped_within_the_timeout() {
    let mut c = Cluster::new("eng-timeout", 2);
    c.start_engine(1, &["--replica-timeout", "2"]);
    let stuck = c.replicas[0].address.clone();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(c.replicas[0].pid() as i32, libc::SIGSTOP) };
    let start = Instant::now();
    let out = run("qemu-io", &["-f", "raw", &c.uri(), "-c", "write -P 0x11 0 64k", "-c", "read -P 0x11 0 64k"]);
    let took = start.elapsed();
    unsafe { libc::kill(c.replicas[0].pid() as i32, libc::SIGCONT) };
    let out = out.expect("I/O continues on the other replica");
    assert!(!out.contains("failed"), "{out}");
    assert!(took < Duration::from_secs(10), "I/O waited {took:?} on a stuck replica");
    assert_eq!(replica_modes(&engine_status(c.engine()))[&stuck], "ERR");
}

#[test]
fn snapshot_mid_stream_then_revert_on_every_replica() {
    let mut c = Cluster::new("eng-snap", 3);
    c.start_engine(1, &[]);
    let uri = c.uri();
    run("qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x11 0 4M"]).unwrap();
    let mut fio_run = fio(
        &uri,
        &["--rw=randwrite", "--size=16M", "--offset=64M", "--verify=crc32c", "--do_verify=1", "--verify_fatal=1"],
    );
    wait_for_writes_in_flight(&c.engine().address, &mut fio_run, 200, Duration::from_secs(30));
    engine_cli(&["snapshot", "create", "--engine", &c.engine().address, "snap1"]).expect("snapshot during I/O");
    finish(fio_run, "fio across the snapshot");
    let at_snapshot = images(&c.addresses(), 1);
    // Data written before the snapshot is in it; not a byte of the later
    // writes is (checked after the revert against a post-revert read).
    run("qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x22 0 8M"]).unwrap();
    let list = engine_cli(&["snapshot", "list", "--engine", &c.engine().address]).unwrap();
    assert!(list.contains("\"snap1\""), "{list}");
    engine_cli(&["snapshot", "revert", "--engine", &c.engine().address, "snap1"]).expect("revert");
    let after = images(&c.addresses(), 1);
    assert_identical(&after, &c.addresses());
    assert!(after[0][..4 << 20].iter().all(|&b| b == 0x11), "reverted data is as at the snapshot");
    // Every replica reads as it did right after the snapshot's I/O finished,
    // except what fio wrote after the snapshot point: those ranges must
    // match neither 0x22 nor garbage — they equal the snapshot-time content.
    assert!(after[0][4 << 20..8 << 20].iter().all(|&b| b == 0), "the 0x22 writes after the snapshot are gone");
    let fio_range = 64 << 20..80 << 20;
    let differing = after[0][fio_range.clone()]
        .chunks(4096)
        .zip(at_snapshot[0][fio_range].chunks(4096))
        .filter(|(a, b)| a != b)
        .count();
    assert!(differing > 0, "no fio write landed after the snapshot: it was not taken mid-stream");
    eprintln!("{differing} fio blocks were written after the snapshot and rolled back");
    let out = engine_cli(&["snapshot", "revert", "--engine", &c.engine().address, "nope"]).unwrap_err();
    assert!(out.contains("not found"), "{out}");
}

#[test]
fn an_engine_with_an_older_epoch_is_fenced() {
    let mut c = Cluster::new("eng-fence", 2);
    c.start_engine(1, &[]);
    let uri_one = c.uri();
    run("qemu-io", &["-f", "raw", &uri_one, "-c", "write -P 0x01 0 64k"]).unwrap();
    let second_socket = c.dir.path().join("vol2.sock");
    let addresses = c.addresses();
    let refs: Vec<&str> = addresses.iter().map(String::as_str).collect();
    let second = start_engine("engine2", "vol", SIZE, 2, &refs, &second_socket, c.dir.path(), &[]).unwrap();
    let uri_two = nbd_uri("vol", &second_socket);
    run("qemu-io", &["-f", "raw", &uri_two, "-c", "write -P 0x02 0 64k"]).unwrap();
    let stale = run("qemu-io", &["-f", "raw", &uri_one, "-c", "write -P 0x03 0 64k"]);
    match stale {
        Err(_) => {}
        Ok(out) => assert!(out.contains("failed"), "epoch 1 write must fail: {out}"),
    }
    assert_eq!(engine_status(c.engine())["fenced"], true);
    let out = run("qemu-io", &["-f", "raw", &uri_two, "-c", "read -P 0x02 0 64k"]).unwrap();
    assert!(!out.contains("Pattern verification failed"), "{out}");
    for img in images(&addresses, 2) {
        assert!(img[..65536].iter().all(|&b| b == 0x02));
    }
    drop(second);
}

#[test]
fn bad_nbd_input_gets_errors_and_other_clients_are_unaffected() {
    let mut c = Cluster::new("eng-bad", 2);
    c.start_engine(1, &[]);
    let sock: &Path = &c.socket;
    let mut good = NbdClient::connect(sock, "vol").unwrap();
    assert_eq!(good.size, SIZE_BYTES);
    let block = vec![0x77u8; 4096];
    assert_eq!(good.request(1, 4096, 4096, &block).unwrap().0, 0);

    // Unknown export name.
    assert!(NbdClient::connect(sock, "other").is_err());
    // Read past the end, zero-length write, unaligned write, unknown command.
    let mut bad = NbdClient::connect(sock, "vol").unwrap();
    assert_eq!(bad.request(0, SIZE_BYTES, 4096, &[]).unwrap().0, 22, "read past the end: EINVAL");
    assert_eq!(bad.request(1, 0, 0, &[]).unwrap().0, 22, "zero-length write: EINVAL");
    assert_eq!(bad.request(1, 100, 4096, &block).unwrap().0, 22, "unaligned write: EINVAL");
    assert_eq!(bad.request(99, 0, 4096, &[]).unwrap().0, 22, "unknown command: EINVAL");
    // Garbage after the handshake: the server closes this connection.
    {
        use std::io::{Read, Write};
        bad.stream.write_all(&[0xde; 64]).unwrap();
        let mut buf = [0u8; 16];
        let n = bad.stream.read(&mut buf).unwrap_or(0);
        assert_eq!(n, 0, "connection closed after garbage");
    }
    // The first client is unaffected.
    let (err, data) = good.request(0, 4096, 4096, &[]).unwrap();
    assert_eq!(err, 0);
    assert_eq!(data, block);
    let out = run("qemu-io", &["-f", "raw", &c.uri(), "-c", "read -P 0x77 4k 4k"]).unwrap();
    assert!(!out.contains("failed"), "{out}");
}

/// Unmounts a mountpoint by its exact path when dropped.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = run("umount", &[self.0.to_str().unwrap()]);
    }
}

fn file_digest(path: &Path) -> u32 {
    let data = std::fs::read(path).unwrap();
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    h
}

/// The engine's block-device frontend as its status describes it.
fn blockdev_frontend(engine: &Process) -> String {
    let status = engine_status(engine);
    let frontends = status["frontends"].as_array().expect("frontends");
    frontends
        .iter()
        .filter_map(|f| f.as_str())
        .find(|f| f.starts_with("blockdev:"))
        .expect("a blockdev frontend")
        .into()
}

/// Starts the cluster's engine on a new volume with a block device
/// (`flags`) over every replica, checks its FUSE requests come over
/// `transport`, and gives the volume's name.
fn start_blockdev_engine(c: &mut Cluster, name: &str, flags: &[&str], transport: &str) -> String {
    let volume = unique(name);
    let addresses = c.addresses();
    let refs: Vec<&str> = addresses.iter().map(String::as_str).collect();
    c.engine = Some(start_engine("engine", &volume, SIZE, 1, &refs, &c.socket, c.dir.path(), flags).unwrap());
    let frontend = blockdev_frontend(c.engine());
    assert!(frontend.contains(transport), "requests should come over {transport}: {frontend}");
    volume
}

/// This kernel has FUSE over io_uring (CONFIG_FUSE_IO_URING): the engine
/// turns the fuse module's parameter on and serves the block device there.
fn require_fuse_uring() {
    assert!(
        Path::new("/sys/module/fuse/parameters/enable_uring").exists(),
        "this kernel lacks FUSE over io_uring (CONFIG_FUSE_IO_URING); the block-device tests need it"
    );
}

#[test]
fn blockdev_ext4_survives_a_replica_kill() {
    require_root();
    require_tool("mkfs.ext4", "e2fsprogs");
    require_tool("fio", "fio");
    require_fuse_uring();
    let mut c = Cluster::new("eng-bd", 3);
    let addresses = c.addresses();
    let volume = start_blockdev_engine(&mut c, "bd", &["--blockdev"], "FUSE over io_uring");
    let device = format!("/dev/ironhorn/{volume}");
    assert!(Path::new(&device).exists(), "{device} exists");
    // Many requests in flight on the ring at once, every block checked.
    let fio = Command::new("fio")
        .args([
            "--name=ring",
            &format!("--filename={device}"),
            "--ioengine=io_uring",
            "--direct=1",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=64",
            "--size=64M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ])
        .output()
        .unwrap();
    assert!(fio.status.success(), "fio verify over the ring: {}", String::from_utf8_lossy(&fio.stdout));
    run("mkfs.ext4", &["-q", &device]).expect("mkfs.ext4");
    let mnt = c.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    run("mount", &[&device, mnt.to_str().unwrap()]).expect("mount");
    let mounted = Mounted(mnt.clone());
    let write_files = |from: usize, to: usize| {
        for i in from..to {
            let data: Vec<u8> = (0..(1 << 20) + i * 4099).map(|k| (k * 31 + i * 7) as u8).collect();
            std::fs::write(mnt.join(format!("f{i}")), data).unwrap();
        }
        run("sync", &[]).unwrap();
    };
    write_files(0, 8);
    c.replicas[2].kill9();
    write_files(8, 16);
    let digests: Vec<u32> = (0..16).map(|i| file_digest(&mnt.join(format!("f{i}")))).collect();
    drop(mounted);
    let fsck = Command::new("fsck.ext4").args(["-n", "-f", &device]).output().unwrap();
    assert!(fsck.status.success(), "fsck -n: {}", String::from_utf8_lossy(&fsck.stdout));
    run("mount", &[&device, mnt.to_str().unwrap()]).expect("remount");
    let _mounted = Mounted(mnt.clone());
    for (i, d) in digests.iter().enumerate() {
        assert_eq!(file_digest(&mnt.join(format!("f{i}"))), *d, "file f{i} after remount");
    }
    let status = engine_status(c.engine());
    assert_eq!(replica_modes(&status)[&addresses[2]], "ERR");
}

/// What the block device's FUSE ring entries hold resident in process
/// `pid`, in KiB: their memfd mapping in /proc/PID/smaps.
fn ring_resident_kib(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let (mut in_ring, mut found, mut kib) = (false, false, 0);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if !first.ends_with(':') {
            // A mapping's first line: "start-end perms offset dev inode path".
            in_ring = line.ends_with("/memfd:ironhorn-fuse-ring (deleted)");
            found |= in_ring;
        } else if in_ring && first == "Rss:" {
            kib += line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).expect("Rss: N kB");
        }
    }
    assert!(found, "the engine (pid {pid}) maps no ironhorn-fuse-ring memory");
    kib
}

/// A burst of 1 MiB writes leaves the ring's entries holding their payload
/// pages; once large I/O stops, the ring gives them back while 4 KiB I/O
/// goes on (the ring idles between QD1 requests), and nothing is lost:
/// fio verifies the small writes as they go and the large ones after.
#[test]
fn blockdev_ring_gives_large_io_pages_back_while_small_io_runs_and_loses_nothing() {
    require_root();
    require_tool("fio", "fio");
    require_fuse_uring();
    let mut c = Cluster::new("eng-trim", 2);
    let volume = start_blockdev_engine(&mut c, "trim", &["--blockdev"], "FUSE over io_uring");
    let pid = c.engine().pid();
    let device = format!("/dev/ironhorn/{volume}");
    let fio = |name: &str, rest: &[&str]| {
        let mut cmd = Command::new("fio");
        cmd.args([
            &format!("--name={name}"),
            &format!("--filename={device}"),
            "--ioengine=io_uring",
            "--direct=1",
            "--verify=crc32c",
            "--verify_fatal=1",
        ])
        .args(rest)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        cmd
    };
    let large = ["--rw=write", "--bs=1M", "--iodepth=16", "--size=64M"];
    let out = fio("large", &large).args(["--do_verify=0"]).output().unwrap();
    assert!(out.status.success(), "1 MiB writes: {}", String::from_utf8_lossy(&out.stdout));
    let peak = ring_resident_kib(pid);
    assert!(peak >= 4096, "1 MiB writes should fill the ring's entries; {peak} KiB resident");

    let mut small = fio("small", &["--rw=randwrite", "--bs=4k", "--iodepth=1", "--offset=64M", "--size=64M"])
        .args(["--do_verify=1"])
        .spawn()
        .unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
    let trimmed = loop {
        // Whether fio runs is read before the ring's memory, so pages found
        // gone were given back while it ran.
        let running = small.try_wait().unwrap().is_none();
        let now = ring_resident_kib(pid);
        assert!(running, "the small I/O ended with {now} KiB of the ring's {peak} still resident");
        if now <= peak / 4 {
            break now;
        }
        assert!(Instant::now() < deadline, "the ring still holds {now} KiB of {peak} after 120 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = small.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "4 KiB writes verified after the ring trimmed to {trimmed} KiB: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = fio("large", &large).args(["--verify_only"]).output().unwrap();
    assert!(out.status.success(), "the 1 MiB writes read back: {}", String::from_utf8_lossy(&out.stdout));
}

/// The block device's FUSE file: an fsync reaches every replica (nothing
/// acknowledged is left unflushed after it returns), unaligned writes that
/// straddle blocks read back byte for byte, and a read past the end is short.
/// Over both ways FUSE requests reach the engine: io_uring and `/dev/fuse`.
#[test]
fn blockdev_fsync_flushes_every_replica_and_unaligned_file_io_reads_back() {
    require_fuse_uring();
    fsync_and_unaligned_file_io("bds", &["--blockdev"], "FUSE over io_uring");
}

#[test]
fn blockdev_fsync_and_unaligned_file_io_over_dev_fuse() {
    fsync_and_unaligned_file_io("bdd", &["--blockdev", "--no-fuse-uring"], "FUSE + loop");
}

fn fsync_and_unaligned_file_io(name: &str, flags: &[&str], transport: &str) {
    use std::io::{Read, Seek, SeekFrom, Write};
    require_root();
    let mut c = Cluster::new(&format!("eng-{name}"), 2);
    let volume = start_blockdev_engine(&mut c, name, flags, transport);
    // Asked over gRPC from this process: a child process would inherit the
    // open file and close it, and FUSE flushes on every close.
    let rt = runtime();
    let address = format!("http://{}", c.engine().address);
    let unflushed = || {
        rt.block_on(async {
            let mut client =
                ironhorn_proto::engine::engine_client::EngineClient::connect(address.clone()).await.unwrap();
            client.status(ironhorn_proto::engine::StatusRequest {}).await.unwrap().into_inner().unflushed_bytes
        })
    };
    let file_path = Path::new("/run/ironhorn/fuse").join(&volume).join("volume");
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(&file_path).expect("open the FUSE file");
    assert_eq!(file.metadata().unwrap().len(), SIZE_BYTES, "the file is as large as the volume");

    // Unaligned, straddling a block boundary, then a second one inside the first.
    let first: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    file.seek(SeekFrom::Start(4000)).unwrap();
    file.write_all(&first).unwrap();
    assert!(unflushed() > 0, "the write is acknowledged but not yet flushed (the background flush waits 5 s)");
    file.sync_all().expect("fsync");
    assert_eq!(unflushed(), 0, "fsync returned with writes unflushed");

    file.seek(SeekFrom::Start(6000)).unwrap();
    file.write_all(b"straddle").unwrap();
    let mut expected = first.clone();
    expected[2000..2008].copy_from_slice(b"straddle");
    let mut back = vec![0u8; expected.len()];
    file.seek(SeekFrom::Start(4000)).unwrap();
    file.read_exact(&mut back).unwrap();
    assert!(back == expected, "unaligned writes read back differently");

    // The last 100 bytes, asked for 4096: a short read, not an error.
    let mut tail = vec![0u8; 4096];
    file.seek(SeekFrom::Start(SIZE_BYTES - 100)).unwrap();
    assert_eq!(file.read(&mut tail).unwrap(), 100);
    // Past the end: ENOSPC, nothing written.
    file.seek(SeekFrom::Start(SIZE_BYTES - 10)).unwrap();
    let err = file.write_all(&[1u8; 100]).expect_err("a write past the end is refused");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
}

#[test]
fn an_interrupted_rebuild_resumes_instead_of_starting_over() {
    let mut c = Cluster::new("eng-resume", 1);
    c.start_engine(1, &["--rebuild-mib-per-sec", "48"]);
    finish(fio(&c.uri(), &["--rw=write", "--bs=1M", "--size=256M", "--end_fsync=1"]), "fio fill");
    c.add_replica_process(1);
    let target = c.replicas[1].address.clone();
    engine_cli(&["replica", "add", "--engine", &c.engine().address, "--replica", &target, "--no-wait"]).unwrap();
    // Interrupt the rebuild part-way by killing the target.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (copied_before, running) = loop {
        let status = engine_status(c.engine());
        let r = &status["rebuilds"][0];
        let copied = r["copied_bytes"].as_u64().unwrap_or(0);
        if copied >= 48 << 20 {
            assert_eq!(r["state"], "running", "the rebuild must still be copying when its target dies: {r}");
            break (copied, r.clone());
        }
        assert_ne!(r["state"], "done", "rebuild finished before it could be interrupted: {r}");
        assert!(Instant::now() < deadline, "rebuild made no progress: {status}");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Killed straight after the look that saw it copying; whether the
    // rebuild was still running then is checked below (it must fail, not end).
    c.replicas[1].kill9();
    eprintln!("killed the target while the rebuild was at: {running}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = engine_status(c.engine())["rebuilds"][0]["state"].clone();
        if state == "failed" {
            break;
        }
        assert_ne!(state, "done", "the rebuild ended before its target was killed");
        assert!(Instant::now() < deadline, "rebuild did not notice the dead target: {}", engine_status(c.engine()));
        std::thread::sleep(Duration::from_millis(100));
    }
    // Back on its store: the second rebuild copies only what is left.
    c.add_replica_process(1);
    let back = c.replicas[1].address.clone();
    engine_cli(&["replica", "add", "--engine", &c.engine().address, "--replica", &back]).unwrap();
    let status = engine_status(c.engine());
    let second = &status["rebuilds"][0];
    assert_eq!(second["state"], "done", "{status}");
    let copied_after = second["copied_bytes"].as_u64().unwrap();
    eprintln!("first attempt copied {copied_before} bytes; the resumed one {copied_after} of {SIZE_BYTES}");
    assert!(copied_after + copied_before / 2 <= SIZE_BYTES, "the second rebuild redid the first one's work: {second}");
    let both = vec![c.replicas[0].address.clone(), back];
    assert_identical(&images(&both, 1), &both);
}

#[test]
fn after_an_engine_crash_the_newest_replica_serves_and_the_other_is_rebuilt() {
    let mut c = Cluster::new("eng-start", 2);
    c.start_engine(1, &[]);
    let uri = c.uri();
    run("qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x0a 0 1M", "-c", "flush"]).unwrap();
    // Replica 1 drops out; replica 0 alone takes newer data.
    c.replicas[1].kill9();
    run("qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x0b 0 1M", "-c", "flush"]).unwrap();
    // The engine dies; replica 1 comes back on its old store.
    c.engine.as_mut().unwrap().kill9();
    c.add_replica_process(1);
    let stale = c.replicas[1].address.clone();
    c.start_engine(2, &[]);
    let out = run("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x0b 0 1M"]).unwrap();
    assert!(!out.contains("Pattern verification failed"), "older data was served: {out}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = engine_status(c.engine());
        if replica_modes(&status)[&stale] == "RW" {
            break;
        }
        assert!(Instant::now() < deadline, "stale replica was not rebuilt: {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let images = images(&c.addresses(), 2);
    assert_identical(&images, &c.addresses());
    assert!(images[0][..1 << 20].iter().all(|&b| b == 0x0b));
}

#[test]
fn expand_grows_every_replica() {
    let mut c = Cluster::new("eng-expand", 2);
    c.start_engine(1, &[]);
    run("qemu-io", &["-f", "raw", &c.uri(), "-c", "write -P 0x3c 0 1M"]).unwrap();
    let status = engine_cli(&["expand", "--engine", &c.engine().address, "--size", "320MiB"]).expect("expand");
    assert!(status.contains(&(320u64 << 20).to_string()), "{status}");
    assert_eq!(run("nbdinfo", &["--size", &c.uri()]).unwrap().trim(), (320u64 << 20).to_string());
    run("qemu-io", &["-f", "raw", &c.uri(), "-c", "write -P 0x3d 300M 1M", "-c", "read -P 0x3c 0 1M"]).unwrap();
    let rt = runtime();
    let images: Vec<Vec<u8>> = c.addresses().iter().map(|a| rt.block_on(replica_image(a, 320 << 20, 1))).collect();
    assert_identical(&images, &c.addresses());
    assert!(images[0][300 << 20..301 << 20].iter().all(|&b| b == 0x3d));
    let shrink = engine_cli(&["expand", "--engine", &c.engine().address, "--size", "128MiB"]).unwrap_err();
    assert!(shrink.contains("at least"), "{shrink}");
}

#[test]
fn a_corrupt_block_on_one_replica_is_read_from_another_and_repaired() {
    let mut c = Cluster::new("eng-corrupt", 2);
    c.start_engine(1, &[]);
    run("qemu-io", &["-f", "raw", &c.uri(), "-c", "write -P 0x6e 2M 64k", "-c", "flush"]).unwrap();
    // Flip a byte of that data in replica 0's store while it is stopped.
    assert_eq!(c.replicas[0].stop(Duration::from_secs(20)), Some(0));
    let path = c.dir.path().join("r0.img");
    let mut raw = std::fs::read(&path).unwrap();
    let at = raw.chunks(4096).position(|b| b.iter().all(|&x| x == 0x6e)).expect("data block in the store");
    raw[at * 4096 + 17] ^= 1;
    std::fs::write(&path, &raw).unwrap();
    drop(raw);
    c.add_replica_process(0);
    c.engine.as_mut().unwrap().stop(Duration::from_secs(20));
    c.start_engine(2, &[]);
    let corrupt = c.replicas[0].address.clone();
    // Each replica serves reads in turns of 256: 600 reads reach replica 0;
    // every read still returns good data.
    let out = run("qemu-io", &["-f", "raw", &c.uri(), "-c", "read -P 0x6e 2M 64k"]).unwrap();
    assert!(!out.contains("Pattern verification failed") && !out.contains("failed"), "{out}");
    let mut client = NbdClient::connect(&c.socket, "vol").unwrap();
    for read in 0..600 {
        let (error, data) = client.request(0, 2 << 20, 65536, &[]).unwrap();
        assert_eq!(error, 0, "read {read}");
        assert!(data.len() == 65536 && data.iter().all(|&b| b == 0x6e), "read {read} returned other bytes");
    }
    // The bad copy is rewritten in place from the other replica; the
    // replica never leaves RW (nothing is rebuilt).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = engine_status(c.engine());
        if status["bad_blocks_repaired"].as_u64() == Some(1) {
            assert_eq!(status["bad_blocks_found"].as_u64(), Some(1), "{status}");
            assert_eq!(replica_modes(&status)[&corrupt], "RW", "{status}");
            assert!(status["rebuilds"].as_array().unwrap().is_empty(), "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "the bad block was not repaired: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let rt = runtime();
    let data = rt.block_on(async {
        let s = DataStream::open(&corrupt).await;
        s.read(2 << 20, 65536, 2).await
    });
    let data = data.expect("the repaired range reads back");
    assert!(data.iter().all(|&b| b == 0x6e));
}

/// Every frontend request is counted once, by kind, with its bytes; a
/// request the volume refuses counts as an error; the histogram holds them all.
#[test]
fn metrics_count_each_frontend_request() {
    require_tool("qemu-io", "qemu-utils");
    let mut c = Cluster::new("eng-metrics", 2);
    c.start_engine(1, &[]);
    let uri = c.uri();
    run("qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x21 0 64k", "-c", "write -P 0x22 1M 4k"]).unwrap();
    run("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x21 0 64k", "-c", "read -P 0x22 1M 4k"]).unwrap();
    let mut client = NbdClient::connect(&c.socket, "vol").unwrap();
    assert_eq!(client.request(0, SIZE_BYTES - 4096, 8192, &[]).unwrap().0, 22, "read past the end: EINVAL");
    let out = engine_cli(&["metrics", "--engine", &c.engine().address]).expect("metrics");
    let m: serde_json::Value = serde_json::from_str(&out).expect("metrics JSON");
    assert_eq!(m["volume"], "vol");
    let op = |name: &str| m["ops"].as_array().unwrap().iter().find(|o| o["op"] == name).unwrap().clone();
    let (write, read) = (op("write"), op("read"));
    assert_eq!((write["requests"].as_u64(), write["errors"].as_u64()), (Some(2), Some(0)), "{out}");
    assert_eq!(write["bytes"], (64 << 10) + 4096, "{out}");
    assert_eq!((read["requests"].as_u64(), read["errors"].as_u64()), (Some(3), Some(1)), "{out}");
    assert_eq!(read["bytes"], (64 << 10) + 4096, "only what was read counts as bytes: {out}");
    assert_eq!(op("trim")["requests"], 0);
    for o in [&write, &read] {
        let buckets = o["latency_buckets"].as_array().unwrap();
        assert_eq!(buckets.len(), m["latency_bounds_us"].as_array().unwrap().len());
        assert!(buckets.windows(2).all(|w| w[0].as_u64() <= w[1].as_u64()), "cumulative: {out}");
        assert!(o["latency_ns_total"].as_u64().unwrap() > 0);
    }
}

/// Replica 1 (at `address`) is SIGKILLed, 2 MiB written while it is away,
/// then it is restarted on its store and added back: asserts it copies only
/// those (dirty map, at most four 1 MiB chunks), whatever went before, and
/// ends identical to the others.
fn kill_write_and_readd_copies_only_the_new_writes(c: &mut Cluster, address: &str) {
    // Killed with no I/O in flight on purpose: what is checked is that only
    // the writes made while it is away are copied when it comes back.
    c.replicas[1].kill9();
    finish(fio(&c.uri(), &["--rw=randwrite", "--size=2M", "--offset=200M"]), "fio while it is away");
    assert_eq!(replica_modes(&engine_status(c.engine()))[address], "ERR");
    c.add_replica_process(1);
    let back = c.replicas[1].address.clone();
    engine_cli(&["replica", "remove", "--engine", &c.engine().address, "--replica", address]).expect("remove");
    engine_cli(&["replica", "add", "--engine", &c.engine().address, "--replica", &back]).expect("re-add");
    let status = engine_status(c.engine());
    assert_eq!(replica_modes(&status)[&back], "RW", "{status}");
    let delta = &status["rebuilds"][0];
    assert_eq!(delta["method"], "dirty-map", "{delta}");
    let copied = delta["copied_bytes"].as_u64().unwrap();
    assert!(copied > 0 && copied <= 4 << 20, "only the 2 MiB written while away, not the earlier fill: {delta}");
    let all = c.addresses();
    assert_identical(&images(&all, 1), &all);
}

/// A volume filled without a single client flush, then a replica rebuilt
/// into it: when that replica later drops out and comes back, it copies
/// what was written while it was away, not the whole unflushed fill (the
/// end of a rebuild makes everything before it durable on every replica).
#[test]
fn a_rebuilt_replica_that_drops_out_later_copies_only_the_new_writes() {
    let mut c = Cluster::new("eng-reheal", 1);
    c.start_engine(1, &[]);
    finish(fio(&c.uri(), &["--rw=write", "--bs=1M", "--size=128M"]), "fio fill, no flush");
    c.add_replica_process(1);
    let fresh = c.replicas[1].address.clone();
    engine_cli(&["replica", "add", "--engine", &c.engine().address, "--replica", &fresh]).expect("replica add");
    kill_write_and_readd_copies_only_the_new_writes(&mut c, &fresh);
}

/// Writes a client never flushes get a flush from the engine a few seconds
/// later: a replica killed after that comes back copying only what was
/// written while it was away, not the whole unflushed fill.
#[test]
fn writes_no_client_flushes_get_a_background_flush() {
    let mut c = Cluster::new("eng-bgflush", 2);
    c.start_engine(1, &[]);
    let address = c.replicas[1].address.clone();
    finish(fio(&c.uri(), &["--rw=write", "--bs=1M", "--size=64M"]), "fio fill, no flush");
    // The engine flushes 5 s after the first unflushed write: wait until it
    // says no acknowledged write is left unflushed (every replica answered).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = engine_status(c.engine());
        if status["unflushed_bytes"].as_u64().expect("unflushed_bytes") == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no background flush covered the fill within 30 s: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    kill_write_and_readd_copies_only_the_new_writes(&mut c, &address);
}

/// A small deterministic generator (xorshift64*), so a failing case can be
/// replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Random bytes at every stage of the NBD protocol: raw bytes instead of a
/// handshake, and after a valid handshake both raw bytes and request
/// headers with the right magic and random command, flags, offset and length
/// (up to 4 GiB writes announced). The engine answers or closes the
/// connection each time, never dies, and a client connected throughout
/// reads and writes as before.
#[test]
fn random_bytes_on_the_nbd_socket_never_take_the_engine_down() {
    use std::io::{Read, Write};
    let mut c = Cluster::new("eng-fuzz", 1);
    c.start_engine(1, &[]);
    let sock = c.socket.clone();
    let mut good = NbdClient::connect(&sock, "vol").unwrap();
    let block = vec![0x3cu8; 4096];
    assert_eq!(good.request(1, 8192, 4096, &block).unwrap().0, 0);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..300u32 {
        let mut stream = match case % 3 {
            0 => std::os::unix::net::UnixStream::connect(&sock).expect("connect"),
            _ => NbdClient::connect(&sock, "vol").expect("handshake").stream,
        };
        let payload = if case % 3 == 2 {
            let mut header = Vec::with_capacity(28);
            header.extend_from_slice(&0x2560_9513u32.to_be_bytes());
            header.extend_from_slice(&(rng.next() as u16).to_be_bytes()); // flags
            header.extend_from_slice(&((rng.next() % 12) as u16).to_be_bytes()); // command
            header.extend_from_slice(&rng.next().to_be_bytes()); // handle
            let offset = if rng.next() % 2 == 0 { rng.next() % SIZE_BYTES } else { rng.next() };
            header.extend_from_slice(&offset.to_be_bytes());
            header.extend_from_slice(&(rng.next() as u32).to_be_bytes()); // length
            let extra = (rng.next() % 64) as usize;
            header.extend(rng.bytes(extra));
            header
        } else {
            let n = (rng.next() % 512) as usize;
            rng.bytes(n)
        };
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = stream.write_all(&payload);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink);
        assert!(c.engine.as_mut().unwrap().alive(), "the engine died on case {case}: {payload:02x?}");
    }
    let (err, data) = good.request(0, 8192, 4096, &[]).unwrap();
    assert_eq!((err, data), (0, block), "the client connected throughout still reads its data");
    assert_eq!(good.request(1, 12288, 4096, &[0x4d; 4096]).unwrap().0, 0, "and writes");
}

/// With no I/O at all, a replica whose process dies is failed as soon as its
/// data stream ends (before, an idle engine kept reporting it RW until the
/// next write, and the manager saw a healthy volume with a dead replica).
#[test]
fn an_idle_engine_fails_a_replica_whose_process_died() {
    let mut c = Cluster::new("eng-idle", 2);
    c.start_engine(1, &[]);
    let victim = c.replicas[1].address.clone();
    assert_eq!(replica_modes(&engine_status(c.engine()))[&victim], "RW");
    c.replicas[1].kill9();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let modes = replica_modes(&engine_status(c.engine()));
        if modes[&victim] == "ERR" {
            assert_eq!(modes[&c.replicas[0].address], "RW", "{modes:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "a dead replica still shows {modes:?} with no I/O");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = run("qemu-io", &["-f", "raw", &c.uri(), "-c", "write -P 0x21 0 64k", "-c", "read -P 0x21 0 64k"]);
    assert!(out.is_ok_and(|o| !o.contains("failed")), "the volume serves on the replica left");
}

/// Drops every packet to one TCP port on this host while it lives (a
/// partition with no reset: the peer just stops answering); the rule is
/// removed by its exact spec.
struct DropPort(u16);

impl DropPort {
    fn new(port: u16) -> DropPort {
        require_tool("iptables", "iptables");
        let port_s = port.to_string();
        run("iptables", &["-I", "INPUT", "-p", "tcp", "--dport", &port_s, "-j", "DROP"]).expect("iptables insert");
        DropPort(port)
    }
}

impl Drop for DropPort {
    fn drop(&mut self) {
        let port = self.0.to_string();
        let _ = run("iptables", &["-D", "INPUT", "-p", "tcp", "--dport", &port, "-j", "DROP"]);
    }
}

/// A replica cut off without a reset (its packets dropped) while the volume
/// is idle is failed by the engine's HTTP/2 keepalive within the replica
/// timeout plus the ping interval, not at the next write; the volume goes on
/// serving from the other replica.
#[test]
fn an_idle_engine_fails_a_replica_cut_off_by_the_network() {
    let mut c = Cluster::new("eng-partition", 2);
    c.start_engine(1, &["--replica-timeout", "2"]);
    let victim = c.replicas[1].address.clone();
    let port: u16 = victim.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(replica_modes(&engine_status(c.engine()))[&victim], "RW");
    let _cut = DropPort::new(port);
    let start = Instant::now();
    loop {
        let modes = replica_modes(&engine_status(c.engine()));
        if modes[&victim] == "ERR" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "a cut-off replica still shows {modes:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("cut-off replica failed after {:?}", start.elapsed());
    let out = run("qemu-io", &["-f", "raw", &c.uri(), "-c", "write -P 0x31 0 64k", "-c", "read -P 0x31 0 64k"]);
    assert!(out.is_ok_and(|o| !o.contains("failed")), "the volume serves on the replica left");
}

/// The transport of each replica in an engine's status.
fn transports(status: &serde_json::Value) -> std::collections::HashMap<String, String> {
    status["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| (r["address"].as_str().unwrap().to_string(), r["transport"].as_str().unwrap().to_string()))
        .collect()
}

/// Replicas started with the engine's `--local-sockets` directory are
/// reached over their unix socket there; one without a socket (a stale file
/// of a dead process in its place) over TCP. Data written over both reads
/// back the same on every replica; a local replica killed under fio verify
/// leaves a stale file, and a fresh local one is rebuilt and reached over
/// its socket.
#[test]
fn same_node_replicas_are_reached_over_local_sockets_and_others_over_tcp() {
    let dir = TempDir::new("eng-local");
    let sockets = dir.path().join("sockets");
    let sockets_arg = sockets.display().to_string();
    let local = ["--local-sockets", sockets_arg.as_str()];
    let store = |i: usize| format!("file:{}", dir.path().join(format!("r{i}.img")).display());
    let r0 = start_replica("replica-0", &store(0), SIZE, dir.path(), &local).unwrap();
    let r1 = start_replica("replica-1", &store(1), SIZE, dir.path(), &[]).unwrap();
    let mut r2 = start_replica("replica-2", &store(2), SIZE, dir.path(), &local).unwrap();
    for r in [&r0, &r2] {
        let path = sockets.join(format!("{}.sock", r.address));
        assert!(std::os::unix::fs::FileTypeExt::is_socket(&std::fs::metadata(&path).unwrap().file_type()), "{path:?}");
    }
    // A socket file nobody listens on, named for the TCP-only replica.
    drop(std::os::unix::net::UnixListener::bind(sockets.join(format!("{}.sock", r1.address))).unwrap());

    let socket = dir.path().join("vol.sock");
    let addresses = [r0.address.clone(), r1.address.clone(), r2.address.clone()];
    let refs: Vec<&str> = addresses.iter().map(String::as_str).collect();
    let engine = start_engine("engine", "vol", SIZE, 1, &refs, &socket, dir.path(), &local).unwrap();
    let status = engine_status(&engine);
    let t = transports(&status);
    assert_eq!((t[&r0.address].as_str(), t[&r1.address].as_str(), t[&r2.address].as_str()), ("unix", "tcp", "unix"));
    let uri = nbd_uri("vol", &socket);
    finish(fio(&uri, &["--rw=write", "--bs=1M", "--size=64M", "--end_fsync=1"]), "fio fill");

    let mut run = fio(
        &uri,
        &[
            "--rw=randwrite",
            "--size=32M",
            "--offset=64M",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--verify_state_save=0",
        ],
    );
    wait_for_writes_in_flight(&engine.address, &mut run, 1000, Duration::from_secs(60));
    let killed = r2.address.clone();
    r2.kill9();
    finish(run, "fio verify with a local replica killed");
    assert_eq!(replica_modes(&engine_status(&engine))[&killed], "ERR");
    let healthy = [r0.address.clone(), r1.address.clone()];
    assert_identical(&images(&healthy, 1), &healthy);

    // A fresh store on this node: rebuilt, then reached over its socket.
    let r3 = start_replica("replica-3", &store(3), SIZE, dir.path(), &local).unwrap();
    engine_cli(&["replica", "add", "--engine", &engine.address, "--replica", &r3.address]).expect("replica add");
    let status = engine_status(&engine);
    assert_eq!(replica_modes(&status)[&r3.address], "RW", "{status}");
    assert_eq!(transports(&status)[&r3.address], "unix", "{status}");
    assert_eq!(status["rebuilds"][0]["state"], "done", "{status}");
    let all = [r0.address.clone(), r1.address.clone(), r3.address.clone()];
    assert_identical(&images(&all, 1), &all);
    drop(engine);
    drop((r0, r1, r3));
}
