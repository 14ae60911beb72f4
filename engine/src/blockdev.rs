//! The volume as a kernel block device at `/dev/ironhorn/<volume>`.
//!
//! This kernel has neither ublk nor NBD, so the device is built from what it
//! has: a one-file FUSE filesystem whose file is the volume (reads, writes and
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
        VolumeError::Io(_) | VolumeError::Busy(_) => Errno::EIO,
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

/// Builds `/dev/ironhorn/<volume>` for `volume` (FUSE file + loop device).
pub fn start(volume: Arc<Volume>, runtime: tokio::runtime::Handle) -> Result<BlockDevice, String> {
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
    let dir = Path::new("/dev/ironhorn");
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    device.link = dir.join(&name);
    let _ = std::fs::remove_file(&device.link);
    std::os::unix::fs::symlink(&device.loop_device, &device.link)
        .map_err(|e| format!("link {} -> {}: {e}", device.link.display(), device.loop_device))?;
    tracing::info!(device = %device.loop_device, link = %device.link.display(), "block device ready");
    Ok(device)
}

impl BlockDevice {
    pub fn description(&self) -> String {
        format!("blockdev:{} ({})", self.link.display(), self.loop_device)
    }
}

impl Drop for BlockDevice {
    fn drop(&mut self) {
        if !self.link.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.link);
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
