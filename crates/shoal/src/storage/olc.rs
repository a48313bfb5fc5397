//! The optimistic latch of a page: one version word (Leis et al., "The ART of practical
//! synchronization", DaMoN 2016, §3; LeanStore's hybrid latch without its shared mode).
//!
//! The word is even when the page is unlatched and odd while a writer holds it exclusively.
//! A reader takes no latch: it reads the version ([`Latch::optimistic`], waiting while it is
//! odd), reads the page, then checks that the version is unchanged ([`Latch::validate`]); if
//! not, what it read may be torn and it restarts. Readers therefore write no shared memory,
//! so the upper levels of a tree stay in every core's cache. A writer latches exclusively,
//! either from nothing ([`Latch::lock`]) or by upgrading a version it read
//! ([`Latch::try_upgrade`], which fails if a writer came in between), and releases with
//! [`Latch::unlock`] (a new version: every reader that overlapped restarts) or, when it
//! changed nothing, [`Latch::unlock_unchanged`] (the old version back: no reader restarts).
//!
//! Memory ordering follows the seqlock of Boehm ("Can seqlocks get along with programming
//! language memory models?", MSPC 2012): the page words are atomics read and written with
//! `Relaxed` (so a racing read is never undefined behaviour, only a stale or torn value that
//! validation rejects); a writer's lock is followed by a release fence, and a reader's
//! validation is preceded by an acquire fence, so a reader that saw any word a writer stored
//! also sees that writer's odd version. The version loads and the latching compare-exchange
//! are `SeqCst` (a plain load on x86-64, the same instruction as `Acquire` on AArch64): a
//! read validated at a version then precedes, in the single total order of sequentially
//! consistent operations, the latch of the next writer, and with it everything that writer
//! does afterwards. Ghost reclamation under optimistic concurrency control (`txn/reclaim.rs`)
//! relies on that: a reader's epoch pin, made before its read, is seen by the committer that
//! deleted the record it read.
//!
//! This file reaches its atomics only through `super::sync`, so the shuttle model
//! (`tests/storage_shuttle.rs`) compiles it against shuttle's.

use super::sync::{fence, spin_wait, AtomicU64, Ordering};

/// The version word of one page.
#[derive(Debug, Default)]
pub struct Latch {
    v: AtomicU64,
}

/// The lock bit: set while a writer holds the latch.
const LOCKED: u64 = 1;

impl Latch {
    /// An unlatched latch at version 0.
    pub fn new() -> Self {
        Latch {
            v: AtomicU64::new(0),
        }
    }

    /// The current version for an optimistic read, waiting while a writer holds the latch.
    #[inline]
    pub fn optimistic(&self) -> u64 {
        let mut spins = 0u32;
        loop {
            let v = self.v.load(Ordering::SeqCst);
            if v & LOCKED == 0 {
                return v;
            }
            spin_wait(&mut spins);
        }
    }

    /// The current version, or `None` while a writer holds the latch (no waiting).
    #[inline]
    pub fn try_optimistic(&self) -> Option<u64> {
        let v = self.v.load(Ordering::SeqCst);
        (v & LOCKED == 0).then_some(v)
    }

    /// True when no writer latched the page since `v` was read: everything read from the
    /// page in between is a consistent snapshot.
    #[inline]
    pub fn validate(&self, v: u64) -> bool {
        fence(Ordering::Acquire);
        self.v.load(Ordering::SeqCst) == v
    }

    /// Latches exclusively if the version is still `v`.
    #[inline]
    pub fn try_upgrade(&self, v: u64) -> bool {
        if self
            .v
            .compare_exchange(v, v | LOCKED, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        // The page stores that follow must not become visible before the odd version.
        fence(Ordering::Release);
        true
    }

    /// Latches exclusively, waiting for the current holder; returns the version it had.
    #[inline]
    pub fn lock(&self) -> u64 {
        let mut spins = 0u32;
        loop {
            let v = self.optimistic();
            if self.try_upgrade(v) {
                return v;
            }
            spin_wait(&mut spins);
        }
    }

    /// Releases an exclusive latch with a new version.
    #[inline]
    pub fn unlock(&self) {
        let v = self.v.load(Ordering::Relaxed);
        debug_assert!(v & LOCKED != 0);
        self.v.store(v + 1, Ordering::Release);
    }

    /// Releases an exclusive latch taken at version `v` without having changed the page:
    /// readers that overlapped need not restart.
    #[inline]
    pub fn unlock_unchanged(&self, v: u64) {
        debug_assert_eq!(self.v.load(Ordering::Relaxed), v | LOCKED);
        self.v.store(v, Ordering::Release);
    }

    /// True while a writer holds the latch.
    pub fn is_locked(&self) -> bool {
        self.v.load(Ordering::Relaxed) & LOCKED != 0
    }
}
