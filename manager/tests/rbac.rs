//! The RBAC of deploy/ironhorn.yaml against the requests the code makes:
//! an instance manager registering and beating, and a manager electing
//! itself, serving the REST API through a volume's whole life (create,
//! attach, snapshot, expand, settings, listings, detach, delete) and
//! reconciling it, all against the in-memory apiserver, which records the
//! method and path of every request per service account. Each request must
//! be allowed by the Roles and ClusterRoles bound to the account that made
//! it, and each rule must be used by some request (least privilege).

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use ironhorn_manager::controller::Controller;
use ironhorn_manager::crd::Volume;
use ironhorn_manager::datastore::Datastore;
use ironhorn_manager::datastore::kubernetes::KubeStore;
use ironhorn_manager::leader::{self, Timing};
use ironhorn_manager::registration::{Registrar, read_kubernetes_node};
use ironhorn_proto::instance::InstanceState;
use serde_json::{Value, json};
use support::apiserver::{FakeApiserver, Logged};
use support::nodes::HealthyNodes;
use support::rest::call;

const NS: &str = "ironhorn-system";

/// (verb, apiGroup, resource[/subresource], namespaced)
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    verb: String,
    group: String,
    resource: String,
    namespaced: bool,
}

fn access(l: &Logged) -> Access {
    let parts: Vec<&str> = l.path.trim_start_matches('/').split('/').collect();
    let (group, mut rest) = match parts[0] {
        "api" => (String::new(), &parts[2..]),
        "apis" => (parts[1].to_string(), &parts[3..]),
        other => panic!("unexpected path root {other} in {}", l.path),
    };
    let namespaced = rest.first() == Some(&"namespaces");
    if namespaced {
        rest = &rest[2..];
    }
    let resource = match rest.get(2) {
        Some(sub) => format!("{}/{sub}", rest[0]),
        None => rest[0].to_string(),
    };
    let verb = match (l.method.as_str(), rest.len()) {
        ("GET", 1) if l.query.contains("watch=true") || l.query.contains("watch=1") => "watch",
        ("GET", 1) => "list",
        ("GET", _) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        (m, _) => panic!("unexpected method {m}"),
    };
    Access { verb: verb.into(), group, resource, namespaced }
}

/// Every (verb, group, resource, namespaced) the account's bound roles grant.
fn granted(docs: &[Value], account: &str) -> BTreeSet<Access> {
    let bound = |binding: &Value| {
        binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["kind"] == "ServiceAccount" && s["name"] == account && s["namespace"] == NS)
    };
    let mut out = BTreeSet::new();
    for binding in docs.iter().filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding") {
        if !bound(binding) {
            continue;
        }
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
        let role_name = &binding["roleRef"]["name"];
        let role = docs
            .iter()
            .find(|d| d["kind"] == role_kind && &d["metadata"]["name"] == role_name)
            .unwrap_or_else(|| panic!("{role_kind} {role_name} is bound but not defined"));
        // A Role grants in its namespace; a ClusterRole (through either
        // binding) also grants cluster-scoped resources.
        let namespaced = role_kind == "Role" || binding["kind"] == "RoleBinding";
        for rule in role["rules"].as_array().unwrap() {
            for group in rule["apiGroups"].as_array().unwrap() {
                for resource in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        let a = |namespaced| Access {
                            verb: verb.as_str().unwrap().into(),
                            group: group.as_str().unwrap().into(),
                            resource: resource.as_str().unwrap().into(),
                            namespaced,
                        };
                        out.insert(a(true));
                        if !namespaced {
                            out.insert(a(false));
                        }
                    }
                }
            }
        }
    }
    out
}

fn manifest() -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/ironhorn.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text).unwrap().into_iter().filter(|d| !d.is_null()).collect()
}

async fn until(what: &str, mut probe: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !probe().await {
        assert!(std::time::Instant::now() < deadline, "{what}: not within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_roles_grant_exactly_the_requests_the_code_makes() {
    let api = FakeApiserver::new();
    for n in ["n1", "n2"] {
        api.seed(
            "/api/v1/nodes",
            json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": n,
            "labels": { "topology.kubernetes.io/zone": n } } }),
        );
    }
    // A full event log: the next event recorded prunes the oldest.
    for i in 0..ironhorn_manager::events::KEEP {
        api.seed(
            "/api/v1/namespaces/ironhorn-system/events",
            json!({ "apiVersion": "v1", "kind": "Event", "metadata": { "name": format!("old.{i:04}"), "namespace": NS },
                    "involvedObject": { "kind": "Volume", "name": "gone" }, "reason": "Old",
                    "lastTimestamp": format!("2020-01-01T00:{:02}:{:02}Z", i / 60 % 60, i % 60) }),
        );
    }

    // Instance managers: register (create, then update on a changed disk
    // list) and beat (create, then renew the lease).
    for n in ["n1", "n2"] {
        let client = api.client("ironhorn-instance-manager");
        let mut registrar = Registrar::new(KubeStore::new(client.clone(), NS), n);
        for disks in [vec!["file:/d".to_string()], vec!["file:/d".to_string(), "file:/e".to_string()]] {
            let reg = read_kubernetes_node(&client, n, &format!("{n}:8500"), &disks).await.unwrap();
            assert!(registrar.register(&reg).await.unwrap());
        }
        registrar.beat(Duration::from_secs(40)).await.unwrap();
        registrar.beat(Duration::from_secs(40)).await.unwrap();
    }

    // The manager: elected, reconciling, serving the API.
    let store = KubeStore::cached(api.client("ironhorn-manager"), NS);
    let timing = Timing {
        duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry: Duration::from_millis(300),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (gate, elector) = leader::spawn(store.clone(), "m1".into(), timing, stopped(stop_rx.clone()));
    let cluster = HealthyNodes::default();
    let controller = Controller::new(store.clone(), cluster.clone()).with_gate(gate.clone());
    let running = tokio::spawn({
        let stop = stopped(stop_rx.clone());
        async move { controller.run(Duration::from_millis(200), stop).await }
    });
    let router = ironhorn_manager::api::router(store.clone(), gate.clone());
    until("leadership", async || gate.is_leader()).await;

    for (method, uri, body, expect) in [
        ("PUT", "/v1/settings/default-replica-count", Some(json!({ "value": "2" })), 200),
        ("PUT", "/v1/settings/default-replica-count", Some(json!({ "value": "2" })), 200),
        ("POST", "/v1/volumes", Some(json!({ "name": "v1", "size": "1GiB" })), 200),
        ("GET", "/readyz", None, 200),
        ("GET", "/v1/volumes", None, 200),
        ("GET", "/v1/volumes/v1", None, 200),
        ("GET", "/v1/nodes", None, 200),
        (
            "POST",
            "/v1/nodes/n2",
            Some(json!({ "tags": ["ssd"], "disks": { "disk-1": { "allowScheduling": true } } })),
            200,
        ),
        ("POST", "/v1/nodes/n2", Some(json!({ "tags": ["ssd"] })), 200),
        ("GET", "/v1/replicas", None, 200),
        ("GET", "/v1/engines", None, 200),
        ("GET", "/v1/snapshots", None, 200),
        ("GET", "/v1/events", None, 200),
        ("GET", "/v1/settings", None, 200),
        ("GET", "/v1/capacity", None, 200),
        ("GET", "/metrics", None, 200),
    ] {
        let (status, reply) = call(&router, method, uri, body).await;
        assert_eq!(status, expect, "{method} {uri}: {reply}");
    }
    let replicas = "/apis/ironhorn.io/v1alpha1/namespaces/ironhorn-system/replicas";
    until("2 replicas scheduled", async || api.objects(replicas).len() == 2).await;
    let (status, reply) =
        call(&router, "PUT", "/v1/settings/default-replica-count", Some(json!({ "value": "3" }))).await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = call(&router, "POST", "/v1/volumes/v1/attach", Some(json!({ "node": "n1" }))).await;
    assert_eq!(status, 200, "{reply}");
    let engines = "/apis/ironhorn.io/v1alpha1/namespaces/ironhorn-system/engines";
    let engine = async |api: &FakeApiserver| api.object(engines, "v1-e").unwrap_or_default();
    until("a running engine", async || engine(&api).await["status"]["currentState"] == "running").await;
    // A snapshot the (unreachable) engine cannot take: its status says why.
    let (status, reply) = call(&router, "POST", "/v1/volumes/v1/snapshots", Some(json!({ "name": "s1" }))).await;
    assert_eq!(status, 200, "{reply}");
    let snapshots = "/apis/ironhorn.io/v1alpha1/namespaces/ironhorn-system/snapshots";
    until("the snapshot's failure in its status", async || {
        api.object(snapshots, "s1").is_some_and(|s| s["status"]["message"].as_str().is_some_and(|m| !m.is_empty()))
    })
    .await;
    // A replica's process fails: the replica is marked failed, an event says so.
    let first_replica = api.objects(replicas)[0]["metadata"]["name"].as_str().unwrap().to_string();
    assert!(cluster.set_state(&first_replica, InstanceState::Error));
    until("the replica marked failed", async || {
        api.object(replicas, &first_replica)
            .is_some_and(|r| r["spec"]["failedAt"].as_str().is_some_and(|f| !f.is_empty()))
    })
    .await;
    // The engine's process fails: a new one starts at a higher epoch.
    let epoch = engine(&api).await["spec"]["epoch"].as_u64().unwrap();
    assert!(cluster.set_state("v1-e", InstanceState::Error));
    until("the engine restarted at a new epoch", async || {
        engine(&api).await["spec"]["epoch"].as_u64().is_some_and(|e| e > epoch)
    })
    .await;
    let (status, reply) = call(&router, "POST", "/v1/volumes/v1/expand", Some(json!({ "size": "2GiB" }))).await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = call(&router, "DELETE", "/v1/volumes/v1/snapshots/s1", None).await;
    assert!(status == 200 || status == 202, "{status} {reply}");
    let (status, reply) = call(&router, "POST", "/v1/volumes/v1/detach", None).await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = call(&router, "DELETE", "/v1/volumes/v1", None).await;
    assert!(status == 200 || status == 202, "{status} {reply}");
    until("the volume gone", async || store.get::<Volume>("v1").await.unwrap().is_none()).await;
    let _ = stop_tx.send(true);
    running.await.unwrap();
    elector.await.unwrap();

    let docs = manifest();
    let log = api.log();
    let mut problems = Vec::new();
    for account in ["ironhorn-instance-manager", "ironhorn-manager"] {
        let rules = granted(&docs, account);
        let used: BTreeSet<Access> = log.iter().filter(|l| l.client == account).map(access).collect();
        for a in &used {
            if !rules.contains(a) {
                problems.push(format!("{account} makes a request its roles do not grant: {a:?}"));
            }
        }
        let strip = |a: &Access| (a.verb.clone(), a.group.clone(), a.resource.clone());
        let mut used_any: BTreeSet<_> = used.iter().map(strip).collect();
        // A cached reader (the manager) lists and watches a kind, and reads
        // one object of it directly after a conflict or a delete
        // (datastore/cache.rs): `get` comes with `watch`.
        let watched: Vec<_> = used_any.iter().filter(|(v, ..)| v == "watch").cloned().collect();
        used_any.extend(watched.into_iter().map(|(_, g, r)| ("get".to_string(), g, r)));
        for r in rules.iter().map(strip).collect::<BTreeSet<_>>() {
            if !used_any.contains(&r) {
                problems.push(format!("{account}'s roles grant what no request used: {r:?}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
