//! One facade over the manager's objects, with two implementations:
//! [`embedded::EmbeddedStore`] (one machine: a directory of JSON files) and
//! [`kubernetes::KubeStore`] (custom resources through the apiserver).
//! Controllers are written once, against [`Datastore`].
//!
//! Semantics both implementations keep (they are the apiserver's):
//! - every write carries the object's resourceVersion; a stale one is a
//!   [`Error::Conflict`], so a read-modify-write never loses another writer's
//!   change ([`update_status`] and [`update`] retry on conflict);
//! - `create` and `replace` write metadata and spec (a status in the object
//!   is dropped, as the apiserver does for a status subresource),
//!   `replace_status` only status;
//! - deleting an object with finalizers only sets its deletionTimestamp; it
//!   goes away when the last finalizer is removed.

mod cache;
pub mod embedded;
pub mod health;
pub mod kubernetes;

use std::fmt::Debug;
use std::future::Future;

use kube::Resource;
use kube::core::NamespaceResourceScope;
use serde::Serialize;
use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{kind} {name} not found")]
    NotFound { kind: String, name: String },
    #[error("{kind} {name} already exists")]
    AlreadyExists { kind: String, name: String },
    #[error("{kind} {name} was changed by someone else (resourceVersion conflict)")]
    Conflict { kind: String, name: String },
    /// The backend refused this identity the request (apiserver 401/403).
    #[error(
        "the manager may not {verb} {kind} {name}: {message} (its service account lacks a rule; \
         see the Roles in deploy/ironhorn.yaml)"
    )]
    Forbidden { verb: String, kind: String, name: String, message: String },
    /// The backend rejected the object itself (apiserver 400/422).
    #[error("{kind} {name} rejected: {message}")]
    Invalid { kind: String, name: String, message: String },
    #[error("datastore: {0}")]
    Backend(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A stored object: one of the CRD types.
pub trait Object:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<T> Object for T where
    T: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// Which object changed (a watch event); reconcile reads the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub kind: String,
    pub name: String,
}

pub trait Datastore: Clone + Send + Sync + 'static {
    /// The namespace the objects live in (the manager's own).
    fn namespace(&self) -> &str;
    /// Why the last write failed, while the backend cannot take writes
    /// (only [`health::Recorded`] keeps track; others say None).
    fn write_failure(&self) -> Option<String> {
        None
    }
    fn get<K: Object>(&self, name: &str) -> impl Future<Output = Result<Option<K>>> + Send;
    fn list<K: Object>(&self) -> impl Future<Output = Result<Vec<K>>> + Send;
    fn create<K: Object>(&self, object: &K) -> impl Future<Output = Result<K>> + Send;
    /// Writes metadata and spec; status is left as stored.
    fn replace<K: Object>(&self, object: &K) -> impl Future<Output = Result<K>> + Send;
    /// Writes status only.
    fn replace_status<K: Object>(&self, object: &K) -> impl Future<Output = Result<K>> + Send;
    /// Deletes (or, with finalizers, marks for deletion). Absent is fine.
    fn delete<K: Object>(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Changes of kind K from now on, until the receiver is dropped.
    fn watch<K: Object>(&self) -> impl Future<Output = Result<tokio::sync::mpsc::Receiver<Change>>> + Send;
}

const RETRIES: usize = 8;

/// Read-modify-write of an object's status, retried on conflict. `change`
/// returns false when nothing needs writing.
pub async fn update_status<K: Object, D: Datastore>(
    store: &D,
    name: &str,
    change: impl FnMut(&mut K) -> bool,
) -> Result<Option<K>> {
    read_modify_write(store, name, change, true).await
}

/// Read-modify-write of an object's metadata and spec, retried on conflict.
pub async fn update<K: Object, D: Datastore>(
    store: &D,
    name: &str,
    change: impl FnMut(&mut K) -> bool,
) -> Result<Option<K>> {
    read_modify_write(store, name, change, false).await
}

async fn read_modify_write<K: Object, D: Datastore>(
    store: &D,
    name: &str,
    mut change: impl FnMut(&mut K) -> bool,
    status: bool,
) -> Result<Option<K>> {
    for _ in 0..RETRIES {
        let Some(mut object) = store.get::<K>(name).await? else { return Ok(None) };
        if !change(&mut object) {
            return Ok(Some(object));
        }
        let written = if status { store.replace_status(&object).await } else { store.replace(&object).await };
        match written {
            Err(Error::Conflict { .. }) => continue,
            other => return other.map(Some),
        }
    }
    Err(Error::Conflict { kind: K::kind(&()).to_string(), name: name.to_string() })
}
