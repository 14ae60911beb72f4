//! The node's mount table and the tools that change it (mount, umount,
//! blkid, mkfs, resize2fs, xfs_growfs). The table is read from
//! `/proc/self/mountinfo` every time: it is the node plugin's only memory
//! of what it staged and published, so a restarted plugin knows as much as
//! the one before it.

use std::path::Path;

use tokio::process::Command;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// "major:minor" of the mounted device.
    pub device_number: String,
    /// The path inside the mounted filesystem this mount shows ("/" for the
    /// whole filesystem; a file for a bind-mounted device node).
    pub root: String,
    pub mount_point: String,
    pub options: String,
    pub fs_type: String,
    pub source: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                let v = d.iter().fold(0u16, |v, b| v * 8 + (b - b'0') as u16);
                out.push(v as u8);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `/proc/PID/mountinfo` text; lines it cannot read are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if f.len() < 6 || r.len() < 2 {
                return None;
            }
            Some(MountEntry {
                device_number: f[2].to_string(),
                root: unescape(f[3]),
                mount_point: unescape(f[4]),
                options: f[5].to_string(),
                fs_type: r[0].to_string(),
                source: unescape(r[1]),
            })
        })
        .collect()
}

pub fn table() -> Result<Vec<MountEntry>, String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("read mountinfo: {e}"))?;
    Ok(parse_mountinfo(&text))
}

/// The topmost mount at exactly `path`.
pub fn mount_at(path: &Path) -> Result<Option<MountEntry>, String> {
    let path = path.to_string_lossy();
    let path = path.trim_end_matches('/');
    Ok(table()?.into_iter().rev().find(|m| m.mount_point == path))
}

/// "major:minor" of a block device node (following symlinks).
pub fn device_number(device: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(device).map_err(|e| format!("{}: {e}", device.display()))?;
    let rdev = meta.rdev();
    Ok(format!("{}:{}", libc::major(rdev), libc::minor(rdev)))
}

/// Runs a tool, returning its stdout or an error with its stderr.
pub async fn run(tool: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(tool).args(args).output().await.map_err(|e| format!("{tool}: {e} (is it installed?)"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{tool} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// The filesystem on a device, None when it holds none (blkid's exit status
/// 2 means it found nothing; anything else that fails is an error, so an
/// unreadable device is never taken for an empty one).
pub async fn filesystem(device: &Path) -> Result<Option<String>, String> {
    let dev = device.to_string_lossy();
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE", dev.as_ref()])
        .output()
        .await
        .map_err(|e| format!("blkid: {e} (is util-linux installed?)"))?;
    match out.status.code() {
        Some(0) => {
            let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Ok(if t.is_empty() { None } else { Some(t) })
        }
        Some(2) => Ok(None),
        _ => Err(format!("blkid -p {dev}: {}", String::from_utf8_lossy(&out.stderr).trim())),
    }
}

/// Makes a filesystem on an empty device (the caller checked it is empty).
/// No discard pass: a new volume reads zeroes already.
pub async fn mkfs(device: &Path, fs_type: &str) -> Result<(), String> {
    let dev = device.to_string_lossy();
    match fs_type {
        "ext4" => run("mkfs.ext4", &["-q", "-F", "-E", "nodiscard,lazy_itable_init=1", dev.as_ref()]).await.map(drop),
        "xfs" => run("mkfs.xfs", &["-q", "-K", dev.as_ref()]).await.map(drop),
        other => Err(format!("cannot format {other}")),
    }
}

pub async fn mount(source: &Path, target: &Path, fs_type: Option<&str>, options: &[String]) -> Result<(), String> {
    let mut args: Vec<String> = Vec::new();
    if let Some(t) = fs_type {
        args.extend(["-t".into(), t.to_string()]);
    }
    if !options.is_empty() {
        args.extend(["-o".into(), options.join(",")]);
    }
    args.push(source.to_string_lossy().into_owned());
    args.push(target.to_string_lossy().into_owned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    run("mount", &refs).await.map(drop)
}

/// Unmounts `target` when something is mounted there (every layer).
pub async fn unmount(target: &Path) -> Result<(), String> {
    while mount_at(target)?.is_some() {
        run("umount", &[target.to_string_lossy().as_ref()]).await?;
    }
    Ok(())
}

/// Grows the filesystem mounted at `mount_point` to fill its device.
pub async fn grow(device: &Path, mount_point: &Path, fs_type: &str) -> Result<(), String> {
    match fs_type {
        "ext4" | "ext3" | "ext2" => run("resize2fs", &[device.to_string_lossy().as_ref()]).await.map(drop),
        "xfs" => run("xfs_growfs", &[mount_point.to_string_lossy().as_ref()]).await.map(drop),
        other => Err(format!("cannot grow a {other} filesystem")),
    }
}

/// Bytes of a block device.
pub fn device_size(device: &Path) -> Result<u64, String> {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::File::open(device).map_err(|e| format!("{}: {e}", device.display()))?;
    f.seek(SeekFrom::End(0)).map_err(|e| format!("{}: {e}", device.display()))
}

/// (total, free, used) bytes and (total, free, used) inodes of the
/// filesystem at `path`.
pub fn fs_usage(path: &Path) -> Result<((u64, u64, u64), (u64, u64, u64)), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: statvfs writes into the zeroed struct it is given.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path and s a valid out pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(format!("statvfs {}: {}", path.display(), std::io::Error::last_os_error()));
    }
    let frsize = s.f_frsize as u64;
    let bytes = (s.f_blocks as u64 * frsize, s.f_bavail as u64 * frsize, (s.f_blocks - s.f_bfree) as u64 * frsize);
    let inodes = (s.f_files as u64, s.f_ffree as u64, (s.f_files - s.f_ffree) as u64);
    Ok((bytes, inodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes_and_optional_fields() {
        let text = "\
36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
120 30 7:3 / /var/lib/kubelet/plugins/x/globalmount rw,relatime shared:60 - ext4 /dev/loop3 rw
121 30 0:5 /loop3 /var/lib/kubelet/pods/p/vol\\040dev rw,nosuid - devtmpfs udev rw
garbage line
";
        let t = parse_mountinfo(text);
        assert_eq!(t.len(), 3);
        assert_eq!(t[1].device_number, "7:3");
        assert_eq!(t[1].mount_point, "/var/lib/kubelet/plugins/x/globalmount");
        assert_eq!(t[1].fs_type, "ext4");
        assert_eq!(t[1].source, "/dev/loop3");
        assert_eq!(t[2].root, "/loop3");
        assert_eq!(t[2].mount_point, "/var/lib/kubelet/pods/p/vol dev");
    }
}
