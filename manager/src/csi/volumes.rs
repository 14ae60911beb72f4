//! The manager's volumes as both CSI services use them: look one up, wait
//! for a state, attach here and get the device, detach, delete. Each call
//! that changes something waits until status says it is done (or answers
//! DEADLINE_EXCEEDED after `WAIT`; the sidecars retry and the same call
//! picks up where it was).

use std::time::Duration;

use serde_json::json;
use tonic::Status;

use super::api_status;
use crate::client::call;
use crate::crd::Volume;

pub const WAIT: Duration = Duration::from_secs(90);

pub async fn get(api: &str, name: &str) -> Result<Option<Volume>, Status> {
    match call(api, "GET", &format!("/v1/volumes/{name}"), None).await {
        Ok(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(|e| Status::internal(format!("the manager's volume does not parse: {e}"))),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(api_status(e)),
    }
}

/// Polls the volume until `done` holds (None: it does not exist), gives up
/// with the error `done` returns, or DEADLINE_EXCEEDED after WAIT.
pub async fn wait(
    api: &str,
    name: &str,
    what: &str,
    done: impl Fn(Option<&Volume>) -> Result<bool, Status>,
) -> Result<Option<Volume>, Status> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = get(api, name).await?;
        if done(v.as_ref())? {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            let state = v.and_then(|v| v.status).map(|s| s.state).unwrap_or_else(|| "gone".into());
            return Err(Status::deadline_exceeded(format!("volume {name}: not {what} yet (still {state}); retry")));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Attaches the volume on `node` with the blockdev frontend; returns the
/// device once the engine made it.
pub async fn attach(api: &str, name: &str, node: &str) -> Result<String, Status> {
    let body = json!({ "node": node, "frontend": "blockdev" });
    call(api, "POST", &format!("/v1/volumes/{name}/attach"), Some(&body)).await.map_err(api_status)?;
    let attached = wait(api, name, "attached", |v| {
        let v = v.ok_or_else(|| Status::not_found(format!("volume {name} was deleted")))?;
        let s = v.status.clone().unwrap_or_default();
        Ok(s.state == "attached" && s.current_node_id == node && !s.blockdev.is_empty())
    })
    .await?;
    Ok(attached.and_then(|v| v.status).map(|s| s.blockdev).unwrap_or_default())
}

/// Waits until no engine of the volume runs (asking for a detach first
/// when `ask`).
pub async fn detach(api: &str, name: &str, ask: bool) -> Result<(), Status> {
    if ask {
        call(api, "POST", &format!("/v1/volumes/{name}/detach"), None).await.map_err(api_status)?;
    }
    wait(api, name, "detached", |v| {
        Ok(v.is_none_or(|v| v.status.as_ref().is_none_or(|s| s.current_node_id.is_empty() && s.state != "detaching")))
    })
    .await
    .map(drop)
}

/// Deletes the volume (already gone is fine) and waits until it and its
/// replicas' stores are gone.
pub async fn delete(api: &str, name: &str) -> Result<(), Status> {
    match call(api, "DELETE", &format!("/v1/volumes/{name}"), None).await {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(api_status(e)),
    }
    wait(api, name, "deleted", |v| Ok(v.is_none())).await.map(drop)
}
