//! An NBD client over TCP for the workload: fixed newstyle handshake,
//! NBD_OPT_GO, simple replies, one request at a time. Unlike the protocol
//! tests' client it never panics: a server's error reply and a broken
//! connection are told apart, so the workload can reconnect after the
//! latter.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_FLUSH: u16 = 3;

#[derive(Debug)]
pub enum NbdError {
    /// The server answered with this errno; the connection is still good.
    Errno(u32),
    /// The connection failed or the server spoke nonsense: reconnect.
    Connection(String),
}

impl std::fmt::Display for NbdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NbdError::Errno(e) => write!(f, "server error {e}"),
            NbdError::Connection(e) => write!(f, "connection: {e}"),
        }
    }
}

fn conn(e: impl std::fmt::Display) -> NbdError {
    NbdError::Connection(e.to_string())
}

/// `nbd://HOST:PORT/EXPORT` → (HOST:PORT, EXPORT).
pub fn parse_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix("nbd://")?;
    let (address, export) = rest.split_once('/')?;
    Some((address.to_string(), export.to_string()))
}

pub struct Conn {
    stream: TcpStream,
    handle: u64,
}

impl Conn {
    pub fn connect(uri: &str, timeout: Duration) -> Result<Conn, NbdError> {
        let (address, export) = parse_uri(uri).ok_or_else(|| conn(format!("not an nbd:// URI: {uri:?}")))?;
        let address: std::net::SocketAddr = address.parse().map_err(conn)?;
        let mut s = TcpStream::connect_timeout(&address, timeout).map_err(conn)?;
        s.set_read_timeout(Some(timeout)).map_err(conn)?;
        s.set_write_timeout(Some(timeout)).map_err(conn)?;
        s.set_nodelay(true).map_err(conn)?;
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).map_err(conn)?;
        if &hello[..8] != b"NBDMAGIC" {
            return Err(conn("no NBD greeting"));
        }
        s.write_all(&3u32.to_be_bytes()).map_err(conn)?; // fixed newstyle, no zeroes
        let mut opt = Vec::new();
        opt.extend_from_slice(b"IHAVEOPT");
        opt.extend_from_slice(&7u32.to_be_bytes()); // NBD_OPT_GO
        opt.extend_from_slice(&((4 + export.len() + 2) as u32).to_be_bytes());
        opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
        opt.extend_from_slice(export.as_bytes());
        opt.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&opt).map_err(conn)?;
        loop {
            let mut head = [0u8; 20];
            s.read_exact(&mut head).map_err(conn)?;
            let kind = u32::from_be_bytes(head[12..16].try_into().expect("4 bytes"));
            let len = u32::from_be_bytes(head[16..20].try_into().expect("4 bytes")) as usize;
            if len > 1 << 20 {
                return Err(conn(format!("option reply of {len} bytes")));
            }
            let mut data = vec![0u8; len];
            s.read_exact(&mut data).map_err(conn)?;
            match kind {
                1 => break, // NBD_REP_ACK
                3 => {}     // NBD_REP_INFO
                _ => {
                    return Err(conn(format!(
                        "NBD_OPT_GO refused: reply {kind:#x} {}",
                        String::from_utf8_lossy(&data)
                    )));
                }
            }
        }
        Ok(Conn { stream: s, handle: 0 })
    }

    fn request(&mut self, kind: u16, offset: u64, length: u32, data: &[u8]) -> Result<Vec<u8>, NbdError> {
        self.handle += 1;
        let mut req = Vec::with_capacity(28 + data.len());
        req.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        req.extend_from_slice(&0u16.to_be_bytes());
        req.extend_from_slice(&kind.to_be_bytes());
        req.extend_from_slice(&self.handle.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&length.to_be_bytes());
        req.extend_from_slice(data);
        self.stream.write_all(&req).map_err(conn)?;
        let mut head = [0u8; 16];
        self.stream.read_exact(&mut head).map_err(conn)?;
        if u32::from_be_bytes(head[..4].try_into().expect("4 bytes")) != SIMPLE_REPLY_MAGIC {
            return Err(conn("bad reply magic"));
        }
        if u64::from_be_bytes(head[8..16].try_into().expect("8 bytes")) != self.handle {
            return Err(conn("reply to another request"));
        }
        let error = u32::from_be_bytes(head[4..8].try_into().expect("4 bytes"));
        if error != 0 {
            return Err(NbdError::Errno(error));
        }
        let mut out = Vec::new();
        if kind == CMD_READ {
            out = vec![0u8; length as usize];
            self.stream.read_exact(&mut out).map_err(conn)?;
        }
        Ok(out)
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), NbdError> {
        self.request(CMD_WRITE, offset, data.len() as u32, data).map(drop)
    }

    pub fn flush(&mut self) -> Result<(), NbdError> {
        self.request(CMD_FLUSH, 0, 0, &[]).map(drop)
    }

    pub fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, NbdError> {
        self.request(CMD_READ, offset, length, &[])
    }
}
