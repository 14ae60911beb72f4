//! NBD server (fixed newstyle) over unix sockets or TCP, written from the
//! protocol document: option haggling with EXPORT_NAME, ABORT, LIST, INFO,
//! GO, STRUCTURED_REPLY, LIST/SET_META_CONTEXT (`base:allocation`);
//! transmission with READ, WRITE, DISC, FLUSH, TRIM, WRITE_ZEROES,
//! BLOCK_STATUS, FUA and CAN_MULTI_CONN.
//!
//! A request the protocol can answer gets an error reply and the connection
//! goes on; only a request that cannot be framed (bad magic, absurd length)
//! closes the connection. Other connections never notice either.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};

use crate::volume::{BLOCK, MAX_IO_BYTES, Volume, VolumeError};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;
const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_LIST_META_CONTEXT: u32 = 9;
const OPT_SET_META_CONTEXT: u32 = 10;

const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_META_CONTEXT: u32 = 4;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
const REP_ERR_INVALID: u32 = (1 << 31) + 3;
const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;

const INFO_EXPORT: u16 = 0;
const INFO_NAME: u16 = 1;
const INFO_BLOCK_SIZE: u16 = 3;

const TF_HAS_FLAGS: u16 = 1 << 0;
const TF_SEND_FLUSH: u16 = 1 << 2;
const TF_SEND_FUA: u16 = 1 << 3;
const TF_SEND_TRIM: u16 = 1 << 5;
const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
const TF_CAN_MULTI_CONN: u16 = 1 << 8;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_BLOCK_STATUS: u16 = 7;
const CMD_FLAG_FUA: u16 = 1 << 0;
const CMD_FLAG_REQ_ONE: u16 = 1 << 3;

const REPLY_FLAG_DONE: u16 = 1 << 0;
const REPLY_TYPE_NONE: u16 = 0;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

const EIO: u32 = 5;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;
const EOVERFLOW: u32 = 75;
const ESHUTDOWN: u32 = 108;

const STATE_HOLE: u32 = 1 << 0;
const STATE_ZERO: u32 = 1 << 1;
const BASE_ALLOCATION: &str = "base:allocation";
const BASE_ALLOCATION_ID: u32 = 1;

/// Largest option payload accepted during the handshake.
const MAX_OPTION_BYTES: u32 = 64 * 1024;
/// Requests one connection may have in flight.
const IN_FLIGHT_PER_CONNECTION: usize = 128;
/// A write payload longer than this cannot be a real request: disconnect.
const MAX_FRAMED_WRITE: u32 = 64 << 20;

pub fn transmission_flags() -> u16 {
    TF_HAS_FLAGS | TF_SEND_FLUSH | TF_SEND_FUA | TF_SEND_TRIM | TF_SEND_WRITE_ZEROES | TF_CAN_MULTI_CONN
}

fn errno(e: &VolumeError) -> u32 {
    match e {
        VolumeError::Invalid(_) | VolumeError::NotFound(_) => EINVAL,
        VolumeError::Fenced(_) => ESHUTDOWN,
        VolumeError::NoSpace(_) => ENOSPC,
        VolumeError::TooLarge(_) => EOVERFLOW,
        VolumeError::Io(_) | VolumeError::Busy(_) | VolumeError::NoQuorum(_) => EIO,
    }
}

/// What the handshake settled on.
struct Session {
    structured: bool,
    allocation_context: bool,
}

enum Handshake {
    Transmit(Session),
    Closed,
}

async fn option_reply<W: AsyncWrite + Unpin>(w: &mut W, option: u32, kind: u32, data: &[u8]) -> std::io::Result<()> {
    let mut out = BytesMut::with_capacity(20 + data.len());
    out.put_u64(OPTION_REPLY_MAGIC);
    out.put_u32(option);
    out.put_u32(kind);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
    w.write_all(&out).await
}

async fn option_error<W: AsyncWrite + Unpin>(w: &mut W, option: u32, kind: u32, message: &str) -> std::io::Result<()> {
    option_reply(w, option, kind, message.as_bytes()).await
}

/// Parses `u32 len, name` at the start of `data`: (name, rest).
fn take_name(data: &[u8]) -> Option<(String, &[u8])> {
    let len = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
    let name = data.get(4..4 + len)?;
    Some((String::from_utf8(name.to_vec()).ok()?, &data[4 + len..]))
}

/// Parses a meta-context option: export name and the queries.
fn meta_queries(data: &[u8]) -> Option<(String, Vec<String>)> {
    let (export, rest) = take_name(data)?;
    let count = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let mut rest = &rest[4..];
    let mut queries = Vec::new();
    for _ in 0..count.min(1024) {
        let (q, r) = take_name(rest)?;
        queries.push(q);
        rest = r;
    }
    (queries.len() == count && rest.is_empty()).then_some((export, queries))
}

async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, volume: &Volume) -> std::io::Result<Handshake> {
    let mut hello = BytesMut::with_capacity(18);
    hello.put_u64(NBDMAGIC);
    hello.put_u64(IHAVEOPT);
    hello.put_u16(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    s.write_all(&hello).await?;
    let client_flags = s.read_u32().await?;
    if client_flags & CLIENT_FLAG_FIXED_NEWSTYLE == 0 {
        return Ok(Handshake::Closed);
    }
    let no_zeroes = client_flags & CLIENT_FLAG_NO_ZEROES != 0;
    let mut session = Session { structured: false, allocation_context: false };
    let name_ok = |n: &str| n.is_empty() || n == volume.name;
    loop {
        if s.read_u64().await? != IHAVEOPT {
            return Ok(Handshake::Closed);
        }
        let option = s.read_u32().await?;
        let length = s.read_u32().await?;
        if length > MAX_OPTION_BYTES {
            return Ok(Handshake::Closed);
        }
        let mut data = vec![0u8; length as usize];
        s.read_exact(&mut data).await?;
        match option {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data).to_string();
                if !name_ok(&name) {
                    // This option has no error reply: the protocol says close.
                    return Ok(Handshake::Closed);
                }
                let mut out = BytesMut::new();
                out.put_u64(volume.size());
                out.put_u16(transmission_flags());
                if !no_zeroes {
                    out.put_slice(&[0u8; 124]);
                }
                s.write_all(&out).await?;
                return Ok(Handshake::Transmit(session));
            }
            OPT_ABORT => {
                let _ = option_reply(s, option, REP_ACK, &[]).await;
                return Ok(Handshake::Closed);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    option_error(s, option, REP_ERR_INVALID, "LIST takes no data").await?;
                    continue;
                }
                let mut entry = BytesMut::new();
                entry.put_u32(volume.name.len() as u32);
                entry.put_slice(volume.name.as_bytes());
                option_reply(s, option, REP_SERVER, &entry).await?;
                option_reply(s, option, REP_ACK, &[]).await?;
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    option_error(s, option, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data").await?;
                    continue;
                }
                session.structured = true;
                option_reply(s, option, REP_ACK, &[]).await?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let Some((export, queries)) = meta_queries(&data) else {
                    option_error(s, option, REP_ERR_INVALID, "malformed meta context request").await?;
                    continue;
                };
                if !name_ok(&export) {
                    option_error(s, option, REP_ERR_UNKNOWN, "unknown export").await?;
                    continue;
                }
                if option == OPT_SET_META_CONTEXT && !session.structured {
                    option_error(s, option, REP_ERR_INVALID, "structured replies not negotiated").await?;
                    continue;
                }
                let wanted = if option == OPT_LIST_META_CONTEXT && queries.is_empty() {
                    true
                } else {
                    queries.iter().any(|q| q == BASE_ALLOCATION || (option == OPT_LIST_META_CONTEXT && q == "base:"))
                };
                if option == OPT_SET_META_CONTEXT {
                    session.allocation_context = wanted;
                }
                if wanted {
                    let mut ctx = BytesMut::new();
                    ctx.put_u32(if option == OPT_SET_META_CONTEXT { BASE_ALLOCATION_ID } else { 0 });
                    ctx.put_slice(BASE_ALLOCATION.as_bytes());
                    option_reply(s, option, REP_META_CONTEXT, &ctx).await?;
                }
                option_reply(s, option, REP_ACK, &[]).await?;
            }
            OPT_INFO | OPT_GO => {
                let Some((name, rest)) = take_name(&data) else {
                    option_error(s, option, REP_ERR_INVALID, "malformed INFO/GO request").await?;
                    continue;
                };
                let Some(count) = rest.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
                    option_error(s, option, REP_ERR_INVALID, "malformed INFO/GO request").await?;
                    continue;
                };
                if rest.len() != 2 + 2 * count as usize {
                    option_error(s, option, REP_ERR_INVALID, "malformed INFO/GO request").await?;
                    continue;
                }
                if !name_ok(&name) {
                    option_error(s, option, REP_ERR_UNKNOWN, &format!("no export named {name:?}")).await?;
                    continue;
                }
                let mut export = BytesMut::new();
                export.put_u16(INFO_EXPORT);
                export.put_u64(volume.size());
                export.put_u16(transmission_flags());
                option_reply(s, option, REP_INFO, &export).await?;
                let mut sizes = BytesMut::new();
                sizes.put_u16(INFO_BLOCK_SIZE);
                sizes.put_u32(BLOCK as u32);
                sizes.put_u32(BLOCK as u32);
                sizes.put_u32(MAX_IO_BYTES as u32);
                option_reply(s, option, REP_INFO, &sizes).await?;
                let mut named = BytesMut::new();
                named.put_u16(INFO_NAME);
                named.put_slice(volume.name.as_bytes());
                option_reply(s, option, REP_INFO, &named).await?;
                option_reply(s, option, REP_ACK, &[]).await?;
                if option == OPT_GO {
                    return Ok(Handshake::Transmit(session));
                }
            }
            _ => option_error(s, option, REP_ERR_UNSUP, "option not supported").await?,
        }
    }
}

fn simple_reply(cookie: u64, error: u32, data: Option<Bytes>) -> Vec<Bytes> {
    let mut head = BytesMut::with_capacity(16);
    head.put_u32(SIMPLE_REPLY_MAGIC);
    head.put_u32(error);
    head.put_u64(cookie);
    let mut out = vec![head.freeze()];
    out.extend(data);
    out
}

fn structured_chunk(cookie: u64, flags: u16, kind: u16, payload: &[Bytes]) -> Vec<Bytes> {
    let mut head = BytesMut::with_capacity(20);
    head.put_u32(STRUCTURED_REPLY_MAGIC);
    head.put_u16(flags);
    head.put_u16(kind);
    head.put_u64(cookie);
    head.put_u32(payload.iter().map(|p| p.len() as u32).sum());
    let mut out = vec![head.freeze()];
    out.extend(payload.iter().cloned());
    out
}

fn error_reply(structured: bool, cookie: u64, error: u32, message: &str) -> Vec<Bytes> {
    if structured {
        let mut p = BytesMut::new();
        p.put_u32(error);
        let msg = &message.as_bytes()[..message.len().min(4096)];
        p.put_u16(msg.len() as u16);
        p.put_slice(msg);
        structured_chunk(cookie, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, &[p.freeze()])
    } else {
        simple_reply(cookie, error, None)
    }
}

fn ok_reply(structured: bool, cookie: u64) -> Vec<Bytes> {
    if structured {
        structured_chunk(cookie, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[])
    } else {
        simple_reply(cookie, 0, None)
    }
}

struct Request {
    flags: u16,
    kind: u16,
    cookie: u64,
    offset: u64,
    length: u32,
    data: Bytes,
}

async fn serve_request(volume: &Volume, session: &Session, req: Request) -> Vec<Bytes> {
    let structured = session.structured;
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let length = req.length as u64;
    let result: Result<Vec<Bytes>, VolumeError> = match req.kind {
        CMD_READ => match volume.read(req.offset, length).await {
            Ok(data) if structured => {
                let mut at = BytesMut::with_capacity(8);
                at.put_u64(req.offset);
                Ok(structured_chunk(req.cookie, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, &[at.freeze(), data]))
            }
            Ok(data) => Ok(simple_reply(req.cookie, 0, Some(data))),
            Err(e) => Err(e),
        },
        CMD_WRITE => volume.write(req.offset, req.data, fua).await.map(|()| ok_reply(structured, req.cookie)),
        CMD_FLUSH => volume.flush().await.map(|()| ok_reply(structured, req.cookie)),
        CMD_TRIM | CMD_WRITE_ZEROES => {
            volume.trim(req.offset, length, fua).await.map(|()| ok_reply(structured, req.cookie))
        }
        CMD_BLOCK_STATUS if structured && session.allocation_context => {
            match volume.allocation(req.offset, length).await {
                Ok(extents) => {
                    let mut p = BytesMut::new();
                    p.put_u32(BASE_ALLOCATION_ID);
                    let one = req.flags & CMD_FLAG_REQ_ONE != 0;
                    for (_, len, zero) in extents.iter().take(if one { 1 } else { usize::MAX }) {
                        p.put_u32(*len as u32);
                        p.put_u32(if *zero { STATE_HOLE | STATE_ZERO } else { 0 });
                    }
                    Ok(structured_chunk(req.cookie, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, &[p.freeze()]))
                }
                Err(e) => Err(e),
            }
        }
        CMD_BLOCK_STATUS => {
            Err(VolumeError::Invalid("BLOCK_STATUS needs structured replies and base:allocation".into()))
        }
        other => {
            return error_reply(structured, req.cookie, EINVAL, &format!("unknown command {other}"));
        }
    };
    match result {
        Ok(reply) => reply,
        Err(e) => {
            tracing::debug!(kind = req.kind, offset = req.offset, length, error = %e, "NBD request failed");
            error_reply(structured, req.cookie, errno(&e), &e.to_string())
        }
    }
}

/// Serves one NBD client until it disconnects.
pub async fn serve_connection<S>(stream: S, volume: Arc<Volume>) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut stream = stream;
    let session = match handshake(&mut stream, &volume).await? {
        Handshake::Transmit(s) => s,
        Handshake::Closed => return Ok(()),
    };
    serve_transmission(stream, volume, session).await
}

/// The transmission phase alone, with simple replies: what the kernel's
/// NBD client speaks once userspace handed it the socket.
pub async fn serve_kernel_client<S>(stream: S, volume: Arc<Volume>) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_transmission(stream, volume, Session { structured: false, allocation_context: false }).await
}

async fn serve_transmission<S>(stream: S, volume: Arc<Volume>, session: Session) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let session = Arc::new(session);
    let (reader, writer) = tokio::io::split(stream);
    // Buffered both ways: at depth, several request headers arrive in one
    // read and several replies leave in one write, instead of a system call
    // per header, per payload and per reply part.
    let mut reader = tokio::io::BufReader::with_capacity(256 << 10, reader);
    let mut writer = tokio::io::BufWriter::with_capacity(256 << 10, writer);
    let (tx, mut rx) = mpsc::channel::<Vec<Bytes>>(IN_FLIGHT_PER_CONNECTION);
    let writer_task = tokio::spawn(async move {
        while let Some(parts) = rx.recv().await {
            for part in parts {
                writer.write_all(&part).await?;
            }
            // Batch replies that are already waiting before flushing.
            while let Ok(parts) = rx.try_recv() {
                for part in parts {
                    writer.write_all(&part).await?;
                }
            }
            writer.flush().await?;
        }
        writer.shutdown().await
    });
    let limit = Arc::new(Semaphore::new(IN_FLIGHT_PER_CONNECTION));
    let mut header = [0u8; 28];
    loop {
        if reader.read_exact(&mut header).await.is_err() {
            break;
        }
        let magic = u32::from_be_bytes(header[0..4].try_into().expect("4"));
        let flags = u16::from_be_bytes(header[4..6].try_into().expect("2"));
        let kind = u16::from_be_bytes(header[6..8].try_into().expect("2"));
        let cookie = u64::from_be_bytes(header[8..16].try_into().expect("8"));
        let offset = u64::from_be_bytes(header[16..24].try_into().expect("8"));
        let length = u32::from_be_bytes(header[24..28].try_into().expect("4"));
        if magic != REQUEST_MAGIC {
            tracing::warn!(magic, "bad NBD request magic; closing the connection");
            break;
        }
        if kind == CMD_DISC {
            break;
        }
        let mut data = Bytes::new();
        if kind == CMD_WRITE {
            if length > MAX_FRAMED_WRITE {
                tracing::warn!(length, "NBD write too large to frame; closing the connection");
                break;
            }
            match read_payload(&mut reader, length as usize).await {
                Ok(payload) => data = payload,
                Err(_) => break,
            }
        }
        let permit = limit.clone().acquire_owned().await.expect("semaphore");
        let (volume, session, tx) = (volume.clone(), session.clone(), tx.clone());
        let req = Request { flags, kind, cookie, offset, length, data };
        ironhorn_proto::busy_poll::spawn_request(async move {
            let reply = serve_request(&volume, &session, req).await;
            let _ = tx.send(reply).await;
            drop(permit);
        });
    }
    // Let in-flight requests finish and their replies go out.
    let _ = limit.acquire_many(IN_FLIGHT_PER_CONNECTION as u32).await;
    drop(tx);
    let _ = writer_task.await;
    Ok(())
}

/// Reads a write's `len` bytes of payload straight into a buffer of its
/// own (not zeroed first: every byte is read over).
async fn read_payload<R: AsyncRead + Unpin>(reader: &mut R, len: usize) -> std::io::Result<Bytes> {
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        if (&mut *reader).take((len - buf.len()) as u64).read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.freeze())
}

/// Where an NBD listener binds.
#[derive(Clone, Debug)]
pub enum Listen {
    Unix(std::path::PathBuf),
    Tcp(std::net::SocketAddr),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a socket path".into());
            }
            return Ok(Self::Unix(p.into()));
        }
        if let Some(a) = s.strip_prefix("tcp:") {
            return a.parse().map(Self::Tcp).map_err(|e| format!("NBD address {a:?}: {e}"));
        }
        Err(format!("NBD listener {s:?}: expected unix:PATH or tcp:HOST:PORT"))
    }
}

/// Binds the listener and serves clients forever; returns its description.
pub async fn listen(listen: &Listen, volume: Arc<Volume>) -> std::io::Result<String> {
    match listen {
        Listen::Unix(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let _ = std::fs::remove_file(path);
            let listener = tokio::net::UnixListener::bind(path)?;
            let description = format!("nbd+unix:///{}?socket={}", volume.name, path.display());
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let volume = volume.clone();
                    tokio::spawn(async move {
                        if let Err(e) = serve_connection(stream, volume).await {
                            tracing::debug!(error = %e, "NBD connection ended");
                        }
                    });
                }
            });
            Ok(description)
        }
        Listen::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let local = listener.local_addr()?;
            let description = format!("nbd://{local}/{}", volume.name);
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let _ = stream.set_nodelay(true);
                    let volume = volume.clone();
                    tokio::spawn(async move {
                        if let Err(e) = serve_connection(stream, volume).await {
                            tracing::debug!(error = %e, "NBD connection ended");
                        }
                    });
                }
            });
            Ok(description)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> Vec<u8> {
        let mut out = (n.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(n.as_bytes());
        out
    }

    #[tokio::test]
    async fn a_payload_is_read_whole_across_short_reads_and_not_past_its_end() {
        let (mut tx, rx) = tokio::io::duplex(1000);
        let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        let sent = payload.clone();
        let writer = tokio::spawn(async move {
            for piece in sent.chunks(700) {
                tx.write_all(piece).await.unwrap();
            }
            tx.write_all(b"next").await.unwrap();
            tx
        });
        let mut rx = tokio::io::BufReader::with_capacity(512, rx);
        let got = read_payload(&mut rx, payload.len()).await.unwrap();
        assert_eq!(&got[..], &payload[..]);
        let mut next = [0u8; 4];
        rx.read_exact(&mut next).await.unwrap();
        assert_eq!(&next, b"next", "what follows the payload is left for the next header");
        drop(writer.await.unwrap());
        let err = read_payload(&mut rx, 10).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "a payload cut short is an error");
    }

    #[test]
    fn parses_meta_context_requests() {
        let mut data = name("vol");
        data.extend_from_slice(&2u32.to_be_bytes());
        data.extend(name("base:allocation"));
        data.extend(name("qemu:dirty-bitmap:x"));
        let (export, queries) = meta_queries(&data).unwrap();
        assert_eq!(export, "vol");
        assert_eq!(queries, vec!["base:allocation".to_string(), "qemu:dirty-bitmap:x".to_string()]);
        // A count that does not match the queries, or trailing bytes: refused.
        let mut short = name("vol");
        short.extend_from_slice(&3u32.to_be_bytes());
        short.extend(name("base:allocation"));
        assert!(meta_queries(&short).is_none());
        let mut trailing = data.clone();
        trailing.push(0);
        assert!(meta_queries(&trailing).is_none());
    }

    #[test]
    fn option_parsers_never_panic_on_arbitrary_bytes() {
        // Deterministic pseudo-random inputs, every length up to 64.
        let mut x: u64 = 0x1234_5678_9abc_def1;
        for len in 0..64 {
            for _ in 0..200 {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x % 7) as u8
                    })
                    .collect();
                let _ = take_name(&bytes);
                let _ = meta_queries(&bytes);
            }
        }
    }

    #[test]
    fn parses_listen_addresses() {
        assert!(matches!("unix:/run/x.sock".parse::<Listen>(), Ok(Listen::Unix(_))));
        assert!(matches!("tcp:127.0.0.1:10809".parse::<Listen>(), Ok(Listen::Tcp(_))));
        for bad in ["", "unix:", "tcp:nohost", "udp:1.2.3.4:5"] {
            assert!(bad.parse::<Listen>().is_err(), "{bad:?}");
        }
    }
}
