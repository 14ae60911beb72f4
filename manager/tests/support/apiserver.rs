//! An in-memory apiserver behind tower-test mock services: objects by URL,
//! resourceVersions and conflicts, status as a subresource of ironhorn.io
//! kinds (dropped on create, kept on a main-resource update), finalizers,
//! and watches replayed from a resourceVersion. Every request is recorded
//! with the name of the client that made it, so tests can count them and
//! check them against RBAC rules; a client can be cut off (every request
//! answered 503) to play a manager whose apiserver link failed.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};
use tokio::sync::mpsc;

pub type MockBody = BoxBody<Bytes, std::io::Error>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    pub client: String,
    pub method: String,
    pub path: String,
    pub query: String,
}

/// Where a request points.
struct Target {
    /// The collection: everything before the name (`/apis/g/v/namespaces/ns/plural`).
    collection: String,
    name: Option<String>,
    status: bool,
    /// ironhorn.io custom resources keep status as a subresource.
    status_subresource: bool,
}

fn parse(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (prefix_len, group) = match parts.first()? {
        &"api" => (2, ""),
        &"apis" => (3, *parts.get(1)?),
        _ => return None,
    };
    let mut rest = &parts[prefix_len.min(parts.len())..];
    let mut collection: Vec<&str> = parts[..prefix_len].to_vec();
    if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        collection.extend_from_slice(&rest[..2]);
        rest = &rest[2..];
    }
    let plural = rest.first()?;
    collection.push(plural);
    let name = rest.get(1).map(|s| s.to_string());
    let status = rest.get(2) == Some(&"status");
    Some(Target {
        collection: format!("/{}", collection.join("/")),
        name,
        status,
        status_subresource: group == "ironhorn.io",
    })
}

struct Event {
    version: u64,
    collection: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct State {
    /// (collection, name) → object
    objects: BTreeMap<(String, String), Value>,
    version: u64,
    events: Vec<Event>,
    watchers: Vec<(String, u64, mpsc::UnboundedSender<Result<Frame<Bytes>, std::io::Error>>)>,
    log: Vec<Logged>,
    cut_off: HashSet<String>,
    /// Clients answered 403 (no RBAC rule).
    forbidden: HashSet<String>,
    /// client → (collection suffix, creates still allowed there)
    create_budget: BTreeMap<String, (String, usize)>,
}

#[derive(Clone, Default)]
pub struct FakeApiserver {
    state: Arc<Mutex<State>>,
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code })
}

fn full(value: &Value) -> MockBody {
    http_body_util::Full::new(Bytes::from(serde_json::to_vec(value).unwrap())).map_err(|e| match e {}).boxed()
}

fn answer(code: StatusCode, body: MockBody) -> Response<MockBody> {
    Response::builder().status(code).header("content-type", "application/json").body(body).unwrap()
}

fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query.split('&').find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

impl FakeApiserver {
    pub fn new() -> Self {
        Self::default()
    }

    /// A kube client whose requests are recorded as `who`'s.
    pub fn client(&self, who: &str) -> kube::Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<kube::client::Body>, Response<MockBody>>();
        let this = self.clone();
        let who = who.to_string();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let this = this.clone();
                let who = who.clone();
                tokio::spawn(async move {
                    let response = this.serve(&who, request).await;
                    send.send_response(response);
                });
            }
        });
        kube::Client::new(service, "ironhorn-system")
    }

    /// From now on every request of `who` is answered 503 (or again served).
    pub fn cut_off(&self, who: &str, cut: bool) {
        let mut state = self.state.lock().unwrap();
        if cut {
            state.cut_off.insert(who.to_string());
        } else {
            state.cut_off.remove(who);
        }
    }

    /// From now on every request of `who` is answered 403 Forbidden.
    pub fn forbid(&self, who: &str) {
        self.state.lock().unwrap().forbidden.insert(who.to_string());
    }

    /// `who` may create `n` more objects in collections ending in `suffix`;
    /// after that it is cut off (a manager dying between two writes).
    pub fn die_after_creates(&self, who: &str, suffix: &str, n: usize) {
        self.state.lock().unwrap().create_budget.insert(who.to_string(), (suffix.to_string(), n));
    }

    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    pub fn clear_log(&self) {
        self.state.lock().unwrap().log.clear();
    }

    /// Puts an object in place as an administrator would (not logged).
    pub fn seed(&self, collection: &str, mut object: Value) {
        let mut state = self.state.lock().unwrap();
        state.version += 1;
        object["metadata"]["resourceVersion"] = json!(state.version.to_string());
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        state.objects.insert((collection.to_string(), name), object);
    }

    pub fn objects(&self, collection: &str) -> Vec<Value> {
        let state = self.state.lock().unwrap();
        state.objects.iter().filter(|((c, _), _)| c == collection).map(|(_, v)| v.clone()).collect()
    }

    pub fn object(&self, collection: &str, name: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(&(collection.to_string(), name.to_string())).cloned()
    }

    async fn serve(&self, who: &str, request: Request<kube::client::Body>) -> Response<MockBody> {
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let query = request.uri().query().unwrap_or("").to_string();
        let bytes = request.into_body().collect_bytes().await.unwrap_or_default();
        let body: Value =
            if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap_or(Value::Null) };
        let mut state = self.state.lock().unwrap();
        state.log.push(Logged {
            client: who.into(),
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
        });
        if method == Method::POST
            && let Some((suffix, left)) = state.create_budget.get_mut(who)
            && path.ends_with(suffix.as_str())
        {
            if *left == 0 {
                state.cut_off.insert(who.to_string());
            } else {
                *left -= 1;
            }
        }
        if state.cut_off.contains(who) {
            return answer(StatusCode::SERVICE_UNAVAILABLE, full(&status_body(503, "ServiceUnavailable", "cut off")));
        }
        if state.forbidden.contains(who) {
            let message = format!("User \"system:serviceaccount:ironhorn-system:{who}\" cannot {method} {path}");
            return answer(StatusCode::FORBIDDEN, full(&status_body(403, "Forbidden", &message)));
        }
        let Some(target) = parse(&path) else {
            return answer(StatusCode::NOT_FOUND, full(&status_body(404, "NotFound", &format!("no route {path}"))));
        };
        match (&method, &target.name) {
            (&Method::GET, None) => {
                let watching = matches!(query_value(&query, "watch"), Some("true" | "1"));
                if watching {
                    let from: u64 = query_value(&query, "resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
                    let (tx, rx) = mpsc::unbounded_channel();
                    for e in state.events.iter().filter(|e| e.version > from && e.collection == target.collection) {
                        let _ = tx.send(Ok(event_frame(e.kind, &e.object)));
                    }
                    state.watchers.push((target.collection.clone(), from, tx));
                    let stream = StreamBody::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)).boxed();
                    return answer(StatusCode::OK, stream);
                }
                let items: Vec<Value> = state
                    .objects
                    .iter()
                    .filter(|((c, _), _)| *c == target.collection)
                    .map(|(_, v)| v.clone())
                    .collect();
                let list = json!({ "apiVersion": "v1", "kind": "List",
                                   "metadata": { "resourceVersion": state.version.to_string() }, "items": items });
                answer(StatusCode::OK, full(&list))
            }
            (&Method::GET, Some(name)) => match state.objects.get(&(target.collection.clone(), name.clone())) {
                Some(object) => answer(StatusCode::OK, full(object)),
                None => not_found(name),
            },
            (&Method::POST, None) => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default().to_string();
                let key = (target.collection.clone(), name.clone());
                if state.objects.contains_key(&key) {
                    return answer(
                        StatusCode::CONFLICT,
                        full(&status_body(409, "AlreadyExists", &format!("{name} already exists"))),
                    );
                }
                let mut object = body;
                if target.status_subresource {
                    object.as_object_mut().unwrap().remove("status");
                }
                object["metadata"]["uid"] = json!(format!("uid-{name}"));
                object["metadata"]["creationTimestamp"] = json!("2026-12-03T00:00:00Z");
                if target.collection.contains("/namespaces/") {
                    object["metadata"]["namespace"] = json!("ironhorn-system");
                }
                let stored = state.write(&target.collection, &name, object, "ADDED");
                answer(StatusCode::CREATED, full(&stored))
            }
            (&Method::PUT, Some(name)) => {
                let key = (target.collection.clone(), name.clone());
                let Some(current) = state.objects.get(&key).cloned() else { return not_found(name) };
                let sent = body["metadata"]["resourceVersion"].as_str().unwrap_or("");
                if !sent.is_empty() && sent != current["metadata"]["resourceVersion"].as_str().unwrap_or("") {
                    return answer(
                        StatusCode::CONFLICT,
                        full(&status_body(
                            409,
                            "Conflict",
                            "the object has been modified; apply your changes to the latest version",
                        )),
                    );
                }
                let mut object = if target.status {
                    let mut object = current.clone();
                    object["status"] = body["status"].clone();
                    object
                } else {
                    let mut object = body;
                    if target.status_subresource {
                        match current.get("status") {
                            Some(s) => object["status"] = s.clone(),
                            None => {
                                object.as_object_mut().unwrap().remove("status");
                            }
                        }
                    }
                    for key in ["uid", "creationTimestamp", "deletionTimestamp", "namespace"] {
                        match current["metadata"].get(key) {
                            Some(v) => object["metadata"][key] = v.clone(),
                            None => {
                                object["metadata"].as_object_mut().unwrap().remove(key);
                            }
                        }
                    }
                    object
                };
                let finalizers_empty = object["metadata"]["finalizers"].as_array().is_none_or(|f| f.is_empty());
                if object["metadata"]["deletionTimestamp"].is_string() && finalizers_empty {
                    object["metadata"]["resourceVersion"] = json!(state.version.to_string());
                    state.remove(&target.collection, name);
                    return answer(StatusCode::OK, full(&object));
                }
                let stored = state.write(&target.collection, name, std::mem::take(&mut object), "MODIFIED");
                answer(StatusCode::OK, full(&stored))
            }
            (&Method::DELETE, Some(name)) => {
                let key = (target.collection.clone(), name.clone());
                let Some(mut current) = state.objects.get(&key).cloned() else { return not_found(name) };
                let has_finalizers = current["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
                if has_finalizers {
                    if !current["metadata"]["deletionTimestamp"].is_string() {
                        current["metadata"]["deletionTimestamp"] = json!("2026-12-03T00:00:01Z");
                        current = state.write(&target.collection, name, current, "MODIFIED");
                    }
                    return answer(StatusCode::OK, full(&current));
                }
                state.remove(&target.collection, name);
                answer(StatusCode::OK, full(&current))
            }
            _ => answer(
                StatusCode::METHOD_NOT_ALLOWED,
                full(&status_body(405, "MethodNotAllowed", &format!("{method} {path} is not served"))),
            ),
        }
    }
}

fn not_found(name: &str) -> Response<MockBody> {
    answer(StatusCode::NOT_FOUND, full(&status_body(404, "NotFound", &format!("{name} not found"))))
}

fn event_frame(kind: &str, object: &Value) -> Frame<Bytes> {
    let mut line = serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap();
    line.push(b'\n');
    Frame::data(Bytes::from(line))
}

impl State {
    fn write(&mut self, collection: &str, name: &str, mut object: Value, kind: &'static str) -> Value {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.objects.insert((collection.to_string(), name.to_string()), object.clone());
        self.notify(collection, kind, &object);
        object
    }

    fn remove(&mut self, collection: &str, name: &str) {
        if let Some(mut object) = self.objects.remove(&(collection.to_string(), name.to_string())) {
            self.version += 1;
            object["metadata"]["resourceVersion"] = json!(self.version.to_string());
            self.notify(collection, "DELETED", &object);
        }
    }

    fn notify(&mut self, collection: &str, kind: &'static str, object: &Value) {
        let version = self.version;
        self.events.push(Event { version, collection: collection.to_string(), kind, object: object.clone() });
        self.watchers.retain(|(c, _, tx)| c != collection || tx.send(Ok(event_frame(kind, object))).is_ok());
    }
}
