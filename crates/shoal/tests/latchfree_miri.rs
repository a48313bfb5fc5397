//! Memory-safety tests of the latch-free lock table and the page accessors, written for Miri
//! (`CARGO_PROFILE_TEST_DEBUG_ASSERTIONS=false cargo +nightly miri test -p shoal --test
//! latchfree_miri`), where the first two reported undefined behaviour before the fixes
//! of the twenty-second session (a lock head freed behind a reference argument; a parked
//! waiter's entry taken over by a second thread of its transaction and freed under it).
//! They also run natively, where they check the outcomes.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use shoal::lock::latchfree::{LatchFreeLockTable, Params};
use shoal::lock::{DeadlockPolicy, LockId, LockMode, LockTable};

fn key(k: u8) -> LockId {
    LockId::Key(1, vec![k].into())
}

/// A tiny table whose pools keep nothing: every reclaimed entry or lock head goes back to
/// the allocator at once (the same happens with the default `Params` once a slot's pool
/// holds `FREE_CAP` of them).
fn tiny(free_cap: usize) -> LatchFreeLockTable {
    LatchFreeLockTable::with_params(
        DeadlockPolicy::Timeout,
        Params {
            buckets: 6,
            slots: 4,
            wait_registry: 4,
            retire_batch: 1,
            free_cap,
            sweep_every: 1,
            sweep_buckets: 6,
            poison_heads: false,
        },
    )
}

/// Lock, then unlock: the unlock kills the idle lock head, and `sweep_bucket` ->
/// `unlink_dead(g, link, cur, h: &LockHead)` unlinks it and reclaims it at once
/// (`retire_head` -> `reclaim_head` -> `pool_head`), which deallocates it when the pool is
/// full while `h`, a reference argument of `unlink_dead`, is still protected.
#[test]
fn unlock_frees_a_lock_head_behind_a_reference_argument() {
    let t = tiny(0);
    t.lock(1, &key(1), LockMode::X, Duration::from_secs(1))
        .unwrap();
    t.unlock(1, &key(1));
    assert!(t.is_free(&key(1)));
}

/// One transaction id used from two threads (nothing in the safe `LockTable` API forbids
/// it): thread A waits, parked and unpinned, holding its entry; the main thread, with the
/// same txn id, takes the waiting entry over (`acquire` finds it by txn), times out (which
/// leaves it live, not waiting), and unlocks it; the entry is then unlinked and reclaimed
/// at once while A still holds a pointer to it. When A wakes it writes to freed memory.
/// (Debug builds stop at the `debug_assert!(s & WAITING == 0)` in `acquire`; run with
/// `CARGO_PROFILE_TEST_DEBUG_ASSERTIONS=false` to see what a release build does.)
#[test]
fn same_txn_from_two_threads_reuses_a_parked_waiters_entry() {
    let t = Arc::new(tiny(0));
    let k = key(7);
    // Txn 1 holds X.
    t.lock(1, &k, LockMode::X, Duration::from_secs(1)).unwrap();
    // Thread A: txn 2 waits for S.
    let a = {
        let (t, k) = (t.clone(), k.clone());
        thread::spawn(move || t.lock(2, &k, LockMode::S, Duration::from_millis(300)))
    };
    while t.waiters(&k) < 1 {
        thread::yield_now();
    }
    // Thread C: txn 3 waits behind it (so A's entry is not the last and can be unlinked).
    let c = {
        let (t, k) = (t.clone(), k.clone());
        thread::spawn(move || t.lock(3, &k, LockMode::S, Duration::from_millis(300)))
    };
    while t.waiters(&k) < 2 {
        thread::yield_now();
    }
    // Txn 2 again, from this thread: takes over A's waiting entry, times out (the entry is
    // left granted N, not waiting), then unlocks it: unlinked and freed.
    let r = t.lock(2, &k, LockMode::S, Duration::from_millis(1));
    assert!(r.is_err(), "{r:?}");
    t.unlock(2, &k);
    // Let the waiters go; A's entry is no longer on the list, so only its timeout wakes it,
    // and it then reads and writes its (freed) entry.
    t.unlock(1, &k);
    let ra = a.join().unwrap();
    let rc = c.join().unwrap();
    // With the fix: the takeover is refused, A's entry stays linked and A is granted.
    assert_eq!(ra, Ok(LockMode::S));
    assert_eq!(rc, Ok(LockMode::S));
    t.unlock(2, &k);
    t.unlock(3, &k);
}

/// A few threads locking and unlocking two keys with small pools, so that entries and lock
/// heads are unlinked, reclaimed (at once or deferred), reused and freed while the others
/// walk the lists (a Miri data-race and use-after-free check of the reclamation scheme).
#[test]
fn concurrent_lock_unlock_with_small_pools() {
    let t = Arc::new(tiny(1));
    let hs: Vec<_> = (0..3u64)
        .map(|th| {
            let t = t.clone();
            thread::spawn(move || {
                for i in 0..6u64 {
                    let txn = 1 + th * 100 + i;
                    let (k1, k2) = (key((i % 2) as u8), key(((i + 1) % 2) as u8));
                    let m = if (th + i) % 3 == 0 {
                        LockMode::X
                    } else {
                        LockMode::S
                    };
                    // Ordered keys: no deadlocks; failures (timeouts) are fine here.
                    let (a, b) = if k1 < k2 { (k1, k2) } else { (k2, k1) };
                    let _ = t.lock(txn, &a, m, Duration::from_millis(200));
                    let _ = t.lock(txn, &b, LockMode::S, Duration::from_millis(200));
                    t.unlock(txn, &b);
                    t.unlock(txn, &a);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    t.reclaim();
    assert!(t.is_free(&key(0)) && t.is_free(&key(1)));
}

/// `Frame::read_bytes` (the page store's one unsafe copy) at every alignment, near both
/// ends of the page, with lengths that run past the page.
#[test]
fn read_bytes_at_the_page_edges() {
    use shoal::storage::page::{PageStore, PAGE_SIZE};
    let store = PageStore::new();
    let pid = store.alloc();
    let f = store.frame(pid).unwrap();
    let model: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 + i / 256) as u8).collect();
    f.write_bytes(0, &model);
    let offs = (0..24).chain(PAGE_SIZE - 24..PAGE_SIZE + 2);
    for off in offs {
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 31, 40] {
            let mut out = vec![0xAA];
            f.read_bytes(off, len, &mut out);
            let end = (off + len).min(PAGE_SIZE);
            let want: &[u8] = if off < end { &model[off..end] } else { &[] };
            assert_eq!(&out[1..], want, "off {off} len {len}");
        }
    }
}
