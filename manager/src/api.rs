//! REST API (JSON over HTTP) over the datastore. It writes specs only; the
//! controllers do the work and report in status. Errors are JSON
//! `{"error": "..."}` with 400 (bad input), 404 (unknown name), 409 (conflicts
//! with the current state).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use std::sync::Arc;

use crate::crd::*;
use crate::datastore::{self, Datastore, update};
use crate::metrics::{self, Sampler};
use crate::settings;

pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<datastore::Error> for ApiError {
    fn from(e: datastore::Error) -> Self {
        let code = match e {
            datastore::Error::NotFound { .. } => StatusCode::NOT_FOUND,
            datastore::Error::AlreadyExists { .. } | datastore::Error::Conflict { .. } => StatusCode::CONFLICT,
            datastore::Error::Forbidden { .. } => StatusCode::FORBIDDEN,
            datastore::Error::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            // The datastore cannot be reached or failed: try again later.
            datastore::Error::Backend(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError(code, e.to_string())
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

fn not_found(kind: &str, name: &str) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("{kind} {name:?} not found"))
}

type Reply = Result<Json<Value>, ApiError>;

fn reply<T: serde::Serialize>(value: &T) -> Reply {
    serde_json::to_value(value).map(Json).map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

pub fn router<D: Datastore>(store: D, gate: crate::leader::Gate) -> Router {
    // One sampler for every reader of rates, so they share intervals.
    let sampler = Arc::new(Sampler::default());
    let io_sampler = sampler.clone();
    Router::new()
        // Liveness: the process answers. Readiness: the datastore answers
        // (every manager serves the API; `leader` says which reconciles).
        .route("/healthz", get(move || async move { Json(json!({ "ok": true, "leader": gate.is_leader() })) }))
        .route("/readyz", get(ready::<D>))
        .route("/v1/volumes", get(list_volumes::<D>).post(create_volume::<D>))
        .route("/v1/volumes/{name}", get(get_volume::<D>).delete(delete_volume::<D>))
        .route("/v1/volumes/{name}/attach", post(attach::<D>))
        .route("/v1/volumes/{name}/detach", post(detach::<D>))
        .route("/v1/volumes/{name}/update", post(update_volume::<D>))
        .route("/v1/volumes/{name}/expand", post(expand_volume::<D>))
        .route("/v1/volumes/{name}/scrub", post(scrub_volume::<D>))
        .route("/v1/volumes/{name}/snapshots", get(list_snapshots::<D>).post(create_snapshot::<D>))
        .route("/v1/volumes/{name}/snapshots/{snapshot}", axum::routing::delete(delete_snapshot::<D>))
        .route("/v1/snapshots", get(list::<D, Snapshot>))
        .route("/v1/capacity", get(capacity::<D>))
        .route("/v1/nodes", get(list::<D, Node>))
        .route("/v1/nodes/{name}", post(update_node::<D>))
        .route("/v1/replicas", get(list::<D, Replica>))
        .route("/v1/engines", get(list::<D, Engine>))
        .route("/v1/events", get(list_events::<D>))
        .route("/v1/settings", get(list_settings::<D>))
        .route("/v1/settings/{name}", get(get_setting::<D>).put(set_setting::<D>))
        .route(
            "/v1/volumes/{name}/io",
            get(move |State(store): State<D>, Path(name): Path<String>| volume_io(store, io_sampler, name)),
        )
        .route("/metrics", get(move |State(store): State<D>| prometheus(store, sampler)))
        .merge(crate::ui::routes(store.clone()))
        .with_state(store)
}

async fn ready<D: Datastore>(State(store): State<D>) -> Reply {
    store.get::<Setting>("default-replica-count").await?;
    Ok(Json(json!({ "ready": true })))
}

async fn list<D: Datastore, K: datastore::Object>(State(store): State<D>) -> Reply {
    reply(&store.list::<K>().await?)
}

/// A DNS-1123 label short enough that replica and engine names built from it
/// stay valid LV and object names.
pub fn valid_volume_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateVolume {
    name: String,
    /// "10GiB" or a number of bytes.
    size: Value,
    number_of_replicas: Option<u32>,
    #[serde(default)]
    frontend: Frontend,
    #[serde(default)]
    node_selector: Vec<String>,
    #[serde(default)]
    disk_selector: Vec<String>,
    #[serde(default)]
    replica_soft_anti_affinity: SoftAntiAffinity,
    stale_replica_timeout: Option<u64>,
    #[serde(default)]
    write_quorum: WriteQuorum,
    /// snapshot://NAME or volume://NAME: the data to start with.
    #[serde(default)]
    data_source: String,
    #[serde(default)]
    data_locality: DataLocality,
    #[serde(default)]
    pvc_name: String,
    #[serde(default)]
    pvc_namespace: String,
    /// Requests per second; 0 = unlimited.
    #[serde(default)]
    iops_limit: u64,
    /// Bytes per second ("100MiB" or a number); 0 = unlimited.
    bandwidth_limit: Option<Value>,
}

/// Checks a new volume's data source: it exists, and the new volume is at
/// least as big as what it copies.
async fn check_data_source<D: Datastore>(store: &D, source: &str, size: u64) -> Result<(), ApiError> {
    use crate::restore::Source;
    let source_size = match Source::parse(source).map_err(|e| bad(e.to_string()))? {
        None => return Ok(()),
        Some(Source::Snapshot(name)) => {
            let snapshot = store.get::<Snapshot>(&name).await?.ok_or_else(|| not_found("snapshot", &name))?;
            let status = snapshot.status.unwrap_or_default();
            if !status.ready_to_use {
                return Err(ApiError(StatusCode::CONFLICT, format!("snapshot {name} is not taken yet")));
            }
            status.size
        }
        Some(Source::Volume(name)) => live_volume(store, &name).await?.spec.size,
    };
    if size < source_size {
        return Err(bad(format!("size {size} is smaller than the {source_size} bytes of {source}")));
    }
    Ok(())
}

fn check_replica_count(replicas: u32) -> Result<(), ApiError> {
    if (1..=20).contains(&replicas) {
        Ok(())
    } else {
        Err(bad(format!("numberOfReplicas {replicas}: must be 1 to 20")))
    }
}

/// The volume named, when it exists and is not being deleted.
async fn live_volume<D: Datastore>(store: &D, name: &str) -> Result<Volume, ApiError> {
    let volume = store.get::<Volume>(name).await?.ok_or_else(|| not_found("volume", name))?;
    if volume.metadata.deletion_timestamp.is_some() {
        return Err(ApiError(StatusCode::CONFLICT, format!("volume {name} is being deleted")));
    }
    Ok(volume)
}

fn parse_size_value(size: &Value) -> Result<u64, ApiError> {
    let bytes = match size {
        Value::String(s) => ironhorn_proto::units::parse_size(s).map_err(bad)?,
        Value::Number(n) => n.as_u64().ok_or_else(|| bad(format!("size {n} is not a byte count")))?,
        other => return Err(bad(format!("size {other} is not a size"))),
    };
    if bytes == 0 || bytes % 4096 != 0 {
        return Err(bad(format!("size {bytes} must be a positive multiple of 4096 bytes")));
    }
    Ok(bytes)
}

/// A bandwidth limit: bytes per second as a number or a size ("100MiB"); 0
/// or "0" = unlimited.
fn parse_bandwidth(limit: &Value) -> Result<u64, ApiError> {
    match limit {
        Value::String(s) => ironhorn_proto::units::parse_size(s).map_err(|e| bad(format!("bandwidthLimit: {e}"))),
        Value::Number(n) => n.as_u64().ok_or_else(|| bad(format!("bandwidthLimit {n} is not a byte count"))),
        other => Err(bad(format!("bandwidthLimit {other}: give bytes per second, e.g. \"100MiB\""))),
    }
}

async fn create_volume<D: Datastore>(
    State(store): State<D>,
    body: Result<Json<CreateVolume>, axum::extract::rejection::JsonRejection>,
) -> Reply {
    let Json(body) = body.map_err(|e| bad(e.body_text()))?;
    if !valid_volume_name(&body.name) {
        return Err(bad(format!(
            "volume name {:?}: use 1-40 lowercase letters, digits and '-', not starting or ending with '-'",
            body.name
        )));
    }
    let size = parse_size_value(&body.size)?;
    let replicas = match body.number_of_replicas {
        Some(n) => n,
        None => settings::get_u64(&store, "default-replica-count").await? as u32,
    };
    check_replica_count(replicas)?;
    check_data_source(&store, &body.data_source, size).await?;
    let bandwidth_limit = body.bandwidth_limit.as_ref().map(parse_bandwidth).transpose()?.unwrap_or(0);
    let mut volume = Volume::new(
        &body.name,
        VolumeSpec {
            size,
            number_of_replicas: replicas,
            frontend: body.frontend,
            node_id: String::new(),
            stale_replica_timeout: body.stale_replica_timeout.unwrap_or(0),
            replica_soft_anti_affinity: body.replica_soft_anti_affinity,
            node_selector: body.node_selector,
            disk_selector: body.disk_selector,
            write_quorum: body.write_quorum,
            data_source: body.data_source,
            data_locality: body.data_locality,
            pvc_name: body.pvc_name,
            pvc_namespace: body.pvc_namespace,
            iops_limit: body.iops_limit,
            bandwidth_limit,
            ..Default::default()
        },
    );
    volume.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    let mut created = store.create(&volume).await?;
    // Status is a subresource: a create drops it, so it is written after.
    created.status =
        Some(VolumeStatus { state: "creating".into(), robustness: "unknown".into(), ..Default::default() });
    match store.replace_status(&created).await {
        Ok(written) => reply(&written),
        // Created all the same; the first controller pass writes status.
        Err(e) => {
            tracing::warn!(volume = %created.metadata.name.as_deref().unwrap_or_default(), error = %e, "initial status not written");
            created.status = None;
            reply(&created)
        }
    }
}

/// A volume as the API shows it. While the manager's datastore writes fail,
/// its stored status is whatever last got through, so it is not shown as
/// current: robustness unknown, and a condition saying why.
fn shown<D: Datastore>(store: &D, mut volume: Volume) -> Volume {
    if let Some(why) = store.write_failure() {
        let status = volume.status.get_or_insert_default();
        status.robustness = "unknown".into();
        let now = crate::controller::now();
        let message = format!("the manager cannot write status: {why}");
        set_condition(&mut status.conditions, "StatusCurrent", false, "DatastoreWriteFailed", &message, &now);
    }
    volume
}

async fn list_volumes<D: Datastore>(State(store): State<D>) -> Reply {
    let volumes: Vec<Volume> = store.list::<Volume>().await?.into_iter().map(|v| shown(&store, v)).collect();
    reply(&volumes)
}

async fn get_volume<D: Datastore>(State(store): State<D>, Path(name): Path<String>) -> Reply {
    match store.get::<Volume>(&name).await? {
        Some(v) => reply(&shown(&store, v)),
        None => Err(not_found("volume", &name)),
    }
}

async fn delete_volume<D: Datastore>(State(store): State<D>, Path(name): Path<String>) -> Reply {
    if store.get::<Volume>(&name).await?.is_none() {
        return Err(not_found("volume", &name));
    }
    store.delete::<Volume>(&name).await?;
    Ok(Json(json!({ "deleting": name })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Attach {
    node: String,
    frontend: Option<Frontend>,
}

async fn attach<D: Datastore>(
    State(store): State<D>,
    Path(name): Path<String>,
    body: Result<Json<Attach>, axum::extract::rejection::JsonRejection>,
) -> Reply {
    let Json(body) = body.map_err(|e| bad(e.body_text()))?;
    let volume = live_volume(&store, &name).await?;
    if store.get::<Node>(&body.node).await?.is_none() {
        return Err(not_found("node", &body.node));
    }
    if !volume.spec.node_id.is_empty() && volume.spec.node_id != body.node {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("volume {name} is attached to {}; detach it first", volume.spec.node_id),
        ));
    }
    let status = volume.status.clone().unwrap_or_default();
    if let Some(c) = condition(&status.conditions, "Scheduled")
        && c.status == "False"
    {
        return Err(ApiError(StatusCode::CONFLICT, format!("volume {name} is not scheduled: {}", c.message)));
    }
    let updated = update::<Volume, D>(&store, &name, |v| {
        let frontend = body.frontend.unwrap_or(v.spec.frontend);
        let changed = v.spec.node_id != body.node || v.spec.frontend != frontend;
        v.spec.node_id = body.node.clone();
        v.spec.frontend = frontend;
        changed
    })
    .await?;
    reply(&updated)
}

async fn detach<D: Datastore>(State(store): State<D>, Path(name): Path<String>) -> Reply {
    change_spec(&store, &name, |spec| {
        let changed = !spec.node_id.is_empty();
        spec.node_id.clear();
        changed
    })
    .await
}

/// Asks for a scrub now (spec.scrubRequested + 1); the engine controller
/// starts it. Only an attached volume has an engine to run it.
async fn scrub_volume<D: Datastore>(State(store): State<D>, Path(name): Path<String>) -> Reply {
    let volume = live_volume(&store, &name).await?;
    if volume.spec.node_id.is_empty() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("volume {name} is detached; a scrub runs in its engine: attach it first"),
        ));
    }
    change_spec(&store, &name, |spec| {
        spec.scrub_requested += 1;
        true
    })
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct UpdateVolume {
    number_of_replicas: Option<u32>,
    iops_limit: Option<u64>,
    bandwidth_limit: Option<Value>,
}

/// Changes what can change on an existing volume: its replica count (the
/// controllers add or remove replicas while it is attached; a detached
/// volume gets there at its next attach) and its I/O limits (applied by a
/// running engine within a pass).
async fn update_volume<D: Datastore>(
    State(store): State<D>,
    Path(name): Path<String>,
    body: Result<Json<UpdateVolume>, axum::extract::rejection::JsonRejection>,
) -> Reply {
    let Json(body) = body.map_err(|e| bad(e.body_text()))?;
    if body.number_of_replicas.is_none() && body.iops_limit.is_none() && body.bandwidth_limit.is_none() {
        return Err(bad("nothing to update: give numberOfReplicas, iopsLimit or bandwidthLimit"));
    }
    if let Some(replicas) = body.number_of_replicas {
        check_replica_count(replicas)?;
    }
    let bandwidth = body.bandwidth_limit.as_ref().map(parse_bandwidth).transpose()?;
    live_volume(&store, &name).await?;
    change_spec(&store, &name, |spec| {
        let before = spec.clone();
        spec.number_of_replicas = body.number_of_replicas.unwrap_or(spec.number_of_replicas);
        spec.iops_limit = body.iops_limit.unwrap_or(spec.iops_limit);
        spec.bandwidth_limit = bandwidth.unwrap_or(spec.bandwidth_limit);
        *spec != before
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct UpdateNode {
    allow_scheduling: Option<bool>,
    tags: Option<Vec<String>>,
    /// Disk name → its scheduling flag.
    #[serde(default)]
    disks: std::collections::BTreeMap<String, UpdateDisk>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct UpdateDisk {
    allow_scheduling: Option<bool>,
    tags: Option<Vec<String>>,
}

/// A tag as placement matches it: letters, digits, '-', '_' and '.'.
fn check_tags(tags: &[String]) -> Result<(), ApiError> {
    match tags.iter().find(|t| t.is_empty() || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))) {
        Some(t) => Err(bad(format!("tag {t:?}: use letters, digits, '-', '_' and '.'"))),
        None => Ok(()),
    }
}

/// Sets a node's (and its disks') scheduling flag and tags: what people
/// own on a Node object (registration keeps them).
async fn update_node<D: Datastore>(
    State(store): State<D>,
    Path(name): Path<String>,
    body: Result<Json<UpdateNode>, axum::extract::rejection::JsonRejection>,
) -> Reply {
    let Json(body) = body.map_err(|e| bad(e.body_text()))?;
    let node = store.get::<Node>(&name).await?.ok_or_else(|| not_found("node", &name))?;
    for tags in body.tags.iter().chain(body.disks.values().filter_map(|d| d.tags.as_ref())) {
        check_tags(tags)?;
    }
    if let Some(disk) = body.disks.keys().find(|d| !node.spec.disks.contains_key(*d)) {
        return Err(not_found("disk", &format!("{name}/{disk}")));
    }
    let updated = update::<Node, D>(&store, &name, |n| {
        let before = n.spec.clone();
        if let Some(allow) = body.allow_scheduling {
            n.spec.allow_scheduling = allow;
        }
        if let Some(tags) = &body.tags {
            n.spec.tags = tags.clone();
        }
        for (disk, change) in &body.disks {
            if let Some(d) = n.spec.disks.get_mut(disk) {
                if let Some(allow) = change.allow_scheduling {
                    d.allow_scheduling = allow;
                }
                if let Some(tags) = &change.tags {
                    d.tags = tags.clone();
                }
            }
        }
        n.spec != before
    })
    .await?
    .ok_or_else(|| not_found("node", &name))?;
    reply(&updated)
}

/// Applies `change` to a volume's spec (it says whether anything changed)
/// and answers with the volume.
async fn change_spec<D: Datastore>(store: &D, name: &str, change: impl Fn(&mut VolumeSpec) -> bool) -> Reply {
    let updated =
        update::<Volume, D>(store, name, |v| change(&mut v.spec)).await?.ok_or_else(|| not_found("volume", name))?;
    reply(&updated)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpandVolume {
    /// "20GiB" or a number of bytes.
    size: Value,
}

/// Grows a volume, attached or detached: the controllers grow its replicas
/// (through the engine while attached) and report status.currentSize.
/// The same size again is a no-op; a smaller one is refused.
async fn expand_volume<D: Datastore>(
    State(store): State<D>,
    Path(name): Path<String>,
    body: Result<Json<ExpandVolume>, axum::extract::rejection::JsonRejection>,
) -> Reply {
    let Json(body) = body.map_err(|e| bad(e.body_text()))?;
    let size = parse_size_value(&body.size)?;
    let volume = live_volume(&store, &name).await?;
    if size < volume.spec.size {
        return Err(bad(format!("volume {name} is {} bytes; volumes grow, they never shrink", volume.spec.size)));
    }
    change_spec(&store, &name, |spec| {
        let changed = spec.size < size;
        spec.size = spec.size.max(size);
        changed
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSnapshot {
    name: String,
}

/// A snapshot's object name: a DNS-1123 label (it is also the name the
/// engine and the replicas store), not the engine's own rebuild prefix.
fn valid_snapshot_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.starts_with("ironhorn-rebuild-")
}

/// Asks for a snapshot of the volume: the controller takes it through the
/// engine while the volume is attached, on its replicas while it is
/// detached (status readyToUse says when). The
/// same name for the same volume again is the same snapshot.
async fn create_snapshot<D: Datastore>(
    State(store): State<D>,
    Path(volume): Path<String>,
    body: Result<Json<CreateSnapshot>, axum::extract::rejection::JsonRejection>,
) -> Reply {
    let Json(body) = body.map_err(|e| bad(e.body_text()))?;
    if !valid_snapshot_name(&body.name) {
        return Err(bad(format!(
            "snapshot name {:?}: use 1-63 lowercase letters, digits and '-' (not starting with ironhorn-rebuild-)",
            body.name
        )));
    }
    live_volume(&store, &volume).await?;
    if let Some(existing) = store.get::<Snapshot>(&body.name).await? {
        if existing.spec.volume != volume {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("snapshot {} already exists, of volume {}", body.name, existing.spec.volume),
            ));
        }
        return reply(&existing);
    }
    let mut snapshot = Snapshot::new(&body.name, SnapshotSpec { volume: volume.clone() });
    snapshot.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    snapshot.status =
        Some(SnapshotStatus { message: "waiting for the volume's engine to take it".into(), ..Default::default() });
    reply(&store.create(&snapshot).await?)
}

async fn list_snapshots<D: Datastore>(State(store): State<D>, Path(volume): Path<String>) -> Reply {
    if store.get::<Volume>(&volume).await?.is_none() {
        return Err(not_found("volume", &volume));
    }
    let mut all: Vec<Snapshot> = store.list().await?;
    all.retain(|s| s.spec.volume == volume);
    reply(&all)
}

async fn delete_snapshot<D: Datastore>(State(store): State<D>, Path((volume, name)): Path<(String, String)>) -> Reply {
    match store.get::<Snapshot>(&name).await? {
        Some(s) if s.spec.volume == volume => {
            store.delete::<Snapshot>(&name).await?;
            Ok(Json(json!({ "deleting": name })))
        }
        _ => Err(not_found("snapshot", &name)),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CapacityQuery {
    /// One node's disks; none: every node's.
    node: Option<String>,
    /// Comma-separated tags, as a volume's selectors.
    node_selector: Option<String>,
    disk_selector: Option<String>,
}

fn tags(list: &Option<String>) -> Vec<String> {
    list.as_deref().unwrap_or_default().split(',').filter(|t| !t.is_empty()).map(str::to_string).collect()
}

/// The largest volume one replica of which the scheduler could still place
/// (on the node named, or anywhere), from the nodes' reported disks.
async fn capacity<D: Datastore>(
    State(store): State<D>,
    query: Result<axum::extract::Query<CapacityQuery>, axum::extract::rejection::QueryRejection>,
) -> Reply {
    let axum::extract::Query(query) = query.map_err(|e| bad(e.body_text()))?;
    let mut nodes: Vec<Node> = store.list().await?;
    if let Some(name) = &query.node {
        nodes.retain(|n| n.metadata.name.as_deref() == Some(name.as_str()));
        if nodes.is_empty() {
            return Err(not_found("node", name));
        }
    }
    let replicas: Vec<Replica> = store.list().await?;
    let values = settings::Values::load(&store).await?;
    let ready = |name: &str| {
        nodes.iter().any(|n| {
            n.metadata.name.as_deref() == Some(name)
                && n.status.as_ref().and_then(|s| condition(&s.conditions, "Ready")).is_some_and(|c| c.status == "True")
        })
    };
    let candidates = crate::controller::disk_candidates(&nodes, &replicas, ready);
    let size = crate::scheduler::largest_volume(
        &candidates,
        &tags(&query.node_selector),
        &tags(&query.disk_selector),
        crate::controller::limits(&values),
        ironhorn_replica::store::default_store_bytes,
    );
    Ok(Json(json!({ "maximumVolumeSize": size })))
}

#[derive(Deserialize)]
struct EventQuery {
    volume: Option<String>,
}

/// Events, oldest first; `?volume=NAME` keeps one volume's.
async fn list_events<D: Datastore>(
    State(store): State<D>,
    axum::extract::Query(query): axum::extract::Query<EventQuery>,
) -> Reply {
    use k8s_openapi::api::core::v1::Event;
    let mut events: Vec<Event> = store.list().await?;
    if let Some(volume) = &query.volume {
        events.retain(|e| e.involved_object.name.as_deref() == Some(volume.as_str()));
    }
    events.sort_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0));
    let out: Vec<Value> = events
        .iter()
        .map(|e| {
            json!({
                "time": e.last_timestamp.as_ref().map(|t| t.0.to_string()),
                "volume": e.involved_object.name,
                "type": e.type_,
                "reason": e.reason,
                "message": e.message,
            })
        })
        .collect();
    Ok(Json(Value::Array(out)))
}

async fn prometheus<D: Datastore>(store: D, sampler: Arc<Sampler>) -> Result<Response, ApiError> {
    let page = metrics::page(&store, &sampler).await?;
    Ok(([(axum::http::header::CONTENT_TYPE, metrics::encode::CONTENT_TYPE)], page).into_response())
}

/// A volume's I/O rates over the latest interval (its engine's counters,
/// sampled as for `/metrics`); the UI's charts ask each second.
async fn volume_io<D: Datastore>(store: D, sampler: Arc<Sampler>, name: String) -> Reply {
    store.get::<Volume>(&name).await?.ok_or_else(|| not_found("volume", &name))?;
    match metrics::volume_io(&store, &sampler, &name).await? {
        Some(rates) => reply(&rates),
        None => Err(ApiError(
            StatusCode::CONFLICT,
            format!("volume {name:?} is not attached or its engine does not answer"),
        )),
    }
}

async fn list_settings<D: Datastore>(State(store): State<D>) -> Reply {
    let values = settings::Values::load(&store).await?;
    let out = settings::DEFINITIONS
        .iter()
        .map(|def| {
            json!({
                "name": def.name,
                "value": values.get(def.name),
                "default": def.default,
                "description": def.description,
            })
        })
        .collect();
    Ok(Json(Value::Array(out)))
}

async fn get_setting<D: Datastore>(State(store): State<D>, Path(name): Path<String>) -> Reply {
    let def = settings::definition(&name).ok_or_else(|| not_found("setting", &name))?;
    Ok(Json(json!({
        "name": def.name,
        "value": settings::get(&store, def.name).await?,
        "default": def.default,
        "description": def.description,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetSetting {
    value: String,
}

async fn set_setting<D: Datastore>(
    State(store): State<D>,
    Path(name): Path<String>,
    body: Result<Json<SetSetting>, axum::extract::rejection::JsonRejection>,
) -> Reply {
    let Json(body) = body.map_err(|e| bad(e.body_text()))?;
    if settings::definition(&name).is_none() {
        return Err(not_found("setting", &name));
    }
    let value = settings::set(&store, &name, &body.value).await.map_err(bad)?;
    Ok(Json(json!({ "name": name, "value": value })))
}
