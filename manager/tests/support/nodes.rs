//! A [`Cluster`] of healthy nodes: every instance manager answers, every
//! disk has 100 GiB free, created instances are listed as running at a
//! made-up address (nothing listens there, so engines never answer). It
//! counts the calls that change something, so a test can tell which
//! manager acted.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ironhorn_manager::cluster::{Cluster, SnapshotOp};
use ironhorn_proto::instance as pb;

#[derive(Clone, Default)]
pub struct HealthyNodes {
    changes: Arc<AtomicUsize>,
    /// Instance manager address → the instances it runs.
    running: Arc<Mutex<HashMap<String, Vec<pb::Instance>>>>,
    /// Sizes engines were asked to grow to, in order.
    expansions: Arc<Mutex<Vec<u64>>>,
}

impl HealthyNodes {
    /// Instances created or deleted, stores deleted, engine changes.
    pub fn changes(&self) -> usize {
        self.changes.load(Ordering::SeqCst)
    }

    /// Reports the instance `name` in `state` from now on (as its process
    /// failing would); false when no such instance runs.
    pub fn set_state(&self, name: &str, state: pb::InstanceState) -> bool {
        let mut running = self.running.lock().unwrap();
        let found = running.values_mut().flatten().find(|i| i.name == name);
        found.map(|i| i.state = state as i32).is_some()
    }

    /// The sizes engines were asked to grow to so far.
    pub fn expansions(&self) -> Vec<u64> {
        self.expansions.lock().unwrap().clone()
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }
}

const UNREACHABLE: &str = "no process runs in this test";

impl Cluster for HealthyNodes {
    async fn instances(&self, im: &str) -> Result<Vec<pb::Instance>, String> {
        Ok(self.running.lock().unwrap().get(im).cloned().unwrap_or_default())
    }
    async fn create_instance(&self, im: &str, request: pb::CreateRequest) -> Result<pb::Instance, String> {
        self.changed();
        let (kind, spec) = match request.spec {
            Some(pb::create_request::Spec::Engine(e)) => (pb::InstanceKind::Engine, pb::instance::Spec::Engine(e)),
            Some(pb::create_request::Spec::Replica(r)) => (pb::InstanceKind::Replica, pb::instance::Spec::Replica(r)),
            None => return Err("no spec".into()),
        };
        let instance = pb::Instance {
            name: request.name.clone(),
            kind: kind as i32,
            state: pb::InstanceState::Running as i32,
            address: format!("{}.invalid:1", request.name),
            spec: Some(spec),
            ..Default::default()
        };
        let mut running = self.running.lock().unwrap();
        let list = running.entry(im.to_string()).or_default();
        list.retain(|i| i.name != request.name);
        list.push(instance.clone());
        Ok(instance)
    }
    async fn delete_instance(&self, im: &str, name: &str, _: bool) -> Result<(), String> {
        self.changed();
        if let Some(list) = self.running.lock().unwrap().get_mut(im) {
            list.retain(|i| i.name != name);
        }
        Ok(())
    }
    async fn disk_status(&self, _: &str, _: &str) -> Result<pb::DiskStatusResponse, String> {
        Ok(pb::DiskStatusResponse { total_bytes: 100 << 30, free_bytes: 100 << 30, stores: vec![], stores_bytes: 0 })
    }
    async fn delete_store(&self, _: &str, _: &str) -> Result<(), String> {
        self.changed();
        Ok(())
    }
    /// A running engine reports its replicas RW, or ERR where the replica's
    /// instance is in error.
    async fn engine_status(&self, address: &str) -> Result<ironhorn_proto::engine::StatusResponse, String> {
        let running = self.running.lock().unwrap();
        let all: Vec<&pb::Instance> = running.values().flatten().collect();
        let engine = all
            .iter()
            .find(|i| i.address == address && i.state == pb::InstanceState::Running as i32)
            .ok_or_else(|| format!("{address}: {UNREACHABLE}"))?;
        let Some(pb::instance::Spec::Engine(spec)) = &engine.spec else { return Err("not an engine".into()) };
        let replicas = spec
            .replicas
            .iter()
            .map(|a| {
                let failed = all.iter().any(|i| i.address == *a && i.state == pb::InstanceState::Error as i32);
                ironhorn_proto::engine::ReplicaStatus {
                    address: a.clone(),
                    mode: if failed { "ERR" } else { "RW" }.into(),
                    error: String::new(),
                    transport: "tcp".into(),
                }
            })
            .collect();
        Ok(ironhorn_proto::engine::StatusResponse {
            volume: spec.volume.clone(),
            size_bytes: spec.size_bytes,
            epoch: spec.epoch,
            replicas,
            ..Default::default()
        })
    }
    async fn engine_replica_add(&self, _: &str, _: &str) -> Result<(), String> {
        self.changed();
        Err(UNREACHABLE.into())
    }
    async fn engine_replica_remove(&self, _: &str, _: &str) -> Result<(), String> {
        self.changed();
        Err(UNREACHABLE.into())
    }
    async fn engine_scrub(&self, _: &str) -> Result<(), String> {
        self.changed();
        Err(UNREACHABLE.into())
    }
    async fn engine_set_rebuild_rate(&self, _: &str, _: u64) -> Result<(), String> {
        Ok(())
    }

    async fn engine_set_limits(&self, _: &str, _: ironhorn_proto::engine::IoLimits) -> Result<(), String> {
        self.changed();
        Err(UNREACHABLE.into())
    }
    async fn engine_expand(&self, _: &str, size: u64) -> Result<(), String> {
        self.changed();
        self.expansions.lock().unwrap().push(size);
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
    /// Lists no snapshot; takes and deletes none.
    async fn engine_snapshot(&self, _: &str, op: SnapshotOp) -> Result<Vec<ironhorn_proto::engine::Snapshot>, String> {
        match op {
            SnapshotOp::List => Ok(vec![]),
            _ => Err(format!("{op:?}: {UNREACHABLE}")),
        }
    }
}
