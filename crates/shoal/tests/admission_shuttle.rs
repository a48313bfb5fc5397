//! Model checking of the admission gate's slot hand-over with `shuttle`: the algorithm's
//! source file (`src/admission/gate.rs`) is compiled here a second time against shuttle's
//! atomics, mutex and park/unpark (it reaches them only through `super::sync`), and
//! shuttle's randomized scheduler explores thread interleavings of it (a fixed number of
//! schedules per scenario, so it runs under plain `cargo test`). Parking is modelled without
//! spurious wake-ups: a lost wake-up leaves a thread parked forever, which shuttle reports as
//! a deadlock.
//!
//! Scenarios: the slot limit holds while threads take, keep, take back, steal and give up
//! slots (an in-section counter); a slot given up while a thread queues is not lost (the
//! releaser's check of the queue races the waiter's count-then-scan); a slot kept by a
//! thread that never comes back reaches the waiter through the watchdog's rounds; and a
//! resumer queued behind nothing is served.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

#[path = "common/shuttle_park.rs"]
mod park;

/// The primitives `gate.rs` uses, from shuttle (parking: `common/shuttle_park.rs`; the
/// gate's escape is off in the model, `park_timeout` is `park`).
mod sync {
    pub(super) use shuttle::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    pub(super) use super::park::{current, park, park_timeout, Thread};

    /// The queue's mutex, with the one method the gate uses.
    pub(super) struct Mutex<T>(shuttle::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(super) fn new(t: T) -> Self {
            Mutex(shuttle::sync::Mutex::new(t))
        }

        pub(super) fn lock(&self) -> shuttle::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}

#[allow(dead_code)]
#[path = "../src/admission/gate.rs"]
mod gate;

use gate::Gate;
use shuttle::thread;

const ITERATIONS: usize = 3000;

#[test]
fn shuttle_slot_limit_holds_through_keep_steal_and_release() {
    shuttle::check_random(
        || {
            let g = Arc::new(Gate::new(2, None));
            let inside = Arc::new(AtomicUsize::new(0));
            let hs: Vec<_> = (1..=3u32)
                .map(|token| {
                    let (g, inside) = (Arc::clone(&g), Arc::clone(&inside));
                    thread::spawn(move || {
                        let mut kept: Option<(usize, u64)> = None;
                        for round in 0..3u32 {
                            let i = match kept.take() {
                                Some((i, w)) if g.reclaim(i, w, token) => i,
                                _ => g.acquire(token, round == 1, || {}).unwrap(),
                            };
                            assert!(inside.fetch_add(1, SeqCst) < 2, "a third running section");
                            thread::yield_now();
                            inside.fetch_sub(1, SeqCst);
                            if (round + token) % 2 == 0 {
                                g.release(i);
                            } else {
                                kept = Some((i, g.keep(i, token, round)));
                            }
                        }
                        if let Some((i, w)) = kept {
                            g.release_kept(i, w, token);
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            let s = g.stats();
            assert_eq!((s.busy, s.idle, s.waiting), (0, 0, 0), "{s:?}");
        },
        ITERATIONS,
    );
}

#[test]
fn shuttle_release_racing_a_queueing_thread_loses_no_slot() {
    shuttle::check_random(
        || {
            let g = Arc::new(Gate::new(2, None));
            let a = g.acquire(1, false, || {}).unwrap();
            let b = g.acquire(2, false, || {}).unwrap();
            let released = Arc::new(AtomicBool::new(false));
            let waiters: Vec<_> = [(3u32, false), (4, true)]
                .into_iter()
                .map(|(token, resume)| {
                    let (g, released) = (Arc::clone(&g), Arc::clone(&released));
                    thread::spawn(move || {
                        let i = g.acquire(token, resume, || {}).unwrap();
                        assert!(released.load(SeqCst), "a slot before any was given up");
                        g.release(i);
                    })
                })
                .collect();
            let r = {
                let (g, released) = (Arc::clone(&g), Arc::clone(&released));
                thread::spawn(move || {
                    released.store(true, SeqCst);
                    g.release(a);
                })
            };
            thread::yield_now();
            // The main thread keeps `b` for a while, then gives it up as well.
            r.join().unwrap();
            g.release(b);
            for h in waiters {
                h.join().unwrap();
            }
            assert_eq!(g.stats().busy, 0);
        },
        ITERATIONS,
    );
}

#[test]
fn shuttle_watchdog_hands_over_a_slot_kept_by_a_thread_that_never_returns() {
    shuttle::check_random(
        || {
            let g = Arc::new(Gate::new(1, None));
            let done = Arc::new(AtomicBool::new(false));
            // The owner runs, commits and keeps its slot, and never begins again.
            let owner = {
                let g = Arc::clone(&g);
                thread::spawn(move || {
                    let i = g.acquire(1, false, || {}).unwrap();
                    thread::yield_now();
                    g.keep(i, 1, 1);
                })
            };
            let waiter = {
                let (g, done) = (Arc::clone(&g), Arc::clone(&done));
                thread::spawn(move || {
                    let i = g.acquire(2, false, || {}).unwrap();
                    done.store(true, SeqCst);
                    g.release(i);
                })
            };
            let watchdog = {
                let (g, done) = (Arc::clone(&g), Arc::clone(&done));
                thread::spawn(move || {
                    let mut seen = vec![gate::FREE; 1];
                    while !done.load(SeqCst) {
                        g.police(&mut seen);
                        thread::yield_now();
                    }
                })
            };
            owner.join().unwrap();
            waiter.join().unwrap();
            watchdog.join().unwrap();
            let s = g.stats();
            assert_eq!((s.busy, s.waiting), (0, 0), "{s:?}");
        },
        ITERATIONS,
    );
}
