//! ironhorn manager: custom resources, the datastore facade (Kubernetes or
//! embedded), the scheduler, the controllers, the REST API, and the pieces
//! of the `ironhorn` CLI (including `ironhorn up`, a standalone cluster).

pub mod api;
pub mod client;
pub mod cluster;
pub mod controller;
pub mod copy;
pub mod crd;
pub mod csi;
pub mod datastore;
pub mod epoch;
pub mod events;
pub mod expansion;
pub mod follow;
pub mod leader;
pub mod metrics;
pub mod registration;
pub mod replenish;
pub mod restore;
pub mod scheduler;
pub mod scrub;
pub mod settings;
pub mod simnet;
pub mod snapshots;
pub mod standalone;
pub mod ui;
pub mod watch;

use std::net::SocketAddr;
use std::time::Duration;

use cluster::Cluster;
use datastore::Datastore;

/// Leader election settings for a manager that shares its datastore with
/// others (see [`leader`]).
#[derive(Clone, Debug)]
pub struct Election {
    /// This manager's name in the lease (the pod's name on a cluster).
    pub identity: String,
    pub timing: leader::Timing,
}

/// Runs the controllers and the REST API until SIGTERM or SIGINT; with
/// `election`, the controllers run only while this manager holds the lease.
pub async fn serve<D: Datastore, C: Cluster>(
    store: D,
    cluster: C,
    listen: SocketAddr,
    election: Option<Election>,
) -> Result<(), String> {
    serve_on(store, cluster, bind_api(listen).await?, election).await
}

/// Binds the API's address (before anything else is started, so a taken
/// port leaves nothing behind).
pub async fn bind_api(listen: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(listen).await.map_err(|e| format!("API listen on {listen}: {e}"))
}

/// `serve` on a listener already bound.
pub async fn serve_on<D: Datastore, C: Cluster>(
    store: D,
    cluster: C,
    listener: tokio::net::TcpListener,
    election: Option<Election>,
) -> Result<(), String> {
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(address = %local, "manager API serving");
    // Tests and supervisors read this line to learn the bound address.
    ironhorn_proto::say!("listening on {local}");
    // Controllers and the API share one record of whether writes land.
    let store = datastore::health::Recorded::new(store);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stopped| *stopped).await;
    };
    let (gate, elector) = match election {
        Some(e) => {
            e.timing.validate()?;
            let (gate, task) = leader::spawn(store.clone(), e.identity, e.timing, wait_stop(stop_rx.clone()));
            (gate, Some(task))
        }
        None => (leader::Gate::always(), None),
    };
    let controller = controller::Controller::new(store.clone(), cluster).with_gate(gate.clone());
    let controllers = tokio::spawn({
        let stop = wait_stop(stop_rx.clone());
        async move { controller.run(Duration::from_secs(2), stop).await }
    });
    let server = axum::serve(listener, api::router(store, gate)).with_graceful_shutdown(wait_stop(stop_rx));
    let server = tokio::spawn(async move { server.await });
    ironhorn_proto::shutdown::signal().await;
    let _ = stop_tx.send(true);
    let _ = controllers.await;
    if let Some(elector) = elector {
        // Releases the lease, so the next manager takes over at once.
        let _ = elector.await;
    }
    match tokio::time::timeout(Duration::from_secs(3), server).await {
        Ok(Ok(Err(e))) => Err(format!("API server: {e}")),
        _ => Ok(()),
    }
}
