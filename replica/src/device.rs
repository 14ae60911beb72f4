//! The byte range a store lives on: one file, or an LVM logical volume.
//!
//! A [`Device`] is a list of segments, each a run of the store's logical
//! byte range mapped onto an open file at some offset. A file store is one
//! segment. An LV is one segment per LVM segment, mapped onto its PV the way
//! dm-linear would map it; that is how LVs are reached on kernels without
//! device-mapper (see `lvm.rs`). I/O that crosses a segment edge is split.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::faults::{FaultOp, Faults, Verdict, injected};
use crate::io::{AlignedBuf, Backend, BackendKind, IO_ALIGN};
use crate::lvm;

/// Where a store lives, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    File(PathBuf),
    Lvm { vg: String, lv: String },
}

impl std::str::FromStr for StoreLocation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("file:") {
            if path.is_empty() {
                return Err("store file:PATH needs a path".into());
            }
            return Ok(Self::File(PathBuf::from(path)));
        }
        if let Some(rest) = s.strip_prefix("lvm:") {
            let (vg, lv) = rest.split_once('/').ok_or_else(|| format!("store {s:?}: expected lvm:VG/LV"))?;
            let valid = |n: &str| {
                !n.is_empty()
                    && !n.starts_with('-')
                    && n.chars().all(|c| c.is_ascii_alphanumeric() || "+_.-".contains(c))
            };
            if !valid(vg) || !valid(lv) {
                return Err(format!("store {s:?}: VG and LV names may hold only letters, digits and +_.-"));
            }
            return Ok(Self::Lvm { vg: vg.into(), lv: lv.into() });
        }
        Err(format!("store {s:?}: expected file:PATH or lvm:VG/LV"))
    }
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "file:{}", p.display()),
            Self::Lvm { vg, lv } => write!(f, "lvm:{vg}/{lv}"),
        }
    }
}

/// One run of the store's logical range on one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub logical_start: u64,
    pub length: u64,
    pub file: usize,
    pub physical_start: u64,
}

pub struct Device {
    location: StoreLocation,
    backend: Backend,
    segments: Vec<Segment>,
    size_bytes: u64,
    kind: BackendKind,
    /// Faults tests switch on at run time (none by default).
    faults: Arc<Faults>,
}

/// Reserves `[offset, offset+length)` of a store file on its filesystem, so
/// a full filesystem refuses the store when it is made or grown, never a
/// write into it later (a sparse file would fail mid-write, metadata too).
fn preallocate(file: &File, offset: u64, length: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on an open descriptor; mode 0 allocates and extends.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, offset as libc::off_t, length as libc::off_t) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        // A filesystem without fallocate: fall back to a sparse file.
        return file.set_len(offset + length);
    }
    Err(e)
}

pub(crate) fn open_direct(path: &std::path::Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(path)
}

impl Device {
    /// Whether the store exists (file present, or LV present).
    pub fn exists(location: &StoreLocation) -> io::Result<bool> {
        match location {
            StoreLocation::File(p) => Ok(p.exists()),
            StoreLocation::Lvm { vg, lv } => lvm::lv_exists(vg, lv),
        }
    }

    /// Creates the byte range: a file of `size_bytes`, or an LV of at least that.
    pub fn create(location: &StoreLocation, size_bytes: u64) -> io::Result<()> {
        match location {
            StoreLocation::File(p) => {
                let file = OpenOptions::new().write(true).create_new(true).open(p)?;
                if let Err(e) = preallocate(&file, 0, size_bytes) {
                    drop(file);
                    let _ = std::fs::remove_file(p);
                    return Err(e);
                }
                file.sync_all()
            }
            // The superblock slots (and the journal head) must not hold an
            // earlier LV's store: zero the first MiB before the LV appears.
            StoreLocation::Lvm { vg, lv } => lvm::lv_create_zeroed(vg, lv, size_bytes, 1 << 20),
        }
    }

    pub fn open(location: &StoreLocation, kind: BackendKind) -> io::Result<Self> {
        let (files, segments) = match location {
            StoreLocation::File(p) => {
                let file = open_direct(p)?;
                let length = file.metadata()?.len();
                (vec![file], vec![Segment { logical_start: 0, length, file: 0, physical_start: 0 }])
            }
            StoreLocation::Lvm { vg, lv } => lvm::lv_map(vg, lv)?,
        };
        let size_bytes = segments.iter().map(|s| s.length).sum();
        let files = files.into_iter().map(Arc::new).collect();
        let backend = Backend::new(kind, files)?;
        Ok(Self { location: location.clone(), backend, segments, size_bytes, kind, faults: Arc::default() })
    }

    /// Grows the byte range to at least `size_bytes` and reopens the mapping.
    pub fn grow(&mut self, size_bytes: u64) -> io::Result<()> {
        if size_bytes <= self.size_bytes {
            return Ok(());
        }
        match &self.location {
            StoreLocation::File(p) => {
                let file = OpenOptions::new().write(true).open(p)?;
                preallocate(&file, self.size_bytes, size_bytes - self.size_bytes)?;
                file.sync_all()?;
            }
            StoreLocation::Lvm { vg, lv } => lvm::lv_extend(vg, lv, size_bytes)?,
        }
        let faults = self.faults.clone();
        *self = Self::open(&self.location.clone(), self.kind)?.with_faults(faults);
        Ok(())
    }

    pub fn destroy(location: &StoreLocation) -> io::Result<()> {
        match location {
            StoreLocation::File(p) => std::fs::remove_file(p),
            StoreLocation::Lvm { vg, lv } => lvm::lv_remove(vg, lv),
        }
    }

    /// Routes this device's I/O through `faults`.
    pub fn with_faults(mut self, faults: Arc<Faults>) -> Self {
        self.faults = faults;
        self
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    pub fn location(&self) -> &StoreLocation {
        &self.location
    }

    pub fn backend_kind(&self) -> BackendKind {
        self.kind
    }

    /// Splits [offset, offset+len) into (file, physical offset, buffer range).
    fn pieces(&self, offset: u64, len: u64) -> io::Result<Vec<(usize, u64, usize, usize)>> {
        if offset % IO_ALIGN as u64 != 0 || len % IO_ALIGN as u64 != 0 || offset + len > self.size_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("device I/O at {offset}+{len} outside {} or unaligned", self.size_bytes),
            ));
        }
        let mut out = Vec::with_capacity(1);
        let mut at = offset;
        let end = offset + len;
        for seg in &self.segments {
            let seg_end = seg.logical_start + seg.length;
            if at >= seg_end || at < seg.logical_start {
                continue;
            }
            let take = (end.min(seg_end)) - at;
            out.push((seg.file, seg.physical_start + (at - seg.logical_start), (at - offset) as usize, take as usize));
            at += take;
            if at == end {
                break;
            }
        }
        assert_eq!(at, end, "segments do not cover the device");
        Ok(out)
    }

    pub async fn read(&self, offset: u64, buf: AlignedBuf) -> io::Result<AlignedBuf> {
        match self.faults.check(FaultOp::Read).await {
            Verdict::Run => {}
            Verdict::Fail(errno) => return Err(injected(errno)),
            Verdict::Torn => return Err(injected(libc::EIO)),
        }
        let pieces = self.pieces(offset, buf.len() as u64)?;
        if let [(file, phys, _, _)] = pieces[..] {
            return self.backend.read(file, phys, buf).await;
        }
        let mut buf = buf;
        for (file, phys, start, len) in pieces {
            let part = self.backend.read(file, phys, AlignedBuf::zeroed(len)).await?;
            buf[start..start + len].copy_from_slice(&part);
        }
        Ok(buf)
    }

    pub async fn write(&self, offset: u64, buf: AlignedBuf) -> io::Result<AlignedBuf> {
        match self.faults.check(FaultOp::Write).await {
            Verdict::Run => {}
            Verdict::Fail(errno) => return Err(injected(errno)),
            Verdict::Torn => {
                let half = (buf.len() / 2).next_multiple_of(IO_ALIGN).min(buf.len());
                if half > 0 {
                    self.write_unchecked(offset, AlignedBuf::from_slice(&buf[..half])).await?;
                }
                return Err(injected(libc::EIO));
            }
        }
        self.write_unchecked(offset, buf).await
    }

    async fn write_unchecked(&self, offset: u64, buf: AlignedBuf) -> io::Result<AlignedBuf> {
        let pieces = self.pieces(offset, buf.len() as u64)?;
        if let [(file, phys, _, _)] = pieces[..] {
            return self.backend.write(file, phys, buf).await;
        }
        for (file, phys, start, len) in pieces {
            self.backend.write(file, phys, AlignedBuf::from_slice(&buf[start..start + len])).await?;
        }
        Ok(buf)
    }

    pub async fn sync(&self) -> io::Result<()> {
        match self.faults.check(FaultOp::Sync).await {
            Verdict::Run => self.backend.sync().await,
            Verdict::Fail(errno) => Err(injected(errno)),
            Verdict::Torn => Err(injected(libc::EIO)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_locations() {
        assert_eq!("file:/tmp/x".parse::<StoreLocation>(), Ok(StoreLocation::File("/tmp/x".into())));
        assert_eq!(
            "lvm:vg0/r-1".parse::<StoreLocation>(),
            Ok(StoreLocation::Lvm { vg: "vg0".into(), lv: "r-1".into() })
        );
        for bad in ["", "file:", "lvm:vg", "lvm:/lv", "lvm:vg/", "disk:/x", "lvm:v g/l", "lvm:-vg/lv"] {
            assert!(bad.parse::<StoreLocation>().is_err(), "{bad:?} must be rejected");
        }
    }
}
