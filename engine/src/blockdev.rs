//! The volume as a kernel block device at `/dev/ironhorn/<volume>`.
//!
//! Chosen at run time: where the kernel has the NBD driver, the engine hands
//! one end of a socketpair to `/dev/nbdN` (ioctls, as nbd-client does) and
//! serves the transmission phase on the other end itself. Elsewhere (this
//! development kernel has neither ublk nor NBD) the device is built from
//! what there is: a one-file FUSE filesystem whose file is the volume (reads, writes and
//! fsync go straight to the replicator, no FUSE page cache), and a loop
//! device with direct I/O and 4 KiB sectors on that file. `/dev/ironhorn/<vol>`
//! is a symlink to the loop device. On drop the link, the loop device and
//! the mount are removed, by their exact names.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use crate::fuse::{self, Op, Reply, Request, abi};
use crate::volume::{BLOCK, MAX_IO_BYTES, Volume, VolumeError};

const ROOT: u64 = 1;
const FILE: u64 = 2;
const FILE_NAME: &str = "volume";
/// Seconds the kernel may cache the file's attributes (a resize
/// invalidates them at once).
const TTL_SECS: u64 = 1;

/// The one-file filesystem: its file is the volume.
struct VolumeFs {
    volume: Arc<Volume>,
    /// Serialises read-modify-write of partial blocks (rare: the loop device
    /// sends whole 4 KiB sectors).
    partial: Arc<tokio::sync::Mutex<()>>,
}

fn attr(ino: u64, size: u64) -> abi::Attr {
    if ino == ROOT {
        abi::Attr { ino, size: 0, mode: abi::S_IFDIR | 0o755, nlink: 2, blksize: BLOCK as u32 }
    } else {
        abi::Attr { ino, size, mode: abi::S_IFREG | 0o600, nlink: 1, blksize: BLOCK as u32 }
    }
}

fn errno(e: &VolumeError) -> i32 {
    match e {
        VolumeError::Invalid(_) | VolumeError::NotFound(_) => libc::EINVAL,
        VolumeError::Fenced(_) => libc::EROFS,
        VolumeError::NoSpace(_) => libc::ENOSPC,
        VolumeError::TooLarge(_) => libc::EOVERFLOW,
        VolumeError::Io(_) | VolumeError::Busy(_) | VolumeError::NoQuorum(_) => libc::EIO,
    }
}

/// The block-aligned range covering `[offset, offset+len)`.
fn aligned(offset: u64, len: u64) -> (u64, u64) {
    let start = offset / BLOCK * BLOCK;
    let end = (offset + len).div_ceil(BLOCK) * BLOCK;
    (start, end - start)
}

async fn read_range(volume: &Volume, offset: u64, len: u64) -> Result<bytes::Bytes, VolumeError> {
    let (start, span) = aligned(offset, len);
    if start == offset && span == len && len <= MAX_IO_BYTES {
        return volume.read(offset, len).await;
    }
    let mut out = Vec::with_capacity(span as usize);
    let mut at = start;
    while at < start + span {
        let n = MAX_IO_BYTES.min(start + span - at);
        out.extend_from_slice(&volume.read(at, n).await?);
        at += n;
    }
    let skip = (offset - start) as usize;
    Ok(bytes::Bytes::from(out).slice(skip..skip + len as usize))
}

async fn write_range(
    volume: &Volume,
    partial: &tokio::sync::Mutex<()>,
    offset: u64,
    data: bytes::Bytes,
) -> Result<(), VolumeError> {
    let len = data.len() as u64;
    if offset % BLOCK == 0 && len % BLOCK == 0 && len <= MAX_IO_BYTES {
        return volume.write(offset, data, false).await;
    }
    let _one = partial.lock().await;
    let (start, span) = aligned(offset, len);
    let mut merged = read_range(volume, start, span).await?.to_vec();
    let skip = (offset - start) as usize;
    merged[skip..skip + data.len()].copy_from_slice(&data);
    let mut at = 0usize;
    while at < merged.len() {
        let n = (MAX_IO_BYTES as usize).min(merged.len() - at);
        volume.write(start + at as u64, bytes::Bytes::copy_from_slice(&merged[at..at + n]), false).await?;
        at += n;
    }
    Ok(())
}

impl VolumeFs {
    /// Answers one request: metadata at once, I/O from a task of its own
    /// (so the reader goes on to the next request).
    fn handle(&self, request: Request, reply: Reply) {
        let ino = request.nodeid;
        let size = self.volume.size();
        match request.op {
            Op::Lookup { name } if ino == ROOT && name == FILE_NAME.as_bytes() => {
                reply.ok(&abi::entry(&attr(FILE, size), TTL_SECS))
            }
            Op::Lookup { .. } => reply.error(libc::ENOENT),
            Op::Getattr if ino == ROOT || ino == FILE => reply.ok(&abi::attr_out(&attr(ino, size), TTL_SECS)),
            Op::Getattr => reply.error(libc::ENOENT),
            Op::Setattr { .. } if ino != FILE => reply.error(libc::EPERM),
            // The file is as large as the volume; only a resize of the volume changes that.
            Op::Setattr { size: Some(s) } if s != size => reply.error(libc::EPERM),
            Op::Setattr { .. } => reply.ok(&abi::attr_out(&attr(FILE, size), TTL_SECS)),
            // No FUSE page cache: every read and write reaches the replicas.
            Op::Open if ino == FILE => {
                reply.ok(&abi::open_out(0, abi::FOPEN_DIRECT_IO | abi::FOPEN_PARALLEL_DIRECT_WRITES))
            }
            Op::Open => reply.error(libc::EISDIR),
            Op::Opendir if ino == ROOT => reply.ok(&abi::open_out(0, 0)),
            Op::Opendir => reply.error(libc::ENOTDIR),
            Op::Readdir { offset, size: room } => {
                let entries = [(ROOT, abi::DT_DIR, "."), (ROOT, abi::DT_DIR, ".."), (FILE, abi::DT_REG, FILE_NAME)];
                reply.ok(&abi::dirents(&entries, offset, room))
            }
            Op::Release | Op::Releasedir => reply.ok(&[]),
            Op::Statfs => reply.ok(&abi::statfs_out(size / BLOCK, BLOCK as u32, 1)),
            Op::Read { .. } | Op::Write { .. } if ino != FILE => reply.error(libc::EISDIR),
            Op::Read { offset, size: want } => {
                let end = (offset + want as u64).min(size);
                if offset >= end {
                    return reply.ok(&[]);
                }
                let volume = self.volume.clone();
                ironhorn_proto::busy_poll::spawn_request(async move {
                    match read_range(&volume, offset, end - offset).await {
                        Ok(data) => reply.ok(&data),
                        Err(e) => {
                            tracing::warn!(offset, size = want, error = %e, "blockdev read failed");
                            reply.error(errno(&e))
                        }
                    }
                });
            }
            Op::Write { offset, data } => {
                if offset + data.len() as u64 > size {
                    return reply.error(libc::ENOSPC);
                }
                let (volume, partial) = (self.volume.clone(), self.partial.clone());
                ironhorn_proto::busy_poll::spawn_request(async move {
                    let len = data.len();
                    match write_range(&volume, &partial, offset, data).await {
                        Ok(()) => reply.ok(&abi::write_out(len as u32)),
                        Err(e) => {
                            tracing::warn!(offset, len, error = %e, "blockdev write failed");
                            reply.error(errno(&e))
                        }
                    }
                });
            }
            Op::Flush | Op::Fsync => {
                let volume = self.volume.clone();
                ironhorn_proto::busy_poll::spawn_request(async move {
                    match volume.flush().await {
                        Ok(()) => reply.ok(&[]),
                        Err(e) => reply.error(errno(&e)),
                    }
                });
            }
            Op::Init(_) | Op::NoReply | Op::Destroy | Op::Other(_) => reply.error(libc::ENOSYS),
        }
    }
}

/// The FUSE half of the fallback device: the mount and the task serving it.
struct FuseFile {
    mount: fuse::Mount,
    server: tokio::task::JoinHandle<()>,
}

pub struct BlockDevice {
    kernel_nbd: Option<KernelNbd>,
    fuse: Option<FuseFile>,
    pub loop_device: String,
    pub link: PathBuf,
    mountpoint: PathBuf,
}

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn link_device(volume: &str, device: &str) -> Result<PathBuf, String> {
    let dir = Path::new("/dev/ironhorn");
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let link = dir.join(volume);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(device, &link).map_err(|e| format!("link {} -> {device}: {e}", link.display()))?;
    Ok(link)
}

/// Builds `/dev/ironhorn/<volume>`: kernel NBD where the kernel has it,
/// else a FUSE file with a loop device on it.
pub fn start(volume: Arc<Volume>, runtime: tokio::runtime::Handle, fuse_uring: bool) -> Result<BlockDevice, String> {
    if kernel_nbd_available() {
        let name = volume.name.clone();
        let nbd = KernelNbd::start(volume, &runtime)?;
        let mut device = BlockDevice {
            loop_device: nbd.device.clone(),
            kernel_nbd: Some(nbd),
            fuse: None,
            link: PathBuf::new(),
            mountpoint: PathBuf::new(),
        };
        device.link = link_device(&name, &device.loop_device)?;
        tracing::info!(device = %device.loop_device, link = %device.link.display(), "block device ready (kernel NBD)");
        return Ok(device);
    }
    let mountpoint = Path::new("/run/ironhorn/fuse").join(&volume.name);
    std::fs::create_dir_all(&mountpoint).map_err(|e| format!("create {}: {e}", mountpoint.display()))?;
    let name = volume.name.clone();
    let fs = VolumeFs { volume, partial: Arc::new(tokio::sync::Mutex::new(())) };
    // Before the mount: the kernel decides at mount time (in the INIT it
    // sends) whether to offer io_uring.
    let ring = fuse_uring && fuse::uring::enable_in_kernel();
    let mount = {
        let _entered = runtime.enter();
        fuse::Mount::new(&format!("ironhorn-{name}"), &mountpoint).map_err(|e| e.to_string())?
    };
    let channel = mount.channel.clone();
    let server = runtime.spawn(async move {
        let served =
            fuse::Mount::serve(channel, MAX_IO_BYTES as u32, ring, move |request, reply| fs.handle(request, reply));
        if let Err(e) = served.await {
            tracing::error!(error = %e, "FUSE server stopped: the block device fails its I/O");
        }
    });
    let mut device = BlockDevice {
        kernel_nbd: None,
        fuse: Some(FuseFile { mount, server }),
        loop_device: String::new(),
        link: PathBuf::new(),
        mountpoint: mountpoint.clone(),
    };
    let file = mountpoint.join(FILE_NAME);
    let file = file.to_str().ok_or("mountpoint path is not UTF-8")?;
    device.loop_device = match run("losetup", &["--find", "--show", "--direct-io=on", "--sector-size", "4096", file]) {
        Ok(dev) => dev,
        Err(e) => {
            tracing::warn!(error = %e, "loop device with direct I/O failed; using buffered I/O");
            run("losetup", &["--find", "--show", "--sector-size", "4096", file])?
        }
    };
    device.link = link_device(&name, &device.loop_device)?;
    tracing::info!(device = %device.loop_device, link = %device.link.display(), "block device ready (FUSE + loop)");
    Ok(device)
}

impl BlockDevice {
    pub fn description(&self) -> String {
        let via = match &self.fuse {
            None => "kernel NBD",
            Some(f) if f.mount.channel.on_ring() => "FUSE over io_uring + loop",
            Some(_) => "FUSE + loop",
        };
        format!("blockdev:{} ({}, {via})", self.link.display(), self.loop_device)
    }

    /// Makes the kernel device show `size` bytes after the volume grew: kernel
    /// NBD takes the new size by ioctl; the loop device re-reads its file's
    /// size (LOOP_SET_CAPACITY), once the kernel has dropped its cached
    /// attributes of the FUSE file and read them again.
    pub fn refresh_size(&self, size: u64) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        if let Some(nbd) = &self.kernel_nbd {
            return ioctl(nbd.file.as_raw_fd(), NBD_SET_SIZE_BLOCKS, size / BLOCK, "NBD_SET_SIZE_BLOCKS");
        }
        if let Some(fuse) = &self.fuse {
            fuse.mount
                .channel
                .invalidate_attributes(FILE)
                .map_err(|e| format!("invalidate the FUSE file's attributes: {e}"))?;
        }
        let file = self.mountpoint.join(FILE_NAME);
        let seen = std::fs::metadata(&file).map_err(|e| format!("stat {}: {e}", file.display()))?.len();
        if seen != size {
            return Err(format!("{} shows {seen} bytes, not {size}", file.display()));
        }
        run("losetup", &["--set-capacity", &self.loop_device]).map(drop)
    }
}

impl Drop for BlockDevice {
    fn drop(&mut self) {
        if !self.link.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.link);
        }
        if let Some(nbd) = self.kernel_nbd.take() {
            drop(nbd);
            return;
        }
        if !self.loop_device.is_empty() {
            if let Err(e) = run("losetup", &["-d", &self.loop_device]) {
                tracing::warn!(error = %e, "detach loop device");
            }
        }
        if let Some(fuse) = self.fuse.take() {
            // The server answers the loop device's last requests above; once
            // unmounted, its read ends.
            if let Err(e) = fuse::unmount(&fuse.mount.mountpoint) {
                tracing::warn!(error = %e, "unmount FUSE");
            }
            fuse.server.abort();
        }
        let _ = std::fs::remove_dir(&self.mountpoint);
    }
}

// Kernel NBD ioctls (linux/nbd.h): _IO(0xab, n).
const NBD_SET_SOCK: libc::c_ulong = 0xab00;
const NBD_SET_BLKSIZE: libc::c_ulong = 0xab01;
const NBD_DO_IT: libc::c_ulong = 0xab03;
const NBD_CLEAR_SOCK: libc::c_ulong = 0xab04;
const NBD_CLEAR_QUE: libc::c_ulong = 0xab05;
const NBD_SET_SIZE_BLOCKS: libc::c_ulong = 0xab07;
const NBD_DISCONNECT: libc::c_ulong = 0xab08;
const NBD_SET_TIMEOUT: libc::c_ulong = 0xab09;
const NBD_SET_FLAGS: libc::c_ulong = 0xab0a;

/// Whether the kernel NBD driver is loaded with devices to use.
pub fn kernel_nbd_available() -> bool {
    Path::new("/sys/module/nbd").exists() && Path::new("/dev/nbd0").exists()
}

fn ioctl(fd: std::os::fd::RawFd, request: libc::c_ulong, arg: libc::c_ulong, what: &str) -> Result<(), String> {
    // SAFETY: NBD ioctls take an integer argument (or none); fd is open.
    let rc = unsafe { libc::ioctl(fd, request as _, arg) };
    if rc < 0 { Err(format!("{what}: {}", std::io::Error::last_os_error())) } else { Ok(()) }
}

/// `/dev/nbdN` connected to this engine through a socketpair.
struct KernelNbd {
    device: String,
    file: std::fs::File,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KernelNbd {
    fn start(volume: Arc<Volume>, runtime: &tokio::runtime::Handle) -> Result<KernelNbd, String> {
        use std::os::fd::AsRawFd;
        let index = (0..256)
            .find(|i| {
                Path::new(&format!("/dev/nbd{i}")).exists() && !Path::new(&format!("/sys/block/nbd{i}/pid")).exists()
            })
            .ok_or("no free /dev/nbdN device")?;
        let device = format!("/dev/nbd{index}");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&device)
            .map_err(|e| format!("open {device}: {e}"))?;
        let (ours, kernels) = std::os::unix::net::UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
        ours.set_nonblocking(true).map_err(|e| format!("socketpair: {e}"))?;
        let size = volume.size();
        {
            let _guard = runtime.enter();
            let stream = tokio::net::UnixStream::from_std(ours).map_err(|e| format!("socketpair: {e}"))?;
            runtime.spawn(async move {
                if let Err(e) = crate::nbd::serve_kernel_client(stream, volume).await {
                    tracing::warn!(error = %e, "kernel NBD connection ended");
                }
            });
        }
        let fd = file.as_raw_fd();
        ioctl(fd, NBD_SET_BLKSIZE, BLOCK, "NBD_SET_BLKSIZE")?;
        ioctl(fd, NBD_SET_SIZE_BLOCKS, size / BLOCK, "NBD_SET_SIZE_BLOCKS")?;
        ioctl(fd, NBD_SET_FLAGS, crate::nbd::transmission_flags() as libc::c_ulong, "NBD_SET_FLAGS")?;
        ioctl(fd, NBD_SET_TIMEOUT, 30, "NBD_SET_TIMEOUT")?;
        ioctl(fd, NBD_SET_SOCK, kernels.as_raw_fd() as libc::c_ulong, "NBD_SET_SOCK")?;
        let thread_fd = fd;
        let thread = std::thread::Builder::new()
            .name(format!("nbd{index}"))
            .spawn(move || {
                // Blocks until NBD_DISCONNECT or the socket closes.
                if let Err(e) = ioctl(thread_fd, NBD_DO_IT, 0, "NBD_DO_IT") {
                    tracing::info!("kernel NBD session ended: {e}");
                }
                let _ = ioctl(thread_fd, NBD_CLEAR_QUE, 0, "NBD_CLEAR_QUE");
                let _ = ioctl(thread_fd, NBD_CLEAR_SOCK, 0, "NBD_CLEAR_SOCK");
                drop(kernels);
            })
            .map_err(|e| format!("NBD thread: {e}"))?;
        Ok(KernelNbd { device, file, thread: Some(thread) })
    }
}

impl Drop for KernelNbd {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        let _ = ioctl(self.file.as_raw_fd(), NBD_DISCONNECT, 0, "NBD_DISCONNECT");
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
