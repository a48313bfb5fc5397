//! Checkpoints and their faults: a checkpoint beside transactions that hold locks (whatever
//! the deadlock policy), failed background checkpoints, checkpoint records bounded in bytes,
//! and the directory lock after the last handle of a database with background threads is
//! dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::dump;
use shoal::doppel::{DoppelOptions, SplitOp};
use shoal::log::record::{decode_frame_at, Frame, LogRecord};
use shoal::{ConcurrencyControl, Database, DeadlockPolicy, LockTableKind, Options};

fn key(i: u32) -> Vec<u8> {
    format!("k{i:03}").into_bytes()
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// Commits rows, checkpoints, commits more, then lets a transaction update, insert and delete
/// a key each and keep them locked while another thread checkpoints; then commits or aborts
/// it, reopens, and compares with the model. The keys the holder locks have their committed
/// values in the previous checkpoint (`k002`) and in the log after it (`k001`), and the log
/// spans several segments.
fn checkpoint_beside_a_lock_holder(
    deadlock: DeadlockPolicy,
    lock_table: LockTableKind,
    commit: bool,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = Options::default()
        .with_deadlock(deadlock)
        .with_lock_table(lock_table)
        .with_lock_timeout(Duration::from_secs(10))
        .with_log_segment_size(4096);
    let what = format!("{deadlock:?} {lock_table:?} commit={commit}");
    let mut model = BTreeMap::new();
    let lsn = {
        let db = Database::open(dir.path(), opts.clone()).expect("open");
        let t = db.create_table("t").expect("create");
        for i in 0..40 {
            let v = format!("first {i}").into_bytes();
            db.run(|tx| tx.put(&t, key(i), &v)).expect("put");
            model.insert(key(i), v);
        }
        db.checkpoint().expect("first checkpoint");
        db.run(|tx| tx.put(&t, key(1), "second 1")).expect("put");
        model.insert(key(1), b"second 1".to_vec());
        for i in 40..80 {
            let v = format!("second {i}").into_bytes();
            db.run(|tx| tx.put(&t, key(i), &v)).expect("put");
            model.insert(key(i), v);
        }
        let mut holder = db.begin();
        holder.put(&t, key(1), "uncommitted").expect("update");
        holder.insert(&t, "new", "uncommitted").expect("insert");
        assert!(holder.delete(&t, key(2)).expect("delete"));
        let t0 = Instant::now();
        let res = std::thread::scope(|s| {
            s.spawn(|| db.checkpoint())
                .join()
                .expect("the checkpoint thread panicked")
        });
        let took = t0.elapsed();
        let lsn = match res {
            Ok(Some(lsn)) => lsn,
            other => panic!("{what}: checkpoint beside a lock holder: {other:?}"),
        };
        assert!(
            took < Duration::from_secs(2),
            "{what}: the checkpoint waited {took:?} behind a lock holder"
        );
        if commit {
            holder.commit().expect("commit the holder");
            model.insert(key(1), b"uncommitted".to_vec());
            model.insert(b"new".to_vec(), b"uncommitted".to_vec());
            model.remove(&key(2));
        } else {
            holder.abort();
        }
        lsn
    };
    let db = Database::open(dir.path(), opts).expect("reopen");
    let stats = db.recovery_stats().expect("stats").clone();
    assert_eq!(stats.checkpoint_lsn, Some(lsn), "{what}");
    assert_eq!(dump(&db, "t"), model, "{what}");
    assert_eq!(stats.checkpoint_rows, 80, "{what}: rows of the checkpoint");
}

/// On each lock table, under wait-die and no-wait (which make the checkpoint take the committed
/// values of locked keys) and the waits-for graph (where it must not wait behind the lock
/// holder): [`checkpoint_beside_a_lock_holder`] with the holder aborting and committing.
fn checkpoint_beside_lock_holders(lock_table: LockTableKind) {
    for deadlock in [
        DeadlockPolicy::WaitDie,
        DeadlockPolicy::NoWait,
        DeadlockPolicy::WaitForGraph,
    ] {
        for commit in [false, true] {
            checkpoint_beside_a_lock_holder(deadlock, lock_table, commit);
        }
    }
}

common::tables::every_table!(checkpoint_beside_lock_holders);

/// A transaction that commits while the checkpoint runs (its record lands below or above the
/// checkpoint's LSN) is never lost, and the checkpoint never fails.
#[test]
fn checkpoints_beside_a_stream_of_committers_lose_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = Options::default()
        .with_deadlock(DeadlockPolicy::NoWait)
        .with_log_segment_size(16 << 10);
    let model = {
        let db = Database::open(dir.path(), opts.clone()).expect("open");
        let t = db.create_table("t").expect("create");
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..3u32)
                .map(|w| {
                    let (db, t, stop) = (&db, &t, &stop);
                    s.spawn(move || {
                        let mut n = 0u32;
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 50 {
                            n += 1;
                            let v = format!("{w}:{n}").into_bytes();
                            db.run(|tx| {
                                tx.put(t, key(n % 20 + w * 20), &v)?;
                                tx.put(t, format!("w{w}"), &v)
                            })
                            .expect("write");
                        }
                    })
                })
                .collect();
            let results: Vec<_> = (0..10)
                .map(|_| {
                    let r = db.checkpoint();
                    std::thread::sleep(Duration::from_millis(2));
                    r
                })
                .collect();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for w in writers {
                w.join().expect("writer");
            }
            for r in results {
                r.expect("checkpoint beside committers");
            }
        });
        dump(&db, "t")
    };
    let db = Database::open(dir.path(), opts).expect("reopen");
    assert_eq!(dump(&db, "t"), model);
}

#[test]
fn a_failed_background_checkpoint_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = Database::open(dir.path(), Options::default()).expect("open");
        let t = db.create_table("t").expect("create");
        db.run(|tx| tx.put(&t, "k", "v")).expect("put");
    }
    let opts = Options::default().with_checkpoint_interval(Some(Duration::from_millis(1)));
    let db = Database::open(dir.path(), opts).expect("open");
    // Nothing is logged from now on, so every checkpoint has the LSN where the log continues.
    // A directory where their temporary file goes makes them fail (as root too, unlike
    // permissions).
    let lsn = db.recovery_stats().expect("stats").end_lsn;
    let blocker = dir.path().join(format!("checkpoint-{lsn:020}.tmp"));
    loop {
        match std::fs::create_dir(&blocker) {
            Ok(()) => break,
            // A background checkpoint's own temporary file, for a moment.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::thread::sleep(Duration::from_micros(100))
            }
            Err(e) => panic!("block the checkpoints: {e}"),
        }
    }
    std::fs::write(blocker.join("keep"), b"x").expect("fill the blocker");
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.checkpoint_status().background_failures == 0 {
        assert!(Instant::now() < deadline, "no background checkpoint failed");
        std::thread::sleep(Duration::from_millis(1));
    }
    let st = db.checkpoint_status();
    assert!(st.background_runs >= st.background_failures);
    let msg = st.last_error.expect("the failure's message");
    assert!(msg.contains("checkpoint-"), "{msg}");
    // Unblock, and let a background checkpoint succeed after the last failure.
    std::fs::remove_dir_all(&blocker).expect("unblock");
    let runs = db.checkpoint_status().background_runs;
    while db.checkpoint_status().background_runs < runs + 2 {
        assert!(Instant::now() < deadline, "no background checkpoint ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The next explicit checkpoint reports the pending failure, once.
    let err = db.checkpoint().expect_err("the pending background failure");
    assert!(
        err.to_string().contains("background checkpoint failed"),
        "{err}"
    );
    assert!(db.checkpoint().expect("a checkpoint").is_some());
    let st = db.checkpoint_status();
    assert!(st.background_failures >= 1);
    assert!(st.last_error.is_some());
    drop(db);
    let db = Database::open(dir.path(), Options::default()).expect("reopen");
    assert!(db.recovery_stats().expect("stats").checkpoint_lsn.is_some());
    assert_eq!(dump(&db, "t").get(&b"k"[..]), Some(&b"v".to_vec()));
}

#[test]
fn checkpoint_records_are_bounded_in_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = 20u32;
    let value = |i: u32| vec![i as u8; 1 << 20];
    {
        let db = Database::open(dir.path(), Options::default()).expect("open");
        let t = db.create_table("t").expect("create");
        for i in 0..rows {
            db.run(|tx| tx.put(&t, key(i), value(i))).expect("put");
        }
        db.run(|tx| tx.put(&t, "small", "v")).expect("put");
        db.checkpoint().expect("checkpoint").expect("a log");
    }
    let ckpt = files(dir.path(), "ckpt");
    assert_eq!(ckpt.len(), 1, "{ckpt:?}");
    let bytes = std::fs::read(&ckpt[0]).expect("read the checkpoint");
    let (mut off, mut row_records, mut rows_seen) = (0usize, 0, 0);
    while off < bytes.len() {
        match decode_frame_at(&bytes[off..], off as u64) {
            Frame::Record(rec, n) => {
                if let LogRecord::Commit { writes, .. } = &rec {
                    assert!(
                        n <= (4 << 20) + (1 << 20) + 4096,
                        "a checkpoint record of {n} bytes"
                    );
                    row_records += 1;
                    rows_seen += writes.len();
                }
                off += n;
            }
            other => panic!("undecodable checkpoint at {off}: {other:?}"),
        }
    }
    assert!(row_records >= 4, "{row_records} row records");
    assert_eq!(rows_seen, rows as usize + 1);
    let db = Database::open(dir.path(), Options::default()).expect("reopen");
    assert_eq!(
        db.recovery_stats().expect("stats").checkpoint_rows,
        u64::from(rows) + 1
    );
    let got = dump(&db, "t");
    assert_eq!(got.len(), rows as usize + 1);
    for i in 0..rows {
        assert!(got.get(&key(i)) == Some(&value(i)), "row {i}");
    }
}

fn doppel_opts(checkpoint_interval: Option<Duration>) -> Options {
    Options::default()
        .with_cc(ConcurrencyControl::Doppel)
        .with_doppel(
            DoppelOptions::default()
                .with_split_phase(Duration::from_millis(1))
                .with_max_joined(Duration::from_millis(1))
                .with_auto_classify(false),
        )
        .with_log(shoal::LogMode::Async)
        .with_checkpoint_interval(checkpoint_interval)
}

/// Opens and drops a database again and again while its background threads are busy; every
/// reopen right after the drop must find the directory unlocked.
fn reopen_right_after_drop(opts: Options, rounds: u32) {
    let dir = tempfile::tempdir().expect("tempdir");
    for round in 0..rounds {
        let db = Database::open(dir.path(), opts.clone())
            .unwrap_or_else(|e| panic!("round {round}: reopen right after the drop: {e}"));
        let t = match db.table("t") {
            Ok(t) => t,
            Err(_) => db.create_table("t").expect("create"),
        };
        let doppel = db.options().cc == ConcurrencyControl::Doppel;
        if round % 2 == 0 {
            // A transaction that is open while the coordinator starts a phase change: the
            // change waits for it, and the drop comes right after it ends.
            let mut tx = db.begin();
            tx.add(&t, "hot", 1).expect("add");
            if doppel {
                db.split_hint(&t, "hot", SplitOp::Add).expect("hint");
            }
            std::thread::sleep(Duration::from_millis(2));
            let _ = tx.commit();
        } else {
            if doppel {
                db.split_hint(&t, "hot", SplitOp::Add).expect("hint");
            }
            std::thread::scope(|s| {
                for w in 0..2 {
                    let (db, t) = (&db, &t);
                    s.spawn(move || {
                        for i in 0..5 {
                            db.run(|tx| tx.add(t, "hot", 1)).expect("add");
                            if w == 0 && i == 2 {
                                // Stashed in a split phase: a phase change follows.
                                let _ = db.run(|tx| tx.get(t, "hot"));
                            }
                        }
                    });
                }
            });
        }
        drop(db);
        // A background checkpoint cut short by the drop leaves no temporary file behind.
        let tmps = files(dir.path(), "tmp");
        assert!(tmps.is_empty(), "round {round}: left behind: {tmps:?}");
    }
    let db = Database::open(dir.path(), opts).expect("final reopen");
    assert!(db.table("t").is_ok());
}

#[test]
fn dropping_a_doppel_database_unlocks_its_directory_at_once() {
    reopen_right_after_drop(doppel_opts(None), 300);
}

#[test]
fn dropping_a_doppel_database_with_background_checkpoints_unlocks_its_directory_at_once() {
    reopen_right_after_drop(doppel_opts(Some(Duration::from_millis(1))), 300);
}

#[test]
fn dropping_a_database_with_background_checkpoints_unlocks_its_directory_at_once() {
    let opts = Options::default()
        .with_checkpoint_interval(Some(Duration::from_millis(1)))
        .with_log(shoal::LogMode::Async);
    reopen_right_after_drop(opts, 300);
}
