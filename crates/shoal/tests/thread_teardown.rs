//! Transactions run while a thread is being torn down: from the destructor of a thread-local
//! that outlives the engine's own thread-locals (its destructor runs after theirs). A pool
//! that flushes its work when a thread exits does this; the engine must not panic.

use std::cell::RefCell;
use std::sync::Mutex;
use std::time::Duration;

use shoal::doppel::SplitOp;
use shoal::{ConcurrencyControl, Database, LogMode, Options, Table};

/// Runs its transactions when dropped, that is, at thread exit.
struct AtExit(Option<(Database, Table)>);

impl Drop for AtExit {
    fn drop(&mut self) {
        if let Some((db, t)) = self.0.take() {
            // A panic escaping a thread-local's destructor aborts the process: catch it and
            // report it to the test.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for i in 0..20u64 {
                    db.run(|tx| {
                        tx.put(&t, i.to_be_bytes(), b"v")?;
                        tx.add(&t, b"hits", 1)?;
                        let _ = tx.get(&t, 0u64.to_be_bytes())?;
                        let _ = tx.scan(&t, ..)?;
                        Ok(())
                    })
                    .expect("a transaction at thread exit");
                }
                grow(&db, &t, 1000);
            }));
            if let Err(e) = ran {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                PANICS.lock().unwrap().push(msg);
            }
        }
    }
}

/// Values that grow leave holes that their page compacts away.
fn grow(db: &Database, t: &Table, first: u64) {
    for len in (40usize..=96).step_by(8) {
        db.run(|tx| {
            for i in first..first + 300 {
                tx.put(t, i.to_be_bytes(), vec![7u8; len])?;
            }
            Ok(())
        })
        .expect("growing values");
    }
}

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

thread_local! {
    static AT_EXIT: RefCell<AtExit> = const { RefCell::new(AtExit(None)) };
}

fn check(opts: Options, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path(), opts).unwrap();
    let t = db.create_table("t").unwrap();
    if db.options().cc == ConcurrencyControl::Doppel {
        db.split_hint(&t, b"hits", SplitOp::Add).unwrap();
    }
    let (db2, t2) = (db.clone(), t.clone());
    let joined = std::thread::spawn(move || {
        // Registered first, so destroyed last (destructors run in reverse order of
        // registration): the engine's thread-locals, first touched by the transactions
        // below, are gone by the time it runs.
        AT_EXIT.with(|a| a.borrow_mut().0 = Some((db2.clone(), t2.clone())));
        for i in 100..120u64 {
            db2.run(|tx| {
                tx.put(&t2, i.to_be_bytes(), b"w")?;
                tx.add(&t2, b"hits", 1)?;
                let _ = tx.scan(&t2, ..)?;
                Ok(())
            })
            .unwrap();
        }
        grow(&db2, &t2, 2000);
    })
    .join();
    assert!(joined.is_ok(), "{what}");
    let panics = std::mem::take(&mut *PANICS.lock().unwrap());
    assert!(
        panics.is_empty(),
        "{what}: a transaction at thread exit panicked: {panics:?}"
    );
    let n = db.run(|tx| tx.scan(&t, ..)).unwrap().len();
    assert_eq!(n, 641, "{what}");
    assert_eq!(
        db.run(|tx| tx.get_i64(&t, b"hits")).unwrap(),
        Some(40),
        "{what}"
    );
}

#[test]
fn transactions_in_a_thread_local_destructor_run_under_every_protocol() {
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
        ConcurrencyControl::Doppel,
        ConcurrencyControl::Serial,
    ] {
        for log in [LogMode::Sync, LogMode::Async, LogMode::Pipelined] {
            let opts = Options::default()
                .with_cc(cc)
                .with_log(log)
                .with_lock_timeout(Duration::from_secs(5));
            check(opts, &format!("{cc:?} {log:?}"));
        }
    }
}
