//! The store's safety rules, in process with injected faults: the fence has
//! no gap, flush stamps are durable exactly when their flush is, corrupt
//! metadata from disk is an error (never a panic), and device faults fail
//! what they hit without losing what was flushed.

use std::sync::Arc;
use std::time::Duration;

use ironhorn_replica::device::StoreLocation;
use ironhorn_replica::faults::{Fault, FaultAction, FaultOp};
use ironhorn_replica::format::{BLOCK, FlushStamp, JournalBlock, Record};
use ironhorn_replica::io::BackendKind;
use ironhorn_replica::store::{Store, StoreConfig, StoreError};

const BLOCK_U64: u64 = BLOCK as u64;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn config(tag: &str, blocks: u64) -> (StoreConfig, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("ironhorn-safety-{tag}-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut config = StoreConfig::new(StoreLocation::File(path.clone()), blocks * BLOCK_U64);
    config.backend = BackendKind::Uring;
    (config, path)
}

fn block_of(n: u64, version: u8) -> Vec<u8> {
    let mut b = vec![version; BLOCK];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b
}

/// Old-epoch writes in flight (their data writes held up by an injected
/// delay) while a new engine raises the epoch and takes a snapshot: once the
/// raise returned, nothing of the old epoch lands: the volume's content
/// does not change afterwards, and the new head stays empty. Repeated with
/// the raise coming at different points of the old writes.
#[test]
fn old_epoch_writes_racing_an_epoch_raise_and_a_snapshot_never_land_after_it() {
    runtime().block_on(async {
        let (config, path) = config("fence", 256);
        let store = Arc::new(Store::open(&config).await.unwrap());
        let faults = store.faults();
        for round in 0..12u64 {
            let old = round + 1;
            let new = round + 2;
            store.raise_epoch(old).await.unwrap();
            // Only the 16 old data writes are held up, not the raise's own
            // superblock write that follows them.
            faults.arm(Fault::new(&[FaultOp::Write], FaultAction::Delay(Duration::from_millis(60 + round))).times(16));
            let fired_before = faults.fired();
            let writes: Vec<_> = (0..16u64)
                .map(|i| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        store.write(old, (i * 8 + round % 8) * BLOCK_U64, &block_of(i, round as u8 + 1), false).await
                    })
                })
                .collect();
            // Wait until the old writes are observably at the device.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while faults.fired() < fired_before + 16 {
                assert!(std::time::Instant::now() < deadline, "no old write reached the device");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            store.raise_epoch(new).await.unwrap();
            let after_raise = store.checksums("", true, 0, 256 * BLOCK_U64, BLOCK_U64).await.unwrap();
            store.snapshot_create(new, &format!("s{round}")).await.unwrap();
            let mut landed = 0;
            for w in writes {
                match w.await.unwrap() {
                    Ok(()) => landed += 1,
                    Err(StoreError::Fenced { .. }) => {}
                    Err(e) => panic!("old write failed with {e}, not FENCED"),
                }
            }
            faults.clear();
            let now = store.checksums("", true, 0, 256 * BLOCK_U64, BLOCK_U64).await.unwrap();
            assert!(now == after_raise, "round {round}: an old-epoch write landed after the raise ({landed} landed)");
            assert!(store.extents("").unwrap().is_empty(), "round {round}: the new head holds an old-epoch write");
            let refused = store.write(old, 0, &block_of(0, 99), false).await;
            assert!(matches!(refused, Err(StoreError::Fenced { .. })), "{refused:?}");
        }
        drop(store);
        std::fs::remove_file(&path).unwrap();
    });
}

/// A stamp is durable with its flush: it survives a crash (no close) and
/// journal roll-over into checkpoints; a withdrawn stamp stays withdrawn; a
/// flush whose sync fails leaves the old stamp on disk.
#[test]
fn a_flush_stamp_is_durable_exactly_when_its_flush_is() {
    runtime().block_on(async {
        let (mut config, path) = config("stamp", 64);
        config.journal_blocks = Some(4);
        let store = Store::open(&config).await.unwrap();
        assert_eq!(store.info().stamp, FlushStamp::NONE);
        let mut last = FlushStamp::NONE;
        // Enough flushes that the tiny journal rolls into checkpoints.
        for sequence in 1..=40 {
            store.write(3, (sequence % 64) * BLOCK_U64, &block_of(sequence, 1), false).await.unwrap();
            last = FlushStamp { epoch: 3, sequence };
            store.flush_stamped(3, Some(last)).await.unwrap();
        }
        drop(store); // a crash: no close
        let store = Store::open(&config).await.unwrap();
        assert!(!store.info().clean_at_open);
        assert_eq!(store.info().stamp, last);

        store.flush_stamped(3, Some(FlushStamp::NONE)).await.unwrap();
        drop(store);
        let store = Store::open(&config).await.unwrap();
        assert_eq!(store.info().stamp, FlushStamp::NONE, "a withdrawn stamp stays withdrawn");

        store.flush_stamped(4, Some(FlushStamp { epoch: 4, sequence: 1 })).await.unwrap();
        store.write(4, 0, &block_of(0, 2), false).await.unwrap();
        store.faults().arm(Fault::new(&[FaultOp::Sync], FaultAction::Eio).times(1));
        let failed = store.flush_stamped(4, Some(FlushStamp { epoch: 4, sequence: 2 })).await;
        assert!(failed.is_err(), "the flush whose sync failed must fail");
        assert!(
            matches!(store.read(4, 0, BLOCK_U64).await, Err(StoreError::Failed(_))),
            "a store whose sync failed stops"
        );
        drop(store);
        let store = Store::open(&config).await.unwrap();
        assert_eq!(store.info().stamp, FlushStamp { epoch: 4, sequence: 1 }, "the failed flush's stamp is not on disk");
        store.close().await.unwrap();
        std::fs::remove_file(&path).unwrap();
    });
}

/// A journal record naming a block past the volume end (bits flipped on
/// disk, then resealed) is reported as corrupt metadata with the journal's
/// byte offset; the store does not open, nothing panics.
#[test]
fn a_journal_record_past_the_volume_end_is_corrupt_not_a_panic() {
    runtime().block_on(async {
        let (config, path) = config("journal", 64);
        let store = Store::open(&config).await.unwrap();
        store.write(1, 5 * BLOCK_U64, &block_of(5, 1), false).await.unwrap();
        store.flush().await.unwrap();
        let store_id = store.info().store_id;
        drop(store); // unclean: the journal is replayed at the next open

        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let journal_at = 2 * BLOCK_U64; // first journal block, after the two superblock slots
        let mut raw = vec![0u8; BLOCK];
        file.read_exact_at(&mut raw, journal_at).unwrap();
        let mut jb = JournalBlock::decode(&raw, store_id).expect("the flush wrote journal block 0");
        let mut bent = false;
        for r in &mut jb.records {
            if let Record::Map { lba, .. } = r {
                *lba = 1 << 40;
                bent = true;
            }
        }
        assert!(bent, "journal block 0 maps the written block: {jb:?}");
        file.write_all_at(&jb.encode(store_id), journal_at).unwrap();
        file.sync_all().unwrap();

        let err = Store::open(&config).await.err().expect("a journal mapping past the volume must not open");
        assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
        assert!(err.to_string().contains(&format!("journal block at byte {journal_at}")), "{err}");
        std::fs::remove_file(&path).unwrap();
    });
}

/// Device faults: EIO on a data write fails that write only; a torn data
/// write followed by a crash leaves every flushed block intact and the torn
/// block either old or new, never a mix; ENOSPC from the device is an
/// out-of-space error, not a failed store.
#[test]
fn device_faults_fail_what_they_hit_and_lose_nothing_flushed() {
    runtime().block_on(async {
        let (config, path) = config("faults", 64);
        let store = Store::open(&config).await.unwrap();
        for b in 0..8 {
            store.write(1, b * BLOCK_U64, &block_of(b, 1), false).await.unwrap();
        }
        store.flush().await.unwrap();
        let faults = store.faults();

        faults.arm(Fault::new(&[FaultOp::Write], FaultAction::Eio).times(1));
        let err = store.write(1, 2 * BLOCK_U64, &block_of(2, 2), false).await.unwrap_err();
        assert!(matches!(err, StoreError::Io { .. }), "{err}");
        assert_eq!(&store.read(1, 2 * BLOCK_U64, BLOCK_U64).await.unwrap()[..], &block_of(2, 1)[..]);

        faults.arm(Fault::new(&[FaultOp::Write], FaultAction::NoSpace).times(1));
        let err = store.write(1, 3 * BLOCK_U64, &block_of(3, 2), false).await.unwrap_err();
        assert!(matches!(err, StoreError::DeviceFull { .. }), "{err}");
        store.write(1, 3 * BLOCK_U64, &block_of(3, 3), false).await.expect("the store still takes writes");

        faults.arm(Fault::new(&[FaultOp::Write], FaultAction::Torn).times(1));
        let two: Vec<u8> = [block_of(4, 4), block_of(5, 4)].concat();
        assert!(store.write(1, 4 * BLOCK_U64, &two, false).await.is_err(), "a torn write is reported");
        faults.clear();
        drop(store); // crash right after the torn write

        let store = Store::open(&config).await.unwrap();
        for b in [0, 1, 2, 6, 7] {
            assert_eq!(&store.read(1, b * BLOCK_U64, BLOCK_U64).await.unwrap()[..], &block_of(b, 1)[..], "block {b}");
        }
        for b in [4, 5] {
            let got = store.read(1, b * BLOCK_U64, BLOCK_U64).await.unwrap();
            assert!(got[..] == block_of(b, 1)[..] || got[..] == block_of(b, 4)[..], "block {b} is a mix");
        }
        store.close().await.unwrap();
        std::fs::remove_file(&path).unwrap();
    });
}

/// Bit rot in the head and in a snapshot: a scrub names exactly the flipped
/// blocks by layer and offset, a read of one fails as a checksum mismatch
/// (never wrong data) and the store stays usable; writing the good data back
/// into each named layer repairs it, and a second scrub finds nothing.
#[test]
fn a_scrub_finds_flipped_bits_in_every_layer_and_write_layer_repairs_them() {
    runtime().block_on(async {
        let (config, path) = config("scrub", 256);
        let store = Store::open(&config).await.unwrap();
        store.raise_epoch(1).await.unwrap();
        for n in 0..32u64 {
            store.write(1, n * BLOCK_U64, &block_of(n, 1), false).await.unwrap();
        }
        store.snapshot_create(1, "s1").await.unwrap();
        for n in 16..48u64 {
            store.write(1, n * BLOCK_U64, &block_of(n, 2), false).await.unwrap();
        }
        store.flush().await.unwrap();
        let sealed = store.flip_bits(2, 9, 0, 0, true).await.unwrap();
        assert!(sealed.iter().all(|b| b.layer == "s1"), "only the snapshot's blocks: {sealed:?}");
        for b in &sealed {
            let n = b.offset / BLOCK_U64;
            store.write_layer(1, "s1", b.offset, &block_of(n, 1)).await.unwrap();
        }
        let clean = store.scrub(0, 256 * BLOCK_U64).await.unwrap();
        assert!(clean.bad.is_empty());
        assert_eq!(clean.checked_bytes, 64 * BLOCK_U64, "32 blocks in s1, 32 in the head");
        let flipped = store.flip_bits(6, 42, 0, 0, false).await.unwrap();
        assert_eq!(flipped.len(), 6);
        let mut found = store.scrub(0, 256 * BLOCK_U64).await.unwrap().bad;
        let mut expected = flipped.clone();
        found.sort_by(|a, b| (&a.layer, a.offset).cmp(&(&b.layer, b.offset)));
        expected.sort_by(|a, b| (&a.layer, a.offset).cmp(&(&b.layer, b.offset)));
        assert_eq!(found, expected, "the scrub names exactly the flipped blocks");
        // A read through a flipped block of the view fails, naming it.
        let visible = flipped.iter().find(|b| b.layer.is_empty() || b.offset < 16 * BLOCK_U64);
        {
            let b = visible.expect("seed 42 flips a block the volume reads");
            match store.read(1, b.offset, BLOCK_U64).await {
                Err(StoreError::Checksum { offset }) => assert_eq!(offset, b.offset),
                other => panic!("read of a flipped block: {other:?}"),
            }
        }
        // Repair: the good data into the layer that holds the bad copy.
        for b in &flipped {
            let n = b.offset / BLOCK_U64;
            let version = if b.layer.is_empty() { 2 } else { 1 };
            store.write_layer(1, &b.layer, b.offset, &block_of(n, version)).await.unwrap();
        }
        store.flush().await.unwrap();
        assert!(store.scrub(0, 256 * BLOCK_U64).await.unwrap().bad.is_empty(), "repaired");
        for n in 0..48u64 {
            let want = block_of(n, if n >= 16 { 2 } else { 1 });
            assert_eq!(&store.read(1, n * BLOCK_U64, BLOCK_U64).await.unwrap()[..], &want[..], "block {n}");
        }
        for n in 0..32u64 {
            let got = store.read_snapshot("s1", n * BLOCK_U64, BLOCK_U64).await.unwrap();
            assert_eq!(&got[..], &block_of(n, 1)[..], "s1 block {n}");
        }
        assert!(store.flip_bits(1, 1, 200 * BLOCK_U64, 8 * BLOCK_U64, false).await.is_err(), "nothing mapped there");
        store.close().await.unwrap();
        let _ = std::fs::remove_file(path);
    });
}
