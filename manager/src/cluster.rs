//! The manager's only road to the processes: instance managers (one per node)
//! and engines, over gRPC. Controllers decide; this applies. A trait, so the
//! decision code can be driven without processes.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ironhorn_proto::engine::engine_client::EngineClient;
use ironhorn_proto::engine::{ReplicaAddRequest, ReplicaRemoveRequest, StatusRequest, StatusResponse};
use ironhorn_proto::instance::instance_manager_client::InstanceManagerClient;
use ironhorn_proto::instance::{self as pb};
use tonic::transport::{Channel, Endpoint};

pub trait Cluster: Clone + Send + Sync + 'static {
    fn instances(&self, im: &str) -> impl Future<Output = Result<Vec<pb::Instance>, String>> + Send;
    fn create_instance(
        &self,
        im: &str,
        request: pb::CreateRequest,
    ) -> impl Future<Output = Result<pb::Instance, String>> + Send;
    /// Stops and forgets an instance; an unknown name is already deleted.
    fn delete_instance(
        &self,
        im: &str,
        name: &str,
        remove_data: bool,
    ) -> impl Future<Output = Result<(), String>> + Send;
    fn disk_status(&self, im: &str, disk: &str) -> impl Future<Output = Result<pb::DiskStatusResponse, String>> + Send;
    fn delete_store(&self, im: &str, store: &str) -> impl Future<Output = Result<(), String>> + Send;
    fn engine_status(&self, engine: &str) -> impl Future<Output = Result<StatusResponse, String>> + Send;
    /// Asks the engine to bring a replica in (WO) and rebuild it, without
    /// waiting for the rebuild.
    fn engine_replica_add(&self, engine: &str, replica: &str) -> impl Future<Output = Result<(), String>> + Send;
    /// Takes a replica out of the engine; one it does not have is fine.
    fn engine_replica_remove(&self, engine: &str, replica: &str) -> impl Future<Output = Result<(), String>> + Send;
    /// Takes, deletes (absent is fine) or lists the engine's snapshots;
    /// answers the list after the operation.
    /// Grows the volume through its engine (every replica, then the
    /// engine's frontends).
    fn engine_expand(&self, engine: &str, size: u64) -> impl Future<Output = Result<(), String>> + Send;
    /// Replaces the engine's frontend I/O limits (0: none).
    fn engine_set_limits(
        &self,
        engine: &str,
        limits: ironhorn_proto::engine::IoLimits,
    ) -> impl Future<Output = Result<(), String>> + Send;
    /// Replaces the engine's rebuild copy rate limit (0: none).
    fn engine_set_rebuild_rate(
        &self,
        engine: &str,
        bytes_per_sec: u64,
    ) -> impl Future<Output = Result<(), String>> + Send;
    /// Starts a scrub on the engine (a running one is left running).
    fn engine_scrub(&self, engine: &str) -> impl Future<Output = Result<(), String>> + Send;
    /// Grows one replica's store directly (its volume has no engine).
    fn replica_expand(&self, replica: &str, size: u64, epoch: u64) -> impl Future<Output = Result<(), String>> + Send;
    /// A snapshot op on one replica of a detached volume (at `epoch`, the
    /// replica's highest); returns what the replica holds after it.
    fn replica_snapshot(
        &self,
        replica: &str,
        op: SnapshotOp,
        epoch: u64,
    ) -> impl Future<Output = Result<Vec<ironhorn_proto::replica::Snapshot>, String>> + Send;
    fn replica_info(
        &self,
        replica: &str,
    ) -> impl Future<Output = Result<ironhorn_proto::replica::InfoResponse, String>> + Send;
    fn engine_snapshot(
        &self,
        engine: &str,
        op: SnapshotOp,
    ) -> impl Future<Output = Result<Vec<ironhorn_proto::engine::Snapshot>, String>> + Send;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotOp {
    Create(String),
    Delete(String),
    List,
}

#[derive(Clone, Default)]
pub struct GrpcCluster {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl GrpcCluster {
    fn channel(&self, address: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().expect("channel cache");
        if let Some(c) = channels.get(address) {
            return Ok(c.clone());
        }
        let channel = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("{address}: {e}"))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            // A peer cut off mid-connection is found in seconds, not at the
            // next request's timeout.
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    fn im(&self, address: &str) -> Result<InstanceManagerClient<Channel>, String> {
        Ok(InstanceManagerClient::new(self.channel(address)?))
    }
}

/// How long a pass waits for a poll (instance list, disk or engine status):
/// one node that does not answer must not hold every volume's pass for the
/// channel's 30 s.
const POLL_TIMEOUT: Duration = Duration::from_secs(5);

fn poll<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(POLL_TIMEOUT);
    request
}

fn status(address: &str, s: tonic::Status) -> String {
    format!("{address}: {}", s.message())
}

impl Cluster for GrpcCluster {
    async fn instances(&self, im: &str) -> Result<Vec<pb::Instance>, String> {
        let reply = self.im(im)?.list(poll(pb::ListRequest {})).await.map_err(|e| status(im, e))?;
        Ok(reply.into_inner().instances)
    }

    async fn create_instance(&self, im: &str, request: pb::CreateRequest) -> Result<pb::Instance, String> {
        Ok(self.im(im)?.create(request).await.map_err(|e| status(im, e))?.into_inner())
    }

    async fn delete_instance(&self, im: &str, name: &str, remove_data: bool) -> Result<(), String> {
        let request = pb::DeleteRequest { name: name.to_string(), remove_data };
        match self.im(im)?.delete(request).await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(status(im, s)),
        }
    }

    async fn disk_status(&self, im: &str, disk: &str) -> Result<pb::DiskStatusResponse, String> {
        let request = poll(pb::DiskStatusRequest { disk: disk.to_string() });
        Ok(self.im(im)?.disk_status(request).await.map_err(|e| status(im, e))?.into_inner())
    }

    async fn delete_store(&self, im: &str, store: &str) -> Result<(), String> {
        let request = pb::DeleteStoreRequest { store: store.to_string() };
        self.im(im)?.delete_store(request).await.map_err(|e| status(im, e))?;
        Ok(())
    }

    async fn engine_status(&self, engine: &str) -> Result<StatusResponse, String> {
        let mut client = EngineClient::new(self.channel(engine)?);
        Ok(client.status(poll(StatusRequest {})).await.map_err(|e| status(engine, e))?.into_inner())
    }

    async fn engine_replica_add(&self, engine: &str, replica: &str) -> Result<(), String> {
        let mut client = EngineClient::new(self.channel(engine)?);
        let request = ReplicaAddRequest { address: replica.to_string(), wait: false };
        client.replica_add(request).await.map_err(|e| status(engine, e))?;
        Ok(())
    }

    async fn engine_replica_remove(&self, engine: &str, replica: &str) -> Result<(), String> {
        let mut client = EngineClient::new(self.channel(engine)?);
        match client.replica_remove(ReplicaRemoveRequest { address: replica.to_string() }).await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(status(engine, s)),
        }
    }

    async fn engine_scrub(&self, engine: &str) -> Result<(), String> {
        let mut client = EngineClient::new(self.channel(engine)?);
        client.scrub(poll(ironhorn_proto::engine::ScrubRequest {})).await.map_err(|e| status(engine, e))?;
        Ok(())
    }

    async fn engine_set_limits(&self, engine: &str, limits: ironhorn_proto::engine::IoLimits) -> Result<(), String> {
        let mut client = EngineClient::new(self.channel(engine)?);
        client.set_limits(limits).await.map_err(|e| status(engine, e))?;
        Ok(())
    }

    async fn engine_set_rebuild_rate(&self, engine: &str, bytes_per_sec: u64) -> Result<(), String> {
        let mut client = EngineClient::new(self.channel(engine)?);
        let rate = ironhorn_proto::engine::RebuildRate { bytes_per_sec };
        client.set_rebuild_rate(rate).await.map_err(|e| status(engine, e))?;
        Ok(())
    }

    async fn engine_expand(&self, engine: &str, size: u64) -> Result<(), String> {
        let mut client = EngineClient::new(self.channel(engine)?);
        client
            .expand(ironhorn_proto::engine::ExpandRequest { size_bytes: size })
            .await
            .map_err(|e| status(engine, e))?;
        Ok(())
    }

    async fn replica_expand(&self, replica: &str, size: u64, epoch: u64) -> Result<(), String> {
        use ironhorn_proto::replica::replica_client::ReplicaClient;
        let mut client = ReplicaClient::new(self.channel(replica)?);
        let request = ironhorn_proto::replica::ExpandRequest { size_bytes: size, epoch };
        client.expand(request).await.map_err(|e| status(replica, e))?;
        Ok(())
    }

    async fn replica_snapshot(
        &self,
        replica: &str,
        op: SnapshotOp,
        epoch: u64,
    ) -> Result<Vec<ironhorn_proto::replica::Snapshot>, String> {
        use ironhorn_proto::replica::replica_client::ReplicaClient;
        use ironhorn_proto::replica::{SnapshotCreateRequest, SnapshotDeleteRequest, SnapshotListRequest};
        let mut client = ReplicaClient::new(self.channel(replica)?);
        match op {
            SnapshotOp::Create(name) => {
                client.snapshot_create(SnapshotCreateRequest { name, epoch }).await.map_err(|e| status(replica, e))?;
            }
            SnapshotOp::Delete(name) => match client.snapshot_delete(SnapshotDeleteRequest { name, epoch }).await {
                Ok(_) => {}
                Err(s) if s.code() == tonic::Code::NotFound => {}
                Err(s) => return Err(status(replica, s)),
            },
            SnapshotOp::List => {}
        }
        let list = client.snapshot_list(SnapshotListRequest {}).await.map_err(|e| status(replica, e))?;
        Ok(list.into_inner().snapshots)
    }

    async fn replica_info(&self, replica: &str) -> Result<ironhorn_proto::replica::InfoResponse, String> {
        use ironhorn_proto::replica::InfoRequest;
        use ironhorn_proto::replica::replica_client::ReplicaClient;
        let mut client = ReplicaClient::new(self.channel(replica)?);
        Ok(client.info(InfoRequest {}).await.map_err(|e| status(replica, e))?.into_inner())
    }

    async fn engine_snapshot(
        &self,
        engine: &str,
        op: SnapshotOp,
    ) -> Result<Vec<ironhorn_proto::engine::Snapshot>, String> {
        use ironhorn_proto::engine::{SnapshotListRequest, SnapshotRequest};
        let mut client = EngineClient::new(self.channel(engine)?);
        let reply = match op {
            SnapshotOp::Create(name) => client.snapshot_create(SnapshotRequest { name }).await,
            SnapshotOp::Delete(name) => match client.snapshot_delete(SnapshotRequest { name }).await {
                Err(s) if s.code() == tonic::Code::NotFound => client.snapshot_list(SnapshotListRequest {}).await,
                other => other,
            },
            SnapshotOp::List => client.snapshot_list(SnapshotListRequest {}).await,
        };
        Ok(reply.map_err(|e| status(engine, e))?.into_inner().snapshots)
    }
}
