//! Driving a volume by editing its object, as `kubectl edit` / `kubectl
//! patch` do in the Kubernetes datastore mode (docs/kubectl.md): a client
//! that is not the manager creates a Volume, sets spec.nodeID to attach,
//! raises spec.size to expand, clears spec.nodeID to detach; the manager,
//! reading the in-memory apiserver, carries each out.

mod support;

use std::time::Duration;

use ironhorn_manager::controller::Controller;
use ironhorn_manager::crd::{Replica, Volume, VolumeSpec};
use ironhorn_manager::datastore::kubernetes::KubeStore;
use ironhorn_manager::registration::{Registrar, read_kubernetes_node};
use kube::api::{Api, PostParams};
use serde_json::json;
use support::apiserver::FakeApiserver;
use support::nodes::HealthyNodes;

const NS: &str = "ironhorn-system";

async fn until(what: &str, mut probe: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !probe().await {
        assert!(std::time::Instant::now() < deadline, "{what}: not within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `kubectl edit`: read the object, change it, write it back.
async fn edit(volumes: &Api<Volume>, change: impl Fn(&mut VolumeSpec)) {
    let mut v = volumes.get("v1").await.expect("get");
    change(&mut v.spec);
    volumes.replace("v1", &PostParams::default(), &v).await.expect("replace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_attached_expanded_and_detached_by_editing_its_object() {
    let api = FakeApiserver::new();
    for n in ["n1", "n2"] {
        api.seed("/api/v1/nodes", json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": n } }));
        let client = api.client("ironhorn-instance-manager");
        let reg = read_kubernetes_node(&client, n, &format!("{n}:8500"), &["file:/d".to_string()]).await.unwrap();
        assert!(Registrar::new(KubeStore::new(client, NS), n).register(&reg).await.unwrap());
    }
    let store = KubeStore::cached(api.client("ironhorn-manager"), NS);
    let cluster = HealthyNodes::default();
    let controller = Controller::new(store.clone(), cluster.clone());
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(async move {
        controller
            .run(Duration::from_millis(200), async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            })
            .await
    });

    // `kubectl apply` of a Volume the manager has never seen.
    let kubectl = api.client("kubectl");
    let volumes: Api<Volume> = Api::namespaced(kubectl.clone(), NS);
    let replicas: Api<Replica> = Api::namespaced(kubectl, NS);
    let spec = VolumeSpec { size: 1 << 30, number_of_replicas: 2, ..Default::default() };
    volumes.create(&PostParams::default(), &Volume::new("v1", spec)).await.expect("create");
    let state = async |volumes: &Api<Volume>| {
        volumes.get("v1").await.unwrap().status.map(|s| (s.state, s.current_node_id)).unwrap_or_default()
    };
    until("two replicas, detached", async || {
        replicas.list(&Default::default()).await.unwrap().items.len() == 2 && state(&volumes).await.0 == "detached"
    })
    .await;

    // Attach: spec.nodeID.
    edit(&volumes, |s| s.node_id = "n1".into()).await;
    until("attached on n1", async || state(&volumes).await == ("attached".to_string(), "n1".to_string())).await;
    let modes = async || {
        replicas
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|r| r.status.clone().unwrap_or_default().mode)
            .collect::<Vec<_>>()
    };
    until("kubectl shows each replica's mode", async || modes().await == ["RW", "RW"]).await;

    // Expand: a bigger spec.size reaches the engine.
    edit(&volumes, |s| s.size = 2 << 30).await;
    until("the engine asked to grow to 2 GiB", async || cluster.expansions().contains(&(2 << 30))).await;

    // Detach: spec.nodeID cleared; the replicas' modes go with the engine.
    edit(&volumes, |s| s.node_id.clear()).await;
    until("detached", async || state(&volumes).await == ("detached".to_string(), String::new())).await;
    until("no modes while detached", async || modes().await == ["", ""]).await;

    let _ = stop_tx.send(true);
    running.await.unwrap();
}
