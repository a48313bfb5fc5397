//! The log buffer and its flush daemon (Shore-MT §6.2.4; group commit).
//!
//! Inserting a record has three steps, and only the first is a critical section:
//!
//! 1. **claim** (under a mutex): take the next LSN range and make sure the ring has room,
//!    waiting for the flusher if it does not. The claim order is the log order, and commits
//!    claim in commit-request order, so commit order = log order (ELR paper §3.2);
//! 2. **copy** the bytes into the claimed region of the ring, in parallel with other threads;
//! 3. **release** in LSN order: wait until every earlier claim is released, then publish the new
//!    end (`released`). The flusher only ever writes bytes below `released`.
//!
//! The flush daemon writes `[durable, released)` in place into the current segment file (which
//! it extends with zeros ahead of the log's end, [`ALLOCATE_AHEAD`]), fsyncs, sleeps
//! the configured extra device latency, publishes `durable` and wakes the waiters: every commit
//! that arrived during a flush shares the next one (group commit). A failed write or fsync is
//! fatal for the log: every waiter and every later insert gets the error, and nothing written
//! after it is reported durable.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::record::{frame_salt, mark_flush_start, LogRecord, FLUSH_START, FRAME_HEADER};
use super::segment;
use crate::error::{Error, Result};
use crate::vfs::{on, VFile, Vfs};

/// How the flusher is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlushPolicy {
    /// Flush as soon as anything is released (waiters are waiting).
    Eager,
    /// Flush at least every `delay`, or when the ring is half full.
    Periodic(Duration),
}

/// Settings of a log.
#[derive(Clone)]
pub(crate) struct LogConfig {
    pub vfs: Arc<dyn Vfs>,
    pub dir: PathBuf,
    pub capacity: usize,
    pub segment_size: u64,
    pub extra_latency: Duration,
    pub policy: FlushPolicy,
}

/// The ring's bytes, reached only through raw pointers: threads copy into and out of
/// disjoint ranges at once, so no reference to the whole ring may exist while they do (one
/// would alias the others' writes).
struct Ring {
    ptr: *mut u8,
    len: usize,
}

impl Ring {
    fn new(len: usize) -> Ring {
        let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()).cast::<u8>();
        Ring { ptr, len }
    }

    /// The bytes `pos..pos + n`.
    ///
    /// # Safety
    /// The range lies inside the ring, and nobody writes it while the slice lives.
    unsafe fn bytes(&self, pos: usize, n: usize) -> &[u8] {
        debug_assert!(pos + n <= self.len);
        // SAFETY: in bounds and unwritten meanwhile (the caller's contract); `ptr` is the
        // live allocation of `len` initialized bytes made in `new`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(pos), n) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are the boxed slice `new` leaked, freed only here.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

// SAFETY: the ring owns its allocation (freed in `Drop`), so it may move to another thread.
unsafe impl Send for Ring {}

// SAFETY: threads only touch disjoint byte ranges of the ring, as the claim/release protocol
// documented on `LogShared` guarantees; the atomics `released` and `durable` order the writes
// of one thread before the reads of another.
unsafe impl Sync for Ring {}

struct ClaimState {
    next: u64,
}

/// State shared by inserters and the flush daemon.
///
/// Invariants: `durable <= released <= claim.next`, `claim.next - durable <= capacity`.
/// Bytes of LSN range `[released, claim.next)` belong to their claimers until released; bytes
/// of `[durable, released)` are read only by the flusher; the ring position of LSN `x` is
/// reused for LSN `x + capacity` only once `durable > x`.
pub(crate) struct LogShared {
    ring: Ring,
    cap: usize,
    claim: Mutex<ClaimState>,
    released: AtomicU64,
    durable: AtomicU64,
    /// Set once, when a write or fsync fails; read by every operation of every transaction,
    /// so it sits on a cache line of its own.
    failed: crossbeam_utils::CachePadded<AtomicBool>,
    failure: Mutex<Option<String>>,
    /// Inserters waiting for ring space sleep here (waiters for `durable` register a
    /// callback instead, see `park_until_durable`).
    wait_lock: Mutex<()>,
    durable_cv: Condvar,
    /// The flusher sleeps here.
    work_lock: Mutex<bool>,
    work_cv: Condvar,
    shutdown: AtomicBool,
    dir: PathBuf,
    flushes: AtomicU64,
    /// Work to run once the log is durable up to an LSN (pipelined commits, waiting
    /// committers), in registration order.
    callbacks: Mutex<Vec<(u64, OnDurable)>>,
}

/// Called once with the outcome when a record becomes durable (or the log fails).
pub(crate) type DurableCallback = Box<dyn FnOnce(std::result::Result<(), String>) + Send>;

/// Like [`DurableCallback`], for a waiting thread: returns the thread to wake, if any. The
/// flusher runs every such callback of a flush first and wakes the threads they name only
/// after all of them ran, in one batch: a woken committer that preempted the flusher half
/// way would hold up the others and the next flush.
pub(crate) type DurableWake =
    Box<dyn FnOnce(std::result::Result<(), String>) -> Option<std::thread::Thread> + Send>;

/// What to do once the log is durable up to an LSN.
pub(crate) enum OnDurable {
    /// Run this (on the flusher's thread).
    Run(DurableCallback),
    /// Run this and wake the thread it returns, after the whole batch.
    Wake(DurableWake),
    /// A synchronous commit's thread, to queue for an admission slot (see
    /// `admission::commit`): the case of nearly every commit past the cores, so it comes
    /// without a boxed callback; with its state in the waiter, which its thread reuses,
    /// the commit allocates nothing (it allocated three objects before, each freed by the
    /// flusher's thread).
    Requeue(Arc<crate::admission::Gate>, Arc<crate::admission::Waiter>),
}

impl OnDurable {
    /// Runs the callback; a thread to wake goes to `wake`.
    fn fire(self, res: std::result::Result<(), String>, wake: &mut Vec<std::thread::Thread>) {
        match self {
            OnDurable::Run(cb) => cb(res),
            OnDurable::Wake(cb) => wake.extend(cb(res)),
            OnDurable::Requeue(gate, me) => {
                wake.extend(crate::admission::requeue_durable(&gate, &me, res.is_ok()));
            }
        }
    }
}

/// Runs a batch of callbacks with one outcome: the waking ones first, then the others, then
/// the wake-ups.
fn fire_all(batch: Vec<OnDurable>, res: std::result::Result<(), String>) {
    let mut wake = Vec::new();
    let (waking, running): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .partition(|cb| matches!(cb, OnDurable::Wake(_) | OnDurable::Requeue(..)));
    for cb in waking.into_iter().chain(running) {
        cb.fire(res.clone(), &mut wake);
    }
    for t in wake {
        t.unpark();
    }
}

impl LogShared {
    fn fail_error(&self) -> Error {
        let msg = self
            .failure
            .lock()
            .clone()
            .unwrap_or_else(|| "log failed".to_string());
        Error::Io {
            path: self.dir.clone(),
            source: std::io::Error::other(format!(
                "the log failed ({msg}); this handle refuses further work: reopen the \
                 database to recover"
            )),
        }
    }

    /// Copies `src` into the ring at the positions of LSN `at` onwards (wrapping around).
    ///
    /// # Safety
    /// The caller owns `[at, at + src.len())`: claimed, not yet released.
    unsafe fn copy_in(&self, at: u64, src: &[u8]) {
        let start = (at % self.cap as u64) as usize;
        let first = src.len().min(self.cap - start);
        // SAFETY: both ranges lie inside the ring (`first <= cap - start`, and the rest is
        // shorter than `cap` because a record is at most `cap` bytes); the caller owns them.
        unsafe {
            let base = self.ring.ptr;
            std::ptr::copy_nonoverlapping(src.as_ptr(), base.add(start), first);
            if first < src.len() {
                std::ptr::copy_nonoverlapping(src.as_ptr().add(first), base, src.len() - first);
            }
        }
    }

    /// Marks the frame at LSN `at` as the first of a flush (`record::mark_flush_start`).
    ///
    /// # Safety
    /// The caller is the flusher, `at` is the start of a frame lying wholly in
    /// `[durable, released)`: its inserter has released it and nobody else touches it.
    unsafe fn mark_flush_start(&self, at: u64) {
        // Through a copy (one record, once per flush): the frame may wrap around the ring.
        let mut head = [0u8; FRAME_HEADER];
        // SAFETY: the header's bytes belong to the flusher alone (see above).
        unsafe { self.copy_out(at, &mut head) };
        let len =
            (u32::from_le_bytes([head[0], head[1], head[2], head[3]]) & !FLUSH_START) as usize;
        let mut frame = vec![0u8; (FRAME_HEADER + len).min(self.cap)];
        // SAFETY: as above, for the whole frame.
        unsafe { self.copy_out(at, &mut frame) };
        mark_flush_start(&mut frame, at);
        // SAFETY: as above.
        unsafe { self.copy_in(at, &frame) };
    }

    /// Copies the bytes of the ring at the positions of LSN `at` onwards (wrapping around)
    /// into `dst`.
    ///
    /// # Safety
    /// Nobody writes `[at, at + dst.len())` meanwhile, and `dst` is at most the ring's size.
    unsafe fn copy_out(&self, at: u64, dst: &mut [u8]) {
        let start = (at % self.cap as u64) as usize;
        let first = dst.len().min(self.cap - start);
        // SAFETY: both source ranges lie inside the ring (`first <= cap - start`, the rest is
        // shorter than `cap`); nobody writes them (the caller's contract).
        unsafe {
            let base = self.ring.ptr.cast_const();
            std::ptr::copy_nonoverlapping(base.add(start), dst.as_mut_ptr(), first);
            if first < dst.len() {
                std::ptr::copy_nonoverlapping(base, dst.as_mut_ptr().add(first), dst.len() - first);
            }
        }
    }

    fn wake_flusher(&self) {
        let mut pending = self.work_lock.lock();
        *pending = true;
        self.work_cv.notify_one();
    }
}

/// The write-ahead log: a ring buffer plus its flush daemon.
pub(crate) struct LogBuffer {
    shared: Arc<LogShared>,
    flusher: Option<std::thread::JoinHandle<()>>,
    /// The LSN the log started at in this run.
    opened_at: u64,
    /// The log already ended with a [`LogRecord::Close`] when this run started: a close
    /// with no record since writes none.
    closed_at_start: bool,
}

impl LogBuffer {
    /// Starts a log whose next record gets LSN `start`, appending to a new segment file that
    /// begins at `start`.
    pub fn start(cfg: LogConfig, start: u64) -> Result<LogBuffer> {
        let cap = cfg.capacity.next_power_of_two().max(1 << 16);
        let shared = Arc::new(LogShared {
            ring: Ring::new(cap),
            cap,
            claim: Mutex::new(ClaimState { next: start }),
            released: AtomicU64::new(start),
            durable: AtomicU64::new(start),
            failed: crossbeam_utils::CachePadded::new(AtomicBool::new(false)),
            failure: Mutex::new(None),
            wait_lock: Mutex::new(()),
            durable_cv: Condvar::new(),
            work_lock: Mutex::new(false),
            work_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            dir: cfg.dir.clone(),
            flushes: AtomicU64::new(0),
            callbacks: Mutex::new(Vec::new()),
        });
        let file = segment::create(&*cfg.vfs, &cfg.dir, start)?;
        let sh = Arc::clone(&shared);
        let flusher = std::thread::Builder::new()
            .name("shoal-log-flusher".into())
            .spawn(move || flusher_main(sh, cfg, file, start))
            .map_err(|source| Error::Io {
                path: PathBuf::from("<log flusher thread>"),
                source,
            })?;
        Ok(LogBuffer {
            shared,
            flusher: Some(flusher),
            opened_at: start,
            closed_at_start: false,
        })
    }

    /// Appends one framed record (encoded at position 0, as [`LogRecord::encode`] does; it is
    /// re-salted for its LSN here); returns its `(lsn, end)`. The record is in the buffer (and
    /// ordered after every earlier insert) when this returns, not yet durable.
    ///
    /// [`LogRecord::encode`]: super::record::LogRecord::encode
    pub fn insert(&self, bytes: &[u8]) -> Result<(u64, u64)> {
        let sh = &*self.shared;
        let len = bytes.len() as u64;
        if bytes.len() > sh.cap || bytes.len() < FRAME_HEADER {
            return Err(Error::Unsupported(format!(
                "a log record of {} bytes does not fit the log buffer ({} bytes)",
                bytes.len(),
                sh.cap
            )));
        }
        // 1. Claim.
        let lsn = {
            let mut c = sh.claim.lock();
            loop {
                if sh.failed.load(Ordering::Acquire) {
                    return Err(sh.fail_error());
                }
                if c.next + len - sh.durable.load(Ordering::Acquire) <= sh.cap as u64 {
                    break;
                }
                // Ring full: let the flusher make room. Holding the claim mutex keeps the
                // claim order FIFO; everyone behind us would wait for space anyway.
                sh.wake_flusher();
                let mut g = sh.wait_lock.lock();
                if c.next + len - sh.durable.load(Ordering::Acquire) > sh.cap as u64 {
                    sh.durable_cv.wait_for(&mut g, Duration::from_millis(1));
                }
            }
            let lsn = c.next;
            c.next += len;
            lsn
        };
        // 2. Copy, outside any critical section; the checksum gets the salt of the LSN.
        let mut header = [0u8; FRAME_HEADER];
        header.copy_from_slice(&bytes[..FRAME_HEADER]);
        let crc =
            u32::from_le_bytes([header[4], header[5], header[6], header[7]]) ^ frame_salt(lsn);
        header[4..8].copy_from_slice(&crc.to_le_bytes());
        // SAFETY: `[lsn, lsn + len)` was claimed by this thread alone; its ring positions are
        // free because `lsn + len - durable <= cap` (checked under the claim mutex, and
        // `durable` only grows), and the flusher reads only below `released <= lsn`.
        unsafe {
            sh.copy_in(lsn, &header);
            sh.copy_in(lsn + FRAME_HEADER as u64, &bytes[FRAME_HEADER..]);
        }
        // 3. Release in LSN order.
        let mut spins = 0u32;
        while sh.released.load(Ordering::Acquire) != lsn {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        sh.released.store(lsn + len, Ordering::Release);
        Ok((lsn, lsn + len))
    }

    /// Tells the log that it ended with a clean close's record when it was opened (so a
    /// close with no record since need not write another).
    pub fn set_closed_at_start(&mut self) {
        self.closed_at_start = true;
    }

    /// Fails once the log has failed: a failed write or fsync leaves the log unusable, and
    /// the database refuses every later operation (what is in memory may include commits
    /// that will never be durable). Reopening the database recovers.
    pub fn check(&self) -> Result<()> {
        if self.shared.failed.load(Ordering::Acquire) {
            Err(self.shared.fail_error())
        } else {
            Ok(())
        }
    }

    /// The durable LSN: every record that ends at or below it is on stable storage.
    pub fn durable(&self) -> u64 {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// Asks the flusher to write out everything released so far (queuing a callback or a
    /// waiter does this already).
    #[cfg(test)]
    pub fn request_flush(&self) {
        self.shared.wake_flusher();
    }

    /// The end of the released log: every record below it is in the buffer.
    pub fn released(&self) -> u64 {
        self.shared.released.load(Ordering::Acquire)
    }

    /// Runs `cb` once the log is durable up to `end` (at once if it already is), on the flush
    /// daemon's thread; or with the error if the log fails first.
    pub fn on_durable(&self, end: u64, cb: DurableCallback) {
        self.when_durable(end, OnDurable::Run(cb));
    }

    /// As [`on_durable`](Self::on_durable) for a waiting thread: `cb` returns the thread to
    /// wake, which the flusher wakes after every callback of the flush ran.
    pub fn on_durable_wake(&self, end: u64, cb: DurableWake) {
        self.when_durable(end, OnDurable::Wake(cb));
    }

    /// Queues `me` for a slot of `gate` once the log is durable up to `end` (a synchronous
    /// commit's wait: `admission::commit`), waking it if it is handed one at once; or wakes
    /// it with the failure.
    pub(crate) fn on_durable_requeue(
        &self,
        end: u64,
        gate: Arc<crate::admission::Gate>,
        me: Arc<crate::admission::Waiter>,
    ) {
        self.when_durable(end, OnDurable::Requeue(gate, me));
    }

    fn when_durable(&self, end: u64, cb: OnDurable) {
        let sh = &*self.shared;
        let mut cbs = sh.callbacks.lock();
        // Durable first: a commit made durable by the flush before a failure (a segment
        // rotation that could not create its file) is durable all the same.
        if sh.durable.load(Ordering::Acquire) >= end {
            drop(cbs);
            fire_all(vec![cb], Ok(()));
        } else if sh.failed.load(Ordering::Acquire) {
            drop(cbs);
            fire_all(vec![cb], Err(sh.fail_error().to_string()));
        } else {
            cbs.push((end, cb));
            drop(cbs);
            sh.wake_flusher();
        }
    }

    /// Waits until `end` is durable. A transaction waiting here holds no admission slot
    /// meanwhile and takes one back after the wait (see `admission::commit_wait` for the
    /// commit's own wait, which does better).
    pub fn wait_durable(&self, end: u64) -> Result<()> {
        if self.shared.durable.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        crate::admission::blocking(|| self.park_until_durable(end))
    }

    /// Parks the calling thread until `end` is durable (or the log fails), without touching
    /// admission. The flusher wakes each waiter of a flush itself, one `unpark` per waiter
    /// right after the flush, rather than through a condition variable whose waiters would
    /// wake one another in a chain.
    pub fn park_until_durable(&self, end: u64) -> Result<()> {
        const PENDING: u8 = 0;
        const DONE: u8 = 1;
        const FAILED: u8 = 2;
        let sh = &*self.shared;
        if sh.durable.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        let state = Arc::new(std::sync::atomic::AtomicU8::new(PENDING));
        let me = std::thread::current();
        {
            let state = Arc::clone(&state);
            self.on_durable_wake(
                end,
                Box::new(move |res| {
                    state.store(if res.is_ok() { DONE } else { FAILED }, Ordering::Release);
                    Some(me)
                }),
            );
        }
        loop {
            match state.load(Ordering::Acquire) {
                DONE => return Ok(()),
                FAILED => return Err(sh.fail_error()),
                _ => {}
            }
            // A stray wake-up (another part of the engine parks this thread too) only costs
            // a look at `state`; the timeout is a safety net.
            std::thread::park_timeout(Duration::from_millis(10));
        }
    }

    /// Writes out and fsyncs everything inserted so far.
    pub fn flush(&self) -> Result<()> {
        let end = self.released();
        self.wait_durable(end)
    }

    /// Callbacks and waiting threads registered for a later durable LSN (tests use it to
    /// know that waiters have gathered before they let a flush finish).
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.shared.callbacks.lock().len()
    }

    /// The directory holding the segments.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }
}

impl Drop for LogBuffer {
    fn drop(&mut self) {
        // A clean close ends the log with a flush of its own (`LogRecord::Close`), so that
        // damage to the last flush of records is reported as corruption, not cut as a torn
        // tail (see `segment::replay`). Nothing else inserts any more: every handle is gone.
        let released = self.released();
        let unclosed = released > self.opened_at || !self.closed_at_start;
        if self.check().is_ok() && released > 0 && unclosed {
            // The records before it get a flush of their own first: asynchronous commits
            // not flushed yet would otherwise share the close's flush, the last one, and
            // damage to them would be cut as a torn tail.
            let _ = self.park_until_durable(released);
            if let Ok((_, end)) = self.insert(&LogRecord::Close.encode()) {
                let _ = self.park_until_durable(end);
            }
        }
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake_flusher();
        if let Some(h) = self.flusher.take() {
            let _ = h.join();
        }
    }
}

/// The current segment file as the flusher writes it.
struct Segment {
    file: Box<dyn VFile>,
    /// The LSN at its byte 0.
    start: u64,
    /// How far it is known to hold bytes: the log bytes written to it, then zeros written
    /// ahead of them ([`ALLOCATE_AHEAD`]). After a failed extension the file may be longer.
    allocated: u64,
    /// Set while the file may be longer than `allocated` (an extension failed half way).
    longer: bool,
}

/// How far ahead of the log's end a segment's file is extended with zeros, at most. Appending
/// to a file changes its size, so every fdatasync of an append also writes the file's metadata
/// (the inode, or a journal commit): a second device write; writing over bytes that already
/// exist does not. Measured on this project's machines (fsync about 0.1 ms), an 8 KiB append plus
/// fdatasync took 330-830 µs, the same write in place 120-160 µs. The zeros cost one
/// metadata-changing fdatasync per 4 MiB of log, and a crash leaves a zero tail that recovery
/// reads as the end of the log ([`segment::replay`]).
pub(crate) const ALLOCATE_AHEAD: u64 = 4 << 20;

impl Segment {
    /// Cuts the zeros after the log's end `end` (an LSN), durably: a segment that is not the
    /// last, or the last after a clean shutdown, holds whole records only.
    fn trim(&mut self, end: u64, path: &Path) -> Result<()> {
        let len = end - self.start;
        if self.allocated > len || self.longer {
            self.file.set_len(len).map_err(on("truncate", path))?;
            self.file.sync().map_err(on("fsync", path))?;
            self.allocated = len;
            self.longer = false;
        }
        Ok(())
    }

    /// Makes sure the file holds bytes up to `end` (relative to the segment's start),
    /// writing zeros up to a multiple of `step` past it. On a disk too full for that, it
    /// writes zeros only up to `end` (the flush's own bytes): the log goes on as long as the
    /// disk has room for its records, as an appending log would.
    fn extend(&mut self, end: u64, step: u64, path: &Path) -> Result<()> {
        if end <= self.allocated {
            return Ok(());
        }
        let len = end.div_ceil(step) * step;
        match self.file.allocate(len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull && len > end => {
                self.longer = true;
                self.file.allocate(end).map_err(on("write", path))?;
                self.allocated = end;
                return Ok(());
            }
            Err(e) => {
                self.longer = true;
                return Err(on("write", path)(e));
            }
        }
        self.allocated = len;
        Ok(())
    }
}

/// How long an idle flusher under [`FlushPolicy::Eager`] sleeps before it looks again
/// without being woken.
const IDLE_FLUSHER_WAKE: Duration = Duration::from_millis(100);

fn flusher_main(sh: Arc<LogShared>, cfg: LogConfig, file: Box<dyn VFile>, start: u64) {
    let mut seg = Segment {
        file,
        start,
        allocated: 0,
        longer: false,
    };
    let mut durable = start;
    loop {
        // Wait for work.
        {
            let mut pending = sh.work_lock.lock();
            let timeout = match cfg.policy {
                // Everything that needs a flush wakes the flusher (`wake_flusher`, under
                // `work_lock`, so no wake-up is lost); the timeout is only a safety net, long
                // enough that an idle database does not wake a core 200 times a second.
                FlushPolicy::Eager => IDLE_FLUSHER_WAKE,
                FlushPolicy::Periodic(d) => d,
            };
            if !*pending && !sh.shutdown.load(Ordering::Acquire) {
                let deadline = Instant::now() + timeout;
                while !*pending && !sh.shutdown.load(Ordering::Acquire) {
                    if sh.work_cv.wait_until(&mut pending, deadline).timed_out() {
                        break;
                    }
                }
            }
            *pending = false;
        }
        let released = sh.released.load(Ordering::Acquire);
        if released > durable {
            if let Err(e) = flush_range(&sh, &cfg, &mut seg, durable, released) {
                fail_log(&sh, &e);
                return;
            }
            durable = released;
            sh.flushes.fetch_add(1, Ordering::Relaxed);
            {
                let _g = sh.wait_lock.lock();
                sh.durable.store(durable, Ordering::Release);
                sh.durable_cv.notify_all();
            }
            // In registration order (roughly commit order): a committer that the callback
            // queues for an admission slot keeps its place.
            let ready: Vec<OnDurable> = {
                let mut cbs = sh.callbacks.lock();
                let (ready, pending): (Vec<_>, Vec<_>) =
                    cbs.drain(..).partition(|(end, _)| *end <= durable);
                *cbs = pending;
                ready.into_iter().map(|(_, cb)| cb).collect()
            };
            fire_all(ready, Ok(()));
            // Only now the next segment, if it is time for one: the flush is durable, so its
            // commits were acknowledged above even if the new file cannot be made (a full
            // disk, no inodes left). A failure here ends the log for what comes after.
            if let Err(e) = rotate(&cfg, &mut seg, durable) {
                fail_log(&sh, &e);
                return;
            }
        }
        if sh.shutdown.load(Ordering::Acquire) && sh.released.load(Ordering::Acquire) == durable {
            // A clean shutdown leaves no zeros after the log's end. If cutting them fails,
            // recovery reads them as the end of the log all the same.
            let _ = seg.trim(durable, &segment::path(&cfg.dir, seg.start));
            return;
        }
    }
}

fn flush_range(
    sh: &LogShared,
    cfg: &LogConfig,
    seg: &mut Segment,
    from: u64,
    to: u64,
) -> Result<()> {
    let path = segment::path(&cfg.dir, seg.start);
    // The emulated device latency comes first: until it has passed, nothing of this flush is
    // in the file, as with a real slow device (a crash during it loses the whole group).
    if !cfg.extra_latency.is_zero() {
        std::thread::sleep(cfg.extra_latency);
    }
    // Zeros ahead of the writes (see `ALLOCATE_AHEAD`), made durable by this flush's fsync.
    let end = to - seg.start;
    let step = ALLOCATE_AHEAD.min(cfg.segment_size.max(1).next_multiple_of(1 << 12));
    seg.extend(end, step, &path)?;
    // SAFETY: this is the flusher; `from` (the durable end) starts a frame, and the frames of
    // `[from, to)` are released.
    unsafe { sh.mark_flush_start(from) };
    let cap = sh.cap as u64;
    let mut at = from;
    while at < to {
        let pos = (at % cap) as usize;
        let n = ((to - at) as usize).min(sh.cap - pos);
        // SAFETY: `[from, to)` lies below `released`, so every inserter of those bytes has
        // finished copying (acquire load of `released` above), and no inserter can reuse
        // these positions before `durable` passes them, which happens only after this write.
        let chunk = unsafe { sh.ring.bytes(pos, n) };
        seg.file
            .write_at(at - seg.start, chunk)
            .map_err(on("write", &path))?;
        at += n as u64;
    }
    seg.file.sync().map_err(on("fsync", &path))
}

/// Begins a new segment at `to` (the durable end: a record boundary) once the current one
/// is big enough, cutting the zeros after its end first.
fn rotate(cfg: &LogConfig, seg: &mut Segment, to: u64) -> Result<()> {
    if to - seg.start < cfg.segment_size {
        return Ok(());
    }
    seg.trim(to, &segment::path(&cfg.dir, seg.start))?;
    *seg = Segment {
        file: segment::create(&*cfg.vfs, &cfg.dir, to)?,
        start: to,
        allocated: 0,
        longer: false,
    };
    Ok(())
}

/// Ends the log after `e`: nothing is durable past what was published, every waiter wakes
/// and every pending callback gets the error.
fn fail_log(sh: &LogShared, e: &Error) {
    *sh.failure.lock() = Some(e.to_string());
    sh.failed.store(true, Ordering::Release);
    {
        let _g = sh.wait_lock.lock();
        sh.durable_cv.notify_all();
    }
    let cbs = std::mem::take(&mut *sh.callbacks.lock());
    fire_all(
        cbs.into_iter().map(|(_, cb)| cb).collect(),
        Err(e.to_string()),
    );
}
