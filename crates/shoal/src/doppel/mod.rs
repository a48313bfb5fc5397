//! Doppel phase reconciliation (Narula 2015, chapters 3-5), selected with
//! [`ConcurrencyControl::Doppel`](crate::ConcurrencyControl::Doppel).
//!
//! **Phases.** The database alternates between *joined* phases, where every transaction runs
//! the optimistic (Silo) protocol of [`ConcurrencyControl::Optimistic`](crate::ConcurrencyControl::Optimistic),
//! and *split* phases, where a set of hot records is *split*: each has one *selected
//! operation* ([`SplitOp`]: ADD, MAX, MIN, OPUT, TOPKINSERT(K)) and every use of that operation
//! through the blind API ([`Transaction::add`](crate::Transaction::add),
//! [`max`](crate::Transaction::max), [`min`](crate::Transaction::min),
//! [`oput`](crate::Transaction::oput), [`topk_insert`](crate::Transaction::topk_insert)) is
//! buffered in the transaction's split write set and, once the transaction's OCC commit
//! succeeded, folded into the committing worker's *slice* of the record (OP_delta) instead of
//! the record. Anything else on a split record in a split phase — a read (`get`, a scan over
//! it, the value-returning `add_and_get`/`max_and_get`/`min_and_get`), a `put`/`insert`/`delete`, or a different
//! operation — *stashes* the transaction: it fails with the retryable [`Error::Stashed`]
//! (and is rolled back), and the thread's next [`Database::begin`] waits for the next joined
//! phase, so [`Database::run`] re-runs it there (not counted as a retry, no backoff). A
//! thread that would rather keep working sets the stashed transaction's inputs aside in a
//! [`StashQueue`] and re-runs them once their phase has ended, as the thesis' workers do.
//! Transactions never straddle phases.
//!
//! **Coordinator.** One thread per database changes phases. From joined to split when the
//! classification (below) or [`Database::split_hint`] names records to split; from split to
//! joined when stashed work waits: [`DoppelOptions::split_phase`] (t_s) after the first stash
//! of the phase, or as soon as [`DoppelOptions::stash_threshold`] (n_s) transactions were
//! stashed, or when the classification changes the split set. A joined phase lasts until every
//! stashed thread has begun its re-run (at most [`DoppelOptions::max_joined`]). To change
//! phase the coordinator sets a *changing* flag; `begin()` calls that see it wait, while
//! transactions already running finish (a phase change waits only for those). A thread that
//! begins a transaction while it already has one open on this database joins the current
//! phase at once, so nested transactions cannot deadlock a change; and if running
//! transactions do not drain within [`DoppelOptions::drain_timeout`] (say a transaction that
//! waits for another thread's `begin()`), the change is cancelled, the waiting `begin()`s go
//! on, and the coordinator tries again later (after the drain timeout, doubling per cancel up
//! to eight drain timeouts, so that one long transaction does not keep every `begin()`
//! waiting). A stashed re-run waits for its joined phase at most
//! [`DoppelOptions::stash_wait`], then goes on in the split phase; stashed again after two
//! such waits, `Database::run` returns [`Error::Stashed`] (its joined phase could not come:
//! a running transaction waits for it). When the split phase ends, each worker's slices are
//! merged into the global records (OP_reconcile) while no transaction runs; the next phase
//! starts after that.
//!
//! **Workers and slices.** Each thread gets a small integer [`worker_id`] on first use
//! (process-wide, reused after the thread exits). A thread uses slice set
//! `worker_id % DoppelOptions::slots`; the default 64 slots give every thread of a
//! bench harness its own slices. Threads that share a slot are still correct (the slot has a
//! mutex) but contend. The worker id is also the *writer* of the ordered tuples a thread
//! writes with OPUT and TOPKINSERT (the thesis' core id).
//!
//! **Classification** (§3.6, §5.1). Every [`DoppelOptions::sample_every`]-th transaction of a
//! thread counts the operations it issued per record (ADD/MAX/MIN/OPUT/TOPK through the blind
//! API, reads, writes); every OCC abort counts a conflict for the record that failed
//! validation and the operation the transaction used on it. Every
//! [`DoppelOptions::classify_interval`] (t_c) the coordinator evaluates for each record and
//! splittable operation `savings = w_c·c_op + w_i·n_op` and
//! `impact = savings / max(1, n − n_op)`, and splits the record for its best operation when
//! `c_op ≥ min_conflicts` and impact exceeds [`DoppelOptions::split_threshold`] (or
//! [`DoppelOptions::split_threshold_after_first`] once some record is split); a split record
//! whose impact for its selected operation falls below [`DoppelOptions::join_threshold`]
//! goes back to joined. Records named by [`Database::split_hint`] stay split until
//! [`Database::clear_split_hint`].
//!
//! **Logging.** A split-phase commit logs its joined after-images and its split operations
//! (as operations, a `LogRecord::Ops`) in one record,
//! before it applies them to its slice; the end of a split phase logs the reconciled values
//! as after-images. Recovery replays in log order: within a split phase only split operations
//! touch a split record, and they commute, so replaying them on the last after-image gives
//! the reconciled value; the reconciliation record then resets the record idempotently.
//! Checkpoints run only inside joined phases (they hold off phase changes meanwhile), so a
//! checkpoint never misses slices that were not reconciled.
//!
//! **Value encodings.** Integers (ADD, MAX, MIN) are 8-byte little-endian `i64`. An ordered
//! tuple (OPUT) is `order: i64 LE | writer: u32 LE | bytes` ([`OrderedTuple::encode`]); a
//! tuple `(o', j', x')` replaces `(o, j, x)` when `(o', j') > (o, j)`, and an absent record
//! counts as order −∞. A top-K set (TOPKINSERT) is `n: u32 LE` followed by `n` entries
//! `order: i64 LE | writer: u32 LE | len: u32 LE | bytes[len]`, largest order first
//! ([`encode_topk`]), with at most one entry per order (the highest writer id) and at most K
//! entries (an insert beyond K drops the smallest order). Read them with
//! [`Transaction::get_tuple`](crate::Transaction::get_tuple) and
//! [`Transaction::get_topk`](crate::Transaction::get_topk).
//!
//! [`Database::begin`]: crate::Database::begin
//! [`Database::run`]: crate::Database::run
//! [`Database::split_hint`]: crate::Database::split_hint
//! [`Database::clear_split_hint`]: crate::Database::clear_split_hint
//! [`Error::Stashed`]: crate::Error::Stashed

mod coordinator;
mod ops;
mod stash;
mod value;

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;

pub(crate) use coordinator::{DoppelHandle, Fold, Store};
pub use ops::SplitOp;
pub(crate) use ops::{clamp_i64, Delta};
pub use stash::StashQueue;
pub use value::{decode_topk, encode_topk, OrderedTuple, TUPLE_HEADER};
pub(crate) use value::{decode_topk_at, decode_tuple_at};

use crate::error::{Error, Result};
use crate::lock::TableId;

/// Parameters of Doppel, with the thesis' values as defaults (§3.5, §3.6, §7).
///
/// Start from [`DoppelOptions::default()`] and change what you need with the `with_*`
/// methods, which take and return the options by value so they chain; then hand them to
/// [`Options::with_doppel`](crate::Options::with_doppel). The fields stay public for reading
/// (`db.options().doppel.split_phase`) and for assignment on a `let mut`; the struct is
/// `#[non_exhaustive]`, so new parameters can be added without breaking callers, which is
/// why it cannot be built with a struct literal outside this crate.
///
/// ```
/// use shoal::{ConcurrencyControl, Database, Options};
/// use shoal::doppel::DoppelOptions;
/// use std::time::Duration;
/// let db = Database::in_memory_with(
///     Options::default()
///         .with_cc(ConcurrencyControl::Doppel)
///         .with_doppel(DoppelOptions::default().with_split_phase(Duration::from_millis(5))),
/// );
/// assert_eq!(db.options().doppel.split_phase, Duration::from_millis(5));
/// assert_eq!(db.options().doppel.classify_interval, Duration::from_millis(200));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DoppelOptions {
    /// t_s: longest time stashed work waits in a split phase. Default 20 ms.
    pub split_phase: Duration,
    /// n_s: end the split phase early once this many transactions were stashed in it.
    /// Default 100 000.
    pub stash_threshold: u64,
    /// t_c: how often the statistics are evaluated. Default 200 ms.
    pub classify_interval: Duration,
    /// w_c: weight of sampled conflicts. Default 2.
    pub conflict_weight: f64,
    /// w_i: weight of sampled issued operations. Default 1.
    pub issue_weight: f64,
    /// Impact above which a record is split while nothing is split. Default 2.0. (The
    /// thesis gives no numbers; these are ours.)
    pub split_threshold: f64,
    /// Impact above which a further record is split once one is (phases change anyway, so
    /// the next split costs less). Default 1.0.
    pub split_threshold_after_first: f64,
    /// Impact below which a split record goes back to joined. Default 0.5.
    pub join_threshold: f64,
    /// Fewest conflicts per interval before a record is considered for splitting. Default 10.
    pub min_conflicts: u64,
    /// One transaction in this many (per thread) counts its operations. Default 8.
    pub sample_every: u32,
    /// Automatic classification; off leaves only [`Database::split_hint`](crate::Database::split_hint).
    /// Default on.
    pub auto_classify: bool,
    /// Number of slice sets (workers); threads map to `worker_id % slots`. Default 64.
    pub slots: usize,
    /// How long a phase change waits for running transactions before it is cancelled and
    /// retried later. Default 50 ms.
    pub drain_timeout: Duration,
    /// Longest joined phase while stashed threads have not yet begun their re-runs.
    /// Default 20 ms.
    pub max_joined: Duration,
    /// Longest wait of a stashed transaction's re-run for its joined phase. A joined phase
    /// needs every running transaction to end; when one of them waits for the stashed
    /// thread (outside the engine), it never comes. Past this wait the re-run goes on in the
    /// split phase; stashed again after a second such wait, [`Database::run`](crate::Database::run)
    /// returns [`Error::Stashed`]. An explicit
    /// [`Database::checkpoint`](crate::Database::checkpoint), which runs in a joined phase,
    /// waits as long for one, then returns an [`Error::Io`] of kind `TimedOut` (the
    /// background checkpointer waits on). Default 2 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// let o = shoal::doppel::DoppelOptions::default().with_stash_wait(Duration::from_secs(5));
    /// assert_eq!(o.stash_wait, Duration::from_secs(5));
    /// ```
    pub stash_wait: Duration,
}

impl Default for DoppelOptions {
    fn default() -> Self {
        DoppelOptions {
            split_phase: Duration::from_millis(20),
            stash_threshold: 100_000,
            classify_interval: Duration::from_millis(200),
            conflict_weight: 2.0,
            issue_weight: 1.0,
            split_threshold: 2.0,
            split_threshold_after_first: 1.0,
            join_threshold: 0.5,
            min_conflicts: 10,
            sample_every: 8,
            auto_classify: true,
            slots: 64,
            drain_timeout: Duration::from_millis(50),
            max_joined: Duration::from_millis(20),
            stash_wait: Duration::from_secs(2),
        }
    }
}

crate::setters::setters! {
    DoppelOptions;
    with_split_phase => split_phase: Duration,
    with_stash_threshold => stash_threshold: u64,
    with_classify_interval => classify_interval: Duration,
    with_conflict_weight => conflict_weight: f64,
    with_issue_weight => issue_weight: f64,
    with_split_threshold => split_threshold: f64,
    with_split_threshold_after_first => split_threshold_after_first: f64,
    with_join_threshold => join_threshold: f64,
    with_min_conflicts => min_conflicts: u64,
    with_sample_every => sample_every: u32,
    with_auto_classify => auto_classify: bool,
    with_slots => slots: usize,
    with_drain_timeout => drain_timeout: Duration,
    with_stash_wait => stash_wait: Duration,
    with_max_joined => max_joined: Duration,
}

/// The phase the database is in.
///
/// ```
/// use shoal::doppel::Phase;
/// assert_ne!(Phase::Joined, Phase::Split);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Every record joined; OCC for everything.
    Joined,
    /// Some records split.
    Split,
}

/// Counters of the Doppel runtime, from [`Database::doppel_stats`](crate::Database::doppel_stats).
///
/// ```
/// # fn main() -> shoal::Result<()> {
/// use shoal::{ConcurrencyControl, Database, Options};
/// let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Doppel));
/// let s = db.doppel_stats().expect("a Doppel database");
/// assert_eq!(s.split_keys, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct DoppelStats {
    /// The current phase (`None` never: kept optional for forward compatibility).
    pub phase: Option<Phase>,
    /// Phase number: grows by one with every phase change.
    pub epoch: u64,
    /// Split phases entered so far.
    pub split_phases: u64,
    /// Transactions stashed so far.
    pub stashed: u64,
    /// Records split now.
    pub split_keys: usize,
    /// Most records split at once so far.
    pub max_split_keys: usize,
    /// Phase changes cancelled because running transactions did not drain in time.
    pub cancelled_changes: u64,
}

// ----- worker ids ---------------------------------------------------------------------------

static NEXT_WORKER: AtomicU32 = AtomicU32::new(0);
static FREE_WORKERS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

struct WorkerGuard(u32);

impl WorkerGuard {
    fn register() -> WorkerGuard {
        let mut free = FREE_WORKERS.lock();
        // Smallest free id first, so live threads keep small, distinct ids.
        let id = match free.iter().enumerate().min_by_key(|(_, v)| **v) {
            Some((i, _)) => free.swap_remove(i),
            None => NEXT_WORKER.fetch_add(1, Ordering::Relaxed),
        };
        WorkerGuard(id)
    }
}

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        FREE_WORKERS.lock().push(self.0);
    }
}

thread_local! {
    static WORKER: WorkerGuard = WorkerGuard::register();
    /// Per database: open transactions of this thread.
    static ACTIVE: RefCell<Vec<(u64, u32)>> = const { RefCell::new(Vec::new()) };
    /// Per database: the split phase in which this thread last had a transaction stashed.
    static STASHED: RefCell<Vec<StashMark>> = const { RefCell::new(Vec::new()) };
    /// Transactions begun on this thread (for sampling).
    static BEGUN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// The database whose transaction this thread last began, and whether that `begin()`
    /// was a stashed re-run that gave up waiting for a joined phase (see [`Doppel::enter`]).
    /// Keyed by database: a transaction on another database begun inside `Database::run`'s
    /// closure must not change what the run decides.
    static OVERDUE: std::cell::Cell<(u64, bool)> = const { std::cell::Cell::new((u64::MAX, false)) };
}

/// Whether this thread's last transaction began as a stashed re-run that waited longer than
/// [`DoppelOptions::stash_wait`] for a joined phase and went on in a split phase: a second
/// stash of such a re-run ends `Database::run`'s retries.
pub(crate) fn began_overdue(db: u64) -> bool {
    OVERDUE
        .try_with(std::cell::Cell::get)
        .is_ok_and(|(d, overdue)| d == db && overdue)
}

/// This thread's worker id: a small integer, distinct among live threads, assigned on first
/// use and reused after the thread exits. It picks the thread's slice set under Doppel and is
/// the writer id of the ordered tuples it writes.
///
/// ```
/// let me = shoal::doppel::worker_id();
/// assert_eq!(me, shoal::doppel::worker_id());
/// let other = std::thread::spawn(shoal::doppel::worker_id).join().unwrap();
/// assert_ne!(me, other);
/// ```
pub fn worker_id() -> u32 {
    // A thread-local being destroyed (thread exit) answers with a fresh id.
    WORKER
        .try_with(|w| w.0)
        .unwrap_or_else(|_| NEXT_WORKER.fetch_add(1, Ordering::Relaxed))
}

struct StashMark {
    db: u64,
    epoch: u64,
    owner: Weak<Doppel>,
}

impl Drop for StashMark {
    fn drop(&mut self) {
        if let Some(d) = self.owner.upgrade() {
            d.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn active_count(db: u64) -> u32 {
    // A thread being torn down counts none, as `active_add` records none.
    ACTIVE
        .try_with(|a| {
            a.borrow()
                .iter()
                .find(|(d, _)| *d == db)
                .map_or(0, |(_, n)| *n)
        })
        .unwrap_or(0)
}

fn active_add(db: u64, delta: i32) {
    let _ = ACTIVE.try_with(|a| {
        let mut a = a.borrow_mut();
        match a.iter_mut().position(|(d, _)| *d == db) {
            Some(i) => {
                a[i].1 = a[i].1.saturating_add_signed(delta);
                if a[i].1 == 0 {
                    a.swap_remove(i);
                }
            }
            None if delta > 0 => a.push((db, delta as u32)),
            None => {}
        }
    });
}

// ----- the runtime --------------------------------------------------------------------------

const SPLIT: u64 = 1;
const CHANGING: u64 = 2;

fn epoch_of(w: u64) -> u64 {
    w >> 2
}

pub(crate) type Key = (TableId, Box<[u8]>);

/// A split operation a transaction applies at commit: table, key and the operation.
pub(crate) type SplitWrite = (TableId, Box<[u8]>, Delta);

/// A key's hash, for matching a conflict to the operation that used the key.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    h.write(key);
    h.finish()
}
type SplitMap = FxHashMap<TableId, FxHashMap<Box<[u8]>, SplitOp>>;

/// What a transaction did with a record, for the statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpClass {
    Read,
    Write,
    Split(SplitOp),
}

#[derive(Default)]
struct SlotData {
    /// The split records of the current split phase (empty in joined phases). Each slot has
    /// its own `Arc`, so a transaction taking it at `enter` touches no shared count.
    split: Arc<SplitMap>,
    slices: FxHashMap<Key, Delta>,
    /// Per record: (operation, sampled issue count, conflict count).
    stats: FxHashMap<Key, Vec<(OpClass, u64, u64)>>,
    /// The records whose sampled operations are counted: those that had a conflict in this
    /// classification interval or the last, and the split ones (by key hash). Only they can
    /// be split or stay split (`c_op >= min_conflicts`, or a current split record's impact),
    /// so counting every record a sampled transaction touches would only fill `stats` with
    /// keys the classification skips (RUBiS, INCR1 with a cold table: hundreds of thousands
    /// per interval).
    watch: rustc_hash::FxHashSet<(TableId, u64)>,
}

#[derive(Default)]
struct Slot {
    /// Transactions running on this slot (plus checkpoint pins).
    active: AtomicU64,
    data: Mutex<SlotData>,
}

#[derive(Default)]
struct Control {
    hints: FxHashMap<Key, SplitOp>,
    current: FxHashMap<Key, SplitOp>,
    desired: FxHashMap<Key, SplitOp>,
    reclassify: bool,
}

/// The Doppel runtime of one database.
pub(crate) struct Doppel {
    db: u64,
    opts: DoppelOptions,

    word: CachePadded<AtomicU64>,
    slots: Box<[CachePadded<Slot>]>,
    gate: Mutex<()>,
    cv: Condvar,
    base: Instant,
    stashes: AtomicU64,
    first_stash: AtomicU64,
    pending: AtomicI64,
    total_stashed: AtomicU64,
    split_phases: AtomicU64,
    cancelled: AtomicU64,
    max_split: AtomicU64,
    ctl: Mutex<Control>,
    stop: AtomicBool,
}

/// A transaction's place in a phase.
pub(crate) struct Entered {
    pub(crate) slot: usize,
    pub(crate) epoch: u64,
    pub(crate) split: bool,
    pub(crate) sampled: bool,
    /// The phase's split records (split phases only): phases change only while no
    /// transaction runs, so this stays exact for the transaction's life, and looking a key up
    /// takes no lock.
    split_map: Option<Arc<SplitMap>>,
}

impl Entered {
    /// The selected operation of a split record, if `key` is split (split phases only).
    pub(crate) fn split_op(&self, table: TableId, key: &[u8]) -> Option<SplitOp> {
        self.split_map.as_ref()?.get(&table)?.get(key).copied()
    }

    /// Whether a split record of `table` lies in the range.
    pub(crate) fn split_in_range(
        &self,
        table: TableId,
        lo: std::ops::Bound<&[u8]>,
        hi: std::ops::Bound<&[u8]>,
    ) -> bool {
        use std::ops::RangeBounds;
        self.split_map.as_ref().is_some_and(|m| {
            m.get(&table)
                .is_some_and(|m| m.keys().any(|k| (lo, hi).contains(&k[..])))
        })
    }
}

impl Doppel {
    pub(crate) fn new(db: u64, opts: DoppelOptions) -> Arc<Doppel> {
        let n = opts.slots.max(1);
        Arc::new(Doppel {
            db,
            opts,
            word: CachePadded::new(AtomicU64::new(0)),
            slots: (0..n).map(|_| CachePadded::new(Slot::default())).collect(),
            gate: Mutex::new(()),
            cv: Condvar::new(),
            base: Instant::now(),
            stashes: AtomicU64::new(0),
            first_stash: AtomicU64::new(0),
            pending: AtomicI64::new(0),
            total_stashed: AtomicU64::new(0),
            split_phases: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            max_split: AtomicU64::new(0),
            ctl: Mutex::new(Control::default()),
            stop: AtomicBool::new(false),
        })
    }

    fn now_ns(&self) -> u64 {
        (self.base.elapsed().as_nanos() as u64).max(1)
    }

    /// Waits (briefly) until the phase word is no longer `w`.
    fn wait_while(&self, w: u64) {
        // Without an admission slot: the phase change waits for running transactions, which
        // may need a slot to finish.
        crate::admission::blocking(|| {
            let mut g = self.gate.lock();
            if self.word.load(Ordering::SeqCst) == w {
                self.cv.wait_for(&mut g, Duration::from_millis(1));
            }
        })
    }

    fn wake(&self) {
        let _g = self.gate.lock();
        self.cv.notify_all();
    }

    /// Registers a transaction in the current phase; see the module documentation.
    pub(crate) fn enter(self: &Arc<Self>) -> Entered {
        loop {
            // Without `joined_only`, `try_enter` always enters.
            if let Some(e) = self.try_enter(false, None) {
                return e;
            }
        }
    }

    /// Registers a transaction, or with `joined_only` a checkpoint pin, which waits for a
    /// joined phase: until `deadline` if there is one, then gives up (`None`).
    fn try_enter(
        self: &Arc<Self>,
        joined_only: bool,
        deadline: Option<Instant>,
    ) -> Option<Entered> {
        let slot = worker_id() as usize % self.slots.len();
        let nested = active_count(self.db) > 0;
        let mark = if nested {
            None
        } else {
            // A thread being torn down keeps no marks (see `stash`).
            STASHED
                .try_with(|s| s.borrow().iter().find(|m| m.db == self.db).map(|m| m.epoch))
                .ok()
                .flatten()
        };
        // A stashed re-run waits for a joined phase, which needs every running transaction
        // to end. One that waits (outside the engine) for this thread's result never ends:
        // the phase changes are cancelled over and over, and the re-run waited for ever. So
        // it waits at most `DoppelOptions::stash_wait`, then goes on in the phase there is; a
        // split record it touches stashes it again, and after a second such wait
        // `Database::run` returns the `Stashed` error instead of re-running it (a deadlock
        // broken by a timeout, as under 2PL).
        let since = mark.map(|_| Instant::now());
        let mut overdue = false;
        let w = loop {
            let w = self.word.load(Ordering::SeqCst);
            if !nested {
                overdue = overdue || since.is_some_and(|s| s.elapsed() > self.opts.stash_wait);
                let wait_mark = mark.is_some() && !overdue;
                if w & CHANGING != 0
                    || ((joined_only || wait_mark) && w & SPLIT != 0)
                    || (wait_mark && mark.is_some_and(|e| epoch_of(w) <= e))
                {
                    if joined_only && deadline.is_some_and(|d| Instant::now() >= d) {
                        return None;
                    }
                    self.wait_while(w);
                    continue;
                }
            }
            self.slots[slot].active.fetch_add(1, Ordering::SeqCst);
            if nested || self.word.load(Ordering::SeqCst) == w {
                break w;
            }
            self.slots[slot].active.fetch_sub(1, Ordering::SeqCst);
        };
        if mark.is_some() {
            // The re-run has begun (in a joined phase, unless overdue): the mark goes (and
            // with it the pending count the coordinator waits for).
            let _ = STASHED.try_with(|s| s.borrow_mut().retain(|m| m.db != self.db));
        }
        if !nested {
            let _ = OVERDUE.try_with(|o| o.set((self.db, overdue)));
        }
        active_add(self.db, 1);
        let every = self.opts.sample_every.max(1);
        let sampled = BEGUN.with(|b| {
            let n = b.get().wrapping_add(1);
            b.set(n);
            n % every == 0
        });
        let split = w & SPLIT != 0;
        Some(Entered {
            slot,
            epoch: epoch_of(w),
            split,
            sampled,
            split_map: split.then(|| Arc::clone(&self.slots[slot].data.lock().split)),
        })
    }

    /// Ends what [`enter`](Self::enter) began.
    pub(crate) fn exit(&self, slot: usize) {
        active_add(self.db, -1);
        self.slots[slot].active.fetch_sub(1, Ordering::SeqCst);
    }

    /// A transaction of split phase `epoch` was stashed.
    pub(crate) fn stash(self: &Arc<Self>, epoch: u64) {
        self.total_stashed.fetch_add(1, Ordering::Relaxed);
        if self.stashes.fetch_add(1, Ordering::AcqRel) == 0 {
            let _ = self.first_stash.compare_exchange(
                0,
                self.now_ns(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        // A thread being torn down keeps no mark: its re-run is stashed again until a
        // joined phase.
        let _ = STASHED.try_with(|s| {
            let mut s = s.borrow_mut();
            match s.iter_mut().find(|m| m.db == self.db) {
                Some(m) => m.epoch = m.epoch.max(epoch),
                None => {
                    self.pending.fetch_add(1, Ordering::AcqRel);
                    s.push(StashMark {
                        db: self.db,
                        epoch,
                        owner: Arc::downgrade(self),
                    });
                }
            }
        });
    }

    /// Folds a committed transaction's split operations into its slot's slices (OP_delta).
    pub(crate) fn apply_slices(&self, slot: usize, sw: Vec<SplitWrite>) {
        let mut d = self.slots[slot].data.lock();
        for (t, k, delta) in sw {
            match d.slices.entry((t, k)) {
                std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().merge(delta),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(delta);
                }
            }
        }
    }

    /// Counts a finished transaction's operations (when sampled: `keys` parallels `ops`) and
    /// its conflict.
    pub(crate) fn record(
        &self,
        slot: usize,
        ops: &[(TableId, u64, OpClass)],
        keys: &[Box<[u8]>],
        sampled: bool,
        conflict: Option<(TableId, Box<[u8]>)>,
    ) {
        if !self.opts.auto_classify || (!sampled && conflict.is_none()) {
            return;
        }
        let every = u64::from(self.opts.sample_every.max(1));
        let mut guard = self.slots[slot].data.lock();
        let SlotData { stats, watch, .. } = &mut *guard;
        let mut bump = |table: TableId, key: &[u8], class: OpClass, n: u64, c: u64| {
            let v = stats.entry((table, key.into())).or_default();
            match v.iter_mut().find(|e| e.0 == class) {
                Some(e) => {
                    e.1 += n;
                    e.2 += c;
                }
                None => v.push((class, n, c)),
            }
        };
        let conflict = conflict.map(|(t, k)| {
            let h = key_hash(&k);
            watch.insert((t, h));
            (t, h, k)
        });
        if sampled && keys.len() == ops.len() {
            for ((t, h, class), k) in ops.iter().zip(keys) {
                if watch.contains(&(*t, *h)) {
                    bump(*t, k, *class, every, 0);
                }
            }
        }
        if let Some((t, h, k)) = conflict {
            let class = ops
                .iter()
                .rev()
                .find(|(ot, oh, _)| *ot == t && *oh == h)
                .map_or(OpClass::Read, |o| o.2);
            bump(t, &k, class, 0, 1);
        }
    }
}

/// Holds off phase changes while a checkpoint runs, inside a joined phase.
pub(crate) struct Pin {
    rt: Arc<Doppel>,
    slot: usize,
}

impl Pin {
    /// Waits for a joined phase and holds it. With `wait`, gives up after that long (a
    /// split-phase transaction that stays open, perhaps waiting for this very thread, keeps
    /// the phase split for ever) and returns an [`Error::Io`] of kind `TimedOut`.
    pub(crate) fn new(rt: &Arc<Doppel>, wait: Option<Duration>) -> Result<Pin> {
        // Nested in a transaction of this thread, the phase cannot change: a split one would
        // never end.
        if active_count(rt.db) > 0 && rt.word.load(Ordering::SeqCst) & SPLIT != 0 {
            return Err(Error::Unsupported(
                "a checkpoint inside a split-phase transaction of the same thread".into(),
            ));
        }
        // Waiting for a joined phase like a stashed thread: the coordinator ends a split phase
        // (after t_s) for pending waiters.
        rt.pending.fetch_add(1, Ordering::AcqRel);
        let e = rt.try_enter(true, wait.map(|w| Instant::now() + w));
        rt.pending.fetch_sub(1, Ordering::AcqRel);
        match e {
            Some(e) => Ok(Pin {
                rt: Arc::clone(rt),
                slot: e.slot,
            }),
            None => Err(Error::Io {
                path: std::path::PathBuf::new(),
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "checkpoint: no joined Doppel phase within {:?} (DoppelOptions::stash_wait): \
                         a split-phase transaction stayed open",
                        rt.opts.stash_wait
                    ),
                ),
            }),
        }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.rt.exit(self.slot);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_overdue_begin_counts_only_for_its_own_database() {
        let _ = super::OVERDUE.try_with(|o| o.set((7, true)));
        assert!(super::began_overdue(7));
        // A run on database 8 whose closure began an overdue re-run on database 7 does not
        // end its own retries on that account.
        assert!(!super::began_overdue(8));
        let _ = super::OVERDUE.try_with(|o| o.set((7, false)));
        assert!(!super::began_overdue(7));
    }
}
