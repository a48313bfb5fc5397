//! What admission control costs when it has nothing to do: the same small update transaction
//! (two integer adds, TPC-B-like keys) on one and on two threads, against a database with
//! `Admission::Off` and one with `Admission::Auto`, in alternating rounds inside one process
//! (the machine's speed drifts between minutes, so only a ratio measured this way means
//! anything). Prints the mean throughput of each and the ratios auto/off.
//!
//! ```sh
//! cargo run --release -p shoal --example admission_overhead
//! ```

use std::time::Instant;

use shoal::{Admission, Database, Options, Table};

const ROUNDS: usize = 16;
const TXNS: u64 = 100_000;

/// Runs `TXNS` transactions on each of `threads` threads; returns transactions per second.
fn round(db: &Database, t: &Table, threads: u64) -> shoal::Result<f64> {
    let start = Instant::now();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|th| {
                s.spawn(move || -> shoal::Result<()> {
                    let mut x = th * 7919 + 1;
                    for _ in 0..TXNS {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let account = (x >> 33) % 100_000;
                        let teller = 1_000_000 + (x >> 20) % 200;
                        db.run(|tx| {
                            tx.add_and_get(t, account.to_be_bytes(), 1)?;
                            tx.add_and_get(t, teller.to_be_bytes(), 1)?;
                            Ok(())
                        })?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or(Ok(())))
    })?;
    Ok((threads * TXNS) as f64 / start.elapsed().as_secs_f64())
}

fn main() -> shoal::Result<()> {
    let open = |admission| -> shoal::Result<(Database, Table)> {
        let db = Database::in_memory_with(Options::default().with_admission(admission));
        let t = db.create_table("t")?;
        Ok((db, t))
    };
    let (off, t_off) = open(Admission::Off)?;
    let (auto, t_auto) = open(Admission::Auto)?;
    for threads in [1, 2] {
        let (mut sum_off, mut sum_auto) = (0.0, 0.0);
        let mut ratios = Vec::with_capacity(ROUNDS);
        for r in 0..ROUNDS {
            // Alternate which goes first.
            let (o, a) = if r % 2 == 0 {
                let o = round(&off, &t_off, threads)?;
                (o, round(&auto, &t_auto, threads)?)
            } else {
                let a = round(&auto, &t_auto, threads)?;
                (round(&off, &t_off, threads)?, a)
            };
            sum_off += o;
            sum_auto += a;
            ratios.push(a / o);
        }
        ratios.sort_by(f64::total_cmp);
        let median = (ratios[ROUNDS / 2 - 1] + ratios[ROUNDS / 2]) / 2.0;
        println!(
            "threads={threads} rounds={ROUNDS}: off {:.0} tps, auto {:.0} tps, \
             auto/off {:.3} (median of rounds {median:.3}, min {:.3}, max {:.3})",
            sum_off / ROUNDS as f64,
            sum_auto / ROUNDS as f64,
            sum_auto / sum_off,
            ratios[0],
            ratios[ROUNDS - 1],
        );
    }
    Ok(())
}
