//! The commit's wait for the log: group commit without a slot and without a second wake-up.
//!
//! A synchronous commit waits for its log record to be durable. The flusher writes and
//! fsyncs everything in the buffer at once (group commit) and then wakes the commits of that
//! flush in one batch. Three things make the wait cheap past the cores:
//!
//! - **No slot while waiting.** The committer gives its slot up before it parks (to the head
//!   of the queue), so the cores run other transactions during the flush.
//! - **One wake-up per commit.** Once the record is durable the flusher does not wake the
//!   committer only for it to queue for a slot and park again (two context switches per
//!   commit, and with 64 threads on 2 cores almost every woken committer would park again
//!   at once): it puts the committer in the gate's queue itself, and the committer wakes
//!   only when it is handed a slot. It then keeps that slot for its next transaction like
//!   any commit does (see the quantum in the parent module).
//! - **No allocation per commit.** The flusher's list of durable waits takes the committer
//!   as a typed entry (`OnDurable::Requeue`: the gate and the waiter), not as a boxed
//!   callback, the wait's progress lives in the waiter, and a thread reuses its waiter once
//!   the queue and the flusher have let go of it: nothing the committer allocates is freed
//!   by the flusher's thread (in `mimalloc` a cross-thread free costs both threads; it took
//!   a seventh of the flusher's time at 64 threads).
//!
//! A commit that still holds locks during the wait (no early lock release) must release
//! them as soon as it is durable, not after a turn of the queue: it is woken directly, runs
//! its release without a slot, and queues for one only at its next `begin`.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::gate::Waiter;
use super::{watch, Gate, LOCAL, NO_SLOT};
use crate::error::Result;
use crate::log::buffer::LogBuffer;

/// `Waiter::commit` once the flusher queued the committer for a slot (0 before).
const QUEUED: u8 = 1;
/// `Waiter::commit` once the log failed.
const FAILED: u8 = 2;

/// What the thread holds when its commit starts to wait.
enum Plan {
    /// No slot to give up (no gate, a nested transaction, or it escaped): a plain wait.
    Plain,
    /// A slot, given up now; the flusher queues this thread for a new one.
    Requeue(Arc<Gate>, u32),
    /// A slot, given up now; the thread finishes its commit without one.
    Leave,
}

/// Waits until the log is durable up to `end` for a transaction that has written its commit
/// record (or, read-only, must not return before what it read is durable). `holds_locks`:
/// the transaction still holds locks it releases after the wait.
pub(crate) fn commit_wait(log: &LogBuffer, end: u64, holds_locks: bool) -> Result<()> {
    if log.durable() >= end {
        return Ok(());
    }
    let plan = LOCAL
        .try_with(|l| {
            let mut l = l.borrow_mut();
            if l.depth != 1 || l.slot == NO_SLOT || l.kept != 0 || l.suspended {
                return Plan::Plain;
            }
            let Some(g) = l.gate.clone() else {
                return Plan::Plain;
            };
            g.release(l.slot);
            l.slot = NO_SLOT;
            if holds_locks {
                Plan::Leave
            } else {
                // Until it is handed a slot the thread holds none; `end` finds none.
                l.suspended = true;
                Plan::Requeue(g, l.token)
            }
        })
        .unwrap_or(Plan::Plain);
    match plan {
        Plan::Plain => log.wait_durable(end),
        Plan::Leave => log.park_until_durable(end),
        Plan::Requeue(gate, token) => requeue_wait(log, end, gate, token),
    }
}

/// The flusher's part of a synchronous commit's wait (`LogBuffer::on_durable_requeue`):
/// once the commit is durable, queues its thread `me` for a slot of `gate` and returns the
/// thread to wake if it was handed one at once (else the thread that hands it one wakes
/// it); if the log failed, marks the failure and returns the thread to wake.
pub(crate) fn requeue_durable(
    gate: &Arc<Gate>,
    me: &Arc<Waiter>,
    durable: bool,
) -> Option<std::thread::Thread> {
    if durable {
        // Handed a slot at once: woken (after the flusher's whole batch); else queued, and
        // woken by the thread that hands it a slot later (the flag only tells the
        // committer, should it wake up before, that its escape time runs).
        let now = gate.enqueue(me, false).is_some();
        if !now {
            watch(gate);
        }
        me.commit.store(QUEUED, Ordering::Release);
        now.then(|| me.thread())
    } else {
        me.commit.store(FAILED, Ordering::Release);
        Some(me.thread())
    }
}

thread_local! {
    /// The waiter of this thread's last commit wait, reused once nothing else holds it.
    static WAITER: RefCell<Option<Arc<Waiter>>> = const { RefCell::new(None) };
}

/// A waiter for this thread (token `token`): the last one again when nothing else holds it
/// (the usual case: the queue and the flusher drop theirs within microseconds of the hand-
/// over), else a new one. Nothing is allocated per commit, and nothing allocated by this
/// thread is freed by the flusher's (a cross-thread free costs both sides in `mimalloc`).
fn commit_waiter(token: u32) -> Arc<Waiter> {
    let fresh = || Waiter::new(std::thread::current(), token);
    WAITER
        .try_with(|c| {
            let mut c = c.borrow_mut();
            if let Some(w) = c.as_mut() {
                if Waiter::reset_unshared(w, token) {
                    return Arc::clone(w);
                }
            }
            let w = fresh();
            *c = Some(Arc::clone(&w));
            w
        })
        .unwrap_or_else(|_| fresh())
}

fn requeue_wait(log: &LogBuffer, end: u64, gate: Arc<Gate>, token: u32) -> Result<()> {
    let me = commit_waiter(token);
    log.on_durable_requeue(end, Arc::clone(&gate), Arc::clone(&me));
    // Parked until handed a slot (or the log fails). The escape time of the gate counts from
    // the moment the thread is known to be queued.
    let outcome = loop {
        if me.granted().is_some() {
            break Ok(gate.wait_granted(&me, false, None));
        }
        match me.commit.load(Ordering::Acquire) {
            QUEUED => break Ok(gate.wait_granted(&me, false, Some(Instant::now()))),
            FAILED => break Err(log.check().err()),
            _ => std::thread::park_timeout(Duration::from_millis(10)),
        }
    };
    let slot = match outcome {
        Ok(slot) => slot.unwrap_or(NO_SLOT),
        Err(_) => NO_SLOT,
    };
    let _ = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        l.slot = slot;
        l.kept = 0;
        l.since = Instant::now();
        l.suspended = false;
    });
    match outcome {
        Ok(_) => Ok(()),
        Err(Some(e)) => Err(e),
        // The callback reported a failure, so the log has failed; `check` says how.
        Err(None) => log.check(),
    }
}
