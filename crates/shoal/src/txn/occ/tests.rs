//! Tests of the optimistic protocol through the public API (and the TID words).

use crate::{ConcurrencyControl, Database, Error, Options, Table};

fn occ() -> Options {
    Options {
        cc: ConcurrencyControl::Optimistic,
        ..Options::default()
    }
}

fn db() -> Database {
    Database::in_memory_with(occ())
}

/// An OCC database with an empty table `t`.
fn db_t() -> (Database, Table) {
    let db = db();
    let t = db.create_table("t").unwrap();
    (db, t)
}

fn tid_of(db: &Database, table: &str, key: &[u8]) -> Option<u64> {
    db.table(table)
        .unwrap()
        .inner
        .tree
        .get(key, |r| r.map(|r| r.tid))
}

fn is_conflict<T: std::fmt::Debug>(r: crate::Result<T>) -> bool {
    match r {
        Err(e @ Error::Conflict { .. }) => e.is_retryable(),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[test]
fn stale_read_fails_validation() {
    let (db, t) = db_t();
    db.run(|tx| tx.put(&t, "x", "0")).unwrap();
    let mut t1 = db.begin();
    assert_eq!(t1.get(&t, "x").unwrap(), Some(b"0".to_vec()));
    db.run(|t2| t2.put(&t, "x", "2")).unwrap();
    t1.put(&t, "y", "1").unwrap();
    assert!(is_conflict(t1.commit()));
    // Nothing of T1 is visible and the locks it took are gone.
    assert_eq!(db.run(|tx| tx.get(&t, "y")).unwrap(), None);
    assert_eq!(db.run(|tx| tx.get(&t, "x")).unwrap(), Some(b"2".to_vec()));
    db.run(|tx| tx.put(&t, "y", "3")).unwrap();
    // A read-only transaction is validated as well.
    let mut t3 = db.begin();
    t3.get(&t, "x").unwrap();
    db.run(|tx| tx.put(&t, "x", "4")).unwrap();
    assert!(is_conflict(t3.commit()));
    // An unchanged read commits.
    let mut t4 = db.begin();
    t4.get(&t, "x").unwrap();
    t4.put(&t, "x", "5").unwrap();
    t4.commit().unwrap();
}

#[test]
fn stale_absence_fails_validation() {
    let (db, t) = db_t();
    let mut t1 = db.begin();
    assert_eq!(t1.get(&t, "x").unwrap(), None);
    db.run(|t2| t2.put(&t, "x", "2")).unwrap();
    t1.put(&t, "y", "1").unwrap();
    assert!(is_conflict(t1.commit()));
}

#[test]
fn phantom_is_caught_by_scan_validation() {
    let (db, t) = db_t();
    db.run(|tx| {
        tx.put(&t, "a", "1")?;
        tx.put(&t, "c", "1")
    })
    .unwrap();
    // Insert into the scanned range.
    let mut t1 = db.begin();
    assert_eq!(t1.scan(&t, "a".."d").unwrap().len(), 2);
    db.run(|t2| t2.insert(&t, "b", "2")).unwrap();
    t1.put(&t, "z", "count=2").unwrap();
    assert!(is_conflict(t1.commit()));
    // Delete inside the range (the ghost's new TID shows it).
    let mut t1 = db.begin();
    assert_eq!(t1.scan_rev(&t, "a".."d").unwrap().len(), 3);
    db.run(|t2| t2.delete(&t, "c")).unwrap();
    assert!(is_conflict(t1.commit()));
    // A write just outside the range does not conflict.
    let mut t1 = db.begin();
    assert_eq!(t1.scan(&t, "a".."c").unwrap().len(), 2);
    db.run(|t2| t2.put(&t, "c", "3")).unwrap();
    t1.put(&t, "z", "count=2").unwrap();
    t1.commit().unwrap();
    // Our own writes inside the range do not conflict with our own scan.
    let mut t1 = db.begin();
    t1.put(&t, "bb", "own").unwrap();
    assert_eq!(t1.scan(&t, ..).unwrap().len(), 5);
    t1.put(&t, "ab", "own").unwrap();
    t1.delete(&t, "a").unwrap();
    t1.commit().unwrap();
    let keys: Vec<Vec<u8>> = db
        .run(|tx| tx.scan(&t, ..))
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, [&b"ab"[..], b"b", b"bb", b"c", b"z"]);
}

#[test]
fn reads_see_own_writes() {
    let (db, t) = db_t();
    db.run(|tx| {
        tx.put(&t, "a", "old")?;
        tx.put(&t, "d", "old")?;
        tx.put(&t, "n", 5i64.to_le_bytes())
    })
    .unwrap();
    let mut tx = db.begin();
    tx.put(&t, "a", "new").unwrap();
    tx.put(&t, "b", "new").unwrap();
    assert!(tx.delete(&t, "d").unwrap());
    assert!(!tx.delete(&t, "d").unwrap());
    assert_eq!(tx.get(&t, "a").unwrap(), Some(b"new".to_vec()));
    assert_eq!(tx.get(&t, "d").unwrap(), None);
    assert_eq!(tx.add_and_get(&t, "n", 2).unwrap(), 7);
    assert_eq!(tx.add_and_get(&t, "n", 1).unwrap(), 8);
    assert_eq!(tx.max_and_get(&t, "n", 3).unwrap(), 8);
    assert_eq!(tx.min_and_get(&t, "n", 3).unwrap(), 3);
    assert!(matches!(
        tx.insert(&t, "b", "again"),
        Err(Error::DuplicateKey { .. })
    ));
    tx.insert(&t, "d", "re").unwrap(); // after our own delete
    let rows = tx.scan(&t, ..).unwrap();
    let want: Vec<(Vec<u8>, Vec<u8>)> = [
        ("a", &b"new"[..]),
        ("b", b"new"),
        ("d", b"re"),
        ("n", &3i64.to_le_bytes()),
    ]
    .iter()
    .map(|(k, v)| (k.as_bytes().to_vec(), v.to_vec()))
    .collect();
    assert_eq!(rows, want);
    let mut rev = tx.scan_rev(&t, "b"..).unwrap();
    rev.reverse();
    assert_eq!(rev, want[1..]);
    // Nothing is visible to others before commit.
    assert_eq!(db.run(|o| o.get(&t, "a")).unwrap(), Some(b"old".to_vec()));
    tx.commit().unwrap();
    assert_eq!(db.run(|o| o.scan(&t, ..)).unwrap(), want);
}

#[test]
fn duplicate_insert_is_caught_at_commit() {
    let (db, t) = db_t();
    let mut t1 = db.begin();
    t1.insert(&t, "k", "t1").unwrap();
    let mut t2 = db.begin();
    t2.insert(&t, "k", "t2").unwrap();
    t2.commit().unwrap();
    assert!(is_conflict(t1.commit()));
    assert_eq!(db.run(|tx| tx.get(&t, "k")).unwrap(), Some(b"t2".to_vec()));
    // A failed committer leaves no placeholder behind.
    let mut t3 = db.begin();
    t3.insert(&t, "p", "t3").unwrap();
    t3.get(&t, "k").unwrap();
    db.run(|tx| tx.put(&t, "k", "t4")).unwrap();
    assert!(is_conflict(t3.commit()));
    assert_eq!(db.debug_index_len("t").unwrap(), 1);
    // Inserting then deleting a new key leaves nothing either.
    db.run(|tx| {
        tx.insert(&t, "q", "v")?;
        tx.delete(&t, "q").map(|_| ())
    })
    .unwrap();
    assert_eq!(db.debug_index_len("t").unwrap(), 1);
}

#[test]
fn duplicate_after_a_stale_read_is_a_conflict() {
    let (db, t) = db_t();
    db.run(|tx| tx.put(&t, "next", 0i64.to_le_bytes())).unwrap();
    // Both read the counter, the second commits the order it numbered 0 first.
    let mut t1 = db.begin();
    assert_eq!(t1.get_i64(&t, "next").unwrap(), Some(0));
    db.run(|tx| {
        tx.add_and_get(&t, "next", 1)?;
        tx.insert(&t, "order/0", "t2")
    })
    .unwrap();
    assert!(is_conflict(t1.insert(&t, "order/0", "t1").map(|_| ())));
    // With nothing stale read, a duplicate is a duplicate.
    let mut t3 = db.begin();
    assert_eq!(t3.get_i64(&t, "next").unwrap(), Some(1));
    assert!(matches!(
        t3.insert(&t, "order/0", "t3"),
        Err(Error::DuplicateKey { .. })
    ));
}

#[test]
fn commit_tids_grow_and_deletes_keep_a_ghost() {
    let (db, t) = db_t();
    db.run(|tx| tx.put(&t, "k", "1")).unwrap();
    let a = tid_of(&db, "t", b"k").unwrap();
    assert!(a > 0 && a & super::LOCK_BIT == 0);
    db.run(|tx| tx.put(&t, "k", "2")).unwrap();
    let b = tid_of(&db, "t", b"k").unwrap();
    assert!(b > a);
    // A transaction that runs across the delete keeps its ghost in place.
    let mut older = db.begin();
    older.get(&t, "other").unwrap();
    db.run(|tx| tx.delete(&t, "k")).unwrap();
    let c = tid_of(&db, "t", b"k").unwrap();
    assert!(c > b);
    assert_eq!(db.debug_index_len("t").unwrap(), 1);
    assert_eq!(db.run(|tx| tx.get(&t, "k")).unwrap(), None);
    assert!(db.run(|tx| tx.scan(&t, ..)).unwrap().is_empty());
    assert_eq!(db.debug_index_len("t").unwrap(), 1);
    assert_eq!(db.debug_ghost_backlog().0, 1);
    // Once it ends, nobody can need the ghost.
    older.commit().unwrap();
    assert_eq!(db.debug_index_len("t").unwrap(), 0);
    assert_eq!(db.debug_ghost_backlog(), (0, 0));
}

/// A reader that recorded a key's absence, then an insert and a delete of that key: the
/// ghost is what tells the reader's validation, so it stays until the reader ends (with
/// ghosts removed at once, the key would look absent again and the commit would pass).
#[test]
fn an_older_readers_absence_keeps_the_ghost_that_invalidates_it() {
    let (db, t) = db_t();
    let mut r = db.begin();
    assert_eq!(r.get(&t, "x").unwrap(), None);
    let mut s = db.begin();
    assert!(s.scan(&t, "a".."z").unwrap().is_empty());
    db.run(|tx| tx.put(&t, "x", "1")).unwrap();
    db.run(|tx| tx.delete(&t, "x")).unwrap();
    // More commits run the collector; the ghost must stay.
    for i in 0..3 {
        db.run(|tx| tx.put(&t, format!("z{i}"), "v")).unwrap();
    }
    assert_eq!(db.debug_ghost_backlog().0, 1);
    r.put(&t, "y", "1").unwrap();
    assert!(is_conflict(r.commit()));
    s.put(&t, "y", "2").unwrap();
    assert!(is_conflict(s.commit()));
    // Both ended: the next commit collects the ghost.
    db.run(|tx| tx.put(&t, "z9", "v")).unwrap();
    assert_eq!(db.run(|tx| tx.get(&t, "x")).unwrap(), None);
    assert_eq!(tid_of(&db, "t", b"x"), None);
    assert_eq!(db.debug_ghost_backlog(), (0, 0));
}

/// A ghost seen by a scan (of a transaction that began after the delete, so it does not
/// hold the ghost back) is removed, and the key is inserted again by a committer whose
/// reads would give it the ghost's very TID: the scan's validation must still see the
/// change (found by the phantom test: two scans in one committed transaction differed).
#[test]
fn a_reinserted_key_never_reuses_a_removed_ghosts_tid() {
    let (db, t) = db_t();
    db.run(|tx| tx.put(&t, "k", "1")).unwrap();
    for _ in 0..50 {
        db.run(|tx| tx.put(&t, "a", "x")).unwrap();
    }
    // An older transaction keeps the ghost until the reader below has seen it.
    let mut older = db.begin();
    older.get(&t, "zz").unwrap();
    db.run(|tx| tx.delete(&t, "k")).unwrap();
    let ghost = tid_of(&db, "t", b"k").unwrap();
    assert_eq!(tid_of(&db, "t", b"a"), Some(ghost - 1));
    let mut r = db.begin();
    assert_eq!(r.scan(&t, "j".."l").unwrap(), Vec::new());
    // The older one ends: the ghost goes (the reader began after the delete).
    older.commit().unwrap();
    assert_eq!(tid_of(&db, "t", b"k"), None);
    // A fresh thread (no commit TID of its own yet) reads "a" (TID `ghost - 1`) and
    // inserts "k": without the floor its TID would be `ghost` again.
    std::thread::scope(|s| {
        s.spawn(|| {
            db.run(|tx| {
                tx.get(&t, "a")?;
                tx.insert(&t, "k", "2")
            })
            .unwrap();
        });
    });
    assert!(tid_of(&db, "t", b"k").unwrap() > ghost);
    assert_eq!(r.scan(&t, "j".."l").unwrap().len(), 1);
    assert!(is_conflict(r.commit()));
}

/// A queue under OCC: inserts at the tail, deletes at the head, with a reader scanning
/// the head of the queue in between. Ghosts are collected and emptied leaves merge, so
/// the index stays the size of the queue (before epoch collection every deleted key
/// stayed as a ghost: 20,000 entries here).
#[test]
fn a_queue_keeps_the_index_small() {
    let db = db();
    let t = db.create_table("q").unwrap();
    let window = 100u32;
    for i in 0..20_000u32 {
        db.run(|tx| tx.insert(&t, i.to_be_bytes(), "v")).unwrap();
        if let Some(old) = i.checked_sub(window) {
            db.run(|tx| {
                // Delivery-like: find the oldest by a scan from the start.
                let rows = tx.scan(&t, ..)?;
                let (k, _) = rows.first().expect("a queued key");
                assert_eq!(k[..], old.to_be_bytes());
                tx.delete(&t, k).map(|_| ())
            })
            .unwrap();
        }
    }
    let s = db.debug_index_stats("q").unwrap();
    assert_eq!(db.debug_index_check("q").unwrap(), Ok(()));
    assert_eq!((s.entries, s.ghosts), (window as usize, 0), "{s:?}");
    assert!(s.leaves <= 8, "{s:?}");
}

#[test]
fn a_failed_transaction_is_doomed() {
    let (db, t) = db_t();
    // A reader that waits out a committer's lock bit too long gives up with a conflict.
    let tree = &db.table("t").unwrap().inner.tree;
    tree.update(b"x", |s| {
        *s = Some(crate::storage::btree::Record {
            value: b"v".to_vec(),
            ghost: false,
            tid: 1 | super::LOCK_BIT,
        })
    });
    let mut tx = db.begin();
    assert!(is_conflict(tx.get(&t, "x")));
    assert!(matches!(
        tx.get(&t, "y"),
        Err(Error::TransactionAborted { .. })
    ));
    drop(tx);
    let mut tx = db.begin();
    tx.put(&t, "x", "w").unwrap();
    assert!(is_conflict(tx.commit()));
    tree.update(b"x", |s| s.as_mut().unwrap().tid = 1);
    db.run(|tx| tx.put(&t, "x", "w")).unwrap();
}

/// Leaves split between a transaction's reads and its commit (so the hints it kept are
/// stale): it still validates, locks, installs and unlocks the right records.
#[test]
fn stale_leaf_hints_after_splits() {
    let (db, t) = db_t();
    let key = |i: u32| format!("k{:06}", i * 1000);
    db.run(|tx| {
        for i in 0..20 {
            tx.put(&t, key(i), 0i64.to_le_bytes())?;
        }
        Ok(())
    })
    .unwrap();
    let fill = |from: u32| {
        db.run(|tx| {
            for i in from..from + 3000 {
                tx.put(&t, format!("k{:06}", i * 6 + 1), "x")?;
            }
            Ok(())
        })
        .unwrap();
    };
    // Read-modify-writes, reads and blind writes whose leaves split before commit.
    let mut t1 = db.begin();
    for i in 0..10 {
        assert_eq!(t1.add_and_get(&t, key(i), 1).unwrap(), 1);
        t1.get(&t, key(i + 10)).unwrap();
    }
    t1.put(&t, "k5000000", "new").unwrap();
    assert_eq!(t1.get(&t, "k4999999").unwrap(), None);
    fill(0);
    t1.commit().unwrap();
    // A stale read is still caught through a stale hint, and the abort unlocks through
    // the lock phase's hints.
    let mut t2 = db.begin();
    t2.get(&t, key(15)).unwrap();
    t2.add_and_get(&t, key(3), 1).unwrap();
    t2.insert(&t, "k0000001a", "p").unwrap();
    fill(3000);
    db.run(|tx| tx.add_and_get(&t, key(15), 5).map(|_| ()))
        .unwrap();
    assert!(is_conflict(t2.commit()));
    db.run(|tx| {
        for i in 0..20 {
            let want = match i {
                0..10 => 1,
                15 => 5,
                _ => 0,
            };
            assert_eq!(tx.get_i64(&t, key(i))?, Some(want), "key {i}");
        }
        assert_eq!(tx.get(&t, "k5000000")?, Some(b"new".to_vec()));
        assert_eq!(tx.get(&t, "k0000001a")?, None);
        Ok(())
    })
    .unwrap();
    // Nothing stays locked, and the aborted insert left no placeholder.
    assert_eq!(db.debug_index_len("t").unwrap(), 20 + 1 + 6000);
    db.run(|tx| tx.add_and_get(&t, key(3), 1).map(|_| ()))
        .unwrap();
    let tree = &db.table("t").unwrap().inner.tree;
    assert_eq!(tree.check_invariants(), Ok(()));
}

#[test]
fn concurrent_increments_are_exact() {
    let (db, t) = db_t();
    std::thread::scope(|s| {
        for th in 0..4 {
            let (db, t) = (&db, &t);
            s.spawn(move || {
                for i in 0..300 {
                    db.run(|tx| {
                        tx.add_and_get(t, [(i + th) as u8 % 3], 1)?;
                        tx.add_and_get(t, "total", 1)
                    })
                    .unwrap();
                }
            });
        }
    });
    let (sum, total) = db
        .run(|tx| {
            let mut sum = 0;
            for k in 0..3u8 {
                sum += tx.get_i64(&t, [k])?.unwrap_or(0);
            }
            Ok((sum, tx.get_i64(&t, "total")?))
        })
        .unwrap();
    assert_eq!((sum, total), (1200, Some(1200)));
}

#[test]
fn commits_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Database::open(dir.path(), occ()).unwrap();
        let t = db.create_table("t").unwrap();
        db.run(|tx| {
            tx.put(&t, "a", "1")?;
            tx.put(&t, "b", "2")?;
            tx.add_and_get(&t, "n", 7).map(|_| ())
        })
        .unwrap();
        db.run(|tx| tx.delete(&t, "b").map(|_| ())).unwrap();
        let mut lost = db.begin();
        lost.put(&t, "c", "aborted").unwrap();
        lost.abort();
        let mut p = db.begin();
        p.put(&t, "d", "pipelined").unwrap();
        p.commit_pipelined().unwrap().wait().unwrap();
    }
    let db = Database::open(dir.path(), occ()).unwrap();
    let t = db.table("t").unwrap();
    let rows = db.run(|tx| tx.scan(&t, ..)).unwrap();
    let want: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"a".to_vec(), b"1".to_vec()),
        (b"d".to_vec(), b"pipelined".to_vec()),
        (b"n".to_vec(), 7i64.to_le_bytes().to_vec()),
    ];
    assert_eq!(rows, want);
    // Recovered records start at TID 0; new commits still validate and install.
    db.run(|tx| tx.add_and_get(&t, "n", 1)).unwrap();
    assert!(db.checkpoint().unwrap().is_some());
    drop(db);
    let db = Database::open(dir.path(), occ()).unwrap();
    let t = db.table("t").unwrap();
    assert_eq!(db.run(|tx| tx.get_i64(&t, "n")).unwrap(), Some(8));
}

#[test]
fn inserts_fill_their_pages_as_under_2pl() {
    // An OCC commit first locks a placeholder for each new key and writes the value at
    // install. Placeholders that take no room let a leaf pack far more of them than their
    // values fit, and the leaf then splits in the middle as each one grows: a bulk load
    // (a thousand rows a transaction) left its pages two thirds full. The pages should end
    // up as full as under 2PL, which inserts each value at once. Also TPC-C's order lines:
    // ten rows at a time at the end of each of four districts' runs.
    let leaves = |cc: ConcurrencyControl, per_txn: u32, runs: u8| {
        let db = Database::in_memory_with(Options {
            cc,
            ..Options::default()
        });
        let t = db.create_table("t").unwrap();
        let rows = 8_000 / u32::from(runs);
        for batch in 0..rows / per_txn {
            for d in 0..runs {
                db.run(|tx| {
                    for o in per_txn * batch..per_txn * (batch + 1) {
                        let mut k = vec![d];
                        k.extend_from_slice(&o.to_be_bytes());
                        tx.insert(&t, k, [7u8; 150])?;
                    }
                    Ok(())
                })
                .unwrap();
            }
        }
        let s = t.inner.tree.stats();
        assert_eq!(s.entries, 8_000);
        s.leaves
    };
    for (per_txn, runs) in [(1_000, 1), (10, 4)] {
        let occ = leaves(ConcurrencyControl::Optimistic, per_txn, runs);
        let twopl = leaves(ConcurrencyControl::TwoPhaseLocking, per_txn, runs);
        assert!(
            occ * 10 <= twopl * 11,
            "{per_txn} rows a transaction, {runs} runs: OCC {occ} leaves, 2PL {twopl}"
        );
    }
}
