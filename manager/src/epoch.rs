//! Minting an engine's fencing epoch.
//!
//! Every engine start stores a new epoch in the volume's Engine object before
//! any process can use it; replicas refuse I/O of an epoch lower than the
//! highest they have seen, which is what fences an old engine. Two engines
//! of one volume must therefore never be handed the same epoch.
//!
//! The epoch is minted by compare-and-swap on the Engine object: the stored
//! epoch must still be the one the caller's decision was based on, and the
//! write carries the resourceVersion it was read with. A manager that loses
//! the race (another pass or another manager minted first, or anything else
//! changed the object meanwhile) gets [`Mint::Lost`] and starts nothing; its
//! next pass decides again from a fresh snapshot. A plain retry-on-conflict
//! would not do: it would write the epoch it computed earlier a second time.

use kube::ResourceExt;

use crate::crd::{Engine, EngineSpec};
use crate::datastore::{Datastore, Error, Result};

#[derive(Debug, PartialEq, Eq)]
pub enum Mint {
    /// The object now holds this epoch, written by this call alone.
    Minted(u64),
    /// Someone else changed the Engine object since `seen`: start nothing.
    Lost,
}

/// Stores `spec` with the epoch after `seen` (the epoch the caller saw;
/// None when it saw no Engine object, which creates one at epoch 1).
pub async fn mint<D: Datastore>(store: &D, name: &str, seen: Option<u64>, mut spec: EngineSpec) -> Result<Mint> {
    let Some(seen) = seen else {
        spec.epoch = 1;
        return match store.create(&Engine::new(name, spec)).await {
            Ok(_) => Ok(Mint::Minted(1)),
            Err(Error::AlreadyExists { .. }) => Ok(Mint::Lost),
            Err(e) => Err(e),
        };
    };
    let Some(mut engine) = store.get::<Engine>(name).await? else { return Ok(Mint::Lost) };
    if engine.spec.epoch != seen {
        return Ok(Mint::Lost);
    }
    spec.epoch = seen + 1;
    engine.spec = spec;
    match store.replace(&engine).await {
        Ok(written) => {
            debug_assert_eq!(written.name_any(), name);
            Ok(Mint::Minted(written.spec.epoch))
        }
        Err(Error::Conflict { .. }) => Ok(Mint::Lost),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::datastore::embedded::EmbeddedStore;

    fn spec() -> EngineSpec {
        EngineSpec {
            volume_name: "v".into(),
            node_id: "n-1".into(),
            volume_size: 1 << 20,
            desire_state: "running".into(),
            ..Default::default()
        }
    }

    /// Many attaches of one volume at once, each decided from a snapshot that
    /// showed epoch 3: exactly one mints 4, the others start nothing. (The
    /// old mint, an update retried on conflict with the epoch computed from
    /// the snapshot, gave every one of them epoch 4.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_attaches_never_share_an_epoch() {
        let dir = std::env::temp_dir().join(format!("ironhorn-epoch-{}", std::process::id()));
        let store = EmbeddedStore::open(&dir).unwrap();
        for round in 0..20u64 {
            let seen = 3 + round;
            let mut engine = Engine::new("v-e", EngineSpec { epoch: seen, ..spec() });
            if round == 0 {
                store.create(&engine).await.unwrap();
            } else {
                let stored: Engine = store.get("v-e").await.unwrap().unwrap();
                engine.metadata = stored.metadata;
                store.replace(&engine).await.unwrap();
            }
            let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
            let attaches: Vec<_> = (0..8)
                .map(|i| {
                    let (store, barrier) = (store.clone(), barrier.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        let node = format!("n-{i}");
                        mint(&store, "v-e", Some(seen), EngineSpec { node_id: node, ..spec() }).await.unwrap()
                    })
                })
                .collect();
            let mut minted = Vec::new();
            for a in attaches {
                if let Mint::Minted(epoch) = a.await.unwrap() {
                    minted.push(epoch);
                }
            }
            assert_eq!(minted, vec![seen + 1], "round {round}: exactly one attach mints the next epoch");
            let stored: Engine = store.get("v-e").await.unwrap().unwrap();
            assert_eq!(stored.spec.epoch, seen + 1);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn first_engine_is_created_once_at_epoch_one() {
        let dir = std::env::temp_dir().join(format!("ironhorn-epoch-first-{}", std::process::id()));
        let store = EmbeddedStore::open(&dir).unwrap();
        let (a, b) = tokio::join!(mint(&store, "w-e", None, spec()), mint(&store, "w-e", None, spec()));
        let outcomes: BTreeSet<String> = [a.unwrap(), b.unwrap()].iter().map(|m| format!("{m:?}")).collect();
        assert_eq!(outcomes, BTreeSet::from(["Lost".to_string(), "Minted(1)".to_string()]));
        // A caller whose snapshot is behind the stored epoch starts nothing.
        assert_eq!(mint(&store, "w-e", Some(0), spec()).await.unwrap(), Mint::Lost);
        assert_eq!(mint(&store, "w-e", Some(1), spec()).await.unwrap(), Mint::Minted(2));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
