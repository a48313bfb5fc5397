//! A small bank on shoal: accounts in a table, concurrent transfers from a few threads with
//! `Database::run` (which retries deadlocks and lock timeouts), and a consistent total.
//!
//! Run it with `cargo run -p shoal --example bank`.

use std::time::Duration;

use shoal::{Database, Error, Options, Table, Transaction};

const ACCOUNTS: u32 = 10;
const INITIAL: i64 = 100;
const THREADS: u32 = 4;
const TRANSFERS_PER_THREAD: u32 = 200;

fn account(i: u32) -> String {
    format!("account-{i:02}")
}

/// Moves `amount` from `from` to `to`; returns `false` (changing nothing) on insufficient
/// funds. Errors from the engine propagate with `?`.
fn transfer(
    tx: &mut Transaction<'_>,
    t: &Table,
    from: &str,
    to: &str,
    amount: i64,
) -> shoal::Result<bool> {
    let balance = tx.get_i64(t, from)?.unwrap_or(0);
    if balance < amount {
        return Ok(false);
    }
    tx.add_and_get(t, from, -amount)?;
    tx.add_and_get(t, to, amount)?;
    Ok(true)
}

fn total(db: &Database, t: &Table) -> shoal::Result<i64> {
    db.run(|tx| {
        let rows = tx.scan(t, ..)?;
        Ok(rows
            .iter()
            .map(|(_, v)| i64::from_le_bytes(v[..8].try_into().expect("8-byte balance")))
            .sum())
    })
}

fn main() -> shoal::Result<()> {
    let db =
        Database::in_memory_with(Options::default().with_lock_timeout(Duration::from_millis(500)));
    let accounts = db.create_table("accounts")?;

    db.run(|tx| {
        for i in 0..ACCOUNTS {
            tx.insert(&accounts, account(i), INITIAL.to_le_bytes())?;
        }
        Ok(())
    })?;
    println!(
        "opened {ACCOUNTS} accounts, total {}",
        total(&db, &accounts)?
    );

    // Concurrent transfers. `db.run` retries the closure on retryable errors (deadlock, lock
    // timeout, conflict), so each thread only sees fatal errors or the final outcome.
    let results: Vec<shoal::Result<(u32, u32)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|th| {
                let (db, accounts) = (&db, &accounts);
                s.spawn(move || -> shoal::Result<(u32, u32)> {
                    let (mut done, mut refused) = (0, 0);
                    for n in 0..TRANSFERS_PER_THREAD {
                        let from = account((th * 7 + n * 3) % ACCOUNTS);
                        let to = account((th * 5 + n * 7 + 1) % ACCOUNTS);
                        if from == to {
                            continue;
                        }
                        let amount = i64::from(n % 50 + 1);
                        if db.run(|tx| transfer(tx, accounts, &from, &to, amount))? {
                            done += 1;
                        } else {
                            refused += 1;
                        }
                    }
                    Ok((done, refused))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("transfer thread panicked"))
            .collect()
    });
    for (th, r) in results.into_iter().enumerate() {
        let (done, refused) = r?;
        println!("thread {th}: {done} transfers, {refused} refused for insufficient funds");
    }

    // Driving a transaction by hand: errors are either retryable (start over) or fatal.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut tx = db.begin();
        match transfer(&mut tx, &accounts, &account(0), &account(1), 1).and_then(|_| tx.commit()) {
            Ok(()) => break,
            Err(e) if e.is_retryable() => {
                eprintln!("attempt {attempts} failed ({e}); retrying");
                continue;
            }
            Err(e) => return Err(e),
        }
    }

    // A fatal error is not retried: an integer operation on a non-integer value.
    let err = db
        .run(|tx| {
            tx.put(&accounts, "note", "not a number")?;
            tx.add_and_get(&accounts, "note", 1)
        })
        .expect_err("adding to text fails");
    assert!(!err.is_retryable());
    assert!(matches!(err, Error::NotAnInteger { .. }));
    println!("fatal error, transaction rolled back: {err}");

    let sum = total(&db, &accounts)?;
    println!("total after the transfers: {sum}");
    assert_eq!(
        sum,
        i64::from(ACCOUNTS) * INITIAL,
        "money was created or destroyed"
    );
    Ok(())
}
