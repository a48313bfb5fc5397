//! The lock tables' common behaviours: every scenario runs over every table `Database` builds
//! (the sharded simple table, its one-shard latched form, and the latch-free table of Jung et
//! al. 2013), each as a test of its own (`common::tables::every_table`); then, for the
//! latch-free table, a 256-thread stress test, the bounded memory tests, and engine runs
//! (bank invariant) with `LockTableKind::LatchFree`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex as StdMutex};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::lock::latchfree::{LatchFreeLockTable, Params, ALLOC_BATCH};
use shoal::lock::{DeadlockPolicy, LockFailure, LockId, LockMode, LockTable, TxnId, Victim};
use shoal::{Database, LockTableKind, Options};

use common::tables::{every_table, AnyTable};

use LockMode::*;

const LONG: Duration = Duration::from_secs(10);

every_table!(
    uncontended_lock_convert_unlock,
    fifo_order_of_x_waiters,
    waiting_conversion_blocks_later_compatible_request,
    conversion_granted_ahead_of_waiting_new_request,
    timeout_withdraws_request_and_leaves_queue_clean,
    timeout_of_first_waiter_grants_the_next,
    try_lock_leaves_nothing_behind,
    key_range_modes_on_one_key,
    intent_locks_follow_table4,
    deadlock_two_cycle,
    deadlock_three_cycle,
    deadlock_upgrade,
    waiting_chain_is_not_a_deadlock,
    timeout_policy_breaks_deadlock_by_timeout,
    many_keys_queue_count,
    tags_outlive_requests,
    unlock_all_releases_each_lock_with_its_tag_and_grants_waiters,
);

fn key(k: u8) -> LockId {
    common::lock_key(k)
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    common::wait_until(what, LONG, cond)
}

/// A table of `kind` with deadlock `policy`.
fn table(kind: LockTableKind, policy: DeadlockPolicy) -> Arc<AnyTable> {
    AnyTable::new(kind, policy, Victim::KillYoung)
}

fn uncontended_lock_convert_unlock(kind: LockTableKind) {
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let k = key(1);
    assert_eq!(t.lock(1, &k, SN, LONG), Ok(SN));
    assert_eq!(t.lock(1, &k, NS, LONG), Ok(S));
    assert_eq!(t.lock(1, &k, SN, LONG), Ok(S), "covered: the held mode");
    assert_eq!(t.lock(2, &k, NS, LONG), Ok(NS));
    assert_eq!(t.try_lock(3, &k, XN), Err(LockFailure::WouldBlock));
    assert_eq!(t.held_mode(1, &k), S);
    assert_eq!(t.lock(4, &k, N, LONG), Ok(N));
    assert_eq!(t.held_mode(4, &k), N);
    t.unlock(1, &k);
    t.unlock(1, &k); // not held: no-op
    assert!(!t.is_free(&k));
    t.unlock(2, &k);
    assert!(t.is_free(&k));
    assert_eq!(t.lock(5, &key(9), N, LONG), Ok(N));
    assert!(t.is_free(&key(9)));
    assert_eq!(t.queue_count(), 0);
}

/// Transaction `txn` asks for `mode` on `id` in a thread of its own (waiting up to
/// `timeout`), releases it once granted, and returns the answer.
fn spawn_lock(
    t: &Arc<AnyTable>,
    txn: TxnId,
    id: &LockId,
    mode: LockMode,
    timeout: Duration,
) -> thread::JoinHandle<Result<LockMode, LockFailure>> {
    let (t, id) = (t.clone(), id.clone());
    thread::spawn(move || {
        let r = t.lock(txn, &id, mode, timeout);
        t.unlock(txn, &id);
        r
    })
}

fn fifo_order_of_x_waiters(kind: LockTableKind) {
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let k = key(1);
    t.lock(100, &k, X, LONG).unwrap();
    let order = Arc::new(StdMutex::new(Vec::new()));
    let mut handles = Vec::new();
    for txn in 1..=5u64 {
        let (t2, k2, order2) = (t.clone(), k.clone(), order.clone());
        handles.push(thread::spawn(move || {
            t2.lock(txn, &k2, X, LONG).unwrap();
            order2.lock().unwrap().push(txn);
            t2.unlock(txn, &k2);
        }));
        wait_until("enqueue", || t.waiters(&k) == txn as usize);
    }
    t.unlock(100, &k);
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4, 5]);
    assert!(t.is_free(&k));
    assert_eq!(t.queue_count(), 0);
}

fn waiting_conversion_blocks_later_compatible_request(kind: LockTableKind) {
    // Kimura §4.2: A and B hold SN; A converts to XN and waits for B; C's SN request is
    // compatible with every granted mode but must wait behind A's conversion.
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let k = key(7);
    let (a, b, c) = (1, 2, 3);
    t.lock(a, &k, SN, LONG).unwrap();
    t.lock(b, &k, SN, LONG).unwrap();
    let log = Arc::new(StdMutex::new(Vec::new()));
    let ha = {
        let (t, k, log) = (t.clone(), k.clone(), log.clone());
        thread::spawn(move || {
            assert_eq!(t.lock(a, &k, XN, LONG), Ok(XN));
            log.lock().unwrap().push(a);
            thread::sleep(Duration::from_millis(20));
            log.lock().unwrap().push(a + 100);
            t.unlock(a, &k);
        })
    };
    wait_until("A's conversion waits", || t.waiters(&k) == 1);
    assert_eq!(t.try_lock(c, &k, SN), Err(LockFailure::WouldBlock));
    assert_eq!(t.waiters(&k), 1, "try_lock left nothing behind");
    let hc = {
        let (t, k, log) = (t.clone(), k.clone(), log.clone());
        thread::spawn(move || {
            assert_eq!(t.lock(c, &k, SN, LONG), Ok(SN));
            log.lock().unwrap().push(c);
            t.unlock(c, &k);
        })
    };
    wait_until("C waits", || t.waiters(&k) == 2);
    thread::sleep(Duration::from_millis(20));
    assert!(
        log.lock().unwrap().is_empty(),
        "nobody granted while B holds SN"
    );
    assert_eq!(t.held_mode(c, &k), N);
    t.unlock(b, &k);
    ha.join().unwrap();
    hc.join().unwrap();
    assert_eq!(*log.lock().unwrap(), vec![a, a + 100, c]);
    assert!(t.is_free(&k));
}

fn conversion_granted_ahead_of_waiting_new_request(kind: LockTableKind) {
    // A holds IS; B waits for X; A converts IS -> IX: compatible with every other granted
    // mode, so it is granted although B waits.
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let tab = LockId::Table(3);
    t.lock(1, &tab, IS, LONG).unwrap();
    let hb = spawn_lock(&t, 2, &tab, X, LONG);
    wait_until("B waits", || t.waiters(&tab) == 1);
    assert_eq!(t.try_lock(1, &tab, IX), Ok(IX));
    assert_eq!(
        t.try_lock(3, &tab, IS),
        Err(LockFailure::WouldBlock),
        "FIFO behind B"
    );
    t.unlock(1, &tab);
    assert_eq!(hb.join().unwrap(), Ok(X));
    assert!(t.is_free(&tab));
}

fn timeout_withdraws_request_and_leaves_queue_clean(kind: LockTableKind) {
    for policy in [DeadlockPolicy::Timeout, DeadlockPolicy::WaitForGraph] {
        let t = table(kind, policy);
        let k = key(1);
        t.lock(1, &k, X, LONG).unwrap();
        let to = Duration::from_millis(40);
        let start = Instant::now();
        match t.lock(2, &k, S, to) {
            Err(LockFailure::Timeout { blocker, waited }) => {
                assert_eq!(blocker, Some(1));
                assert!(waited >= to && start.elapsed() >= to);
            }
            other => panic!("expected timeout, got {other:?}"),
        }
        assert_eq!(t.waiters(&k), 0);
        t.unlock(1, &k);
        assert!(t.is_free(&k), "{policy:?}");

        // A timed-out conversion falls back to its granted mode.
        t.lock(1, &k, S, LONG).unwrap();
        t.lock(2, &k, S, LONG).unwrap();
        assert!(matches!(
            t.lock(1, &k, X, to),
            Err(LockFailure::Timeout {
                blocker: Some(2),
                ..
            })
        ));
        assert_eq!(t.held_mode(1, &k), S);
        t.unlock(2, &k);
        assert_eq!(t.try_lock(3, &k, X), Err(LockFailure::WouldBlock));
        t.unlock(1, &k);
        assert!(t.is_free(&k));
        assert_eq!(t.queue_count(), 0);
    }
}

fn timeout_of_first_waiter_grants_the_next(kind: LockTableKind) {
    // A holds S; B waits X (times out); C waits S behind B. When B gives up, C becomes
    // grantable and must be woken.
    let t = table(kind, DeadlockPolicy::Timeout);
    let k = key(2);
    t.lock(1, &k, S, LONG).unwrap();
    // B's wait must outlast C's thread start and enqueue: 60 ms did not on a loaded
    // 2-core machine (B gave up first and C was granted at once, never waiting).
    let hb = spawn_lock(&t, 2, &k, X, Duration::from_millis(400));
    wait_until("B waits", || t.waiters(&k) == 1);
    let hc = spawn_lock(&t, 3, &k, S, LONG);
    wait_until("C waits", || t.waiters(&k) == 2);
    assert!(matches!(
        hb.join().unwrap(),
        Err(LockFailure::Timeout { .. })
    ));
    assert_eq!(hc.join().unwrap(), Ok(S));
    t.unlock(1, &k);
    assert_eq!(t.queue_count(), 0);
}

fn try_lock_leaves_nothing_behind(kind: LockTableKind) {
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let k = key(1);
    assert_eq!(t.try_lock(1, &k, X), Ok(X));
    for m in [S, X, NS, SN, XN, NX] {
        assert_eq!(t.try_lock(2, &k, m), Err(LockFailure::WouldBlock));
    }
    assert_eq!(t.waiters(&k), 0);
    assert_eq!(t.held_mode(2, &k), N);
    t.unlock(1, &k);
    assert!(t.is_free(&k));
    // Failed conversion keeps the held mode.
    t.try_lock(1, &k, SN).unwrap();
    t.try_lock(2, &k, SN).unwrap();
    assert_eq!(t.try_lock(1, &k, XN), Err(LockFailure::WouldBlock));
    assert_eq!(t.held_mode(1, &k), SN);
    t.unlock(1, &k);
    t.unlock(2, &k);
    assert_eq!(t.queue_count(), 0);
}

fn key_range_modes_on_one_key(kind: LockTableKind) {
    // NS (phantom protection of the gap) and XN (update of the key) coexist (Kimura §2.2).
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let k = key(10);
    t.lock(1, &k, NS, LONG).unwrap();
    assert_eq!(t.try_lock(2, &k, XN), Ok(XN));
    assert_eq!(t.try_lock(3, &k, NX), Err(LockFailure::WouldBlock));
    assert_eq!(t.try_lock(3, &k, SN), Err(LockFailure::WouldBlock));
    t.unlock(2, &k);
    assert_eq!(t.try_lock(3, &k, SN), Ok(SN));
    t.unlock(1, &k);
    assert_eq!(t.try_lock(4, &k, NX), Ok(NX));
    t.unlock(3, &k);
    t.unlock(4, &k);
    assert_eq!(t.queue_count(), 0);
}

fn intent_locks_follow_table4(kind: LockTableKind) {
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let tab = LockId::Table(5);
    for a in [S, X, IS, IX, SIX] {
        for b in [S, X, IS, IX, SIX] {
            t.lock(1, &tab, a, LONG).unwrap();
            let got = t.try_lock(2, &tab, b);
            assert_eq!(got.is_ok(), a.compatible(b), "{a:?} held, {b:?} asked");
            t.unlock(2, &tab);
            t.unlock(1, &tab);
            assert!(t.is_free(&tab));
        }
    }
    // Conversions along Gray's lattice.
    assert_eq!(t.lock(1, &tab, IS, LONG), Ok(IS));
    assert_eq!(t.lock(1, &tab, IX, LONG), Ok(IX));
    assert_eq!(t.lock(1, &tab, S, LONG), Ok(SIX));
    assert_eq!(t.try_lock(2, &tab, IS), Ok(IS));
    assert_eq!(t.try_lock(3, &tab, IX), Err(LockFailure::WouldBlock));
    assert_eq!(t.try_lock(3, &tab, S), Err(LockFailure::WouldBlock));
    t.unlock(1, &tab);
    assert_eq!(t.try_lock(3, &tab, IX), Ok(IX));
    t.unlock(2, &tab);
    t.unlock(3, &tab);
    assert!(t.is_free(&LockId::Database));
    assert_eq!(t.queue_count(), 0);
}

/// Each txn `i` holds `own[i]` in `first` mode, then (all at once) asks for `want[i]` in
/// mode `second`. Returns the per-txn results.
fn run_cycle(
    t: &Arc<AnyTable>,
    own: Vec<LockId>,
    want: Vec<LockId>,
    first: LockMode,
    second: LockMode,
) -> Vec<Result<LockMode, LockFailure>> {
    let n = own.len();
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (t, barrier) = (t.clone(), barrier.clone());
            let (own, want) = (own[i].clone(), want[i].clone());
            thread::spawn(move || {
                let txn = i as TxnId + 1;
                t.lock(txn, &own, first, LONG).unwrap();
                barrier.wait();
                let r = t.lock(txn, &want, second, LONG);
                if r.is_ok() {
                    // Hold a little so the others really wait.
                    thread::sleep(Duration::from_millis(5));
                    t.unlock(txn, &want);
                }
                t.unlock(txn, &own);
                r
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn assert_one_victim(results: &[Result<LockMode, LockFailure>], started: Instant) {
    let victims = results
        .iter()
        .filter(|r| matches!(r, Err(LockFailure::Deadlock { blocker: Some(_) })))
        .count();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!((victims, ok), (1, results.len() - 1), "{results:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "detected without timeouts"
    );
}

/// Twenty rounds of [`run_cycle`] on fresh waits-for-graph tables: exactly one victim each
/// time, found without timeouts, and nothing left behind.
fn one_victim_per_cycle(
    kind: LockTableKind,
    own: Vec<LockId>,
    want: Vec<LockId>,
    (first, second): (LockMode, LockMode),
) {
    for _ in 0..20 {
        let t = table(kind, DeadlockPolicy::WaitForGraph);
        let start = Instant::now();
        let r = run_cycle(&t, own.clone(), want.clone(), first, second);
        assert_one_victim(&r, start);
        assert_eq!(t.queue_count(), 0);
        assert!(t.is_idle(), "a waits-for edge or a grown shard left behind");
    }
}

fn deadlock_two_cycle(kind: LockTableKind) {
    one_victim_per_cycle(kind, vec![key(1), key(2)], vec![key(2), key(1)], (X, X));
}

fn deadlock_three_cycle(kind: LockTableKind) {
    let own = vec![key(1), key(2), key(3)];
    let want = vec![key(2), key(3), key(1)];
    one_victim_per_cycle(kind, own, want, (X, X));
}

fn deadlock_upgrade(kind: LockTableKind) {
    // Both hold S on one key and convert to X; the victim keeps S until it unlocks.
    let k = vec![key(4), key(4)];
    one_victim_per_cycle(kind, k.clone(), k, (S, X));
}

fn waiting_chain_is_not_a_deadlock(kind: LockTableKind) {
    // T2 waits for T1, T3 for T2 (on another lock): no cycle, nobody is a victim.
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let (a, b) = (key(1), key(2));
    t.lock(1, &a, X, LONG).unwrap();
    t.lock(2, &b, X, LONG).unwrap();
    let h2 = {
        let (t, a, b) = (t.clone(), a.clone(), b.clone());
        thread::spawn(move || {
            let r = t.lock(2, &a, X, LONG);
            t.unlock(2, &a);
            t.unlock(2, &b);
            r
        })
    };
    wait_until("T2 waits", || t.waiters(&a) == 1);
    let h3 = spawn_lock(&t, 3, &b, X, LONG);
    wait_until("T3 waits", || t.waiters(&b) == 1);
    thread::sleep(Duration::from_millis(30)); // a few re-checks
    t.unlock(1, &a);
    assert_eq!(h2.join().unwrap(), Ok(X));
    assert_eq!(h3.join().unwrap(), Ok(X));
    assert_eq!(t.queue_count(), 0);
    assert!(t.is_idle(), "a waits-for edge or a grown shard left behind");
}

fn timeout_policy_breaks_deadlock_by_timeout(kind: LockTableKind) {
    let t = table(kind, DeadlockPolicy::Timeout);
    let (a, b) = (key(1), key(2));
    let barrier = Arc::new(Barrier::new(2));
    let hs: Vec<_> = [(a.clone(), b.clone()), (b, a)]
        .into_iter()
        .enumerate()
        .map(|(i, (own, want))| {
            let (t, barrier) = (t.clone(), barrier.clone());
            thread::spawn(move || {
                let txn = i as TxnId + 1;
                t.lock(txn, &own, X, LONG).unwrap();
                barrier.wait();
                let to = Duration::from_millis(30 + 200 * i as u64);
                let r = t.lock(txn, &want, X, to);
                t.unlock(txn, &want);
                t.unlock(txn, &own);
                r
            })
        })
        .collect();
    let r: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(matches!(r[0], Err(LockFailure::Timeout { .. })), "{r:?}");
    assert_eq!(r[1], Ok(X));
    assert_eq!(t.queue_count(), 0);
}

fn many_keys_queue_count(kind: LockTableKind) {
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let k = |i: u32| LockId::Key(i % 7, i.to_le_bytes().to_vec().into());
    for i in 0..2000u32 {
        t.lock(u64::from(i % 3), &k(i), XN, LONG).unwrap();
    }
    t.lock(1, &LockId::NegInf(3), NS, LONG).unwrap();
    t.lock(1, &LockId::Database, IX, LONG).unwrap();
    assert_eq!(t.queue_count(), 2002);
    for i in 0..2000u32 {
        t.unlock(u64::from(i % 3), &k(i));
    }
    t.unlock(1, &LockId::NegInf(3));
    t.unlock(1, &LockId::Database);
    assert_eq!(t.queue_count(), 0);
    assert!(t.is_idle(), "a waits-for edge or a grown shard left behind");
}

fn tags_outlive_requests(kind: LockTableKind) {
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let k = key(3);
    assert_eq!(t.tag(&k), 0);
    t.lock(1, &k, X, LONG).unwrap();
    t.unlock_tagged(1, &k, 42);
    assert!(t.is_free(&k));
    assert!(t.tag(&k) >= 42, "the tag outlives the queue");
    t.unlock_tagged(9, &k, 100); // not held: no-op
    t.lock(2, &k, S, LONG).unwrap();
    assert!(t.tag(&k) >= 42, "a new queue reports the old tag");
    t.unlock_tagged(2, &k, 7);
    assert!(t.tag(&k) >= 42, "tags never decrease");
    t.lock(3, &k, X, LONG).unwrap();
    t.unlock_tagged(3, &k, 50);
    assert!(t.tag(&k) >= 50);
    assert_eq!(t.queue_count(), 0);

    // A grant read with its tag reports what `tag` reads then: on a new queue (the tag
    // outlived the old one), joining another holder, and converting a held lock.
    let (m, tag) = t.try_lock_tagged(4, &k, S).unwrap();
    assert_eq!((m, tag), (S, t.tag(&k)));
    assert!(tag >= 50, "a new queue's grant reports the old tag");
    let (m, tag) = t.try_lock_tagged(5, &k, S).unwrap();
    assert_eq!((m, tag), (S, t.tag(&k)));
    t.unlock_tagged(5, &k, 60);
    let (m, tag) = t.try_lock_tagged(4, &k, X).unwrap();
    assert_eq!(m, X);
    assert!(
        tag >= 60,
        "a conversion reports the tag its queue took meanwhile"
    );
    assert_eq!(tag, t.tag(&k));
    assert_eq!(t.try_lock_tagged(6, &k, S), Err(LockFailure::WouldBlock));
    t.unlock(4, &k);
    assert_eq!(t.queue_count(), 0);
}

fn unlock_all_releases_each_lock_with_its_tag_and_grants_waiters(kind: LockTableKind) {
    let t = table(kind, DeadlockPolicy::WaitForGraph);
    let k = |i: u32| LockId::Key(i % 3, i.to_le_bytes().to_vec().into());
    let mut all: Vec<(LockId, u64)> = (0..300u32)
        .map(|i| {
            t.lock(1, &k(i), if i % 2 == 0 { X } else { S }, LONG)
                .unwrap();
            (k(i), if i % 2 == 0 { 1000 + u64::from(i) } else { 0 })
        })
        .collect();
    // Another transaction shares one of the S locks, and waits on one X lock and one S.
    t.lock(2, &k(1), S, LONG).unwrap();
    let waiter = |key: LockId, mode: LockMode| {
        let t = t.clone();
        thread::spawn(move || t.lock(3, &key, mode, LONG))
    };
    let w = [waiter(k(10), S), waiter(k(11), X)];
    wait_until("both waiters queued", || {
        t.waiters(&k(10)) == 1 && t.waiters(&k(11)) == 1
    });
    t.unlock_all(1, &mut all);
    let [a, b] = w;
    assert_eq!(a.join().unwrap(), Ok(S));
    assert_eq!(b.join().unwrap(), Ok(X));
    for i in 0..300u32 {
        if i % 2 == 0 {
            assert!(t.tag(&k(i)) >= 1000 + u64::from(i), "lock {i} lost its tag");
        }
        let held = [(1, Some(S)), (10, Some(S)), (11, Some(X))];
        let by_others = held.iter().find(|h| h.0 == i).and_then(|h| h.1);
        assert_eq!(t.held_mode(1, &k(i)), N, "lock {i} still held");
        if by_others.is_none() {
            assert!(t.is_free(&k(i)), "lock {i} left behind");
        }
    }
    t.unlock(2, &k(1));
    t.unlock(3, &k(10));
    t.unlock(3, &k(11));
    assert_eq!(t.queue_count(), 0);
}

// ---- latch-free table only ----

/// 256 threads on four hot keys: shared and exclusive locks, S->X conversions, deadlock
/// victims and timeouts retried; an in-section counter per key checks mutual exclusion.
///
/// Runs 3 s, longer (up to a minute) until 1000 lock sections completed: the check is that
/// the table makes progress, not how fast (a loaded 2-core machine may take its time).
/// Three holders of IS on one table convert at once, to S, IX and S. The two S requests
/// are compatible and must both be granted without waiting out a timeout: a conversion that
/// backed off its tentative grant used to park on the verdict it read while it was still
/// tentative, so one that backed off at the same moment (and skipped it, not yet waiting,
/// in its wake-ups) could leave it parked with nobody left to wake it.
#[test]
fn concurrent_conversions_never_wait_out_a_timeout() {
    let t = table(LockTableKind::LatchFree, DeadlockPolicy::Timeout);
    let tab = LockId::Table(1);
    let started = Instant::now();
    for round in 0..300u64 {
        let base = 1 + round * 3;
        let go = Arc::new(Barrier::new(3));
        let hs: Vec<_> = [(0, LockMode::S), (1, LockMode::IX), (2, LockMode::S)]
            .into_iter()
            .map(|(i, m)| {
                let (t, tab, go) = (t.clone(), tab.clone(), go.clone());
                thread::spawn(move || {
                    let txn = base + i;
                    t.lock(txn, &tab, LockMode::IS, LONG).unwrap();
                    go.wait();
                    let r = t.lock(txn, &tab, m, Duration::from_secs(5));
                    t.unlock(txn, &tab);
                    r
                })
            })
            .collect();
        for h in hs {
            let r = h.join().unwrap();
            assert!(r.is_ok(), "round {round}: {r:?}");
        }
        assert!(t.is_free(&tab));
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "300 rounds took {:?}: some conversion waited out a timeout",
        started.elapsed()
    );
}

/// A release of a transaction's lock from another thread while the transaction's own thread
/// waits for it (a misuse: one thread per transaction) leaves the waiting request alone: the
/// waiter may be parked holding its entry, which must not be unlinked and reused under it.
/// The waiter is granted when the holder leaves, and holds the lock until it releases it.
#[test]
fn a_release_from_another_thread_leaves_a_waiting_request_alone() {
    let t = table(LockTableKind::LatchFree, DeadlockPolicy::WaitForGraph);
    let k = key(7);
    for _ in 0..50 {
        t.lock(100, &k, X, LONG).unwrap();
        let (t2, k2) = (t.clone(), k.clone());
        let (granted, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let (g2, r2) = (granted.clone(), release.clone());
        let waiter = thread::spawn(move || {
            let r = t2.lock(1, &k2, X, LONG);
            g2.wait();
            r2.wait();
            t2.unlock(1, &k2);
            r
        });
        wait_until("enqueue", || t.waiters(&k) == 1);
        t.unlock(1, &k); // from the wrong thread
        t.unlock(100, &k);
        granted.wait();
        assert!(!t.is_free(&k), "the waiter was granted and holds the lock");
        assert_eq!(t.try_lock(2, &k, LockMode::S), Err(LockFailure::WouldBlock));
        release.wait();
        assert_eq!(waiter.join().unwrap(), Ok(X));
        wait_until("free", || t.is_free(&k));
    }
}

#[test]
fn stress_256_threads_hot_keys() {
    const THREADS: usize = 256;
    const KEYS: u8 = 4;
    const WRITER: i64 = 1 << 32;
    const PROGRESS: u64 = 1000;
    let t = Arc::new(LatchFreeLockTable::new(DeadlockPolicy::WaitForGraph));
    let inside: Arc<Vec<AtomicI64>> = Arc::new((0..KEYS).map(|_| AtomicI64::new(0)).collect());
    let next_txn = Arc::new(AtomicU64::new(1));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let start = Instant::now();
    let (deadline, cap) = (
        start + Duration::from_secs(3),
        start + Duration::from_secs(60),
    );
    let handles: Vec<_> = (0..THREADS)
        .map(|th| {
            let (t, inside, next_txn) = (t.clone(), inside.clone(), next_txn.clone());
            let (done, failed) = (done.clone(), failed.clone());
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(th as u64);
                let more = || {
                    let now = Instant::now();
                    now < deadline || (now < cap && done.load(Ordering::Relaxed) < PROGRESS)
                };
                while more() {
                    let txn = next_txn.fetch_add(1, Ordering::Relaxed);
                    let ki = rng.gen_range(0..KEYS);
                    let k = key(ki);
                    let c = &inside[ki as usize];
                    let timeout = Duration::from_millis(500);
                    let ok = match rng.gen_range(0..3) {
                        0 => t.lock(txn, &k, X, timeout).map(|_| {
                            assert_eq!(c.fetch_add(WRITER, Ordering::SeqCst), 0, "X excl");
                            thread::yield_now();
                            c.fetch_sub(WRITER, Ordering::SeqCst);
                        }),
                        1 => t.lock(txn, &k, S, timeout).map(|_| {
                            let prev = c.fetch_add(1, Ordering::SeqCst);
                            assert!(prev < WRITER, "S while X held");
                            thread::yield_now();
                            c.fetch_sub(1, Ordering::SeqCst);
                        }),
                        _ => t.lock(txn, &k, S, timeout).and_then(|_| {
                            let prev = c.fetch_add(1, Ordering::SeqCst);
                            assert!(prev < WRITER, "S while X held");
                            let r = t.lock(txn, &k, X, timeout);
                            match r {
                                Ok(_) => {
                                    let prev = c.fetch_add(WRITER - 1, Ordering::SeqCst);
                                    assert_eq!(prev, 1, "conversion to X not exclusive");
                                    thread::yield_now();
                                    c.fetch_sub(WRITER, Ordering::SeqCst);
                                }
                                Err(_) => {
                                    c.fetch_sub(1, Ordering::SeqCst);
                                }
                            }
                            r.map(|_| ())
                        }),
                    };
                    t.unlock(txn, &k);
                    if ok.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let (done, failed) = (done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!(
        "stress: {done} lock sections, {failed} failed (deadlock/timeout), {} entries",
        t.allocated_entries()
    );
    assert!(done >= PROGRESS, "made progress: {done}");
    for k in 0..KEYS {
        assert!(t.is_free(&key(k)));
    }
    assert_eq!(t.queue_count(), 0);
}

/// Many short transactions (intent locks on the database and a table, key locks on a small
/// key set): the number of allocated request entries stops growing.
#[test]
fn allocated_entries_stay_bounded() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 6;
    const TXNS: usize = 1000;
    // A small free list, so that the bound below is far under the requests made (the
    // default pool is sized for bursts after long epoch stalls).
    const FREE: usize = 128;
    let t = Arc::new(LatchFreeLockTable::with_params(
        DeadlockPolicy::Timeout,
        Params {
            slots: 64,
            free_cap: FREE,
            ..Params::default()
        },
    ));
    let next_txn = Arc::new(AtomicU64::new(1));
    // The same threads run every round (their reclamation slots persist), with a barrier
    // after each round at which the main thread samples the allocation count.
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let hs: Vec<_> = (0..THREADS)
        .map(|th| {
            let (t, next_txn, barrier) = (t.clone(), next_txn.clone(), barrier.clone());
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(th as u64);
                for _ in 0..ROUNDS {
                    for _ in 0..TXNS {
                        let txn = next_txn.fetch_add(1, Ordering::Relaxed);
                        let mut held = vec![LockId::Database, LockId::Table(1)];
                        t.lock(txn, &LockId::Database, IX, LONG).unwrap();
                        t.lock(txn, &LockId::Table(1), IX, LONG).unwrap();
                        let mut keys: Vec<u8> = (0..4).map(|_| rng.gen_range(0..64)).collect();
                        keys.sort_unstable();
                        keys.dedup();
                        for k in keys {
                            // Sorted order: no deadlocks.
                            t.lock(txn, &key(k), X, LONG).unwrap();
                            held.push(key(k));
                        }
                        for id in held {
                            t.unlock(txn, &id);
                        }
                    }
                    barrier.wait();
                    barrier.wait();
                }
            })
        })
        .collect();
    let mut after = Vec::new();
    let mut before = Vec::new();
    for _ in 0..ROUNDS {
        barrier.wait();
        before.push(t.allocated_entries());
        // Quiescent: bulk reclamation brings every slot down to its free list.
        t.reclaim();
        after.push(t.allocated_entries());
        barrier.wait();
    }
    for h in hs {
        h.join().unwrap();
    }
    eprintln!(
        "allocated entries after each round of {} transactions: {before:?}, after a quiescent \
         reclaim: {after:?}",
        THREADS * TXNS
    );
    assert_eq!(t.queue_count(), 0);
    // About 6 requests per transaction: ~290k requests in all, far more than the bounds, which
    // do not depend on the length of the run. While running, per slot (64): retire batches
    // waiting for the epoch (more while a descheduled thread stays pinned), the free list and
    // one allocation batch; per lock head (66), its last entry. After a quiescent `reclaim`,
    // only free lists, allocation batches and last entries remain.
    let quiescent = 64 * (FREE + ALLOC_BATCH) + 66;
    assert!(
        after.iter().all(|&a| a <= quiescent),
        "{after:?} > {quiescent}"
    );
    assert!(THREADS * TXNS * ROUNDS * 6 > 10 * quiescent);
    // Stable from round to round (the same threads reuse the same slots).
    let (first, last) = (after[0], *after.last().unwrap());
    assert!(
        last <= 2 * first + THREADS * ALLOC_BATCH,
        "growing: {after:?}"
    );
}

/// Transactions that lock an ever-growing stream of fresh ids (as inserts do: history rows,
/// new orders) plus one of a few hot ids: idle lock heads are killed and reclaimed, so the
/// number of allocated lock heads stays bounded while running, independently of the number
/// of distinct ids locked, and drops to zero at a quiescent bulk reclamation. Mutual
/// exclusion on the hot ids is checked with in-section counters.
#[test]
fn lock_heads_stay_bounded_over_fresh_ids() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 3;
    const ROUND: Duration = Duration::from_millis(700);
    const HOT: u8 = 4;
    const FRESH_PER_TXN: u64 = 4;
    const WRITER: i64 = 1 << 32;
    // Small sizes so that a full sweep is short: 16 sweep steps of 1024 buckets, one step
    // every 16 head creations of a slot.
    let params = Params {
        buckets: 1 << 14,
        slots: 64,
        sweep_every: 16,
        sweep_buckets: 1024,
        ..Params::default()
    };
    let t = Arc::new(LatchFreeLockTable::with_params(
        DeadlockPolicy::Timeout,
        params,
    ));
    let inside: Arc<Vec<AtomicI64>> = Arc::new((0..HOT).map(|_| AtomicI64::new(0)).collect());
    let next_txn = Arc::new(AtomicU64::new(1));
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (t, stop) = (t.clone(), stop.clone());
        thread::spawn(move || {
            let mut max = 0;
            while !stop.load(Ordering::Relaxed) {
                max = max.max(t.allocated_heads());
                thread::sleep(Duration::from_millis(1));
            }
            max
        })
    };
    let hs: Vec<_> = (0..THREADS)
        .map(|th| {
            let (t, inside) = (t.clone(), inside.clone());
            let (next_txn, barrier) = (next_txn.clone(), barrier.clone());
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(th as u64);
                for _ in 0..ROUNDS {
                    let end = Instant::now() + ROUND;
                    while Instant::now() < end {
                        let txn = next_txn.fetch_add(1, Ordering::Relaxed);
                        let hk = rng.gen_range(0..HOT);
                        let c = &inside[hk as usize];
                        t.lock(txn, &LockId::Database, IX, LONG).unwrap();
                        t.lock(txn, &LockId::Table(1), IX, LONG).unwrap();
                        let mode = if rng.gen_bool(0.5) { X } else { S };
                        assert_eq!(t.lock(txn, &key(hk), mode, LONG), Ok(mode));
                        let add = if mode == X { WRITER } else { 1 };
                        let prev = c.fetch_add(add, Ordering::SeqCst);
                        if mode == X {
                            assert_eq!(prev, 0, "X granted beside another holder");
                        } else {
                            assert!(prev < WRITER, "S granted beside X");
                        }
                        // Fresh ids (never locked before), as inserted rows.
                        let fresh: Vec<LockId> = (0..FRESH_PER_TXN)
                            .map(|i| {
                                let n = txn * FRESH_PER_TXN + i;
                                LockId::Key(2, n.to_be_bytes().to_vec().into())
                            })
                            .collect();
                        for id in &fresh {
                            assert_eq!(t.lock(txn, id, X, LONG), Ok(X));
                        }
                        for id in &fresh {
                            assert_eq!(t.held_mode(txn, id), X);
                        }
                        c.fetch_sub(add, Ordering::SeqCst);
                        t.unlock(txn, &key(hk));
                        for id in &fresh {
                            t.unlock(txn, id);
                        }
                        t.unlock(txn, &LockId::Table(1));
                        t.unlock(txn, &LockId::Database);
                    }
                    barrier.wait();
                    barrier.wait();
                }
            })
        })
        .collect();
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        barrier.wait();
        let before = t.allocated_heads();
        // Quiescent: every lock head is idle, a bulk reclamation kills and frees them all.
        t.reclaim();
        rounds.push((before, t.allocated_heads(), t.lock_heads()));
        barrier.wait();
    }
    for h in hs {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let max = sampler.join().unwrap();
    let txns = next_txn.load(Ordering::Relaxed) - 1;
    let ids = txns * (FRESH_PER_TXN + 1) + 2;
    eprintln!(
        "{txns} transactions locked about {ids} distinct ids ({} fresh); allocated lock heads: \
         at most {max} while running; (at the end of the round, after a quiescent reclaim, \
         live) per round: {rounds:?}; {} entries",
        txns * FRESH_PER_TXN,
        t.allocated_entries()
    );
    for &(_, after, live) in &rounds {
        assert_eq!(
            (after, live),
            (0, 0),
            "idle heads left after a quiescent reclaim"
        );
    }
    // While running: the lock heads of running transactions (8 x 7), those created since a
    // sweep last passed their bucket (a full sweep every 16 x 16 creations per slot), and
    // retired ones waiting for the epoch (batches of 64 per slot; more while a preempted
    // thread stays pinned: under load a preempted pinned thread holds back the epoch for as
    // long as it is off the CPU, and 3k-9k here grew past 50k once in a loaded full-suite
    // run). Not a function of the run length: a leak would keep every one of the fresh ids'
    // heads, so the bound is a fifth of them.
    let bound = (txns as usize * FRESH_PER_TXN as usize / 5).max(50_000);
    assert!(max <= bound, "{max} lock heads allocated (> {bound})");
    assert_eq!(t.queue_count(), 0);
    for k in 0..HOT {
        assert!(t.is_free(&key(k)));
    }
}

// ---- engine runs with the latch-free table ----

fn latchfree_options() -> Options {
    common::options(shoal::ConcurrencyControl::TwoPhaseLocking)
        .with_lock_table(LockTableKind::LatchFree)
}

/// The bank invariant (tests/bank.rs) on the latch-free table: concurrent transfers never
/// change the total, and concurrent readers always see it.
#[test]
fn bank_invariant_with_latchfree_table() {
    const ACCOUNTS: usize = 30;
    const INITIAL: i64 = 1000;
    let acct = |i: usize| format!("acct{i:03}");
    let db = Database::in_memory_with(latchfree_options());
    let t = db.create_table("accounts").unwrap();
    db.run(|tx| {
        for i in 0..ACCOUNTS {
            tx.insert(&t, acct(i), common::enc(INITIAL))?;
        }
        Ok(())
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_millis(1500);
    let (transfers, sums) = (AtomicU64::new(0), AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        for th in 0..8u64 {
            let (db, t, transfers) = (&db, &t, &transfers);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(th);
                while Instant::now() < deadline {
                    let from = rng.gen_range(0..ACCOUNTS);
                    let to = (from + rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
                    let amount = rng.gen_range(1..=300);
                    let r = db.run(|tx| {
                        let a = tx.get_i64(t, acct(from))?.unwrap();
                        if a < amount {
                            return Ok(false);
                        }
                        let b = tx.get_i64(t, acct(to))?.unwrap();
                        tx.put(t, acct(from), common::enc(a - amount))?;
                        tx.put(t, acct(to), common::enc(b + amount))?;
                        Ok(true)
                    });
                    if r.expect("transfer") {
                        transfers.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        for _ in 0..2 {
            let (db, t, sums, stop) = (&db, &t, &sums, &stop);
            s.spawn(move || {
                while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                    let rows = db.run(|tx| tx.scan(t, ..)).expect("scan");
                    let sum: i64 = rows.iter().map(|(_, v)| common::dec(v)).sum();
                    assert_eq!(sum, ACCOUNTS as i64 * INITIAL, "not serializable");
                    sums.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let (transfers, sums) = (transfers.into_inner(), sums.into_inner());
    eprintln!("latch-free bank: {transfers} transfers, {sums} sums");
    assert!(transfers > 0 && sums > 0);
    let rows = db.run(|tx| tx.scan(&t, ..)).unwrap();
    let total: i64 = rows.iter().map(|(_, v)| common::dec(v)).sum();
    assert_eq!(total, ACCOUNTS as i64 * INITIAL);
}

/// Random transactions of point reads, read-modify-writes and scans on the latch-free table,
/// checked on the direct serialization graph (as `tests/serializability.rs`): unique written
/// versions, every write reads first. Here the 8 keys exist from the start (no inserts, so no
/// phantoms): see [`dsg_with_phantoms_short`] for the variant with absent keys.
#[test]
fn dsg_random_transactions_with_latchfree_table() {
    dsg_run(
        LockTableKind::LatchFree,
        4,
        8,
        None,
        Duration::from_millis(1500),
    );
}

/// The workload with keys that start absent (fresh keys every 8 transactions, so reads of
/// absent keys, inserts into scanned ranges and phantoms keep happening), 6 threads on 6 keys,
/// on each lock table. Short enough for every `cargo test`; see
/// [`dsg_with_phantoms_both_tables`] for the long run.
///
/// It guards the phantom that both lock tables showed here until inserts inherited the
/// inserter's own gap lock: a transaction scanned a range, inserted a key into it (splitting
/// the gap its scan had locked), and another transaction inserted just above that key and
/// committed — a G2 / G-single cycle. The anomaly occurs mostly at the start of an epoch,
/// when the range is empty or sparse, hence the short epochs (before the fix a single run
/// of this test caught it about every other time).
#[test]
fn dsg_with_phantoms_short() {
    for kind in [LockTableKind::Sharded, LockTableKind::LatchFree] {
        dsg_run(kind, 6, 6, Some(8), Duration::from_millis(1000));
    }
}

/// The long run of [`dsg_with_phantoms_short`]: both epoch lengths of the original
/// reproducer (128 transactions) and the short run's (8), five rounds on each lock table.
/// `cargo test --release --test latchfree -- --ignored dsg_with_phantoms_both_tables`.
#[test]
#[ignore = "long (about 30 s): the full phantom reproducer, run by hand or in soak runs"]
fn dsg_with_phantoms_both_tables() {
    for round in 0..5 {
        let epoch = if round % 2 == 0 { 128 } else { 8 };
        for kind in [LockTableKind::Sharded, LockTableKind::LatchFree] {
            dsg_run(kind, 6, 6, Some(epoch), Duration::from_millis(1500));
        }
    }
}

/// `epoch_len`: `Some(n)`: transaction `id` works on the keys of block `id / n`, which start
/// absent; `None`: one block of keys, all inserted before the run. Runs for `duration`.
fn dsg_run(
    kind: LockTableKind,
    threads: u64,
    keys: usize,
    epoch_len: Option<u64>,
    duration: Duration,
) {
    use common::dsg::{History, Recorder, TxnRecord, Version};
    use std::collections::HashMap;

    #[allow(non_snake_case)]
    let KEYS = keys;
    let k = |epoch: u64, i: usize| format!("e{epoch:06}/k{i}");
    let what = format!("dsg {kind:?} epoch {epoch_len:?}");
    let seed = common::seed(&what);
    let db = Database::in_memory_with(latchfree_options().with_lock_table(kind));
    let t = db.create_table("t").unwrap();
    if epoch_len.is_none() {
        db.run(|tx| {
            for i in 0..KEYS {
                tx.insert(&t, k(0, i), Version::INITIAL.encode())?;
            }
            Ok(())
        })
        .unwrap();
    }
    let next_id = AtomicU64::new(1);
    let history = StdMutex::new(History::new());
    let aborts = AtomicU64::new(0);
    let deadline = Instant::now() + duration;
    thread::scope(|s| {
        for th in 0..threads {
            let (db, t, next_id, history, aborts) = (&db, &t, &next_id, &history, &aborts);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_add(th));
                while Instant::now() < deadline {
                    let id = next_id.fetch_add(1, Ordering::Relaxed);
                    let epoch = epoch_len.map_or(0, |n| id / n);
                    let mut attempt = || -> shoal::Result<TxnRecord> {
                        let mut tx = db.begin();
                        let mut r = Recorder::new(id);
                        for _ in 0..rng.gen_range(2..=5) {
                            let op = rng.gen_range(0..10);
                            if op < 8 {
                                let key = k(epoch, rng.gen_range(0..KEYS));
                                let seen = r.get(&mut tx, t, &key)?;
                                if op >= 4 {
                                    r.put(&mut tx, t, key, seen)?;
                                }
                            } else {
                                let lo = format!("e{epoch:06}/").into_bytes();
                                let hi = format!("e{epoch:06}0").into_bytes();
                                let rows = tx.scan(t, lo..hi)?;
                                let found: HashMap<String, Version> = rows
                                    .into_iter()
                                    .map(|(kk, v)| {
                                        (String::from_utf8(kk).unwrap(), Version::decode(Some(&v)))
                                    })
                                    .collect();
                                for i in 0..KEYS {
                                    let key = k(epoch, i);
                                    let seen = found.get(&key).copied().unwrap_or(Version::INITIAL);
                                    r.observe(&key, seen);
                                }
                            }
                        }
                        tx.commit()?;
                        Ok(r.rec)
                    };
                    match attempt() {
                        Ok(rec) => history.lock().unwrap().push(rec),
                        Err(e) if e.is_retryable() => {
                            aborts.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("T{id}: unexpected error {e:?}"),
                    }
                }
            });
        }
    });
    let history = history.into_inner().unwrap();
    let stats = history.assert_serializable(&what);
    eprintln!(
        "{what}: {} committed, {} aborted, {stats:?}",
        stats.txns,
        aborts.load(Ordering::Relaxed)
    );
    assert!(
        stats.txns >= 20 && stats.ww > 0 && stats.wr > 0 && stats.rw > 0,
        "{stats:?}"
    );
}
