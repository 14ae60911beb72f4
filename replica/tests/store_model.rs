//! Property test: random sequences of store operations against a model.
//! After every operation the whole volume, and every snapshot's view of it,
//! must read back as the model allows.
//!
//! The model keeps, per block, the values the block may hold: one after a
//! plain write; any of the batch's values after concurrent writes and trims
//! that overlap it; after a crash (the store dropped without `close`, as a
//! killed process leaves it), the value at the last flush point or any
//! value written since. Each check reads the store, asserts every block
//! holds an allowed value, and pins the model to the value seen. Flush
//! points: a flush, a close, and the structural operations (snapshots,
//! revert, expand, layer insert), which checkpoint.
//!
//! Runs on both I/O backends, with a tiny journal so checkpoints happen often.

use std::sync::Arc;

use ironhorn_replica::device::StoreLocation;
use ironhorn_replica::io::BackendKind;
use ironhorn_replica::store::{Store, StoreConfig, StoreError};
use proptest::prelude::*;

const BLOCK: usize = 4096;
const MAX_SNAPSHOTS: usize = 4;

/// A block's content: zeroes, or `pattern(block, seed)`.
type Val = Option<u8>;

#[derive(Clone, Debug)]
enum Io {
    Write { block: u64, count: u64, seed: u8 },
    Trim { block: u64, count: u64 },
}

#[derive(Clone, Debug)]
enum Op {
    Io(Io),
    /// Issued together, completing in any order.
    Concurrent(Vec<Io>),
    Flush,
    SnapshotCreate,
    SnapshotDelete(usize),
    SnapshotRevert(usize),
    Expand(u64),
    Reopen,
    /// Dropped without close, then opened again.
    Crash,
    LayerInsert(usize),
}

fn io() -> impl Strategy<Value = Io> {
    prop_oneof![
        4 => (0u64..96, 1u64..9, any::<u8>()).prop_map(|(block, count, seed)| Io::Write { block, count, seed }),
        1 => (0u64..96, 1u64..17).prop_map(|(block, count)| Io::Trim { block, count }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => io().prop_map(Op::Io),
        3 => proptest::collection::vec(io(), 2..8).prop_map(Op::Concurrent),
        2 => Just(Op::Flush),
        2 => Just(Op::SnapshotCreate),
        1 => (0usize..MAX_SNAPSHOTS).prop_map(Op::SnapshotDelete),
        1 => (0usize..MAX_SNAPSHOTS).prop_map(Op::SnapshotRevert),
        1 => (1u64..17).prop_map(Op::Expand),
        1 => Just(Op::Reopen),
        2 => Just(Op::Crash),
        1 => (0usize..=MAX_SNAPSHOTS).prop_map(Op::LayerInsert),
    ]
}

fn pattern(block: u64, seed: u8) -> Vec<u8> {
    (0..BLOCK).map(|i| (i as u64 ^ block.wrapping_mul(31) ^ seed as u64 * 7) as u8).collect()
}

fn render(block: u64, val: Val) -> Vec<u8> {
    match val {
        None => vec![0; BLOCK],
        Some(seed) => pattern(block, seed),
    }
}

struct Model {
    /// Per block, the values it may hold now (one, after a check).
    head: Vec<Vec<Val>>,
    /// Per block, the values a crash may leave: the one at the last flush
    /// point and every one written since.
    since_flush: Vec<Vec<Val>>,
    snapshots: Vec<(String, Vec<Val>)>,
    next_name: u32,
}

impl Model {
    fn blocks(&self) -> u64 {
        self.head.len() as u64
    }

    /// The head as it is now (checked, so one value per block).
    fn pinned(&self) -> Vec<Val> {
        self.head.iter().map(|v| v[0]).collect()
    }

    fn flush_point(&mut self) {
        self.since_flush = self.head.clone();
    }

    /// Blocks `io` touches, and the value it leaves there.
    fn extent(&self, io: &Io) -> (std::ops::Range<u64>, Val) {
        let (block, count, val) = match *io {
            Io::Write { block, count, seed } => (block, count, Some(seed)),
            Io::Trim { block, count } => (block, count, None),
        };
        let block = block % self.blocks();
        (block..block + count.min(self.blocks() - block), val)
    }

    /// Ios issued together: a block one of them touched may hold any of
    /// their values; a crash may leave any of them too.
    fn apply(&mut self, ios: &[Io]) {
        let mut touched: Vec<Vec<Val>> = vec![Vec::new(); self.head.len()];
        for io in ios {
            let (range, val) = self.extent(io);
            for b in range {
                touched[b as usize].push(val);
            }
        }
        for (b, vals) in touched.into_iter().enumerate() {
            if !vals.is_empty() {
                self.since_flush[b].extend(vals.iter().copied());
                self.head[b] = vals;
            }
        }
    }
}

struct Harness {
    config: StoreConfig,
    store: Option<Arc<Store>>,
    model: Model,
}

impl Harness {
    fn store(&self) -> &Arc<Store> {
        self.store.as_ref().expect("open store")
    }

    /// Reads everything; each block must hold an allowed value, which the
    /// model then keeps as the block's one value.
    async fn check(&mut self) {
        let store = self.store().clone();
        let size = self.model.blocks() * BLOCK as u64;
        let data = store.read(1, 0, size).await.expect("read whole volume");
        for (b, allowed) in self.model.head.iter_mut().enumerate() {
            let got = &data[b * BLOCK..(b + 1) * BLOCK];
            let seen = allowed.iter().copied().find(|v| render(b as u64, *v) == got);
            let seen = seen.unwrap_or_else(|| panic!("block {b} holds none of the values allowed: {allowed:?}"));
            *allowed = vec![seen];
        }
        let listed: Vec<String> = store.snapshot_list().into_iter().map(|s| s.name).collect();
        let expected: Vec<String> = self.model.snapshots.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(listed, expected);
        for (name, content) in &self.model.snapshots {
            let view = store.read_snapshot(name, 0, content.len() as u64 * BLOCK as u64).await.expect("read snapshot");
            for (b, val) in content.iter().enumerate() {
                assert!(view[b * BLOCK..(b + 1) * BLOCK] == render(b as u64, *val)[..], "snapshot {name} block {b}");
            }
        }
    }

    async fn run_io(store: Arc<Store>, io: Io, range: std::ops::Range<u64>) {
        let offset = range.start * BLOCK as u64;
        match io {
            Io::Write { seed, .. } => {
                let data: Vec<u8> = range.flat_map(|b| pattern(b, seed)).collect();
                store.write(1, offset, &data, false).await.expect("write");
            }
            Io::Trim { .. } => {
                let length = (range.end - range.start) * BLOCK as u64;
                store.trim(1, offset, length).await.expect("trim");
            }
        }
    }

    async fn apply(&mut self, op: &Op) {
        let size_blocks = self.model.blocks();
        match op {
            Op::Io(io) => {
                let (range, _) = self.model.extent(io);
                Self::run_io(self.store().clone(), io.clone(), range).await;
                self.model.apply(std::slice::from_ref(io));
            }
            Op::Concurrent(ios) => {
                let mut tasks = tokio::task::JoinSet::new();
                for io in ios {
                    let (range, _) = self.model.extent(io);
                    tasks.spawn(Self::run_io(self.store().clone(), io.clone(), range));
                }
                while let Some(done) = tasks.join_next().await {
                    done.expect("io task");
                }
                self.model.apply(ios);
            }
            Op::Flush => {
                self.store().flush().await.expect("flush");
                self.model.flush_point();
            }
            Op::SnapshotCreate => {
                if self.model.snapshots.len() < MAX_SNAPSHOTS {
                    let name = format!("snap-{}", self.model.next_name);
                    self.model.next_name += 1;
                    self.store().snapshot_create(1, &name).await.expect("snapshot create");
                    let content = self.model.pinned();
                    self.model.snapshots.push((name, content));
                    self.model.flush_point();
                }
            }
            Op::SnapshotDelete(i) => {
                if let Some((name, _)) = self.model.snapshots.get(*i).cloned() {
                    self.store().snapshot_delete(1, &name).await.expect("snapshot delete");
                    self.model.snapshots.remove(*i);
                    self.model.flush_point();
                }
            }
            Op::SnapshotRevert(i) => {
                if let Some((name, content)) = self.model.snapshots.get(*i).cloned() {
                    self.store().snapshot_revert(1, &name).await.expect("snapshot revert");
                    self.model.snapshots.truncate(*i + 1);
                    // A snapshot taken before an expand reads as its old size
                    // followed by zeroes.
                    let mut head: Vec<Vec<Val>> = content.into_iter().map(|v| vec![v]).collect();
                    head.resize(size_blocks as usize, vec![None]);
                    self.model.head = head;
                    self.model.flush_point();
                }
            }
            Op::Expand(extra) => {
                if size_blocks + extra <= 128 {
                    let size = (size_blocks + extra) * BLOCK as u64;
                    self.store().expand(1, size).await.expect("expand");
                    self.model.head.resize((size_blocks + extra) as usize, vec![None]);
                    for (_, content) in &mut self.model.snapshots {
                        content.resize((size_blocks + extra) as usize, None);
                    }
                    self.model.flush_point();
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
                        0 => vec![None; size_blocks as usize],
                        _ => self.model.snapshots[i - 1].1.clone(),
                    };
                    self.model.snapshots.insert(i, (name, content));
                    self.model.flush_point();
                }
            }
            Op::Reopen => {
                self.store.take().expect("store").close().await.expect("close");
                let store = Store::open(&self.config).await.expect("reopen");
                assert!(store.info().clean_at_open, "a closed store reopens as clean");
                self.store = Some(Arc::new(store));
                self.model.flush_point();
            }
            Op::Crash => {
                let store = self.store.take().expect("store");
                assert_eq!(Arc::strong_count(&store), 1, "no I/O task still holds the store");
                drop(store);
                let store = Store::open(&self.config).await.expect("reopen after a crash");
                assert!(!store.info().clean_at_open, "a store dropped without close reopens as unclean");
                self.store = Some(Arc::new(store));
                self.model.head = self.model.since_flush.clone();
            }
        }
    }
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
        let blocks = vec![vec![None]; initial_blocks as usize];
        let mut h = Harness {
            config,
            store: Some(Arc::new(store)),
            model: Model { head: blocks.clone(), since_flush: blocks, snapshots: Vec::new(), next_name: 0 },
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
        // Asked to grow (an expansion this replica missed), it grows, keeps
        // its data and reads zeroes beyond; it never shrinks.
        let mut smaller = config.clone();
        smaller.volume_size /= 2;
        smaller.grow = true;
        assert!(matches!(Store::open(&smaller).await, Err(StoreError::SizeMismatch { .. })));
        other.grow = true;
        let grown = Store::open(&other).await.unwrap();
        assert_eq!(grown.info().size_bytes, other.volume_size);
        assert_eq!(&grown.read(1, 3 * BLOCK as u64, BLOCK as u64).await.unwrap()[..], &data[..]);
        let beyond = grown.read(1, config.volume_size, BLOCK as u64).await.unwrap();
        assert!(beyond.iter().all(|&b| b == 0));
        grown.close().await.unwrap();
        let mut exact = other.clone();
        exact.grow = false;
        assert!(Store::open(&exact).await.is_ok_and(|s| s.info().size_bytes == other.volume_size));
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
