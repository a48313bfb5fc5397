//! Every lock table runs every deadlock policy (issue 15: the latch-free table used to turn
//! every policy but the waits-for graph into plain waits that ended at the lock timeout).
//! Lock timeouts here are a minute, so a policy that is not run shows up as a `Timeout`
//! (or a test that takes a minute), not as a flaky timing assertion. Each scenario runs on
//! each table kind as a test of its own (`common::tables::every_table`).

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use shoal::lock::{DeadlockPolicy, LockFailure, LockId, LockMode, LockTable, Victim, WaitStyle};
use shoal::{Database, Error, LockTableKind, Options, Table};

use common::tables::{every_table, AnyTable};

/// Long enough that reaching it is a test failure, not a resolution.
const LONG: Duration = Duration::from_secs(60);

use common::DEADLOCK_POLICIES as ALL_POLICIES;

every_table!(
    two_cycle_is_resolved_by_every_policy_on_every_table,
    dreadlocks_victim_rules_on_every_table,
    no_wait_fails_at_once_on_every_table,
    wait_die_older_waits_younger_dies_on_every_table,
    wound_wait_older_wounds_younger_on_every_table,
    timeout_policy_waits_for_the_timeout_on_every_table,
    every_combination_opens_or_is_refused,
    crossing_transactions_under_no_wait_get_deadlock_at_once,
    crossing_transactions_resolve_under_every_policy_on_every_table,
);

const VICTIMS: [Victim; 3] = [Victim::KillYoung, Victim::KillShort, Victim::KillLong];

fn key(k: u8) -> LockId {
    common::lock_key(k)
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    common::wait_until(what, LONG, cond)
}

/// A table of `kind` under `policy` (victim kill-young) on which transaction `holder` holds
/// key 1 exclusively.
fn held_by(kind: LockTableKind, policy: DeadlockPolicy, holder: u64) -> (Arc<AnyTable>, LockId) {
    let t = AnyTable::new(kind, policy, Victim::KillYoung);
    let k = key(1);
    t.t().lock(holder, &k, LockMode::X, LONG).unwrap();
    (t, k)
}

/// Releases each `(transaction, lock)`.
fn release(t: &AnyTable, locks: &[(u64, &LockId)]) {
    for &(txn, id) in locks {
        t.t().unlock(txn, id);
    }
}

fn is_deadlock(r: &Result<LockMode, LockFailure>) -> bool {
    matches!(r, Err(LockFailure::Deadlock { .. }))
}

/// [`common::two_cycle`] on `t` with the long timeout.
fn two_cycle(t: &Arc<AnyTable>, pipes: [u64; 2]) -> Vec<Result<LockMode, LockFailure>> {
    common::two_cycle(t, AnyTable::t, pipes, LONG)
}

/// Every table × every policy that resolves deadlocks: a 2-cycle ends in a deadlock victim
/// (never the minute-long timeout), and the policy's own victim: wait-die and wound-wait and
/// Dreadlocks kill-young roll back the younger transaction (2) and let the older one finish.
fn two_cycle_is_resolved_by_every_policy_on_every_table(kind: LockTableKind) {
    for policy in &ALL_POLICIES[1..] {
        let policy = *policy;
        for round in 0..5 {
            let t = AnyTable::new(kind, policy, Victim::KillYoung);
            let start = Instant::now();
            let rs = two_cycle(&t, [0, 0]);
            let what = format!("{kind:?} {policy:?} round {round}: {rs:?}");
            assert!(
                rs.iter().all(|r| r.is_ok() || is_deadlock(r)),
                "no timeouts: {what}"
            );
            assert!(rs.iter().any(is_deadlock), "a victim: {what}");
            assert!(start.elapsed() < LONG / 2, "{what}");
            match policy {
                DeadlockPolicy::WaitDie
                | DeadlockPolicy::WoundWait
                | DeadlockPolicy::Dreadlocks(_) => {
                    assert!(rs[0].is_ok() && is_deadlock(&rs[1]), "younger dies: {what}")
                }
                _ => {}
            }
            assert_eq!(t.queue_count(), 0, "{what}");
        }
    }
}

/// Kimura §4.3 on every table and with every wait style: with flush pipelines, kill-short
/// rolls back the transaction whose thread has fewer pipelined commits waiting, kill-long the
/// other, kill-young the younger (transaction 1 is older and has the shorter pipeline).
fn dreadlocks_victim_rules_on_every_table(kind: LockTableKind) {
    for style in [
        WaitStyle::Spin,
        WaitStyle::Sleep,
        WaitStyle::SleepBackoff,
        WaitStyle::Hybrid,
    ] {
        for (victim, loser) in [
            (Victim::KillYoung, 1usize),
            (Victim::KillShort, 0),
            (Victim::KillLong, 1),
        ] {
            let t = AnyTable::new(kind, DeadlockPolicy::Dreadlocks(style), victim);
            let rs = two_cycle(&t, [0, 5]);
            let what = format!("{kind:?} {style:?} {victim:?}: {rs:?}");
            assert!(is_deadlock(&rs[loser]), "{what}");
            assert!(rs[1 - loser].is_ok(), "{what}");
        }
    }
}

/// No-wait on every table: a request that cannot be granted fails at once, as a deadlock,
/// and leaves nothing behind.
fn no_wait_fails_at_once_on_every_table(kind: LockTableKind) {
    let (t, k) = held_by(kind, DeadlockPolicy::NoWait, 1);
    assert_eq!(
        t.t().lock(2, &k, LockMode::S, LONG),
        Err(LockFailure::Deadlock { blocker: Some(1) }),
        "{kind:?}"
    );
    assert_eq!(t.waiters(&k), 0, "{kind:?}");
    // A compatible request is granted as usual.
    t.t().unlock(1, &k);
    assert_eq!(t.t().lock(2, &k, LockMode::S, LONG), Ok(LockMode::S));
    assert_eq!(t.t().lock(3, &k, LockMode::S, LONG), Ok(LockMode::S));
    release(&t, &[(2, &k), (3, &k)]);
    assert_eq!(t.queue_count(), 0, "{kind:?}");
}

/// Wait-die on every table: an older requester waits for a younger holder; a younger one
/// dies at once rather than wait for an older one.
fn wait_die_older_waits_younger_dies_on_every_table(kind: LockTableKind) {
    let (t, k) = held_by(kind, DeadlockPolicy::WaitDie, 5);
    let older = {
        let (t, k) = (t.clone(), k.clone());
        thread::spawn(move || {
            let r = t.t().lock(3, &k, LockMode::X, LONG);
            t.t().unlock(3, &k);
            r
        })
    };
    wait_until("the older requester waits", || t.waiters(&k) == 1);
    let younger = t.t().lock(7, &k, LockMode::X, LONG);
    assert!(
        matches!(
            younger,
            Err(LockFailure::Deadlock {
                blocker: Some(5 | 3)
            })
        ),
        "{kind:?}: {younger:?}"
    );
    assert_eq!(t.waiters(&k), 1, "{kind:?}: the older one still waits");
    release(&t, &[(5, &k)]);
    assert_eq!(older.join().unwrap(), Ok(LockMode::X), "{kind:?}");
    assert_eq!(t.queue_count(), 0, "{kind:?}");
}

/// Wound-wait on every table: an older requester wounds the younger holder, which fails the
/// next time it waits (here: while it already waits for a third transaction that never
/// releases), with no cycle and no timeout involved; the older one then gets the lock.
fn wound_wait_older_wounds_younger_on_every_table(kind: LockTableKind) {
    let t = AnyTable::new(kind, DeadlockPolicy::WoundWait, Victim::KillYoung);
    let (k1, k2) = (key(1), key(2));
    t.t().lock(3, &k2, LockMode::X, LONG).unwrap();
    t.t().lock(7, &k1, LockMode::X, LONG).unwrap();
    let younger = {
        let (t, k1, k2) = (t.clone(), k1.clone(), k2.clone());
        thread::spawn(move || {
            // Younger waits for older (3): allowed.
            let r = t.t().lock(7, &k2, LockMode::X, LONG);
            t.t().unlock(7, &k2);
            t.t().unlock(7, &k1);
            r
        })
    };
    wait_until("the younger waits", || t.waiters(&k2) == 1);
    thread::sleep(Duration::from_millis(20));
    assert_eq!(
        t.waiters(&k2),
        1,
        "{kind:?}: a younger waiter is not killed"
    );
    // Older (5) waits for younger (7): wounds it.
    let r = t.t().lock(5, &k1, LockMode::X, LONG);
    assert_eq!(r, Ok(LockMode::X), "{kind:?}");
    assert_eq!(
        younger.join().unwrap(),
        Err(LockFailure::Deadlock { blocker: None }),
        "{kind:?}"
    );
    release(&t, &[(5, &k1), (3, &k2)]);
    assert_eq!(t.queue_count(), 0, "{kind:?}");
}

/// The timeout policy still waits until the timeout on every table.
fn timeout_policy_waits_for_the_timeout_on_every_table(kind: LockTableKind) {
    let (t, k) = held_by(kind, DeadlockPolicy::Timeout, 1);
    let r = t.t().lock(2, &k, LockMode::X, Duration::from_millis(30));
    let Err(LockFailure::Timeout { blocker, .. }) = r else {
        panic!("{kind:?}: {r:?}, not a timeout");
    };
    assert_eq!(blocker, Some(1), "{kind:?}");
    release(&t, &[(1, &k)]);
    assert_eq!(t.queue_count(), 0, "{kind:?}");
}

fn options(kind: LockTableKind, deadlock: DeadlockPolicy, victim: Victim) -> Options {
    Options::default()
        .with_lock_table(kind)
        .with_deadlock(deadlock)
        .with_victim(victim)
        .with_lock_timeout(LONG)
}

/// Every lock table × policy × victim combination either opens (and runs what it names, as
/// the tests above show) or is refused with `InvalidOptions`: a victim rule other than
/// kill-young means something to Dreadlocks only.
fn every_combination_opens_or_is_refused(kind: LockTableKind) {
    for policy in ALL_POLICIES {
        for victim in VICTIMS {
            let used =
                victim == Victim::KillYoung || matches!(policy, DeadlockPolicy::Dreadlocks(_));
            let o = options(kind, policy, victim);
            let what = format!("{kind:?} {policy:?} {victim:?}");
            match Database::try_in_memory_with(o.clone()) {
                Ok(_) => assert!(used, "{what} opened"),
                Err(Error::InvalidOptions(msg)) => {
                    assert!(!used, "{what} refused: {msg}");
                    assert!(msg.contains("Dreadlocks"), "{msg}");
                }
                Err(e) => panic!("{what}: {e:?}"),
            }
            if !used {
                let dir = tempfile::tempdir().unwrap();
                assert!(
                    matches!(Database::open(dir.path(), o), Err(Error::InvalidOptions(_))),
                    "{what}"
                );
            }
        }
    }
}

/// A database on a lock table of `kind` under `policy` with rows `a` and `b` in table `t`.
fn rows_a_and_b(kind: LockTableKind, policy: DeadlockPolicy) -> (Database, Table) {
    let db = Database::in_memory_with(options(kind, policy, Victim::KillYoung));
    let t = db.create_table("t").unwrap();
    db.run(|tx| {
        tx.put(&t, "a", "0")?;
        tx.put(&t, "b", "0")
    })
    .unwrap();
    (db, t)
}

/// Through `Database`: two transactions update two rows in opposite orders. Under no-wait the
/// crossing request fails at once with `Error::Deadlock` on every table (the old latch-free
/// table waited out the lock timeout, here a minute).
fn crossing_transactions_under_no_wait_get_deadlock_at_once(kind: LockTableKind) {
    let (db, t) = rows_a_and_b(kind, DeadlockPolicy::NoWait);
    let mut t1 = db.begin();
    let mut t2 = db.begin();
    t1.put(&t, "a", "1").unwrap();
    t2.put(&t, "b", "2").unwrap();
    let start = Instant::now();
    let r = t1.put(&t, "b", "1");
    assert!(matches!(r, Err(Error::Deadlock { .. })), "{kind:?}: {r:?}");
    assert!(start.elapsed() < LONG / 2, "{kind:?}");
    t1.abort();
    t2.put(&t, "a", "2").unwrap();
    t2.commit().unwrap();
    assert_eq!(db.run(|tx| tx.get(&t, "a")).unwrap(), Some(b"2".to_vec()));
}

/// Through `Database`, each waiting policy on each table: two transactions crossing on two
/// rows end with one `Error::Deadlock` (no `LockTimeout`), and wait-die and wound-wait abort
/// the younger one, so the older one commits.
fn crossing_transactions_resolve_under_every_policy_on_every_table(kind: LockTableKind) {
    for policy in &ALL_POLICIES[1..] {
        let policy = *policy;
        let (db, t) = rows_a_and_b(kind, policy);
        let barrier = Barrier::new(2);
        let results: Vec<Result<(), Error>> = thread::scope(|s| {
            let hs: Vec<_> = [("a", "b"), ("b", "a")]
                .into_iter()
                .enumerate()
                .map(|(i, (first, second))| {
                    let (db, t, barrier) = (&db, &t, &barrier);
                    s.spawn(move || {
                        // Begin in order: the first thread's transaction is the older.
                        if i == 1 {
                            barrier.wait();
                        }
                        let mut tx = db.begin();
                        if i == 0 {
                            barrier.wait();
                        }
                        tx.put(t, first, "x")?;
                        barrier.wait();
                        let r = tx.put(t, second, "x");
                        match r {
                            Ok(()) => tx.commit(),
                            Err(e) => {
                                tx.abort();
                                Err(e)
                            }
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let what = format!("{kind:?} {policy:?}: {results:?}");
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Ok(()) | Err(Error::Deadlock { .. }))),
            "{what}"
        );
        assert!(results.iter().any(|r| r.is_err()), "{what}");
        if matches!(policy, DeadlockPolicy::WaitDie | DeadlockPolicy::WoundWait) {
            assert!(results[0].is_ok() && results[1].is_err(), "{what}");
        }
    }
}

/// Dreadlocks after a lock released before its transaction's end (2PL's instant locks): T3
/// waits for T10's lock C, T2 waits for T3 (its digest names T10), T10 releases C and asks
/// for T2's lock A. Waits-for: T10 -> T2 -> T3, and T3 runs: no cycle. Before, T10 found
/// its fingerprint in T2's digest and rolled back, 19 or 20 times in 20 (the fingerprints
/// below do not collide: not a Bloom false positive).
#[test]
fn dreadlocks_reports_no_deadlock_through_a_lock_released_early() {
    use shoal::lock::dread::{new_fingerprint, txn_fingerprint, Digest};
    let mut d = Digest::of_fingerprint(txn_fingerprint(2));
    d.union(&Digest::of_fingerprint(txn_fingerprint(3)));
    assert!(!d.contains(&Digest::of_fingerprint(txn_fingerprint(10))));
    for kind in [LockTableKind::Sharded, LockTableKind::LatchFree] {
        for style in [WaitStyle::SleepBackoff, WaitStyle::Sleep] {
            for _ in 0..3 {
                let t = AnyTable::new(kind, DeadlockPolicy::Dreadlocks(style), Victim::KillYoung);
                let (a, b, c) = (key(1), key(2), key(3));
                t.lock(2, &a, LockMode::X, LONG).expect("T2: A");
                t.lock(3, &b, LockMode::X, LONG).expect("T3: B");
                t.lock(10, &c, LockMode::X, LONG).expect("T10: C");
                thread::scope(|s| {
                    s.spawn(|| {
                        t.lock(3, &c, LockMode::X, LONG).expect("T3 waits for T10");
                        thread::sleep(Duration::from_millis(200));
                        t.unlock(3, &c);
                        t.unlock(3, &b);
                    });
                    thread::sleep(Duration::from_millis(30));
                    s.spawn(|| {
                        t.lock(2, &b, LockMode::X, LONG).expect("T2 waits for T3");
                        t.unlock(2, &b);
                        t.unlock(2, &a);
                    });
                    thread::sleep(Duration::from_millis(30));
                    t.unlock(10, &c);
                    new_fingerprint(10);
                    let r = t.lock(10, &a, LockMode::X, Duration::from_secs(5));
                    assert!(r.is_ok(), "{kind:?} {style:?}: {r:?}");
                    t.unlock(10, &a);
                });
            }
        }
    }
}

/// The same through the engine: T10's insert waits for its instant NX on the key before it
/// ("p", which T9's scan holds), T3's scan of "p" queues behind it, T2 waits for T3. Once
/// the insert is done (NX released), T10 updates a key T2 holds. Before: `Deadlock` in 5
/// rounds of 5 (the waits-for graph: none).
#[test]
fn an_insert_instant_lock_leaves_no_false_deadlock_behind_under_dreadlocks() {
    use std::sync::mpsc;
    for _ in 0..3 {
        let db = Database::in_memory_with(
            Options::default()
                .with_deadlock(DeadlockPolicy::Dreadlocks(WaitStyle::SleepBackoff))
                .with_lock_timeout(Duration::from_secs(10))
                .with_admission(shoal::Admission::Off),
        );
        let t = db.create_table("t").expect("table");
        db.run(|tx| {
            ["a2", "b3", "p"]
                .iter()
                .try_for_each(|k| tx.put(&t, k, "v"))
        })
        .expect("load");
        let pause = || thread::sleep(Duration::from_millis(40));
        let (db, t) = (&db, &t);
        let r10 = thread::scope(|s| {
            let (go2, rx2) = mpsc::channel::<()>();
            let (go3, rx3) = mpsc::channel::<()>();
            let (end9, rx9) = mpsc::channel::<()>();
            let h2 = s.spawn(move || {
                let mut tx = db.begin();
                tx.put(t, "a2", "2")?;
                rx2.recv().expect("go 2");
                tx.put(t, "b3", "2")
            });
            pause();
            let h9 = s.spawn(move || {
                let mut tx = db.begin();
                tx.scan(t, "p"..="p").expect("scan");
                rx9.recv().expect("end 9");
            });
            pause();
            let h3 = s.spawn(move || {
                let mut tx = db.begin();
                tx.put(t, "b3", "3")?;
                rx3.recv().expect("go 3");
                let r = tx.scan(t, "p"..="p");
                thread::sleep(Duration::from_millis(200));
                r.map(|_| ())
            });
            pause();
            let h10 = s.spawn(move || {
                let mut tx = db.begin();
                tx.put(t, "q", "10")?;
                tx.put(t, "a2", "10")
            });
            pause();
            go3.send(()).expect("go 3");
            pause();
            go2.send(()).expect("go 2");
            pause();
            end9.send(()).expect("end 9");
            h9.join().expect("T9");
            let r10 = h10.join().expect("T10");
            h3.join().expect("T3").expect("T3's scan");
            h2.join().expect("T2").expect("T2's write");
            r10
        });
        assert!(!matches!(r10, Err(Error::Deadlock { .. })), "{r10:?}");
    }
}

/// Dreadlocks' flush-pipeline victim rules pick exactly one victim of a cycle while the
/// pipelines change: T1's thread has 5 commits in flight at its first request, T2's 4; T1
/// waits for T2, its pipeline drains to 3, then T2 closes the cycle. Before, each side
/// compared its length now with the other's length when that one asked: under kill-long
/// neither was the longer and both waited out the lock timeout (E5's kill-long series ran at
/// 4 tps under a pipelined log); under kill-short both rolled back.
#[test]
fn pipeline_victim_rules_pick_one_victim_while_pipelines_drain() {
    use shoal::lock::dread::pipeline_handle;
    use std::sync::atomic::Ordering::SeqCst;
    for kind in [LockTableKind::Sharded, LockTableKind::LatchFree] {
        for victim in [Victim::KillLong, Victim::KillShort] {
            let t = AnyTable::new(
                kind,
                DeadlockPolicy::Dreadlocks(WaitStyle::SleepBackoff),
                victim,
            );
            let (x, y) = (key(1), key(2));
            let start = Instant::now();
            let barrier = Barrier::new(2);
            let (r1, r2) = thread::scope(|s| {
                let (t, x, y, both) = (&t, &x, &y, &barrier);
                let (tx1, rx1) = std::sync::mpsc::channel();
                let h1 = s.spawn(move || {
                    let pipe = pipeline_handle();
                    pipe.store(5, SeqCst);
                    t.lock(1, x, LockMode::X, LONG).expect("T1: x");
                    tx1.send(Arc::clone(&pipe)).expect("send");
                    both.wait();
                    let r = t.lock(1, y, LockMode::X, Duration::from_secs(10));
                    pipe.store(0, SeqCst);
                    t.unlock(1, x);
                    t.unlock(1, y);
                    r
                });
                let pipe1 = rx1.recv().expect("T1's pipeline");
                let h2 = s.spawn(move || {
                    let pipe = pipeline_handle();
                    pipe.store(4, SeqCst);
                    t.lock(2, y, LockMode::X, LONG).expect("T2: y");
                    both.wait();
                    // T1 waits for y; its thread's pipeline drains meanwhile.
                    thread::sleep(Duration::from_millis(50));
                    pipe1.store(3, SeqCst);
                    thread::sleep(Duration::from_millis(20));
                    let r = t.lock(2, x, LockMode::X, Duration::from_secs(10));
                    pipe.store(0, SeqCst);
                    t.unlock(2, x);
                    t.unlock(2, y);
                    r
                });
                (h1.join().expect("T1"), h2.join().expect("T2"))
            });
            let died = [&r1, &r2]
                .iter()
                .filter(|r| matches!(r, Err(LockFailure::Deadlock { .. })))
                .count();
            assert_eq!(died, 1, "{kind:?} {victim:?}: {r1:?} {r2:?}");
            assert!(
                r1.is_ok() || r2.is_ok(),
                "{kind:?} {victim:?}: {r1:?} {r2:?}"
            );
            // T1's 5 at its first request is the longer one.
            assert_eq!(
                r1.is_err(),
                victim == Victim::KillLong,
                "{kind:?} {victim:?}"
            );
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{:?}",
                start.elapsed()
            );
        }
    }
}
