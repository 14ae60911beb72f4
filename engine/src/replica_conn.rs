//! A connection from the engine to one replica: the pipelined `Io` stream
//! (requests tagged with ids, answered in any order) plus the unary client.
//!
//! Requests are queued on an unbounded channel, so the engine can enqueue
//! one request to every replica under one short lock and keep the same
//! order on every stream; the engine bounds how many are in flight. Each
//! stream message carries every request queued when the transport asked
//! for the next one (see `ironhorn_proto::batch`). When the
//! stream breaks, every waiting request fails at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ironhorn_proto::batch::Batches;
use ironhorn_proto::replica::replica_client::ReplicaClient;
use ironhorn_proto::replica::{IoRequest, IoRequests, IoResponse, IoStatus};
use tokio::sync::{mpsc, oneshot};
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

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<IoResponse>>>>;

pub struct ReplicaConn {
    pub address: String,
    /// TCP, or the node's local socket for a replica on this node.
    pub transport: ironhorn_proto::local::Transport,
    client: ReplicaClient<Channel>,
    tx: mpsc::UnboundedSender<IoRequest>,
    waiting: Waiters,
    next_id: AtomicU64,
    broken: Arc<AtomicBool>,
    /// Becomes true when the data stream ends (the replica died, its
    /// connection was reset): watchers learn at once, not at the next request.
    closed: tokio::sync::watch::Receiver<bool>,
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
    /// Connects (bounded by `timeout`) and opens the data stream; over the
    /// replica's socket in `local_sockets` when it has one there.
    pub async fn connect(
        address: &str,
        timeout: Duration,
        local_sockets: Option<&std::path::Path>,
    ) -> Result<ReplicaConn, ReplicaError> {
        let endpoint = ironhorn_proto::batch::replica_endpoint(address, timeout)
            .map_err(|e| ReplicaError::Invalid(format!("replica address {address:?}: {e}")))?;
        let (channel, transport) =
            tokio::time::timeout(timeout, ironhorn_proto::local::connect(endpoint, address, local_sockets))
                .await
                .map_err(|_| ReplicaError::Failed(format!("connect to replica {address}: timed out")))?
                .map_err(|e| ReplicaError::Failed(format!("connect to replica {address}: {e}")))?;
        let mut client = ReplicaClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::unbounded_channel::<IoRequest>();
        let requests = Batches::new(rx, |r: &IoRequest| r.data.len(), |requests| IoRequests { requests });
        let mut responses = tokio::time::timeout(timeout, client.io(requests))
            .await
            .map_err(|_| ReplicaError::Failed(format!("open data stream to {address}: timed out")))?
            .map_err(|e| ReplicaError::Failed(format!("open data stream to {address}: {e}")))?
            .into_inner();
        let waiting: Waiters = Default::default();
        let broken = Arc::new(AtomicBool::new(false));
        let (w, b, a) = (waiting.clone(), broken.clone(), address.to_string());
        let (closed_tx, closed) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                match responses.message().await {
                    Ok(Some(batch)) => {
                        let mut waiting = w.lock().expect("waiters");
                        for resp in batch.responses {
                            if let Some(tx) = waiting.remove(&resp.id) {
                                let _ = tx.send(resp);
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(replica = %a, error = %e, "data stream failed");
                        break;
                    }
                }
            }
            b.store(true, Ordering::SeqCst);
            // Dropping the senders fails every request still waiting.
            w.lock().expect("waiters").clear();
            let _ = closed_tx.send(true);
        });
        if transport == ironhorn_proto::local::Transport::Local {
            tracing::info!(replica = address, "connected over this node's local socket");
        }
        Ok(ReplicaConn {
            address: address.to_string(),
            transport,
            client,
            tx,
            waiting,
            next_id: AtomicU64::new(1),
            broken,
            closed,
            timeout,
        })
    }

    /// Resolves when the data stream has ended. Holds nothing of the
    /// connection, so a watcher does not keep it open.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut closed = self.closed.clone();
        async move {
            let _ = closed.wait_for(|c| *c).await;
        }
    }

    pub fn client(&self) -> ReplicaClient<Channel> {
        self.client.clone()
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Queues a request on the stream without waiting (its id is set
    /// here); the receiver yields the response. Never blocks, so callers
    /// may hold a lock around it.
    pub fn enqueue(&self, mut req: IoRequest) -> Pending {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if self.broken.load(Ordering::SeqCst) {
            return Pending { rx, timeout: self.timeout };
        }
        self.waiting.lock().expect("waiters").insert(id, tx);
        req.id = id;
        if self.tx.send(req).is_err() {
            self.waiting.lock().expect("waiters").remove(&id);
        }
        Pending { rx, timeout: self.timeout }
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
