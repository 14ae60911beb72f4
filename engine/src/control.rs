//! The engine's control gRPC service: an adapter over [`Volume`]. Volume
//! errors map to gRPC codes in one place ([`status`]).

use std::sync::Arc;

use ironhorn_proto::engine::engine_server::{Engine, EngineServer};
use ironhorn_proto::engine::*;
use tonic::{Request, Response, Status};

use crate::blockdev::BlockDevice;
use crate::volume::{self, Volume, VolumeError};

pub struct EngineService {
    volume: Arc<Volume>,
    /// The kernel block device, told when the volume grows.
    block_device: Option<Arc<BlockDevice>>,
}

impl EngineService {
    pub fn new(volume: Arc<Volume>, block_device: Option<Arc<BlockDevice>>) -> EngineServer<Self> {
        EngineServer::new(Self { volume, block_device })
    }
}

fn status(e: VolumeError) -> Status {
    let msg = e.to_string();
    match e {
        VolumeError::Invalid(_) | VolumeError::TooLarge(_) => Status::invalid_argument(msg),
        VolumeError::NoSpace(_) => Status::resource_exhausted(msg),
        VolumeError::NotFound(_) => Status::not_found(msg),
        VolumeError::Fenced(_) | VolumeError::Busy(_) => Status::failed_precondition(msg),
        VolumeError::Io(_) | VolumeError::NoQuorum(_) => Status::unavailable(msg),
    }
}

pub fn status_message(s: volume::VolumeStatus) -> StatusResponse {
    StatusResponse {
        volume: s.volume,
        size_bytes: s.size_bytes,
        epoch: s.epoch,
        frontends: s.frontends,
        replicas: s
            .replicas
            .into_iter()
            .map(|r| ReplicaStatus {
                address: r.address,
                mode: format!("{:?}", r.mode),
                error: r.error,
                transport: r.transport.to_string(),
            })
            .collect(),
        rebuilds: s
            .rebuilds
            .into_iter()
            .map(|r| RebuildStatus {
                replica: r.replica,
                source: r.source,
                state: r.state,
                compared_bytes: r.compared_bytes,
                copied_bytes: r.copied_bytes,
                total_bytes: r.total_bytes,
                error: r.error,
                method: r.method,
                started_unix_ms: r.started_unix_ms,
                finished_unix_ms: r.finished_unix_ms,
                join_moves: r.join_moves,
            })
            .collect(),
        fenced: s.fenced,
        out_of_space: s.out_of_space,
        unflushed_bytes: s.unflushed_bytes,
        scrub: Some(scrub_message(s.scrub)),
        bad_blocks_found: s.bad_blocks_found,
        bad_blocks_repaired: s.bad_blocks_repaired,
        limits: Some(IoLimits { iops: s.limits.iops, bytes_per_sec: s.limits.bytes_per_sec }),
        rebuild_bytes_per_sec: s.rebuild_bytes_per_sec,
    }
}

fn scrub_message(s: volume::ScrubStatus) -> ScrubStatus {
    ScrubStatus {
        state: s.state,
        checked_bytes: s.checked_bytes,
        total_bytes: s.total_bytes,
        bad_blocks: s.bad_blocks,
        repaired_blocks: s.repaired_blocks,
        error: s.error,
        started_unix_ms: s.started_unix_ms,
        finished_unix_ms: s.finished_unix_ms,
    }
}

impl EngineService {
    async fn snapshots(&self) -> Result<Response<SnapshotListResponse>, Status> {
        let list = self.volume.snapshot_list().await.map_err(status)?;
        Ok(Response::new(SnapshotListResponse {
            snapshots: list
                .into_iter()
                .map(|s| Snapshot { name: s.name, created_unix_ms: s.created_unix_ms, size_bytes: s.size_bytes })
                .collect(),
        }))
    }
}

#[tonic::async_trait]
impl Engine for EngineService {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(status_message(self.volume.status())))
    }

    async fn replica_add(&self, request: Request<ReplicaAddRequest>) -> Result<Response<StatusResponse>, Status> {
        let req = request.into_inner();
        if req.wait {
            self.volume.add_replica(&req.address).await.map_err(status)?;
        } else {
            let volume = self.volume.clone();
            tokio::spawn(async move {
                if let Err(e) = volume.add_replica(&req.address).await {
                    tracing::error!(replica = %req.address, error = %e, "replica add failed");
                }
            });
        }
        Ok(Response::new(status_message(self.volume.status())))
    }

    async fn replica_remove(&self, request: Request<ReplicaRemoveRequest>) -> Result<Response<StatusResponse>, Status> {
        self.volume.remove_replica(&request.into_inner().address).map_err(status)?;
        Ok(Response::new(status_message(self.volume.status())))
    }

    async fn snapshot_create(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotListResponse>, Status> {
        self.volume.snapshot_create(&request.into_inner().name).await.map_err(status)?;
        self.snapshots().await
    }

    async fn snapshot_list(&self, _: Request<SnapshotListRequest>) -> Result<Response<SnapshotListResponse>, Status> {
        self.snapshots().await
    }

    async fn snapshot_delete(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotListResponse>, Status> {
        self.volume.snapshot_delete(&request.into_inner().name).await.map_err(status)?;
        self.snapshots().await
    }

    async fn snapshot_revert(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotListResponse>, Status> {
        self.volume.snapshot_revert(&request.into_inner().name).await.map_err(status)?;
        self.snapshots().await
    }

    async fn expand(&self, request: Request<ExpandRequest>) -> Result<Response<StatusResponse>, Status> {
        let size = request.into_inner().size_bytes;
        self.volume.expand(size).await.map_err(status)?;
        if let Some(device) = self.block_device.clone() {
            tokio::task::spawn_blocking(move || device.refresh_size(size))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(|e| {
                    Status::internal(format!("the volume grew to {size} bytes but its block device did not: {e}"))
                })?;
        }
        Ok(Response::new(status_message(self.volume.status())))
    }

    async fn set_limits(&self, request: Request<IoLimits>) -> Result<Response<StatusResponse>, Status> {
        let l = request.into_inner();
        self.volume.set_limits(crate::limit::Limits { iops: l.iops, bytes_per_sec: l.bytes_per_sec });
        tracing::info!(iops = l.iops, bytes_per_sec = l.bytes_per_sec, "I/O limits set");
        Ok(Response::new(status_message(self.volume.status())))
    }

    async fn set_rebuild_rate(&self, request: Request<RebuildRate>) -> Result<Response<StatusResponse>, Status> {
        let rate = request.into_inner().bytes_per_sec;
        self.volume.set_rebuild_rate(rate);
        tracing::info!(bytes_per_sec = rate, "rebuild rate set");
        Ok(Response::new(status_message(self.volume.status())))
    }

    async fn scrub(&self, _: Request<ScrubRequest>) -> Result<Response<ScrubStatus>, Status> {
        Ok(Response::new(scrub_message(self.volume.start_scrub().map_err(status)?)))
    }

    async fn metrics(&self, _: Request<MetricsRequest>) -> Result<Response<MetricsResponse>, Status> {
        Ok(Response::new(MetricsResponse {
            volume: self.volume.name.clone(),
            latency_bounds_us: crate::metrics::LATENCY_BOUNDS_US.to_vec(),
            ops: self.volume.metrics(),
        }))
    }
}
