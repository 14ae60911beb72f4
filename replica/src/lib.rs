//! ironhorn replica: one copy of one volume, kept in a block store on an LVM
//! logical volume or a file, served over gRPC.

pub mod data;
pub mod device;
pub mod fault_service;
pub mod faults;
pub mod format;
pub mod io;
pub mod lvm;
pub mod server;
pub mod store;

use std::net::SocketAddr;
use std::sync::Arc;

use device::{Device, StoreLocation};
use store::{Store, StoreConfig};

pub use ironhorn_proto::units::parse_size;

pub struct ServeConfig {
    pub store: StoreConfig,
    pub listen: SocketAddr,
    /// The node's directory of same-node sockets: the replica also listens
    /// on `DIR/<listen address>.sock` (see `ironhorn_proto::local`).
    pub local_sockets: Option<std::path::PathBuf>,
    /// Serve the `Faults` service (tests only).
    pub fault_injection: bool,
}

/// Opens (or creates) the store and serves it until SIGTERM or SIGINT, then
/// closes it cleanly.
pub async fn serve(config: ServeConfig) -> Result<(), String> {
    ironhorn_proto::allocator::tune();
    ironhorn_proto::allocator::spawn_trimmer();
    ironhorn_proto::busy_poll::start();
    let store = Store::open(&config.store).await.map_err(|e| format!("{}: {e}", config.store.location))?;
    let store = Arc::new(store);
    let listener =
        tokio::net::TcpListener::bind(config.listen).await.map_err(|e| format!("listen on {}: {e}", config.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let info = store.info();
    tracing::info!(
        address = %local,
        store = %info.location,
        size_bytes = info.size_bytes,
        revision = info.revision,
        clean_at_open = info.clean_at_open,
        "replica serving"
    );
    // The same-node socket only saves engines on this node some CPU: a
    // replica that cannot have one serves over TCP alone.
    let local_listener = config.local_sockets.as_ref().and_then(|dir| {
        match ironhorn_proto::local::Listener::bind(dir, &local.to_string()) {
            Ok(listener) => {
                tracing::info!(path = %listener.file.path().display(), "also serving on this node's local socket");
                Some(listener)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no local socket; engines on this node use TCP");
                None
            }
        }
    });
    // Tests and supervisors read this line to learn the bound address.
    ironhorn_proto::say!("listening on {local}");
    let faults = config.fault_injection.then(|| {
        tracing::warn!("fault injection is on: any client can fail this replica's disk");
        fault_service::FaultService::new(store.clone())
    });
    let router = tonic::transport::Server::builder()
        .max_frame_size(ironhorn_proto::channel::H2_MAX_FRAME)
        .initial_stream_window_size(ironhorn_proto::channel::H2_STREAM_WINDOW)
        .initial_connection_window_size(ironhorn_proto::channel::H2_CONNECTION_WINDOW)
        .add_service(server::ReplicaService::new(store.clone(), config.local_sockets.clone()))
        .add_optional_service(faults);
    let data_store = store.clone();
    let serve = move |stop| async move {
        let data = move |r, w| data::serve(data_store.clone(), r, w);
        ironhorn_proto::data::accept::serve(router, listener, local_listener, data, stop)
            .await
            .map_err(|e| format!("gRPC server: {e}"))
    };
    ironhorn_proto::shutdown::serve_until_signal(serve, std::time::Duration::from_secs(2)).await?;
    tracing::info!("shutting down");
    store.close().await.map_err(|e| format!("close store: {e}"))?;
    tracing::info!("store closed cleanly");
    Ok(())
}

/// Removes a store: deletes the file, or removes the LV.
pub fn delete(location: &StoreLocation) -> Result<(), String> {
    Device::destroy(location).map_err(|e| format!("delete {location}: {e}"))
}
