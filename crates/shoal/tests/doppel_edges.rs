//! Doppel at its edges: split ADDs at the limits of i64 across runs cut short, value-size
//! limits and TopK with K = 0 in split phases, and a stress of phase changes with background
//! checkpoints and a reopen (found in the twenty-second session's review of Doppel).

mod common;

use std::time::{Duration, Instant};

use shoal::doppel::{DoppelOptions, Phase, SplitOp};
use shoal::{ConcurrencyControl, Database, Error, Options, Table};

fn doppel_opts(t_s_ms: u64) -> Options {
    Options::default()
        .with_cc(ConcurrencyControl::Doppel)
        .with_lock_timeout(common::LOCK_TIMEOUT)
        .with_doppel(
            DoppelOptions::default()
                .with_split_phase(Duration::from_millis(t_s_ms))
                .with_auto_classify(false),
        )
}

fn wait_split(db: &Database) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.doppel_stats().unwrap().phase != Some(Phase::Split) {
        assert!(Instant::now() < deadline, "no split phase");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A transaction begun in a split phase.
fn begin_split(db: &Database) -> shoal::Transaction<'_> {
    loop {
        wait_split(db);
        let tx = db.begin();
        if db.doppel_stats().unwrap().phase == Some(Phase::Split) {
            return tx;
        }
    }
}

/// One acknowledged split ADD of `n` on `k` (split for ADD), then the database is dropped
/// in the middle of the split phase (no stash: the phase never ends by itself).
fn split_add_then_drop(dir: &std::path::Path, setup: impl FnOnce(&Database, &Table), n: i64) {
    let db = Database::open(dir, doppel_opts(5)).unwrap();
    let t = db.table("t").or_else(|_| db.create_table("t")).unwrap();
    setup(&db, &t);
    db.split_hint(&t, "k", SplitOp::Add).unwrap();
    let mut tx = begin_split(&db);
    tx.add(&t, "k", n).unwrap();
    tx.commit().unwrap(); // Sync log: durable
    assert_eq!(db.doppel_stats().unwrap().phase, Some(Phase::Split));
}

/// Recovery sums split ADDs exactly across the end of a run whose split phase was never
/// reconciled, while the live database clamped them when it recovered.
#[test]
fn split_adds_of_two_runs_recover_as_each_run_saw_them() {
    let dir = tempfile::tempdir().unwrap();
    // Run 1: k = MAX - 10, split ADD +MAX: clamped to MAX.
    split_add_then_drop(
        dir.path(),
        |db, t| {
            db.run(|tx| tx.put(t, "k", (i64::MAX - 10).to_le_bytes()))
                .unwrap()
        },
        i64::MAX,
    );
    // Run 2: recovers k = MAX (as reconciliation would have clamped it), then a split ADD
    // of -MAX: the database now holds MAX - MAX = 0.
    split_add_then_drop(
        dir.path(),
        |db, t| assert_eq!(db.run(|tx| tx.get_i64(t, "k")).unwrap(), Some(i64::MAX)),
        -i64::MAX,
    );
    // What run 2 acknowledged, reconciled in memory, for comparison.
    let live = {
        let db = Database::in_memory_with(doppel_opts(5));
        let t = db.create_table("t").unwrap();
        db.run(|tx| tx.put(&t, "k", i64::MAX.to_le_bytes()))
            .unwrap();
        db.split_hint(&t, "k", SplitOp::Add).unwrap();
        let mut tx = begin_split(&db);
        tx.add(&t, "k", -i64::MAX).unwrap();
        tx.commit().unwrap();
        db.clear_split_hint(&t, "k").unwrap();
        db.run(|tx| tx.get_i64(&t, "k")).unwrap()
    };
    assert_eq!(live, Some(0));
    let db = Database::open(dir.path(), doppel_opts(5)).unwrap();
    let t = db.table("t").unwrap();
    assert_eq!(
        db.run(|tx| tx.get_i64(&t, "k")).unwrap(),
        live,
        "run 3 recovers what run 2 held"
    );
}

/// `max_value_len` below 8 bytes: a joined ADD fails with ValueTooLarge, a split one stores
/// an 8-byte value anyway.
#[test]
fn a_split_add_respects_max_value_len() {
    let db = Database::in_memory_with(doppel_opts(5).with_max_value_len(4));
    let t = db.create_table("t").unwrap();
    let joined = db.run(|tx| tx.add(&t, "k", 1));
    assert!(
        matches!(joined, Err(Error::ValueTooLarge { .. })),
        "{joined:?}"
    );
    db.split_hint(&t, "k", SplitOp::Add).unwrap();
    let mut tx = begin_split(&db);
    let r = tx.add(&t, "k", 1).and_then(|()| tx.commit());
    db.clear_split_hint(&t, "k").unwrap();
    let stored = db.run(|tx| tx.get(&t, "k")).unwrap();
    assert!(
        r.is_err() && stored.is_none(),
        "split ADD: {r:?}, stored {stored:?} (max_value_len 4)"
    );
}

/// TOPKINSERT with K = 0 "keeps nothing": in a joined phase an insert empties the set. On a
/// record split for TopK(0), two inserts fold into an empty summary, and reconciliation
/// inserts nothing, so the old set stays.
#[test]
fn split_topk_zero_empties_the_set_as_a_joined_insert_does() {
    let db = Database::in_memory_with(doppel_opts(5));
    let t = db.create_table("t").unwrap();
    let seed = |db: &Database, k: &str| {
        db.run(|tx| {
            for o in 1..=3 {
                tx.topk_insert(&t, k, o, b"x", 3)?;
            }
            Ok(())
        })
        .unwrap()
    };
    seed(&db, "joined");
    seed(&db, "split");
    // Joined: each insert with K = 0 leaves the empty set.
    db.run(|tx| {
        tx.topk_insert(&t, "joined", 10, b"a", 0)?;
        tx.topk_insert(&t, "joined", 11, b"b", 0)
    })
    .unwrap();
    assert!(db.run(|tx| tx.get_topk(&t, "joined")).unwrap().is_empty());
    // Split: the same two inserts.
    db.split_hint(&t, "split", SplitOp::TopK(0)).unwrap();
    let mut tx = begin_split(&db);
    tx.topk_insert(&t, "split", 10, b"a", 0).unwrap();
    tx.topk_insert(&t, "split", 11, b"b", 0).unwrap();
    tx.commit().unwrap();
    db.clear_split_hint(&t, "split").unwrap();
    let got = db.run(|tx| tx.get_topk(&t, "split")).unwrap();
    assert!(got.is_empty(), "after split K=0 inserts: {got:?}");
}

/// The stress's hot counters ("a" counts commits, "m" holds the largest id) and its unique
/// rows equal what the workers saw acknowledged.
fn check_counters(
    db: &Database,
    t: &Table,
    want: u64,
    maxv: &std::sync::atomic::AtomicU64,
    when: &str,
) {
    let (a, m, n) = db
        .run(|tx| {
            Ok((
                tx.get_i64(t, "a")?,
                tx.get_i64(t, "m")?,
                tx.scan(t, "u".."v")?.len() as u64,
            ))
        })
        .unwrap();
    let max = maxv.load(std::sync::atomic::Ordering::Relaxed) as i64;
    assert_eq!((a, m, n), (Some(want as i64), Some(max), want), "{when}");
}

/// Stress: split ADDs and MAXes on hot keys, reads of them (stashed), unique inserts per
/// commit, hints flipping between operations, background checkpoints; then a reopen. The
/// hot counters must equal the number of acknowledged commits, live and recovered.
#[test]
fn stress_phase_changes_with_checkpoints_and_reopen() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let opts = doppel_opts(2)
        .with_log(shoal::LogMode::Async)
        .with_checkpoint_interval(Some(Duration::from_millis(7)));
    let threads = 4;
    let acked = Arc::new(AtomicU64::new(0));
    let maxv = Arc::new(AtomicU64::new(0));
    {
        let db = Database::open(dir.path(), opts.clone()).unwrap();
        let t = db.create_table("t").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flipper = {
            let (db, t, stop) = (db.clone(), t.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let op = if i.is_multiple_of(3) {
                        SplitOp::Max
                    } else {
                        SplitOp::Add
                    };
                    db.split_hint(&t, "a", op).unwrap();
                    db.split_hint(&t, "m", SplitOp::Max).unwrap();
                    if i.is_multiple_of(5) {
                        db.clear_split_hint(&t, "m").unwrap();
                    }
                    std::thread::sleep(Duration::from_millis(3));
                }
            })
        };
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                let (db, t, acked, maxv) =
                    (db.clone(), t.clone(), Arc::clone(&acked), Arc::clone(&maxv));
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(3);
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        i += 1;
                        let id = w as u64 * 1_000_000 + i;
                        let read = i.is_multiple_of(7);
                        let r = db.run(|tx| {
                            tx.add(&t, "a", 1)?;
                            tx.max(&t, "m", id as i64)?;
                            tx.insert(&t, format!("u{id:012}"), b"")?;
                            if read {
                                let a = tx.get_i64(&t, "a")?.unwrap_or(0);
                                tx.put(&t, format!("r{id:012}"), a.to_le_bytes())?;
                            }
                            Ok(())
                        });
                        r.unwrap();
                        acked.fetch_add(1, Ordering::Relaxed);
                        maxv.fetch_max(id, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in workers {
            h.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        flipper.join().unwrap();
        db.flush().unwrap();
        // Live: after a reconciliation.
        db.clear_split_hint(&t, "a").unwrap();
        db.clear_split_hint(&t, "m").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !db.split_keys().is_empty() || db.doppel_stats().unwrap().phase != Some(Phase::Joined)
        {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(2));
        }
        check_counters(&db, &t, acked.load(Ordering::Relaxed), &maxv, "live");
        // Then a split phase cut short by the drop.
        db.split_hint(&t, "a", SplitOp::Add).unwrap();
        let mut tx = begin_split(&db);
        tx.add(&t, "a", 1).unwrap();
        tx.insert(&t, "u_last", b"").unwrap();
        tx.commit().unwrap();
        acked.fetch_add(1, Ordering::Relaxed);
        db.flush().unwrap();
        let s = db.doppel_stats().unwrap();
        eprintln!("first run: {s:?}, checkpoint {:?}", db.checkpoint_status());
        assert!(s.split_phases > 2 && s.stashed > 0, "{s:?}");
    }
    let db = Database::open(dir.path(), opts).unwrap();
    let t = db.table("t").unwrap();
    let want = acked.load(Ordering::Relaxed);
    check_counters(&db, &t, want, &maxv, "recovered");
    // Every reader saw a value of "a" no larger than the final one.
    let rs = db.run(|tx| tx.scan(&t, "r".."s")).unwrap();
    assert!(rs
        .iter()
        .all(|(_, v)| i64::from_le_bytes(v[..8].try_into().unwrap()) <= want as i64));
    eprintln!(
        "acked {want}, readers {}, stats {:?}",
        rs.len(),
        db.doppel_stats()
    );
}

/// Waits until no key is split and the phase is joined (every split phase reconciled).
fn wait_joined(db: &Database) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !db.split_keys().is_empty() || db.doppel_stats().unwrap().phase != Some(Phase::Joined) {
        assert!(Instant::now() < deadline, "no joined phase");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A reconciliation of more keys than one log record holds (the smallest log buffer, 64
/// KiB, against 1,000 keys of 100 bytes) is logged in several records. It was one record,
/// refused by the log and dropped, and replaying the split ADDs alone does not give what the
/// database held when a phase's sum passed i64's limit: clamped once per phase, live.
#[test]
fn a_reconciliation_larger_than_a_log_record_is_logged_whole() {
    let dir = tempfile::tempdir().unwrap();
    let opts = doppel_opts(5)
        .with_log_buffer(64 << 10)
        .with_max_value_len(1024);
    let keys: Vec<Vec<u8>> = (0..1000)
        .map(|i| format!("{i:0100}").into_bytes())
        .collect();
    {
        let db = Database::open(dir.path(), opts.clone()).unwrap();
        let t = db.create_table("t").unwrap();
        for c in keys.chunks(100) {
            db.run(|tx| {
                for k in c {
                    tx.put(&t, k, (i64::MAX - 10).to_le_bytes())?;
                }
                Ok(())
            })
            .unwrap();
        }
        // Two split phases: +MAX (clamped to MAX when reconciled), then -MAX: 0.
        for n in [i64::MAX, -i64::MAX] {
            for k in &keys {
                db.split_hint(&t, k, SplitOp::Add).unwrap();
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while db.split_keys().len() < keys.len() {
                assert!(Instant::now() < deadline, "the keys were not split");
                std::thread::sleep(Duration::from_millis(1));
            }
            for c in keys.chunks(100) {
                let mut tx = begin_split(&db);
                for k in c {
                    tx.add(&t, k, n).unwrap();
                }
                tx.commit().unwrap();
            }
            for k in &keys {
                db.clear_split_hint(&t, k).unwrap();
            }
            wait_joined(&db);
        }
        let live = db.run(|tx| tx.get_i64(&t, &keys[0])).unwrap();
        assert_eq!(live, Some(0));
    }
    let db = Database::open(dir.path(), opts).unwrap();
    let t = db.table("t").unwrap();
    for k in [&keys[0], &keys[999]] {
        assert_eq!(
            db.run(|tx| tx.get_i64(&t, k)).unwrap(),
            Some(0),
            "recovered"
        );
    }
}
