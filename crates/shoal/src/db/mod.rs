//! The database handle: opening (with recovery), the shared state of a database, and
//! [`Database::run`]. The catalog of tables is [`catalog`], Doppel's part of the handle
//! [`doppel`](self::doppel), checkpoints [`checkpointing`], recovery [`recovery`].

mod catalog;
mod checkpointing;
mod doppel;
mod identity;
mod options;
mod recovery;

use catalog::new_table;
pub use catalog::Table;
pub(crate) use catalog::{TableSlots, MAX_TABLES};

pub use checkpointing::CheckpointStatus;
pub use options::{
    ConcurrencyControl, Elr, IntentLockKind, LockTableKind, LogMode, Options, MAX_DURATION,
};
use recovery::recover;
pub use recovery::RecoveryStats;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::lock::intent::LightweightIntentLocks;
use crate::lock::latchfree::LatchFreeLockTable;
use crate::lock::simple::SimpleLockTable;
use crate::lock::{LockId, LockMode, LockTable, TableId};
use crate::log::buffer::{FlushPolicy, LogBuffer, LogConfig};
use crate::log::checkpoint::{self, CheckpointWriter};
use crate::log::record::{LogRecord, Write as LogWrite};
use crate::log::segment;
use crate::storage::btree::Record;
use crate::txn::Transaction;
use crate::vfs::{on, Vfs};

pub(crate) struct DbInner {
    pub(crate) id: u64,
    pub(crate) opts: Options,
    pub(crate) locks: Arc<dyn LockTable>,
    pub(crate) lil: Option<Arc<LightweightIntentLocks>>,
    pub(crate) next_txn: AtomicU64,
    /// Ghost reclamation: the deferred two-phase-locking ghosts and the optimistic epochs.
    pub(crate) reclaim: Arc<crate::txn::reclaim::Reclaim>,
    /// Pages the tables hold (allocated and not freed), for [`Options::memory_limit`].
    pub(crate) pages: Arc<crate::storage::page::PageCounts>,
    pub(crate) serial: Mutex<()>,
    pub(crate) tables: RwLock<HashMap<String, Table>>,
    /// The same tables by id, append-only: a transaction borrows its tables from here for the
    /// database's lifetime instead of cloning each handle's `Arc` (a shared reference count
    /// bounced between cores on every transaction).
    pub(crate) by_id: TableSlots,
    dir: Option<PathBuf>,
    pub(crate) log: Option<LogBuffer>,
    pub(crate) log_mode: LogMode,
    checkpoint_lock: Mutex<()>,
    /// The background checkpointer's controls and what it reported.
    checkpointer: Arc<checkpointing::Checkpointer>,
    recovery: Option<RecoveryStats>,
    /// The file system and the directory locks (databases opened on a directory).
    pub(crate) disk: Option<Disk>,
    /// The most log bytes one transaction's writes may take (`u64::MAX` without a log).
    pub(crate) record_limit: u64,
    /// The Doppel runtime (`cc == Doppel` only).
    pub(crate) doppel: Option<crate::doppel::DoppelHandle>,
    /// The admission gate (`None` when [`Options::admission`] is off).
    pub(crate) gate: Option<Arc<crate::admission::Gate>>,
}

/// What a database opened on a directory holds of it.
pub(crate) struct Disk {
    pub(crate) vfs: Arc<dyn Vfs>,
    /// Held for the database's life: the directory's lock and the log directory's.
    _locks: Vec<crate::vfs::DirLock>,
    record_limit: u64,
}

/// Checks that the log can hold what the options let a transaction write; returns the most
/// bytes of writes one transaction may log.
fn check_limits(opts: &Options) -> Result<u64> {
    use crate::log::record::{FRAME_HEADER, MAX_PAYLOAD};
    if opts.log_buffer > MAX_LOG_BUFFER {
        return Err(Error::InvalidOptions(format!(
            "log_buffer {} is more than the {MAX_LOG_BUFFER} bytes allowed",
            opts.log_buffer
        )));
    }
    if opts.log_segment_size > MAX_SEGMENT_SIZE {
        return Err(Error::InvalidOptions(format!(
            "log_segment_size {} is more than the {MAX_SEGMENT_SIZE} bytes allowed",
            opts.log_segment_size
        )));
    }
    let ring = opts.log_buffer.next_power_of_two().max(1 << 16);
    // The frame header, record kind, transaction id and counts.
    let limit = ring.min(MAX_PAYLOAD + FRAME_HEADER) as u64 - 32;
    let one = (opts.max_key_len as u64)
        .saturating_add(opts.max_value_len as u64)
        .saturating_add(16);
    if one > limit {
        return Err(Error::InvalidOptions(format!(
            "a write of the longest key ({} bytes) and value ({} bytes) takes {one} bytes of \
             log, more than one log record can hold ({limit} bytes with a log buffer of {ring} \
             bytes; at most 1 GiB): lower max_value_len or raise log_buffer",
            opts.max_key_len, opts.max_value_len
        )));
    }
    Ok(limit)
}

/// The largest log buffer [`Options::log_buffer`] may ask for (4 GiB).
const MAX_LOG_BUFFER: usize = 1 << 32;
/// The largest log segment [`Options::log_segment_size`] may ask for (1 TiB).
const MAX_SEGMENT_SIZE: u64 = 1 << 40;
/// The most running transactions [`Admission::Limit`](crate::Admission::Limit) and Doppel
/// worker slots ([`DoppelOptions::slots`](crate::doppel::DoppelOptions::slots)) may ask for.
const MAX_SLOTS: usize = 1 << 16;

/// Checks what every database checks of its options, in memory or on disk, and returns them
/// with every duration capped at [`MAX_DURATION`] (so that `Duration::MAX`, "never", cannot
/// overflow a deadline): keys no longer than a page guarantees room for, slot counts that can
/// be allocated, and the deadlock handling the options name. Every lock table runs every
/// [`DeadlockPolicy`](crate::lock::DeadlockPolicy) (the decisions are shared,
/// `lock::deadlock`); a victim rule other than kill-young means something only to
/// Dreadlocks, whose cycles have two sides to choose from. The waits-for graph aborts the
/// transaction its search finds the cycle from, and the prevention policies name their own
/// victim, so a kill-short or kill-long there would be silently ignored: refused instead.
fn check_options(mut opts: Options) -> Result<Options> {
    use crate::lock::{DeadlockPolicy, Victim};
    if opts.victim != Victim::KillYoung && !matches!(opts.deadlock, DeadlockPolicy::Dreadlocks(_)) {
        return Err(Error::InvalidOptions(format!(
            "victim {:?} applies to Dreadlocks only; deadlock policy {:?} chooses its own \
             victim (use Victim::KillYoung, the default, with it)",
            opts.victim, opts.deadlock
        )));
    }
    if opts.max_key_len > crate::storage::page::MAX_KEY {
        return Err(Error::InvalidOptions(format!(
            "max_key_len {} is more than the {} bytes a page guarantees room for",
            opts.max_key_len,
            crate::storage::page::MAX_KEY
        )));
    }
    let slots = match opts.admission {
        crate::Admission::Limit(n) => n.max(opts.doppel.slots),
        _ => opts.doppel.slots,
    };
    if slots > MAX_SLOTS {
        return Err(Error::InvalidOptions(format!(
            "{slots} admission or Doppel slots asked for; at most {MAX_SLOTS}"
        )));
    }
    let cap = |d: &mut Duration| *d = (*d).min(options::MAX_DURATION);
    cap(&mut opts.lock_timeout);
    cap(&mut opts.log_latency);
    cap(&mut opts.async_flush_delay);
    cap(&mut opts.admission_quantum);
    cap(&mut opts.doppel.split_phase);
    cap(&mut opts.doppel.classify_interval);
    if let Some(d) = &mut opts.checkpoint_interval {
        cap(d);
    }
    Ok(opts)
}

impl DbInner {
    /// Bytes of the pages the tables hold (see [`Database::page_bytes`]).
    pub(crate) fn page_bytes(&self) -> u64 {
        self.pages
            .in_use
            .load(Ordering::Relaxed)
            .saturating_mul(crate::storage::page::PAGE_SIZE as u64)
    }

    /// Refuses a write (or a new table) that would find the tables' memory at `used` bytes
    /// or more at [`Options::memory_limit`] (no limit: never).
    pub(crate) fn check_memory(&self, used: u64) -> Result<()> {
        match self.opts.memory_limit {
            Some(limit) if used >= limit => Err(Error::MemoryLimit { used, limit }),
            _ => Ok(()),
        }
    }

    /// Bytes of the pages the tables hold, freed ones on their tables' free lists included
    /// (a table keeps its freed pages for itself: another table's write takes new memory).
    pub(crate) fn held_bytes(&self) -> u64 {
        self.pages
            .held
            .load(Ordering::Relaxed)
            .saturating_mul(crate::storage::page::PAGE_SIZE as u64)
    }

    /// Stops the background threads (the checkpointer first: a checkpoint it runs may wait
    /// for the Doppel coordinator to end a split phase) and waits until they have exited.
    /// Called when the last user handle goes, so that the database is dropped right after on
    /// the user's thread, never later on a background one.
    fn stop_background(&self) {
        self.checkpointer.shutdown();
        if let Some(d) = &self.doppel {
            d.shutdown();
        }
    }
}

impl Drop for DbInner {
    fn drop(&mut self) {
        // The threads have been joined by `Owner` already; this only makes sure they stop.
        self.checkpointer.shutdown();
    }
}

/// Shared by the user's handles of one database, never held by its background threads: when
/// the last handle goes, dropping this stops and joins the background threads before the
/// database itself is dropped (which closes the log and unlocks the directory), so the drop
/// of the last handle returns with the directory unlocked.
struct Owner {
    inner: Arc<DbInner>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.inner.stop_background();
    }
}

/// A database: a set of named tables and the transactions over them.
///
/// `Database` is a cheap handle (`Clone` shares the same database) and is `Send + Sync`: share
/// it between threads and let each thread run its own transactions.
///
/// ```
/// # fn main() -> shoal::Result<()> {
/// let db = shoal::Database::in_memory();
/// let t = db.create_table("kv")?;
/// let mut tx = db.begin();
/// tx.put(&t, b"k", b"v")?;
/// tx.commit()?;
/// assert_eq!(db.run(|tx| tx.get(&t, b"k"))?, Some(b"v".to_vec()));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Database {
    pub(crate) inner: Arc<DbInner>,
    /// Held by user handles only (see [`Owner`]).
    _owner: Arc<Owner>,
}

static NEXT_DB_ID: AtomicU64 = AtomicU64::new(1);

impl Database {
    /// A database that lives in memory only, with default [`Options`].
    ///
    /// ```
    /// let db = shoal::Database::in_memory();
    /// assert!(db.dir().is_none());
    /// ```
    pub fn in_memory() -> Database {
        Self::in_memory_with(Options::default())
    }

    /// A database that lives in memory only, with the given options.
    ///
    /// ```
    /// let db = shoal::Database::in_memory_with(shoal::Options::default());
    /// assert!(db.tables().is_empty());
    /// ```
    ///
    /// # Panics
    ///
    /// On options [`try_in_memory_with`](Self::try_in_memory_with) refuses (a victim rule
    /// with a deadlock policy that does not use it, a `max_key_len` over 4096, more than
    /// 65,536 admission or Doppel slots).
    pub fn in_memory_with(opts: Options) -> Database {
        match Self::try_in_memory_with(opts) {
            Ok(db) => db,
            Err(e) => panic!("Database::in_memory_with: {e}"),
        }
    }

    /// A database that lives in memory only, with the given options; options that name a
    /// technique the database would not run (a victim rule other than kill-young with a
    /// deadlock policy other than Dreadlocks) are refused with [`Error::InvalidOptions`].
    ///
    /// ```
    /// use shoal::{Database, DeadlockPolicy, Error, Options, Victim};
    /// let o = Options::default().with_deadlock(DeadlockPolicy::NoWait).with_victim(Victim::KillShort);
    /// assert!(matches!(Database::try_in_memory_with(o), Err(Error::InvalidOptions(_))));
    /// ```
    pub fn try_in_memory_with(opts: Options) -> Result<Database> {
        let opts = check_options(opts)?;
        let id = NEXT_DB_ID.fetch_add(1, Ordering::Relaxed);
        Ok(Self::build(
            opts,
            id,
            None,
            (HashMap::new(), Arc::default()),
            None,
            None,
            None,
        ))
    }

    /// Opens (creating if needed) the database in directory `dir`, which it locks against
    /// every other opener (another handle or process) until the last handle is dropped.
    ///
    /// With a log ([`Options::log`] other than [`LogMode::None`]) opening recovers: it loads
    /// the newest checkpoint, replays the log after it, cuts a torn tail (damage in the log's
    /// last flush, which a crash may cut short with its sectors reaching the disk in any
    /// order; its bytes are kept in a `torn-<LSN>.bin` file beside the log) and reports
    /// anything else that does not decode as [`Error::Corrupt`] naming the file and offset,
    /// changing nothing. [`recovery_stats`](Self::recovery_stats) tells what it did. With
    /// [`LogMode::None`] a directory that holds a log is recovered the same way, and later
    /// commits are not logged.
    ///
    /// The log may live elsewhere ([`Options::log_dir`]); that directory is locked too and is
    /// marked as this database's (a `SHOAL-ID` file in both), so two databases can never share
    /// one log. Options whose limits the log cannot hold are refused with
    /// [`Error::InvalidOptions`], and so is a victim rule other than kill-young with a
    /// deadlock policy other than Dreadlocks (the others choose their own victim).
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// {
    ///     let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    ///     assert_eq!(db.dir(), Some(dir.path()));
    ///     // One owner at a time.
    ///     assert!(shoal::Database::open(dir.path(), shoal::Options::default()).is_err());
    ///     let t = db.create_table("t")?;
    ///     db.run(|tx| tx.put(&t, "k", "v"))?;
    /// }
    /// let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    /// let t = db.table("t")?;
    /// assert_eq!(db.run(|tx| tx.get(&t, "k"))?, Some(b"v".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<Database> {
        Self::open_on(crate::vfs::std_fs(), dir.as_ref(), opts)
    }

    /// [`open`](Self::open) on the file system `vfs`.
    pub(crate) fn open_on(vfs: Arc<dyn Vfs>, dir: &Path, opts: Options) -> Result<Database> {
        let opts = check_options(opts)?;
        vfs.create_dir_all(dir).map_err(on("create-dir", dir))?;
        let mut locks = vec![vfs.lock_dir(dir).map_err(on("lock", dir))?];
        let log_dir = opts.log_dir.clone().unwrap_or_else(|| dir.to_path_buf());
        vfs.create_dir_all(&log_dir)
            .map_err(on("create-dir", &log_dir))?;
        let separate = vfs.canonical(&log_dir).map_err(on("resolve", &log_dir))?
            != vfs.canonical(dir).map_err(on("resolve", dir))?;
        if separate {
            locks.push(vfs.lock_dir(&log_dir).map_err(on("lock", &log_dir))?);
        }
        let claim = identity::claim(&*vfs, dir, separate.then_some(&*log_dir))?;
        let record_limit = if opts.log == LogMode::None {
            u64::MAX
        } else {
            check_limits(&opts)?
        };
        checkpoint::remove_unfinished(&*vfs, dir)?;
        let db_id = NEXT_DB_ID.fetch_add(1, Ordering::Relaxed);
        let pages = Arc::default();
        let (tables, stats, unreconciled) =
            recover(&*vfs, dir, &log_dir, (db_id, opts.huge_pages), &pages)?;
        // Only now, so that an open that fails leaves the identity files as they were.
        claim.stamp(&*vfs)?;
        let log = if opts.log == LogMode::None {
            None
        } else {
            let policy = match opts.log {
                LogMode::Async => FlushPolicy::Periodic(opts.async_flush_delay),
                _ => FlushPolicy::Eager,
            };
            let mut log = LogBuffer::start(
                LogConfig {
                    vfs: Arc::clone(&vfs),
                    dir: log_dir,
                    capacity: opts.log_buffer,
                    segment_size: opts.log_segment_size,
                    extra_latency: opts.log_latency,
                    policy,
                },
                stats.end_lsn,
            )?;
            if stats.closed_cleanly {
                log.set_closed_at_start();
            }
            Some(log)
        };
        let db = Self::build(
            opts,
            db_id,
            Some(dir.to_path_buf()),
            (tables, pages),
            log,
            Some(stats),
            Some(Disk {
                vfs,
                _locks: locks,
                record_limit,
            }),
        );
        // Split ADDs replayed without their reconciliation were clamped once here, as
        // reconciliation would have: log the values, so that the next recovery starts the
        // next split phase's ADDs from them, not from the exact sum.
        db.inner.log_recovered_adds(unreconciled)?;
        if let Some(every) = db.inner.opts.checkpoint_interval {
            if db.inner.log.is_some() {
                db.spawn_checkpointer(every)?;
            }
        }
        Ok(db)
    }

    fn build(
        opts: Options,
        id: u64,
        dir: Option<PathBuf>,
        (tables, pages): (
            HashMap<String, Table>,
            Arc<crate::storage::page::PageCounts>,
        ),
        log: Option<LogBuffer>,
        recovery: Option<RecoveryStats>,
        disk: Option<Disk>,
    ) -> Database {
        let locks: Arc<dyn LockTable> = match opts.lock_table {
            LockTableKind::Sharded => {
                Arc::new(SimpleLockTable::new(opts.deadlock).with_victim(opts.victim))
            }
            LockTableKind::Latched => {
                Arc::new(SimpleLockTable::with_shards(opts.deadlock, 1).with_victim(opts.victim))
            }
            LockTableKind::LatchFree => {
                Arc::new(LatchFreeLockTable::new(opts.deadlock).with_victim(opts.victim))
            }
        };
        let log_mode = if log.is_some() {
            opts.log
        } else {
            LogMode::None
        };
        // Table ids at or beyond the capacity take their intent locks in the lock table
        // (`TwoPl::coarse_lock`).
        let lil = (opts.intent_locks == IntentLockKind::Lightweight).then(|| {
            Arc::new(LightweightIntentLocks::new(
                4096,
                opts.lock_timeout,
                opts.lock_timeout * 4,
            ))
        });
        let doppel = (opts.cc == ConcurrencyControl::Doppel)
            .then(|| crate::doppel::DoppelHandle::new(id, opts.doppel.clone()));
        let gate = crate::admission::gate(opts.admission, log_mode, opts.admission_quantum);
        let inner = Arc::new(DbInner {
            gate,
            id,
            opts,
            locks,
            lil,
            next_txn: AtomicU64::new(1),
            reclaim: Arc::default(),
            pages,
            serial: Mutex::new(()),
            by_id: TableSlots::with(tables.values()),
            tables: RwLock::new(tables),
            dir,
            log,
            log_mode,
            checkpoint_lock: Mutex::new(()),
            checkpointer: Arc::default(),
            recovery,
            record_limit: disk.as_ref().map_or(u64::MAX, |d| d.record_limit),
            disk,
            doppel,
        });
        let db = Database {
            _owner: Arc::new(Owner {
                inner: Arc::clone(&inner),
            }),
            inner,
        };
        if let Some(d) = &db.inner.doppel {
            // Without a coordinator nothing is ever split: the database runs as OCC.
            // The coordinator sees the database only as a `doppel::Store`.
            let weak: std::sync::Weak<DbInner> = Arc::downgrade(&db.inner);
            let _ = d.spawn(weak);
        }
        db
    }

    /// What recovery did when this database was opened: `None` for in-memory databases. A
    /// database on a directory recovers, and reports it, even when opened with
    /// [`LogMode::None`] (which then writes no log of its own).
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    /// assert_eq!(db.recovery_stats().map(|s| s.log_records), Some(0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn recovery_stats(&self) -> Option<&RecoveryStats> {
        self.inner.recovery.as_ref()
    }

    /// Makes every commit acknowledged so far durable (a barrier for [`LogMode::Async`]).
    /// A no-op without a log.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = shoal::Options::default().with_log(shoal::LogMode::Async);
    /// let db = shoal::Database::open(dir.path(), opts)?;
    /// let t = db.create_table("t")?;
    /// db.run(|tx| tx.put(&t, "k", "v"))?;
    /// db.flush()?; // now the commit survives a crash
    /// # Ok(())
    /// # }
    /// ```
    pub fn flush(&self) -> Result<()> {
        match &self.inner.log {
            Some(log) => log.flush(),
            None => Ok(()),
        }
    }

    /// The directory this database was opened in, if any.
    ///
    /// ```
    /// assert_eq!(shoal::Database::in_memory().dir(), None);
    /// ```
    pub fn dir(&self) -> Option<&Path> {
        self.inner.dir.as_deref()
    }

    /// Bytes of the pages the tables hold now (32 KiB each, allocated and not freed): what
    /// [`Options::memory_limit`] is compared with.
    ///
    /// ```
    /// let db = shoal::Database::in_memory();
    /// assert_eq!(db.page_bytes(), 0);
    /// let t = db.create_table("t")?;
    /// assert_eq!(db.page_bytes(), 32 << 10); // the empty root leaf
    /// # Ok::<(), shoal::Error>(())
    /// ```
    pub fn page_bytes(&self) -> u64 {
        self.inner.page_bytes()
    }

    /// The options this database runs with.
    ///
    /// ```
    /// let db = shoal::Database::in_memory();
    /// assert_eq!(db.options().max_key_len, 4096);
    /// ```
    pub fn options(&self) -> &Options {
        &self.inner.opts
    }

    /// Starts a transaction. It aborts when dropped without [`Transaction::commit`].
    ///
    /// With [`ConcurrencyControl::Serial`] this waits until no other transaction is active.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// let mut tx = db.begin();
    /// tx.insert(&t, b"x", b"1")?;
    /// tx.abort();
    /// assert_eq!(db.run(|tx| tx.get(&t, b"x"))?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn begin(&self) -> Transaction<'_> {
        Transaction::new(self, None)
    }

    /// Begins a transaction that restarts an aborted one whose [`age`](Transaction::age) was
    /// `age`: it gets a new id but keeps that age, as wait-die and wound-wait require (a
    /// restart with a fresh timestamp could be the youngest, and die, forever).
    /// [`run`](Self::run) restarts this way.
    ///
    /// ```
    /// let db = shoal::Database::in_memory();
    /// let tx = db.begin();
    /// let age = tx.age();
    /// tx.abort();
    /// assert_eq!(db.begin_retry(age).age(), age);
    /// ```
    pub fn begin_retry(&self, age: u64) -> Transaction<'_> {
        Transaction::new(self, Some(age))
    }

    /// What the lock table holds in memory: lock names with a queue or lock head, and request
    /// entries (diagnostics: watch it stay bounded over a long run).
    ///
    /// ```
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| tx.put(&t, "k", "v"))?;
    /// // Committed transactions leave no lock queue behind in the default (sharded) table.
    /// assert_eq!(db.lock_table_footprint().heads, 0);
    /// # Ok::<(), shoal::Error>(())
    /// ```
    pub fn lock_table_footprint(&self) -> crate::lock::LockTableFootprint {
        self.inner.locks.footprint()
    }

    /// A snapshot of the admission gate (`None` when [`Options::admission`] is off): slots,
    /// running and waiting transactions, hand-overs so far.
    ///
    /// ```
    /// use shoal::{Admission, Database, Options};
    /// let db = Database::in_memory_with(Options::default().with_admission(Admission::Limit(2)));
    /// let t = db.create_table("t")?;
    /// let mut tx = db.begin();
    /// tx.put(&t, "k", "v")?;
    /// assert_eq!(db.admission_stats().map(|s| (s.limit, s.running)), Some((2, 1)));
    /// tx.commit()?;
    /// // The committing thread keeps its slot for its next transaction.
    /// assert_eq!(db.admission_stats().map(|s| (s.running, s.kept)), Some((0, 1)));
    /// # Ok::<(), shoal::Error>(())
    /// ```
    pub fn admission_stats(&self) -> Option<crate::AdmissionStats> {
        self.inner.gate.as_deref().map(crate::admission::stats)
    }

    /// Ghosts waiting for removal: (optimistic ones waiting for their epoch to end,
    /// two-phase-locking ones whose lock was busy). For tests of ghost removal.
    #[doc(hidden)]
    pub fn debug_ghost_backlog(&self) -> (usize, usize) {
        self.inner.reclaim.pending()
    }

    /// Runs `f` in a transaction and commits it, retrying the whole transaction with
    /// randomized exponential backoff while it fails with a retryable error
    /// ([`Error::is_retryable`]), up to [`Options::max_retries`] times. Any other error aborts
    /// the transaction and is returned at once. `f` may run more than once: keep side effects
    /// outside it.
    ///
    /// A transaction begun inside `f` on the same thread is another transaction: under
    /// two-phase locking, if it needs a lock the outer one holds, it waits for the outer
    /// one, which waits for it. No deadlock detector sees a cycle through one thread, so it
    /// ends with [`Error::LockTimeout`] after [`Options::lock_timeout`], which `run` retries
    /// ([`Options::max_retries`] times); under `Serial` it waits for ever. Do the work in the
    /// outer transaction instead.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("counters")?;
    /// let n = db.run(|tx| tx.add_and_get(&t, b"hits", 1))?;
    /// assert_eq!(n, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn run<T>(&self, mut f: impl FnMut(&mut Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut attempt: u32 = 0;
        let mut stashed: u32 = 0;
        let mut overdue: u32 = 0;
        let mut age = None;
        loop {
            let mut tx = Transaction::new(self, age);
            age = Some(tx.age());
            let res = match f(&mut tx) {
                Ok(v) => tx.commit().map(|()| v),
                Err(e) => {
                    tx.abort();
                    Err(e)
                }
            };
            match res {
                // Doppel: the next begin() waits for the joined phase; not a failed attempt.
                // A re-run that gave up waiting for its joined phase (see
                // `doppel::began_overdue`) and was stashed again is re-run once more (a busy
                // machine can delay a joined phase that long); stashed after a second such
                // wait, it ends here.
                other @ Err(Error::Stashed { .. })
                    if crate::doppel::began_overdue(self.inner.id) =>
                {
                    overdue += 1;
                    if overdue >= 2 {
                        return crate::txn::backoff::finished(other);
                    }
                }
                Err(Error::Stashed { .. }) if stashed < self.inner.opts.max_retries => {
                    stashed += 1;
                }
                Err(e) if e.is_retryable() && attempt < self.inner.opts.max_retries => {
                    attempt += 1;
                    crate::txn::backoff::after_abort(attempt);
                }
                other => return crate::txn::backoff::finished(other),
            }
        }
    }
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("dir", &self.inner.dir)
            .field("options", &self.inner.opts)
            .finish()
    }
}
