//! Fault injection for the store's device: tests switch faults on and off
//! while the store runs, and every read, write and sync of the device passes
//! through here first.
//!
//! A [`Fault`] names which operations it hits (reads, writes, syncs), after
//! how many matching operations it starts (`skip`), how many it hits
//! (`times`, 0 = until cleared) and what it does: fail with EIO or ENOSPC,
//! write only the first half of a buffer and then fail (a torn write), or
//! delay the operation. With no fault armed the cost is one relaxed load.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    Read,
    Write,
    Sync,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// The operation fails with EIO and does nothing.
    Eio,
    /// The operation fails with ENOSPC and does nothing.
    NoSpace,
    /// A write puts its first half on the device, then fails with EIO.
    /// (Reads and syncs hit by it fail with EIO.)
    Torn,
    /// The operation runs after this delay.
    Delay(Duration),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub ops: Vec<FaultOp>,
    /// Matching operations that pass before the fault fires.
    pub skip: u64,
    /// Matching operations it fires on; 0 means until cleared.
    pub times: u64,
    pub action: FaultAction,
}

impl Fault {
    pub fn new(ops: &[FaultOp], action: FaultAction) -> Self {
        Self { ops: ops.to_vec(), skip: 0, times: 0, action }
    }
    pub fn skip(mut self, n: u64) -> Self {
        self.skip = n;
        self
    }
    pub fn times(mut self, n: u64) -> Self {
        self.times = n;
        self
    }
}

struct Armed {
    fault: Fault,
    seen: u64,
    fired: u64,
}

/// What the device must do with one operation.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Run,
    Fail(i32),
    /// Write the first half, then fail.
    Torn,
}

#[derive(Default)]
pub struct Faults {
    any: AtomicBool,
    armed: Mutex<Vec<Armed>>,
}

impl Faults {
    /// Arms `fault` beside any already armed.
    pub fn arm(&self, fault: Fault) {
        let mut armed = self.armed.lock().expect("faults");
        armed.push(Armed { fault, seen: 0, fired: 0 });
        self.any.store(true, Ordering::Release);
    }

    pub fn clear(&self) {
        self.armed.lock().expect("faults").clear();
        self.any.store(false, Ordering::Release);
    }

    /// How many times armed faults have fired so far.
    pub fn fired(&self) -> u64 {
        self.armed.lock().expect("faults").iter().map(|a| a.fired).sum()
    }

    /// Decides one operation; sleeps here for a delay fault.
    pub async fn check(&self, op: FaultOp) -> Verdict {
        if !self.any.load(Ordering::Acquire) {
            return Verdict::Run;
        }
        let mut delay = Duration::ZERO;
        let mut verdict = Verdict::Run;
        {
            let mut armed = self.armed.lock().expect("faults");
            for a in armed.iter_mut().filter(|a| a.fault.ops.contains(&op)) {
                a.seen += 1;
                let live = a.seen > a.fault.skip && (a.fault.times == 0 || a.fired < a.fault.times);
                if !live {
                    continue;
                }
                a.fired += 1;
                match a.fault.action {
                    FaultAction::Delay(d) => delay += d,
                    FaultAction::Eio if verdict == Verdict::Run => verdict = Verdict::Fail(libc::EIO),
                    FaultAction::NoSpace if verdict == Verdict::Run => verdict = Verdict::Fail(libc::ENOSPC),
                    FaultAction::Torn if verdict == Verdict::Run => {
                        verdict = if op == FaultOp::Write { Verdict::Torn } else { Verdict::Fail(libc::EIO) }
                    }
                    _ => {}
                }
            }
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        verdict
    }
}

/// The error an injected failure returns.
pub fn injected(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fault_fires_on_the_nth_matching_operation_for_its_count() {
        let faults = Faults::default();
        faults.arm(Fault::new(&[FaultOp::Sync], FaultAction::Eio).skip(2).times(1));
        assert_eq!(faults.check(FaultOp::Write).await, Verdict::Run, "writes are not matched");
        assert_eq!(faults.check(FaultOp::Sync).await, Verdict::Run);
        assert_eq!(faults.check(FaultOp::Sync).await, Verdict::Run);
        assert_eq!(faults.check(FaultOp::Sync).await, Verdict::Fail(libc::EIO));
        assert_eq!(faults.check(FaultOp::Sync).await, Verdict::Run, "fired its one time");
        assert_eq!(faults.fired(), 1);
        faults.arm(Fault::new(&[FaultOp::Write], FaultAction::Torn));
        assert_eq!(faults.check(FaultOp::Write).await, Verdict::Torn);
        faults.clear();
        assert_eq!(faults.check(FaultOp::Write).await, Verdict::Run);
    }
}
