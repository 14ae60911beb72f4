//! Block I/O backends for the store.
//!
//! Contract: every buffer handed to a backend is an [`AlignedBuf`] (4 KiB
//! aligned, length a multiple of 4 KiB) so files and devices can be opened with
//! `O_DIRECT`. A read or write either transfers the whole buffer or fails;
//! a short transfer is reported as an error, never as success.
//!
//! Two backends sit behind one enum, as firecracker does with its `FileEngine`:
//! - [`Backend::Uring`]: one io_uring per store, driven by a dedicated thread
//!   that sleeps in `io_uring_enter` when idle (no polling, ≈0 % CPU);
//! - [`Backend::Pread`]: plain `pread`/`pwrite` on tokio's blocking pool, for
//!   tests and as a fallback where io_uring is unavailable.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

/// Alignment of every I/O buffer, enough for `O_DIRECT` on any device here.
pub const IO_ALIGN: usize = 4096;

/// A heap buffer aligned to [`IO_ALIGN`], zero-initialised.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only permit reads of the owned bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes; `len` must be a multiple of [`IO_ALIGN`].
    pub fn zeroed(len: usize) -> Self {
        assert!(len > 0 && len % IO_ALIGN == 0, "aligned buffer length {len}");
        let layout = Layout::from_size_align(len, IO_ALIGN).expect("layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self { ptr, len }
    }

    pub fn from_slice(data: &[u8]) -> Self {
        let mut buf = Self::zeroed(data.len());
        buf.copy_from_slice(data);
        buf
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, IO_ALIGN).expect("layout");
        // SAFETY: allocated in `zeroed` with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for self's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// Which backend to run a store on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Uring,
    Pread,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uring" | "io_uring" => Ok(Self::Uring),
            "pread" => Ok(Self::Pread),
            other => Err(format!("unknown I/O backend {other:?} (expected uring or pread)")),
        }
    }
}

/// The I/O backend over a fixed set of open files (PVs or a store file).
pub enum Backend {
    Uring(UringIo),
    Pread(PreadIo),
}

impl Backend {
    pub fn new(kind: BackendKind, files: Vec<Arc<File>>) -> io::Result<Self> {
        Ok(match kind {
            BackendKind::Uring => Self::Uring(UringIo::new(files)?),
            BackendKind::Pread => Self::Pread(PreadIo { files }),
        })
    }

    /// Reads `buf.len()` bytes of file `file` at `offset` into `buf`.
    pub async fn read(&self, file: usize, offset: u64, buf: AlignedBuf) -> io::Result<AlignedBuf> {
        match self {
            Self::Uring(u) => u.submit(Op::Read, file, offset, Some(buf)).await.map(|b| b.expect("buffer")),
            Self::Pread(p) => p.read(file, offset, buf).await,
        }
    }

    /// Writes all of `buf` to file `file` at `offset`; returns the buffer.
    pub async fn write(&self, file: usize, offset: u64, buf: AlignedBuf) -> io::Result<AlignedBuf> {
        match self {
            Self::Uring(u) => u.submit(Op::Write, file, offset, Some(buf)).await.map(|b| b.expect("buffer")),
            Self::Pread(p) => p.write(file, offset, buf).await,
        }
    }

    /// Makes every completed write on every file durable.
    pub async fn sync(&self) -> io::Result<()> {
        match self {
            Self::Uring(u) => {
                for file in 0..u.file_count {
                    u.submit(Op::Sync, file, 0, None).await?;
                }
                Ok(())
            }
            Self::Pread(p) => p.sync().await,
        }
    }
}

/// `pread`/`pwrite` on tokio's blocking thread pool.
pub struct PreadIo {
    files: Vec<Arc<File>>,
}

impl PreadIo {
    async fn read(&self, file: usize, offset: u64, mut buf: AlignedBuf) -> io::Result<AlignedBuf> {
        let f = self.files[file].clone();
        blocking(move || f.read_exact_at(&mut buf, offset).map(|()| buf)).await
    }

    async fn write(&self, file: usize, offset: u64, buf: AlignedBuf) -> io::Result<AlignedBuf> {
        let f = self.files[file].clone();
        blocking(move || f.write_all_at(&buf, offset).map(|()| buf)).await
    }

    async fn sync(&self) -> io::Result<()> {
        for f in &self.files {
            let f = f.clone();
            blocking(move || f.sync_data()).await?;
        }
        Ok(())
    }
}

async fn blocking<T: Send + 'static>(job: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    tokio::task::spawn_blocking(job).await.map_err(|e| io::Error::other(format!("I/O task failed: {e}")))?
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Read,
    Write,
    Sync,
}

type Reply = oneshot::Sender<io::Result<Option<AlignedBuf>>>;

struct Request {
    op: Op,
    file: usize,
    offset: u64,
    buf: Option<AlignedBuf>,
    reply: Reply,
}

struct UringShared {
    queue: Mutex<VecDeque<Request>>,
    wake: OwnedFd,
    stop: AtomicBool,
    /// Set while the ring thread waits with nothing in flight: only then
    /// does a new request need the eventfd to wake it. With I/O in flight,
    /// the next completion wakes it and it drains the queue (batching).
    idle: AtomicBool,
}

impl UringShared {
    fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to an eventfd we own.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// io_uring backend: callers queue requests and kick an eventfd; the ring
/// thread keeps a read armed on that eventfd so it wakes for new work and for
/// completions alike, and sleeps in the kernel when there is neither.
pub struct UringIo {
    shared: Arc<UringShared>,
    thread: Option<JoinHandle<()>>,
    file_count: usize,
}

const RING_ENTRIES: u32 = 256;
const WAKE_TOKEN: u64 = u64::MAX;

impl UringIo {
    pub fn new(files: Vec<Arc<File>>) -> io::Result<Self> {
        let ring = io_uring::IoUring::new(RING_ENTRIES)?;
        // SAFETY: eventfd returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a freshly created descriptor we own.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let shared = Arc::new(UringShared {
            queue: Mutex::new(VecDeque::new()),
            wake,
            stop: AtomicBool::new(false),
            idle: AtomicBool::new(false),
        });
        let file_count = files.len();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ironhorn-uring".into())
            .spawn(move || ring_loop(ring, thread_shared, files))?;
        Ok(Self { shared, thread: Some(thread), file_count })
    }

    async fn submit(
        &self,
        op: Op,
        file: usize,
        offset: u64,
        buf: Option<AlignedBuf>,
    ) -> io::Result<Option<AlignedBuf>> {
        assert!(file < self.file_count, "file index {file} out of range");
        let (reply, done) = oneshot::channel();
        self.shared.queue.lock().expect("uring queue poisoned").push_back(Request { op, file, offset, buf, reply });
        self.shared.kick();
        done.await.map_err(|_| io::Error::other("io_uring thread stopped"))?
    }
}

impl Drop for UringIo {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.kick();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn ring_loop(mut ring: io_uring::IoUring, shared: Arc<UringShared>, files: Vec<Arc<File>>) {
    use io_uring::{opcode, types};
    let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
    // In-flight requests, indexed by user_data; free slots are reused.
    let mut slots: Vec<Option<Request>> = Vec::new();
    let mut free_slots: Vec<usize> = Vec::new();
    let mut backlog: VecDeque<Request> = VecDeque::new();
    let mut wake_buf = [0u8; 8];
    let mut wake_armed = false;
    let mut in_flight = 0usize;

    loop {
        if !wake_armed {
            let sqe = opcode::Read::new(types::Fd(shared.wake.as_raw_fd()), wake_buf.as_mut_ptr(), 8)
                .build()
                .user_data(WAKE_TOKEN);
            // SAFETY: wake_buf outlives the ring loop; the ring has room
            // because at most RING_ENTRIES - 1 requests are queued below.
            if unsafe { ring.submission().push(&sqe) }.is_ok() {
                wake_armed = true;
            }
        }
        backlog.extend(shared.queue.lock().expect("uring queue poisoned").drain(..));
        while in_flight + 1 < RING_ENTRIES as usize {
            let Some(mut req) = backlog.pop_front() else {
                break;
            };
            let fd = types::Fd(fds[req.file]);
            let sqe = match req.op {
                Op::Read => {
                    let buf = req.buf.as_mut().expect("read buffer");
                    opcode::Read::new(fd, buf.as_mut_ptr(), buf.len() as u32).offset(req.offset).build()
                }
                Op::Write => {
                    let buf = req.buf.as_ref().expect("write buffer");
                    opcode::Write::new(fd, buf.as_ptr(), buf.len() as u32).offset(req.offset).build()
                }
                Op::Sync => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            };
            let slot = free_slots.pop().unwrap_or_else(|| {
                slots.push(None);
                slots.len() - 1
            });
            // The buffer moves into the slot; its heap address does not change.
            slots[slot] = Some(req);
            // SAFETY: the buffer stays alive in `slots` until its completion.
            if unsafe { ring.submission().push(&sqe.user_data(slot as u64)) }.is_err() {
                let req = slots[slot].take().expect("slot");
                free_slots.push(slot);
                backlog.push_front(req);
                break;
            }
            in_flight += 1;
        }
        if shared.stop.load(Ordering::SeqCst) && in_flight == 0 && backlog.is_empty() {
            return;
        }
        if in_flight == 0 {
            // Announce idleness, then look again: a request queued before
            // the flag was visible is seen here; one queued after kicks.
            shared.idle.store(true, Ordering::SeqCst);
            if !shared.queue.lock().expect("uring queue poisoned").is_empty() {
                shared.idle.store(false, Ordering::SeqCst);
                continue;
            }
        }
        let waited = ring.submit_and_wait(1);
        shared.idle.store(false, Ordering::SeqCst);
        if let Err(e) = waited {
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // The ring itself failed: fail everything so no caller waits forever.
            for req in slots.iter_mut().filter_map(Option::take).chain(backlog.drain(..)) {
                let _ = req.reply.send(Err(io::Error::new(e.kind(), format!("io_uring: {e}"))));
            }
            return;
        }
        let completions: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (token, result) in completions {
            if token == WAKE_TOKEN {
                wake_armed = false;
                continue;
            }
            let slot = token as usize;
            let req = slots[slot].take().expect("completion for an empty slot");
            free_slots.push(slot);
            in_flight -= 1;
            let expected = req.buf.as_ref().map_or(0, |b| b.len());
            let outcome = if result < 0 {
                Err(io::Error::from_raw_os_error(-result))
            } else if (result as usize) != expected {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short {:?} at {}: {} of {} bytes", req.op, req.offset, result, expected),
                ))
            } else {
                Ok(req.buf)
            };
            let _ = req.reply.send(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn round_trip(kind: BackendKind) {
        let path = std::env::temp_dir().join(format!("ironhorn-io-{}-{kind:?}", std::process::id()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        file.set_len(1 << 20).unwrap();
        let backend = Backend::new(kind, vec![Arc::new(file)]).unwrap();
        let mut data = AlignedBuf::zeroed(8192);
        data.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
        let data = backend.write(0, 4096, data).await.unwrap();
        backend.sync().await.unwrap();
        let back = backend.read(0, 4096, AlignedBuf::zeroed(8192)).await.unwrap();
        assert_eq!(&back[..], &data[..]);
        let past_end = backend.read(0, 1 << 20, AlignedBuf::zeroed(4096)).await;
        assert!(past_end.is_err(), "a read past the end must fail, not return zeroes");
        std::fs::remove_file(path).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn uring_round_trip() {
        round_trip(BackendKind::Uring).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pread_round_trip() {
        round_trip(BackendKind::Pread).await;
    }
}
