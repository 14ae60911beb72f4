//! `ironhorn csi`: the CSI driver `driver.ironhorn.io` (Identity, Controller
//! and Node services on one unix socket, the hostpath driver's shape).
//!
//! The controller side turns CSI calls into calls to the manager's REST API,
//! as Longhorn's CSI plugin calls longhorn-manager; the node side formats,
//! mounts and bind-mounts the engine's block device (`/dev/ironhorn/<vol>`)
//! and keeps no state of its own beyond the mount table (see `mounts`).
//!
//! Volume ids are volume names; snapshot ids are snapshot names. A CSI name
//! that is not a valid ironhorn name maps to a stable digest of it
//! (`params::volume_name`).

pub mod controller;
pub mod mounts;
pub mod node;
pub mod params;
pub mod volumes;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ironhorn_proto::csi;
use ironhorn_proto::csi::identity_server::{Identity, IdentityServer};
use tonic::{Request, Response, Status};

use crate::client::CallError;
use params::RequestError;

pub const DRIVER_NAME: &str = "driver.ironhorn.io";
/// The topology key NodeGetInfo reports (one segment per node).
pub const TOPOLOGY_KEY: &str = "topology.ironhorn.io/node";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    All,
    Controller,
    Node,
}

pub struct Config {
    /// `unix:///PATH/csi.sock` (or a bare path).
    pub endpoint: String,
    pub node_id: String,
    pub mode: Mode,
    /// The manager's REST API, `http://HOST:PORT`.
    pub api: String,
    /// Where ephemeral inline volumes are staged on this node.
    pub state_dir: PathBuf,
}

/// Volumes with a call in flight in this process: a second call for one
/// of them gets ABORTED (the spec's answer to a CO that lost track).
#[derive(Clone, Default)]
pub struct Busy(Arc<Mutex<HashSet<String>>>);

pub struct BusyGuard {
    set: Busy,
    name: String,
}

impl Busy {
    pub fn claim(&self, volume: &str) -> Result<BusyGuard, Status> {
        let mut set = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !set.insert(volume.to_string()) {
            return Err(Status::aborted(format!("an operation on volume {volume} is already in progress; retry")));
        }
        Ok(BusyGuard { set: self.clone(), name: volume.to_string() })
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.set.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.name);
    }
}

impl From<RequestError> for Status {
    fn from(e: RequestError) -> Status {
        match e {
            RequestError::OutOfRange(_) => Status::out_of_range(e.to_string()),
            _ => Status::invalid_argument(e.to_string()),
        }
    }
}

/// The manager's answer as a gRPC status: unknown names NOT_FOUND, conflicts
/// FAILED_PRECONDITION, bad input INVALID_ARGUMENT, an unreachable manager
/// UNAVAILABLE (the sidecars retry).
pub fn api_status(e: CallError) -> Status {
    match &e {
        CallError::Unreachable(m) => Status::unavailable(m.clone()),
        CallError::Refused { status: 404, message } => Status::not_found(message.clone()),
        CallError::Refused { status: 409, message } => Status::failed_precondition(message.clone()),
        CallError::Refused { status: 400, message } => Status::invalid_argument(message.clone()),
        CallError::Refused { message, .. } => Status::internal(message.clone()),
    }
}

pub fn required<'a>(value: &'a str, field: &'static str) -> Result<&'a str, Status> {
    if value.is_empty() { Err(RequestError::Missing(field).into()) } else { Ok(value) }
}

struct IdentityService {
    mode: Mode,
    api: String,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
        let service =
            |t: service::Type| csi::PluginCapability { r#type: Some(Type::Service(Service { r#type: t as i32 })) };
        let mut caps = vec![service(service::Type::VolumeAccessibilityConstraints)];
        if self.mode != Mode::Node {
            caps.push(service(service::Type::ControllerService));
        }
        caps.push(csi::PluginCapability {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion { r#type: volume_expansion::Type::Online as i32 })),
        });
        Ok(Response::new(csi::GetPluginCapabilitiesResponse { capabilities: caps }))
    }

    /// Ready when the manager answers (the controller and the node side
    /// both need it); an unreachable manager is UNAVAILABLE.
    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        crate::client::call(&self.api, "GET", "/v1/settings", None).await.map_err(api_status)?;
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

/// Serves the driver on the unix socket until SIGTERM or SIGINT.
pub async fn serve(config: Config) -> Result<(), String> {
    let path = PathBuf::from(config.endpoint.strip_prefix("unix://").unwrap_or(&config.endpoint));
    if config.endpoint.contains("://") && !config.endpoint.starts_with("unix://") {
        return Err(format!("endpoint {}: only unix:///PATH is served", config.endpoint));
    }
    if config.mode != Mode::Controller && config.node_id.is_empty() {
        return Err("--node-id is required for the node service".into());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    // A socket left by a plugin that died: nobody listens on it any more.
    if path.exists() {
        std::fs::remove_file(&path).map_err(|e| format!("remove stale {}: {e}", path.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(&path).map_err(|e| format!("listen on {}: {e}", path.display()))?;
    let incoming = futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let busy = Busy::default();
    let identity = IdentityService { mode: config.mode, api: config.api.clone() };
    let mut router = tonic::transport::Server::builder().add_service(IdentityServer::new(identity));
    if config.mode != Mode::Node {
        let service = controller::ControllerService { api: config.api.clone(), busy: busy.clone() };
        router = router.add_service(csi::controller_server::ControllerServer::new(service));
    }
    if config.mode != Mode::Controller {
        let service = node::NodeService {
            api: config.api.clone(),
            node_id: config.node_id.clone(),
            state_dir: config.state_dir.clone(),
            busy,
        };
        router = router.add_service(csi::node_server::NodeServer::new(service));
    }
    tracing::info!(endpoint = %path.display(), node = %config.node_id, mode = ?config.mode, "CSI driver serving");
    ironhorn_proto::say!("listening on {}", path.display());
    let result = router.serve_with_incoming_shutdown(incoming, ironhorn_proto::shutdown::signal()).await;
    let _ = std::fs::remove_file(&path);
    result.map_err(|e| format!("CSI server: {e}"))
}
