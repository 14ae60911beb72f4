//! How the data processes' allocator treats large buffers.
//!
//! glibc's malloc serves a request above its mmap threshold (128 KiB at
//! first, raised to the size of each such block freed, up to 32 MiB) with
//! a fresh `mmap`, and gives the top of the heap back to the kernel once
//! more than its trim threshold (twice the mmap threshold) lies free there.
//! A data path that moves 1 MiB messages (a rebuild's chunks, a batch of
//! writes) with several in flight lands on both edges: each buffer's pages
//! were faulted in and zeroed by the kernel, then unmapped or trimmed, and
//! faulted in again for the next. Measured on a full rebuild, the engine
//! spent half its CPU in page faults, page clearing and `munmap`
//! (1.45 ms of CPU per MiB copied; 0.72 with the settings below).
//!
//! [`tune`] fixes both thresholds: buffers up to [`MMAP_THRESHOLD`] come
//! from the heap and their pages are reused, and up to [`TRIM_THRESHOLD`]
//! of free heap top is kept while I/O goes on. [`spawn_trimmer`] gives
//! what was kept back to the kernel every few seconds, so an idle engine or
//! replica holds only what it uses.

use std::time::Duration;

/// Allocations up to this size come from the heap.
pub const MMAP_THRESHOLD: usize = 16 << 20;
/// Free heap top kept for reuse while the process works.
pub const TRIM_THRESHOLD: usize = 64 << 20;
/// How often a process gives its free heap back (one `malloc_trim`).
pub const TRIM_INTERVAL: Duration = Duration::from_secs(10);

/// Sets the thresholds; call before the data path starts. A no-op on
/// platforms other than glibc.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; any value is valid.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int);
    }
}

/// Spawns the task that returns free heap to the kernel every
/// [`TRIM_INTERVAL`] (a few µs when there is nothing to return).
pub fn spawn_trimmer() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::spawn(async {
        let mut tick = tokio::time::interval(TRIM_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // SAFETY: malloc_trim only releases free memory.
            unsafe { libc::malloc_trim(0) };
        }
    });
}
