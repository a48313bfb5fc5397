//! The algorithm of the latch-free lock table (see the parent module's docs for the design).
//!
//! This file uses only `super::sync` for atomics, fences and parking and `super::{LockId, ..}`
//! for the lock-manager types, so the model-checking test can compile it a second time against
//! `shuttle`'s instrumented primitives (`tests/latchfree_shuttle.rs`).

use std::cell::{Cell, UnsafeCell};
use std::hash::BuildHasher;
use std::ptr;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use rustc_hash::FxBuildHasher;
use smallvec::SmallVec;

use super::deadlock::{Blocker, Deadlocks, Decision};
use super::dread::{age_of, pipeline_len};
use super::sync::{
    current, fence, park_timeout, yield_now, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
    Thread,
};
use super::{
    DeadlockPolicy, LockFailure, LockId, LockMode, LockTable, LockTableFootprint, TxnId, Victim,
};

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
/// Retired entries a slot defers (see [`Gate`]) before it tries to reclaim them.
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
/// Bound on the transactions the deadlock search visits from one request.
const DEADLOCK_BUDGET: u32 = 256;
/// Bound on the length of a waits-for path the deadlock search follows.
const DEADLOCK_DEPTH: usize = 32;

// ---- entry state word: granted mode | requested mode << 4 | flags ----

/// The request waits (its requested mode is not granted yet).
const WAITING: u32 = 1 << 8;
/// The requested mode is granted tentatively and being verified (RAW re-check).
const TENTATIVE: u32 = 1 << 9;
/// The request is released or withdrawn; the entry is dead and may be unlinked.
const OBSOLETE: u32 = 1 << 10;
/// Set on an entry when it is reclaimed (back in a free list); reaching one from a list is a
/// reclamation bug, caught by a debug assertion in `walk`.
const POISON: u32 = 1 << 11;

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

const fn pack(granted: LockMode, requested: LockMode, flags: u32) -> u32 {
    granted as u32 | (requested as u32) << 4 | flags
}

fn granted_of(s: u32) -> LockMode {
    LockMode::ALL[(s & 0xf) as usize]
}

fn requested_of(s: u32) -> LockMode {
    LockMode::ALL[((s >> 4) & 0xf) as usize]
}

/// `p` with the deletion mark (low bit; entries and lock heads are 8-byte aligned).
fn marked<T>(p: *mut T) -> *mut T {
    p.wrapping_byte_add(1)
}

/// `p` without the deletion mark.
fn unmarked<T>(p: *mut T) -> *mut T {
    if is_marked(p) {
        p.wrapping_byte_sub(1)
    } else {
        p
    }
}

/// `p` carries the deletion mark.
fn is_marked<T>(p: *mut T) -> bool {
    p as usize & 1 == 1
}

fn bit(m: LockMode) -> u16 {
    1 << (m as u16)
}

/// `m` is compatible with every mode in `mask`.
fn compatible_with_all(m: LockMode, mask: u16) -> bool {
    LockMode::ALL
        .iter()
        .all(|&o| mask & bit(o) == 0 || m.compatible(o))
}

/// One transaction's request on one lock: an element of a lock head's request list.
///
/// Entries are pooled: `txn`, `next`, `head` and `thread` are (re)initialised only while the
/// entry is owned exclusively (fresh from the pool, before it is linked); afterwards only the
/// owning transaction writes `state`, everybody may read.
struct Entry {
    txn: AtomicU64,
    state: AtomicU32,
    /// The transaction's age (wait-die and wound-wait timestamp, Dreadlocks' victim rule),
    /// recorded when the entry is appended under the policies that read it, else 0.
    age: AtomicU64,
    /// The requesting thread's flush-pipeline length when it asked (victim rules).
    pipe: AtomicU32,
    next: AtomicPtr<Entry>,
    head: AtomicPtr<LockHead>,
    /// The requesting thread, unparked by wakers. Written only while the entry is unlinked and
    /// owned by one thread.
    thread: UnsafeCell<Option<Thread>>,
}

impl Entry {
    fn blank() -> Self {
        Entry {
            txn: AtomicU64::new(0),
            state: AtomicU32::new(OBSOLETE),
            age: AtomicU64::new(0),
            pipe: AtomicU32::new(0),
            next: AtomicPtr::new(ptr::null_mut()),
            head: AtomicPtr::new(ptr::null_mut()),
            thread: UnsafeCell::new(None),
        }
    }

    fn unpark(&self) {
        // SAFETY: `thread` is written only before the entry is linked into a list (exclusive
        // ownership); readers reach the entry through the list while pinned, so no write can
        // race with this read (the entry is not recycled before every pinned reader is gone).
        if let Some(t) = unsafe { &*self.thread.get() } {
            t.unpark();
        }
    }
}

/// The lock head of one [`LockId`]: an element of a bucket list.
///
/// A lock head whose requests are all obsolete may be **killed**: its `tail` gets the
/// deletion mark, with a CAS from the unmarked tail the killer read before checking that every
/// entry up to it is obsolete. Appenders CAS the tail too and give up on a marked one, so a
/// dead head never gets a request; lookups skip it. Then its `next` is marked (frozen) and it
/// is unlinked from the bucket list as in Michael's list, and retired like an entry: freed,
/// with the entries still on its list, once no pinned operation can reach it.
struct LockHead {
    /// Hash of `id` (compared before `id` itself in lookups).
    hash: u64,
    id: LockId,
    /// Next lock head of the bucket; marked once this head is dead and about to be unlinked.
    next: AtomicPtr<LockHead>,
    /// First entry of the request list (null only before the first append completes).
    first: AtomicPtr<Entry>,
    /// Last appended entry (Jung Fig. 4: CAS'd by appenders, then the old tail is linked);
    /// marked when the head is dead.
    tail: AtomicPtr<Entry>,
    /// Early-lock-release tag; folded into the bucket's tag floor when the head is killed.
    tag: AtomicU64,
    /// Set when the head is reclaimed but kept allocated ([`Params::poison_heads`]).
    poison: AtomicU32,
}

impl LockHead {
    fn is_dead(&self) -> bool {
        self.check();
        is_marked(self.tail.load(SeqCst))
    }

    /// Debug check that the head was not reclaimed (see [`Params::poison_heads`]).
    fn check(&self) {
        debug_assert!(
            self.poison.load(SeqCst) == 0,
            "reached a reclaimed lock head"
        );
    }
}

/// A retired (unlinked) entry or lock head, deferred until no operation can reach it: until
/// the gate of its bucket group and the table-wide gate have each advanced twice past the
/// epochs read when it was retired (see [`Gate`]).
struct Retired<T> {
    ptr: *mut T,
    /// Its bucket group.
    group: usize,
    /// The group's gate epoch when it was retired.
    group_epoch: u32,
    /// The table-wide gate epoch when it was retired.
    all_epoch: u32,
}

/// Per-slot state only the thread that claimed the slot touches.
#[derive(Default)]
struct SlotLocal {
    /// Unlinked entries waiting for their gates, in retirement order.
    bag: Vec<Retired<Entry>>,
    /// Unlinked (dead) lock heads waiting for their gates, in retirement order.
    heads: Vec<Retired<LockHead>>,
    /// Lock heads this slot created since its last sweep step.
    created: usize,
    /// A sweep step is due when the operation ends (see `created_head`).
    sweep_due: bool,
    /// Reclaimed lock heads kept allocated and poisoned ([`Params::poison_heads`]).
    graveyard: Vec<*mut LockHead>,
    /// Reclaimed entries ready for reuse.
    free: Vec<*mut Entry>,
    /// Reclaimed lock heads ready for reuse (unless [`Params::poison_heads`]).
    free_heads: Vec<*mut LockHead>,
    /// Kills refused since the last reclamation attempt (see `may_kill`).
    refused: usize,
    /// Bag size at which the next reclamation attempt runs (a failed attempt, with a gate
    /// held back by a pinned operation, is not repeated on every retirement).
    collect_at: usize,
}

/// A pool slot: `busy` is 1 while an operation owns the slot's local state, 0 when free.
struct Slot {
    busy: AtomicU32,
    /// Lock heads this slot allocated and freed (written only by the slot's occupant, so
    /// without a read-modify-write; a table-wide counter bounced between cores on every
    /// lock once idle heads are killed at unlock).
    heads_made: AtomicUsize,
    heads_freed: AtomicUsize,
    /// Lock heads in this slot's free list (written only by the slot's occupant).
    heads_pooled: AtomicUsize,
    local: UnsafeCell<SlotLocal>,
}

// SAFETY: `local` is only accessed by the thread that claimed the slot with a successful CAS
// of `busy` from 0 (or by `Drop`, which has `&mut`), so it is never accessed concurrently; the
// raw entry and lock-head pointers it stores are owned by the table.
unsafe impl Sync for Slot {}
// SAFETY: as above; the pointers in `local` refer to heap entries owned by the table.
unsafe impl Send for Slot {}

/// A reclamation gate: an epoch and, per epoch parity, the number of operations pinned on
/// it (a counter-based epoch scheme, as in sleepable RCU).
///
/// An operation pins by incrementing the counter of the current epoch's parity and checking
/// that the epoch did not move meanwhile. The epoch advances from `e` to `e + 1` only when no
/// operation of epoch `e - 1` is pinned (the counter of `e + 1`'s parity is zero), so once it
/// reached `r + 2`, every operation pinned at or before epoch `r` has left. Something unlinked
/// before reading epoch `r` is therefore unreachable once the epoch reaches `r + 2`: only
/// operations pinned before the unlink could still hold it.
///
/// The table has one gate per bucket group (in the group's cache line, which a lookup loads
/// anyway) and one table-wide gate for the rare operations that reach lock heads other than
/// through their own bucket (deadlock search, sweeps, statistics). An operation on one lock
/// pins its group's gate only, so a descheduled pinned thread holds back the reclamation of
/// one group in [`BUCKETS`]` / `[`GROUP_BUCKETS`], not of the whole table (with a single
/// table-wide epoch, txbench read-only fell from 260k-300k tps at 2 threads to about 150k at
/// 8: a pinned thread was descheduled nearly all the time, so heads piled up unreclaimed and
/// the pools cycled through thousands of cold ones).
struct Gate {
    epoch: AtomicU32,
    pinned: [AtomicU32; 2],
}

impl Gate {
    fn new() -> Self {
        Gate {
            epoch: AtomicU32::new(0),
            pinned: [AtomicU32::new(0), AtomicU32::new(0)],
        }
    }

    /// Pins an operation; returns the epoch it is counted under.
    fn enter(&self) -> u32 {
        loop {
            let e = self.epoch.load(SeqCst);
            self.pinned[(e & 1) as usize].fetch_add(1, SeqCst);
            if self.epoch.load(SeqCst) == e {
                return e;
            }
            self.pinned[(e & 1) as usize].fetch_sub(1, SeqCst);
        }
    }

    /// Unpins an operation that [`enter`](Self::enter) returned `e` to.
    fn exit(&self, e: u32) {
        self.pinned[(e & 1) as usize].fetch_sub(1, SeqCst);
    }

    /// No operation is pinned.
    fn idle(&self) -> bool {
        self.pinned[0].load(SeqCst) == 0 && self.pinned[1].load(SeqCst) == 0
    }

    /// The caller, pinned under epoch `mine`, is the only operation pinned.
    fn alone(&self, mine: u32) -> bool {
        self.pinned[(mine & 1) as usize].load(SeqCst) == 1
            && self.pinned[(mine.wrapping_add(1) & 1) as usize].load(SeqCst) == 0
    }

    /// Advances the epoch if no operation of the epoch before it is pinned.
    fn try_advance(&self) -> u32 {
        let e = self.epoch.load(SeqCst);
        if self.pinned[(e.wrapping_add(1) & 1) as usize].load(SeqCst) != 0 {
            return e;
        }
        match self
            .epoch
            .compare_exchange(e, e.wrapping_add(1), SeqCst, SeqCst)
        {
            Ok(_) => e.wrapping_add(1),
            Err(now) => now,
        }
    }

    /// Whether the epoch has reached `r + 2` (advancing it if it can): then nothing unlinked
    /// before `r` was read is reachable.
    fn passed(&self, r: u32) -> bool {
        let mut now = self.epoch.load(SeqCst);
        for _ in 0..2 {
            if now.wrapping_sub(r) >= 2 {
                return true;
            }
            now = self.try_advance();
        }
        now.wrapping_sub(r) >= 2
    }
}

/// One cache line of the lock hash table: a reclamation gate and [`GROUP_BUCKETS`] buckets.
#[repr(align(64))]
struct Group {
    gate: Gate,
    buckets: [AtomicPtr<LockHead>; GROUP_BUCKETS],
}

/// An operation pinned on a gate; unpins when dropped.
struct Pin<'a> {
    gate: &'a Gate,
    epoch: u32,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        self.gate.exit(self.epoch);
    }
}

std::thread_local! {
    /// A per-thread starting index for slot claims (any slot is correct; this spreads them).
    static SLOT_HINT: Cell<usize> = const { Cell::new(usize::MAX) };
}

static NEXT_HINT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn slot_hint() -> usize {
    SLOT_HINT.with(|h| {
        if h.get() == usize::MAX {
            h.set(NEXT_HINT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        }
        h.get()
    })
}

fn backoff(step: &mut u32) {
    if *step < 6 {
        for _ in 0..(1u32 << *step) {
            std::hint::spin_loop();
        }
    } else {
        yield_now();
    }
    *step += 1;
}

/// An operation in progress: owns a pool slot and is pinned on the gate of one bucket group
/// (it may reach the lock heads of that group's buckets and their entries), on the
/// table-wide gate (it may reach any), or on none (it only reclaims its slot's bags).
struct Guard<'a> {
    table: &'a LatchFreeLockTable,
    slot: usize,
    /// The bucket group pinned, if any (`None` with a table-wide pin, or none).
    group: Option<usize>,
    pin: Option<Pin<'a>>,
}

impl Guard<'_> {
    #[allow(clippy::mut_from_ref)]
    fn local(&self) -> &mut SlotLocal {
        // SAFETY: this guard claimed the slot (CAS of `busy` from 0), so no other thread
        // touches its `local` until the guard is dropped; callers never hold two of these
        // borrows.
        unsafe { &mut *self.table.slots[self.slot].local.get() }
    }

    /// Counts a lock head this slot allocated (`true`) or freed (`false`).
    fn count_head(&self, made: bool) {
        let slot = &self.table.slots[self.slot];
        let c = if made {
            &slot.heads_made
        } else {
            &slot.heads_freed
        };
        // Only the slot's occupant writes it.
        c.store(c.load(SeqCst).wrapping_add(1), SeqCst);
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        drop(self.pin.take());
        if std::mem::take(&mut self.local().sweep_due) {
            self.table.sweep_step(self);
            drop(self.pin.take());
        }
        self.table.slots[self.slot].busy.store(0, SeqCst);
    }
}

/// What a bucket traversal does after looking at a lock head (see `unlink_dead`).
enum Step {
    /// The head is live: go on.
    Next,
    /// Read the same link again.
    Reload,
    /// The link changed under us: start again from the bucket.
    Restart,
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

    // ---- reclamation (a gate per bucket group, see `Gate`) ----

    /// Claims a free pool slot (its local state is ours until the guard drops).
    fn claim_slot(&self) -> usize {
        let start = slot_hint();
        let mut step = 0;
        loop {
            let n = self.params.slots;
            for i in 0..n {
                let slot = (start + i) % n;
                let busy = &self.slots[slot].busy;
                if busy.load(Relaxed) == 0 && busy.compare_exchange(0, 1, SeqCst, SeqCst).is_ok() {
                    return slot;
                }
            }
            backoff(&mut step);
        }
    }

    /// Starts an operation on the lock heads of bucket `b`'s group (and their entries).
    fn pin(&self, b: usize) -> Guard<'_> {
        let slot = self.claim_slot();
        let group = b / self.per_group;
        let gate = &self.groups[group].gate;
        let epoch = gate.enter();
        Guard {
            table: self,
            slot,
            group: Some(group),
            pin: Some(Pin { gate, epoch }),
        }
    }

    /// Starts an operation that may reach any lock head and entry.
    fn pin_all(&self) -> Guard<'_> {
        let slot = self.claim_slot();
        Guard {
            table: self,
            slot,
            group: None,
            pin: Some(self.enter_all()),
        }
    }

    /// A table-wide pin (for a part of an operation that leaves its bucket group).
    fn enter_all(&self) -> Pin<'_> {
        Pin {
            gate: &self.all,
            epoch: self.all.enter(),
        }
    }

    /// Reclaims in bulk what no running operation can still reach: kills and unlinks every
    /// idle lock head, then claims every idle slot in turn and reclaims its deferred
    /// retirements (Jung §4.4's lazy bulk de-allocation; what a background de-allocator
    /// would run now and then). Safe to call at any time, concurrently with everything else;
    /// deferred retirements of a slot are otherwise only reclaimed by operations using that
    /// slot.
    pub fn reclaim(&self) {
        {
            // Kill and unlink every idle lock head (retired into this guard's slot).
            let g = self.pin_all();
            for b in 0..self.params.buckets {
                self.sweep_bucket(&g, b, true);
            }
            g.local().created = 0;
        }
        for slot in 0..self.slots.len() {
            if self.slots[slot]
                .busy
                .compare_exchange(0, 1, SeqCst, SeqCst)
                .is_ok()
            {
                let g = Guard {
                    table: self,
                    slot,
                    group: None,
                    pin: None,
                };
                self.collect(&g);
                let local = g.local();
                local.collect_at = local.bag.len() + local.heads.len() + self.params.retire_batch;
            }
        }
    }

    /// Whether something unlinked from bucket `b` by `g` now can be reclaimed at once: `g` is
    /// the only operation pinned on the bucket's group, and none is pinned table-wide. Only
    /// operations pinned before the unlink could reach it; a later one starts from the
    /// bucket (or from a live entry, which this was not). Read after the unlink (both are
    /// `SeqCst`), against a pin's increment before its first read.
    fn unreachable_now(&self, g: &Guard<'_>, b: usize) -> bool {
        let group = b / self.per_group;
        match (&g.pin, g.group) {
            (Some(pin), Some(mine)) if mine == group => {
                pin.gate.alone(pin.epoch) && self.all.idle()
            }
            _ => false,
        }
    }

    /// Debug check that `g`, which unlinked something from bucket `b`, is pinned where it
    /// could reach it: on `b`'s group, or table-wide. (Immediate reuse relies on it: an
    /// operation keeps no pointer across an unpin, except a waiter's own live entry and head.)
    fn check_pinned(&self, g: &Guard<'_>, b: usize) {
        debug_assert!(
            g.pin.is_some() && g.group.is_none_or(|grp| grp == b / self.per_group),
            "unlinked from bucket {b} by an operation not pinned on its group"
        );
    }

    /// Defers something unlinked from bucket `b` until its gates have passed.
    fn deferred<T>(&self, ptr: *mut T, b: usize) -> Retired<T> {
        let group = b / self.per_group;
        Retired {
            ptr,
            group,
            group_epoch: self.groups[group].gate.epoch.load(SeqCst),
            all_epoch: self.all.epoch.load(SeqCst),
        }
    }

    /// Hands an entry unlinked from a lock head of bucket `b` to the reclaimer: reused at
    /// once if no other operation can reach it, else once none can.
    fn retire(&self, g: &Guard<'_>, e: *mut Entry, b: usize) {
        self.check_pinned(g, b);
        if self.unreachable_now(g, b) {
            // SAFETY: unlinked, and no other operation is pinned where it could reach it.
            unsafe { self.recycle(g.local(), e) };
            return;
        }
        let r = self.deferred(e, b);
        g.local().bag.push(r);
        self.collect_if_due(g);
    }

    /// Hands a lock head unlinked from bucket `b` to the reclaimer: reclaimed, with the
    /// entries still on its list, at once if no other operation can reach it, else once
    /// none can.
    fn retire_head(&self, g: &Guard<'_>, h: *mut LockHead, b: usize) {
        self.check_pinned(g, b);
        if self.unreachable_now(g, b) {
            // SAFETY: unlinked, and no other operation is pinned where it could reach it.
            unsafe { self.reclaim_head(g, h) };
            return;
        }
        let r = self.deferred(h, b);
        g.local().heads.push(r);
        self.collect_if_due(g);
    }

    /// Runs a reclamation once the slot's bags have grown by a batch since the last one.
    fn collect_if_due(&self, g: &Guard<'_>) {
        let local = g.local();
        if local.heads.len() + local.bag.len() >= local.collect_at.max(self.params.retire_batch) {
            self.collect(g);
            let local = g.local();
            local.collect_at = local.bag.len() + local.heads.len() + self.params.retire_batch;
        }
    }

    /// Counts a lock head this slot created; every `sweep_every` of them, a sweep step is
    /// due at the end of the operation.
    fn created_head(&self, g: &Guard<'_>) {
        let local = g.local();
        local.created += 1;
        if local.created >= self.params.sweep_every {
            local.created = 0;
            local.sweep_due = true;
        }
    }

    /// A sweep step over the next `sweep_buckets` buckets, pinning each bucket's group in
    /// turn (`g` is unpinned; it is left pinned on the last group visited). Pinning group by
    /// group rather than table-wide keeps a sweeper that is descheduled mid-step from holding
    /// back the reclamation of the whole table.
    fn sweep_step<'a>(&'a self, g: &mut Guard<'a>) {
        let n = self.params.sweep_buckets;
        let start = self.sweep_cursor.fetch_add(n, SeqCst);
        for i in 0..n {
            if !self.may_kill(g) {
                return;
            }
            let b = start.wrapping_add(i) % self.params.buckets;
            let group = b / self.per_group;
            if g.group != Some(group) || g.pin.is_none() {
                drop(g.pin.take());
                let gate = &self.groups[group].gate;
                g.pin = Some(Pin {
                    gate,
                    epoch: gate.enter(),
                });
                g.group = Some(group);
            }
            self.sweep_bucket(g, b, true);
        }
    }

    /// Whether this slot may kill idle lock heads now: only while fewer than
    /// [`KILL_BACKLOG`] of the heads it retired wait for reclamation. When the limit is
    /// reached it tries a reclamation first (at most once every [`RETIRE_BATCH`] refusals, as
    /// a reclamation visits every deferred head).
    fn may_kill(&self, g: &Guard<'_>) -> bool {
        let local = g.local();
        if local.heads.len() < KILL_BACKLOG {
            return true;
        }
        local.refused += 1;
        if local.refused < self.params.retire_batch {
            return false;
        }
        local.refused = 0;
        self.collect(g);
        g.local().heads.len() < KILL_BACKLOG
    }

    /// Whether a deferred retirement is unreachable now: both its gates have passed.
    fn passed<T>(&self, r: &Retired<T>) -> bool {
        self.all.passed(r.all_epoch) && self.groups[r.group].gate.passed(r.group_epoch)
    }

    /// Reclaims the deferred entries and lock heads of this slot that no operation can reach
    /// any more (advancing the gates where it can). It visits every deferred one: they are
    /// few unless operations stay pinned table-wide, and the groups' gates pass in no order.
    fn collect(&self, g: &Guard<'_>) {
        let local = g.local();
        let mut heads = std::mem::take(&mut local.heads);
        heads.retain(|r| {
            if !self.passed(r) {
                return true;
            }
            // SAFETY: unlinked, and both gates passed: no pinned operation can reach it.
            unsafe { self.reclaim_head(g, r.ptr) };
            false
        });
        let local = g.local();
        debug_assert!(local.heads.is_empty(), "reclaiming a head retires nothing");
        local.heads = heads;
        let mut bag = std::mem::take(&mut local.bag);
        bag.retain(|r| {
            if !self.passed(r) {
                return true;
            }
            // SAFETY: unlinked, and both gates passed: no pinned operation can reach it.
            unsafe { self.recycle(g.local(), r.ptr) };
            false
        });
        g.local().bag = bag;
    }

    /// Reclaims an unlinked lock head and the entries still on its list: into the slot's
    /// pools (or the graveyard with [`Params::poison_heads`]).
    ///
    /// # Safety
    ///
    /// `hp` was unlinked from its bucket and no operation can reach it (nor an entry on its
    /// list: entries are reached through their lock head, or through the waiting registry,
    /// which holds live entries only, and a dead head has none); it came from
    /// `Box::into_raw`.
    unsafe fn reclaim_head(&self, g: &Guard<'_>, hp: *mut LockHead) {
        let local = g.local();
        // SAFETY: the caller's guarantee.
        let h = unsafe { &*hp };
        let mut cur = h.first.load(SeqCst);
        while !cur.is_null() {
            // SAFETY: as above, the entries still linked on the list are unreachable;
            // each is linked once (unlinked ones are in some bag or pool instead).
            let next = unmarked(unsafe { &*cur }.next.load(SeqCst));
            // SAFETY: as above.
            unsafe { self.recycle(local, cur) };
            cur = next;
        }
        g.count_head(false);
        if self.params.poison_heads {
            h.poison.store(1, SeqCst);
            local.graveyard.push(hp);
        } else {
            self.pool_head(g, local, hp);
        }
    }

    /// Puts a reclaimed entry on the slot's free list (poisoned), or deallocates it beyond
    /// [`Params::free_cap`].
    ///
    /// # Safety
    ///
    /// `e` came from `Box::into_raw` in `alloc` and no thread can reach it any more.
    unsafe fn recycle(&self, local: &mut SlotLocal, e: *mut Entry) {
        if local.free.len() < self.params.free_cap {
            // SAFETY: the caller guarantees `e` is live and unreachable: ours alone.
            unsafe { &*e }.state.store(POISON | OBSOLETE, SeqCst);
            local.free.push(e);
        } else {
            // SAFETY: as above, and it came from `Box::into_raw` (the caller's guarantee).
            drop(unsafe { Box::from_raw(e) });
            self.allocated.fetch_sub(1, SeqCst);
        }
    }

    /// A fresh entry owned by the caller, initialised and not yet linked.
    fn alloc(&self, g: &Guard<'_>, txn: TxnId, state: u32, head: &LockHead) -> *mut Entry {
        let local = g.local();
        // Reuse the oldest free entry first (a stale reference, were there one, would meet a
        // poisoned entry rather than a recycled one).
        let e = match (!local.free.is_empty()).then(|| local.free.swap_remove(0)) {
            Some(e) => e,
            None => {
                // Bulk pre-allocation (Jung §4.3), on demand.
                local
                    .free
                    .extend((1..ALLOC_BATCH).map(|_| Box::into_raw(Box::new(Entry::blank()))));
                self.allocated.fetch_add(ALLOC_BATCH, SeqCst);
                Box::into_raw(Box::new(Entry::blank()))
            }
        };
        // SAFETY: `e` is from the free list or fresh: unreachable by any other thread.
        let entry = unsafe { &*e };
        entry.txn.store(txn, SeqCst);
        entry.state.store(state, SeqCst);
        let (age, pipe) = if self.deadlocks.needs_blocker_ages() {
            (age_of(txn), pipeline_len().min(u64::from(u32::MAX)) as u32)
        } else {
            (0, 0)
        };
        entry.age.store(age, SeqCst);
        entry.pipe.store(pipe, SeqCst);
        entry.next.store(ptr::null_mut(), SeqCst);
        entry
            .head
            .store(head as *const LockHead as *mut LockHead, SeqCst);
        // SAFETY: exclusive ownership (see above).
        unsafe { *entry.thread.get() = Some(current()) };
        e
    }

    // ---- hash table and lists ----

    /// The hash of `id` that picks its bucket and is kept in its lock head.
    fn hash(id: &LockId) -> u64 {
        FxBuildHasher
            .hash_one(id)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// The bucket of a lock head of hash `hash`: a group from the high bits, a bucket of
    /// the group from other bits.
    fn bucket_of(&self, hash: u64) -> usize {
        let group = (hash >> 32) as usize & (self.groups.len() - 1);
        group * self.per_group + (hash >> 8) as usize % self.per_group
    }

    /// Bucket `b` (an index below `params.buckets`).
    fn bucket(&self, b: usize) -> &AtomicPtr<LockHead> {
        &self.groups[b / self.per_group].buckets[b % self.per_group]
    }

    /// Starts an operation on `id`'s lock head: pinned on its bucket's group. Returns the
    /// id's hash too, for [`find_head`](Self::find_head).
    fn pin_id(&self, id: &LockId) -> (Guard<'_>, u64) {
        let hash = Self::hash(id);
        (self.pin(self.bucket_of(hash)), hash)
    }

    fn tag_floor(&self, bucket: usize) -> &AtomicU64 {
        &self.tag_floor[bucket % self.tag_floor.len()]
    }

    /// Helps unlink the lock head `h` = `cur`, read from `link`, if it is dead (Michael's
    /// list): marks its `next` (so nothing is appended after it or unlinked through it any
    /// more), then unlinks it with a CAS on `link`, and the thread whose CAS succeeds retires
    /// it.
    fn unlink_dead(
        &self,
        g: &Guard<'_>,
        link: &AtomicPtr<LockHead>,
        cur: *mut LockHead,
        h: &LockHead,
    ) -> Step {
        if !h.is_dead() {
            return Step::Next;
        }
        let next = h.next.load(SeqCst);
        if !is_marked(next) {
            // Fails only if `next` changed (an append after `h`, or its successor unlinked):
            // then try again.
            let _ = h.next.compare_exchange(next, marked(next), SeqCst, SeqCst);
            return Step::Reload;
        }
        if link
            .compare_exchange(cur, unmarked(next), SeqCst, SeqCst)
            .is_ok()
        {
            self.retire_head(g, cur, self.bucket_of(h.hash));
            Step::Reload
        } else {
            Step::Restart
        }
    }

    /// Kills `h` if every request on it is obsolete: marks its tail with a CAS from the tail
    /// read before the check, so that no request was appended since (an appender's CAS of the
    /// tail fails on a marked one). Folds its tag into the bucket's tag floor first.
    fn try_kill(&self, h: &LockHead, bucket: usize) -> bool {
        let t = h.tail.load(SeqCst);
        if t.is_null() || is_marked(t) {
            // Empty: its creator is about to append. Or already dead.
            return false;
        }
        // An obsolete entry never becomes live again (only a fresh, unlinked one is), so
        // entries up to `t` found obsolete stay so.
        let mut idle = true;
        self.walk(h, |e| {
            idle &= e.state.load(SeqCst) & OBSOLETE != 0;
            idle && !ptr::eq(e, t)
        });
        if !idle {
            return false;
        }
        // Tags are raised only by the holder of a live entry (before it becomes obsolete), so
        // the tag is final if the CAS below succeeds. Raised first, so that a lookup that
        // skips the dead head then reads a floor covering its tag.
        self.tag_floor(bucket).fetch_max(h.tag.load(SeqCst), SeqCst);
        h.tail
            .compare_exchange(t, marked(t), SeqCst, SeqCst)
            .is_ok()
    }

    /// Unlinks every dead lock head of bucket `b`, killing the idle ones first if `kill`.
    fn sweep_bucket(&self, g: &Guard<'_>, b: usize, kill: bool) {
        debug_assert!(g.group.is_none() || g.group == Some(b / self.per_group));
        let bucket = self.bucket(b);
        'restart: loop {
            let mut link = bucket;
            loop {
                let cur = unmarked(link.load(SeqCst));
                if cur.is_null() {
                    return;
                }
                // SAFETY: reached from the bucket while pinned: not freed before we unpin.
                let h = unsafe { &*cur };
                match self.unlink_dead(g, link, cur, h) {
                    Step::Next => {}
                    Step::Reload => continue,
                    Step::Restart => continue 'restart,
                }
                if kill && self.try_kill(h, b) {
                    continue; // unlink it
                }
                link = &h.next;
            }
        }
    }

    /// The live lock head of `id`, appended to its bucket with a CAS if `create` and missing.
    /// Must be pinned (the head stays allocated while the guard lives). Skips dead heads and
    /// helps unlink them. There is at most one live head per id: a new one is appended only
    /// by a traversal that reached the end of the bucket without seeing a live one, and a
    /// dead head never comes back to life.
    fn find_head(&self, g: &Guard<'_>, id: &LockId, hash: u64, create: bool) -> Option<&LockHead> {
        let b = self.bucket_of(hash);
        debug_assert!(g.group.is_none() || g.group == Some(b / self.per_group));
        let bucket = self.bucket(b);
        let mut fresh: *mut LockHead = ptr::null_mut();
        'restart: loop {
            let mut link = bucket;
            loop {
                let raw = link.load(SeqCst);
                let cur = unmarked(raw);
                if cur.is_null() {
                    if !create {
                        return None;
                    }
                    if is_marked(raw) {
                        continue 'restart; // the last head is dead: nothing goes after it
                    }
                    if fresh.is_null() {
                        fresh = self.new_head(g, hash, id);
                    }
                    if link
                        .compare_exchange(ptr::null_mut(), fresh, SeqCst, SeqCst)
                        .is_ok()
                    {
                        g.count_head(true);
                        self.created_head(g);
                        // SAFETY: just published; freed only after being killed (it has no
                        // request yet, so it is not killed before its creator appends) and
                        // two epochs after being unlinked, and we are pinned.
                        return Some(unsafe { &*fresh });
                    }
                    continue; // someone appended: look at their head
                }
                // SAFETY: reached from the bucket while pinned: not freed before we unpin.
                let h = unsafe { &*cur };
                match self.unlink_dead(g, link, cur, h) {
                    Step::Next => {}
                    Step::Reload => continue,
                    Step::Restart => continue 'restart,
                }
                if h.hash == hash && h.id == *id {
                    if !fresh.is_null() {
                        // `fresh` was never published: back to the pool.
                        self.pool_head(g, g.local(), fresh);
                    }
                    return Some(h);
                }
                link = &h.next;
            }
        }
    }

    /// An unpublished lock head for `id`, owned by the caller: a reclaimed one from the slot's
    /// pool (its key buffer reused when the length matches), else a fresh allocation.
    fn new_head(&self, g: &Guard<'_>, hash: u64, id: &LockId) -> *mut LockHead {
        let local = g.local();
        let Some(hp) = local.free_heads.pop() else {
            return Box::into_raw(Box::new(LockHead {
                hash,
                id: id.clone(),
                next: AtomicPtr::new(ptr::null_mut()),
                first: AtomicPtr::new(ptr::null_mut()),
                tail: AtomicPtr::new(ptr::null_mut()),
                tag: AtomicU64::new(0),
                poison: AtomicU32::new(0),
            }));
        };
        self.slots[g.slot]
            .heads_pooled
            .store(local.free_heads.len(), Relaxed);
        // SAFETY: a pooled head was reclaimed (no pinned operation can reach it) or never
        // published: this slot's occupant owns it exclusively.
        let h = unsafe { &mut *hp };
        h.hash = hash;
        match (&mut h.id, id) {
            (LockId::Key(t, k), LockId::Key(nt, nk)) if k.len() == nk.len() => {
                *t = *nt;
                k.copy_from_slice(nk);
            }
            (old, _) => *old = id.clone(),
        }
        h.next.store(ptr::null_mut(), SeqCst);
        h.first.store(ptr::null_mut(), SeqCst);
        h.tail.store(ptr::null_mut(), SeqCst);
        h.tag.store(0, SeqCst);
        hp
    }

    /// Keeps the unreachable lock head `hp` in the slot's pool for reuse, or frees it beyond
    /// [`Params::free_cap`]. `hp` came from `Box::into_raw` and is owned by the caller: never
    /// published, or reclaimed (no pinned operation can reach it).
    fn pool_head(&self, g: &Guard<'_>, local: &mut SlotLocal, hp: *mut LockHead) {
        if local.free_heads.len() < self.params.free_cap {
            local.free_heads.push(hp);
            // Read only by `pooled_heads` (statistics): no ordering needed.
            self.slots[g.slot]
                .heads_pooled
                .store(local.free_heads.len(), Relaxed);
        } else {
            // SAFETY: the caller's guarantee above.
            drop(unsafe { Box::from_raw(hp) });
        }
    }

    /// Visits every lock head linked in a bucket, live or dead. Must be pinned (or own the
    /// table).
    fn for_each_head(&self, mut f: impl FnMut(&LockHead)) {
        for b in self
            .groups
            .iter()
            .flat_map(|g| &g.buckets[..self.per_group])
        {
            let mut cur = unmarked(b.load(SeqCst));
            while !cur.is_null() {
                // SAFETY: reached from a bucket while pinned: not freed before we unpin.
                let h = unsafe { &*cur };
                h.check();
                f(h);
                cur = unmarked(h.next.load(SeqCst));
            }
        }
    }

    /// Appends `e` at the tail of `h`'s request list (Jung Fig. 4): CAS the tail, then link
    /// the old tail to `e`. Between the two steps the list is half-linked; `walk` waits.
    /// Fails (returns false, `e` stays unlinked) if `h` is dead: look the head up again.
    fn append(&self, h: &LockHead, e: *mut Entry) -> bool {
        let mut step = 0;
        let old = loop {
            let t = h.tail.load(SeqCst);
            if is_marked(t) {
                return false;
            }
            if h.tail.compare_exchange(t, e, SeqCst, SeqCst).is_ok() {
                break t;
            }
            backoff(&mut step);
        };
        h.check();
        if old.is_null() {
            h.first.store(e, SeqCst);
        } else {
            // SAFETY: `old` is the previous tail; the last entry of a list is never unlinked,
            // so it is still allocated.
            unsafe { &*old }.next.store(e, SeqCst);
        }
        true
    }

    /// Visits the entries of `h` in list order until `f` returns false. Must be pinned. Waits
    /// for a half-linked tail to be linked (Jung Fig. 5), so every entry appended before the
    /// walk reached the end is visited.
    fn walk(&self, h: &LockHead, mut f: impl FnMut(&Entry) -> bool) {
        h.check();
        let mut step = 0;
        let mut cur = h.first.load(SeqCst);
        while cur.is_null() {
            if h.tail.load(SeqCst).is_null() {
                return; // empty
            }
            backoff(&mut step); // first append half-done
            cur = h.first.load(SeqCst);
        }
        loop {
            // SAFETY: reached from the list while pinned: not recycled before we unpin.
            let e = unsafe { &*cur };
            debug_assert!(
                e.state.load(SeqCst) & POISON == 0,
                "reached a reclaimed entry"
            );
            if !f(e) {
                return;
            }
            let mut next = unmarked(e.next.load(SeqCst));
            debug_assert!(
                e.state.load(SeqCst) & POISON == 0,
                "an entry was reclaimed while a walk stood on it"
            );
            while next.is_null() {
                if unmarked(h.tail.load(SeqCst)) == cur {
                    return;
                }
                backoff(&mut step); // half-linked tail
                next = unmarked(e.next.load(SeqCst));
            }
            cur = next;
        }
    }

    /// Walks `h`'s list like [`walk`](Self::walk) (visiting every entry, `f` returns nothing)
    /// and unlinks the obsolete entries it passes, in the manner of Harris' list: an obsolete
    /// entry that is not the last one gets its `next` pointer marked (so nothing can be
    /// unlinked through it any more), then is unlinked with a CAS on its predecessor's
    /// unmarked link (or the list head) and retired by whoever's CAS succeeds. The last entry
    /// is never unlinked, so unlinking never races with an append (which only writes a null
    /// `next`). Jung §4.5 advances only the list head; this also cleans the middle.
    fn walk_clean(&self, g: &Guard<'_>, h: &LockHead, mut f: impl FnMut(&Entry)) {
        h.check();
        let mut step = 0;
        let mut link: &AtomicPtr<Entry> = &h.first;
        let mut cur = h.first.load(SeqCst);
        while cur.is_null() {
            if h.tail.load(SeqCst).is_null() {
                return; // empty
            }
            backoff(&mut step); // first append half-done
            cur = h.first.load(SeqCst);
        }
        loop {
            // SAFETY: reached from the list while pinned: not recycled before we unpin.
            let e = unsafe { &*cur };
            let state = e.state.load(SeqCst);
            debug_assert!(state & POISON == 0, "reached a reclaimed entry");
            f(e);
            let mut raw = e.next.load(SeqCst);
            while raw.is_null() {
                if unmarked(h.tail.load(SeqCst)) == cur {
                    return;
                }
                backoff(&mut step); // half-linked tail
                raw = e.next.load(SeqCst);
            }
            let next = unmarked(raw);
            if state & OBSOLETE != 0 {
                // Freeze `next` by marking it (or find it marked, hence frozen). If the mark
                // fails, `next` was just changed (its successor was unlinked): leave `e` for a
                // later pass rather than relink a removed entry.
                let frozen = raw != next
                    || e.next
                        .compare_exchange(raw, marked(raw), SeqCst, SeqCst)
                        .is_ok();
                if frozen && link.compare_exchange(cur, next, SeqCst, SeqCst).is_ok() {
                    self.retire(g, cur, self.bucket_of(h.hash));
                    cur = next;
                    continue; // `link` now points to `next`
                }
            }
            link = &e.next;
            cur = next;
        }
    }

    /// The live entry of `txn` on `h`.
    fn find_entry(&self, h: &LockHead, txn: TxnId) -> Option<*mut Entry> {
        let mut found = None;
        self.walk(h, |e| {
            if e.state.load(SeqCst) & OBSOLETE == 0 && e.txn.load(SeqCst) == txn {
                found = Some(e as *const Entry as *mut Entry);
                return false;
            }
            true
        });
        found
    }

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

    // ---- deadlock detection ----

    fn register_waiter(&self, txn: TxnId, e: *mut Entry) -> Option<usize> {
        let n = self.waiting.len();
        let start = (txn as usize).wrapping_mul(0x9E37_79B9) % n;
        (0..n).map(|i| (start + i) % n).find(|&i| {
            self.waiting[i]
                .compare_exchange(ptr::null_mut(), e, SeqCst, SeqCst)
                .is_ok()
        })
    }

    /// The waiting entry of `txn`, if registered. Must be pinned.
    fn waiting_entry(&self, txn: TxnId) -> Option<&Entry> {
        let n = self.waiting.len();
        let start = (txn as usize).wrapping_mul(0x9E37_79B9) % n;
        (0..n).find_map(|i| {
            let p = self.waiting[(start + i) % n].load(SeqCst);
            if p.is_null() {
                return None;
            }
            // SAFETY: a registered entry is live; it is unregistered before it can become
            // obsolete, and it is not recycled while we are pinned.
            let e = unsafe { &*p };
            (e.txn.load(SeqCst) == txn).then_some(e)
        })
    }

    /// The transactions blocking the waiting entry `e` (empty if it does not wait).
    fn blockers(&self, e: &Entry) -> Vec<TxnId> {
        let mut out = Vec::new();
        self.for_each_blocker(e, |o| out.push(o.txn.load(SeqCst)));
        out
    }

    /// The transactions blocking the waiting entry `e`, with the ages and pipeline lengths
    /// their entries recorded, for the shared policies' decisions.
    fn blocker_set(&self, e: &Entry, out: &mut Vec<Blocker>) {
        out.clear();
        self.for_each_blocker(e, |o| {
            out.push(Blocker {
                txn: o.txn.load(SeqCst),
                age: o.age.load(SeqCst),
                pipe: o.pipe.load(SeqCst),
            })
        });
    }

    /// Calls `f` with each live entry blocking the waiting entry `e` (none if it does not
    /// wait): Kimura's rule, as in `evaluate`. Must be pinned where `e`'s lock head is.
    fn for_each_blocker(&self, e: &Entry, mut f: impl FnMut(&Entry)) {
        let s = e.state.load(SeqCst);
        if s & WAITING == 0 || s & OBSOLETE != 0 {
            return;
        }
        let (target, new) = (requested_of(s), granted_of(s) == LockMode::N);
        // SAFETY: `e` was live (not obsolete) when its state was read above, and we were
        // pinned then: a lock head with a live entry is not killed, so it is retired (if ever)
        // after that read and stays allocated while we are pinned.
        let h = unsafe { &*e.head.load(SeqCst) };
        let mut ahead = true;
        self.walk(h, |o| {
            if ptr::eq(o, e) {
                ahead = false;
                return true;
            }
            let so = o.state.load(SeqCst);
            if so & OBSOLETE == 0
                && (!granted_of(so).compatible(target)
                    || (new && ahead && so & WAITING != 0 && !requested_of(so).compatible(target)))
            {
                f(o);
            }
            true
        });
    }

    /// Wakes `txn` if it waits (registered): a policy decided it should decide again now.
    fn wake_txn(&self, txn: TxnId) {
        // The registry reaches other groups' lock heads' entries.
        let _all = self.enter_all();
        if let Some(e) = self.waiting_entry(txn) {
            e.unpark();
        }
    }

    /// Searches the waits-for relation from `me`'s waiting entry through the lock lists and
    /// the waiting registry (bounded). On a cycle on which `me` is the youngest (largest id)
    /// transaction, returns the transaction `me` waits for on it: `me` is the victim. On a
    /// cycle with a younger member, unparks that member so that it runs its own search at
    /// once and aborts itself.
    fn deadlock_victim(&self, me: TxnId, e: &Entry) -> Option<TxnId> {
        // The search reaches other groups' lock heads (through the waiting registry).
        let _all = self.enter_all();
        let mut budget = DEADLOCK_BUDGET;
        let mut visited = Vec::new();
        let mut path = Vec::new();
        let mut youngest = Vec::new();
        let victim = self.dfs(me, e, &mut path, &mut visited, &mut budget, &mut youngest);
        if victim.is_none() {
            for y in youngest {
                if let Some(ye) = self.waiting_entry(y) {
                    ye.unpark();
                }
            }
        }
        victim
    }

    fn dfs(
        &self,
        me: TxnId,
        e: &Entry,
        path: &mut Vec<TxnId>,
        visited: &mut Vec<TxnId>,
        budget: &mut u32,
        youngest: &mut Vec<TxnId>,
    ) -> Option<TxnId> {
        for b in self.blockers(e) {
            if b == me {
                match path.iter().max() {
                    Some(&y) if y > me => {
                        if !youngest.contains(&y) {
                            youngest.push(y);
                        }
                    }
                    _ => return Some(*path.first().unwrap_or(&me)),
                }
                continue;
            }
            if visited.contains(&b) || path.len() >= DEADLOCK_DEPTH || *budget == 0 {
                continue;
            }
            visited.push(b);
            *budget -= 1;
            if let Some(be) = self.waiting_entry(b) {
                path.push(b);
                let r = self.dfs(me, be, path, visited, budget, youngest);
                path.pop();
                if r.is_some() {
                    return r;
                }
            }
        }
        None
    }

    // ---- acquire ----

    /// `lock` (`timeout = Some`) and `try_lock` (`None`).
    fn acquire(
        &self,
        txn: TxnId,
        id: &LockId,
        mode: LockMode,
        timeout: Option<Duration>,
    ) -> Result<LockMode, LockFailure> {
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
                    debug_assert!(s & WAITING == 0, "one lock call per transaction at a time");
                    let held = granted_of(s);
                    if held.covers(mode) {
                        return Ok(held);
                    }
                    let target = held.supremum(mode);
                    if timeout.is_none()
                        && !matches!(
                            self.evaluate(h, e, txn, target, false, false),
                            Verdict::Grant
                        )
                    {
                        return Err(LockFailure::WouldBlock);
                    }
                    entry.state.store(pack(held, target, WAITING), SeqCst);
                    // Our live entry keeps `h` from being killed.
                    break (h, e, held, target, false);
                }
                None => {
                    if mode == LockMode::N {
                        return Ok(LockMode::N);
                    }
                    if timeout.is_none()
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
        let mut decider = (timeout.is_some() && self.deadlocks.decides())
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
                    entry.state.store(pack(target, target, 0), SeqCst);
                    if let Some(i) = registered {
                        self.waiting[i].store(ptr::null_mut(), SeqCst);
                    }
                    return Ok(target);
                }
                // Back off; others may have blocked on our tentative mode: wake them.
                entry.state.store(waiting, SeqCst);
                fence(SeqCst);
                self.wake(&guard, h, e, bit(target));
            }
            let blocker = match verdict {
                Verdict::Blocked(b) => Some(b),
                _ => None,
            };
            let failure = match timeout {
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
                entry.state.store(done, SeqCst);
                fence(SeqCst);
                self.wake(&guard, h, e, bit(target));
                drop(decider);
                return Err(f);
            }
            let mut nap = timeout.unwrap_or_default().saturating_sub(start.elapsed());
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
}

impl LockTable for LatchFreeLockTable {
    fn footprint(&self) -> LockTableFootprint {
        LockTableFootprint {
            heads: self.allocated_heads() + self.pooled_heads(),
            entries: self.allocated_entries(),
        }
    }

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

    fn unlock_tagged(&self, txn: TxnId, id: &LockId, tag: u64) {
        let (guard, hash) = self.pin_id(id);
        let Some(h) = self.find_head(&guard, id, hash, false) else {
            return;
        };
        let Some(e) = self.find_entry(h, txn) else {
            return;
        };
        h.tag.fetch_max(tag, SeqCst);
        // SAFETY: our own live entry.
        let entry = unsafe { &*e };
        let s = entry.state.load(SeqCst);
        // Release (Jung Fig. 3 R2-R11): mark obsolete, fence, wake the waiters it blocked.
        entry.state.store(s | OBSOLETE, SeqCst);
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
