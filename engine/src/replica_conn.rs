//! A connection from the engine to one replica: the pipelined data stream
//! (`ironhorn_proto::data`) for block I/O plus the gRPC client for the rest.
//!
//! Requests are queued without waiting, so the engine can enqueue one
//! request to every replica under one short lock and keep the same order
//! on every stream; the engine bounds how many are in flight.

use std::time::Duration;

use bytes::Bytes;
use ironhorn_proto::replica::replica_client::ReplicaClient;
use ironhorn_proto::replica::{IoRequest, IoResponse, IoStatus};
use tokio::sync::oneshot;
use tonic::transport::Channel;

const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// How one replica request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaError {
    /// The replica refused the request itself (bad range, unknown name).
    Invalid(String),
    /// The replica has seen a newer engine epoch: this engine is stale.
    Fenced(String),
    /// The replica's store has no room for the request. Its data is intact
    /// and it still serves reads.
    NoSpace(String),
    /// A block the replica read back failed its checksum: that copy is bad,
    /// the replica is otherwise fine (the block is repaired in place).
    Corrupt(String),
    /// Anything that makes the replica unusable: I/O error, no space,
    /// timeout, broken connection.
    Failed(String),
}

impl std::fmt::Display for ReplicaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(m) => write!(f, "invalid request: {m}"),
            Self::Fenced(m) => write!(f, "fenced: {m}"),
            Self::NoSpace(m) | Self::Corrupt(m) => write!(f, "{m}"),
            Self::Failed(m) => write!(f, "{m}"),
        }
    }
}

pub struct ReplicaConn {
    pub address: String,
    /// TCP, or the node's local socket for a replica on this node.
    pub transport: ironhorn_proto::local::Transport,
    client: ReplicaClient<Channel>,
    data: ironhorn_proto::data::Client,
    timeout: Duration,
}

pub fn status_error(status: tonic::Status) -> ReplicaError {
    match status.code() {
        tonic::Code::InvalidArgument | tonic::Code::NotFound | tonic::Code::AlreadyExists => {
            ReplicaError::Invalid(status.message().to_string())
        }
        tonic::Code::FailedPrecondition => ReplicaError::Fenced(status.message().to_string()),
        tonic::Code::ResourceExhausted => ReplicaError::NoSpace(status.message().to_string()),
        tonic::Code::DataLoss => ReplicaError::Corrupt(status.message().to_string()),
        _ => ReplicaError::Failed(format!("{}: {}", status.code(), status.message())),
    }
}

impl ReplicaConn {
    /// Connects (bounded by `timeout`) the data stream and the gRPC
    /// channel; over the replica's socket in `local_sockets` when it has
    /// one there.
    pub async fn connect(
        address: &str,
        timeout: Duration,
        local_sockets: Option<&std::path::Path>,
    ) -> Result<ReplicaConn, ReplicaError> {
        // A malformed address is refused before anything is dialled.
        let endpoint = ironhorn_proto::channel::replica_endpoint(address, timeout)
            .map_err(|e| ReplicaError::Invalid(format!("replica address {address:?}: {e}")))?;
        let data = ironhorn_proto::data::Client::connect(address, local_sockets, timeout)
            .await
            .map_err(|e| ReplicaError::Failed(e.to_string()))?;
        let (channel, _) =
            tokio::time::timeout(timeout, ironhorn_proto::local::connect(endpoint, address, local_sockets))
                .await
                .map_err(|_| ReplicaError::Failed(format!("connect to replica {address}: timed out")))?
                .map_err(|e| ReplicaError::Failed(format!("connect to replica {address}: {e}")))?;
        let client = ReplicaClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let transport = data.transport;
        if transport == ironhorn_proto::local::Transport::Local {
            tracing::info!(replica = address, "connected over this node's local socket");
        }
        Ok(ReplicaConn { address: address.to_string(), transport, client, data, timeout })
    }

    /// Resolves when the data stream has ended (the replica died, its
    /// connection was reset, it stopped answering keep-alives). Holds
    /// nothing of the connection, so a watcher does not keep it open.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.data.closed()
    }

    pub fn client(&self) -> ReplicaClient<Channel> {
        self.client.clone()
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Queues a request on the stream without waiting (its id is set
    /// there); the receiver yields the response. Never blocks, so callers
    /// may hold a lock around it.
    pub fn enqueue(&self, req: IoRequest) -> Pending {
        Pending { rx: self.data.enqueue(req), timeout: self.timeout }
    }
}

/// A queued request's response, bounded by the replica timeout.
pub struct Pending {
    rx: oneshot::Receiver<IoResponse>,
    timeout: Duration,
}

impl Pending {
    pub async fn wait(self) -> Result<Bytes, ReplicaError> {
        let resp = match tokio::time::timeout(self.timeout, self.rx).await {
            Err(_) => return Err(ReplicaError::Failed(format!("no answer within {:?}", self.timeout))),
            Ok(Err(_)) => return Err(ReplicaError::Failed("connection lost".into())),
            Ok(Ok(resp)) => resp,
        };
        match IoStatus::try_from(resp.status) {
            Ok(IoStatus::Ok) => Ok(resp.data),
            Ok(IoStatus::InvalidArgument) => Err(ReplicaError::Invalid(resp.message)),
            Ok(IoStatus::Fenced) => Err(ReplicaError::Fenced(resp.message)),
            Ok(IoStatus::OutOfSpace) => Err(ReplicaError::NoSpace(resp.message)),
            Ok(IoStatus::DataLoss) => Err(ReplicaError::Corrupt(resp.message)),
            _ => Err(ReplicaError::Failed(resp.message)),
        }
    }
}

/// Runs a unary call bounded by `timeout`.
pub async fn unary<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ReplicaError> {
    match tokio::time::timeout(timeout, call).await {
        Err(_) => Err(ReplicaError::Failed(format!("no answer within {timeout:?}"))),
        Ok(Err(status)) => Err(status_error(status)),
        Ok(Ok(resp)) => Ok(resp.into_inner()),
    }
}
