//! Request entries and lock heads of the latch-free lock table (Jung et al. 2013 §3.1,
//! Fig. 4-5): an entry's state is one atomic word (granted mode, requested mode and flags)
//! that only its transaction writes; a lock head holds the latch-free list of a lock's
//! entries and is killed by marking its tail (see the parent module's docs, *Memory*).

use super::*;

// ---- entry state word: granted mode | requested mode << 4 | flags ----

/// The request waits (its requested mode is not granted yet).
pub(super) const WAITING: u32 = 1 << 8;
/// The requested mode is granted tentatively and being verified (RAW re-check).
pub(super) const TENTATIVE: u32 = 1 << 9;
/// The request is released or withdrawn; the entry is dead and may be unlinked.
pub(super) const OBSOLETE: u32 = 1 << 10;
/// Set on an entry when it is reclaimed (back in a free list); reaching one from a list is a
/// reclamation bug, caught by a debug assertion in `walk`.
pub(super) const POISON: u32 = 1 << 11;

pub(super) const fn pack(granted: LockMode, requested: LockMode, flags: u32) -> u32 {
    granted as u32 | (requested as u32) << 4 | flags
}

pub(super) fn granted_of(s: u32) -> LockMode {
    LockMode::ALL[(s & 0xf) as usize]
}

pub(super) fn requested_of(s: u32) -> LockMode {
    LockMode::ALL[((s >> 4) & 0xf) as usize]
}

/// `p` with the deletion mark (low bit; entries and lock heads are 8-byte aligned).
pub(super) fn marked<T>(p: *mut T) -> *mut T {
    p.wrapping_byte_add(1)
}

/// `p` without the deletion mark.
pub(super) fn unmarked<T>(p: *mut T) -> *mut T {
    if is_marked(p) {
        p.wrapping_byte_sub(1)
    } else {
        p
    }
}

/// `p` carries the deletion mark.
pub(super) fn is_marked<T>(p: *mut T) -> bool {
    p as usize & 1 == 1
}

pub(super) fn bit(m: LockMode) -> u16 {
    1 << (m as u16)
}

/// `m` is compatible with every mode in `mask`.
pub(super) fn compatible_with_all(m: LockMode, mask: u16) -> bool {
    LockMode::ALL
        .iter()
        .all(|&o| mask & bit(o) == 0 || m.compatible(o))
}

/// One transaction's request on one lock: an element of a lock head's request list.
///
/// Entries are pooled: `txn`, `next`, `head` and `thread` are (re)initialised only while the
/// entry is owned exclusively (fresh from the pool, before it is linked); afterwards only the
/// owning transaction writes `state`, everybody may read.
pub(super) struct Entry {
    pub(super) txn: AtomicU64,
    pub(super) state: AtomicU32,
    /// The transaction's age (wait-die and wound-wait timestamp, Dreadlocks' victim rule),
    /// recorded when the entry is appended under the policies that read it, else 0.
    pub(super) age: AtomicU64,
    /// The requesting thread's flush-pipeline length when it asked (victim rules).
    pub(super) pipe: AtomicU32,
    /// Its Dreadlocks fingerprint when it asked (recorded like `age`).
    pub(super) fp: AtomicU32,
    pub(super) next: AtomicPtr<Entry>,
    pub(super) head: AtomicPtr<LockHead>,
    /// The requesting thread, unparked by wakers. Written only while the entry is unlinked and
    /// owned by one thread.
    pub(super) thread: UnsafeCell<Option<Thread>>,
}

impl Entry {
    pub(super) fn blank() -> Self {
        Entry {
            txn: AtomicU64::new(0),
            state: AtomicU32::new(OBSOLETE),
            age: AtomicU64::new(0),
            pipe: AtomicU32::new(0),
            fp: AtomicU32::new(0),
            next: AtomicPtr::new(ptr::null_mut()),
            head: AtomicPtr::new(ptr::null_mut()),
            thread: UnsafeCell::new(None),
        }
    }

    pub(super) fn unpark(&self) {
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
pub(super) struct LockHead {
    /// Hash of `id` (compared before `id` itself in lookups).
    pub(super) hash: u64,
    pub(super) id: LockId,
    /// Next lock head of the bucket; marked once this head is dead and about to be unlinked.
    pub(super) next: AtomicPtr<LockHead>,
    /// First entry of the request list (null only before the first append completes).
    pub(super) first: AtomicPtr<Entry>,
    /// Last appended entry (Jung Fig. 4: CAS'd by appenders, then the old tail is linked);
    /// marked when the head is dead.
    pub(super) tail: AtomicPtr<Entry>,
    /// Early-lock-release tag; folded into the bucket's tag floor when the head is killed.
    pub(super) tag: AtomicU64,
    /// Set when the head is reclaimed but kept allocated ([`Params::poison_heads`]).
    pub(super) poison: AtomicU32,
}

impl LockHead {
    pub(super) fn is_dead(&self) -> bool {
        self.check();
        is_marked(self.tail.load(SeqCst))
    }

    /// Debug check that the head was not reclaimed (see [`Params::poison_heads`]).
    pub(super) fn check(&self) {
        debug_assert!(
            self.poison.load(SeqCst) == 0,
            "reached a reclaimed lock head"
        );
    }
}
