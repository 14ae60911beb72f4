//! The Kubernetes datastore: the CRDs of `deploy/crds.yaml` through the
//! apiserver, in one namespace. Conflicts (HTTP 409 on a write carrying a
//! stale resourceVersion) become [`Error::Conflict`] so the facade's
//! read-modify-write helpers retry; a create of an existing name (also 409)
//! becomes [`Error::AlreadyExists`].
//!
//! Watches list once for a resourceVersion, then watch from it; when the
//! stream ends or the version expires (410) they list and watch again.
//!
//! [`KubeStore::cached`] (what the manager runs) reads from watch-fed
//! caches instead (see [`super::cache`]); [`KubeStore::new`] reads from the
//! apiserver every time (an instance manager reads one object a minute).

use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use super::cache::{Caches, KindCache, unsure};
use super::{Change, Datastore, Error, Object, Result};

#[derive(Clone)]
pub struct KubeStore {
    client: Client,
    namespace: String,
    caches: Option<Caches>,
}

impl KubeStore {
    /// Every read asks the apiserver.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self { client, namespace: namespace.to_string(), caches: None }
    }

    /// Reads come from watch-fed caches, one per kind, started on first use.
    pub fn cached(client: Client, namespace: &str) -> Self {
        Self { client, namespace: namespace.to_string(), caches: Some(Caches::default()) }
    }

    /// A cached store with a client from the in-cluster service account or
    /// ~/.kube/config.
    pub async fn connect(namespace: &str) -> Result<Self> {
        let client = Client::try_default().await.map_err(|e| Error::Backend(format!("kubernetes client: {e}")))?;
        Ok(Self::cached(client, namespace))
    }

    fn cache<K: Object>(&self) -> Option<std::sync::Arc<KindCache>> {
        self.caches.as_ref().map(|c| c.of::<K>(&self.client, &self.namespace))
    }

    /// Keeps the cache in step with a write's answer.
    fn wrote<K: Object>(&self, name: &str, result: Result<K>) -> Result<K> {
        if let Some(cache) = self.cache::<K>() {
            match &result {
                Ok(object) => cache.learned(name, Some(object)),
                Err(e) if unsure(e) => cache.invalidate(name),
                Err(_) => {}
            }
        }
        result
    }

    fn api<K: Object>(&self) -> Api<K> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

fn map_error<K: Object>(verb: &str, name: &str, error: kube::Error, on_409: fn(String, String) -> Error) -> Error {
    let kind = K::kind(&()).to_string();
    let name = name.to_string();
    match error {
        kube::Error::Api(status) => match status.code {
            404 => Error::NotFound { kind, name },
            409 => on_409(kind, name),
            401 | 403 => Error::Forbidden { verb: verb.to_string(), kind, name, message: status.message },
            400 | 422 => Error::Invalid { kind, name, message: status.message },
            code => Error::Backend(format!("apiserver answered {code} to {verb} {kind} {name}: {}", status.message)),
        },
        other => Error::Backend(format!("{verb} {kind} {name}: apiserver unreachable: {other}")),
    }
}

fn conflict(kind: String, name: String) -> Error {
    Error::Conflict { kind, name }
}

fn exists(kind: String, name: String) -> Error {
    Error::AlreadyExists { kind, name }
}

impl Datastore for KubeStore {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn get<K: Object>(&self, name: &str) -> Result<Option<K>> {
        let cache = self.cache::<K>();
        if let Some(cache) = &cache
            && let Some(cached) = cache.get::<K>(name).await
        {
            return cached;
        }
        let fresh = self.api::<K>().get_opt(name).await.map_err(|e| map_error::<K>("get", name, e, conflict))?;
        if let Some(cache) = cache {
            cache.learned(name, fresh.as_ref());
        }
        Ok(fresh)
    }

    async fn list<K: Object>(&self) -> Result<Vec<K>> {
        if let Some(cache) = self.cache::<K>()
            && let Some(cached) = cache.list::<K>().await
        {
            return cached;
        }
        let list =
            self.api::<K>().list(&ListParams::default()).await.map_err(|e| map_error::<K>("list", "", e, conflict))?;
        Ok(list.items)
    }

    async fn create<K: Object>(&self, object: &K) -> Result<K> {
        let name = object.name_any();
        let result = self
            .api::<K>()
            .create(&PostParams::default(), object)
            .await
            .map_err(|e| map_error::<K>("create", &name, e, exists));
        self.wrote(&name, result)
    }

    async fn replace<K: Object>(&self, object: &K) -> Result<K> {
        let name = object.name_any();
        let result = self
            .api::<K>()
            .replace(&name, &PostParams::default(), object)
            .await
            .map_err(|e| map_error::<K>("update", &name, e, conflict));
        self.wrote(&name, result)
    }

    async fn replace_status<K: Object>(&self, object: &K) -> Result<K> {
        let name = object.name_any();
        let result = self
            .api::<K>()
            .replace_status(&name, &PostParams::default(), object)
            .await
            .map_err(|e| map_error::<K>("update status of", &name, e, conflict));
        self.wrote(&name, result)
    }

    async fn delete<K: Object>(&self, name: &str) -> Result<()> {
        let result = match self.api::<K>().delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(e) => Err(map_error::<K>("delete", name, e, conflict)),
        };
        // Gone, or only marked for deletion: read it again to know.
        if let Some(cache) = self.cache::<K>() {
            cache.invalidate(name);
        }
        result
    }

    async fn watch<K: Object>(&self) -> Result<mpsc::Receiver<Change>> {
        if let Some(cache) = self.cache::<K>() {
            return Ok(cache.subscribe());
        }
        use futures_util::StreamExt;
        let (tx, rx) = mpsc::channel(1024);
        let api = self.api::<K>();
        let kind = K::kind(&()).to_string();
        tokio::spawn(async move {
            let mut failures = 0u32;
            while !tx.is_closed() {
                let version = match api.list(&ListParams::default().limit(1)).await {
                    Ok(list) => list.metadata.resource_version.unwrap_or_default(),
                    Err(e) => {
                        failures += 1;
                        tracing::warn!(%kind, error = %e, "list for watch failed");
                        tokio::time::sleep(std::time::Duration::from_millis(200 * failures.min(25) as u64)).await;
                        continue;
                    }
                };
                let stream = match api.watch(&WatchParams::default(), &version).await {
                    Ok(stream) => stream,
                    Err(e) => {
                        failures += 1;
                        tracing::warn!(%kind, error = %e, "watch failed");
                        tokio::time::sleep(std::time::Duration::from_millis(200 * failures.min(25) as u64)).await;
                        continue;
                    }
                };
                failures = 0;
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    let name = match event {
                        Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) => o.name_any(),
                        Ok(WatchEvent::Bookmark(_)) => continue,
                        Ok(WatchEvent::Error(e)) => {
                            tracing::info!(%kind, error = %e, "watch ended; listing again");
                            break;
                        }
                        Err(e) => {
                            tracing::info!(%kind, error = %e, "watch stream error; listing again");
                            break;
                        }
                    };
                    if tx.send(Change { kind: kind.clone(), name }).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }
}
