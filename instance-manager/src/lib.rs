//! ironhorn instance manager: one per node. It starts engine and replica
//! processes from the real binaries, gives them ports from its range, sends
//! their output to one log file each, and reports their state (starting,
//! running, stopping, stopped, error) with pid and exit status.
//!
//! Contract:
//! - A process that exits without being asked to is reported as `error`, with
//!   its exit status and the last line of its log. It is never restarted here:
//!   that decision belongs to the manager, which sees the whole volume.
//! - Instances outlive the instance manager. Each process runs in its own
//!   process group with its output going to a file, and the instance table is
//!   persisted in the data dir after every change. When the instance manager
//!   restarts it re-adopts every process that is still the same process (pid
//!   and kernel start time both match) and reports it `running`; an instance
//!   whose process died meanwhile is reported `error` ("exited while the
//!   instance manager was down"). An adopted process is not our child, so its
//!   exit is seen through a pidfd and its exit status is unknown.
//! - SIGTERM stops the instance manager only; its instances keep serving
//!   (an upgrade of the instance manager must not take volumes down).

mod disk;
mod process;
pub mod service;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub use service::InstanceManagerService;

pub struct Config {
    pub data_dir: PathBuf,
    /// The instance manager's own gRPC address.
    pub listen: SocketAddr,
    /// The address instances listen on (this node's address).
    pub address: IpAddr,
    /// Inclusive port range handed to instances.
    pub ports: (u16, u16),
    /// Where `ironhorn-engine` and `ironhorn-replica` are.
    pub bin_dir: PathBuf,
    /// Time between SIGTERM and SIGKILL when an instance is deleted.
    pub stop_grace: Duration,
    /// Start replicas with their fault-injection API on (chaos tests).
    pub replica_fault_injection: bool,
}

/// Parses `START-END` (inclusive).
pub fn parse_port_range(text: &str) -> Result<(u16, u16), String> {
    let (start, end) = text.split_once('-').ok_or_else(|| format!("port range {text:?}: expected START-END"))?;
    let start: u16 = start.trim().parse().map_err(|_| format!("port range {text:?}: bad start"))?;
    let end: u16 = end.trim().parse().map_err(|_| format!("port range {text:?}: bad end"))?;
    if start == 0 || end < start {
        return Err(format!("port range {text:?}: need 0 < START <= END"));
    }
    Ok((start, end))
}

/// Serves until SIGTERM or SIGINT. Instances keep running afterwards.
pub async fn serve(config: Config) -> Result<(), String> {
    std::fs::create_dir_all(config.data_dir.join("logs"))
        .map_err(|e| format!("data dir {}: {e}", config.data_dir.display()))?;
    let listener =
        tokio::net::TcpListener::bind(config.listen).await.map_err(|e| format!("listen on {}: {e}", config.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let service = InstanceManagerService::open(config).await?;
    tracing::info!(address = %local, "instance manager serving");
    ironhorn_proto::say!("listening on {local}");
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let router = tonic::transport::Server::builder()
        .add_service(ironhorn_proto::instance::instance_manager_server::InstanceManagerServer::new(service.clone()));
    ironhorn_proto::shutdown::serve_router(router, incoming, Duration::from_secs(1), "instance manager").await?;
    service.persist().await;
    tracing::info!("instance manager stopped; its instances keep running");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges() {
        assert_eq!(parse_port_range("10000-10099"), Ok((10000, 10099)));
        for bad in ["", "10", "0-5", "9-3", "a-b"] {
            assert!(parse_port_range(bad).is_err(), "{bad}");
        }
    }
}
