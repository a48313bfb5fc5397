//! Portable TPC-B: the transaction of `src/workloads/tpcb.rs` at read ratio 0, its body
//! ([`Tables::execute`]), its inputs ([`draw`], tellers uniform) and its history rows
//! ([`HistoryRow`], keyed by thread and run-tagged sequence) shared with the shoal-native
//! variant, on tables of the engine-neutral interface. Scale `B`: `B` branches, `10·B`
//! tellers, `100,000·B` accounts, balances 0, keys 8-byte big-endian ids. Each transaction
//! picks a teller uniformly (its branch is the teller's), an account of that branch with 85%
//! probability or of another branch otherwise, a delta uniform in [-99999, 99999], adds the
//! delta to the account, the teller and the branch (in that order) and inserts a 50-byte
//! history row.
//!
//! The check: history rows = commits so far (warm-up included), every balance = the sum of the
//! history deltas that updated it, and sum(branch) = sum(teller) = sum(account) = sum(deltas).

use anyhow::{bail, ensure};
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::{LoadCfg, PortableWorkload, RunCfg};
use crate::dist::{KeyDist, Sampler};
use crate::engines::{decode_i64, load_rows, KvEngine, KvTx, LoadValue, TableId, TxResult};
use crate::workloads::tpcb::{
    draw, history_key, id_key, HistoryRow, Tables, ACCOUNTS_PER_BRANCH as ACCOUNTS, FLAG_ALL,
    TELLERS_PER_BRANCH as TELLERS,
};

/// A loaded TPC-B database.
pub struct Tpcb {
    scale: u64,
    tables: Tables<TableId>,
}

/// A worker's state.
pub struct Worker {
    rng: SmallRng,
    tellers: Sampler,
    thread: u16,
    seq: u64,
    cur: HistoryRow,
}

fn key_id(k: &[u8]) -> anyhow::Result<u64> {
    let b: [u8; 8] = k.try_into().map_err(|_| anyhow::anyhow!("bad key {k:?}"))?;
    Ok(u64::from_be_bytes(b))
}

impl PortableWorkload for Tpcb {
    type Worker = Worker;

    fn load(engine: &dyn KvEngine, cfg: &LoadCfg) -> anyhow::Result<Self> {
        let b = cfg.scale.max(1);
        let w = Tpcb {
            scale: b,
            tables: Tables {
                branch: engine.create_table("branch")?,
                teller: engine.create_table("teller")?,
                account: engine.create_table("account")?,
                history: engine.create_table("history")?,
            },
        };
        let mut s = engine.session()?;
        let (br, te, ac) = (w.tables.branch, w.tables.teller, w.tables.account);
        let row = |t: TableId| move |i: u64| (t, id_key(i).to_vec(), LoadValue::Int(0));
        let mut rows = (0..b)
            .map(row(br))
            .chain((0..b * TELLERS).map(row(te)))
            .chain((0..b * ACCOUNTS).map(row(ac)));
        load_rows(s.as_mut(), &mut rows, 10_000)?;
        Ok(w)
    }

    fn rows(&self) -> u64 {
        self.scale * (1 + TELLERS + ACCOUNTS)
    }

    fn worker(&self, run: &RunCfg, thread: u16, seed: u64) -> Worker {
        Worker {
            rng: SmallRng::seed_from_u64(seed),
            tellers: KeyDist::Uniform.over(self.scale * TELLERS),
            thread,
            // The run number in the top 16 bits, as the shoal-native variant's keys.
            seq: u64::from(run.run) << 48,
            cur: HistoryRow::default(),
        }
    }

    fn next(&self, st: &mut Worker) {
        st.cur = draw(self.scale, &st.tellers, &mut st.rng, 0.0);
    }

    fn read_only(&self, _st: &Worker) -> bool {
        false
    }

    fn execute(&self, st: &mut Worker, tx: &mut dyn KvTx) -> TxResult<()> {
        let key = history_key(st.thread, st.seq);
        self.tables.execute(tx, &st.cur, false, &key)
    }

    fn committed(&self, st: &mut Worker) -> [u64; 2] {
        st.seq += 1;
        [1, 0]
    }

    fn check(&self, engine: &dyn KvEngine, tally: [u64; 2]) -> anyhow::Result<String> {
        let b = self.scale;
        let mut want_a = vec![0i64; usize::try_from(b * ACCOUNTS)?];
        let mut want_t = vec![0i64; usize::try_from(b * TELLERS)?];
        let mut want_b = vec![0i64; usize::try_from(b)?];
        let history = engine.scan_all(self.tables.history)?;
        ensure!(
            history.len() as u64 == tally[0],
            "{} history rows but {} commits",
            history.len(),
            tally[0]
        );
        let mut sum = 0i64;
        for (_, v) in &history {
            let h = HistoryRow::decode(v)
                .ok_or_else(|| anyhow::anyhow!("history row of {} bytes", v.len()))?;
            ensure!(h.flags == FLAG_ALL, "history row {h:?} only read a balance");
            let d = h.delta;
            let slot = |w: &mut Vec<i64>, i: u64| -> anyhow::Result<()> {
                let x = usize::try_from(i)
                    .ok()
                    .and_then(|i| w.get_mut(i))
                    .ok_or_else(|| anyhow::anyhow!("history names a missing row {i}"))?;
                *x += d;
                Ok(())
            };
            slot(&mut want_a, h.aid)?;
            slot(&mut want_t, h.tid)?;
            slot(&mut want_b, h.bid)?;
            sum += d;
        }
        for (name, table, want) in [
            ("account", self.tables.account, &want_a),
            ("teller", self.tables.teller, &want_t),
            ("branch", self.tables.branch, &want_b),
        ] {
            let rows = engine.scan_all(table)?;
            ensure!(
                rows.len() == want.len(),
                "{name}: {} rows, loaded {}",
                rows.len(),
                want.len()
            );
            let mut total = 0i64;
            for (k, v) in &rows {
                let i = usize::try_from(key_id(k)?)?;
                let got = decode_i64(v).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
                let w = want.get(i).copied().unwrap_or(i64::MIN);
                if got != w {
                    bail!("{name} {i}: balance {got}, history says {w}");
                }
                total += got;
            }
            ensure!(total == sum, "sum({name}) = {total}, sum(deltas) = {sum}");
        }
        Ok(format!("{} history rows, balances match", history.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::{Durability, EngineKind};

    #[test]
    fn history_rows_are_the_shoal_native_ones() {
        let dir = tempfile::tempdir().unwrap();
        let db = EngineKind::Shoal2pl
            .open(dir.path(), Durability::None)
            .unwrap();
        let load = LoadCfg {
            scale: 2,
            records: 0,
            field_size: 0,
        };
        let w = Tpcb::load(db.as_ref(), &load).unwrap();
        let run = RunCfg {
            threads: 1,
            mix: String::new(),
            hot_fraction: 0.0,
            dist: KeyDist::Uniform,
            seed: 1,
            run: 3,
        };
        let mut st = w.worker(&run, 5, 9);
        let mut s = db.session().unwrap();
        for _ in 0..2 {
            w.next(&mut st);
            let mut tx = s.begin(false).unwrap();
            w.execute(&mut st, tx.as_mut()).unwrap();
            tx.commit().unwrap();
            w.committed(&mut st);
        }
        let rows = db.scan_all(w.tables.history).unwrap();
        let keys: Vec<Vec<u8>> = rows.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(
            keys,
            [
                history_key(5, 3 << 48).to_vec(),
                history_key(5, (3 << 48) + 1).to_vec()
            ]
        );
        for (_, v) in &rows {
            let h = HistoryRow::decode(v).unwrap();
            assert_eq!((h.flags, h.bid), (FLAG_ALL, h.tid / TELLERS));
            assert!(h.aid < 2 * ACCOUNTS);
        }
        assert!(w.check(db.as_ref(), [2, 0]).is_ok());
    }
}
