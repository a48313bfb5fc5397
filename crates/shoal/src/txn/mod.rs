//! Transactions: the public [`Transaction`] as a facade over one concurrency-control
//! protocol.
//!
//! The facade does what every protocol needs done the same way: it checks keys, values and
//! table handles, resolves a table to its slot in the transaction's table list, counts the
//! log bytes of the writes, refuses operations once the transaction has failed, takes part
//! in admission control, and reports the end of the transaction. It then hands the operation
//! to the protocol the database runs, once per operation, through the [`Protocol`] trait:
//!
//! - [`twopl`]: strict two-phase locking with key-range locks (`TwoPhaseLocking`), and the
//!   same code without locks for `Serial` and `None`;
//! - [`occ`]: Silo-style optimistic concurrency control (`Optimistic`);
//! - [`doppel`]: Doppel's phases over that OCC (`Doppel`).
//!
//! Commit machinery that more than one protocol uses (durability tickets, the wait for the
//! log) is in [`commit`], with two-phase locking's commit and its early lock release.
//! [`reclaim`] removes the ghosts of deletes once no transaction needs them.

use std::cell::Cell;
use std::ops::{Bound, RangeBounds};

use parking_lot::MutexGuard;

use crate::db::{ConcurrencyControl, Database, DbInner, LogMode, Table};
use crate::error::{show_key, Error, Result};
use crate::lock::{LockId, LockMode, TxnId};
use crate::log::buffer::LogBuffer;

pub(crate) mod backoff;
mod blind;
mod commit;
mod doppel;
mod epoch;
mod extra;
pub(crate) mod occ;
mod range;
pub(crate) mod reclaim;
mod twopl;
mod undo;

pub use commit::CommitTicket;
pub use range::KeyRange;

/// The atomics `epoch` uses (std's here; shuttle's in the model-checking test).
mod epoch_sync {
    pub(super) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
}

/// `Ok` when `len` is at most `max`, else the error `too_large(len, max)` makes.
#[inline]
fn at_most(len: usize, max: usize, too_large: impl FnOnce(usize, usize) -> Error) -> Result<()> {
    if len > max {
        Err(too_large(len, max))
    } else {
        Ok(())
    }
}

/// Entries read from the tree per scan round; each round is locked and validated on its own.
const SCAN_CHUNK: usize = 256;

/// What a scan returns: `(key, value)` in ascending key order.
type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// The new value of a read-modify-write, from the current one (`None`: no live record).
trait Modify: FnMut(Option<&[u8]>) -> Result<Vec<u8>> {}
impl<F: FnMut(Option<&[u8]>) -> Result<Vec<u8>>> Modify for F {}

/// An integer update (`add_and_get` and its kin): the new value from the current one
/// (`None`: absent), or `None` on overflow.
trait IntOp: Fn(Option<i64>) -> Option<i64> {}
impl<F: Fn(Option<i64>) -> Option<i64>> IntOp for F {}

/// What a scan asks a protocol for: the first `limit` visible rows of `lo..hi` in key order
/// (`usize::MAX`: all).
#[derive(Clone, Copy)]
struct Span<'k> {
    lo: Bound<&'k [u8]>,
    hi: Bound<&'k [u8]>,
    limit: usize,
}

/// What `put` and `insert` hand a protocol: the new value, and whether a live record may be
/// replaced.
#[derive(Clone, Copy)]
enum Write<'v> {
    /// Insert or replace.
    Put(&'v [u8]),
    /// Insert only: fail on a live record.
    Insert(&'v [u8]),
}

impl<'v> Write<'v> {
    /// The value to store.
    fn value(self) -> &'v [u8] {
        match self {
            Write::Put(v) | Write::Insert(v) => v,
        }
    }
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
    cx: Ctx<'db>,
    /// The protocol's own state.
    cc: Cc,
    finished: bool,
    /// `Serial`: the database's one mutex, held from begin to end.
    _serial: Option<SerialTurn<'db>>,
    /// How `commit` is acknowledged.
    commit_mode: LogMode,
}

thread_local! {
    /// The databases whose `Serial` mutex this thread holds (see [`SerialTurn`]).
    static SERIAL_TURNS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A `Serial` transaction's hold of its database's mutex, known to its thread: a checkpoint
/// asked for inside it would wait for the mutex its own thread holds.
struct SerialTurn<'db> {
    _guard: MutexGuard<'db, ()>,
    db: u64,
}

impl<'db> SerialTurn<'db> {
    fn new(guard: MutexGuard<'db, ()>, db: u64) -> Self {
        let _ = SERIAL_TURNS.try_with(|t| t.borrow_mut().push(db));
        SerialTurn { _guard: guard, db }
    }
}

impl Drop for SerialTurn<'_> {
    fn drop(&mut self) {
        let _ = SERIAL_TURNS.try_with(|t| {
            let mut t = t.borrow_mut();
            if let Some(i) = t.iter().position(|&d| d == self.db) {
                t.swap_remove(i);
            }
        });
    }
}

/// Whether this thread holds database `db`'s `Serial` mutex (a transaction of it is open).
pub(crate) fn holds_serial_turn(db: u64) -> bool {
    SERIAL_TURNS
        .try_with(|t| t.borrow().contains(&db))
        .unwrap_or(false)
}

/// What every protocol uses of its transaction: the database, the ids, the tables it named,
/// the log bytes of its writes, and why it failed.
struct Ctx<'db> {
    db: &'db Database,
    id: TxnId,
    /// The timestamp wait-die, wound-wait and the kill-young victim policy order by: the id,
    /// or the first attempt's id for a restart ([`Database::begin_retry`]).
    age: TxnId,
    /// Why the transaction failed, and whether that failure was retryable.
    failed: Option<(String, bool)>,
    /// Log bytes the writes so far would take (see `charge`).
    redo_bytes: Cell<u64>,
    /// Table-page bytes the writes so far will take when installed (see `charge`): an
    /// overflow value takes whole pages, far more than its log bytes.
    page_bytes: Cell<u64>,
    /// The tables this transaction used, borrowed from the database's append-only registry
    /// (`DbInner::by_id`); operations name them by their index here. Inline up to eight
    /// (TPC-C's NewOrder uses eight tables): a transaction allocates nothing for them.
    tables: smallvec::SmallVec<[&'db Table; 8]>,
    /// Admitted through the database's admission gate: its end must be reported.
    admitted: bool,
}

/// The protocol a transaction runs, with its state. Two-phase locking's state is small and
/// inline (the common case; boxing it would cost an allocation per transaction); the
/// optimistic ones are boxed, as they were before they had a type of their own.
#[allow(clippy::large_enum_variant)]
enum Cc {
    Locking(twopl::TwoPl),
    Optimistic(Box<occ::Occ>),
    Doppel(Box<doppel::DoppelTxn>),
}

/// Runs `$e` with `$p` bound to the protocol state of `$cc` (a `&mut Cc`): the one place an
/// operation chooses its protocol.
macro_rules! dispatch {
    ($cc:expr, $p:ident => $e:expr) => {
        match $cc {
            Cc::Locking($p) => $e,
            Cc::Optimistic($p) => $e,
            Cc::Doppel($p) => $e,
        }
    };
}
use dispatch;

/// A concurrency-control protocol, as the facade sees it. Every operation comes with its
/// checks done and its table resolved to `slot` (an index into `cx.tables`).
trait Protocol {
    fn get(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// A read of a key the transaction goes on to write: a plain read unless the protocol
    /// can prepare the write (2PL locks it exclusively at once).
    fn get_for_update(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        self.get(cx, slot, key)
    }

    /// [`get`](Self::get) (or [`get_for_update`](Self::get_for_update)) into `out`: whether
    /// the key was there (`out` is cleared when not).
    fn get_into(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        for_update: bool,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        let v = if for_update {
            self.get_for_update(cx, slot, key)?
        } else {
            self.get(cx, slot, key)?
        };
        out.clear();
        Ok(v.map(|v| out.extend_from_slice(&v)).is_some())
    }

    /// `put` and `insert` (an insert of a present key fails with `DuplicateKey`). Every
    /// protocol has its own: a default through [`update`](Self::update) would run 2PL's
    /// latch-safe `update`, which reads the record before writing it.
    fn write(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], w: Write<'_>) -> Result<()>;

    fn delete(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8]) -> Result<bool>;

    /// `add_and_get`, `max_and_get`, `min_and_get`: stores `op(current integer)`, as a
    /// read-modify-write ([`update`](Self::update)) unless the protocol can do better.
    fn int_op(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], op: impl IntOp) -> Result<i64> {
        let mut out = 0;
        self.update(cx, slot, key, |cur| {
            let new = int_value(key, cur, &op)?;
            out = i64::from_le_bytes(new);
            Ok(new.to_vec())
        })?;
        Ok(out)
    }

    /// Replaces the value with `f(current value)`; returns the new value's length.
    fn update(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], f: impl Modify) -> Result<usize>;

    /// A blind commutative operation (`add`, `max`, ...): a read-modify-write, unless the
    /// protocol can do better (Doppel's split records).
    fn blind(
        &mut self,
        cx: &mut Ctx<'_>,
        slot: u16,
        key: &[u8],
        delta: crate::doppel::Delta,
    ) -> Result<()> {
        let max = cx.inner().opts.max_value_len;
        self.update(cx, slot, key, |cur| blind_value(key, cur, &delta, max))
            .map(|_| ())
    }

    /// The first `limit` visible rows of `lo..hi` in key order (`usize::MAX`: all), read
    /// under the protocol's phantom protection for the part of the range it covered.
    fn scan(&mut self, cx: &mut Ctx<'_>, slot: u16, span: Span<'_>) -> Result<Rows>;

    /// Takes coarse locks (`lock_table`, `lock_database`): each `(lightweight-intent object,
    /// lock name, mode)` in order. Only a locking protocol has anything to do.
    fn lock_coarse(&mut self, _cx: &mut Ctx<'_>, _locks: &[(u32, LockId, LockMode)]) -> Result<()> {
        Ok(())
    }

    /// Commits; the facade has checked that the transaction is still active.
    fn commit(&mut self, cx: &mut Ctx<'_>, mode: LogMode) -> Result<CommitTicket>;

    /// Undoes what the transaction did (it did not commit).
    fn abort(&mut self, cx: &mut Ctx<'_>);

    /// The transaction is over, committed or not (its handle is being dropped).
    fn end(&mut self, _cx: &mut Ctx<'_>) {}

    /// (locks held, writes), for `Debug`.
    fn counts(&self) -> (usize, usize);
}

impl<'db> Ctx<'db> {
    fn inner(&self) -> &'db DbInner {
        &self.db.inner
    }

    /// The table in slot `slot`.
    fn table(&self, slot: u16) -> &'db Table {
        self.tables[slot as usize]
    }

    /// The log a commit in `mode` goes to (`None` without a log or in `LogMode::None`).
    fn log(&self, mode: LogMode) -> Option<&'db LogBuffer> {
        match &self.inner().log {
            Some(log) if mode != LogMode::None => Some(log),
            _ => None,
        }
    }

    fn active(&self) -> Result<()> {
        if let Some(log) = &self.inner().log {
            log.check()?;
        }
        match &self.failed {
            None => Ok(()),
            Some((cause, retryable)) => Err(Error::TransactionAborted {
                txn: self.id,
                cause: cause.clone(),
                retryable: *retryable,
            }),
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        at_most(key.len(), self.inner().opts.max_key_len, |len, max| {
            Error::KeyTooLarge { len, max }
        })
    }

    /// The check of a key that only looks a record up (a read, a delete, a scan's bound):
    /// non-empty and no longer than a page guarantees room for. A key longer than
    /// `max_key_len` cannot be written, but one written under a larger limit (a database
    /// reopened with a smaller one) can still be read and deleted.
    fn check_lookup_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        at_most(key.len(), crate::storage::page::MAX_KEY, |len, max| {
            Error::KeyTooLarge { len, max }
        })
    }

    fn check_value(&self, value: &[u8]) -> Result<()> {
        at_most(value.len(), self.inner().opts.max_value_len, |len, max| {
            Error::ValueTooLarge { len, max }
        })
    }

    /// Counts a write against the largest commit record the log takes, refusing the write
    /// that would outgrow it (limits are checked where the data enters, not at commit).
    fn charge(&self, key: &[u8], value_len: usize) -> Result<()> {
        let max = self.inner().record_limit;
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
        let stored = crate::storage::stored_len(value_len);
        self.page_bytes
            .set(self.page_bytes.get() + 16 + key.len() as u64 + stored as u64);
        Ok(())
    }

    /// Takes back the page bytes [`charge`](Self::charge) counted for a buffered write that a
    /// later write of the same key replaced (its log bytes stay: the limit on the commit
    /// record is checked per write, as the record was before it was deduplicated).
    fn uncharge_pages(&self, key: &[u8], value_len: usize) {
        let stored = 16 + key.len() as u64 + crate::storage::stored_len(value_len) as u64;
        self.page_bytes
            .set(self.page_bytes.get().saturating_sub(stored));
    }

    /// Fails unless `table` belongs to this transaction's database.
    fn check_table(&self, table: &Table) -> Result<()> {
        if table.inner.db_id != self.inner().id {
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
            .inner()
            .by_id
            .get(table.inner.id)
            .ok_or_else(|| Error::NoSuchTable {
                name: table.inner.name.clone(),
            })?;
        self.tables.push(t);
        Ok((self.tables.len() - 1) as u16)
    }
}

impl<'db> Transaction<'db> {
    pub(crate) fn new(db: &'db Database, age: Option<TxnId>) -> Self {
        let inner = &db.inner;
        let cc = inner.opts.cc;
        // First of all, so that the wait to run counts in the transaction's latency.
        let admitted = inner.gate.as_ref().is_some_and(crate::admission::begin);
        let serial = (cc == ConcurrencyControl::Serial).then(|| {
            let guard = inner
                .serial
                .try_lock()
                .unwrap_or_else(|| crate::admission::blocking(|| inner.serial.lock()));
            SerialTurn::new(guard, inner.id)
        });
        let id = inner
            .next_txn
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cc = match cc {
            ConcurrencyControl::Optimistic | ConcurrencyControl::Doppel => {
                let occ = occ::Occ::begin(inner);
                match inner.doppel() {
                    Some(rt) => Cc::Doppel(Box::new(doppel::DoppelTxn::begin(rt, occ))),
                    None => Cc::Optimistic(Box::new(occ)),
                }
            }
            _ => Cc::Locking(twopl::TwoPl::new(
                inner,
                cc == ConcurrencyControl::TwoPhaseLocking,
            )),
        };
        Transaction {
            cx: Ctx {
                db,
                id,
                age: age.map_or(id, |a| a.min(id)),
                failed: None,
                redo_bytes: Cell::new(0),
                page_bytes: Cell::new(0),
                tables: smallvec::SmallVec::new(),
                admitted,
            },
            cc,
            finished: false,
            _serial: serial,
            commit_mode: inner.log_mode,
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
        self.cx.id
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
    pub fn age(&self) -> u64 {
        self.cx.age
    }

    /// The common opening of a lookup (a read or a delete): the transaction is active, the
    /// key one a lookup takes, the table this database's; returns the table's slot.
    fn open(&mut self, table: &Table, key: &[u8]) -> Result<u16> {
        self.cx.active()?;
        self.cx.check_lookup_key(key)?;
        self.cx.table_slot(table)
    }

    /// [`open`](Self::open) for a write that may add to the tables: the key within
    /// `max_key_len`, refused at the memory limit
    /// ([`Options::memory_limit`](crate::Options::memory_limit)).
    fn open_write(&mut self, table: &Table, key: &[u8]) -> Result<u16> {
        self.cx.active()?;
        self.cx.check_key(key)?;
        let slot = self.cx.table_slot(table)?;
        self.check_room(table, key.len())?;
        Ok(slot)
    }

    /// Refuses a write at the memory limit ([`Options::memory_limit`](crate::Options::memory_limit)).
    /// Under OCC and Doppel the transaction's earlier writes wait in its write set until
    /// commit, so they count too (as the page bytes they will take: counted as their log
    /// bytes, values just past the inline limit, each taking a 32 KiB overflow page,
    /// went 15 times past the limit): counting the tables' pages alone, one
    /// transaction installed megabytes into a database limited to 256 KiB. So do the `adding`
    /// bytes of this write (a 16 MiB value went into a database limited to 1 MiB), and the
    /// pages other tables freed and keep for themselves (only `table`'s own freed pages
    /// are room for it: filling one table, emptying it and filling another held twice the
    /// limit).
    fn check_room(&self, table: &Table, adding: usize) -> Result<()> {
        room(self.cx.inner(), table, self.pending_bytes(), adding)
    }

    /// The bytes of buffered writes [`check_room`](Self::check_room) counts (OCC and Doppel).
    fn pending_bytes(&self) -> u64 {
        match self.cx.inner().opts.cc {
            ConcurrencyControl::Optimistic | ConcurrencyControl::Doppel => self.cx.page_bytes.get(),
            _ => 0,
        }
    }

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
        let slot = self.open(table, key)?;
        dispatch!(&mut self.cc, p => p.get(&mut self.cx, slot, key))
    }

    /// Reads the value of `key` that this transaction goes on to write (SQL's `SELECT ...
    /// FOR UPDATE`, RocksDB's `GetForUpdate`). Under two-phase locking it takes XN on the
    /// key at once instead of SN: the write that follows needs no lock upgrade, so the
    /// read-then-write costs one lock request instead of two, and two transactions that
    /// read the same row before writing it queue at the read instead of deadlocking at
    /// their upgrades. Under OCC and Doppel it is [`get`](Self::get): the write is checked
    /// at commit either way.
    ///
    /// It behaves as `get` in every other respect; calling it on a key the transaction
    /// never writes is correct but blocks other readers under 2PL until the end.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("stock")?;
    /// db.run(|tx| tx.put(&t, "item-7", 20u32.to_le_bytes()))?;
    /// // Take two from the stock: read it for update, then write it.
    /// db.run(|tx| {
    ///     let v = tx.get_for_update(&t, "item-7")?.unwrap_or_default();
    ///     let q = u32::from_le_bytes(v.try_into().unwrap_or_default());
    ///     tx.put(&t, "item-7", (q - 2).to_le_bytes())
    /// })?;
    /// assert_eq!(db.run(|tx| tx.get(&t, "item-7"))?, Some(18u32.to_le_bytes().to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn get_for_update(
        &mut self,
        table: &Table,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<Vec<u8>>> {
        let key = key.as_ref();
        let slot = self.open(table, key)?;
        dispatch!(&mut self.cc, p => p.get_for_update(&mut self.cx, slot, key))
    }

    /// [`get`](Self::get) into a buffer the caller keeps: the value replaces `out`'s
    /// contents, and the return value says whether the key was there (`out` is left empty
    /// when not, or on an error). A caller that reads many rows with one buffer saves the
    /// allocation `get` makes for each value (under two-phase locking, `None` and `Serial`
    /// the read allocates nothing at all).
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| {
    ///     tx.put(&t, "a", "1")?;
    ///     tx.put(&t, "b", "22")
    /// })?;
    /// let mut buf = Vec::new();
    /// let mut total = 0;
    /// db.run(|tx| {
    ///     for k in ["a", "b", "c"] {
    ///         if tx.get_into(&t, k, &mut buf)? {
    ///             total += buf.len();
    ///         }
    ///     }
    ///     Ok(())
    /// })?;
    /// assert_eq!(total, 3);
    /// assert!(buf.is_empty()); // "c" is absent
    /// # Ok(())
    /// # }
    /// ```
    pub fn get_into(
        &mut self,
        table: &Table,
        key: impl AsRef<[u8]>,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        self.read_into(table, key.as_ref(), false, out)
    }

    /// [`get_for_update`](Self::get_for_update) into a buffer the caller keeps, as
    /// [`get_into`](Self::get_into) does for `get`.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("stock")?;
    /// db.run(|tx| tx.put(&t, "item-7", 20u32.to_le_bytes()))?;
    /// let mut buf = Vec::new();
    /// db.run(|tx| {
    ///     tx.get_for_update_into(&t, "item-7", &mut buf)?;
    ///     let q = u32::from_le_bytes(buf[..].try_into().unwrap_or_default());
    ///     tx.put(&t, "item-7", (q - 2).to_le_bytes())
    /// })?;
    /// assert_eq!(db.run(|tx| tx.get(&t, "item-7"))?, Some(18u32.to_le_bytes().to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn get_for_update_into(
        &mut self,
        table: &Table,
        key: impl AsRef<[u8]>,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        self.read_into(table, key.as_ref(), true, out)
    }

    fn read_into(
        &mut self,
        table: &Table,
        key: &[u8],
        for_update: bool,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        out.clear();
        let slot = self.open(table, key)?;
        let r = dispatch!(&mut self.cc, p => p.get_into(&mut self.cx, slot, key, for_update, out));
        if !matches!(r, Ok(true)) {
            out.clear();
        }
        r
    }

    /// Reads an 8-byte little-endian integer value, or `None` if absent.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| tx.add_and_get(&t, "n", 5).map(|_| ()))?;
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
        self.write(table, key.as_ref(), Write::Put(value.as_ref()))
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
        self.write(table, key.as_ref(), Write::Insert(value.as_ref()))
    }

    fn write(&mut self, table: &Table, key: &[u8], w: Write<'_>) -> Result<()> {
        self.cx.active()?;
        self.cx.check_key(key)?;
        self.cx.check_value(w.value())?;
        let slot = self.cx.table_slot(table)?;
        self.check_room(
            table,
            key.len() + crate::storage::stored_len(w.value().len()),
        )?;
        dispatch!(&mut self.cc, p => p.write(&mut self.cx, slot, key, w))
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
        let slot = self.open(table, key)?;
        dispatch!(&mut self.cc, p => p.delete(&mut self.cx, slot, key))
    }

    /// Adds `delta` to the 8-byte integer at `key` (a missing key counts as 0) and returns the
    /// new value. Fails with [`Error::NotAnInteger`] on a value that is not 8 bytes and
    /// [`Error::Overflow`] when the sum does not fit.
    ///
    /// Returning the new value makes this a read of the record: under Doppel it cannot run on
    /// a split record's per-worker slice (the transaction is stashed until the next joined
    /// phase). When the caller does not need the result, [`add`](Self::add) is the
    /// commutative form that Doppel can split.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// assert_eq!(db.run(|tx| tx.add_and_get(&t, "n", 2))?, 2);
    /// assert_eq!(db.run(|tx| tx.add_and_get(&t, "n", -5))?, -3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn add_and_get(&mut self, table: &Table, key: impl AsRef<[u8]>, delta: i64) -> Result<i64> {
        self.int_op(table, key.as_ref(), |cur| {
            cur.unwrap_or(0).checked_add(delta)
        })
    }

    /// Stores the larger of the current integer and `v` (a missing key takes `v`); returns
    /// the stored value. [`max`](Self::max) is the form without a result that Doppel can split.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// assert_eq!(db.run(|tx| tx.max_and_get(&t, "bid", 10))?, 10);
    /// assert_eq!(db.run(|tx| tx.max_and_get(&t, "bid", 7))?, 10);
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_and_get(&mut self, table: &Table, key: impl AsRef<[u8]>, v: i64) -> Result<i64> {
        self.int_op(table, key.as_ref(), |cur| Some(cur.map_or(v, |c| c.max(v))))
    }

    /// Stores the smaller of the current integer and `v` (a missing key takes `v`); returns
    /// the stored value. [`min`](Self::min) is the form without a result that Doppel can split.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// assert_eq!(db.run(|tx| tx.min_and_get(&t, "low", 10))?, 10);
    /// assert_eq!(db.run(|tx| tx.min_and_get(&t, "low", 7))?, 7);
    /// # Ok(())
    /// # }
    /// ```
    pub fn min_and_get(&mut self, table: &Table, key: impl AsRef<[u8]>, v: i64) -> Result<i64> {
        self.int_op(table, key.as_ref(), |cur| Some(cur.map_or(v, |c| c.min(v))))
    }

    fn int_op(&mut self, table: &Table, key: &[u8], op: impl IntOp) -> Result<i64> {
        let slot = self.open_write(table, key)?;
        // The value is 8 bytes, which `max_value_len` may not allow (as `put` and `add`
        // refuse it).
        self.cx.check_value(&[0; 8])?;
        dispatch!(&mut self.cc, p => p.int_op(&mut self.cx, slot, key, &op))
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
        self.scan_impl(table, lo, hi, usize::MAX)
    }

    /// The first `limit` rows of a range in ascending key order: a scan that stops early.
    /// Only the part of the range up to the last row it read is protected against
    /// phantoms (locked under 2PL, validated under OCC), so finding the smallest key of a
    /// range ("the oldest new order") neither reads nor locks the rest of it.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| { for k in ["a", "b", "c", "d"] { tx.put(&t, k, "v")?; } Ok(()) })?;
    /// let first = db.run(|tx| tx.scan_limit(&t, "b".., 2))?;
    /// assert_eq!(first, vec![(b"b".to_vec(), b"v".to_vec()), (b"c".to_vec(), b"v".to_vec())]);
    /// assert!(db.run(|tx| tx.scan_limit(&t, .., 0))?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn scan_limit(
        &mut self,
        table: &Table,
        range: impl KeyRange,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let (lo, hi) = range.key_bounds();
        if limit == 0 {
            self.check_scan(table, lo, hi)?;
            return Ok(Vec::new());
        }
        self.scan_impl(table, lo, hi, limit)
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
        let mut rows = self.scan_impl(table, lo, hi, usize::MAX)?;
        rows.reverse();
        Ok(rows)
    }

    /// The last `limit` rows of a range, in descending key order: a descending scan that
    /// stops early ("the customer's latest order"). Like [`scan_limit`](Self::scan_limit),
    /// it protects only the part of the range from the last row it returns up to the
    /// range's end (locked under 2PL, validated under OCC), and it neither reads nor locks
    /// the rest.
    ///
    /// It steps down the range one key at a time: it finds the greatest key below the part
    /// read so far (an unprotected look, ghosts included), then scans from that key up to
    /// the part read so far with the protocol's own ascending scan, which takes the locks or
    /// records the reads that protect it; a key inserted meanwhile shows up in that scan.
    /// So each row costs two descents: for more than a handful of rows,
    /// [`scan_rev`](Self::scan_rev) is cheaper.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| { for k in ["a", "b", "c", "d"] { tx.put(&t, k, "v")?; } Ok(()) })?;
    /// let last = db.run(|tx| tx.scan_rev_limit(&t, .."d", 2))?;
    /// assert_eq!(last, vec![(b"c".to_vec(), b"v".to_vec()), (b"b".to_vec(), b"v".to_vec())]);
    /// assert!(db.run(|tx| tx.scan_rev_limit(&t, "x".., 1))?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn scan_rev_limit(
        &mut self,
        table: &Table,
        range: impl KeyRange,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let (lo, hi) = range.key_bounds();
        let mut out = Vec::new();
        // Validates the table before its tree is looked at.
        self.check_scan(table, lo, hi)?;
        if limit == 0 {
            return Ok(out);
        }
        let above_lo = (lo, Bound::Unbounded);
        // The part of the range still to read ends at `upper`.
        let mut upper: Bound<Vec<u8>> = hi.map(<[u8]>::to_vec);
        loop {
            let start = table
                .inner
                .tree
                .last_within(upper.as_ref().map(Vec::as_slice))
                .filter(|k| above_lo.contains(k.as_slice()));
            let from = match &start {
                Some(k) => Bound::Included(k.as_slice()),
                None => lo,
            };
            let rows =
                self.scan_impl(table, from, upper.as_ref().map(Vec::as_slice), usize::MAX)?;
            for row in rows.into_iter().rev() {
                out.push(row);
                if out.len() == limit {
                    return Ok(out);
                }
            }
            match start {
                // Down to the range's start: nothing below is left.
                None => return Ok(out),
                Some(k) => upper = Bound::Excluded(k),
            }
        }
    }

    fn scan_impl(
        &mut self,
        table: &Table,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Rows> {
        let slot = self.check_scan(table, lo, hi)?;
        dispatch!(&mut self.cc, p => p.scan(&mut self.cx, slot, Span { lo, hi, limit }))
    }

    /// What every scan checks, a scan of no rows too: the transaction is usable, the bounds
    /// are keys the database takes, the table is this database's. Returns its slot.
    fn check_scan(&mut self, table: &Table, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Result<u16> {
        self.cx.active()?;
        // Bounds are lookups: as long as a key written under a larger `max_key_len` may be.
        let max = crate::storage::page::MAX_KEY;
        for b in [lo, hi] {
            if let Bound::Included(k) | Bound::Excluded(k) = b {
                at_most(k.len(), max, |len, max| Error::KeyTooLarge { len, max })?;
            }
        }
        self.cx.table_slot(table)
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
    /// [`Options::log`](crate::Options::log). Ignored when the database has no log, and
    /// `LogMode::None` is ignored on a database that has one (every commit of a logged
    /// database is logged: recovery replays the log in order).
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
        if self.cx.inner().log.is_some() && mode != LogMode::None {
            self.commit_mode = mode;
        }
    }

    fn finish_commit(&mut self, mode: LogMode) -> Result<CommitTicket> {
        self.cx.active()?;
        self.finished = true;
        dispatch!(&mut self.cc, p => p.commit(&mut self.cx, mode))
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

    fn finish_abort(&mut self) {
        if !self.finished {
            self.finished = true;
            dispatch!(&mut self.cc, p => p.abort(&mut self.cx));
        }
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        self.finish_abort();
        dispatch!(&mut self.cc, p => p.end(&mut self.cx));
        if self.cx.admitted {
            crate::admission::end();
        }
    }
}

impl std::fmt::Debug for Transaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (locks, writes) = dispatch!(&self.cc, p => p.counts());
        f.debug_struct("Transaction")
            .field("id", &self.cx.id)
            .field("locks_held", &locks)
            .field("writes", &writes)
            .field("failed", &self.cx.failed)
            .finish()
    }
}

/// [`Transaction::check_room`] with its parts given, for a check made where the transaction
/// is borrowed (inside an `update` function, once the new value's length is known).
fn room(inner: &DbInner, table: &Table, pending: u64, adding: usize) -> Result<()> {
    if inner.opts.memory_limit.is_none() {
        return Ok(());
    }
    let own_free = (table.inner.tree.free_pages() as u64)
        .saturating_mul(crate::storage::page::PAGE_SIZE as u64);
    let used = inner
        .held_bytes()
        .saturating_sub(own_free)
        .saturating_add(pending);
    inner.check_memory(used.saturating_add(adding as u64))
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

/// The integer an `int_op` stores: `op` of the current value, which must be an integer.
fn int_value(key: &[u8], cur: Option<&[u8]>, op: impl IntOp) -> Result<[u8; 8]> {
    let cur = cur.map(|c| decode_i64(key, c)).transpose()?;
    op(cur)
        .map(i64::to_le_bytes)
        .ok_or_else(|| Error::Overflow { key: show_key(key) })
}

/// The value a blind operation stores on top of `cur`, as a read-modify-write.
fn blind_value(
    key: &[u8],
    cur: Option<&[u8]>,
    delta: &crate::doppel::Delta,
    max: usize,
) -> Result<Vec<u8>> {
    let v = delta.apply(key, cur, false)?;
    if v.len() > max {
        return Err(Error::ValueTooLarge { len: v.len(), max });
    }
    Ok(v)
}
