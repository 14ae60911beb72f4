//! A FUSE server session served on the engine's own runtime.
//!
//! `/dev/fuse` is opened non-blocking and read from a task: each wake-up
//! takes every request the kernel has queued, so a burst from the loop
//! device becomes a burst of volume requests in the same turn of the
//! runtime (and one message per replica), with no thread between the kernel
//! and the volume. Replies are written from the task that answers them;
//! a write to `/dev/fuse` never blocks.

pub mod abi;
mod trim;
pub mod uring;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;

pub use abi::{Op, Request};

/// Requests read in one go before the reader lets other tasks run.
const BURST: usize = 64;

/// The kernel side of a mount: answers go here.
#[derive(Clone)]
pub struct Channel {
    fd: Arc<AsyncFd<OwnedFd>>,
    /// Set once requests come over io_uring.
    ring: Arc<std::sync::atomic::AtomicBool>,
}

impl Channel {
    fn send(&self, parts: &[&[u8]]) -> std::io::Result<()> {
        let iov: Vec<libc::iovec> =
            parts.iter().map(|p| libc::iovec { iov_base: p.as_ptr() as *mut _, iov_len: p.len() }).collect();
        // SAFETY: the iovecs point into `parts`, alive for the call.
        let n = unsafe { libc::writev(self.fd.get_ref().as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
        if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
    }

    /// Answers request `unique` with `payload`.
    pub fn reply(&self, unique: u64, payload: &[u8]) {
        let header = abi::out_header(abi::OUT_HEADER + payload.len(), 0, unique);
        self.deliver(unique, &[&header, payload]);
    }

    /// Answers request `unique` with an error (a positive errno).
    pub fn error(&self, unique: u64, errno: i32) {
        let header = abi::out_header(abi::OUT_HEADER, -errno, unique);
        self.deliver(unique, &[&header]);
    }

    fn deliver(&self, unique: u64, parts: &[&[u8]]) {
        match self.send(parts) {
            Ok(()) => {}
            // The request was interrupted, or the mount is gone.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) => {}
            Err(e) => tracing::warn!(unique, error = %e, "FUSE reply refused"),
        }
    }

    /// Whether requests come over io_uring (from INIT on).
    pub fn on_ring(&self) -> bool {
        self.ring.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Makes the kernel drop its cached attributes of `ino` (the volume
    /// grew). ENOENT: the kernel holds none, and reads them on next use.
    pub fn invalidate_attributes(&self, ino: u64) -> std::io::Result<()> {
        match self.send(&[&abi::inval_inode(ino)]) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }
}

/// Where the answer to one request goes: `/dev/fuse`, or the ring entry
/// the request came in. A request dropped unanswered (its task panicked or
/// was cancelled) is answered EIO, so the kernel never waits for it for
/// ever and a ring entry is never lost.
pub struct Reply {
    to: Option<To>,
}

enum To {
    Device { channel: Channel, unique: u64 },
    Ring(uring::Slot),
}

impl Reply {
    pub fn device(channel: Channel, unique: u64) -> Reply {
        Reply { to: Some(To::Device { channel, unique }) }
    }

    pub fn ring(slot: uring::Slot) -> Reply {
        Reply { to: Some(To::Ring(slot)) }
    }

    /// Answers with `payload`.
    pub fn ok(mut self, payload: &[u8]) {
        self.send(0, payload)
    }

    /// Answers with an error (a positive errno).
    pub fn error(mut self, errno: i32) {
        self.send(-errno, &[])
    }

    /// `error` is 0 or a negative errno, as in the out header.
    fn send(&mut self, error: i32, payload: &[u8]) {
        match self.to.take() {
            Some(To::Device { channel, unique }) if error == 0 => channel.reply(unique, payload),
            Some(To::Device { channel, unique }) => channel.error(unique, -error),
            Some(To::Ring(slot)) => slot.answer(error, payload),
            None => {}
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if self.to.is_some() {
            tracing::error!("FUSE request dropped unanswered; answering EIO");
            self.send(-libc::EIO, &[]);
        }
    }
}

/// The largest write (and read) the kernel sends when requests come on the
/// ring: every ring entry has room for one, so this bounds the entries'
/// memory (touched only as far as requests fill it).
pub const RING_MAX_WRITE: u32 = 256 << 10;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("open /dev/fuse: {0}")]
    Device(std::io::Error),
    #[error("mount FUSE on {path}: {error}")]
    Mount { path: PathBuf, error: std::io::Error },
    #[error("register /dev/fuse with the runtime: {0}")]
    Register(std::io::Error),
    #[error("mount point {0} is not a valid C string")]
    Path(PathBuf),
}

/// A mounted FUSE filesystem. Dropping it does not unmount: call
/// [`Mount::unmount`].
pub struct Mount {
    pub channel: Channel,
    pub mountpoint: PathBuf,
}

impl Mount {
    /// Mounts a FUSE filesystem named `fsname` on `mountpoint` (root only;
    /// mount(2) directly, no fusermount). Must be called inside a runtime.
    pub fn new(fsname: &str, mountpoint: &Path) -> Result<Mount, MountError> {
        let dev = CString::new("/dev/fuse").expect("no NUL");
        // SAFETY: a plain open(2); the descriptor is owned below.
        let raw = unsafe { libc::open(dev.as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(MountError::Device(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` was just opened and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let target = CString::new(mountpoint.as_os_str().as_encoded_bytes())
            .map_err(|_| MountError::Path(mountpoint.to_path_buf()))?;
        let source = CString::new(fsname).map_err(|_| MountError::Path(mountpoint.to_path_buf()))?;
        let fstype = CString::new("fuse.ironhorn").expect("no NUL");
        let data = CString::new(format!("fd={raw},rootmode=40000,user_id=0,group_id=0,allow_other")).expect("no NUL");
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
        // SAFETY: all pointers are valid NUL-terminated strings.
        let rc =
            unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, data.as_ptr() as *const _) };
        if rc < 0 {
            return Err(MountError::Mount { path: mountpoint.to_path_buf(), error: std::io::Error::last_os_error() });
        }
        // SAFETY: an OwnedFd keeps the same open descriptor until dropped.
        let fd = match unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
            Ok(fd) => fd,
            Err(e) => {
                let _ = unmount(mountpoint);
                return Err(MountError::Register(e.into_parts().1));
            }
        };
        Ok(Mount { channel: Channel { fd: Arc::new(fd), ring: Arc::default() }, mountpoint: mountpoint.to_path_buf() })
    }

    /// Reads requests until the filesystem is unmounted, answering INIT
    /// itself and handing every other request that wants an answer to
    /// `handle` (which answers through its [`Reply`], now or later). Where
    /// the kernel offers FUSE over io_uring and `ring` is set, requests come
    /// on a ring from INIT on, served by a task of its own; `/dev/fuse`
    /// still carries what the kernel does not route there.
    pub async fn serve(
        channel: Channel,
        max_write: u32,
        ring: bool,
        handle: impl Fn(Request, Reply) + Send + Sync + 'static,
    ) -> std::io::Result<()> {
        let handle = Arc::new(handle);
        let mut buf = vec![0u8; (max_write as usize + 4096).max(abi::MIN_READ_BUFFER)];
        loop {
            let mut guard = channel.fd.readable().await?;
            let mut drained = false;
            for _ in 0..BURST {
                // SAFETY: reads into `buf`, which outlives the call.
                let n = unsafe { libc::read(guard.get_inner().as_raw_fd(), buf.as_mut_ptr() as *mut _, buf.len()) };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EAGAIN) => {
                            guard.clear_ready();
                            drained = true;
                            break;
                        }
                        // A request interrupted before it was read.
                        Some(libc::ENOENT) | Some(libc::EINTR) => continue,
                        // Unmounted.
                        Some(libc::ENODEV) => return Ok(()),
                        _ => return Err(e),
                    }
                }
                let request = match abi::parse(&buf[..n as usize]) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(error = %e, "malformed FUSE request");
                        if n as usize >= 16 {
                            let unique = u64::from_ne_bytes(buf[8..16].try_into().expect("8 bytes"));
                            channel.error(unique, libc::EIO);
                        }
                        continue;
                    }
                };
                match &request.op {
                    Op::Init(init) => {
                        if !abi::offers_async_dio(init) {
                            tracing::warn!(
                                "kernel FUSE lacks async direct I/O; the block device runs at queue depth 1"
                            );
                        }
                        let ring = ring && abi::offers_io_uring(init);
                        let max_write = if ring { max_write.min(RING_MAX_WRITE) } else { max_write };
                        channel.reply(request.unique, &abi::negotiate(init, max_write, 256));
                        if ring {
                            start_ring(&channel, max_write as usize, handle.clone());
                        }
                    }
                    Op::NoReply => {}
                    Op::Destroy => channel.reply(request.unique, &[]),
                    _ => {
                        let reply = Reply::device(channel.clone(), request.unique);
                        handle(request, reply)
                    }
                }
            }
            if !drained {
                // A long burst: let the tasks it started run before reading on.
                drop(guard);
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Registers the ring and spawns the task serving it; on failure the
/// kernel keeps sending on `/dev/fuse`.
fn start_ring(channel: &Channel, max_write: usize, handle: Arc<impl Fn(Request, Reply) + Send + Sync + 'static>) {
    let payload = max_write.max(abi::MIN_READ_BUFFER);
    match uring::Ring::start(channel.clone(), uring::queues(), payload) {
        Ok(registered) => {
            match &registered.refused {
                None => {
                    channel.ring.store(true, std::sync::atomic::Ordering::Release);
                    tracing::info!(queues = uring::queues(), depth = uring::DEPTH, "FUSE requests come over io_uring");
                }
                Some(e) => tracing::warn!(error = %e, "the kernel refused FUSE ring entries; reading /dev/fuse"),
            }
            tokio::spawn(registered.ring.serve(move |request, slot| handle(request, Reply::ring(slot))));
        }
        Err(e) => tracing::warn!(error = %e, "FUSE over io_uring unavailable; reading /dev/fuse"),
    }
}

/// Detaches the filesystem at `mountpoint` (lazily: open files keep it
/// until closed).
pub fn unmount(mountpoint: &Path) -> std::io::Result<()> {
    let target = CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path with NUL"))?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A channel whose "kernel" end is the other half of a socket pair.
    fn channel() -> (Channel, std::os::unix::net::UnixStream) {
        let (ours, kernel) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        // SAFETY: the AsyncFd owns the descriptor for its whole life.
        let fd = unsafe { AsyncFd::register(OwnedFd::from(ours)) }.unwrap();
        (Channel { fd: Arc::new(fd), ring: Arc::default() }, kernel)
    }

    fn answer(kernel: &mut std::os::unix::net::UnixStream) -> (u32, i32, u64) {
        use std::io::Read;
        let mut h = [0u8; abi::OUT_HEADER];
        kernel.read_exact(&mut h).unwrap();
        let len = u32::from_ne_bytes(h[0..4].try_into().unwrap());
        (len, i32::from_ne_bytes(h[4..8].try_into().unwrap()), u64::from_ne_bytes(h[8..16].try_into().unwrap()))
    }

    #[tokio::test]
    async fn a_request_dropped_unanswered_is_answered_eio_once() {
        let (channel, mut kernel) = channel();
        drop(Reply::device(channel.clone(), 41));
        assert_eq!(answer(&mut kernel), (abi::OUT_HEADER as u32, -libc::EIO, 41));
        Reply::device(channel.clone(), 42).error(libc::ENOSPC);
        assert_eq!(answer(&mut kernel), (abi::OUT_HEADER as u32, -libc::ENOSPC, 42));
        Reply::device(channel, 43).ok(b"data");
        assert_eq!(answer(&mut kernel), (abi::OUT_HEADER as u32 + 4, 0, 43));
        let mut rest = [0u8; 4];
        std::io::Read::read_exact(&mut kernel, &mut rest).unwrap();
        assert_eq!(&rest, b"data");
        // Nothing more (the channel is gone): each request was answered once.
        assert_eq!(std::io::Read::read(&mut kernel, &mut rest).unwrap(), 0);
    }
}
