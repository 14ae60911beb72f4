//! Copies a snapshot's view of a volume into new replicas: read in chunks
//! from one replica that has the snapshot (ReadLayer, merged), write every
//! chunk that is not all zeroes into each target's head (WriteLayer; a new
//! store reads zeroes already), then flush each target so the copy is
//! durable before the volume is ever attached. Writes are idempotent, so an
//! interrupted copy resumes from the last offset it recorded.

use ironhorn_proto::replica::replica_client::ReplicaClient;
use ironhorn_proto::replica::{InfoRequest, IoOp, IoRequest, IoStatus, ReadLayerRequest, WriteLayerRequest};
use tonic::transport::Channel;

/// Bytes per read and write.
pub const CHUNK: u64 = 1 << 20;

async fn client(address: &str) -> Result<ReplicaClient<Channel>, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| format!("{address}: {e}"))?
        .connect()
        .await
        .map_err(|e| format!("connect to replica {address}: {e}"))?;
    Ok(ReplicaClient::new(channel).max_decoding_message_size(16 << 20).max_encoding_message_size(16 << 20))
}

/// How long a target's flush may take, connecting included.
const FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Makes a target's writes durable: one FLUSH on its data stream.
async fn flush(address: &str, epoch: u64) -> Result<(), String> {
    let stream = ironhorn_proto::data::Client::connect(address, None, FLUSH_TIMEOUT)
        .await
        .map_err(|e| format!("flush {address}: {e}"))?;
    let request = IoRequest { op: IoOp::Flush as i32, epoch, ..Default::default() };
    let answer = tokio::time::timeout(FLUSH_TIMEOUT, stream.enqueue(request))
        .await
        .map_err(|_| format!("flush {address}: no answer within {FLUSH_TIMEOUT:?}"))?
        .map_err(|_| format!("flush {address}: data stream closed"))?;
    if answer.status == IoStatus::Ok as i32 { Ok(()) } else { Err(format!("flush {address}: {}", answer.message)) }
}

/// Why a copy did not finish.
#[derive(Debug, PartialEq, Eq)]
pub enum CopyError {
    /// `progress` said stop (this manager no longer leads); the bytes up to
    /// `at` are written, and a copy from there carries on.
    Stopped {
        at: u64,
    },
    Failed(String),
}

impl From<String> for CopyError {
    fn from(e: String) -> Self {
        CopyError::Failed(e)
    }
}

/// Copies bytes [from, bytes) of `snapshot` as seen on `source` into every
/// target; `progress(done)` after each chunk says whether to go on.
pub async fn copy_snapshot(
    source: &str,
    snapshot: &str,
    targets: &[String],
    bytes: u64,
    from: u64,
    progress: impl Fn(u64) -> bool,
) -> Result<(), CopyError> {
    let mut reader = client(source).await?;
    let mut writers = Vec::new();
    for address in targets {
        let mut c = client(address).await?;
        // Its epoch as it stands (a volume is restored before any engine).
        let epoch = c.info(InfoRequest {}).await.map_err(|e| format!("{address}: {e}"))?.into_inner().highest_epoch;
        writers.push((address.clone(), c, epoch));
    }
    let mut offset = from / CHUNK * CHUNK;
    while offset < bytes {
        let length = CHUNK.min(bytes - offset);
        let request = ReadLayerRequest { layer: snapshot.to_string(), offset, length, merged: true };
        let data = reader
            .read_layer(request)
            .await
            .map_err(|e| format!("read snapshot {snapshot} at {offset} from {source}: {e}"))?
            .into_inner()
            .data;
        if data.len() as u64 != length {
            return Err(format!("read snapshot {snapshot} at {offset}: {} bytes, not {length}", data.len()).into());
        }
        if data.iter().any(|&b| b != 0) {
            for (address, writer, epoch) in &mut writers {
                let request = WriteLayerRequest {
                    layer: String::new(),
                    offset,
                    data: data.clone(),
                    zero: false,
                    length,
                    epoch: *epoch,
                };
                writer.write_layer(request).await.map_err(|e| format!("write {address} at {offset}: {e}"))?;
            }
        }
        offset += length;
        if !progress(offset) {
            return Err(CopyError::Stopped { at: offset });
        }
    }
    for (address, _, epoch) in &writers {
        flush(address, *epoch).await?;
    }
    Ok(())
}
