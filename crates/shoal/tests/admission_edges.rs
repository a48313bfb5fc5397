//! Load control at its edges: a panic inside `Database::run`, nested transactions whose
//! inner one waits for a lock, a read-only wait for a pipelined commit's durability.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use shoal::{Admission, ConcurrencyControl, Database, Elr, LogMode, Options};

fn until(f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A panic inside `Database::run` leaves no slot taken: another thread runs at once.
#[test]
fn a_panic_inside_run_gives_the_slot_back() {
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
        ConcurrencyControl::Serial,
    ] {
        let db = Database::in_memory_with(
            Options::default()
                .with_admission(Admission::Limit(1))
                .with_cc(cc),
        );
        let t = db.create_table("t").unwrap();
        let (db, t) = (&db, &t);
        std::thread::scope(|s| {
            let (done_tx, done_rx) = mpsc::channel::<()>();
            let h = s.spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    db.run(|tx| {
                        tx.put(t, "k", "v")?;
                        let _ = tx.update(t, "k", |_: Option<&[u8]>| -> Vec<u8> { panic!("boom") });
                        Ok(())
                    })
                }));
                assert!(r.is_err());
                // Stay alive (keeping whatever the thread keeps) while another thread runs.
                done_rx.recv().unwrap();
            });
            let start = Instant::now();
            until(|| db.admission_stats().unwrap().running == 0);
            let other = s.spawn(move || db.run(|tx| tx.put(t, "k", "w")).unwrap());
            other.join().unwrap();
            assert!(
                start.elapsed() < Duration::from_millis(900),
                "{cc:?}: waited for the escape"
            );
            assert_eq!(db.admission_stats().unwrap().escaped, 0, "{cc:?}");
            assert_eq!(db.run(|tx| tx.get(t, "k")).unwrap(), Some(b"w".to_vec()));
            done_tx.send(()).unwrap();
            h.join().unwrap();
        });
    }
}

/// One slot. C holds `x` and waits for a pipelined commit's lock on `y` (without its slot);
/// A runs an outer transaction and a nested inner one that asks for `x`. When the flush
/// ends C's wait, C needs the slot A's thread holds: the inner wait must have given it up.
#[test]
fn a_nested_inner_lock_wait_lets_the_holder_resume() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(
        dir.path(),
        Options::default()
            .with_admission(Admission::Limit(1))
            .with_log(LogMode::Sync)
            .with_log_latency(Duration::from_millis(300))
            .with_lock_timeout(Duration::from_secs(60)),
    )
    .unwrap();
    let t = db.create_table("t").unwrap();
    let (db, t) = (&db, &t);
    let mut t0 = db.begin();
    t0.put(t, "y", "0").unwrap();
    let ticket = t0.commit_pipelined().unwrap();
    let start = Instant::now();
    std::thread::scope(|s| {
        let (c_has_x, c_locked) = mpsc::channel();
        let c = s.spawn(move || {
            let mut tc = db.begin();
            tc.put(t, "x", "c").unwrap();
            c_has_x.send(()).unwrap();
            tc.put(t, "y", "c").unwrap();
            tc.commit()
        });
        c_locked.recv().unwrap();
        until(|| db.admission_stats().unwrap().running == 0);
        let a = s.spawn(move || {
            let mut outer = db.begin();
            outer.put(t, "o", "1").unwrap();
            let mut inner = db.begin();
            let v = inner.get(t, "x").unwrap();
            inner.commit().unwrap();
            outer.commit().unwrap();
            v
        });
        c.join().unwrap().unwrap();
        assert_eq!(a.join().unwrap(), Some(b"c".to_vec()));
    });
    ticket.wait().unwrap();
    let s = db.admission_stats().unwrap();
    assert_eq!(s.escaped, 0, "{s:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// One slot, SX-ELR: a pipelined commit releases its locks at once and tags them; a
/// read-only transaction on another thread reads the key and must wait for the flush,
/// without keeping the only slot from a third thread meanwhile.
#[test]
fn a_read_only_wait_on_a_pipelined_commit_gives_the_slot_up() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(
        dir.path(),
        Options::default()
            .with_admission(Admission::Limit(1))
            .with_elr(Elr::Sx)
            .with_log(LogMode::Sync)
            .with_log_latency(Duration::from_millis(500))
            .with_lock_timeout(Duration::from_secs(60)),
    )
    .unwrap();
    let t = db.create_table("t").unwrap();
    let (db, t) = (&db, &t);
    let mut t0 = db.begin();
    t0.put(t, "y", "0").unwrap();
    let ticket = t0.commit_pipelined().unwrap();
    std::thread::scope(|s| {
        let (read_tx, read_rx) = mpsc::channel();
        let r = s.spawn(move || {
            db.run(|tx| {
                let v = tx.get(t, "y");
                read_tx.send(()).unwrap();
                v
            })
            .unwrap()
        });
        read_rx.recv().unwrap();
        until(|| db.admission_stats().unwrap().running == 0 || r.is_finished());
        assert!(!r.is_finished(), "the flush came first: scenario missed");
        let start = Instant::now();
        let w = s.spawn(move || {
            db.run(|tx| {
                tx.set_log_mode(LogMode::Async);
                tx.put(t, "z", "1")
            })
            .unwrap()
        });
        w.join().unwrap();
        let took = start.elapsed();
        assert_eq!(r.join().unwrap(), Some(b"0".to_vec()));
        assert!(
            took < Duration::from_millis(400),
            "the writer waited {took:?}"
        );
    });
    assert!(ticket.is_durable() || ticket.wait().is_ok());
    assert_eq!(db.admission_stats().unwrap().escaped, 0);
}
