//! Intent-lock-only transactions (Kimura et al. 2012 §6.3, Fig. 4; experiment E2).
//!
//! Four empty tables, named after TPC-B's (`branch`, `teller`, `account`, `history`), and the
//! database. A transaction takes intent locks on all four tables (and so on the database) with
//! [`Transaction::lock_table`] and commits, touching no key: half of the transactions take IS,
//! half IX. With `--absolute-locks N`, N transactions per million instead take an absolute lock:
//! one in four an X lock on the whole database, the others an X lock on one random table (with
//! IX on the database). So the run measures only the cost of intent locks: lightweight intent
//! locks (`--intent-locks lil`) against intent locks in the lock table (`--intent-locks
//! table`).
//!
//! The consistency check takes an X lock on the database in a fresh transaction: it succeeds
//! only if every transaction released its intent locks.

use anyhow::Context;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, LockMode, Table, Transaction};

use super::{Ledger, Load, Workload};
use crate::config::RunConfig;

/// The tables' names.
pub const TABLES: [&str; 4] = ["branch", "teller", "account", "history"];

/// A loaded (empty) intent-lock database.
pub struct Intents {
    tables: Vec<Table>,
}

/// What one transaction locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntentTxn {
    /// IS on every table.
    Read,
    /// IX on every table.
    Write,
    /// X on one table.
    TableX(usize),
    /// X on the database.
    DatabaseX,
}

/// A worker thread's state.
pub struct IntentsWorker {
    rng: SmallRng,
    /// Absolute-lock transactions per million.
    absolute_per_million: u64,
    cur: IntentTxn,
}

/// `--absolute-locks` of a run (0 when absent).
pub fn absolute_per_million(cfg: &RunConfig) -> u64 {
    cfg.absolute_locks.min(1_000_000)
}

impl Workload for Intents {
    type Worker = IntentsWorker;

    fn rows(_cfg: &RunConfig) -> u64 {
        0
    }

    fn load(l: Load<'_>) -> anyhow::Result<Intents> {
        let tables = TABLES
            .iter()
            .map(|n| super::create_table(l.db, n))
            .collect::<anyhow::Result<_>>()?;
        Ok(Intents { tables })
    }

    fn worker(&self, cfg: &RunConfig, _run: u16, _thread: u16, seed: u64) -> IntentsWorker {
        IntentsWorker {
            rng: SmallRng::seed_from_u64(seed),
            absolute_per_million: absolute_per_million(cfg),
            cur: IntentTxn::Read,
        }
    }

    fn next(&self, w: &mut IntentsWorker) {
        w.cur = if w.absolute_per_million > 0
            && w.rng.gen_range(0..1_000_000) < w.absolute_per_million
        {
            if w.rng.gen_range(0..4) == 0 {
                IntentTxn::DatabaseX
            } else {
                IntentTxn::TableX(w.rng.gen_range(0..self.tables.len()))
            }
        } else if w.rng.gen_bool(0.5) {
            IntentTxn::Read
        } else {
            IntentTxn::Write
        };
    }

    fn execute(&self, w: &IntentsWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        match w.cur {
            IntentTxn::Read | IntentTxn::Write => {
                let mode = if w.cur == IntentTxn::Read {
                    LockMode::IS
                } else {
                    LockMode::IX
                };
                for t in &self.tables {
                    tx.lock_table(t, mode)?;
                }
                Ok(())
            }
            IntentTxn::TableX(t) => tx.lock_table(&self.tables[t], LockMode::X),
            IntentTxn::DatabaseX => tx.lock_database(LockMode::X),
        }
    }

    fn committed(&self, _w: &mut IntentsWorker) {}

    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String> {
        db.run(|tx| tx.lock_database(LockMode::X))
            .context("an X lock on the database after the run (an intent lock leaked?)")?;
        Ok(format!(
            "no intent lock left behind after {} commits",
            ledger.total()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::engine::Setting;
    use crate::sweep::Value;
    use crate::workloads::testutil::{config, run_txns};

    #[test]
    fn runs_and_checks() {
        for il in ["lil", "table"] {
            let cfg = config(
                "intents",
                &[
                    ("intent-locks", Setting::value("intent-locks", il)),
                    ("absolute-locks", Value::Int(100_000)),
                    ("lock-timeout", Setting::value("lock-timeout", "20ms")),
                ],
            );
            let db = Database::in_memory_with(cfg.options.clone());
            let w = crate::workloads::testutil::load::<Intents>(&db, &cfg, 1);
            let ledger = run_txns(&w, &db, &cfg, 300);
            w.check(&db, &ledger).unwrap();
            // A leaked IX blocks the database X lock of the check.
            let mut tx = db.begin();
            tx.lock_table(&w.tables[0], LockMode::IX).unwrap();
            let mut other = db.begin();
            assert!(other.lock_table(&w.tables[0], LockMode::S).is_err());
            drop(other);
            tx.commit().unwrap();
        }
    }

    #[test]
    fn draws_absolute_locks_at_the_given_rate() {
        let cfg = config("intents", &[("absolute-locks", Value::Int(250_000))]);
        let db = Database::in_memory_with(cfg.options.clone());
        let w = crate::workloads::testutil::load::<Intents>(&db, &cfg, 1);
        let mut st = w.worker(&cfg, 0, 0, 3);
        let mut abs = 0;
        for _ in 0..4_000 {
            w.next(&mut st);
            abs += u32::from(matches!(
                st.cur,
                IntentTxn::TableX(_) | IntentTxn::DatabaseX
            ));
        }
        assert!((800..1_200).contains(&abs), "{abs}");
    }
}
