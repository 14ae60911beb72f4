//! Comparing replicas by checksums (no data is read): a replica's snapshot
//! chain, its per-view checksums, a content digest, and whether two hold
//! the same data. The election breaks ties with these; rebuilds check with
//! them.

use super::*;

/// A replica's snapshot names, oldest first.
pub(super) async fn snapshot_names(r: &Replica, timeout: Duration) -> Result<Vec<String>> {
    unary(timeout, r.conn.client().snapshot_list(SnapshotListRequest {}))
        .await
        .map(|l| l.snapshots.into_iter().map(|s| s.name).collect())
        .map_err(|e| replica_error(&r.address, e))
}

/// Checksums of one layer's view (`""`: the volume) over the whole volume:
/// one per MiB, the last partial MiB one per block; asked in batches.
pub(super) async fn view_checksums(r: &Replica, layer: &str, size: u64, timeout: Duration) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    let whole = size / CHUNK * CHUNK;
    let batch = CHECKSUM_BATCH_CHUNKS * CHUNK;
    let mut offset = 0;
    while offset < size {
        let (length, chunk_size) =
            if offset < whole { ((whole - offset).min(batch), CHUNK) } else { (size - offset, BLOCK) };
        let request = ChecksumsRequest { layer: layer.to_string(), merged: true, offset, length, chunk_size };
        let answer =
            unary(timeout, r.conn.client().checksums(request)).await.map_err(|e| replica_error(&r.address, e))?;
        out.extend(answer.crc32);
        offset += length;
    }
    Ok(out)
}

/// A digest of a replica's whole content: its snapshot chain and every
/// layer's checksums (no data is read). Compared only within this process.
pub(super) async fn content_digest(r: &Replica, size: u64, timeout: Duration) -> Result<u64> {
    use std::hash::{Hash, Hasher};
    let names = snapshot_names(r, timeout).await?;
    let mut digest = std::hash::DefaultHasher::new();
    for layer in names.iter().map(String::as_str).chain([""]) {
        layer.hash(&mut digest);
        view_checksums(r, layer, size, timeout).await?.hash(&mut digest);
    }
    Ok(digest.finish())
}

/// Whether two replicas hold the same snapshot chain and the same data in
/// every layer's view (checksums only; no data is read).
pub(super) async fn same_data(a: &Replica, b: &Replica, size: u64, timeout: Duration) -> Result<bool> {
    let names_a = snapshot_names(a, timeout).await?;
    if names_a != snapshot_names(b, timeout).await? {
        return Ok(false);
    }
    for layer in names_a.iter().map(String::as_str).chain([""]) {
        let (x, y) = tokio::join!(view_checksums(a, layer, size, timeout), view_checksums(b, layer, size, timeout));
        if x? != y? {
            return Ok(false);
        }
    }
    Ok(true)
}
