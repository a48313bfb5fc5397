//! Optimistic concurrency control after Silo (Tu et al. 2013), as described in chapter 3 of
//! Narula's thesis (Doppel's OCC baseline). Selected with
//! [`ConcurrencyControl::Optimistic`](crate::ConcurrencyControl::Optimistic); the public
//! [`Transaction`] API is the same as under two-phase locking.
//!
//! **TID words.** Every [`Record`] carries a `tid: u64`: the commit TID of the transaction that
//! last wrote it, with the top bit ([`LOCK_BIT`]) as a lock bit that a committing writer holds
//! while it validates, logs and installs. The word sits in the record in its B+-tree page; it
//! is written only under the leaf's exclusive latch and read with the value in one
//! version-validated copy of the leaf (optimistic lock coupling, `storage/btree.rs`), so a
//! reader gets value and TID atomically and the page version is the "atomic word" of Silo. A reader that finds the lock bit set retries
//! (spinning briefly, then yielding) and gives up with [`Error::Conflict`] after a few
//! milliseconds.
//!
//! **Execution.** Reads (`get`, and the read half of `insert`, `delete`, `add_and_get`, `max_and_get`, `min_and_get`)
//! first look in the transaction's write set (reads see own writes), otherwise copy value and
//! TID from the tree and append `(key, TID)` to the read set; a missing key (no record, or a
//! ghost with its TID) is recorded as well. Writes are buffered in the write set, a map
//! ordered by `(table id, key)`. `insert` reads the key (recorded) and fails with
//! [`Error::DuplicateKey`] on a live record; the recorded absence is validated at commit, so a
//! concurrent insert of the same key makes one of the two fail with a conflict. A scan records
//! its bounds and the `(key, TID)` of every entry it saw, ghosts included, and overlays the
//! transaction's own buffered writes on its result.
//!
//! **Commit.** (1) Lock the write set in `(table id, key)` order by setting the lock bit under
//! the leaf write latch; a key without a record gets a locked ghost placeholder. A record
//! locked by another committer is waited for briefly, then the transaction aborts with
//! [`Error::Conflict`]: nobody waits while holding a lock for long, and the global order rules
//! out deadlock anyway. (2) Validate: every read's record still has the same TID and is not
//! locked by another transaction (absent keys are still absent, or are our own placeholder);
//! every scanned range is read again and must show the same keys with the same TIDs, leaving
//! out our own placeholders and ignoring our own lock bits. This re-scan is the equivalent of
//! Silo's node-set validation (Silo checks leaf versions; shoal's tree has no node versions,
//! so it compares the range's contents, which also catches inserts into the range because
//! an inserter holds a locked placeholder from its lock phase to its install). (3) Pick the
//! commit TID: one more than the largest TID read, scanned or overwritten and than this
//! thread's previous commit TID — no global counter. (4) If the database has a log, append
//! the same `LogRecord::Commit` after-image record as 2PL while the write locks are held.
//! (5) Install the values with the new TID, which clears the lock bit; deletes become ghosts.
//! A failed validation releases the locks (removing our placeholders) and returns the
//! retryable [`Error::Conflict`]. Abort drops the buffers: nothing was written in place.
//!
//! **Leaf hints.** Every read keeps the [`LeafHint`] of the B+-tree leaf it found its key in
//! (Silo keeps record pointers), and a write that follows a read of its key starts from that
//! read's hint; the lock phase records the leaf it locked in. Validation, locking, installing
//! and unlocking then latch that leaf directly when it still covers the key, instead of
//! descending from the root each time. A read of a key we hold the lock bit of is validated
//! without the tree at all, against the TID the lock phase found (see `validate`).
//!
//! **Why the log order is enough for recovery.** A transaction inserts its commit record
//! while it holds the lock bits of its write set, and installs after the insert. So for
//! conflicting writers of one key the log order is their install order (write-write), and a
//! transaction that read another's value logs after it, since the value was installed after
//! its writer's log insert (write-read). Recovery replays after-images in log order, so each
//! key ends with the value of its last writer in serialization order; and any durable prefix
//! of the log is closed under these dependencies, so it is the state of a serial execution of
//! the transactions in it. Read-write anti-dependencies may appear out of log order, but
//! their write sets are disjoint and after-image replay does not read.
//!
//! **Durability.** Installed values are visible before they are durable, as with early lock
//! release: [`Elr`](crate::Elr) options do not apply to OCC. A writer's commit waits for its
//! own record ([`LogMode::Sync`]), and because its record comes after every commit it read
//! from, that covers its dependencies. A read-only transaction under `Sync` waits until the
//! log is durable up to what was released when it committed (everything it could have read
//! was logged before), so it never reports data a crash could take back (safe SX-ELR).
//! `Pipelined` returns a ticket for the same point; `Async` does not wait.
//!
//! **Ghosts.** A committed delete leaves a ghost with the delete's TID. Removing it at once
//! would let a key go absent → present → absent without a TID change for a reader that
//! recorded its absence, so ghosts are collected by epochs as in Silo §4.8 (see
//! [`reclaim`](super::reclaim)): every transaction pins an epoch before its first read, and
//! a ghost goes once every transaction that was running when it was installed has ended.
//! Removal needs no version bump for the validator: validation compares each read's TID and
//! each scanned range's keys and TIDs with the tree, so a transaction that pinned later and
//! saw the ghost finds it gone and aborts (conservatively), and one that pinned earlier holds
//! the removal back. Commit TIDs are chosen above the TID of every ghost removed so far
//! (`Reclaim::tid_floor`): TIDs here are not epoch-numbered as in Silo, so without that a key
//! inserted again after its ghost went could carry the ghost's TID, and a reader that saw the
//! ghost would miss the change. A commit's own placeholder is removed at once, when that commit aborts
//! or when it deletes a key that did not exist, since nobody can have read the placeholder
//! unlocked.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ops::Bound;

use super::commit::durable;
use super::{as_ref_bound, CommitTicket, Ctx, Modify, Protocol, Rows, Span, Write, SCAN_CHUNK};
use crate::db::{DbInner, LogMode};
use crate::doppel::SplitWrite;
use crate::error::{show_key, Error, Result};
use crate::lock::TableId;
use crate::log::record::{LogRecord, OpWrite, Write as LogWrite};
use crate::storage::btree::{LeafHint, Record};

#[cfg(test)]
mod tests;
mod tid;

pub(crate) use tid::{install_reconciled, read_committed, LOCK_BIT};
use tid::{lock_one, locked, read_once, table_of, unlock_all, validate, Spin};

thread_local! {
    /// The last commit TID chosen on this thread.
    static LAST_TID: Cell<u64> = const { Cell::new(0) };
}

/// What a read saw: no record, or a record (live or ghost) with this TID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Absent,
    Tid(u64),
}

struct Read {
    slot: u16,
    key: Box<[u8]>,
    seen: Seen,
    /// The leaf the read found `key` in (or its place): validation tries it first.
    hint: LeafHint,
}

struct ScanSet {
    slot: u16,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    /// Every entry the scan returned from the tree (ghosts included) with its TID.
    seen: Vec<(Box<[u8]>, u64)>,
    /// The leaves that entries came from, with their versions then (the node set): while
    /// none has been latched since, the scan needs no second look.
    leaves: Vec<LeafHint>,
}

struct WriteEntry {
    slot: u16,
    /// `None`: delete.
    value: Option<Vec<u8>>,
    /// Commit state: the lock bit is ours.
    locked: bool,
    /// Commit state: the record is our placeholder (there was none).
    created: bool,
    /// Commit state: the TID we overwrite.
    old_tid: u64,
    /// The leaf of `key` as last seen: from a read of the key just before the write was
    /// buffered, then from the lock phase. Locking, installing and unlocking try it first.
    hint: Option<LeafHint>,
}

/// The read, scan and write sets of an optimistic transaction.
#[derive(Default)]
struct OccState {
    reads: Vec<Read>,
    scans: Vec<ScanSet>,
    writes: BTreeMap<TableId, BTreeMap<Box<[u8]>, WriteEntry>>,
}

impl OccState {
    pub(super) fn clear(&mut self) {
        self.reads.clear();
        self.scans.clear();
        self.writes.clear();
    }

    pub(super) fn writes(&self) -> usize {
        self.writes.values().map(BTreeMap::len).sum()
    }

    fn own(&self, table: TableId, key: &[u8]) -> Option<&WriteEntry> {
        self.writes.get(&table)?.get(key)
    }
}

/// True when no key can lie between the bounds (`BTreeMap::range` panics on those).
fn empty_range(lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> bool {
    match (lo, hi) {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
        | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
        _ => false,
    }
}

/// `rows` (a scan of `lo..hi` in the tree) with this transaction's own writes in that range
/// merged in: its buffered values replace or add rows, its deletes remove them.
fn overlay(
    own: Option<&BTreeMap<Box<[u8]>, WriteEntry>>,
    lo: Bound<&[u8]>,
    hi: Bound<&[u8]>,
    rows: Rows,
) -> Rows {
    let Some(m) = own else {
        return rows;
    };
    if empty_range(lo, hi) {
        return rows;
    }
    let mut own = m.range::<[u8], _>((lo, hi)).peekable();
    if own.peek().is_none() {
        return rows;
    }
    let mut merged = Vec::with_capacity(rows.len());
    let mut rows = rows.into_iter().peekable();
    for (k, w) in own {
        while let Some(r) = rows.next_if(|(rk, _)| rk[..] < k[..]) {
            merged.push(r);
        }
        rows.next_if(|(rk, _)| rk[..] == k[..]);
        if let Some(v) = &w.value {
            merged.push((k.to_vec(), v.clone()));
        }
    }
    merged.extend(rows);
    merged
}

/// How many rows [`overlay`] would return, without building them: `rows` (sorted by key)
/// plus this transaction's buffered rows not among them, minus its deletes of rows among them.
fn overlay_len(
    own: Option<&BTreeMap<Box<[u8]>, WriteEntry>>,
    lo: Bound<&[u8]>,
    hi: Bound<&[u8]>,
    rows: &Rows,
) -> usize {
    let Some(m) = own.filter(|_| !empty_range(lo, hi)) else {
        return rows.len();
    };
    m.range::<[u8], _>((lo, hi)).fold(rows.len(), |n, (k, w)| {
        let present = rows.binary_search_by(|(rk, _)| rk[..].cmp(&k[..])).is_ok();
        match (present, w.value.is_some()) {
            (false, true) => n + 1,
            (true, false) => n - 1,
            _ => n,
        }
    })
}

/// An optimistic transaction: its read, scan and write sets, its epoch pin, and the record
/// that failed its validation.
pub(super) struct Occ {
    st: OccState,
    /// The epoch this transaction pinned before its first read, which keeps the ghosts of
    /// later deletes in place until it ends ([`reclaim`](super::reclaim)).
    pin: Option<super::reclaim::Pin>,
    /// The record (slot, key) that failed validation or stayed locked, for Doppel's
    /// classification.
    pub(super) conflict: Option<(u16, Box<[u8]>)>,
}

impl Occ {
    pub(super) fn begin(inner: &DbInner) -> Occ {
        Occ {
            st: OccState::default(),
            pin: Some(inner.reclaim.pin()),
            conflict: None,
        }
    }

    /// Drops the read, scan and write sets (the transaction was stashed).
    pub(super) fn clear(&mut self) {
        self.st.clear();
    }

    /// Ends the epoch pin, then removes the ghosts no running transaction can need any more
    /// (see [`reclaim`](super::reclaim)).
    pub(super) fn end_epoch(&mut self, cx: &Ctx<'_>) {
        if let Some(pin) = self.pin.take() {
            let reclaim = &cx.inner().reclaim;
            reclaim.unpin(pin);
            reclaim.collect_retired();
        }
    }

    /// A conflict in the middle of the transaction: it is doomed, later operations fail.
    fn fail(&mut self, cx: &mut Ctx<'_>, detail: String) -> Error {
        self.doom(cx, Error::Conflict { txn: cx.id, detail })
    }

    /// Ends the transaction with `e`: its writes are dropped, later operations and the
    /// commit fail with [`Error::TransactionAborted`].
    pub(super) fn doom(&mut self, cx: &mut Ctx<'_>, e: Error) -> Error {
        cx.failed = Some((e.to_string(), e.is_retryable()));
        self.st.clear();
        e
    }

    /// Reads `key`: from the write set, else from the tree (recorded in the read set).
    fn read(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut v = Vec::new();
        Ok(self.read_into(cx, slot, key, &mut v)?.then_some(v))
    }

    /// [`read`](Self::read) into `out` (replacing its contents when the key is live):
    /// whether it is.
    fn read_into(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        let t = cx.table(slot);
        let st = &mut self.st;
        if let Some(w) = st.own(t.inner.id, key) {
            out.clear();
            return Ok(w.value.as_ref().map(|v| out.extend_from_slice(v)).is_some());
        }
        let mut spin = Spin::new();
        let mut hint = None;
        let detail = loop {
            let (got, h) = read_once(&t.inner.tree, key, hint, out);
            if let Some((seen, live)) = got {
                st.reads.push(Read {
                    slot,
                    key: key.into(),
                    seen,
                    hint: h,
                });
                return Ok(live);
            }
            hint = Some(h);
            if !spin.wait() {
                break format!(
                    "key {} of table {:?} stayed locked by a committing transaction",
                    show_key(key),
                    t.inner.name
                );
            }
        };
        self.conflict = Some((slot, key.into()));
        Err(self.fail(cx, detail))
    }

    fn buffer(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        value: Option<Vec<u8>>,
    ) -> Result<()> {
        // A transaction that outgrows the log fails whole, as under 2PL: its commit would
        // otherwise write the part accepted before the refusal.
        if let Err(e) = cx.charge(key, value.as_ref().map_or(0, Vec::len)) {
            return Err(self.doom(cx, e));
        }
        let tid = table_of(&cx.tables, slot).inner.id;
        let st = &mut self.st;
        // A read-modify-write (`add_and_get`, `insert`, `delete`, ...) has just read the key: start
        // from the leaf that read found.
        let hint = st
            .reads
            .last()
            .filter(|r| r.slot == slot && r.key[..] == key[..])
            .map(|r| r.hint);
        let m = st.writes.entry(tid).or_default();
        match m.get_mut(key) {
            Some(w) => {
                // The write set keeps the last value only: the one replaced no longer
                // counts against the memory limit (a rewritten 2 KiB overflow value counted
                // a 32 KiB page per rewrite).
                cx.uncharge_pages(key, w.value.as_ref().map_or(0, Vec::len));
                w.value = value;
            }
            None => {
                m.insert(
                    key.into(),
                    WriteEntry {
                        slot,
                        value,
                        locked: false,
                        created: false,
                        old_tid: 0,
                        hint,
                    },
                );
            }
        }
        Ok(())
    }

    /// Silo's commit protocol up to the install (see the module documentation), with Doppel's
    /// split operations `deltas` in the log record; returns the log position to be durable
    /// at, if there is one to wait for.
    pub(super) fn validate_and_install(
        &mut self,
        cx: &mut Ctx<'_>,
        mode: LogMode,
        deltas: &[SplitWrite],
    ) -> Result<Option<u64>> {
        let mut st = std::mem::take(&mut self.st);
        let log = cx.log(mode);
        let conflict = |txn: u64, detail: String| Error::Conflict { txn, detail };
        if st.writes.is_empty() && deltas.is_empty() {
            if let Err((d, (slot, key))) = validate(&cx.tables, &st) {
                self.conflict = Some((slot, key.clone()));
                return Err(conflict(cx.id, d));
            }
            let Some(log) = log else {
                return Ok(None);
            };
            // Everything this transaction read was logged below `released`: do not report
            // it before it is durable.
            let upto = log.released();
            return Ok((log.durable() < upto).then_some(upto));
        }
        // (1) Lock the write set in (table id, key) order.
        let mut busy = None;
        'lock: for m in st.writes.values_mut() {
            for (key, w) in m.iter_mut() {
                let tree = &table_of(&cx.tables, w.slot).inner.tree;
                let mut spin = Spin::new();
                while !lock_one(tree, key, w) {
                    if !spin.wait() {
                        busy = Some((w.slot, key.clone()));
                        break 'lock;
                    }
                }
            }
        }
        if let Some((slot, key)) = busy {
            unlock_all(&cx.tables, &mut st);
            self.conflict = Some((slot, key.clone()));
            return Err(conflict(
                cx.id,
                format!(
                    "key {} of table {:?} stayed locked by another committer",
                    show_key(&key),
                    table_of(&cx.tables, slot).inner.name
                ),
            ));
        }
        // (2) Validate the reads and the scanned ranges.
        if let Err((d, (slot, key))) = validate(&cx.tables, &st) {
            unlock_all(&cx.tables, &mut st);
            self.conflict = Some((slot, key.clone()));
            return Err(conflict(cx.id, d));
        }
        // (3) The commit TID.
        // Above every removed ghost's TID too (see `Reclaim::tid_floor`).
        let mut max = LAST_TID.with(Cell::get).max(cx.inner().reclaim.tid_floor());
        for r in &st.reads {
            if let Seen::Tid(t) = r.seen {
                max = max.max(t);
            }
        }
        for s in &st.scans {
            for (_, t) in &s.seen {
                max = max.max(*t);
            }
        }
        for m in st.writes.values() {
            for w in m.values() {
                max = max.max(w.old_tid);
            }
        }
        let tid = max + 1;
        debug_assert!(tid < LOCK_BIT);
        LAST_TID.with(|c| c.set(tid));
        // (4) Log while the write locks are held.
        let mut end = None;
        if let Some(log) = log {
            let writes = st
                .writes
                .iter()
                .flat_map(|(table, m)| {
                    m.iter().map(|(key, w)| LogWrite {
                        table: *table,
                        key: key.to_vec(),
                        value: w.value.clone(),
                    })
                })
                .collect();
            let bytes = if deltas.is_empty() {
                LogRecord::Commit { txn: cx.id, writes }
            } else {
                LogRecord::Ops {
                    txn: cx.id,
                    writes,
                    ops: deltas
                        .iter()
                        .map(|(table, key, d)| OpWrite {
                            table: *table,
                            key: key.to_vec(),
                            op: d.encode(),
                        })
                        .collect(),
                }
            }
            .encode();
            match log.insert(&bytes) {
                Ok((_, e)) => end = Some(e),
                Err(e) => {
                    unlock_all(&cx.tables, &mut st);
                    cx.failed = Some((e.to_string(), e.is_retryable()));
                    return Err(e);
                }
            }
        }
        // (5) Install with the new TID (clears the lock bits). The ghosts of deletes are
        // listed for removal once no running transaction can need them (`reclaim`).
        let mut ghosts = Vec::new();
        for m in st.writes.values_mut() {
            for (key, w) in m.iter_mut() {
                let table = table_of(&cx.tables, w.slot);
                let tree = &table.inner.tree;
                let value = w.value.take();
                let created = w.created;
                if value.is_none() && !created {
                    ghosts.push((table.clone(), key.clone(), tid));
                }
                tree.update_hinted(key, w.hint, |slot| match value {
                    Some(value) => {
                        *slot = Some(Record {
                            value,
                            ghost: false,
                            tid,
                        })
                    }
                    None if created => *slot = None,
                    None => {
                        *slot = Some(Record {
                            value: Vec::new(),
                            ghost: true,
                            tid,
                        })
                    }
                });
            }
        }
        cx.inner().reclaim.retire(ghosts);
        Ok(end)
    }
}

impl Protocol for Occ {
    fn get(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read(cx, slot, key)
    }

    fn get_into(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        _for_update: bool,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        self.read_into(cx, slot, key, out)
    }

    fn write(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], w: Write<'_>) -> Result<()> {
        if matches!(w, Write::Insert(_)) && self.read(cx, slot, key)?.is_some() {
            // Report the duplicate only if what the transaction read so far still holds:
            // otherwise the key may exist only because of a write the transaction should
            // have seen earlier (two transactions that read the same counter and insert the
            // same derived key), and the right answer is a retryable conflict.
            let st = &self.st;
            if let Err((detail, (slot, key))) = validate(&cx.tables, st) {
                self.conflict = Some((slot, key.clone()));
                return Err(self.fail(cx, detail));
            }
            return Err(Error::DuplicateKey { key: show_key(key) });
        }
        self.buffer(cx, slot, key, Some(w.value().to_vec()))?;
        Ok(())
    }

    fn delete(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8]) -> Result<bool> {
        if self.read(cx, slot, key)?.is_none() {
            return Ok(false);
        }
        self.buffer(cx, slot, key, None)?;
        Ok(true)
    }

    fn update(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        mut f: impl Modify,
    ) -> Result<usize> {
        let cur = self.read(cx, slot, key)?;
        let v = f(cur.as_deref())?;
        let len = v.len();
        self.buffer(cx, slot, key, Some(v))?;
        Ok(len)
    }

    fn scan(&mut self, cx: &mut Ctx<'_>, slot: u16, span: Span<'_>) -> Result<Rows> {
        let Span { lo, hi, limit } = span;
        let table = table_of(&cx.tables, slot);
        let tree = &table.inner.tree;
        let own = self.st.writes.get(&table.inner.id);
        let mut seen = Vec::new();
        let mut leaves = Vec::new();
        let mut chunk_leaves = Vec::new();
        let mut out = Vec::new();
        let mut start: Bound<Vec<u8>> = lo.map(<[u8]>::to_vec);
        // The part of the range the scan covered: all of it, or up to the last key read
        // when the limit stopped it (only that part is validated at commit).
        let covered: Bound<Vec<u8>> = loop {
            let want = SCAN_CHUNK.min(limit.saturating_sub(out.len())).max(1);
            let mut spin = Spin::new();
            let chunk = loop {
                chunk_leaves.clear();
                let c = tree.range_noting(as_ref_bound(&start), hi, want, Some(&mut chunk_leaves));
                if c.iter().all(|(_, r)| !locked(r.tid)) {
                    leaves.append(&mut chunk_leaves);
                    break c;
                }
                if !spin.wait() {
                    return Err(self.fail(
                        cx,
                        format!(
                            "a scan of table {:?} met a key that stayed locked by a committer",
                            table.inner.name
                        ),
                    ));
                }
            };
            let full = chunk.len() == want;
            let last = chunk.last().map(|(k, _)| k.clone());
            for (k, r) in chunk {
                seen.push((k.clone().into_boxed_slice(), r.tid));
                if !r.ghost {
                    out.push((k, r.value));
                }
            }
            match (full, last) {
                (true, Some(k)) => {
                    // Enough rows once this transaction's own writes up to `k` are merged in
                    // (its deletes may hide some, its inserts add some)?
                    if limit != usize::MAX
                        && overlay_len(own, lo, Bound::Included(&k[..]), &out) >= limit
                    {
                        break Bound::Included(k);
                    }
                    start = Bound::Excluded(k);
                }
                _ => break hi.map(<[u8]>::to_vec),
            }
        };
        let mut rows = overlay(own, lo, as_ref_bound(&covered), out);
        rows.truncate(limit);
        self.st.scans.push(ScanSet {
            slot,
            lo: lo.map(<[u8]>::to_vec),
            hi: covered,
            seen,
            leaves,
        });
        Ok(rows)
    }

    fn commit(&mut self, cx: &mut Ctx<'_>, mode: LogMode) -> Result<CommitTicket> {
        let r = self
            .validate_and_install(cx, mode, &[])
            .and_then(|lsn| durable(cx.log(mode), lsn, mode));
        self.end_epoch(cx);
        r
    }

    fn abort(&mut self, cx: &mut Ctx<'_>) {
        self.end_epoch(cx);
    }

    fn counts(&self) -> (usize, usize) {
        (0, self.st.writes())
    }
}
