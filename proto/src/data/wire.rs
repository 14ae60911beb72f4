//! Frames on a socket: the handshake, a batching frame writer and a frame
//! reader, over either transport (TCP or this node's unix socket).

use std::collections::VecDeque;
use std::io::IoSlice;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedReceiver;

use super::frame::{self, FrameError};
use crate::replica::{IoRequest, IoResponse};

/// What a data-stream client sends first, and the replica answers with:
/// distinct from HTTP/2's preface (`PRI * HTTP/2.0…`), so the replica tells
/// the two apart on one port. The last two bytes are the version.
pub const MAGIC: [u8; 8] = *b"IHDATA01";

pub type Reader = Box<dyn AsyncRead + Unpin + Send>;
pub type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// Why a data stream ended or could not start.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("malformed frame: {0}")]
    Frame(#[from] FrameError),
    #[error("nothing heard for {0:?}")]
    Silent(Duration),
    #[error("peer does not speak the data stream (it answered {0:02x?})")]
    Handshake([u8; 8]),
}

/// A payload at most this long is copied beside its header; a longer one
/// goes as its own segment of the vectored write, uncopied (the kernel
/// copies it once into the socket either way). An engine writes each
/// payload to every replica, so a copy here is one per replica.
const COPY_LIMIT: usize = 512;
/// A batch stops taking frames at this many, or at [`MAX_BATCH_BYTES`] of
/// payload: one write, and the reader takes it in few reads.
const MAX_BATCH_FRAMES: usize = 256;
const MAX_BATCH_BYTES: usize = 2 << 20;
/// Slices handed to one `writev` at most (the kernel's limit is 1024).
const MAX_SLICES: usize = 512;

/// A frame the writer can send: a header it encodes, a payload after it.
pub trait Frame {
    fn put_header(&self, out: &mut BytesMut);
    fn payload(&self) -> &Bytes;
}

impl Frame for IoRequest {
    fn put_header(&self, out: &mut BytesMut) {
        frame::put_request_header(self, out)
    }
    fn payload(&self) -> &Bytes {
        &self.data
    }
}

impl Frame for IoResponse {
    fn put_header(&self, out: &mut BytesMut) {
        frame::put_response_header(self, out)
    }
    fn payload(&self) -> &Bytes {
        &self.data
    }
}

/// Frames gathered for one vectored write.
#[derive(Default)]
struct Batch {
    /// Headers and small payloads not yet cut into a segment.
    open: BytesMut,
    segments: VecDeque<Bytes>,
}

impl Batch {
    fn push(&mut self, f: &impl Frame) {
        f.put_header(&mut self.open);
        let payload = f.payload();
        if payload.len() <= COPY_LIMIT {
            self.open.extend_from_slice(payload);
        } else {
            self.segments.push_back(self.open.split().freeze());
            self.segments.push_back(payload.clone());
        }
    }

    async fn write_to(&mut self, w: &mut Writer) -> std::io::Result<()> {
        if !self.open.is_empty() {
            self.segments.push_back(self.open.split().freeze());
        }
        while !self.segments.is_empty() {
            let slices: Vec<IoSlice<'_>> = self.segments.iter().take(MAX_SLICES).map(|s| IoSlice::new(s)).collect();
            let mut n = w.write_vectored(&slices).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            while n > 0 {
                let first = self.segments.front_mut().expect("written bytes belong to a segment");
                if n >= first.len() {
                    n -= first.len();
                    self.segments.pop_front();
                } else {
                    let _ = first.split_to(n);
                    n = 0;
                }
            }
        }
        w.flush().await
    }
}

/// Sends every frame queued on `rx`, each write taking all that is queued
/// when the last one ended (a lone frame leaves at once). With `keepalive`,
/// a socket idle for its period gets the frame it makes. Returns when `rx`
/// closes, or with the first write error.
pub async fn send_frames<T: Frame>(
    mut rx: UnboundedReceiver<T>,
    mut w: Writer,
    keepalive: Option<(Duration, fn() -> T)>,
) -> Result<(), StreamError> {
    let mut batch = Batch::default();
    let period = keepalive.map_or(Duration::from_secs(3600), |(p, _)| p);
    let mut last_sent = Instant::now();
    let timer = tokio::time::sleep(period);
    tokio::pin!(timer);
    loop {
        let first = tokio::select! {
            biased;
            item = rx.recv() => match item {
                Some(item) => item,
                None => return Ok(()),
            },
            () = &mut timer, if keepalive.is_some() => {
                // One timer per period, not per write: it fires, and sends
                // only if nothing went out meanwhile.
                let due = last_sent + period;
                if Instant::now() < due {
                    timer.as_mut().reset(due.into());
                    continue;
                }
                timer.as_mut().reset((Instant::now() + period).into());
                (keepalive.expect("guarded").1)()
            }
        };
        let mut bytes = first.payload().len();
        batch.push(&first);
        drop(first);
        let mut frames = 1;
        while frames < MAX_BATCH_FRAMES && bytes < MAX_BATCH_BYTES {
            let Ok(item) = rx.try_recv() else { break };
            bytes += item.payload().len();
            batch.push(&item);
            frames += 1;
        }
        batch.write_to(&mut w).await?;
        last_sent = Instant::now();
    }
}

/// Reads frames off a socket, one at a time.
pub struct FrameReader<T> {
    r: Reader,
    buf: BytesMut,
    take: fn(&mut BytesMut) -> Result<Option<T>, FrameError>,
    /// Give up on a peer heard nothing from for this long.
    silence: Option<Duration>,
    last_heard: Instant,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<T> FrameReader<T> {
    /// Frames decoded by `take` (`frame::take_request` or
    /// `frame::take_response`).
    pub fn new(r: Reader, take: fn(&mut BytesMut) -> Result<Option<T>, FrameError>, silence: Option<Duration>) -> Self {
        let limit = silence.unwrap_or(Duration::from_secs(3600));
        Self {
            r,
            buf: BytesMut::with_capacity(64 << 10),
            take,
            silence,
            last_heard: Instant::now(),
            timer: Box::pin(tokio::time::sleep(limit)),
        }
    }

    /// The next frame; None when the peer closed the stream between frames.
    pub async fn next(&mut self) -> Result<Option<T>, StreamError> {
        loop {
            if let Some(item) = (self.take)(&mut self.buf)? {
                return Ok(Some(item));
            }
            if self.buf.capacity() - self.buf.len() < 16 << 10 {
                self.buf.reserve(64 << 10);
            }
            tokio::select! {
                biased;
                read = self.r.read_buf(&mut self.buf) => {
                    if read? == 0 {
                        return if self.buf.is_empty() {
                            Ok(None)
                        } else {
                            Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "stream ended inside a frame").into())
                        };
                    }
                    self.last_heard = Instant::now();
                }
                // One timer per silence period, not per read: it fires, and
                // ends the stream only if nothing came meanwhile.
                () = self.timer.as_mut(), if self.silence.is_some() => {
                    let limit = self.silence.expect("guarded");
                    let due = self.last_heard + limit;
                    if Instant::now() >= due {
                        return Err(StreamError::Silent(limit));
                    }
                    self.timer.as_mut().reset(due.into());
                }
            }
        }
    }
}

/// The client's half of the handshake: send [`MAGIC`], expect it back.
pub async fn hello(r: &mut Reader, w: &mut Writer) -> Result<(), StreamError> {
    w.write_all(&MAGIC).await?;
    w.flush().await?;
    let mut answer = [0u8; 8];
    r.read_exact(&mut answer).await?;
    if answer != MAGIC {
        return Err(StreamError::Handshake(answer));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::IoOp;

    fn write(id: u64, len: usize) -> IoRequest {
        IoRequest {
            id,
            op: IoOp::Write as i32,
            offset: id * 4096,
            length: len as u64,
            data: Bytes::from(vec![id as u8; len]),
            ..Default::default()
        }
    }

    /// Small and large payloads, queued before the writer runs, arrive
    /// in order and whole; a closed queue ends both sides cleanly.
    #[tokio::test(flavor = "current_thread")]
    async fn queued_frames_arrive_in_order_whole_and_the_stream_ends_cleanly() {
        let (a, b) = tokio::io::duplex(8 << 10);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let sent: Vec<IoRequest> =
            (1..=300).map(|i| write(i, if i % 7 == 0 { 1 << 20 } else { 4096 * (i as usize % 3) })).collect();
        for r in &sent {
            tx.send(r.clone()).unwrap();
        }
        drop(tx);
        let writer = tokio::spawn(send_frames(rx, Box::new(a) as Writer, None));
        let mut got = Vec::new();
        let mut reader = FrameReader::new(Box::new(b) as Reader, frame::take_request, None);
        while let Some(r) = reader.next().await.unwrap() {
            got.push(r);
        }
        writer.await.unwrap().unwrap();
        assert_eq!(got, sent);
    }

    /// An idle writer sends keep-alives; a reader hearing nothing gives up.
    #[tokio::test(flavor = "current_thread")]
    async fn idle_writer_keeps_alive_and_silent_reader_gives_up() {
        let ms = Duration::from_millis;
        let (a, b) = tokio::io::duplex(1 << 16);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<IoRequest>();
        let keepalive = || IoRequest { id: frame::KEEPALIVE_ID, ..Default::default() };
        tokio::spawn(send_frames(rx, Box::new(a) as Writer, Some((ms(50), keepalive))));
        let mut heard = 0;
        let mut reader = FrameReader::new(Box::new(b) as Reader, frame::take_request, Some(ms(200)));
        let ended = tokio::time::timeout(ms(500), async {
            while let Some(r) = reader.next().await? {
                assert_eq!(r.id, frame::KEEPALIVE_ID);
                heard += 1;
            }
            Ok::<_, StreamError>(())
        })
        .await;
        assert!(ended.is_err(), "a kept-alive stream must not be given up on");
        assert!((5..=10).contains(&heard), "{heard} keep-alives in 500 ms at one per 50 ms");
        drop(tx);

        let (_quiet, b) = tokio::io::duplex(1 << 16);
        let mut silent = FrameReader::new(Box::new(b) as Reader, frame::take_request, Some(ms(100)));
        assert!(matches!(silent.next().await, Err(StreamError::Silent(_))));
    }
}
