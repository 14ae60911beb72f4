//! A small HTTP/1.1 JSON client for the REST API (what the CLI uses).

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;

/// Calls the API at `base` (`http://HOST:PORT`). Non-2xx answers become an
/// error with the server's message.
pub async fn call(base: &str, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    let authority =
        base.strip_prefix("http://").ok_or_else(|| format!("API address {base:?}: expected http://HOST:PORT"))?;
    let authority = authority.trim_end_matches('/');
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("cannot reach the ironhorn API at {base}: {e} (is `ironhorn up` running?)"))?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(io).await.map_err(|e| format!("API {base}: {e}"))?;
    tokio::spawn(connection);
    let bytes = match body {
        Some(v) => serde_json::to_vec(v).map_err(|e| e.to_string())?,
        None => Vec::new(),
    };
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", authority)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| format!("API {base}{path}: {e}"))?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    let value: Value = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) };
    if !status.is_success() {
        let message = value["error"].as_str().map(str::to_string).unwrap_or_else(|| format!("HTTP {status}"));
        return Err(message);
    }
    Ok(value)
}
