//! The simple lock table of the engine-core issue: a sharded hash table from [`LockId`] to a
//! FIFO request queue, one mutex per shard.
//!
//! * **Sharding.** [`SHARD_COUNT`] shards, each a cache-padded `parking_lot::Mutex` around a
//!   hash table of lock entries; the shard is picked by a (re-mixed) Fx hash of the lock id,
//!   within a window of the shards that depends on the table for key locks (see `shard`).
//!   The id is hashed once: the same hash picks the shard and probes the shard's table.
//!   An entry (the lock's name and its queue) is at most a cache line: a key of up to
//!   [`INLINE_KEY`] bytes is copied into it (a longer one is boxed), and the queue's first
//!   request lives in it, so an uncontended lock allocates nothing. A shard's first entry
//!   lives in the shard, next to its mutex (the shard mostly holds one lock or none): an
//!   uncontended acquire or release then touches only the shard's 128 bytes; further
//!   entries go to the shard's hash table, one cache line each. A request records only what
//!   every policy needs; the thread handle of a waiting request, and the queue's second and
//!   later requests, live in a separate allocation made when a second request arrives; the age
//!   and flush-pipeline length of a request are read (thread-locals) only under the policies
//!   that decide by them (wait-die, wound-wait, Dreadlocks). A queue is removed as soon as it
//!   holds no request, so memory stays bounded by the live requests.
//! * **Queues and grants.** Requests are kept in arrival order, each with a granted mode (`N`
//!   while a new request waits) and a requested mode. Grants follow Kimura et al. 2012 §4.2:
//!   a *new* request is granted iff its mode is compatible with every other request's granted
//!   mode and with the requested mode of every still-waiting request ahead of it (FIFO); a
//!   *conversion* (the transaction already holds the lock; the target is the supremum of held
//!   and asked) is granted iff compatible with every other request's granted mode. A waiting
//!   conversion keeps its place, so later new requests treat its requested mode as blocking.
//! * **Waiting.** A blocked caller stores its thread handle with its queue, checks for a
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

use std::hash::Hasher;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use hashbrown::hash_table::HashTable;
use parking_lot::{Mutex, MutexGuard};
use rustc_hash::{FxHashMap, FxHashSet, FxHasher};

use super::deadlock::{Blocker, Deadlocks, Decision};
use super::dread::{age_of, epoch_of, fingerprint, pipeline_of};
use super::{
    DeadlockPolicy, Granted, LockFailure, LockId, LockMode, LockTable, TableId, TaggedGrant, TxnId,
    Victim,
};

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

/// Longest key (in bytes) whose lock name is stored in its entry without an allocation.
pub const INLINE_KEY: usize = 16;
// `Name::of` and `Name::is` take a short key's bytes from `LockKey::head16`.
const _: () = assert!(INLINE_KEY == 16 && INLINE_KEY <= super::LockKey::INLINE);

/// One transaction's request on one lock.
#[derive(Clone, Copy)]
struct Request {
    txn: TxnId,
    /// The transaction's age, the timestamp of wait-die and wound-wait (see `dread::set_age`).
    /// Recorded only under the policies that read it ([`Deadlocks::needs_blocker_ages`]);
    /// else the id.
    age: TxnId,
    /// The requesting thread's flush-pipeline length when it asked (victim policies).
    /// Recorded only under the policies that read it; else 0.
    pipe: u16,
    /// Its transaction's early releases when it asked (recorded like `age`): with the id,
    /// its Dreadlocks fingerprint (`dread::fingerprint`). Two 16-bit fields keep a request
    /// at 24 bytes, and a shard's first lock in the shard's own two cache lines.
    epoch: u16,
    /// Mode held (`N` while a new request waits).
    granted: LockMode,
    /// Mode asked for; equals `granted` unless waiting.
    requested: LockMode,
    waiting: bool,
    /// The waits-for graph holds an entry for `txn` written by this request.
    in_graph: bool,
}

const _: () = assert!(std::mem::size_of::<Request>() <= 24);

/// The requests of a queue that has had more than one at a time (a waiting request always
/// has another one ahead of it, so only these queues ever have waiters).
#[derive(Default)]
struct Crowd {
    reqs: Vec<Request>,
    /// Number of requests with `waiting` set.
    waiting: u32,
    /// The threads of the waiting requests, unparked when they are granted.
    threads: Vec<(TxnId, Thread)>,
}

impl Crowd {
    fn take_thread(&mut self, txn: TxnId) -> Option<Thread> {
        let i = self.threads.iter().position(|&(t, _)| t == txn)?;
        Some(self.threads.swap_remove(i).1)
    }
}

/// The requests on one lock, in arrival order.
enum Reqs {
    Empty,
    /// The one request of an uncontended lock, inline in the entry.
    One(Request),
    Many(Box<Crowd>),
}

/// The queue of one lock.
struct Queue {
    reqs: Reqs,
    /// Highest commit LSN of an early-released exclusive lock (safe SX-ELR, Kimura §5.3).
    tag: u64,
}

thread_local! {
    /// `unlock_all`'s (shard, hash, index) list, kept for the thread's next release.
    static SPARE_ORDER: std::cell::Cell<Vec<(usize, u64, usize)>> =
        const { std::cell::Cell::new(Vec::new()) };
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
    fn reqs(&self) -> &[Request] {
        match &self.reqs {
            Reqs::Empty => &[],
            Reqs::One(r) => std::slice::from_ref(r),
            Reqs::Many(c) => &c.reqs,
        }
    }

    fn reqs_mut(&mut self) -> &mut [Request] {
        match &mut self.reqs {
            Reqs::Empty => &mut [],
            Reqs::One(r) => std::slice::from_mut(r),
            Reqs::Many(c) => &mut c.reqs,
        }
    }

    /// Number of requests with `waiting` set.
    fn waiting(&self) -> u32 {
        match &self.reqs {
            Reqs::Many(c) => c.waiting,
            _ => 0,
        }
    }

    /// The queue's crowd, made (with the inline request moved into it) if it has none yet.
    fn crowd(&mut self) -> &mut Crowd {
        if !matches!(self.reqs, Reqs::Many(_)) {
            let mut reqs = Vec::with_capacity(4);
            if let Reqs::One(r) = self.reqs {
                reqs.push(r);
            }
            self.reqs = Reqs::Many(Box::new(Crowd {
                reqs,
                ..Crowd::default()
            }));
        }
        match &mut self.reqs {
            Reqs::Many(c) => c,
            _ => unreachable!("the crowd was just made"),
        }
    }

    /// Appends a granted request.
    fn push(&mut self, r: Request) {
        debug_assert!(!r.waiting);
        if let Reqs::Empty = self.reqs {
            self.reqs = Reqs::One(r);
        } else {
            self.crowd().reqs.push(r);
        }
    }

    /// Appends a waiting request of the thread `t`.
    fn push_waiting(&mut self, r: Request, t: Thread) {
        debug_assert!(r.waiting);
        let c = self.crowd();
        c.reqs.push(r);
        c.threads.push((r.txn, t));
        c.waiting += 1;
    }

    /// Removes the request at `p`; returns it and its thread if it waited.
    fn remove(&mut self, p: usize) -> (Request, Option<Thread>) {
        match &mut self.reqs {
            Reqs::Many(c) => {
                let r = c.reqs.remove(p);
                let t = if r.waiting {
                    c.waiting -= 1;
                    c.take_thread(r.txn)
                } else {
                    None
                };
                (r, t)
            }
            _ => {
                let r = self.reqs()[p];
                self.reqs = Reqs::Empty;
                (r, None)
            }
        }
    }

    fn position(&self, txn: TxnId) -> Option<usize> {
        self.reqs().iter().position(|r| r.txn == txn)
    }

    /// Mask of the granted modes of all requests but `skip`.
    fn granted_mask_except(&self, skip: usize) -> u16 {
        self.reqs()
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != skip)
            .fold(0, |m, (_, r)| m | r.granted.bit())
    }

    /// Mask of the modes blocking a new request appended at the tail: every granted mode and
    /// every waiting request's requested mode.
    fn tail_blocking_mask(&self) -> u16 {
        self.reqs().iter().fold(0, |m, r| {
            m | r.granted.bit() | if r.waiting { r.requested.bit() } else { 0 }
        })
    }

    /// The transactions blocking the waiting request at `i`.
    fn blockers(&self, i: usize) -> impl Iterator<Item = TxnId> + '_ {
        let reqs = self.reqs();
        let me = &reqs[i];
        let (m, new) = (me.requested, me.granted == LockMode::N);
        reqs.iter().enumerate().filter_map(move |(j, o)| {
            let blocks = j != i
                && (!o.granted.compatible(m)
                    || (new && j < i && o.waiting && !o.requested.compatible(m)));
            blocks.then_some(o.txn)
        })
    }

    /// Grants every waiting request that can be granted now, in queue order; collects the
    /// threads to wake.
    fn grant_pass(&mut self, wake: &mut Wakeups) {
        let Reqs::Many(c) = &mut self.reqs else {
            return;
        };
        if c.waiting == 0 {
            return;
        }
        let Crowd {
            reqs,
            waiting,
            threads,
        } = &mut **c;
        let mut counts = [0u32; LockMode::ALL.len()];
        for r in reqs.iter() {
            counts[r.granted as usize] += 1;
        }
        // Requested modes of the waiting requests seen so far.
        let mut ahead_waiting = 0u16;
        for r in reqs.iter_mut() {
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
                *waiting -= 1;
                if let Some(i) = threads.iter().position(|&(t, _)| t == r.txn) {
                    wake.push(threads.swap_remove(i).1);
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
        for i in 0..self.reqs().len() {
            let r = self.reqs()[i];
            if r.waiting {
                let edges = graph.entry(r.txn).or_default();
                edges.clear();
                edges.extend(self.blockers(i));
                self.reqs_mut()[i].in_graph = true;
            } else if r.in_graph {
                graph.remove(&r.txn);
                self.reqs_mut()[i].in_graph = false;
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

/// A lock name as an entry stores it: a short key inline, a longer one boxed.
enum Name {
    Database,
    Table(TableId),
    NegInf(TableId),
    /// A key of at most [`INLINE_KEY`] bytes: its length and bytes.
    Short(TableId, u8, [u8; INLINE_KEY]),
    /// A longer key.
    Long(TableId, Box<[u8]>),
}

/// The hash of a lock name from its kind, table and key bytes: the one hash of a lock id,
/// for its shard and within the shard's table.
#[inline]
fn hash_parts(kind: u8, table: TableId, key: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write_u64(u64::from(kind) << 32 | u64::from(table));
    h.write(key);
    h.finish()
}

#[inline]
fn hash_id(id: &LockId) -> u64 {
    match id {
        LockId::Database => hash_parts(0, 0, &[]),
        LockId::Table(t) => hash_parts(1, *t, &[]),
        LockId::NegInf(t) => hash_parts(2, *t, &[]),
        LockId::Key(t, k) => hash_parts(3, *t, k),
    }
}

impl Name {
    fn of(id: &LockId) -> Name {
        match id {
            LockId::Database => Name::Database,
            LockId::Table(t) => Name::Table(*t),
            LockId::NegInf(t) => Name::NegInf(*t),
            LockId::Key(t, k) => match u8::try_from(k.len()) {
                Ok(n) if k.len() <= INLINE_KEY => {
                    let mut b = [0u8; INLINE_KEY];
                    b[..k.len()].copy_from_slice(k);
                    Name::Short(*t, n, b)
                }
                _ => Name::Long(*t, (**k).into()),
            },
        }
    }

    /// True when this is the name of `id`.
    #[inline]
    fn is(&self, id: &LockId) -> bool {
        match (self, id) {
            (Name::Database, LockId::Database) => true,
            (Name::Table(a), LockId::Table(b)) | (Name::NegInf(a), LockId::NegInf(b)) => a == b,
            // A short name holds a key of at most 16 bytes, zero padded: the id's key
            // matches only if it is as short, and then its inline form compares whole.
            (Name::Short(a, n, b), LockId::Key(t, k)) => {
                a == t && k.head16().is_some_and(|(m, h)| m == *n && h == b)
            }
            (Name::Long(a, b), LockId::Key(t, k)) => a == t && b[..] == k[..],
            _ => false,
        }
    }

    /// [`hash_id`] of the id this names.
    fn hash(&self) -> u64 {
        match self {
            Name::Database => hash_parts(0, 0, &[]),
            Name::Table(t) => hash_parts(1, *t, &[]),
            Name::NegInf(t) => hash_parts(2, *t, &[]),
            Name::Short(t, n, b) => hash_parts(3, *t, &b[..usize::from(*n)]),
            Name::Long(t, k) => hash_parts(3, *t, k),
        }
    }
}

/// One lock of a shard: its name and its queue.
struct Entry {
    name: Name,
    queue: Queue,
}

/// An entry of a shard's hash table, in a cache line of its own.
#[repr(align(64))]
struct Line(Entry);

const _: () = assert!(std::mem::size_of::<Entry>() <= 64);
const _: () = assert!(std::mem::size_of::<Line>() == 64);

/// One shard: the queues of the locks hashed to it.
///
/// The shard's first lock lives in the shard itself, next to its mutex: with 512 shards
/// and a few dozen locks held at a time, a shard mostly holds one lock or none, so an
/// uncontended request and its release touch only the shard's own 128 bytes (two adjacent
/// cache lines, whose addresses the hash gives at once), not a line of the table's control
/// bytes and then the entry's line that those name, each a cache miss after the one
/// before, and each a transfer from the other core when two threads lock keys of one
/// shard. The hash table holds the shard's other locks.
#[derive(Default)]
struct Shard {
    first: Option<Entry>,
    map: HashTable<Line>,
    /// Highest tag of a queue removed from this shard: a tag must outlive its queue, so
    /// every lock of the shard reports at least this much afterwards (conservative).
    retired_tag: u64,
}

// The mutex, the table's header and the first entry fit in one cache-padded shard.
const _: () = assert!(std::mem::size_of::<Mutex<Shard>>() <= 128);

/// A shard's table keeps room for this many locks however few it holds.
const SHARD_ROOM: usize = 14;

impl Shard {
    /// After a queue was removed: a table that grew for a burst of locks (a bulk load
    /// holds thousands at once) shrinks back once it is mostly empty, so its entries and
    /// control bytes stay few and hot, rather than each new lock landing on a cold line of a
    /// large, sparse table.
    fn removed(&mut self) {
        let cap = self.map.capacity();
        if cap > SHARD_ROOM && self.map.len() * 8 < cap {
            let room = SHARD_ROOM.max(self.map.len() * 2);
            self.map.shrink_to(room, |e| e.0.name.hash());
        }
    }

    /// The queue of `id` (hash `h`).
    fn get(&self, h: u64, id: &LockId) -> Option<&Queue> {
        if let Some(e) = self.first.as_ref().filter(|e| e.name.is(id)) {
            return Some(&e.queue);
        }
        if self.map.is_empty() {
            return None;
        }
        self.map.find(h, |e| e.0.name.is(id)).map(|e| &e.0.queue)
    }

    fn get_mut(&mut self, h: u64, id: &LockId) -> Option<&mut Queue> {
        if self.first.as_ref().is_some_and(|e| e.name.is(id)) {
            return self.first.as_mut().map(|e| &mut e.queue);
        }
        if self.map.is_empty() {
            return None;
        }
        self.map
            .find_mut(h, |e| e.0.name.is(id))
            .map(|e| &mut e.0.queue)
    }

    /// Adds the queue of a lock the shard does not hold (hash `h`).
    fn insert(&mut self, h: u64, e: Entry) {
        if self.first.is_none() {
            self.first = Some(e);
        } else {
            self.map.insert_unique(h, Line(e), |e| e.0.name.hash());
        }
    }

    /// Removes the queue of `id` (hash `h`), keeping its tag.
    fn remove(&mut self, h: u64, id: &LockId) {
        let gone = if self.first.as_ref().is_some_and(|e| e.name.is(id)) {
            self.first.take()
        } else {
            match self.map.find_entry(h, |e| e.0.name.is(id)) {
                Ok(o) => Some(o.remove().0 .0),
                Err(_) => None,
            }
        };
        if let Some(e) = gone {
            self.retired_tag = self.retired_tag.max(e.queue.tag);
        }
        self.removed();
    }

    /// The number of queues.
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.map.len()
    }

    /// Every entry.
    fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.first.iter().chain(self.map.iter().map(|e| &e.0))
    }
}

/// Sharded lock table with a FIFO queue per lock (see the [module docs](self)).
pub struct SimpleLockTable {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    shard_bits: u32,
    /// No-wait, wait-die, wound-wait and Dreadlocks (the waits-for graph is this table's).
    deadlocks: Deadlocks,
    policy: DeadlockPolicy,
    /// Requests record their transaction's age and flush-pipeline length (the policy
    /// decides by them: [`Deadlocks::needs_blocker_ages`]).
    ages: bool,
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
        let deadlocks = Deadlocks::new(policy, Victim::KillYoung);
        SimpleLockTable {
            shards: (0..n)
                .map(|_| CachePadded::new(Mutex::new(Shard::default())))
                .collect(),
            shard_bits: n.trailing_zeros(),
            ages: deadlocks.needs_blocker_ages(),
            deadlocks,
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
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// True when the table is back at rest (diagnostics and tests): no lock queue, an empty
    /// waits-for graph, and every shard shrunk back to its resting room after a burst.
    pub fn is_idle(&self) -> bool {
        self.queue_count() == 0
            && self.graph.lock().is_empty()
            && self
                .shards
                .iter()
                .all(|s| s.lock().map.capacity() <= SHARD_ROOM)
    }

    /// Number of requests currently waiting on `id` (diagnostics and tests).
    pub fn waiters(&self, id: &LockId) -> usize {
        let h = hash_id(id);
        self.shard_of(h, id)
            .lock()
            .get(h, id)
            .map_or(0, |q| q.waiting() as usize)
    }

    /// The mode `txn` currently holds on `id` (`N` if none).
    pub fn held_mode(&self, txn: TxnId, id: &LockId) -> LockMode {
        let h = hash_id(id);
        let shard = self.shard_of(h, id).lock();
        shard
            .get(h, id)
            .and_then(|q| q.reqs().iter().find(|r| r.txn == txn))
            .map_or(LockMode::N, |r| r.granted)
    }

    /// A granted request of `txn` for `mode`, with the age and pipeline length the policy
    /// needs.
    fn request(&self, txn: TxnId, mode: LockMode) -> Request {
        let (age, pipe, epoch) = if self.ages {
            (
                age_of(txn),
                u16::try_from(pipeline_of(txn)).unwrap_or(u16::MAX),
                epoch_of(txn),
            )
        } else {
            (txn, 0, 0)
        };
        Request {
            txn,
            age,
            pipe,
            epoch,
            granted: mode,
            requested: mode,
            waiting: false,
            in_graph: false,
        }
    }

    #[cfg(test)]
    fn shard(&self, id: &LockId) -> &Mutex<Shard> {
        self.shard_of(hash_id(id), id)
    }

    /// The shard of `id`, whose hash is `h`.
    fn shard_of(&self, h: u64, id: &LockId) -> &Mutex<Shard> {
        &self.shards[self.shard_index(h, id)]
    }

    /// The index of [`shard_of`](Self::shard_of).
    fn shard_index(&self, h: u64, id: &LockId) -> usize {
        if self.shard_bits == 0 {
            return 0;
        }
        // Re-mix so the shard bits are independent of the bits the shard's table uses.
        let mixed = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        match id {
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
        }
    }

    /// [`LockTable::unlock_tagged`] in the locked shard `sh` of `id` (hash `h`); graph
    /// changes and wake-ups are collected for the caller to apply after the shard mutex.
    #[allow(clippy::too_many_arguments)]
    fn unlock_in<'a>(
        &'a self,
        sh: &mut Shard,
        txn: TxnId,
        h: u64,
        id: &LockId,
        tag: u64,
        graph: &mut Option<MutexGuard<'a, Graph>>,
        wake: &mut Wakeups,
    ) {
        let Some(q) = sh.get_mut(h, id) else {
            return;
        };
        let Some(p) = q.position(txn) else {
            return;
        };
        q.tag = q.tag.max(tag);
        let had_waiters = q.waiting() > 0;
        let (r, thread) = q.remove(p);
        if r.waiting {
            // Misuse (another thread of `txn` is waiting here): let it notice.
            if r.in_graph {
                graph.get_or_insert_with(|| self.graph.lock()).remove(&txn);
            }
            if let Some(t) = thread {
                wake.push(t);
            }
        }
        if q.reqs().is_empty() {
            sh.remove(h, id);
        } else {
            self.after_change(q, had_waiters, graph, wake);
        }
    }

    fn uses_graph(&self) -> bool {
        self.policy == DeadlockPolicy::WaitForGraph
    }

    /// The request path of [`LockTable::acquire`]; `tag` is told the lock's early-lock-release
    /// tag (as [`LockTable::tag`] reads it) when the request is granted without a wait, under
    /// the same shard mutex.
    fn acquire_reading_tag(
        &self,
        txn: TxnId,
        id: &LockId,
        mode: LockMode,
        wait: Option<Duration>,
        tag: impl FnOnce(u64),
    ) -> Granted {
        let h = hash_id(id);
        let mut shard = self.shard_of(h, id).lock();
        let sh = &mut *shard;
        let retired = sh.retired_tag;
        let q = match sh.get_mut(h, id) {
            Some(q) => q,
            None => {
                if mode == LockMode::N {
                    return Ok(LockMode::N);
                }
                let e = Entry {
                    name: Name::of(id),
                    queue: Queue {
                        reqs: Reqs::One(self.request(txn, mode)),
                        tag: 0,
                    },
                };
                sh.insert(h, e);
                tag(retired);
                return Ok(mode);
            }
        };
        match q.position(txn) {
            Some(p) => {
                // Conversion.
                let held = q.reqs()[p].granted;
                debug_assert!(
                    !q.reqs()[p].waiting,
                    "one lock call per transaction at a time"
                );
                if held.covers(mode) {
                    tag(q.tag.max(retired));
                    return Ok(held);
                }
                let target = held.supremum(mode);
                if target.compatible_with_all(q.granted_mask_except(p)) {
                    let r = &mut q.reqs_mut()[p];
                    r.granted = target;
                    r.requested = target;
                    if q.waiting() > 0 && self.uses_graph() {
                        // The stronger granted mode may block more waiters.
                        q.sync_graph(&mut self.graph.lock());
                    }
                    tag(q.tag.max(retired));
                    return Ok(target);
                }
                if wait.is_none() {
                    return Err(LockFailure::WouldBlock);
                }
                let c = q.crowd();
                let r = &mut c.reqs[p];
                r.requested = target;
                r.waiting = true;
                c.threads.push((txn, thread::current()));
                c.waiting += 1;
            }
            None => {
                if mode == LockMode::N {
                    return Ok(LockMode::N);
                }
                // A new granted request at the tail is compatible with every waiting request,
                // so it blocks none of them: no graph update needed.
                if mode.compatible_with_all(q.tail_blocking_mask()) {
                    q.push(self.request(txn, mode));
                    tag(q.tag.max(retired));
                    return Ok(mode);
                }
                if wait.is_none() {
                    return Err(LockFailure::WouldBlock);
                }
                let mut r = self.request(txn, mode);
                r.granted = LockMode::N;
                r.waiting = true;
                q.push_waiting(r, thread::current());
            }
        }
        self.wait(shard, txn, h, id, wait.unwrap_or_default())
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
        if !had_waiters && q.waiting() == 0 {
            return;
        }
        q.grant_pass(wake);
        if self.uses_graph() {
            q.sync_graph(graph.get_or_insert_with(|| self.graph.lock()));
        }
        if matches!(self.policy, DeadlockPolicy::Dreadlocks(_)) {
            // Backoff at release (Kimura §4.2), see `Deadlocks::lock_changed`.
            for r in q.reqs() {
                self.deadlocks.lock_changed(r.txn, r.waiting);
            }
        }
    }

    /// Withdraws the waiting request at `p` of the queue of `id` (hash `h`; a conversion
    /// falls back to its granted mode), grants what becomes grantable and drops an empty
    /// queue.
    fn withdraw<'a>(
        &'a self,
        shard: &mut Shard,
        h: u64,
        id: &LockId,
        p: usize,
        graph: &mut Option<MutexGuard<'a, Graph>>,
        wake: &mut Wakeups,
    ) {
        let Some(q) = shard.get_mut(h, id) else {
            unreachable!("queue of a waiting request");
        };
        let r = q.reqs()[p];
        debug_assert!(r.waiting);
        if r.in_graph {
            graph
                .get_or_insert_with(|| self.graph.lock())
                .remove(&r.txn);
        }
        if r.granted == LockMode::N {
            q.remove(p);
        } else {
            let c = q.crowd();
            c.waiting -= 1;
            c.take_thread(r.txn);
            let r = &mut c.reqs[p];
            r.requested = r.granted;
            r.waiting = false;
            r.in_graph = false;
        }
        if q.reqs().is_empty() {
            shard.remove(h, id);
        } else {
            self.after_change(q, true, graph, wake);
        }
    }

    /// The blocking path: `txn`'s request on `id` (hash `h`) is enqueued as waiting; wait for
    /// the grant, a deadlock, or the timeout.
    fn wait(
        &self,
        mut shard: MutexGuard<'_, Shard>,
        txn: TxnId,
        h: u64,
        id: &LockId,
        timeout: Duration,
    ) -> Result<LockMode, LockFailure> {
        if !matches!(
            self.policy,
            DeadlockPolicy::WaitForGraph | DeadlockPolicy::Timeout
        ) {
            return self.wait_prevent_or_dreadlocks(shard, txn, h, id, timeout);
        }
        let start = Instant::now();
        let mut first = true;
        loop {
            let sh = &mut *shard;
            let Some((q, p)) = sh
                .get_mut(h, id)
                .and_then(|q| q.position(txn).map(|p| (q, p)))
            else {
                // Our request was removed by a concurrent `unlock` of the same transaction.
                return Err(LockFailure::Deadlock { blocker: None });
            };
            if !q.reqs()[p].waiting {
                return Ok(q.reqs()[p].granted);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                let blocker = q.blockers(p).next();
                let (mut graph, mut wake) = (None, Wakeups::default());
                self.withdraw(sh, h, id, p, &mut graph, &mut wake);
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
                    self.withdraw(sh, h, id, p, &mut graph, &mut wake);
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
                        .get(h, id)
                        .and_then(|q| q.position(txn).map(|p| q.reqs()[p].waiting))
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
        h: u64,
        id: &LockId,
        timeout: Duration,
    ) -> Result<LockMode, LockFailure> {
        let start = Instant::now();
        let mut wait = None;
        let mut blockers: Vec<Blocker> = Vec::new();
        let result = loop {
            let sh = &mut *shard;
            let Some((q, p)) = sh
                .get_mut(h, id)
                .and_then(|q| q.position(txn).map(|p| (q, p)))
            else {
                break Err(LockFailure::Deadlock { blocker: None });
            };
            let reqs = q.reqs();
            if !reqs[p].waiting {
                break Ok(reqs[p].granted);
            }
            let wait = wait.get_or_insert_with(|| self.deadlocks.wait(txn, reqs[p].age));
            blockers.clear();
            {
                let m = reqs[p].requested;
                let new = reqs[p].granted == LockMode::N;
                blockers.extend(
                    reqs.iter()
                        .enumerate()
                        .filter(|&(j, o)| {
                            j != p
                                && (!o.granted.compatible(m)
                                    || (new && j < p && o.waiting && !o.requested.compatible(m)))
                        })
                        .map(|(_, o)| Blocker {
                            txn: o.txn,
                            age: o.age,
                            pipe: u32::from(o.pipe),
                            fp: fingerprint(o.txn, o.epoch),
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
                    self.withdraw(sh, h, id, p, &mut graph, &mut wake);
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
    fn acquire(&self, txn: TxnId, id: &LockId, mode: LockMode, wait: Option<Duration>) -> Granted {
        self.acquire_reading_tag(txn, id, mode, wait, |_| ())
    }

    fn try_lock_tagged(&self, txn: TxnId, id: &LockId, mode: LockMode) -> TaggedGrant {
        let mut tag = 0;
        let m = self.acquire_reading_tag(txn, id, mode, None, |t| tag = t)?;
        Ok((m, tag))
    }

    fn tag(&self, id: &LockId) -> u64 {
        let h = hash_id(id);
        let shard = self.shard_of(h, id).lock();
        shard.get(h, id).map_or(0, |q| q.tag).max(shard.retired_tag)
    }

    fn unlock_tagged(&self, txn: TxnId, id: &LockId, tag: u64) {
        let h = hash_id(id);
        let mut shard = self.shard_of(h, id).lock();
        let (mut graph, mut wake) = (None, Wakeups::default());
        self.unlock_in(&mut shard, txn, h, id, tag, &mut graph, &mut wake);
        drop(graph);
        drop(shard);
        wake.unpark_all();
    }

    fn unlock_all(&self, txn: TxnId, locks: &mut [(LockId, u64)]) {
        if locks.len() < 2 {
            for (id, tag) in locks.iter() {
                self.unlock_tagged(txn, id, *tag);
            }
            return;
        }
        // Sorted by shard: each shard's mutex (and its cache line) is taken once for all
        // the locks it holds. The (shard, hash, index) list's buffer is the thread's, reused.
        let mut order = SPARE_ORDER.try_with(|o| o.take()).unwrap_or_default();
        order.clear();
        order.extend(locks.iter().enumerate().map(|(i, (id, _))| {
            let h = hash_id(id);
            (self.shard_index(h, id), h, i)
        }));
        order.sort_unstable_by_key(|&(s, _, _)| s);
        let mut at = 0;
        while at < order.len() {
            let s = order[at].0;
            let mut shard = self.shards[s].lock();
            let (mut graph, mut wake) = (None, Wakeups::default());
            while at < order.len() && order[at].0 == s {
                let (_, h, i) = order[at];
                let (id, tag) = &locks[i];
                self.unlock_in(&mut shard, txn, h, id, *tag, &mut graph, &mut wake);
                at += 1;
            }
            drop(graph);
            drop(shard);
            wake.unpark_all();
        }
        let _ = SPARE_ORDER.try_with(|o| o.set(order));
    }

    fn is_free(&self, id: &LockId) -> bool {
        let h = hash_id(id);
        self.shard_of(h, id).lock().get(h, id).is_none()
    }

    fn footprint(&self) -> super::LockTableFootprint {
        let mut f = super::LockTableFootprint::default();
        for s in self.shards.iter() {
            let s = s.lock();
            f.heads += s.len();
            f.entries += s.entries().map(|e| e.queue.reqs().len()).sum::<usize>();
        }
        f
    }
}

#[cfg(test)]
#[path = "simple_tests.rs"]
mod tests;
