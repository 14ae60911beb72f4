//! Data-safety regressions, each reproduced the way a user would meet it:
//! real replica and engine processes, the engine's CLI, a raw NBD client.
//!
//! - The engine elects its source by flush stamp, not by how many map
//!   entries a replica applied: a replica with a long history of overwrites
//!   must not beat one that took newer flushed writes.
//! - With --write-majority an engine cut off from most replicas refuses
//!   writes instead of acknowledging them.
//! - A huge read on the replica's stream is refused, and the replica goes on
//!   answering.

use std::path::Path;

use ironhorn_proto::replica::faults_client::FaultsClient;
use ironhorn_proto::replica::replica_client::ReplicaClient;
use ironhorn_proto::replica::{
    ArmFaultRequest, ClearFaultsRequest, FaultAction, FaultOp, FlipBitsRequest, ReadLayerRequest, ScrubRequest,
};
use ironhorn_tests::*;

const SIZE: &str = "64MiB";
const BLOCK: u64 = 4096;
const NBD_READ: u16 = 0;
const NBD_WRITE: u16 = 1;
const NBD_FLUSH: u16 = 3;

fn replica(dir: &Path, name: &str) -> Process {
    let store = format!("file:{}", dir.join(format!("{name}.img")).display());
    start_replica(name, &store, SIZE, dir, &[]).expect("start replica")
}

fn engine(dir: &Path, name: &str, epoch: u64, replicas: &[&Process], extra: &[&str]) -> Process {
    let addresses: Vec<&str> = replicas.iter().map(|r| r.address.as_str()).collect();
    let socket = dir.join(format!("{name}.sock"));
    start_engine(name, "vol", SIZE, epoch, &addresses, &socket, dir, extra).expect("start engine")
}

fn nbd(dir: &Path, engine: &str) -> NbdClient {
    NbdClient::connect(&dir.join(format!("{engine}.sock")), "vol").expect("NBD connect")
}

fn write_block(c: &mut NbdClient, block: u64, version: u64) {
    let (error, _) = c.request(NBD_WRITE, block * BLOCK, BLOCK as u32, &pattern(block, version)).unwrap();
    assert_eq!(error, 0, "write of block {block} version {version}");
}

fn flush(c: &mut NbdClient) {
    assert_eq!(c.request(NBD_FLUSH, 0, 0, &[]).unwrap().0, 0, "flush");
}

fn read_version(c: &mut NbdClient, block: u64) -> Option<u64> {
    let (error, data) = c.request(NBD_READ, block * BLOCK, BLOCK as u32, &[]).unwrap();
    assert_eq!(error, 0, "read of block {block}");
    version_of(block, &data)
}

/// The sequence from the review: A and B take 2,000 overwrites of one
/// block; A dies; an empty C is rebuilt from B (its revision counter is now
/// small); B dies; C alone takes 50 flushed writes; everything crashes; B
/// and C restart under a new engine. The engine must serve C's data. (It
/// served B's, losing all 50 flushed writes, when it elected by revision.)
#[test]
fn a_replica_with_a_long_history_does_not_beat_newer_flushed_writes() {
    require_root();
    let dir = TempDir::new("safety-elect");
    let mut a = replica(dir.path(), "a");
    let mut b = replica(dir.path(), "b");
    let mut e1 = engine(dir.path(), "e1", 1, &[&a, &b], &[]);
    let mut client = nbd(dir.path(), "e1");
    for version in 1..=2000 {
        write_block(&mut client, 0, version);
        if version % 100 == 0 {
            flush(&mut client);
        }
    }
    a.kill9();
    let mut c = replica(dir.path(), "c");
    engine_cli(&["replica", "add", "--engine", &e1.address, "--replica", &c.address]).expect("rebuild C from B");
    assert_eq!(replica_modes(&engine_status(&e1))[&c.address], "RW");
    b.kill9();
    for block in 100..150 {
        write_block(&mut client, block, 7);
        flush(&mut client);
    }
    drop(client);
    e1.kill9();
    c.kill9();

    let b = replica(dir.path(), "b");
    let c = replica(dir.path(), "c");
    let _e2 = engine(dir.path(), "e2", 2, &[&b, &c], &[]);
    let mut client = nbd(dir.path(), "e2");
    let lost: Vec<u64> = (100..150).filter(|&block| read_version(&mut client, block) != Some(7)).collect();
    assert!(lost.is_empty(), "flushed writes lost after the restart, blocks {lost:?}");
    assert_eq!(read_version(&mut client, 0), Some(2000), "the overwritten block keeps its last flushed version");
}

/// A rebuilt replica that went stale: C is rebuilt from B (C's stamp is
/// handed over only by the flush after the rebuild), then C dies and B alone
/// takes the newest flushed writes. Restarted together, with C listed first,
/// B serves: neither the list order nor C's copied history counts.
#[test]
fn a_rebuilt_replica_that_went_stale_does_not_serve_whatever_the_list_order() {
    require_root();
    let dir = TempDir::new("safety-elect2");
    let b = replica(dir.path(), "b");
    let mut e1 = engine(dir.path(), "e1", 1, &[&b], &[]);
    let mut client = nbd(dir.path(), "e1");
    for block in 0..4000 {
        write_block(&mut client, block, 1);
    }
    flush(&mut client);
    let mut c = replica(dir.path(), "c");
    engine_cli(&["replica", "add", "--engine", &e1.address, "--replica", &c.address]).expect("rebuild C from B");
    c.kill9();
    for block in 0..10 {
        write_block(&mut client, block, 2);
        flush(&mut client);
    }
    drop(client);
    e1.kill9();
    let mut b = b;
    b.kill9();

    let b = replica(dir.path(), "b");
    let c = replica(dir.path(), "c");
    // C first in the list: list order must not matter either.
    let e2 = engine(dir.path(), "e2", 2, &[&c, &b], &[]);
    let mut client = nbd(dir.path(), "e2");
    for block in 0..10 {
        assert_eq!(read_version(&mut client, block), Some(2), "block {block}: flushed version 2 lost");
    }
    assert_eq!(read_version(&mut client, 3999), Some(1));
    let status = engine_status(&e2);
    assert_eq!(replica_modes(&status)[&b.address], "RW", "{status}");
}

/// With --write-majority, an engine whose volume has three replicas and
/// that reaches only one refuses writes (EIO) instead of acknowledging
/// them; without it, one replica is enough.
#[test]
fn with_write_majority_an_engine_cut_off_from_two_of_three_replicas_refuses_writes() {
    require_root();
    let dir = TempDir::new("safety-quorum");
    let r: Vec<Process> = (0..3).map(|i| replica(dir.path(), &format!("r{i}"))).collect();
    let mut replicas = r.into_iter();
    let (keep, mut gone1, mut gone2) = (replicas.next().unwrap(), replicas.next().unwrap(), replicas.next().unwrap());
    let majority = engine(dir.path(), "major", 1, &[&keep, &gone1, &gone2], &["--write-majority"]);
    let mut client = nbd(dir.path(), "major");
    write_block(&mut client, 5, 1);
    flush(&mut client);
    gone1.kill9();
    write_block(&mut client, 6, 1);
    flush(&mut client);
    gone2.kill9();
    let (error, _) = client.request(NBD_WRITE, 7 * BLOCK, BLOCK as u32, &pattern(7, 1)).unwrap();
    assert_eq!(error, 5, "a write one of three replicas took must fail with EIO");
    let (error, _) = client.request(NBD_FLUSH, 0, 0, &[]).unwrap();
    assert_eq!(error, 5, "so must a flush");
    assert_eq!(read_version(&mut client, 6), Some(1), "reads still served");
    drop(client);
    drop(majority);

    // The same cut without the option: one replica acknowledges alone.
    let solo = engine(dir.path(), "solo", 2, &[&keep], &[]);
    let mut client = nbd(dir.path(), "solo");
    write_block(&mut client, 8, 1);
    flush(&mut client);
    assert_eq!(read_version(&mut client, 8), Some(1));
    drop(solo);
}

/// One stream Read of 1 TiB on a store of 2 TiB (a sparse file made before
/// the replica formats it) is refused with INVALID_ARGUMENT; the replica
/// answers Info and small reads afterwards. (It allocated 1 TiB and
/// aborted before.)
#[test]
fn a_huge_stream_read_is_refused_and_the_replica_keeps_answering() {
    require_root();
    let dir = TempDir::new("safety-huge");
    let path = dir.path().join("big.img");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(5u64 << 39).unwrap(); // 2.5 TiB, sparse
    drop(file);
    let store = format!("file:{}", path.display());
    let r = start_replica("big", &store, "2TiB", dir.path(), &[]).expect("start replica on a sparse file");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let mut client = connect(&r.address).await;
        let stream = DataStream::open(&r.address).await;
        let err = stream.read(0, 1 << 40, 1).await.expect_err("a 1 TiB read must be refused");
        assert!(err.contains("larger than"), "{err}");
        let info = client.info(ironhorn_proto::replica::InfoRequest {}).await.expect("Info still answers");
        assert_eq!(info.into_inner().size_bytes, 2 << 40);
        let data = stream.read(1 << 40, 4096, 1).await.expect("a small read still works");
        assert!(data.iter().all(|&b| b == 0));
    });
}

const CHUNK_BLOCKS: u64 = 256;

/// Writes blocks [chunk * 256, +256) at `version` in one 1 MiB request.
fn write_chunk(c: &mut NbdClient, chunk: u64, version: u64) -> u32 {
    let first = chunk * CHUNK_BLOCKS;
    let data: Vec<u8> = (first..first + CHUNK_BLOCKS).flat_map(|b| pattern(b, version)).collect();
    c.request(NBD_WRITE, first * BLOCK, data.len() as u32, &data).unwrap().0
}

/// Every replica runs out of space (a snapshot holds the first version of
/// every block, and the overwrites exceed the stores' spare blocks): the NBD
/// client gets ENOSPC, no replica is failed, every acknowledged write and
/// the data under the refused ones read back, the engine says out of space.
/// Deleting the snapshot frees blocks and writes land again. (Before, the
/// client got EIO and all three replicas were failed at once.)
#[test]
fn a_volume_whose_every_replica_is_full_refuses_writes_with_enospc_and_keeps_serving_reads() {
    require_root();
    let dir = TempDir::new("safety-full");
    let r: Vec<Process> = (0..3).map(|i| replica(dir.path(), &format!("f{i}"))).collect();
    let e = engine(dir.path(), "full", 1, &[&r[0], &r[1], &r[2]], &[]);
    let mut client = nbd(dir.path(), "full");
    let chunks = (64 << 20) / (CHUNK_BLOCKS * BLOCK);
    for chunk in 0..chunks {
        assert_eq!(write_chunk(&mut client, chunk, 1), 0, "first write of chunk {chunk}");
    }
    flush(&mut client);
    engine_cli(&["snapshot", "create", "--engine", &e.address, "s1"]).expect("snapshot");

    let mut refused = None;
    for chunk in 0..chunks {
        match write_chunk(&mut client, chunk, 2) {
            0 => {}
            28 => {
                refused = Some(chunk);
                break;
            }
            other => panic!("overwrite of chunk {chunk}: error {other}, expected 0 or ENOSPC (28)"),
        }
    }
    let refused = refused.expect("the stores never ran out of space: the test did not reach its point");
    assert!(refused > 0, "some overwrites fit before the stores filled up");
    assert_eq!(client.request(NBD_FLUSH, 0, 0, &[]).unwrap().0, 0, "a flush needs no space and succeeds");
    let status = engine_status(&e);
    let modes = replica_modes(&status);
    assert!(modes.values().all(|m| m == "RW"), "no replica failed for lack of space: {modes:?}");
    assert_eq!(status["out_of_space"], true, "the engine says it is out of space: {status}");

    for chunk in 0..chunks {
        for block in chunk * CHUNK_BLOCKS..(chunk + 1) * CHUNK_BLOCKS {
            let version = read_version(&mut client, block);
            match chunk.cmp(&refused) {
                std::cmp::Ordering::Less => assert_eq!(version, Some(2), "acknowledged overwrite of block {block}"),
                std::cmp::Ordering::Equal => assert_eq!(version, Some(1), "refused write left block {block} as it was"),
                std::cmp::Ordering::Greater => assert_eq!(version, Some(1), "block {block} never overwritten"),
            }
        }
    }

    engine_cli(&["snapshot", "delete", "--engine", &e.address, "s1"]).expect("snapshot delete");
    assert_eq!(write_chunk(&mut client, refused, 2), 0, "with the snapshot gone the write fits");
    flush(&mut client);
    assert_eq!(engine_status(&e)["out_of_space"], false, "and the engine no longer says out of space");
    assert_eq!(read_version(&mut client, refused * CHUNK_BLOCKS), Some(2));
}

/// Three replicas with their fault-injection API on, named PREFIX0..2.
fn fault_injecting_replicas(dir: &Path, prefix: &str) -> Vec<Process> {
    (0..3)
        .map(|i| {
            let store = format!("file:{}", dir.join(format!("{prefix}{i}.img")).display());
            start_replica(&format!("{prefix}{i}"), &store, SIZE, dir, &["--fault-injection"]).expect("replica")
        })
        .collect()
}

/// Arms a fault on a replica started with --fault-injection.
fn arm_fault(address: &str, op: FaultOp, action: FaultAction) -> Result<u64, tonic::Status> {
    runtime().block_on(async {
        let mut c = FaultsClient::connect(format!("http://{address}")).await.expect("connect to the replica");
        let request = ArmFaultRequest { ops: vec![op as i32], action: action as i32, skip: 0, times: 1, delay_ms: 0 };
        c.arm(request).await.map(|r| r.into_inner().fired)
    })
}

fn faults_fired(address: &str) -> u64 {
    runtime().block_on(async {
        let mut c = FaultsClient::connect(format!("http://{address}")).await.expect("connect to the replica");
        c.state(ClearFaultsRequest {}).await.expect("fault state").into_inner().fired
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Disks that fail under running processes: one replica's next data write
/// fails with EIO, another's next sync does. Each of those replicas is
/// failed alone (its own fault), the client sees every write and flush
/// succeed on the replica left, and every acknowledged block reads back.
/// A replica started without --fault-injection refuses to arm a fault.
#[test]
fn replicas_whose_disk_fails_a_write_or_a_sync_are_failed_alone_and_nothing_acknowledged_is_lost() {
    require_root();
    let dir = TempDir::new("safety-disk");
    let r = fault_injecting_replicas(dir.path(), "d");
    let e = engine(dir.path(), "disk", 1, &[&r[0], &r[1], &r[2]], &[]);
    let mut client = nbd(dir.path(), "disk");
    for block in 0..64 {
        write_block(&mut client, block, 1);
    }
    flush(&mut client);

    arm_fault(&r[1].address, FaultOp::Write, FaultAction::Eio).expect("arm a write fault");
    for block in 64..128 {
        write_block(&mut client, block, 1);
    }
    flush(&mut client);
    arm_fault(&r[2].address, FaultOp::Sync, FaultAction::Eio).expect("arm a sync fault");
    for block in 128..192 {
        write_block(&mut client, block, 1);
    }
    flush(&mut client);

    assert_eq!(faults_fired(&r[1].address), 1, "the write fault hit a write");
    assert_eq!(faults_fired(&r[2].address), 1, "the sync fault hit a sync");
    let modes = replica_modes(&engine_status(&e));
    assert_eq!(modes[&r[0].address], "RW", "{modes:?}");
    assert_eq!(modes[&r[1].address], "ERR", "failed by its own write error: {modes:?}");
    assert_eq!(modes[&r[2].address], "ERR", "failed by its own sync error: {modes:?}");
    for block in 0..192 {
        assert_eq!(read_version(&mut client, block), Some(1), "acknowledged block {block}");
    }

    let plain = replica(dir.path(), "plain");
    let refused = arm_fault(&plain.address, FaultOp::Write, FaultAction::Eio).expect_err("fault injection is off");
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
}

/// Flips one bit in each of `blocks` data blocks of a replica started with
/// --fault-injection; returns (layer, offset) of each.
fn flip_bits(address: &str, blocks: u32, seed: u64) -> Vec<(String, u64)> {
    runtime().block_on(async {
        let mut c = FaultsClient::connect(format!("http://{address}")).await.expect("connect to the replica");
        let request = FlipBitsRequest { blocks, seed, offset: 0, length: 0, sealed_only: false };
        let flipped = c.flip_bits(request).await.expect("flip bits").into_inner().flipped;
        flipped.into_iter().map(|b| (b.layer, b.offset)).collect()
    })
}

/// What the replica's own scrub finds now, and its merged view of `layer`.
fn replica_scrub_and_view(address: &str, layer: &str, length: u64) -> (usize, Vec<u8>) {
    runtime().block_on(async {
        let mut c = ReplicaClient::connect(format!("http://{address}")).await.expect("connect to the replica");
        let bad = c.scrub(ScrubRequest { offset: 0, length: 64 << 20 }).await.expect("scrub").into_inner().bad;
        let read = ReadLayerRequest { layer: layer.into(), offset: 0, length, merged: true };
        let view = c.read_layer(read).await.expect("read layer").into_inner().data;
        (bad.len(), view.to_vec())
    })
}

/// Bit rot in one of three replicas, in the head and in a snapshot: reads
/// of the bad blocks return good data from another replica and queue them
/// for repair; a scrub finds the rest; every bad block is rewritten in
/// place from a healthy copy and the replica never leaves RW (no rebuild).
/// Afterwards the replica's own scrub finds nothing and its head and
/// snapshot read the same bytes as a healthy replica's.
#[test]
fn flipped_bits_in_one_replica_are_repaired_in_place_by_reads_and_a_scrub() {
    require_root();
    let dir = TempDir::new("safety-rot");
    let r = fault_injecting_replicas(dir.path(), "b");
    let e = engine(dir.path(), "rot", 1, &[&r[0], &r[1], &r[2]], &[]);
    let mut client = nbd(dir.path(), "rot");
    for block in 0..256 {
        write_block(&mut client, block, 1);
    }
    flush(&mut client);
    engine_cli(&["snapshot", "create", "--engine", &e.address, "before"]).expect("snapshot");
    for block in 128..384 {
        write_block(&mut client, block, 2);
    }
    flush(&mut client);
    let bad = r[0].address.clone();
    let flipped = flip_bits(&bad, 24, 7);
    assert_eq!(flipped.len(), 24);
    assert!(flipped.iter().any(|(layer, _)| layer == "before"), "some in the snapshot: {flipped:?}");
    assert!(flipped.iter().any(|(layer, _)| layer.is_empty()), "some in the head: {flipped:?}");

    // Every block read three times (the replicas serve reads in turns): all good.
    for _ in 0..3 {
        for block in 0..384 {
            let want = if block >= 128 { 2 } else { 1 };
            assert_eq!(read_version(&mut client, block), Some(want), "block {block}");
        }
    }
    // The reads queued their bad blocks for repair: wait until some were.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while engine_status(&e)["bad_blocks_repaired"].as_u64().unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "reads met no bad block: {}", engine_status(&e));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let scrub: serde_json::Value =
        serde_json::from_str(&engine_cli(&["scrub", "--engine", &e.address, "--wait"]).expect("scrub")).unwrap();
    assert_eq!(scrub["state"], "done", "{scrub}");
    assert_eq!(scrub["checked_bytes"].as_u64(), Some(3 * (256 + 256) * BLOCK), "every block of all 3: {scrub}");
    let status = engine_status(&e);
    assert_eq!(status["bad_blocks_found"].as_u64(), Some(24), "reads and the scrub found each once: {status}");
    assert_eq!(status["bad_blocks_repaired"].as_u64(), Some(24), "{status}");
    // Blocks of the snapshot the head shadows are never read: only the
    // scrub finds those.
    let shadowed = flipped.iter().filter(|(layer, offset)| layer == "before" && *offset >= 128 * BLOCK).count();
    assert!(shadowed == 0 || scrub["bad_blocks"].as_u64() >= Some(shadowed as u64), "{flipped:?} {scrub}");
    let modes = replica_modes(&status);
    assert!(modes.values().all(|m| m == "RW"), "no replica failed: {modes:?}");
    assert!(status["rebuilds"].as_array().unwrap().is_empty(), "nothing rebuilt: {status}");

    let again: serde_json::Value =
        serde_json::from_str(&engine_cli(&["scrub", "--engine", &e.address, "--wait"]).expect("scrub")).unwrap();
    assert_eq!(again["bad_blocks"], 0, "{again}");
    for layer in ["", "before"] {
        let (found, view) = replica_scrub_and_view(&bad, layer, 2 << 20);
        let (_, good) = replica_scrub_and_view(&r[1].address, layer, 2 << 20);
        assert_eq!(found, 0, "the replica's own scrub finds nothing");
        assert!(view == good, "layer {layer:?} of the repaired replica equals a healthy one's");
    }
}

/// A rebuild whose source reads back bad blocks: the chunks holding them are
/// copied from another healthy replica instead (the rebuild does not fail
/// and start over from a source that will fail the same way), and the
/// source's bad blocks are repaired in place. Both old replicas carry
/// flipped bits, in different blocks, so whichever one the engine picks as
/// the source has bad blocks the other holds good. The new replica ends
/// RW with exactly the written bytes; a scrub afterwards finds the rest,
/// and nothing is left bad.
#[test]
fn a_rebuild_copies_a_bad_source_block_from_another_replica_and_the_source_is_repaired() {
    require_root();
    let dir = TempDir::new("safety-rotsrc");
    let r = fault_injecting_replicas(dir.path(), "s");
    let e = engine(dir.path(), "rotsrc", 1, &[&r[0], &r[1]], &[]);
    let mut client = nbd(dir.path(), "rotsrc");
    for block in 0..256 {
        write_block(&mut client, block, 1);
    }
    flush(&mut client);
    let a = flip_bits(&r[0].address, 6, 11);
    let b = flip_bits(&r[1].address, 6, 12);
    assert!(a.iter().all(|x| !b.contains(x)), "the seeds flip different blocks: {a:?} {b:?}");

    engine_cli(&["replica", "add", "--engine", &e.address, "--replica", &r[2].address])
        .expect("the rebuild finishes although its source has bad blocks");
    let status = engine_status(&e);
    assert_eq!(replica_modes(&status)[&r[2].address], "RW", "{status}");
    assert_eq!(status["rebuilds"][0]["state"], "done", "{status}");
    assert!(status["bad_blocks_found"].as_u64() > Some(0), "the copy met the source's bad blocks: {status}");
    let (found, view) = replica_scrub_and_view(&r[2].address, "", 2 << 20);
    assert_eq!(found, 0, "the new replica holds no bad block");
    for block in 0..512u64 {
        let got = &view[(block * BLOCK) as usize..((block + 1) * BLOCK) as usize];
        let want = if block < 256 { pattern(block, 1) } else { vec![0; BLOCK as usize] };
        assert!(got == want.as_slice(), "block {block} of the rebuilt replica");
    }

    let scrub: serde_json::Value =
        serde_json::from_str(&engine_cli(&["scrub", "--engine", &e.address, "--wait"]).expect("scrub")).unwrap();
    assert_eq!(scrub["state"], "done", "{scrub}");
    let status = engine_status(&e);
    assert_eq!(status["bad_blocks_found"].as_u64(), Some(12), "every flipped block found once: {status}");
    assert_eq!(status["bad_blocks_repaired"].as_u64(), Some(12), "{status}");
    assert!(replica_modes(&status).values().all(|m| m == "RW"), "{status}");
    for replica in &r {
        let (found, view) = replica_scrub_and_view(&replica.address, "", 2 << 20);
        assert_eq!(found, 0, "{} holds no bad block", replica.address);
        for block in 0..256u64 {
            assert_eq!(version_of(block, &view[(block * BLOCK) as usize..][..BLOCK as usize]), Some(1));
        }
    }
}

/// A rebuild of a full volume while the whole volume is rewritten twice. The
/// rebuild's join snapshot keeps every block the writes replace, and a
/// store's room beyond the volume is a quarter of it: held for the whole
/// copy, the snapshot ran the replicas out of space and writes got ENOSPC.
/// The engine now moves the join point forward when a replica's free room
/// has halved since the join (a new rebuild snapshot, the old one merged
/// away), so the writes never fail, the rebuild finishes, and the new
/// replica alone serves the last version of every block.
#[test]
fn a_rebuild_under_a_full_rewrite_never_runs_the_replicas_out_of_space() {
    require_root();
    let dir = TempDir::new("safety-roll");
    let a = replica(dir.path(), "a");
    let b = replica(dir.path(), "b");
    let c = replica(dir.path(), "c");
    let e = engine(dir.path(), "roll", 1, &[&a, &b], &["--rebuild-mib-per-sec", "8"]);
    let mut client = nbd(dir.path(), "roll");
    const BLOCKS: u64 = 64 * 256;
    const RUN: u64 = 64;
    let write_all = |client: &mut NbdClient, version: u64| {
        for first in (0..BLOCKS).step_by(RUN as usize) {
            let data: Vec<u8> = (first..first + RUN).flat_map(|block| pattern(block, version)).collect();
            let (error, _) = client.request(NBD_WRITE, first * BLOCK, (RUN * BLOCK) as u32, &data).unwrap();
            assert_eq!(error, 0, "write of blocks {first}.. version {version}");
        }
        flush(client);
    };
    write_all(&mut client, 1);

    let engine_address = e.address.clone();
    let new = c.address.clone();
    let add =
        std::thread::spawn(move || engine_cli(&["replica", "add", "--engine", &engine_address, "--replica", &new]));
    // The rewrite starts once the copy is observably under way.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let rebuild = engine_status(&e)["rebuilds"][0].clone();
        if rebuild["state"] == "running" && rebuild["copied_bytes"].as_u64() > Some(0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no rebuild copying: {rebuild}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    write_all(&mut client, 2);
    write_all(&mut client, 3);
    let rebuild = engine_status(&e)["rebuilds"][0].clone();
    assert_eq!(rebuild["state"], "running", "the rewrite happened during the copy: {rebuild}");
    add.join().unwrap().expect("the rebuild finishes");
    let status = engine_status(&e);
    assert!(replica_modes(&status).values().all(|m| m == "RW"), "{status}");
    assert!(status["rebuilds"][0]["join_moves"].as_u64() >= Some(2), "the join point moved: {status}");

    // The rebuilt replica alone serves every block's last version.
    for old in [&a, &b] {
        engine_cli(&["replica", "remove", "--engine", &e.address, "--replica", &old.address]).expect("remove");
    }
    assert_eq!(replica_modes(&engine_status(&e)).len(), 1);
    for first in (0..BLOCKS).step_by(RUN as usize) {
        let (error, data) = client.request(NBD_READ, first * BLOCK, (RUN * BLOCK) as u32, &[]).unwrap();
        assert_eq!(error, 0, "read of blocks {first}..");
        for (i, block) in (first..first + RUN).enumerate() {
            let got = version_of(block, &data[i * BLOCK as usize..][..BLOCK as usize]);
            assert_eq!(got, Some(3), "block {block} on the rebuilt replica");
        }
    }
}

/// A small filesystem mounted for one test, unmounted (and its loop device
/// released: mount -o loop sets autoclear) on drop, by its exact path.
struct SmallFs {
    mount: std::path::PathBuf,
}

impl SmallFs {
    fn new(dir: &Path, name: &str, mib: u64) -> SmallFs {
        require_tool("mkfs.ext4", "e2fsprogs");
        let image = dir.join(format!("{name}.fs"));
        let mount = dir.join(name);
        std::fs::File::create(&image).unwrap().set_len(mib << 20).unwrap();
        run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]).expect("mkfs.ext4");
        std::fs::create_dir_all(&mount).unwrap();
        run("mount", &["-o", "loop", image.to_str().unwrap(), mount.to_str().unwrap()]).expect("mount -o loop");
        SmallFs { mount }
    }

    /// Fills what is left of the filesystem with one file.
    fn fill(&self) {
        let filler = self.mount.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0xa5u8; 1 << 20];
        loop {
            match std::io::Write::write(&mut f, &chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", filler.display()),
            }
        }
        let _ = f.sync_all();
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mount).status();
    }
}

/// A replica whose file disk (a small ext4 filesystem) fills up to the last
/// byte while the volume runs: its store was reserved when it was made, so
/// every write after goes on landing there (no I/O error, it stays RW) and
/// reads back; a new store on the full filesystem is refused with a clear
/// out-of-space error, and the replicas running are unaffected.
#[test]
fn a_replica_whose_filesystem_fills_up_keeps_its_store_and_a_new_store_is_refused() {
    require_root();
    let dir = TempDir::new("safety-fsfull");
    let fs = SmallFs::new(dir.path(), "small", 128);
    let full_store = format!("file:{}", fs.mount.join("f0.img").display());
    let r0 = start_replica("f0", &full_store, SIZE, dir.path(), &[]).expect("replica on the small filesystem");
    let r1 = replica(dir.path(), "f1");
    let e = engine(dir.path(), "fsfull", 1, &[&r0, &r1], &[]);
    let mut client = nbd(dir.path(), "fsfull");
    for block in 0..1024 {
        write_block(&mut client, block, 1);
    }
    flush(&mut client);
    fs.fill();
    let free = nix_free_bytes(&fs.mount);
    assert!(free < 1 << 20, "the filesystem is full ({free} bytes free)");
    // Overwrites and new blocks, across the whole volume.
    for block in (0..16384).step_by(7) {
        write_block(&mut client, block, 2);
    }
    flush(&mut client);
    let status = engine_status(&e);
    assert_eq!(replica_modes(&status)[&r0.address], "RW", "the replica on the full filesystem: {status}");
    for block in (0..16384).step_by(7) {
        assert_eq!(read_version(&mut client, block), Some(2), "block {block}");
    }
    let refused =
        match start_replica("f2", &format!("file:{}", fs.mount.join("f2.img").display()), SIZE, dir.path(), &[]) {
            Ok(_) => panic!("a new store on a full filesystem was made"),
            Err(e) => e,
        };
    assert!(refused.contains("No space left") || refused.contains("out of space"), "{refused}");
    assert!(!fs.mount.join("f2.img").exists(), "the refused store left no file behind");
    assert_eq!(replica_modes(&engine_status(&e))[&r0.address], "RW");
    drop(client);
    drop(e);
    drop(r0);
}

fn nix_free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs into a zeroed struct with a valid C string.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    s.f_bavail as u64 * s.f_frsize as u64
}
