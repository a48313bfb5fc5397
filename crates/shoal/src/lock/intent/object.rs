//! One object of the lightweight intent lock table: the granted counters packed in one word
//! (a CAS fast path when nobody waits) and the slow path of Algorithm 3 behind a mutex.
//!
//! Reaches atomics, the mutex and the condition variable only through `super::sync`, so
//! `tests/intent_shuttle.rs` compiles this file against `shuttle`'s primitives.
//!
//! The word holds the granted IS, IX, S and X counts and a `SLOW` bit. `SLOW` is set and
//! cleared only under the mutex and, under it, is set exactly while some request waits
//! (`waiters > 0`); the waiting counts (`waiting_abs`, `waiters`) live under the mutex. So:
//!
//! - a request takes the fast path (one CAS of the word) only while `SLOW` is clear, that is
//!   when no absolute request waits and so no priority rule applies;
//! - a release is one atomic subtraction; only if the word it changed had `SLOW` set does it
//!   take the mutex to bump the version and wake the waiters;
//! - a waiter decides "not grantable" (and sets `SLOW`, by CAS on the value it judged) and reads
//!   the version it sleeps on while holding the mutex, and the releaser bumps under the same
//!   mutex: a release either precedes the waiter's check in the word's order (the check sees
//!   it) or follows it (it sees `SLOW` and wakes the waiter after the waiter sleeps). No
//!   wake-up is lost.

use std::time::{Duration, Instant};

use super::sync::{AtomicU64, Condvar, Mutex, Ordering};

/// Index of the counted modes.
pub(crate) const IS: usize = 0;
/// Intent exclusive.
pub(crate) const IX: usize = 1;
/// Shared (absolute).
pub(crate) const S: usize = 2;
/// Exclusive (absolute).
pub(crate) const X: usize = 3;

/// Compatibility of the four counted modes (Table 4 restricted to IS IX S X).
const COMPAT: [[bool; 4]; 4] = [
    // IS    IX     S      X
    [true, true, true, false],    // IS
    [true, true, false, false],   // IX
    [true, false, true, false],   // S
    [false, false, false, false], // X
];

/// Bit position of each mode's count in the word.
const SHIFT: [u32; 4] = [0, 21, 42, 62];
/// Width of each count: up to 2^21 - 1 concurrent IS and IX holders, 2^20 - 1 S holders and one
/// X holder (X conflicts with everything, own locks aside, so it is never granted twice). A
/// request that would overflow its count is treated as not grantable (it waits for a release).
const WIDTH: [u32; 4] = [21, 21, 20, 1];
/// Set while requests wait: every request and release then goes through the mutex.
const SLOW: u64 = 1 << 63;

const fn one(q: usize) -> u64 {
    1 << SHIFT[q]
}

const fn field(q: usize) -> u64 {
    ((1 << WIDTH[q]) - 1) << SHIFT[q]
}

/// The count fields that conflict with each mode.
const CONFLICT: [u64; 4] = {
    let mut c = [0u64; 4];
    let mut p = 0;
    while p < 4 {
        let mut q = 0;
        while q < 4 {
            if !COMPAT[p][q] {
                c[p] |= field(q);
            }
            q += 1;
        }
        p += 1;
    }
    c
};

/// The word contribution of one lock of each mode in a mask (IS=1 IX=2 S=4 X=8).
const WEIGHT: [u64; 16] = {
    let mut w = [0u64; 16];
    let mut m = 0;
    while m < 16 {
        let mut q = 0;
        while q < 4 {
            if m & (1 << q) != 0 {
                w[m] += one(q);
            }
            q += 1;
        }
        m += 1;
    }
    w
};

/// The word contribution of one lock of each mode in `mask` (IS=1 IX=2 S=4 X=8).
fn weight(mask: u8) -> u64 {
    WEIGHT[usize::from(mask & 0xf)]
}

/// Can `p` be granted to the holder of `mine` (whose own locks are part of `w`), ignoring
/// waiting requests?
fn grantable(w: u64, mine: u8, p: usize) -> bool {
    let others = (w & !SLOW) - weight(mine);
    others & CONFLICT[p] == 0 && w & field(p) != field(p)
}

/// Why a request was not granted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not grantable at once and the caller did not want to wait.
    WouldBlock,
    /// Waited this long, then gave up (deadlock prevention).
    Timeout(Duration),
}

#[derive(Default)]
struct Waiting {
    /// Waiting absolute requests: [S, X].
    abs: [u32; 2],
    /// Every waiting request (absolute or intent).
    waiters: u32,
}

/// One lockable object.
pub(crate) struct Object {
    word: AtomicU64,
    /// Bumped (under `waiting`) by every release or withdrawal that waiters may care about.
    version: AtomicU64,
    waiting: Mutex<Waiting>,
    wake: Condvar,
}

impl Object {
    pub(crate) fn new() -> Self {
        Object {
            word: AtomicU64::new(0),
            version: AtomicU64::new(0),
            waiting: Mutex::new(Waiting::default()),
            wake: Condvar::new(),
        }
    }

    /// Grants one more lock of mode `p` to the holder of `mine` (its modes held here), at once
    /// or, with `wait = Some(timeout)`, after waiting up to `timeout` (Algorithm 3).
    pub(crate) fn acquire(
        &self,
        mine: u8,
        p: usize,
        wait: Option<Duration>,
    ) -> Result<(), Refused> {
        let mut w = self.word.load(Ordering::Relaxed);
        while w & SLOW == 0 && grantable(w, mine, p) {
            match self.word.compare_exchange_weak(
                w,
                w + one(p),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => w = now,
            }
        }
        self.acquire_slow(mine, p, wait)
    }

    fn acquire_slow(&self, mine: u8, p: usize, wait: Option<Duration>) -> Result<(), Refused> {
        let start = Instant::now();
        let absolute = p == S || p == X;
        let mut g = self.waiting.lock();
        let mut announced = false;
        loop {
            // Waiting absolute requests go first: hold back the intents that conflict with
            // them.
            let held_back =
                !absolute && ((g.abs[0] > 0 && !COMPAT[p][S]) || (g.abs[1] > 0 && !COMPAT[p][X]));
            let mut w = self.word.load(Ordering::Acquire);
            let granted = loop {
                if !held_back && grantable(w, mine, p) {
                    match self.word.compare_exchange_weak(
                        w,
                        w + one(p),
                        Ordering::Acquire,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => break true,
                        Err(now) => w = now,
                    }
                } else if wait.is_none() || w & SLOW != 0 {
                    break false;
                } else {
                    // Judged on `w`: announce the slow path on that very value.
                    match self.word.compare_exchange_weak(
                        w,
                        w | SLOW,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => break false,
                        Err(now) => w = now,
                    }
                }
            };
            if granted {
                if announced {
                    self.withdraw(&mut g, p);
                }
                return Ok(());
            }
            let Some(timeout) = wait else {
                return Err(Refused::WouldBlock);
            };
            if !announced {
                if absolute {
                    g.abs[p - S] += 1;
                }
                g.waiters += 1;
                announced = true;
            }
            let waited = start.elapsed();
            if waited >= timeout {
                self.withdraw(&mut g, p);
                // Our announcement may have held others back: let them re-check.
                self.version.fetch_add(1, Ordering::AcqRel);
                self.wake.notify_all();
                return Err(Refused::Timeout(waited));
            }
            let base = self.version.load(Ordering::Acquire);
            while self.version.load(Ordering::Acquire) == base && start.elapsed() < timeout {
                g = self.wake.wait_for(g, Duration::from_millis(1));
            }
        }
    }

    /// Takes back an announced request of mode `p` (granted or given up); the last waiter
    /// re-opens the fast path.
    fn withdraw(&self, g: &mut Waiting, p: usize) {
        if p == S || p == X {
            g.abs[p - S] -= 1;
        }
        g.waiters -= 1;
        if g.waiters == 0 {
            self.word.fetch_and(!SLOW, Ordering::AcqRel);
        }
    }

    /// Releases one lock of each mode in `mask` (Algorithm 4).
    pub(crate) fn release(&self, mask: u8) {
        let old = self.word.fetch_sub(weight(mask), Ordering::Release);
        if old & SLOW != 0 {
            let _g = self.waiting.lock();
            self.version.fetch_add(1, Ordering::AcqRel);
            self.wake.notify_all();
        }
    }

    /// Granted counts as [IS, IX, S, X].
    pub(crate) fn granted(&self) -> [u32; 4] {
        let w = self.word.load(Ordering::Acquire);
        [IS, IX, S, X].map(|q| ((w & field(q)) >> SHIFT[q]) as u32)
    }

    /// Requests waiting now, and whether the slow path is on (for tests).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> (u32, bool) {
        let n = self.waiting.lock().waiters;
        (n, self.word.load(Ordering::Acquire) & SLOW != 0)
    }
}
