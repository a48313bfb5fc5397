//! The bank invariant: transfers between accounts from many threads never change the total,
//! and concurrent read-only transactions summing all balances (with a scan, and with one
//! point read per account) always see exactly the initial total.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, Error, Table};

use common::{dec, enc, mode_name, modes};

const ACCOUNTS: usize = 50;
const INITIAL: i64 = 1000;
const TOTAL: i64 = ACCOUNTS as i64 * INITIAL;
const TRANSFER_THREADS: usize = 8;
const READER_THREADS: usize = 2;
const DURATION: Duration = Duration::from_millis(1200);

fn acct(i: usize) -> String {
    format!("acct{i:03}")
}

fn setup(o: &shoal::Options) -> (Database, Table) {
    let db = Database::in_memory_with(o.clone());
    let t = db.create_table("accounts").expect("create table");
    db.run(|tx| {
        for i in 0..ACCOUNTS {
            tx.insert(&t, acct(i), enc(INITIAL))?;
        }
        Ok(())
    })
    .expect("create the accounts");
    (db, t)
}

/// The error a transfer with `add_and_get` returns to abort itself on overdraft (not retryable, so
/// `db.run` aborts the transaction, undoing the first `add_and_get`, and returns it).
fn insufficient_funds() -> Error {
    Error::Unsupported("insufficient funds".into())
}

/// How a transfer moves the money.
#[derive(Clone, Copy)]
enum Via {
    /// `get_i64` + `put`, refusing to overdraw (commits without change: `Ok(false)`).
    ReadWrite,
    /// `add_and_get`, aborting (through [`insufficient_funds`]) when the source goes negative.
    Add,
}

/// Moves `amount` from `from` to `to`; `Ok(true)` when it did.
fn transfer(
    tx: &mut shoal::Transaction<'_>,
    t: &Table,
    (from, to): (&str, &str),
    amount: i64,
    via: Via,
) -> shoal::Result<bool> {
    match via {
        Via::ReadWrite => {
            let a = tx.get_i64(t, from)?.expect("account exists");
            if a < amount {
                return Ok(false);
            }
            let b = tx.get_i64(t, to)?.expect("account exists");
            tx.put(t, from, enc(a - amount))?;
            tx.put(t, to, enc(b + amount))?;
        }
        Via::Add => {
            let left = tx.add_and_get(t, from, -amount)?;
            if left < 0 {
                return Err(insufficient_funds());
            }
            tx.add_and_get(t, to, amount)?;
        }
    }
    Ok(true)
}

#[test]
fn bank_transfers_preserve_total_and_readers_see_it() {
    for o in modes() {
        let what = format!("bank [{}]", mode_name(&o));
        let seed = common::seed(&what);
        let (db, t) = setup(&o);
        let transfers = AtomicU64::new(0);
        let refused = AtomicU64::new(0);
        let scan_sums = AtomicU64::new(0);
        let get_sums = AtomicU64::new(0);
        let starved = AtomicU64::new(0);
        let deadline = Instant::now() + DURATION;
        std::thread::scope(|s| {
            for th in 0..TRANSFER_THREADS {
                let (db, t, transfers, refused) = (&db, &t, &transfers, &refused);
                // Optimistic readers of all 50 accounts validate against every transfer
                // that commits meanwhile: unpaced writers on 2 cores starve them (Silo's
                // readers are not protected). Pace the writers under optimistic modes.
                let pace = common::optimistic(&o).then_some(Duration::from_micros(100));
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(th as u64));
                    while Instant::now() < deadline {
                        if let Some(p) = pace {
                            std::thread::sleep(p);
                        }
                        let from = rng.gen_range(0..ACCOUNTS);
                        let to = (from + rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
                        let (from, to) = (acct(from), acct(to));
                        // Large enough amounts that overdrafts happen now and then.
                        let amount = rng.gen_range(1..=600);
                        let via = if rng.gen_bool(0.5) {
                            Via::Add
                        } else {
                            Via::ReadWrite
                        };
                        let res = db.run(|tx| transfer(tx, t, (&from, &to), amount, via));
                        match res {
                            Ok(true) => {
                                transfers.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(false) => {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(Error::Unsupported(m)) if m == "insufficient funds" => {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("transfer {from} -> {to} failed: {e:?}"),
                        }
                    }
                });
            }
            for th in 0..READER_THREADS {
                let (db, t, scan_sums, get_sums) = (&db, &t, &scan_sums, &get_sums);
                let (what, opts, starved) = (&what, &o, &starved);
                // An optimistic reader of all accounts can lose validation to the writers
                // more often than `Database::run` retries (it then returns the retryable
                // error): that is starvation, not a wrong answer; count it and read again.
                let starve = move |e: Error, what_read: &str| {
                    assert!(
                        e.is_retryable() && common::optimistic(opts),
                        "{what}: {what_read}: {e:?}"
                    );
                    starved.fetch_add(1, Ordering::Relaxed);
                };
                s.spawn(move || {
                    let mut n = th;
                    while Instant::now() < deadline {
                        n += 1;
                        if n % 2 == 0 {
                            let rows = match db.run(|tx| tx.scan(t, ..)) {
                                Ok(rows) => rows,
                                Err(e) => {
                                    starve(e, "sum by scan");
                                    continue;
                                }
                            };
                            assert_eq!(rows.len(), ACCOUNTS, "{what}: scan row count");
                            let sum: i64 = rows.iter().map(|(_, v)| dec(v)).sum();
                            assert_eq!(
                                sum, TOTAL,
                                "{what}: a scan summed the balances to {sum}, not {TOTAL}: \
                                 not serializable"
                            );
                            scan_sums.fetch_add(1, Ordering::Relaxed);
                        } else {
                            let balances = match db.run(|tx| {
                                (0..ACCOUNTS)
                                    .map(|i| Ok(tx.get_i64(t, acct(i))?.expect("account exists")))
                                    .collect::<shoal::Result<Vec<i64>>>()
                            }) {
                                Ok(b) => b,
                                Err(e) => {
                                    starve(e, "sum by point reads");
                                    continue;
                                }
                            };
                            let sum: i64 = balances.iter().sum();
                            assert_eq!(
                                sum, TOTAL,
                                "{what}: point reads summed the balances to {sum}, not \
                                 {TOTAL}: not serializable ({balances:?})"
                            );
                            get_sums.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let (transfers, refused) = (transfers.into_inner(), refused.into_inner());
        let (scan_sums, get_sums) = (scan_sums.into_inner(), get_sums.into_inner());
        let starved = starved.into_inner();
        eprintln!(
            "{what}: {transfers} transfers, {refused} refused, {scan_sums} scan sums, \
             {get_sums} point-read sums, {starved} reads starved past the retry limit"
        );
        assert!(transfers > 0, "{what}: no transfer committed");
        assert!(
            scan_sums > 0 && get_sums > 0,
            "{what}: readers made no progress"
        );
        let rows = db.run(|tx| tx.scan(&t, ..)).expect("final scan");
        assert_eq!(
            rows.len(),
            ACCOUNTS,
            "{what}: accounts appeared or vanished"
        );
        let balances: Vec<i64> = rows.iter().map(|(_, v)| dec(v)).collect();
        assert_eq!(
            balances.iter().sum::<i64>(),
            TOTAL,
            "{what}: final total wrong: {balances:?}"
        );
        assert!(
            balances.iter().all(|&b| b >= 0),
            "{what}: an account is overdrawn (an aborted add was not undone?): {balances:?}"
        );
    }
}

/// A refused `add_and_get` transfer is undone: the non-retryable error aborts the transaction.
#[test]
fn bank_aborted_transfer_is_undone() {
    for o in modes() {
        let (db, t) = setup(&o);
        let res = db.run(|tx| transfer(tx, &t, (&acct(0), &acct(1)), INITIAL + 1, Via::Add));
        assert!(
            matches!(res, Err(Error::Unsupported(_))),
            "overdraft refused: {res:?}"
        );
        let a = db.run(|tx| tx.get_i64(&t, acct(0))).expect("read");
        assert_eq!(a, Some(INITIAL), "the aborted add was undone");
        let ok = db
            .run(|tx| transfer(tx, &t, (&acct(0), &acct(1)), INITIAL, Via::Add))
            .expect("transfer all");
        assert!(ok);
        let both = db
            .run(|tx| Ok((tx.get_i64(&t, acct(0))?, tx.get_i64(&t, acct(1))?)))
            .expect("read");
        assert_eq!(both, (Some(0), Some(2 * INITIAL)));
    }
}
