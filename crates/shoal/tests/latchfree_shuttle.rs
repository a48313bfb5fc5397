//! Model checking of the latch-free lock table with `shuttle`: the algorithm's source file
//! (`src/lock/latchfree/table.rs`) is compiled here a second time against shuttle's atomics,
//! fences and park/unpark (it reaches them only through `super::sync`), and shuttle's
//! randomized scheduler explores thread interleavings of it (bounded: a fixed number of
//! schedules per scenario, so it runs under plain `cargo test`). Shuttle treats every atomic
//! access as `SeqCst` and `park_timeout` as `park` without a timeout: a lost wake-up shows up
//! as a deadlock of the model, which shuttle reports as a failure.
//!
//! Scenarios: acquire/release races on one lock (exclusive, and a conversion racing a new
//! request), no lost wake-up (a waiter racing the releaser; and a withdrawn try_lock), and
//! reclamation with the smallest batches (every unlink triggers a reclamation attempt): a walk
//! that reaches a reclaimed entry trips the poison assertion in `walk`.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use shoal::lock::{DeadlockPolicy, LockFailure, LockId, LockMode, LockTable, TxnId};

/// The primitives `table.rs` uses, from shuttle. Parking is modelled without spurious
/// wake-ups (shuttle's own `park` may wake spuriously whenever another task can run, which
/// would hide a lost wake-up): a parked task returns only once its token was set by `unpark`.
mod sync {
    pub(super) use shuttle::sync::atomic::{
        fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub(super) use shuttle::thread::yield_now;

    use shuttle::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    shuttle::thread_local! {
        static TOKEN: Arc<AtomicBool> = Arc::new(AtomicBool::new(false));
    }

    /// A thread handle whose `unpark` sets the thread's token.
    #[derive(Clone, Debug)]
    pub(super) struct Thread {
        inner: shuttle::thread::Thread,
        token: Arc<AtomicBool>,
    }

    impl Thread {
        pub(super) fn id(&self) -> shuttle::thread::ThreadId {
            self.inner.id()
        }

        pub(super) fn unpark(&self) {
            self.token.store(true, Ordering::SeqCst);
            self.inner.unpark();
        }
    }

    pub(super) fn current() -> Thread {
        Thread {
            inner: shuttle::thread::current(),
            token: TOKEN.with(Arc::clone),
        }
    }

    /// No timeout and no spurious wake-up: returns once the token is (or was) set.
    pub(super) fn park_timeout(_: Duration) {
        let token = TOKEN.with(Arc::clone);
        while !token.swap(false, Ordering::SeqCst) {
            shuttle::thread::park();
        }
    }
}

#[allow(dead_code)]
#[path = "../src/lock/latchfree/table.rs"]
mod table;

use shuttle::thread;
use table::{LatchFreeLockTable, Params};
use LockMode::*;

const ITERATIONS: usize = 3000;
const LONG: Duration = Duration::from_secs(3600);

fn small_table() -> Arc<LatchFreeLockTable> {
    Arc::new(LatchFreeLockTable::with_params(
        DeadlockPolicy::Timeout,
        Params {
            buckets: 2,
            slots: 4,
            wait_registry: 4,
            retire_batch: 1,
            // Reclaimed entries stay allocated (poisoned), so a walk reaching one is caught.
            free_cap: 1 << 20,
            // Every lock-head creation sweeps both buckets: idle heads are killed and
            // unlinked all the time, racing with lookups and appends.
            sweep_every: 1,
            sweep_buckets: 2,
        },
    ))
}

fn key(k: u8) -> LockId {
    LockId::Key(1, vec![k].into_boxed_slice())
}

/// Writers add 1 << 32 to the key's in-section counter, readers add 1.
const WRITER: i64 = 1 << 32;

fn section(c: &AtomicI64, mode: LockMode) {
    let add = if mode == X { WRITER } else { 1 };
    let prev = c.fetch_add(add, SeqCst);
    if mode == X {
        assert_eq!(prev, 0, "X granted while another request is in the section");
    } else {
        assert!(prev < WRITER, "S granted while X is in the section");
    }
    thread::yield_now();
    c.fetch_sub(add, SeqCst);
}

#[test]
fn shuttle_exclusive_acquire_release_race() {
    shuttle::check_random(
        || {
            let t = small_table();
            let c = Arc::new(AtomicI64::new(0));
            let hs: Vec<_> = (0..3u64)
                .map(|i| {
                    let (t, c) = (t.clone(), c.clone());
                    thread::spawn(move || {
                        for round in 0..2u64 {
                            let txn: TxnId = 10 * round + i + 1;
                            let mode = if i == 2 { S } else { X };
                            assert_eq!(t.lock(txn, &key(1), mode, LONG), Ok(mode));
                            section(&c, mode);
                            t.unlock(txn, &key(1));
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            assert!(t.is_free(&key(1)));
            assert_eq!(t.queue_count(), 0);
        },
        ITERATIONS,
    );
}

#[test]
fn shuttle_conversion_races_new_request() {
    shuttle::check_random(
        || {
            let t = small_table();
            let c = Arc::new(AtomicI64::new(0));
            // T1 takes S and converts to X while T2 asks for S and T3 for X.
            let h1 = {
                let (t, c) = (t.clone(), c.clone());
                thread::spawn(move || {
                    assert_eq!(t.lock(1, &key(1), S, LONG), Ok(S));
                    assert!(c.fetch_add(1, SeqCst) < WRITER);
                    assert_eq!(t.lock(1, &key(1), X, LONG), Ok(X));
                    assert_eq!(c.fetch_add(WRITER - 1, SeqCst), 1, "conversion exclusive");
                    thread::yield_now();
                    c.fetch_sub(WRITER, SeqCst);
                    t.unlock(1, &key(1));
                })
            };
            let hs: Vec<_> = [(2, S), (3, X)]
                .into_iter()
                .map(|(txn, mode)| {
                    let (t, c) = (t.clone(), c.clone());
                    thread::spawn(move || {
                        assert_eq!(t.lock(txn, &key(1), mode, LONG), Ok(mode));
                        section(&c, mode);
                        t.unlock(txn, &key(1));
                    })
                })
                .collect();
            h1.join().unwrap();
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(t.queue_count(), 0);
        },
        ITERATIONS,
    );
}

#[test]
fn shuttle_no_lost_wakeup() {
    shuttle::check_random(
        || {
            // Jung Fig. 6: the releaser (T1) races the requesters; a lost wake-up leaves a
            // requester parked forever, which shuttle reports as a deadlock.
            let t = small_table();
            t.lock(1, &key(1), X, LONG).unwrap();
            let released = Arc::new(AtomicBool::new(false));
            let hs: Vec<_> = [(2, X), (3, S), (4, S)]
                .into_iter()
                .map(|(txn, mode)| {
                    let (t, released) = (t.clone(), released.clone());
                    thread::spawn(move || {
                        assert_eq!(t.lock(txn, &key(1), mode, LONG), Ok(mode));
                        assert!(released.load(SeqCst));
                        t.unlock(txn, &key(1));
                    })
                })
                .collect();
            thread::yield_now();
            released.store(true, SeqCst);
            t.unlock(1, &key(1));
            for h in hs {
                h.join().unwrap();
            }
            assert!(t.is_free(&key(1)));
        },
        ITERATIONS,
    );
}

#[test]
fn shuttle_withdrawn_try_lock_wakes_waiter() {
    shuttle::check_random(
        || {
            // T1 holds S; T3 waits for S behind nothing; T2's try_lock(X) publishes a waiting
            // request for a moment (which may block T3 by FIFO) and withdraws it.
            let t = small_table();
            t.lock(1, &key(1), S, LONG).unwrap();
            let h2 = {
                let t = t.clone();
                thread::spawn(move || {
                    assert_eq!(t.try_lock(2, &key(1), X), Err(LockFailure::WouldBlock));
                })
            };
            let h3 = {
                let t = t.clone();
                thread::spawn(move || {
                    assert_eq!(t.lock(3, &key(1), S, LONG), Ok(S));
                    t.unlock(3, &key(1));
                })
            };
            h2.join().unwrap();
            h3.join().unwrap();
            t.unlock(1, &key(1));
            assert!(t.is_free(&key(1)));
        },
        ITERATIONS,
    );
}

#[test]
fn shuttle_reclamation_never_frees_reachable_entry() {
    shuttle::check_random(
        || {
            // Retire batch 1: every unlink tries to advance the epoch and reclaim. Walkers on
            // the same list assert (in `walk`) that they never reach a reclaimed entry.
            let t = small_table();
            let hs: Vec<_> = (0..2u64)
                .map(|i| {
                    let t = t.clone();
                    thread::spawn(move || {
                        for round in 0..3u64 {
                            let txn = 100 * i + round + 1;
                            t.lock(txn, &key(1), S, LONG).unwrap();
                            t.lock(txn, &key(2), X, LONG).unwrap();
                            t.unlock(txn, &key(1));
                            t.unlock(txn, &key(2));
                        }
                    })
                })
                .collect();
            let walker = {
                let t = t.clone();
                thread::spawn(move || {
                    for _ in 0..3 {
                        t.reclaim();
                        let _ = t.is_free(&key(1));
                        let _ = t.waiters(&key(2));
                        if t.try_lock(999, &key(1), S).is_ok() {
                            t.unlock(999, &key(1));
                        }
                    }
                })
            };
            for h in hs {
                h.join().unwrap();
            }
            walker.join().unwrap();
            assert_eq!(t.queue_count(), 0);
            // 2 lock heads keep their last entry; the rest is retired, pooled or reclaimed.
            assert!(t.allocated_entries() <= 8 * table::ALLOC_BATCH);
        },
        ITERATIONS,
    );
}
