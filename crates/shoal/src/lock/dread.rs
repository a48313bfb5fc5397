//! Shared state of the non-graph deadlock policies: Dreadlocks digests (Kimura et al. 2012
//! §4.2), the wound marks of wound-wait, and the count of spinning waiters for the hybrid
//! waiting style.
//!
//! Fingerprints are per transaction: `FINGERPRINT_BITS` of the `DIGEST_BITS`-bit Bloom
//! filter, hashed from the transaction id. Kimura et al. and Shore-MT draw them per thread;
//! then a digest that went stale (it still names a dependency on a thread's previous,
//! finished transaction) makes that thread's next transaction find its own fingerprint in a
//! blocker's digest: a false deadlock that no Bloom collision explains. Staleness also spreads
//! through every digest built from a stale one, which marking at release cannot reach. With a
//! fingerprint per transaction an old dependency can never name a new transaction. The same
//! holds within a transaction that releases a lock before its end (2PL's instant locks):
//! digests built while others waited for that lock still name it, so it takes a fresh
//! fingerprint for its later requests ([`new_fingerprint`]), and each request records the
//! fingerprint it was made with. The only false deadlocks left are Bloom collisions. A digest is published only while its
//! transaction waits; the digest of a transaction that does not wait is its fingerprint.
//! Bloom filters give no false negatives, so every cycle is found; a collision can report a
//! false deadlock, which is counted like any other victim. Kimura et al. used 512-bit
//! digests; we use 1024 bits (16 words to OR per blocker) because long queues of many threads
//! fill 512 bits enough to make false positives common in our stress tests.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};

use super::TxnId;

/// Bits of a digest.
pub const DIGEST_BITS: usize = 1024;
/// Bits set in a fingerprint.
pub const FINGERPRINT_BITS: usize = 3;

const REGISTRY_SHARDS: usize = 64;
const WOUND_LIMIT: usize = 4096;

/// A Bloom-filter digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Digest(pub [u64; DIGEST_BITS / 64]);

impl Digest {
    /// The digest holding just this packed fingerprint.
    pub fn of_fingerprint(fp: u32) -> Digest {
        let mut d = Digest::default();
        for i in 0..FINGERPRINT_BITS {
            let bit = ((fp >> (10 * i)) & 1023) as usize;
            d.0[bit / 64] |= 1 << (bit % 64);
        }
        d
    }

    /// True when every bit of `other` is set here.
    pub fn contains(&self, other: &Digest) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a & b == *b)
    }

    /// Sets every bit of `other` here.
    pub fn union(&mut self, other: &Digest) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a |= b;
        }
    }
}

thread_local! {
    static PIPELINE: Arc<AtomicU64> = Arc::new(AtomicU64::new(0));
    /// The transaction whose lock requests this thread makes, and its age (see `set_age`).
    static AGE: std::cell::Cell<(TxnId, TxnId)> = const { std::cell::Cell::new((0, 0)) };
    /// The transaction of this thread's requests and how many locks it has released before
    /// its end (see `new_fingerprint`).
    static EPOCH: std::cell::Cell<(TxnId, u16)> = const { std::cell::Cell::new((0, 0)) };
    /// The transaction of this thread's requests and its thread's flush-pipeline length at
    /// its first request (see `pipeline_of`).
    static PIPE: std::cell::Cell<(TxnId, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// The flush-pipeline length the victim rules use for `txn`, whose requests this thread
/// makes: the thread's length at the transaction's first request, the same for all its
/// requests and its own decisions. Read afresh at each, a waiter compared its length now
/// with the length the other side's request recorded earlier, and the other side did the
/// same the other way: the lengths shrink as flushes complete, so under kill-long each side
/// could find the other the longer, and neither rolled back until a lock timeout.
pub fn pipeline_of(txn: TxnId) -> u64 {
    PIPE.with(|p| match p.get() {
        (t, n) if t == txn => n,
        _ => {
            // At most 2^16 - 1: what a request records (the victim rules compare no more).
            let n = pipeline_len().min(u64::from(u16::MAX));
            p.set((txn, n));
            n
        }
    })
}

/// Gives `txn`, whose requests this thread makes, a fresh fingerprint for its next
/// requests: called when it releases a lock before its end (2PL's instant locks). Digests
/// built while others waited for that lock name the old fingerprint, and nothing marks
/// stale those built from them in turn; had it kept its fingerprint, a later request of its
/// own would find it there and report a deadlock that does not exist.
pub fn new_fingerprint(txn: TxnId) {
    EPOCH.with(|e| {
        let (t, n) = e.get();
        e.set((txn, if t == txn { n.wrapping_add(1) } else { 1 }));
    });
}

/// How many locks `txn`, whose requests this thread makes, has released before its end
/// (modulo 2^16; see [`new_fingerprint`]).
pub fn epoch_of(txn: TxnId) -> u16 {
    EPOCH.with(|e| match e.get() {
        (t, n) if t == txn => n,
        _ => 0,
    })
}

/// The fingerprint of `txn` after `epoch` early releases.
pub fn fingerprint(txn: TxnId, epoch: u16) -> u32 {
    txn_fingerprint(txn ^ (u64::from(epoch) << 48))
}

/// The fingerprint of `txn`'s requests made on this thread now: [`txn_fingerprint`] of its
/// id, mixed with the number of its early releases (see [`new_fingerprint`]).
pub fn fingerprint_of(txn: TxnId) -> u32 {
    fingerprint(txn, epoch_of(txn))
}

/// Declares that this thread's next lock requests for `txn` carry the age (wait-die and
/// wound-wait timestamp) `age`: a transaction restarted after an abort keeps the age of its
/// first attempt, as the two policies require (Rosenkrantz, Stearns and Lewis 1978: a
/// restarted transaction that kept being the youngest could die forever). The transaction
/// layer calls it before every request.
pub fn set_age(txn: TxnId, age: TxnId) {
    AGE.with(|a| a.set((txn, age)));
}

/// The age of `txn`'s requests made on this thread: what [`set_age`] declared for it, else
/// its id (a transaction's id is the time it began).
pub fn age_of(txn: TxnId) -> TxnId {
    AGE.with(|a| {
        let (t, age) = a.get();
        if t == txn {
            age
        } else {
            txn
        }
    })
}

/// This thread's flush-pipeline counter: the number of its pipelined commits that are not
/// durable yet. The transaction layer raises it at a pipelined commit and lowers it (from the
/// flush daemon, through this handle) when the commit is durable.
pub fn pipeline_handle() -> Arc<AtomicU64> {
    // A thread being torn down gets a counter of its own: only its commit and the flush
    // daemon use it.
    PIPELINE
        .try_with(Arc::clone)
        .unwrap_or_else(|_| Arc::new(AtomicU64::new(0)))
}

/// The length of this thread's flush pipeline (see [`pipeline_handle`]).
pub fn pipeline_len() -> u64 {
    PIPELINE
        .try_with(|p| p.load(Ordering::Acquire))
        .unwrap_or(0)
}

/// The packed fingerprint (three 10-bit positions) of transaction `txn`: a hash of its id.
pub fn txn_fingerprint(txn: TxnId) -> u32 {
    // splitmix64 finalizer: consecutive ids get independent positions.
    let mut x = txn.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut fp = 0u32;
    for i in 0..FINGERPRINT_BITS {
        x ^= x >> 30;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        fp |= ((x % DIGEST_BITS as u64) as u32) << (10 * i);
    }
    fp
}

#[derive(Clone)]
struct Entry {
    digest: Digest,
    stale: bool,
    /// The waiting thread, so that a waiter that finds it in a cycle can wake it to check.
    thread: std::thread::Thread,
}

type Registry = Box<[CachePadded<Mutex<FxHashMap<TxnId, Entry>>>]>;

/// Digests of waiting transactions, wound marks and spinner count.
pub(crate) struct DreadState {
    registry: Registry,
    wounded: Mutex<FxHashSet<TxnId>>,
    spinners: AtomicUsize,
    cores: usize,
    /// Runnable threads of the machine (Linux `/proc/loadavg`), sampled at most once a
    /// millisecond: `(sample time in ms since `born`) << 20 | runnable`; 0 before the first.
    runnable: AtomicU64,
    born: std::time::Instant,
}

impl DreadState {
    pub fn new() -> Self {
        DreadState {
            registry: (0..REGISTRY_SHARDS)
                .map(|_| CachePadded::new(Mutex::new(FxHashMap::default())))
                .collect(),
            wounded: Mutex::new(FxHashSet::default()),
            spinners: AtomicUsize::new(0),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            runnable: AtomicU64::new(0),
            born: std::time::Instant::now(),
        }
    }

    fn shard(&self, txn: TxnId) -> &Mutex<FxHashMap<TxnId, Entry>> {
        &self.registry[(txn as usize) % REGISTRY_SHARDS]
    }

    /// The digest to use for `txn` (whose thread fingerprint is `fp`): its published digest
    /// while it waits and the digest is fresh, else just its fingerprint.
    pub fn digest_of(&self, txn: TxnId, fp: u32) -> Digest {
        match self.shard(txn).lock().get(&txn) {
            Some(e) if !e.stale => e.digest,
            _ => Digest::of_fingerprint(fp),
        }
    }

    /// Publishes `txn`'s refreshed digest (clearing a stale mark); the calling thread is the
    /// one that waits for `txn`.
    pub fn publish(&self, txn: TxnId, digest: Digest) {
        let mut shard = self.shard(txn).lock();
        match shard.get_mut(&txn) {
            Some(e) => {
                e.digest = digest;
                e.stale = false;
            }
            None => {
                shard.insert(
                    txn,
                    Entry {
                        digest,
                        stale: false,
                        thread: std::thread::current(),
                    },
                );
            }
        }
    }

    /// Wakes the thread waiting for `txn`, if it sleeps: a waiter found a cycle through `txn`
    /// whose victim `txn` is, and `txn` would otherwise notice only at its next nap's end.
    pub fn nudge(&self, txn: TxnId) {
        let t = self.shard(txn).lock().get(&txn).map(|e| e.thread.clone());
        if let Some(t) = t {
            t.unpark();
        }
    }

    /// Marks `txn`'s digest stale (sleep-and-backoff: its dependency was released).
    pub fn mark_stale(&self, txn: TxnId) {
        if let Some(e) = self.shard(txn).lock().get_mut(&txn) {
            e.stale = true;
        }
    }

    /// Forgets `txn`'s digest when it stops waiting.
    pub fn retire(&self, txn: TxnId) {
        self.shard(txn).lock().remove(&txn);
    }

    /// Wound-wait: marks `txn` for abort the next time it waits.
    pub fn wound(&self, txn: TxnId) {
        let mut w = self.wounded.lock();
        if w.len() >= WOUND_LIMIT {
            // Marks of transactions that finished before noticing would pile up; dropping
            // them only lets a wounded transaction keep waiting (its timeout still bounds it).
            w.clear();
        }
        w.insert(txn);
    }

    /// True (once) if `txn` was wounded.
    pub fn take_wound(&self, txn: TxnId) -> bool {
        self.wounded.lock().remove(&txn)
    }

    /// Hybrid waiting: may one more waiter spin? Registers it if so. Spinning pays while the
    /// runnable threads fit on the cores (a spinner then takes no CPU a lock holder needs);
    /// past that, waiters sleep. Where the machine's runnable count is unknown (not Linux),
    /// at most `cores - 1` waiters spin.
    pub fn try_spin(&self) -> bool {
        if self.machine_runnable().is_some_and(|r| r > self.cores) {
            return false;
        }
        let n = self.spinners.fetch_add(1, Ordering::AcqRel);
        if n < self.cores.saturating_sub(1).max(1) {
            true
        } else {
            self.spinners.fetch_sub(1, Ordering::AcqRel);
            false
        }
    }

    /// Runnable threads of the machine (the fourth field of `/proc/loadavg`, which counts
    /// the reader itself), re-read at most once a millisecond.
    fn machine_runnable(&self) -> Option<usize> {
        const NONE: u64 = (1 << 20) - 1;
        let now = self.born.elapsed().as_millis() as u64 + 1;
        let cached = self.runnable.load(Ordering::Relaxed);
        if cached != 0 && cached >> 20 == now {
            let r = cached & NONE;
            return (r != NONE).then_some(r as usize);
        }
        let r = std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| {
            let field = s.split_whitespace().nth(3)?;
            field.split('/').next()?.parse::<usize>().ok()
        });
        let v = r.map_or(NONE, |r| r.min(NONE as usize - 1) as u64);
        self.runnable.store(now << 20 | v, Ordering::Relaxed);
        r
    }

    /// Ends a spin registered by [`try_spin`](Self::try_spin).
    pub fn end_spin(&self) {
        self.spinners.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_have_three_bits_and_digests_union() {
        let a = Digest::of_fingerprint(txn_fingerprint(1));
        let bits: u32 = a.0.iter().map(|w| w.count_ones()).sum();
        assert!((1..=3).contains(&bits));
        let b = Digest::of_fingerprint(txn_fingerprint(2));
        assert_ne!(a, b);
        let mut u = a;
        u.union(&b);
        assert!(u.contains(&a) && u.contains(&b));
        assert!(a.contains(&a));
    }
}
