//! Ghost reclamation: a revived ghost whose reviver aborts, ghosts deferred until their
//! delete is durable in batched dequeues, queues under every configuration, and OCC readers
//! of a ghost removed and re-inserted (twenty-second session's review).

mod common;

use shoal::{ConcurrencyControl, Database};

/// 2PL, one thread, deterministic. A scan holds NS on "k" (the gap lock just below its
/// range), so the ghost T1's delete leaves is deferred (its lock is busy). T2 re-inserts "k"
/// (NS and XN are compatible): it revives the ghost in place, with the ghost as its undo
/// image. The scan ends and a later transaction's release retries the deferred ghost while
/// T2's record is live, so it drops the entry. T2 then aborts: "k" is a ghost again, listed
/// nowhere, and stays in the index for ever.
#[test]
fn a_revived_ghost_whose_reviver_aborts_is_removed() {
    let db = Database::in_memory_with(common::options(ConcurrencyControl::TwoPhaseLocking));
    let t = db.create_table("t").unwrap();
    db.run(|tx| {
        tx.put(&t, "a", "1")?;
        tx.put(&t, "k", "1")?;
        tx.put(&t, "z", "1")
    })
    .unwrap();
    let mut scanner = db.begin();
    assert_eq!(scanner.scan(&t, "l"..).unwrap().len(), 1); // NS on "k"
    db.run(|tx| tx.delete(&t, "k")).unwrap();
    assert_eq!(db.debug_ghost_backlog().1, 1, "the ghost is deferred");
    let mut t2 = db.begin();
    t2.insert(&t, "k", "2").unwrap(); // revives the ghost
    scanner.commit().unwrap();
    // A later release retries the deferred ghost: "k" is live (T2's) now.
    db.run(|tx| tx.get(&t, "a")).unwrap();
    t2.abort();
    for _ in 0..100 {
        db.run(|tx| tx.get(&t, "a")).unwrap();
    }
    assert_eq!(db.run(|tx| tx.get(&t, "k")).unwrap(), None);
    assert_eq!(
        db.debug_index_len("t").unwrap(),
        2,
        "the ghost of \"k\" must go (backlog {:?})",
        db.debug_ghost_backlog()
    );
}

/// A queue that dequeues in batches (one transaction deletes 100 keys) on a logged database
/// whose ghosts wait for their delete to be durable (SX-ELR, or an `Async` commit): the
/// index must stay the size of the queue, not grow by every batch.
#[test]
fn batched_dequeues_with_deferred_ghosts_keep_the_index_small() {
    use shoal::{Elr, LogMode};
    let mut bad = Vec::new();
    for (elr, log) in [(Elr::Sx, LogMode::Sync), (Elr::Off, LogMode::Async)] {
        let dir = tempfile::tempdir().unwrap();
        let o = common::options(ConcurrencyControl::TwoPhaseLocking)
            .with_elr(elr)
            .with_log(log);
        let db = Database::open(dir.path(), o).unwrap();
        let t = db.create_table("q").unwrap();
        let batch = 100u32;
        for round in 0..50u32 {
            db.run(|tx| {
                for i in 0..batch {
                    let k = round * batch + i;
                    tx.insert(&t, k.to_be_bytes(), [1])?;
                }
                Ok(())
            })
            .unwrap();
            db.run(|tx| {
                for i in 0..batch {
                    let k = round * batch + i;
                    assert!(tx.delete(&t, k.to_be_bytes())?);
                }
                Ok(())
            })
            .unwrap();
        }
        db.flush().unwrap();
        // A few more transactions after everything is durable.
        for _ in 0..4 {
            db.run(|tx| tx.get(&t, [0])).unwrap();
        }
        let entries = db.debug_index_len("q").unwrap();
        if entries > 2 * batch as usize {
            bad.push(format!(
                "{elr:?}/{log:?}: {entries} index entries for an empty queue (backlog {:?})",
                db.debug_ghost_backlog()
            ));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Insert-at-one-end, delete-at-the-other under every concurrency control, with and without a
/// log, with SX-ELR and with pipelined commits; plus inserts that abort. The index stays small.
#[test]
fn queues_and_aborted_inserts_leave_no_ghosts_in_any_configuration() {
    use shoal::{Elr, LogMode};
    let ccs = [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
        ConcurrencyControl::Doppel,
        ConcurrencyControl::Serial,
    ];
    let mut bad = Vec::new();
    for cc in ccs {
        for (log, elr, pipelined) in [
            (None, Elr::Off, false),
            (Some(LogMode::Sync), Elr::Off, false),
            (Some(LogMode::Sync), Elr::Sx, false),
            (Some(LogMode::Async), Elr::Off, false),
            (Some(LogMode::Sync), Elr::Off, true),
            (Some(LogMode::Sync), Elr::Sx, true),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let o = common::options(cc).with_elr(elr);
            let db = match log {
                None => Database::in_memory_with(o),
                Some(l) => Database::open(dir.path(), o.with_log(l)).unwrap(),
            };
            let t = db.create_table("q").unwrap();
            let window = 50u32;
            let mut tickets = Vec::new();
            for i in 0..1500u32 {
                let mut tx = db.begin();
                tx.insert(&t, i.to_be_bytes(), [1]).unwrap();
                if i >= window {
                    assert!(tx.delete(&t, (i - window).to_be_bytes()).unwrap());
                }
                if pipelined {
                    tickets.push(tx.commit_pipelined().unwrap());
                } else {
                    tx.commit().unwrap();
                }
                // An insert that aborts.
                let mut tx = db.begin();
                tx.insert(&t, (1_000_000 + i).to_be_bytes(), [1]).unwrap();
                tx.abort();
            }
            for tk in tickets {
                tk.wait().unwrap();
            }
            if log.is_some() {
                db.flush().unwrap();
            }
            for _ in 0..8 {
                db.run(|tx| tx.get(&t, [0])).unwrap();
            }
            let n = db.debug_index_len("q").unwrap();
            if n > window as usize + 64 {
                bad.push(format!(
                    "{cc:?} log {log:?} {elr:?} pipelined {pipelined}: {n} entries, backlog {:?}",
                    db.debug_ghost_backlog()
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// OCC: a reader that saw a ghost (the key absent), while the ghost is removed and the key
/// inserted again by another thread, must fail validation (point read and scan).
#[test]
fn an_optimistic_reader_of_a_removed_and_reinserted_ghost_fails_validation() {
    for cc in [ConcurrencyControl::Optimistic, ConcurrencyControl::Doppel] {
        for scan in [false, true] {
            let db = Database::in_memory_with(common::options(cc));
            let t = db.create_table("t").unwrap();
            db.run(|tx| {
                tx.put(&t, "a", "1")?;
                tx.put(&t, "k", "1")
            })
            .unwrap();
            // An older transaction holds the ghost back until the reader has seen it.
            let mut old = db.begin();
            old.get(&t, "a").unwrap();
            db.run(|tx| tx.delete(&t, "k").map(|_| ())).unwrap();
            assert_eq!(db.debug_index_len("t").unwrap(), 2, "the ghost stays");
            let mut r = db.begin();
            if scan {
                assert_eq!(r.scan(&t, ..).unwrap().len(), 1);
            } else {
                assert_eq!(r.get(&t, "k").unwrap(), None);
            }
            old.commit().unwrap();
            // The reader pinned after the delete: it does not hold the ghost back.
            assert_eq!(db.debug_index_len("t").unwrap(), 1, "the ghost went");
            std::thread::scope(|s| {
                s.spawn(|| db.run(|tx| tx.put(&t, "k", "2")).unwrap());
            });
            r.put(&t, "z", "1").unwrap();
            let res = r.commit();
            assert!(
                matches!(res, Err(shoal::Error::Conflict { .. })),
                "{cc:?} scan={scan}: {res:?}"
            );
        }
    }
}
