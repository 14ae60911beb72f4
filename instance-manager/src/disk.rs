//! This node's disks as the manager sees them: an LVM volume group
//! (`lvm:VG`, size and free from `vgs`) or a directory (`file:DIR`, from
//! statvfs), and the replica stores on each.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct DiskStatus {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub stores: Vec<String>,
    pub stores_bytes: u64,
}

pub fn status(disk: &str) -> Result<DiskStatus, String> {
    if let Some(vg) = disk.strip_prefix("lvm:") {
        let info = ironhorn_replica::lvm::vg_info(vg).map_err(|e| e.to_string())?;
        let stores = ironhorn_replica::lvm::lv_list(vg).map_err(|e| e.to_string())?;
        return Ok(DiskStatus {
            total_bytes: info.size_bytes,
            free_bytes: info.free_bytes,
            stores: stores.into_iter().map(|lv| format!("lvm:{vg}/{lv}")).collect(),
            stores_bytes: info.size_bytes - info.free_bytes,
        });
    }
    if let Some(dir) = disk.strip_prefix("file:") {
        let (total_bytes, free_bytes) = statvfs(Path::new(dir))?;
        let mut stores = Vec::new();
        let mut stores_bytes = 0;
        let entries = std::fs::read_dir(dir).map_err(|e| format!("disk {dir}: {e}"))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|x| x == "img") {
                // The file's length: a sparse store may grow to it.
                stores_bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
                stores.push(format!("file:{}", path.display()));
            }
        }
        stores.sort();
        return Ok(DiskStatus { total_bytes, free_bytes, stores, stores_bytes });
    }
    Err(format!("disk {disk:?}: expected lvm:VG or file:DIRECTORY"))
}

/// The longest an LVM disk's answer is reused.
pub const CACHE_FOR: Duration = Duration::from_secs(5);

/// Disk answers kept between the manager's polls. An LVM disk's status
/// costs two LVM commands, each scanning devices under the volume group's
/// lock (and so slowing every `lvcreate` beside it), and the manager asks
/// on every pass. An answer is reused while nothing this instance manager
/// runs has changed (a process started, became ready, exited or was
/// deleted; a store was deleted: the moments its stores come and go) and
/// for at most [`CACHE_FOR`], for changes made by hand. A directory is
/// read afresh every time: it is cheap, and its stores grow as they are
/// written.
#[derive(Default)]
pub struct StatusCache {
    changes: AtomicU64,
    answers: Mutex<HashMap<String, (u64, Instant, DiskStatus)>>,
}

impl StatusCache {
    /// Something that may add or remove a store happened.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// `disk`'s status, from the cache when still good (blocking).
    pub fn status(&self, disk: &str) -> Result<DiskStatus, String> {
        if !disk.starts_with("lvm:") {
            return status(disk);
        }
        // Read before asking: a change while LVM answers makes the answer
        // stale at once.
        let seen = self.changes.load(Ordering::SeqCst);
        if let Some((changes, at, answer)) = self.answers.lock().expect("disk cache").get(disk)
            && *changes == seen
            && at.elapsed() < CACHE_FOR
        {
            return Ok(answer.clone());
        }
        let answer = status(disk)?;
        self.answers.lock().expect("disk cache").insert(disk.to_string(), (seen, Instant::now(), answer.clone()));
        Ok(answer)
    }
}

fn statvfs(dir: &Path) -> Result<(u64, u64), String> {
    let path = CString::new(dir.as_os_str().as_bytes()).map_err(|_| format!("{}: bad path", dir.display()))?;
    // SAFETY: statvfs writes into the zeroed struct we pass; path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(format!("statvfs {}: {}", dir.display(), std::io::Error::last_os_error()));
    }
    let unit = st.f_frsize as u64;
    Ok((st.f_blocks as u64 * unit, st.f_bavail as u64 * unit))
}

/// True when the store exists (file present, or LV present).
pub fn store_exists(store: &str) -> Result<bool, String> {
    if let Some(path) = store.strip_prefix("file:") {
        return Ok(Path::new(path).exists());
    }
    if let Some((vg, lv)) = store.strip_prefix("lvm:").and_then(|s| s.split_once('/')) {
        return ironhorn_replica::lvm::lv_exists(vg, lv).map_err(|e| e.to_string());
    }
    Err(format!("store {store:?}: expected file:PATH or lvm:VG/LV"))
}

/// Deletes a store; an absent one is already deleted.
pub fn delete_store(store: &str) -> Result<(), String> {
    let location: ironhorn_replica::device::StoreLocation = store.parse()?;
    if !store_exists(store)? {
        return Ok(());
    }
    ironhorn_replica::delete(&location)
}
