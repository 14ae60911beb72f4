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

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner,
    MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite,
    Request, WriteFlags,
};

use crate::volume::{BLOCK, MAX_IO_BYTES, Volume, VolumeError};

const ROOT: INodeNo = INodeNo(1);
const FILE: INodeNo = INodeNo(2);
const FILE_NAME: &str = "volume";
const TTL: Duration = Duration::from_secs(1);

struct VolumeFs {
    volume: Arc<Volume>,
    runtime: tokio::runtime::Handle,
    /// Serialises read-modify-write of partial blocks (rare: the loop device
    /// sends whole 4 KiB sectors).
    partial: Arc<tokio::sync::Mutex<()>>,
}

fn attr(ino: INodeNo, size: u64) -> FileAttr {
    let now = SystemTime::now();
    let (kind, perm, nlink) =
        if ino == ROOT { (FileType::Directory, 0o755, 2) } else { (FileType::RegularFile, 0o600, 1) };
    FileAttr {
        ino,
        size,
        blocks: size / 512,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLOCK as u32,
        flags: 0,
    }
}

fn errno(e: &VolumeError) -> Errno {
    match e {
        VolumeError::Invalid(_) | VolumeError::NotFound(_) => Errno::EINVAL,
        VolumeError::Fenced(_) => Errno::EROFS,
        VolumeError::NoSpace(_) => Errno::ENOSPC,
        VolumeError::TooLarge(_) => Errno::EOVERFLOW,
        VolumeError::Io(_) | VolumeError::Busy(_) | VolumeError::NoQuorum(_) => Errno::EIO,
    }
}

/// The block-aligned range covering `[offset, offset+len)`.
fn aligned(offset: u64, len: u64) -> (u64, u64) {
    let start = offset / BLOCK * BLOCK;
    let end = (offset + len).div_ceil(BLOCK) * BLOCK;
    (start, end - start)
}

async fn read_range(volume: &Volume, offset: u64, len: u64) -> Result<Vec<u8>, VolumeError> {
    let (start, span) = aligned(offset, len);
    let mut out = Vec::with_capacity(span as usize);
    let mut at = start;
    while at < start + span {
        let n = MAX_IO_BYTES.min(start + span - at);
        out.extend_from_slice(&volume.read(at, n).await?);
        at += n;
    }
    let skip = (offset - start) as usize;
    Ok(out[skip..skip + len as usize].to_vec())
}

async fn write_range(
    volume: &Volume,
    partial: &tokio::sync::Mutex<()>,
    offset: u64,
    data: &[u8],
) -> Result<(), VolumeError> {
    let len = data.len() as u64;
    if offset % BLOCK == 0 && len % BLOCK == 0 && len <= MAX_IO_BYTES {
        return volume.write(offset, bytes::Bytes::copy_from_slice(data), false).await;
    }
    let _one = partial.lock().await;
    let (start, span) = aligned(offset, len);
    let mut merged = read_range(volume, start, span).await?;
    let skip = (offset - start) as usize;
    merged[skip..skip + data.len()].copy_from_slice(data);
    let mut at = 0usize;
    while at < merged.len() {
        let n = (MAX_IO_BYTES as usize).min(merged.len() - at);
        volume.write(start + at as u64, bytes::Bytes::copy_from_slice(&merged[at..at + n]), false).await?;
        at += n;
    }
    Ok(())
}

impl Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(0);
        // Without async direct I/O the kernel sends the loop device's
        // requests one at a time; with it, many are in flight at once.
        if let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO) {
            tracing::warn!(?missing, "kernel FUSE lacks async direct I/O; the block device runs at queue depth 1");
        }
        let _ = config.set_max_background(256);
        let _ = config.set_congestion_threshold(192);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == FILE_NAME {
            reply.entry(&TTL, &attr(FILE, self.volume.size()), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino {
            ROOT => reply.attr(&TTL, &attr(ROOT, 0)),
            FILE => reply.attr(&TTL, &attr(FILE, self.volume.size())),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino != FILE {
            return reply.error(Errno::EPERM);
        }
        match size {
            Some(s) if s != self.volume.size() => reply.error(Errno::EPERM),
            _ => reply.attr(&TTL, &attr(FILE, self.volume.size())),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == FILE {
            // No FUSE page cache: every read and write reaches the replicas.
            reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        } else {
            reply.error(Errno::EISDIR);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        let volume = self.volume.clone();
        let end = (offset + size as u64).min(volume.size());
        if offset >= end {
            return reply.data(&[]);
        }
        self.runtime.spawn(async move {
            match read_range(&volume, offset, end - offset).await {
                Ok(data) => reply.data(&data),
                Err(e) => {
                    tracing::warn!(offset, size, error = %e, "blockdev read failed");
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if offset + data.len() as u64 > self.volume.size() {
            return reply.error(Errno::ENOSPC);
        }
        let (volume, partial, data) = (self.volume.clone(), self.partial.clone(), data.to_vec());
        self.runtime.spawn(async move {
            match write_range(&volume, &partial, offset, &data).await {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => {
                    tracing::warn!(offset, len = data.len(), error = %e, "blockdev write failed");
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        let volume = self.volume.clone();
        self.runtime.spawn(async move {
            match volume.flush().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let volume = self.volume.clone();
        self.runtime.spawn(async move {
            match volume.flush().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (FILE, FileType::RegularFile, FILE_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

pub struct BlockDevice {
    kernel_nbd: Option<KernelNbd>,
    session: Option<fuser::BackgroundSession>,
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
pub fn start(volume: Arc<Volume>, runtime: tokio::runtime::Handle) -> Result<BlockDevice, String> {
    if kernel_nbd_available() {
        let name = volume.name.clone();
        let nbd = KernelNbd::start(volume, &runtime)?;
        let mut device = BlockDevice {
            loop_device: nbd.device.clone(),
            kernel_nbd: Some(nbd),
            session: None,
            link: PathBuf::new(),
            mountpoint: PathBuf::new(),
        };
        device.link = link_device(&name, &device.loop_device)?;
        tracing::info!(device = %device.loop_device, link = %device.link.display(), "block device ready (kernel NBD)");
        return Ok(device);
    }
    let mountpoint = Path::new("/run/ironhorn/fuse").join(&volume.name);
    std::fs::create_dir_all(&mountpoint).map_err(|e| format!("create {}: {e}", mountpoint.display()))?;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("ironhorn-{}", volume.name)),
        MountOption::Subtype("ironhorn".into()),
        MountOption::RW,
        MountOption::NoAtime,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    config.n_threads = Some(2);
    let name = volume.name.clone();
    let fs = VolumeFs { volume, runtime, partial: Arc::new(tokio::sync::Mutex::new(())) };
    let session = fuser::spawn_mount(fs, &mountpoint, &config)
        .map_err(|e| format!("FUSE mount on {}: {e}", mountpoint.display()))?;
    let mut device = BlockDevice {
        kernel_nbd: None,
        session: Some(session),
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
        format!("blockdev:{} ({})", self.link.display(), self.loop_device)
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
        if let Some(session) = &self.session {
            // Offset -1: the attributes only (there is no page cache).
            match session.notifier().inval_inode(FILE, -1, 0) {
                Ok(()) => {}
                // Not in the kernel's cache: its next lookup reads the size.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(format!("invalidate the FUSE file's attributes: {e}")),
            }
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
        if let Some(session) = self.session.take() {
            if let Err(e) = session.umount_and_join() {
                tracing::warn!(error = %e, "unmount FUSE");
            }
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
