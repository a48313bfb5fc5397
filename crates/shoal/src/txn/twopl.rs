//! Strict two-phase locking with key-range locks: the protocol of
//! [`ConcurrencyControl::TwoPhaseLocking`](crate::ConcurrencyControl::TwoPhaseLocking), and,
//! with its locks switched off, of `Serial` and `None`.
//!
//! Protocol (Kimura et al. 2012 §2.2, Algorithms 1-2, Table 3), with lock names that are key
//! *values* (see [`crate::lock`]):
//!
//! - every operation first takes an intent lock on the database and the table (IS for reads,
//!   IX for writes; Table 4), cached for the rest of the transaction;
//! - a point read takes SN on the key value (key shared, gap free). When the key is absent the
//!   same SN lock protects its absence: every insert takes XN on its key value *before* the
//!   record appears, so no insert of that key can happen under a reader. This deviates from
//!   Algorithm 2, which locks the prior key's gap (NS) and so also blocks inserts of other keys
//!   into that gap; a lock table that names key values can lock an absent value directly;
//! - updates, deletes and integer operations take XN on the key. A delete turns the record into
//!   a ghost; ghosts are removed after the deleting (or aborting) transaction has released its
//!   locks, and only when no transaction holds or waits for a lock on that key (one whose lock
//!   is still busy then is deferred and retried by later transactions: [`reclaim`](super::reclaim));
//! - an insert of a new key (Algorithm 1) takes XN on the key, then an instant-duration NX on
//!   the prior key (or the table's `-infinity` fence) to check that no scan protects the gap,
//!   re-checks that the prior key is still the predecessor, creates the record and releases NX.
//!   The new key splits the prior key's gap; if the inserting transaction itself holds a gap
//!   lock on the prior key (it scanned there), the lock on the new key inherits that gap part
//!   (`XS` or `X` instead of `XN`) before the key appears, so the upper half stays protected;
//! - a scan takes the cursor locks of Table 3 (ascending column): NS on the key just below the
//!   range (or `-infinity`) and S on every key in the range, ghosts included, then re-reads the
//!   range to check nothing moved before the locks were granted. A descending scan takes the
//!   same locks (a superset of Table 3's descending column) and returns the rows reversed.
//!
//! No latch is ever held while waiting for a lock: each tree operation is atomic under its leaf
//! latch, and the protocol re-validates after a lock is granted. Two facts make that enough:
//! a key with any lock on it is never removed, and a key can only appear in the gap after `p`
//! while its inserter holds NX on `p`.
//!
//! Writes are applied in place with an undo list; abort restores before-images (a record that
//! did not exist becomes a ghost).
//!
//! `Serial` and `None` run this same path with `locking` off: they share everything here but
//! the locks (in-place writes, the undo list, ghosts, the redo record built at commit), so a
//! variant of their own would repeat all of it to leave out a few calls. `Serial` adds the
//! database's one mutex, held by the facade from begin to end.

use std::collections::hash_map::Entry;
use std::ops::Bound;
use std::time::Duration;

use rustc_hash::FxHashMap;

use super::undo::{Before, UndoLog};
use super::{
    as_ref_bound, int_value, CommitTicket, Ctx, IntOp, Modify, Protocol, Rows, Span, Write,
    SCAN_CHUNK,
};
use crate::db::{DbInner, LogMode, TableSlots};
use crate::error::{show_key, Error, Result};
use crate::lock::intent::{LightweightIntentLocks, PrivateIntents};
use crate::lock::modes::{cursor_mode, CursorDir, CursorStep, Part};
use crate::lock::{LockFailure, LockId, LockKey, LockMode, TaggedGrant, TxnId};
use crate::storage::btree::{LeafHint, Record};

/// The state of a two-phase-locking transaction: its locks, its undo list and its ghosts.
pub(super) struct TwoPl {
    /// False under `Serial` and `None`: no lock is taken.
    pub(super) locking: bool,
    timeout: Duration,
    pub(super) held: FxHashMap<LockId, LockMode>,
    /// Intent locks held in the lightweight intent lock table (when it is on).
    pub(super) intents: PrivateIntents,
    pub(super) undo: UndoLog,
    /// Keys this transaction turned into ghosts (deleted, or inserted and then aborted):
    /// candidates for removal once its locks are gone.
    pub(super) ghosts: Vec<(u16, Box<[u8]>)>,
    /// Highest early-lock-release tag (a commit LSN) seen on a lock this transaction took.
    pub(super) max_tag: u64,
    /// Collect tags: a log, and not unsafe SX-ELR (under which nothing waits for them).
    track_tags: bool,
    /// The leaf of each table's last access, by table slot: a get followed by an update of
    /// the same key, or an insert after the lookup that found its key absent, skips the
    /// second root-to-leaf descent (the tree checks a hint's fences, so a stale one costs a
    /// version check and two comparisons).
    hints: Vec<Option<LeafHint>>,
}

/// True for modes that lock something exclusively (key, gap or intent).
pub(super) fn has_exclusive(m: LockMode) -> bool {
    !matches!(
        m,
        LockMode::N | LockMode::S | LockMode::NS | LockMode::SN | LockMode::IS
    )
}

thread_local! {
    /// The `held` map of this thread's last finished transaction, emptied, kept for the next
    /// one: a transaction that takes hundreds of locks then does not grow (and rehash) its
    /// map from nothing every time.
    static SPARE_HELD: std::cell::Cell<FxHashMap<LockId, LockMode>> =
        std::cell::Cell::new(FxHashMap::default());
    /// The list of locks the thread's last commit released, emptied, kept for the next one.
    static SPARE_RELEASE: std::cell::Cell<Vec<(LockId, u64)>> =
        const { std::cell::Cell::new(Vec::new()) };
}

/// Largest `held` map (in locks it has room for) kept for the next transaction.
const SPARE_HELD_ROOM: usize = 1024;

impl Drop for TwoPl {
    fn drop(&mut self) {
        if self.held.capacity() <= SPARE_HELD_ROOM {
            let mut held = std::mem::take(&mut self.held);
            held.clear();
            // `try_with`: nothing to keep during thread teardown.
            let _ = SPARE_HELD.try_with(|s| s.set(held));
        }
        std::mem::take(&mut self.undo).recycle();
    }
}

impl TwoPl {
    pub(super) fn new(inner: &DbInner, locking: bool) -> TwoPl {
        TwoPl {
            locking,
            timeout: inner.opts.lock_timeout,
            held: if locking {
                SPARE_HELD.try_with(|s| s.take()).unwrap_or_default()
            } else {
                FxHashMap::default()
            },
            intents: PrivateIntents::default(),
            undo: UndoLog::new(inner.log.is_some()),
            ghosts: Vec::new(),
            max_tag: 0,
            track_tags: locking
                && inner.opts.elr != crate::db::Elr::SxUnsafe
                && inner.log.is_some(),
            hints: Vec::new(),
        }
    }

    /// The leaf hint of table `slot`'s last access.
    fn hint(&self, slot: u16) -> Option<LeafHint> {
        self.hints.get(usize::from(slot)).copied().flatten()
    }

    /// Remembers the leaf of an access to table `slot`.
    fn set_hint(&mut self, slot: u16, h: LeafHint) {
        let i = usize::from(slot);
        if self.hints.len() <= i {
            self.hints.resize(i + 1, None);
        }
        self.hints[i] = Some(h);
    }

    /// [`Ctx::charge`] for a write already made: a transaction that outgrows the log is
    /// rolled back and fails.
    fn charged(&mut self, cx: &mut Ctx<'_>, key: &[u8], value_len: usize) -> Result<()> {
        cx.charge(key, value_len).inspect_err(|e| self.fail(cx, e))
    }

    /// Rolls back, releases every lock and remembers why: later operations fail.
    pub(super) fn fail(&mut self, cx: &mut Ctx<'_>, err: &Error) {
        cx.failed = Some((err.to_string(), err.is_retryable()));
        self.rollback(cx);
        self.release_all(cx);
    }

    /// Takes `mode` on `id` until the end of the transaction (a no-op when a held lock
    /// covers it).
    /// [`lock`](Self::lock) on the key `key` of table `slot`; names the lock (an allocation)
    /// only when locks are taken.
    fn lock_key(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], mode: LockMode) -> Result<()> {
        if !self.locking {
            return Ok(());
        }
        let id = key_id(cx, slot, key);
        self.lock(cx, id, mode)
    }

    fn lock(&mut self, cx: &mut Ctx<'_>, id: LockId, mode: LockMode) -> Result<()> {
        if !self.locking {
            return Ok(());
        }
        let mode = key_mode(cx, &id, mode);
        // One hash of the id in `held`: the entry serves the check and the insert.
        let slot = match self.held.entry(id) {
            Entry::Occupied(o) if o.get().covers(mode) => return Ok(()),
            slot => slot,
        };
        declare_age(cx);
        match Self::acquire_tagged(self.timeout, cx, slot.key(), mode, self.track_tags) {
            Ok((m, tag)) => {
                self.max_tag = self.max_tag.max(tag);
                slot.insert_entry(m);
                Ok(())
            }
            Err(f) => {
                let e = lock_error(cx, slot.key(), f);
                self.fail(cx, &e);
                Err(e)
            }
        }
    }

    /// Takes `mode` on `id` for an instant: returns whether the caller must release it with
    /// [`unlock_instant`](Self::unlock_instant) (false when the transaction already held a
    /// lock there, which it then keeps, converted).
    fn lock_instant(&mut self, cx: &mut Ctx<'_>, id: &LockId, mode: LockMode) -> Result<bool> {
        if !self.locking {
            return Ok(false);
        }
        let mode = key_mode(cx, id, mode);
        if self.held.contains_key(id) {
            self.lock(cx, id.clone(), mode)?;
            return Ok(false);
        }
        declare_age(cx);
        match Self::acquire(self.timeout, cx, id, mode) {
            Ok(_) => Ok(true),
            Err(f) => {
                let e = lock_error(cx, id, f);
                self.fail(cx, &e);
                Err(e)
            }
        }
    }

    /// [`acquire`](Self::acquire), and when `tagged` the lock's early-lock-release tag at
    /// the grant (else 0): read with the request in one visit to the lock when it is
    /// granted at once.
    fn acquire_tagged(
        timeout: Duration,
        cx: &Ctx<'_>,
        id: &LockId,
        mode: LockMode,
        tagged: bool,
    ) -> TaggedGrant {
        if !tagged {
            return Self::acquire(timeout, cx, id, mode).map(|m| (m, 0));
        }
        let locks = &cx.inner().locks;
        match locks.try_lock_tagged(cx.id, id, mode) {
            Err(LockFailure::WouldBlock) => {}
            r => return r,
        }
        let m = Self::acquire(timeout, cx, id, mode)?;
        Ok((m, locks.tag(id)))
    }

    /// Requests `mode` on `id` from the lock table: at once if it can be granted, else
    /// waiting without an admission slot (a waiter must not keep a running slot from the
    /// transaction it waits for).
    fn acquire(
        timeout: Duration,
        cx: &Ctx<'_>,
        id: &LockId,
        mode: LockMode,
    ) -> std::result::Result<LockMode, LockFailure> {
        let locks = &cx.inner().locks;
        match locks.try_lock(cx.id, id, mode) {
            Err(LockFailure::WouldBlock) => {}
            r => return r,
        }
        // The slot to wait in or give up is the one the thread runs in, which belongs to
        // another database's gate in a transaction nested in one of that database (or to
        // none). Taking this database's gate instead, a nested wait kept a slot of a gate
        // that did not count it, or counted a waiter in a slot it did not hold.
        let Some(gate) = crate::admission::running_gate() else {
            return locks.lock(cx.id, id, mode, timeout);
        };
        let gate = &*gate;
        // The holder most likely runs in another slot and is done within microseconds: a
        // short spin saves two slot hand-overs (each a wake-up of a parked thread). Its clock
        // starts only here: the common, uncontended request reads no clock.
        let spin = crate::admission::LockSpin::new();
        loop {
            match locks.try_lock(cx.id, id, mode) {
                Err(LockFailure::WouldBlock) if spin.again(gate) => {}
                // Waiting in its slot keeps the number of transactions in the system at the
                // slot count, so a hot lock's queue cannot grow into a convoy of parked
                // threads that each need a wake-up (TPC-C Payment with one warehouse: a
                // queue of 64 ran at a tenth of the 2-thread rate). At least one slot stays
                // with a thread that is not waiting, so the holder always gets to run; and
                // a thread resuming (perhaps the holder) gets this one's slot at once.
                Err(LockFailure::WouldBlock) if gate.waiting().1 == 0 && gate.wait_in_slot() => {
                    let r = locks.lock(cx.id, id, mode, timeout);
                    gate.end_wait_in_slot();
                    return r;
                }
                Err(LockFailure::WouldBlock) => {
                    return crate::admission::blocking(|| locks.lock(cx.id, id, mode, timeout))
                }
                r => return r,
            }
        }
    }

    /// [`acquire`](Self::acquire) for the lightweight intent lock table.
    fn acquire_intent(
        lil: &LightweightIntentLocks,
        mine: &mut PrivateIntents,
        obj: u32,
        mode: LockMode,
    ) -> std::result::Result<(), LockFailure> {
        match lil.try_lock(mine, obj, mode) {
            Err(LockFailure::WouldBlock) => {
                crate::admission::blocking(|| lil.lock(mine, obj, mode))
            }
            r => r,
        }
    }

    fn unlock_instant(&mut self, cx: &mut Ctx<'_>, id: &LockId, taken: bool) {
        if taken {
            cx.inner().locks.unlock(cx.id, id);
            // Dependencies on this lock end here, not at the transaction's end: Dreadlocks
            // digests that named it must not name its next requests.
            crate::lock::dread::new_fingerprint(cx.id);
        }
    }

    fn intent(&mut self, cx: &mut Ctx<'_>, slot: u16, write: bool) -> Result<()> {
        if !self.locking {
            return Ok(());
        }
        let mode = if write { LockMode::IX } else { LockMode::IS };
        let tid = cx.table(slot).inner.id;
        if cx.inner().lil.is_some() {
            // Lightweight intent locks (Kimura §3.2): counters, not lock-table queues.
            // Object 0 is the database, object `t` table `t`.
            return self.coarse_lock(
                cx,
                &[(0, LockId::Database, mode), (tid, LockId::Table(tid), mode)],
            );
        }
        self.lock(cx, LockId::Database, mode)?;
        self.lock(cx, LockId::Table(tid), mode)
    }

    pub(super) fn release_all(&mut self, cx: &mut Ctx<'_>) {
        self.release_all_tagged(cx, 0);
    }

    fn release_intents(&mut self, cx: &mut Ctx<'_>) {
        if let Some(lil) = &cx.inner().lil {
            if !self.intents.is_empty() {
                lil.release_all(&mut self.intents);
            }
        }
    }

    /// Removes this transaction's ghosts whose locks are free, defers the others (see
    /// [`reclaim`]).
    /// Removes this transaction's ghosts, or defers them (see `Reclaim::collect_locked`);
    /// `lsn` is the commit's end LSN when it released its locks before its record was
    /// durable, else 0.
    fn collect_ghosts(&mut self, cx: &mut Ctx<'_>, lsn: u64) {
        let ghosts = std::mem::take(&mut self.ghosts);
        let tables = &cx.tables;
        let inner = cx.inner();
        inner.reclaim.collect_locked(
            &*inner.locks,
            self.locking,
            lsn,
            || inner.log.as_ref().map_or(u64::MAX, |l| l.durable()),
            ghosts.into_iter().map(|(s, k)| (tables[s as usize], k)),
        );
    }

    /// Releases the held locks whose mode satisfies `pred` (S-ELR).
    pub(super) fn release_matching(&mut self, cx: &mut Ctx<'_>, pred: impl Fn(LockMode) -> bool) {
        if !self.locking {
            return;
        }
        let locks = &cx.inner().locks;
        let id = cx.id;
        self.held.retain(|lid, m| {
            if pred(*m) {
                locks.unlock(id, lid);
                false
            } else {
                true
            }
        });
    }

    /// Releases every lock, leaving `tag` (the commit record's end LSN) on the queues of
    /// exclusive ones (SX-ELR).
    pub(super) fn release_all_tagged(&mut self, cx: &mut Ctx<'_>, tag: u64) {
        if self.locking && !self.held.is_empty() {
            // All at once, so the table can take each of its latches once.
            let mut all = SPARE_RELEASE.try_with(|s| s.take()).unwrap_or_default();
            all.extend(
                self.held
                    .drain()
                    .map(|(id, m)| (id, if has_exclusive(m) { tag } else { 0 })),
            );
            cx.inner().locks.unlock_all(cx.id, &mut all);
            all.clear();
            if all.capacity() <= SPARE_HELD_ROOM {
                let _ = SPARE_RELEASE.try_with(|s| s.set(all));
            }
        }
        self.release_intents(cx);
        self.collect_ghosts(cx, tag);
    }

    pub(super) fn rollback(&mut self, cx: &mut Ctx<'_>) {
        self.undo.undo(&cx.tables, &mut self.ghosts);
    }

    /// The common write path: with XN held on `key`, replaces the live value (or creates the
    /// record) with what `f` computes from the current live value.
    fn modify<T>(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        mut f: impl FnMut(Option<&[u8]>) -> Result<T>,
    ) -> Result<T>
    where
        T: AsRef<[u8]>,
    {
        let tree = &cx.table(slot).inner.tree;
        // Live record or ghost: update in place (the XN lock makes it ours).
        enum Step<T> {
            Done(T),
            Failed(Error),
            /// No record; the prior key if the leaf showed it (a hint for the insert).
            Absent(Option<Option<LockKey>>),
        }
        let hint = self.hint(slot);
        let undo = &mut self.undo;
        let locking = self.locking;
        let (step, h) = tree.update_with_prior(key, hint, locking, |rec, prior| match rec {
            Some(r) => {
                let cur = if r.ghost { None } else { Some(&r.value[..]) };
                match f(cur) {
                    Ok(v) => {
                        // The old value is copied to the undo list, the new one over it
                        // in the record's buffer: no allocation for either.
                        undo.push(slot, key, Some(Before::of(r)), Some(v.as_ref()));
                        r.value.clear();
                        r.value.extend_from_slice(v.as_ref());
                        r.ghost = false;
                        Step::Done(v)
                    }
                    Err(e) => Step::Failed(e),
                }
            }
            // `Serial` and `None` check no gap: the record is created here, under the latch
            // the search took (one search of the leaf, not two).
            None if !locking => match f(None) {
                Ok(v) => {
                    undo.push(slot, key, None, Some(v.as_ref()));
                    *rec = Some(Record::copied(v.as_ref()));
                    Step::Done(v)
                }
                Err(e) => Step::Failed(e),
            },
            // The prior key as a lock name: inline up to `LockKey::INLINE` bytes, so no
            // allocation for it (or for the gap lock's id made from it).
            None => Step::Absent(prior.map(|p| p.map(LockKey::from))),
        });
        self.set_hint(slot, h);
        match step {
            Step::Done(v) => {
                self.charged(cx, key, v.as_ref().len())?;
                Ok(v)
            }
            Step::Failed(e) => Err(e),
            Step::Absent(prior) => {
                let v = f(None)?;
                self.insert_new(cx, slot, key, v.as_ref(), prior)?;
                self.charged(cx, key, v.as_ref().len())?;
                Ok(v)
            }
        }
    }

    /// Algorithm 1 for a key with no record: instant NX on the prior key, then create.
    ///
    /// The new key splits the prior key's gap `(prior, next)` into `(prior, key)` and
    /// `(key, next)`. The instant NX proves that no *other* transaction holds a gap lock on the
    /// prior key, but this transaction may hold one itself (it scanned the range, or positioned
    /// a cursor in the gap). Its lock on the prior key keeps covering only the lower half once
    /// the key exists, so before the key appears the lock on the new key takes the same gap
    /// part (lock inheritance): `XN` becomes `XS` (or `X`). Without it another transaction could
    /// insert into `(key, next)` (its instant NX on `key` is compatible with `XN`) and commit
    /// a phantom into a range this transaction has read.
    ///
    /// `hint` is the prior key if the caller just saw it (see `BTree::update_with_prior`).
    fn insert_new(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        value: &[u8],
        mut hint: Option<Option<LockKey>>,
    ) -> Result<()> {
        // `Serial` and `None` insert in `modify`: they check no gap.
        debug_assert!(self.locking);
        loop {
            let tree = &cx.table(slot).inner.tree;
            let prior = match hint.take() {
                Some(p) => p,
                None => tree.predecessor(key).map(LockKey::from),
            };
            let gap = gap_id(cx, slot, prior.clone());
            // The gap part this transaction holds on the prior key, read before the instant
            // NX (which converts and keeps a held lock). The new key inherits it before it
            // appears; if the prior key changes below, the next round inherits from the new one
            // (a lock inherited in vain only restricts others more).
            let inherited = self
                .held
                .get(&gap)
                .and_then(|m| m.gap_part())
                .filter(|&g| g != Part::N);
            if let Some(g) = inherited {
                let id = key_id(cx, slot, key);
                self.lock(cx, id, LockMode::key_range(Part::X, g))?;
            }
            let taken = self.lock_instant(cx, &gap, LockMode::NX)?;
            let tree = &cx.table(slot).inner.tree;
            let mut created = false;
            let mut before = None;
            let mut put = |rec: &mut Option<Record>| match rec {
                None => {
                    *rec = Some(Record::copied(value));
                    created = true;
                }
                Some(r) => {
                    // Cannot happen while we hold XN on the key, but stay correct anyway.
                    before = Some(r.clone());
                    r.value.clear();
                    r.value.extend_from_slice(value);
                    r.ghost = false;
                }
            };
            // Check that the prior key is still the predecessor, and insert: under one leaf
            // latch when the leaf shows the predecessor, else in two steps (the NX lock keeps
            // the gap from changing in between).
            let hint = self.hint(slot);
            let (moved, h) = tree.update_with_prior(key, hint, true, |rec, now| match now {
                Some(now) if now != prior.as_deref() => Some(true),
                Some(_) => {
                    put(rec);
                    Some(false)
                }
                None => None,
            });
            self.set_hint(slot, h);
            let moved = match moved {
                Some(m) => m,
                None if tree.predecessor(key).as_deref() != prior.as_deref() => true,
                None => {
                    tree.update(key, &mut put);
                    false
                }
            };
            if moved {
                // A ghost in the gap went away, or the prior key changed before our lock:
                // look again.
                self.unlock_instant(cx, &gap, taken);
                continue;
            }
            self.unlock_instant(cx, &gap, taken);
            let before = before.as_ref().filter(|_| !created).map(Before::of);
            self.undo.push(slot, key, before, Some(value));
            return Ok(());
        }
    }

    /// Takes each `(lightweight-intent object, lock name, mode)` in order, through the
    /// lightweight intent lock table when it is on, else through the lock table.
    ///
    /// An object beyond the lightweight table's capacity (a table id of 4096 or more) is
    /// locked in the lock table: sharing a counter with the object its id wraps to, table
    /// 4096 locked the database and table 4097 table 1. Each object always goes the same
    /// way, so every transaction meets every other on it in one place.
    fn coarse_lock(&mut self, cx: &mut Ctx<'_>, locks: &[(u32, LockId, LockMode)]) -> Result<()> {
        for (obj, id, mode) in locks {
            match &cx.inner().lil {
                Some(lil) if (*obj as usize) < lil.capacity() => {
                    if let Err(f) = Self::acquire_intent(lil, &mut self.intents, *obj, *mode) {
                        let e = lock_error(cx, id, f);
                        self.fail(cx, &e);
                        return Err(e);
                    }
                }
                _ => self.lock(cx, id.clone(), *mode)?,
            }
        }
        Ok(())
    }

    /// A read-modify-write under XN on `key`.
    fn rmw<T: AsRef<[u8]>>(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        f: impl FnMut(Option<&[u8]>) -> Result<T>,
    ) -> Result<T> {
        self.intent(cx, slot, true)?;
        self.lock_key(cx, slot, key, LockMode::XN)?;
        self.modify(cx, slot, key, f)
    }

    /// A point read: SN on the key (XN when the transaction goes on to write it, so the
    /// write needs no upgrade: one lock request instead of two, and no deadlock of two
    /// readers that both upgrade), under the table's read or write intent.
    fn read<T>(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        for_update: bool,
        take: impl FnOnce(&mut Vec<u8>) -> Option<T>,
    ) -> Result<Option<T>> {
        self.intent(cx, slot, for_update)?;
        let mode = if for_update {
            LockMode::XN
        } else {
            LockMode::SN
        };
        self.lock_key(cx, slot, key, mode)?;
        let hint = self.hint(slot);
        let (v, h) = cx
            .table(slot)
            .inner
            .tree
            .get_hinted_mut(key, hint, |rec| match rec {
                Some(r) if !r.ghost => take(&mut r.value),
                _ => None,
            });
        self.set_hint(slot, h);
        Ok(v)
    }
}

impl Protocol for TwoPl {
    fn get(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read(cx, slot, key, false, |v| Some(std::mem::take(v)))
    }

    fn get_into(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        for_update: bool,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        // The copy the tree made and `out` trade places: the value lands in `out` without
        // being copied again, and `out`'s old buffer becomes the tree's spare buffer.
        let got = self.read(cx, slot, key, for_update, |v| {
            std::mem::swap(v, out);
            Some(())
        })?;
        Ok(got.is_some())
    }

    fn get_for_update(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        self.read(cx, slot, key, true, |v| Some(std::mem::take(v)))
    }

    fn delete(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8]) -> Result<bool> {
        self.intent(cx, slot, true)?;
        self.lock_key(cx, slot, key, LockMode::XN)?;
        let undo = &mut self.undo;
        let deleted = cx.table(slot).inner.tree.update(key, |rec| match rec {
            Some(r) if !r.ghost => {
                undo.push(slot, key, Some(Before::of(r)), None);
                r.value.clear();
                r.ghost = true;
                true
            }
            _ => false,
        });
        match deleted {
            true => {
                self.ghosts.push((slot, key.into()));
                self.charged(cx, key, 0)?;
                Ok(true)
            }
            false => Ok(false),
        }
    }

    fn int_op(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], op: impl IntOp) -> Result<i64> {
        // Not the default: the 8-byte array goes into the record without a `Vec` of its own.
        let out = self.rmw(cx, slot, key, |cur| int_value(key, cur, &op))?;
        Ok(i64::from_le_bytes(out))
    }

    fn write(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], w: Write<'_>) -> Result<()> {
        // The engine's own function, run in place under the leaf's latch: one descent.
        self.rmw(cx, slot, key, |cur| match (cur, w) {
            (Some(_), Write::Insert(_)) => Err(Error::DuplicateKey { key: show_key(key) }),
            _ => Ok(w.value()),
        })
        .map(|_| ())
    }

    fn update(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], f: impl Modify) -> Result<usize> {
        let mut f = f;
        self.intent(cx, slot, true)?;
        self.lock_key(cx, slot, key, LockMode::XN)?;
        // The caller's function runs with no page latch held: it may panic (which left the
        // leaf latched for good, and every later access to it spinning) or run another
        // transaction on the same tree (which spun on the latch). Under XN nobody else
        // changes the value between this read and the write.
        let cur = cx
            .table(slot)
            .inner
            .tree
            .get(key, |r| r.filter(|r| !r.ghost).map(|r| r.value.clone()));
        let v = f(cur.as_deref())?;
        self.modify(cx, slot, key, |_| Ok(&v[..])).map(<[u8]>::len)
    }

    fn scan(&mut self, cx: &mut Ctx<'_>, slot: u16, span: Span<'_>) -> Result<Rows> {
        let Span { lo, hi, limit } = span;
        self.intent(cx, slot, false)?;
        let mut out = Vec::new();
        // The initial cursor lock (Table 3, ascending): on the start key itself when it
        // exists, else on the key below it, else on the table's -infinity fence.
        if self.locking {
            loop {
                let tree = &cx.table(slot).inner.tree;
                let (id, mode, prior) = match lo {
                    Bound::Unbounded => (
                        gap_id(cx, slot, None),
                        cursor_mode(CursorDir::Ascending, true, CursorStep::InitialFenceLow),
                        None,
                    ),
                    Bound::Included(k) | Bound::Excluded(k) => {
                        let incl = matches!(lo, Bound::Included(_));
                        if tree.get(k, |r| r.is_some()) {
                            (
                                key_id(cx, slot, k),
                                cursor_mode(
                                    CursorDir::Ascending,
                                    incl,
                                    CursorStep::InitialExactMatch,
                                ),
                                Some(k.to_vec()),
                            )
                        } else {
                            let p = tree.predecessor(k);
                            let step = if p.is_some() {
                                CursorStep::InitialNonExistent
                            } else {
                                CursorStep::InitialFenceLow
                            };
                            (
                                gap_id(cx, slot, p.as_deref().map(LockKey::from)),
                                cursor_mode(CursorDir::Ascending, incl, step),
                                p,
                            )
                        }
                    }
                };
                self.lock(cx, id, mode)?;
                // Validate: the locked key must still be the floor of the start bound.
                let tree = &cx.table(slot).inner.tree;
                let now = match lo {
                    Bound::Unbounded => None,
                    Bound::Included(k) | Bound::Excluded(k) => {
                        if tree.get(k, |r| r.is_some()) {
                            Some(k.to_vec())
                        } else {
                            tree.predecessor(k)
                        }
                    }
                };
                if now == prior {
                    break;
                }
            }
        }
        let next_mode = cursor_mode(CursorDir::Ascending, true, CursorStep::Next);
        let mut start: Bound<Vec<u8>> = lo.map(<[u8]>::to_vec);
        let mut leaves = Vec::new();
        loop {
            // Read (and lock) no further than the rows still wanted; ghosts are skipped, so
            // a short chunk may need another one.
            let want = SCAN_CHUNK.min(limit.saturating_sub(out.len())).max(1);
            let tree = &cx.table(slot).inner.tree;
            // The leaves the chunk came from, with their versions: when no writer has
            // latched any of them once the keys are locked, the chunk is what a second read
            // would return (`BTree::range_noting`), and the scan does without that read.
            leaves.clear();
            let mut chunk = tree.range_noting(as_ref_bound(&start), hi, want, Some(&mut leaves));
            if self.locking {
                loop {
                    for (k, _) in &chunk {
                        let id = key_id(cx, slot, k);
                        self.lock(cx, id, next_mode)?;
                    }
                    let tree = &cx.table(slot).inner.tree;
                    if leaves.iter().all(|&h| tree.unchanged_since(h)) {
                        break;
                    }
                    leaves.clear();
                    let again =
                        tree.range_noting(as_ref_bound(&start), hi, want, Some(&mut leaves));
                    let same = again.len() == chunk.len()
                        && again
                            .iter()
                            .zip(&chunk)
                            .all(|((a, ra), (b, rb))| a == b && ra.ghost == rb.ghost);
                    chunk = again;
                    if same {
                        break;
                    }
                }
            }
            let full = chunk.len() == want;
            let last = chunk.last().map(|(k, _)| k.clone());
            out.extend(
                chunk
                    .into_iter()
                    .filter(|(_, r)| !r.ghost)
                    .map(|(k, r)| (k, r.value)),
            );
            match (full, last) {
                (true, Some(k)) if out.len() < limit => start = Bound::Excluded(k),
                _ => break,
            }
        }
        Ok(out)
    }

    fn lock_coarse(&mut self, cx: &mut Ctx<'_>, locks: &[(u32, LockId, LockMode)]) -> Result<()> {
        if !self.locking {
            return Ok(());
        }
        self.coarse_lock(cx, locks)
    }

    fn commit(&mut self, cx: &mut Ctx<'_>, mode: LogMode) -> Result<CommitTicket> {
        self.commit_elr(cx, mode)
    }

    fn abort(&mut self, cx: &mut Ctx<'_>) {
        self.rollback(cx);
        self.release_all(cx);
    }

    fn counts(&self) -> (usize, usize) {
        (self.held.len(), self.undo.len())
    }
}

fn lock_error(cx: &Ctx<'_>, id: &LockId, f: LockFailure) -> Error {
    let resource = describe(&cx.inner().by_id, id);
    let blocker = |b: Option<TxnId>| b.map_or_else(|| "?".to_string(), |b| format!("txn {b}"));
    match f {
        LockFailure::Deadlock { blocker: b } => Error::Deadlock {
            txn: cx.id,
            resource,
            blocker: blocker(b),
        },
        LockFailure::Timeout { blocker: b, waited } => Error::LockTimeout {
            txn: cx.id,
            resource,
            blocker: blocker(b),
            waited_ms: waited.as_millis() as u64,
        },
        LockFailure::WouldBlock => Error::LockTimeout {
            txn: cx.id,
            resource,
            blocker: "?".to_string(),
            waited_ms: 0,
        },
    }
}

/// The mode the configured key-range design takes for a request of `mode` on `id`.
fn key_mode(cx: &Ctx<'_>, id: &LockId, mode: LockMode) -> LockMode {
    match id {
        LockId::Key(..) | LockId::NegInf(_) => cx.inner().opts.key_range_modes.map(mode),
        LockId::Database | LockId::Table(_) => mode,
    }
}

fn key_id(cx: &Ctx<'_>, slot: u16, key: &[u8]) -> LockId {
    LockId::Key(cx.table(slot).inner.id, key.into())
}

fn gap_id(cx: &Ctx<'_>, slot: u16, prior: Option<LockKey>) -> LockId {
    let tid = cx.table(slot).inner.id;
    match prior {
        Some(k) => LockId::Key(tid, k),
        None => LockId::NegInf(tid),
    }
}

/// Tells the lock table the age of this transaction's next requests (only needed when it
/// differs from the id).
fn declare_age(cx: &Ctx<'_>) {
    if cx.age != cx.id {
        crate::lock::dread::set_age(cx.id, cx.age);
    }
}

/// Renders a lock name for error messages, naming tables from the database's id registry
/// (which also holds tables the transaction locked with `lock_table` only).
fn describe(tables: &TableSlots, id: &LockId) -> String {
    let name = |tid: u32| {
        tables
            .get(tid)
            .map_or_else(|| format!("table#{tid}"), |t| format!("{:?}", t.inner.name))
    };
    match id {
        LockId::Database => "the database".to_string(),
        LockId::Table(t) => format!("table {}", name(*t)),
        LockId::NegInf(t) => format!("the -infinity fence of table {}", name(*t)),
        LockId::Key(t, k) => format!("key {} of table {}", show_key(k), name(*t)),
    }
}
