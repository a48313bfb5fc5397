//! Ghost reclamation: when a deleted record's ghost may leave the index.
//!
//! **Two-phase locking** (Kimura et al. 2012 §2.2, after Graefe: ghosts are removed by a
//! system transaction once no active transaction needs them). A ghost's key takes part in
//! key-range locking, so it may go only while nobody holds or waits for a lock on it. The
//! deleting (or aborting) transaction tries right after it released its locks; a ghost whose
//! lock is still busy then (another transaction waits for it, a scan holds it, or, under
//! flush pipelining and early lock release, a lock outlives the transaction's own release
//! point) is not leaked: it goes on a deferred list that every later transaction's release
//! retries a few entries of, until its lock is free or the key was inserted again. A ghost
//! whose delete released its locks before its commit record was durable (SX-ELR) waits on
//! that list until it is: the ghost's lock carries the delete's LSN to a read-only scan that
//! reaches the key (Kimura §5.2), and a scan that found no ghost would report the key gone
//! without waiting for a delete that a crash may still undo.
//!
//! **Optimistic concurrency control** (Silo, Tu et al. SOSP 2013 §4.8: a deleted record is
//! unlinked once no transaction that could have seen it is still running). The danger is a
//! transaction that recorded a key's *absence* (a point read, or a scan that did not see it)
//! before an insert and a delete of that key committed: with the ghost gone, validation sees
//! the key absent again and misses both. So every optimistic transaction pins the current
//! epoch in a slot before its first read and clears the slot when it ends; a committer that
//! installed ghosts tags them with the epoch it then advances (`fetch_add`), and a ghost goes
//! once every pinned slot holds a later epoch. A transaction whose read preceded the delete
//! pinned before that read, so before the install, so before the tag was drawn: its slot
//! holds an epoch at or below the tag until it ends. (The order runs through the leaf's
//! page version, which the read validated and the writer's latch changed, both sequentially
//! consistent (`storage/olc.rs`), and through this module's mutex to the collector.) Transactions that
//! pinned later may see the ghost and then not find it: validation compares TIDs and scanned
//! key sets, so that shows as a change and aborts them, conservatively. A ghost is removed
//! only if it is still the same ghost (ghost bit, the delete's TID, no lock bit), and commit
//! TIDs stay above the TIDs of removed ghosts ([`Reclaim::tid_floor`]), so a key inserted
//! again never repeats the TID a reader saw on its ghost; one locked
//! by a committer is retried later; one written again is dropped from the list (a later
//! delete lists it anew).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};

use parking_lot::Mutex;

use super::epoch::Epochs;
pub(crate) use super::epoch::Pin;
use super::occ::LOCK_BIT;
use crate::db::Table;
use crate::lock::{LockId, LockTable};

/// Epoch slots: one per concurrently running optimistic transaction. More transactions than
/// this at once are counted apart, which holds every ghost back while they run (safe, and
/// only under hundreds of concurrent transactions).
const SLOTS: usize = 256;

/// Deferred two-phase-locking ghosts retried per transaction release.
const RETRY_PER_RELEASE: usize = 16;

/// A ghost installed by an optimistic commit, removable once epoch `tag` is over.
struct Retired {
    tag: u64,
    table: Table,
    key: Box<[u8]>,
    /// The delete's commit TID: the ghost is removed only if the record still has it.
    tid: u64,
}

/// A two-phase-locking ghost left for a later transaction to remove.
struct Deferred {
    table: Table,
    key: Box<[u8]>,
    /// The delete's commit LSN, which must be durable before the ghost goes (0: none).
    lsn: u64,
}

/// The database's ghost reclamation state (see the module documentation).
pub(crate) struct Reclaim {
    epochs: Epochs,
    /// The largest delete TID of an optimistic ghost removed so far: commit TIDs are chosen
    /// above it (see [`tid_floor`](Self::tid_floor)).
    removed_tid: AtomicU64,
    /// Optimistic ghosts waiting for their epoch to end, roughly in tag order.
    retired: Mutex<VecDeque<Retired>>,
    retired_len: AtomicUsize,
    /// Two-phase-locking ghosts whose lock was busy when their transaction tried, or whose
    /// delete was not yet durable.
    deferred: Mutex<VecDeque<Deferred>>,
    deferred_len: AtomicUsize,
}

impl Default for Reclaim {
    fn default() -> Self {
        Reclaim {
            epochs: Epochs::new(SLOTS),
            removed_tid: AtomicU64::new(0),
            retired: Mutex::new(VecDeque::new()),
            retired_len: AtomicUsize::new(0),
            deferred: Mutex::new(VecDeque::new()),
            deferred_len: AtomicUsize::new(0),
        }
    }
}

impl Reclaim {
    /// Pins the current epoch for an optimistic transaction that is about to start reading.
    pub(crate) fn pin(&self) -> Pin {
        self.epochs.pin()
    }

    /// Ends a pin taken by [`pin`](Self::pin).
    pub(crate) fn unpin(&self, pin: Pin) {
        self.epochs.unpin(pin);
    }

    /// Lists the ghosts an optimistic commit just installed (`(table, key, delete TID)`):
    /// they are removed once every transaction running now has ended. Call after the
    /// install.
    pub(crate) fn retire(&self, ghosts: Vec<(Table, Box<[u8]>, u64)>) {
        if ghosts.is_empty() {
            return;
        }
        let tag = self.epochs.advance();
        let mut q = self.retired.lock();
        q.extend(ghosts.into_iter().map(|(table, key, tid)| Retired {
            tag,
            table,
            key,
            tid,
        }));
        self.retired_len.store(q.len(), SeqCst);
    }

    /// Removes the optimistic ghosts whose epoch no running transaction pinned. Call after
    /// unpinning (a transaction's own pin holds back the ghosts it retired).
    pub(crate) fn collect_retired(&self) {
        if self.retired_len.load(SeqCst) == 0 {
            return;
        }
        let oldest = self.epochs.oldest_pinned();
        let ready: Vec<Retired> = {
            let mut q = self.retired.lock();
            let mut ready = Vec::new();
            while q.front().is_some_and(|r| r.tag < oldest) {
                ready.extend(q.pop_front());
            }
            self.retired_len.store(q.len(), SeqCst);
            ready
        };
        // Raise the floor before any of these ghosts goes (see `tid_floor`).
        if let Some(max) = ready.iter().map(|r| r.tid).max() {
            self.removed_tid.fetch_max(max, SeqCst);
        }
        let mut again = Vec::new();
        for r in ready {
            let mut busy = false;
            r.table.inner.tree.update(&r.key, |slot| match slot {
                Some(rec) if rec.ghost && rec.tid == r.tid => *slot = None,
                // A committer holds the ghost's lock bit: it may still give it back as it
                // was (a failed validation), so look again later.
                Some(rec) if rec.ghost && rec.tid == r.tid | LOCK_BIT => busy = true,
                // Written since (or already gone): not this entry's ghost any more.
                _ => {}
            });
            if busy {
                again.push(r);
            }
        }
        if !again.is_empty() {
            let mut q = self.retired.lock();
            q.extend(again);
            self.retired_len.store(q.len(), SeqCst);
        }
    }

    /// Removes the two-phase-locking ghosts `ghosts` (`(table, key)`) whose lock nobody holds
    /// or waits for; defers the others. Then retries a few deferred ones. `locking` is false
    /// for serial transactions, which take no locks.
    ///
    /// `lsn` is the deleting commit's end LSN when it released its locks before its record
    /// was durable (SX-ELR), else 0, and `durable` reads the log's durable LSN (only when a
    /// ghost or a deferred one needs it: the flusher writes that line often). Such a ghost
    /// stays until its delete is durable: a scan that passes over its key locks the
    /// neighbours, not the key, so the ghost's lock is the only one that carries the delete's
    /// LSN to a read-only reader (Kimura §5.2's wait); without the ghost, the reader would
    /// report the key gone and return before a crash could bring it back.
    pub(crate) fn collect_locked<'t>(
        &self,
        locks: &dyn LockTable,
        locking: bool,
        lsn: u64,
        durable: impl Fn() -> u64,
        ghosts: impl IntoIterator<Item = (&'t Table, Box<[u8]>)>,
    ) {
        let now = std::cell::OnceCell::new();
        let durable = || *now.get_or_init(&durable);
        let mut busy = Vec::new();
        for (table, key) in ghosts {
            // The table handle is cloned only for a ghost that stays: its reference count is
            // a line every thread's deletes would otherwise write.
            if lsn > 0 && lsn > durable() {
                busy.push(Deferred {
                    table: table.clone(),
                    key,
                    lsn,
                });
            } else if let Some(key) = remove_if_free(locks, locking, table, key) {
                busy.push(Deferred {
                    table: table.clone(),
                    key,
                    lsn: 0,
                });
            }
        }
        if self.deferred_len.load(SeqCst) > 0 {
            let retry: Vec<Deferred> = {
                let mut q = self.deferred.lock();
                // Oldest first; stop at a delete not yet durable (those behind it came later).
                // A ghost that only waited for its delete to be durable is tried once in that
                // state, so all of them are taken (each was listed once, by one release); only
                // the retries of busy locks are limited per release. With a limit on both, a
                // transaction that deletes more keys than the limit listed more ghosts than
                // the releases took off, and the list (and the index) grew for ever.
                let mut r = Vec::new();
                let mut retries = 0;
                while let Some(g) = q.front() {
                    if g.lsn == 0 {
                        if retries == RETRY_PER_RELEASE {
                            break;
                        }
                        retries += 1;
                    } else if g.lsn > durable() {
                        break;
                    }
                    r.extend(q.pop_front());
                }
                self.deferred_len.store(q.len(), SeqCst);
                r
            };
            for Deferred { table, key, .. } in retry {
                if let Some(key) = remove_if_free(locks, locking, &table, key) {
                    busy.push(Deferred { table, key, lsn: 0 });
                }
            }
        }
        if !busy.is_empty() {
            let mut q = self.deferred.lock();
            q.extend(busy);
            self.deferred_len.store(q.len(), SeqCst);
        }
    }

    /// A lower bound for optimistic commit TIDs: every ghost removed so far had a smaller
    /// TID. Without it, a key could lose its ghost (TID `t`) and be inserted again by a
    /// committer that read nothing newer than `t - 1`, so with TID `t` again; a transaction
    /// that saw the ghost (it began after the delete, so it does not hold the ghost back)
    /// and then the new record would find the same TID at validation and miss the change.
    /// Silo's epoch-numbered TIDs rule that out; here the collector raises the floor before
    /// it takes the leaf latch to remove a ghost, and an inserter creates its placeholder
    /// under that latch afterwards and reads the floor after that, so its TID is larger.
    pub(crate) fn tid_floor(&self) -> u64 {
        self.removed_tid.load(SeqCst)
    }

    /// Ghosts waiting: (optimistic, two-phase locking). For tests and diagnostics.
    pub(crate) fn pending(&self) -> (usize, usize) {
        (self.retired.lock().len(), self.deferred.lock().len())
    }
}

/// Removes the ghost at `key` if nobody holds or waits for a lock on it; gives the key back
/// if it must wait (the lock is busy). A key that is no ghost any more needs nothing.
fn remove_if_free(
    locks: &dyn LockTable,
    locking: bool,
    table: &Table,
    key: Box<[u8]>,
) -> Option<Box<[u8]>> {
    // The lock name owns the key: no second copy.
    let id = LockId::Key(table.inner.id, key.into());
    let LockId::Key(_, k) = &id else {
        return None;
    };
    let mut busy = false;
    table.inner.tree.update(k, |rec| {
        if rec.as_ref().is_some_and(|r| r.ghost) {
            if !locking || locks.is_free(&id) {
                *rec = None;
            } else {
                busy = true;
            }
        }
    });
    match id {
        LockId::Key(_, k) if busy => Some(k.into()),
        _ => None,
    }
}
