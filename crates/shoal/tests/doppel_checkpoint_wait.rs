//! Checkpoints under Doppel: a checkpoint asked for while a split-phase transaction of
//! another thread is open waits for the joined phase, and that wait is bounded.
//!
//! A stashed re-run that waits for a joined phase gives up after
//! `DoppelOptions::stash_wait` (a running transaction may be waiting, outside the engine,
//! for the very thread that waits). A checkpoint has the same dependency (it needs every
//! split-phase transaction to end) and the same bound: it returns an `Error::Io` of kind
//! `TimedOut` instead of waiting for as long as the other transaction stays open.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use shoal::doppel::{DoppelOptions, Phase, SplitOp};
use shoal::{ConcurrencyControl, Database, LogMode, Options};

fn opts() -> Options {
    Options::default()
        .with_cc(ConcurrencyControl::Doppel)
        .with_log(LogMode::Sync)
        .with_doppel(
            DoppelOptions::default()
                .with_split_phase(Duration::from_millis(2))
                .with_stash_wait(Duration::from_millis(500))
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

/// Thread A holds a split-phase transaction (a split ADD, not yet committed) open until
/// thread B has taken a checkpoint, as an application handing work between two threads
/// would. Under 2PL or OCC the checkpoint returns at once; a stashed `Database::run` on B
/// gives up waiting after `stash_wait` (500 ms here), and so does the checkpoint, with a
/// `TimedOut` error (before, it returned only when A's transaction ended: in the
/// application, never). Once A commits, a checkpoint goes through. Thread C runs small
/// transactions on another key meanwhile, and they keep finishing.
#[test]
fn a_checkpoint_waiting_for_a_joined_phase_gives_up_after_the_stash_wait() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path(), opts()).unwrap();
    let t = db.create_table("t").unwrap();
    db.run(|tx| tx.put(&t, "a", 0i64.to_le_bytes())).unwrap();
    db.split_hint(&t, "a", SplitOp::Add).unwrap();

    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (open_tx, open_rx) = mpsc::channel::<()>();
    let a = {
        let (db, t) = (db.clone(), t.clone());
        std::thread::spawn(move || {
            // A transaction begun in a split phase.
            let mut tx = loop {
                wait_split(&db);
                let tx = db.begin();
                if db.doppel_stats().unwrap().phase == Some(Phase::Split) {
                    break tx;
                }
            };
            tx.add(&t, "a", 1).unwrap();
            open_tx.send(()).unwrap();
            // Waits for B's checkpoint (bounded here only so that the test ends).
            let _ = go_rx.recv_timeout(Duration::from_secs(20));
            tx.commit().unwrap();
        })
    };
    open_rx.recv().unwrap();

    // C: small transactions on a key that is not split, timed: for one second with A's
    // transaction open and no checkpoint asked for, then while B's checkpoint waits.
    let c_stop = Arc::new(AtomicBool::new(false));
    let c_max = Arc::new(AtomicU64::new(0));
    let c = {
        let (db, t, stop, max) = (
            db.clone(),
            t.clone(),
            Arc::clone(&c_stop),
            Arc::clone(&c_max),
        );
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let t0 = Instant::now();
                db.run(|tx| tx.put(&t, "c", n.to_le_bytes())).unwrap();
                max.fetch_max(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    let before = Duration::from_micros(c_max.swap(0, Ordering::Relaxed));

    // B: the checkpoint, on a helper thread so that the test can time it.
    let (done_tx, done_rx) = mpsc::channel();
    let b = {
        let db = db.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let r = db.checkpoint();
            let _ = done_tx.send((r.map_err(|e| e.to_string()), t0.elapsed()));
        })
    };
    // Ten times the stash wait, and far beyond the split phase, drain timeout and backoff.
    let got = done_rx.recv_timeout(Duration::from_secs(5));
    let stats = db.doppel_stats().unwrap();
    let during = Duration::from_micros(c_max.load(Ordering::Relaxed));
    c_stop.store(true, Ordering::Relaxed);
    c.join().unwrap();
    eprintln!(
        "longest unrelated transaction: {before:?} before the checkpoint was asked for, \
         {during:?} while it waited; {stats:?}"
    );
    // Let A go so that everything ends, whatever the outcome.
    let _ = go_tx.send(());
    a.join().unwrap();
    b.join().unwrap();
    let (res, took) = got.expect("db.checkpoint() still blocked after 5 s (stash_wait 500 ms)");
    let err = res.expect_err("no joined phase could come while A's transaction stayed open");
    assert!(err.contains("no joined Doppel phase"), "{err}");
    assert!(took >= Duration::from_millis(500), "gave up after {took:?}");
    assert!(before < Duration::from_secs(4) && during < Duration::from_secs(4));
    // A's transaction has ended: nothing holds the phase split any more.
    assert!(db.checkpoint().unwrap().is_some());
    assert_eq!(
        db.run(|tx| tx.get(&t, "a")).unwrap(),
        Some(1i64.to_le_bytes().to_vec())
    );
}
