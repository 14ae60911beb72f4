//! A small HTTP/1.1 JSON client for the REST API (what the CLI and the CSI
//! controller use).

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use std::time::Duration;

use serde_json::Value;

/// Why a call to the API failed: the API could not be reached or answered
/// garbage, or it answered with an HTTP error (its status and message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("{0}")]
    Unreachable(String),
    #[error("{message}")]
    Refused { status: u16, message: String },
}

impl CallError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, CallError::Refused { status: 404, .. })
    }
}

impl From<CallError> for String {
    fn from(e: CallError) -> String {
        e.to_string()
    }
}

/// Calls the API at `base` (`http://HOST:PORT`). Non-2xx answers become an
/// error with the server's message.
pub async fn call(base: &str, method: &str, path: &str, body: Option<&Value>) -> Result<Value, CallError> {
    let unreachable = CallError::Unreachable;
    let authority = base
        .strip_prefix("http://")
        .ok_or_else(|| unreachable(format!("API address {base:?}: expected http://HOST:PORT")))?;
    let authority = authority.trim_end_matches('/');
    let stream = tokio::net::TcpStream::connect(authority).await.map_err(|e| {
        unreachable(format!("cannot reach the ironhorn API at {base}: {e} (is `ironhorn up` running?)"))
    })?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(io).await.map_err(|e| unreachable(format!("API {base}: {e}")))?;
    tokio::spawn(connection);
    let bytes = match body {
        Some(v) => serde_json::to_vec(v).map_err(|e| unreachable(e.to_string()))?,
        None => Vec::new(),
    };
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", authority)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|e| unreachable(e.to_string()))?;
    let response = sender.send_request(request).await.map_err(|e| unreachable(format!("API {base}{path}: {e}")))?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|e| unreachable(e.to_string()))?.to_bytes();
    let value: Value = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) };
    if !status.is_success() {
        let message = value["error"].as_str().map(str::to_string).unwrap_or_else(|| format!("HTTP {status}"));
        return Err(CallError::Refused { status: status.as_u16(), message });
    }
    Ok(value)
}

/// Polls a volume until `done` holds for it (None: it does not exist), or
/// fails after `timeout` saying what state it was left in.
pub async fn wait_for(
    api: &str,
    name: &str,
    timeout: Duration,
    done: impl Fn(Option<&Value>) -> bool,
) -> Result<Option<Value>, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let volume = match call(api, "GET", &format!("/v1/volumes/{name}"), None).await {
            Ok(v) => Some(v),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e.into()),
        };
        if done(volume.as_ref()) {
            return Ok(volume);
        }
        if tokio::time::Instant::now() >= deadline {
            let state = volume.and_then(|v| v["status"]["state"].as_str().map(str::to_string));
            return Err(format!(
                "volume {name}: still {} after {}s",
                state.as_deref().unwrap_or("gone"),
                timeout.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
