//! The replica's side of its port: every accepted connection (TCP, or this
//! node's unix socket) is routed by its first eight bytes, either to the
//! data stream ([`super::MAGIC`]) or, those bytes replayed, to the gRPC
//! server.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, oneshot};

use super::MAGIC;
use super::wire::{Reader, Writer};

/// How long a new connection has to send its first eight bytes.
const FIRST_BYTES_WITHIN: Duration = Duration::from_secs(10);

/// A connection of either kind.
pub enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    /// Its read and write halves, each usable from its own task.
    pub fn into_halves(self) -> (Reader, Writer) {
        match self {
            Conn::Tcp(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Conn::Unix(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
        }
    }
}

/// A connection whose first bytes were read to route it, handed to the
/// gRPC server with those bytes put back in front.
pub struct Rewound {
    conn: Conn,
    prefix: [u8; 8],
    replayed: usize,
}

/// Where a connection goes.
pub enum Routed {
    Data(Reader, Writer),
    Grpc(Rewound),
}

/// Reads a connection's first bytes and routes it; a data-stream client
/// is answered with [`MAGIC`] here.
pub async fn route(mut conn: Conn) -> io::Result<Routed> {
    let mut first = [0u8; 8];
    tokio::time::timeout(FIRST_BYTES_WITHIN, conn.read_exact(&mut first))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request within 10 s of connecting"))??;
    if first != MAGIC {
        return Ok(Routed::Grpc(Rewound { conn, prefix: first, replayed: 0 }));
    }
    conn.write_all(&MAGIC).await?;
    let (r, w) = conn.into_halves();
    Ok(Routed::Data(r, w))
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut *self {
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut *self {
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut *self {
            Conn::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self {
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self {
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for Rewound {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.replayed < this.prefix.len() {
            let n = (this.prefix.len() - this.replayed).min(buf.remaining());
            buf.put_slice(&this.prefix[this.replayed..this.replayed + n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.conn).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewound {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.conn).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.conn).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Rewound {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

/// A listener of either kind.
pub enum Listening {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl Listening {
    async fn accept(&self) -> io::Result<Conn> {
        match self {
            Listening::Tcp(l) => {
                let (s, _) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok(Conn::Tcp(s))
            }
            Listening::Unix(l) => Ok(Conn::Unix(l.accept().await?.0)),
        }
    }
}

type Grpc = mpsc::UnboundedSender<io::Result<Rewound>>;

async fn accept_loop(listening: Listening, grpc: Grpc, data: Arc<dyn Fn(Reader, Writer) + Send + Sync>) {
    loop {
        let conn = match listening.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                // Out of descriptors, or a connection reset before accept:
                // keep serving the connections already open.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (grpc, data) = (grpc.clone(), data.clone());
        tokio::spawn(async move {
            match route(conn).await {
                Ok(Routed::Data(r, w)) => data(r, w),
                Ok(Routed::Grpc(conn)) => {
                    let _ = grpc.send(Ok(conn));
                }
                Err(e) => tracing::debug!(error = %e, "connection closed before it was routed"),
            }
        });
    }
}

/// Serves `router` and data streams (each handed to `data`) on `tcp` and,
/// when given, on the local socket, until `stop` fires. Then the listeners
/// close, and the local socket's file is removed once nothing serves on it.
pub async fn serve(
    router: tonic::transport::server::Router,
    tcp: tokio::net::TcpListener,
    local: Option<crate::local::Listener>,
    data: impl Fn(Reader, Writer) + Send + Sync + 'static,
    stop: oneshot::Receiver<()>,
) -> Result<(), tonic::transport::Error> {
    let data: Arc<dyn Fn(Reader, Writer) + Send + Sync> = Arc::new(data);
    let (grpc, incoming) = mpsc::unbounded_channel();
    let mut acceptors = tokio::task::JoinSet::new();
    acceptors.spawn(accept_loop(Listening::Tcp(tcp), grpc.clone(), data.clone()));
    let file = local.map(|crate::local::Listener { listener, file }| {
        acceptors.spawn(accept_loop(Listening::Unix(listener), grpc.clone(), data.clone()));
        file
    });
    drop(grpc);
    let served = router
        .serve_with_incoming_shutdown(tokio_stream::wrappers::UnboundedReceiverStream::new(incoming), async {
            let _ = stop.await;
        })
        .await;
    acceptors.shutdown().await;
    drop(file);
    served
}
