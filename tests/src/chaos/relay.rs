//! Latency with jitter on a link, made in user space. This kernel has no
//! `netem` qdisc and no NFQUEUE, so a delay cannot be put on a packet; a
//! relay inside the replica node's namespace takes the engine's TCP
//! connections to that node instead (an iptables `REDIRECT` in the nat
//! table, by the engine node's source address and the node's port range),
//! connects on to the address each was meant for (`SO_ORIGINAL_DST`), and
//! holds everything the node sends back for a jittered delay before passing
//! it on, in order: what `netem delay` on the node's egress would do, at the
//! granularity of the relay's reads instead of packets.
//!
//! The relay is in place before the volume attaches (a rule only catches new
//! connections) and passes bytes straight through until `set_delay`.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::rng::Rng;
use super::workload::enter_netns;

/// Delay of the node's answers, drawn per read from `lo..=hi` ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delay {
    pub lo_ms: u64,
    pub hi_ms: u64,
}

#[derive(Default)]
pub struct RelayCounters {
    /// Connections taken over from the engine's node.
    pub connections: AtomicU64,
    /// Reads passed back to the engine after a delay.
    pub delayed: AtomicU64,
    /// Sum of the delays given, in ms.
    pub delay_ms: AtomicU64,
}

struct Shared {
    delay: Mutex<(Option<Delay>, Rng)>,
    counters: RelayCounters,
    stop: AtomicBool,
}

pub struct Relay {
    shared: Arc<Shared>,
    port: u16,
}

impl Relay {
    /// Starts the relay in `netns` and sends it every TCP connection from
    /// `from` to `ports` (`"first:last"`) of that node.
    pub fn start(netns: &str, from: &str, ports: &str, rng: Rng) -> Result<Relay, String> {
        let shared = Arc::new(Shared {
            delay: Mutex::new((None, rng)),
            counters: RelayCounters::default(),
            stop: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel();
        let ns = netns.to_string();
        let s = shared.clone();
        std::thread::spawn(move || {
            // Sockets stay in the namespace they were made in: this thread
            // makes the listener and every outgoing connection.
            let listener = enter_netns(&ns).and_then(|()| TcpListener::bind("0.0.0.0:0"));
            let listener = match listener {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(format!("relay in {ns}: {e}")));
                    return;
                }
            };
            let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
            let _ = listener.set_nonblocking(true);
            let _ = tx.send(Ok(port));
            accept_loop(listener, s);
        });
        let port = rx.recv().map_err(|_| "the relay thread died".to_string())??;
        let rule = redirect_rule(from, ports, port);
        let mut args = vec!["netns", "exec", netns, "iptables", "-w", "-t", "nat", "-A", "PREROUTING"];
        args.extend(rule.iter().map(String::as_str));
        let out = std::process::Command::new("ip").args(&args).output().map_err(|e| format!("ip: {e}"))?;
        if !out.status.success() {
            shared.stop.store(true, Ordering::Relaxed);
            return Err(format!("iptables REDIRECT in {netns}: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Relay { shared, port })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn counters(&self) -> &RelayCounters {
        &self.shared.counters
    }

    /// Delays the node's answers from now on (None: straight through).
    pub fn set_delay(&self, delay: Option<Delay>) {
        self.shared.delay.lock().unwrap().0 = delay;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The rule goes with the namespace (`up` removes it); the threads
        // see `stop` within their poll interval and close their sockets.
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

/// The nat rule's match and target (after `-A PREROUTING`).
fn redirect_rule(from: &str, ports: &str, to: u16) -> Vec<String> {
    ["-p", "tcp", "-s", from, "--dport", ports, "-j", "REDIRECT", "--to-ports", &to.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((client, _)) => {
                let Ok(target) = original_destination(&client) else { continue };
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect_timeout(&SocketAddr::V4(target), Duration::from_secs(5)) else {
                    continue;
                };
                shared.counters.connections.fetch_add(1, Ordering::Relaxed);
                for s in [&client, &server] {
                    let _ = s.set_nodelay(true);
                    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                }
                let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => (c, s),
                    _ => continue,
                };
                // Engine to node: straight through. Node to engine: delayed.
                pump(client, server, shared.clone(), false);
                pump(s2, c2, shared.clone(), true);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Where a redirected connection was going (`SO_ORIGINAL_DST`).
fn original_destination(stream: &TcpStream) -> std::io::Result<SocketAddrV4> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed sockaddr_in is valid; getsockopt writes at most `len` bytes.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let ip = std::net::Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    Ok(SocketAddrV4::new(ip, u16::from_be(addr.sin_port)))
}

/// Copies `from` to `to` on two threads: a reader that stamps each read
/// with when it may go out, and a writer that waits for that moment. Due
/// times never go backwards, so bytes keep their order.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>, delayed: bool) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader_shared = shared.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut last_due = Instant::now();
        while !reader_shared.stop.load(Ordering::Relaxed) {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let now = Instant::now();
                    let wait = if delayed { draw(&reader_shared) } else { None };
                    let due = match wait {
                        Some(d) => {
                            reader_shared.counters.delayed.fetch_add(1, Ordering::Relaxed);
                            reader_shared.counters.delay_ms.fetch_add(d.as_millis() as u64, Ordering::Relaxed);
                            (now + d).max(last_due)
                        }
                        None => now.max(last_due),
                    };
                    last_due = due;
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        // Dropping `tx` tells the writer to finish what it holds and close.
    });
    std::thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if shared.stop.load(Ordering::Relaxed) || to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

fn draw(shared: &Shared) -> Option<Duration> {
    let mut guard = shared.delay.lock().unwrap();
    let (delay, rng) = &mut *guard;
    delay.map(|d| Duration::from_millis(rng.between(d.lo_ms, d.hi_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_redirects_one_source_and_port_range_to_the_relay() {
        assert_eq!(
            redirect_rule("10.100.200.11", "20200:20299", 41000).join(" "),
            "-p tcp -s 10.100.200.11 --dport 20200:20299 -j REDIRECT --to-ports 41000"
        );
    }
}
