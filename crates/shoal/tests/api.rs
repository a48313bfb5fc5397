//! Behaviour of the public API on one thread (and two for the doomed-transaction case): input
//! validation, read-your-writes, rollback, ghosts, integer operations and scan bounds.

use std::ops::{Bound, RangeBounds};
use std::time::Duration;

use shoal::{ConcurrencyControl, Database, Error, Options};

fn dbs() -> Vec<Database> {
    vec![
        Database::in_memory(),
        Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Serial)),
        Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Optimistic)),
    ]
}

fn k(i: u32) -> [u8; 4] {
    i.to_be_bytes()
}

#[test]
fn bad_input_is_a_typed_error() {
    for db in dbs() {
        let t = db.create_table("t").expect("create");
        let mut tx = db.begin();
        assert!(matches!(tx.put(&t, b"", b"v"), Err(Error::EmptyKey)));
        let long = vec![7u8; db.options().max_key_len + 1];
        assert!(matches!(tx.get(&t, &long), Err(Error::KeyTooLarge { .. })));
        let big = vec![0u8; db.options().max_value_len + 1];
        assert!(matches!(
            tx.put(&t, b"k", &big),
            Err(Error::ValueTooLarge { .. })
        ));
        tx.put(&t, b"s", b"not a number").expect("put");
        assert!(matches!(
            tx.add_and_get(&t, b"s", 1),
            Err(Error::NotAnInteger { len: 12, .. })
        ));
        tx.put(&t, b"m", i64::MAX.to_le_bytes()).expect("put");
        assert!(matches!(
            tx.add_and_get(&t, b"m", 1),
            Err(Error::Overflow { .. })
        ));
        // Statement errors do not doom the transaction.
        tx.put(&t, b"ok", b"1").expect("still usable");
        tx.commit().expect("commit");
        assert!(matches!(
            db.create_table("t"),
            Err(Error::TableExists { .. })
        ));
        assert!(matches!(
            db.create_table("a\nb"),
            Err(Error::InvalidTableName { .. })
        ));
        assert!(matches!(db.table("zz"), Err(Error::NoSuchTable { .. })));
        let other = Database::in_memory();
        let foreign = other.create_table("t").expect("create");
        assert!(matches!(
            db.run(|tx| tx.get(&foreign, b"k")),
            Err(Error::ForeignTable { .. })
        ));
    }
}

#[test]
fn read_own_writes_and_rollback() {
    for db in dbs() {
        let t = db.create_table("t").expect("create");
        db.run(|tx| tx.put(&t, b"a", b"1")).expect("seed");
        let mut tx = db.begin();
        tx.put(&t, b"a", b"2").expect("put");
        tx.insert(&t, b"b", b"3").expect("insert");
        assert!(tx.delete(&t, b"a").expect("delete"));
        assert_eq!(tx.get(&t, b"a").expect("get"), None);
        assert_eq!(tx.get(&t, b"b").expect("get"), Some(b"3".to_vec()));
        assert_eq!(tx.add_and_get(&t, b"n", 5).expect("add"), 5);
        assert_eq!(tx.scan(&t, ..).expect("scan").len(), 2);
        tx.abort();
        let rows = db.run(|tx| tx.scan(&t, ..)).expect("scan");
        assert_eq!(rows, vec![(b"a".to_vec(), b"1".to_vec())]);
        // Dropping is aborting.
        {
            let mut tx = db.begin();
            tx.put(&t, b"z", b"z").expect("put");
        }
        assert_eq!(db.run(|tx| tx.get(&t, b"z")).expect("get"), None);
    }
}

#[test]
fn insert_duplicate_and_reinsert_after_delete() {
    for db in dbs() {
        let t = db.create_table("t").expect("create");
        db.run(|tx| tx.insert(&t, b"k", b"1")).expect("insert");
        assert!(matches!(
            db.run(|tx| tx.insert(&t, b"k", b"2")),
            Err(Error::DuplicateKey { .. })
        ));
        db.run(|tx| tx.delete(&t, b"k")).expect("delete");
        db.run(|tx| tx.insert(&t, b"k", b"3"))
            .expect("insert over ghost");
        assert_eq!(
            db.run(|tx| tx.get(&t, b"k")).expect("get"),
            Some(b"3".to_vec())
        );
        let mut tx = db.begin();
        assert!(tx.delete(&t, b"k").expect("delete"));
        tx.insert(&t, b"k", b"4")
            .expect("insert in same txn after delete");
        tx.commit().expect("commit");
        assert_eq!(
            db.run(|tx| tx.get(&t, b"k")).expect("get"),
            Some(b"4".to_vec())
        );
    }
}

#[test]
fn integer_ops() {
    for db in dbs() {
        let t = db.create_table("t").expect("create");
        assert_eq!(db.run(|tx| tx.add_and_get(&t, b"c", 3)).expect("add"), 3);
        assert_eq!(db.run(|tx| tx.add_and_get(&t, b"c", -10)).expect("add"), -7);
        assert_eq!(db.run(|tx| tx.max_and_get(&t, b"c", -9)).expect("max"), -7);
        assert_eq!(db.run(|tx| tx.max_and_get(&t, b"c", 4)).expect("max"), 4);
        assert_eq!(db.run(|tx| tx.min_and_get(&t, b"c", 9)).expect("min"), 4);
        assert_eq!(db.run(|tx| tx.min_and_get(&t, b"c", -1)).expect("min"), -1);
        assert_eq!(db.run(|tx| tx.get_i64(&t, b"c")).expect("get"), Some(-1));
        assert_eq!(db.run(|tx| tx.get_i64(&t, b"none")).expect("get"), None);
    }
}

#[test]
fn scan_bounds_match_a_model() {
    for db in dbs() {
        let t = db.create_table("t").expect("create");
        // Keys 0, 2, 4, ..., 2000 with some deleted (ghosts) to exercise the ghost path.
        db.run(|tx| {
            for i in (0..=2000).step_by(2) {
                tx.put(&t, k(i), k(i))?;
            }
            Ok(())
        })
        .expect("load");
        db.run(|tx| {
            for i in (0..=2000).step_by(6) {
                tx.delete(&t, k(i))?;
            }
            Ok(())
        })
        .expect("delete");
        let live: Vec<u32> = (0..=2000).step_by(2).filter(|i| i % 6 != 0).collect();
        let bounds = |x: u32| {
            [
                Bound::Included(k(x).to_vec()),
                Bound::Excluded(k(x).to_vec()),
                Bound::Unbounded,
            ]
        };
        for (a, b) in [
            (0, 2000),
            (5, 5),
            (6, 600),
            (7, 1999),
            (300, 301),
            (1998, 2001),
        ] {
            for lo in bounds(a) {
                for hi in bounds(b) {
                    let r = (lo.as_ref().map(|v| &v[..]), hi.as_ref().map(|v| &v[..]));
                    let got: Vec<Vec<u8>> = db
                        .run(|tx| tx.scan(&t, r))
                        .expect("scan")
                        .into_iter()
                        .map(|(k, _)| k)
                        .collect();
                    let want: Vec<Vec<u8>> = live
                        .iter()
                        .map(|&i| k(i).to_vec())
                        .filter(|x| (r.0, r.1).contains(&x[..]))
                        .collect();
                    assert_eq!(got, want, "range {r:?}");
                    let mut rev: Vec<Vec<u8>> = db
                        .run(|tx| tx.scan_rev(&t, r))
                        .expect("scan")
                        .into_iter()
                        .map(|(k, _)| k)
                        .collect();
                    rev.reverse();
                    assert_eq!(rev, want, "reverse range {r:?}");
                }
            }
        }
    }
}

#[test]
fn ghosts_are_collected_when_unlocked() {
    let db = Database::in_memory();
    let t = db.create_table("t").expect("create");
    db.run(|tx| {
        for i in 0..100 {
            tx.put(&t, k(i), b"v")?;
        }
        Ok(())
    })
    .expect("load");
    db.run(|tx| {
        for i in 0..100 {
            tx.delete(&t, k(i))?;
        }
        Ok(())
    })
    .expect("delete");
    // Nobody else held locks, so every ghost is gone from the index itself.
    assert_eq!(db.run(|tx| tx.scan(&t, ..)).expect("scan").len(), 0);
    assert_eq!(shoal_internal_len(&db, "t"), 0);
}

/// Entries in the index including ghosts, via a full scan of the tree.
fn shoal_internal_len(db: &Database, name: &str) -> usize {
    db.debug_index_len(name).expect("table")
}

#[test]
fn a_deadlock_victim_is_doomed_and_releases_its_locks() {
    let db = Database::in_memory_with(Options::default().with_lock_timeout(Duration::from_secs(5)));
    let t = db.create_table("t").expect("create");
    db.run(|tx| {
        tx.put(&t, b"a", b"0")?;
        tx.put(&t, b"b", b"0")
    })
    .expect("seed");
    let barrier = std::sync::Barrier::new(2);
    let results: Vec<(bool, bool)> = std::thread::scope(|s| {
        let hs: Vec<_> = [(b"a", b"b"), (b"b", b"a")]
            .into_iter()
            .map(|(first, second)| {
                let (db, t, barrier) = (&db, &t, &barrier);
                s.spawn(move || {
                    let mut tx = db.begin();
                    tx.put(t, first, b"1").expect("first lock");
                    barrier.wait();
                    match tx.put(t, second, b"1") {
                        Ok(()) => (tx.commit().is_ok(), false),
                        Err(e) => {
                            assert!(e.is_retryable(), "{e}");
                            // Doomed: later operations say why.
                            let again = tx.get(t, b"a");
                            assert!(matches!(again, Err(Error::TransactionAborted { .. })));
                            (false, true)
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let committed = results.iter().filter(|r| r.0).count();
    let victims = results.iter().filter(|r| r.1).count();
    assert_eq!((committed, victims), (1, 1), "{results:?}");
}

/// A closure that swallows a retryable error (here a lock timeout) and goes on still has its
/// transaction run again by `Database::run`: the commit fails with a `TransactionAborted`
/// that says the earlier failure was retryable.
#[test]
fn run_retries_a_transaction_whose_closure_swallowed_a_retryable_error() {
    let db =
        Database::in_memory_with(Options::default().with_lock_timeout(Duration::from_millis(50)));
    let t = db.create_table("t").expect("create");
    let mut blocker = Some(db.begin());
    blocker
        .as_mut()
        .expect("blocker")
        .put(&t, b"a", b"held")
        .expect("lock");
    let mut attempts = 0;
    let mut swallowed = Vec::new();
    db.run(|tx| {
        attempts += 1;
        if let Err(e) = tx.put(&t, b"a", b"mine") {
            // The error is dropped on the floor; the blocker goes away.
            swallowed.push(e.is_retryable());
            drop(blocker.take());
        }
        Ok(())
    })
    .expect("run retries the doomed transaction");
    assert_eq!((attempts, swallowed), (2, vec![true]));
    let v = db.run(|tx| tx.get(&t, b"a")).expect("read");
    assert_eq!(v.as_deref(), Some(&b"mine"[..]));
}

#[test]
fn a_refused_table_lock_names_the_table() {
    use shoal::IntentLockKind;
    use shoal::LockMode;
    for intent_locks in [IntentLockKind::Lightweight, IntentLockKind::LockTable] {
        let db = Database::in_memory_with(
            Options::default()
                .with_lock_timeout(Duration::from_millis(5))
                .with_intent_locks(intent_locks),
        );
        let t = db.create_table("accounts").expect("create");
        let mut a = db.begin();
        a.lock_table(&t, LockMode::X).expect("X");
        let mut b = db.begin();
        let e = b.lock_table(&t, LockMode::IS).expect_err("blocked by X");
        assert!(e.is_retryable(), "{e}");
        assert!(
            e.to_string().contains("\"accounts\""),
            "{intent_locks:?}: {e}"
        );
        drop(b);
        a.commit().expect("commit");
        // A foreign table is still refused.
        let other = Database::in_memory();
        let u = other.create_table("u").expect("create");
        let mut c = db.begin();
        assert!(matches!(
            c.lock_table(&u, LockMode::IS),
            Err(Error::ForeignTable { .. })
        ));
    }
}

/// Wait-die orders by age, and a restart keeps its first attempt's age: a transaction begun
/// with `begin_retry` for an aborted older one waits for a younger holder (and times out
/// here), where a fresh transaction dies at once.
#[test]
fn wait_die_restart_keeps_its_age() {
    let db = Database::in_memory_with(
        Options::default()
            .with_deadlock(shoal::DeadlockPolicy::WaitDie)
            .with_lock_timeout(Duration::from_millis(100)),
    );
    let t = db.create_table("t").unwrap();
    let first = db.begin();
    let age = first.age();
    assert_eq!(age, first.id());
    first.abort();
    let mut holder = db.begin();
    holder.put(&t, b"k", b"1").unwrap();
    // A fresh transaction is younger than the holder: it dies without waiting.
    let mut fresh = db.begin();
    let e = fresh.put(&t, b"k", b"2").unwrap_err();
    assert!(matches!(e, Error::Deadlock { .. }), "{e:?}");
    fresh.abort();
    // The restart is older than the holder: it waits, until its lock timeout.
    let mut retry = db.begin_retry(age);
    assert!(retry.id() > holder.id() && retry.age() < holder.age());
    let e = retry.put(&t, b"k", b"3").unwrap_err();
    assert!(matches!(e, Error::LockTimeout { .. }), "{e:?}");
    retry.abort();
    holder.commit().unwrap();
}

/// `get_for_update` reads what `get` reads. Under 2PL it locks the key exclusively at once:
/// a second reader is refused (here after the 5 ms lock timeout), where after a `get` it is
/// let in. Under OCC it is a plain read: both transactions read, and the second writer to
/// commit fails validation.
#[test]
fn get_for_update_reads_and_locks_for_the_write() {
    let db =
        Database::in_memory_with(Options::default().with_lock_timeout(Duration::from_millis(5)));
    let t = db.create_table("t").expect("create");
    db.run(|tx| tx.put(&t, b"k", b"1")).expect("seed");
    let mut a = db.begin();
    assert_eq!(a.get(&t, b"k").expect("get"), Some(b"1".to_vec()));
    let mut b = db.begin();
    assert_eq!(b.get(&t, b"k").expect("shared"), Some(b"1".to_vec()));
    drop(b);
    a.commit().expect("commit");

    let mut a = db.begin();
    assert_eq!(
        a.get_for_update(&t, b"k").expect("read"),
        Some(b"1".to_vec())
    );
    assert_eq!(a.get_for_update(&t, b"none").expect("absent"), None);
    let mut b = db.begin();
    let e = b.get(&t, b"k").expect_err("the key is locked for update");
    assert!(e.is_retryable(), "{e}");
    drop(b);
    a.put(&t, b"k", b"2").expect("write without an upgrade");
    a.commit().expect("commit");
    assert_eq!(
        db.run(|tx| tx.get(&t, b"k")).expect("get"),
        Some(b"2".to_vec())
    );

    let occ = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Optimistic));
    let t = occ.create_table("t").expect("create");
    occ.run(|tx| tx.put(&t, b"k", b"1")).expect("seed");
    let mut a = occ.begin();
    let mut b = occ.begin();
    assert_eq!(a.get_for_update(&t, b"k").expect("a"), Some(b"1".to_vec()));
    assert_eq!(b.get_for_update(&t, b"k").expect("b"), Some(b"1".to_vec()));
    a.put(&t, b"k", b"2").expect("a writes");
    b.put(&t, b"k", b"3").expect("b writes");
    a.commit().expect("first committer");
    let e = b.commit().expect_err("b read a value that changed");
    assert!(e.is_retryable(), "{e}");
    assert_eq!(
        occ.run(|tx| tx.get(&t, b"k")).expect("get"),
        Some(b"2".to_vec())
    );
}

/// Runs `f` on a thread of its own; `None` when it has not returned within `secs`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

/// `Transaction::update`'s function may panic, or read through another transaction, under
/// every concurrency control. Under 2PL and Serial it ran with the leaf latched: a panic left
/// the latch held for good (every later access to the leaf spun, and so did the panicking
/// thread's own rollback when it had written there first), and a nested read spun on it.
#[test]
fn an_update_function_that_panics_or_reads_leaves_no_latch_behind() {
    let ccs = [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Serial,
        ConcurrencyControl::Optimistic,
        ConcurrencyControl::Doppel,
    ];
    for cc in ccs {
        let db = Database::in_memory_with(Options::default().with_cc(cc));
        let t = db.create_table("t").expect("table");
        db.run(|tx| {
            tx.put(&t, "a", "1")?;
            tx.put(&t, "b", "2")
        })
        .expect("load");
        let (d, tt) = (db.clone(), t.clone());
        let unwound = within(10, move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = d.run(|tx| {
                    tx.put(&tt, "c", "x")?;
                    tx.update(&tt, "a", |_| panic!("the caller's function panics"))
                });
            }))
            .is_err()
        });
        assert_eq!(unwound, Some(true), "{cc:?}: the panic did not unwind");
        let (d, tt) = (db.clone(), t.clone());
        let after = within(10, move || d.run(|tx| tx.get(&tt, "a")));
        assert_eq!(
            after.map(Result::ok),
            Some(Some(Some(b"1".to_vec()))),
            "{cc:?}"
        );
        if cc == ConcurrencyControl::Serial {
            continue; // a nested transaction under Serial waits for the outer one (documented)
        }
        let (d, tt) = (db.clone(), t.clone());
        let nested = within(10, move || {
            d.run(|tx| {
                tx.update(&tt, "a", |cur| {
                    let b = d
                        .run(|t2| t2.get(&tt, "b"))
                        .ok()
                        .flatten()
                        .unwrap_or_default();
                    [cur.unwrap_or_default(), &b[..]].concat()
                })
            })
        });
        assert_eq!(nested.map(Result::ok), Some(Some(2)), "{cc:?}");
        assert_eq!(
            db.run(|tx| tx.get(&t, "a")).expect("read"),
            Some(b"12".to_vec())
        );
    }
}

#[test]
fn a_scan_of_no_rows_checks_its_table_and_bounds() {
    let db = Database::in_memory();
    let other = Database::in_memory();
    let theirs = other.create_table("t").expect("table");
    let t = db.create_table("t").expect("table");
    let mut tx = db.begin();
    for limit in [0, 1] {
        assert!(matches!(
            tx.scan_limit(&theirs, .., limit),
            Err(Error::ForeignTable { .. })
        ));
        assert!(matches!(
            tx.scan_rev_limit(&theirs, .., limit),
            Err(Error::ForeignTable { .. })
        ));
        let long = vec![0u8; 5000];
        assert!(matches!(
            tx.scan_limit(&t, long.clone().., limit),
            Err(Error::KeyTooLarge { .. })
        ));
    }
    assert!(tx.scan_limit(&t, .., 0).expect("empty").is_empty());
}

/// `Options::memory_limit` holds for one large transaction under every protocol. Under OCC
/// and Doppel a transaction's writes wait in its write set until commit, and only the
/// tables' pages were counted: one transaction of 2 MB committed whole into a database
/// limited to 256 KiB.
#[test]
fn one_large_transaction_is_held_to_the_memory_limit_under_every_protocol() {
    const LIMIT: u64 = 256 << 10;
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
        ConcurrencyControl::Doppel,
    ] {
        let db = Database::in_memory_with(
            Options::default()
                .with_cc(cc)
                .with_memory_limit(Some(LIMIT)),
        );
        let t = db.create_table("t").unwrap();
        let mut tx = db.begin();
        let mut refused = None;
        for i in 0..2000u32 {
            if let Err(e) = tx.put(&t, i.to_be_bytes(), [7u8; 1000]) {
                refused = Some((i, e));
                break;
            }
        }
        let committed = tx.commit();
        let used = db.page_bytes();
        assert!(
            refused.is_some() && used <= 2 * LIMIT,
            "{cc:?}: no write refused ({refused:?}), commit {committed:?}, the tables now \
             hold {used} bytes of pages under a limit of {LIMIT}"
        );
    }
}

/// A write refused with `TransactionTooLarge` dooms the transaction under every protocol:
/// the commit fails with `TransactionAborted` and nothing of it is written. Under OCC and
/// Doppel the refusal left the transaction usable, and its commit wrote the part accepted
/// before it.
#[test]
fn a_transaction_too_large_is_refused_alike_under_every_protocol() {
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Serial,
        ConcurrencyControl::Optimistic,
        ConcurrencyControl::Doppel,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let b = 1usize << 20;
        let opts = Options::default()
            .with_cc(cc)
            .with_log_buffer(b)
            .with_max_value_len(b / 16);
        let db = Database::open(dir.path(), opts).unwrap();
        let t = db.create_table("t").unwrap();
        let v = vec![1u8; b / 16];
        let mut tx = db.begin();
        tx.put(&t, "first", "1").unwrap();
        let mut refused = false;
        for i in 0..64 {
            match tx.put(&t, format!("k{i:03}"), &v) {
                Ok(()) => {}
                Err(Error::TransactionTooLarge { .. }) => {
                    refused = true;
                    break;
                }
                Err(e) => panic!("{cc:?}: {e}"),
            }
        }
        assert!(refused, "{cc:?}");
        let commit = tx.commit();
        let first = db.run(|tx| tx.get(&t, "first")).unwrap();
        assert!(
            matches!(commit, Err(Error::TransactionAborted { .. })) && first.is_none(),
            "{cc:?}: commit after TransactionTooLarge = {commit:?}, \"first\" = {first:?}"
        );
    }
}

/// `add_and_get` (and `max_and_get`, `min_and_get`) refuse an 8-byte value over
/// `max_value_len`, as `put` and `add` do (they stored it).
#[test]
fn integer_operations_respect_max_value_len() {
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
    ] {
        let db = Database::in_memory_with(Options::default().with_cc(cc).with_max_value_len(4));
        let t = db.create_table("t").unwrap();
        assert!(matches!(
            db.run(|tx| tx.add(&t, "n", 1)),
            Err(Error::ValueTooLarge { len: 8, max: 4 })
        ));
        let r = db.run(|tx| tx.add_and_get(&t, "n", 1));
        assert!(
            matches!(r, Err(Error::ValueTooLarge { len: 8, max: 4 })),
            "{cc:?}: add_and_get = {r:?}, stored {:?}",
            db.run(|tx| tx.get(&t, "n"))
        );
    }
}

/// One value larger than the memory limit is refused: only the tables' pages at the time
/// were compared with it, and a 16 MiB value went into a database limited to 1 MiB.
#[test]
fn one_value_larger_than_the_memory_limit_is_refused() {
    const LIMIT: u64 = 1 << 20;
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
    ] {
        let db = Database::in_memory_with(
            Options::default()
                .with_cc(cc)
                .with_memory_limit(Some(LIMIT)),
        );
        let t = db.create_table("t").unwrap();
        let r = db.run(|tx| tx.put(&t, "big", vec![1u8; 16 << 20]));
        assert!(
            matches!(r, Err(Error::MemoryLimit { .. })) && db.page_bytes() <= LIMIT,
            "{cc:?}: {r:?}, page_bytes {} under a {LIMIT}-byte limit",
            db.page_bytes()
        );
        db.run(|tx| tx.put(&t, "small", [1u8; 100]))
            .expect("a small write still fits");
    }
}

/// `create_table` is refused at the memory limit (each table takes a 32 KiB root page at
/// once: 200 tables took 6 MiB under a 1 MiB limit).
#[test]
fn create_table_is_refused_at_the_memory_limit() {
    const LIMIT: u64 = 1 << 20;
    let db = Database::in_memory_with(Options::default().with_memory_limit(Some(LIMIT)));
    let mut refused = None;
    for i in 0..200 {
        if let Err(e) = db.create_table(&format!("t{i}")) {
            refused = Some(e);
            break;
        }
    }
    assert!(
        matches!(refused, Some(Error::MemoryLimit { .. })) && db.page_bytes() <= LIMIT,
        "{refused:?}: page_bytes {} under a {LIMIT}-byte limit",
        db.page_bytes()
    );
}

/// A database reopened with a smaller `max_key_len` still reads and deletes the rows whose
/// keys are longer (the open succeeded and scans returned them, but `get` and `delete`
/// refused their keys, so they could not be removed); writing such a key is refused.
#[test]
fn rows_written_under_a_larger_max_key_len_can_be_read_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let long = vec![b'k'; 100];
    {
        let db = Database::open(dir.path(), Options::default()).unwrap();
        let t = db.create_table("t").unwrap();
        db.run(|tx| tx.put(&t, &long, "v")).unwrap();
    }
    let db = Database::open(dir.path(), Options::default().with_max_key_len(50)).unwrap();
    let t = db.table("t").unwrap();
    assert_eq!(db.run(|tx| tx.scan(&t, ..)).unwrap().len(), 1);
    assert_eq!(db.run(|tx| tx.get(&t, &long)).unwrap(), Some(b"v".to_vec()));
    assert!(matches!(
        db.run(|tx| tx.put(&t, &long, "w")),
        Err(Error::KeyTooLarge { len: 100, max: 50 })
    ));
    assert!(db.run(|tx| tx.delete(&t, &long)).unwrap());
    assert!(db.run(|tx| tx.scan(&t, ..)).unwrap().is_empty());
}

/// Pages a table freed stay with it (only it reuses them), so they count against the
/// memory limit for other tables' writes: filling table `a`, emptying it and filling `b`
/// held twice the limit. Writes to `a` itself reuse its freed pages.
#[test]
fn pages_one_table_freed_count_against_the_limit_for_another() {
    const LIMIT: u64 = 2 << 20;
    let db = Database::in_memory_with(Options::default().with_memory_limit(Some(LIMIT)));
    let fill = |t: &shoal::Table| {
        let mut n = 0u32;
        while db.run(|tx| tx.put(t, n.to_be_bytes(), [7u8; 3000])).is_ok() {
            n += 1;
        }
        n
    };
    let a = db.create_table("a").unwrap();
    let n = fill(&a);
    assert!(
        n > 30,
        "{n} rows (each value on an overflow page) filled the limit"
    );
    for i in 0..n {
        db.run(|tx| tx.delete(&a, i.to_be_bytes())).unwrap();
    }
    // Let the ghosts go (later transactions collect them) and their pages be freed.
    for _ in 0..100 {
        db.run(|tx| tx.get(&a, "x").map(drop)).unwrap();
    }
    assert!(
        db.page_bytes() < LIMIT / 4,
        "{} bytes in use",
        db.page_bytes()
    );
    let b = db.create_table("b");
    let held = |db: &Database| {
        ["a", "b"]
            .iter()
            .filter_map(|name| db.debug_index_stats(name).ok())
            .map(|s| ((s.pages + s.free) * (32 << 10)) as u64)
            .sum::<u64>()
    };
    if let Ok(b) = &b {
        fill(b);
    }
    assert!(
        held(&db) <= LIMIT + LIMIT / 8,
        "the tables hold {} bytes under a {LIMIT}-byte limit",
        held(&db)
    );
    // `a` takes rows again, on its own freed pages.
    assert!(fill(&a) > 0, "a's freed pages are room for a");
}
