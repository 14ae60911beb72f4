//! The workload's NBD connection over TCP, on the tests' shared wire
//! (`nbd_wire`), one request at a time. It tells a server's error reply
//! (the connection is still good) from a broken connection (reconnect).

use std::net::TcpStream;
use std::time::Duration;

use crate::nbd_wire::{self, CMD_FLUSH, CMD_READ, CMD_WRITE};

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
        nbd_wire::handshake(&mut s, &export).map_err(conn)?;
        Ok(Conn { stream: s, handle: 0 })
    }

    fn request(&mut self, kind: u16, offset: u64, length: u32, data: &[u8]) -> Result<Vec<u8>, NbdError> {
        self.handle += 1;
        match nbd_wire::request(&mut self.stream, self.handle, kind, offset, length, data).map_err(conn)? {
            (0, out) => Ok(out),
            (error, _) => Err(NbdError::Errno(error)),
        }
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
