//! The replica binary as a real process: crash consistency under SIGKILL on a
//! file store and on an LVM store, corruption detection, fencing, LVM
//! segments and expand, bad input.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ironhorn_proto::replica::faults_client::FaultsClient;
use ironhorn_proto::replica::{
    CopyFromRequest, ExpandRequest, FlipBitsRequest, InfoRequest, IoOp, IoRequest, IoStatus, SetEpochRequest,
    SnapshotDeleteRequest,
};
use ironhorn_tests::*;

const VOLUME: &str = "64MiB";
const HOT_BLOCKS: u64 = 2048;
const EPOCH: u64 = 1;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// What the test knows about each block of the hot range.
#[derive(Default)]
struct Ledger {
    /// Highest version submitted so far.
    submitted: Vec<u64>,
    /// Highest version acknowledged.
    acked: Vec<u64>,
    /// Version that was acknowledged before the last completed flush.
    durable: Vec<u64>,
}

/// Streams writes and periodic flushes for `run_for`, then SIGKILLs the
/// replica with requests still in flight.
async fn write_then_crash(replica: &mut Process, ledger: &Arc<Mutex<Ledger>>, run_for: Duration, seed: u64) {
    let stream = DataStream::open(&replica.address).await;
    let limit = Arc::new(tokio::sync::Semaphore::new(48));
    let mut tasks = tokio::task::JoinSet::new();
    let start = std::time::Instant::now();
    let mut x = seed | 1;
    let mut n = 0u64;
    while start.elapsed() < run_for {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let count = 1 + (x >> 40) % 4;
        let first = x % (HOT_BLOCKS - count);
        let permit = limit.clone().acquire_owned().await.unwrap();
        let mut data = Vec::with_capacity(count as usize * BLOCK);
        let versions: Vec<u64> = {
            let mut l = ledger.lock().unwrap();
            (first..first + count)
                .map(|b| {
                    l.submitted[b as usize] += 1;
                    l.submitted[b as usize]
                })
                .collect()
        };
        for (i, v) in versions.iter().enumerate() {
            data.extend(pattern(first + i as u64, *v));
        }
        // Sent here, in version order; only the wait runs in a task.
        let pending = stream.send(IoOp::Write, first * BLOCK as u64, data.len() as u64, data.into(), EPOCH);
        let l = ledger.clone();
        tasks.spawn(async move {
            if pending.await.map(check).is_ok_and(|r| r.is_ok()) {
                let mut l = l.lock().unwrap();
                for (i, v) in versions.iter().enumerate() {
                    let b = (first + i as u64) as usize;
                    l.acked[b] = l.acked[b].max(*v);
                }
            }
            drop(permit);
        });
        n += 1;
        if n % 150 == 0 {
            let (s, l) = (stream.clone(), ledger.clone());
            tasks.spawn(async move {
                let before = l.lock().unwrap().acked.clone();
                if s.flush(EPOCH).await.is_ok() {
                    let mut l = l.lock().unwrap();
                    for (d, a) in l.durable.iter_mut().zip(before) {
                        *d = (*d).max(a);
                    }
                }
            });
        }
    }
    replica.kill9();
    while tasks.join_next().await.is_some() {}
    assert!(n > 300, "only {n} writes were issued before the crash");
}

/// Every block reads as a version at least as new as the durable one, and
/// one that was really written; then that version counts as durable.
async fn verify_after_crash(replica: &Process, ledger: &Arc<Mutex<Ledger>>) {
    let mut client = connect(&replica.address).await;
    let info = client.info(InfoRequest {}).await.unwrap().into_inner();
    assert!(!info.clean_at_open, "a SIGKILLed store must not report a clean shutdown");
    let stream = DataStream::open(&replica.address).await;
    let chunk = 256u64;
    let mut l = ledger.lock().unwrap();
    let mut newer = 0;
    for start in (0..HOT_BLOCKS).step_by(chunk as usize) {
        let data = stream.read(start * BLOCK as u64, chunk * BLOCK as u64, EPOCH).await.expect("read after restart");
        for i in 0..chunk {
            let b = start + i;
            let got = version_of(b, &data[(i as usize) * BLOCK..(i as usize + 1) * BLOCK]);
            let durable = l.durable[b as usize];
            let submitted = l.submitted[b as usize];
            match got {
                Some(v) if v >= durable && v <= submitted => {
                    if v > durable {
                        newer += 1;
                    }
                    l.durable[b as usize] = v;
                    l.acked[b as usize] = v;
                }
                Some(v) => panic!(
                    "block {b}: read version {v}, but version {durable} was flushed (submitted up to {submitted})"
                ),
                None => panic!("block {b}: content matches no write (durable version {durable})"),
            }
        }
    }
    eprintln!("verified {HOT_BLOCKS} blocks; {newer} hold writes newer than the last flush");
}

fn crash_cycles(store: &str, dir: &TempDir, cycles: u64) {
    let rt = runtime();
    let ledger = Arc::new(Mutex::new(Ledger {
        submitted: vec![0; HOT_BLOCKS as usize],
        acked: vec![0; HOT_BLOCKS as usize],
        durable: vec![0; HOT_BLOCKS as usize],
    }));
    let mut replica = start_replica("replica", store, VOLUME, dir.path(), &[]).unwrap();
    for cycle in 0..cycles {
        rt.block_on(write_then_crash(&mut replica, &ledger, Duration::from_millis(1200 + 300 * cycle), 0x1234 + cycle));
        replica = start_replica("replica", store, VOLUME, dir.path(), &[]).unwrap();
        rt.block_on(verify_after_crash(&replica, &ledger));
    }
    assert_eq!(replica.stop(Duration::from_secs(20)), Some(0), "replica exits 0 on SIGTERM");
}

#[test]
fn sigkill_mid_stream_keeps_flushed_writes_on_a_file_store() {
    let dir = TempDir::new("crash-file");
    let store = format!("file:{}", dir.path().join("r.img").display());
    crash_cycles(&store, &dir, 3);
}

#[test]
fn sigkill_mid_stream_keeps_flushed_writes_on_an_lvm_store() {
    let dir = TempDir::new("crash-lvm");
    let vg = VolumeGroup::new(dir.path(), 256 << 20);
    let store = format!("lvm:{}/crash", vg.name);
    crash_cycles(&store, &dir, 3);
    assert!(vg.lv_names().contains(&"crash".to_string()));
}

#[test]
fn a_flipped_byte_is_reported_with_its_offset() {
    let dir = TempDir::new("corrupt");
    let path = dir.path().join("r.img");
    let store = format!("file:{}", path.display());
    let rt = runtime();
    let mut replica = start_replica("replica", &store, VOLUME, dir.path(), &[]).unwrap();
    let target = 77u64;
    rt.block_on(async {
        let s = DataStream::open(&replica.address).await;
        for b in 70..80 {
            s.write(b * BLOCK as u64, pattern(b, 1), EPOCH).await.unwrap();
        }
        s.flush(EPOCH).await.unwrap();
    });
    assert_eq!(replica.stop(Duration::from_secs(20)), Some(0));

    // Find the block's bytes in the raw store and flip one byte.
    let mut raw = std::fs::read(&path).unwrap();
    let needle = pattern(target, 1);
    let at = raw.chunks(BLOCK).position(|c| c == &needle[..]).expect("the written block is somewhere in the store");
    raw[at * BLOCK + 1000] ^= 0x40;
    std::fs::write(&path, &raw).unwrap();

    let replica = start_replica("replica", &store, VOLUME, dir.path(), &[]).unwrap();
    rt.block_on(async {
        let s = DataStream::open(&replica.address).await;
        let err = s.read(target * BLOCK as u64, BLOCK as u64, EPOCH).await.expect_err("corrupt block must not read");
        let offset = (target * BLOCK as u64).to_string();
        // A checksum mismatch is DATA_LOSS (not a plain I/O error): the engine
        // repairs such a block from a healthy replica instead of failing this one.
        assert!(err.contains("DATA_LOSS") && err.contains(&offset), "error is DATA_LOSS and names the offset: {err}");
        // A range that includes it fails too; its neighbours still read.
        assert!(s.read(70 * BLOCK as u64, 10 * BLOCK as u64, EPOCH).await.is_err());
        for b in (70..80).filter(|b| *b != target) {
            let data = s.read(b * BLOCK as u64, BLOCK as u64, EPOCH).await.unwrap();
            assert_eq!(version_of(b, &data), Some(1));
        }
    });
}

#[test]
fn an_older_epoch_is_fenced_and_changes_nothing() {
    let dir = TempDir::new("fence");
    let store = format!("file:{}", dir.path().join("r.img").display());
    let rt = runtime();
    let mut replica = start_replica("replica", &store, VOLUME, dir.path(), &[]).unwrap();
    rt.block_on(async {
        let s = DataStream::open(&replica.address).await;
        s.write(0, pattern(0, 5), 5).await.unwrap();
        let err = s.write(0, pattern(0, 4), 4).await.expect_err("epoch 4 after 5");
        assert!(err.starts_with("FENCED"), "{err}");
        assert!(s.read(0, BLOCK as u64, 4).await.unwrap_err().starts_with("FENCED"));
        assert!(s.flush(4).await.unwrap_err().starts_with("FENCED"));
        let data = s.read(0, BLOCK as u64, 5).await.unwrap();
        assert_eq!(version_of(0, &data), Some(5));
        s.flush(5).await.unwrap();
    });
    // The epoch is durable: after a crash epoch 4 is still refused.
    replica.kill9();
    let replica = start_replica("replica", &store, VOLUME, dir.path(), &[]).unwrap();
    rt.block_on(async {
        let mut client = connect(&replica.address).await;
        let info = client.info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.highest_epoch, 5);
        let s = DataStream::open(&replica.address).await;
        assert!(s.write(0, pattern(0, 4), 4).await.unwrap_err().starts_with("FENCED"));
        let data = s.read(0, BLOCK as u64, 6).await.unwrap();
        assert_eq!(version_of(0, &data), Some(5));
    });
}

/// One stream message carrying many requests: overlapping writes land in
/// message order, every request gets its own answer (a bad one an error,
/// the rest still served).
#[test]
fn one_message_of_many_requests_is_applied_in_order() {
    use ironhorn_proto::replica::{IoRequest, IoStatus};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = TempDir::new("batch");
    let store = format!("file:{}", dir.path().join("r.img").display());
    let rt = runtime();
    let replica = start_replica("replica", &store, VOLUME, dir.path(), &[]).unwrap();
    rt.block_on(async {
        let write = |id: u64, block: u64, version: u64| IoRequest {
            id,
            op: IoOp::Write as i32,
            offset: block * BLOCK as u64,
            length: BLOCK as u64,
            data: pattern(block, version).into(),
            epoch: EPOCH,
            fua: false,
            flush_sequence: 0,
            paced: false,
        };
        // Block 7 written five times in one message; block 8 once, with a
        // request in between whose length does not match its data.
        let mut requests: Vec<IoRequest> = (1..=5).map(|v| write(v, 7, v)).collect();
        requests.push(IoRequest { length: 3 * BLOCK as u64, ..write(6, 9, 1) });
        requests.push(write(7, 8, 1));
        requests.push(IoRequest { id: 8, op: IoOp::Flush as i32, epoch: EPOCH, ..Default::default() });
        // All eight frames in one socket write, after the handshake.
        let mut socket = tokio::net::TcpStream::connect(&replica.address).await.expect("connect");
        let mut wire = bytes::BytesMut::from(&ironhorn_proto::data::MAGIC[..]);
        for r in &requests {
            ironhorn_proto::data::frame::put_request_header(r, &mut wire);
            wire.extend_from_slice(&r.data);
        }
        socket.write_all(&wire).await.expect("send the requests");
        let mut hello = [0u8; 8];
        socket.read_exact(&mut hello).await.expect("handshake answer");
        assert_eq!(hello, ironhorn_proto::data::MAGIC);
        let mut responses = ironhorn_proto::data::wire::FrameReader::new(
            Box::new(socket),
            ironhorn_proto::data::frame::take_response,
            Some(std::time::Duration::from_secs(20)),
        );
        let mut answered = std::collections::BTreeMap::new();
        while answered.len() < 8 {
            let r = responses.next().await.expect("stream").expect("answers for every request");
            assert!(answered.insert(r.id, r.status).is_none(), "request {} answered twice", r.id);
        }
        let ok = IoStatus::Ok as i32;
        assert_eq!(answered[&6], IoStatus::InvalidArgument as i32);
        assert!(answered.iter().filter(|(id, _)| **id != 6).all(|(_, s)| *s == ok), "{answered:?}");
        let s = DataStream::open(&replica.address).await;
        assert_eq!(version_of(7, &s.read(7 * BLOCK as u64, BLOCK as u64, EPOCH).await.unwrap()), Some(5));
        assert_eq!(version_of(8, &s.read(8 * BLOCK as u64, BLOCK as u64, EPOCH).await.unwrap()), Some(1));
        assert_eq!(version_of(9, &s.read(9 * BLOCK as u64, BLOCK as u64, EPOCH).await.unwrap()), Some(0));
    });
}

#[test]
fn lvm_store_with_a_second_segment_survives_restart_and_delete_removes_it() {
    let dir = TempDir::new("lvm");
    let vg = VolumeGroup::new(dir.path(), 512 << 20);
    let store = format!("lvm:{}/r1", vg.name);
    let rt = runtime();
    let mut replica = start_replica("replica", &store, "32MiB", dir.path(), &[]).unwrap();
    assert_eq!(vg.lv_names(), vec!["r1".to_string()], "serve created the LV");
    // Another LV right behind r1 forces r1's growth into a second segment.
    vg.create_lv("blocker", "8m");
    let blocks = 16384u64; // 64 MiB after expand
    rt.block_on(async {
        let mut client = connect(&replica.address).await;
        let s = DataStream::open(&replica.address).await;
        for b in (0..8192).step_by(97) {
            s.write(b * BLOCK as u64, pattern(b, 1), EPOCH).await.unwrap();
        }
        s.flush(EPOCH).await.unwrap();
        let info = client
            .expand(ExpandRequest { size_bytes: blocks * BLOCK as u64, epoch: EPOCH })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.size_bytes, blocks * BLOCK as u64);
        // Fill the whole volume so the data spans both segments.
        for start in (0..blocks).step_by(256) {
            let data: Vec<u8> = (start..start + 256).flat_map(|b| pattern(b, 2)).collect();
            s.write(start * BLOCK as u64, data, EPOCH).await.unwrap();
        }
        s.flush(EPOCH).await.unwrap();
    });
    assert!(vg.segment_count("r1") >= 2, "r1 grew into a second segment");
    assert_eq!(replica.stop(Duration::from_secs(20)), Some(0));

    // Restart with the wrong size: refused, one line, exit code != 0.
    let err = start_replica("replica-wrong", &store, "32MiB", dir.path(), &[]).err().expect("size mismatch refused");
    assert!(err.contains("use expand"), "{err}");

    let mut replica = start_replica("replica", &store, "64MiB", dir.path(), &[]).unwrap();
    rt.block_on(async {
        let mut client = connect(&replica.address).await;
        let info = client.info(InfoRequest {}).await.unwrap().into_inner();
        assert!(info.clean_at_open);
        let s = DataStream::open(&replica.address).await;
        for start in (0..blocks).step_by(256) {
            let data = s.read(start * BLOCK as u64, 256 * BLOCK as u64, EPOCH).await.unwrap();
            for i in 0..256u64 {
                let b = start + i;
                assert_eq!(version_of(b, &data[i as usize * BLOCK..(i as usize + 1) * BLOCK]), Some(2), "block {b}");
            }
        }
    });
    assert_eq!(replica.stop(Duration::from_secs(20)), Some(0));
    run(binary("ironhorn-replica").to_str().unwrap(), &["delete", "--store", &store]).expect("delete");
    assert_eq!(vg.lv_names(), vec!["blocker".to_string()], "delete removed the LV");
}

/// LVs are made without zeroing, so a new LV can sit on a deleted LV's
/// extents, valid superblock and all. A new store must start empty, never
/// open what an earlier volume left there.
#[test]
fn a_new_lv_on_a_deleted_lvs_extents_starts_empty() {
    let dir = TempDir::new("lvreuse");
    let vg = VolumeGroup::new(dir.path(), 256 << 20);
    let rt = runtime();
    let old = format!("lvm:{}/old", vg.name);
    let mut replica = start_replica("old", &old, "32MiB", dir.path(), &[]).unwrap();
    rt.block_on(async {
        let s = DataStream::open(&replica.address).await;
        for b in 0..64 {
            s.write(b * BLOCK as u64, pattern(b, 7), EPOCH).await.unwrap();
        }
        s.flush(EPOCH).await.unwrap();
    });
    assert_eq!(replica.stop(Duration::from_secs(20)), Some(0));
    run(binary("ironhorn-replica").to_str().unwrap(), &["delete", "--store", &old]).expect("delete");
    // Same size, same VG: the allocator hands out the same extents.
    let new = format!("lvm:{}/new", vg.name);
    let mut replica = start_replica("new", &new, "32MiB", dir.path(), &[]).unwrap();
    rt.block_on(async {
        let mut client = connect(&replica.address).await;
        let info = client.info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.revision_counter, 0, "a new store has no history");
        let s = DataStream::open(&replica.address).await;
        let data = s.read(0, 64 * BLOCK as u64, EPOCH).await.unwrap();
        assert!(data.iter().all(|&b| b == 0), "a new store read the deleted volume's data");
    });
    assert_eq!(replica.stop(Duration::from_secs(20)), Some(0));
    assert_eq!(vg.lv_names(), vec!["new".to_string()], "no staging LV left behind");
}

#[test]
fn bad_store_arguments_fail_with_one_line() {
    let dir = TempDir::new("badargs");
    let bin = binary("ironhorn-replica");
    let bin = bin.to_str().unwrap();
    let vg = VolumeGroup::new(dir.path(), 64 << 20);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["serve".into(), "--store".into(), "disk:/x".into(), "--size".into(), "1GiB".into()],
            "expected file:PATH or lvm:VG/LV",
        ),
        (
            vec![
                "serve".into(),
                "--store".into(),
                "lvm:nosuchvg9/lv".into(),
                "--size".into(),
                "16MiB".into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
            ],
            "nosuchvg9",
        ),
        (
            vec![
                "serve".into(),
                "--store".into(),
                format!("lvm:{}/big", vg.name),
                "--size".into(),
                "1GiB".into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
            ],
            "free",
        ),
        (
            vec!["serve".into(), "--store".into(), "file:/tmp/x.img".into(), "--size".into(), "12XB".into()],
            "unknown unit",
        ),
        (vec!["delete".into(), "--store".into(), format!("lvm:{}/absent", vg.name)], "not found"),
    ];
    for (args, expect) in cases {
        let out = std::process::Command::new(bin).args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} must fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expect), "{args:?}: stderr {stderr:?} should say {expect:?}");
    }
    assert!(vg.lv_names().is_empty(), "no half-created LV remains");
}

#[test]
fn bad_requests_get_errors_and_the_replica_keeps_serving() {
    let dir = TempDir::new("badreq");
    let store = format!("file:{}", dir.path().join("r.img").display());
    let rt = runtime();
    let _replica = {
        let r = start_replica("replica", &store, "16MiB", dir.path(), &[]).unwrap();
        rt.block_on(async {
            let mut client = connect(&r.address).await;
            let s = DataStream::open(&r.address).await;
            s.write(0, pattern(0, 1), EPOCH).await.unwrap();
            let past_end = s.read(16 << 20, BLOCK as u64, EPOCH).await.unwrap_err();
            assert!(past_end.starts_with("INVALID_ARGUMENT"), "{past_end}");
            let unaligned = s.write(100, pattern(0, 2), EPOCH).await.unwrap_err();
            assert!(unaligned.starts_with("INVALID_ARGUMENT"), "{unaligned}");
            let empty = s.write(0, Vec::new(), EPOCH).await.unwrap_err();
            assert!(empty.starts_with("INVALID_ARGUMENT"), "{empty}");
            let unknown = check(s.call(IoOp::Unspecified, 0, 0, Default::default(), EPOCH).await.unwrap()).unwrap_err();
            assert!(unknown.starts_with("INVALID_ARGUMENT"), "{unknown}");
            let missing =
                client.snapshot_delete(SnapshotDeleteRequest { name: "nope".into(), epoch: EPOCH }).await.unwrap_err();
            assert_eq!(missing.code(), tonic::Code::NotFound);
            let shrink = client.expand(ExpandRequest { size_bytes: 4096, epoch: EPOCH }).await.unwrap_err();
            assert_eq!(shrink.code(), tonic::Code::InvalidArgument);
            // Still serving, data intact.
            let data = s.read(0, BLOCK as u64, EPOCH).await.unwrap();
            assert_eq!(version_of(0, &data), Some(1));
        });
        r
    };
}

/// Malformed bytes on the replica's port (an oversized frame, unknown
/// flags, a frame cut off by the peer closing, neither the data stream's
/// magic nor HTTP/2) close only the connection that sent them: the replica
/// answers nothing for them and writes nothing, and other streams and new
/// connections are served with the data intact.
#[test]
fn malformed_data_frames_close_only_their_own_connection() {
    use ironhorn_proto::data::{MAGIC, frame};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = TempDir::new("badframe");
    let store = format!("file:{}", dir.path().join("r.img").display());
    let rt = runtime();
    let r = start_replica("replica", &store, "16MiB", dir.path(), &[]).unwrap();
    rt.block_on(async {
        let s = DataStream::open(&r.address).await;
        s.write(0, pattern(0, 1), EPOCH).await.unwrap();
        s.flush(EPOCH).await.unwrap();
        let write = IoRequest {
            id: 1,
            op: IoOp::Write as i32,
            length: BLOCK as u64,
            data: pattern(0, 2).into(),
            epoch: EPOCH,
            ..Default::default()
        };
        let mut header = bytes::BytesMut::new();
        frame::put_request_header(&write, &mut header);
        let mut oversized = header.clone();
        oversized[..4].copy_from_slice(&(frame::MAX_FRAME as u32 + 1).to_le_bytes());
        let mut flags = header.clone();
        flags[16] = 0x40;
        let cut_off = [&header[..], &write.data[..100]].concat();
        let cases: [(&str, Vec<u8>); 4] = [
            ("oversized frame", [&MAGIC[..], &oversized[..]].concat()),
            ("unknown flags", [&MAGIC[..], &flags[..], &write.data[..]].concat()),
            ("frame cut off", [&MAGIC[..], &cut_off[..]].concat()),
            ("neither magic nor HTTP/2", b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        ];
        for (what, bytes) in cases {
            let mut socket = tokio::net::TcpStream::connect(&r.address).await.expect("connect");
            socket.write_all(&bytes).await.expect(what);
            if what == "frame cut off" {
                socket.shutdown().await.expect("half-close");
            }
            let mut answer = Vec::new();
            let read = tokio::time::timeout(std::time::Duration::from_secs(15), socket.read_to_end(&mut answer)).await;
            let read = read.unwrap_or_else(|_| panic!("{what}: the replica kept the connection open"));
            // A reset is as good as a close; either way no frame came back.
            if read.is_ok() && bytes.starts_with(&MAGIC) {
                assert_eq!(answer, MAGIC, "{what}: only the handshake may be answered");
            }
        }
        let data = s.read(0, BLOCK as u64, EPOCH).await.unwrap();
        assert_eq!(version_of(0, &data), Some(1), "a malformed write changed the data");
        let fresh = DataStream::open(&r.address).await;
        assert_eq!(version_of(0, &fresh.read(0, BLOCK as u64, EPOCH).await.unwrap()), Some(1));
    });
}

/// A rebuild's direct copy (`CopyFrom`): the target reads a range from the
/// source replica and writes it, zero blocks as marks, and then reads the
/// same bytes. A source that cannot serve the range (unreachable, a block
/// failing its checksum there) is answered apart from the target's own
/// errors, with nothing written; bad requests (empty, unaligned, unknown
/// layer, an older epoch) are refused before the source is asked, and the
/// target keeps serving.
#[test]
fn copy_from_moves_a_range_between_replicas_and_tells_source_failures_apart() {
    let dir = TempDir::new("copyfrom");
    let blocks: u64 = 16;
    let (source, target) = (
        start_replica(
            "source",
            &format!("file:{}", dir.path().join("s.img").display()),
            "16MiB",
            dir.path(),
            &["--fault-injection"],
        )
        .unwrap(),
        start_replica("target", &format!("file:{}", dir.path().join("t.img").display()), "16MiB", dir.path(), &[])
            .unwrap(),
    );
    runtime().block_on(async {
        let s = DataStream::open(&source.address).await;
        // Blocks 3 and 9..12 stay zero: they travel as marks.
        for b in (0..blocks).filter(|b| *b != 3 && !(9..12).contains(b)) {
            s.write(b * BLOCK as u64, pattern(b, 5), EPOCH).await.unwrap();
        }
        s.flush(EPOCH).await.unwrap();
        let mut t = connect(&target.address).await;
        let ts = DataStream::open(&target.address).await;
        // The target holds other data in the range first.
        for b in 0..blocks {
            ts.write(b * BLOCK as u64, pattern(b, 1), EPOCH).await.unwrap();
        }
        let copy = |source: &str, layer: &str, offset: u64, length: u64, epoch: u64| CopyFromRequest {
            source: source.to_string(),
            layer: layer.to_string(),
            offset,
            length,
            epoch,
            timeout_ms: 2000,
        };
        let length = blocks * BLOCK as u64;
        let done = t.copy_from(copy(&source.address, "", 0, length, EPOCH)).await.unwrap().into_inner();
        assert_eq!(done.source_status, IoStatus::Ok as i32, "{}", done.source_message);
        assert_eq!(done.copied_bytes, (blocks - 4) * BLOCK as u64, "zero blocks are marks, not data");
        let (want, got) = (s.read(0, length, EPOCH).await.unwrap(), ts.read(0, length, EPOCH).await.unwrap());
        assert!(want == got, "the target reads what the source holds");
        assert_eq!(version_of(3, &got[3 * BLOCK..4 * BLOCK]), Some(0), "a zero run overwrote old data");

        // Source failures: an address nobody serves, then a bad block.
        ts.write(0, pattern(0, 9), EPOCH).await.unwrap();
        let gone = t.copy_from(copy("127.0.0.1:1", "", 0, length, EPOCH)).await.unwrap().into_inner();
        assert_eq!(gone.source_status, IoStatus::Unavailable as i32, "{}", gone.source_message);
        assert!(gone.source_message.contains("127.0.0.1:1"), "{}", gone.source_message);
        let mut faults = FaultsClient::connect(format!("http://{}", source.address)).await.unwrap();
        let flip = FlipBitsRequest { blocks: 1, seed: 7, offset: 0, length: BLOCK as u64, sealed_only: false };
        assert_eq!(faults.flip_bits(flip).await.unwrap().into_inner().flipped.len(), 1);
        let bad = t.copy_from(copy(&source.address, "", 0, length, EPOCH)).await.unwrap().into_inner();
        assert_eq!(bad.source_status, IoStatus::DataLoss as i32, "{}", bad.source_message);
        assert_eq!(bad.copied_bytes, 0);
        let block0 = ts.read(0, BLOCK as u64, EPOCH).await.unwrap();
        assert_eq!(version_of(0, &block0), Some(9), "nothing was written for a failed source");

        // Refused by the target itself.
        for (request, code) in [
            (copy(&source.address, "", 0, 0, EPOCH), tonic::Code::InvalidArgument),
            (copy(&source.address, "", 100, length, EPOCH), tonic::Code::InvalidArgument),
            (copy(&source.address, "", 16 << 20, length, EPOCH), tonic::Code::InvalidArgument),
            (copy(&source.address, "no-such-snapshot", 0, length, EPOCH), tonic::Code::NotFound),
            (copy("not an address", "", 0, length, EPOCH), tonic::Code::InvalidArgument),
        ] {
            let e = t.copy_from(request.clone()).await.unwrap_err();
            assert_eq!(e.code(), code, "{request:?}: {e}");
        }
        t.set_epoch(SetEpochRequest { epoch: EPOCH + 1 }).await.unwrap();
        let fenced = t.copy_from(copy(&source.address, "", 0, length, EPOCH)).await.unwrap_err();
        assert_eq!(fenced.code(), tonic::Code::FailedPrecondition, "{fenced}");
        let block0 = ts.read(0, BLOCK as u64, EPOCH + 1).await.unwrap();
        assert_eq!(version_of(0, &block0), Some(9), "the target still serves, unchanged");
    });
}

/// Random Io requests, many in flight at once: op numbers in and out of the
/// enum, offsets aligned or not and past the end, lengths from 0 to 2^64,
/// data that matches the length or not, fua and flush sequences at random.
/// Every request is answered; the replica keeps answering Info, and a block
/// outside the range the random writes could reach still reads back.
#[test]
fn random_io_requests_are_each_answered_and_the_replica_keeps_serving() {
    let dir = TempDir::new("fuzzreq");
    let store = format!("file:{}", dir.path().join("r.img").display());
    let size: u64 = 16 << 20;
    let r = start_replica("replica", &store, "16MiB", dir.path(), &[]).unwrap();
    runtime().block_on(async {
        let mut client = connect(&r.address).await;
        let s = DataStream::open(&r.address).await;
        let last = size / BLOCK as u64 - 1;
        s.write(last * BLOCK as u64, pattern(last, 7), EPOCH).await.unwrap();
        s.flush(EPOCH).await.unwrap();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..20 {
            let mut answers = Vec::new();
            for _ in 0..50 {
                let op = (next() % 8) as i32;
                // Half aligned inside the first half of the volume, half anything.
                let offset = if next() % 2 == 0 { (next() % (size / 2 / 4096)) * 4096 } else { next() };
                let length = match next() % 4 {
                    0 => 0,
                    1 => (next() % 64) * 4096,
                    2 => next() % (1 << 20),
                    _ => next(),
                };
                let data_len = match next() % 3 {
                    0 => length.min(1 << 20) as usize,
                    1 => (next() % 8192) as usize,
                    _ => 0,
                };
                let data = Bytes::from((0..data_len).map(|i| i as u8).collect::<Vec<u8>>());
                let req = IoRequest {
                    id: 0,
                    op,
                    offset,
                    length,
                    data,
                    epoch: EPOCH,
                    fua: next() % 2 == 0,
                    flush_sequence: next() % 1000,
                    paced: next() % 2 == 0,
                };
                answers.push(s.send_request(req));
            }
            for (i, answer) in answers.into_iter().enumerate() {
                let answered = tokio::time::timeout(Duration::from_secs(20), answer).await;
                assert!(matches!(answered, Ok(Ok(_))), "round {round} request {i} got no answer: {answered:?}");
            }
        }
        let info = client.info(InfoRequest {}).await.expect("Info still answers");
        assert_eq!(info.into_inner().size_bytes, size);
        let data = s.read(last * BLOCK as u64, BLOCK as u64, EPOCH).await.expect("read");
        assert_eq!(version_of(last, &data), Some(7), "a block out of the random writes' reach is intact");
    });
}
