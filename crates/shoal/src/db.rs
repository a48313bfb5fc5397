//! The database handle, its options and table handles.

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
use crate::lock::{DeadlockPolicy, LockId, LockMode, LockTable, TableId, Victim};
use crate::log::buffer::{FlushPolicy, LogBuffer, LogConfig};
use crate::log::checkpoint::{self, CheckpointWriter};
use crate::log::record::{LogRecord, Write as LogWrite};
use crate::log::segment;
use crate::storage::btree::{BTree, Record};
use crate::txn::Transaction;

/// Which concurrency control transactions use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConcurrencyControl {
    /// Strict two-phase locking with key-range locks (Graefe's modes), cursor locks for scans
    /// and intent locks on tables and the database. Serializable.
    #[default]
    TwoPhaseLocking,
    /// Optimistic concurrency control after Silo (Tu et al. 2013; Narula's thesis, chapter 3):
    /// reads record the TID word of every record (and the absence of missing keys, and the
    /// keys and TIDs every scan saw), writes are buffered, and commit locks the write set in
    /// a global order, validates the reads and scanned ranges, logs and installs. A failed
    /// validation aborts with the retryable [`Error::Conflict`](crate::Error::Conflict). No
    /// lock table, no deadlocks; [`Options::elr`] does not apply. See the module
    /// documentation of `txn::occ` in the source for the details.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::{ConcurrencyControl, Database, Error, Options};
    /// let db = Database::in_memory_with(Options {
    ///     cc: ConcurrencyControl::Optimistic,
    ///     ..Options::default()
    /// });
    /// let t = db.create_table("t")?;
    /// let mut t1 = db.begin();
    /// assert_eq!(t1.get(&t, "x")?, None); // T1 reads x (absent)
    /// db.run(|t2| t2.put(&t, "x", "1"))?; // T2 writes x and commits
    /// t1.put(&t, "y", "1")?;
    /// assert!(matches!(t1.commit(), Err(Error::Conflict { .. }))); // T1's read is stale
    /// # Ok(())
    /// # }
    /// ```
    Optimistic,
    /// Doppel phase reconciliation (Narula 2015): joined phases run [`Optimistic`](Self::Optimistic);
    /// split phases run the blind commutative operations on hot records
    /// ([`Transaction::add_blind`](crate::Transaction::add_blind) and friends) on per-worker
    /// slices, in parallel, and stash transactions that read those records until the next
    /// joined phase. Tuned by [`Options::doppel`]; see [`crate::doppel`].
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::{ConcurrencyControl, Database, Options};
    /// use shoal::doppel::SplitOp;
    /// let db = Database::in_memory_with(Options { cc: ConcurrencyControl::Doppel, ..Options::default() });
    /// let t = db.create_table("t")?;
    /// db.split_hint(&t, "hits", SplitOp::Add)?; // split "hits" for ADD from now on
    /// for _ in 0..10 {
    ///     db.run(|tx| tx.add_blind(&t, "hits", 1))?;
    /// }
    /// // A read is stashed while "hits" is split and runs in the next joined phase.
    /// assert_eq!(db.run(|tx| tx.get_i64(&t, "hits"))?, Some(10));
    /// # Ok(())
    /// # }
    /// ```
    Doppel,
    /// No locks: transactions run one at a time behind a single database-wide mutex. This is
    /// the cost floor the harness measures concurrency control against; it is serializable
    /// only because it is serial.
    Serial,
}

/// When a commit is acknowledged, relative to its log record reaching stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogMode {
    /// No log: nothing survives the process. The default for in-memory databases.
    None,
    /// `commit` returns once the commit record is durable; concurrent commits share one
    /// fsync (group commit). The default for [`Database::open`].
    #[default]
    Sync,
    /// Flush pipelining: `commit` returns once the commit record is in the log buffer and the
    /// thread goes on; the flush daemon releases the transaction's locks (unless early lock
    /// release freed them already) when the record is durable. See
    /// [`Transaction::commit_pipelined`](crate::Transaction::commit_pipelined).
    Pipelined,
    /// `commit` returns once the commit record is in the log buffer; the flush daemon makes it
    /// durable within [`Options::async_flush_delay`]. A crash may lose the last commits, never
    /// a part of one, and never a commit without the commits it depended on.
    Async,
}

/// Which lock table 2PL uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LockTableKind {
    /// The hash table split into shards with one mutex each (the default).
    #[default]
    Sharded,
    /// One latch over the whole lock table: the traditional design Jung et al. 2013 measure
    /// against (their Fig. 3, left). For experiments.
    Latched,
    /// The latch-free lock table of Jung et al. 2013 ([`LatchFreeLockTable`]).
    LatchFree,
}

/// Where intent locks on the database and tables live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IntentLockKind {
    /// Lightweight intent locks (Kimura et al. 2012 §3.2): per-object counters outside the
    /// lock table. The default.
    #[default]
    Lightweight,
    /// Intent locks as ordinary requests in the lock table, the traditional design.
    LockTable,
}

/// Early lock release (Athanassoulis et al. 2011; Kimura et al. 2012 §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Elr {
    /// Strict: every lock is held until the commit is durable.
    #[default]
    Off,
    /// Shared locks are released at the commit request, exclusive ones when durable.
    Shared,
    /// Every lock is released once the commit record is in the log buffer. Exclusive locks
    /// leave the commit's LSN as a tag on their queue; a read-only transaction that took a
    /// tagged lock waits until that LSN is durable before its commit returns (safe SX-ELR,
    /// Kimura §5.3), so it never reports data that a crash could take back.
    Sx,
    /// Like `Sx` without the read-only wait: the anomaly of Kimura §5.2 (Table 6) is
    /// possible. For experiments only.
    SxUnsafe,
}

/// Settings of a [`Database`].
///
/// ```
/// use shoal::{Database, Options, ConcurrencyControl};
/// use std::time::Duration;
/// let db = Database::in_memory_with(Options {
///     cc: ConcurrencyControl::TwoPhaseLocking,
///     lock_timeout: Duration::from_millis(500),
///     ..Options::default()
/// });
/// assert_eq!(db.options().lock_timeout, Duration::from_millis(500));
/// ```
#[derive(Clone, Debug)]
pub struct Options {
    /// Concurrency control. Default: two-phase locking.
    pub cc: ConcurrencyControl,
    /// The lock table. Default: sharded.
    pub lock_table: LockTableKind,
    /// Where intent locks live. Default: lightweight intent locks.
    pub intent_locks: IntentLockKind,
    /// Which key-range lock modes 2PL uses. Default: Graefe's (the most concurrent); the
    /// others exist to measure the difference.
    pub key_range_modes: crate::lock::KeyRangeModes,
    /// Deadlock handling of the lock table. Default: waits-for graph check on blocking.
    pub deadlock: DeadlockPolicy,
    /// Which transaction of a deadlock Dreadlocks rolls back. Default: the younger.
    pub victim: Victim,
    /// Longest wait for one lock before the transaction fails with
    /// [`Error::LockTimeout`]. Default: 2 s.
    pub lock_timeout: Duration,
    /// Longest key in bytes. Default: 4096.
    pub max_key_len: usize,
    /// Longest value in bytes. Default: 16 MiB.
    pub max_value_len: usize,
    /// Commit durability for databases opened with [`Database::open`] (in-memory databases
    /// never log). Default: [`LogMode::Sync`].
    pub log: LogMode,
    /// Early lock release. Default: off.
    pub elr: Elr,
    /// Extra delay added to every log flush on top of the real fsync, to emulate a slower log
    /// device (e.g. 10 ms for a disk). Default: none.
    pub log_latency: Duration,
    /// Put the log segments here instead of in the database directory.
    pub log_dir: Option<PathBuf>,
    /// Size of the log buffer in bytes (rounded up to a power of two). Default: 32 MiB.
    pub log_buffer: usize,
    /// A log segment file is closed and a new one started once it holds this many bytes.
    /// Default: 64 MiB.
    pub log_segment_size: u64,
    /// Longest time an [`LogMode::Async`] commit stays in the buffer. Default: 10 ms.
    pub async_flush_delay: Duration,
    /// Take a checkpoint this often in the background (`None`: only when
    /// [`Database::checkpoint`] is called). Default: none.
    pub checkpoint_interval: Option<Duration>,
    /// How many times [`Database::run`] retries a transaction that failed with a retryable
    /// error before giving the error to the caller. Default: 1000.
    pub max_retries: u32,
    /// Parameters of [`ConcurrencyControl::Doppel`] (ignored by the other modes).
    pub doppel: crate::doppel::DoppelOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cc: ConcurrencyControl::default(),
            lock_table: LockTableKind::default(),
            intent_locks: IntentLockKind::default(),
            key_range_modes: crate::lock::KeyRangeModes::default(),
            deadlock: DeadlockPolicy::default(),
            victim: Victim::default(),
            lock_timeout: Duration::from_secs(2),
            max_key_len: 4096,
            max_value_len: 16 << 20,
            max_retries: 1000,
            doppel: crate::doppel::DoppelOptions::default(),
            log: LogMode::Sync,
            elr: Elr::Off,
            log_latency: Duration::ZERO,
            log_dir: None,
            log_buffer: 32 << 20,
            log_segment_size: 64 << 20,
            async_flush_delay: Duration::from_millis(10),
            checkpoint_interval: None,
        }
    }
}

pub(crate) struct TableInner {
    pub(crate) id: TableId,
    pub(crate) name: String,
    pub(crate) db_id: u64,
    pub(crate) tree: BTree,
}

/// A handle to a table: cheap to clone, valid for the life of its database.
///
/// ```
/// # fn main() -> shoal::Result<()> {
/// let db = shoal::Database::in_memory();
/// let t = db.create_table("users")?;
/// assert_eq!(t.name(), "users");
/// assert_eq!(db.table("users")?.name(), "users");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Table {
    pub(crate) inner: Arc<TableInner>,
}

impl Table {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("id", &self.inner.id)
            .field("name", &self.inner.name)
            .finish()
    }
}

pub(crate) struct DbInner {
    pub(crate) id: u64,
    pub(crate) opts: Options,
    pub(crate) locks: Arc<dyn LockTable>,
    pub(crate) lil: Option<Arc<LightweightIntentLocks>>,
    pub(crate) next_txn: AtomicU64,
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
    stop: Arc<AtomicBool>,
    recovery: Option<RecoveryStats>,
    _dir_lock: Option<std::fs::File>,
    /// The Doppel runtime (`cc == Doppel` only).
    pub(crate) doppel: Option<crate::doppel::DoppelHandle>,
}

/// Table ids a database can hold (ids are dense from 1).
pub(crate) const MAX_TABLES: usize = TABLE_CHUNK * TABLE_CHUNKS;
const TABLE_CHUNK: usize = 256;
const TABLE_CHUNKS: usize = 256;

/// Append-only map from table id to table, with stable addresses: a slot is set once and
/// never cleared, so `get` hands out references that live as long as the database.
pub(crate) struct TableSlots {
    chunks: Box<[std::sync::OnceLock<TableChunk>]>,
}

/// `TABLE_CHUNK` consecutive table ids.
type TableChunk = Box<[std::sync::OnceLock<Table>]>;

impl TableSlots {
    /// Slots holding `tables` (recovery refuses ids of [`MAX_TABLES`] or more).
    fn with<'t>(tables: impl Iterator<Item = &'t Table>) -> TableSlots {
        let slots = TableSlots {
            chunks: (0..TABLE_CHUNKS)
                .map(|_| std::sync::OnceLock::new())
                .collect(),
        };
        for t in tables {
            let _ = slots.set(t);
        }
        slots
    }

    /// Records `t` under its id (a second table with the same id keeps the first).
    fn set(&self, t: &Table) -> Result<()> {
        let id = t.inner.id as usize;
        let chunk = self
            .chunks
            .get(id / TABLE_CHUNK)
            .ok_or_else(|| Error::InvalidTableName {
                name: t.inner.name.clone(),
                reason: "too many tables",
            })?
            .get_or_init(|| {
                (0..TABLE_CHUNK)
                    .map(|_| std::sync::OnceLock::new())
                    .collect()
            });
        let _ = chunk[id % TABLE_CHUNK].set(t.clone());
        Ok(())
    }

    /// The table with id `id`, borrowed for as long as `self`.
    pub(crate) fn get(&self, id: TableId) -> Option<&Table> {
        let id = id as usize;
        self.chunks.get(id / TABLE_CHUNK)?.get()?[id % TABLE_CHUNK].get()
    }
}

impl DbInner {
    /// The table with this id.
    pub(crate) fn table_by_id(&self, id: TableId) -> Option<Table> {
        self.by_id.get(id).cloned()
    }

    /// The Doppel runtime, if this database runs Doppel.
    pub(crate) fn doppel(&self) -> Option<&Arc<crate::doppel::Doppel>> {
        self.doppel.as_ref().map(|d| &d.rt)
    }
}

impl Drop for DbInner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// What [`Database::open`] found and replayed.
#[derive(Clone, Debug, Default)]
pub struct RecoveryStats {
    /// LSN of the checkpoint loaded, if any.
    pub checkpoint_lsn: Option<u64>,
    /// Rows loaded from the checkpoint.
    pub checkpoint_rows: u64,
    /// Log records replayed after the checkpoint.
    pub log_records: u64,
    /// Bytes of a torn last record that were cut off.
    pub torn_bytes: u64,
    /// The LSN the log continues from.
    pub end_lsn: u64,
    /// Wall time of the whole recovery.
    pub elapsed: Duration,
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
    pub fn in_memory_with(opts: Options) -> Database {
        let id = NEXT_DB_ID.fetch_add(1, Ordering::Relaxed);
        Self::build(opts, id, None, HashMap::new(), None, None, None)
    }

    /// Opens (creating if needed) the database in directory `dir`, which it locks against a
    /// second opener.
    ///
    /// This version keeps data in memory only: the write-ahead log and recovery that make the
    /// directory durable are not built yet, so the tables start empty on every open.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    /// assert_eq!(db.dir(), Some(dir.path()));
    /// assert!(shoal::Database::open(dir.path(), shoal::Options::default()).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<Database> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock_path = dir.join("LOCK");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| Error::Io {
                path: lock_path.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Io {
                    path: lock_path,
                    source: std::io::Error::new(
                        std::io::ErrorKind::WouldBlock,
                        "the database is open in another handle or process",
                    ),
                })
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(Error::Io {
                    path: lock_path,
                    source,
                })
            }
        }
        let db_id = NEXT_DB_ID.fetch_add(1, Ordering::Relaxed);
        if opts.log == LogMode::None {
            return Ok(Self::build(
                opts,
                db_id,
                Some(dir.to_path_buf()),
                HashMap::new(),
                None,
                None,
                Some(file),
            ));
        }
        let log_dir = opts.log_dir.clone().unwrap_or_else(|| dir.to_path_buf());
        std::fs::create_dir_all(&log_dir).map_err(|source| Error::Io {
            path: log_dir.clone(),
            source,
        })?;
        let (tables, stats) = recover(dir, &log_dir, db_id)?;
        let policy = match opts.log {
            LogMode::Async => FlushPolicy::Periodic(opts.async_flush_delay),
            _ => FlushPolicy::Eager,
        };
        let log = LogBuffer::start(
            LogConfig {
                dir: log_dir,
                capacity: opts.log_buffer,
                segment_size: opts.log_segment_size,
                extra_latency: opts.log_latency,
                policy,
            },
            stats.end_lsn,
        )?;
        let db = Self::build(
            opts,
            db_id,
            Some(dir.to_path_buf()),
            tables,
            Some(log),
            Some(stats),
            Some(file),
        );
        if let Some(every) = db.inner.opts.checkpoint_interval {
            db.spawn_checkpointer(every)?;
        }
        Ok(db)
    }

    fn build(
        opts: Options,
        id: u64,
        dir: Option<PathBuf>,
        tables: HashMap<String, Table>,
        log: Option<LogBuffer>,
        recovery: Option<RecoveryStats>,
        lock: Option<std::fs::File>,
    ) -> Database {
        let locks: Arc<dyn LockTable> = match opts.lock_table {
            LockTableKind::Sharded => {
                Arc::new(SimpleLockTable::new(opts.deadlock).with_victim(opts.victim))
            }
            LockTableKind::Latched => {
                Arc::new(SimpleLockTable::with_shards(opts.deadlock, 1).with_victim(opts.victim))
            }
            LockTableKind::LatchFree => Arc::new(LatchFreeLockTable::new(opts.deadlock)),
        };
        let log_mode = if log.is_some() {
            opts.log
        } else {
            LogMode::None
        };
        // Table ids beyond the capacity share counters (`id % capacity`): conservative.
        let lil = (opts.intent_locks == IntentLockKind::Lightweight).then(|| {
            Arc::new(LightweightIntentLocks::new(
                4096,
                opts.lock_timeout,
                opts.lock_timeout * 4,
            ))
        });
        let doppel = (opts.cc == ConcurrencyControl::Doppel)
            .then(|| crate::doppel::DoppelHandle::new(id, opts.doppel.clone()));
        let db = Database {
            inner: Arc::new(DbInner {
                id,
                opts,
                locks,
                lil,
                next_txn: AtomicU64::new(1),
                serial: Mutex::new(()),
                by_id: TableSlots::with(tables.values()),
                tables: RwLock::new(tables),
                dir,
                log,
                log_mode,
                checkpoint_lock: Mutex::new(()),
                stop: Arc::new(AtomicBool::new(false)),
                recovery,
                _dir_lock: lock,
                doppel,
            }),
        };
        if let Some(d) = &db.inner.doppel {
            // Without a coordinator nothing is ever split: the database runs as OCC.
            let _ = d.spawn(Arc::downgrade(&db.inner));
        }
        db
    }

    fn spawn_checkpointer(&self, every: Duration) -> Result<()> {
        let weak = Arc::downgrade(&self.inner);
        let stop = Arc::clone(&self.inner.stop);
        std::thread::Builder::new()
            .name("shoal-checkpointer".into())
            .spawn(move || {
                let tick = Duration::from_millis(20).min(every);
                let mut waited = Duration::ZERO;
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(tick);
                    waited += tick;
                    if waited < every {
                        continue;
                    }
                    waited = Duration::ZERO;
                    let Some(inner) = weak.upgrade() else { return };
                    let db = Database { inner };
                    // A failed background checkpoint leaves the previous one and the log in
                    // place, so nothing is lost; the next attempt tries again.
                    let _ = db.checkpoint();
                }
            })
            .map_err(|source| Error::Io {
                path: PathBuf::from("<checkpoint thread>"),
                source,
            })?;
        Ok(())
    }

    /// What recovery did when this database was opened (`None` for in-memory databases and
    /// databases without a log).
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
    /// let opts = shoal::Options { log: shoal::LogMode::Async, ..Default::default() };
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

    /// Writes a checkpoint (a snapshot of every table plus the LSN it covers) and deletes the
    /// log segments and older checkpoints it makes unnecessary. Transactions keep running
    /// meanwhile. Returns the checkpoint's LSN, or `None` without a log.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// {
    ///     let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    ///     let t = db.create_table("t")?;
    ///     db.run(|tx| tx.put(&t, "k", "v"))?;
    ///     assert!(db.checkpoint()?.is_some());
    /// }
    /// let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    /// let t = db.table("t")?;
    /// assert_eq!(db.run(|tx| tx.get(&t, "k"))?, Some(b"v".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn checkpoint(&self) -> Result<Option<u64>> {
        let inner = &*self.inner;
        let (Some(log), Some(dir)) = (&inner.log, &inner.dir) else {
            return Ok(None);
        };
        let _one_at_a_time = inner.checkpoint_lock.lock();
        // Under Doppel a checkpoint runs inside a joined phase: no slice is unreconciled.
        let _pin = match inner.doppel() {
            Some(d) => Some(crate::doppel::Pin::new(d)?),
            None => None,
        };
        let lsn = log.released();
        let mut w = CheckpointWriter::create(dir, lsn)?;
        let mut tables: Vec<Table> = inner.tables.read().values().cloned().collect();
        tables.sort_by_key(|t| t.inner.id);
        let ckpt_txn = inner.next_txn.fetch_add(1, Ordering::Relaxed);
        for t in &tables {
            w.table(t.inner.id, &t.inner.name)?;
            let mut start: Bound<Vec<u8>> = Bound::Unbounded;
            loop {
                let chunk = {
                    let _serial =
                        (inner.opts.cc == ConcurrencyControl::Serial).then(|| inner.serial.lock());
                    let b = match &start {
                        Bound::Unbounded => Bound::Unbounded,
                        Bound::Excluded(k) => Bound::Excluded(&k[..]),
                        Bound::Included(k) => Bound::Included(&k[..]),
                    };
                    t.inner.tree.range(b, Bound::Unbounded, 1024)
                };
                let Some((last, _)) = chunk.last() else { break };
                let next = Bound::Excluded(last.clone());
                let full = chunk.len() == 1024;
                let mut rows = Vec::with_capacity(chunk.len());
                for (key, rec) in chunk {
                    let value = if matches!(
                        inner.opts.cc,
                        ConcurrencyControl::Optimistic | ConcurrencyControl::Doppel
                    ) {
                        // Wait out a committer's lock bit: a commit whose record is below
                        // `lsn` installs its values before it unlocks them.
                        crate::txn::occ::read_committed(&t.inner.tree, &key)
                    } else if inner.opts.cc == ConcurrencyControl::Serial {
                        // Read under the serial mutex: no transaction is half done.
                        let _serial = inner.serial.lock();
                        t.inner
                            .tree
                            .get(&key, |r| r.filter(|r| !r.ghost).map(|r| r.value.clone()))
                    } else {
                        // Instant shared key lock: never read an uncommitted value.
                        let id = LockId::Key(t.inner.id, key.clone().into_boxed_slice());
                        match inner
                            .locks
                            .lock(ckpt_txn, &id, LockMode::SN, inner.opts.lock_timeout)
                        {
                            Ok(_) => {
                                let v = t
                                    .inner
                                    .tree
                                    .get(&key, |r| r.filter(|r| !r.ghost).map(|r| r.value.clone()));
                                inner.locks.unlock(ckpt_txn, &id);
                                v
                            }
                            Err(_) => {
                                return Err(Error::LockTimeout {
                                    txn: ckpt_txn,
                                    resource: format!(
                                        "a key of table {:?} (checkpoint)",
                                        t.inner.name
                                    ),
                                    blocker: "?".into(),
                                    waited_ms: inner.opts.lock_timeout.as_millis() as u64,
                                })
                            }
                        }
                    };
                    let _ = rec;
                    if let Some(v) = value {
                        rows.push(LogWrite {
                            table: t.inner.id,
                            key,
                            value: Some(v),
                        });
                    }
                }
                w.rows(rows)?;
                if !full {
                    break;
                }
                start = next;
            }
        }
        // Every value read above was committed with a record below `released` now: make it
        // durable before the checkpoint that contains it can replace the log.
        log.flush()?;
        w.finish()?;
        let segs = segment::list(log.dir())?;
        for pair in segs.windows(2) {
            if pair[1].0 <= lsn {
                std::fs::remove_file(&pair[0].1).map_err(|source| Error::Io {
                    path: pair[0].1.clone(),
                    source,
                })?;
            }
        }
        Ok(Some(lsn))
    }

    /// The directory this database was opened in, if any.
    ///
    /// ```
    /// assert_eq!(shoal::Database::in_memory().dir(), None);
    /// ```
    pub fn dir(&self) -> Option<&Path> {
        self.inner.dir.as_deref()
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

    /// Creates an empty table. Names are 1 to 255 bytes without control characters.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// db.create_table("a")?;
    /// assert!(matches!(db.create_table("a"), Err(shoal::Error::TableExists { .. })));
    /// assert!(db.create_table("").is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn create_table(&self, name: &str) -> Result<Table> {
        let bad = |reason| {
            Err(Error::InvalidTableName {
                name: name.to_string(),
                reason,
            })
        };
        if name.is_empty() {
            return bad("empty");
        }
        if name.len() > 255 {
            return bad("longer than 255 bytes");
        }
        if name.chars().any(char::is_control) {
            return bad("contains a control character");
        }
        let mut tables = self.inner.tables.write();
        if tables.contains_key(name) {
            return Err(Error::TableExists {
                name: name.to_string(),
            });
        }
        let id = TableId::try_from(tables.len() + 1)
            .ok()
            .filter(|&id| (id as usize) < MAX_TABLES)
            .ok_or_else(|| Error::InvalidTableName {
                name: name.to_string(),
                reason: "too many tables",
            })?;
        if let Some(log) = &self.inner.log {
            let rec = LogRecord::CreateTable {
                id,
                name: name.to_string(),
            };
            let (_, end) = log.insert(&rec.encode())?;
            log.wait_durable(end)?;
        }
        let t = new_table(id, name, self.inner.id);
        self.inner.by_id.set(&t)?;
        tables.insert(name.to_string(), t.clone());
        Ok(t)
    }

    /// Looks a table up by name.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// db.create_table("t")?;
    /// assert!(db.table("t").is_ok());
    /// assert!(db.table("u").is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn table(&self, name: &str) -> Result<Table> {
        self.inner
            .tables
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NoSuchTable {
                name: name.to_string(),
            })
    }

    /// The names of all tables, sorted.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// db.create_table("b")?;
    /// db.create_table("a")?;
    /// assert_eq!(db.tables(), vec!["a".to_string(), "b".to_string()]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tables(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.tables.read().keys().cloned().collect();
        v.sort();
        v
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

    /// Doppel manual labelling (thesis §3.6): split `key` of `table` for `op` from the next
    /// split phase on, whatever the statistics say, until [`clear_split_hint`](Self::clear_split_hint).
    /// A record whose current value cannot hold `op`'s type (e.g. text for
    /// [`SplitOp::Add`](crate::doppel::SplitOp::Add)) is not split. Fails with
    /// [`Error::Unsupported`] unless the database runs [`ConcurrencyControl::Doppel`].
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::{ConcurrencyControl, Database, Options};
    /// use shoal::doppel::SplitOp;
    /// let db = Database::in_memory_with(Options { cc: ConcurrencyControl::Doppel, ..Options::default() });
    /// let t = db.create_table("items")?;
    /// db.split_hint(&t, "max_bid", SplitOp::Max)?;
    /// db.run(|tx| tx.max_blind(&t, "max_bid", 30))?;
    /// assert_eq!(db.run(|tx| tx.get_i64(&t, "max_bid"))?, Some(30));
    /// assert!(Database::in_memory().split_hint(&Database::in_memory().create_table("x")?, "k", SplitOp::Add).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn split_hint(
        &self,
        table: &Table,
        key: impl AsRef<[u8]>,
        op: crate::doppel::SplitOp,
    ) -> Result<()> {
        self.hint(table, key.as_ref(), Some(op))
    }

    /// Removes a [`split_hint`](Self::split_hint); the record is joined again at the next
    /// classification unless the statistics keep it split.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::{ConcurrencyControl, Database, Options};
    /// use shoal::doppel::SplitOp;
    /// let db = Database::in_memory_with(Options { cc: ConcurrencyControl::Doppel, ..Options::default() });
    /// let t = db.create_table("t")?;
    /// db.split_hint(&t, "k", SplitOp::Add)?;
    /// db.clear_split_hint(&t, "k")?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn clear_split_hint(&self, table: &Table, key: impl AsRef<[u8]>) -> Result<()> {
        self.hint(table, key.as_ref(), None)
    }

    fn hint(&self, table: &Table, key: &[u8], op: Option<crate::doppel::SplitOp>) -> Result<()> {
        if table.inner.db_id != self.inner.id {
            return Err(Error::ForeignTable {
                name: table.inner.name.clone(),
            });
        }
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        let Some(d) = &self.inner.doppel else {
            return Err(Error::Unsupported(
                "split hints need ConcurrencyControl::Doppel".into(),
            ));
        };
        d.hint((table.inner.id, key.into()), op);
        Ok(())
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

    /// Counters of the Doppel runtime (`None` unless the database runs
    /// [`ConcurrencyControl::Doppel`]).
    ///
    /// ```
    /// use shoal::{ConcurrencyControl, Database, Options};
    /// let db = Database::in_memory_with(Options { cc: ConcurrencyControl::Doppel, ..Options::default() });
    /// assert_eq!(db.doppel_stats().map(|s| s.stashed), Some(0));
    /// assert!(Database::in_memory().doppel_stats().is_none());
    /// ```
    pub fn doppel_stats(&self) -> Option<crate::doppel::DoppelStats> {
        self.inner.doppel.as_ref().map(|d| d.stats())
    }

    /// The records split in the current (or, in a joined phase, the next) split phase, as
    /// `(table name, key, selected operation)`, sorted. Empty unless Doppel.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::{ConcurrencyControl, Database, Options};
    /// let db = Database::in_memory_with(Options { cc: ConcurrencyControl::Doppel, ..Options::default() });
    /// assert!(db.split_keys().is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn split_keys(&self) -> Vec<(String, Vec<u8>, crate::doppel::SplitOp)> {
        let Some(d) = &self.inner.doppel else {
            return Vec::new();
        };
        d.split_keys()
            .into_iter()
            .map(|(t, k, op)| {
                let name = self
                    .inner
                    .table_by_id(t)
                    .map_or_else(|| format!("table#{t}"), |t| t.inner.name.clone());
                (name, k, op)
            })
            .collect()
    }

    /// Number of entries in a table's index, ghosts included (for tests of ghost removal).
    #[doc(hidden)]
    pub fn debug_index_len(&self, name: &str) -> Result<usize> {
        Ok(self.table(name)?.inner.tree.len())
    }

    /// Runs `f` in a transaction and commits it, retrying the whole transaction with
    /// randomized exponential backoff while it fails with a retryable error
    /// ([`Error::is_retryable`]), up to [`Options::max_retries`] times. Any other error aborts
    /// the transaction and is returned at once. `f` may run more than once: keep side effects
    /// outside it.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("counters")?;
    /// let n = db.run(|tx| tx.add(&t, b"hits", 1))?;
    /// assert_eq!(n, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn run<T>(&self, mut f: impl FnMut(&mut Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut attempt: u32 = 0;
        let mut stashed: u32 = 0;
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
                Err(Error::Stashed { .. }) if stashed < self.inner.opts.max_retries => {
                    stashed += 1;
                }
                Err(e) if e.is_retryable() && attempt < self.inner.opts.max_retries => {
                    attempt += 1;
                    crate::txn::backoff(attempt);
                }
                other => return other,
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

fn new_table(id: TableId, name: &str, db_id: u64) -> Table {
    Table {
        inner: Arc::new(TableInner {
            id,
            name: name.to_string(),
            db_id,
            tree: BTree::new(),
        }),
    }
}

fn table_of<'a>(
    by_id: &'a BTreeMap<TableId, Table>,
    id: TableId,
    at: (&Path, u64),
) -> Result<&'a Table> {
    by_id.get(&id).ok_or_else(|| Error::Corrupt {
        path: at.0.to_path_buf(),
        offset: at.1,
        detail: format!("a commit record names table id {id} that was never created"),
    })
}

/// Rebuilds the tables from the newest checkpoint and the log after it.
fn recover(
    dir: &Path,
    log_dir: &Path,
    db_id: u64,
) -> Result<(HashMap<String, Table>, RecoveryStats)> {
    let t0 = Instant::now();
    let mut by_id: BTreeMap<TableId, Table> = BTreeMap::new();
    let mut stats = RecoveryStats::default();
    let mut from = 0;
    let apply =
        |by_id: &mut BTreeMap<TableId, Table>, rec: LogRecord, at: (&Path, u64)| -> Result<u64> {
            match rec {
                LogRecord::CreateTable { id, name } => {
                    if id as usize >= MAX_TABLES {
                        return Err(Error::Corrupt {
                            path: at.0.to_path_buf(),
                            offset: at.1,
                            detail: format!(
                                "a create-table record names table id {id}, beyond the limit of \
                                 {} tables",
                                MAX_TABLES - 1
                            ),
                        });
                    }
                    by_id
                        .entry(id)
                        .or_insert_with(|| new_table(id, &name, db_id));
                    Ok(0)
                }
                LogRecord::Commit { writes, .. } => {
                    let n = writes.len() as u64;
                    for w in writes {
                        let t = by_id.get(&w.table).ok_or_else(|| Error::Corrupt {
                            path: at.0.to_path_buf(),
                            offset: at.1,
                            detail: format!(
                                "a commit record names table id {} that was never created",
                                w.table
                            ),
                        })?;
                        let value = w.value;
                        t.inner.tree.update(&w.key, |slot| {
                            *slot = value.map(|value| Record {
                                value,
                                ghost: false,
                                tid: 0,
                            });
                        });
                    }
                    Ok(n)
                }
                LogRecord::Ops { writes, ops, .. } => {
                    let n = (writes.len() + ops.len()) as u64;
                    for w in writes {
                        let t = table_of(by_id, w.table, at)?;
                        let value = w.value;
                        t.inner.tree.update(&w.key, |slot| {
                            *slot = value.map(|value| Record {
                                value,
                                ghost: false,
                                tid: 0,
                            });
                        });
                    }
                    for o in ops {
                        let t = table_of(by_id, o.table, at)?;
                        let d =
                            crate::doppel::Delta::decode(&o.op).ok_or_else(|| Error::Corrupt {
                                path: at.0.to_path_buf(),
                                offset: at.1,
                                detail: "an undecodable split operation".into(),
                            })?;
                        t.inner.tree.update(&o.key, |slot| {
                            let cur = slot.as_ref().filter(|r| !r.ghost).map(|r| &r.value[..]);
                            if let Ok(value) = d.apply(&o.key, cur, true) {
                                *slot = Some(Record {
                                    value,
                                    ghost: false,
                                    tid: 0,
                                });
                            }
                        });
                    }
                    Ok(n)
                }
                LogRecord::CheckpointEnd { .. } => Err(Error::Corrupt {
                    path: at.0.to_path_buf(),
                    offset: at.1,
                    detail: "a checkpoint marker inside the log".into(),
                }),
            }
        };
    if let Some(ck) = checkpoint::load_latest(dir)? {
        from = ck.lsn;
        stats.checkpoint_lsn = Some(ck.lsn);
        for rec in ck.records {
            stats.checkpoint_rows += apply(&mut by_id, rec, (dir, 0))?;
        }
    }
    let mut records = 0u64;
    let scan = segment::replay(log_dir, from, |lsn, rec| {
        records += 1;
        apply(&mut by_id, rec, (log_dir, lsn)).map(|_| ())
    })?;
    stats.log_records = records;
    stats.torn_bytes = scan.torn_bytes;
    stats.end_lsn = scan.end;
    stats.elapsed = t0.elapsed();
    let tables = by_id
        .into_values()
        .map(|t| (t.inner.name.clone(), t))
        .collect();
    Ok((tables, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_slots_hand_out_the_table_of_each_id_and_refuse_ids_past_the_limit() {
        let a = new_table(1, "a", 7);
        let b = new_table(300, "b", 7);
        let slots = TableSlots::with([&a].into_iter());
        slots.set(&b).unwrap();
        assert_eq!(slots.get(1).map(|t| t.inner.name.as_str()), Some("a"));
        assert_eq!(slots.get(300).map(|t| t.inner.name.as_str()), Some("b"));
        assert!(slots.get(2).is_none());
        assert!(slots.get(299).is_none());
        // A second table under a taken id keeps the first.
        slots.set(&new_table(1, "c", 7)).unwrap();
        assert_eq!(slots.get(1).map(|t| t.inner.name.as_str()), Some("a"));
        let far = new_table(MAX_TABLES as TableId, "far", 7);
        assert!(matches!(
            slots.set(&far),
            Err(Error::InvalidTableName { .. })
        ));
        assert!(slots.get(MAX_TABLES as TableId).is_none());
        assert!(slots.get(TableId::MAX).is_none());
    }
}
