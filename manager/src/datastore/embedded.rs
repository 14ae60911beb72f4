//! The embedded datastore: one machine, one directory. Each object is a JSON
//! file `<dir>/<plural>/<name>.json`, written whole to a temporary file,
//! fsynced and renamed into place, so a crash leaves the old or the new
//! object, never half of one. All objects are also held in memory; reads never
//! touch the disk. A manager restarted on the same directory sees exactly what
//! was last written.
//!
//! Watches are in-process channels. A watcher whose channel is full misses
//! events; controllers also resync on a timer, so a missed event delays a
//! reconcile, it never loses one.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Change, Datastore, Error, Object, Result};

#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    dir: PathBuf,
    /// plural → name → object
    objects: HashMap<String, BTreeMap<String, Value>>,
    next_version: u64,
    watchers: Vec<(String, mpsc::Sender<Change>)>,
}

fn now() -> String {
    jiff::Timestamp::now().to_string()
}

fn version_of(value: &Value) -> u64 {
    value["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn write_atomic(path: &Path, value: &Value) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    let mut file = std::fs::File::create(&tmp)?;
    std::io::Write::write_all(&mut file, &bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(path.parent().expect("object files live in a directory"))?.sync_all()
}

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Backend(e.to_string())
}

impl EmbeddedStore {
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| backend(format!("{}: {e}", dir.display())))?;
        let mut objects: HashMap<String, BTreeMap<String, Value>> = HashMap::new();
        let mut next_version = 1;
        for kind_dir in std::fs::read_dir(dir).map_err(backend)?.flatten() {
            if !kind_dir.path().is_dir() {
                continue;
            }
            let plural = kind_dir.file_name().to_string_lossy().into_owned();
            let map = objects.entry(plural).or_default();
            for file in std::fs::read_dir(kind_dir.path()).map_err(backend)?.flatten() {
                let path = file.path();
                if path.extension().is_none_or(|x| x != "json") {
                    continue; // leftovers of an interrupted write (*.json.tmp)
                }
                let bytes = std::fs::read(&path).map_err(|e| backend(format!("{}: {e}", path.display())))?;
                let value: Value =
                    serde_json::from_slice(&bytes).map_err(|e| backend(format!("{}: {e}", path.display())))?;
                next_version = next_version.max(version_of(&value) + 1);
                let name = value["metadata"]["name"].as_str().unwrap_or_default().to_string();
                map.insert(name, value);
            }
        }
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner { dir: dir.to_path_buf(), objects, next_version, watchers: Vec::new() })),
        })
    }
}

impl Inner {
    fn path(&self, plural: &str, name: &str) -> PathBuf {
        self.dir.join(plural).join(format!("{name}.json"))
    }

    fn bump(&mut self, value: &mut Value) {
        value["metadata"]["resourceVersion"] = json!(self.next_version.to_string());
        self.next_version += 1;
    }

    fn store(&mut self, kind: &str, plural: &str, name: &str, value: Value) -> Result<Value> {
        let path = self.path(plural, name);
        std::fs::create_dir_all(path.parent().expect("has parent")).map_err(backend)?;
        let finalizers_empty = value["metadata"]["finalizers"].as_array().is_none_or(|f| f.is_empty());
        if value["metadata"]["deletionTimestamp"].is_string() && finalizers_empty {
            self.remove(kind, plural, name)?;
            return Ok(value);
        }
        write_atomic(&path, &value).map_err(|e| backend(format!("{}: {e}", path.display())))?;
        self.objects.entry(plural.to_string()).or_default().insert(name.to_string(), value.clone());
        self.notify(kind, name);
        Ok(value)
    }

    fn remove(&mut self, kind: &str, plural: &str, name: &str) -> Result<()> {
        let path = self.path(plural, name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(backend(format!("{}: {e}", path.display()))),
        }
        if let Some(map) = self.objects.get_mut(plural) {
            map.remove(name);
        }
        self.notify(kind, name);
        Ok(())
    }

    fn notify(&mut self, kind: &str, name: &str) {
        self.watchers.retain(|(k, tx)| {
            if k != kind {
                return !tx.is_closed();
            }
            match tx.try_send(Change { kind: kind.to_string(), name: name.to_string() }) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => true,
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    fn current(&self, kind: &str, plural: &str, name: &str) -> Result<&Value> {
        self.objects
            .get(plural)
            .and_then(|m| m.get(name))
            .ok_or_else(|| Error::NotFound { kind: kind.to_string(), name: name.to_string() })
    }
}

fn names<K: Object>() -> (String, String) {
    (K::kind(&()).to_string(), K::plural(&()).to_string())
}

fn to_value<K: Object>(object: &K) -> Result<(String, Value)> {
    let value = serde_json::to_value(object).map_err(backend)?;
    let name = value["metadata"]["name"].as_str().unwrap_or_default().to_string();
    if name.is_empty() {
        return Err(backend(format!("{} without a name", K::kind(&()))));
    }
    Ok((name, value))
}

/// Reads the stored JSON in place (no copy of the tree first).
fn from_value<K: Object>(value: &Value) -> Result<K> {
    K::deserialize(value).map_err(backend)
}

/// The namespace embedded objects report (one machine has one).
pub const NAMESPACE: &str = "ironhorn-system";

impl Datastore for EmbeddedStore {
    fn namespace(&self) -> &str {
        NAMESPACE
    }

    async fn get<K: Object>(&self, name: &str) -> Result<Option<K>> {
        let (_, plural) = names::<K>();
        let inner = self.inner.lock().expect("datastore lock");
        inner.objects.get(&plural).and_then(|m| m.get(name)).map(from_value).transpose()
    }

    async fn list<K: Object>(&self) -> Result<Vec<K>> {
        let (_, plural) = names::<K>();
        let inner = self.inner.lock().expect("datastore lock");
        inner.objects.get(&plural).map(|m| m.values().map(from_value).collect()).unwrap_or(Ok(Vec::new()))
    }

    async fn create<K: Object>(&self, object: &K) -> Result<K> {
        let (kind, plural) = names::<K>();
        let (name, mut value) = to_value(object)?;
        let mut inner = self.inner.lock().expect("datastore lock");
        if inner.objects.get(&plural).is_some_and(|m| m.contains_key(&name)) {
            return Err(Error::AlreadyExists { kind, name });
        }
        // As the apiserver does for kinds with a status subresource: a
        // create writes metadata and spec; status only through replace_status.
        if let Some(map) = value.as_object_mut() {
            map.remove("status");
        }
        let serial = inner.next_version;
        value["metadata"]["uid"] = json!(format!("{:016x}-{serial}", jiff::Timestamp::now().as_nanosecond() as u64));
        value["metadata"]["creationTimestamp"] = json!(now());
        if value["metadata"]["namespace"].is_null() {
            value["metadata"]["namespace"] = json!(NAMESPACE);
        }
        inner.bump(&mut value);
        let stored = inner.store(&kind, &plural, &name, value)?;
        from_value(&stored)
    }

    async fn replace<K: Object>(&self, object: &K) -> Result<K> {
        let (kind, plural) = names::<K>();
        let (name, mut value) = to_value(object)?;
        let mut inner = self.inner.lock().expect("datastore lock");
        let current = inner.current(&kind, &plural, &name)?.clone();
        if version_of(&current) != version_of(&value) {
            return Err(Error::Conflict { kind, name });
        }
        // Status is not written through replace; deletion marks stay.
        match current.get("status") {
            Some(status) => value["status"] = status.clone(),
            None => {
                value.as_object_mut().expect("object").remove("status");
            }
        }
        for key in ["uid", "creationTimestamp", "deletionTimestamp", "namespace"] {
            match current["metadata"].get(key) {
                Some(v) => value["metadata"][key] = v.clone(),
                None => {
                    value["metadata"].as_object_mut().expect("metadata").remove(key);
                }
            }
        }
        inner.bump(&mut value);
        let stored = inner.store(&kind, &plural, &name, value)?;
        from_value(&stored)
    }

    async fn replace_status<K: Object>(&self, object: &K) -> Result<K> {
        let (kind, plural) = names::<K>();
        let (name, value) = to_value(object)?;
        let mut inner = self.inner.lock().expect("datastore lock");
        let mut current = inner.current(&kind, &plural, &name)?.clone();
        if version_of(&current) != version_of(&value) {
            return Err(Error::Conflict { kind, name });
        }
        current["status"] = value.get("status").cloned().unwrap_or(Value::Null);
        inner.bump(&mut current);
        let stored = inner.store(&kind, &plural, &name, current)?;
        from_value(&stored)
    }

    async fn delete<K: Object>(&self, name: &str) -> Result<()> {
        let (kind, plural) = names::<K>();
        let mut inner = self.inner.lock().expect("datastore lock");
        let Ok(current) = inner.current(&kind, &plural, name) else { return Ok(()) };
        let mut current = current.clone();
        let has_finalizers = current["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        if !has_finalizers {
            return inner.remove(&kind, &plural, name);
        }
        if current["metadata"]["deletionTimestamp"].is_string() {
            return Ok(());
        }
        current["metadata"]["deletionTimestamp"] = json!(now());
        inner.bump(&mut current);
        inner.store(&kind, &plural, name, current).map(drop)
    }

    async fn watch<K: Object>(&self) -> Result<mpsc::Receiver<Change>> {
        let (kind, _) = names::<K>();
        let (tx, rx) = mpsc::channel(1024);
        self.inner.lock().expect("datastore lock").watchers.push((kind, tx));
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Volume, VolumeSpec};
    use crate::datastore::update_status;

    fn volume(name: &str) -> Volume {
        Volume::new(name, VolumeSpec { size: 1 << 30, number_of_replicas: 3, ..Default::default() })
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ironhorn-embedded-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[tokio::test]
    async fn objects_survive_reopen_and_stale_writes_conflict() {
        let dir = temp_dir("reopen");
        let store = EmbeddedStore::open(&dir).unwrap();
        let created = store.create(&volume("v1")).await.unwrap();
        assert!(matches!(store.create(&volume("v1")).await, Err(Error::AlreadyExists { .. })));
        let mut first = created.clone();
        first.spec.number_of_replicas = 2;
        store.replace(&first).await.unwrap();
        // `created` carries the old resourceVersion now.
        let mut stale = created.clone();
        stale.spec.number_of_replicas = 1;
        assert!(matches!(store.replace(&stale).await, Err(Error::Conflict { .. })));
        update_status::<Volume, _>(&store, "v1", |v| {
            v.status.get_or_insert_default().state = "detached".into();
            true
        })
        .await
        .unwrap();
        drop(store);
        let store = EmbeddedStore::open(&dir).unwrap();
        let v: Volume = store.get("v1").await.unwrap().unwrap();
        assert_eq!(v.spec.number_of_replicas, 2);
        assert_eq!(v.status.unwrap().state, "detached");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn finalizers_hold_deletion_until_removed() {
        let dir = temp_dir("finalizer");
        let store = EmbeddedStore::open(&dir).unwrap();
        let mut v = volume("v2");
        v.metadata.finalizers = Some(vec![crate::crd::FINALIZER.into()]);
        store.create(&v).await.unwrap();
        let mut changes = store.watch::<Volume>().await.unwrap();
        store.delete::<Volume>("v2").await.unwrap();
        assert_eq!(changes.recv().await.unwrap().name, "v2");
        let mut marked: Volume = store.get("v2").await.unwrap().unwrap();
        assert!(marked.metadata.deletion_timestamp.is_some());
        marked.metadata.finalizers = Some(vec![]);
        store.replace(&marked).await.unwrap();
        assert!(store.get::<Volume>("v2").await.unwrap().is_none());
        assert!(!dir.join("volumes/v2.json").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
