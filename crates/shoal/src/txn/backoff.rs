//! Retry backoff that adapts to the abort rate (used by [`Database::run`]).
//!
//! A transaction that aborted on a conflict (OCC validation, a deadlock, a lock timeout)
//! retries after a randomized delay. A fixed exponential schedule (1 µs doubling per
//! attempt) treats a rare collision and a hot spot alike: under heavy contention the first
//! retries come back within microseconds, collide with the same transactions again and form
//! a convoy of retries that wastes the cores on work that aborts.
//!
//! Here the window also scales with the abort rate that the thread has been seeing: each
//! thread keeps an exponentially weighted moving average of the outcomes of its attempts
//! (commit or retryable abort, weight 1/16 per attempt), in a thread-local, so the estimate
//! costs no shared write. The window before retry number `k` is
//! `1 µs × 2^min(k, 10) × (1 + 15 × rate)`, jittered uniformly: at a low abort rate it is the
//! plain exponential schedule (a collision is a fluke; retry at once), at a high one the
//! first retry already waits up to 16 times longer, so that the retries spread out over
//! about the time the conflicting transactions need to finish. Delays under 2 µs yield
//! instead of sleeping.
//!
//! [`Database::run`]: crate::Database::run

use std::cell::Cell;
use std::time::Duration;

/// Fixed point: 1.0 is `ONE`.
const ONE: u32 = 1 << 16;
/// The moving average's weight of a new outcome, as a shift (1/16).
const WEIGHT_SHIFT: u32 = 4;
/// The window at rate 1.0 is this many times the window at rate 0.
const MAX_SCALE: u64 = 16;
/// The window's first step.
const BASE_NS: u64 = 1_000;
/// Delays below this yield instead of sleeping (a sleep costs tens of microseconds).
const SLEEP_FROM_NS: u64 = 2_000;

thread_local! {
    /// This thread's abort rate (fixed point) and its random state.
    static STATE: Cell<(u32, u64)> = const { Cell::new((0, 0)) };
}

fn update(aborted: bool) -> (u32, u64) {
    STATE
        .try_with(|s| {
            let (rate, mut x) = s.get();
            let target = if aborted { ONE } else { 0 };
            let rate = if target >= rate {
                rate + ((target - rate) >> WEIGHT_SHIFT)
            } else {
                rate - ((rate - target) >> WEIGHT_SHIFT)
            };
            if x == 0 {
                // Seed from the address of a stack value and the clock: distinct per thread.
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1);
                x = t ^ (&x as *const u64 as u64).rotate_left(32) | 1;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.set((rate, x));
            (rate, x)
        })
        .unwrap_or((0, 1))
}

/// The backoff window before retry number `attempt` (from 1) at abort rate `rate`.
pub(crate) fn window_ns(attempt: u32, rate: u32) -> u64 {
    let base = BASE_NS << attempt.min(10);
    let scale_fp = ONE as u64 + (MAX_SCALE - 1) * rate.min(ONE) as u64;
    (base * scale_fp) >> 16
}

/// Records an abort and waits before retry number `attempt` (from 1).
pub(crate) fn after_abort(attempt: u32) {
    let (rate, x) = update(true);
    let ns = x % window_ns(attempt, rate).max(1);
    if ns < SLEEP_FROM_NS {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_nanos(ns));
    }
}

/// Records the final outcome of a transaction run (committed, or failed) and returns it.
pub(crate) fn finished<T>(res: crate::Result<T>) -> crate::Result<T> {
    let aborted = matches!(&res, Err(e) if e.is_retryable());
    let _ = STATE.try_with(|s| {
        let (rate, x) = s.get();
        let rate = if aborted {
            rate + ((ONE - rate.min(ONE)) >> WEIGHT_SHIFT)
        } else {
            rate - (rate >> WEIGHT_SHIFT)
        };
        s.set((rate, x));
    });
    res
}

/// This thread's abort-rate estimate, from 0.0 to 1.0.
#[cfg(test)]
fn rate() -> f64 {
    STATE.with(|s| s.get().0 as f64 / ONE as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_the_exponential_schedule_at_no_aborts_and_grows_with_the_rate() {
        assert_eq!(window_ns(1, 0), 2_000);
        assert_eq!(window_ns(3, 0), 8_000);
        assert_eq!(window_ns(20, 0), window_ns(10, 0), "capped at 2^10");
        assert_eq!(window_ns(1, ONE), 2_000 * MAX_SCALE);
        assert!(window_ns(1, ONE / 2) > window_ns(1, ONE / 4));
        assert!(window_ns(1, ONE / 4) > window_ns(1, 0));
    }

    #[test]
    fn the_rate_follows_the_outcomes_of_this_thread() {
        std::thread::spawn(|| {
            assert_eq!(rate(), 0.0);
            for _ in 0..200 {
                let _ = finished::<()>(Err(crate::Error::Conflict {
                    txn: 1,
                    detail: String::new(),
                }));
            }
            let high = rate();
            assert!(high > 0.9, "{high}");
            for _ in 0..200 {
                let _ = finished(Ok(()));
            }
            let low = rate();
            assert!(low < 0.1, "{low}");
            // An abort with its backoff counts too (a short one: the first retry).
            update(false);
            after_abort(1);
            assert!(rate() > low);
        })
        .join()
        .expect("thread");
    }
}
