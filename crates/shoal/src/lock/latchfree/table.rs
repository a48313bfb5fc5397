//! The algorithm of the latch-free lock table (see the parent module's docs for the design):
//! this file holds the table, its sizes, the grant rule and acquire and release (Jung et al.
//! 2013 §3.1-§3.2, §3.4); its submodules the entries and lock heads (`state`, §3.1), the
//! hash table and lists (`lists`, §3.1, §4.5), reclamation (`reclaim`, §4) and deadlock
//! handling (`search`, §3.3).
//!
//! These files use only `super::sync` for atomics, fences and parking and `super::{LockId,
//! ..}` for the lock-manager types, so the model-checking test can compile them a second
//! time against `shuttle`'s instrumented primitives (`tests/latchfree_shuttle.rs`). The
//! submodules are named by path relative to this file, which both compilations include
//! from elsewhere.

use std::cell::{Cell, UnsafeCell};
use std::hash::BuildHasher;
use std::ptr;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use rustc_hash::FxBuildHasher;
use smallvec::SmallVec;

use super::deadlock::{Blocker, Deadlocks, Decision};
use super::dread::{age_of, fingerprint_of, pipeline_of};
use super::sync::{
    current, fence, park_timeout, yield_now, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
    Thread,
};
use super::{
    DeadlockPolicy, Granted, LockFailure, LockId, LockMode, LockTable, LockTableFootprint, TxnId,
    Victim,
};

#[path = "lists.rs"]
mod lists;
#[path = "reclaim.rs"]
mod reclaim;
#[path = "search.rs"]
mod search;
#[path = "state.rs"]
mod state;

use reclaim::*;
use state::*;

/// Buckets per bucket group: a group is one cache line holding its reclamation gate (three
/// counters) and this many bucket pointers.
pub const GROUP_BUCKETS: usize = 6;
/// Number of buckets of the lock hash table (fixed): 2^15 groups of [`GROUP_BUCKETS`], 2 MiB.
/// With lock heads killed at release the lists are short anyway, and this keeps them short
/// when idle heads stay linked (txbench read-only at MPL 512: 2^16 buckets gave 91k-115k tps
/// with `find_head` a third of the profile, 2^18 116k-123k; 2^20 made every lookup a cache
/// miss in an 8 MiB array).
pub const BUCKETS: usize = GROUP_BUCKETS << 15;
/// Number of pool slots (at most this many operations run at once; more wait for a slot).
pub const SLOTS: usize = 512;
/// Capacity of the waiting-transaction registry used by deadlock detection.
pub const WAIT_REGISTRY: usize = 1024;
/// Entries allocated at once when a slot's free list is empty (bulk pre-allocation).
pub const ALLOC_BATCH: usize = 32;
/// Retired entries a slot defers (see `Gate`) before it tries to reclaim them.
pub const RETIRE_BATCH: usize = 64;
/// Free entries (and, separately, free lock heads) a slot keeps for reuse; beyond that
/// reclaimed ones are deallocated. Sized for the burst a slot reclaims at once after a
/// descheduled thread held a gate back: with a small pool (128) that burst went back to the
/// allocator and the next one came fresh from it, cold pages and cross-thread frees included
/// (txbench read-only at MPL 4, under a single table-wide epoch: 20% of the time in
/// reclamation and the allocator).
pub const FREE_CAP: usize = 8192;
/// Lock heads a slot creates between two sweep steps over the buckets. (64 swept so often
/// that hot heads kept being killed and recreated: txbench read-only at MPL 512 fell from
/// about 120k to 5k-48k tps; 1024 measured like no sweeping at all.)
pub const SWEEP_EVERY: usize = 1024;
/// Buckets one sweep step visits (a full sweep of [`BUCKETS`] takes 64 steps).
pub const SWEEP_BUCKETS: usize = 4096;
/// Retired lock heads a slot may hold back (not yet reclaimable) and still kill
/// idle lock heads (eagerly at unlock, or in a sweep step). Past that, idle heads stay
/// linked and are reused: while descheduled threads hold gates back (many more threads
/// than cores, waiting transactions stalled in a deadlock search), killing would only pile
/// up memory that cannot be reclaimed.
pub const KILL_BACKLOG: usize = 4096;
/// Stripes of the early-lock-release tag floor (the tags of reclaimed lock heads).
const TAG_FLOORS: usize = 1024;
/// How often a blocked request re-runs the deadlock search.
pub const DEADLOCK_RECHECK: Duration = Duration::from_millis(10);
/// Poll period of a waiter that runs on another thread than its entry's (see `acquire`).
const FOREIGN_POLL: Duration = Duration::from_millis(1);

/// Sizes of a [`LatchFreeLockTable`]; [`Params::default`] is what [`LatchFreeLockTable::new`]
/// uses. Smaller values make reclamation run often (tests and model checking).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Buckets of the lock hash table (rounded up to a power of two of groups of
    /// [`GROUP_BUCKETS`]; fewer than that make one group of this many buckets).
    pub buckets: usize,
    /// Pool slots: at most this many operations run at once.
    pub slots: usize,
    /// Capacity of the waiting-transaction registry of deadlock detection.
    pub wait_registry: usize,
    /// Deferred retirements a slot collects before it tries to reclaim them.
    pub retire_batch: usize,
    /// Reclaimed entries a slot keeps for reuse; beyond that they are deallocated.
    pub free_cap: usize,
    /// Lock heads a slot creates between two sweep steps (see [`Params::sweep_buckets`]).
    pub sweep_every: usize,
    /// Buckets a sweep step visits: it kills and unlinks the idle lock heads there.
    pub sweep_buckets: usize,
    /// Testing aid: reclaimed lock heads are poisoned and kept allocated until the table is
    /// dropped, rather than freed, so that reaching one trips a debug assertion.
    pub poison_heads: bool,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            buckets: BUCKETS,
            slots: SLOTS,
            wait_registry: WAIT_REGISTRY,
            retire_batch: RETIRE_BATCH,
            free_cap: FREE_CAP,
            sweep_every: SWEEP_EVERY,
            sweep_buckets: SWEEP_BUCKETS,
            poison_heads: false,
        }
    }
}

/// Result of checking a request against the others on its lock.
enum Verdict {
    Grant,
    /// Blocked by this transaction.
    Blocked(TxnId),
    /// Conflicts with a younger transaction's tentative grant: re-check shortly.
    Retry,
}

/// Latch-free lock table after Jung et al. 2013 (see the [module docs](super)).
pub struct LatchFreeLockTable {
    /// The buckets, in groups of `per_group` (a power of two of groups).
    groups: Box<[Group]>,
    /// Buckets used per group: [`GROUP_BUCKETS`], or fewer for a tiny table.
    per_group: usize,
    slots: Box<[CachePadded<Slot>]>,
    /// The table-wide reclamation gate (see [`Gate`]).
    all: CachePadded<Gate>,
    /// Entries of waiting requests, for the waits-for walk of deadlock detection.
    waiting: Box<[AtomicPtr<Entry>]>,
    allocated: AtomicUsize,
    /// Where the next sweep step starts (a bucket index, modulo the bucket count).
    sweep_cursor: AtomicUsize,
    /// Highest early-lock-release tag of a killed lock head, per stripe of buckets: a tag
    /// must outlive its lock head.
    tag_floor: Box<[AtomicU64]>,
    /// The deadlock policy's decisions and per-transaction state, shared with the other
    /// tables; the waits-for search is this table's own (`deadlock_victim`).
    deadlocks: Deadlocks,
    params: Params,
}

impl std::fmt::Debug for LatchFreeLockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatchFreeLockTable")
            .field("policy", &self.deadlocks.policy())
            .field("allocated_entries", &self.allocated_entries())
            .field("allocated_heads", &self.allocated_heads())
            .finish()
    }
}

impl LatchFreeLockTable {
    /// A new empty table with the given deadlock handling.
    pub fn new(policy: DeadlockPolicy) -> Self {
        Self::with_params(policy, Params::default())
    }

    /// A new empty table with the given sizes.
    pub fn with_params(policy: DeadlockPolicy, mut params: Params) -> Self {
        let per_group = params.buckets.clamp(1, GROUP_BUCKETS);
        let groups = params.buckets.div_ceil(per_group).next_power_of_two();
        params.buckets = groups * per_group;
        params.slots = params.slots.max(1);
        params.wait_registry = params.wait_registry.max(1);
        params.retire_batch = params.retire_batch.max(1);
        params.sweep_every = params.sweep_every.max(1);
        params.sweep_buckets = params.sweep_buckets.clamp(1, params.buckets);
        LatchFreeLockTable {
            groups: (0..groups)
                .map(|_| Group {
                    gate: Gate::new(),
                    buckets: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
                })
                .collect(),
            per_group,
            slots: (0..params.slots)
                .map(|_| {
                    CachePadded::new(Slot {
                        busy: AtomicU32::new(0),
                        heads_made: AtomicUsize::new(0),
                        heads_freed: AtomicUsize::new(0),
                        heads_pooled: AtomicUsize::new(0),
                        local: UnsafeCell::new(SlotLocal::default()),
                    })
                })
                .collect(),
            all: CachePadded::new(Gate::new()),
            waiting: (0..params.wait_registry)
                .map(|_| AtomicPtr::new(ptr::null_mut()))
                .collect(),
            allocated: AtomicUsize::new(0),
            sweep_cursor: AtomicUsize::new(0),
            tag_floor: (0..params.buckets.min(TAG_FLOORS))
                .map(|_| AtomicU64::new(0))
                .collect(),
            deadlocks: Deadlocks::new(policy, Victim::KillYoung),
            params,
        }
    }

    /// Sets the victim rule Dreadlocks uses (default kill-young).
    pub fn with_victim(mut self, victim: Victim) -> Self {
        self.deadlocks = Deadlocks::new(self.deadlocks.policy(), victim);
        self
    }

    /// The deadlock policy the table was created with.
    pub fn policy(&self) -> DeadlockPolicy {
        self.deadlocks.policy()
    }

    /// The victim rule.
    pub fn victim(&self) -> Victim {
        self.deadlocks.victim()
    }

    /// Number of request entries currently allocated (live, obsolete, retired or pooled).
    pub fn allocated_entries(&self) -> usize {
        self.allocated.load(SeqCst)
    }

    /// Number of locks with at least one live (waiting or granted) request.
    pub fn queue_count(&self) -> usize {
        let _g = self.pin_all();
        let mut n = 0;
        self.for_each_head(|h| {
            let mut live = false;
            self.walk(h, |e| {
                live |= e.state.load(SeqCst) & OBSOLETE == 0;
                !live
            });
            n += usize::from(live);
        });
        n
    }

    /// Number of lock heads in use: linked in a bucket (live or dead) or retired and not
    /// reclaimed yet. Reclaimed heads kept for reuse are [`pooled_heads`](Self::pooled_heads).
    pub fn allocated_heads(&self) -> usize {
        let (made, freed) = self.slots.iter().fold((0usize, 0usize), |(m, f), s| {
            (
                m.wrapping_add(s.heads_made.load(SeqCst)),
                f.wrapping_add(s.heads_freed.load(SeqCst)),
            )
        });
        made.wrapping_sub(freed)
    }

    /// Number of reclaimed lock heads kept allocated in the slots' free lists for reuse.
    pub fn pooled_heads(&self) -> usize {
        self.slots
            .iter()
            .map(|s| s.heads_pooled.load(Relaxed))
            .sum()
    }

    /// Number of live (not killed) lock heads linked in the buckets.
    pub fn lock_heads(&self) -> usize {
        let _g = self.pin_all();
        let mut n = 0;
        self.for_each_head(|h| n += usize::from(!h.is_dead()));
        n
    }

    /// Number of requests currently waiting on `id`.
    pub fn waiters(&self, id: &LockId) -> usize {
        let (g, hash) = self.pin_id(id);
        let Some(h) = self.find_head(&g, id, hash, false) else {
            return 0;
        };
        let mut n = 0;
        self.walk(h, |e| {
            let s = e.state.load(SeqCst);
            n += usize::from(s & WAITING != 0 && s & OBSOLETE == 0);
            true
        });
        n
    }

    /// The mode `txn` currently holds on `id` (`N` if none).
    pub fn held_mode(&self, txn: TxnId, id: &LockId) -> LockMode {
        let (g, hash) = self.pin_id(id);
        self.find_head(&g, id, hash, false)
            .and_then(|h| self.find_entry(h, txn))
            // SAFETY: pinned, so the entry is not recycled while we read it.
            .map_or(LockMode::N, |e| {
                granted_of(unsafe { &*e }.state.load(SeqCst))
            })
    }
}

impl LatchFreeLockTable {
    // ---- grant rule, wake-ups ----

    /// Kimura's rule for `me` (null: a request about to be appended at the tail) asking for
    /// `target`: every other granted mode must be compatible; a new request must also be
    /// compatible with the requested mode of every waiting request ahead of it.
    fn evaluate(
        &self,
        h: &LockHead,
        me: *const Entry,
        txn: TxnId,
        target: LockMode,
        new: bool,
        recheck: bool,
    ) -> Verdict {
        let mut verdict = Verdict::Grant;
        let mut ahead = true;
        self.walk(h, |e| {
            if ptr::eq(e, me) {
                ahead = false;
                return true;
            }
            let s = e.state.load(SeqCst);
            if s & OBSOLETE != 0 {
                return true;
            }
            let other = e.txn.load(SeqCst);
            if !granted_of(s).compatible(target) {
                verdict = if recheck && s & TENTATIVE != 0 && other > txn {
                    Verdict::Retry
                } else {
                    Verdict::Blocked(other)
                };
                return matches!(verdict, Verdict::Retry);
            }
            if new && ahead && s & WAITING != 0 && !requested_of(s).compatible(target) {
                verdict = Verdict::Blocked(other);
                return false;
            }
            true
        });
        verdict
    }

    /// Wakes the waiters of `h` whose requested mode conflicts with a mode in `mask` that
    /// `me` stopped holding or requesting. Call after the state change and a fence.
    /// Also unlinks the obsolete entries it passes.
    /// Under Dreadlocks with backoff, marks the digests of the waiters it passes stale
    /// (their dependencies may just have changed; see `Deadlocks::lock_changed`).
    fn wake(&self, g: &Guard<'_>, h: &LockHead, me: *const Entry, mask: u16) {
        let stale = self.deadlocks.marks_waiters_stale();
        self.walk_clean(g, h, |e| {
            if !ptr::eq(e, me) {
                let s = e.state.load(SeqCst);
                if s & WAITING != 0 && s & OBSOLETE == 0 {
                    if stale {
                        self.deadlocks.lock_changed(e.txn.load(SeqCst), true);
                    }
                    if !compatible_with_all(requested_of(s), mask) {
                        e.unpark();
                    }
                }
            }
        });
    }

    // ---- acquire ----
}

impl LockTable for LatchFreeLockTable {
    fn footprint(&self) -> LockTableFootprint {
        LockTableFootprint {
            heads: self.allocated_heads() + self.pooled_heads(),
            entries: self.allocated_entries(),
        }
    }

    fn acquire(&self, txn: TxnId, id: &LockId, mode: LockMode, wait: Option<Duration>) -> Granted {
        let hash = Self::hash(id);
        let b = self.bucket_of(hash);
        let mut guard = self.pin(b);
        let (h, e, held, target, new) = loop {
            let Some(h) = self.find_head(&guard, id, hash, mode != LockMode::N) else {
                return Ok(LockMode::N);
            };
            match self.find_entry(h, txn) {
                Some(e) => {
                    // SAFETY: our own live entry: only we can make it obsolete.
                    let entry = unsafe { &*e };
                    let s = entry.state.load(SeqCst);
                    if s & OBSOLETE != 0 {
                        // Released since the lookup (from another thread: a misuse).
                        continue;
                    }
                    if s & (WAITING | TENTATIVE) != 0 {
                        // Another thread of this transaction is inside `acquire` with this
                        // entry (a misuse: one lock call per transaction at a time), and may
                        // be parked unpinned holding it. Taking it over would let this thread
                        // end the wait and release the entry, which is then unlinked and
                        // reclaimed under the parked thread (a use after free when it wakes).
                        return Err(LockFailure::WouldBlock);
                    }
                    let held = granted_of(s);
                    if held.covers(mode) {
                        return Ok(held);
                    }
                    let target = held.supremum(mode);
                    if wait.is_none()
                        && !matches!(
                            self.evaluate(h, e, txn, target, false, false),
                            Verdict::Grant
                        )
                    {
                        return Err(LockFailure::WouldBlock);
                    }
                    // From the state just read: a release of this transaction's lock from
                    // another thread (a misuse) may have made the entry obsolete since, and
                    // a plain store would bring it back to life after it was unlinked.
                    if entry
                        .state
                        .compare_exchange(s, pack(held, target, WAITING), SeqCst, SeqCst)
                        .is_err()
                    {
                        continue;
                    }
                    // Our live entry keeps `h` from being killed.
                    break (h, e, held, target, false);
                }
                None => {
                    if mode == LockMode::N {
                        return Ok(LockMode::N);
                    }
                    if wait.is_none()
                        && !matches!(
                            self.evaluate(h, ptr::null(), txn, mode, true, false),
                            Verdict::Grant
                        )
                    {
                        return Err(LockFailure::WouldBlock);
                    }
                    let e = self.alloc(&guard, txn, pack(LockMode::N, mode, WAITING), h);
                    if self.append(h, e) {
                        // From now on our live entry keeps `h` from being killed.
                        break (h, e, LockMode::N, mode, true);
                    }
                    // `h` was killed meanwhile: the entry is still ours, unlinked; look again.
                    guard.local().free.push(e);
                }
            }
        };
        // SAFETY: our own live entry.
        let entry = unsafe { &*e };
        let waiting = pack(held, target, WAITING);
        // Wakers unpark the thread recorded in the entry when it was appended. A conversion
        // asked from another thread (against the one-thread-per-transaction rule) cannot be
        // woken that way, so it polls.
        // SAFETY: our own entry; `thread` is only written before the entry is linked.
        let foreign =
            unsafe { &*entry.thread.get() }.as_ref().map(|t| t.id()) != Some(current().id());
        let start = Instant::now();
        let mut registered: Option<usize> = None;
        let policy = self.deadlocks.policy();
        // The shared decisions of no-wait, wait-die, wound-wait and Dreadlocks (`None` under
        // the waits-for graph and the timeout policy).
        let mut decider = (wait.is_some() && self.deadlocks.decides())
            .then(|| self.deadlocks.wait(txn, age_of(txn)));
        let mut blockers: Vec<Blocker> = Vec::new();
        loop {
            // RAW: our WAITING state is published; read the others' states only after a fence.
            fence(SeqCst);
            let mut verdict = self.evaluate(h, e, txn, target, new, false);
            if let Verdict::Grant = verdict {
                // A granted transaction waits for nobody: withdraw a published digest before
                // the grant becomes visible, so nobody builds a false cycle through it. (If
                // the grant backs off, the next decision publishes it again.)
                if let Some(w) = decider.as_mut() {
                    w.retire();
                }
                // Tentative grant, fence, re-check (Dekker): of two conflicting grants at
                // least one sees the other's tentative mode and backs off.
                entry.state.store(pack(target, target, TENTATIVE), SeqCst);
                let mut step = 0;
                loop {
                    fence(SeqCst);
                    match self.evaluate(h, e, txn, target, new, true) {
                        Verdict::Retry => backoff(&mut step),
                        v => {
                            verdict = v;
                            break;
                        }
                    }
                }
                if let Verdict::Grant = verdict {
                    // Unregister before the grant is final: a granted entry may be released
                    // (from another thread, a misuse) and unlinked at once, and the registry
                    // must never hold an entry that can become obsolete.
                    if let Some(i) = registered {
                        self.waiting[i].store(ptr::null_mut(), SeqCst);
                    }
                    entry.state.store(pack(target, target, 0), SeqCst);
                    return Ok(target);
                }
                // Back off; others may have blocked on our tentative mode: wake them. Then
                // decide again: one that backed off at the same moment saw us tentative and
                // skipped us in its wake-up, so the verdict read before our WAITING state was
                // published may be stale (parking on it lost that wake-up).
                entry.state.store(waiting, SeqCst);
                fence(SeqCst);
                self.wake(&guard, h, e, bit(target));
                continue;
            }
            let blocker = match verdict {
                Verdict::Blocked(b) => Some(b),
                _ => None,
            };
            let failure = match wait {
                None => Some(LockFailure::WouldBlock),
                Some(t) if start.elapsed() >= t => Some(LockFailure::Timeout {
                    blocker,
                    waited: start.elapsed(),
                }),
                Some(_) => None,
            };
            let mut wake: SmallVec<[TxnId; 4]> = SmallVec::new();
            let failure = match (failure, policy) {
                (Some(f), _) => Some(f),
                (None, DeadlockPolicy::Timeout) => None,
                (None, DeadlockPolicy::WaitForGraph) => {
                    // At the first wait, after every wake-up, and every DEADLOCK_RECHECK.
                    if registered.is_none() {
                        registered = self.register_waiter(txn, e);
                        fence(SeqCst);
                    }
                    self.deadlock_victim(txn, entry)
                        .map(|b| LockFailure::Deadlock { blocker: Some(b) })
                }
                (None, _) => {
                    // Registered so that a wounding or cycle-finding transaction can wake us.
                    if registered.is_none() && self.deadlocks.wakes_waiters() {
                        registered = self.register_waiter(txn, e);
                        fence(SeqCst);
                    }
                    self.blocker_set(entry, &mut blockers);
                    if blockers.is_empty() {
                        // The blocker went away since `evaluate`: evaluate again.
                        continue;
                    }
                    match decider.as_mut().map(|w| w.decide(&blockers)) {
                        Some(Decision::Fail(f)) => Some(f),
                        Some(Decision::Wait(w)) => {
                            wake = w;
                            None
                        }
                        None => None,
                    }
                }
            };
            if let Some(f) = failure {
                if let Some(i) = registered {
                    self.waiting[i].store(ptr::null_mut(), SeqCst);
                }
                // Withdraw: a new request dies, a conversion falls back to its held mode.
                let done = if new {
                    pack(LockMode::N, target, OBSOLETE)
                } else {
                    pack(held, held, 0)
                };
                // Withdraw a published digest first, as a grant does: nobody may build a
                // cycle through a wait that is over.
                drop(decider);
                entry.state.store(done, SeqCst);
                fence(SeqCst);
                self.wake(&guard, h, e, bit(target));
                return Err(f);
            }
            let mut nap = wait.unwrap_or_default().saturating_sub(start.elapsed());
            if policy == DeadlockPolicy::WaitForGraph {
                nap = nap.min(DEADLOCK_RECHECK);
            }
            if foreign {
                nap = nap.min(FOREIGN_POLL);
            }
            // Never park pinned: our entry and lock head stay valid without a pin (a live
            // entry is never unlinked, a lock head with a live entry is never killed, hence
            // never unlinked or freed).
            drop(guard);
            for t in wake {
                self.wake_txn(t);
            }
            match decider.as_ref() {
                Some(w) => w.nap(nap, yield_now, park_timeout),
                None => park_timeout(nap),
            }
            guard = self.pin(b);
        }
    }

    fn unlock_tagged(&self, txn: TxnId, id: &LockId, tag: u64) {
        let (guard, hash) = self.pin_id(id);
        let Some(h) = self.find_head(&guard, id, hash, false) else {
            return;
        };
        let Some(e) = self.find_entry(h, txn) else {
            return;
        };
        h.tag.fetch_max(tag, SeqCst);
        // SAFETY: the transaction's own live entry (a pinned lookup found it).
        let entry = unsafe { &*e };
        // Release (Jung Fig. 3 R2-R11): mark obsolete, fence, wake the waiters it blocked.
        // A request still in flight (waiting or tentatively granted) belongs to a thread of
        // this transaction that is inside `acquire` (a misuse: one thread per transaction)
        // and may be parked unpinned holding the entry: it is not released from here, as
        // that would let the entry be unlinked and reused under it. Nothing of it is held.
        let mut s = entry.state.load(SeqCst);
        loop {
            if s & (WAITING | TENTATIVE | OBSOLETE) != 0 {
                return;
            }
            match entry
                .state
                .compare_exchange(s, s | OBSOLETE, SeqCst, SeqCst)
            {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        fence(SeqCst);
        self.wake(&guard, h, e, bit(granted_of(s)) | bit(requested_of(s)));
        // Eager kill: a lock head whose last request just became obsolete is killed and
        // unlinked now rather than by the next sweep, so the bucket lists hold about as many
        // heads as there are held or awaited locks and lookups stay in cache.
        let b = self.bucket_of(hash);
        if self.may_kill(&guard) && self.try_kill(h, b) {
            self.sweep_bucket(&guard, b, false);
        }
    }

    fn is_free(&self, id: &LockId) -> bool {
        let (g, hash) = self.pin_id(id);
        let Some(h) = self.find_head(&g, id, hash, false) else {
            return true;
        };
        let mut free = true;
        self.walk(h, |e| {
            free &= e.state.load(SeqCst) & OBSOLETE != 0;
            free
        });
        free
    }

    fn tag(&self, id: &LockId) -> u64 {
        let (g, hash) = self.pin_id(id);
        let own = self
            .find_head(&g, id, hash, false)
            .map_or(0, |h| h.tag.load(SeqCst));
        // Read after the lookup: a head killed before the lookup skipped it had its tag
        // folded into the floor before it was marked dead.
        own.max(self.tag_floor(self.bucket_of(hash)).load(SeqCst))
    }
}

impl Drop for LatchFreeLockTable {
    fn drop(&mut self) {
        let mut heads = Vec::new();
        self.for_each_head(|h| heads.push(h as *const LockHead as *mut LockHead));
        for s in self.slots.iter_mut() {
            let local = s.local.get_mut();
            heads.extend(local.heads.drain(..).map(|r| r.ptr));
            for h in local.graveyard.drain(..) {
                // SAFETY: a reclaimed head kept allocated: owned by the graveyard only (its
                // entries were recycled when it was reclaimed).
                drop(unsafe { Box::from_raw(h) });
            }
        }
        for hp in heads {
            // SAFETY: `&mut self`: no other thread uses the table; every lock head came from
            // `Box::into_raw` and is either linked in a bucket or retired in one bag (it is
            // retired only by the CAS that unlinked it), so it is visited once.
            let h = unsafe { Box::from_raw(hp) };
            let mut cur = h.first.load(SeqCst);
            while !cur.is_null() {
                // SAFETY: every linked entry came from `Box::into_raw` and is linked once
                // (unlinked entries are in the slots' bags, not here).
                let e = unsafe { Box::from_raw(cur) };
                cur = unmarked(e.next.load(SeqCst));
            }
        }
        for s in self.slots.iter_mut() {
            let local = s.local.get_mut();
            for r in local.bag.drain(..) {
                // SAFETY: retired entries are unlinked and owned by the bag.
                drop(unsafe { Box::from_raw(r.ptr) });
            }
            for e in local.free.drain(..) {
                // SAFETY: free entries are owned by the free list.
                drop(unsafe { Box::from_raw(e) });
            }
            for h in local.free_heads.drain(..) {
                // SAFETY: pooled heads are owned by the free list; their entries were
                // recycled when they were reclaimed.
                drop(unsafe { Box::from_raw(h) });
            }
        }
    }
}
