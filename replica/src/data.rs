//! The replica's data stream (see `ironhorn_proto::data`): block requests
//! applied to the [`Store`] in stream order, answered as they complete.
//! Store errors map to data-stream statuses here and only here.

use std::sync::Arc;

use bytes::Bytes;
use ironhorn_proto::data::frame;
use ironhorn_proto::data::wire::{self, FrameReader, Reader, Writer};
use ironhorn_proto::replica::{IoOp, IoRequest, IoResponse, IoStatus};
use tokio::sync::{Semaphore, mpsc};

use crate::format::FlushStamp;
use crate::store::{StartedWrite, Store, StoreError};

/// Requests of one stream being worked on at once; more wait in the socket.
const IN_FLIGHT_PER_STREAM: usize = 256;
/// A client silent this long is gone (its engine died, or the network cut
/// it off without a reset): its connection is closed, not kept for ever.
/// Clients send a keep-alive every `ironhorn_proto::data::KEEPALIVE`.
const CLIENT_SILENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Serves one data-stream connection on tasks of its own, until the client
/// closes it or sends something malformed.
pub fn serve(store: Arc<Store>, r: Reader, w: Writer) {
    // Unbounded, but never holds more than IN_FLIGHT_PER_STREAM: a permit
    // is held until its response is queued.
    let (tx, rx) = mpsc::unbounded_channel::<IoResponse>();
    tokio::spawn(async move {
        if let Err(e) = wire::send_frames(rx, w, None).await {
            tracing::debug!(error = %e, "data stream: answers could not be sent");
        }
    });
    tokio::spawn(async move {
        let limit = Arc::new(Semaphore::new(IN_FLIGHT_PER_STREAM));
        // Requests start strictly one after another, in stream order; while
        // one waits to start (for a permit, for room in the store), the
        // socket is not read, and the client's writes back up.
        let mut requests = FrameReader::new(r, frame::take_request, Some(CLIENT_SILENCE));
        loop {
            let req = match requests.next().await {
                Ok(Some(req)) => req,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "data stream ended");
                    break;
                }
            };
            if req.id == frame::KEEPALIVE_ID {
                let _ = tx.send(IoResponse { id: frame::KEEPALIVE_ID, ..Default::default() });
                continue;
            }
            let Ok(permit) = limit.clone().acquire_owned().await else { return };
            let ordered = order(&store, req).await;
            let store = store.clone();
            let tx = tx.clone();
            let paced = match &ordered {
                Ordered::Write(req, _) | Ordered::Other(req) => req.paced,
                Ordered::Done(_) => false,
            };
            let serve = async move {
                let response = complete(&store, ordered).await;
                let _ = tx.send(response);
                drop(permit);
            };
            // A request the engine held to the volume's I/O limit is not
            // polled for (see `busy_poll::keep_polling`).
            if paced {
                tokio::spawn(serve);
            } else {
                ironhorn_proto::busy_poll::spawn_request(serve);
            }
        }
    });
}

fn io_status(e: &StoreError) -> IoStatus {
    match e {
        StoreError::InvalidArgument(_)
        | StoreError::SizeMismatch { .. }
        | StoreError::NotFound(_)
        | StoreError::AlreadyExists(_) => IoStatus::InvalidArgument,
        StoreError::Fenced { .. } => IoStatus::Fenced,
        StoreError::OutOfSpace { .. } | StoreError::DeviceFull { .. } => IoStatus::OutOfSpace,
        StoreError::Checksum { .. } => IoStatus::DataLoss,
        StoreError::Io { .. } | StoreError::Corrupt(_) => IoStatus::IoError,
        StoreError::Failed(_) | StoreError::NotAStore(_) => IoStatus::Unavailable,
    }
}

fn respond(id: u64, outcome: Result<Bytes, StoreError>) -> IoResponse {
    match outcome {
        Ok(data) => IoResponse { id, status: IoStatus::Ok as i32, message: String::new(), data },
        Err(e) => {
            tracing::debug!(id, error = %e, "I/O request failed");
            IoResponse { id, status: io_status(&e) as i32, message: e.to_string(), data: Bytes::new() }
        }
    }
}

/// The part of a data request that must run in stream order. Writes are
/// placed in the write order and trims applied here, so overlapping requests
/// resolve the same way on every replica that sees the same stream.
enum Ordered {
    Done(IoResponse),
    Write(IoRequest, StartedWrite),
    Other(IoRequest),
}

async fn order(store: &Store, req: IoRequest) -> Ordered {
    let id = req.id;
    match IoOp::try_from(req.op) {
        Ok(IoOp::Write) => {
            if req.length != 0 && req.length != req.data.len() as u64 {
                let e = StoreError::InvalidArgument(format!(
                    "write length {} does not match {} data bytes",
                    req.length,
                    req.data.len()
                ));
                return Ordered::Done(respond(id, Err(e)));
            }
            match store.start_write(req.epoch, "", req.offset, req.data.len() as u64).await {
                Ok(started) => Ordered::Write(req, started),
                Err(e) => Ordered::Done(respond(id, Err(e))),
            }
        }
        Ok(IoOp::Trim) | Ok(IoOp::WriteZeroes) => match store.trim(req.epoch, req.offset, req.length).await {
            Ok(()) if req.fua => Ordered::Other(IoRequest { op: IoOp::Flush as i32, ..req }),
            outcome => Ordered::Done(respond(id, outcome.map(|()| Bytes::new()))),
        },
        Ok(IoOp::Read) | Ok(IoOp::Flush) => Ordered::Other(req),
        Ok(IoOp::Unspecified) | Err(_) => {
            Ordered::Done(respond(id, Err(StoreError::InvalidArgument(format!("unknown I/O op {}", req.op)))))
        }
    }
}

/// The rest of a data request, run concurrently with others.
async fn complete(store: &Store, ordered: Ordered) -> IoResponse {
    match ordered {
        Ordered::Done(response) => response,
        Ordered::Write(req, started) => {
            let mut outcome = store.finish_write(started, &req.data).await;
            if outcome.is_ok() && req.fua {
                outcome = store.flush().await;
            }
            respond(req.id, outcome.map(|()| Bytes::new()))
        }
        Ordered::Other(req) => {
            let outcome = if req.op == IoOp::Read as i32 {
                store.read(req.epoch, req.offset, req.length).await.map(Bytes::from_owner)
            } else {
                let stamp =
                    (req.flush_sequence != 0).then_some(FlushStamp { epoch: req.epoch, sequence: req.flush_sequence });
                store.flush_stamped(req.epoch, stamp).await.map(|()| Bytes::new())
            };
            respond(req.id, outcome)
        }
    }
}
