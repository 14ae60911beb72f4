//! Processes as the kernel sees them: identity (pid + start time, so a reused
//! pid is never mistaken for our instance), signals, and exit notification
//! for processes that are not our children (pidfd).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// The process's start time in clock ticks since boot (field 22 of
/// /proc/PID/stat), or None when there is no such process.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields
    // after it start past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let state = rest.split_whitespace().next()?;
    if state == "Z" || state == "X" {
        return None; // a zombie has exited already
    }
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// CPU time (user + system, in ms) and resident memory (bytes) of a
/// process, from /proc/PID/stat and /proc/PID/statm; None when it is gone.
pub fn usage(pid: u32) -> Option<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    // SAFETY: sysconf only reads configuration values.
    let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    parse_usage(&stat, &statm, ticks.max(1) as u64, page.max(1) as u64)
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_ms: u64,
    pub rss_bytes: u64,
}

impl std::ops::Add for Usage {
    type Output = Usage;
    fn add(self, o: Usage) -> Usage {
        Usage { cpu_ms: self.cpu_ms + o.cpu_ms, rss_bytes: self.rss_bytes + o.rss_bytes }
    }
}

fn parse_usage(stat: &str, statm: &str, ticks_per_sec: u64, page: u64) -> Option<Usage> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: state(3) … utime(14) stime(15).
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(Usage { cpu_ms: (utime + stime) * 1000 / ticks_per_sec, rss_bytes: resident * page })
}

pub fn signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: kill has no memory effects; the pid is a plain number.
    if unsafe { libc::kill(pid as libc::pid_t, signal) } == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Waits until a process that is not our child exits.
pub async fn wait_foreign_exit(pid: u32) -> io::Result<()> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ESRCH) { Ok(()) } else { Err(e) };
    }
    // SAFETY: fd is a fresh descriptor we own; the AsyncFd owns it until it
    // is dropped and nothing else closes or replaces it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)? };
    // A pidfd becomes readable when the process exits.
    let _ = fd.readable().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_a_start_time() {
        assert!(start_ticks(std::process::id()).is_some());
        assert!(start_ticks(u32::MAX - 1).is_none());
    }

    #[test]
    fn usage_is_read_past_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 123 1000 10";
        let got = parse_usage(stat, "2500 300 100 1 0 200 0", 100, 4096).unwrap();
        assert_eq!(got, Usage { cpu_ms: 3000, rss_bytes: 300 * 4096 });
        assert_eq!(parse_usage("garbage", "1 2", 100, 4096), None);
        let own = usage(std::process::id()).expect("own usage");
        assert!(own.rss_bytes > 0);
    }

    #[tokio::test]
    async fn foreign_exit_is_seen() {
        let mut child = std::process::Command::new("sleep").arg("0.2").spawn().expect("sleep");
        let pid = child.id();
        wait_foreign_exit(pid).await.expect("pidfd");
        child.wait().expect("reap");
    }
}
