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

pub mod units {
    //! Sizes as people write them: `1GiB`, `512MiB`, `4096`, `10G` (binary).

    pub fn parse_size(text: &str) -> Result<u64, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let value: u64 =
            digits.parse().map_err(|_| format!("size {text:?}: expected a number with an optional unit"))?;
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            other => return Err(format!("size {text:?}: unknown unit {other:?}")),
        };
        value.checked_mul(1u64 << shift).ok_or_else(|| format!("size {text:?} is too large"))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_sizes() {
            assert_eq!(parse_size("1GiB"), Ok(1 << 30));
            assert_eq!(parse_size("512MiB"), Ok(512 << 20));
            assert_eq!(parse_size("4096"), Ok(4096));
            assert_eq!(parse_size("10G"), Ok(10 << 30));
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
