//! The simple lock table of the engine-core issue: a sharded hash table from [`LockId`] to a
//! FIFO request queue, one mutex per shard.
//!
//! * **Sharding.** [`SHARD_COUNT`] shards, each a cache-padded `parking_lot::Mutex` around an
//!   `FxHashMap<LockId, Queue>`; the shard is picked by a (re-mixed) Fx hash of the lock id,
//!   within a window of the shards that depends on the table for key locks (see `shard`).
//!   An uncontended acquire or release is one shard mutex plus one hash lookup; creating a queue
//!   clones the `LockId`. The first [`INLINE_REQUESTS`] requests of a queue live in the hash
//!   table's entry itself, so an uncontended lock allocates nothing more and reads no other
//!   memory. A queue is removed as soon as it holds no request, so memory stays bounded by the
//!   live requests.
//! * **Queues and grants.** Requests are kept in arrival order, each with a granted mode (`N`
//!   while a new request waits) and a requested mode. Grants follow Kimura et al. 2012 §4.2:
//!   a *new* request is granted iff its mode is compatible with every other request's granted
//!   mode and with the requested mode of every still-waiting request ahead of it (FIFO); a
//!   *conversion* (the transaction already holds the lock; the target is the supremum of held
//!   and asked) is granted iff compatible with every other request's granted mode. A waiting
//!   conversion keeps its place, so later new requests treat its requested mode as blocking.
//! * **Waiting.** A blocked caller stores its thread handle in its request, checks for a
//!   deadlock, spins for up to [`SPIN_BEFORE_PARK`] re-checking its grant, and then parks with
//!   `std::thread::park_timeout`, rechecking its `waiting` flag under the shard mutex after
//!   every wake-up (spurious wake-ups are harmless; the park token rules out lost ones). Every
//!   queue change that may grant (release, withdrawal) runs a grant pass and unparks the
//!   newly granted waiters after the shard mutex is released.
//! * **Deadlocks.** With [`DeadlockPolicy::WaitForGraph`] the table keeps a global waits-for
//!   graph (`txn -> txns it waits for`), touched only when a queue has waiters. The edges of a
//!   queue's waiters are rewritten (under that queue's shard mutex) after every change of the
//!   queue, so the graph is exact and stale edges cause no false deadlocks. A blocked request
//!   searches the graph (DFS) for a path back to itself when it starts waiting and again every
//!   [`DEADLOCK_RECHECK`]; on a cycle it withdraws at once and fails with
//!   [`LockFailure::Deadlock`]. Search and withdrawal happen under one graph-mutex hold, so a
//!   cycle yields exactly one victim. With [`DeadlockPolicy::Timeout`] a request simply waits
//!   until its timeout. No-wait, wait-die, wound-wait and Dreadlocks are decided by the code
//!   every lock table shares ([`Deadlocks`]); this table reads the blockers off the queue under
//!   the shard mutex and naps with the mutex released. Every way, a timed-out request
//!   withdraws (a conversion falls back to its granted mode) and fails with
//!   [`LockFailure::Timeout`].
//!
//! Mutex order: shard mutex, then the graph mutex; no code path takes a shard mutex while
//! holding the graph mutex or a second shard mutex.
//!
//! The scalable latch-free lock table of Jung et al. 2013
//! ([`LatchFreeLockTable`](super::latchfree::LatchFreeLockTable)) implements the same
//! [`LockTable`] trait and the same deadlock policies.
//!
//! Precondition: a transaction issues at most one lock call at a time (one thread per
//! transaction); a transaction never has more than one request per lock.
//!
//! After a failed `lock` (deadlock victim or timeout) the transaction keeps every lock it held
//! before, including its old mode on the lock it tried to convert; the caller aborts it and
//! `unlock`s each of them. `unlock` releases the whole request (there is no downgrade).

use std::hash::BuildHasher;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};
use smallvec::SmallVec;

use super::deadlock::{Blocker, Deadlocks, Decision};
use super::dread::{age_of, pipeline_len};
use super::{DeadlockPolicy, LockFailure, LockId, LockMode, LockTable, TxnId, Victim};

const SHARD_BITS: u32 = 9;

/// Number of shards of a [`SimpleLockTable`] (a power of two).
pub const SHARD_COUNT: usize = 1 << SHARD_BITS;

/// A table's keys use `1 / 2^WINDOW_SHIFT` of the shards (a window of 64 of the 512).
const WINDOW_SHIFT: u32 = 3;

/// How often a blocked request re-runs the deadlock search under
/// [`DeadlockPolicy::WaitForGraph`].
pub const DEADLOCK_RECHECK: Duration = Duration::from_millis(10);

/// How long a blocked request of the waits-for-graph and timeout policies keeps running,
/// re-checking its grant, before it parks (it parks at once after that, until granted).
pub const SPIN_BEFORE_PARK: Duration = Duration::from_micros(20);

/// Spin-loop hints between two checks of the grant while spinning.
const SPIN_STEP: u32 = 64;

/// Requests a queue holds without a heap allocation.
pub const INLINE_REQUESTS: usize = 2;

/// One transaction's request on one lock.
struct Request {
    txn: TxnId,
    /// Mode held (`N` while a new request waits).
    granted: LockMode,
    /// Mode asked for; equals `granted` unless waiting.
    requested: LockMode,
    waiting: bool,
    /// The waits-for graph holds an entry for `txn` written by this request.
    in_graph: bool,
    /// The waiting thread, unparked when the request is granted.
    thread: Option<Thread>,
    /// The transaction's age, the timestamp of wait-die and wound-wait (see `dread::set_age`).
    age: TxnId,
    /// The requesting thread's flush-pipeline length when it asked (victim policies).
    pipe: u32,
}

impl Request {
    fn granted(txn: TxnId, mode: LockMode) -> Self {
        Request {
            txn,
            granted: mode,
            requested: mode,
            waiting: false,
            in_graph: false,
            thread: None,
            age: age_of(txn),
            pipe: pipeline_len().min(u32::MAX as u64) as u32,
        }
    }
}

/// The requests on one lock, in arrival order.
struct Queue {
    reqs: SmallVec<[Request; INLINE_REQUESTS]>,
    /// Number of requests with `waiting` set.
    waiting: u32,
    /// Highest commit LSN of an early-released exclusive lock (safe SX-ELR, Kimura §5.3).
    tag: u64,
}

/// Threads to unpark once the shard mutex is released.
#[derive(Default)]
struct Wakeups {
    first: Option<Thread>,
    rest: Vec<Thread>,
}

impl Wakeups {
    fn push(&mut self, t: Thread) {
        if self.first.is_none() {
            self.first = Some(t);
        } else {
            self.rest.push(t);
        }
    }

    fn unpark_all(self) {
        if let Some(t) = self.first {
            t.unpark();
        }
        for t in self.rest {
            t.unpark();
        }
    }
}

impl Queue {
    fn position(&self, txn: TxnId) -> Option<usize> {
        self.reqs.iter().position(|r| r.txn == txn)
    }

    /// Mask of the granted modes of all requests but `skip`.
    fn granted_mask_except(&self, skip: usize) -> u16 {
        self.reqs
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != skip)
            .fold(0, |m, (_, r)| m | r.granted.bit())
    }

    /// Mask of the modes blocking a new request appended at the tail: every granted mode and
    /// every waiting request's requested mode.
    fn tail_blocking_mask(&self) -> u16 {
        self.reqs.iter().fold(0, |m, r| {
            m | r.granted.bit() | if r.waiting { r.requested.bit() } else { 0 }
        })
    }

    /// The transactions blocking the waiting request at `i`.
    fn blockers(&self, i: usize) -> impl Iterator<Item = TxnId> + '_ {
        let me = &self.reqs[i];
        let (m, new) = (me.requested, me.granted == LockMode::N);
        self.reqs.iter().enumerate().filter_map(move |(j, o)| {
            let blocks = j != i
                && (!o.granted.compatible(m)
                    || (new && j < i && o.waiting && !o.requested.compatible(m)));
            blocks.then_some(o.txn)
        })
    }

    /// Grants every waiting request that can be granted now, in queue order; collects the
    /// threads to wake.
    fn grant_pass(&mut self, wake: &mut Wakeups) {
        if self.waiting == 0 {
            return;
        }
        let mut counts = [0u32; LockMode::ALL.len()];
        for r in &self.reqs {
            counts[r.granted as usize] += 1;
        }
        // Requested modes of the waiting requests seen so far.
        let mut ahead_waiting = 0u16;
        for r in &mut self.reqs {
            if !r.waiting {
                continue;
            }
            counts[r.granted as usize] -= 1; // "every other request"
            let mut block =
                counts
                    .iter()
                    .enumerate()
                    .fold(0u16, |m, (i, &c)| if c > 0 { m | 1 << i } else { m });
            if r.granted == LockMode::N {
                block |= ahead_waiting;
            }
            if r.requested.compatible_with_all(block) {
                r.granted = r.requested;
                r.waiting = false;
                self.waiting -= 1;
                if let Some(t) = r.thread.take() {
                    wake.push(t);
                }
            } else {
                ahead_waiting |= r.requested.bit();
            }
            counts[r.granted as usize] += 1;
        }
    }

    /// Rewrites the waits-for edges of this queue's requests: waiting requests get their
    /// current blockers, requests that stopped waiting lose their entry.
    fn sync_graph(&mut self, graph: &mut Graph) {
        for i in 0..self.reqs.len() {
            let txn = self.reqs[i].txn;
            if self.reqs[i].waiting {
                let edges = graph.entry(txn).or_default();
                edges.clear();
                edges.extend(self.blockers(i));
                self.reqs[i].in_graph = true;
            } else if self.reqs[i].in_graph {
                graph.remove(&txn);
                self.reqs[i].in_graph = false;
            }
        }
    }
}

/// Waits-for graph: a waiting transaction -> the transactions it waits for.
type Graph = FxHashMap<TxnId, Vec<TxnId>>;

/// If `txn` waits (transitively) for itself, the transaction it waits for directly on such a
/// cycle.
fn find_cycle(graph: &Graph, txn: TxnId) -> Option<TxnId> {
    let first = graph.get(&txn)?;
    let mut visited = FxHashSet::default();
    let mut stack = Vec::new();
    for &b in first {
        stack.clear();
        stack.push(b);
        while let Some(n) = stack.pop() {
            if n == txn {
                return Some(b);
            }
            if visited.insert(n) {
                if let Some(next) = graph.get(&n) {
                    stack.extend_from_slice(next);
                }
            }
        }
    }
    None
}

/// One shard: the queues of the locks hashed to it.
#[derive(Default)]
struct Shard {
    map: FxHashMap<LockId, Queue>,
    /// Highest tag of a queue removed from this shard: a tag must outlive its queue, so
    /// every lock of the shard reports at least this much afterwards (conservative).
    retired_tag: u64,
}

impl Shard {
    fn remove_queue(&mut self, id: &LockId) {
        if let Some(q) = self.map.remove(id) {
            self.retired_tag = self.retired_tag.max(q.tag);
        }
    }
}

/// Sharded lock table with a FIFO queue per lock (see the [module docs](self)).
pub struct SimpleLockTable {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    shard_bits: u32,
    /// No-wait, wait-die, wound-wait and Dreadlocks (the waits-for graph is this table's).
    deadlocks: Deadlocks,
    policy: DeadlockPolicy,
    graph: Mutex<Graph>,
}

impl std::fmt::Debug for SimpleLockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimpleLockTable")
            .field("policy", &self.policy)
            .field("queues", &self.queue_count())
            .finish()
    }
}

impl SimpleLockTable {
    /// A new empty table with [`SHARD_COUNT`] shards and the given deadlock handling.
    pub fn new(policy: DeadlockPolicy) -> Self {
        Self::with_shards(policy, SHARD_COUNT)
    }

    /// A table with `shards` shards (rounded up to a power of two). One shard is the
    /// traditional lock manager of Jung et al. 2013 Fig. 3 (left): a single latch over the
    /// whole hash table, held while a request is created, checked and queued and while a
    /// release grants waiters — the baseline the scalable designs are measured against.
    ///
    /// ```
    /// use shoal::lock::simple::SimpleLockTable;
    /// use shoal::lock::{DeadlockPolicy, LockId, LockMode, LockTable};
    /// let latched = SimpleLockTable::with_shards(DeadlockPolicy::WaitForGraph, 1);
    /// let k = LockId::Table(1);
    /// latched.lock(1, &k, LockMode::IX, std::time::Duration::from_secs(1)).unwrap();
    /// latched.unlock(1, &k);
    /// ```
    pub fn with_shards(policy: DeadlockPolicy, shards: usize) -> Self {
        let n = shards.max(1).next_power_of_two();
        SimpleLockTable {
            shards: (0..n)
                .map(|_| CachePadded::new(Mutex::new(Shard::default())))
                .collect(),
            shard_bits: n.trailing_zeros(),
            deadlocks: Deadlocks::new(policy, Victim::KillYoung),
            policy,
            graph: Mutex::new(Graph::default()),
        }
    }

    /// Sets the victim policy Dreadlocks uses (default kill-young).
    ///
    /// ```
    /// use shoal::lock::simple::SimpleLockTable;
    /// use shoal::lock::{DeadlockPolicy, Victim, WaitStyle};
    /// let t = SimpleLockTable::new(DeadlockPolicy::Dreadlocks(WaitStyle::Spin))
    ///     .with_victim(Victim::KillShort);
    /// assert_eq!(t.victim(), Victim::KillShort);
    /// ```
    pub fn with_victim(mut self, victim: Victim) -> Self {
        self.deadlocks = Deadlocks::new(self.policy, victim);
        self
    }

    /// The victim policy.
    pub fn victim(&self) -> Victim {
        self.deadlocks.victim()
    }

    /// The deadlock policy the table was created with.
    pub fn policy(&self) -> DeadlockPolicy {
        self.policy
    }

    /// Number of lock queues currently in the table (0 once every lock is released and no
    /// request waits).
    pub fn queue_count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// Number of requests currently waiting on `id` (diagnostics and tests).
    pub fn waiters(&self, id: &LockId) -> usize {
        self.shard(id)
            .lock()
            .map
            .get(id)
            .map_or(0, |q| q.waiting as usize)
    }

    /// The mode `txn` currently holds on `id` (`N` if none).
    pub fn held_mode(&self, txn: TxnId, id: &LockId) -> LockMode {
        let shard = self.shard(id).lock();
        shard
            .map
            .get(id)
            .and_then(|q| q.reqs.iter().find(|r| r.txn == txn))
            .map_or(LockMode::N, |r| r.granted)
    }

    fn shard(&self, id: &LockId) -> &Mutex<Shard> {
        if self.shard_bits == 0 {
            return &self.shards[0];
        }
        let h = FxBuildHasher.hash_one(id);
        // Re-mix so the shard bits are independent of the bits the shard's map uses.
        let mixed = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let i = match id {
            // The keys of one table go to a window of the shards of its own (consecutive
            // table ids get disjoint windows, until they wrap around): threads that work on
            // different tables then touch different shard mutexes and maps, and no cache
            // line of the lock table moves between their cores (the insert benchmark, with a
            // table per thread, spent twice the time per lock at 2 threads as at 1 on the
            // shard mutexes before). Within a table the keys still spread over the window.
            LockId::Key(t, _) | LockId::NegInf(t) if self.shard_bits > WINDOW_SHIFT => {
                let bits = self.shard_bits - WINDOW_SHIFT;
                let base = (*t as usize) << bits;
                (base + (mixed >> (64 - bits)) as usize) & (self.shards.len() - 1)
            }
            _ => (mixed >> (64 - self.shard_bits)) as usize,
        };
        &self.shards[i]
    }

    fn uses_graph(&self) -> bool {
        self.policy == DeadlockPolicy::WaitForGraph
    }

    /// After a change of `q` that may grant or change who blocks whom: grant pass and, under
    /// the waits-for-graph policy, graph update.
    fn after_change<'a>(
        &'a self,
        q: &mut Queue,
        had_waiters: bool,
        graph: &mut Option<MutexGuard<'a, Graph>>,
        wake: &mut Wakeups,
    ) {
        if !had_waiters && q.waiting == 0 {
            return;
        }
        q.grant_pass(wake);
        if self.uses_graph() {
            q.sync_graph(graph.get_or_insert_with(|| self.graph.lock()));
        }
        if matches!(self.policy, DeadlockPolicy::Dreadlocks(_)) {
            // Backoff at release (Kimura §4.2), see `Deadlocks::lock_changed`.
            for r in &q.reqs {
                self.deadlocks.lock_changed(r.txn, r.waiting);
            }
        }
    }

    /// Withdraws the waiting request at `p` of the queue of `id` (a conversion falls back to
    /// its granted mode), grants what becomes grantable and drops an empty queue.
    fn withdraw<'a>(
        &'a self,
        shard: &mut Shard,
        id: &LockId,
        p: usize,
        graph: &mut Option<MutexGuard<'a, Graph>>,
        wake: &mut Wakeups,
    ) {
        let q = shard.map.get_mut(id).expect("queue of a waiting request");
        let r = &mut q.reqs[p];
        debug_assert!(r.waiting);
        q.waiting -= 1;
        if r.in_graph {
            graph
                .get_or_insert_with(|| self.graph.lock())
                .remove(&r.txn);
        }
        if r.granted == LockMode::N {
            q.reqs.remove(p);
        } else {
            r.requested = r.granted;
            r.waiting = false;
            r.in_graph = false;
            r.thread = None;
        }
        if q.reqs.is_empty() {
            shard.remove_queue(id);
        } else {
            self.after_change(q, true, graph, wake);
        }
    }

    /// `lock` (`timeout = Some`) and `try_lock` (`None`).
    fn acquire(
        &self,
        txn: TxnId,
        id: &LockId,
        mode: LockMode,
        timeout: Option<Duration>,
    ) -> Result<LockMode, LockFailure> {
        let shard_mutex = self.shard(id);
        let mut shard = shard_mutex.lock();
        let sh = &mut *shard;
        let Some(q) = sh.map.get_mut(id) else {
            if mode == LockMode::N {
                return Ok(LockMode::N);
            }
            let mut reqs = SmallVec::new();
            reqs.push(Request::granted(txn, mode));
            sh.map.insert(
                id.clone(),
                Queue {
                    reqs,
                    waiting: 0,
                    tag: 0,
                },
            );
            return Ok(mode);
        };
        match q.position(txn) {
            Some(p) => {
                // Conversion.
                let held = q.reqs[p].granted;
                debug_assert!(
                    !q.reqs[p].waiting,
                    "one lock call per transaction at a time"
                );
                if held.covers(mode) {
                    return Ok(held);
                }
                let target = held.supremum(mode);
                if target.compatible_with_all(q.granted_mask_except(p)) {
                    let r = &mut q.reqs[p];
                    r.granted = target;
                    r.requested = target;
                    if q.waiting > 0 && self.uses_graph() {
                        // The stronger granted mode may block more waiters.
                        q.sync_graph(&mut self.graph.lock());
                    }
                    return Ok(target);
                }
                if timeout.is_none() {
                    return Err(LockFailure::WouldBlock);
                }
                let r = &mut q.reqs[p];
                r.requested = target;
                r.waiting = true;
                r.thread = Some(thread::current());
                q.waiting += 1;
            }
            None => {
                if mode == LockMode::N {
                    return Ok(LockMode::N);
                }
                // A new granted request at the tail is compatible with every waiting request,
                // so it blocks none of them: no graph update needed.
                if mode.compatible_with_all(q.tail_blocking_mask()) {
                    q.reqs.push(Request::granted(txn, mode));
                    return Ok(mode);
                }
                if timeout.is_none() {
                    return Err(LockFailure::WouldBlock);
                }
                q.reqs.push(Request {
                    txn,
                    granted: LockMode::N,
                    requested: mode,
                    waiting: true,
                    in_graph: false,
                    thread: Some(thread::current()),
                    age: age_of(txn),
                    pipe: pipeline_len().min(u32::MAX as u64) as u32,
                });
                q.waiting += 1;
            }
        }
        self.wait(shard, txn, id, timeout.unwrap_or_default())
    }

    /// The blocking path: `txn`'s request on `id` is enqueued as waiting; wait for the grant,
    /// a deadlock, or the timeout.
    fn wait(
        &self,
        mut shard: MutexGuard<'_, Shard>,
        txn: TxnId,
        id: &LockId,
        timeout: Duration,
    ) -> Result<LockMode, LockFailure> {
        if !matches!(
            self.policy,
            DeadlockPolicy::WaitForGraph | DeadlockPolicy::Timeout
        ) {
            return self.wait_prevent_or_dreadlocks(shard, txn, id, timeout);
        }
        let start = Instant::now();
        let mut first = true;
        loop {
            let sh = &mut *shard;
            let Some(p) = sh.map.get_mut(id).and_then(|q| q.position(txn)) else {
                // Our request was removed by a concurrent `unlock` of the same transaction.
                return Err(LockFailure::Deadlock { blocker: None });
            };
            let q = sh.map.get_mut(id).expect("queue exists");
            if !q.reqs[p].waiting {
                return Ok(q.reqs[p].granted);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                let blocker = q.blockers(p).next();
                let (mut graph, mut wake) = (None, Wakeups::default());
                self.withdraw(sh, id, p, &mut graph, &mut wake);
                drop(graph);
                drop(shard);
                wake.unpark_all();
                return Err(LockFailure::Timeout { blocker, waited });
            }
            if self.uses_graph() {
                let mut graph = self.graph.lock();
                if first {
                    // Our enqueue changed the queue: refresh its edges (ours included).
                    q.sync_graph(&mut graph);
                }
                if let Some(b) = find_cycle(&graph, txn) {
                    let (mut graph, mut wake) = (Some(graph), Wakeups::default());
                    self.withdraw(sh, id, p, &mut graph, &mut wake);
                    drop(graph);
                    drop(shard);
                    wake.unpark_all();
                    return Err(LockFailure::Deadlock { blocker: Some(b) });
                }
            }
            if first {
                first = false;
                // Most locks are held for microseconds: wait a little while running before
                // parking. A grant that comes meanwhile costs neither side a system call
                // (the releaser's unpark finds the thread running). Then re-check from the
                // top (timeout, deadlock), and park.
                let until = Instant::now() + SPIN_BEFORE_PARK.min(timeout - waited);
                loop {
                    MutexGuard::unlocked(&mut shard, || {
                        for _ in 0..SPIN_STEP {
                            std::hint::spin_loop();
                        }
                    });
                    let still_waiting = shard
                        .map
                        .get(id)
                        .and_then(|q| q.position(txn).map(|p| q.reqs[p].waiting))
                        .unwrap_or(false);
                    if !still_waiting || Instant::now() >= until {
                        break;
                    }
                }
                continue;
            }
            let mut nap = timeout - waited;
            if self.uses_graph() {
                nap = nap.min(DEADLOCK_RECHECK);
            }
            MutexGuard::unlocked(&mut shard, || thread::park_timeout(nap));
        }
    }
}

impl SimpleLockTable {
    /// The waiting loop of `NoWait`, `WaitDie`, `WoundWait` and `Dreadlocks`: the decisions
    /// are the shared ones of [`Deadlocks`]; this table supplies the blockers (read under the
    /// shard mutex) and the waiting.
    fn wait_prevent_or_dreadlocks(
        &self,
        mut shard: MutexGuard<'_, Shard>,
        txn: TxnId,
        id: &LockId,
        timeout: Duration,
    ) -> Result<LockMode, LockFailure> {
        let start = Instant::now();
        let mut wait = None;
        let mut blockers: Vec<Blocker> = Vec::new();
        let result = loop {
            let sh = &mut *shard;
            let Some(p) = sh.map.get_mut(id).and_then(|q| q.position(txn)) else {
                break Err(LockFailure::Deadlock { blocker: None });
            };
            let q = sh.map.get_mut(id).expect("queue exists");
            if !q.reqs[p].waiting {
                break Ok(q.reqs[p].granted);
            }
            let wait = wait.get_or_insert_with(|| self.deadlocks.wait(txn, q.reqs[p].age));
            blockers.clear();
            {
                let m = q.reqs[p].requested;
                let new = q.reqs[p].granted == LockMode::N;
                blockers.extend(
                    q.reqs
                        .iter()
                        .enumerate()
                        .filter(|&(j, o)| {
                            j != p
                                && (!o.granted.compatible(m)
                                    || (new && j < p && o.waiting && !o.requested.compatible(m)))
                        })
                        .map(|(_, o)| Blocker {
                            txn: o.txn,
                            age: o.age,
                            pipe: o.pipe,
                        }),
                );
            }
            let waited = start.elapsed();
            // Decide: give up (victim), or wait.
            let decision = if waited >= timeout {
                Decision::Fail(LockFailure::Timeout {
                    blocker: blockers.first().map(|b| b.txn),
                    waited,
                })
            } else {
                wait.decide(&blockers)
            };
            match decision {
                Decision::Fail(f) => {
                    let (mut graph, mut wake) = (None, Wakeups::default());
                    self.withdraw(sh, id, p, &mut graph, &mut wake);
                    drop(graph);
                    wait.retire();
                    drop(shard);
                    wake.unpark_all();
                    return Err(f);
                }
                Decision::Wait(nudge) => {
                    for b in nudge {
                        self.deadlocks.nudge(b);
                    }
                }
            }
            // Outside the shard latch: the hybrid style may read /proc.
            MutexGuard::unlocked(&mut shard, || {
                wait.nap(timeout - waited, thread::yield_now, thread::park_timeout)
            });
        };
        drop(shard);
        drop(wait);
        result
    }
}

impl LockTable for SimpleLockTable {
    fn lock(
        &self,
        txn: TxnId,
        id: &LockId,
        mode: LockMode,
        timeout: Duration,
    ) -> Result<LockMode, LockFailure> {
        self.acquire(txn, id, mode, Some(timeout))
    }

    fn try_lock(&self, txn: TxnId, id: &LockId, mode: LockMode) -> Result<LockMode, LockFailure> {
        self.acquire(txn, id, mode, None)
    }

    fn unlock(&self, txn: TxnId, id: &LockId) {
        self.unlock_tagged(txn, id, 0);
    }

    fn tag(&self, id: &LockId) -> u64 {
        let shard = self.shard(id).lock();
        shard
            .map
            .get(id)
            .map_or(0, |q| q.tag)
            .max(shard.retired_tag)
    }

    fn unlock_tagged(&self, txn: TxnId, id: &LockId, tag: u64) {
        let mut shard = self.shard(id).lock();
        let sh = &mut *shard;
        let Some(q) = sh.map.get_mut(id) else {
            return;
        };
        let Some(p) = q.position(txn) else {
            return;
        };
        q.tag = q.tag.max(tag);
        let had_waiters = q.waiting > 0;
        let r = q.reqs.remove(p);
        let (mut graph, mut wake) = (None, Wakeups::default());
        if r.waiting {
            // Misuse (another thread of `txn` is waiting here): let it notice.
            q.waiting -= 1;
            if r.in_graph {
                graph.get_or_insert_with(|| self.graph.lock()).remove(&txn);
            }
            if let Some(t) = r.thread {
                wake.push(t);
            }
        }
        if q.reqs.is_empty() {
            sh.remove_queue(id);
        } else {
            self.after_change(q, had_waiters, &mut graph, &mut wake);
        }
        drop(graph);
        drop(shard);
        wake.unpark_all();
    }

    fn is_free(&self, id: &LockId) -> bool {
        !self.shard(id).lock().map.contains_key(id)
    }

    fn footprint(&self) -> super::LockTableFootprint {
        let mut f = super::LockTableFootprint::default();
        for s in self.shards.iter() {
            let s = s.lock();
            f.heads += s.map.len();
            f.entries += s.map.values().map(|q| q.reqs.len()).sum::<usize>();
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier, Mutex as StdMutex};
    use std::time::{Duration, Instant};

    use super::*;
    use LockMode::*;

    fn shard_index(t: &SimpleLockTable, id: &LockId) -> usize {
        let p: *const Mutex<Shard> = t.shard(id);
        t.shards
            .iter()
            .position(|s| std::ptr::eq(&**s, p))
            .expect("a shard of the table")
    }

    #[test]
    fn keys_of_consecutive_tables_use_disjoint_shards_and_spread_within_their_window() {
        let t = SimpleLockTable::new(DeadlockPolicy::WaitForGraph);
        let windows = 1usize << WINDOW_SHIFT;
        let per = SHARD_COUNT / windows;
        let mut used = vec![std::collections::BTreeSet::new(); windows];
        for (tab, seen) in used.iter_mut().enumerate() {
            for k in 0..4000u32 {
                let key = LockId::Key(tab as crate::lock::TableId, k.to_be_bytes().to_vec().into());
                seen.insert(shard_index(&t, &key));
            }
            seen.insert(shard_index(
                &t,
                &LockId::NegInf(tab as crate::lock::TableId),
            ));
        }
        for (a, sa) in used.iter().enumerate() {
            assert!(
                sa.len() > per / 2,
                "table {a}: {} of {per} shards",
                sa.len()
            );
            assert!(sa.len() <= per);
            for sb in &used[a + 1..] {
                assert!(sa.is_disjoint(sb));
            }
        }
        // The one-shard table has nothing to choose from.
        let one = SimpleLockTable::with_shards(DeadlockPolicy::WaitForGraph, 1);
        assert_eq!(shard_index(&one, &LockId::Key(3, Box::from(&b"k"[..]))), 0);
    }

    const LONG: Duration = Duration::from_secs(10);

    fn key(k: u8) -> LockId {
        LockId::Key(1, vec![k].into_boxed_slice())
    }

    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < LONG, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn table(policy: DeadlockPolicy) -> Arc<SimpleLockTable> {
        Arc::new(SimpleLockTable::new(policy))
    }

    #[test]
    fn uncontended_lock_convert_unlock() {
        let t = table(DeadlockPolicy::WaitForGraph);
        let k = key(1);
        assert_eq!(t.lock(1, &k, SN, LONG), Ok(SN));
        assert_eq!(t.lock(1, &k, NS, LONG), Ok(S));
        assert_eq!(
            t.lock(1, &k, SN, LONG),
            Ok(S),
            "covered request returns the held mode"
        );
        assert_eq!(t.lock(2, &k, NS, LONG), Ok(NS));
        assert_eq!(t.try_lock(3, &k, XN), Err(LockFailure::WouldBlock));
        assert_eq!(t.held_mode(1, &k), S);
        assert_eq!(t.lock(4, &k, N, LONG), Ok(N));
        assert_eq!(t.held_mode(4, &k), N);
        t.unlock(1, &k);
        t.unlock(1, &k); // not held: no-op
        assert!(!t.is_free(&k));
        t.unlock(2, &k);
        assert!(t.is_free(&k));
        assert_eq!(t.lock(5, &key(9), N, LONG), Ok(N));
        assert_eq!(t.queue_count(), 0);
    }

    #[test]
    fn fifo_order_of_x_waiters() {
        let t = table(DeadlockPolicy::WaitForGraph);
        let k = key(1);
        t.lock(100, &k, X, LONG).unwrap();
        let order = Arc::new(StdMutex::new(Vec::new()));
        let mut handles = Vec::new();
        for txn in 1..=5u64 {
            let (t2, k2, order2) = (t.clone(), k.clone(), order.clone());
            handles.push(thread::spawn(move || {
                t2.lock(txn, &k2, X, LONG).unwrap();
                order2.lock().unwrap().push(txn);
                t2.unlock(txn, &k2);
            }));
            wait_until("enqueue", || t.waiters(&k) == txn as usize);
        }
        t.unlock(100, &k);
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4, 5]);
        assert!(t.is_free(&k));
        assert_eq!(t.queue_count(), 0);
    }

    #[test]
    fn waiting_conversion_blocks_later_compatible_request() {
        // Kimura §4.2: A and B hold SN; A converts to XN and waits for B; C's SN request is
        // compatible with every granted mode but must wait behind A's conversion.
        let t = table(DeadlockPolicy::WaitForGraph);
        let k = key(7);
        let (a, b, c) = (1, 2, 3);
        t.lock(a, &k, SN, LONG).unwrap();
        t.lock(b, &k, SN, LONG).unwrap();
        let log = Arc::new(StdMutex::new(Vec::new()));
        let ha = {
            let (t, k, log) = (t.clone(), k.clone(), log.clone());
            thread::spawn(move || {
                assert_eq!(t.lock(a, &k, XN, LONG), Ok(XN));
                log.lock().unwrap().push(a);
                thread::sleep(Duration::from_millis(20));
                log.lock().unwrap().push(a + 100);
                t.unlock(a, &k);
            })
        };
        wait_until("A's conversion waits", || t.waiters(&k) == 1);
        assert_eq!(t.try_lock(c, &k, SN), Err(LockFailure::WouldBlock));
        assert_eq!(t.waiters(&k), 1, "try_lock left nothing behind");
        let hc = {
            let (t, k, log) = (t.clone(), k.clone(), log.clone());
            thread::spawn(move || {
                assert_eq!(t.lock(c, &k, SN, LONG), Ok(SN));
                log.lock().unwrap().push(c);
                t.unlock(c, &k);
            })
        };
        wait_until("C waits", || t.waiters(&k) == 2);
        thread::sleep(Duration::from_millis(20));
        assert!(
            log.lock().unwrap().is_empty(),
            "nobody granted while B holds SN"
        );
        assert_eq!(t.held_mode(c, &k), N);
        t.unlock(b, &k);
        ha.join().unwrap();
        hc.join().unwrap();
        assert_eq!(*log.lock().unwrap(), vec![a, a + 100, c]);
        assert!(t.is_free(&k));
    }

    #[test]
    fn conversion_granted_ahead_of_waiting_new_request() {
        // A holds IS; B waits for X; A converts IS -> IX: compatible with every other granted
        // mode, so it is granted although B waits.
        let t = table(DeadlockPolicy::WaitForGraph);
        let tab = LockId::Table(3);
        t.lock(1, &tab, IS, LONG).unwrap();
        let hb = {
            let (t, tab) = (t.clone(), tab.clone());
            thread::spawn(move || {
                assert_eq!(t.lock(2, &tab, X, LONG), Ok(X));
                t.unlock(2, &tab);
            })
        };
        wait_until("B waits", || t.waiters(&tab) == 1);
        assert_eq!(t.try_lock(1, &tab, IX), Ok(IX));
        assert_eq!(
            t.try_lock(3, &tab, IS),
            Err(LockFailure::WouldBlock),
            "FIFO behind B"
        );
        t.unlock(1, &tab);
        hb.join().unwrap();
        assert!(t.is_free(&tab));
    }

    #[test]
    fn timeout_withdraws_request_and_leaves_queue_clean() {
        for policy in [DeadlockPolicy::Timeout, DeadlockPolicy::WaitForGraph] {
            let t = table(policy);
            let k = key(1);
            t.lock(1, &k, X, LONG).unwrap();
            let to = Duration::from_millis(40);
            let start = Instant::now();
            match t.lock(2, &k, S, to) {
                Err(LockFailure::Timeout { blocker, waited }) => {
                    assert_eq!(blocker, Some(1));
                    assert!(waited >= to && start.elapsed() >= to);
                }
                other => panic!("expected timeout, got {other:?}"),
            }
            assert_eq!(t.waiters(&k), 0);
            t.unlock(1, &k);
            assert!(t.is_free(&k), "{policy:?}");

            // A timed-out conversion falls back to its granted mode.
            t.lock(1, &k, S, LONG).unwrap();
            t.lock(2, &k, S, LONG).unwrap();
            assert!(matches!(
                t.lock(1, &k, X, to),
                Err(LockFailure::Timeout {
                    blocker: Some(2),
                    ..
                })
            ));
            assert_eq!(t.held_mode(1, &k), S);
            t.unlock(2, &k);
            assert_eq!(t.try_lock(3, &k, X), Err(LockFailure::WouldBlock));
            t.unlock(1, &k);
            assert!(t.is_free(&k));
            assert_eq!(t.queue_count(), 0);
        }
    }

    #[test]
    fn timeout_of_first_waiter_grants_the_next() {
        // Queue: A holds S; B waits X (times out); C waits S behind B. When B gives up, C
        // becomes grantable and must be woken.
        let t = table(DeadlockPolicy::Timeout);
        let k = key(2);
        t.lock(1, &k, S, LONG).unwrap();
        let hb = {
            let (t, k) = (t.clone(), k.clone());
            thread::spawn(move || t.lock(2, &k, X, Duration::from_millis(60)))
        };
        wait_until("B waits", || t.waiters(&k) == 1);
        let hc = {
            let (t, k) = (t.clone(), k.clone());
            thread::spawn(move || {
                let r = t.lock(3, &k, S, LONG);
                t.unlock(3, &k);
                r
            })
        };
        wait_until("C waits", || t.waiters(&k) == 2);
        assert!(matches!(
            hb.join().unwrap(),
            Err(LockFailure::Timeout { .. })
        ));
        assert_eq!(hc.join().unwrap(), Ok(S));
        t.unlock(1, &k);
        assert_eq!(t.queue_count(), 0);
    }

    #[test]
    fn try_lock_leaves_nothing_behind() {
        let t = table(DeadlockPolicy::WaitForGraph);
        let k = key(1);
        assert_eq!(t.try_lock(1, &k, X), Ok(X));
        for m in [S, X, NS, SN, XN, NX] {
            assert_eq!(t.try_lock(2, &k, m), Err(LockFailure::WouldBlock));
        }
        assert_eq!(t.waiters(&k), 0);
        t.unlock(1, &k);
        assert!(t.is_free(&k));
        // Failed conversion keeps the held mode.
        t.try_lock(1, &k, SN).unwrap();
        t.try_lock(2, &k, SN).unwrap();
        assert_eq!(t.try_lock(1, &k, XN), Err(LockFailure::WouldBlock));
        assert_eq!(t.held_mode(1, &k), SN);
        t.unlock(1, &k);
        t.unlock(2, &k);
        assert_eq!(t.queue_count(), 0);
    }

    #[test]
    fn key_range_modes_on_one_key() {
        // NS (phantom protection of the gap) and XN (update of the key) coexist (Kimura §2.2).
        let t = table(DeadlockPolicy::WaitForGraph);
        let k = key(10);
        t.lock(1, &k, NS, LONG).unwrap();
        assert_eq!(t.try_lock(2, &k, XN), Ok(XN));
        assert_eq!(t.try_lock(3, &k, NX), Err(LockFailure::WouldBlock));
        assert_eq!(t.try_lock(3, &k, SN), Err(LockFailure::WouldBlock));
        t.unlock(2, &k);
        assert_eq!(t.try_lock(3, &k, SN), Ok(SN));
        t.unlock(1, &k);
        assert_eq!(t.try_lock(4, &k, NX), Ok(NX));
        t.unlock(3, &k);
        t.unlock(4, &k);
        assert_eq!(t.queue_count(), 0);
    }

    #[test]
    fn intent_locks_follow_table4() {
        let t = table(DeadlockPolicy::WaitForGraph);
        let tab = LockId::Table(5);
        for a in [S, X, IS, IX, SIX] {
            for b in [S, X, IS, IX, SIX] {
                t.lock(1, &tab, a, LONG).unwrap();
                let got = t.try_lock(2, &tab, b);
                assert_eq!(got.is_ok(), a.compatible(b), "{a:?} held, {b:?} asked");
                t.unlock(2, &tab);
                t.unlock(1, &tab);
                assert!(t.is_free(&tab));
            }
        }
        // Conversions along Gray's lattice.
        assert_eq!(t.lock(1, &tab, IS, LONG), Ok(IS));
        assert_eq!(t.lock(1, &tab, IX, LONG), Ok(IX));
        assert_eq!(t.lock(1, &tab, S, LONG), Ok(SIX));
        assert_eq!(t.try_lock(2, &tab, IS), Ok(IS));
        assert_eq!(t.try_lock(3, &tab, IX), Err(LockFailure::WouldBlock));
        assert_eq!(t.try_lock(3, &tab, S), Err(LockFailure::WouldBlock));
        t.unlock(1, &tab);
        assert_eq!(t.try_lock(3, &tab, IX), Ok(IX));
        t.unlock(2, &tab);
        t.unlock(3, &tab);
        assert!(t.is_free(&LockId::Database));
        assert_eq!(t.queue_count(), 0);
    }

    /// Each txn `i` holds `own[i]` in `first` mode, then (all at once) asks for `want[i]` in
    /// mode `second`. Returns the per-txn results.
    fn run_cycle(
        t: &Arc<SimpleLockTable>,
        own: Vec<LockId>,
        want: Vec<LockId>,
        first: LockMode,
        second: LockMode,
    ) -> Vec<Result<LockMode, LockFailure>> {
        let n = own.len();
        let barrier = Arc::new(Barrier::new(n));
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (t, barrier) = (t.clone(), barrier.clone());
                let (own, want) = (own[i].clone(), want[i].clone());
                thread::spawn(move || {
                    let txn = i as TxnId + 1;
                    t.lock(txn, &own, first, LONG).unwrap();
                    barrier.wait();
                    let r = t.lock(txn, &want, second, LONG);
                    if r.is_ok() {
                        // Hold a little so the others really wait.
                        thread::sleep(Duration::from_millis(5));
                        t.unlock(txn, &want);
                    }
                    t.unlock(txn, &own);
                    r
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn assert_one_victim(results: &[Result<LockMode, LockFailure>], started: Instant) {
        let victims = results
            .iter()
            .filter(|r| matches!(r, Err(LockFailure::Deadlock { blocker: Some(_) })))
            .count();
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!((victims, ok), (1, results.len() - 1), "{results:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "detected without timeouts"
        );
    }

    #[test]
    fn deadlock_two_cycle() {
        for _ in 0..20 {
            let t = table(DeadlockPolicy::WaitForGraph);
            let start = Instant::now();
            let r = run_cycle(&t, vec![key(1), key(2)], vec![key(2), key(1)], X, X);
            assert_one_victim(&r, start);
            assert_eq!(t.queue_count(), 0);
            assert!(t.graph.lock().is_empty());
        }
    }

    #[test]
    fn deadlock_three_cycle() {
        for _ in 0..20 {
            let t = table(DeadlockPolicy::WaitForGraph);
            let start = Instant::now();
            let own = vec![key(1), key(2), key(3)];
            let want = vec![key(2), key(3), key(1)];
            let r = run_cycle(&t, own, want, X, X);
            assert_one_victim(&r, start);
            assert_eq!(t.queue_count(), 0);
            assert!(t.graph.lock().is_empty());
        }
    }

    #[test]
    fn deadlock_upgrade() {
        for _ in 0..20 {
            let t = table(DeadlockPolicy::WaitForGraph);
            let start = Instant::now();
            // Both hold S on one key and convert to X; the victim keeps S until it unlocks.
            let k = key(4);
            let r = run_cycle(&t, vec![k.clone(), k.clone()], vec![k.clone(), k], S, X);
            assert_one_victim(&r, start);
            assert_eq!(t.queue_count(), 0);
            assert!(t.graph.lock().is_empty());
        }
    }

    #[test]
    fn waiting_chain_is_not_a_deadlock() {
        // T2 waits for T1, T3 for T2 (on another lock): no cycle, nobody is a victim.
        let t = table(DeadlockPolicy::WaitForGraph);
        let (a, b) = (key(1), key(2));
        t.lock(1, &a, X, LONG).unwrap();
        t.lock(2, &b, X, LONG).unwrap();
        let h2 = {
            let (t, a, b) = (t.clone(), a.clone(), b.clone());
            thread::spawn(move || {
                let r = t.lock(2, &a, X, LONG);
                t.unlock(2, &a);
                t.unlock(2, &b);
                r
            })
        };
        wait_until("T2 waits", || t.waiters(&a) == 1);
        let h3 = {
            let (t, b) = (t.clone(), b.clone());
            thread::spawn(move || {
                let r = t.lock(3, &b, X, LONG);
                t.unlock(3, &b);
                r
            })
        };
        wait_until("T3 waits", || t.waiters(&b) == 1);
        thread::sleep(Duration::from_millis(30)); // a few re-checks
        t.unlock(1, &a);
        assert_eq!(h2.join().unwrap(), Ok(X));
        assert_eq!(h3.join().unwrap(), Ok(X));
        assert_eq!(t.queue_count(), 0);
        assert!(t.graph.lock().is_empty());
    }

    #[test]
    fn timeout_policy_breaks_deadlock_by_timeout() {
        let t = table(DeadlockPolicy::Timeout);
        let (a, b) = (key(1), key(2));
        let n = 2;
        let barrier = Arc::new(Barrier::new(n));
        let hs: Vec<_> = [(a.clone(), b.clone()), (b, a)]
            .into_iter()
            .enumerate()
            .map(|(i, (own, want))| {
                let (t, barrier) = (t.clone(), barrier.clone());
                thread::spawn(move || {
                    let txn = i as TxnId + 1;
                    t.lock(txn, &own, X, LONG).unwrap();
                    barrier.wait();
                    let to = Duration::from_millis(30 + 200 * i as u64);
                    let r = t.lock(txn, &want, X, to);
                    t.unlock(txn, &want);
                    t.unlock(txn, &own);
                    r
                })
            })
            .collect();
        let r: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(matches!(r[0], Err(LockFailure::Timeout { .. })), "{r:?}");
        assert_eq!(r[1], Ok(X));
        assert_eq!(t.queue_count(), 0);
    }

    #[test]
    fn many_keys_queue_count() {
        let t = table(DeadlockPolicy::WaitForGraph);
        for i in 0..2000u32 {
            let k = LockId::Key(i % 7, i.to_le_bytes().to_vec().into_boxed_slice());
            t.lock(u64::from(i % 3), &k, XN, LONG).unwrap();
        }
        t.lock(1, &LockId::NegInf(3), NS, LONG).unwrap();
        t.lock(1, &LockId::Database, IX, LONG).unwrap();
        assert_eq!(t.queue_count(), 2002);
        for i in 0..2000u32 {
            let k = LockId::Key(i % 7, i.to_le_bytes().to_vec().into_boxed_slice());
            t.unlock(u64::from(i % 3), &k);
        }
        t.unlock(1, &LockId::NegInf(3));
        t.unlock(1, &LockId::Database);
        assert_eq!(t.queue_count(), 0);
    }
}
