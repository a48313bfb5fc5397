//! Workloads the harness can run. Each one loads its tables, generates transactions for the
//! worker threads and checks its consistency invariants after a run.

pub mod insert;
pub mod intents;
pub mod keyrange;
#[cfg_attr(not(test), allow(dead_code))]
pub mod lockexp;
pub mod tpcb;
pub mod tpcc;
pub mod txbench;
pub mod ycsb;

use shoal::{Database, Transaction};

use crate::harness::RunConfig;

/// Which workload `shoal bench` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadKind {
    /// TPC-B: branches, tellers, accounts and a history table; each transaction moves a
    /// random delta through one account, its teller and the teller's branch.
    Tpcb,
    /// YCSB core workloads A-F (`--mix a,b,...`) on one table of `--records` records.
    Ycsb,
    /// Kimura et al.'s key-range locking microbenchmark (E1): four range searches and one
    /// update on a small table; `--existing-endpoints P`, `--key-range-modes`.
    Keyrange,
    /// TPC-C: W warehouses (`--warehouses`), the five transactions in the specification's
    /// mix or one alone (`--mix`), consistency conditions 1-4 checked after each run.
    Tpcc,
    /// The Shore-MT insert microbenchmark: each thread inserts into its own table,
    /// committing every 1,000 records (one commit = one transaction in the results).
    Insert,
    /// txbench (Jung et al. 2013 §5.1.2): range scans of `--rows-per-scan` rows over three
    /// tables, a share (`--update-fraction`) of them followed by updates of the next table.
    Txbench,
    /// Intent-lock-only transactions (Kimura et al. 2012 Fig. 4): IS or IX on four tables,
    /// `--absolute-locks` per million take X on a table or the database.
    Intents,
    /// INCR1 (Doppel): one ADD(k, 1) per transaction on `--records` counters, on the one hot
    /// key with probability `--hot-fraction`. Portable path only (`--engine`, see
    /// `src/portable/incr.rs`).
    Incr1,
}

impl WorkloadKind {
    /// The name used on the command line and in JSON records.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Tpcb => "tpcb",
            WorkloadKind::Ycsb => "ycsb",
            WorkloadKind::Keyrange => "keyrange",
            WorkloadKind::Tpcc => "tpcc",
            WorkloadKind::Insert => "insert",
            WorkloadKind::Txbench => "txbench",
            WorkloadKind::Intents => "intents",
            WorkloadKind::Incr1 => "incr1",
        }
    }
}

/// Runs `load(item)` for every item of `items` on up to `threads` threads (each thread takes
/// the next unclaimed item), and advances `progress` by what each call returns (rows loaded).
/// Stops at the first error.
pub fn parallel_load<T: Sync>(
    items: &[T],
    threads: usize,
    progress: &indicatif::ProgressBar,
    load: impl Fn(&T) -> anyhow::Result<u64> + Sync,
) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..threads.clamp(1, items.len().max(1)))
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    while !failed.load(Ordering::Relaxed) {
                        let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            return Ok(());
                        };
                        match load(item) {
                            Ok(n) => progress.inc(n),
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
        }
        Ok(())
    })
}

/// How many transactions each worker thread committed in each run on one loaded database
/// (warm-up included): `commits[run][thread]`. Consistency checks compare the data against it.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Commits per run on this database, per thread of that run.
    pub commits: Vec<Vec<u64>>,
}

impl Ledger {
    /// All commits recorded.
    pub fn total(&self) -> u64 {
        self.commits.iter().flatten().sum()
    }
}

/// A loaded workload: the transaction generator and the consistency check.
///
/// The harness calls, per worker thread, [`worker`](Workload::worker) once, then for every
/// transaction [`next`](Workload::next) to draw its inputs, [`execute`](Workload::execute) (again
/// with the same inputs after each retryable abort), and [`committed`](Workload::committed) once
/// it commits.
pub trait Workload: Sync + Sized {
    /// Per-thread state: random generator, current inputs, sequence numbers.
    type Worker: Send;

    /// Rows [`load`](Self::load) inserts for `cfg` (for the progress bar).
    fn rows(cfg: &RunConfig) -> u64;

    /// Creates the workload's tables in the empty database `db` and loads them for `cfg`
    /// (its database-changing options), using up to `load_threads` threads. Advances
    /// `progress` by the rows loaded.
    fn load(
        db: &Database,
        cfg: &RunConfig,
        load_threads: usize,
        progress: &indicatif::ProgressBar,
    ) -> anyhow::Result<Self>;

    /// State for worker `thread` of the `run`-th run on this database.
    fn worker(&self, cfg: &RunConfig, run: u16, thread: u16, seed: u64) -> Self::Worker;

    /// Draws the inputs of the next transaction.
    fn next(&self, w: &mut Self::Worker);

    /// Performs the current transaction's operations in `tx` (the harness commits).
    fn execute(&self, w: &Self::Worker, tx: &mut Transaction<'_>) -> shoal::Result<()>;

    /// The current transaction committed.
    fn committed(&self, w: &mut Self::Worker);

    /// Names of the workload's transaction types, for per-type statistics. The default is a
    /// single type, `txn`.
    fn kinds(&self) -> &'static [&'static str] {
        &["txn"]
    }

    /// The type of the current transaction: an index into [`kinds`](Self::kinds).
    fn kind(&self, _w: &Self::Worker) -> usize {
        0
    }

    /// Whether the current transaction, once [`execute`](Self::execute) returned `Ok`, must
    /// be rolled back instead of committed (TPC-C NewOrder's 1% invalid item). The harness
    /// aborts it, counts it as an expected rollback (not a failure) and does not retry it;
    /// [`committed`](Self::committed) is not called.
    fn rollback(&self, _w: &Self::Worker) -> bool {
        false
    }

    /// Checks the workload's invariants on a quiescent database; `ledger` holds every commit
    /// made on it. Returns a one-line summary, or an error describing the violation.
    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String>;
}

/// Helpers for the workloads' unit tests.
#[cfg(test)]
pub(crate) mod testutil {
    use super::*;
    use crate::sweep::{Point, Value};

    /// A 2PL, unlogged, one-thread run configuration of `workload` with the `extra` options.
    pub fn config(workload: &str, extra: &[(&'static str, Value)]) -> RunConfig {
        let _ = workload;
        let mut p = vec![
            ("scale", Value::Int(1)),
            ("cc", Value::from("2pl")),
            ("log", Value::from("none")),
            ("threads", Value::Int(2)),
            ("read-ratio", Value::Float(0.0)),
            ("seed", Value::Int(42)),
        ];
        p.extend(extra.iter().cloned());
        RunConfig::from_point(&Point(p)).expect("valid test configuration")
    }

    /// Runs `n` transactions on each of two threads, retrying retryable aborts; returns the
    /// ledger of commits.
    pub fn run_txns<W: Workload>(w: &W, db: &Database, cfg: &RunConfig, n: u64) -> Ledger {
        let per_thread = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2u16)
                .map(|t| {
                    let mut st = w.worker(cfg, 0, t, cfg.thread_seed(t.into()));
                    s.spawn(move || {
                        for _ in 0..n {
                            w.next(&mut st);
                            loop {
                                let mut tx = db.begin();
                                let r = w.execute(&st, &mut tx).and_then(|()| tx.commit());
                                match r {
                                    Ok(()) => break,
                                    Err(e) if e.is_retryable() => std::thread::yield_now(),
                                    Err(e) => panic!("fatal: {e}"),
                                }
                            }
                            w.committed(&mut st);
                        }
                        n
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        Ledger {
            commits: vec![per_thread],
        }
    }
}
