//! Lightweight intent locks (Kimura et al. 2012 §3.2, Algorithms 3 and 4).
//!
//! Intent locks on the database and on tables are taken by almost every transaction, so in a
//! lock table they are a hot spot of *physical* contention although they rarely conflict
//! *logically*. LIL keeps them out of the lock table: a global table holds, per object, only
//! counters of granted IS/IX/S/X locks, a version number and the number of waiting absolute
//! (S/X) requests, guarded by a critical section a few instructions long; each transaction
//! keeps its own private table of what it holds, read and written without synchronization.
//! A request that cannot be granted at once (only possible when an absolute lock is involved)
//! announces itself if absolute, then waits on a condition variable in 1 ms slices, re-trying
//! whenever the object's version moved; releases bump the version and broadcast only when
//! someone waits. Waiting absolute requests have priority: intent requests that conflict with
//! them are held back. Deadlocks are prevented by timeouts, longer for absolute requests, so
//! the main lock table never needs to know about intent locks.
//!
//! SIX is held as S plus IX.
//!
//! *Deviation:* the paper guards each object's counters with a spinlock. Here the four granted
//! counts and a `SLOW` flag are packed into one 64-bit word (module `object`): while nobody
//! waits on the object, a grant is one compare-and-swap of the word and a release one atomic
//! subtraction, with no clock read and no version bump. A request that cannot be granted at
//! once takes a mutex, announces itself (setting `SLOW`, which sends every later request of the
//! object through the mutex too, where waiting absolute requests keep their priority) and
//! waits as in Algorithm 3; while `SLOW` is set, releases bump the version and broadcast under
//! that mutex. The object's algorithm reaches its primitives only through the `sync` module
//! below, so `tests/intent_shuttle.rs` model-checks it with `shuttle`.

#[path = "intent/object.rs"]
mod object;

/// The primitives the object algorithm uses (`parking_lot` here; `shuttle`'s in the
/// model-checking test), with a by-value guard API shared by both.
mod sync {
    use std::time::Duration;

    pub(super) use std::sync::atomic::{AtomicU64, Ordering};

    /// A mutex whose `lock` returns the guard.
    #[derive(Default)]
    pub(super) struct Mutex<T>(parking_lot::Mutex<T>);

    impl<T> Mutex<T> {
        pub(super) fn new(v: T) -> Self {
            Mutex(parking_lot::Mutex::new(v))
        }

        pub(super) fn lock(&self) -> parking_lot::MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    /// A condition variable waiting in timed slices.
    #[derive(Default)]
    pub(super) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(super) fn new() -> Self {
            Condvar(parking_lot::Condvar::new())
        }

        pub(super) fn wait_for<'a, T>(
            &self,
            mut g: parking_lot::MutexGuard<'a, T>,
            d: Duration,
        ) -> parking_lot::MutexGuard<'a, T> {
            self.0.wait_for(&mut g, d);
            g
        }

        pub(super) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

use std::time::Duration;

use crossbeam_utils::CachePadded;

use object::{Object, Refused, IS, IX, S, X};

use super::{LockFailure, LockMode};

/// How an intent lock request ends: taken, or why not.
pub type Taken = Result<(), LockFailure>;

/// The global lightweight-intent-lock table: one slot per lockable object (object 0 is the
/// database, table `t` is object `t`).
///
/// ```
/// use shoal::lock::intent::{LightweightIntentLocks, PrivateIntents};
/// use shoal::lock::LockMode;
/// use std::time::Duration;
/// let lil = LightweightIntentLocks::new(16, Duration::from_millis(100), Duration::from_secs(1));
/// let (mut a, mut b) = (PrivateIntents::default(), PrivateIntents::default());
/// lil.lock(&mut a, 1, LockMode::IX).unwrap();
/// lil.lock(&mut b, 1, LockMode::IS).unwrap();          // intents are compatible
/// assert!(lil.try_lock(&mut b, 1, LockMode::S).is_err()); // S conflicts with a's IX
/// lil.release_all(&mut a);
/// lil.lock(&mut b, 1, LockMode::S).unwrap();
/// lil.release_all(&mut b);
/// ```
pub struct LightweightIntentLocks {
    objects: Box<[CachePadded<Object>]>,
    intent_timeout: Duration,
    absolute_timeout: Duration,
}

/// Entries a private table keeps inline (a transaction rarely locks more objects: the
/// database and a few tables), so building and dropping one allocates nothing.
const INLINE: usize = 8;

/// A transaction's private table of the intent locks it holds (no synchronization needed).
#[derive(Debug, Default, Clone)]
pub struct PrivateIntents {
    /// The first `len` entries: (object, bit mask of held modes IS=1 IX=2 S=4 X=8).
    inline: [(u32, u8); INLINE],
    len: usize,
    /// Entries beyond the inline ones.
    spill: Vec<(u32, u8)>,
}

impl PrivateIntents {
    fn entries(&self) -> impl Iterator<Item = &(u32, u8)> {
        self.inline[..self.len].iter().chain(self.spill.iter())
    }

    fn mask(&self, obj: u32) -> u8 {
        self.entries()
            .find(|(o, _)| *o == obj)
            .map_or(0, |(_, m)| *m)
    }

    fn add(&mut self, obj: u32, bit: u8) {
        let (inline, spill) = (&mut self.inline[..self.len], &mut self.spill);
        match inline
            .iter_mut()
            .chain(spill.iter_mut())
            .find(|(o, _)| *o == obj)
        {
            Some((_, m)) => *m |= bit,
            None if self.len < INLINE => {
                self.inline[self.len] = (obj, bit);
                self.len += 1;
            }
            None => self.spill.push((obj, bit)),
        }
    }

    /// True when nothing is held.
    ///
    /// ```
    /// assert!(shoal::lock::intent::PrivateIntents::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The counted modes that make up `m`.
fn parts(m: LockMode) -> &'static [usize] {
    match m {
        LockMode::IS => &[IS],
        LockMode::IX => &[IX],
        LockMode::S => &[S],
        LockMode::X => &[X],
        LockMode::SIX => &[S, IX],
        _ => &[],
    }
}

/// Does holding the modes in `mask` already give mode `p`?
fn covered(mask: u8, p: usize) -> bool {
    let has = |m: usize| mask & (1 << m) != 0;
    match p {
        IS => has(IS) || has(IX) || has(S) || has(X),
        IX => has(IX) || has(X),
        S => has(S) || has(X),
        _ => has(X),
    }
}

impl LightweightIntentLocks {
    /// A table for objects `0..capacity` (rounded up to a power of two), with the
    /// deadlock-prevention timeouts of intent and of absolute requests.
    ///
    /// ```
    /// use shoal::lock::intent::LightweightIntentLocks;
    /// use std::time::Duration;
    /// let lil = LightweightIntentLocks::new(100, Duration::ZERO, Duration::ZERO);
    /// assert_eq!(lil.capacity(), 128);
    /// ```
    pub fn new(capacity: usize, intent_timeout: Duration, absolute_timeout: Duration) -> Self {
        LightweightIntentLocks {
            objects: (0..capacity.max(1).next_power_of_two())
                .map(|_| CachePadded::new(Object::new()))
                .collect(),
            intent_timeout,
            absolute_timeout,
        }
    }

    /// Number of objects this table can lock.
    pub fn capacity(&self) -> usize {
        self.objects.len()
    }

    fn object(&self, obj: u32) -> &Object {
        // Ids beyond the capacity share an object (conservative). The length is a power of
        // two: a mask, not a division, on the hot path.
        &self.objects[obj as usize & (self.objects.len() - 1)]
    }

    /// Acquires `mode` (IS, IX, S, SIX or X) on `obj` for the transaction owning `mine`,
    /// waiting up to the timeout for its kind (Algorithm 3).
    pub fn lock(&self, mine: &mut PrivateIntents, obj: u32, mode: LockMode) -> Taken {
        self.lock_parts(mine, obj, mode, true)
    }

    /// Like [`lock`](Self::lock) but fails with [`LockFailure::WouldBlock`] instead of
    /// waiting (parts of a SIX granted before the failure stay held).
    pub fn try_lock(&self, mine: &mut PrivateIntents, obj: u32, mode: LockMode) -> Taken {
        self.lock_parts(mine, obj, mode, false)
    }

    /// Each part of `mode` in turn (SIX is S and IX), waiting or not.
    #[inline]
    fn lock_parts(&self, mine: &mut PrivateIntents, obj: u32, mode: LockMode, wait: bool) -> Taken {
        // Ids that share an object are one lock, for the transaction as for the others: it
        // records what it holds by object, so its own locks on another id of the same
        // object count as its own (counted as another's, they blocked it for ever).
        let obj = (obj as usize & (self.objects.len() - 1)) as u32;
        for &p in parts(mode) {
            self.lock_part(mine, obj, p, wait)?;
        }
        Ok(())
    }

    #[inline]
    fn lock_part(&self, mine: &mut PrivateIntents, obj: u32, p: usize, wait: bool) -> Taken {
        let held = mine.mask(obj);
        if covered(held, p) {
            return Ok(());
        }
        let timeout = if p == S || p == X {
            self.absolute_timeout
        } else {
            self.intent_timeout
        };
        match self.object(obj).acquire(held, p, wait.then_some(timeout)) {
            Ok(()) => {
                mine.add(obj, 1 << p);
                Ok(())
            }
            Err(Refused::WouldBlock) => Err(LockFailure::WouldBlock),
            Err(Refused::Timeout(waited)) => Err(LockFailure::Timeout {
                blocker: None,
                waited,
            }),
        }
    }

    /// Releases every intent lock the transaction holds (Algorithm 4).
    pub fn release_all(&self, mine: &mut PrivateIntents) {
        for &(obj, mask) in mine.entries() {
            self.object(obj).release(mask);
        }
        mine.len = 0;
        mine.spill.clear();
    }

    /// Granted counts of `obj` as [IS, IX, S, X] (for tests and statistics).
    pub fn granted(&self, obj: u32) -> [u32; 4] {
        self.object(obj).granted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    fn lil() -> LightweightIntentLocks {
        LightweightIntentLocks::new(8, Duration::from_millis(200), Duration::from_millis(400))
    }

    #[test]
    fn ids_that_share_an_object_are_one_lock_for_their_holder_too() {
        // One object for every id: the database (0) and table 4096 of a table of 4096
        // objects, say. Before, the holder's IX on id 0 counted as another's against its X
        // on id 1, and the request waited out its timeout.
        let t =
            LightweightIntentLocks::new(1, Duration::from_millis(200), Duration::from_millis(400));
        let (mut a, mut b) = (PrivateIntents::default(), PrivateIntents::default());
        t.lock(&mut a, 0, LockMode::IX).expect("IX on 0");
        t.lock(&mut a, 1, LockMode::X)
            .expect("X on 1, the same object");
        t.lock(&mut a, 0, LockMode::IS).expect("covered");
        assert_eq!(
            t.try_lock(&mut b, 0, LockMode::IS),
            Err(LockFailure::WouldBlock)
        );
        t.release_all(&mut a);
        assert_eq!(t.granted(0), [0; 4]);
        t.lock(&mut b, 0, LockMode::IS).expect("IS once released");
        t.release_all(&mut b);
    }

    #[test]
    fn table4_between_two_transactions() {
        use LockMode::*;
        let modes = [S, X, IS, IX, SIX];
        for a in modes {
            for b in modes {
                let t = lil();
                let (mut pa, mut pb) = (PrivateIntents::default(), PrivateIntents::default());
                t.lock(&mut pa, 1, a).expect("first");
                let got = t.try_lock(&mut pb, 1, b).is_ok();
                assert_eq!(got, a.compatible(b), "{a:?} then {b:?}");
                t.release_all(&mut pa);
                t.release_all(&mut pb);
                assert_eq!(t.granted(1), [0; 4]);
            }
        }
    }

    #[test]
    fn own_locks_do_not_conflict_and_convert() {
        let t = lil();
        let mut p = PrivateIntents::default();
        t.lock(&mut p, 0, LockMode::IS).expect("IS");
        t.lock(&mut p, 0, LockMode::IX).expect("IX");
        t.lock(&mut p, 0, LockMode::X).expect("upgrade to X alone");
        t.lock(&mut p, 0, LockMode::IS).expect("covered");
        assert_eq!(t.granted(0), [1, 1, 0, 1]);
        t.release_all(&mut p);
        assert_eq!(t.granted(0), [0; 4]);
    }

    #[test]
    fn waiting_absolute_lock_gets_priority_and_timeouts_prevent_deadlock() {
        let t = Arc::new(lil());
        let mut holder = PrivateIntents::default();
        t.lock(&mut holder, 2, LockMode::IX).expect("IX");
        let granted = Arc::new(AtomicBool::new(false));
        let h = {
            let (t, granted) = (Arc::clone(&t), Arc::clone(&granted));
            std::thread::spawn(move || {
                let mut p = PrivateIntents::default();
                let r = t.lock(&mut p, 2, LockMode::S);
                granted.store(r.is_ok(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
                t.release_all(&mut p);
                r
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        // While S waits, a new IX is held back even though IX is compatible with IX.
        let mut late = PrivateIntents::default();
        assert_eq!(
            t.try_lock(&mut late, 2, LockMode::IX),
            Err(LockFailure::WouldBlock)
        );
        // An IX that waits is granted once S is done.
        let waiter = {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                let mut p = PrivateIntents::default();
                let r = t.lock(&mut p, 2, LockMode::IX);
                t.release_all(&mut p);
                r
            })
        };
        // But IS (compatible with S) is not held back.
        assert!(t.try_lock(&mut late, 2, LockMode::IS).is_ok());
        t.release_all(&mut late);
        t.release_all(&mut holder);
        assert!(h.join().expect("join").is_ok());
        assert!(granted.load(Ordering::SeqCst));
        assert!(waiter.join().expect("join").is_ok());
        // Timeout: X behind a holder that never lets go.
        let mut a = PrivateIntents::default();
        t.lock(&mut a, 3, LockMode::IS).expect("IS");
        let mut b = PrivateIntents::default();
        assert!(matches!(
            t.lock(&mut b, 3, LockMode::X),
            Err(LockFailure::Timeout { .. })
        ));
        // The timed-out announcement is gone (and with it the slow path): intents flow again.
        assert_eq!(t.object(3).waiting(), (0, false));
        assert_eq!(t.object(2).waiting(), (0, false));
        assert!(t.try_lock(&mut b, 3, LockMode::IX).is_ok());
        t.release_all(&mut a);
        t.release_all(&mut b);
        assert_eq!(t.granted(3), [0; 4]);
    }

    #[test]
    fn stress_exclusive_excludes_everyone() {
        let t = Arc::new(LightweightIntentLocks::new(
            2,
            Duration::from_secs(5),
            Duration::from_secs(5),
        ));
        let inside = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = (0..16u64)
            .map(|i| {
                let (t, inside) = (Arc::clone(&t), Arc::clone(&inside));
                std::thread::spawn(move || {
                    for n in 0..300u64 {
                        let mut p = PrivateIntents::default();
                        let m = match (i + n) % 10 {
                            0 => LockMode::X,
                            1 => LockMode::S,
                            2..=5 => LockMode::IX,
                            _ => LockMode::IS,
                        };
                        t.lock(&mut p, 1, m).expect("lock");
                        let w = if m == LockMode::X { 1 << 32 } else { 1 };
                        let before = inside.fetch_add(w, Ordering::SeqCst);
                        if m == LockMode::X {
                            assert_eq!(before, 0, "X shared the object");
                        } else {
                            assert!(before < 1 << 32, "someone held X");
                        }
                        inside.fetch_sub(w, Ordering::SeqCst);
                        t.release_all(&mut p);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("join");
        }
        assert_eq!(t.granted(1), [0; 4]);
    }
}
