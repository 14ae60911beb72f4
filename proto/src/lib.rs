//! Wire types for ironhorn's gRPC services, generated from `proto/*.proto`,
//! and the text forms every process's flags and APIs share (`units`).

pub mod replica {
    tonic::include_proto!("ironhorn.replica.v1");
}

pub mod engine {
    tonic::include_proto!("ironhorn.engine.v1");
}

pub mod instance {
    tonic::include_proto!("ironhorn.instance.v1");
}

/// The Container Storage Interface (package `csi.v1`).
pub mod csi {
    tonic::include_proto!("csi.v1");
}

pub mod data;
pub mod local;

pub mod say {
    //! Lines for the operator on stdout or stderr that never stop a process:
    //! `println!` panics when the write fails (a full disk under the log
    //! file, a closed pipe), and a storage process must not die because a
    //! log line was lost. The line is dropped instead.

    use std::io::Write;

    pub fn out(args: std::fmt::Arguments) {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_fmt(args).and_then(|()| stdout.write_all(b"\n")).and_then(|()| stdout.flush());
    }

    pub fn err(args: std::fmt::Arguments) {
        let _ = writeln!(std::io::stderr().lock(), "{args}");
    }

    /// The processes' log: `RUST_LOG` (default info) to stderr. A line
    /// stderr cannot take is dropped silently: the subscriber's own report
    /// of such a failure goes to stderr with `eprintln!`, which panics, and
    /// a panic while reporting a panic aborts the process.
    pub fn init_logging() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
            .with_writer(std::io::stderr)
            .log_internal_errors(false)
            .init();
    }

    /// `line` without terminal escape sequences (a log line's colours) and
    /// other control characters: fit for an event or a status message.
    pub fn plain(line: &str) -> String {
        let mut out = String::with_capacity(line.len());
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // CSI: ESC [ parameters… final byte in @..~; else ESC + one.
                if chars.next_if_eq(&'[').is_some() {
                    while let Some(p) = chars.next() {
                        if ('@'..='~').contains(&p) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            } else if !c.is_control() || c == '\t' {
                out.push(c);
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn colours_and_controls_are_dropped_and_text_kept() {
            let line = "\u{1b}[2m2026-12-04T14:39Z\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m store: disk \u{7}gone\r";
            assert_eq!(super::plain(line), "2026-12-04T14:39Z ERROR store: disk gone");
            assert_eq!(super::plain("plain text"), "plain text");
        }
    }

    /// `println!` that drops the line when stdout cannot take it.
    #[macro_export]
    macro_rules! say {
        ($($arg:tt)*) => { $crate::say::out(format_args!($($arg)*)) };
    }

    /// `eprintln!` that drops the line when stderr cannot take it.
    #[macro_export]
    macro_rules! say_err {
        ($($arg:tt)*) => { $crate::say::err(format_args!($($arg)*)) };
    }
}

pub mod allocator;
pub mod busy_poll;

pub mod channel {
    //! gRPC connections to a replica (from the engine, from another
    //! replica): the frame size and flow-control windows both ends use for
    //! the unary calls that carry bulk data (rebuild's 1 MiB reads and
    //! writes). Block I/O travels on the data stream instead ([`crate::data`]).

    /// HTTP/2 frame size both ends advertise (the protocol's largest): a
    /// 1 MiB message leaves as one frame, one socket write.
    pub const H2_MAX_FRAME: u32 = (1 << 24) - 1;

    /// HTTP/2 flow-control windows both ends of a replica connection
    /// advertise, per stream and per connection. hyper's server default is
    /// 1 MiB for both, so a rebuild's 1 MiB chunks in flight waited a round
    /// trip per MiB for window updates. A window bounds nothing else: the
    /// in-flight limits are the engine's.
    pub const H2_STREAM_WINDOW: u32 = 16 << 20;
    pub const H2_CONNECTION_WINDOW: u32 = 32 << 20;

    /// The endpoint for a gRPC connection to a replica, with the frame size
    /// and windows above. Connecting is bounded by `timeout`; keep-alives
    /// find a dead peer.
    pub fn replica_endpoint(
        address: &str,
        timeout: std::time::Duration,
    ) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
        Ok(tonic::transport::Endpoint::from_shared(format!("http://{address}"))?
            .tcp_nodelay(true)
            .max_frame_size(H2_MAX_FRAME)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .connect_timeout(timeout)
            .http2_keep_alive_interval(std::time::Duration::from_secs(5))
            .keep_alive_timeout(timeout))
    }
}

pub mod blocks {
    //! Splitting a buffer into runs of zero and non-zero blocks: a rebuild
    //! sends a zero run as a mark instead of its bytes.

    /// A run of whole blocks, all zero or all holding data: bytes
    /// `start..start + len` of the buffer.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Run {
        pub start: usize,
        pub len: usize,
        pub zero: bool,
    }

    /// The runs of `data` in `block`-byte blocks, in order, covering it
    /// whole (a last partial block counts as a block).
    pub fn runs(data: &[u8], block: usize) -> Vec<Run> {
        let mut out: Vec<Run> = Vec::new();
        for (i, b) in data.chunks(block).enumerate() {
            // 64 bytes at a time: the inner fold vectorises, and a block of
            // data usually stops the scan in its first few bytes.
            let zero = b.chunks(64).all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0);
            match out.last_mut() {
                Some(last) if last.zero == zero => last.len += b.len(),
                _ => out.push(Run { start: i * block, len: b.len(), zero }),
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn runs_alternate_and_cover_the_buffer() {
            let mut data = vec![0u8; 6 * 4];
            data[4] = 1; // block 1
            data[9] = 1; // block 2
            data[23] = 1; // block 5
            assert_eq!(
                runs(&data, 4),
                vec![
                    Run { start: 0, len: 4, zero: true },
                    Run { start: 4, len: 8, zero: false },
                    Run { start: 12, len: 8, zero: true },
                    Run { start: 20, len: 4, zero: false },
                ]
            );
            assert_eq!(runs(&[0; 8], 4), vec![Run { start: 0, len: 8, zero: true }]);
            assert_eq!(runs(&[], 4), vec![]);
        }
    }
}

pub mod units {
    //! Sizes as people write them: `1GiB`, `512MiB`, `4096`, `10G` (binary),
    //! and Kubernetes' binary quantities (`10Gi`).

    pub fn parse_size(text: &str) -> Result<u64, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let value: u64 =
            digits.parse().map_err(|_| format!("size {text:?}: expected a number with an optional unit"))?;
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "ki" | "kib" => 10,
            "m" | "mb" | "mi" | "mib" => 20,
            "g" | "gb" | "gi" | "gib" => 30,
            "t" | "tb" | "ti" | "tib" => 40,
            other => return Err(format!("size {text:?}: unknown unit {other:?}")),
        };
        value.checked_mul(1u64 << shift).ok_or_else(|| format!("size {text:?} is too large"))
    }

    /// `n` bytes in the largest binary unit it reaches: `1GiB`, `1.5MiB`, `512B`.
    pub fn format_size(n: u64) -> String {
        const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
        for (unit, size) in UNITS {
            if n >= size {
                return if n % size == 0 {
                    format!("{}{unit}", n / size)
                } else {
                    format!("{:.1}{unit}", n as f64 / size as f64)
                };
            }
        }
        format!("{n}B")
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn formats_sizes() {
            assert_eq!(format_size(1 << 30), "1GiB");
            assert_eq!(format_size(3 << 19), "1.5MiB");
            assert_eq!(format_size(512), "512B");
            assert_eq!(format_size(0), "0B");
        }

        #[test]
        fn parses_sizes() {
            assert_eq!(parse_size("1GiB"), Ok(1 << 30));
            assert_eq!(parse_size("512MiB"), Ok(512 << 20));
            assert_eq!(parse_size("4096"), Ok(4096));
            assert_eq!(parse_size("10G"), Ok(10 << 30));
            assert_eq!(parse_size("10Gi"), Ok(10 << 30));
            for bad in ["", "1XB", "-1", "99999999999TiB", "GiB"] {
                assert!(parse_size(bad).is_err(), "{bad:?}");
            }
        }
    }
}

pub mod runtime {
    //! The tokio runtime every ironhorn process runs on. The data path is
    //! hand-off heavy (socket → task → stream), so the default is one worker
    //! thread: wake-ups stay on one core instead of bouncing between cores.
    //! `IRONHORN_WORKER_THREADS=N` picks N worker threads instead.

    pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
        let threads = std::env::var("IRONHORN_WORKER_THREADS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(1);
        let mut builder = if threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(threads);
            b
        };
        builder.enable_all().build()
    }
}

pub mod shutdown {
    //! Graceful stop for a gRPC server whose clients keep long-lived streams
    //! open (engines keep their replica streams open for ever): on SIGTERM or
    //! SIGINT stop accepting, give open connections `grace` to finish, then
    //! stop serving regardless so the caller can close its state cleanly.

    use std::time::Duration;

    pub async fn signal() {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }

    /// Serves `router` on `incoming` until a signal, then at most `grace`.
    /// (A replica serves its port and its local socket through
    /// `crate::data::accept` instead: it routes data streams too.)
    pub async fn serve_router(
        router: tonic::transport::server::Router,
        incoming: tonic::transport::server::TcpIncoming,
        grace: Duration,
        what: &'static str,
    ) -> Result<(), String> {
        let serve = move |stopped: tokio::sync::oneshot::Receiver<()>| async move {
            router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await
                .map_err(|e| format!("{what}: {e}"))
        };
        serve_until_signal(serve, grace).await
    }

    /// Runs `serve(stop)` until a signal, then at most `grace` longer.
    pub async fn serve_until_signal<F, Fut>(serve: F, grace: Duration) -> Result<(), String>
    where
        F: FnOnce(tokio::sync::oneshot::Receiver<()>) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let mut server = tokio::spawn(serve(stopped));
        tokio::select! {
            result = &mut server => return result.map_err(|e| format!("server task: {e}"))?,
            _ = signal() => {}
        }
        let _ = stop.send(());
        match tokio::time::timeout(grace, &mut server).await {
            Ok(result) => result.map_err(|e| format!("server task: {e}"))?,
            Err(_) => {
                server.abort();
                Ok(())
            }
        }
    }
}
