//! The Shore-MT insert microbenchmark (Johnson et al. 2009 §3.2): each worker thread inserts
//! records into its own table, committing every 1,000 records, so threads share no data and
//! any loss of per-thread throughput comes from the engine (log, lock manager, latches).
//!
//! One harness "transaction" is one commit of [`RECORDS_PER_COMMIT`] inserts, so records per
//! second = tps × 1,000. Worker `t` of the `r`-th run on a database inserts into table
//! `insert_r_t` (created when the worker is), keys its records with its sequence number as a
//! u64 big-endian (ascending: appends at the end of the table's index) and writes a
//! [`VALUE_LEN`]-byte value. Nothing is loaded. The consistency check counts every table's
//! records: 1,000 per commit of its thread, keys exactly `0..n`.

use std::sync::Mutex;

use anyhow::{bail, Context};
use shoal::{Database, Table, Transaction};

use super::{Ledger, Load, Workload};
use crate::config::RunConfig;

/// Records inserted per commit.
pub const RECORDS_PER_COMMIT: u64 = 1_000;
/// Bytes per record value.
pub const VALUE_LEN: usize = 100;
/// Records per transaction of the consistency check's scans.
const CHECK_CHUNK: u64 = 100_000;

/// The insert microbenchmark on one database.
pub struct Insert {
    db: Database,
    /// Tables created so far: (run, thread, table).
    tables: Mutex<Vec<(u16, u16, Table)>>,
}

/// A worker thread's state: its table and the next record number.
pub struct InsertWorker {
    table: Table,
    next: u64,
}

fn table_name(run: u16, thread: u16) -> String {
    format!("insert_{run}_{thread}")
}

impl Workload for Insert {
    type Worker = InsertWorker;

    fn rows(_cfg: &RunConfig) -> u64 {
        0
    }

    fn load(l: Load<'_>) -> anyhow::Result<Insert> {
        Ok(Insert {
            db: l.db.clone(),
            tables: Mutex::new(Vec::new()),
        })
    }

    fn worker(&self, _cfg: &RunConfig, run: u16, thread: u16, _seed: u64) -> InsertWorker {
        let table = self
            .db
            .create_table(&table_name(run, thread))
            .or_else(|_| self.db.table(&table_name(run, thread)))
            .expect("creating an insert table");
        self.tables
            .lock()
            .unwrap()
            .push((run, thread, table.clone()));
        InsertWorker { table, next: 0 }
    }

    fn next(&self, _w: &mut InsertWorker) {}

    fn execute(&self, w: &InsertWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        let mut value = [b'v'; VALUE_LEN];
        for n in w.next..w.next + RECORDS_PER_COMMIT {
            value[..8].copy_from_slice(&n.to_le_bytes());
            tx.insert(&w.table, n.to_be_bytes(), value)?;
        }
        Ok(())
    }

    fn committed(&self, w: &mut InsertWorker) {
        w.next += RECORDS_PER_COMMIT;
    }

    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String> {
        let tables = self.tables.lock().unwrap();
        let mut total = 0u64;
        for (run, thread, table) in tables.iter() {
            let commits = ledger
                .commits
                .get(usize::from(*run))
                .and_then(|r| r.get(usize::from(*thread)))
                .copied()
                .unwrap_or(0);
            let want = commits * RECORDS_PER_COMMIT;
            let mut seen = 0u64;
            let mut lo = 0u64;
            loop {
                let hi = lo + CHECK_CHUNK;
                let upper = if hi > want {
                    std::ops::Bound::Unbounded
                } else {
                    std::ops::Bound::Excluded(hi.to_be_bytes().to_vec())
                };
                let rows = db
                    .run(|tx| {
                        tx.scan(
                            table,
                            (
                                std::ops::Bound::Included(lo.to_be_bytes().to_vec()),
                                upper.clone(),
                            ),
                        )
                    })
                    .with_context(|| format!("scanning {}", table.name()))?;
                for (k, v) in &rows {
                    let n = <[u8; 8]>::try_from(k.as_slice())
                        .map(u64::from_be_bytes)
                        .ok();
                    if n != Some(seen) || v.len() != VALUE_LEN {
                        bail!(
                            "{}: record {seen} expected, found key {k:02x?} ({} bytes)",
                            table.name(),
                            v.len()
                        );
                    }
                    seen += 1;
                }
                if hi > want {
                    break;
                }
                lo = hi;
            }
            if seen != want {
                bail!(
                    "{}: {seen} records but {commits} commits of {RECORDS_PER_COMMIT}",
                    table.name()
                );
            }
            total += seen;
        }
        Ok(format!(
            "{} tables hold {total} records = 1,000 per commit",
            tables.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_commit_in_thousands_and_check_counts_them() {
        let db = Database::in_memory();
        let cfg = crate::harness::plan(&crate::sweep::Sweep {
            axes: vec![
                crate::sweep::Axis::new("scale", true, [1u64]),
                crate::sweep::Axis::new("cc", true, [crate::config::Cc::TwoPl]),
                crate::sweep::Axis::new("log", true, [crate::config::Log::None]),
                crate::sweep::Axis::new("threads", false, [2u64]),
                crate::sweep::Axis::new("read-ratio", false, [0.0]),
                crate::sweep::Axis::new("seed", false, [1u64]),
            ],
        })
        .unwrap()
        .runs
        .remove(0)
        .0;
        let ins = crate::workloads::testutil::load::<Insert>(&db, &cfg, 1);
        let mut w0 = ins.worker(&cfg, 0, 0, 0);
        let mut w1 = ins.worker(&cfg, 0, 1, 0);
        for (w, n) in [(&mut w0, 3), (&mut w1, 1)] {
            for _ in 0..n {
                ins.next(w);
                let mut tx = db.begin();
                ins.execute(w, &mut tx).unwrap();
                tx.commit().unwrap();
                ins.committed(w);
            }
        }
        let ledger = Ledger {
            by_kind: Vec::new(),
            commits: vec![vec![3, 1]],
        };
        let s = ins.check(&db, &ledger).unwrap();
        assert!(s.contains("4000 records"), "{s}");
        let bad = Ledger {
            by_kind: Vec::new(),
            commits: vec![vec![2, 1]],
        };
        assert!(ins.check(&db, &bad).is_err());
    }
}
