//! Property test: random sequences of store operations against a simple
//! in-memory model. After every operation the whole volume, and every
//! snapshot's view of it, must read back exactly as the model says.
//! Runs on both I/O backends, with a tiny journal so checkpoints happen often.

use ironhorn_replica::device::StoreLocation;
use ironhorn_replica::io::BackendKind;
use ironhorn_replica::store::{Store, StoreConfig, StoreError};
use proptest::prelude::*;

const BLOCK: usize = 4096;
const MAX_SNAPSHOTS: usize = 4;

#[derive(Clone, Debug)]
enum Op {
    Write { block: u64, count: u64, seed: u8 },
    Trim { block: u64, count: u64 },
    Flush,
    SnapshotCreate,
    SnapshotDelete(usize),
    SnapshotRevert(usize),
    Expand(u64),
    Reopen,
    LayerInsert(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u64..96, 1u64..9, any::<u8>()).prop_map(|(block, count, seed)| Op::Write { block, count, seed }),
        2 => (0u64..96, 1u64..17).prop_map(|(block, count)| Op::Trim { block, count }),
        2 => Just(Op::Flush),
        2 => Just(Op::SnapshotCreate),
        1 => (0usize..MAX_SNAPSHOTS).prop_map(Op::SnapshotDelete),
        1 => (0usize..MAX_SNAPSHOTS).prop_map(Op::SnapshotRevert),
        1 => (1u64..17).prop_map(Op::Expand),
        1 => Just(Op::Reopen),
        1 => (0usize..=MAX_SNAPSHOTS).prop_map(Op::LayerInsert),
    ]
}

struct Model {
    head: Vec<u8>,
    snapshots: Vec<(String, Vec<u8>)>,
    next_name: u32,
}

fn pattern(block: u64, seed: u8) -> Vec<u8> {
    (0..BLOCK).map(|i| (i as u64 ^ block.wrapping_mul(31) ^ seed as u64 * 7) as u8).collect()
}

struct Harness {
    config: StoreConfig,
    store: Option<Store>,
    model: Model,
}

impl Harness {
    fn store(&self) -> &Store {
        self.store.as_ref().expect("open store")
    }

    async fn check(&self) {
        let store = self.store();
        let size = self.model.head.len() as u64;
        let data = store.read(1, 0, size).await.expect("read whole volume");
        assert!(data[..] == self.model.head[..], "volume differs from the model");
        let listed: Vec<String> = store.snapshot_list().into_iter().map(|s| s.name).collect();
        let expected: Vec<String> = self.model.snapshots.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(listed, expected);
        for (name, content) in &self.model.snapshots {
            let view = store.read_snapshot(name, 0, content.len() as u64).await.expect("read snapshot");
            assert!(view[..] == content[..], "snapshot {name} differs from the model");
        }
    }

    async fn apply(&mut self, op: &Op) {
        let size_blocks = self.model.head.len() as u64 / BLOCK as u64;
        match op {
            Op::Write { block, count, seed } => {
                let (block, count) = clamp(*block, *count, size_blocks);
                let data: Vec<u8> = (block..block + count).flat_map(|b| pattern(b, *seed)).collect();
                self.store().write(1, block * BLOCK as u64, &data, false).await.expect("write");
                let at = block as usize * BLOCK;
                self.model.head[at..at + data.len()].copy_from_slice(&data);
            }
            Op::Trim { block, count } => {
                let (block, count) = clamp(*block, *count, size_blocks);
                self.store().trim(1, block * BLOCK as u64, count * BLOCK as u64).await.expect("trim");
                let at = block as usize * BLOCK;
                self.model.head[at..at + count as usize * BLOCK].fill(0);
            }
            Op::Flush => self.store().flush().await.expect("flush"),
            Op::SnapshotCreate => {
                if self.model.snapshots.len() < MAX_SNAPSHOTS {
                    let name = format!("snap-{}", self.model.next_name);
                    self.model.next_name += 1;
                    self.store().snapshot_create(1, &name).await.expect("snapshot create");
                    self.model.snapshots.push((name, self.model.head.clone()));
                }
            }
            Op::SnapshotDelete(i) => {
                if let Some((name, _)) = self.model.snapshots.get(*i).cloned() {
                    self.store().snapshot_delete(1, &name).await.expect("snapshot delete");
                    self.model.snapshots.remove(*i);
                }
            }
            Op::SnapshotRevert(i) => {
                if let Some((name, content)) = self.model.snapshots.get(*i).cloned() {
                    let size = self.model.head.len();
                    self.store().snapshot_revert(1, &name).await.expect("snapshot revert");
                    self.model.snapshots.truncate(*i + 1);
                    // A snapshot taken before an expand reads as its old size
                    // followed by zeroes.
                    self.model.head = content;
                    self.model.head.resize(size, 0);
                }
            }
            Op::Expand(extra) => {
                if size_blocks + extra <= 128 {
                    let size = (size_blocks + extra) * BLOCK as u64;
                    self.store().expand(1, size).await.expect("expand");
                    self.model.head.resize(size as usize, 0);
                    for (_, content) in &mut self.model.snapshots {
                        content.resize(size as usize, 0);
                    }
                    self.config.volume_size = size;
                }
            }
            Op::LayerInsert(i) => {
                let n = self.model.snapshots.len();
                if n < MAX_SNAPSHOTS {
                    let i = (*i).min(n);
                    let below = if i == n { String::new() } else { self.model.snapshots[i].0.clone() };
                    let name = format!("ins-{}", self.model.next_name);
                    self.model.next_name += 1;
                    self.store().layer_insert(1, &name, &below).await.expect("layer insert");
                    let content = match i {
                        0 => vec![0; self.model.head.len()],
                        _ => self.model.snapshots[i - 1].1.clone(),
                    };
                    self.model.snapshots.insert(i, (name, content));
                }
            }
            Op::Reopen => {
                self.store.take().expect("store").close().await.expect("close");
                let store = Store::open(&self.config).await.expect("reopen");
                assert!(store.info().clean_at_open, "a closed store reopens as clean");
                self.store = Some(store);
            }
        }
    }
}

fn clamp(block: u64, count: u64, size_blocks: u64) -> (u64, u64) {
    let block = block % size_blocks;
    (block, count.min(size_blocks - block))
}

fn run(backend: BackendKind, initial_blocks: u64, ops: Vec<Op>) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let path = std::env::temp_dir().join(format!(
            "ironhorn-model-{}-{:?}-{}.img",
            std::process::id(),
            backend,
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
        ));
        let size = initial_blocks * BLOCK as u64;
        let mut config = StoreConfig::new(StoreLocation::File(path.clone()), size);
        config.backend = backend;
        config.journal_blocks = Some(4);
        config.capacity_bytes = Some(1200 * BLOCK as u64);
        let store = Store::open(&config).await.expect("create store");
        let mut h = Harness {
            config,
            store: Some(store),
            model: Model { head: vec![0; size as usize], snapshots: Vec::new(), next_name: 0 },
        };
        h.check().await;
        for op in &ops {
            h.apply(op).await;
            h.check().await;
        }
        h.store.take().unwrap().close().await.unwrap();
        std::fs::remove_file(&path).unwrap();
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model_pread(initial in 16u64..64, ops in proptest::collection::vec(op(), 1..60)) {
        run(BackendKind::Pread, initial, ops);
    }

    #[test]
    fn store_matches_model_uring(initial in 16u64..64, ops in proptest::collection::vec(op(), 1..60)) {
        run(BackendKind::Uring, initial, ops);
    }
}

/// Bad input gets a clear error and changes nothing.
#[test]
fn bad_requests_are_refused_and_change_nothing() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let path = std::env::temp_dir().join(format!("ironhorn-bad-{}.img", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let config = StoreConfig::new(StoreLocation::File(path.clone()), 64 * BLOCK as u64);
        let store = Store::open(&config).await.unwrap();
        let data = pattern(3, 9);
        store.write(1, 3 * BLOCK as u64, &data, true).await.unwrap();
        let cases: Vec<StoreError> = vec![
            store.write(1, 100, &data, false).await.unwrap_err(),
            store.write(1, 0, &data[..100], false).await.unwrap_err(),
            store.write(1, 64 * BLOCK as u64, &data, false).await.unwrap_err(),
            store.write(1, 0, &[], false).await.unwrap_err(),
            store.read(1, 63 * BLOCK as u64, 2 * BLOCK as u64).await.unwrap_err(),
            store.read(1, u64::MAX - 4095, BLOCK as u64).await.unwrap_err(),
            store.trim(1, 0, 0).await.unwrap_err(),
            store.snapshot_delete(1, "nope").await.unwrap_err(),
            store.snapshot_revert(1, "nope").await.unwrap_err(),
            store.snapshot_create(1, "bad name!").await.unwrap_err(),
            store.expand(1, 4 * BLOCK as u64).await.unwrap_err(),
            store.checksums("", true, 0, BLOCK as u64, 1000).await.unwrap_err(),
        ];
        for e in &cases {
            assert!(
                matches!(e, StoreError::InvalidArgument(_) | StoreError::NotFound(_)),
                "unexpected error kind: {e}"
            );
        }
        assert_eq!(&store.read(1, 3 * BLOCK as u64, BLOCK as u64).await.unwrap()[..], &data[..]);
        // Reopening with another size is refused, never a silent resize.
        store.close().await.unwrap();
        let mut other = config.clone();
        other.volume_size *= 2;
        assert!(matches!(Store::open(&other).await, Err(StoreError::SizeMismatch { .. })));
        std::fs::remove_file(&path).unwrap();
    });
}

/// Overwriting a full volume again and again without FLUSH must not run out
/// of space (replaced blocks are recycled by automatic commits); filling the
/// store for real with snapshots gives OutOfSpace and loses nothing.
#[test]
fn space_is_recycled_and_a_full_store_says_so() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let path = std::env::temp_dir().join(format!("ironhorn-full-{}.img", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let blocks = 256u64;
        let mut config = StoreConfig::new(StoreLocation::File(path.clone()), blocks * BLOCK as u64);
        config.journal_blocks = Some(16);
        // Room for the volume, one more copy of it, and metadata.
        config.capacity_bytes = Some((2 + 16 + 2 * blocks + 40) * BLOCK as u64);
        let store = Store::open(&config).await.unwrap();
        for round in 0..12u8 {
            for start in (0..blocks).step_by(64) {
                let data: Vec<u8> = (start..start + 64).flat_map(|b| pattern(b, round)).collect();
                store.write(1, start * BLOCK as u64, &data, false).await.expect("overwrite without flush");
            }
        }
        let data: Vec<u8> = (0..blocks).flat_map(|b| pattern(b, 11)).collect();
        assert!(store.read(1, 0, blocks * BLOCK as u64).await.unwrap()[..] == data[..]);

        // Snapshots pin old versions; eventually a write cannot be placed.
        let mut full = None;
        for round in 0..8u8 {
            store.snapshot_create(1, &format!("s{round}")).await.unwrap();
            let next: Vec<u8> = (0..blocks).flat_map(|b| pattern(b, 100 + round)).collect();
            if let Err(e) = store.write(1, 0, &next, false).await {
                full = Some((round, e));
                break;
            }
            assert!(round < 7, "snapshots of a full volume must fill the store");
        }
        let (round, err) = full.expect("the store fills up");
        assert!(matches!(err, StoreError::OutOfSpace { .. }), "{err}");
        // The failed write changed nothing: the head still reads as before it.
        let expected: Vec<u8> =
            if round == 0 { data } else { (0..blocks).flat_map(|b| pattern(b, 100 + round - 1)).collect() };
        assert!(store.read(1, 0, blocks * BLOCK as u64).await.unwrap()[..] == expected[..]);
        // Deleting snapshots frees space again.
        for s in store.snapshot_list() {
            store.snapshot_delete(1, &s.name).await.unwrap();
        }
        store.write(1, 0, &expected, true).await.expect("room again after deleting snapshots");
        store.close().await.unwrap();
        std::fs::remove_file(&path).unwrap();
    });
}
