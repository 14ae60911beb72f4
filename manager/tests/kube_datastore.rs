//! The Kubernetes datastore against a mocked apiserver (tower-test): every
//! request the facade and a controller pass make is checked (method, path,
//! query, body) in order, and nothing else may arrive.

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame};
use ironhorn_manager::cluster::Cluster;
use ironhorn_manager::controller::Controller;
use ironhorn_manager::crd::{Volume, VolumeSpec};
use ironhorn_manager::datastore::kubernetes::KubeStore;
use ironhorn_manager::datastore::{Datastore, update_status};
use serde_json::{Value, json};
use tower_test::mock::Handle;

type MockBody = BoxBody<Bytes, std::io::Error>;
type Mock = Handle<Request<kube::client::Body>, Response<MockBody>>;

const BASE: &str = "/apis/ironhorn.io/v1alpha1/namespaces/ironhorn-system";

fn body(value: &Value) -> MockBody {
    http_body_util::Full::new(Bytes::from(serde_json::to_vec(value).unwrap())).map_err(|e| match e {}).boxed()
}

fn volume_json(resource_version: &str, replicas: u32, status: Option<Value>) -> Value {
    let mut v = json!({
        "apiVersion": "ironhorn.io/v1alpha1",
        "kind": "Volume",
        "metadata": { "name": "v1", "namespace": "ironhorn-system", "resourceVersion": resource_version, "uid": "u-1" },
        "spec": { "size": 1073741824u64, "numberOfReplicas": replicas },
    });
    if let Some(s) = status {
        v["status"] = s;
    }
    v
}

fn list_json(kind: &str, items: Vec<Value>) -> Value {
    json!({ "apiVersion": "ironhorn.io/v1alpha1", "kind": kind, "metadata": { "resourceVersion": "5" }, "items": items })
}

fn status_json(code: u16, reason: &str) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": reason, "reason": reason, "code": code })
}

/// Takes the next request (within a second), checks it, answers it.
async fn expect(
    handle: &mut Mock,
    method: Method,
    path: &str,
    query_has: &[&str],
    check_body: impl FnOnce(&Value),
    status: StatusCode,
    reply: MockBody,
) {
    let (request, send) = tokio::time::timeout(Duration::from_secs(1), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("no request arrived; expected {method} {path}"))
        .expect("service dropped");
    let uri = request.uri().clone();
    assert_eq!((request.method(), uri.path()), (&method, path), "unexpected request {} {uri}", request.method());
    let query = uri.query().unwrap_or("");
    for part in query_has {
        assert!(query.contains(part), "{method} {path}: query {query:?} lacks {part:?}");
    }
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let value: Value = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
    check_body(&value);
    send.send_response(Response::builder().status(status).body(reply).unwrap());
}

fn no_body(v: &Value) {
    assert!(v.is_null() || v == &json!({}), "unexpected body {v}");
}

#[derive(Clone)]
struct NoProcesses;

impl Cluster for NoProcesses {
    async fn instances(&self, _: &str) -> Result<Vec<ironhorn_proto::instance::Instance>, String> {
        panic!("no node exists, so no instance manager may be called")
    }
    async fn create_instance(
        &self,
        _: &str,
        _: ironhorn_proto::instance::CreateRequest,
    ) -> Result<ironhorn_proto::instance::Instance, String> {
        panic!("nothing may be started")
    }
    async fn delete_instance(&self, _: &str, _: &str, _: bool) -> Result<(), String> {
        panic!("nothing may be stopped")
    }
    async fn disk_status(&self, _: &str, _: &str) -> Result<ironhorn_proto::instance::DiskStatusResponse, String> {
        panic!("no disk exists")
    }
    async fn delete_store(&self, _: &str, _: &str) -> Result<(), String> {
        panic!("no store exists")
    }
    async fn engine_status(&self, _: &str) -> Result<ironhorn_proto::engine::StatusResponse, String> {
        panic!("no engine exists")
    }
    async fn engine_replica_add(&self, _: &str, _: &str) -> Result<(), String> {
        panic!("no engine exists")
    }
    async fn engine_scrub(&self, _: &str) -> Result<(), String> {
        panic!("no engine exists")
    }
    async fn engine_expand(&self, _: &str, _: u64) -> Result<(), String> {
        panic!("no engine exists")
    }
    async fn engine_set_rebuild_rate(&self, _: &str, _: u64) -> Result<(), String> {
        Ok(())
    }

    async fn engine_set_limits(&self, _: &str, _: ironhorn_proto::engine::IoLimits) -> Result<(), String> {
        panic!("no engine exists")
    }
    async fn replica_expand(&self, _: &str, _: u64, _: u64) -> Result<(), String> {
        panic!("no replica exists")
    }
    async fn replica_snapshot(
        &self,
        _: &str,
        _: ironhorn_manager::cluster::SnapshotOp,
        _: u64,
    ) -> Result<Vec<ironhorn_proto::replica::Snapshot>, String> {
        panic!("no replica exists")
    }
    async fn replica_info(&self, _: &str) -> Result<ironhorn_proto::replica::InfoResponse, String> {
        panic!("no replica exists")
    }
    async fn engine_snapshot(
        &self,
        _: &str,
        _: ironhorn_manager::cluster::SnapshotOp,
    ) -> Result<Vec<ironhorn_proto::engine::Snapshot>, String> {
        Err("no processes".into())
    }

    async fn engine_replica_remove(&self, _: &str, _: &str) -> Result<(), String> {
        panic!("no engine exists")
    }
}

#[tokio::test]
async fn create_status_conflict_retry_watch_reconcile_and_delete_make_exactly_these_requests() {
    let (service, mut handle) = tower_test::mock::pair::<Request<kube::client::Body>, Response<MockBody>>();
    let store = KubeStore::new(kube::Client::new(service, "ironhorn-system"), "ironhorn-system");
    let volumes = format!("{BASE}/volumes");
    let v1 = format!("{BASE}/volumes/v1");
    let v1_status = format!("{BASE}/volumes/v1/status");

    // 1. Create.
    let s = store.clone();
    let client = tokio::spawn(async move {
        let v = Volume::new("v1", VolumeSpec { size: 1 << 30, number_of_replicas: 3, ..Default::default() });
        s.create(&v).await.expect("create")
    });
    expect(
        &mut handle,
        Method::POST,
        &volumes,
        &[],
        |b| {
            assert_eq!(b["metadata"]["name"], "v1");
            assert_eq!(b["spec"]["numberOfReplicas"], 3);
            assert_eq!(b["spec"]["size"], 1u64 << 30);
        },
        StatusCode::CREATED,
        body(&volume_json("1", 3, None)),
    )
    .await;
    let created = client.await.unwrap();
    assert_eq!(created.metadata.resource_version.as_deref(), Some("1"));

    // 2. Status update that meets a conflict: read again, write again.
    let s = store.clone();
    let client = tokio::spawn(async move {
        update_status::<Volume, _>(&s, "v1", |v| {
            v.status.get_or_insert_default().state = "detached".into();
            true
        })
        .await
        .expect("status update")
    });
    expect(&mut handle, Method::GET, &v1, &[], no_body, StatusCode::OK, body(&volume_json("1", 3, None))).await;
    expect(
        &mut handle,
        Method::PUT,
        &v1_status,
        &[],
        |b| {
            assert_eq!(b["metadata"]["resourceVersion"], "1");
            assert_eq!(b["status"]["state"], "detached");
        },
        StatusCode::CONFLICT,
        body(&status_json(409, "Conflict")),
    )
    .await;
    // Someone else changed the spec meanwhile (resourceVersion 2).
    expect(&mut handle, Method::GET, &v1, &[], no_body, StatusCode::OK, body(&volume_json("2", 2, None))).await;
    expect(
        &mut handle,
        Method::PUT,
        &v1_status,
        &[],
        |b| {
            assert_eq!(b["metadata"]["resourceVersion"], "2", "retried on the fresh object");
            assert_eq!(b["spec"]["numberOfReplicas"], 2, "the other writer's change is kept");
            assert_eq!(b["status"]["state"], "detached");
        },
        StatusCode::OK,
        body(&volume_json("3", 2, Some(json!({ "state": "detached" })))),
    )
    .await;
    let updated = client.await.unwrap().expect("object exists");
    assert_eq!(updated.status.unwrap().state, "detached");

    // 3. A watch event drives a reconcile pass of the real controller.
    let s = store.clone();
    let client = tokio::spawn(async move {
        let mut changes = s.watch::<Volume>().await.expect("watch");
        let change = changes.recv().await.expect("one change");
        assert_eq!(change.name, "v1");
        Controller::new(s, NoProcesses).reconcile_all().await.expect("reconcile");
        changes // kept open: no re-list, no re-watch
    });
    expect(
        &mut handle,
        Method::GET,
        &volumes,
        &["limit=1"],
        no_body,
        StatusCode::OK,
        body(&list_json("VolumeList", vec![])),
    )
    .await;
    let (events_tx, events_rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    let stream = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(events_rx)).boxed();
    expect(&mut handle, Method::GET, &volumes, &["watch=true", "resourceVersion=5"], no_body, StatusCode::OK, stream)
        .await;
    let event = json!({ "type": "MODIFIED", "object": volume_json("6", 2, Some(json!({ "state": "detached" }))) });
    let mut line = serde_json::to_vec(&event).unwrap();
    line.push(b'\n');
    events_tx.send(Ok(Frame::data(Bytes::from(line)))).await.unwrap();
    // The pass: a snapshot (nodes, the settings in one list: none set, so
    // defaults, the nodes' heartbeat leases, volumes, engines, replicas,
    // snapshots), then the volume's status.
    for kind in ["nodes", "settings", "leases", "volumes", "engines", "replicas", "snapshots"] {
        let items =
            if kind == "volumes" { vec![volume_json("6", 2, Some(json!({ "state": "detached" })))] } else { vec![] };
        let list_kind = format!("{}List", &kind[..1].to_uppercase()) + &kind[1..kind.len() - 1];
        let path = match kind {
            "leases" => "/apis/coordination.k8s.io/v1/namespaces/ironhorn-system/leases".to_string(),
            _ => format!("{BASE}/{kind}"),
        };
        expect(&mut handle, Method::GET, &path, &[], no_body, StatusCode::OK, body(&list_json(&list_kind, items)))
            .await;
    }
    // Created without the finalizer (as kubectl would): the pass adds it, so
    // deleting the volume will wait for its engine, replicas and LVs.
    expect(
        &mut handle,
        Method::GET,
        &v1,
        &[],
        no_body,
        StatusCode::OK,
        body(&volume_json("6", 2, Some(json!({ "state": "detached" })))),
    )
    .await;
    let mut with_finalizer = volume_json("7", 2, Some(json!({ "state": "detached" })));
    with_finalizer["metadata"]["finalizers"] = json!(["ironhorn.io"]);
    expect(
        &mut handle,
        Method::PUT,
        &v1,
        &[],
        |b| {
            assert_eq!(b["metadata"]["resourceVersion"], "6");
            assert_eq!(b["metadata"]["finalizers"], json!(["ironhorn.io"]));
        },
        StatusCode::OK,
        body(&with_finalizer),
    )
    .await;
    expect(&mut handle, Method::GET, &v1, &[], no_body, StatusCode::OK, body(&with_finalizer)).await;
    expect(
        &mut handle,
        Method::PUT,
        &v1_status,
        &[],
        |b| {
            assert_eq!(b["metadata"]["resourceVersion"], "7");
            let scheduled =
                b["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Scheduled").unwrap();
            assert_eq!(scheduled["status"], "False");
            assert_eq!(scheduled["reason"], "NoReadyNode", "no node exists, and the condition says so");
        },
        StatusCode::OK,
        body(&volume_json("8", 2, Some(json!({ "state": "creating" })))),
    )
    .await;
    let changes = tokio::time::timeout(Duration::from_secs(1), client).await.expect("reconcile finished").unwrap();

    // 4. Delete.
    let s = store.clone();
    let client = tokio::spawn(async move { s.delete::<Volume>("v1").await.expect("delete") });
    expect(&mut handle, Method::DELETE, &v1, &[], |_| {}, StatusCode::OK, body(&volume_json("9", 2, None))).await;
    client.await.unwrap();

    // And nothing else.
    let extra = tokio::time::timeout(Duration::from_millis(500), handle.next_request()).await;
    assert!(extra.is_err(), "unexpected extra request: {:?}", extra.ok().flatten().map(|(r, _)| r.uri().clone()));
    drop(changes);
    drop(events_tx);
}

#[tokio::test]
async fn events_are_recorded_in_the_managers_namespace() {
    let (service, mut handle) = tower_test::mock::pair::<Request<kube::client::Body>, Response<MockBody>>();
    let store = KubeStore::new(kube::Client::new(service, "storage-ops"), "storage-ops");
    let s = store.clone();
    let client = tokio::spawn(async move {
        ironhorn_manager::events::record(&s, "v1", ironhorn_manager::events::Kind::Warning, "ReplicaFailed", "gone")
            .await
    });
    let events = "/api/v1/namespaces/storage-ops/events";
    expect(
        &mut handle,
        Method::POST,
        events,
        &[],
        |b| {
            assert_eq!(b["metadata"]["namespace"], "storage-ops");
            assert_eq!(b["involvedObject"]["namespace"], "storage-ops");
            assert_eq!(b["involvedObject"]["name"], "v1");
            assert_eq!(b["reason"], "ReplicaFailed");
        },
        StatusCode::CREATED,
        body(&json!({ "apiVersion": "v1", "kind": "Event", "metadata": { "name": "v1.1", "namespace": "storage-ops" },
                      "involvedObject": {}, "reason": "ReplicaFailed" })),
    )
    .await;
    expect(
        &mut handle,
        Method::GET,
        events,
        &[],
        no_body,
        StatusCode::OK,
        body(&json!({ "apiVersion": "v1", "kind": "EventList", "metadata": { "resourceVersion": "2" }, "items": [] })),
    )
    .await;
    client.await.unwrap();
    let extra = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
    assert!(extra.is_err(), "unexpected extra request");
}
