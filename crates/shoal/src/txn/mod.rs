//! Transactions under strict two-phase locking with key-range locks.
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
//!   is still busy then is deferred and retried by later transactions: [`reclaim`]);
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

use std::ops::{Bound, Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};
use std::time::Duration;

use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::db::{ConcurrencyControl, Database, Elr, LogMode, Table, TableSlots};
use crate::error::{show_key, Error, Result};
use crate::lock::intent::PrivateIntents;
use crate::lock::modes::{cursor_mode, CursorDir, CursorStep, Part};
use crate::lock::{LockFailure, LockId, LockMode, TxnId};
use crate::log::record::{LogRecord, Write as LogWrite};
use crate::storage::btree::Record;

pub(crate) mod backoff;
mod epoch;
mod extra;
pub(crate) mod occ;
pub(crate) mod reclaim;
mod split;

/// The atomics `epoch` uses (std's here; shuttle's in the model-checking test).
mod epoch_sync {
    pub(super) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
}

/// Entries read from the tree per scan round; each round is locked and validated on its own.
const SCAN_CHUNK: usize = 256;

/// One undo entry: the before-image of a record this transaction changed.
struct Undo {
    table: u16,
    key: Box<[u8]>,
    /// `None`: the record did not exist; abort turns it into a ghost.
    before: Option<Record>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    /// Insert or replace.
    Put,
    /// Insert only: fail on a live record.
    Insert,
}

/// A transaction. Obtain one from [`Database::begin`] or use [`Database::run`].
///
/// Every operation takes the locks it needs and holds them until [`commit`](Self::commit) or
/// [`abort`](Self::abort) (strict two-phase locking), so the transactions of a database are
/// serializable. An operation that fails with a retryable error ([`Error::is_retryable`])
/// rolls the transaction back at once (so its locks stop blocking others); later operations
/// then fail with [`Error::TransactionAborted`]. Dropping an unfinished transaction aborts it.
///
/// Under [`ConcurrencyControl::Optimistic`] the same API runs Silo-style optimistic
/// concurrency control instead: operations take no locks, writes are buffered until commit,
/// and [`commit`](Self::commit) validates what the transaction read and fails with the
/// retryable [`Error::Conflict`] if another transaction changed it. Until then a transaction
/// may observe data that validation will reject, so keep decisions with outside effects until
/// after the commit.
///
/// ```
/// # fn main() -> shoal::Result<()> {
/// let db = shoal::Database::in_memory();
/// let t = db.create_table("t")?;
/// let mut tx = db.begin();
/// tx.put(&t, b"a", b"1")?;
/// assert_eq!(tx.get(&t, b"a")?, Some(b"1".to_vec())); // reads its own writes
/// tx.commit()?;
/// # Ok(())
/// # }
/// ```
pub struct Transaction<'db> {
    db: &'db Database,
    id: TxnId,
    /// The timestamp wait-die, wound-wait and the kill-young victim policy order by: the id,
    /// or the first attempt's id for a restart ([`Database::begin_retry`]).
    age: TxnId,
    locking: bool,
    timeout: Duration,
    failed: Option<String>,
    /// Log bytes the writes so far would take (see `charge`).
    redo_bytes: std::cell::Cell<u64>,
    finished: bool,
    _serial: Option<MutexGuard<'db, ()>>,
    held: FxHashMap<LockId, LockMode>,
    /// Intent locks held in the lightweight intent lock table (when it is on).
    intents: PrivateIntents,
    /// The tables this transaction used, borrowed from the database's append-only registry
    /// (`DbInner::by_id`); operations name them by their index here.
    tables: Vec<&'db Table>,
    undo: Vec<Undo>,
    /// Keys this transaction turned into ghosts (deleted, or inserted and then aborted):
    /// candidates for removal once its locks are gone.
    ghosts: Vec<(u16, Box<[u8]>)>,
    /// How `commit` is acknowledged.
    commit_mode: LogMode,
    /// Highest early-lock-release tag (a commit LSN) seen on a lock this transaction took.
    max_tag: u64,
    /// Safe SX-ELR is on: collect tags.
    track_tags: bool,
    /// The read, scan and write sets under optimistic concurrency control (`None` under the
    /// other modes).
    occ: Option<Box<occ::OccState>>,
    /// Optimistic concurrency control: the epoch this transaction pinned before its first
    /// read, which keeps the ghosts of later deletes in place until it ends ([`reclaim`]).
    epoch_pin: Option<reclaim::Pin>,
    /// Doppel: the phase this transaction runs in, its split write set and statistics
    /// (`None` under the other modes).
    dop: Option<Box<split::DopTxn>>,
    /// Admitted through the database's admission gate: its end must be reported.
    admitted: bool,
}

/// Tells when a commit made with [`Transaction::commit_pipelined`] is durable.
#[derive(Clone, Debug)]
pub struct CommitTicket {
    state: Option<Arc<TicketState>>,
}

#[derive(Debug, Default)]
struct TicketState {
    outcome: Mutex<Option<std::result::Result<(), String>>>,
    cv: Condvar,
}

impl TicketState {
    fn set(&self, r: std::result::Result<(), String>) {
        *self.outcome.lock() = Some(r);
        self.cv.notify_all();
    }
}

impl CommitTicket {
    fn done() -> Self {
        CommitTicket { state: None }
    }

    fn pending() -> Self {
        CommitTicket {
            state: Some(Arc::new(TicketState::default())),
        }
    }

    /// True once the commit is on stable storage.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// let mut tx = db.begin();
    /// tx.put(&t, "k", "v")?;
    /// // Without a log there is nothing to wait for.
    /// assert!(tx.commit_pipelined()?.is_durable());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_durable(&self) -> bool {
        match &self.state {
            None => true,
            Some(st) => matches!(*st.outcome.lock(), Some(Ok(()))),
        }
    }

    /// Blocks until the commit is durable; fails if the log failed first (then the commit
    /// may or may not survive a crash).
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// let mut tx = db.begin();
    /// tx.put(&t, "k", "v")?;
    /// tx.commit_pipelined()?.wait()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait(&self) -> Result<()> {
        let Some(st) = &self.state else {
            return Ok(());
        };
        // A wait: it holds no admission slot (nor one kept for a next transaction).
        crate::admission::blocking(|| self.wait_outcome(st))
    }

    fn wait_outcome(&self, st: &TicketState) -> Result<()> {
        let mut g = st.outcome.lock();
        loop {
            match &*g {
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => {
                    return Err(Error::Io {
                        path: std::path::PathBuf::from("<log>"),
                        source: std::io::Error::other(e.clone()),
                    })
                }
                None => st.cv.wait(&mut g),
            }
        }
    }
}

/// True for modes that lock something exclusively (key, gap or intent).
fn has_exclusive(m: LockMode) -> bool {
    !matches!(
        m,
        LockMode::N | LockMode::S | LockMode::NS | LockMode::SN | LockMode::IS
    )
}

/// Puts back the before-image of every write in `undo`, newest first; keys that did not exist
/// become ghosts (listed in `ghosts` for removal).
fn undo_writes(
    undo: &mut Vec<Undo>,
    tables: &[impl std::borrow::Borrow<Table>],
    ghosts: &mut Vec<(u16, Box<[u8]>)>,
) {
    while let Some(u) = undo.pop() {
        let table: &Table = tables[u.table as usize].borrow();
        let mut ghost = false;
        table.inner.tree.update(&u.key, |rec| match u.before {
            Some(r) => *rec = Some(r),
            None => {
                if let Some(r) = rec.as_mut() {
                    r.ghost = true;
                    r.value = Vec::new();
                    ghost = true;
                }
            }
        });
        if ghost {
            ghosts.push((u.table, u.key));
        }
    }
}

impl<'db> Transaction<'db> {
    pub(crate) fn new(db: &'db Database, age: Option<TxnId>) -> Self {
        let inner = &db.inner;
        let cc = inner.opts.cc;
        let locking = cc == ConcurrencyControl::TwoPhaseLocking;
        // First of all, so that the wait to run counts in the transaction's latency.
        let admitted = inner.gate.as_ref().is_some_and(crate::admission::begin);
        let optimistic = matches!(
            cc,
            ConcurrencyControl::Optimistic | ConcurrencyControl::Doppel
        );
        let serial = (cc == ConcurrencyControl::Serial).then(|| {
            inner
                .serial
                .try_lock()
                .unwrap_or_else(|| crate::admission::blocking(|| inner.serial.lock()))
        });
        let id = inner
            .next_txn
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Transaction {
            db,
            id,
            age: age.map_or(id, |a| a.min(id)),
            locking,
            timeout: inner.opts.lock_timeout,
            failed: None,
            redo_bytes: std::cell::Cell::new(0),
            finished: false,
            _serial: serial,
            held: FxHashMap::default(),
            intents: PrivateIntents::default(),
            tables: Vec::new(),
            undo: Vec::new(),
            ghosts: Vec::new(),
            commit_mode: inner.log_mode,
            max_tag: 0,
            track_tags: locking && inner.opts.elr == Elr::Sx && inner.log.is_some(),
            occ: optimistic.then(Box::default),
            epoch_pin: optimistic.then(|| inner.reclaim.pin()),
            dop: split::DopTxn::begin(db),
            admitted,
        }
    }

    /// This transaction's id. Ids grow with begin order, so a smaller id is an older
    /// transaction.
    ///
    /// ```
    /// let db = shoal::Database::in_memory();
    /// let a = db.begin();
    /// let b = db.begin();
    /// assert!(a.id() < b.id());
    /// ```
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The transaction's age: the timestamp by which wait-die and wound-wait
    /// ([`DeadlockPolicy`](crate::lock::DeadlockPolicy)) and the kill-young victim policy
    /// tell older from younger. It is the id, unless the transaction was begun with
    /// [`Database::begin_retry`] to restart an aborted one: then it keeps that one's age, so
    /// that a transaction that keeps being restarted grows older and eventually wins.
    ///
    /// ```
    /// let db = shoal::Database::in_memory();
    /// let first = db.begin();
    /// let age = first.age();
    /// first.abort();
    /// let _other = db.begin();
    /// let retry = db.begin_retry(age);
    /// assert_eq!(retry.age(), age);
    /// assert!(retry.id() > age);
    /// ```
    pub fn age(&self) -> TxnId {
        self.age
    }

    /// Tells the lock table the age of this transaction's next requests (only needed when
    /// it differs from the id).
    fn declare_age(&self) {
        if self.age != self.id {
            crate::lock::dread::set_age(self.id, self.age);
        }
    }

    // ----- checks ---------------------------------------------------------------------------

    fn active(&self) -> Result<()> {
        if let Some(log) = &self.db.inner.log {
            log.check()?;
        }
        match &self.failed {
            None => Ok(()),
            Some(cause) => Err(Error::TransactionAborted {
                txn: self.id,
                cause: cause.clone(),
            }),
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        let max = self.db.inner.opts.max_key_len;
        if key.len() > max {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max,
            });
        }
        Ok(())
    }

    fn check_value(&self, value: &[u8]) -> Result<()> {
        let max = self.db.inner.opts.max_value_len;
        if value.len() > max {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max,
            });
        }
        Ok(())
    }

    /// Counts a write against the largest commit record the log takes, refusing the write
    /// that would outgrow it (limits are checked where the data enters, not at commit).
    fn charge(&self, key: &[u8], value_len: usize) -> Result<()> {
        let max = self.db.inner.record_limit;
        // Table id, key and value lengths, a tag: at most 16 bytes besides key and value.
        let bytes = self.redo_bytes.get() + 16 + key.len() as u64 + value_len as u64;
        if bytes > max {
            return Err(Error::TransactionTooLarge {
                txn: self.id,
                bytes,
                max,
            });
        }
        self.redo_bytes.set(bytes);
        Ok(())
    }

    /// [`charge`](Self::charge) for a write already made under 2PL: a transaction that
    /// outgrows the log is rolled back and fails.
    fn charged(&mut self, key: &[u8], value_len: usize) -> Result<()> {
        self.charge(key, value_len).inspect_err(|e| self.fail(e))
    }

    /// Fails unless `table` belongs to this transaction's database.
    fn check_table(&self, table: &Table) -> Result<()> {
        if table.inner.db_id != self.db.inner.id {
            return Err(Error::ForeignTable {
                name: table.inner.name.clone(),
            });
        }
        Ok(())
    }

    /// Validates the table handle and returns its slot in `self.tables`.
    fn table_slot(&mut self, table: &Table) -> Result<u16> {
        self.check_table(table)?;
        if let Some(i) = self
            .tables
            .iter()
            .position(|t| t.inner.id == table.inner.id)
        {
            return Ok(i as u16);
        }
        let t = self
            .db
            .inner
            .by_id
            .get(table.inner.id)
            .ok_or_else(|| Error::NoSuchTable {
                name: table.inner.name.clone(),
            })?;
        self.tables.push(t);
        Ok((self.tables.len() - 1) as u16)
    }

    // ----- locking --------------------------------------------------------------------------

    /// Rolls back, releases every lock and remembers why: later operations fail.
    fn fail(&mut self, err: &Error) {
        self.failed = Some(err.to_string());
        self.rollback();
        self.release_all();
    }

    fn lock_error(&self, id: &LockId, f: LockFailure) -> Error {
        let resource = describe(&self.db.inner.by_id, id);
        let blocker = |b: Option<TxnId>| b.map_or_else(|| "?".to_string(), |b| format!("txn {b}"));
        match f {
            LockFailure::Deadlock { blocker: b } => Error::Deadlock {
                txn: self.id,
                resource,
                blocker: blocker(b),
            },
            LockFailure::Timeout { blocker: b, waited } => Error::LockTimeout {
                txn: self.id,
                resource,
                blocker: blocker(b),
                waited_ms: waited.as_millis() as u64,
            },
            LockFailure::WouldBlock => Error::LockTimeout {
                txn: self.id,
                resource,
                blocker: "?".to_string(),
                waited_ms: 0,
            },
        }
    }

    /// The mode the configured key-range design takes for a request of `mode` on `id`.
    fn key_mode(&self, id: &LockId, mode: LockMode) -> LockMode {
        match id {
            LockId::Key(..) | LockId::NegInf(_) => self.db.inner.opts.key_range_modes.map(mode),
            LockId::Database | LockId::Table(_) => mode,
        }
    }

    /// Takes `mode` on `id` until the end of the transaction (a no-op when a held lock
    /// covers it).
    fn lock(&mut self, id: LockId, mode: LockMode) -> Result<()> {
        if !self.locking {
            return Ok(());
        }
        let mode = self.key_mode(&id, mode);
        if let Some(&h) = self.held.get(&id) {
            if h.covers(mode) {
                return Ok(());
            }
        }
        self.declare_age();
        match self.acquire(&id, mode) {
            Ok(m) => {
                if self.track_tags {
                    self.max_tag = self.max_tag.max(self.db.inner.locks.tag(&id));
                }
                self.held.insert(id, m);
                Ok(())
            }
            Err(f) => {
                let e = self.lock_error(&id, f);
                self.fail(&e);
                Err(e)
            }
        }
    }

    /// Takes `mode` on `id` for an instant: returns whether the caller must release it with
    /// [`unlock_instant`](Self::unlock_instant) (false when the transaction already held a
    /// lock there, which it then keeps, converted).
    fn lock_instant(&mut self, id: &LockId, mode: LockMode) -> Result<bool> {
        if !self.locking {
            return Ok(false);
        }
        let mode = self.key_mode(id, mode);
        if self.held.contains_key(id) {
            self.lock(id.clone(), mode)?;
            return Ok(false);
        }
        self.declare_age();
        match self.acquire(id, mode) {
            Ok(_) => Ok(true),
            Err(f) => {
                let e = self.lock_error(id, f);
                self.fail(&e);
                Err(e)
            }
        }
    }

    /// Requests `mode` on `id` from the lock table: at once if it can be granted, else
    /// waiting without an admission slot (a waiter must not keep a running slot from the
    /// transaction it waits for).
    fn acquire(&self, id: &LockId, mode: LockMode) -> std::result::Result<LockMode, LockFailure> {
        let locks = &self.db.inner.locks;
        let Some(gate) = self.db.inner.gate.as_deref().filter(|_| self.admitted) else {
            return locks.lock(self.id, id, mode, self.timeout);
        };
        match locks.try_lock(self.id, id, mode) {
            Err(LockFailure::WouldBlock) => {}
            r => return r,
        }
        // The holder most likely runs in another slot and is done within microseconds: a
        // short spin saves two slot hand-overs (each a wake-up of a parked thread). Its clock
        // starts only here: the common, uncontended request reads no clock.
        let spin = crate::admission::LockSpin::new();
        loop {
            match locks.try_lock(self.id, id, mode) {
                Err(LockFailure::WouldBlock) if spin.again(gate) => {}
                // Waiting in its slot keeps the number of transactions in the system at the
                // slot count, so a hot lock's queue cannot grow into a convoy of parked
                // threads that each need a wake-up (TPC-C Payment with one warehouse: a
                // queue of 64 ran at a tenth of the 2-thread rate). At least one slot stays
                // with a thread that is not waiting, so the holder always gets to run; and
                // a thread resuming (perhaps the holder) gets this one's slot at once.
                Err(LockFailure::WouldBlock) if gate.waiting().1 == 0 && gate.wait_in_slot() => {
                    let r = locks.lock(self.id, id, mode, self.timeout);
                    gate.end_wait_in_slot();
                    return r;
                }
                Err(LockFailure::WouldBlock) => {
                    return crate::admission::blocking(|| {
                        locks.lock(self.id, id, mode, self.timeout)
                    })
                }
                r => return r,
            }
        }
    }

    /// [`acquire`](Self::acquire) for the lightweight intent lock table.
    fn acquire_intent(
        lil: &crate::lock::intent::LightweightIntentLocks,
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

    fn unlock_instant(&mut self, id: &LockId, taken: bool) {
        if taken {
            self.db.inner.locks.unlock(self.id, id);
        }
    }

    fn intent(&mut self, slot: u16, write: bool) -> Result<()> {
        if !self.locking {
            return Ok(());
        }
        let mode = if write { LockMode::IX } else { LockMode::IS };
        let tid = self.tables[slot as usize].inner.id;
        if let Some(lil) = &self.db.inner.lil {
            // Lightweight intent locks (Kimura §3.2): counters, not lock-table queues.
            // Object 0 is the database, object `t` table `t`.
            for (obj, id) in [(0, LockId::Database), (tid, LockId::Table(tid))] {
                if let Err(f) = Self::acquire_intent(lil, &mut self.intents, obj, mode) {
                    let e = self.lock_error(&id, f);
                    self.fail(&e);
                    return Err(e);
                }
            }
            return Ok(());
        }
        self.lock(LockId::Database, mode)?;
        self.lock(LockId::Table(tid), mode)
    }

    fn key_id(&self, slot: u16, key: &[u8]) -> LockId {
        LockId::Key(self.tables[slot as usize].inner.id, key.into())
    }

    fn gap_id(&self, slot: u16, prior: Option<Vec<u8>>) -> LockId {
        let tid = self.tables[slot as usize].inner.id;
        match prior {
            Some(k) => LockId::Key(tid, k.into_boxed_slice()),
            None => LockId::NegInf(tid),
        }
    }

    fn release_all(&mut self) {
        if self.locking {
            let locks = &self.db.inner.locks;
            for (id, _) in self.held.drain() {
                locks.unlock(self.id, &id);
            }
        }
        self.release_intents();
        self.collect_ghosts();
    }

    fn release_intents(&mut self) {
        if let Some(lil) = &self.db.inner.lil {
            if !self.intents.is_empty() {
                lil.release_all(&mut self.intents);
            }
        }
    }

    /// Removes this transaction's ghosts whose locks are free, defers the others (see
    /// [`reclaim`]).
    fn collect_ghosts(&mut self) {
        let ghosts = std::mem::take(&mut self.ghosts);
        let tables = &self.tables;
        self.db.inner.reclaim.collect_locked(
            &*self.db.inner.locks,
            self.locking,
            ghosts.into_iter().map(|(s, k)| (tables[s as usize], k)),
        );
    }

    /// Ends an optimistic transaction's epoch pin, then removes the ghosts no running
    /// transaction can need any more (see [`reclaim`]).
    fn occ_end(&mut self) {
        if let Some(pin) = self.epoch_pin.take() {
            let reclaim = &self.db.inner.reclaim;
            reclaim.unpin(pin);
            reclaim.collect_retired();
        }
    }

    /// Releases the held locks whose mode satisfies `pred` (S-ELR).
    fn release_matching(&mut self, pred: impl Fn(LockMode) -> bool) {
        if !self.locking {
            return;
        }
        let locks = &self.db.inner.locks;
        let id = self.id;
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
    fn release_all_tagged(&mut self, tag: u64) {
        if self.locking {
            let locks = &self.db.inner.locks;
            for (lid, m) in self.held.drain() {
                if has_exclusive(m) {
                    locks.unlock_tagged(self.id, &lid, tag);
                } else {
                    locks.unlock(self.id, &lid);
                }
            }
        }
        self.release_intents();
        self.collect_ghosts();
    }

    fn rollback(&mut self) {
        undo_writes(&mut self.undo, &self.tables, &mut self.ghosts);
    }

    // ----- operations -----------------------------------------------------------------------

    /// Reads the value of `key`, or `None` if absent. Takes SN on the key (held to commit), so
    /// neither the value nor its absence can change under this transaction.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| tx.put(&t, "k", "v"))?;
    /// assert_eq!(db.run(|tx| tx.get(&t, "k"))?, Some(b"v".to_vec()));
    /// assert_eq!(db.run(|tx| tx.get(&t, "nope"))?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn get(&mut self, table: &Table, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        let key = key.as_ref();
        self.active()?;
        self.check_key(key)?;
        let slot = self.table_slot(table)?;
        self.dop_access(slot, key, split::OpClass::Read)?;
        if self.occ.is_some() {
            return self.occ_read(slot, key);
        }
        self.intent(slot, false)?;
        self.lock(self.key_id(slot, key), LockMode::SN)?;
        Ok(table.inner.tree.get(key, |rec| match rec {
            Some(r) if !r.ghost => Some(r.value.clone()),
            _ => None,
        }))
    }

    /// Reads an 8-byte little-endian integer value, or `None` if absent.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| tx.add(&t, "n", 5).map(|_| ()))?;
    /// assert_eq!(db.run(|tx| tx.get_i64(&t, "n"))?, Some(5));
    /// db.run(|tx| tx.put(&t, "s", "text"))?;
    /// assert!(matches!(db.run(|tx| tx.get_i64(&t, "s")), Err(shoal::Error::NotAnInteger { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn get_i64(&mut self, table: &Table, key: impl AsRef<[u8]>) -> Result<Option<i64>> {
        let key = key.as_ref();
        match self.get(table, key)? {
            None => Ok(None),
            Some(v) => decode_i64(key, &v).map(Some),
        }
    }

    /// Writes `value` at `key`, inserting it or replacing the old value.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| { tx.put(&t, "k", "1")?; tx.put(&t, "k", "2") })?;
    /// assert_eq!(db.run(|tx| tx.get(&t, "k"))?, Some(b"2".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn put(
        &mut self,
        table: &Table,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<()> {
        self.write(table, key.as_ref(), value.as_ref(), WriteKind::Put)
    }

    /// Inserts a new key; fails with [`Error::DuplicateKey`] if it is present (the transaction
    /// stays usable after that error).
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| tx.insert(&t, "k", "1"))?;
    /// assert!(matches!(db.run(|tx| tx.insert(&t, "k", "2")), Err(shoal::Error::DuplicateKey { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn insert(
        &mut self,
        table: &Table,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<()> {
        self.write(table, key.as_ref(), value.as_ref(), WriteKind::Insert)
    }

    fn write(&mut self, table: &Table, key: &[u8], value: &[u8], kind: WriteKind) -> Result<()> {
        self.active()?;
        self.check_key(key)?;
        self.check_value(value)?;
        let slot = self.table_slot(table)?;
        let class = match kind {
            WriteKind::Put => split::OpClass::Write,
            WriteKind::Insert => split::OpClass::Read,
        };
        self.dop_access(slot, key, class)?;
        if self.occ.is_some() {
            return self.occ_write(slot, key, value, kind);
        }
        self.intent(slot, true)?;
        self.lock(self.key_id(slot, key), LockMode::XN)?;
        self.modify(slot, key, |cur| match cur {
            Some(_) if kind == WriteKind::Insert => Err(Error::DuplicateKey { key: show_key(key) }),
            _ => Ok(value.to_vec()),
        })
        .map(|_| ())
    }

    /// The common write path: with XN held on `key`, replaces the live value (or creates the
    /// record) with what `f` computes from the current live value.
    fn modify<T>(
        &mut self,
        slot: u16,
        key: &[u8],
        mut f: impl FnMut(Option<&[u8]>) -> Result<T>,
    ) -> Result<T>
    where
        T: AsRef<[u8]>,
    {
        let tree = &self.tables[slot as usize].inner.tree;
        // Live record or ghost: update in place (the XN lock makes it ours).
        enum Step<T> {
            Done(T),
            Failed(Error),
            /// No record; the prior key if the leaf showed it (a hint for the insert).
            Absent(Option<Option<Vec<u8>>>),
        }
        let mut before = None;
        let step = tree.update_with_prior(key, |rec, prior| match rec {
            Some(r) => {
                let cur = if r.ghost { None } else { Some(&r.value[..]) };
                match f(cur) {
                    Ok(v) => {
                        before = Some(r.clone());
                        r.value.clear();
                        r.value.extend_from_slice(v.as_ref());
                        r.ghost = false;
                        Step::Done(v)
                    }
                    Err(e) => Step::Failed(e),
                }
            }
            None => Step::Absent(prior.map(|p| p.map(<[u8]>::to_vec))),
        });
        match step {
            Step::Done(v) => {
                self.undo.push(Undo {
                    table: slot,
                    key: key.into(),
                    before,
                });
                self.charged(key, v.as_ref().len())?;
                Ok(v)
            }
            Step::Failed(e) => Err(e),
            Step::Absent(prior) => {
                let v = f(None)?;
                self.insert_new(slot, key, v.as_ref(), prior)?;
                self.charged(key, v.as_ref().len())?;
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
        slot: u16,
        key: &[u8],
        value: &[u8],
        mut hint: Option<Option<Vec<u8>>>,
    ) -> Result<()> {
        loop {
            let tree = &self.tables[slot as usize].inner.tree;
            let prior = match hint.take() {
                Some(p) => p,
                None => tree.predecessor(key),
            };
            let gap = self.gap_id(slot, prior.clone());
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
                self.lock(self.key_id(slot, key), LockMode::key_range(Part::X, g))?;
            }
            let taken = self.lock_instant(&gap, LockMode::NX)?;
            let tree = &self.tables[slot as usize].inner.tree;
            let mut created = false;
            let mut before = None;
            let mut put = |rec: &mut Option<Record>| match rec {
                None => {
                    *rec = Some(Record {
                        value: value.to_vec(),
                        ghost: false,
                        tid: 0,
                    });
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
            let moved = tree.update_with_prior(key, |rec, now| match now {
                Some(now) if now != prior.as_deref() => Some(true),
                Some(_) => {
                    put(rec);
                    Some(false)
                }
                None => None,
            });
            let moved = match moved {
                Some(m) => m,
                None if tree.predecessor(key) != prior => true,
                None => {
                    tree.update(key, &mut put);
                    false
                }
            };
            if moved {
                // A ghost in the gap went away, or the prior key changed before our lock:
                // look again.
                self.unlock_instant(&gap, taken);
                continue;
            }
            self.unlock_instant(&gap, taken);
            self.undo.push(Undo {
                table: slot,
                key: key.into(),
                before: if created { None } else { before },
            });
            return Ok(());
        }
    }

    /// Deletes `key`; returns whether a live record was there. The record becomes a ghost
    /// that is removed once no transaction needs it.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| tx.put(&t, "k", "v"))?;
    /// assert!(db.run(|tx| tx.delete(&t, "k"))?);
    /// assert!(!db.run(|tx| tx.delete(&t, "k"))?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn delete(&mut self, table: &Table, key: impl AsRef<[u8]>) -> Result<bool> {
        let key = key.as_ref();
        self.active()?;
        self.check_key(key)?;
        let slot = self.table_slot(table)?;
        self.dop_access(slot, key, split::OpClass::Read)?;
        if self.occ.is_some() {
            return self.occ_delete(slot, key);
        }
        self.intent(slot, true)?;
        self.lock(self.key_id(slot, key), LockMode::XN)?;
        let mut before = None;
        table.inner.tree.update(key, |rec| {
            if let Some(r) = rec.as_mut() {
                if !r.ghost {
                    before = Some(Record {
                        value: std::mem::take(&mut r.value),
                        ghost: false,
                        tid: 0,
                    });
                    r.ghost = true;
                }
            }
        });
        match before {
            Some(b) => {
                self.undo.push(Undo {
                    table: slot,
                    key: key.into(),
                    before: Some(b),
                });
                self.ghosts.push((slot, key.into()));
                self.charged(key, 0)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Adds `delta` to the 8-byte integer at `key` (a missing key counts as 0) and returns the
    /// new value. Fails with [`Error::NotAnInteger`] on a value that is not 8 bytes and
    /// [`Error::Overflow`] when the sum does not fit.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// assert_eq!(db.run(|tx| tx.add(&t, "n", 2))?, 2);
    /// assert_eq!(db.run(|tx| tx.add(&t, "n", -5))?, -3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn add(&mut self, table: &Table, key: impl AsRef<[u8]>, delta: i64) -> Result<i64> {
        self.int_op(table, key.as_ref(), |cur| {
            cur.unwrap_or(0).checked_add(delta)
        })
    }

    /// Stores the larger of the current integer and `v` (a missing key takes `v`); returns
    /// the stored value.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// assert_eq!(db.run(|tx| tx.max(&t, "bid", 10))?, 10);
    /// assert_eq!(db.run(|tx| tx.max(&t, "bid", 7))?, 10);
    /// # Ok(())
    /// # }
    /// ```
    pub fn max(&mut self, table: &Table, key: impl AsRef<[u8]>, v: i64) -> Result<i64> {
        self.int_op(table, key.as_ref(), |cur| Some(cur.map_or(v, |c| c.max(v))))
    }

    /// Stores the smaller of the current integer and `v` (a missing key takes `v`); returns
    /// the stored value.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// assert_eq!(db.run(|tx| tx.min(&t, "low", 10))?, 10);
    /// assert_eq!(db.run(|tx| tx.min(&t, "low", 7))?, 7);
    /// # Ok(())
    /// # }
    /// ```
    pub fn min(&mut self, table: &Table, key: impl AsRef<[u8]>, v: i64) -> Result<i64> {
        self.int_op(table, key.as_ref(), |cur| Some(cur.map_or(v, |c| c.min(v))))
    }

    fn int_op(
        &mut self,
        table: &Table,
        key: &[u8],
        op: impl Fn(Option<i64>) -> Option<i64>,
    ) -> Result<i64> {
        self.active()?;
        self.check_key(key)?;
        let slot = self.table_slot(table)?;
        self.dop_access(slot, key, split::OpClass::Read)?;
        if self.occ.is_some() {
            return self.occ_int_op(slot, key, op);
        }
        self.intent(slot, true)?;
        self.lock(self.key_id(slot, key), LockMode::XN)?;
        let out = self.modify(slot, key, |cur| {
            let cur = cur.map(|c| decode_i64(key, c)).transpose()?;
            op(cur)
                .map(i64::to_le_bytes)
                .ok_or_else(|| Error::Overflow { key: show_key(key) })
        })?;
        Ok(i64::from_le_bytes(out))
    }

    /// Reads every live record with a key in `range`, in ascending key order. Takes the
    /// cursor locks of Kimura Table 3, so the result (including the absence of other keys in
    /// the range: no phantoms) holds until the transaction ends.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| { for k in ["a", "b", "c", "d"] { tx.put(&t, k, k)?; } Ok(()) })?;
    /// let rows = db.run(|tx| tx.scan(&t, "b"..="c"))?;
    /// assert_eq!(rows, vec![(b"b".to_vec(), b"b".to_vec()), (b"c".to_vec(), b"c".to_vec())]);
    /// assert_eq!(db.run(|tx| tx.scan(&t, ..))?.len(), 4);
    /// # Ok(())
    /// # }
    /// ```
    pub fn scan(&mut self, table: &Table, range: impl KeyRange) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let (lo, hi) = range.key_bounds();
        self.scan_impl(table, lo, hi)
    }

    /// Like [`scan`](Self::scan) but in descending key order.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| { for k in ["a", "b", "c"] { tx.put(&t, k, "")?; } Ok(()) })?;
    /// let keys: Vec<Vec<u8>> = db.run(|tx| tx.scan_rev(&t, ..))?.into_iter().map(|(k, _)| k).collect();
    /// assert_eq!(keys, vec![b"c".to_vec(), b"b".to_vec(), b"a".to_vec()]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn scan_rev(
        &mut self,
        table: &Table,
        range: impl KeyRange,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let (lo, hi) = range.key_bounds();
        let mut rows = self.scan_impl(table, lo, hi)?;
        rows.reverse();
        Ok(rows)
    }

    fn scan_impl(
        &mut self,
        table: &Table,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.active()?;
        for b in [lo, hi] {
            if let Bound::Included(k) | Bound::Excluded(k) = b {
                if k.len() > self.db.inner.opts.max_key_len {
                    return Err(Error::KeyTooLarge {
                        len: k.len(),
                        max: self.db.inner.opts.max_key_len,
                    });
                }
            }
        }
        let slot = self.table_slot(table)?;
        self.dop_scan(slot, lo, hi)?;
        if self.occ.is_some() {
            return self.occ_scan(slot, lo, hi);
        }
        self.intent(slot, false)?;
        let mut out = Vec::new();
        // The initial cursor lock (Table 3, ascending): on the start key itself when it
        // exists, else on the key below it, else on the table's -infinity fence.
        if self.locking {
            loop {
                let tree = &self.tables[slot as usize].inner.tree;
                let (id, mode, prior) = match lo {
                    Bound::Unbounded => (
                        self.gap_id(slot, None),
                        cursor_mode(CursorDir::Ascending, true, CursorStep::InitialFenceLow),
                        None,
                    ),
                    Bound::Included(k) | Bound::Excluded(k) => {
                        let incl = matches!(lo, Bound::Included(_));
                        if tree.get(k, |r| r.is_some()) {
                            (
                                self.key_id(slot, k),
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
                                self.gap_id(slot, p.clone()),
                                cursor_mode(CursorDir::Ascending, incl, step),
                                p,
                            )
                        }
                    }
                };
                self.lock(id, mode)?;
                // Validate: the locked key must still be the floor of the start bound.
                let tree = &self.tables[slot as usize].inner.tree;
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
        loop {
            let tree = &self.tables[slot as usize].inner.tree;
            let mut chunk = tree.range(as_ref_bound(&start), hi, SCAN_CHUNK);
            if self.locking {
                loop {
                    for (k, _) in &chunk {
                        self.lock(self.key_id(slot, k), next_mode)?;
                    }
                    let tree = &self.tables[slot as usize].inner.tree;
                    let again = tree.range(as_ref_bound(&start), hi, SCAN_CHUNK);
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
            let full = chunk.len() == SCAN_CHUNK;
            let last = chunk.last().map(|(k, _)| k.clone());
            out.extend(
                chunk
                    .into_iter()
                    .filter(|(_, r)| !r.ghost)
                    .map(|(k, r)| (k, r.value)),
            );
            match (full, last) {
                (true, Some(k)) => start = Bound::Excluded(k),
                _ => break,
            }
        }
        Ok(out)
    }

    /// Commits: makes every write visible to later transactions and releases the locks.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// let mut tx = db.begin();
    /// tx.put(&t, "k", "v")?;
    /// tx.commit()?;
    /// assert!(db.run(|tx| tx.get(&t, "k"))?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub fn commit(mut self) -> Result<()> {
        let mode = self.commit_mode;
        self.finish_commit(mode).map(|_| ())
    }

    /// Commits with a flush pipeline (Johnson et al. 2009; Kimura §4.3): returns as soon as
    /// the commit record is in the log buffer, so the calling thread can go on with its next
    /// transaction, and hands back a [`CommitTicket`] that tells when the commit is durable.
    /// Unless early lock release is on, the transaction's locks are held until then (by the
    /// flush daemon, not by this thread). Without a log the ticket is durable at once.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    /// let t = db.create_table("t")?;
    /// let mut tx = db.begin();
    /// tx.put(&t, "k", "v")?;
    /// let ticket = tx.commit_pipelined()?;
    /// ticket.wait()?; // durable now
    /// assert!(ticket.is_durable());
    /// # Ok(())
    /// # }
    /// ```
    pub fn commit_pipelined(mut self) -> Result<CommitTicket> {
        self.finish_commit(LogMode::Pipelined)
    }

    /// Chooses how this transaction's commit is acknowledged, overriding
    /// [`Options::log`](crate::Options::log). Ignored when the database has no log.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    /// let t = db.create_table("t")?;
    /// let mut tx = db.begin();
    /// tx.set_log_mode(shoal::LogMode::Async); // this one may be lost in a crash
    /// tx.put(&t, "k", "v")?;
    /// tx.commit()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_log_mode(&mut self, mode: LogMode) {
        if self.db.inner.log.is_some() && mode != LogMode::None {
            self.commit_mode = mode;
        }
    }

    fn finish_commit(&mut self, mode: LogMode) -> Result<CommitTicket> {
        if self.occ.is_some() {
            let r = self.occ_commit(mode);
            self.occ_end();
            return r;
        }
        self.active()?;
        let inner = &self.db.inner;
        let log = match &inner.log {
            Some(log) if mode != LogMode::None => log,
            _ => {
                self.undo.clear();
                self.finished = true;
                self.release_all();
                return Ok(CommitTicket::done());
            }
        };
        let elr = inner.opts.elr;
        if self.undo.is_empty() {
            // Read-only. Under safe SX-ELR it may have read data whose commit is not durable
            // yet: it must not return before that commit is (Kimura §5.3, Algorithm 7).
            self.finished = true;
            self.release_all();
            if elr == Elr::Sx && self.max_tag > log.durable() {
                crate::admission::commit_wait(log, self.max_tag, false)?;
            }
            return Ok(CommitTicket::done());
        }
        if elr == Elr::Shared {
            // S-ELR: shared locks go at the commit request.
            self.release_matching(|m| !has_exclusive(m));
        }
        let bytes = self.redo_record().encode();
        // The commit record enters the buffer while the exclusive locks are still held, so a
        // transaction that depends on this one logs its commit after it: commit order = log
        // order.
        let end = match log.insert(&bytes) {
            Ok((_, end)) => end,
            Err(e) => {
                // Not in the log: roll back and report (the log is unusable now).
                self.fail(&e);
                self.finished = true;
                return Err(e);
            }
        };
        // While this transaction holds its exclusive locks, nobody has seen its writes: if the
        // log fails before the commit is durable they are rolled back, so a failed commit
        // leaves no trace. Under SX-ELR they are visible already; the failed log refuses
        // every later operation instead (see `Transaction::active`).
        let keep_undo = matches!(elr, Elr::Off | Elr::Shared) && mode != LogMode::Async;
        if !keep_undo {
            self.undo.clear();
        }
        self.finished = true;
        if matches!(elr, Elr::Sx | Elr::SxUnsafe) {
            // SX-ELR: every lock goes once the commit record is in the buffer; X locks leave
            // their commit LSN as a tag on the queue for later readers.
            self.release_all_tagged(end);
        }
        match mode {
            LogMode::Sync => {
                let r = crate::admission::commit_wait(
                    log,
                    end,
                    !self.held.is_empty() || !self.intents.is_empty(),
                );
                if r.is_err() {
                    self.rollback();
                }
                self.undo.clear();
                self.release_all();
                r.map(|()| CommitTicket::done())
            }
            LogMode::Async | LogMode::None => {
                self.release_all();
                Ok(CommitTicket::done())
            }
            LogMode::Pipelined => {
                let ticket = CommitTicket::pending();
                let state = ticket.state.clone();
                // Locks still held (no ELR) travel with the callback and are released by the
                // flush daemon when the commit is durable.
                let held: Vec<LockId> = self.held.drain().map(|(id, _)| id).collect();
                let mut intents = std::mem::take(&mut self.intents);
                let lil = inner.lil.clone();
                let mut ghosts = std::mem::take(&mut self.ghosts);
                let mut undo = std::mem::take(&mut self.undo);
                // Owned handles: the callback outlives this borrow of the database.
                let tables: Vec<Table> = self.tables.iter().map(|&t| t.clone()).collect();
                let locks = std::sync::Arc::clone(&inner.locks);
                let reclaim = std::sync::Arc::clone(&inner.reclaim);
                let (id, locking) = (self.id, self.locking);
                // The thread's flush pipeline grows until this commit is durable (the
                // kill-short / kill-long victim policies compare these lengths).
                let pipe = crate::lock::dread::pipeline_handle();
                pipe.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                log.on_durable(
                    end,
                    Box::new(move |res| {
                        // The ticket first: once another transaction can take these locks
                        // (and see the writes), the ticket must already say durable.
                        // A commit that will never be durable is rolled back before its
                        // locks go (without ELR nobody has seen its writes).
                        if res.is_err() {
                            undo_writes(&mut undo, &tables, &mut ghosts);
                        }
                        undo.clear();
                        if let Some(st) = state {
                            st.set(res);
                        }
                        for l in &held {
                            locks.unlock(id, l);
                        }
                        if let Some(lil) = lil {
                            lil.release_all(&mut intents);
                        }
                        reclaim.collect_locked(
                            &*locks,
                            locking,
                            ghosts.into_iter().map(|(s, k)| (&tables[s as usize], k)),
                        );
                        pipe.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                    }),
                );
                log.request_flush();
                Ok(ticket)
            }
        }
    }

    /// Aborts: undoes every write and releases the locks. Dropping an unfinished transaction
    /// does the same.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// let mut tx = db.begin();
    /// tx.put(&t, "k", "v")?;
    /// tx.abort();
    /// assert!(db.run(|tx| tx.get(&t, "k"))?.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn abort(mut self) {
        self.finish_abort();
    }

    /// The commit record: the after-image of every key this transaction changed.
    fn redo_record(&self) -> LogRecord {
        let mut seen: FxHashSet<(u16, &[u8])> = FxHashSet::default();
        let mut writes = Vec::new();
        for u in &self.undo {
            if seen.insert((u.table, &u.key)) {
                let t = &self.tables[u.table as usize];
                let value = t
                    .inner
                    .tree
                    .get(&u.key, |r| r.filter(|r| !r.ghost).map(|r| r.value.clone()));
                writes.push(LogWrite {
                    table: t.inner.id,
                    key: u.key.to_vec(),
                    value,
                });
            }
        }
        LogRecord::Commit {
            txn: self.id,
            writes,
        }
    }

    fn finish_abort(&mut self) {
        if !self.finished {
            self.finished = true;
            self.rollback();
            self.release_all();
        }
        self.occ_end();
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        self.finish_abort();
        self.dop_end();
        if self.admitted {
            crate::admission::end();
        }
    }
}

impl std::fmt::Debug for Transaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("id", &self.id)
            .field("locks_held", &self.held.len())
            .field(
                "writes",
                &self.occ.as_ref().map_or(self.undo.len(), |o| o.writes()),
            )
            .field("failed", &self.failed)
            .finish()
    }
}

/// A range of keys for [`Transaction::scan`]: any Rust range (`..`, `a..b`, `a..=b`, `a..`,
/// `..b`, `..=b`) or a pair of [`Bound`]s, over anything that is bytes (`&[u8]`, `&[u8; N]`,
/// `Vec<u8>`, `&str`, ...).
///
/// ```
/// use shoal::KeyRange;
/// use std::ops::Bound;
/// let (lo, hi) = (b"a"..b"c").key_bounds();
/// assert_eq!((lo, hi), (Bound::Included(&b"a"[..]), Bound::Excluded(&b"c"[..])));
/// assert_eq!((..).key_bounds(), (Bound::Unbounded, Bound::Unbounded));
/// let pair: (Bound<&str>, Bound<&str>) = (Bound::Excluded("a"), Bound::Unbounded);
/// assert_eq!(pair.key_bounds().0, Bound::Excluded(&b"a"[..]));
/// ```
pub trait KeyRange {
    /// The lower and upper bound as byte slices.
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>);
}

fn bound_of<K: AsRef<[u8]>>(b: Bound<&K>) -> Bound<&[u8]> {
    b.map(|k| k.as_ref())
}

impl KeyRange for RangeFull {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (Bound::Unbounded, Bound::Unbounded)
    }
}

impl<K: AsRef<[u8]>> KeyRange for Range<K> {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (
            Bound::Included(self.start.as_ref()),
            Bound::Excluded(self.end.as_ref()),
        )
    }
}

impl<K: AsRef<[u8]>> KeyRange for RangeInclusive<K> {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (
            Bound::Included(self.start().as_ref()),
            Bound::Included(self.end().as_ref()),
        )
    }
}

impl<K: AsRef<[u8]>> KeyRange for RangeFrom<K> {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (Bound::Included(self.start.as_ref()), Bound::Unbounded)
    }
}

impl<K: AsRef<[u8]>> KeyRange for RangeTo<K> {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (Bound::Unbounded, Bound::Excluded(self.end.as_ref()))
    }
}

impl<K: AsRef<[u8]>> KeyRange for RangeToInclusive<K> {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (Bound::Unbounded, Bound::Included(self.end.as_ref()))
    }
}

impl<K: AsRef<[u8]>> KeyRange for (Bound<K>, Bound<K>) {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (bound_of(self.0.as_ref()), bound_of(self.1.as_ref()))
    }
}

fn as_ref_bound(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn decode_i64(key: &[u8], v: &[u8]) -> Result<i64> {
    let bytes: [u8; 8] = v.try_into().map_err(|_| Error::NotAnInteger {
        key: show_key(key),
        len: v.len(),
    })?;
    Ok(i64::from_le_bytes(bytes))
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
