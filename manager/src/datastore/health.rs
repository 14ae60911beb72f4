//! A datastore that remembers whether its writes are failing.
//!
//! Status in the datastore is only as current as the last write that
//! reached it. When writes fail (the embedded store's disk is full, the
//! apiserver rejects them), what the API would show is the last status
//! that got through: a volume could read `healthy` long after its replicas
//! failed. [`Recorded`] wraps the manager's datastore, records the outcome
//! of every write, and the API marks what it serves as not current while
//! the last write failed.

use std::sync::{Arc, Mutex};

use super::{Change, Datastore, Error, Object, Result};

#[derive(Clone)]
pub struct Recorded<D> {
    inner: D,
    failure: Arc<Mutex<Option<String>>>,
}

impl<D: Datastore> Recorded<D> {
    pub fn new(inner: D) -> Self {
        Self { inner, failure: Arc::default() }
    }

    fn note<T>(&self, result: Result<T>) -> Result<T> {
        let mut failure = self.failure.lock().expect("write failure");
        match &result {
            // The backend answered: conflicts and missing objects are
            // answers, not failures to write.
            Ok(_)
            | Err(
                Error::Conflict { .. } | Error::NotFound { .. } | Error::AlreadyExists { .. } | Error::Invalid { .. },
            ) => *failure = None,
            Err(e @ (Error::Backend(_) | Error::Forbidden { .. })) => {
                if failure.is_none() {
                    tracing::error!(error = %e, "datastore writes are failing: status shown by the API is not current");
                }
                *failure = Some(e.to_string());
            }
        }
        result
    }
}

impl<D: Datastore> Datastore for Recorded<D> {
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    fn write_failure(&self) -> Option<String> {
        self.failure.lock().expect("write failure").clone()
    }

    async fn get<K: Object>(&self, name: &str) -> Result<Option<K>> {
        self.inner.get(name).await
    }

    async fn list<K: Object>(&self) -> Result<Vec<K>> {
        self.inner.list().await
    }

    async fn create<K: Object>(&self, object: &K) -> Result<K> {
        self.note(self.inner.create(object).await)
    }

    async fn replace<K: Object>(&self, object: &K) -> Result<K> {
        self.note(self.inner.replace(object).await)
    }

    async fn replace_status<K: Object>(&self, object: &K) -> Result<K> {
        self.note(self.inner.replace_status(object).await)
    }

    async fn delete<K: Object>(&self, name: &str) -> Result<()> {
        self.note(self.inner.delete::<K>(name).await)
    }

    async fn watch<K: Object>(&self) -> Result<tokio::sync::mpsc::Receiver<Change>> {
        self.inner.watch::<K>().await
    }
}
