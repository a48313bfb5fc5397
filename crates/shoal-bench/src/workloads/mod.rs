//! Workloads the harness can run. Each one loads its tables, generates transactions for the
//! worker threads and checks its consistency invariants after a run.

pub mod doppel_args;
pub mod incr;
pub mod insert;
pub mod intents;
pub mod keyrange;
pub mod like;
#[cfg_attr(not(test), allow(dead_code))]
pub mod lockexp;
pub mod ops;
pub mod rubis;
pub mod tellers;
pub mod tpcb;
pub mod tpcc;
pub mod txbench;
pub mod ycsb;

use anyhow::Context;
use shoal::{Database, Table, Transaction};

use crate::config::RunConfig;

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
    /// Kimura et al. 2012 Fig. 6 (E4): each transaction adds 1 to 5 distinct tellers in
    /// ascending order (no true deadlock); `--records` tellers (default 200).
    Tellers,
    /// Doppel's INCR1 (thesis §7.2): `--records` counters (default 1,000,000), one hot; a
    /// share `--hot-fraction` of the transactions ADD 1 to the hot one, the rest to a
    /// uniformly chosen other one.
    Incr1,
    /// Doppel's INCRZ (thesis §7.4): each transaction ADDs 1 to one of `--records` counters
    /// chosen Zipfian(`--alpha`).
    Incrz,
    /// Doppel's LIKE (thesis §7.5): users (uniform) like pages (Zipfian `--alpha`); a share
    /// `--write-fraction` writes (PUT the user's last like, ADD the page's count), the rest
    /// read both.
    Like,
    /// RUBiS bidding mix (thesis §6.1, §7.8): `--variant b` (15% read-write) or `c` (50%
    /// StoreBid); items chosen Zipfian(`--alpha`); StoreBid as in the thesis' Fig. 6-2.
    Rubis,
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
            WorkloadKind::Tellers => "tellers",
            WorkloadKind::Incr1 => "incr1",
            WorkloadKind::Incrz => "incrz",
            WorkloadKind::Like => "like",
            WorkloadKind::Rubis => "rubis",
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

/// Loads rows `0..n` in transactions of `chunk` ids spread over up to `threads` threads
/// ([`parallel_load`]): `row(tx, id)` inserts what id `id` stands for and returns how many
/// rows that was (for `progress`). `what` names the rows in errors.
pub fn load_ids(
    db: &Database,
    n: u64,
    chunk: u64,
    threads: usize,
    progress: &indicatif::ProgressBar,
    what: &str,
    row: impl Fn(&mut Transaction<'_>, u64) -> shoal::Result<u64> + Sync,
) -> anyhow::Result<()> {
    let starts: Vec<u64> = (0..n).step_by(usize::try_from(chunk.max(1))?).collect();
    parallel_load(&starts, threads, progress, |&lo| {
        let hi = (lo + chunk).min(n);
        db.run(|tx| (lo..hi).try_fold(0, |rows, id| Ok(rows + row(tx, id)?)))
            .with_context(|| format!("loading {what} {lo}..{hi}"))
    })
}

/// Creates the table `name` in the database the harness opened empty for the workload.
pub fn create_table(db: &Database, name: &str) -> anyhow::Result<Table> {
    db.create_table(name)
        .with_context(|| format!("creating table {name} (is the database empty?)"))
}

/// Ends a consistency check of `what` (`TPC-B`, ...): an error listing the first ten of the
/// `bad` findings, if there are any.
pub fn fail_if_bad(what: &str, mut bad: Vec<String>) -> anyhow::Result<()> {
    if bad.is_empty() {
        return Ok(());
    }
    let n = bad.len();
    bad.truncate(10);
    anyhow::bail!(
        "{what} consistency check failed ({n} problems):\n  {}",
        bad.join("\n  ")
    )
}

/// How many transactions each worker thread committed in each run on one loaded database
/// (warm-up included): `commits[run][thread]`. Consistency checks compare the data against it.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Commits per run on this database, per thread of that run.
    pub commits: Vec<Vec<u64>>,
    /// Commits per run on this database, per transaction type ([`Workload::kinds`] order),
    /// warm-up included; empty where not counted (a check then skips what needs it).
    pub by_kind: Vec<Vec<u64>>,
}

impl Ledger {
    /// All commits recorded.
    pub fn total(&self) -> u64 {
        self.commits.iter().flatten().sum()
    }
}

/// What [`Workload::load`] loads into and how.
#[derive(Clone, Copy)]
pub struct Load<'a> {
    /// The empty database to create the workload's tables in.
    pub db: &'a Database,
    /// The run configuration (its database-changing options decide what is loaded).
    pub cfg: &'a RunConfig,
    /// Threads the load may use.
    pub load_threads: usize,
    /// Advanced by the rows loaded.
    pub progress: &'a indicatif::ProgressBar,
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

    /// Rows [`load`](Self::load) inserts for `cfg` (for the progress bar). Default: `--records`.
    fn rows(cfg: &RunConfig) -> u64 {
        cfg.records
    }

    /// Creates the workload's tables in the empty database and loads them (see [`Load`]).
    fn load(l: Load<'_>) -> anyhow::Result<Self>;

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

    /// Doppel: a copy of `w` holding the current transaction's inputs, taken when the
    /// transaction was stashed, so the worker can go on with new transactions and re-run the
    /// copy in a later joined phase (thesis §3.3). It must leave `w` ready for
    /// [`next`](Self::next), with any unique ids the copy will use reserved. `None` (the
    /// default) makes the worker wait for the joined phase instead.
    fn save(&self, _w: &mut Self::Worker) -> Option<Self::Worker> {
        None
    }

    /// `--cc atomic`: performs the current transaction as plain atomic memory operations
    /// without a transaction (Doppel thesis §7.2's upper bound). Returns `false` if the
    /// workload has no such form (the default).
    fn execute_atomic(&self, _w: &Self::Worker) -> bool {
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
    use crate::sweep::Value;

    /// A 2PL, unlogged, two-thread run configuration with the `extra` options.
    pub fn config(_workload: &str, extra: &[(&'static str, Value)]) -> RunConfig {
        RunConfig::for_test("2pl", extra)
    }

    /// A run configuration of concurrency control `cc` (two threads, no log) with the
    /// `extra` options.
    pub fn config_cc(cc: &str, extra: &[(&'static str, Value)]) -> RunConfig {
        RunConfig::for_test(cc, extra)
    }

    /// Loads `W` for `cfg` into `db` with `load_threads` threads and no progress bar.
    pub fn load<W: Workload>(db: &Database, cfg: &RunConfig, load_threads: usize) -> W {
        let progress = &indicatif::ProgressBar::hidden();
        W::load(Load {
            db,
            cfg,
            load_threads,
            progress,
        })
        .expect("load")
    }

    /// An in-memory database with `cfg`'s options; Doppel phases shortened to 2 ms.
    pub fn open(cfg: &RunConfig) -> Database {
        let mut o = cfg.options.clone();
        o.doppel.split_phase = std::time::Duration::from_millis(2);
        Database::in_memory_with(o)
    }

    /// [`run_txns`] under Doppel's split phases: on a Doppel database, `hint` first names the
    /// keys to split and the run starts once (within 2 s) a split phase has begun, and the run
    /// must have seen split phases with at least `min_split` keys split; returns the ledger
    /// and, on a Doppel database, the runtime's counters afterwards.
    pub fn run_split<W: Workload>(
        w: &W,
        db: &Database,
        cfg: &RunConfig,
        n: u64,
        min_split: usize,
        hint: impl FnOnce(&W),
    ) -> (Ledger, Option<shoal::DoppelStats>) {
        if db.doppel_stats().is_some() {
            hint(w);
            let t0 = std::time::Instant::now();
            while db.doppel_stats().is_some_and(|s| s.split_phases == 0)
                && t0.elapsed() < std::time::Duration::from_secs(2)
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let ledger = run_txns(w, db, cfg, n);
        let stats = db.doppel_stats();
        if let Some(s) = &stats {
            assert!(s.split_phases > 0 && s.max_split_keys >= min_split, "{s:?}");
        }
        (ledger, stats)
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
            by_kind: Vec::new(),
        }
    }
}
