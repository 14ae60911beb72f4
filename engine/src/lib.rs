//! ironhorn engine: one volume, fronted over NBD (and as a kernel block
//! device), every write replicated to the volume's replicas.

pub mod blockdev;
pub mod control;
pub mod election;
pub mod fuse;
pub mod limit;
pub mod metrics;
pub mod nbd;
pub mod replica_conn;
pub mod volume;

use std::net::SocketAddr;
use std::time::Duration;

pub struct ServeConfig {
    pub volume: String,
    pub size: u64,
    pub epoch: u64,
    pub replicas: Vec<String>,
    pub nbd: Vec<nbd::Listen>,
    pub blockdev: bool,
    /// The block device's FUSE requests come over io_uring where the
    /// kernel can (see `fuse::uring`).
    pub fuse_uring: bool,
    pub listen: SocketAddr,
    pub replica_timeout: Duration,
    /// Rebuild copy rate limit in bytes per second (0: unlimited).
    pub rebuild_bytes_per_sec: u64,
    /// Writes need a majority of `replicas` to acknowledge them.
    pub write_majority: bool,
    /// Frontend I/O limits (zeros: none); changed later with SetLimits.
    pub limits: limit::Limits,
    /// This node's directory of same-node replica sockets: a replica with a
    /// socket there is reached over it instead of TCP.
    pub local_sockets: Option<std::path::PathBuf>,
}

/// Opens the volume, starts the frontends and the control server, and runs
/// until SIGTERM or SIGINT (then flushes every replica).
pub async fn serve(config: ServeConfig) -> Result<(), String> {
    ironhorn_proto::allocator::tune();
    ironhorn_proto::allocator::spawn_trimmer();
    ironhorn_proto::busy_poll::start();
    if config.replicas.is_empty() {
        return Err("at least one --replica is needed".into());
    }
    let (volume, to_rebuild) = volume::Volume::open(
        &config.volume,
        config.size,
        config.epoch,
        &config.replicas,
        config.replica_timeout,
        config.local_sockets.clone(),
    )
    .await
    .map_err(|e| format!("open volume {}: {e}", config.volume))?;
    volume.set_rebuild_rate(config.rebuild_bytes_per_sec);
    volume.set_limits(config.limits);
    if config.write_majority {
        volume.set_min_write_acks(config.replicas.len() / 2 + 1);
    }
    for listen in &config.nbd {
        let description =
            nbd::listen(listen, volume.clone()).await.map_err(|e| format!("NBD listener {listen:?}: {e}"))?;
        tracing::info!(frontend = %description, "NBD frontend ready");
        volume.add_frontend(description);
    }
    let block_device = if config.blockdev {
        let (v, handle, ring) = (volume.clone(), tokio::runtime::Handle::current(), config.fuse_uring);
        let device = tokio::task::spawn_blocking(move || blockdev::start(v, handle, ring))
            .await
            .map_err(|e| format!("block device: {e}"))??;
        volume.add_frontend(device.description());
        Some(std::sync::Arc::new(device))
    } else {
        None
    };
    let listener =
        tokio::net::TcpListener::bind(config.listen).await.map_err(|e| format!("listen on {}: {e}", config.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    if !to_rebuild.is_empty() {
        tracing::info!(replicas = ?to_rebuild, "rebuilding replicas that are behind");
        tokio::spawn(volume.clone().rebuild_all(to_rebuild));
    }
    ironhorn_proto::say!("listening on {local}");
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let router = tonic::transport::Server::builder()
        .add_service(control::EngineService::new(volume.clone(), block_device.clone()));
    ironhorn_proto::shutdown::serve_router(router, incoming, std::time::Duration::from_secs(2), "control server")
        .await?;
    tracing::info!("shutting down: flushing replicas");
    if let Err(e) = volume.flush().await {
        tracing::warn!(error = %e, "final flush failed");
    }
    if let Some(mut device) = block_device {
        // The control service's handle goes with its last connection.
        let mut tries = 0;
        let teardown = loop {
            match std::sync::Arc::try_unwrap(device) {
                Ok(owned) => break Some(owned),
                Err(shared) if tries == 250 => {
                    tracing::error!(link = %shared.link.display(), "block device still in use after 5 s; left in place");
                    break None;
                }
                Err(shared) => device = shared,
            }
            tries += 1;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        if let Some(owned) = teardown {
            tokio::task::spawn_blocking(move || drop(owned))
                .await
                .map_err(|e| format!("block device teardown: {e}"))?;
        }
    }
    Ok(())
}

pub use ironhorn_proto::units::parse_size;
