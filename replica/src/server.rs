//! The replica's gRPC surface: an adapter from `ironhorn.replica.v1` to
//! [`Store`]. Store errors map to gRPC codes in exactly one place
//! ([`status`]; the data stream's in `crate::data`); a bad request is answered with an error and
//! the replica keeps serving.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ironhorn_proto::replica::replica_client::ReplicaClient;
use ironhorn_proto::replica::replica_server::{Replica, ReplicaServer};
use ironhorn_proto::replica::*;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::format::{BLOCK_SIZE, FlushStamp};
use crate::store::{SnapshotInfo, Store, StoreError, StoreInfo};

/// Largest single request or response message, data included.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// How long a `CopyFrom` waits for its source when the request names no
/// timeout.
const COPY_SOURCE_TIMEOUT: Duration = Duration::from_secs(30);

pub struct ReplicaService {
    store: Arc<Store>,
    /// Clients of the replicas `CopyFrom` has read from, by address (one
    /// HTTP/2 connection each, made on first use and kept).
    peers: std::sync::Mutex<HashMap<String, ReplicaClient<Channel>>>,
    local_sockets: Option<std::path::PathBuf>,
}

impl ReplicaService {
    /// `local_sockets`: this node's directory of replica sockets, where a
    /// peer on this node is reached (see `ironhorn_proto::local`).
    pub fn new(store: Arc<Store>, local_sockets: Option<std::path::PathBuf>) -> ReplicaServer<Self> {
        ReplicaServer::new(Self { store, peers: Default::default(), local_sockets })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

pub(crate) fn status(e: StoreError) -> Status {
    let msg = e.to_string();
    match e {
        StoreError::InvalidArgument(_) | StoreError::SizeMismatch { .. } => Status::invalid_argument(msg),
        StoreError::NotFound(_) => Status::not_found(msg),
        StoreError::AlreadyExists(_) => Status::already_exists(msg),
        StoreError::Fenced { .. } => Status::failed_precondition(msg),
        StoreError::OutOfSpace { .. } | StoreError::DeviceFull { .. } => Status::resource_exhausted(msg),
        // DATA_LOSS is a block that fails its checksum (another replica's
        // copy may be good); an I/O error or a broken store is INTERNAL.
        StoreError::Checksum { .. } => Status::data_loss(msg),
        StoreError::Io { .. } | StoreError::Corrupt(_) => Status::internal(msg),
        StoreError::Failed(_) | StoreError::NotAStore(_) => Status::unavailable(msg),
    }
}

/// How a source replica's answer to a `CopyFrom` read failed, for the
/// engine: a bad block there (it can read that range from another copy),
/// a refused request, or anything else.
fn source_status(e: &Status) -> IoStatus {
    match e.code() {
        tonic::Code::DataLoss => IoStatus::DataLoss,
        tonic::Code::InvalidArgument | tonic::Code::NotFound => IoStatus::InvalidArgument,
        _ => IoStatus::Unavailable,
    }
}

fn info_response(info: StoreInfo) -> InfoResponse {
    InfoResponse {
        size_bytes: info.size_bytes,
        block_size: BLOCK_SIZE as u32,
        revision_counter: info.revision,
        highest_epoch: info.highest_epoch,
        clean_at_open: info.clean_at_open,
        format_version: crate::format::FORMAT_VERSION,
        capacity_bytes: info.capacity_bytes,
        used_bytes: info.used_bytes,
        layer_count: info.layer_count,
        store: info.location,
        store_id: info.store_id,
        stamp_epoch: info.stamp.epoch,
        stamp_sequence: info.stamp.sequence,
    }
}

pub fn bad_block(b: crate::store::BadBlock) -> BadBlock {
    BadBlock { layer: b.layer, offset: b.offset }
}

fn snapshot_message(s: SnapshotInfo) -> Snapshot {
    Snapshot {
        name: s.name,
        created_unix_ms: s.created_unix_ms,
        allocated_bytes: s.allocated_bytes,
        size_bytes: s.size_bytes,
    }
}

#[tonic::async_trait]
impl Replica for ReplicaService {
    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        Ok(Response::new(info_response(self.store.info())))
    }

    async fn set_epoch(&self, request: Request<SetEpochRequest>) -> Result<Response<InfoResponse>, Status> {
        self.store.raise_epoch(request.into_inner().epoch).await.map_err(status)?;
        Ok(Response::new(info_response(self.store.info())))
    }

    async fn withdraw_stamp(&self, request: Request<WithdrawStampRequest>) -> Result<Response<InfoResponse>, Status> {
        let epoch = request.into_inner().epoch;
        self.store.flush_stamped(epoch, Some(FlushStamp::NONE)).await.map_err(status)?;
        Ok(Response::new(info_response(self.store.info())))
    }

    async fn snapshot_create(&self, request: Request<SnapshotCreateRequest>) -> Result<Response<Snapshot>, Status> {
        let req = request.into_inner();
        let snap = self.store.snapshot_create(req.epoch, &req.name).await.map_err(status)?;
        Ok(Response::new(snapshot_message(snap)))
    }

    async fn snapshot_list(&self, _: Request<SnapshotListRequest>) -> Result<Response<SnapshotListResponse>, Status> {
        Ok(Response::new(self.list()))
    }

    async fn snapshot_delete(
        &self,
        request: Request<SnapshotDeleteRequest>,
    ) -> Result<Response<SnapshotListResponse>, Status> {
        let req = request.into_inner();
        self.store.snapshot_delete(req.epoch, &req.name).await.map_err(status)?;
        Ok(Response::new(self.list()))
    }

    async fn snapshot_revert(
        &self,
        request: Request<SnapshotRevertRequest>,
    ) -> Result<Response<SnapshotListResponse>, Status> {
        let req = request.into_inner();
        self.store.snapshot_revert(req.epoch, &req.name).await.map_err(status)?;
        Ok(Response::new(self.list()))
    }

    async fn expand(&self, request: Request<ExpandRequest>) -> Result<Response<InfoResponse>, Status> {
        let req = request.into_inner();
        self.store.expand(req.epoch, req.size_bytes).await.map_err(status)?;
        Ok(Response::new(info_response(self.store.info())))
    }

    async fn extents(&self, request: Request<ExtentsRequest>) -> Result<Response<ExtentsResponse>, Status> {
        let r = request.into_inner();
        let extents =
            if r.merged { self.store.allocation(r.offset, r.length).await } else { self.store.extents(&r.layer) }
                .map_err(status)?;
        Ok(Response::new(ExtentsResponse {
            extents: extents.into_iter().map(|e| Extent { offset: e.offset, length: e.length, zero: e.zero }).collect(),
        }))
    }

    async fn checksums(&self, request: Request<ChecksumsRequest>) -> Result<Response<ChecksumsResponse>, Status> {
        let r = request.into_inner();
        let crc32 = self.store.checksums(&r.layer, r.merged, r.offset, r.length, r.chunk_size).await.map_err(status)?;
        Ok(Response::new(ChecksumsResponse { crc32 }))
    }

    async fn read_layer(&self, request: Request<ReadLayerRequest>) -> Result<Response<ReadLayerResponse>, Status> {
        let r = request.into_inner();
        if r.length > MAX_MESSAGE_BYTES as u64 / 2 {
            return Err(Status::invalid_argument(format!("read of {} bytes is larger than one message", r.length)));
        }
        let (data, states) = if r.merged {
            let data = self.store.read_snapshot(&r.layer, r.offset, r.length).await.map_err(status)?;
            (data, Vec::new())
        } else {
            self.store.read_layer(&r.layer, r.offset, r.length).await.map_err(status)?
        };
        Ok(Response::new(ReadLayerResponse {
            data: Bytes::from_owner(data),
            block_state: states.into_iter().map(|s| s as u8).collect::<Vec<u8>>().into(),
        }))
    }

    async fn layer_insert(
        &self,
        request: Request<LayerInsertRequest>,
    ) -> Result<Response<SnapshotListResponse>, Status> {
        self.layer_insert_impl(request.into_inner()).await.map(Response::new)
    }

    async fn scrub(&self, request: Request<ScrubRequest>) -> Result<Response<ScrubResponse>, Status> {
        let r = request.into_inner();
        let report = self.store.scrub(r.offset, r.length).await.map_err(status)?;
        Ok(Response::new(ScrubResponse {
            bad: report.bad.into_iter().map(bad_block).collect(),
            checked_bytes: report.checked_bytes,
        }))
    }

    async fn copy_from(&self, request: Request<CopyFromRequest>) -> Result<Response<CopyFromResponse>, Status> {
        self.copy_from_impl(request.into_inner()).await.map(Response::new)
    }

    async fn write_layer(&self, request: Request<WriteLayerRequest>) -> Result<Response<WriteLayerResponse>, Status> {
        let r = request.into_inner();
        if r.zero {
            self.store.zero_layer(r.epoch, &r.layer, r.offset, r.length).await.map_err(status)?;
        } else {
            self.store.write_layer(r.epoch, &r.layer, r.offset, &r.data).await.map_err(status)?;
        }
        Ok(Response::new(WriteLayerResponse {}))
    }
}

impl ReplicaService {
    /// The client for the replica at `address`, connecting lazily.
    fn peer(&self, address: &str, timeout: Duration) -> Result<ReplicaClient<Channel>, Status> {
        let mut peers = self.peers.lock().expect("peers");
        if let Some(client) = peers.get(address) {
            return Ok(client.clone());
        }
        let endpoint = ironhorn_proto::channel::replica_endpoint(address, timeout)
            .map_err(|e| Status::invalid_argument(format!("source replica address {address:?}: {e}")))?;
        let (channel, _) = ironhorn_proto::local::connect_lazy(endpoint, address, self.local_sockets.as_deref());
        let client = ReplicaClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        peers.insert(address.to_string(), client.clone());
        Ok(client)
    }

    async fn copy_from_impl(&self, r: CopyFromRequest) -> Result<CopyFromResponse, Status> {
        if r.length == 0 || r.length > MAX_MESSAGE_BYTES as u64 / 2 {
            return Err(Status::invalid_argument(format!(
                "copy of {} bytes: must be more than 0 and fit one message",
                r.length
            )));
        }
        // A fenced or unknown target learns so before the source reads.
        self.store.check_layer_write(r.epoch, &r.layer, r.offset, r.length).map_err(status)?;
        let timeout = match r.timeout_ms {
            0 => COPY_SOURCE_TIMEOUT,
            ms => Duration::from_millis(ms.into()),
        };
        let mut client = self.peer(&r.source, timeout)?;
        let read = ReadLayerRequest { layer: r.layer.clone(), offset: r.offset, length: r.length, merged: true };
        let source_failed = |status: IoStatus, message: String| CopyFromResponse {
            copied_bytes: 0,
            source_status: status as i32,
            source_message: format!("source replica {}: {message}", r.source),
        };
        let data = match tokio::time::timeout(timeout, client.read_layer(read)).await {
            Err(_) => return Ok(source_failed(IoStatus::Unavailable, format!("no answer within {timeout:?}"))),
            Ok(Err(e)) => return Ok(source_failed(source_status(&e), e.message().to_string())),
            Ok(Ok(response)) => response.into_inner().data,
        };
        if data.len() as u64 != r.length {
            let message = format!("{} bytes read, {} asked", data.len(), r.length);
            return Ok(source_failed(IoStatus::IoError, message));
        }
        let mut copied = 0;
        for run in ironhorn_proto::blocks::runs(&data, BLOCK_SIZE as usize) {
            let at = r.offset + run.start as u64;
            if run.zero {
                self.store.zero_layer(r.epoch, &r.layer, at, run.len as u64).await.map_err(status)?;
            } else {
                self.store
                    .write_layer(r.epoch, &r.layer, at, &data[run.start..run.start + run.len])
                    .await
                    .map_err(status)?;
                copied += run.len as u64;
            }
        }
        Ok(CopyFromResponse { copied_bytes: copied, source_status: IoStatus::Ok as i32, source_message: String::new() })
    }

    async fn layer_insert_impl(&self, r: LayerInsertRequest) -> Result<SnapshotListResponse, Status> {
        self.store.layer_insert(r.epoch, &r.name, &r.below).await.map_err(status)?;
        Ok(self.list())
    }

    fn list(&self) -> SnapshotListResponse {
        SnapshotListResponse { snapshots: self.store.snapshot_list().into_iter().map(snapshot_message).collect() }
    }
}
