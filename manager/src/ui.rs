//! The web UI: one page, its script and its style, compiled into the binary
//! (no network access, nothing to install) and served at `/` beside the
//! REST API; and `/v1/watch`, server-sent events fed by the datastore's
//! watch, so open pages update within a second of a change without polling.
//! Each event names the kind and object that changed; the page fetches what
//! it shows again (at most a few times a second).

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use futures_util::Stream;
use k8s_openapi::api::core::v1::Event as KubeEvent;
use tokio::sync::broadcast;

use crate::crd::*;
use crate::datastore::{Change, Datastore, Object};

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// Changes waiting for a slow page; a page further behind gets a "lagged"
/// event and refreshes everything.
const BACKLOG: usize = 1024;

/// Fans the datastore's watches out to every open page. The watches start
/// with the first page (a manager nobody looks at watches nothing more).
struct Hub<D> {
    store: D,
    sender: OnceLock<broadcast::Sender<Change>>,
}

impl<D: Datastore> Hub<D> {
    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.sender
            .get_or_init(|| {
                let (sender, _) = broadcast::channel(BACKLOG);
                forward::<D, Volume>(&self.store, &sender);
                forward::<D, Replica>(&self.store, &sender);
                forward::<D, Engine>(&self.store, &sender);
                forward::<D, Node>(&self.store, &sender);
                forward::<D, Setting>(&self.store, &sender);
                forward::<D, Snapshot>(&self.store, &sender);
                forward::<D, KubeEvent>(&self.store, &sender);
                sender
            })
            .subscribe()
    }
}

/// Forwards the changes of kind K for as long as the manager runs.
fn forward<D: Datastore, K: Object>(store: &D, sender: &broadcast::Sender<Change>) {
    let (store, sender) = (store.clone(), sender.clone());
    tokio::spawn(async move {
        loop {
            match store.watch::<K>().await {
                Ok(mut changes) => {
                    while let Some(change) = changes.recv().await {
                        // No page listening is fine.
                        let _ = sender.send(change);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "UI watch failed; retrying"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}

fn change_event(change: &Change) -> Event {
    Event::default().event("change").data(serde_json::json!({ "kind": change.kind, "name": change.name }).to_string())
}

fn events(changes: broadcast::Receiver<Change>) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(changes, |mut changes| async move {
        let event = match changes.recv().await {
            Ok(change) => change_event(&change),
            Err(broadcast::error::RecvError::Lagged(_)) => Event::default().event("lagged").data("{}"),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(event), changes))
    })
}

pub fn routes<D: Datastore>(store: D) -> Router<D> {
    let hub = Arc::new(Hub { store, sender: OnceLock::new() });
    Router::new()
        .route("/", get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX) }))
        .route("/ui/app.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT) }))
        .route("/ui/app.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) }))
        .route(
            "/v1/watch",
            get(move || {
                let changes = hub.subscribe();
                async move { Sse::new(events(changes)).keep_alive(KeepAlive::default()).into_response() }
            }),
        )
}
