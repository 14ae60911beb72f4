//! Events: what the controllers decided and why, as Kubernetes core/v1
//! Events about a Volume (through the datastore facade, so `kubectl get
//! events` shows them in a cluster and `ironhorn event list` everywhere).
//! Bounded: the oldest are deleted past [`KEEP`]. They live in the
//! manager's own namespace (the datastore's).

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::datastore::Datastore;

pub const KEEP: usize = 1000;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

/// Records an event about a volume. Failing to record is logged, never
/// fatal: the decision it describes was already applied.
pub async fn record<D: Datastore>(store: &D, volume: &str, kind: Kind, reason: &str, message: &str) {
    // Messages carry text from processes' logs: no terminal codes in events.
    let message = &ironhorn_proto::say::plain(message);
    let now = jiff::Timestamp::now();
    match kind {
        Kind::Normal => tracing::info!(%volume, reason, "{message}"),
        Kind::Warning => tracing::warn!(%volume, reason, "{message}"),
    }
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{volume}.{:x}", now.as_nanosecond())),
            namespace: Some(store.namespace().to_string()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("ironhorn.io/v1alpha1".into()),
            kind: Some("Volume".into()),
            name: Some(volume.to_string()),
            namespace: Some(store.namespace().to_string()),
            ..Default::default()
        },
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        type_: Some(if kind == Kind::Normal { "Normal" } else { "Warning" }.into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        source: Some(EventSource { component: Some("ironhorn-manager".into()), ..Default::default() }),
        ..Default::default()
    };
    if let Err(e) = store.create(&event).await {
        tracing::warn!(error = %e, "could not record event");
        return;
    }
    if let Ok(mut all) = store.list::<Event>().await
        && all.len() > KEEP
    {
        all.sort_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0));
        for old in &all[..all.len() - KEEP] {
            if let Some(name) = &old.metadata.name {
                let _ = store.delete::<Event>(name).await;
            }
        }
    }
}
