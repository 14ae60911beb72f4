//! The replica data stream: block requests from an engine (or a copy) to a
//! replica, and their answers, as plain frames on a socket of their own.
//!
//! It replaced a bidirectional gRPC stream. That stream paid, per batch,
//! for protobuf encoding, HTTP/2 framing and flow control, and a hop
//! through the HTTP/2 connection task on each side; at 4 KiB random writes
//! that was a tenth of the engine's and of each replica's CPU (ad hoc
//! `perf record`, docs/benchmarks.md), and CPU per request is what bounds
//! 3-replica IOPS on a small node. The unary calls (info, snapshots,
//! rebuild) stay gRPC.
//!
//! The stream shares the replica's port: a client opens with [`MAGIC`],
//! which HTTP/2's preface never starts with, and the replica routes the
//! connection by its first eight bytes ([`accept`]). Requests are
//! pipelined: each carries an id, answers come in any order. Batching is
//! the writer's: every frame queued when a write ends leaves in the next
//! one. An idle client sends a keep-alive every [`KEEPALIVE`], so a peer
//! that stops answering (frozen, cut off by the network) is found within
//! that plus the client's timeout even with no I/O.

pub mod accept;
pub mod client;
pub mod frame;
pub mod wire;

pub use client::Client;
pub use wire::{MAGIC, StreamError};

/// How long a client's stream may be idle before it sends a keep-alive.
pub const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(5);
