//! The embedded store keeps the apiserver's rules for status, so what works
//! on one machine works on a cluster: the same scenario on both stores (the
//! Kubernetes one against the in-memory apiserver).

mod support;

use ironhorn_manager::crd::{Volume, VolumeSpec, VolumeStatus};
use ironhorn_manager::datastore::Datastore;
use ironhorn_manager::datastore::embedded::EmbeddedStore;
use ironhorn_manager::datastore::kubernetes::KubeStore;
use serde_json::{Value, json};
use support::apiserver::FakeApiserver;

async fn status_is_a_subresource<D: Datastore>(store: D, which: &str) {
    let mut v = Volume::new("v1", VolumeSpec { size: 1 << 30, number_of_replicas: 3, ..Default::default() });
    v.status = Some(VolumeStatus { state: "creating".into(), ..Default::default() });
    let created = store.create(&v).await.unwrap();
    assert!(created.status.is_none(), "{which}: create wrote status");
    assert!(store.get::<Volume>("v1").await.unwrap().unwrap().status.is_none(), "{which}: create stored status");

    let mut with_status = created.clone();
    with_status.status = Some(VolumeStatus { state: "detached".into(), ..Default::default() });
    let written = store.replace_status(&with_status).await.unwrap();
    assert_eq!(written.status.as_ref().unwrap().state, "detached", "{which}");

    // A spec write carrying another status leaves the stored status alone.
    let mut spec_change = written.clone();
    spec_change.spec.number_of_replicas = 2;
    spec_change.status = Some(VolumeStatus { state: "bogus".into(), ..Default::default() });
    let replaced = store.replace(&spec_change).await.unwrap();
    assert_eq!(replaced.spec.number_of_replicas, 2, "{which}");
    let stored = store.get::<Volume>("v1").await.unwrap().unwrap();
    assert_eq!(stored.status.unwrap().state, "detached", "{which}: replace changed status");

    // Through the REST API: a new volume reads `creating` at once.
    let router = ironhorn_manager::api::router(store.clone(), ironhorn_manager::leader::Gate::always());
    let (status, body) =
        support::rest::call(&router, "POST", "/v1/volumes", Some(json!({ "name": "v2", "size": "1GiB" }))).await;
    assert_eq!(status, 200, "{which}");
    assert_eq!(body["status"]["state"], "creating", "{which}: {body}");
    let stored = store.get::<Volume>("v2").await.unwrap().unwrap();
    assert_eq!(stored.status.unwrap().state, "creating", "{which}");
}

#[tokio::test]
async fn embedded_store() {
    let dir = std::env::temp_dir().join(format!("ironhorn-both-stores-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    status_is_a_subresource(EmbeddedStore::open(&dir).unwrap(), "embedded").await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn kubernetes_store() {
    let api = FakeApiserver::new();
    status_is_a_subresource(KubeStore::new(api.client("manager"), "ironhorn-system"), "kubernetes").await;
}

async fn call(router: &axum::Router, method: &str, uri: &str, body: Option<Value>) -> (u16, String) {
    let (status, body) = support::rest::call(router, method, uri, body).await;
    (status, body["error"].as_str().unwrap_or_default().to_string())
}

#[tokio::test]
async fn apiserver_refusals_come_out_of_the_rest_api_as_their_own_status_with_a_message_to_act_on() {
    let api = FakeApiserver::new();
    let store = KubeStore::cached(api.client("manager"), "ironhorn-system");
    let router = ironhorn_manager::api::router(store, ironhorn_manager::leader::Gate::always());
    let create = json!({ "name": "v1", "size": "1GiB" });
    assert_eq!(call(&router, "POST", "/v1/volumes", Some(create.clone())).await.0, 200);
    // 409: the name is taken.
    let (status, message) = call(&router, "POST", "/v1/volumes", Some(create)).await;
    assert_eq!((status, message.contains("already exists")), (409, true), "{message}");
    // 404: no such volume.
    let (status, message) = call(&router, "GET", "/v1/volumes/nope", None).await;
    assert_eq!((status, message.contains("not found")), (404, true), "{message}");
    // 403: the service account lacks a rule; the message says which and where to look.
    api.forbid("manager");
    let (status, message) = call(&router, "POST", "/v1/volumes", Some(json!({ "name": "v2", "size": "1GiB" }))).await;
    assert_eq!(status, 403, "{message}");
    assert!(message.contains("may not create Volume v2") && message.contains("deploy/ironhorn.yaml"), "{message}");
    assert!(!message.contains("ErrorResponse") && !message.contains("Status {"), "debug text leaked: {message}");
    // Unreachable: 503, not 500.
    let cut = FakeApiserver::new();
    let store = KubeStore::new(cut.client("manager"), "ironhorn-system");
    cut.cut_off("manager", true);
    let router = ironhorn_manager::api::router(store, ironhorn_manager::leader::Gate::always());
    let (status, message) = call(&router, "GET", "/v1/volumes", None).await;
    assert_eq!(status, 503, "{message}");
}
