//! Admission control through the public API: the slot limit holds for running transactions,
//! nested transactions share their thread's slot, a transaction waiting for a lock gives its
//! slot to the transaction it waits for, and `Admission::Off` has no gate. The tests wait for
//! states (polling `Database::admission_stats`), never for times.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use shoal::{Admission, ConcurrencyControl, Database, LogMode, Options};

fn until(f: impl Fn() -> bool) {
    while !f() {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn limited(n: usize, cc: ConcurrencyControl) -> Database {
    Database::in_memory_with(
        Options::default()
            .with_admission(Admission::Limit(n))
            .with_cc(cc)
            .with_lock_timeout(Duration::from_secs(60)),
    )
}

#[test]
fn running_transactions_never_exceed_the_limit() {
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
    ] {
        let db = limited(2, cc);
        let t = db.create_table("t").unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for i in 0..8u32 {
                let (db, t, inside, max) = (&db, &t, &inside, &max);
                s.spawn(move || {
                    for n in 0..200u32 {
                        db.run(|tx| {
                            // Shared keys: lock waits (which give the slot up) happen too.
                            tx.add_and_get(t, [(n % 3) as u8], 1)?;
                            tx.put(t, i.to_be_bytes(), n.to_be_bytes())?;
                            // No wait inside the engine from here to the commit: the
                            // transaction holds a slot throughout.
                            let now = inside.fetch_add(1, SeqCst) + 1;
                            max.fetch_max(now, SeqCst);
                            std::thread::yield_now();
                            inside.fetch_sub(1, SeqCst);
                            Ok(())
                        })
                        .unwrap();
                    }
                });
            }
        });
        assert!(
            max.load(SeqCst) <= 2,
            "{cc:?}: {} ran at once",
            max.load(SeqCst)
        );
        let total: i64 = (0..3u8)
            .map(|k| db.run(|tx| tx.get_i64(&t, [k])).unwrap().unwrap_or(0))
            .sum();
        assert_eq!(total, 8 * 200);
        let s = db.admission_stats().unwrap();
        assert_eq!((s.running, s.waiting), (0, 0), "{s:?}");
    }
}

#[test]
fn nested_begin_shares_the_slot_and_never_waits() {
    let db = limited(1, ConcurrencyControl::TwoPhaseLocking);
    let other = limited(1, ConcurrencyControl::TwoPhaseLocking);
    let t = db.create_table("t").unwrap();
    let u = other.create_table("u").unwrap();
    let mut outer = db.begin();
    outer.put(&t, "a", "1").unwrap();
    // The only slot is this thread's: the nested transactions run in it.
    let mut inner = db.begin();
    inner.put(&t, "b", "2").unwrap();
    let mut elsewhere = other.begin();
    elsewhere.put(&u, "c", "3").unwrap();
    assert_eq!(db.admission_stats().unwrap().running, 1);
    assert_eq!(
        other.admission_stats().unwrap().running,
        0,
        "a transaction nested under another database's runs without a slot"
    );
    elsewhere.commit().unwrap();
    inner.commit().unwrap();
    outer.commit().unwrap();
    assert_eq!(db.run(|tx| tx.get(&t, "b")).unwrap(), Some(b"2".to_vec()));
    // Another thread gets the slot the committed thread kept (nobody waits).
    std::thread::scope(|s| {
        s.spawn(|| db.run(|tx| tx.put(&t, "d", "4")).unwrap());
    });
}

/// One slot. A holds a lock on `x` and comes back from a lock wait needing its slot while B
/// runs in it; B then asks for `x`. If B kept its slot while waiting for A's lock, A could
/// never run again (and B would wait for its lock timeout, a minute here).
#[test]
fn a_lock_waiter_gives_its_slot_to_the_holder_it_waits_for() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(
        dir.path(),
        Options::default()
            .with_admission(Admission::Limit(1))
            .with_log(LogMode::Sync)
            // The pipelined commit below holds `y` until its flush is durable: long enough
            // for A to wait on it and for B to begin meanwhile.
            .with_log_latency(Duration::from_secs(1))
            .with_lock_timeout(Duration::from_secs(60)),
    )
    .unwrap();
    let t = db.create_table("t").unwrap();
    let (db, t) = (&db, &t);
    let stats = || db.admission_stats().unwrap();
    // A flush-pipelined commit keeps its lock on `y` (no early lock release) until durable,
    // without a transaction or a slot.
    let mut t0 = db.begin();
    t0.put(t, "y", "0").unwrap();
    let ticket = t0.commit_pipelined().unwrap();
    let (a_locked, a_has_x) = mpsc::channel();
    let (b_running, b_is_running) = mpsc::channel();
    let (go, b_go) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let a = s.spawn(move || {
            let mut ta = db.begin();
            ta.put(t, "x", "a").unwrap();
            a_locked.send(()).unwrap();
            // Waits for the pipelined commit's lock on `y`, without a slot.
            ta.put(t, "y", "a").unwrap();
            ta.commit()
        });
        a_has_x.recv().unwrap();
        until(|| stats().running == 0); // A gave its slot up for the lock wait
        let b = s.spawn(move || {
            let mut tb = db.begin(); // takes the slot
            b_running.send(()).unwrap();
            b_go.recv().unwrap();
            // A holds `x`: B waits, and gives the slot to A.
            let v = tb.get(t, "x").unwrap();
            tb.commit().map(|()| v)
        });
        b_is_running.recv().unwrap();
        // The flush ends A's lock wait; A now waits for the slot B holds.
        until(|| stats().waiting == 1 || a.is_finished());
        assert!(
            !a.is_finished(),
            "the flush ended before B began: scenario missed"
        );
        assert_eq!(stats().resuming, 1, "A resumes a transaction");
        go.send(()).unwrap();
        a.join().unwrap().unwrap();
        assert_eq!(b.join().unwrap().unwrap(), Some(b"a".to_vec()));
    });
    ticket.wait().unwrap();
    let s = stats();
    assert_eq!((s.running, s.waiting), (0, 0), "{s:?}");
}

#[test]
fn admission_off_has_no_gate_and_default_is_auto() {
    let off = Database::in_memory_with(Options::default().with_admission(Admission::Off));
    assert!(off.admission_stats().is_none());
    let t = off.create_table("t").unwrap();
    // Without a gate any number of transactions run at once.
    let txs: Vec<_> = (0..64).map(|_| off.begin()).collect();
    drop(txs);
    off.run(|tx| tx.put(&t, "k", "v")).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(
        Database::in_memory().admission_stats().unwrap().limit,
        cores
    );
}

#[test]
fn auto_adds_a_spare_slot_for_synchronous_commits_only() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let limit = |log: LogMode, admission: Admission| {
        let dir = tempfile::tempdir().unwrap();
        let o = Options::default().with_log(log).with_admission(admission);
        let db = Database::open(dir.path(), o).unwrap();
        db.admission_stats().unwrap().limit
    };
    assert_eq!(limit(LogMode::Sync, Admission::Auto), cores + 1);
    assert_eq!(limit(LogMode::Async, Admission::Auto), cores);
    assert_eq!(limit(LogMode::Pipelined, Admission::Auto), cores);
    assert_eq!(limit(LogMode::Sync, Admission::Limit(2)), 2);
}

#[test]
fn many_threads_over_one_slot_all_finish_in_every_mode() {
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
        ConcurrencyControl::Serial,
        ConcurrencyControl::Doppel,
    ] {
        let db = limited(1, cc);
        let t = db.create_table("t").unwrap();
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    for _ in 0..50 {
                        db.run(|tx| tx.add_and_get(&t, "n", 1)).unwrap();
                    }
                });
            }
        });
        assert_eq!(
            db.run(|tx| tx.get_i64(&t, "n")).unwrap(),
            Some(800),
            "{cc:?}"
        );
    }
}

/// One slot, held by A, whose transaction waits (outside the engine) for B to commit: B
/// waits for the slot, gives up after `admission::ESCAPE` and runs without one, so the
/// program finishes instead of deadlocking.
#[test]
fn a_thread_waiting_for_a_slot_too_long_runs_without_one() {
    let db = limited(1, ConcurrencyControl::TwoPhaseLocking);
    let t = db.create_table("t").unwrap();
    let (db, t) = (&db, &t);
    let (b_done, wait_b) = mpsc::channel();
    std::thread::scope(|s| {
        let a = s.spawn(move || {
            let mut ta = db.begin();
            ta.put(t, "a", "1").unwrap();
            wait_b.recv().unwrap();
            ta.commit()
        });
        until(|| db.admission_stats().unwrap().running == 1);
        s.spawn(move || {
            db.run(|tb| tb.put(t, "b", "1")).unwrap();
            b_done.send(()).unwrap();
        });
        a.join().unwrap().unwrap();
    });
    let s = db.admission_stats().unwrap();
    assert_eq!((s.escaped, s.running, s.waiting), (1, 0, 0), "{s:?}");
}

/// With more than one slot, a lock waiter keeps its slot while one slot stays with a thread
/// that is not waiting for a lock. Hot-key increments under 2PL, with commits that wait for
/// the log (so lock holders come back from log waits and need a slot again): everything
/// finishes, and no thread had to escape the gate, which is how a slot/lock deadlock would
/// have ended.
#[test]
fn lock_waiters_that_keep_their_slot_never_block_the_holder() {
    for slots in [2, 3] {
        for log in [LogMode::Sync, LogMode::Pipelined] {
            let dir = tempfile::tempdir().unwrap();
            let db = Database::open(
                dir.path(),
                Options::default()
                    .with_admission(Admission::Limit(slots))
                    .with_log(log)
                    .with_lock_timeout(Duration::from_secs(60)),
            )
            .unwrap();
            let t = db.create_table("t").unwrap();
            std::thread::scope(|s| {
                for _ in 0..12 {
                    s.spawn(|| {
                        for _ in 0..40 {
                            db.run(|tx| {
                                tx.add_and_get(&t, "hot", 1)?;
                                tx.add_and_get(&t, "other", 1)
                            })
                            .unwrap();
                        }
                    });
                }
            });
            assert_eq!(
                db.run(|tx| tx.get_i64(&t, "hot")).unwrap(),
                Some(480),
                "{slots} slots, {log:?}"
            );
            let st = db.admission_stats().unwrap();
            assert_eq!(st.escaped, 0, "{slots} slots, {log:?}: {st:?}");
        }
    }
}

/// Waits until `f` holds; panics after 10 s (a state the test waits for was missed).
fn until_within(f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "waited 10 s for a state"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Thread T2 holds a lock of database B (admission off) and begins a transaction of A;
/// thread T1 holds A's only slot and, in a nested transaction of B, waits for that lock.
/// Before, the nested wait kept A's slot (B has no gate, and its own gate was the one
/// consulted), and T2 waited for it: a deadlock only the 1 s escape broke (T2 waited 1.0 s).
#[test]
fn a_nested_lock_wait_in_an_ungated_database_gives_up_the_threads_slot() {
    let a = Database::in_memory_with(
        Options::default()
            .with_admission(Admission::Limit(1))
            .with_lock_timeout(Duration::from_secs(60)),
    );
    let b = Database::in_memory_with(
        Options::default()
            .with_admission(Admission::Off)
            .with_lock_timeout(Duration::from_secs(60)),
    );
    let ta = a.create_table("t").expect("ok");
    let tb = b.create_table("t").expect("ok");
    let (a, b, ta, tb) = (&a, &b, &ta, &tb);
    let (locked_tx, locked_rx) = mpsc::channel();
    let (t1_waiting_tx, t1_waiting_rx) = mpsc::channel::<()>();
    let waited = std::thread::scope(|s| {
        // T2: holds B's key k.
        let t2 = s.spawn(move || {
            let mut txb = b.begin();
            txb.put(tb, "k", "2").expect("ok");
            locked_tx.send(()).expect("ok");
            t1_waiting_rx.recv().expect("ok");
            // Now T2, with a B transaction open, begins on A.
            let start = Instant::now();
            let mut txa = a.begin();
            let waited = start.elapsed();
            txa.put(ta, "x", "2").expect("ok");
            txa.commit().expect("ok");
            txb.commit().expect("ok");
            waited
        });
        locked_rx.recv().expect("ok");
        // T1: A's only slot, then a nested B transaction that waits for k.
        s.spawn(move || {
            let mut txa = a.begin();
            txa.put(ta, "y", "1").expect("ok");
            let mut txb = b.begin();
            txb.put(tb, "k", "1").expect("ok"); // waits for T2
            txb.commit().expect("ok");
            txa.commit().expect("ok");
        });
        // T1 takes A's slot, then waits in B's lock table (giving the slot up, now).
        std::thread::sleep(Duration::from_millis(100));
        t1_waiting_tx.send(()).expect("ok");
        t2.join().expect("ok")
    });
    let st = a.admission_stats().expect("ok");
    println!("T2 waited {waited:?} for A's slot; A stats {st:?}");
    assert!(
        waited < Duration::from_millis(500) && st.escaped == 0,
        "T2 waited {waited:?} (escaped {}) for the slot T1 kept through a lock wait",
        st.escaped
    );
}

/// Both databases gated (two slots each): a nested B lock wait in an A slot was counted in
/// B's lock waiters, so A's rule "one slot stays with a thread that is not waiting for a
/// lock" did not hold; the holder T3, coming back from a log wait, found both A slots held
/// by lock waiters and could only escape (with a 400 ms log wait: 1.4 s).
#[test]
fn a_nested_lock_wait_counts_on_the_gate_of_the_slot_it_waits_in() {
    let opts = || {
        Options::default()
            .with_admission(Admission::Limit(2))
            .with_lock_timeout(Duration::from_secs(60))
    };
    let a = Database::in_memory_with(opts());
    let b = Database::in_memory_with(opts());
    let dir = tempfile::tempdir().expect("ok");
    // C: a slow log, so T3's commit there is a long wait inside the engine.
    let c = Database::open(
        dir.path(),
        opts()
            .with_admission(Admission::Off)
            .with_log(LogMode::Sync)
            .with_log_latency(Duration::from_secs(2)),
    )
    .expect("ok");
    let ta = a.create_table("t").expect("ok");
    let tb = b.create_table("t").expect("ok");
    let tc = c.create_table("t").expect("ok");
    let (a, b, c, ta, tb, tc) = (&a, &b, &c, &ta, &tb, &tc);
    let (in_log_tx, in_log_rx) = mpsc::channel();
    let resumed = std::thread::scope(|s| {
        let t3 = s.spawn(move || {
            let mut txa = a.begin();
            txa.put(ta, "x", "3").expect("ok"); // L_A
            let mut txb = b.begin();
            txb.put(tb, "y", "3").expect("ok"); // L_B
            let mut txc = c.begin();
            txc.put(tc, "z", "3").expect("ok");
            in_log_tx.send(()).expect("ok");
            let start = Instant::now();
            txc.commit().expect("ok"); // ~2 s without A's slot, then takes one back
            let resumed = start.elapsed();
            txb.commit().expect("ok");
            txa.commit().expect("ok");
            resumed
        });
        in_log_rx.recv().expect("ok");
        until_within(|| a.admission_stats().expect("ok").running == 0);
        // T1: an A slot, nested B transaction waiting (in its slot) for L_B.
        s.spawn(move || {
            let _txa = a.begin();
            let mut txb = b.begin();
            txb.put(tb, "y", "1").expect("ok");
            txb.commit().expect("ok");
        });
        until_within(|| a.admission_stats().expect("ok").running == 1);
        std::thread::sleep(Duration::from_millis(30));
        // T2: the other A slot, waiting (in its slot) for L_A.
        s.spawn(move || {
            let mut txa = a.begin();
            txa.put(ta, "x", "2").expect("ok");
            txa.commit().expect("ok");
        });
        // T2 waits for L_A: in its slot before (with T1's wait counted on B's gate), now
        // without it (T1 already waits in one of A's two slots).
        std::thread::sleep(Duration::from_millis(100));
        t3.join().expect("ok")
    });
    let st = a.admission_stats().expect("ok");
    println!("T3's commit on C took {resumed:?}; A stats {st:?}");
    assert!(
        st.escaped == 0 && resumed < Duration::from_millis(2600),
        "holder T3 took {resumed:?} to resume (A escaped {})",
        st.escaped
    );
}
