//! Phantom protection while the tree underneath changes shape: leaf merges, freed and
//! reused pages, and ghost reclamation.
//!
//! - OCC (Silo's node-set validation): a negative read or a range scan in leaves that then
//!   merge (their ghosts reclaimed, their pages freed and reused by other parts of the tree)
//!   still fails validation when another transaction inserts into what it read, and still
//!   commits when the insert falls outside. Empty-table and reverse limited scans too.
//! - 2PL: a scan's gap lock anchored on a key that another transaction deletes keeps the
//!   ghost, and an insert into the gap waits (every lock table, every key-range design).
//! - A stress of check-then-insert transactions keeping "at most 3 live keys per range",
//!   with keys long enough that leaves hold few entries (splits, merges, page reuse and
//!   ghost reclamation all happen): a phantom lets two transactions both see 2 and insert.

mod common;

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::{ConcurrencyControl, Database, KeyRangeModes, LockTableKind, Options, Table};

/// Key length of the merge scenarios: a few keys fill a leaf.
const PAD: usize = 3000;

fn padded(s: &str) -> Vec<u8> {
    let mut k = s.as_bytes().to_vec();
    k.resize(PAD, b'.');
    k
}

fn sixty_rows() -> (Database, shoal::Table) {
    let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Optimistic));
    let t = db.create_table("t").unwrap();
    db.run(|tx| {
        for i in 0..60 {
            tx.put(&t, padded(&format!("a{i:02}")), b"v")?;
        }
        Ok(())
    })
    .unwrap();
    (db, t)
}

/// Deletes a10..a49 while a pinned transaction holds their ghosts back, then starts `T`,
/// then lets the ghosts go (merges, freed pages) while T runs.
fn scenario(phantom: &str, reuse: bool, scan: bool) -> shoal::Result<()> {
    let (db, t) = sixty_rows();
    let before = db.debug_index_stats("t").unwrap();
    let mut x = db.begin();
    x.get(&t, padded("a00")).unwrap();
    db.run(|tx| {
        for i in 10..50 {
            tx.delete(&t, padded(&format!("a{i:02}")))?;
        }
        Ok(())
    })
    .unwrap();
    let mut tr = db.begin();
    // T reads in the last leaves: an absent key and a small range, neither holds a ghost.
    assert!(tr.get(&t, padded("a52x")).unwrap().is_none());
    if scan {
        let rows = tr.scan(&t, padded("a50")..padded("a55")).unwrap();
        assert_eq!(rows.len(), 5);
    }
    tr.put(&t, padded("zz"), b"w").unwrap();
    x.abort(); // ghosts go now: empty leaves merge
    db.run(|tx| tx.get(&t, padded("a00"))).unwrap(); // another collect
    let mid = db.debug_index_stats("t").unwrap();
    assert!(mid.leaves < before.leaves, "no merge happened");
    if reuse {
        // Reuse freed pages: grow other parts of the tree.
        db.run(|tx| {
            for i in 0..40 {
                tx.put(&t, padded(&format!("b{i:02}")), b"v")?;
            }
            Ok(())
        })
        .unwrap();
    }
    db.run(|tx| tx.insert(&t, padded(phantom), b"p")).unwrap();
    tr.commit()
}

#[test]
fn occ_negative_read_fails_after_its_leaf_merged_and_an_insert_hit_it() {
    for reuse in [false, true] {
        let r = scenario("a52x", reuse, false);
        assert!(
            r.is_err(),
            "reuse {reuse}: negative read not invalidated: {r:?}"
        );
    }
}

#[test]
fn occ_scan_fails_after_its_leaves_merged_and_a_phantom_was_inserted() {
    for reuse in [false, true] {
        let r = scenario("a51x", reuse, true);
        assert!(r.is_err(), "reuse {reuse}: phantom not detected: {r:?}");
    }
}

#[test]
fn occ_scan_commits_after_merges_when_the_insert_is_outside_its_range() {
    let r = scenario("a05x", true, true);
    assert!(r.is_ok(), "{r:?}");
}

/// Scans of an empty table, then an insert into their range: the scanner must fail.
#[test]
fn occ_scans_of_an_empty_table_fail_after_an_insert_into_their_range() {
    let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Optimistic));
    let t = db.create_table("t").unwrap();
    for (lo, hi, k) in [("a", "z", "m"), ("a", "z", "a"), ("m", "n", "m")] {
        let mut tr = db.begin();
        assert!(tr.scan(&t, lo..hi).unwrap().is_empty());
        assert!(tr.scan_limit(&t, lo..hi, 3).unwrap().is_empty());
        assert!(tr.scan_rev_limit(&t, lo..hi, 3).unwrap().is_empty());
        tr.put(&t, "zzz", "w").unwrap();
        db.run(|tx| tx.insert(&t, k, "p")).unwrap();
        assert!(
            tr.commit().is_err(),
            "empty scan {lo}..{hi} then insert {k}"
        );
        db.run(|tx| tx.delete(&t, k).map(|_| ())).unwrap();
        db.run(|tx| tx.delete(&t, "zzz").map(|_| ())).unwrap();
    }
}

/// `scan_rev_limit`, then an insert inside the part it covered: the scanner must fail.
#[test]
fn occ_reverse_limited_scan_fails_after_an_insert_into_what_it_covered() {
    let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Optimistic));
    let t = db.create_table("t").unwrap();
    db.run(|tx| {
        for k in ["b", "d", "f", "h"] {
            tx.put(&t, k, "v")?;
        }
        Ok(())
    })
    .unwrap();
    db.run(|tx| tx.delete(&t, "f").map(|_| ())).unwrap();
    for ins in ["e", "g", "i", "ff"] {
        let mut tr = db.begin();
        let rows = tr.scan_rev_limit(&t, .., 2).unwrap();
        assert_eq!(rows.len(), 2);
        tr.put(&t, "zzz", "w").unwrap();
        db.run(|tx| tx.insert(&t, ins, "p")).unwrap();
        assert!(tr.commit().is_err(), "rev limit then insert {ins}");
        db.run(|tx| tx.delete(&t, ins).map(|_| ())).unwrap();
    }
}

/// A 2PL scan of `q..w` (empty) holds the gap after `p`; under Graefe's modes another
/// transaction deletes `p` and commits meanwhile; an insert of `s` must still wait.
#[test]
fn twopl_gap_lock_on_a_deleted_key_keeps_blocking_inserts_into_the_gap() {
    for lt in [
        LockTableKind::Sharded,
        LockTableKind::Latched,
        LockTableKind::LatchFree,
    ] {
        for m in [
            KeyRangeModes::Graefe,
            KeyRangeModes::Lomet,
            KeyRangeModes::SharedExclusive,
        ] {
            let o = Options::default()
                .with_cc(ConcurrencyControl::TwoPhaseLocking)
                .with_lock_table(lt)
                .with_key_range_modes(m)
                .with_lock_timeout(Duration::from_millis(300));
            let db = Database::in_memory_with(o);
            let t = db.create_table("t").unwrap();
            db.run(|tx| {
                tx.put(&t, "b", "1")?;
                tx.put(&t, "p", "1")?;
                tx.put(&t, "x", "1")
            })
            .unwrap();
            let mut scanner = db.begin();
            assert!(scanner.scan(&t, "q".."w").unwrap().is_empty());
            assert!(scanner.get(&t, "r").unwrap().is_none());
            if m == KeyRangeModes::Graefe {
                // XN on "p" is compatible with the scanner's NS: the delete commits.
                db.run(|tx| tx.delete(&t, "p").map(|_| ())).unwrap();
                for _ in 0..20 {
                    db.run(|tx| tx.get(&t, "b")).unwrap();
                }
            }
            let (db2, t2) = (db.clone(), t.clone());
            let h = std::thread::spawn(move || {
                let mut tx = db2.begin();
                let r = tx.insert(&t2, "s", "p");
                match r {
                    Ok(()) => tx.commit(),
                    Err(e) => Err(e),
                }
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(
                scanner.scan(&t, "q".."w").unwrap().is_empty(),
                "{lt:?} {m:?}: phantom"
            );
            scanner.commit().unwrap();
            let _ = h.join().unwrap();
        }
    }
}

/// Ranges of the stress, each holding at most [`CAP`] live keys.
const RANGES: u32 = 24;
/// Most live keys a range may hold.
const CAP: usize = 3;
/// Key length of the stress.
const STRESS_PAD: usize = 1800;

fn key(r: u32, id: u32) -> Vec<u8> {
    let mut k = format!("r{r:03}/{id:08}/").into_bytes();
    k.resize(STRESS_PAD, b'x');
    k
}

fn bounds(r: u32) -> (Vec<u8>, Vec<u8>) {
    (
        format!("r{r:03}/").into_bytes(),
        format!("r{r:03}0").into_bytes(),
    )
}

fn count_in(
    tx: &mut shoal::Transaction<'_>,
    t: &Table,
    r: u32,
    how: u32,
) -> shoal::Result<Vec<Vec<u8>>> {
    let (lo, hi) = bounds(r);
    let rows = match how {
        0 => tx.scan(t, lo.clone()..hi.clone())?,
        1 => tx.scan_rev(t, lo.clone()..hi.clone())?,
        2 => tx.scan_limit(t, lo.clone()..hi.clone(), CAP + 1)?,
        3 => tx.scan_rev_limit(t, lo.clone()..hi.clone(), CAP + 1)?,
        _ => tx
            .scan(t, (Bound::Excluded(&b"r"[..]), Bound::Excluded(&hi[..])))?
            .into_iter()
            .filter(|(k, _)| k.starts_with(&lo))
            .collect(),
    };
    Ok(rows.into_iter().map(|(k, _)| k).collect())
}

fn run(o: Options, what: &str) {
    let db = Database::in_memory_with(o.clone().with_max_retries(0));
    let t = db.create_table("t").expect("create");
    let next = AtomicU64::new(1);
    let commits = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_millis(700);
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let (db, t, next, commits) = (&db, &t, &next, &commits);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(th * 7919 + 1);
                while Instant::now() < deadline {
                    let r = rng.gen_range(0..RANGES);
                    let how = rng.gen_range(0..5);
                    let op = rng.gen_range(0..10);
                    let mut tx = db.begin();
                    let res: shoal::Result<()> = (|| {
                        let keys = count_in(&mut tx, t, r, how)?;
                        assert!(
                            keys.len() <= CAP || o.cc != ConcurrencyControl::TwoPhaseLocking,
                            "{what}: range {r} has {} keys inside a 2PL txn",
                            keys.len()
                        );
                        if op < 6 {
                            if keys.len() < CAP {
                                let id = next.fetch_add(1, Ordering::Relaxed) as u32;
                                tx.insert(t, key(r, id), b"v")?;
                            }
                        } else if op < 9 {
                            if !keys.is_empty() {
                                let k = &keys[rng.gen_range(0..keys.len())];
                                tx.delete(t, k)?;
                                if op == 8 {
                                    // delete and re-insert the same key
                                    tx.insert(t, k, b"w")?;
                                }
                            }
                        } else {
                            // a negative point lookup then insert into the range
                            let id = next.fetch_add(1, Ordering::Relaxed) as u32;
                            let k = key(r, id);
                            assert!(tx.get(t, &k)?.is_none());
                            if keys.len() < CAP {
                                tx.insert(t, k, b"p")?;
                            }
                        }
                        let again = count_in(&mut tx, t, r, (how + 1) % 5)?;
                        let _ = again;
                        Ok(())
                    })();
                    match res.and_then(|()| tx.commit()) {
                        Ok(()) => {
                            commits.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) if e.is_retryable() => {}
                        Err(e) => panic!("{what}: {e:?}"),
                    }
                }
            });
        }
    });
    let all = db.run(|tx| tx.scan(&t, ..)).expect("final");
    let mut per = vec![0usize; RANGES as usize];
    for (k, _) in &all {
        let r: usize = std::str::from_utf8(&k[1..4]).unwrap().parse().unwrap();
        per[r] += 1;
    }
    assert!(
        commits.load(Ordering::Relaxed) > 0,
        "{what}: nothing committed"
    );
    for (r, n) in per.iter().enumerate() {
        assert!(
            *n <= CAP,
            "{what}: range {r} ended with {n} keys > {CAP} (phantom)"
        );
    }
}

#[test]
fn occ_keeps_at_most_three_keys_per_range_under_splits_and_merges() {
    for i in 0..3 {
        run(
            common::options(ConcurrencyControl::Optimistic),
            &format!("occ#{i}"),
        );
    }
}

#[test]
fn twopl_keeps_at_most_three_keys_per_range_under_splits_and_merges() {
    for m in [
        KeyRangeModes::Graefe,
        KeyRangeModes::Lomet,
        KeyRangeModes::SharedExclusive,
    ] {
        run(
            common::options(ConcurrencyControl::TwoPhaseLocking).with_key_range_modes(m),
            &format!("2pl {m:?}"),
        );
    }
}
