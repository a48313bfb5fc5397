//! The tellers microbenchmark of Kimura et al. 2012 Fig. 6 (experiment E4): every
//! transaction adds 1 to the balances of 5 distinct tellers, taken in canonical (ascending
//! id) order. Lock requests therefore always come in one global order and no true deadlock
//! can form; whatever a deadlock-handling policy aborts (wound-wait, wait-die, no-wait) is a
//! false positive.
//!
//! Table `teller`: `--records` rows (default [`DEFAULT_TELLERS`], the TPC-B tellers of scale
//! 20), 8-byte big-endian ids, 8-byte little-endian balances starting at 0. The tellers are
//! drawn uniformly, or by `--zipf`/`--self-similar`. The consistency check: every teller
//! exists, no balance is negative, and the balances sum to 5 × the commits.

use anyhow::bail;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use shoal::{Database, Table, Transaction};

use super::{Ledger, Load, Workload};
use crate::config::RunConfig;
use crate::dist::{KeyDist, Sampler};

/// Tellers updated by each transaction.
pub const TELLERS_PER_TXN: usize = 5;
/// Tellers loaded unless `--records` says otherwise.
pub const DEFAULT_TELLERS: u64 = 200;
/// Rows per load transaction.
const LOAD_BATCH: u64 = 5_000;

/// The loaded tellers table.
pub struct Tellers {
    teller: Table,
    n: u64,
}

/// A worker's state: its generator and the current transaction's tellers, ascending.
pub struct TellersWorker {
    rng: SmallRng,
    pick: Sampler,
    cur: [u64; TELLERS_PER_TXN],
}

fn key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

impl Workload for Tellers {
    type Worker = TellersWorker;

    fn load(l: Load<'_>) -> anyhow::Result<Tellers> {
        let n = l.cfg.records;
        if n < TELLERS_PER_TXN as u64 {
            bail!("tellers needs at least {TELLERS_PER_TXN} tellers (--records), got {n}");
        }
        let teller = super::create_table(l.db, "teller")?;
        let zero = 0i64.to_le_bytes();
        super::load_ids(
            l.db,
            n,
            LOAD_BATCH,
            l.load_threads,
            l.progress,
            "tellers",
            |tx, id| {
                tx.insert(&teller, key(id), zero)?;
                Ok(1)
            },
        )?;
        Ok(Tellers { teller, n })
    }

    fn worker(&self, cfg: &RunConfig, _run: u16, _thread: u16, seed: u64) -> TellersWorker {
        TellersWorker {
            rng: SmallRng::seed_from_u64(seed),
            pick: cfg.dist.unwrap_or(KeyDist::Uniform).over(self.n),
            cur: [0; TELLERS_PER_TXN],
        }
    }

    fn next(&self, w: &mut TellersWorker) {
        let mut n = 0;
        while n < TELLERS_PER_TXN {
            let t = w.pick.sample(&mut w.rng).min(self.n - 1);
            if !w.cur[..n].contains(&t) {
                w.cur[n] = t;
                n += 1;
            }
        }
        w.cur.sort_unstable();
    }

    fn execute(&self, w: &TellersWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        for &t in &w.cur {
            tx.add_and_get(&self.teller, key(t), 1)?;
        }
        Ok(())
    }

    fn committed(&self, _w: &mut TellersWorker) {}

    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String> {
        let mut sum: i128 = 0;
        super::ops::scan_counted(db, &self.teller, "teller", self.n, &mut |k, v| {
            let bal = <[u8; 8]>::try_from(v)
                .map(i64::from_le_bytes)
                .map_err(|_| anyhow::anyhow!("teller {k:?}: value of {} bytes", v.len()))?;
            if bal < 0 {
                bail!("teller {k:?} has a negative balance {bal}");
            }
            sum += i128::from(bal);
            Ok(())
        })?;
        let want = i128::from(ledger.total()) * TELLERS_PER_TXN as i128;
        if sum != want {
            bail!(
                "teller balances sum to {sum}, expected {want} ({} commits × {TELLERS_PER_TXN})",
                ledger.total()
            );
        }
        Ok(format!(
            "{} tellers sum to {sum} = {TELLERS_PER_TXN} × {} commits",
            self.n,
            ledger.total()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Value;
    use crate::workloads::testutil::{config, run_txns};

    #[test]
    fn canonical_order_and_consistent_sums() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::open(dir.path(), shoal::Options::default()).unwrap();
        let cfg = config("tellers", &[("records", Value::Int(20))]);
        let w = crate::workloads::testutil::load::<Tellers>(&db, &cfg, 1);
        let mut st = w.worker(&cfg, 0, 0, 7);
        for _ in 0..100 {
            w.next(&mut st);
            assert!(st.cur.windows(2).all(|p| p[0] < p[1]), "{:?}", st.cur);
            assert!(st.cur.iter().all(|&t| t < 20));
        }
        let ledger = run_txns(&w, &db, &cfg, 200);
        let msg = w.check(&db, &ledger).unwrap();
        assert!(msg.contains("2000"), "{msg}");
        assert!(w.check(&db, &Ledger::default()).is_err());
    }
}
