//! Doppel phase changes against long or waiting transactions (liveness).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal::doppel::{DoppelOptions, Phase, SplitOp};
use shoal::{ConcurrencyControl, Database, Options};

fn doppel_opts(t_s_ms: u64) -> Options {
    Options::default()
        .with_cc(ConcurrencyControl::Doppel)
        .with_doppel(
            DoppelOptions::default()
                .with_split_phase(Duration::from_millis(t_s_ms))
                .with_auto_classify(false),
        )
}

fn wait_phase(db: &Database, p: Phase) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while db.doppel_stats().unwrap().phase != Some(p) {
        assert!(Instant::now() < deadline, "no {p:?} phase within 5 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A transaction begun in a split phase.
fn begin_split(db: &Database) -> shoal::Transaction<'_> {
    loop {
        wait_phase(db, Phase::Split);
        let tx = db.begin();
        if db.doppel_stats().unwrap().phase == Some(Phase::Split) {
            return tx;
        }
    }
}

/// Thread A has a split-phase transaction open and waits for the result of thread B's
/// `db.run`, which reads the split record. B is stashed; its re-run's `begin()` waits for a
/// joined phase, which cannot come while A's transaction runs. That wait had no escape (the
/// first `begin()` of a phase change goes on once the change is cancelled after
/// `drain_timeout`), so both waited for ever. Now the re-run waits at most `stash_wait`,
/// goes on in the split phase and is stashed again; after a second such wait `run` returns
/// `Stashed`: a deadlock broken by a timeout, as under 2PL.
#[test]
fn a_stashed_rerun_does_not_wait_for_ever_behind_a_transaction_that_waits_for_it() {
    let db = Database::in_memory_with(
        doppel_opts(20).with_doppel(
            DoppelOptions::default()
                .with_split_phase(Duration::from_millis(20))
                .with_auto_classify(false)
                .with_stash_wait(Duration::from_millis(300)),
        ),
    );
    let t = db.create_table("t").unwrap();
    db.run(|tx| tx.put(&t, "hot", 0i64.to_le_bytes())).unwrap();
    db.split_hint(&t, "hot", SplitOp::Add).unwrap();
    let mut tx = begin_split(&db);
    tx.add(&t, "hot", 1).unwrap();
    let (send, recv) = std::sync::mpsc::channel();
    let b = {
        let (db, t) = (db.clone(), t.clone());
        std::thread::spawn(move || {
            let r = db.run(|tx| tx.get_i64(&t, "hot"));
            let _ = send.send(r);
        })
    };
    let got = recv.recv_timeout(Duration::from_secs(5));
    let stats = db.doppel_stats().unwrap();
    // Let B go (A ends its transaction) so that the test does not hang.
    tx.commit().unwrap();
    b.join().unwrap();
    assert!(
        matches!(got, Ok(Err(shoal::Error::Stashed { .. }))),
        "B's transaction did not end with `Stashed` within 5 s while A's split-phase \
         transaction waited for it: {got:?} (cancelled phase changes meanwhile: {}, \
         stashed: {})",
        stats.cancelled_changes,
        stats.stashed
    );
    // A's increment stands, and B's read now goes through.
    assert_eq!(db.run(|tx| tx.get_i64(&t, "hot")).unwrap(), Some(1));
}

/// One long transaction (longer than `drain_timeout`) in a joined phase while a split is
/// wanted: the coordinator sets the changing flag, every other `begin()` waits, and the
/// change is cancelled after `drain_timeout` (50 ms). The coordinator used to try again at
/// its next tick (under 1 ms later): other threads spent 96% of their time inside `begin()`
/// for as long as the long transaction ran. Cancelled changes now back off.
#[test]
fn one_long_transaction_does_not_stall_every_other_begin() {
    let db = Database::in_memory_with(doppel_opts(20));
    let t = db.create_table("t").unwrap();
    db.run(|tx| tx.put(&t, "hot", 0i64.to_le_bytes())).unwrap();
    wait_phase(&db, Phase::Joined);
    // The long transaction: begun in the joined phase, open for 1.5 s.
    let (began_s, began_r) = std::sync::mpsc::channel();
    let long = {
        let (db, t) = (db.clone(), t.clone());
        std::thread::spawn(move || {
            let mut tx = db.begin();
            tx.get(&t, "cold").unwrap();
            began_s.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            tx.commit().unwrap();
        })
    };
    began_r.recv().unwrap();
    // Now a split is wanted.
    db.split_hint(&t, "hot", SplitOp::Add).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = spawn_worker(&db, &t, &stop);
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    let (in_begin, total, commits) = worker.join().unwrap();
    long.join().unwrap();
    let cancelled = db.doppel_stats().unwrap().cancelled_changes;
    // Control: the same worker once the long transaction is over (the split phase runs).
    wait_phase(&db, Phase::Split);
    let stop = Arc::new(AtomicBool::new(false));
    let control = spawn_worker(&db, &t, &stop);
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    let (c_in_begin, c_total, c_commits) = control.join().unwrap();
    eprintln!(
        "control: {c_commits} commits in {c_total:?}, {c_in_begin:?} of it inside begin() ({:.0}%)",
        c_in_begin.as_secs_f64() / c_total.as_secs_f64() * 100.0
    );
    let frac = in_begin.as_secs_f64() / total.as_secs_f64();
    eprintln!(
        "worker: {commits} commits in {total:?}, {in_begin:?} of it inside begin() ({:.0}%); \
         cancelled phase changes: {cancelled}",
        frac * 100.0
    );
    assert!(
        frac < 0.5,
        "an unrelated worker spent {:.0}% of its time waiting in begin() ({commits} commits \
         in {total:?}; {c_commits} in {c_total:?} without the long transaction) while one long \
         transaction held off {cancelled} phase changes",
        frac * 100.0
    );
}

/// A worker committing one-row transactions until `stop`: (time inside `begin()`, total
/// time, commits).
fn spawn_worker(
    db: &Database,
    t: &shoal::Table,
    stop: &Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Duration, Duration, u64)> {
    {
        let (db, t, stop) = (db.clone(), t.clone(), Arc::clone(stop));
        std::thread::spawn(move || {
            let (mut in_begin, mut commits) = (Duration::ZERO, 0u64);
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let b = Instant::now();
                let mut tx = db.begin();
                in_begin += b.elapsed();
                tx.put(&t, "w", commits.to_le_bytes()).unwrap();
                tx.commit().unwrap();
                commits += 1;
            }
            (in_begin, start.elapsed(), commits)
        })
    }
}
