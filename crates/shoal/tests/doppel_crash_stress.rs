//! Stress of Doppel with admission, sync/pipelined commits, nested transactions, a stash
//! queue, background checkpoints and phase changes, ended by a real crash (the child
//! process aborts in the middle of the work); then recovery is checked, more work runs on
//! the recovered database, and it is reopened and checked again.
//!
//! Invariant: every committed transaction adds 1 to "a" (split for ADD most of the time)
//! and inserts one unique row "u<id>", and raises "m" (split for MAX) to its id; so at any
//! point, live or recovered, a == number of u rows and m == largest u id, and every id
//! acknowledged before the crash is there (commits are synchronous: durable when
//! acknowledged). Readers store the value of "a" they saw in "r<id>": never more than a.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shoal::doppel::{DoppelOptions, Phase, SplitOp, StashQueue};
use shoal::{Admission, ConcurrencyControl, Database, Error, LogMode, Options, Table};

const CHILD_ENV: &str = "SHOAL_DOPPEL_CRASH_STRESS_CHILD";

fn opts() -> Options {
    Options::default()
        .with_cc(ConcurrencyControl::Doppel)
        .with_log(LogMode::Sync)
        .with_admission(Admission::Limit(2))
        .with_checkpoint_interval(Some(Duration::from_millis(15)))
        .with_doppel(
            DoppelOptions::default()
                .with_split_phase(Duration::from_millis(2))
                .with_auto_classify(false),
        )
}

fn id_of(w: u64, i: u64, run: u64) -> u64 {
    run * 100_000_000 + w * 1_000_000 + i
}

/// One unit of work: +1 on "a", MAX on "m", the unique row.
fn unit(tx: &mut shoal::Transaction<'_>, t: &Table, id: u64) -> shoal::Result<()> {
    tx.add(t, "a", 1)?;
    tx.max(t, "m", id as i64)?;
    tx.insert(t, format!("u{id:012}"), b"")
}

/// Runs the workload on `db` until `deadline`; acknowledged ids go to `acked`.
fn workload(db: &Database, t: &Table, run: u64, deadline: Instant, acked: &Arc<Mutex<Vec<u64>>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (db, t, stop) = (db.clone(), t.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                db.split_hint(&t, "m", SplitOp::Max).unwrap();
                if i.is_multiple_of(4) {
                    db.clear_split_hint(&t, "a").unwrap();
                } else {
                    db.split_hint(&t, "a", SplitOp::Add).unwrap();
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let workers: Vec<_> = (0..6u64)
        .map(|w| {
            let (db, t, acked) = (db.clone(), t.clone(), Arc::clone(acked));
            std::thread::spawn(move || {
                let mut queue: StashQueue<u64> = StashQueue::new(&db);
                let mut i = 0u64;
                while Instant::now() < deadline {
                    i += 1;
                    let id = id_of(w, i, run);
                    let ok = match (w, i % 5) {
                        // Through `run`, sometimes reading the split counter (stashed).
                        (0 | 1, k) => db
                            .run(|tx| {
                                unit(tx, &t, id)?;
                                if k == 0 {
                                    let a = tx.get_i64(&t, "a")?.unwrap_or(0);
                                    tx.put(&t, format!("r{id:012}"), a.to_le_bytes())?;
                                }
                                Ok(())
                            })
                            .map(|()| true),
                        // Nested: the inner transaction joins the outer one's phase.
                        (2, _) => db
                            .run(|tx| {
                                unit(tx, &t, id)?;
                                let inner = db.run(|tx2| unit(tx2, &t, id + 500_000));
                                match inner {
                                    Ok(()) => {
                                        acked.lock().unwrap().push(id + 500_000);
                                        Ok(())
                                    }
                                    // A retry of the outer one runs the inner one again.
                                    Err(Error::DuplicateKey { .. }) => Ok(()),
                                    Err(Error::Stashed { .. }) => Ok(()),
                                    Err(e) if e.is_retryable() => Ok(()),
                                    Err(e) => Err(e),
                                }
                            })
                            .map(|()| true),
                        // A stash queue: reads of "a" set aside, re-run when their phase ended.
                        (3, _) => {
                            let input = queue.pop_ready().unwrap_or(id);
                            let mut tx = db.begin();
                            let r = unit(&mut tx, &t, input)
                                .and_then(|()| {
                                    if input.is_multiple_of(3) {
                                        let a = tx.get_i64(&t, "a")?.unwrap_or(0);
                                        tx.put(&t, format!("r{input:012}"), a.to_le_bytes())?;
                                    }
                                    Ok(())
                                })
                                .and_then(|()| tx.commit());
                            Ok(match r {
                                Ok(()) => {
                                    acked.lock().unwrap().push(input);
                                    false
                                }
                                Err(Error::Stashed { .. }) => {
                                    queue.push(input);
                                    false
                                }
                                Err(e) if e.is_retryable() => {
                                    queue.push(input);
                                    false
                                }
                                Err(Error::DuplicateKey { .. }) => false,
                                Err(e) => panic!("{e}"),
                            })
                        }
                        // Pipelined commits, waited for.
                        (4, _) => {
                            let mut tx = db.begin();
                            match unit(&mut tx, &t, id).and_then(|()| tx.commit_pipelined()) {
                                Ok(ticket) => ticket.wait().map(|()| true),
                                Err(e) if e.is_retryable() => Ok(false),
                                Err(e) => Err(e),
                            }
                        }
                        // Plain split ADDs and MAXes with a few non-split writes.
                        _ => db
                            .run(|tx| {
                                unit(tx, &t, id)?;
                                tx.put(&t, format!("w{w}"), id.to_le_bytes())
                            })
                            .map(|()| true),
                    };
                    match ok {
                        Ok(true) => acked.lock().unwrap().push(id),
                        Ok(false) => {}
                        Err(e) => panic!("worker {w}: {e}"),
                    }
                }
            })
        })
        .collect();
    for h in workers {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
}

/// The invariant; returns (a, number of u rows).
fn check(db: &Database, t: &Table, acked: &[u64], when: &str) -> (i64, usize) {
    db.clear_split_hint(t, "a").unwrap();
    db.clear_split_hint(t, "m").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !db.split_keys().is_empty() || db.doppel_stats().unwrap().phase != Some(Phase::Joined) {
        assert!(Instant::now() < deadline, "{when}: no joined phase");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (a, m, us, rs) = db
        .run(|tx| {
            Ok((
                tx.get_i64(t, "a")?.unwrap_or(0),
                tx.get_i64(t, "m")?.unwrap_or(0),
                tx.scan(t, "u".."v")?,
                tx.scan(t, "r".."s")?,
            ))
        })
        .unwrap();
    let ids: std::collections::BTreeSet<u64> = us
        .iter()
        .map(|(k, _)| std::str::from_utf8(&k[1..]).unwrap().parse().unwrap())
        .collect();
    assert_eq!(a, ids.len() as i64, "{when}: a against the unique rows");
    assert_eq!(
        m,
        ids.iter().next_back().copied().unwrap_or(0) as i64,
        "{when}: m against the largest id"
    );
    let missing: Vec<_> = acked.iter().filter(|id| !ids.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "{when}: acknowledged ids lost: {missing:?}"
    );
    for (k, v) in &rs {
        let seen = i64::from_le_bytes(v[..8].try_into().unwrap());
        assert!(seen <= a, "{when}: reader {k:?} saw a = {seen} > {a}");
    }
    (a, ids.len())
}

/// The child: opens the database in `dir`, runs the workload, and aborts in the middle of
/// it after writing the ids acknowledged so far to `dir/acked`.
fn child_main(dir: &std::path::Path) {
    let db = Database::open(dir, opts()).unwrap();
    let t = db.create_table("t").unwrap();
    let acked = Arc::new(Mutex::new(Vec::new()));
    {
        let (acked, dir, db) = (Arc::clone(&acked), dir.to_path_buf(), db.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2500));
            let ids: Vec<u64> = acked.lock().unwrap().clone();
            let text: String = ids.iter().map(|i| format!("{i}\n")).collect();
            std::fs::write(dir.join("acked.tmp"), text).unwrap();
            std::fs::rename(dir.join("acked.tmp"), dir.join("acked")).unwrap();
            let s = db.doppel_stats().unwrap();
            eprintln!("child: {} acked, {s:?}; aborting", ids.len());
            std::process::abort();
        });
    }
    workload(&db, &t, 0, Instant::now() + Duration::from_secs(60), &acked);
}

#[test]
fn doppel_stress_with_admission_checkpoints_crash_and_reopen() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child_main(std::path::Path::new(&dir));
        return;
    }
    let start = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "doppel_stress_with_admission_checkpoints_crash_and_reopen",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .output()
        .unwrap();
    eprintln!(
        "{}",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.starts_with("child"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(!out.status.success(), "the child was to abort");
    let acked: Vec<u64> = std::fs::read_to_string(dir.path().join("acked"))
        .expect("the child wrote its acknowledged ids")
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert!(acked.len() > 100, "too little work: {}", acked.len());
    // Recovery after the crash.
    let (a1, n1) = {
        let db = Database::open(dir.path(), opts()).unwrap();
        let rs = db.recovery_stats().cloned().unwrap();
        eprintln!("recovered: {rs:?}");
        assert!(!rs.closed_cleanly);
        let t = db.table("t").unwrap();
        let got = check(&db, &t, &acked, "recovered after the crash");
        // More work on the recovered database, then a clean close in a split phase.
        let acked2 = Arc::new(Mutex::new(acked.clone()));
        workload(
            &db,
            &t,
            1,
            Instant::now() + Duration::from_millis(2000),
            &acked2,
        );
        let acked2 = acked2.lock().unwrap().clone();
        let live = check(&db, &t, &acked2, "live after more work");
        db.split_hint(&t, "a", SplitOp::Add).unwrap();
        db.split_hint(&t, "m", SplitOp::Max).unwrap();
        let mut last = acked2.clone();
        let deadline = Instant::now() + Duration::from_secs(5);
        while db.doppel_stats().unwrap().phase != Some(Phase::Split) {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
        for i in 0..20u64 {
            let id = id_of(9, i, 2);
            db.run(|tx| unit(tx, &t, id)).unwrap();
            last.push(id);
        }
        // One more in a transaction begun in the split phase, left unreconciled by the drop.
        loop {
            let mut tx = db.begin();
            if db.doppel_stats().unwrap().phase != Some(Phase::Split) {
                drop(tx);
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let id = id_of(9, 99, 2);
            unit(&mut tx, &t, id).unwrap();
            tx.commit().unwrap();
            last.push(id);
            break;
        }
        assert_eq!(db.doppel_stats().unwrap().phase, Some(Phase::Split));
        std::fs::write(
            dir.path().join("acked2"),
            last.iter().map(|i| format!("{i}\n")).collect::<String>(),
        )
        .unwrap();
        eprintln!(
            "second run: live {live:?}, recovered {got:?}, stats {:?}",
            db.doppel_stats()
        );
        (live.0 + 21, live.1 + 21)
    };
    let acked2: Vec<u64> = std::fs::read_to_string(dir.path().join("acked2"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let db = Database::open(dir.path(), opts()).unwrap();
    let t = db.table("t").unwrap();
    let (a2, n2) = check(&db, &t, &acked2, "reopened after the second run");
    assert_eq!((a2, n2), (a1, n1));
    eprintln!("total {:?}", start.elapsed());
}
