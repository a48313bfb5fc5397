//! Load control: an admission gate that keeps the number of transactions actually running
//! near the number of cores.
//!
//! # Why
//!
//! With more threads than cores, a thread that holds locks (or an OCC commit's lock bits, or
//! a claimed log range) is preempted by the scheduler, and everyone who needs what it holds
//! waits a whole scheduling quantum: throughput collapses once threads outnumber cores (TPC-B
//! under 2PL fell from 754k tps at 2 threads to 100k at 512 on two cores). This is the
//! data-contention thrashing of the load-control literature: Heiss and Wagner, "Adaptive Load
//! Control in Transaction Processing Systems" (VLDB 1991) and Mönkeberg and Weikum,
//! "Performance Evaluation of an Adaptive and Robust Load Control Method for the Avoidance
//! of Data-Contention Thrashing" (VLDB 1992) limit the multiprogramming level; MySQL's
//! `innodb_thread_concurrency` limits the threads inside InnoDB the same way; and CATS (Tian
//! et al., "Contention-Aware Lock Scheduling", VLDB 2018) shows that what a waiter waits
//! behind matters as much as how many run. Shore-MT's rule (Johnson et al., EDBT 2009)
//! shapes the fast path: no hot latch on the common path.
//!
//! # Design
//!
//! A gate has a fixed number of *slots* ([`Admission::Auto`]: one per core, from
//! [`std::thread::available_parallelism`], and a spare one with synchronous commits, whose
//! slots change hands at every commit: see [`Admission`]); a thread must hold one to run a
//! transaction.
//!
//! - **Where slots are taken**: in [`Database::begin`](crate::Database::begin) (and
//!   `begin_retry`, `run`), before anything else, so the time a transaction waits to run is
//!   inside its begin..commit latency. The slot is one word per slot, on its own cache line;
//!   taking a free one is one compare-and-swap.
//! - **Where they are given up**: when the transaction ends (commit, abort or drop), and for
//!   the length of every wait inside the engine: a lock wait (the lock is first tried without
//!   waiting, then retried for [`LOCK_SPIN`], since its holder most likely runs in another
//!   slot and is done within microseconds; only then does the request wait: in its slot
//!   while at least one other slot stays with a thread that is not waiting for a lock and
//!   no resumer waits, which keeps a hot lock's queue as short as the slot count instead
//!   of a convoy of parked threads, else giving its slot up around the blocking call),
//!   a wait for the log to be durable (sync commits, safe SX-ELR read-only commits), a
//!   Doppel `begin` waiting for a phase change, and the serial mode's mutex. A thread that
//!   comes back from a wait queues as a *resumer*: resumers are served before threads that
//!   begin a transaction, because they may hold locks others wait for. A commit's own wait
//!   for the log (`admission/commit.rs`) does better: its thread is queued for a slot by
//!   the log flusher once the commit is durable, as a beginner (it holds nothing), and
//!   wakes only when it is handed one, which it keeps for its next transaction; one that
//!   still holds locks (no early lock release) is woken at once and releases them without
//!   a slot.
//! - **The quantum**: a thread that commits keeps its slot (marked *kept*, still its own,
//!   one store to its own slot's line) and takes it back at its next `begin` with one
//!   compare-and-swap on the same line. With no thread waiting that is all the gate costs
//!   per transaction, and nothing shared is written. While threads wait, a thread keeps its
//!   slot across consecutive transactions for at most its quantum ([`QUANTUM`] unless
//!   [`Options::admission_quantum`](crate::Options::admission_quantum) says otherwise) after it got it, then hands
//!   it to the head of the queue at the end of a transaction; so the hand-over (an unpark and
//!   a park) is paid once per quantum, not per transaction. An abort keeps the slot the same
//!   way: its retry conflicts only with the few transactions running in the other slots,
//!   and giving the slot up would send the retry to the back of the queue and pay a
//!   hand-over per abort (OCC TPC-B at 512 threads: 0.74 of peak that way, 0.81 keeping
//!   it; a backoff that sleeps longer than a watchdog tick loses the slot anyway). A
//!   transaction end gives the slot up at once while resumers wait.
//! - **Kept slots are reclaimed**: with nobody waiting, any thread may take a kept slot (its
//!   owner's next `begin` then queues normally). While threads wait, a watchdog thread (one
//!   per process, asleep while no gate has waiters) looks every [`WATCHDOG_TICK`] (growing
//!   to [`WATCHDOG_TICK_MAX`] while it finds nothing to take back) and hands a slot that
//!   stayed kept, unchanged, for a whole tick to the head of the queue: a thread that
//!   commits and then does something else for a long time costs the others at most about
//!   two ticks. A thread that exits gives its kept slot up at once.
//! - **Nesting**: a thread that begins a transaction while it has one open (on this or
//!   another database) runs it in the slot it holds (or, if it holds none, without one): it
//!   never waits for a slot while it has a transaction open, so nesting cannot deadlock.
//! - **Fairness**: waiters are served in FIFO order within their class; resumers go before
//!   beginners, but at most 16 in a row while a beginner waits, so beginners are not starved
//!   either. A slot given up while threads wait goes directly from its owner to the head of
//!   the queue, never through the free state, so newcomers cannot overtake the queue; a
//!   thread that has had its quantum queues behind everyone who waited.
//! - **Escape**: a thread that waited [`ESCAPE`] (1 s) for a slot, the last second of it
//!   without any slot changing hands, leaves the queue and runs without one. Threads that
//!   hold every slot may be waiting outside the engine for this very thread (three threads
//!   on two cores, each with a transaction open, waiting for one another on a channel): the
//!   escape turns that deadlock into a delay. A queue that moves is never escaped from,
//!   however long it is: its turn comes (FIFO). With the time waited alone, a turn of the
//!   queue near a second (TPC-B at 512 threads on a busy two-core machine: p99.9 up to 0.7
//!   s, the longest waits over 1 s) let threads run past the gate, which preempted the
//!   slot holders and lengthened the turns further (1,093 escapes in one such 5 s run).
//! - **Caveat**: a transaction holds its slot from `begin` to its end, also while its thread
//!   runs application code between operations; a thread that keeps a transaction open while
//!   it waits for something outside the engine keeps others from running (up to the escape
//!   time). Leaking a transaction (`std::mem::forget`) keeps its thread's slot until the
//!   thread exits.
//!
//! The hand-over itself is in `admission/gate.rs`, written against a small `sync` module so
//! that `tests/admission_shuttle.rs` model-checks it with `shuttle`.
//!
//! ```
//! use shoal::{Admission, Database, Options};
//! // On by default (one running transaction per core); `Off` gives the old behaviour.
//! assert_eq!(Options::default().admission, Admission::Auto);
//! let db = Database::in_memory_with(Options::default().with_admission(Admission::Limit(1)));
//! let t = db.create_table("t")?;
//! db.run(|tx| tx.put(&t, "k", "v"))?;
//! let s = db.admission_stats().expect("admission is on");
//! assert_eq!((s.limit, s.running, s.waiting), (1, 0, 0));
//! # Ok::<(), shoal::Error>(())
//! ```

#[path = "admission/commit.rs"]
mod commit;
#[path = "admission/gate.rs"]
mod gate;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

pub(crate) use commit::{commit_wait, requeue_durable};
pub(crate) use gate::{Gate, Waiter};

/// The primitives the hand-over uses (`std` and `parking_lot` here; `shuttle`'s in the
/// model-checking test).
mod sync {
    pub(super) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    pub(super) use std::thread::{current, park, park_timeout, Thread};

    /// The queue's mutex, with the one method the gate uses.
    #[derive(Default)]
    pub(super) struct Mutex<T>(parking_lot::Mutex<T>);

    impl<T> Mutex<T> {
        pub(super) fn new(t: T) -> Self {
            Mutex(parking_lot::Mutex::new(t))
        }

        pub(super) fn lock(&self) -> parking_lot::MutexGuard<'_, T> {
            self.0.lock()
        }
    }
}

pub use gate::QUANTUM;

/// The longest a thread waits for a slot while no slot changes hands: then it runs without
/// one. Threads that hold every slot may be waiting, outside the engine, for this very
/// thread (say three threads with a transaction open each, on two cores, that wait for one
/// another on a channel); the escape turns that deadlock into a delay. A queue that moves
/// (slots handed over) is waited out, however long it is.
pub const ESCAPE: Duration = Duration::from_secs(1);

/// How long a transaction that finds a lock taken retries it (spinning, then yielding)
/// before it gives its slot up and waits in the lock table.
pub const LOCK_SPIN: Duration = Duration::from_micros(100);

/// The retry budget of a lock request that would block (see [`LOCK_SPIN`]).
pub(crate) struct LockSpin {
    start: Instant,
    n: std::cell::Cell<u32>,
}

impl LockSpin {
    pub(crate) fn new() -> LockSpin {
        LockSpin {
            start: Instant::now(),
            n: std::cell::Cell::new(0),
        }
    }

    /// Waits a little; false once the budget is spent, or at once when a transaction waits
    /// to resume on `gate` (it may be the holder this one waits for).
    pub(crate) fn again(&self, gate: &Gate) -> bool {
        if gate.waiting().1 > 0 {
            return false;
        }
        let n = self.n.get() + 1;
        self.n.set(n);
        if n < 16 {
            for _ in 0..(1 << n.min(6)) {
                std::hint::spin_loop();
            }
        } else {
            std::thread::yield_now();
        }
        self.start.elapsed() < LOCK_SPIN
    }
}

/// How often the watchdog looks for slots kept by threads that stayed away while others
/// wait (a slot kept unchanged for a whole tick is handed over).
pub const WATCHDOG_TICK: Duration = Duration::from_millis(1);

/// The longest the watchdog's tick grows to while its rounds find no slot to take back.
pub const WATCHDOG_TICK_MAX: Duration = Duration::from_millis(4);

/// The watchdog's next tick: back to [`WATCHDOG_TICK`] after a round that took a slot from a
/// thread that stayed away (more may follow), else twice the last one, up to
/// [`WATCHDOG_TICK_MAX`]. Each round wakes the watchdog, and on a machine with as many
/// runnable threads as cores that preempts a transaction; with a 1 ms tick, half the context
/// switches of OCC TPC-B at 512 threads on 2 cores were the watchdog's (23-24 per thousand
/// commits, 15-17 with a longer tick), while its rounds there took a slot about 4 times a
/// second.
fn next_tick(last: Duration, took: usize) -> Duration {
    if took > 0 {
        WATCHDOG_TICK
    } else {
        (last * 2).min(WATCHDOG_TICK_MAX)
    }
}

/// How many transactions a database lets run at once ([`Options::admission`]).
///
/// [`Options::admission`]: crate::Options::admission
///
/// ```
/// use shoal::{Admission, Database, Options};
/// let db = Database::in_memory_with(Options::default().with_admission(Admission::Off));
/// assert!(db.admission_stats().is_none());
/// let auto = Database::in_memory();
/// let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
/// assert_eq!(auto.admission_stats().map(|s| s.limit), Some(cores));
/// ```
///
/// With synchronous commits ([`LogMode::Sync`], the default of [`Database::open`]) `Auto`
/// gives one slot more than there are cores. Such a commit gives its slot up for its flush
/// (to a parked thread, or later to itself when the flusher queues it), so a slot changes
/// hands at every commit; the thread handed it still has to be woken and scheduled, and
/// until it runs its core has nothing to do. The spare slot keeps a runnable thread there
/// meanwhile. TPC-B (scale 20, 2PL, SX-ELR, sync commits, 64 threads on 2 cores) ran
/// 65-70k transactions/s with two slots and 87k with three (and with four); without a
/// log, where a slot changes hands once a quantum, a third slot made 512 threads 2-4%
/// slower (2PL), so there `Auto` stays at one per core.
///
/// [`LogMode::Sync`]: crate::LogMode::Sync
/// [`Database::open`]: crate::Database::open
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Admission {
    /// No gate: every thread that begins a transaction runs it at once.
    Off,
    /// As many running transactions as [`std::thread::available_parallelism`], one more
    /// with synchronous commits (the default; see [`Admission::slots_for`]).
    #[default]
    Auto,
    /// At most this many running transactions (0 counts as 1).
    Limit(usize),
}

impl Admission {
    /// The number of slots of a database without synchronous commits, or `None` when off.
    ///
    /// ```
    /// use shoal::Admission;
    /// assert_eq!(Admission::Off.slots(), None);
    /// assert_eq!(Admission::Limit(0).slots(), Some(1));
    /// assert_eq!(Admission::Limit(8).slots(), Some(8));
    /// assert!(Admission::Auto.slots().is_some_and(|n| n >= 1));
    /// ```
    pub fn slots(self) -> Option<usize> {
        match self {
            Admission::Off => None,
            Admission::Auto => Some(std::thread::available_parallelism().map_or(1, |n| n.get())),
            Admission::Limit(n) => Some(n.max(1)),
        }
    }

    /// The number of slots of a database whose commits follow `log`, or `None` when off:
    /// [`Auto`](Admission::Auto) adds a slot for [`LogMode::Sync`](crate::LogMode::Sync)
    /// (see [`Admission`]).
    ///
    /// ```
    /// use shoal::{Admission, LogMode};
    /// let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    /// assert_eq!(Admission::Auto.slots_for(LogMode::Async), Some(cores));
    /// assert_eq!(Admission::Auto.slots_for(LogMode::Sync), Some(cores + 1));
    /// assert_eq!(Admission::Limit(2).slots_for(LogMode::Sync), Some(2));
    /// ```
    pub fn slots_for(self, log: crate::LogMode) -> Option<usize> {
        let spare = usize::from(self == Admission::Auto && log == crate::LogMode::Sync);
        self.slots().map(|n| n + spare)
    }
}

/// A snapshot of a database's admission gate ([`Database::admission_stats`]).
///
/// [`Database::admission_stats`]: crate::Database::admission_stats
///
/// ```
/// let db = shoal::Database::in_memory();
/// let s = db.admission_stats().unwrap();
/// assert_eq!((s.running, s.waiting, s.handovers), (0, 0, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Slots: the most transactions that run at once.
    pub limit: usize,
    /// Slots held by a running transaction.
    pub running: usize,
    /// Slots kept by a thread between two of its transactions.
    pub kept: usize,
    /// Threads waiting for a slot.
    pub waiting: usize,
    /// Of those, threads resuming a transaction after a lock or log wait.
    pub resuming: usize,
    /// Slots handed to a waiting thread so far.
    pub handovers: u64,
    /// Of those, kept slots the watchdog took from a thread that stayed away.
    pub reclaimed: u64,
    /// Threads that waited the escape time (1 s, with no slot changing hands) for a slot and
    /// ran without one.
    pub escaped: u64,
}

pub(crate) fn stats(g: &Gate) -> AdmissionStats {
    let s = g.stats();
    AdmissionStats {
        limit: g.limit(),
        running: s.busy,
        kept: s.idle,
        waiting: s.waiting,
        resuming: s.resuming,
        handovers: s.handovers,
        reclaimed: s.reclaimed,
        escaped: s.escaped,
    }
}

/// A new gate for `a` with quantum `quantum` in a database whose commits follow `log`, or
/// `None` when off.
pub(crate) fn gate(a: Admission, log: crate::LogMode, quantum: Duration) -> Option<Arc<Gate>> {
    a.slots_for(log)
        .map(|n| Arc::new(Gate::new(n, Some(ESCAPE)).with_quantum(quantum)))
}

const NO_SLOT: usize = usize::MAX;

/// What a thread holds.
struct Local {
    /// This thread's token in slot words (never 0).
    token: u32,
    /// Transactions open on this thread that were admitted (any database).
    depth: u32,
    /// The gate of `slot` (kept after the slot goes, to avoid re-cloning it).
    gate: Option<Arc<Gate>>,
    /// The slot held or kept, or `NO_SLOT`.
    slot: usize,
    /// The slot's word while kept between transactions; 0 while running in it.
    kept: u64,
    /// When the slot was taken (the quantum runs from here).
    since: Instant,
    /// Counts keeps (tells one kept period from the next).
    seq: u32,
    /// The slot was given up for a wait inside the engine and is to be taken back.
    suspended: bool,
}

static NEXT_TOKEN: AtomicU32 = AtomicU32::new(1);

impl Local {
    fn new() -> Local {
        let mut token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        if token == 0 {
            // Wrapped after 2^32 threads: 0 means "nobody". A token shared by two threads
            // only lets one take the other's kept slot, which anyone may do anyway.
            token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        }
        Local {
            token,
            depth: 0,
            gate: None,
            slot: NO_SLOT,
            kept: 0,
            since: Instant::now(),
            seq: 0,
            suspended: false,
        }
    }

    /// Gives up a slot kept between transactions.
    fn drop_kept(&mut self) {
        if self.slot != NO_SLOT && self.kept != 0 {
            if let Some(g) = &self.gate {
                g.release_kept(self.slot, self.kept, self.token);
            }
            self.slot = NO_SLOT;
            self.kept = 0;
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // The thread exits: what it kept (or, after a leaked transaction, held) goes.
        if self.slot != NO_SLOT {
            if let Some(g) = &self.gate {
                if self.kept != 0 {
                    g.release_kept(self.slot, self.kept, self.token);
                } else if !self.suspended {
                    g.release(self.slot);
                }
            }
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local::new());
}

/// Admits a transaction on this thread through `gate`: takes back the slot it kept, or takes
/// a slot (waiting in the queue), or, with a transaction already open on this thread, runs
/// in the slot it holds. Returns whether [`end`] must be called when the transaction ends.
pub(crate) fn begin(gate: &Arc<Gate>) -> bool {
    LOCAL
        .try_with(|l| {
            let mut l = l.borrow_mut();
            if l.depth > 0 {
                // Nested: shares the thread's slot (or runs without one); never waits.
                l.depth += 1;
                return true;
            }
            let same = l.gate.as_ref().is_some_and(|g| Arc::ptr_eq(g, gate));
            if !same {
                l.drop_kept();
                l.gate = Some(Arc::clone(gate));
            }
            if l.slot != NO_SLOT {
                let (waiting, _) = gate.waiting();
                let (slot, kept, token) = (l.slot, l.kept, l.token);
                if waiting > 0 && l.since.elapsed() >= gate.quantum() {
                    // Its quantum is over and others wait: to the back of the queue.
                    gate.release_kept(slot, kept, token);
                } else if gate.reclaim(slot, kept, token) {
                    l.kept = 0;
                    l.depth = 1;
                    return true;
                }
                l.slot = NO_SLOT;
                l.kept = 0;
            }
            let token = l.token;
            // `None`: waited too long, runs without a slot (see `ESCAPE`).
            let slot = gate
                .acquire(token, false, || watch(gate))
                .unwrap_or(NO_SLOT);
            l.slot = slot;
            l.kept = 0;
            l.since = Instant::now();
            l.depth = 1;
            true
        })
        // During thread teardown: run without a slot.
        .unwrap_or(false)
}

/// Ends a transaction [`begin`] admitted (committed or not): the thread keeps its slot for
/// its next transaction (or its retry), unless its quantum is over and others wait, or
/// resumers wait.
pub(crate) fn end() {
    let _ = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        let l = &mut *l;
        l.depth = l.depth.saturating_sub(1);
        if l.depth > 0 || l.slot == NO_SLOT || l.kept != 0 {
            return;
        }
        // Borrowed, not cloned: a reference count written by every thread per transaction
        // would be the shared hot line this gate exists to avoid.
        let Some(g) = l.gate.as_ref() else { return };
        let (waiting, resuming) = g.waiting();
        let hand_over = resuming > 0 || (waiting > 0 && l.since.elapsed() >= g.quantum());
        if hand_over {
            g.release(l.slot);
            l.slot = NO_SLOT;
        } else {
            l.seq = l.seq.wrapping_add(1);
            l.kept = g.keep(l.slot, l.token, l.seq);
        }
    });
}

/// The gate whose slot this thread runs in now, if any: its transaction's own database's,
/// or, for a transaction nested in one of another database, that database's (the slot is
/// the thread's, whatever database its transactions belong to). `None` when it runs
/// without one (escaped, nested in an ungated transaction, or its slot given up for a
/// wait) or only keeps one between transactions.
pub(crate) fn running_gate() -> Option<Arc<Gate>> {
    LOCAL
        .try_with(|l| {
            let l = l.borrow();
            let running = l.slot != NO_SLOT && l.kept == 0 && !l.suspended;
            running.then(|| l.gate.clone()).flatten()
        })
        .ok()
        .flatten()
}

/// Runs `f`, a wait inside the engine (for a lock, the log, a phase change), without holding
/// a slot: a running transaction gives its slot up for the wait and takes one back after it
/// (ahead of threads that begin transactions); a slot kept between transactions is given up.
pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    let held = LOCAL
        .try_with(|l| {
            let mut l = l.borrow_mut();
            if l.slot == NO_SLOT || l.suspended {
                return None;
            }
            if l.kept != 0 {
                l.drop_kept();
                return None;
            }
            let g = l.gate.clone()?;
            g.release(l.slot);
            l.slot = NO_SLOT;
            l.suspended = true;
            Some(g)
        })
        .ok()
        .flatten();
    let r = f();
    if let Some(g) = held {
        let _ = LOCAL.try_with(|l| {
            let token = l.borrow().token;
            let slot = g.acquire(token, true, || watch(&g)).unwrap_or(NO_SLOT);
            let mut l = l.borrow_mut();
            l.slot = slot;
            l.kept = 0;
            l.since = Instant::now();
            l.suspended = false;
        });
    }
    r
}

/// The watchdog: gates with waiting threads, each with the slot words it saw last round.
struct Watchdog {
    gates: parking_lot::Mutex<Vec<(Weak<Gate>, Vec<u64>)>>,
    cv: parking_lot::Condvar,
}

static WATCHDOG: std::sync::OnceLock<Option<Arc<Watchdog>>> = std::sync::OnceLock::new();

/// Makes sure the watchdog looks at `gate` while threads wait on it.
fn watch(gate: &Arc<Gate>) {
    let Some(w) = WATCHDOG.get_or_init(spawn_watchdog) else {
        return;
    };
    let mut gates = w.gates.lock();
    if gates
        .iter()
        .any(|(g, _)| std::ptr::eq(g.as_ptr(), Arc::as_ptr(gate)))
    {
        return;
    }
    gates.push((Arc::downgrade(gate), vec![gate::FREE; gate.limit()]));
    w.cv.notify_one();
}

fn spawn_watchdog() -> Option<Arc<Watchdog>> {
    let w = Arc::new(Watchdog {
        gates: parking_lot::Mutex::new(Vec::new()),
        cv: parking_lot::Condvar::new(),
    });
    let me = Arc::clone(&w);
    std::thread::Builder::new()
        .name("shoal-admission".into())
        .spawn(move || {
            let mut tick = WATCHDOG_TICK;
            loop {
                {
                    let mut g = me.gates.lock();
                    if g.is_empty() {
                        // Watching starts again at the short tick.
                        tick = WATCHDOG_TICK;
                    }
                    while g.is_empty() {
                        me.cv.wait(&mut g);
                    }
                }
                std::thread::sleep(tick);
                let mut took = 0;
                let mut gates = me.gates.lock();
                gates.retain_mut(|(weak, seen)| {
                    let Some(g) = weak.upgrade() else {
                        return false;
                    };
                    took += g.police(seen);
                    // Keep watching while threads wait. A thread that queues later calls
                    // `watch` after counting itself, so dropping the gate here loses nothing.
                    g.waiting().0 > 0
                });
                tick = next_tick(tick, took);
            }
        })
        // Without the thread, kept slots are still given up when their threads come back
        // or exit; only threads that stay away longer keep others waiting.
        .ok()
        .map(|_| w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    /// Polls until `f` holds (the tests wait for states, never for times).
    fn until(f: impl Fn() -> bool) {
        while !f() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_commit_waiter_is_reused_only_once_nothing_else_holds_it() {
        let mut w = Waiter::new(std::thread::current(), 7);
        w.grant(3);
        w.commit.store(2, Ordering::Relaxed);
        let queued = Arc::clone(&w);
        assert!(!Waiter::reset_unshared(&mut w, 7), "still held by a queue");
        assert_eq!(w.granted(), Some(3), "left alone while shared");
        drop(queued);
        assert!(!Waiter::reset_unshared(&mut w, 8), "another thread's token");
        assert!(Waiter::reset_unshared(&mut w, 7));
        assert_eq!(w.granted(), None);
        assert_eq!(w.commit.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn lock_waiters_keep_slots_only_while_one_slot_stays_with_a_runner() {
        let one = Gate::new(1, None);
        assert!(!one.wait_in_slot(), "one slot: a waiter always gives it up");
        let g = Gate::new(3, None);
        assert!(g.wait_in_slot());
        assert!(g.wait_in_slot());
        assert!(!g.wait_in_slot(), "the third slot stays with a runner");
        g.end_wait_in_slot();
        assert!(g.wait_in_slot());
    }

    #[test]
    fn waiters_get_slots_in_fifo_order_and_resumers_first() {
        let g = Arc::new(Gate::new(1, None));
        let held = g.acquire(100, false, || {}).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut hs = Vec::new();
        // Beginners 1..=3 queue in this order, then resumer 4 arrives last.
        for t in 1..=4u32 {
            let (gt, order) = (Arc::clone(&g), Arc::clone(&order));
            hs.push(std::thread::spawn(move || {
                let i = gt.acquire(t, t == 4, || {}).unwrap();
                order.lock().unwrap().push(t);
                gt.release(i);
            }));
            until(|| g.waiting().0 == t);
        }
        assert_eq!(g.waiting(), (4, 1));
        g.release(held);
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![4, 1, 2, 3]);
        let s = g.stats();
        assert_eq!((s.busy, s.idle, s.waiting, s.handovers), (0, 0, 0, 4));
    }

    #[test]
    fn resumers_overtake_a_waiting_beginner_a_bounded_number_of_times() {
        let g = Arc::new(Gate::new(1, None));
        let held = g.acquire(100, false, || {}).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let n = gate::MAX_OVERTAKE + 2;
        let mut hs = Vec::new();
        // Token 1 begins; tokens 2.. resume, all queued in that order.
        for t in 1..=n + 1 {
            let (gt, order) = (Arc::clone(&g), Arc::clone(&order));
            hs.push(std::thread::spawn(move || {
                let i = gt.acquire(t, t > 1, || {}).unwrap();
                order.lock().unwrap().push(t);
                gt.release(i);
            }));
            until(|| g.waiting().0 == t);
        }
        g.release(held);
        for h in hs {
            h.join().unwrap();
        }
        let order = order.lock().unwrap().clone();
        let at = order.iter().position(|&t| t == 1).unwrap();
        assert_eq!(at, gate::MAX_OVERTAKE as usize, "{order:?}");
    }

    #[test]
    fn kept_slot_goes_to_anyone_when_nobody_waits_and_back_to_its_owner() {
        let g = Gate::new(1, None);
        let i = g.acquire(1, false, || {}).unwrap();
        let kept = g.keep(i, 1, 7);
        assert!(g.reclaim(i, kept, 1));
        let kept = g.keep(i, 1, 8);
        // Another thread takes it (nobody waits); the owner's reclaim then fails.
        assert_eq!(g.acquire(2, false, || {}).unwrap(), i);
        assert!(!g.reclaim(i, kept, 1));
        g.release(i);
        assert_eq!(g.stats().busy, 0);
    }

    #[test]
    fn watchdog_round_hands_a_slot_kept_by_an_absent_thread_to_the_waiter() {
        let g = Arc::new(Gate::new(1, None));
        let i = g.acquire(1, false, || {}).unwrap();
        let waiter = {
            let g = Arc::clone(&g);
            std::thread::spawn(move || {
                let j = g.acquire(2, false, || {}).unwrap();
                g.release(j);
                j
            })
        };
        until(|| g.waiting().0 == 1);
        // The owner commits while a thread waits and keeps its slot, then stays away.
        g.keep(i, 1, 1);
        let mut seen = vec![FREE_WORD; 1];
        assert_eq!(g.police(&mut seen), 0, "a first sighting is not enough");
        assert_eq!(g.police(&mut seen), 1);
        assert_eq!(waiter.join().unwrap(), i);
        let s = g.stats();
        assert_eq!((s.reclaimed, s.waiting, s.busy), (1, 0, 0));
    }

    #[test]
    fn a_slot_freed_while_a_thread_queues_is_not_lost() {
        for _ in 0..200 {
            let g = Arc::new(Gate::new(2, None));
            let a = g.acquire(1, false, || {}).unwrap();
            let b = g.acquire(2, false, || {}).unwrap();
            let (g2, g3) = (Arc::clone(&g), Arc::clone(&g));
            let w = std::thread::spawn(move || {
                let j = g2.acquire(3, false, || {}).unwrap();
                g2.release(j);
            });
            let r = std::thread::spawn(move || {
                g3.release(a);
                g3.release(b);
            });
            r.join().unwrap();
            w.join().unwrap();
            assert_eq!(g.stats().busy, 0);
        }
    }

    #[test]
    fn a_waiter_behind_a_moving_queue_does_not_escape_but_one_behind_a_stuck_gate_does() {
        // One slot, an escape time of 60 ms, and eight threads queued ahead that hold the
        // slot 25 ms each: the last one waits about 200 ms, but slots change hands all the
        // while, so its turn comes and it must not run without a slot.
        let g = Arc::new(Gate::new(1, Some(Duration::from_millis(60))));
        let held = g.acquire(100, false, || {}).unwrap();
        let escaped_ahead = Arc::new(AtomicUsize::new(0));
        let mut hs = Vec::new();
        for t in 1..=8u32 {
            let (g2, esc) = (Arc::clone(&g), Arc::clone(&escaped_ahead));
            hs.push(std::thread::spawn(move || {
                match g2.acquire(t, false, || {}) {
                    Some(i) => {
                        std::thread::sleep(Duration::from_millis(25));
                        g2.release(i);
                    }
                    None => {
                        esc.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
            until(|| g.waiting().0 == t);
        }
        let last = {
            let g2 = Arc::clone(&g);
            std::thread::spawn(move || {
                let start = Instant::now();
                let got = g2.acquire(9, false, || {});
                if let Some(i) = got {
                    g2.release(i);
                }
                (got.is_some(), start.elapsed())
            })
        };
        until(|| g.waiting().0 == 9);
        g.release(held);
        for h in hs {
            h.join().unwrap();
        }
        let (served, waited) = last.join().unwrap();
        assert!(served, "escaped after {waited:?} while the queue moved");
        assert!(waited >= Duration::from_millis(60), "{waited:?}: no test");
        assert_eq!(
            (escaped_ahead.load(Ordering::SeqCst), g.stats().escaped),
            (0, 0)
        );
        // A gate whose only slot stays with one thread: the waiter escapes after about
        // the escape time.
        let stuck = g.acquire(100, false, || {}).unwrap();
        let start = Instant::now();
        assert_eq!(g.acquire(10, false, || {}), None);
        assert!(start.elapsed() >= Duration::from_millis(60));
        assert_eq!(g.stats().escaped, 1);
        g.release(stuck);
    }

    #[test]
    fn the_watchdog_tick_grows_while_rounds_take_nothing_and_resets_when_one_does() {
        let mut t = WATCHDOG_TICK;
        let mut ticks = Vec::new();
        for _ in 0..4 {
            t = next_tick(t, 0);
            ticks.push(t.as_millis());
        }
        assert_eq!(ticks, [2, 4, 4, 4]);
        assert_eq!(next_tick(t, 1), WATCHDOG_TICK);
    }

    const FREE_WORD: u64 = gate::FREE;

    #[test]
    fn thread_local_layer_counts_nesting_and_keeps_the_slot_after_commit() {
        let g = Arc::new(Gate::new(1, None));
        let t = std::thread::spawn({
            let g = Arc::clone(&g);
            move || {
                assert!(begin(&g));
                assert!(begin(&g), "nested begin shares the slot");
                assert_eq!(g.stats().busy, 1);
                end();
                assert_eq!(g.stats().busy, 1, "the outer transaction still runs");
                end();
                assert_eq!((g.stats().busy, g.stats().idle), (0, 1));
                // A wait gives the kept slot up.
                blocking(|| ());
                assert_eq!(g.stats().idle, 0);
                assert!(begin(&g));
                let inside = blocking(|| g.stats().busy);
                assert_eq!(inside, 0, "no slot during a wait");
                assert_eq!(g.stats().busy, 1, "taken back after it");
                end();
                assert_eq!(
                    (g.stats().busy, g.stats().idle),
                    (0, 1),
                    "an abort keeps it for the retry"
                );
                assert!(begin(&g));
                end();
            }
        });
        t.join().unwrap();
        // The thread kept its slot and exited: gone with it.
        assert_eq!(g.stats().idle + g.stats().busy, 0);
    }

    #[test]
    fn running_sections_never_exceed_the_limit() {
        let g = Arc::new(Gate::new(2, None));
        let inside = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let (g, inside, max) = (Arc::clone(&g), Arc::clone(&inside), Arc::clone(&max));
                std::thread::spawn(move || {
                    for n in 0..300 {
                        assert!(begin(&g));
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max.fetch_max(now, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        if n % 7 == 0 {
                            blocking(std::thread::yield_now);
                        }
                        end();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(max.load(Ordering::SeqCst) <= 2);
        let s = g.stats();
        assert_eq!((s.busy, s.idle, s.waiting), (0, 0, 0));
    }
}
