//! FUSE over io_uring: the kernel hands requests to entries the server
//! registered on a ring, and one command both answers an entry's request and
//! hands the entry back for the next (no `read` and `writev` per request).
//!
//! One ring on the engine's runtime serves every kernel queue (there is one
//! queue per possible CPU; the kernel puts a request on the queue of the CPU
//! that issued it, and switches to the ring only once every queue has
//! entries). Completions arrive through an eventfd on tokio's reactor, like
//! the replica's disk ring. The kernel copies each request into an entry's
//! buffers from task work on this thread, so the buffers are only ever
//! touched by this process while the entry is in its hands.
//!
//! On a current-thread runtime (the engine's), the ring defers that task
//! work (`IORING_SETUP_DEFER_TASKRUN`): the kernel then fills entries only
//! inside this thread's own `io_uring_enter`, never on some other return to
//! user space, so right after an enter and a full reap the server knows
//! every entry that holds a request, and can give the others' payload pages
//! back (see `trim`).
//!
//! Requests the kernel does not route through the ring (interrupts, forgets)
//! still come on `/dev/fuse`, which [`super::Mount::serve`] goes on reading.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use tokio::io::unix::AsyncFd;

use super::abi::{self, Request, ring};
use super::trim;

/// Entries per kernel queue: the most requests one CPU's queue holds in
/// the server's hands at once (the loop device's queue depth is 128 across
/// all queues; past this, requests wait in the kernel for an entry).
pub const DEPTH: usize = 32;

/// Offset of `len` in `struct io_uring_sqe` (the io-uring crate leaves it
/// unset for commands; FUSE reads its two iovecs from `addr`, `len`).
const SQE_LEN_AT: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("create io_uring: {0}")]
    Create(std::io::Error),
    #[error("map the ring entries' memory: {0}")]
    Memory(std::io::Error),
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
    #[error("submit FUSE ring entries: {0}")]
    Submit(std::io::Error),
}

/// The entries' memory, shared with the kernel: one mapping of a memfd
/// (named [`MEMORY_NAME`]) with every entry's header, then every entry's
/// payload. Pages are faulted in
/// only as requests fill them (4 KiB I/O touches one page of an entry's
/// payload), so room for the largest request costs nothing until used; a
/// burst of large requests leaves up to the whole mapping resident.
///
/// Pages go back only on a ring with deferred task work, and only for
/// entries the kernel holds, right after an enter and a reap (`Ring::trim`).
/// Without deferral the kernel copies a request into an entry from task
/// work that runs on any return to user space (after an interrupt too), and
/// the request then sits in the entry until its completion is reaped: no
/// moment is safe. (A periodic `madvise` on such a ring made fio verify fail
/// once in the suite's online-resize test: a write's data read as zeros.)
struct Memory {
    base: *mut u8,
    len: usize,
    count: usize,
    payload_len: usize,
    /// Each entry's two iovecs (header, payload), which REGISTER points at.
    iov: Box<[[libc::iovec; 2]]>,
}

impl Memory {
    fn new(count: usize, payload_len: usize) -> std::io::Result<Memory> {
        let headers = (count * ring::HEADER).next_multiple_of(4096);
        let len = headers + count * payload_len;
        // A memfd, not anonymous memory, so the mapping has a name in
        // /proc/PID/smaps (this kernel lacks named anonymous mappings).
        // SAFETY: a NUL-terminated name; the fd is checked below.
        let fd = unsafe { libc::memfd_create(MEMORY_NAME.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new fd that nothing else owns.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        // Sparse: pages are allocated only as entries fill them.
        file.set_len(len as u64)?;
        // SAFETY: a shared mapping of the memfd; checked below. The mapping
        // keeps the memory after the fd closes.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = base as *mut u8;
        let iov = (0..count)
            .map(|i| {
                // SAFETY: both offsets lie inside the mapping.
                let (header, payload) = unsafe { (base.add(i * ring::HEADER), base.add(headers + i * payload_len)) };
                [
                    libc::iovec { iov_base: header.cast(), iov_len: ring::HEADER },
                    libc::iovec { iov_base: payload.cast(), iov_len: payload_len },
                ]
            })
            .collect();
        Ok(Memory { base, len, count, payload_len, iov })
    }

    /// Gives entry `i`'s payload pages back: they read as zeros after.
    ///
    /// # Safety
    /// Only while neither the kernel nor a borrow uses the payload.
    unsafe fn drop_payload(&self, i: usize) -> std::io::Result<()> {
        let [_, payload] = self.iov[i];
        // SAFETY: the range is entry i's payload inside the live mapping,
        // page aligned (the payloads start on a page and are multiples of it).
        // MADV_REMOVE frees the memfd's pages, not only this mapping of them.
        let rc = unsafe { libc::madvise(payload.iov_base, self.payload_len, libc::MADV_REMOVE) };
        if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
    }

    /// Entry `i`'s header and payload.
    ///
    /// # Safety
    /// Only while the entry is out of the kernel's hands, and one borrow of
    /// an entry at a time.
    #[allow(clippy::mut_from_ref)]
    unsafe fn entry(&self, i: usize) -> (&mut [u8], &mut [u8]) {
        assert!(i < self.count, "entry {i} of {}", self.count);
        let [header, payload] = self.iov[i];
        // SAFETY: the iovecs name disjoint ranges of the live mapping.
        unsafe {
            (
                std::slice::from_raw_parts_mut(header.iov_base.cast(), header.iov_len),
                std::slice::from_raw_parts_mut(payload.iov_base.cast(), self.payload_len),
            )
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

struct Inner {
    uring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// The entries' memory; entry i serves kernel queue `i / DEPTH`.
    memory: Option<Memory>,
    /// Entries in the kernel's or the server's hands (not yet ended by an
    /// error completion).
    live: usize,
    /// Whether the serving task was woken to submit the answers pushed
    /// since the last submit (they are the submission queue's entries).
    submit_requested: bool,
    /// Completions reaped while registering, not yet served.
    early: Vec<(usize, i32)>,
    /// Task work is deferred to this thread's enters (see the module doc);
    /// only then are payload pages given back.
    deferred: bool,
    /// Each entry's state, for trimming.
    uses: Vec<trim::Use>,
    last_large: std::time::Instant,
}

// SAFETY: the mapping is owned by Inner and used under the mutex; the ring
// itself is Send.
unsafe impl Send for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.live > 0 {
            // The kernel may still copy a request into an entry it holds
            // (from task work on this thread) until it cancels the entry:
            // its memory must outlive that.
            tracing::warn!(entries = self.live, "FUSE ring dropped with entries in the kernel; keeping their memory");
            std::mem::forget(self.memory.take());
        }
    }
}

impl Inner {
    /// Submits what is queued. On a deferred ring this also runs the
    /// kernel's task work: it fills entries with requests and posts their
    /// completions in this call.
    fn submit(&mut self) -> std::io::Result<usize> {
        if !self.deferred {
            return self.uring.submit();
        }
        let queued = self.uring.submission().len() as u32;
        // SAFETY: no signal mask or timeout argument is passed.
        unsafe { self.uring.submitter().enter::<libc::sigset_t>(queued, 0, ENTER_GETEVENTS, None) }
    }

    /// Entry `index` took `bytes` of payload; it is now in the server's
    /// hands (`busy`) or its answer is queued for the kernel.
    fn used(&mut self, index: usize, bytes: usize, busy: bool) {
        let u = &mut self.uses[index];
        u.busy = busy;
        u.touched = u.touched.max(bytes);
        if bytes > trim::PAGE {
            self.last_large = std::time::Instant::now();
        }
    }

    fn activity(&mut self, reaped: bool) -> trim::Activity {
        trim::Activity { last_large: self.last_large, reaped, unsubmitted: !self.uring.submission().is_empty() }
    }
}

/// The ring a mount's requests arrive on.
pub struct Ring {
    inner: Mutex<Inner>,
    event: AsyncFd<OwnedFd>,
    /// Wakes the serving task to submit answers (after the tasks already
    /// runnable, so one `io_uring_enter` carries a burst of answers).
    submit: tokio::sync::Notify,
    /// `/dev/fuse`, kept open as long as commands go to it.
    channel: super::Channel,
}

/// Where the answer to a request that came on the ring goes (answered
/// once: `answer` takes it).
pub struct Slot {
    ring: Arc<Ring>,
    index: usize,
    unique: u64,
}

fn command(
    fuse: RawFd,
    cmd_op: u32,
    req: [u8; 80],
    index: usize,
    iov: Option<*mut [libc::iovec; 2]>,
) -> squeue::Entry128 {
    let mut op = opcode::UringCmd80::new(types::Fd(fuse), cmd_op).cmd(req);
    if let Some(iov) = iov {
        op = op.addr(Some(iov as u64));
    }
    let sqe = op.build().user_data(index as u64);
    if iov.is_none() {
        return sqe;
    }
    // SAFETY: Entry128 is repr(C) over the kernel's 128-byte SQE; `len` is
    // the u32 at byte 24 of `struct io_uring_sqe`.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[SQE_LEN_AT..SQE_LEN_AT + 4].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: the same bytes back into the same type.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// `IORING_ENTER_GETEVENTS` (the io-uring crate keeps its constant private).
const ENTER_GETEVENTS: u32 = 1;

/// The entries' memory as /proc/PID/smaps names it: `/memfd:` this
/// ` (deleted)`.
pub const MEMORY_NAME: &std::ffi::CStr = c"ironhorn-fuse-ring";

const ENABLE: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns on the fuse module's `enable_uring` parameter if the kernel has it
/// and it is off. It only makes the kernel offer io_uring at INIT; servers
/// that do not register entries go on with `/dev/fuse` as before. Returns
/// whether the kernel now offers it.
pub fn enable_in_kernel() -> bool {
    match std::fs::read_to_string(ENABLE) {
        Ok(v) if v.trim() == "Y" => true,
        Ok(_) => match std::fs::write(ENABLE, "Y") {
            Ok(()) => {
                tracing::info!("turned on the fuse module's enable_uring");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot turn on {ENABLE}; FUSE requests come on /dev/fuse");
                false
            }
        },
        // Built without CONFIG_FUSE_IO_URING (or an older kernel).
        Err(_) => false,
    }
}

/// The kernel queue entry `index` serves.
fn qid(index: usize) -> u16 {
    (index / DEPTH) as u16
}

/// Kernel queues: one per possible CPU.
pub fn queues() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.max(1) as usize
}

/// A ring whose entries went to the kernel.
pub struct Registered {
    pub ring: Arc<Ring>,
    /// Why the kernel refused some entries: it then keeps sending on
    /// `/dev/fuse`. The ring must still be served, for requests the kernel
    /// put in the entries it took.
    pub refused: Option<std::io::Error>,
}

impl Ring {
    /// Registers `DEPTH` entries on each of `queues` kernel queues, each able
    /// to carry `payload_len` bytes (the kernel wants room for its largest
    /// request: max_write, max_pages). Call after the INIT answer.
    pub fn start(channel: super::Channel, queues: usize, payload_len: usize) -> Result<Registered, RingError> {
        let fuse = channel.fd.get_ref().as_raw_fd();
        let count = queues * DEPTH;
        // Deferred task work needs every enter to come from this thread: a
        // current-thread runtime keeps the serving task on it.
        let deferred = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        let mut builder = IoUring::<squeue::Entry128, cqueue::Entry>::builder();
        if deferred {
            builder.setup_single_issuer().setup_defer_taskrun();
        }
        let uring = builder.build(count.next_power_of_two() as u32).map_err(RingError::Create)?;
        // SAFETY: eventfd returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(RingError::EventFd(std::io::Error::last_os_error()));
        }
        // SAFETY: a descriptor just created and owned by nothing else.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        uring.submitter().register_eventfd(event.as_raw_fd()).map_err(RingError::EventFd)?;
        // SAFETY: `event` is an OwnedFd that the AsyncFd owns for its whole
        // life, so its raw fd stays open and the same.
        let event = unsafe { AsyncFd::register_with_interest(event, tokio::io::Interest::READABLE) }
            .map_err(|e| RingError::EventFd(e.into_parts().1))?;
        let memory = Memory::new(count, payload_len).map_err(RingError::Memory)?;
        let mut inner = Inner {
            uring,
            memory: None,
            live: 0,
            submit_requested: false,
            early: Vec::new(),
            deferred,
            uses: vec![trim::Use::default(); count],
            last_large: std::time::Instant::now(),
        };
        for (index, iov) in memory.iov.iter().enumerate() {
            let iov = iov as *const [libc::iovec; 2] as *mut [libc::iovec; 2];
            let sqe = command(fuse, ring::CMD_REGISTER, ring::cmd_req(0, qid(index)), index, Some(iov));
            // SAFETY: the iovecs and the buffers they name live as long as
            // the ring (or are leaked with it, see Inner's Drop).
            unsafe { inner.uring.submission().push(&sqe) }.expect("the ring has room for every entry");
        }
        inner.memory = Some(memory);
        inner.live = count;
        inner.submit().map_err(RingError::Submit)?;
        // A refused registration completes at once with its error. The
        // registrations that made the ring ready may already carry requests:
        // those are kept for `serve`.
        let mut refused = None;
        let done: Vec<(usize, i32)> =
            inner.uring.completion().map(|cqe| (cqe.user_data() as usize, cqe.result())).collect();
        for (index, result) in done {
            if result < 0 {
                inner.live -= 1;
                refused.get_or_insert(std::io::Error::from_raw_os_error(-result));
            } else {
                inner.early.push((index, result));
            }
        }
        let ring = Arc::new(Ring { inner: Mutex::new(inner), event, submit: tokio::sync::Notify::new(), channel });
        Ok(Registered { ring, refused })
    }

    /// Takes the requests the kernel has put in entries, until every entry
    /// has ended (the mount is gone). `handle` answers each through its slot.
    pub async fn serve(self: Arc<Self>, handle: impl Fn(Request, Slot)) {
        let mut look_again = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(look_again.unwrap_or_else(std::time::Instant::now).into()), if look_again.is_some() => {}
                ready = self.event.readable() => {
                    let Ok(mut ready) = ready else { return };
                    let mut counter = [0u8; 8];
                    // Clear the eventfd first: completions after this re-arm it.
                    // SAFETY: reading 8 bytes into a local buffer.
                    let _ = unsafe { libc::read(self.event.get_ref().as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
                    ready.clear_ready();
                }
                _ = self.submit.notified() => {}
            }
            self.submit_answers();
            let (arrived, live) = self.take();
            // Right after the enter and the reap: see `trim`.
            look_again = self.trim(!arrived.is_empty());
            for (index, unique, request) in arrived {
                let slot = Slot { ring: self.clone(), index, unique };
                match request {
                    Ok(request) => handle(request, slot),
                    Err(e) => {
                        tracing::error!(error = %e, "malformed FUSE request on the ring");
                        slot.answer(-libc::EIO, &[]);
                    }
                }
            }
            if live == 0 {
                tracing::info!("FUSE ring ended");
                return;
            }
        }
    }

    /// Submits the answers pushed since the last call; on a deferred ring
    /// also runs the kernel's task work, which fills entries with requests.
    fn submit_answers(&self) {
        let mut inner = self.inner.lock().expect("FUSE ring poisoned");
        inner.submit_requested = false;
        // A deferred ring enters even with nothing queued, for its task work.
        if !inner.deferred && inner.uring.submission().is_empty() {
            return;
        }
        if let Err(e) = inner.submit() {
            tracing::error!(error = %e, "FUSE ring submit failed");
        }
        if !inner.uring.submission().is_empty() {
            inner.submit_requested = true;
            self.submit.notify_one();
        }
    }

    /// Gives back the payload pages of entries the kernel holds, once large
    /// payloads have stopped (`trim::decide`), and says when an idle ring
    /// should look again. Called right after an enter
    /// and a reap with nothing in between: the kernel fills an entry only
    /// inside this thread's enters and posts its completion in the same
    /// call, so every entry holding a request was just reaped (busy), and an
    /// entry not busy holds nothing until the next enter. `reaped`: the reap
    /// took requests (then nothing is trimmed this time).
    fn trim(&self, reaped: bool) -> Option<std::time::Instant> {
        let mut inner = self.inner.lock().expect("FUSE ring poisoned");
        if !inner.deferred {
            return None;
        }
        let activity = inner.activity(reaped);
        let decision = trim::decide(&inner.uses, &activity, std::time::Instant::now());
        if decision.trim.is_empty() {
            return decision.look_again;
        }
        let plan = decision.trim;
        let Some(memory) = inner.memory.as_ref() else { return None };
        let mut given = 0;
        for &i in &plan {
            // SAFETY: entry i is in the kernel's hands waiting for a request,
            // which it can only copy in during a later enter of ours.
            match unsafe { memory.drop_payload(i) } {
                Ok(()) => given += 1,
                Err(e) => tracing::warn!(entry = i, error = %e, "madvise of a FUSE ring entry failed"),
            }
        }
        for &i in &plan {
            inner.uses[i].touched = 0;
        }
        tracing::debug!(entries = given, "gave FUSE ring entries' payload pages back");
        decision.look_again
    }

    /// Reaps completions: the requests now in entries, and the entries live.
    #[allow(clippy::type_complexity)]
    fn take(&self) -> (Vec<(usize, u64, Result<Request, abi::ParseError>)>, usize) {
        let mut inner = self.inner.lock().expect("FUSE ring poisoned");
        let mut arrived = Vec::new();
        let mut done = std::mem::take(&mut inner.early);
        done.extend(inner.uring.completion().map(|cqe| (cqe.user_data() as usize, cqe.result())));
        for (index, result) in done {
            if result < 0 {
                // The mount is going (ENOTCONN, ECONNABORTED): the entry is over.
                inner.live -= 1;
                let e = std::io::Error::from_raw_os_error(-result);
                tracing::debug!(index, error = %e, "FUSE ring entry ended");
                continue;
            }
            let memory = inner.memory.as_ref().expect("entries' memory while entries are live");
            // SAFETY: a completion hands the entry back to the server.
            let (header, payload) = unsafe { memory.entry(index) };
            let unique = ring::commit_id(header);
            let size = ring::payload_size(header).min(payload.len());
            let request = abi::parse_ring(&header[ring::IN_OUT], &header[ring::OP_IN], &payload[..size]);
            arrived.push((index, unique, request));
            inner.used(index, size, true);
        }
        (arrived, inner.live)
    }
}

impl Slot {
    /// The answer `payload` (error 0) or a negative errno; hands the entry
    /// back to the kernel for the next request.
    pub fn answer(self, error: i32, payload: &[u8]) {
        let mut inner = self.ring.inner.lock().expect("FUSE ring poisoned");
        let memory = inner.memory.as_ref().expect("entries' memory while entries are live");
        // SAFETY: the entry is the server's until this command is submitted.
        let (header, room) = unsafe { memory.entry(self.index) };
        let (error, payload) = if payload.len() > room.len() {
            tracing::error!(len = payload.len(), room = room.len(), "FUSE answer larger than its ring entry");
            (-libc::EIO, &[][..])
        } else {
            (error, payload)
        };
        room[..payload.len()].copy_from_slice(payload);
        ring::set_answer(header, self.unique, error, payload.len());
        inner.used(self.index, payload.len(), false);
        let fuse = self.ring.channel.fd.get_ref().as_raw_fd();
        let sqe =
            command(fuse, ring::CMD_COMMIT_AND_FETCH, ring::cmd_req(self.unique, qid(self.index)), self.index, None);
        // SAFETY: as in `start`: the entry's memory outlives the command.
        if unsafe { inner.uring.submission().push(&sqe) }.is_err() {
            // Cannot happen: one SQE per entry, and an entry has one command at a time.
            tracing::error!("FUSE ring full");
            return;
        }
        if !inner.submit_requested {
            inner.submit_requested = true;
            self.ring.submit.notify_one();
        }
    }
}
