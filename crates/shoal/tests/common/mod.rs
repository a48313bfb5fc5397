//! Helpers shared by the integration tests: the concurrency-control modes under test, integer
//! value encoding, owned key ranges, the direct-serialization-graph checker ([`dsg`]) and the
//! step scheduler that drives interleaved transactions on their own threads ([`sched`]), and
//! the lock tables the lock-table tests run each scenario on ([`tables`]).
//!
//! Each test file does `mod common;` and uses only part of this, hence the `dead_code` allow.
#![allow(dead_code)]

pub mod dsg;
pub mod sched;
pub mod tables;

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};
use std::time::Duration;

use shoal::{ConcurrencyControl, Database, DeadlockPolicy, Options, WaitStyle};

/// The lock wait used by the tests: short, so that a test that wedges fails fast, long enough
/// that a loaded 2-core CI machine does not time out ordinary waits all the time.
pub const LOCK_TIMEOUT: Duration = Duration::from_millis(300);

/// Every deadlock policy, the timeout-only one first (the others resolve deadlocks without
/// waiting for the timeout).
pub const DEADLOCK_POLICIES: [DeadlockPolicy; 9] = [
    DeadlockPolicy::Timeout,
    DeadlockPolicy::WaitForGraph,
    DeadlockPolicy::NoWait,
    DeadlockPolicy::WaitDie,
    DeadlockPolicy::WoundWait,
    DeadlockPolicy::Dreadlocks(WaitStyle::Spin),
    DeadlockPolicy::Dreadlocks(WaitStyle::Sleep),
    DeadlockPolicy::Dreadlocks(WaitStyle::SleepBackoff),
    DeadlockPolicy::Dreadlocks(WaitStyle::Hybrid),
];

/// Options for one concurrency-control mode, with the tests' short lock timeout.
pub fn options(cc: ConcurrencyControl) -> Options {
    Options::default()
        .with_cc(cc)
        .with_lock_timeout(LOCK_TIMEOUT)
}

/// Every serializable concurrency-control mode the correctness tests run against. Later
/// issues (OCC, Doppel) add their modes here and every test picks them up.
pub fn modes() -> Vec<Options> {
    vec![
        options(ConcurrencyControl::TwoPhaseLocking),
        options(ConcurrencyControl::Optimistic),
        options(ConcurrencyControl::Doppel),
    ]
}

/// True for optimistic modes (Doppel's joined phases are OCC). Their transactions may observe an inconsistent state before
/// commit (Silo-style OCC is not opaque): commit-time validation then aborts them with a
/// retryable `Conflict`, so tests check consistency only of what committed.
pub fn optimistic(o: &Options) -> bool {
    matches!(
        o.cc,
        ConcurrencyControl::Optimistic | ConcurrencyControl::Doppel
    )
}

/// An inconsistency observed inside a running transaction: a bug under locking (panics);
/// under an optimistic mode the retryable conflict that commit validation would raise anyway.
pub fn inconsistent(o: &Options, what: &str) -> shoal::Error {
    assert!(optimistic(o), "{what} [{}]", mode_name(o));
    shoal::Error::Conflict {
        txn: 0,
        detail: format!("seen inside the transaction: {what}"),
    }
}

/// The outcome of a reader's commit in a test that checks what the reader saw: `true` if it
/// committed. Only an optimistic mode may refuse it, and only with a retryable `Conflict`.
pub fn reader_committed(o: &Options, r: shoal::Result<()>, what: &str) -> bool {
    match r {
        Ok(()) => true,
        Err(e @ shoal::Error::Conflict { .. }) if optimistic(o) => {
            assert!(e.is_retryable(), "{what}: {e}");
            false
        }
        Err(e) => panic!("{what}: reader commit failed: {e}"),
    }
}

/// A short name of a mode for messages.
pub fn mode_name(o: &Options) -> String {
    format!("{:?}", o.cc)
}

/// Encodes an integer value the way the engine's integer operations store it.
pub fn enc(v: i64) -> [u8; 8] {
    v.to_le_bytes()
}

/// Decodes an 8-byte little-endian integer value.
pub fn dec(v: &[u8]) -> i64 {
    i64::from_le_bytes(v.try_into().expect("an 8-byte integer value"))
}

/// Renders a key for messages.
pub fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}

/// An owned range of byte keys usable with `Transaction::scan`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    /// Lower bound.
    pub lo: Bound<Vec<u8>>,
    /// Upper bound.
    pub hi: Bound<Vec<u8>>,
}

impl KeyRange {
    /// A range from two bounds.
    pub fn new(lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> KeyRange {
        KeyRange {
            lo: lo.map(<[u8]>::to_vec),
            hi: hi.map(<[u8]>::to_vec),
        }
    }
    /// Every key.
    pub fn all() -> KeyRange {
        KeyRange {
            lo: Bound::Unbounded,
            hi: Bound::Unbounded,
        }
    }
    /// `[lo, hi)`.
    pub fn half_open(lo: &[u8], hi: &[u8]) -> KeyRange {
        Self::new(Bound::Included(lo), Bound::Excluded(hi))
    }
    /// Whether `k` lies in the range.
    pub fn contains_key(&self, k: &[u8]) -> bool {
        let lo_ok = match &self.lo {
            Bound::Included(b) => k >= b.as_slice(),
            Bound::Excluded(b) => k > b.as_slice(),
            Bound::Unbounded => true,
        };
        let hi_ok = match &self.hi {
            Bound::Included(b) => k <= b.as_slice(),
            Bound::Excluded(b) => k < b.as_slice(),
            Bound::Unbounded => true,
        };
        lo_ok && hi_ok
    }
}

impl RangeBounds<[u8]> for KeyRange {
    fn start_bound(&self) -> Bound<&[u8]> {
        self.lo.as_ref().map(Vec::as_slice)
    }
    fn end_bound(&self) -> Bound<&[u8]> {
        self.hi.as_ref().map(Vec::as_slice)
    }
}

impl std::fmt::Display for KeyRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.lo {
            Bound::Included(b) => write!(f, "[{}", show(b))?,
            Bound::Excluded(b) => write!(f, "({}", show(b))?,
            Bound::Unbounded => write!(f, "(-inf")?,
        }
        write!(f, ", ")?;
        match &self.hi {
            Bound::Included(b) => write!(f, "{}]", show(b)),
            Bound::Excluded(b) => write!(f, "{})", show(b)),
            Bound::Unbounded => write!(f, "+inf)"),
        }
    }
}

/// A seed for a test's random choices: `SHOAL_TEST_SEED` when set (to replay a failure),
/// otherwise from the clock. Printed so a failing run can be replayed.
pub fn seed(test: &str) -> u64 {
    let s = match std::env::var("SHOAL_TEST_SEED") {
        Ok(v) => v.parse().expect("SHOAL_TEST_SEED is a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos() as u64,
    };
    eprintln!("{test}: seed {s} (replay with SHOAL_TEST_SEED={s})");
    s
}

impl shoal::KeyRange for KeyRange {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (self.start_bound(), self.end_bound())
    }
}

/// Every row of `table`, read in one transaction.
pub fn dump(db: &Database, table: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let t = db.table(table).expect("table");
    db.run(|tx| tx.scan(&t, ..))
        .expect("scan")
        .into_iter()
        .collect()
}

/// The lock id of key `k` in table 1 (the lock-table tests' keys).
pub fn lock_key(k: u8) -> shoal::lock::LockId {
    shoal::lock::LockId::Key(1, vec![k].into())
}

/// Polls `cond` every millisecond; reaching `limit` first fails the test, naming `what`.
pub fn wait_until(what: &str, limit: Duration, cond: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Transactions 1 (older) and 2 each hold X on one key of `table(t)` and then ask for the
/// other's (waiting up to `timeout`), their threads' flush pipelines holding `pipes` pending
/// commits. Returns both requests' results, transaction 1's first.
pub fn two_cycle<T: Send + Sync + 'static>(
    t: &std::sync::Arc<T>,
    table: fn(&T) -> &dyn shoal::lock::LockTable,
    pipes: [u64; 2],
    timeout: Duration,
) -> Vec<Result<shoal::LockMode, shoal::lock::LockFailure>> {
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::{Arc, Barrier};
    let barrier = Arc::new(Barrier::new(2));
    let hs: Vec<_> = [(1u64, 1u8, 2u8, pipes[0]), (2, 2, 1, pipes[1])]
        .into_iter()
        .map(|(txn, a, b, pending)| {
            let (t, barrier) = (t.clone(), barrier.clone());
            std::thread::spawn(move || {
                let t = table(&t);
                let pipe = shoal::lock::dread::pipeline_handle();
                pipe.store(pending, SeqCst);
                t.lock(txn, &lock_key(a), shoal::LockMode::X, timeout)
                    .unwrap();
                barrier.wait();
                let r = t.lock(txn, &lock_key(b), shoal::LockMode::X, timeout);
                if r.is_ok() {
                    std::thread::sleep(Duration::from_millis(2));
                    t.unlock(txn, &lock_key(b));
                }
                t.unlock(txn, &lock_key(a));
                pipe.store(0, SeqCst);
                r
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}
