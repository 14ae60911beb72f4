//! A [`Cluster`] of healthy, empty nodes: every instance manager answers,
//! every disk has 100 GiB free, created instances run at a made-up address
//! (nothing listens there). It counts the calls that change something, so a
//! test can tell which manager acted.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ironhorn_manager::cluster::{Cluster, SnapshotOp};
use ironhorn_proto::instance as pb;

#[derive(Clone, Default)]
pub struct HealthyNodes {
    changes: Arc<AtomicUsize>,
}

impl HealthyNodes {
    /// Instances created or deleted, stores deleted, engine changes.
    pub fn changes(&self) -> usize {
        self.changes.load(Ordering::SeqCst)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }
}

const UNREACHABLE: &str = "no process runs in this test";

impl Cluster for HealthyNodes {
    async fn instances(&self, _: &str) -> Result<Vec<pb::Instance>, String> {
        Ok(vec![])
    }
    async fn create_instance(&self, _: &str, request: pb::CreateRequest) -> Result<pb::Instance, String> {
        self.changed();
        Err(format!("{}: {UNREACHABLE}", request.name))
    }
    async fn delete_instance(&self, _: &str, _: &str, _: bool) -> Result<(), String> {
        self.changed();
        Ok(())
    }
    async fn disk_status(&self, _: &str, _: &str) -> Result<pb::DiskStatusResponse, String> {
        Ok(pb::DiskStatusResponse { total_bytes: 100 << 30, free_bytes: 100 << 30, stores: vec![], stores_bytes: 0 })
    }
    async fn delete_store(&self, _: &str, _: &str) -> Result<(), String> {
        self.changed();
        Ok(())
    }
    async fn engine_status(&self, _: &str) -> Result<ironhorn_proto::engine::StatusResponse, String> {
        Err(UNREACHABLE.into())
    }
    async fn engine_replica_add(&self, _: &str, _: &str) -> Result<(), String> {
        self.changed();
        Err(UNREACHABLE.into())
    }
    async fn engine_replica_remove(&self, _: &str, _: &str) -> Result<(), String> {
        self.changed();
        Err(UNREACHABLE.into())
    }
    async fn engine_expand(&self, _: &str, _: u64) -> Result<(), String> {
        self.changed();
        Err(UNREACHABLE.into())
    }
    async fn replica_expand(&self, _: &str, _: u64, _: u64) -> Result<(), String> {
        self.changed();
        Err(UNREACHABLE.into())
    }
    async fn replica_snapshot(
        &self,
        _: &str,
        _: SnapshotOp,
        _: u64,
    ) -> Result<Vec<ironhorn_proto::replica::Snapshot>, String> {
        Err(UNREACHABLE.into())
    }
    async fn replica_info(&self, _: &str) -> Result<ironhorn_proto::replica::InfoResponse, String> {
        Err(UNREACHABLE.into())
    }
    async fn engine_snapshot(&self, _: &str, _: SnapshotOp) -> Result<Vec<ironhorn_proto::engine::Snapshot>, String> {
        Err(UNREACHABLE.into())
    }
}
