//! What a scenario works with: its own standalone cluster (nodes in network
//! namespaces, replicas with fault injection on), one attached volume, the
//! running workload, and the seeded generator that picks its targets.

use std::time::{Duration, Instant};

use ironhorn_proto::instance::Instance;
use ironhorn_proto::instance::ListRequest;
use ironhorn_proto::instance::instance_manager_client::InstanceManagerClient;
use ironhorn_proto::replica::faults_client::FaultsClient;
use ironhorn_proto::replica::{ArmFaultRequest, ClearFaultsRequest, FaultAction, FaultOp, FaultState};

use super::faults;
use super::relay::Relay;
use super::rng::Rng;
use super::workload::Workload;
use crate::StandaloneCluster;

/// The node the volume is attached on (the workload runs in its namespace).
pub const ENGINE_NODE: &str = "n-1";

/// The replica node whose link a relay scenario delays.
pub const RELAY_NODE: &str = "n-2";

pub struct Ctx {
    pub cluster: StandaloneCluster,
    pub volume: String,
    pub rng: Rng,
    /// How long a fault is held.
    pub duration: Duration,
    pub workload: Workload,
    /// Every replica was killed at once at some point.
    pub crash_all: bool,
    /// The seeded choices the scenario made (targets, gaps, delays), in
    /// order: one seed gives one schedule.
    pub schedule: Vec<String>,
    /// The delay relay in front of `RELAY_NODE` (scenarios with `relay`).
    /// Last, so it outlives the cluster's processes it carries traffic for.
    pub relay: Option<Relay>,
}

/// A replica of the volume as the manager sees it.
#[derive(Clone, Debug)]
pub struct Replica {
    pub name: String,
    pub node: String,
    pub address: String,
}

/// One call to the fault-injection API of the replica at `address`: how
/// many times its armed faults fired.
fn faults_call<F, Fut>(address: &str, call: F) -> Result<u64, String>
where
    F: FnOnce(FaultsClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<FaultState>, tonic::Status>>,
{
    runtime().block_on(async {
        let c = FaultsClient::connect(format!("http://{address}")).await.map_err(|e| e.to_string())?;
        Ok(call(c).await.map_err(|e| e.to_string())?.into_inner().fired)
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

impl Ctx {
    pub fn im_address(&self, node: &str) -> Result<String, String> {
        let nodes = self.cluster.json(&["node", "list"]);
        nodes
            .as_array()
            .and_then(|a| a.iter().find(|n| n["metadata"]["name"] == node))
            .and_then(|n| n["spec"]["instanceManagerAddress"].as_str())
            .map(str::to_string)
            .ok_or_else(|| format!("no node {node}"))
    }

    /// The node's address on the simulated network.
    pub fn node_ip(&self, node: &str) -> Result<String, String> {
        let im = self.im_address(node)?;
        Ok(im.rsplit_once(':').map(|(ip, _)| ip.to_string()).unwrap_or(im))
    }

    /// The manager's address on the simulated network (the bridge's).
    pub fn manager_ip(&self) -> Result<String, String> {
        let ip = self.node_ip(ENGINE_NODE)?;
        let (net, _) = ip.rsplit_once('.').ok_or("not an IPv4 address")?;
        Ok(format!("{net}.1"))
    }

    pub fn instances(&self, node: &str) -> Result<Vec<Instance>, String> {
        let im = self.im_address(node)?;
        runtime()
            .block_on(async {
                let mut c =
                    InstanceManagerClient::connect(format!("http://{im}")).await.map_err(|e| format!("{e:?}"))?;
                Ok(c.list(ListRequest {}).await.map_err(|e| e.to_string())?.into_inner().instances)
            })
            .map_err(|e: String| format!("instances on {node} ({im}): {e}"))
    }

    /// The pid of a running instance `name` on `node`.
    pub fn pid(&self, node: &str, name: &str) -> Result<u32, String> {
        self.instances(node)?
            .into_iter()
            .find(|i| i.name == name && i.pid > 0)
            .map(|i| i.pid)
            .ok_or_else(|| format!("no running instance {name} on {node}"))
    }

    pub fn im_pid(&self, node: &str) -> Result<u32, String> {
        let path = self.cluster.dir.path().join(format!("data/nodes/{node}/im.pid"));
        std::fs::read_to_string(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The node's network namespace (where its instance manager runs).
    pub fn netns(&self, node: &str) -> Result<String, String> {
        faults::netns_of(self.im_pid(node)?)
    }

    pub fn replicas(&self) -> Vec<Replica> {
        self.cluster
            .replicas_of(&self.volume)
            .iter()
            .map(|r| Replica {
                name: r["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                node: r["spec"]["nodeID"].as_str().unwrap_or_default().to_string(),
                address: r["status"]["address"].as_str().unwrap_or_default().to_string(),
            })
            .collect()
    }

    /// Replicas not on the engine's node, in a seeded order.
    pub fn remote_replicas(&mut self) -> Vec<Replica> {
        let mut remote: Vec<Replica> = self.replicas().into_iter().filter(|r| r.node != ENGINE_NODE).collect();
        remote.sort_by(|a, b| a.name.cmp(&b.name));
        self.shuffle(&mut remote);
        remote
    }

    /// Heals every node's namespace and wakes every stopped process of the
    /// cluster (best effort): what a failed scenario leaves behind.
    pub fn lift_all_faults(&self) {
        for node in self.nodes() {
            if let Ok(ns) = self.netns(&node) {
                let _ = faults::heal(&ns);
            }
            let mut pids: Vec<u32> = self.instances(&node).unwrap_or_default().iter().map(|i| i.pid).collect();
            pids.extend(self.im_pid(&node));
            for pid in pids.into_iter().filter(|p| *p > 0) {
                let _ = faults::signal(pid, libc::SIGCONT);
            }
        }
    }

    /// Records one seeded choice of the fault schedule.
    pub fn note(&mut self, choice: String) {
        self.schedule.push(choice);
    }

    /// A seeded pause of `lo..=hi` ms, recorded in the schedule; its length.
    pub fn pause_between(&mut self, lo: u64, hi: u64) -> u64 {
        let ms = self.rng.between(lo, hi);
        self.note(format!("wait {ms} ms"));
        std::thread::sleep(Duration::from_millis(ms));
        ms
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// The first engine object (from the manager's list) that `matches`.
    fn find_engine(&self, matches: impl Fn(&serde_json::Value) -> bool) -> Result<serde_json::Value, String> {
        let text = self.cluster.cli(&["engine", "list", "-o", "json"])?;
        let all: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("engine list: {e}"))?;
        all.as_array().and_then(|a| a.iter().find(|e| matches(e))).cloned().ok_or_else(|| "no such engine".into())
    }

    /// The volume's engine object.
    fn volume_engine(&self) -> Result<serde_json::Value, String> {
        self.find_engine(|e| e["spec"]["volumeName"] == self.volume.as_str())
    }

    /// (engine instance name, pid).
    pub fn engine(&self) -> Result<(String, u32), String> {
        let engine = self.volume_engine()?;
        let name = engine["metadata"]["name"].as_str().ok_or("an engine without a name")?.to_string();
        let node = engine["spec"]["nodeID"].as_str().filter(|n| !n.is_empty()).unwrap_or(ENGINE_NODE);
        let pid = self.pid(node, &name)?;
        Ok((name, pid))
    }

    /// (node, epoch) of the volume's engine as the manager has it.
    pub fn engine_placement(&self) -> Result<(String, u64), String> {
        let e = self.volume_engine()?;
        Ok((e["spec"]["nodeID"].as_str().unwrap_or_default().to_string(), e["spec"]["epoch"].as_u64().unwrap_or(0)))
    }

    /// Engine object `name` as the manager has it.
    fn engine_object(&self, name: &str) -> Result<serde_json::Value, String> {
        self.find_engine(|e| e["metadata"]["name"] == name).map_err(|_| format!("no engine {name}"))
    }

    /// The fencing epoch the manager gave engine `name`.
    pub fn engine_epoch(&self, name: &str) -> Result<u64, String> {
        self.engine_object(name)?["spec"]["epoch"].as_u64().ok_or_else(|| format!("engine {name} has no epoch"))
    }

    /// Replica name → mode (RW, WO, ERR) as the engine reports it.
    pub fn replica_modes(&self) -> Vec<(String, String)> {
        let Ok((name, _)) = self.engine() else { return vec![] };
        let Ok(engine) = self.engine_object(&name) else { return vec![] };
        engine["status"]["replicaModeMap"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
            .unwrap_or_default()
    }

    pub fn nodes(&self) -> Vec<String> {
        (1..=self.cluster.nodes).map(|i| format!("n-{i}")).collect()
    }

    /// Arms a fault in the store of the replica at `address`.
    pub fn arm_fault(
        &self,
        address: &str,
        ops: &[FaultOp],
        action: FaultAction,
        times: u64,
        delay_ms: u64,
    ) -> Result<u64, String> {
        let request = ArmFaultRequest {
            ops: ops.iter().map(|o| *o as i32).collect(),
            action: action as i32,
            skip: 0,
            times,
            delay_ms,
        };
        faults_call(address, |mut c| async move { c.arm(request).await })
    }

    /// Flips one bit in each of `blocks` data blocks of the replica at
    /// `address` (only snapshots' blocks with `sealed_only`); the flipped
    /// blocks as (layer, offset).
    pub fn flip_bits(
        &self,
        address: &str,
        blocks: u32,
        seed: u64,
        sealed_only: bool,
    ) -> Result<Vec<(String, u64)>, String> {
        let request = ironhorn_proto::replica::FlipBitsRequest { blocks, seed, offset: 0, length: 0, sealed_only };
        runtime().block_on(async {
            let mut c = FaultsClient::connect(format!("http://{address}")).await.map_err(|e| e.to_string())?;
            let flipped = c.flip_bits(request).await.map_err(|e| e.message().to_string())?.into_inner().flipped;
            Ok(flipped.into_iter().map(|b| (b.layer, b.offset)).collect())
        })
    }

    /// The bad blocks the replica at `address` finds reading back all of
    /// its data itself (its own scrub, not the engine's).
    pub fn replica_bad_blocks(&self, address: &str) -> Result<usize, String> {
        runtime().block_on(async {
            let mut c = ironhorn_proto::replica::replica_client::ReplicaClient::connect(format!("http://{address}"))
                .await
                .map_err(|e| e.to_string())?;
            let info = c.info(ironhorn_proto::replica::InfoRequest {}).await.map_err(|e| e.to_string())?;
            let request = ironhorn_proto::replica::ScrubRequest { offset: 0, length: info.into_inner().size_bytes };
            Ok(c.scrub(request).await.map_err(|e| e.to_string())?.into_inner().bad.len())
        })
    }

    /// The volume object as the manager has it.
    pub fn volume_object(&self) -> Result<serde_json::Value, String> {
        let text = self.cluster.cli(&["volume", "get", &self.volume, "-o", "json"])?;
        serde_json::from_str(&text).map_err(|e| format!("volume JSON: {e}"))
    }

    /// How many times the faults armed in replica `address` fired.
    pub fn faults_fired(&self, address: &str) -> Result<u64, String> {
        faults_call(address, |mut c| async move { c.state(ClearFaultsRequest {}).await })
    }

    pub fn clear_faults(&self, address: &str) -> Result<(), String> {
        faults_call(address, |mut c| async move { c.clear(ClearFaultsRequest {}).await }).map(drop)
    }

    /// The workload has `n` more writes acknowledged, still running.
    pub fn in_flight(&self, n: u64) -> Result<u64, String> {
        self.workload.wait_acked(n, Duration::from_secs(120))
    }

    /// Holds a fault for the scenario's duration.
    pub fn hold(&self) {
        std::thread::sleep(self.duration);
    }

    pub fn healthy(&self) -> bool {
        let Ok(text) = self.cluster.cli(&["volume", "get", &self.volume, "-o", "json"]) else { return false };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { return false };
        if v["status"]["state"] != "attached" || v["status"]["robustness"] != "healthy" {
            return false;
        }
        // And the engine agrees: every replica of the spec in RW.
        let modes = self.replica_modes();
        let want = v["spec"]["numberOfReplicas"].as_u64().unwrap_or(3) as usize;
        modes.len() == want && modes.iter().all(|(_, m)| m == "RW")
    }

    /// Waits until the fault shows: the volume is not healthy.
    pub fn wait_degraded(&self) -> Result<(), String> {
        self.until(Duration::from_secs(60), "the volume degraded by the fault", |c| !c.healthy())
    }

    pub fn wait_healthy(&self, timeout: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        while !self.healthy() {
            if start.elapsed() > timeout {
                let v = self.cluster.cli(&["volume", "get", &self.volume]).unwrap_or_default();
                return Err(format!("not healthy within {timeout:?}:\n{v}"));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok(start.elapsed())
    }

    /// Waits until `check` holds (polling), or fails naming `what`.
    pub fn until(&self, timeout: Duration, what: &str, mut check: impl FnMut(&Ctx) -> bool) -> Result<(), String> {
        let start = Instant::now();
        while !check(self) {
            if start.elapsed() > timeout {
                return Err(format!("timed out after {timeout:?} waiting for: {what}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The volume's endpoint as the manager has it now.
    pub fn endpoint(&self) -> Option<String> {
        endpoint_of(&self.cluster.api, &self.volume)
    }

    pub fn events(&self) -> Vec<serde_json::Value> {
        self.cluster
            .cli(&["event", "list", "--volume", &self.volume, "-o", "json"])
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    }
}

/// The endpoint of `volume` from the manager at `api` (None: none now).
pub fn endpoint_of(api: &str, volume: &str) -> Option<String> {
    let out = std::process::Command::new(crate::binary("ironhorn"))
        .args(["--api", api, "volume", "get", volume, "-o", "json"])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let endpoint = v["status"]["endpoint"].as_str()?;
    (!endpoint.is_empty()).then(|| endpoint.to_string())
}
