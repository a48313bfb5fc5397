//! The commit's wait for the log: group commit without a slot and without a second wake-up.
//!
//! A synchronous commit waits for its log record to be durable. The flusher writes and
//! fsyncs everything in the buffer at once (group commit) and then wakes the commits of that
//! flush in one batch. Two things make the wait cheap past the cores:
//!
//! - **No slot while waiting.** The committer gives its slot up before it parks (to the head
//!   of the queue), so the cores run other transactions during the flush.
//! - **One wake-up per commit.** Once the record is durable the flusher does not wake the
//!   committer only for it to queue for a slot and park again (two context switches per
//!   commit, and with 64 threads on 2 cores almost every woken committer would park again
//!   at once): it puts the committer in the gate's queue itself, and the committer wakes
//!   only when it is handed a slot. It then keeps that slot for its next transaction like
//!   any commit does (see the quantum in the parent module).
//!
//! A commit that still holds locks during the wait (no early lock release) must release
//! them as soon as it is durable, not after a turn of the queue: it is woken directly, runs
//! its release without a slot, and queues for one only at its next `begin`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::gate::Waiter;
use super::{watch, Gate, LOCAL, NO_SLOT};
use crate::error::Result;
use crate::log::buffer::LogBuffer;

const PENDING: u8 = 0;
const QUEUED: u8 = 1;
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

fn requeue_wait(log: &LogBuffer, end: u64, gate: Arc<Gate>, token: u32) -> Result<()> {
    let me = Waiter::new(std::thread::current(), token);
    let state = Arc::new(AtomicU8::new(PENDING));
    {
        let (gate, me, state) = (Arc::clone(&gate), Arc::clone(&me), Arc::clone(&state));
        log.on_durable_wake(
            end,
            Box::new(move |res| {
                if res.is_ok() {
                    // Handed a slot at once: woken (after the flusher's whole batch); else
                    // queued, and woken by the thread that hands it a slot later (the flag
                    // only tells the committer, should it wake up before, that its escape
                    // time runs).
                    let now = gate.enqueue(&me, false).is_some();
                    if !now {
                        watch(&gate);
                    }
                    state.store(QUEUED, Ordering::Release);
                    now.then(|| me.thread())
                } else {
                    state.store(FAILED, Ordering::Release);
                    Some(me.thread())
                }
            }),
        );
    }
    // Parked until handed a slot (or the log fails). The escape time of the gate counts from
    // the moment the thread is known to be queued.
    let outcome = loop {
        if me.granted().is_some() {
            break Ok(gate.wait_granted(&me, false, None));
        }
        match state.load(Ordering::Acquire) {
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
