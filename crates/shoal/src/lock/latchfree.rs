//! The scalable lock table of Jung, Han, Fekete, Heiser and Yeom 2013, "A scalable lock
//! manager for multicores": lock acquisition and release without any latch (§3, RAW pattern
//! with explicit fences), staged allocation and de-allocation of lock entries (§4).
//!
//! # Structure (§3.1, Fig. 4-5)
//!
//! * A lock hash table of [`BUCKETS`] buckets, fixed size. A bucket is the head of a latch-free
//!   singly linked list of **lock heads**, one per [`LockId`], appended with a CAS on the last
//!   `next` pointer. Idle lock heads are killed, unlinked and reclaimed (see *Memory* below).
//! * Each lock head holds a latch-free list of **request entries** in arrival order, appended
//!   as in Fig. 4: replace the list's tail pointer (with a CAS rather than the paper's
//!   `atomic_fetch_and_store`, so that an append fails on a dead lock head), then link the old
//!   tail to the new entry. A traversal that meets a half-linked tail (a `next` of null on an
//!   entry that is no longer the tail) waits until it is linked (Fig. 5), so every entry
//!   appended before a traversal reaches the end is seen.
//! * An entry's state is one atomic word: granted mode, requested mode and the flags
//!   `WAITING`, `TENTATIVE` and `OBSOLETE`. Only the owning transaction writes it.
//!
//! # Acquire and release (§3.1-§3.2)
//!
//! Grants follow the same rule as [`SimpleLockTable`](super::simple::SimpleLockTable) (Kimura
//! §4.2): a new request is granted iff compatible with every granted mode and with the
//! requested mode of every waiting request ahead of it; a conversion iff compatible with every
//! other granted mode. A requester **publishes** its request as `WAITING` (appending a new
//! entry, or rewriting its own entry for a conversion), issues `fence(SeqCst)`, then reads the
//! others' states. If the rule allows the grant it writes the target mode as a **tentative**
//! grant, fences again and re-checks (the RAW/Dekker pattern): of two conflicting requesters
//! at least one sees the other's tentative mode and backs off to `WAITING` (and wakes whoever
//! it may have blocked meanwhile). Ties between two tentative grants go to the older (smaller)
//! transaction: it re-checks until the younger one has either backed off or finalised. A
//! release marks the entry `OBSOLETE`, fences, and wakes the waiting entries whose requested
//! mode conflicts with what it gave up.
//!
//! *Deviation:* the paper grants optimistically and lets the releaser grant waiters (Fig. 3
//! R6-R9 under the waiter's transaction mutex); here the waiter always grants itself after a
//! wake-up, and the releaser only unparks. That keeps every state word single-writer, needs no
//! transaction mutex, and supports Kimura's conversions, which InnoDB's code does not have.
//!
//! # Waiting: no lost wake-up (§3.4, Fig. 6)
//!
//! A blocked request parks with `park_timeout`. It stays published as `WAITING` while it
//! waits, and every (re-)evaluation is preceded by a fence; a waker changes its own state,
//! fences, then scans the list and unparks. In the five schedules of Fig. 6 either the waiter's
//! evaluation reads the releaser's `OBSOLETE` state, or the releaser's scan reads the waiter's
//! `WAITING` state and unparks it; `unpark` before `park` leaves a token, so the park returns at
//! once. (A conversion asked from another thread than the one that appended the entry, which
//! the one-thread-per-transaction rule excludes, cannot be unparked and polls every
//! millisecond instead.) Parks are bounded by the timeout (and by the deadlock re-check
//! period), and a timed-out request withdraws: a new request becomes `OBSOLETE`, a conversion
//! falls back to its held mode, and both wake the waiters they may have blocked.
//!
//! # Deadlocks (§3.3)
//!
//! Every [`DeadlockPolicy`] runs here as on the other tables. The decisions that do not
//! depend on the table's structure (no-wait, wait-die and wound-wait by age, Dreadlocks'
//! digests, waiting styles and victim rule) are the shared ones of
//! [`deadlock`]; this table supplies *who blocks me* (the live entries ahead
//! of or granted beside the waiting one that conflict with it, the same rule as granting,
//! with the age and flush-pipeline length each entry recorded when it was appended) and the
//! waiting. A blocked request re-decides after every wake-up and at least every
//! [`DECIDE_EVERY`](super::deadlock::DECIDE_EVERY). Waiters that another transaction may have
//! to wake (wound-wait's wounded, a Dreadlocks victim whose cycle another waiter found)
//! register their entry in the waiting registry below, through which they are unparked.
//! Dreadlocks digests and wound marks are per-transaction state kept by
//! [`dread`], a sharded map under mutexes: a request that does not wait never
//! touches it, but a Dreadlocks waiter does, and under Dreadlocks with backoff a release
//! that passes waiters marks their digests stale through it (*limit:* that policy's wait and
//! wake paths are not latch-free; the grant and release paths of requests without waiters
//! are, under every policy). A waiter withdraws its digest before its grant becomes visible,
//! so nobody builds a false cycle through a transaction that no longer waits.
//!
//! Under [`DeadlockPolicy::WaitForGraph`] a blocked transaction walks the waits-for relation
//! itself, without any latch, at its first wait and every [`DEADLOCK_RECHECK`]: its blockers
//! are read off its lock's list (the same rule as granting), and what a blocker waits for is
//! found through a small registry of waiting entries ([`WAIT_REGISTRY`] slots, CAS-claimed).
//! The walk is a depth-first search bounded in depth and visited transactions; it runs when a
//! request starts waiting, after every wake-up and every [`DEADLOCK_RECHECK`]. The detecting
//! transaction aborts itself (the paper's policy (3)), but only if it is the youngest
//! (largest id) on the cycle it found, so that concurrent detections of one cycle choose a
//! single victim (*deviation:* the paper accepts several). A detector that is not the youngest
//! unparks the youngest member, whose own search then finds the cycle and aborts it at once.
//! Every wait also ends at its timeout, which covers cycles the bounded walk misses or a full
//! registry.
//!
//! # Memory: staged allocation and reclamation (§4)
//!
//! Entries are pre-allocated in bulk ([`ALLOC_BATCH`] at a time, on demand, per reclamation
//! slot) and released by marking them `OBSOLETE` (§4.3). The wake-up pass that follows every
//! release or withdrawal also unlinks the obsolete entries it passes, anywhere in the list
//! (*deviation:* §4.5 advances only the list head, which lets a long-held lock at the front
//! keep every later obsolete entry linked): as in Harris' list, the entry's `next` pointer is
//! first marked (frozen), then a CAS on the predecessor's unmarked link (or the list head)
//! unlinks it, and the thread whose CAS succeeds retires it. The last entry of a list is never
//! unlinked, so unlinking never races with an append. Unlinked entries are reclaimed by an
//! **epoch scheme** over lock-table operations rather than over transactions (the table does
//! not see transaction begin and end), with one **gate per bucket group** rather than one
//! epoch for the table. The buckets come in groups of [`GROUP_BUCKETS`], one cache line each,
//! which also holds the group's gate: an epoch and two counters of pinned operations, one
//! per epoch parity (as in sleepable RCU). An operation on one lock pins the gate of its
//! bucket's group (the line its lookup loads anyway); the rare operations that reach other
//! groups' lock heads (the deadlock search through the waiting registry, statistics, bulk
//! reclamation) pin a table-wide gate of the same kind. A gate's epoch advances past `e` only
//! once no operation of epoch `e - 1` is pinned, so something unlinked before its group's
//! epoch read `r` (and the table-wide one read `a`) is unreachable once they reach `r + 2`
//! (`a + 2`). The thread that unlinks an entry or lock head reuses it **at once** when it is
//! the only operation pinned on the group and none is pinned table-wide (checked after the
//! unlink: a later operation starts from the bucket and cannot reach it); otherwise it
//! defers it in its slot's bag with both epochs, and every [`RETIRE_BATCH`] deferrals the
//! bag is scanned and what both gates have passed goes back to the slot's free lists
//! (beyond [`FREE_CAP`] it is deallocated). This is §4.1's condition with operations in
//! place of transactions and per group: no operation that could hold a reference is still
//! running. Per-thread state (bags, pools) lives in one of [`SLOTS`] slots that an operation
//! claims. *Why groups:* with far more threads than cores some pinned thread is nearly
//! always descheduled; under one table-wide epoch that stalled all reclamation, killed heads
//! piled up and the pools cycled through thousands of cold ones (txbench read-only fell from
//! 260k-300k tps at 2 threads to about 150k at 8 and beyond). Now a descheduled thread holds
//! back one group of 2^15. [`LatchFreeLockTable::reclaim`] runs a bulk reclamation over all
//! idle slots (what a background de-allocator would call; the tests use it at quiescent
//! points). A waiter leaves its slot and gate while parked; its own entry (live, so never
//! unlinked) and its lock head (which has a live entry, so is never killed) stay valid.
//!
//! **Lock heads** (*extension:* the paper does not reclaim them; without it memory grows with
//! the number of distinct lock names ever used, e.g. inserted rows) are killed **eagerly**:
//! a release that leaves every request of its lock head obsolete kills the head and unlinks
//! it. The buckets then hold about as many heads as there are held or awaited locks, so a
//! lookup stays in cache (with idle heads left linked, txbench read-only at 1 thread spent
//! most of its lock-table time on cache misses in the bucket array and the heads). Killing
//! is refused while a slot holds [`KILL_BACKLOG`] deferred heads it cannot reclaim yet (a
//! descheduled thread pinned table-wide, in a deadlock search, holds every gate's deferrals
//! back for a whole scheduling round, and every head killed meanwhile would be memory that
//! cannot be freed). Idle heads then stay linked and are reused by their next request. A
//! **sweep** also visits the buckets in turn ([`SWEEP_BUCKETS`] buckets every
//! [`SWEEP_EVERY`] lock heads a slot creates, at the end of the operation, pinning one group
//! at a time; and all of them in [`LatchFreeLockTable::reclaim`]) and **kills** every lock
//! head whose requests are all
//! obsolete: it reads the tail, checks every entry up to it, and CASes the tail to its marked
//! value. Appenders CAS the tail as well and fail on a marked one, so of a kill and an
//! append exactly one wins: an append either lands before the kill (whose CAS then fails) or
//! finds the head dead and looks the id up again; no request is lost. Obsolete is final for
//! an entry, so a head with a live (granted or waiting) entry is never killed. Lookups skip
//! dead heads (a new lock head for the id is appended at the end of the bucket; at most one
//! is live per id), and every traversal helps unlink dead heads as in Michael's list: mark
//! the dead head's `next` (frozen: nothing is appended after it or unlinked through it any
//! more), then CAS the predecessor's unmarked link. The thread whose CAS unlinks a head
//! retires it, and it is reclaimed with the entries still on its list under the same
//! condition as entries: into the slot's pool of free lock heads (up to
//! [`FREE_CAP`], its key buffer reused by the next head of a key of the same length), freed
//! beyond that. A killed head's early-lock-release tag is first
//! folded into a per-stripe floor of buckets, which `tag` includes (the trait allows a tag
//! shared with other resources).
//!
//! *Deviations and limits:* there is no background allocator thread (allocation is in bulk on
//! demand); a deferred entry or head waits while some operation stays pinned on its group or
//! table-wide (e.g. a descheduled thread), so the bounds on entries and lock heads are per
//! slot and not strict in time; an
//! idle lock head lives until the sweep next passes its bucket (at most a full sweep, i.e.
//! `BUCKETS / SWEEP_BUCKETS * SWEEP_EVERY` head creations of the table), and a hot lock head
//! found idle by the sweep is killed and recreated by its next request.
//!
//! # Model checking
//!
//! The algorithm lives in `latchfree/table.rs` (acquire, release, the grant rule) and the
//! files it includes: `state.rs` (entries and lock heads), `lists.rs` (the hash table and
//! lists), `reclaim.rs` (allocation and reclamation) and `search.rs` (deadlock handling). It
//! reaches atomics, fences and parking only through the `sync` module below, so
//! `tests/latchfree_shuttle.rs` compiles the same files against `shuttle`'s primitives and
//! explores thread interleavings of them.

#[path = "latchfree/table.rs"]
mod table;

/// The primitives the algorithm uses (`std` here; `shuttle`'s in the model-checking test).
mod sync {
    pub(super) use std::sync::atomic::{
        fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub(super) use std::thread::{current, park_timeout, yield_now, Thread};
}

use super::{deadlock, dread};
use super::{
    DeadlockPolicy, Granted, LockFailure, LockId, LockMode, LockTable, LockTableFootprint, TxnId,
    Victim,
};

pub use table::{
    LatchFreeLockTable, Params, ALLOC_BATCH, BUCKETS, DEADLOCK_RECHECK, FREE_CAP, GROUP_BUCKETS,
    KILL_BACKLOG, RETIRE_BATCH, SLOTS, SWEEP_BUCKETS, SWEEP_EVERY, WAIT_REGISTRY,
};
