//! The embedded store keeps the apiserver's rules for status, so what works
//! on one machine works on a cluster: the same scenario on both stores (the
//! Kubernetes one against the in-memory apiserver).

mod support;

use axum::body::Body;
use http::Request;
use ironhorn_manager::crd::{Volume, VolumeSpec, VolumeStatus};
use ironhorn_manager::datastore::Datastore;
use ironhorn_manager::datastore::embedded::EmbeddedStore;
use ironhorn_manager::datastore::kubernetes::KubeStore;
use serde_json::{Value, json};
use support::apiserver::FakeApiserver;
use tower::ServiceExt;

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
    let post = Request::post("/v1/volumes")
        .header("content-type", "application/json")
        .body(Body::from(json!({ "name": "v2", "size": "1GiB" }).to_string()))
        .unwrap();
    let response = router.clone().oneshot(post).await.unwrap();
    assert_eq!(response.status(), 200, "{which}");
    let body: Value =
        serde_json::from_slice(&axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap()).unwrap();
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
