//! Firefox driven over WebDriver BiDi, the protocol Firefox speaks itself
//! on `--remote-debugging-port` (Debian packages no geckodriver). One
//! WebSocket (RFC 6455, written here: a handshake, masked text frames out,
//! plain frames in) carries JSON commands; each answer is matched by its id
//! and events in between are skipped.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{TempDir, require_tool};

/// A headless Firefox with a fresh profile, killed by its pid when dropped.
pub struct Firefox {
    child: Child,
    pub port: u16,
    _profile: TempDir,
}

impl Firefox {
    pub fn start(log_dir: &Path) -> Firefox {
        require_tool("firefox-esr", "firefox-esr");
        let profile = TempDir::new("firefox-profile");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(log_dir.join("firefox.log")).unwrap();
        let child = Command::new("firefox-esr")
            .args(["--headless", "--no-remote", "--remote-debugging-port", &port.to_string(), "--profile"])
            .arg(profile.path())
            .arg("about:blank")
            .env("MOZ_HEADLESS_WIDTH", "1280")
            .env("MOZ_HEADLESS_HEIGHT", "900")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("firefox-esr");
        Firefox { child, port, _profile: profile }
    }
}

impl Drop for Firefox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Bidi {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    next_id: u64,
}

impl Bidi {
    /// Connects to Firefox's BiDi endpoint (retrying while it starts) and
    /// opens a session.
    pub fn connect(port: u16, within: Duration) -> Result<Bidi, String> {
        let deadline = Instant::now() + within;
        let stream = loop {
            match TcpStream::connect(("127.0.0.1", port)).and_then(|s| Self::handshake(s, port)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(format!("Firefox's BiDi port {port}: {e}")),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        let mut bidi = Bidi { reader: BufReader::new(stream), writer, next_id: 0 };
        bidi.command("session.new", json!({ "capabilities": {} }))?;
        Ok(bidi)
    }

    fn handshake(mut stream: TcpStream, port: u16) -> io::Result<TcpStream> {
        // The key is any 16 bytes in base64; this one is RFC 6455's example.
        write!(
            stream,
            "GET /session HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut status = String::new();
        reader.read_line(&mut status)?;
        if !status.starts_with("HTTP/1.1 101") {
            return Err(io::Error::other(format!("no WebSocket upgrade: {}", status.trim())));
        }
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        // Nothing was sent before our first command, so the reader holds
        // nothing past the header.
        Ok(stream)
    }

    /// Sends a command and waits for its answer: the `result`, or the
    /// error Firefox gave.
    pub fn command(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let text = json!({ "id": id, "method": method, "params": params }).to_string();
        self.send(&text).map_err(|e| format!("{method}: {e}"))?;
        loop {
            let message = self.receive().map_err(|e| format!("{method}: {e}"))?;
            let v: Value = serde_json::from_str(&message).map_err(|e| format!("{method}: {e}: {message}"))?;
            if v["id"] != id {
                continue; // an event
            }
            if v["type"] == "error" {
                return Err(format!("{method}: {} {}", v["error"], v["message"]));
            }
            return Ok(v["result"].clone());
        }
    }

    fn send(&mut self, text: &str) -> io::Result<()> {
        let payload = text.as_bytes();
        let mut frame = vec![0x81]; // FIN, text
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= u16::MAX as usize => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [0x5a, 0x17, 0xc3, 0x2e];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.writer.write_all(&frame)
    }

    fn frame(&mut self, opcode: u8, payload: &[u8]) -> io::Result<()> {
        let mask = [1, 2, 3, 4];
        let mut frame = vec![0x80 | opcode, 0x80 | payload.len() as u8];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.writer.write_all(&frame)
    }

    /// The next whole text message (fragments joined; pings answered).
    fn receive(&mut self) -> io::Result<String> {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            self.reader.read_exact(&mut head)?;
            let (fin, opcode, masked) = (head[0] & 0x80 != 0, head[0] & 0x0f, head[1] & 0x80 != 0);
            let len = match head[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    self.reader.read_exact(&mut b)?;
                    u16::from_be_bytes(b) as usize
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.reader.read_exact(&mut b)?;
                    u64::from_be_bytes(b) as usize
                }
                n => n as usize,
            };
            let mut mask = [0u8; 4];
            if masked {
                self.reader.read_exact(&mut mask)?;
            }
            let mut payload = vec![0u8; len];
            self.reader.read_exact(&mut payload)?;
            if masked {
                payload.iter_mut().enumerate().for_each(|(i, b)| *b ^= mask[i % 4]);
            }
            match opcode {
                0x8 => return Err(io::Error::other("Firefox closed the WebSocket")),
                0x9 => self.frame(0xA, &payload[..payload.len().min(125)])?,
                0xA => {}
                _ => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return String::from_utf8(message).map_err(io::Error::other);
                    }
                }
            }
        }
    }

    /// The first browsing context (the window's tab).
    pub fn context(&mut self) -> Result<String, String> {
        let tree = self.command("browsingContext.getTree", json!({}))?;
        tree["contexts"][0]["context"].as_str().map(str::to_string).ok_or_else(|| format!("no context: {tree}"))
    }

    /// Evaluates `expression` (awaiting a promise) in `context`: the value
    /// it gave, or the exception it threw.
    pub fn evaluate(&mut self, context: &str, expression: &str) -> Result<Value, String> {
        let r = self.command(
            "script.evaluate",
            json!({ "expression": expression, "target": { "context": context }, "awaitPromise": true }),
        )?;
        if r["type"] == "exception" {
            return Err(format!("{}", r["exceptionDetails"]["text"]));
        }
        Ok(r["result"]["value"].clone())
    }
}
