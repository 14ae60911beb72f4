//! Self-healing on a standalone cluster with real processes (durations
//! shortened through settings): reuse with a delta rebuild, replacement on
//! another node after the wait interval, bounded retries with growing gaps,
//! stale-replica cleanup, and salvage from the newest replica.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use ironhorn_proto::instance::instance_manager_client::InstanceManagerClient;
use ironhorn_proto::instance::{InstanceKind, InstanceState, ListRequest};
use ironhorn_tests::*;
use serde_json::Value;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn instance(cluster: &StandaloneCluster, node: &str, name: &str) -> Option<(u32, i32)> {
    cluster.instance(node, name)
}

/// A node dies for good: its instance manager and its replica `replica` (the
/// cluster runs `up --no-supervise`, so nothing starts them again).
fn kill_node(cluster: &StandaloneCluster, node: &str, replica: &str) {
    let (replica_pid, _) = instance(cluster, node, replica).expect("replica instance");
    let im_pid: u32 = std::fs::read_to_string(cluster.dir.path().join(format!("data/nodes/{node}/im.pid")))
        .expect("im.pid")
        .trim()
        .parse()
        .expect("a pid");
    // The exact pid `up` recorded for this node's instance manager.
    kill9(im_pid);
    kill9(replica_pid);
}

fn setting(cluster: &StandaloneCluster, name: &str, value: &str) {
    cluster.cli(&["setting", "set", name, value]).unwrap_or_else(|e| panic!("set {name}: {e}"));
}

fn engine_address(cluster: &StandaloneCluster, volume: &str) -> String {
    cluster.engine_address(volume)
}

fn engine_status(cluster: &StandaloneCluster, volume: &str) -> Value {
    let address = engine_address(cluster, volume);
    serde_json::from_str(&engine_cli(&["status", "--engine", &address]).expect("engine status")).unwrap()
}

fn events(cluster: &StandaloneCluster, volume: &str) -> Vec<Value> {
    cluster.json(&["event", "list", "--volume", volume]).as_array().cloned().unwrap_or_default()
}

fn has_event(cluster: &StandaloneCluster, volume: &str, reason: &str, text: &str) -> bool {
    events(cluster, volume).iter().any(|e| e["reason"] == reason && e["message"].as_str().unwrap_or("").contains(text))
}

fn healthy(cluster: &StandaloneCluster, volume: &str) -> bool {
    let v = cluster.volume(volume);
    v["status"]["state"] == "attached" && v["status"]["robustness"] == "healthy"
}

fn fio(endpoint: &str, size: &str, extra: &[&str]) -> Command {
    require_tool("fio", "fio");
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=heal",
        "--ioengine=nbd",
        &format!("--uri={endpoint}"),
        "--rw=randwrite",
        "--bs=4k",
        &format!("--size={size}"),
        "--iodepth=8",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]);
    cmd.args(extra);
    cmd
}

fn check(out: std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn qemu_io(endpoint: &str, command: &str) -> Result<String, String> {
    require_tool("qemu-io", "qemu-utils");
    let out =
        Command::new("qemu-io").args(["-f", "raw", endpoint, "-c", command]).output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() && !text.contains("failed") && !text.contains("error") { Ok(text) } else { Err(text) }
}

/// A 3-replica volume attached on n-1 (endpoint returned).
fn attached_volume(cluster: &StandaloneCluster, name: &str, size: &str) -> String {
    cluster.cli(&["volume", "create", name, "--size", size, "--replicas", "3"]).unwrap();
    let endpoint = cluster.cli(&["volume", "attach", name, "--node", "n-1"]).unwrap().trim().to_string();
    cluster.wait(Duration::from_secs(30), "volume healthy", || healthy(cluster, name));
    endpoint
}

/// A replica of `volume` not on the engine's node: (name, node).
fn remote_replica(cluster: &StandaloneCluster, volume: &str) -> (String, String) {
    let r = cluster.replicas_of(volume).into_iter().find(|r| r["spec"]["nodeID"] != "n-1").expect("a remote replica");
    (r["metadata"]["name"].as_str().unwrap().to_string(), r["spec"]["nodeID"].as_str().unwrap().to_string())
}

#[test]
fn a_killed_replica_is_reused_with_a_delta_rebuild_under_fio() {
    let cluster = StandaloneCluster::start("heal-reuse", 3, 26500, "2GiB");
    let endpoint = attached_volume(&cluster, "v1", "512MiB");
    let (victim, node) = remote_replica(&cluster, "v1");
    let store_before = cluster.replicas_of("v1").iter().find(|r| r["metadata"]["name"] == victim.as_str()).unwrap()["spec"]["dataPath"].clone();
    // Fill half the volume first, flushed (what a replica acknowledged but
    // did not flush is copied again, by design), so a full copy would show.
    check(fio(&endpoint, "256M", &["--rw=write", "--bs=1M", "--end_fsync=1"]).output().unwrap(), "fill");

    let mut child = fio(&endpoint, "64M", &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let engine = engine_address(&cluster, "v1");
    wait_for_writes_in_flight(&engine, &mut child, 500, Duration::from_secs(60));
    let (pid, _) = instance(&cluster, &node, &victim).expect("victim instance");
    kill9(pid);
    check(child.wait_with_output().unwrap(), "fio verify across a replica kill");

    cluster.wait(Duration::from_secs(60), "the same replica reused and the volume healthy", || {
        healthy(&cluster, "v1") && has_event(&cluster, "v1", "RebuildFinished", &victim)
    });
    let replicas = cluster.replicas_of("v1");
    assert_eq!(replicas.len(), 3, "no new replica was created");
    let r = replicas.iter().find(|r| r["metadata"]["name"] == victim.as_str()).expect("the same replica");
    assert_eq!(r["spec"]["rebuildRetryCount"], 1);
    assert_eq!(r["spec"]["dataPath"], store_before, "the same LV");
    assert!(cluster.lvs(&node).contains(&victim));
    assert!(has_event(&cluster, "v1", "ReplicaReused", &format!("reused replica {victim} (retry 1)")));
    // A delta: the rebuild copied a small part of the 512 MiB volume.
    let status = engine_status(&cluster, "v1");
    let rebuild = status["rebuilds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["state"] == "done")
        .expect("a finished rebuild")
        .clone();
    let copied = rebuild["copied_bytes"].as_u64().unwrap();
    // The fio run touched only the first 64 MiB after the last flush.
    assert!(copied <= 64 << 20, "delta rebuild copied {copied} bytes: {rebuild}");
    assert_eq!(rebuild["method"], "dirty-map", "{rebuild}");
    // And the data verifies through all replicas.
    check(fio(&endpoint, "64M", &["--rw=randread", "--verify_only=1"]).output().unwrap(), "verify after rebuild");
}

#[test]
fn a_dead_node_is_replaced_on_the_fourth_node_after_the_wait_interval_one_rebuild_at_a_time() {
    let cluster = StandaloneCluster::start_with("heal-node", 4, 27000, "2GiB", &["--no-supervise"]);
    setting(&cluster, "replica-replenishment-wait-interval", "8");
    let endpoint = attached_volume(&cluster, "v1", "256MiB");
    check(fio(&endpoint, "64M", &[]).output().unwrap(), "write");
    let used: Vec<String> =
        cluster.replicas_of("v1").iter().map(|r| r["spec"]["nodeID"].as_str().unwrap().to_string()).collect();
    let spare = ["n-1", "n-2", "n-3", "n-4"].into_iter().find(|n| !used.iter().any(|u| u == n)).unwrap().to_string();
    let (victim, dead) = remote_replica(&cluster, "v1");

    kill_node(&cluster, &dead, &victim);
    let killed = Instant::now();
    // I/O carries on with two replicas.
    check(fio(&endpoint, "32M", &["--offset=128M"]).output().unwrap(), "write while degraded");
    cluster.wait(Duration::from_secs(60), "a new replica on the spare node, healthy again", || {
        healthy(&cluster, "v1")
            && cluster
                .replicas_of("v1")
                .iter()
                .any(|r| r["spec"]["nodeID"] == spare.as_str() && r["spec"]["failedAt"] == "")
    });
    assert!(killed.elapsed() >= Duration::from_secs(8), "created only after the wait interval");
    assert!(has_event(&cluster, "v1", "ReplicaCreated", &format!("on node {spare}")));
    // At no moment two rebuilds at once: the engine's history has no overlap.
    let status = engine_status(&cluster, "v1");
    let mut spans: Vec<(u64, u64)> = status["rebuilds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["started_unix_ms"].as_u64().unwrap(), b["finished_unix_ms"].as_u64().unwrap_or(u64::MAX)))
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "overlapping rebuilds: {spans:?}");
    }
    check(fio(&endpoint, "64M", &["--rw=randread", "--verify_only=1"]).output().unwrap(), "verify");
    // The dead node's replica stays failed (its node cannot be asked to
    // delete its LV); it is not counted as healthy.
    let r = cluster.replicas_of("v1").into_iter().find(|r| r["metadata"]["name"] == victim.as_str()).unwrap();
    assert_ne!(r["spec"]["failedAt"], "");
}

#[test]
fn a_replica_that_keeps_failing_is_reused_five_times_with_growing_gaps_then_replaced_and_cleaned_up() {
    let cluster = StandaloneCluster::start("heal-retry", 3, 27500, "2GiB");
    setting(&cluster, "replica-rebuild-backoff-initial", "2");
    setting(&cluster, "replica-rebuild-backoff-max", "6");
    setting(&cluster, "stale-replica-timeout", "12");
    let endpoint = attached_volume(&cluster, "v1", "128MiB");
    check(fio(&endpoint, "32M", &[]).output().unwrap(), "write");
    let (victim, node) = remote_replica(&cluster, "v1");

    let mut kills = Vec::new();
    for retry in 0..=5 {
        // Kill it once it runs as a healthy member again.
        cluster.wait(Duration::from_secs(60), &format!("{victim} healthy before kill {retry}"), || {
            let r = cluster.replicas_of("v1").into_iter().find(|r| r["metadata"]["name"] == victim.as_str()).unwrap();
            r["spec"]["rebuildRetryCount"] == retry && r["spec"]["failedAt"] == "" && healthy(&cluster, "v1")
        });
        let (pid, state) = instance(&cluster, &node, &victim).unwrap();
        assert_eq!(state, InstanceState::Running as i32);
        kill9(pid);
        kills.push(Instant::now());
    }
    // Out of retries: a new replica replaces it.
    cluster.wait(Duration::from_secs(60), "a new replica and healthy", || {
        healthy(&cluster, "v1") && has_event(&cluster, "v1", "ReplicaCreated", "created replica")
    });
    let r = cluster.replicas_of("v1").into_iter().find(|r| r["metadata"]["name"] == victim.as_str());
    if let Some(r) = &r {
        assert_eq!(r["spec"]["rebuildRetryCount"], 5, "reused at most 5 times");
        assert_ne!(r["spec"]["failedAt"], "");
    }
    // Growing gaps: each reuse came at least its backoff after the failure.
    let evs = events(&cluster, "v1");
    let time = |e: &Value| e["time"].as_str().unwrap().parse::<jiff::Timestamp>().unwrap();
    let mut gaps = Vec::new();
    for retry in 1..=5 {
        let reused = evs
            .iter()
            .find(|e| e["message"] == format!("reused replica {victim} (retry {retry})").as_str())
            .expect("reuse event");
        let failed = evs
            .iter()
            .filter(|e| e["reason"] == "ReplicaFailed" && time(e) <= time(reused))
            .last()
            .expect("failure before reuse");
        gaps.push((time(reused).as_second() - time(failed).as_second()) as u64);
    }
    let backoffs = [0u64, 2, 4, 6, 6];
    for (gap, backoff) in gaps.iter().zip(backoffs) {
        assert!(*gap + 1 >= backoff, "gaps {gaps:?} shorter than the backoff {backoffs:?}");
    }
    assert!(gaps[3] > gaps[0] && gaps[4] > gaps[1], "gaps grow: {gaps:?}");
    assert!(!has_event(&cluster, "v1", "ReplicaReused", "(retry 6)"));

    // The replaced replica is stale: after the timeout it and its LV go.
    cluster.wait(Duration::from_secs(60), "the stale replica and its LV deleted", || {
        cluster.replicas_of("v1").iter().all(|r| r["metadata"]["name"] != victim.as_str())
            && !cluster.lvs(&node).contains(&victim)
    });
    assert!(has_event(&cluster, "v1", "StaleReplicaDeleted", &victim));
    assert_eq!(cluster.replicas_of("v1").len(), 3);
    check(fio(&endpoint, "32M", &["--rw=randread", "--verify_only=1"]).output().unwrap(), "verify");
}

#[test]
fn all_replicas_killed_the_volume_is_salvaged_from_the_newest() {
    let cluster = StandaloneCluster::start("heal-salvage", 3, 28000, "2GiB");
    let endpoint = attached_volume(&cluster, "v1", "128MiB");
    // No rebuilds while the replicas drift apart.
    setting(&cluster, "concurrent-replica-rebuild-per-node-limit", "0");
    let replicas: Vec<(String, String)> = cluster
        .replicas_of("v1")
        .iter()
        .map(|r| {
            (r["metadata"]["name"].as_str().unwrap().to_string(), r["spec"]["nodeID"].as_str().unwrap().to_string())
        })
        .collect();
    for (i, (name, node)) in replicas.iter().enumerate() {
        // Each generation reaches the replicas still alive, then one dies.
        let pattern = format!("0x{}{}", i + 1, i + 1);
        qemu_io(&endpoint, &format!("write -P {pattern} 0 8M")).expect("write");
        qemu_io(&endpoint, "flush").expect("flush");
        let (pid, _) = instance(&cluster, node, name).unwrap();
        kill9(pid);
        std::thread::sleep(Duration::from_millis(500));
    }
    setting(&cluster, "concurrent-replica-rebuild-per-node-limit", "5");
    cluster.wait(Duration::from_secs(90), "salvaged and healthy", || {
        healthy(&cluster, "v1") && has_event(&cluster, "v1", "Salvage", "salvaging from")
    });
    let endpoint = cluster.volume("v1")["status"]["endpoint"].as_str().unwrap().to_string();
    // The newest data (written last, held only by the replica killed last).
    qemu_io(&endpoint, "read -P 0x33 0 8M").expect("the newest data is served");
    // Every replica now holds it: read three times (reads rotate over them).
    for _ in 0..3 {
        qemu_io(&endpoint, "read -P 0x33 0 8M").expect("every replica rebuilt from the newest");
    }
    assert_eq!(cluster.replicas_of("v1").len(), 3, "the same three replicas");
}

#[test]
fn attach_goes_ahead_without_a_replica_whose_node_is_gone() {
    let cluster = StandaloneCluster::start_with("heal-attach", 3, 28500, "1GiB", &["--no-supervise"]);
    let endpoint = attached_volume(&cluster, "v1", "64MiB");
    qemu_io(&endpoint, "write -P 0x5a 0 4M").expect("write");
    cluster.cli(&["volume", "detach", "v1"]).unwrap();
    let (victim, dead) = remote_replica(&cluster, "v1");
    kill_node(&cluster, &dead, &victim);
    // The manager has seen the node go (else a pass that listed instances
    // just before the kill may start the engine with all three, and the
    // engine drops the dead one: also fine, but not this test's case).
    cluster.wait(Duration::from_secs(20), "the node reported not ready", || {
        let nodes = cluster.json(&["node", "list"]);
        nodes.as_array().unwrap().iter().any(|n| {
            n["metadata"]["name"] == dead.as_str()
                && n["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "False"))
        })
    });
    // Not stuck attaching: the engine starts with the two that are there.
    let endpoint = cluster
        .cli(&["volume", "attach", "v1", "--node", "n-1", "--timeout-secs", "60"])
        .expect("attach")
        .trim()
        .to_string();
    qemu_io(&endpoint, "read -P 0x5a 0 4M").expect("data served");
    assert!(
        has_event(&cluster, "v1", "ReplicaFailed", &format!("node {dead} unreachable")),
        "{:#?}",
        events(&cluster, "v1")
    );
    cluster.wait(Duration::from_secs(20), "degraded, not faulted", || {
        cluster.volume("v1")["status"]["robustness"] == "degraded"
    });
}

/// A replica's revision counter, asked over gRPC.
fn revision_counter(cluster: &StandaloneCluster, replica: &str) -> u64 {
    let r = cluster.replicas_of("v1").into_iter().find(|r| r["metadata"]["name"] == replica).expect("replica object");
    let address = r["status"]["address"].as_str().expect("replica address").to_string();
    runtime().block_on(async {
        let mut c = connect(&address).await;
        c.info(ironhorn_proto::replica::InfoRequest {}).await.expect("info").into_inner().revision_counter
    })
}

/// Salvage where the revision counters point the wrong way: two replicas
/// with a long history of overwrites, and a newer one (a replacement rebuilt
/// from them, so with a small counter) that alone took the last flushed
/// writes before everything failed. The salvaged volume serves those writes.
#[test]
fn salvage_serves_the_newest_flushed_writes_even_from_the_replica_with_the_lowest_counter() {
    let cluster = StandaloneCluster::start_with("heal-counters", 4, 23500, "2GiB", &["--no-supervise"]);
    setting(&cluster, "replica-replenishment-wait-interval", "1");
    let endpoint = attached_volume(&cluster, "v1", "64MiB");
    // A long history: 16,384 writes into the first MiB.
    check(fio(&endpoint, "1M", &["--io_size=64M", "--do_verify=0"]).output().unwrap(), "overwrites");
    qemu_io(&endpoint, "write -P 0x11 0 1M").expect("a known pattern over the overwritten MiB");
    qemu_io(&endpoint, "flush").expect("flush");
    let (victim, dead) = remote_replica(&cluster, "v1");
    kill_node(&cluster, &dead, &victim);
    cluster.wait(Duration::from_secs(60), "the dead replica failed, a replacement rebuilt on the spare node", || {
        let replicas = cluster.replicas_of("v1");
        let victim_failed =
            replicas.iter().any(|r| r["metadata"]["name"] == victim.as_str() && r["spec"]["failedAt"] != "");
        victim_failed && healthy(&cluster, "v1") && replicas.iter().filter(|r| r["spec"]["failedAt"] == "").count() == 3
    });
    // No more replacements or rebuilds while the replicas drift apart.
    setting(&cluster, "replica-replenishment-wait-interval", "600");
    setting(&cluster, "concurrent-replica-rebuild-per-node-limit", "0");
    let live: Vec<(String, String)> = cluster
        .replicas_of("v1")
        .iter()
        .filter(|r| r["spec"]["failedAt"] == "")
        .map(|r| {
            (r["metadata"]["name"].as_str().unwrap().to_string(), r["spec"]["nodeID"].as_str().unwrap().to_string())
        })
        .collect();
    let counters: Vec<u64> = live.iter().map(|(name, _)| revision_counter(&cluster, name)).collect();
    let (newest, newest_node) = live[counters.iter().enumerate().min_by_key(|(_, c)| **c).unwrap().0].clone();
    let lowest = *counters.iter().min().unwrap();
    assert!(
        counters.iter().filter(|c| **c > lowest + 1000).count() == 2,
        "the replacement's counter must be far below the others' for this test to mean anything: {counters:?}"
    );
    // The two old replicas die; the replacement alone takes flushed writes.
    for (name, node) in live.iter().filter(|(n, _)| *n != newest) {
        let (pid, _) = instance(&cluster, node, name).expect("replica instance");
        kill9(pid);
    }
    qemu_io(&endpoint, "write -P 0x5a 0 200k").expect("write to the last replica");
    qemu_io(&endpoint, "flush").expect("flush");
    let modes = engine_status(&cluster, "v1");
    let rw: Vec<&Value> = modes["replicas"].as_array().unwrap().iter().filter(|r| r["mode"] == "RW").collect();
    assert_eq!(rw.len(), 1, "only the replacement took the writes: {modes}");
    assert!(revision_counter(&cluster, &newest) < counters.iter().max().copied().unwrap(), "counters still disagree");
    let (pid, _) = instance(&cluster, &newest_node, &newest).expect("replacement instance");
    kill9(pid);

    setting(&cluster, "concurrent-replica-rebuild-per-node-limit", "5");
    cluster.wait(Duration::from_secs(120), "salvaged and healthy", || {
        healthy(&cluster, "v1") && has_event(&cluster, "v1", "Salvage", "salvaging from")
    });
    let endpoint = cluster.volume("v1")["status"]["endpoint"].as_str().unwrap().to_string();
    // Reads rotate over the replicas: every one must serve the newest data,
    // and every other flushed block.
    for _ in 0..3 {
        qemu_io(&endpoint, "read -P 0x5a 0 200k").expect("the flushed writes survive the salvage");
        qemu_io(&endpoint, "read -P 0x11 200k 824k").expect("the rest of the flushed MiB too");
    }
}

/// Whether the engine instance of `volume` was started with write majority.
fn engine_write_majority(cluster: &StandaloneCluster, volume: &str) -> bool {
    let nodes = cluster.json(&["node", "list"]);
    let im = nodes.as_array().unwrap().iter().find(|n| n["metadata"]["name"] == "n-1").unwrap()["spec"]
        ["instanceManagerAddress"]
        .as_str()
        .unwrap()
        .to_string();
    runtime().block_on(async {
        let mut c = InstanceManagerClient::connect(format!("http://{im}")).await.expect("instance manager");
        let list = c.list(ListRequest {}).await.expect("list").into_inner();
        let engine = list
            .instances
            .into_iter()
            .find(|i| i.name.starts_with(volume) && i.kind == InstanceKind::Engine as i32)
            .expect("engine");
        match engine.spec {
            Some(ironhorn_proto::instance::instance::Spec::Engine(e)) => e.write_majority,
            other => panic!("engine instance without an engine spec: {other:?}"),
        }
    })
}

/// Two replicas of a volume die (rebuilds held off); a write is tried.
fn write_with_one_replica_left(cluster: &StandaloneCluster, volume: &str, endpoint: &str) -> Result<String, String> {
    let victims: Vec<Value> = cluster.replicas_of(volume).into_iter().take(2).collect();
    for r in victims {
        let (name, node) = (r["metadata"]["name"].as_str().unwrap(), r["spec"]["nodeID"].as_str().unwrap());
        let (pid, _) = instance(cluster, node, name).expect("replica instance");
        kill9(pid);
    }
    qemu_io(endpoint, "write -P 0x77 0 64k").and_then(|_| qemu_io(endpoint, "flush"))
}

/// The write quorum through the manager: the setting decides for volumes
/// that leave it at default, a volume's own choice wins, and an engine with
/// a majority quorum refuses a write that only one of three replicas took,
/// while one with quorum one acknowledges it.
#[test]
fn write_quorum_comes_from_the_volume_or_the_setting_and_majority_refuses_lone_writes() {
    let cluster = StandaloneCluster::start("heal-quorum", 3, 23000, "2GiB");
    setting(&cluster, "default-write-majority", "true");
    cluster.cli(&["volume", "create", "one", "--size", "64MiB", "--write-quorum", "one"]).unwrap();
    let majority = attached_volume(&cluster, "maj", "64MiB");
    let one = cluster.cli(&["volume", "attach", "one", "--node", "n-1"]).unwrap().trim().to_string();
    cluster.wait(Duration::from_secs(30), "volume one healthy", || healthy(&cluster, "one"));
    assert!(engine_write_majority(&cluster, "maj"), "default quorum follows the setting");
    assert!(!engine_write_majority(&cluster, "one"), "the volume's own quorum wins");
    setting(&cluster, "concurrent-replica-rebuild-per-node-limit", "0");
    setting(&cluster, "replica-replenishment-wait-interval", "600");

    let refused = write_with_one_replica_left(&cluster, "maj", &majority);
    assert!(refused.is_err(), "a majority volume acknowledged a write one replica of three took: {refused:?}");
    write_with_one_replica_left(&cluster, "one", &one).expect("quorum one writes with a single replica");
    qemu_io(&one, "read -P 0x77 0 64k").expect("and reads it back");
}

/// The replica count of an attached volume changes both ways: raised, the
/// new replica is created and rebuilt; lowered, replicas are taken out of
/// the engine and deleted with their data, one per pass. The data reads
/// back the same throughout.
#[test]
fn the_replica_count_of_an_attached_volume_goes_up_and_down() {
    let cluster = StandaloneCluster::start("heal-count", 3, 21500, "1GiB");
    cluster.cli(&["volume", "create", "v1", "--size", "64MiB", "--replicas", "2"]).unwrap();
    let endpoint = cluster.cli(&["volume", "attach", "v1", "--node", "n-1"]).unwrap().trim().to_string();
    cluster.wait(Duration::from_secs(30), "volume healthy", || healthy(&cluster, "v1"));
    qemu_io(&endpoint, "write -P 0x6b 0 16M").expect("write");
    qemu_io(&endpoint, "flush").expect("flush");

    cluster.cli(&["volume", "update", "v1", "--replicas", "3"]).expect("raise the count");
    cluster.wait(Duration::from_secs(60), "a third replica, rebuilt and RW", || {
        let modes = engine_status(&cluster, "v1")["replicas"].as_array().cloned().unwrap_or_default();
        healthy(&cluster, "v1") && modes.iter().filter(|r| r["mode"] == "RW").count() == 3
    });
    let nodes: BTreeSet<String> =
        cluster.replicas_of("v1").iter().map(|r| r["spec"]["nodeID"].as_str().unwrap().to_string()).collect();
    assert_eq!(nodes.len(), 3, "one replica per node: {nodes:?}");
    for _ in 0..3 {
        qemu_io(&endpoint, "read -P 0x6b 0 16M").expect("every replica holds the data");
    }

    cluster.cli(&["volume", "update", "v1", "--replicas", "1"]).expect("lower the count");
    cluster.wait(Duration::from_secs(60), "one replica left, its engine serving from it", || {
        let modes = engine_status(&cluster, "v1")["replicas"].as_array().cloned().unwrap_or_default();
        cluster.replicas_of("v1").len() == 1 && modes.len() == 1 && healthy(&cluster, "v1")
    });
    assert!(has_event(&cluster, "v1", "ReplicaRemoved", "1 replicas wanted"));
    let lvs: usize = ["n-1", "n-2", "n-3"].iter().map(|n| cluster.lvs(n).len()).sum();
    assert_eq!(lvs, 1, "the removed replicas' LVs are gone");
    qemu_io(&endpoint, "read -P 0x6b 0 16M").expect("the data is still there");
    qemu_io(&endpoint, "write -P 0x6c 16M 1M").expect("and the volume takes writes");
    let bad = cluster.cli(&["volume", "update", "v1", "--replicas", "0"]).expect_err("0 replicas refused");
    assert!(bad.contains("must be 1 to 20"), "{bad}");
}

/// SIGCONTs a process stopped for a test, however the test ends.
struct Frozen(u32);

impl Frozen {
    fn stop(pid: u32) -> Frozen {
        // SAFETY: an exact pid: one `up` recorded for an instance manager,
        // or one an instance manager lists for its instance.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0, "SIGSTOP {pid}");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// The manager's reconcile passes so far and the seconds they took, from
/// its metrics page.
fn passes(cluster: &StandaloneCluster) -> (f64, f64) {
    let page = cluster.http_get("/metrics").expect("GET /metrics");
    let value = |name: &str| {
        page.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.trim().parse::<f64>().ok()))
            .unwrap_or_else(|| panic!("{name} not on the metrics page"))
    };
    (value("ironhorn_manager_reconcile_passes_total "), value("ironhorn_manager_reconcile_seconds_total "))
}

/// One node's instance manager frozen (SIGSTOP: its connections stay open
/// and nothing answers) must not stall the rest of the cluster. Nodes are
/// polled at once, each from a task of its own; a pass waits at most 1.5 s
/// for any node and goes on without one that has not answered (its poll
/// runs on to its own timeout), and a node that did not answer is then
/// asked with a short timeout. So passes stay short, and every other
/// volume is reconciled as often as before. A volume attached on another
/// node meanwhile attaches (its replica on n-3 left out, and rebuilt once
/// n-3 answers again). Measured: at first every pass waited 5 s for n-3
/// (the attach took 15.6 s against 3.5 s); with short timeouts after the
/// first silent poll, 9 s against 2.5 s; with the pass's 1.5 s wait,
/// 4.0 s against 2.5 s, passes 0.5 s each.
///
/// Then one volume's engine frozen: every look at that volume waits for its
/// status call's 5 s timeout. Each volume is reconciled in a task of its
/// own (the controller's work queue), so a pass starts the others and goes
/// on; a third volume attaches within its usual time. Before the queue, a
/// pass waited for every volume's reconcile, so each pass took the frozen
/// engine's 5 s and the attach took several of them.
#[test]
fn a_frozen_instance_manager_does_not_stall_the_other_volumes() {
    let cluster = StandaloneCluster::start("heal-frozen", 3, 18000, "1GiB");
    for v in ["fz-a", "fz-b", "fz-c"] {
        cluster.cli(&["volume", "create", v, "--size", "64MiB", "--replicas", "3"]).unwrap();
    }
    cluster.wait(Duration::from_secs(60), "every replica running", || {
        ["fz-a", "fz-b", "fz-c"]
            .iter()
            .flat_map(|v| cluster.replicas_of(v))
            .filter(|r| r["status"]["currentState"] == "running")
            .count()
            == 9
    });
    let t = Instant::now();
    cluster.cli(&["volume", "attach", "fz-a", "--node", "n-1"]).unwrap();
    let normal = t.elapsed();
    cluster.wait(Duration::from_secs(60), "fz-a healthy", || healthy(&cluster, "fz-a"));

    let im3: u32 = std::fs::read_to_string(cluster.dir.path().join("data/nodes/n-3/im.pid"))
        .expect("im.pid")
        .trim()
        .parse()
        .expect("a pid");
    let frozen = Frozen::stop(im3);
    let t = Instant::now();
    cluster.cli(&["volume", "attach", "fz-b", "--node", "n-1"]).unwrap();
    let while_frozen = t.elapsed();
    eprintln!("attach with every node answering: {normal:?}; with n-3 frozen: {while_frozen:?}");
    assert_eq!(cluster.volume("fz-b")["status"]["state"], "attached");
    assert!(healthy(&cluster, "fz-a"), "fz-a kept its engine: {}", cluster.volume("fz-a")["status"]);

    // The passes while n-3 stays frozen (its first silent pass is behind):
    // how long every volume waits between two looks.
    let (passes0, seconds0) = passes(&cluster);
    std::thread::sleep(Duration::from_secs(10));
    let (passes1, seconds1) = passes(&cluster);
    let per_pass = (seconds1 - seconds0) / (passes1 - passes0).max(1.0);
    eprintln!("{} passes in 10 s with n-3 frozen, {per_pass:.2} s each", passes1 - passes0);
    assert!(passes1 - passes0 >= 2.0, "the manager kept reconciling: {} passes in 10 s", passes1 - passes0);
    assert!(per_pass < 2.5, "a pass takes {per_pass:.2} s with n-3 frozen (a full poll timeout is 5 s)");
    drop(frozen);
    cluster.wait(Duration::from_secs(120), "fz-b healthy once n-3 answers", || healthy(&cluster, "fz-b"));

    // fz-c's attach with every engine answering, for comparison.
    let t = Instant::now();
    cluster.cli(&["volume", "attach", "fz-c", "--node", "n-2"]).unwrap();
    let normal_c = t.elapsed();
    cluster.wait(Duration::from_secs(60), "fz-c healthy", || healthy(&cluster, "fz-c"));
    cluster.cli(&["volume", "detach", "fz-c"]).unwrap();
    cluster.wait(Duration::from_secs(60), "fz-c detached", || cluster.volume("fz-c")["status"]["state"] == "detached");

    // fz-a's engine frozen: its status call hangs until its timeout.
    let (engine_pid, _) = instance(&cluster, "n-1", "fz-a-e").expect("fz-a's engine instance");
    let frozen = Frozen::stop(engine_pid);
    cluster.wait(Duration::from_secs(30), "fz-a's engine seen not answering", || {
        cluster
            .json(&["engine", "list"])
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["spec"]["volumeName"] == "fz-a" && !e["status"]["error"].as_str().unwrap_or("").is_empty())
    });
    let t = Instant::now();
    cluster.cli(&["volume", "attach", "fz-c", "--node", "n-2"]).unwrap();
    let engine_frozen = t.elapsed();
    eprintln!("fz-c attach with every engine answering: {normal_c:?}; with fz-a's engine frozen: {engine_frozen:?}");
    assert_eq!(cluster.volume("fz-c")["status"]["state"], "attached");
    assert!(
        engine_frozen < normal_c + Duration::from_secs(1),
        "fz-c attached in {engine_frozen:?} with fz-a's engine frozen, {normal_c:?} otherwise: fz-a's 5 s status \
         timeout held the other volumes"
    );
    cluster.wait(Duration::from_secs(60), "fz-c healthy", || healthy(&cluster, "fz-c"));
    drop(frozen);
    cluster.wait(Duration::from_secs(60), "fz-a healthy once its engine answers", || healthy(&cluster, "fz-a"));
}
