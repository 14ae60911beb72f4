//! The data stream's frames: one request or one response each, a fixed
//! little-endian header followed by its payload. Pure encoding and
//! decoding over byte buffers; the sockets are [`super::io`]'s.
//!
//! ```text
//! request:  len u32 | id u64 | op i32 | flags u8 | 0 u8 ×3 | offset u64
//!           | length u64 | epoch u64 | flush_sequence u64 | data
//! response: len u32 | id u64 | status i32 | message_len u32 | message | data
//! ```
//!
//! `len` counts the bytes after itself. `op` and `status` carry the
//! `IoOp` / `IoStatus` numbers of `replica.proto` unchanged (an unknown op
//! reaches the store, which refuses it by name). Request id 0 is the
//! keep-alive: the replica answers it at once with an `Ok` of id 0.

use bytes::{Buf, BufMut, BytesMut};

use crate::replica::{IoRequest, IoResponse};

/// Bytes of a request's header, `len` included.
pub const REQUEST_HEADER: usize = 52;
/// Bytes of a response's header before its message, `len` included.
pub const RESPONSE_HEADER: usize = 20;
/// The largest `len` either side accepts: a 64 MiB payload and its header.
/// Engine I/O is at most 4 MiB; rebuild chunks are 1 MiB.
pub const MAX_FRAME: usize = (64 << 20) + 4096;
/// The id of a keep-alive request and of its answer.
pub const KEEPALIVE_ID: u64 = 0;

const FLAG_FUA: u8 = 1;
const FLAG_PACED: u8 = 2;
const KNOWN_FLAGS: u8 = FLAG_FUA | FLAG_PACED;

/// Why a byte stream is not a valid sequence of frames. The connection
/// carrying it cannot be trusted past this point and is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is larger than the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("frame of {len} bytes is shorter than its {header}-byte header")]
    TooShort { len: usize, header: usize },
    #[error("request flags {0:#04x} include unknown bits")]
    UnknownFlags(u8),
    #[error("response message of {message} bytes overruns its {len}-byte frame")]
    MessageOverrun { message: usize, len: usize },
    #[error("response message is not UTF-8")]
    MessageNotUtf8,
}

/// Appends `req`'s header to `out`; its payload (`req.data`) follows it on
/// the wire, written by the caller (so large payloads are not copied).
pub fn put_request_header(req: &IoRequest, out: &mut BytesMut) {
    out.reserve(REQUEST_HEADER);
    out.put_u32_le((REQUEST_HEADER - 4 + req.data.len()) as u32);
    out.put_u64_le(req.id);
    out.put_i32_le(req.op);
    let flags = if req.fua { FLAG_FUA } else { 0 } | if req.paced { FLAG_PACED } else { 0 };
    out.put_u8(flags);
    out.put_bytes(0, 3);
    out.put_u64_le(req.offset);
    out.put_u64_le(req.length);
    out.put_u64_le(req.epoch);
    out.put_u64_le(req.flush_sequence);
}

/// Appends `resp`'s header and message to `out`; its data follows.
pub fn put_response_header(resp: &IoResponse, out: &mut BytesMut) {
    let message = resp.message.as_bytes();
    out.reserve(RESPONSE_HEADER + message.len());
    out.put_u32_le((RESPONSE_HEADER - 4 + message.len() + resp.data.len()) as u32);
    out.put_u64_le(resp.id);
    out.put_i32_le(resp.status);
    out.put_u32_le(message.len() as u32);
    out.put_slice(message);
}

/// Takes one whole frame's bytes (its `len` field and all it counts) off
/// the front of `buf`, or None while `buf` holds less than a frame; then
/// `buf` has room reserved for the rest of it.
fn take_frame(buf: &mut BytesMut, header: usize) -> Result<Option<BytesMut>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    if len + 4 < header {
        return Err(FrameError::TooShort { len, header });
    }
    if buf.len() < 4 + len {
        buf.reserve(4 + len - buf.len());
        return Ok(None);
    }
    let mut frame = buf.split_to(4 + len);
    frame.advance(4);
    Ok(Some(frame))
}

/// Decodes the request at the front of `buf`, if all of it has arrived.
pub fn take_request(buf: &mut BytesMut) -> Result<Option<IoRequest>, FrameError> {
    let Some(mut f) = take_frame(buf, REQUEST_HEADER)? else { return Ok(None) };
    let id = f.get_u64_le();
    let op = f.get_i32_le();
    let flags = f.get_u8();
    if flags & !KNOWN_FLAGS != 0 {
        return Err(FrameError::UnknownFlags(flags));
    }
    f.advance(3);
    Ok(Some(IoRequest {
        id,
        op,
        fua: flags & FLAG_FUA != 0,
        paced: flags & FLAG_PACED != 0,
        offset: f.get_u64_le(),
        length: f.get_u64_le(),
        epoch: f.get_u64_le(),
        flush_sequence: f.get_u64_le(),
        data: f.freeze(),
    }))
}

/// Decodes the response at the front of `buf`, if all of it has arrived.
pub fn take_response(buf: &mut BytesMut) -> Result<Option<IoResponse>, FrameError> {
    let Some(mut f) = take_frame(buf, RESPONSE_HEADER)? else { return Ok(None) };
    let id = f.get_u64_le();
    let status = f.get_i32_le();
    let message_len = f.get_u32_le() as usize;
    if message_len > f.len() {
        return Err(FrameError::MessageOverrun { message: message_len, len: f.len() + RESPONSE_HEADER - 4 });
    }
    let message = f.split_to(message_len);
    let message = String::from_utf8(message.to_vec()).map_err(|_| FrameError::MessageNotUtf8)?;
    Ok(Some(IoResponse { id, status, message, data: f.freeze() }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::{IoOp, IoStatus};
    use bytes::Bytes;

    fn request(id: u64, data: &[u8]) -> IoRequest {
        IoRequest {
            id,
            op: IoOp::Write as i32,
            offset: 1 << 40,
            length: data.len() as u64,
            data: Bytes::copy_from_slice(data),
            epoch: 7,
            fua: true,
            flush_sequence: u64::MAX,
            paced: false,
        }
    }

    fn encode_request(req: &IoRequest, out: &mut BytesMut) {
        put_request_header(req, out);
        out.extend_from_slice(&req.data);
    }

    #[test]
    fn requests_round_trip_and_arrive_whole_or_not_at_all() {
        let reqs = [
            request(1, &[0xab; 4096]),
            IoRequest { op: 99, paced: true, fua: false, ..request(2, &[]) },
            IoRequest { op: IoOp::Flush as i32, flush_sequence: 3, ..request(3, &[]) },
        ];
        let mut wire = BytesMut::new();
        for r in &reqs {
            encode_request(r, &mut wire);
        }
        assert_eq!(wire.len(), 3 * REQUEST_HEADER + 4096);
        // Fed a byte at a time, each request appears exactly when its last
        // byte arrives.
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for &b in wire.iter() {
            buf.put_u8(b);
            while let Some(r) = take_request(&mut buf).unwrap() {
                got.push(r);
            }
        }
        assert_eq!(got, reqs);
        assert!(buf.is_empty());
    }

    #[test]
    fn responses_round_trip_with_message_and_data() {
        let resps = [
            IoResponse { id: 9, status: IoStatus::Ok as i32, message: String::new(), data: Bytes::from(vec![5; 8192]) },
            IoResponse {
                id: 10,
                status: IoStatus::Fenced as i32,
                message: "epoch 3 < 4 — stale".into(),
                data: Bytes::new(),
            },
            IoResponse { id: KEEPALIVE_ID, status: 0, message: String::new(), data: Bytes::new() },
        ];
        let mut wire = BytesMut::new();
        for r in &resps {
            put_response_header(r, &mut wire);
            wire.extend_from_slice(&r.data);
        }
        let mut got = Vec::new();
        while let Some(r) = take_response(&mut wire).unwrap() {
            got.push(r);
        }
        assert_eq!(got, resps);
    }

    #[test]
    fn malformed_frames_are_refused_by_kind() {
        let mut huge = BytesMut::new();
        huge.put_u32_le(MAX_FRAME as u32 + 1);
        assert_eq!(take_request(&mut huge), Err(FrameError::TooLarge(MAX_FRAME + 1)));

        let mut short = BytesMut::new();
        short.put_u32_le(8);
        short.put_u64_le(1);
        assert_eq!(take_request(&mut short), Err(FrameError::TooShort { len: 8, header: REQUEST_HEADER }));

        let mut flags = BytesMut::new();
        encode_request(&request(4, &[]), &mut flags);
        flags[16] = 0x80;
        assert_eq!(take_request(&mut flags), Err(FrameError::UnknownFlags(0x80)));

        let mut overrun = BytesMut::new();
        put_response_header(&IoResponse { id: 1, status: 0, message: "abc".into(), data: Bytes::new() }, &mut overrun);
        overrun[16..20].copy_from_slice(&100u32.to_le_bytes());
        assert!(matches!(take_response(&mut overrun), Err(FrameError::MessageOverrun { message: 100, .. })));

        let mut not_utf8 = BytesMut::new();
        put_response_header(&IoResponse { id: 1, status: 0, message: "ab".into(), data: Bytes::new() }, &mut not_utf8);
        not_utf8[20] = 0xff;
        assert_eq!(take_response(&mut not_utf8), Err(FrameError::MessageNotUtf8));
    }
}
