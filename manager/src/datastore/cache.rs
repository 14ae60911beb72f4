//! Watch-fed caches for [`super::kubernetes::KubeStore`]: one per kind, filled
//! by a LIST and kept current by a WATCH from its resourceVersion (listed
//! again when the watch ends or its version expires), so reads cost the
//! apiserver nothing; a manager at idle makes no request beyond its watches
//! and its lease renewals.
//!
//! Read-your-writes: an object a write returns goes into the cache at once
//! (unless the cache already holds a newer version). A write refused for a
//! stale resourceVersion, a missing object, or a delete (which may only
//! have marked the object) marks the name dirty: its next read goes to the
//! apiserver and refreshes the entry, so a read-modify-write retry never
//! spins on a stale copy.
//!
//! Change notifications ([`super::Datastore::watch`]) come from the same
//! watch: one per kind, however many subscribe.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use kube::Client;
use kube::api::DynamicObject;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::{Change, Error, Object, Result};

/// How long a read waits for a new cache's first LIST before it asks the
/// apiserver directly (a kind the account may not list still reads).
const SYNC_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Entries {
    objects: BTreeMap<String, Value>,
    dirty: HashSet<String>,
    /// Name → the resourceVersion its deletion was seen at, so a write's
    /// answer that arrives after the watch's DELETED cannot bring it back.
    deleted: HashMap<String, u64>,
}

impl Entries {
    /// Takes `value` for `name` unless what is held (or its deletion) is newer.
    fn offer(&mut self, name: &str, value: Value) -> bool {
        let gone = value["metadata"]["deletionTimestamp"].is_string()
            && value["metadata"]["finalizers"].as_array().is_none_or(|f| f.is_empty());
        if gone {
            // The write that removed the last finalizer deleted it.
            return self.remove(name, version(&value));
        }
        let tombstone = self.deleted.get(name).copied();
        if tombstone.is_some_and(|t| version(&value).is_none_or(|v| v <= t)) || !newer(&value, self.objects.get(name)) {
            return false;
        }
        self.deleted.remove(name);
        self.objects.insert(name.to_string(), value);
        true
    }

    fn remove(&mut self, name: &str, at: Option<u64>) -> bool {
        if let Some(at) = at {
            let t = self.deleted.entry(name.to_string()).or_insert(at);
            *t = (*t).max(at);
        }
        self.objects.remove(name).is_some()
    }
}

pub(super) struct KindCache {
    kind: String,
    api_version: String,
    entries: Mutex<Entries>,
    synced: watch::Sender<bool>,
    /// The informer's last LIST failed (reads go straight to the apiserver,
    /// and get its answer, instead of waiting).
    failing: std::sync::atomic::AtomicBool,
    subscribers: Mutex<Vec<mpsc::Sender<Change>>>,
}

fn version(value: &Value) -> Option<u64> {
    value["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok())
}

/// Whether `new` may replace `old` (resourceVersions are opaque to clients,
/// but the apiserver's are increasing integers; anything else is taken).
fn newer(new: &Value, old: Option<&Value>) -> bool {
    match (version(new), old.and_then(version)) {
        (Some(n), Some(o)) => n >= o,
        _ => true,
    }
}

impl KindCache {
    fn notify(&self, name: &str) {
        let change = Change { kind: self.kind.clone(), name: name.to_string() };
        self.subscribers.lock().expect("subscribers").retain(|tx| match tx.try_send(change.clone()) {
            // A full subscriber misses an event; controllers resync on a timer.
            Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }

    pub(super) fn subscribe(&self) -> mpsc::Receiver<Change> {
        let (tx, rx) = mpsc::channel(1024);
        self.subscribers.lock().expect("subscribers").push(tx);
        rx
    }

    async fn wait_synced(&self) -> bool {
        if self.failing.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        let mut rx = self.synced.subscribe();
        tokio::time::timeout(SYNC_WAIT, rx.wait_for(|s| *s)).await.is_ok_and(|r| r.is_ok())
    }

    /// The cached object, or None when it must be read from the apiserver
    /// (not synced, or dirty). Some(None): cached as absent.
    pub(super) async fn get<K: Object>(&self, name: &str) -> Option<Result<Option<K>>> {
        if !self.wait_synced().await {
            return None;
        }
        let entries = self.entries.lock().expect("cache");
        if entries.dirty.contains(name) {
            return None;
        }
        Some(entries.objects.get(name).map(decode).transpose())
    }

    pub(super) async fn list<K: Object>(&self) -> Option<Result<Vec<K>>> {
        if !self.wait_synced().await {
            return None;
        }
        let entries = self.entries.lock().expect("cache");
        Some(entries.objects.values().map(decode).collect())
    }

    /// Records what the apiserver answered for `name` (None: it is gone).
    pub(super) fn learned<K: Object>(&self, name: &str, object: Option<&K>) {
        let mut entries = self.entries.lock().expect("cache");
        entries.dirty.remove(name);
        match object.and_then(|o| serde_json::to_value(o).ok()) {
            Some(value) => {
                entries.offer(name, value);
            }
            None => {
                entries.remove(name, None);
            }
        }
    }

    /// The next read of `name` goes to the apiserver.
    pub(super) fn invalidate(&self, name: &str) {
        self.entries.lock().expect("cache").dirty.insert(name.to_string());
    }

    /// An object as the apiserver sent it, with the type fields list items
    /// of core kinds leave out.
    fn typed(&self, object: &DynamicObject) -> Option<(String, Value)> {
        let mut value = serde_json::to_value(object).ok()?;
        value["apiVersion"] = Value::String(self.api_version.clone());
        value["kind"] = Value::String(self.kind.clone());
        Some((object.metadata.name.clone()?, value))
    }

    fn apply(&self, event: WatchEvent<DynamicObject>) -> std::result::Result<(), String> {
        let (name, value) = match &event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => match self.typed(o) {
                Some((name, value)) => (name, Some(value)),
                None => return Ok(()),
            },
            WatchEvent::Deleted(o) => match &o.metadata.name {
                Some(name) => (name.clone(), None),
                None => return Ok(()),
            },
            WatchEvent::Bookmark(_) => return Ok(()),
            WatchEvent::Error(e) => return Err(e.to_string()),
        };
        let changed = {
            let mut entries = self.entries.lock().expect("cache");
            match value {
                Some(v) => entries.offer(&name, v),
                None => {
                    let at = match &event {
                        WatchEvent::Deleted(o) => o.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()),
                        _ => None,
                    };
                    entries.remove(&name, at);
                    true
                }
            }
        };
        if !changed {
            return Ok(());
        }
        self.notify(&name);
        Ok(())
    }

    /// A fresh LIST: the cache becomes exactly it; changed names notified.
    fn replace_all(&self, items: &[DynamicObject]) {
        let fresh: BTreeMap<String, Value> = items.iter().filter_map(|o| self.typed(o)).collect();
        let changed: Vec<String> = {
            let mut entries = self.entries.lock().expect("cache");
            let mut changed: Vec<String> =
                entries.objects.keys().filter(|n| !fresh.contains_key(*n)).cloned().collect();
            changed.extend(fresh.iter().filter(|(n, v)| entries.objects.get(*n) != Some(v)).map(|(n, _)| n.clone()));
            entries.objects = fresh;
            entries.dirty.clear();
            entries.deleted.clear();
            changed
        };
        for name in changed {
            self.notify(&name);
        }
        self.synced.send_replace(true);
    }
}

fn decode<K: Object>(value: &Value) -> Result<K> {
    serde_json::from_value(value.clone()).map_err(|e| Error::Backend(format!("cached {}: {e}", K::kind(&()))))
}

/// Every kind's cache of one store.
#[derive(Clone, Default)]
pub(super) struct Caches {
    kinds: Arc<Mutex<HashMap<String, Arc<KindCache>>>>,
}

impl Caches {
    /// The cache of kind K, started (LIST + WATCH task) on first use.
    pub(super) fn of<K: Object>(&self, client: &Client, namespace: &str) -> Arc<KindCache> {
        let key = format!("{}/{}", K::group(&()), K::plural(&()));
        let mut kinds = self.kinds.lock().expect("caches");
        if let Some(cache) = kinds.get(&key) {
            return cache.clone();
        }
        let cache = Arc::new(KindCache {
            kind: K::kind(&()).to_string(),
            api_version: K::api_version(&()).to_string(),
            entries: Mutex::default(),
            synced: watch::channel(false).0,
            failing: Default::default(),
            subscribers: Mutex::default(),
        });
        kinds.insert(key, cache.clone());
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            namespace,
            &kube::api::ApiResource {
                group: K::group(&()).to_string(),
                version: K::version(&()).to_string(),
                api_version: K::api_version(&()).to_string(),
                kind: K::kind(&()).to_string(),
                plural: K::plural(&()).to_string(),
            },
        );
        tokio::spawn(inform(api, Arc::downgrade(&cache)));
        cache
    }
}

/// LIST, then WATCH from its version, forever; again on any end.
async fn inform(api: Api<DynamicObject>, cache: std::sync::Weak<KindCache>) {
    let mut failures = 0u32;
    loop {
        let Some(kind) = cache.upgrade().map(|c| c.kind.clone()) else { return };
        let backoff = |failures: u32| Duration::from_millis(200 * u64::from(failures.min(25)));
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(e) => {
                failures += 1;
                if let Some(c) = cache.upgrade() {
                    c.failing.store(true, std::sync::atomic::Ordering::Relaxed);
                    c.synced.send_replace(false);
                }
                tracing::warn!(%kind, error = %e, "cache list failed");
                tokio::time::sleep(backoff(failures)).await;
                continue;
            }
        };
        let version = list.metadata.resource_version.clone().unwrap_or_default();
        match cache.upgrade() {
            Some(c) => {
                c.failing.store(false, std::sync::atomic::Ordering::Relaxed);
                c.replace_all(&list.items)
            }
            None => return,
        }
        let stream = match api.watch(&WatchParams::default(), &version).await {
            Ok(stream) => stream,
            Err(e) => {
                failures += 1;
                tracing::warn!(%kind, error = %e, "cache watch failed");
                tokio::time::sleep(backoff(failures)).await;
                continue;
            }
        };
        failures = 0;
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let Some(c) = cache.upgrade() else { return };
            let event = match event {
                Ok(e) => e,
                Err(e) => {
                    tracing::info!(%kind, error = %e, "cache watch stream error; listing again");
                    break;
                }
            };
            if let Err(e) = c.apply(event) {
                tracing::info!(%kind, error = %e, "cache watch ended; listing again");
                break;
            }
        }
    }
}

/// Why a write's answer leaves the cached copy unknown.
pub(super) fn unsure(error: &Error) -> bool {
    matches!(error, Error::Conflict { .. } | Error::NotFound { .. } | Error::AlreadyExists { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(version: u64, deleting: bool) -> Value {
        let mut v = json!({ "metadata": { "name": "v1", "resourceVersion": version.to_string() } });
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-12-03T00:00:00Z");
        }
        v
    }

    #[test]
    fn a_late_write_answer_does_not_bring_back_a_deleted_object() {
        let mut entries = Entries::default();
        assert!(entries.offer("v1", object(5, false)));
        assert!(!entries.offer("v1", object(4, false)), "older than held");
        // The watch says deleted at 7; the answer of the write that removed
        // the last finalizer (version 6) comes after it.
        assert!(entries.remove("v1", Some(7)));
        assert!(!entries.offer("v1", object(6, false)));
        assert!(!entries.objects.contains_key("v1"));
        // Created again later: taken.
        assert!(entries.offer("v1", object(8, false)));
        assert!(entries.objects.contains_key("v1"));
    }

    #[test]
    fn an_answer_with_deletion_and_no_finalizers_means_gone() {
        let mut entries = Entries::default();
        entries.offer("v1", object(5, false));
        entries.offer("v1", object(6, true));
        assert!(!entries.objects.contains_key("v1"));
        assert!(!entries.offer("v1", object(6, false)), "the same version again stays deleted");
    }
}
