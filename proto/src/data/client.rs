//! A pipelined data-stream client: many requests in flight, answers matched
//! to them by id. Requests queue on an unbounded channel, so a caller can
//! queue one request to every replica under one short lock and keep the
//! same order on every stream. When the stream breaks, every waiting
//! request fails at once, and [`Client::closed`] resolves.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::KEEPALIVE;
use super::accept::Conn;
use super::frame::{self, KEEPALIVE_ID};
use super::wire::{self, FrameReader, StreamError};
use crate::local::{Transport, existing_socket};
use crate::replica::{IoRequest, IoResponse};

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<IoResponse>>>>;

/// Why a client could not connect.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect to replica {address}: timed out after {timeout:?}")]
    TimedOut { address: String, timeout: Duration },
    #[error("connect to replica {address}: {source}")]
    Connect { address: String, source: std::io::Error },
    #[error("open data stream to {address}: {source}")]
    Stream { address: String, source: StreamError },
}

pub struct Client {
    pub transport: Transport,
    tx: mpsc::UnboundedSender<IoRequest>,
    waiting: Waiters,
    next_id: AtomicU64,
    closed: watch::Receiver<bool>,
}

/// Dials `address`: over `dir`'s socket for it when one answers, else TCP.
async fn dial(address: &str, dir: Option<&Path>) -> std::io::Result<(Conn, Transport)> {
    if let Some(path) = existing_socket(dir, address) {
        match tokio::net::UnixStream::connect(&path).await {
            Ok(s) => return Ok((Conn::Unix(s), Transport::Local)),
            Err(e) => tracing::debug!(path = %path.display(), error = %e, "local socket refused; using TCP"),
        }
    }
    let s = tokio::net::TcpStream::connect(address).await?;
    s.set_nodelay(true)?;
    Ok((Conn::Tcp(s), Transport::Tcp))
}

impl Client {
    /// Connects to the replica at TCP `address` (over `local_dir`'s socket
    /// for it when there is one) and opens the stream, all within
    /// `timeout`. A peer silent for [`KEEPALIVE`] + `timeout` is given up.
    pub async fn connect(address: &str, local_dir: Option<&Path>, timeout: Duration) -> Result<Client, ConnectError> {
        let opened = tokio::time::timeout(timeout, async {
            let (conn, transport) = dial(address, local_dir)
                .await
                .map_err(|source| ConnectError::Connect { address: address.into(), source })?;
            let (mut r, mut w) = conn.into_halves();
            wire::hello(&mut r, &mut w)
                .await
                .map_err(|source| ConnectError::Stream { address: address.into(), source })?;
            Ok::<_, ConnectError>((r, w, transport))
        })
        .await
        .map_err(|_| ConnectError::TimedOut { address: address.into(), timeout })?;
        let (r, w, transport) = opened?;

        let (tx, rx) = mpsc::unbounded_channel::<IoRequest>();
        let waiting: Waiters = Default::default();
        let (closed_tx, closed) = watch::channel(false);
        let keepalive = || IoRequest { id: KEEPALIVE_ID, ..Default::default() };
        let (w2, a2) = (waiting.clone(), address.to_string());
        tokio::spawn(async move {
            let sending = wire::send_frames(rx, w, Some((KEEPALIVE, keepalive)));
            let w = w2.clone();
            let receiving = async move {
                let mut reader = FrameReader::new(r, frame::take_response, Some(KEEPALIVE + timeout));
                while let Some(resp) = reader.next().await? {
                    if resp.id == KEEPALIVE_ID {
                        continue;
                    }
                    if let Some(tx) = w.lock().expect("waiters").remove(&resp.id) {
                        let _ = tx.send(resp);
                    }
                }
                Ok(())
            };
            // Either side ending ends the stream: a write error, the peer
            // closing, a malformed answer, silence, or the client dropped.
            let ended = tokio::select! {
                r = sending => r,
                r = receiving => r,
            };
            match ended {
                Ok(()) => tracing::debug!(replica = %a2, "data stream closed"),
                Err(e) => tracing::warn!(replica = %a2, error = %e, "data stream failed"),
            }
            // Closed first, then the waiters dropped (which fails every
            // request still waiting): `enqueue` relies on that order.
            closed_tx.send_replace(true);
            w2.lock().expect("waiters").clear();
        });
        Ok(Client { transport, tx, waiting, next_id: AtomicU64::new(1), closed })
    }

    /// Queues `req` (its id is set here) without waiting; the receiver
    /// yields the answer, or an error once the stream has broken. Never
    /// blocks, so callers may hold a lock around it.
    pub fn enqueue(&self, mut req: IoRequest) -> oneshot::Receiver<IoResponse> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("waiters").insert(id, tx);
        // The stream task marks the stream closed before it empties the
        // map: a request put in after that emptying is taken out here.
        req.id = id;
        if *self.closed.borrow() || self.tx.send(req).is_err() {
            self.waiting.lock().expect("waiters").remove(&id);
        }
        rx
    }

    /// Resolves when the stream has ended (the replica died, its connection
    /// was reset, it went silent). Holds nothing of the client, so a
    /// watcher does not keep it open.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut closed = self.closed.clone();
        async move {
            let _ = closed.wait_for(|c| *c).await;
        }
    }
}
