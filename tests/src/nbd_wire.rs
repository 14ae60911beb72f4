//! The NBD wire as the tests' clients speak it: the fixed-newstyle
//! handshake with NBD_OPT_GO, and one request with its simple reply, over
//! any stream (a unix socket for the protocol tests, TCP for the chaos
//! workload). Errors are io errors; the callers decide what they mean.

use std::io::{Error, ErrorKind, Read, Write};

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_FLUSH: u16 = 3;

const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const INFO_EXPORT: u16 = 0;

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

/// Greets the server and opens `export`; its size in bytes (0 if the server
/// did not say).
pub fn handshake<S: Read + Write>(s: &mut S, export: &str) -> std::io::Result<u64> {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello)?;
    if &hello[..8] != b"NBDMAGIC" {
        return Err(Error::new(ErrorKind::InvalidData, "no NBD greeting"));
    }
    s.write_all(&3u32.to_be_bytes())?; // fixed newstyle, no zeroes
    let mut opt = Vec::new();
    opt.extend_from_slice(b"IHAVEOPT");
    opt.extend_from_slice(&OPT_GO.to_be_bytes());
    opt.extend_from_slice(&((4 + export.len() + 2) as u32).to_be_bytes());
    opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
    opt.extend_from_slice(export.as_bytes());
    opt.extend_from_slice(&0u16.to_be_bytes()); // no info requests
    s.write_all(&opt)?;
    let mut size = 0;
    loop {
        let mut head = [0u8; 20];
        s.read_exact(&mut head)?;
        let (kind, len) = (be32(&head[12..16]), be32(&head[16..20]) as usize);
        if len > 1 << 20 {
            return Err(Error::new(ErrorKind::InvalidData, format!("option reply of {len} bytes")));
        }
        let mut data = vec![0u8; len];
        s.read_exact(&mut data)?;
        match kind {
            REP_ACK => return Ok(size),
            REP_INFO if len >= 12 && u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT => {
                size = u64::from_be_bytes(data[2..10].try_into().expect("8 bytes"));
            }
            REP_INFO => {}
            _ => {
                return Err(Error::other(format!(
                    "NBD_OPT_GO refused: reply type {kind:#x} {}",
                    String::from_utf8_lossy(&data)
                )));
            }
        }
    }
}

/// Sends request `handle` and reads its simple reply: the reply's error
/// code, and the data a successful read returned.
pub fn request<S: Read + Write>(
    s: &mut S,
    handle: u64,
    kind: u16,
    offset: u64,
    length: u32,
    data: &[u8],
) -> std::io::Result<(u32, Vec<u8>)> {
    let mut req = Vec::with_capacity(28 + data.len());
    req.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    req.extend_from_slice(&0u16.to_be_bytes());
    req.extend_from_slice(&kind.to_be_bytes());
    req.extend_from_slice(&handle.to_be_bytes());
    req.extend_from_slice(&offset.to_be_bytes());
    req.extend_from_slice(&length.to_be_bytes());
    req.extend_from_slice(data);
    s.write_all(&req)?;
    let mut head = [0u8; 16];
    s.read_exact(&mut head)?;
    if be32(&head[..4]) != SIMPLE_REPLY_MAGIC {
        return Err(Error::new(ErrorKind::InvalidData, "not a simple reply"));
    }
    if u64::from_be_bytes(head[8..16].try_into().expect("8 bytes")) != handle {
        return Err(Error::new(ErrorKind::InvalidData, "a reply to another request"));
    }
    let error = be32(&head[4..8]);
    let mut out = Vec::new();
    if kind == CMD_READ && error == 0 {
        out = vec![0u8; length as usize];
        s.read_exact(&mut out)?;
    }
    Ok((error, out))
}
