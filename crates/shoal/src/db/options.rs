//! The options of a database.

use std::path::PathBuf;
use std::time::Duration;

use crate::lock::{DeadlockPolicy, Victim};
#[cfg(doc)]
use crate::{Database, Error};

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
    /// let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Optimistic));
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
    /// ([`Transaction::add`](crate::Transaction::add) and friends) on per-worker
    /// slices, in parallel, and stash transactions that read those records until the next
    /// joined phase. Tuned by [`Options::doppel`]; see [`crate::doppel`].
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::{ConcurrencyControl, Database, Options};
    /// use shoal::doppel::SplitOp;
    /// let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Doppel));
    /// let t = db.create_table("t")?;
    /// db.split_hint(&t, "hits", SplitOp::Add)?; // split "hits" for ADD from now on
    /// for _ in 0..10 {
    ///     db.run(|tx| tx.add(&t, "hits", 1))?;
    /// }
    /// // A read is stashed while "hits" is split and runs in the next joined phase.
    /// assert_eq!(db.run(|tx| tx.get_i64(&t, "hits"))?, Some(10));
    /// # Ok(())
    /// # }
    /// ```
    Doppel,
    /// No locks: transactions run one at a time behind a single database-wide mutex. This is
    /// the cost floor the harness measures concurrency control against; it is serializable
    /// only because it is serial. A thread holding a transaction must not begin a second one
    /// of the same database (it would wait for itself); a checkpoint asked for inside one
    /// fails with [`Error::Unsupported`].
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
    /// The latch-free lock table of Jung et al. 2013: no latch on the acquire and release
    /// paths, lock entries pre-allocated and reclaimed in bulk.
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
    /// Strict: every lock is held until the commit is durable (an
    /// [`LogMode::Async`](crate::LogMode::Async) commit, which returns before, releases its
    /// locks once its record is logged and leaves its LSN as a tag on its exclusive ones: a
    /// read-only transaction that is not `Async` itself and read its writes waits until they
    /// are durable, as under `Sx`).
    #[default]
    Off,
    /// Shared locks are released at the commit request, exclusive ones when durable.
    Shared,
    /// Every lock is released once the commit record is in the log buffer. Exclusive locks
    /// leave the commit's LSN as a tag on their queue; a read-only transaction that took a
    /// tagged lock waits until that LSN is durable before its commit returns (safe SX-ELR,
    /// Kimura §5.3), so it never reports data that a crash could take back. A transaction
    /// that writes waits for nothing more than its own commit does: with
    /// [`LogMode::Sync`](crate::LogMode::Sync) (or a pipelined commit's ticket) that is
    /// durable after every commit it read from, as the log is written in order; an
    /// [`LogMode::Async`](crate::LogMode::Async) commit returns before it is durable, and so
    /// may what it read (a crash takes both back, or neither: it is later in the log).
    Sx,
    /// Like `Sx` without the read-only wait: the anomaly of Kimura §5.2 (Table 6) is
    /// possible. For experiments only.
    SxUnsafe,
}

/// The longest duration an option may give: a database opened with a longer one (such as
/// `Duration::MAX`, meaning "never") uses this instead, a year, which no wait outlasts in
/// practice and which cannot overflow a deadline.
///
/// ```
/// use std::time::Duration;
/// let o = shoal::Options::default().with_lock_timeout(Duration::MAX);
/// let db = shoal::Database::in_memory_with(o);
/// assert_eq!(db.options().lock_timeout, shoal::MAX_DURATION);
/// ```
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Settings of a [`Database`].
///
/// Start from [`Options::default()`] and change what you need with the `with_*` methods,
/// which take and return the options by value so they chain; then hand the options to
/// [`Database::open`] or [`Database::in_memory_with`]. The fields stay public for reading
/// (`db.options().lock_timeout`) and for assignment on a `let mut`; the struct is
/// `#[non_exhaustive]`, so new options can be added without breaking callers, which is why
/// it cannot be built with a struct literal outside this crate.
///
/// ```
/// use shoal::{ConcurrencyControl, Database, DeadlockPolicy, LockTableKind, Options};
/// use std::time::Duration;
/// let opts = Options::default()
///     .with_cc(ConcurrencyControl::TwoPhaseLocking)
///     .with_lock_table(LockTableKind::LatchFree)
///     .with_deadlock(DeadlockPolicy::WaitDie)
///     .with_lock_timeout(Duration::from_millis(500));
/// let db = Database::in_memory_with(opts);
/// assert_eq!(db.options().lock_timeout, Duration::from_millis(500));
/// ```
///
/// The setters do not check how options combine: [`Database::open`] and
/// [`Database::try_in_memory_with`] do, and refuse a combination that would not run the
/// technique it names (a victim rule with a deadlock policy that chooses its own victim, or
/// limits the log cannot hold) with [`Error::InvalidOptions`](crate::Error::InvalidOptions):
///
/// ```
/// use shoal::{Database, DeadlockPolicy, Error, Options, Victim};
/// let opts = Options::default().with_deadlock(DeadlockPolicy::NoWait).with_victim(Victim::KillShort);
/// assert!(matches!(Database::try_in_memory_with(opts), Err(Error::InvalidOptions(_))));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
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
    /// Deadlock handling of the lock table (every [`LockTableKind`] runs every policy).
    /// Default: waits-for graph check on blocking.
    pub deadlock: DeadlockPolicy,
    /// Which transaction of a deadlock Dreadlocks rolls back. Default: the younger. Other
    /// policies choose their own victim; opening with another rule and a policy other than
    /// Dreadlocks fails with [`Error::InvalidOptions`](crate::Error::InvalidOptions).
    pub victim: Victim,
    /// Longest wait for one lock before the transaction fails with
    /// [`Error::LockTimeout`]. Default: 2 s.
    pub lock_timeout: Duration,
    /// Longest key a write takes, in bytes (at most 4096, what a page guarantees room for).
    /// Reads, deletes and scan bounds take keys up to 4096 bytes whatever this says, so
    /// rows written under a larger limit stay reachable after a reopen with a smaller one.
    /// Default: 4096.
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
    /// Load control: how many transactions run at once; more wait in `begin` (the wait
    /// counts in their latency), and a transaction waiting for a lock or the log does not
    /// count. Default: [`Admission::Auto`], one per core (one more with synchronous
    /// commits). See [`Admission`](crate::Admission).
    ///
    /// [`Admission::Auto`]: crate::Admission::Auto
    pub admission: crate::Admission,
    /// Load control's quantum: while threads wait for a slot, a thread keeps its slot
    /// across consecutive transactions for this long, then hands it to the head of the
    /// queue. Each hand-over costs a wake-up, a park and a thread that starts on cold
    /// caches; a longer quantum pays that less often but makes each waiting thread's turn
    /// longer (the wait's tail is about threads ÷ slots × quantum; its mean does not
    /// change). Default: [`QUANTUM`](crate::admission::QUANTUM), 1 ms.
    ///
    /// ```
    /// use std::time::Duration;
    /// let o = shoal::Options::default().with_admission_quantum(Duration::from_millis(4));
    /// let db = shoal::Database::in_memory_with(o);
    /// assert_eq!(db.options().admission_quantum, Duration::from_millis(4));
    /// ```
    pub admission_quantum: Duration,
    /// The most bytes of table pages (32 KiB each) the database holds before it refuses
    /// writes: a put, insert, update or integer operation that finds the tables at or past
    /// it, or whose key and value would take them there, fails with
    /// [`Error::MemoryLimit`](crate::Error::MemoryLimit) (so does `create_table`), which is not
    /// retryable; reads and deletes go on, and writes succeed again once deletes have freed
    /// pages of the table written (a table keeps the pages it freed and only it reuses
    /// them, so for other tables' writes they still count). A soft limit: a transaction
    /// admitted under it may still split a page or two.
    /// Under OCC and Doppel, whose writes wait in the transaction until commit, a write
    /// also counts the transaction's earlier writes (their log bytes). Recovery is never
    /// refused (what was committed is replayed whatever the limit), so a
    /// database that grows toward its machine's memory stops taking writes before it stops
    /// fitting. Only table pages count (and, as above, OCC's and Doppel's buffered writes),
    /// not the log buffer or locks. Default: none.
    ///
    /// ```
    /// let o = shoal::Options::default().with_memory_limit(Some(1 << 20));
    /// let db = shoal::Database::in_memory_with(o);
    /// let t = db.create_table("t")?;
    /// let mut i = 0u32;
    /// let err = loop {
    ///     match db.run(|tx| tx.put(&t, i.to_be_bytes(), [0u8; 100])) {
    ///         Ok(()) => i += 1,
    ///         Err(e) => break e,
    ///     }
    /// };
    /// assert!(matches!(err, shoal::Error::MemoryLimit { .. }));
    /// assert!(db.page_bytes() >= 1 << 20);
    /// assert_eq!(db.run(|tx| tx.get(&t, 0u32.to_be_bytes()))?, Some(vec![0u8; 100]));
    /// # Ok::<(), shoal::Error>(())
    /// ```
    pub memory_limit: Option<u64>,
    /// Back the tables' pages with transparent huge pages (Linux; 2 MiB pages where the
    /// system's `transparent_hugepage/enabled` is `madvise` or `always`). Default: on.
    ///
    /// On, a lookup in a large table misses the TLB less often: YCSB-C over 1M rows ran 10%
    /// faster on this project's machines. Off, the tables stay on 4 KiB pages (even where the
    /// system backs all memory with huge pages), which is cheaper for a database that grows
    /// fast where fresh memory is dear: on a virtual machine whose host backs memory on first
    /// touch, a fresh 2 MiB page took milliseconds to fault in, and off, the insert
    /// microbenchmark ran 1.5x faster at two threads (p99 2-3 ms instead of 7-9 ms) and
    /// TPC-C's p99.9 at two threads fell from 1.3-1.7 ms to 0.5 ms (`docs/results.md`, the
    /// twenty-first session). Many database systems advise turning huge pages off for the
    /// latency spikes.
    ///
    /// ```
    /// let db = shoal::Database::in_memory_with(shoal::Options::default().with_huge_pages(false));
    /// let t = db.create_table("t")?;
    /// db.run(|tx| tx.put(&t, b"k", b"v"))?;
    /// assert_eq!(db.run(|tx| tx.get(&t, b"k"))?, Some(b"v".to_vec()));
    /// # Ok::<(), shoal::Error>(())
    /// ```
    pub huge_pages: bool,
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
            admission: crate::Admission::default(),
            admission_quantum: crate::admission::QUANTUM,
            memory_limit: None,
            huge_pages: true,
        }
    }
}

crate::setters::setters! {
    Options;
    with_cc => cc: ConcurrencyControl,
    with_lock_table => lock_table: LockTableKind,
    with_intent_locks => intent_locks: IntentLockKind,
    with_key_range_modes => key_range_modes: crate::lock::KeyRangeModes,
    with_deadlock => deadlock: DeadlockPolicy,
    with_victim => victim: Victim,
    with_lock_timeout => lock_timeout: Duration,
    with_max_key_len => max_key_len: usize,
    with_max_value_len => max_value_len: usize,
    with_log => log: LogMode,
    with_elr => elr: Elr,
    with_log_latency => log_latency: Duration,
    with_log_dir => log_dir: Option<PathBuf>,
    with_log_buffer => log_buffer: usize,
    with_log_segment_size => log_segment_size: u64,
    with_async_flush_delay => async_flush_delay: Duration,
    with_checkpoint_interval => checkpoint_interval: Option<Duration>,
    with_max_retries => max_retries: u32,
    with_doppel => doppel: crate::doppel::DoppelOptions,
    with_admission => admission: crate::Admission,
    with_admission_quantum => admission_quantum: Duration,
    with_memory_limit => memory_limit: Option<u64>,
    with_huge_pages => huge_pages: bool,
}
