//! What running on a cluster needs, against an in-memory apiserver behind
//! tower-test mocks (support/apiserver.rs): nodes register themselves and
//! renew a heartbeat; the manager marks a node whose heartbeat stopped not
//! Ready; two managers contend for the leader Lease and exactly one
//! reconciles until it stops renewing, then the other takes over.

mod support;

use std::time::{Duration, Instant};

use ironhorn_manager::controller::Controller;
use ironhorn_manager::crd::{Condition, DiskSpec, Node, NodeSpec, Volume, VolumeSpec};
use ironhorn_manager::datastore::Datastore;
use ironhorn_manager::datastore::kubernetes::KubeStore;
use ironhorn_manager::leader::{self, Timing};
use ironhorn_manager::registration::{Registrar, read_kubernetes_node};
use serde_json::{Value, json};
use support::apiserver::FakeApiserver;
use support::nodes::HealthyNodes;

const NS: &str = "ironhorn-system";
const NODES: &str = "/apis/ironhorn.io/v1alpha1/namespaces/ironhorn-system/nodes";
const REPLICAS: &str = "/apis/ironhorn.io/v1alpha1/namespaces/ironhorn-system/replicas";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ironhorn-system/leases";

async fn eventually<T>(what: &str, within: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn renew_time(lease: &Value) -> jiff::Timestamp {
    lease["spec"]["renewTime"].as_str().expect("renewTime").parse().expect("a timestamp")
}

fn ready(node: &Value) -> Condition {
    let conditions: Vec<Condition> = serde_json::from_value(node["status"]["conditions"].clone()).unwrap_or_default();
    conditions.into_iter().find(|c| c.type_ == "Ready").expect("a Ready condition")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_registers_itself_renews_its_heartbeat_and_goes_not_ready_when_it_stops() {
    let api = FakeApiserver::new();
    api.seed(
        "/api/v1/nodes",
        json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": "n1",
            "labels": { "topology.kubernetes.io/zone": "z1", "topology.kubernetes.io/region": "r1", "other": "x" },
            "annotations": { "ironhorn.io/disks": "fast=lvm:vg-fast,file:/var/lib/ironhorn/disk" } } }),
    );
    let client = api.client("instance-manager");
    let registrar = Registrar::new(KubeStore::new(client.clone(), NS), "n1");
    let read = move || {
        let client = client.clone();
        async move { read_kubernetes_node(&client, "n1", "10.0.0.1:8500", &["file:/from-the-flag".into()]).await }
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let beating = tokio::spawn(registrar.run(Duration::from_millis(200), Duration::from_secs(2), read, async {
        let _ = stop_rx.await;
    }));

    let node = eventually("Node object", Duration::from_secs(5), || api.object(NODES, "n1")).await;
    assert_eq!(node["spec"]["instanceManagerAddress"], "10.0.0.1:8500");
    let disks = node["spec"]["disks"].as_object().expect("disks");
    assert_eq!(disks.keys().collect::<Vec<_>>(), ["disk-2", "fast"], "the annotation wins over --disk");
    assert_eq!(disks["fast"]["path"], "lvm:vg-fast");
    assert_eq!(disks["disk-2"]["path"], "file:/var/lib/ironhorn/disk");
    assert_eq!(node["metadata"]["labels"]["topology.kubernetes.io/zone"], "z1");
    assert_eq!(node["metadata"]["labels"]["topology.kubernetes.io/region"], "r1");
    assert!(node["metadata"]["labels"].get("other").is_none(), "only topology labels are copied");

    let first = eventually("heartbeat lease", Duration::from_secs(5), || api.object(LEASES, "ironhorn-node-n1")).await;
    assert_eq!(first["spec"]["holderIdentity"], "n1");
    let renewed = eventually("a renewed heartbeat", Duration::from_secs(5), || {
        api.object(LEASES, "ironhorn-node-n1").filter(|l| renew_time(l) > renew_time(&first))
    })
    .await;
    assert!(renew_time(&renewed) > renew_time(&first));

    // The manager judges the heartbeat (timeout 1 s for the test).
    let manager = KubeStore::new(api.client("manager"), NS);
    ironhorn_manager::settings::set(&manager, "node-heartbeat-timeout", "1").await.expect("setting");
    let controller = Controller::new(manager.clone(), HealthyNodes::default());
    controller.reconcile_all().await.expect("pass");
    let node = api.object(NODES, "n1").unwrap();
    assert_eq!(ready(&node).status, "True", "a node with a fresh heartbeat is Ready: {node}");
    assert_eq!(node["status"]["zone"], "z1");

    stop_tx.send(()).unwrap();
    beating.await.unwrap();
    let stopped_at = renew_time(&api.object(LEASES, "ironhorn-node-n1").unwrap());
    // Wait until the lease is older than the timeout by the wall clock.
    eventually("heartbeat to age past the timeout", Duration::from_secs(5), || {
        (jiff::Timestamp::now().as_second() - stopped_at.as_second() > 1).then_some(())
    })
    .await;
    controller.reconcile_all().await.expect("pass");
    let node = api.object(NODES, "n1").unwrap();
    let condition = ready(&node);
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "HeartbeatExpired"), "{node}");
    let schedulable: Vec<Condition> = serde_json::from_value(node["status"]["conditions"].clone()).unwrap();
    assert!(schedulable.iter().any(|c| c.type_ == "Schedulable" && c.status == "False"));
}

fn timing() -> Timing {
    Timing {
        duration: Duration::from_millis(3000),
        renew_deadline: Duration::from_millis(2000),
        retry: Duration::from_millis(300),
    }
}

struct Manager {
    gate: leader::Gate,
    cluster: HealthyNodes,
    stop: tokio::sync::watch::Sender<bool>,
}

fn start_manager(api: &FakeApiserver, identity: &str) -> Manager {
    let store = KubeStore::new(api.client(identity), NS);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (gate, _) = leader::spawn(store.clone(), identity.into(), timing(), stopped(stop_rx.clone()));
    let cluster = HealthyNodes::default();
    let controller = Controller::new(store, cluster.clone()).with_gate(gate.clone());
    tokio::spawn(async move { controller.run(Duration::from_millis(300), stopped(stop_rx)).await });
    Manager { gate, cluster, stop }
}

fn writes_of(api: &FakeApiserver, who: &str) -> Vec<String> {
    api.log()
        .into_iter()
        .filter(|l| l.client == who && l.method != "GET" && !l.path.starts_with(LEASES))
        .map(|l| format!("{} {}", l.method, l.path))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_contend_for_the_lease_one_reconciles_and_the_other_takes_over_when_it_stops_renewing() {
    let api = FakeApiserver::new();
    three_nodes_and_a_volume(&api).await;

    let managers = [start_manager(&api, "m1"), start_manager(&api, "m2")];
    let both = |managers: &[Manager; 2]| managers.iter().filter(|m| m.gate.is_leader()).count();
    let leader = eventually("a leader", Duration::from_secs(5), || {
        let count = both(&managers);
        assert!(count <= 1, "two leaders at once");
        managers.iter().position(|m| m.gate.is_leader())
    })
    .await;
    let follower = 1 - leader;
    let (leader_id, follower_id) = (["m1", "m2"][leader], ["m1", "m2"][follower]);

    // The leader schedules the volume; watch for 2 s that nothing doubles.
    eventually("3 replicas", Duration::from_secs(5), || (api.objects(REPLICAS).len() == 3).then_some(())).await;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert!(both(&managers) <= 1, "two leaders at once");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let replicas = api.objects(REPLICAS);
    let mut nodes: Vec<&str> = replicas.iter().map(|r| r["spec"]["nodeID"].as_str().unwrap()).collect();
    nodes.sort();
    assert_eq!(nodes, ["n1", "n2", "n3"], "one replica per node, no extras");
    assert!(managers[leader].cluster.changes() > 0, "the leader reconciles (starts replicas)");
    assert_eq!(managers[follower].cluster.changes(), 0, "the follower touched no process");
    assert_eq!(writes_of(&api, follower_id), Vec::<String>::new(), "the follower wrote nothing but lease attempts");

    // The leader's link to the apiserver fails: it must stop acting within
    // its renew deadline, and the follower takes over after the duration.
    api.cut_off(leader_id, true);
    let cut = Instant::now();
    eventually("the old leader to stop", timing().renew_deadline + Duration::from_millis(100), || {
        (!managers[leader].gate.is_leader()).then_some(())
    })
    .await;
    let stopped_after = cut.elapsed();
    let took_over = eventually("the follower to take over", Duration::from_secs(8), || {
        assert!(both(&managers) <= 1, "two leaders at once");
        managers[follower].gate.is_leader().then(|| cut.elapsed())
    })
    .await;
    assert!(
        stopped_after < took_over,
        "the old leader stopped ({stopped_after:?}) before the takeover ({took_over:?})"
    );
    assert!(took_over >= timing().duration - timing().renew_deadline, "took over at {took_over:?}, too soon");
    eventually("the new leader to reconcile", Duration::from_secs(5), || {
        (managers[follower].cluster.changes() > 0).then_some(())
    })
    .await;
    let lease = api.object(LEASES, leader::LEASE_NAME).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], follower_id);
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    assert_eq!(api.objects(REPLICAS).len(), 3, "still no extra replica");

    for m in &managers {
        let _ = m.stop.send(true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_releases_the_lease_and_the_other_takes_over_at_once() {
    let api = FakeApiserver::new();
    let first = start_manager(&api, "a");
    eventually("a to lead", Duration::from_secs(5), || first.gate.is_leader().then_some(())).await;
    let second = start_manager(&api, "b");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!second.gate.is_leader(), "b must follow while a renews");
    first.stop.send(true).unwrap();
    let released = Instant::now();
    eventually("b to lead", Duration::from_secs(2), || second.gate.is_leader().then_some(())).await;
    assert!(released.elapsed() < timing().duration, "a released lease is taken without waiting out its duration");
    let _ = second.stop.send(true);
}

async fn three_nodes_and_a_volume(api: &FakeApiserver) {
    let admin = KubeStore::new(api.client("admin"), NS);
    for n in ["n1", "n2", "n3"] {
        let disk = DiskSpec { path: "file:/d".into(), allow_scheduling: true, ..Default::default() };
        let spec = NodeSpec {
            allow_scheduling: true,
            tags: vec![],
            disks: [("disk-1".to_string(), disk)].into(),
            instance_manager_address: format!("{n}:8500"),
        };
        admin.create(&Node::new(n, spec)).await.unwrap();
    }
    admin
        .create(&Volume::new("v1", VolumeSpec { size: 1 << 30, number_of_replicas: 3, ..Default::default() }))
        .await
        .unwrap();
}

/// The replicas' (name, node), sorted by name.
fn placement(api: &FakeApiserver) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = api
        .objects(REPLICAS)
        .iter()
        .map(|r| (r["metadata"]["name"].as_str().unwrap().into(), r["spec"]["nodeID"].as_str().unwrap().into()))
        .collect();
    out.sort();
    out
}

fn assert_one_per_node(placement: &[(String, String)]) {
    let names: Vec<&str> = placement.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["v1-r-0", "v1-r-1", "v1-r-2"], "{placement:?}");
    let mut nodes: Vec<&str> = placement.iter().map(|(_, n)| n.as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["n1", "n2", "n3"], "one replica per node: {placement:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_dying_between_replica_creates_leaves_a_set_the_next_pass_completes() {
    let api = FakeApiserver::new();
    three_nodes_and_a_volume(&api).await;
    // The first manager writes one Replica object, then dies.
    api.die_after_creates("first", "/replicas", 1);
    let first = Controller::new(KubeStore::new(api.client("first"), NS), HealthyNodes::default());
    // Its first pass reports the nodes' disks ready; its second places.
    for _ in 0..2 {
        let _ = first.reconcile_all().await;
    }
    let partial = placement(&api);
    assert_eq!(partial.len(), 1, "the crash must fall between the creates: {partial:?}");
    let volume = api.object("/apis/ironhorn.io/v1alpha1/namespaces/ironhorn-system/volumes", "v1").unwrap();
    let scheduled = volume["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "Scheduled");
    assert!(scheduled.is_none_or(|c| c["status"] != "True"), "marked scheduled with 1 of 3: {volume}");

    // The next manager finishes the set beside the replica already there.
    let second = Controller::new(KubeStore::new(api.client("second"), NS), HealthyNodes::default());
    second.reconcile_all().await.expect("pass");
    let complete = placement(&api);
    assert_one_per_node(&complete);
    assert!(complete.contains(&partial[0]), "the replica written before the crash is kept: {complete:?}");
    let volume = api.object("/apis/ironhorn.io/v1alpha1/namespaces/ironhorn-system/volumes", "v1").unwrap();
    let scheduled = volume["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Scheduled");
    assert_eq!(scheduled.unwrap()["status"], "True", "{volume}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_placing_one_volume_at_once_make_no_extra_replica() {
    for _ in 0..5 {
        let api = FakeApiserver::new();
        three_nodes_and_a_volume(&api).await;
        let a = Controller::new(KubeStore::new(api.client("a"), NS), HealthyNodes::default());
        let b = Controller::new(KubeStore::new(api.client("b"), NS), HealthyNodes::default());
        for _ in 0..3 {
            let _ = tokio::join!(a.reconcile_all(), b.reconcile_all());
        }
        assert_one_per_node(&placement(&api));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_with_100_volumes_makes_no_request_at_idle_beyond_its_watches() {
    let api = FakeApiserver::new();
    three_nodes_and_a_volume(&api).await;
    let admin = KubeStore::new(api.client("admin"), NS);
    for i in 2..=100 {
        let spec = VolumeSpec { size: 256 << 20, number_of_replicas: 3, ..Default::default() };
        admin.create(&Volume::new(&format!("v{i}"), spec)).await.unwrap();
    }
    let store = KubeStore::cached(api.client("manager"), NS);
    let controller = Controller::new(store, HealthyNodes::default());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(async move {
        let mut rx = stop_rx;
        controller
            .run(Duration::from_millis(200), async move {
                let _ = rx.wait_for(|s| *s).await;
            })
            .await
    });
    // Busy until every volume is placed, started and reported detached.
    eventually("100 volumes detached", Duration::from_secs(60), || {
        let volumes = api.objects("/apis/ironhorn.io/v1alpha1/namespaces/ironhorn-system/volumes");
        (volumes.len() == 100 && volumes.iter().all(|v| v["status"]["state"] == "detached")).then_some(())
    })
    .await;
    assert_eq!(api.objects(REPLICAS).len(), 300);
    // Settle: one more second for the last status writes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = api.log().len();
    let idle = Duration::from_secs(6);
    tokio::time::sleep(idle).await;
    let requests: Vec<String> = api.log()[before..]
        .iter()
        .filter(|l| l.client == "manager")
        .map(|l| format!("{} {}?{}", l.method, l.path, l.query))
        .collect();
    let per_minute = requests.len() as f64 * 60.0 / idle.as_secs_f64();
    assert!(
        requests.is_empty(),
        "{per_minute:.0} requests/min at idle with 100 volumes (30 passes): {:?}",
        &requests[..requests.len().min(20)]
    );
    let _ = stop.send(true);
    running.await.unwrap();
}
