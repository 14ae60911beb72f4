//! The control plane against real processes: `ironhorn up` (manager + three
//! instance managers, each node's disk an LVM VG on a loop device), the CLI,
//! fio and nbdinfo.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use ironhorn_tests::*;

fn fio_verify(endpoint: &str, size: &str) -> Command {
    require_tool("fio", "fio");
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={endpoint}"),
        "--rw=randwrite",
        "--bs=4k",
        &format!("--size={size}"),
        "--iodepth=16",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]);
    cmd
}

fn run_ok(mut cmd: Command) {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_bytes(cluster: &StandaloneCluster) -> Vec<(String, u64, u64)> {
    let nodes = cluster.json(&["node", "list"]);
    nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let d = &n["status"]["diskStatus"]["disk-1"];
            (
                n["metadata"]["name"].as_str().unwrap().to_string(),
                d["storageAvailable"].as_u64().unwrap(),
                d["storageScheduled"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn three_replicas_on_three_nodes_attach_fio_detach_delete_gives_space_back() {
    require_tool("nbdinfo", "libnbd-bin");
    let cluster = StandaloneCluster::start("up-life", 3, 24000, "2GiB");
    let before = free_bytes(&cluster);
    assert!(before.iter().all(|(_, _, scheduled)| *scheduled == 0), "{before:?}");

    cluster.cli(&["volume", "create", "v1", "--size", "256MiB", "--replicas", "3"]).expect("create");
    cluster.wait(Duration::from_secs(60), "v1 detached with its replicas running", || {
        cluster.volume("v1")["status"]["state"] == "detached"
    });
    let replicas = cluster.replicas_of("v1");
    assert_eq!(replicas.len(), 3);
    let nodes: BTreeSet<String> = replicas.iter().map(|r| r["spec"]["nodeID"].as_str().unwrap().to_string()).collect();
    assert_eq!(nodes.len(), 3, "three replicas on three different nodes: {nodes:?}");
    for r in &replicas {
        let node = r["spec"]["nodeID"].as_str().unwrap();
        let name = r["metadata"]["name"].as_str().unwrap();
        assert!(cluster.lvs(node).contains(&name.to_string()), "replica {name} is an LV in {node}'s VG");
        assert!(r["spec"]["dataPath"].as_str().unwrap().starts_with("lvm:"));
    }
    // The node list accounts for them.
    cluster.wait(Duration::from_secs(20), "node list shows the scheduled replicas", || {
        free_bytes(&cluster).iter().all(|(_, _, scheduled)| *scheduled == 256 << 20)
    });
    let table = cluster.cli(&["node", "list"]).unwrap();
    assert!(table.contains("SCHEDULED") && table.contains("256MiB"), "{table}");

    let endpoint = cluster.cli(&["volume", "attach", "v1", "--node", "n-1"]).expect("attach").trim().to_string();
    assert!(endpoint.starts_with("nbd://127.0.0.1:"), "{endpoint}");
    let size = run("nbdinfo", &["--size", &endpoint]).expect("nbdinfo");
    assert_eq!(size.trim(), (256u64 << 20).to_string());
    let volume = cluster.volume("v1");
    assert_eq!(volume["status"]["state"], "attached");
    assert_eq!(volume["status"]["currentNodeID"], "n-1");
    cluster.wait(Duration::from_secs(20), "v1 healthy", || cluster.volume("v1")["status"]["robustness"] == "healthy");
    run_ok(fio_verify(&endpoint, "128M"));
    // The manager's Prometheus page, read with a Prometheus text parser:
    // Longhorn's volume metrics, the engine's counters, the disks.
    let page = cluster.http_get("/metrics").expect("GET /metrics");
    let scrape = prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_string()))).expect("the page parses");
    let sample = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let found: Vec<_> = scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .collect();
        assert_eq!(found.len(), 1, "one {name} {labels:?} in\n{page}");
        match found[0].value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Counter(v) => v,
            ref other => panic!("{name}: {other:?}"),
        }
    };
    let v1 = [("volume", "v1")];
    let v1_on_n1 = [("volume", "v1"), ("node", "n-1"), ("pvc", "")];
    assert_eq!(sample("ironhorn_volume_metrics_up", &v1), 1.0);
    assert_eq!(sample("ironhorn_volume_robustness", &v1_on_n1), 1.0, "healthy");
    assert_eq!(sample("ironhorn_volume_state", &v1_on_n1), 2.0, "attached");
    assert_eq!(sample("ironhorn_volume_capacity_bytes", &v1_on_n1), (256u64 << 20) as f64);
    assert_eq!(sample("ironhorn_volume_size_bytes", &v1), (256u64 << 20) as f64);
    for r in &replicas {
        let name = r["metadata"]["name"].as_str().unwrap();
        let node = r["spec"]["nodeID"].as_str().unwrap();
        assert_eq!(sample("ironhorn_replica_mode", &[("volume", "v1"), ("replica", name)]), 1.0, "RW");
        // fio wrote 128 MiB: each replica's store holds at least that.
        let used = sample("ironhorn_volume_actual_size_bytes", &[("volume", "v1"), ("node", node)]);
        assert!(used >= (128u64 << 20) as f64, "{name} on {node}: {used}");
    }
    // fio wrote and verified 128 MiB: at least that many bytes each way.
    let (write, read) = ([("volume", "v1"), ("op", "write")], [("volume", "v1"), ("op", "read")]);
    assert!(sample("ironhorn_volume_bytes_total", &write) >= (128u64 << 20) as f64, "{page}");
    assert!(sample("ironhorn_volume_bytes_total", &read) >= (128u64 << 20) as f64, "{page}");
    let writes = sample("ironhorn_volume_requests_total", &write);
    let histogram = scrape
        .samples
        .iter()
        .find(|s| s.metric == "ironhorn_volume_request_duration_seconds" && s.labels.get("op") == Some("write"))
        .expect("the write latency histogram");
    let prometheus_parse::Value::Histogram(buckets) = &histogram.value else { panic!("{histogram:?}") };
    assert_eq!(buckets.last().map(|b| (b.less_than, b.count)), Some((f64::INFINITY, writes)));
    assert_eq!(sample("ironhorn_volume_request_errors_total", &write), 0.0);
    let disk = [("node", "n-1"), ("disk", "disk-1")];
    assert_eq!(sample("ironhorn_disk_storage_scheduled_bytes", &disk), (256u64 << 20) as f64);
    assert!(sample("ironhorn_disk_capacity_bytes", &disk) > 0.0);
    assert_eq!(sample("ironhorn_node_count_total", &[]), 3.0);
    assert_eq!(sample("ironhorn_node_status", &[("node", "n-1"), ("condition", "ready")]), 1.0);
    let im = sample("ironhorn_instance_manager_memory_usage_bytes", &[("node", "n-1")]);
    assert!(im > (1u64 << 20) as f64, "an instance manager and its processes use memory: {im}");
    let table = cluster.cli(&["volume", "list"]).unwrap();
    assert!(table.contains("attached") && table.contains("healthy") && table.contains("n-1"), "{table}");
    // The engine reaches the replica on its own node over the node's local
    // socket, the two on other nodes over TCP.
    let engine = cluster.engine_address("v1");
    let status: serde_json::Value =
        serde_json::from_str(&engine_cli(&["status", "--engine", &engine]).expect("engine status")).unwrap();
    let mut transports: Vec<&str> =
        status["replicas"].as_array().expect("replicas").iter().map(|r| r["transport"].as_str().unwrap()).collect();
    transports.sort();
    assert_eq!(transports, ["tcp", "tcp", "unix"], "{status}");
    // I/O limits changed on the volume reach its running engine.
    let limits = || -> serde_json::Value {
        let status: serde_json::Value =
            serde_json::from_str(&engine_cli(&["status", "--engine", &engine]).expect("engine status")).unwrap();
        status["limits"].clone()
    };
    cluster.cli(&["volume", "update", "v1", "--iops-limit", "500", "--bandwidth-limit", "64MiB"]).expect("limits");
    cluster.wait(Duration::from_secs(20), "the engine's limits", || {
        limits() == serde_json::json!({ "iops": 500, "bytes_per_sec": 64 << 20 })
    });
    let err = cluster.cli(&["volume", "update", "v1", "--bandwidth-limit", "fast"]).unwrap_err();
    assert!(err.contains("bandwidthLimit"), "{err}");
    cluster.cli(&["volume", "update", "v1", "--iops-limit", "0", "--bandwidth-limit", "0"]).expect("no limits");
    cluster.wait(Duration::from_secs(20), "no limits", || {
        limits() == serde_json::json!({ "iops": 0, "bytes_per_sec": 0 })
    });

    cluster.cli(&["volume", "detach", "v1"]).expect("detach");
    assert_eq!(cluster.volume("v1")["status"]["state"], "detached");
    assert!(run("nbdinfo", &["--size", &endpoint]).is_err(), "the engine is gone after detach");

    cluster.cli(&["volume", "delete", "v1"]).expect("delete");
    let err = cluster.cli(&["volume", "get", "v1"]).unwrap_err();
    assert!(err.contains("not found"), "{err}");
    for node in ["n-1", "n-2", "n-3"] {
        assert!(cluster.lvs(node).is_empty(), "{node}'s LVs are gone: {:?}", cluster.lvs(node));
    }
    cluster.wait(Duration::from_secs(20), "node list shows the space back", || {
        let now = free_bytes(&cluster);
        now.iter().zip(&before).all(|((_, free, scheduled), (_, was, _))| *scheduled == 0 && free == was)
    });
    assert!(cluster.replicas_of("v1").is_empty());
}

/// A store is larger than its volume (journal, checkpoints, snapshot
/// headroom). With the minimal-available floor at 0 %, only counting the
/// store keeps the scheduler from placing a replica whose LV cannot be made.
#[test]
fn placement_counts_the_store_not_just_the_volume() {
    let cluster = StandaloneCluster::start("up-store", 1, 29500, "512MiB");
    cluster.cli(&["setting", "set", "storage-minimal-available-percentage", "0"]).expect("setting");
    // 450 MiB is less than the disk, but its store (~570 MiB) is more.
    cluster.cli(&["volume", "create", "wide", "--size", "450MiB", "--replicas", "1"]).expect("create");
    cluster.wait(Duration::from_secs(30), "wide unscheduled for insufficient storage", || {
        cluster.volume("wide")["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Scheduled" && c["reason"] == "InsufficientStorage"))
    });
    assert!(cluster.replicas_of("wide").is_empty());
    assert!(cluster.lvs("n-1").is_empty(), "no LV was attempted: {:?}", cluster.lvs("n-1"));
    // 350 MiB (a ~445 MiB store) fits: placed, its LV made, the volume usable.
    cluster.cli(&["volume", "create", "narrow", "--size", "350MiB", "--replicas", "1"]).expect("create");
    cluster.wait(Duration::from_secs(60), "narrow detached with its replica running", || {
        cluster.volume("narrow")["status"]["state"] == "detached"
    });
    let replicas = cluster.replicas_of("narrow");
    assert_eq!(replicas.len(), 1);
    let name = replicas[0]["metadata"]["name"].as_str().unwrap().to_string();
    assert_eq!(cluster.lvs("n-1"), vec![name]);
    assert!(cluster.replicas_of("wide").is_empty(), "wide still does not fit beside narrow");
    cluster.cli(&["volume", "delete", "wide"]).unwrap();
    cluster.cli(&["volume", "delete", "narrow"]).unwrap();
    assert!(cluster.lvs("n-1").is_empty());
}

#[test]
fn a_volume_that_does_not_fit_stays_unscheduled_and_bad_requests_fail() {
    let cluster = StandaloneCluster::start("up-nofit", 3, 24500, "512MiB");
    cluster.cli(&["volume", "create", "huge", "--size", "2GiB", "--replicas", "3"]).expect("create is accepted");
    cluster.wait(Duration::from_secs(30), "huge reports why it is not scheduled", || {
        let v = cluster.volume("huge");
        v["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter().any(|c| c["type"] == "Scheduled" && c["status"] == "False" && c["reason"] == "InsufficientStorage")
        })
    });
    let v = cluster.volume("huge");
    assert_eq!(v["status"]["state"], "creating");
    let table = cluster.cli(&["volume", "list"]).unwrap();
    assert!(table.contains("insufficient storage"), "{table}");
    // Nothing half-made: no replicas, no LVs.
    std::thread::sleep(Duration::from_secs(3));
    assert!(cluster.replicas_of("huge").is_empty());
    for node in ["n-1", "n-2", "n-3"] {
        assert!(cluster.lvs(node).is_empty(), "{node}: {:?}", cluster.lvs(node));
    }
    let err = cluster.cli(&["volume", "attach", "huge", "--node", "n-1"]).unwrap_err();
    assert!(err.contains("insufficient storage"), "{err}");

    // Four replicas on three nodes: hard anti-affinity names itself.
    cluster.cli(&["volume", "create", "four", "--size", "16MiB", "--replicas", "4"]).unwrap();
    cluster.wait(Duration::from_secs(30), "four is unscheduled by anti-affinity", || {
        cluster.volume("four")["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Scheduled" && c["reason"] == "ReplicaAntiAffinity"))
    });

    // Bad input: one line, non-zero exit.
    for (args, expect) in [
        (vec!["volume", "get", "nope"], "not found"),
        (vec!["volume", "create", "x", "--size", "12QB"], "unknown unit"),
        (vec!["volume", "create", "x", "--size", "1000"], "multiple of 4096"),
        (vec!["volume", "create", "Bad_Name", "--size", "1GiB"], "volume name"),
        (vec!["volume", "create", "x", "--size", "1GiB", "--replicas", "0"], "numberOfReplicas"),
        (vec!["volume", "create", "huge", "--size", "1GiB"], "already exists"),
        (vec!["volume", "attach", "huge", "--node", "n-9"], "not found"),
        (vec!["volume", "delete", "nope"], "not found"),
        (vec!["setting", "set", "storage-minimal-available-percentage", "lots"], "not a non-negative integer"),
        (vec!["setting", "get", "no-such-setting"], "not found"),
    ] {
        let err = cluster.cli(&args).expect_err(&format!("{args:?} must fail"));
        assert!(err.contains(expect), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line, got {err}");
    }
    // Deleting the unschedulable volumes leaves nothing behind.
    cluster.cli(&["volume", "delete", "huge"]).unwrap();
    cluster.cli(&["volume", "delete", "four"]).unwrap();
    assert_eq!(cluster.json(&["volume", "list"]).as_array().unwrap().len(), 0);
}

#[test]
fn kill9_of_the_manager_under_fio_leaves_io_running_and_the_restarted_manager_in_step() {
    let mut cluster = StandaloneCluster::start("up-kill", 3, 25000, "2GiB");
    cluster.cli(&["volume", "create", "v1", "--size", "256MiB", "--replicas", "3"]).unwrap();
    let endpoint = cluster.cli(&["volume", "attach", "v1", "--node", "n-2"]).expect("attach").trim().to_string();
    cluster.wait(Duration::from_secs(20), "v1 healthy", || cluster.volume("v1")["status"]["robustness"] == "healthy");
    let epoch_before = cluster.json(&["engine", "list"])[0]["spec"]["epoch"].as_u64().unwrap();

    let mut fio = fio_verify(&endpoint, "192M");
    fio.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut fio = fio.spawn().expect("fio");
    let engine =
        cluster.json(&["engine", "list"])[0]["status"]["address"].as_str().expect("engine address").to_string();
    wait_for_writes_in_flight(&engine, &mut fio, 1000, Duration::from_secs(60));
    cluster.kill9_up();
    assert!(cluster.cli(&["volume", "list"]).is_err(), "the API is down with the manager");
    std::thread::sleep(Duration::from_secs(2));
    // The data path does not depend on the manager.
    assert_eq!(
        run("nbdinfo", &["--size", &endpoint]).expect("engine still serving").trim(),
        (256u64 << 20).to_string()
    );
    cluster.start_up();
    let out = fio.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio verify across a manager kill:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The restarted manager's view matches what runs.
    cluster.wait(Duration::from_secs(30), "v1 attached and healthy after restart", || {
        let v = cluster.volume("v1");
        v["status"]["state"] == "attached" && v["status"]["robustness"] == "healthy"
    });
    let v = cluster.volume("v1");
    assert_eq!(v["status"]["endpoint"], endpoint.as_str(), "the same engine, not a new one");
    let engines = cluster.json(&["engine", "list"]);
    assert_eq!(engines[0]["spec"]["epoch"].as_u64().unwrap(), epoch_before, "the engine was not restarted");
    let replicas = cluster.replicas_of("v1");
    assert_eq!(replicas.len(), 3);
    assert!(replicas.iter().all(|r| r["status"]["currentState"] == "running"), "{replicas:?}");

    // Later operations work.
    cluster.cli(&["volume", "create", "v2", "--size", "64MiB", "--replicas", "2"]).unwrap();
    let endpoint2 = cluster.cli(&["volume", "attach", "v2", "--node", "n-3"]).expect("attach v2").trim().to_string();
    run_ok(fio_verify(&endpoint2, "32M"));
    cluster.cli(&["volume", "detach", "v1"]).unwrap();
    // A re-attach starts a new engine with a higher epoch on the same data.
    let endpoint = cluster.cli(&["volume", "attach", "v1", "--node", "n-1"]).expect("re-attach").trim().to_string();
    let engines = cluster.json(&["engine", "list"]);
    let v1_engine = engines.as_array().unwrap().iter().find(|e| e["spec"]["volumeName"] == "v1").unwrap();
    assert!(v1_engine["spec"]["epoch"].as_u64().unwrap() > epoch_before);
    let mut verify_only = fio_verify(&endpoint, "192M");
    verify_only.args(["--rw=randread", "--verify_only=1"]);
    run_ok(verify_only);
    cluster.cli(&["volume", "delete", "v1"]).unwrap();
    cluster.cli(&["volume", "delete", "v2"]).unwrap();
    for node in ["n-1", "n-2", "n-3"] {
        assert!(cluster.lvs(node).is_empty(), "{node}: {:?}", cluster.lvs(node));
    }
}

#[test]
fn stopping_up_stops_everything_and_the_next_up_brings_volumes_back() {
    let mut cluster = StandaloneCluster::start("up-stop", 3, 25500, "1GiB");
    cluster.cli(&["volume", "create", "v1", "--size", "64MiB", "--replicas", "3"]).unwrap();
    let endpoint = cluster.cli(&["volume", "attach", "v1", "--node", "n-1"]).unwrap().trim().to_string();
    run_ok(fio_verify(&endpoint, "32M"));
    let epoch = cluster.json(&["engine", "list"])[0]["spec"]["epoch"].as_u64().unwrap();
    // The blockdev frontend through the manager.
    cluster.cli(&["volume", "create", "b1", "--size", "32MiB", "--replicas", "2"]).unwrap();
    let dev =
        cluster.cli(&["volume", "attach", "b1", "--node", "n-2", "--frontend", "blockdev"]).unwrap().trim().to_string();
    assert_eq!(dev, "/dev/ironhorn/b1");
    let meta = std::fs::metadata(&dev).expect("block device exists");
    assert!(std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type()), "{dev} is a block device");

    let pids: Vec<u32> = std::fs::read_dir(cluster.dir.path().join("data/nodes"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path().join("im.pid")).unwrap().trim().parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 3);
    // Ctrl-C.
    // SAFETY: signalling the exact pid of the `up` this test started.
    unsafe { libc::kill(cluster.up_pid() as i32, libc::SIGINT) };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pids.iter().any(|p| std::path::Path::new(&format!("/proc/{p}")).exists()) {
        assert!(std::time::Instant::now() < deadline, "instance managers still running");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(run("nbdinfo", &["--size", &endpoint]).is_err(), "the engine stopped too");
    assert!(!std::path::Path::new(&dev).exists(), "the block device is gone");
    let image = cluster.dir.path().join("data/nodes/n-1/disk.img");
    assert!(run("losetup", &["-j", image.to_str().unwrap()]).unwrap().trim().is_empty(), "loop device detached");

    // The next `up` on the same data dir brings v1 back, data intact, with a
    // new engine at a higher epoch.
    cluster.forget_up();
    cluster.start_up();
    // (Status read right after the restart is the last one written; the
    // engine's epoch tells the new engine from the old.)
    cluster.wait(Duration::from_secs(60), "v1 attached again by a new engine", || {
        let engines = cluster.json(&["engine", "list"]);
        let v1 = engines.as_array().unwrap().iter().find(|e| e["spec"]["volumeName"] == "v1").cloned().unwrap();
        let v = cluster.volume("v1");
        v1["spec"]["epoch"].as_u64().unwrap() > epoch
            && v["status"]["state"] == "attached"
            && v["status"]["robustness"] == "healthy"
    });
    let endpoint = cluster.volume("v1")["status"]["endpoint"].as_str().unwrap().to_string();
    let mut verify_only = fio_verify(&endpoint, "32M");
    verify_only.args(["--rw=randread", "--verify_only=1"]);
    run_ok(verify_only);
}

#[test]
fn file_disks_count_their_stores_against_the_disk_size() {
    let cluster = StandaloneCluster::start_with("up-files", 3, 29000, "1GiB", &["--file-disks"]);
    let disks = cluster.disks();
    assert!(disks.values().all(|d| d.starts_with("file:")), "{disks:?}");
    let before = free_bytes(&cluster);
    let nodes = cluster.json(&["node", "list"]);
    for n in nodes.as_array().unwrap() {
        assert_eq!(n["status"]["diskStatus"]["disk-1"]["storageMaximum"], 1u64 << 30, "capped at --disk-size");
    }
    cluster.cli(&["volume", "create", "f1", "--size", "128MiB", "--replicas", "3"]).unwrap();
    let endpoint = cluster.cli(&["volume", "attach", "f1", "--node", "n-2"]).expect("attach").trim().to_string();
    run_ok(fio_verify(&endpoint, "64M"));
    for r in cluster.replicas_of("f1") {
        let store = r["spec"]["dataPath"].as_str().unwrap().to_string();
        let path = store.strip_prefix("file:").expect("a file store");
        assert!(std::path::Path::new(path).is_file(), "{path}");
    }
    cluster.wait(Duration::from_secs(20), "the stores count against each disk", || {
        free_bytes(&cluster).iter().zip(&before).all(|((_, free, _), (_, was, _))| *free + (128 << 20) <= *was)
    });
    // Too big for a 1 GiB file disk, whatever the filesystem holds.
    cluster.cli(&["volume", "create", "big", "--size", "900MiB", "--replicas", "1"]).unwrap();
    cluster.wait(Duration::from_secs(30), "big unscheduled for insufficient storage", || {
        cluster.volume("big")["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Scheduled" && c["reason"] == "InsufficientStorage"))
    });
    let stores: Vec<String> =
        cluster.replicas_of("f1").iter().map(|r| r["spec"]["dataPath"].as_str().unwrap().to_string()).collect();
    cluster.cli(&["volume", "delete", "f1"]).unwrap();
    cluster.cli(&["volume", "delete", "big"]).unwrap();
    for store in stores {
        assert!(!std::path::Path::new(store.strip_prefix("file:").unwrap()).exists(), "{store} removed");
    }
}

/// `up` with stdout and stderr on /dev/full (every write fails with
/// ENOSPC, as on a full log filesystem): it must keep serving. `println!`
/// panicked on the first line and took the manager down.
#[test]
fn up_keeps_serving_when_its_output_cannot_be_written() {
    let full = std::path::Path::new("/dev/full");
    assert!(full.exists(), "/dev/full is needed for this test");
    let mut cluster = StandaloneCluster::start_with_output("up-full", 1, 22500, "1GiB", full);
    cluster.cli(&["volume", "create", "v1", "--size", "64MiB", "--replicas", "1"]).expect("create");
    let endpoint = cluster.cli(&["volume", "attach", "v1", "--node", "n-1"]).expect("attach").trim().to_string();
    run_ok(fio_verify(&endpoint, "16M"));
    assert!(cluster.up_alive(), "up exited although only its log lines were lost");
}

fn condition(volume: &serde_json::Value, kind: &str) -> Option<String> {
    let conditions = volume["status"]["conditions"].as_array()?;
    let c = conditions.iter().find(|c| c["type"] == kind)?;
    c["status"].as_str().map(str::to_string)
}

/// A volume whose replicas run out of space (a snapshot, taken with the
/// engine's CLI, holds every block while the volume is overwritten) says so
/// in its status: condition OutOfSpace, replicas not failed, reads go on;
/// once space is back and a write lands, the condition clears.
#[test]
fn a_volume_out_of_space_says_so_and_keeps_its_replicas() {
    require_tool("qemu-io", "qemu-utils");
    let cluster = StandaloneCluster::start("up-nospace", 1, 22000, "1GiB");
    cluster.cli(&["volume", "create", "v1", "--size", "64MiB", "--replicas", "1"]).expect("create");
    let endpoint = cluster.cli(&["volume", "attach", "v1", "--node", "n-1"]).expect("attach").trim().to_string();
    let qemu = |cmd: &str| run("qemu-io", &["-f", "raw", &endpoint, "-c", cmd]);
    qemu("write -P 0x01 0 64M").expect("fill");
    qemu("flush").expect("flush");
    let engine = cluster.json(&["engine", "list"])[0]["status"]["address"].as_str().expect("engine").to_string();
    engine_cli(&["snapshot", "create", "--engine", &engine, "s1"]).expect("snapshot");
    // Overwrite MiB by MiB until the store refuses.
    let full_at = (0..64).find(|mib| {
        let out = qemu(&format!("write -P 0x02 {mib}M 1M"));
        out.is_err() || out.as_ref().is_ok_and(|o| o.contains("failed"))
    });
    let full_at = full_at.expect("the store never filled up: the test did not reach its point");
    cluster.wait(Duration::from_secs(30), "the volume says it is out of space", || {
        condition(&cluster.volume("v1"), "OutOfSpace").as_deref() == Some("True")
    });
    let v = cluster.volume("v1");
    assert_eq!(v["status"]["robustness"], "healthy", "no replica failed for lack of space: {v}");
    qemu(&format!("read -P 0x02 0 {full_at}M")).expect("acknowledged overwrites read back");
    if full_at + 1 < 64 {
        qemu(&format!("read -P 0x01 {}M 1M", full_at + 1)).expect("blocks never overwritten read back");
    }

    engine_cli(&["snapshot", "delete", "--engine", &engine, "s1"]).expect("snapshot delete");
    qemu(&format!("write -P 0x02 {full_at}M 1M")).expect("room again");
    cluster.wait(Duration::from_secs(30), "the condition clears", || {
        condition(&cluster.volume("v1"), "OutOfSpace").as_deref() == Some("False")
    });
}

fn snapshot_objects(cluster: &StandaloneCluster, volume: &str) -> Vec<serde_json::Value> {
    cluster.json(&["snapshot", "list", volume]).as_array().cloned().unwrap_or_default()
}

fn snapshot_ready(cluster: &StandaloneCluster, volume: &str, name: &str) -> bool {
    snapshot_objects(cluster, volume).iter().any(|s| s["metadata"]["name"] == name && s["status"]["readyToUse"] == true)
}

/// Volume snapshots through the manager: asked for while detached, taken on
/// the replicas at once; asked for while attached, taken on the engine; the same
/// name again is the same snapshot, another volume's name or a bad name is
/// refused; deleted through the API, gone from the engine; the volume's
/// deletion takes its snapshots with it.
#[test]
fn snapshots_through_the_manager_are_taken_by_the_engine_and_deleted_there() {
    let cluster = StandaloneCluster::start("up-snap", 1, 21000, "1GiB");
    cluster.cli(&["volume", "create", "v1", "--size", "64MiB", "--replicas", "1"]).expect("create v1");
    cluster.cli(&["volume", "create", "v2", "--size", "64MiB", "--replicas", "1"]).expect("create v2");
    cluster.cli(&["snapshot", "create", "v1", "before-attach"]).expect("snapshot of a detached volume");
    cluster.wait(Duration::from_secs(30), "the snapshot of the detached volume is taken on its replicas", || {
        snapshot_ready(&cluster, "v1", "before-attach")
    });
    let endpoint = cluster.cli(&["volume", "attach", "v1", "--node", "n-1"]).expect("attach").trim().to_string();
    run("qemu-io", &["-f", "raw", &endpoint, "-c", "write -P 0x11 0 1M"]).expect("write");
    cluster.cli(&["snapshot", "create", "v1", "s1"]).expect("snapshot");
    cluster.wait(Duration::from_secs(30), "s1 taken", || snapshot_ready(&cluster, "v1", "s1"));
    let engine = cluster.json(&["engine", "list"])[0]["status"]["address"].as_str().expect("engine").to_string();
    let on_engine = engine_cli(&["snapshot", "list", "--engine", &engine]).expect("engine snapshot list");
    assert!(on_engine.contains("\"before-attach\"") && on_engine.contains("\"s1\""), "{on_engine}");

    cluster.cli(&["snapshot", "create", "v1", "s1"]).expect("the same snapshot again is fine");
    let taken = cluster.cli(&["snapshot", "create", "v2", "s1"]).expect_err("s1 belongs to v1");
    assert!(taken.contains("already exists"), "{taken}");
    let bad = cluster.cli(&["snapshot", "create", "v1", "Bad_Name"]).expect_err("bad name");
    assert!(bad.contains("snapshot name"), "{bad}");
    let unknown = cluster.cli(&["snapshot", "delete", "v1", "nope"]).expect_err("unknown snapshot");
    assert!(unknown.contains("not found"), "{unknown}");

    cluster.cli(&["snapshot", "delete", "v1", "s1"]).expect("delete");
    cluster.wait(Duration::from_secs(30), "s1 gone from the API and the engine", || {
        let objects = snapshot_objects(&cluster, "v1");
        let on_engine = engine_cli(&["snapshot", "list", "--engine", &engine]).unwrap_or_default();
        objects.iter().all(|s| s["metadata"]["name"] != "s1") && !on_engine.contains("\"s1\"")
    });
    run("qemu-io", &["-f", "raw", &endpoint, "-c", "read -P 0x11 0 1M"]).expect("data unchanged");

    // Detached: a snapshot holds the data as the volume was left, and
    // deleting one removes it from the replicas.
    cluster.cli(&["volume", "detach", "v1"]).expect("detach");
    cluster.cli(&["snapshot", "create", "v1", "detached-1"]).expect("snapshot while detached");
    cluster.wait(Duration::from_secs(30), "detached-1 taken", || snapshot_ready(&cluster, "v1", "detached-1"));
    cluster.cli(&["snapshot", "delete", "v1", "before-attach"]).expect("delete while detached");
    cluster.wait(Duration::from_secs(30), "before-attach gone while detached", || {
        snapshot_objects(&cluster, "v1").iter().all(|s| s["metadata"]["name"] != "before-attach")
    });
    let endpoint = cluster.cli(&["volume", "attach", "v1", "--node", "n-1"]).expect("attach again").trim().to_string();
    run("qemu-io", &["-f", "raw", &endpoint, "-c", "write -P 0x22 0 1M"]).expect("overwrite");
    let engine = cluster.json(&["engine", "list"])[0]["status"]["address"].as_str().expect("engine").to_string();
    let on_engine = engine_cli(&["snapshot", "list", "--engine", &engine]).expect("engine snapshot list");
    assert!(on_engine.contains("\"detached-1\"") && !on_engine.contains("\"before-attach\""), "{on_engine}");
    cluster
        .cli(&["volume", "create", "r1", "--size", "64MiB", "--replicas", "1", "--from", "snapshot://detached-1"])
        .expect("restore");
    let restored = cluster.cli(&["volume", "attach", "r1", "--node", "n-1"]).expect("attach r1").trim().to_string();
    run("qemu-io", &["-f", "raw", &restored, "-c", "read -P 0x11 0 1M"]).expect("the detached snapshot's data");
    run("qemu-io", &["-f", "raw", &endpoint, "-c", "read -P 0x22 0 1M"]).expect("the volume's own data");
    cluster.cli(&["volume", "detach", "r1"]).expect("detach r1");
    cluster.cli(&["volume", "delete", "r1"]).expect("delete r1");

    cluster.cli(&["volume", "delete", "v1"]).expect("delete the volume");
    let left = cluster.http_get("/v1/volumes/v2/snapshots").expect("v2's snapshots");
    assert_eq!(left.trim(), "[]", "v2 has none");
    let all = cluster.cli(&["snapshot", "list", "v1"]).expect_err("v1 is gone");
    assert!(all.contains("not found"), "{all}");
    // Its snapshot objects went with it: their names are free again.
    cluster.cli(&["snapshot", "create", "v2", "before-attach"]).expect("v1's snapshot names are free");
}
