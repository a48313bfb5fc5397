//! Checkpoints under Doppel: explicit and background checkpoints taken while workers
//! commit split operations of every kind (ADD, MAX, OPUT, TOPKINSERT) synchronously on hot
//! keys whose split operation keeps changing, small log segments so that checkpoints delete
//! the log before them, then a real crash (the child process aborts mid-work) and two
//! reopens with a checkpoint between them.
//!
//! Every unit of work adds 1 to "a", raises "m" to its id, OPUTs its id into "o", inserts its
//! id into the top-4 set "k" and inserts the unique row "u<id>" in one transaction. So in any
//! state a serial order explains: a == number of u rows, m == largest u id, o's order ==
//! largest u id, k's orders == the four largest u ids; and every id acknowledged before the
//! crash is there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shoal::doppel::{DoppelOptions, Phase, SplitOp};
use shoal::{Admission, ConcurrencyControl, Database, Error, LogMode, Options, Table};

const CHILD_ENV: &str = "SHOAL_DOPPEL_CKPT_CRASH_CHILD";
const K: u32 = 4;

fn opts() -> Options {
    Options::default()
        .with_cc(ConcurrencyControl::Doppel)
        .with_log(LogMode::Sync)
        .with_admission(Admission::Limit(2))
        .with_log_segment_size(16 << 10)
        .with_checkpoint_interval(Some(Duration::from_millis(20)))
        .with_doppel(
            DoppelOptions::default()
                .with_split_phase(Duration::from_millis(2))
                .with_auto_classify(false),
        )
}

fn unit(tx: &mut shoal::Transaction<'_>, t: &Table, id: u64) -> shoal::Result<()> {
    tx.add(t, "a", 1)?;
    tx.max(t, "m", id as i64)?;
    tx.oput(t, "o", id as i64, id.to_le_bytes())?;
    tx.topk_insert(t, "k", id as i64, id.to_le_bytes(), K)?;
    tx.insert(t, format!("u{id:012}"), b"")
}

fn workload(db: &Database, t: &Table, run: u64, until: Instant, acked: &Arc<Mutex<Vec<u64>>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (db, t, stop) = (db.clone(), t.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let on = |n: u64| !(i + n).is_multiple_of(3);
                let hints: [(&str, SplitOp); 4] = [
                    ("a", SplitOp::Add),
                    ("m", SplitOp::Max),
                    ("o", SplitOp::Oput),
                    ("k", SplitOp::TopK(K)),
                ];
                for (n, (key, op)) in hints.into_iter().enumerate() {
                    if on(n as u64) {
                        db.split_hint(&t, key, op).unwrap();
                    } else {
                        db.clear_split_hint(&t, key).unwrap();
                    }
                }
                std::thread::sleep(Duration::from_millis(4));
            }
        })
    };
    // Explicit checkpoints besides the background ones: each waits for a joined phase.
    let checkpointer = {
        let (db, stop) = (db.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match db.checkpoint() {
                    Ok(_) => n += 1,
                    // No joined phase within `stash_wait` (a loaded machine): not a failure.
                    Err(Error::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::TimedOut => {}
                    // A failed background checkpoint is reported once here.
                    Err(e) => panic!("checkpoint: {e}"),
                }
                std::thread::sleep(Duration::from_millis(3));
            }
            n
        })
    };
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let (db, t, acked) = (db.clone(), t.clone(), Arc::clone(acked));
            std::thread::spawn(move || {
                let mut i = 0u64;
                while Instant::now() < until {
                    i += 1;
                    let id = run * 100_000_000 + w * 1_000_000 + i;
                    let read = w == 0 && i.is_multiple_of(5);
                    let r = db.run(|tx| {
                        unit(tx, &t, id)?;
                        if read {
                            // Stashed in a split phase: re-run in a joined one.
                            let a = tx.get_i64(&t, "a")?.unwrap_or(0);
                            tx.put(&t, format!("r{id:012}"), a.to_le_bytes())?;
                        }
                        Ok(())
                    });
                    match r {
                        Ok(()) => acked.lock().unwrap().push(id),
                        Err(Error::Stashed { .. }) => {}
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
    let n = checkpointer.join().unwrap();
    eprintln!("child: run {run}: {n} explicit checkpoints");
}

/// Checks the invariant; returns (a, number of u rows).
fn check(db: &Database, t: &Table, acked: &[u64], when: &str) -> (i64, usize) {
    for k in ["a", "m", "o", "k"] {
        db.clear_split_hint(t, k).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !db.split_keys().is_empty() || db.doppel_stats().unwrap().phase != Some(Phase::Joined) {
        assert!(Instant::now() < deadline, "{when}: no joined phase");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (a, m, o, k, us) = db
        .run(|tx| {
            Ok((
                tx.get_i64(t, "a")?.unwrap_or(0),
                tx.get_i64(t, "m")?.unwrap_or(0),
                tx.get_tuple(t, "o")?.map(|o| o.order),
                tx.get_topk(t, "k")?
                    .into_iter()
                    .map(|e| e.order)
                    .collect::<Vec<_>>(),
                tx.scan(t, "u".."v")?,
            ))
        })
        .unwrap();
    let ids: std::collections::BTreeSet<u64> = us
        .iter()
        .map(|(k, _)| std::str::from_utf8(&k[1..]).unwrap().parse().unwrap())
        .collect();
    let top: Vec<i64> = ids
        .iter()
        .rev()
        .take(K as usize)
        .map(|&i| i as i64)
        .collect();
    let largest = ids.iter().next_back().copied().unwrap_or(0) as i64;
    assert_eq!(a, ids.len() as i64, "{when}: a against the unique rows");
    assert_eq!(m, largest, "{when}: m against the largest id");
    assert_eq!(
        o,
        (largest > 0).then_some(largest),
        "{when}: o against the largest id"
    );
    assert_eq!(k, top, "{when}: the top-{K} set against the largest ids");
    let missing: Vec<_> = acked.iter().filter(|id| !ids.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "{when}: acknowledged ids lost: {missing:?}"
    );
    (a, ids.len())
}

fn child_main(dir: &std::path::Path) {
    let db = Database::open(dir, opts()).unwrap();
    let t = db.create_table("t").unwrap();
    let acked = Arc::new(Mutex::new(Vec::new()));
    {
        let (acked, dir, db) = (Arc::clone(&acked), dir.to_path_buf(), db.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2000));
            let ids: Vec<u64> = acked.lock().unwrap().clone();
            let text: String = ids.iter().map(|i| format!("{i}\n")).collect();
            std::fs::write(dir.join("acked.tmp"), text).unwrap();
            std::fs::rename(dir.join("acked.tmp"), dir.join("acked")).unwrap();
            eprintln!(
                "child: {} acked, {:?}, {:?}; aborting",
                ids.len(),
                db.doppel_stats().unwrap(),
                db.checkpoint_status()
            );
            std::process::abort();
        });
    }
    workload(&db, &t, 0, Instant::now() + Duration::from_secs(60), &acked);
}

#[test]
fn doppel_split_ops_checkpoints_crash_and_reopen() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child_main(std::path::Path::new(&dir));
        return;
    }
    let reps: usize = std::env::var("DOPPEL_CKPT_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    for rep in 0..reps {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "doppel_split_ops_checkpoints_crash_and_reopen",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "rep {rep}: {}",
            err.lines()
                .filter(|l| l.starts_with("child") || l.contains("panicked"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(!out.status.success(), "the child was to abort");
        let acked: Vec<u64> = std::fs::read_to_string(dir.path().join("acked"))
            .expect("the child wrote its acknowledged ids")
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert!(acked.len() > 50, "too little work: {}", acked.len());
        let first = {
            let db = Database::open(dir.path(), opts()).unwrap();
            let rs = db.recovery_stats().cloned().unwrap();
            eprintln!("rep {rep}: recovered {rs:?}");
            assert!(rs.checkpoint_lsn.is_some(), "no checkpoint was taken");
            let t = db.table("t").unwrap();
            let got = check(&db, &t, &acked, "recovered after the crash");
            // More work in split phases, a checkpoint, then a close in a split phase.
            let acked2 = Arc::new(Mutex::new(acked.clone()));
            workload(
                &db,
                &t,
                1,
                Instant::now() + Duration::from_millis(700),
                &acked2,
            );
            let acked2 = acked2.lock().unwrap().clone();
            let live = check(&db, &t, &acked2, "live after more work");
            db.checkpoint().unwrap();
            db.split_hint(&t, "a", SplitOp::Add).unwrap();
            db.split_hint(&t, "k", SplitOp::TopK(K)).unwrap();
            let mut last = acked2;
            for i in 0..10u64 {
                let id = 200_000_000 + i;
                db.run(|tx| unit(tx, &t, id)).unwrap();
                last.push(id);
            }
            eprintln!("rep {rep}: first {got:?} live {live:?}");
            (live.0 + 10, live.1 + 10, last)
        };
        let db = Database::open(dir.path(), opts()).unwrap();
        let t = db.table("t").unwrap();
        let (a, n) = check(&db, &t, &first.2, "reopened");
        assert_eq!((a, n), (first.0, first.1));
    }
}
