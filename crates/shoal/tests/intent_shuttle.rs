//! Model checking of one lightweight-intent-lock object (`src/lock/intent/object.rs`: the
//! packed-word CAS fast path and the mutex slow path) with `shuttle`: the file is compiled here
//! a second time against shuttle's atomics, mutex and condition variable (it reaches them only
//! through `super::sync`), and shuttle's randomized scheduler explores thread interleavings
//! (a fixed number of schedules per scenario, so it runs under plain `cargo test`). Shuttle
//! treats every atomic access as `SeqCst`, and its condition variable neither times out nor
//! wakes spuriously, so the 1 ms wait slices become plain waits: a lost wake-up shows up as a
//! deadlock of the model, which shuttle reports as a failure.
//!
//! Scenarios: grants race releases on the fast path and into the slow path (compatibility of
//! every granted pair checked by an in-section counter), a waiter racing the releaser (no lost
//! wake-up), a waiting absolute request holding back intents and a try-lock and an immediately
//! timed-out request withdrawing while others wait (the slow path ends and the fast path
//! reopens).

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// The primitives `object.rs` uses, from shuttle, with the by-value guard API of the crate's
/// own `sync` module.
mod sync {
    use std::time::Duration;

    pub(super) use shuttle::sync::atomic::{AtomicU64, Ordering};

    pub(super) struct Mutex<T>(shuttle::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(super) fn new(v: T) -> Self {
            Mutex(shuttle::sync::Mutex::new(v))
        }

        pub(super) fn lock(&self) -> shuttle::sync::MutexGuard<'_, T> {
            self.0.lock().expect("poisoned")
        }
    }

    pub(super) struct Condvar(shuttle::sync::Condvar);

    impl Condvar {
        pub(super) fn new() -> Self {
            Condvar(shuttle::sync::Condvar::new())
        }

        /// No timeout: returns only once notified.
        pub(super) fn wait_for<'a, T>(
            &self,
            g: shuttle::sync::MutexGuard<'a, T>,
            _: Duration,
        ) -> shuttle::sync::MutexGuard<'a, T> {
            self.0.wait(g).expect("poisoned")
        }

        pub(super) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

#[allow(dead_code)]
#[path = "../src/lock/intent/object.rs"]
mod object;

use object::{Object, Refused, IS, IX, S, X};
use shuttle::thread;

const ITERATIONS: usize = 3000;
const LONG: Option<Duration> = Some(Duration::from_secs(3600));

/// Compatibility of IS IX S X (Table 4).
const COMPAT: [[bool; 4]; 4] = [
    [true, true, true, false],
    [true, true, false, false],
    [true, false, true, false],
    [false, false, false, false],
];

/// Holders in the section, 16 bits per mode: entering with `p` checks that no incompatible
/// mode is inside.
fn section(c: &AtomicU64, p: usize) {
    let prev = c.fetch_add(1 << (16 * p), SeqCst);
    for (q, &ok) in COMPAT[p].iter().enumerate() {
        if !ok {
            assert_eq!(
                (prev >> (16 * q)) & 0xffff,
                0,
                "mode {p} granted beside {q}"
            );
        }
    }
    thread::yield_now();
    c.fetch_sub(1 << (16 * p), SeqCst);
}

fn run_threads(o: &Arc<Object>, plans: &[&'static [usize]]) {
    let c = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = plans
        .iter()
        .map(|&plan| {
            let (o, c) = (Arc::clone(o), Arc::clone(&c));
            thread::spawn(move || {
                for &p in plan {
                    assert_eq!(o.acquire(0, p, LONG), Ok(()));
                    section(&c, p);
                    o.release(1 << p);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("join");
    }
}

fn assert_idle(o: &Object) {
    assert_eq!(o.granted(), [0; 4]);
    assert_eq!(o.waiting(), (0, false));
}

#[test]
fn shuttle_grants_and_releases_race() {
    shuttle::check_random(
        || {
            let o = Arc::new(Object::new());
            run_threads(&o, &[&[IX, X], &[IS, S], &[X, IX]]);
            assert_idle(&o);
        },
        ITERATIONS,
    );
}

/// One thread holds `held`; a thread per mode of `waiters` acquires it (waiting where it
/// conflicts), optionally yields while holding it, and releases; then the holder releases.
/// Every acquire must succeed and the object must end idle.
fn holder_then_waiters(held: usize, waiters: &'static [usize], yield_holding: bool) {
    shuttle::check_random(
        move || {
            let o = Arc::new(Object::new());
            assert_eq!(o.acquire(0, held, LONG), Ok(()));
            let hs: Vec<_> = waiters
                .iter()
                .map(|&p| {
                    let o = Arc::clone(&o);
                    thread::spawn(move || {
                        assert_eq!(o.acquire(0, p, LONG), Ok(()));
                        if yield_holding {
                            thread::yield_now();
                        }
                        o.release(1 << p);
                    })
                })
                .collect();
            thread::yield_now();
            o.release(1 << held);
            for h in hs {
                h.join().expect("join");
            }
            assert_idle(&o);
        },
        ITERATIONS,
    );
}

#[test]
fn shuttle_no_lost_wakeup() {
    // The holder releases while the others decide to wait.
    holder_then_waiters(X, &[IS, S], false);
}

#[test]
fn shuttle_waiting_absolute_holds_back_intents() {
    // An IX holder; S waits for it; a later IX may be held back behind S but must get
    // through once S is done; IS never conflicts with S.
    holder_then_waiters(IX, &[S, IX, IS], true);
}

#[test]
fn shuttle_withdrawals_reopen_the_fast_path() {
    shuttle::check_random(
        || {
            let o = Arc::new(Object::new());
            assert_eq!(o.acquire(0, IS, LONG), Ok(()));
            // X waits for the IS holder; beside it an IX try-lock, an IX and an X with no time
            // to wait give up (or, before X announces itself, the IXs are granted).
            let waiter = {
                let o = Arc::clone(&o);
                thread::spawn(move || {
                    assert_eq!(o.acquire(0, X, LONG), Ok(()));
                    o.release(1 << X);
                })
            };
            let quitters: Vec<_> = [
                (IX, None),
                (IX, Some(Duration::ZERO)),
                (X, Some(Duration::ZERO)),
            ]
            .into_iter()
            .map(|(p, wait)| {
                let o = Arc::clone(&o);
                thread::spawn(move || match o.acquire(0, p, wait) {
                    Ok(()) => o.release(1 << p),
                    Err(Refused::WouldBlock) => assert!(wait.is_none()),
                    Err(Refused::Timeout(_)) => assert!(wait.is_some()),
                })
            })
            .collect();
            for h in quitters {
                h.join().expect("join");
            }
            o.release(1 << IS);
            waiter.join().expect("join");
            assert_idle(&o);
            // Own locks: a holder of IS and IX upgrades to X alone.
            assert_eq!(o.acquire(0, IS, LONG), Ok(()));
            assert_eq!(o.acquire(1, IX, LONG), Ok(()));
            assert_eq!(o.acquire(3, X, LONG), Ok(()));
            assert_eq!(o.granted(), [1, 1, 0, 1]);
            o.release(0b1011);
            assert_idle(&o);
        },
        ITERATIONS,
    );
}
