//! The CSI Controller service: CSI calls as calls to the manager's REST API.
//! Each call checks its input first (`params`), then asks the manager, then
//! waits, where the spec wants a finished result, for the controllers to
//! report it in status (a volume created and its replicas up, an attach
//! done, a detach done).

use ironhorn_proto::csi;
use ironhorn_proto::csi::controller_server::Controller;
use ironhorn_proto::csi::controller_service_capability::Rpc;
use ironhorn_proto::csi::controller_service_capability::rpc::Type as CapType;
use serde_json::{Value, json};
use tonic::{Request, Response, Status};

use super::params::{self, RequestError};
use super::{Busy, TOPOLOGY_KEY, api_status, required, volumes};
use crate::client::{CallError, call};
use crate::crd::{self, Volume, condition};

pub struct ControllerService {
    pub api: String,
    pub busy: Busy,
}

fn to_volume(v: Value) -> Result<Volume, Status> {
    serde_json::from_value(v).map_err(|e| Status::internal(format!("the manager's volume does not parse: {e}")))
}

fn to_snapshot(v: Value) -> Result<crd::Snapshot, Status> {
    serde_json::from_value(v).map_err(|e| Status::internal(format!("the manager's snapshot does not parse: {e}")))
}

/// The CSI view of a volume.
pub fn csi_volume(v: &Volume) -> csi::Volume {
    csi::Volume {
        capacity_bytes: v.spec.size as i64,
        volume_id: v.metadata.name.clone().unwrap_or_default(),
        volume_context: Default::default(),
        content_source: content_source(&v.spec.data_source),
        // Reachable from every node: the engine runs where it is attached
        // and talks to its replicas over the network.
        accessible_topology: Vec::new(),
    }
}

/// A volume's dataSource as CSI shows it.
fn content_source(data_source: &str) -> Option<csi::VolumeContentSource> {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let t = match crate::restore::Source::parse(data_source).ok()?? {
        crate::restore::Source::Snapshot(id) => Type::Snapshot(SnapshotSource { snapshot_id: id }),
        crate::restore::Source::Volume(id) => Type::Volume(VolumeSource { volume_id: id }),
    };
    Some(csi::VolumeContentSource { r#type: Some(t) })
}

/// Abnormal when the volume is degraded or faulted, with why.
pub fn volume_condition(v: &Volume) -> csi::VolumeCondition {
    let status = v.status.clone().unwrap_or_default();
    match status.robustness.as_str() {
        "healthy" => csi::VolumeCondition { abnormal: false, message: "healthy".into() },
        "" | "unknown" if status.state != "attached" => csi::VolumeCondition {
            abnormal: false,
            message: format!("{} (robustness is known while attached)", status.state),
        },
        robustness => {
            let why: Vec<String> = status
                .conditions
                .iter()
                .filter(|c| c.status == "False" && !c.message.is_empty())
                .map(|c| format!("{}: {}", c.type_, c.message))
                .collect();
            let message =
                if why.is_empty() { robustness.to_string() } else { format!("{robustness}: {}", why.join("; ")) };
            csi::VolumeCondition { abnormal: true, message }
        }
    }
}

fn snapshot_time(s: &crd::Snapshot) -> Option<prost_types::Timestamp> {
    let status = s.status.clone().unwrap_or_default();
    let t = status
        .creation_time
        .parse::<jiff::Timestamp>()
        .ok()
        .or_else(|| s.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
    Some(prost_types::Timestamp { seconds: t.as_second(), nanos: t.subsec_nanosecond() })
}

fn csi_snapshot(s: &crd::Snapshot) -> csi::Snapshot {
    let status = s.status.clone().unwrap_or_default();
    csi::Snapshot {
        size_bytes: status.size as i64,
        snapshot_id: s.metadata.name.clone().unwrap_or_default(),
        source_volume_id: s.spec.volume.clone(),
        creation_time: snapshot_time(s),
        ready_to_use: status.ready_to_use,
        group_snapshot_id: String::new(),
    }
}

impl ControllerService {
    async fn volume(&self, name: &str) -> Result<Option<Volume>, Status> {
        volumes::get(&self.api, name).await
    }
}

/// Whether an existing volume answers a CreateVolume request the same way.
fn compatible(v: &Volume, size_range: Option<&csi::CapacityRange>, p: &params::VolumeParams) -> Result<(), String> {
    if !params::size_fits(v.spec.size, size_range) {
        return Err(format!("it is {} bytes, outside the capacity range asked for", v.spec.size));
    }
    if let Some(n) = p.number_of_replicas
        && n != v.spec.number_of_replicas
    {
        return Err(format!("it has numberOfReplicas {}, not {n}", v.spec.number_of_replicas));
    }
    if v.spec.node_selector != p.node_selector || v.spec.disk_selector != p.disk_selector {
        return Err("its node or disk selector differs".into());
    }
    Ok(())
}

fn create_body(name: &str, size: u64, p: &params::VolumeParams) -> Value {
    let mut body = json!({
        "name": name,
        "size": size,
        "frontend": "blockdev",
        "nodeSelector": p.node_selector,
        "diskSelector": p.disk_selector,
    });
    if let Some(n) = p.number_of_replicas {
        body["numberOfReplicas"] = json!(n);
    }
    if let Some(t) = p.stale_replica_timeout {
        body["staleReplicaTimeout"] = json!(t);
    }
    if let Some(a) = p.replica_soft_anti_affinity {
        body["replicaSoftAntiAffinity"] = json!(a);
    }
    if let Some(q) = p.write_quorum {
        body["writeQuorum"] = json!(q);
    }
    if p.data_locality == params::DataLocality::BestEffort {
        body["dataLocality"] = json!("best-effort");
    }
    if let Some(n) = p.iops_limit {
        body["iopsLimit"] = json!(n);
    }
    if let Some(b) = p.bandwidth_limit {
        body["bandwidthLimit"] = json!(b);
    }
    if !p.pvc_name.is_empty() {
        body["pvcName"] = json!(p.pvc_name);
        body["pvcNamespace"] = json!(p.pvc_namespace);
    }
    body
}

/// Creates a volume through the manager and waits until its replicas are
/// up (state detached). When it cannot be scheduled it is deleted again and
/// the scheduler's reason comes back as RESOURCE_EXHAUSTED. Shared with the
/// node service's ephemeral volumes.
pub async fn create_and_wait(
    api: &str,
    name: &str,
    size: u64,
    p: &params::VolumeParams,
    data_source: &str,
) -> Result<Volume, Status> {
    let mut body = create_body(name, size, p);
    if !data_source.is_empty() {
        body["dataSource"] = json!(data_source);
    }
    match call(api, "POST", "/v1/volumes", Some(&body)).await {
        Ok(_) => {}
        Err(CallError::Refused { status: 409, .. }) => {} // made by an earlier try
        Err(e) => return Err(api_status(e)),
    }
    let unschedulable = |v: &Volume| {
        let status = v.status.as_ref()?;
        condition(&status.conditions, "Scheduled").filter(|c| c.status == "False").map(|c| c.message.clone())
    };
    let ready = volumes::wait(api, name, "created", |v| {
        let v = v.ok_or_else(|| Status::aborted(format!("volume {name} was deleted while being created")))?;
        // A volume with a source is usable once its copy is done;
        // attaching it waits for that (status.restore).
        let state = v.status.as_ref().map(|s| s.state.as_str()).unwrap_or_default();
        Ok(unschedulable(v).is_some() || matches!(state, "detached" | "attached" | "attaching" | "restoring"))
    })
    .await?
    .ok_or_else(|| Status::aborted(format!("volume {name} vanished")))?;
    if let Some(why) = unschedulable(&ready) {
        // Nothing half-made stays behind.
        volumes::delete(api, name).await?;
        return Err(Status::resource_exhausted(format!("cannot place the volume's replicas: {why}")));
    }
    Ok(ready)
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        let csi_name = required(&req.name, "name")?;
        params::check_capabilities(&req.volume_capabilities)?;
        let p = params::parse_parameters(&req.parameters, false)?;
        let size = params::size_for(req.capacity_range.as_ref())?;
        let name = params::volume_name(csi_name);
        let _guard = self.busy.claim(&name)?;
        let (data_source, size) =
            self.data_source(req.volume_content_source.as_ref(), req.capacity_range.as_ref(), size).await?;
        if let Some(existing) = self.volume(&name).await? {
            if existing.metadata.deletion_timestamp.is_some() {
                return Err(Status::aborted(format!("volume {name} is being deleted; retry")));
            }
            if let Err(why) = compatible(&existing, req.capacity_range.as_ref(), &p) {
                return Err(Status::already_exists(format!("volume {csi_name:?} exists and differs: {why}")));
            }
            if existing.spec.data_source != data_source {
                return Err(Status::already_exists(format!(
                    "volume {csi_name:?} exists with another content source ({:?})",
                    existing.spec.data_source
                )));
            }
        }
        let volume = create_and_wait(&self.api, &name, size, &p, &data_source).await?;
        Ok(Response::new(csi::CreateVolumeResponse { volume: Some(csi_volume(&volume)) }))
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        let name = required(&req.volume_id, "volume_id")?;
        let _guard = self.busy.claim(name)?;
        let Some(volume) = self.volume(name).await? else {
            return Ok(Response::new(csi::DeleteVolumeResponse {}));
        };
        if !volume.spec.node_id.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {name} is published on node {}; unpublish it first",
                volume.spec.node_id
            )));
        }
        volumes::delete(&self.api, name).await?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let name = required(&req.volume_id, "volume_id")?;
        let node = required(&req.node_id, "node_id")?;
        let cap = req.volume_capability.as_ref().ok_or(RequestError::Missing("volume_capability"))?;
        params::check_capability(cap)?;
        let _guard = self.busy.claim(name)?;
        let volume = self.volume(name).await?.ok_or_else(|| Status::not_found(format!("volume {name} not found")))?;
        if !volume.spec.node_id.is_empty() && volume.spec.node_id != node {
            return Err(Status::failed_precondition(format!(
                "volume {name} is published on node {}; a volume is attached to one node at a time",
                volume.spec.node_id
            )));
        }
        let device = volumes::attach(&self.api, name, node).await?;
        let context = [("devicePath".to_string(), device)].into();
        Ok(Response::new(csi::ControllerPublishVolumeResponse { publish_context: context }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let name = required(&req.volume_id, "volume_id")?;
        let _guard = self.busy.claim(name)?;
        let Some(volume) = self.volume(name).await? else {
            return Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}));
        };
        let on = &volume.spec.node_id;
        if !on.is_empty() && !req.node_id.is_empty() && *on != req.node_id {
            // Published on another node, not on this one: nothing to undo.
            return Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}));
        }
        volumes::detach(&self.api, name, !on.is_empty()).await?;
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        let name = required(&req.volume_id, "volume_id")?;
        if req.volume_capabilities.is_empty() {
            return Err(RequestError::Missing("volume_capabilities").into());
        }
        if self.volume(name).await?.is_none() {
            return Err(Status::not_found(format!("volume {name} not found")));
        }
        let checked = params::check_capabilities(&req.volume_capabilities)
            .and_then(|_| params::parse_parameters(&req.parameters, false).map(drop));
        let reply = match checked {
            Ok(()) => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: Default::default(),
                }),
                message: String::new(),
            },
            Err(e) => csi::ValidateVolumeCapabilitiesResponse { confirmed: None, message: e.to_string() },
        };
        Ok(Response::new(reply))
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let all = call(&self.api, "GET", "/v1/volumes", None).await.map_err(api_status)?;
        let mut volumes: Vec<Volume> =
            all.as_array().cloned().unwrap_or_default().into_iter().map(to_volume).collect::<Result<_, _>>()?;
        volumes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let (start, end, next_token) =
            params::page(volumes.len(), req.max_entries, &req.starting_token).map_err(Status::aborted)?;
        let entries = volumes[start..end]
            .iter()
            .map(|v| csi::list_volumes_response::Entry {
                volume: Some(csi_volume(v)),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: published_on(v),
                    volume_condition: Some(volume_condition(v)),
                }),
            })
            .collect();
        Ok(Response::new(csi::ListVolumesResponse { entries, next_token }))
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let req = request.into_inner();
        params::check_capabilities(&req.volume_capabilities).or_else(|e| match e {
            RequestError::Missing("volume_capabilities") => Ok(Vec::new()),
            e => Err(e),
        })?;
        let p = params::parse_parameters(&req.parameters, false)?;
        let mut query = vec![
            format!("nodeSelector={}", p.node_selector.join(",")),
            format!("diskSelector={}", p.disk_selector.join(",")),
        ];
        if let Some(node) = req.accessible_topology.as_ref().and_then(|t| t.segments.get(TOPOLOGY_KEY)) {
            query.push(format!("node={node}"));
        }
        let reply = match call(&self.api, "GET", &format!("/v1/capacity?{}", query.join("&")), None).await {
            Ok(v) => v["maximumVolumeSize"].as_u64().unwrap_or(0),
            // A topology segment naming no node of this cluster has none.
            Err(e) if e.is_not_found() => 0,
            Err(e) => return Err(api_status(e)),
        };
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: reply as i64,
            maximum_volume_size: Some(reply as i64),
            minimum_volume_size: Some(params::BLOCK as i64),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        let caps = [
            CapType::CreateDeleteVolume,
            CapType::PublishUnpublishVolume,
            CapType::ListVolumes,
            CapType::GetCapacity,
            CapType::CreateDeleteSnapshot,
            CapType::ListSnapshots,
            CapType::ListVolumesPublishedNodes,
            CapType::VolumeCondition,
            CapType::GetVolume,
            CapType::ExpandVolume,
            CapType::CloneVolume,
            CapType::SingleNodeMultiWriter,
        ]
        .into_iter()
        .map(|t| csi::ControllerServiceCapability {
            r#type: Some(csi::controller_service_capability::Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse { capabilities: caps }))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let req = request.into_inner();
        let volume = required(&req.source_volume_id, "source_volume_id")?;
        let csi_name = required(&req.name, "name")?;
        if let Some(k) = req.parameters.keys().next() {
            return Err(RequestError::UnknownParameter(k.clone()).into());
        }
        if self.volume(volume).await?.is_none() {
            return Err(Status::not_found(format!("source volume {volume} not found")));
        }
        let name = params::snapshot_name(csi_name);
        if let Some(other) = self.snapshots().await?.iter().find(|s| s.metadata.name.as_deref() == Some(name.as_str()))
            && other.spec.volume != volume
        {
            return Err(Status::already_exists(format!(
                "snapshot {csi_name:?} already exists, of volume {}",
                other.spec.volume
            )));
        }
        let body = json!({ "name": name });
        let made = call(&self.api, "POST", &format!("/v1/volumes/{volume}/snapshots"), Some(&body))
            .await
            .map_err(api_status)
            .and_then(to_snapshot)?;
        Ok(Response::new(csi::CreateSnapshotResponse { snapshot: Some(csi_snapshot(&made)) }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let req = request.into_inner();
        let id = required(&req.snapshot_id, "snapshot_id")?;
        let all = self.snapshots().await?;
        if let Some(s) = all.iter().find(|s| s.metadata.name.as_deref() == Some(id)) {
            let path = format!("/v1/volumes/{}/snapshots/{id}", s.spec.volume);
            match call(&self.api, "DELETE", &path, None).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(api_status(e)),
            }
        }
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let req = request.into_inner();
        let mut all = self.snapshots().await?;
        all.retain(|s| {
            (req.snapshot_id.is_empty() || s.metadata.name.as_deref() == Some(req.snapshot_id.as_str()))
                && (req.source_volume_id.is_empty() || s.spec.volume == req.source_volume_id)
        });
        all.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let (start, end, next_token) =
            params::page(all.len(), req.max_entries, &req.starting_token).map_err(Status::aborted)?;
        let entries = all[start..end]
            .iter()
            .map(|s| csi::list_snapshots_response::Entry { snapshot: Some(csi_snapshot(s)) })
            .collect();
        Ok(Response::new(csi::ListSnapshotsResponse { entries, next_token }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        let name = required(&req.volume_id, "volume_id")?;
        let range = req.capacity_range.as_ref().ok_or(RequestError::Missing("capacity_range"))?;
        let size = params::size_for(Some(range))?;
        let filesystem = match req.volume_capability.as_ref() {
            Some(cap) => matches!(params::check_capability(cap)?, params::AccessType::Mount(_)),
            None => true,
        };
        let _guard = self.busy.claim(name)?;
        let volume = self.volume(name).await?.ok_or_else(|| Status::not_found(format!("volume {name} not found")))?;
        let size = size.max(volume.spec.size);
        let body = json!({ "size": size });
        call(&self.api, "POST", &format!("/v1/volumes/{name}/expand"), Some(&body)).await.map_err(api_status)?;
        volumes::wait(&self.api, name, "expanded", |v| {
            let v = v.ok_or_else(|| Status::not_found(format!("volume {name} was deleted")))?;
            Ok(v.status.as_ref().is_some_and(|s| s.current_size >= size))
        })
        .await?;
        Ok(Response::new(csi::ControllerExpandVolumeResponse {
            capacity_bytes: size as i64,
            node_expansion_required: filesystem,
        }))
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        let req = request.into_inner();
        let name = required(&req.volume_id, "volume_id")?;
        let v = self.volume(name).await?.ok_or_else(|| Status::not_found(format!("volume {name} not found")))?;
        Ok(Response::new(csi::ControllerGetVolumeResponse {
            volume: Some(csi_volume(&v)),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: published_on(&v),
                volume_condition: Some(volume_condition(&v)),
            }),
        }))
    }
}

fn published_on(v: &Volume) -> Vec<String> {
    if v.spec.node_id.is_empty() { Vec::new() } else { vec![v.spec.node_id.clone()] }
}

impl ControllerService {
    /// The manager's dataSource for a CSI content source, and the size the
    /// new volume gets: the one asked for, or the source's when none was;
    /// smaller than the source is OUT_OF_RANGE, an unknown source NOT_FOUND.
    async fn data_source(
        &self,
        source: Option<&csi::VolumeContentSource>,
        range: Option<&csi::CapacityRange>,
        size: u64,
    ) -> Result<(String, u64), Status> {
        use csi::volume_content_source::Type;
        let (data_source, source_size) = match source.and_then(|s| s.r#type.as_ref()) {
            None => return Ok((String::new(), size)),
            Some(Type::Snapshot(s)) => {
                let id = required(&s.snapshot_id, "volume_content_source.snapshot.snapshot_id")?;
                let all = self.snapshots().await?;
                let snapshot = all
                    .iter()
                    .find(|x| x.metadata.name.as_deref() == Some(id))
                    .ok_or_else(|| Status::not_found(format!("snapshot {id} not found")))?;
                let status = snapshot.status.clone().unwrap_or_default();
                if !status.ready_to_use {
                    return Err(Status::unavailable(format!("snapshot {id} is not taken yet; retry")));
                }
                (format!("snapshot://{id}"), status.size)
            }
            Some(Type::Volume(v)) => {
                let id = required(&v.volume_id, "volume_content_source.volume.volume_id")?;
                let volume =
                    self.volume(id).await?.ok_or_else(|| Status::not_found(format!("volume {id} not found")))?;
                (format!("volume://{id}"), volume.spec.size)
            }
        };
        let asked = range.is_some_and(|r| r.required_bytes > 0 || r.limit_bytes > 0);
        let size = if asked { size } else { source_size };
        if size < source_size {
            return Err(RequestError::OutOfRange(format!(
                "{size} bytes is smaller than the {source_size} bytes of {data_source}"
            ))
            .into());
        }
        Ok((data_source, size))
    }

    async fn snapshots(&self) -> Result<Vec<crd::Snapshot>, Status> {
        let all = call(&self.api, "GET", "/v1/snapshots", None).await.map_err(api_status)?;
        all.as_array().cloned().unwrap_or_default().into_iter().map(to_snapshot).collect()
    }
}
