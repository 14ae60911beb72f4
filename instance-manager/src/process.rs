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

    #[tokio::test]
    async fn foreign_exit_is_seen() {
        let mut child = std::process::Command::new("sleep").arg("0.2").spawn().expect("sleep");
        let pid = child.id();
        wait_foreign_exit(pid).await.expect("pidfd");
        child.wait().expect("reap");
    }
}
