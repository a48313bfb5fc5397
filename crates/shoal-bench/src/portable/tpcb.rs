//! Portable TPC-B: the workload of `src/workloads/tpcb.rs` ([`Tpcb`]: its transaction, inputs,
//! history rows and check) at read ratio 0 with uniform tellers, on tables of the
//! engine-neutral interface. This file holds only what the engine-neutral path does its own
//! way: the load (through one session, in transactions of 10,000 rows).

use super::{Done, LoadCfg, PortableWorkload, RunCfg};
use crate::dist::KeyDist;
use crate::engines::{load_rows, KvEngine, KvTx, LoadValue, TableId, TxResult};
use crate::workloads::tpcb::{
    id_key, rows, Tables, Tpcb, TpcbWorker, ACCOUNTS_PER_BRANCH as ACCOUNTS,
    TELLERS_PER_BRANCH as TELLERS,
};

impl PortableWorkload for Tpcb<TableId> {
    type Worker = TpcbWorker;

    fn load(engine: &dyn KvEngine, cfg: &LoadCfg) -> anyhow::Result<Self> {
        let b = cfg.scale.max(1);
        let tables = Tables {
            branch: engine.create_table("branch")?,
            teller: engine.create_table("teller")?,
            account: engine.create_table("account")?,
            history: engine.create_table("history")?,
        };
        let mut s = engine.session()?;
        let row = |t: TableId| move |i: u64| (t, id_key(i).to_vec(), LoadValue::Int(0));
        let mut rows = (0..b)
            .map(row(tables.branch))
            .chain((0..b * TELLERS).map(row(tables.teller)))
            .chain((0..b * ACCOUNTS).map(row(tables.account)));
        load_rows(s.as_mut(), &mut rows, 10_000)?;
        Ok(Tpcb::new(tables, b))
    }

    fn rows(&self) -> u64 {
        rows(self.branches())
    }

    fn worker(&self, run: &RunCfg, thread: u16, seed: u64) -> TpcbWorker {
        self.new_worker(run.run, thread, seed, 0.0, 0.0, KeyDist::Uniform)
    }

    fn next(&self, st: &mut TpcbWorker) {
        self.draw_next(st);
    }

    fn execute(&self, st: &mut TpcbWorker, tx: &mut dyn KvTx) -> TxResult<()> {
        self.run_txn(st, tx)
    }

    fn committed(&self, st: &mut TpcbWorker) -> [u64; 2] {
        self.note_commit(st);
        [1, 0]
    }

    fn check(&self, engine: &dyn KvEngine, done: &Done) -> anyhow::Result<String> {
        self.tables()
            .check(engine, self.branches(), &done.ledger, self.read_only())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::tpcb::{history_key, HistoryRow, FLAG_ALL};

    #[test]
    fn history_rows_are_the_shoal_native_ones() {
        let (_dir, db) = crate::portable::tests::shoal_engine();
        let load = LoadCfg {
            scale: 2,
            records: 0,
            field_size: 0,
        };
        let w = Tpcb::<TableId>::load(db.as_ref(), &load).unwrap();
        let run = RunCfg {
            threads: 1,
            mix: crate::workloads::ycsb::Mix::A,
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
            PortableWorkload::committed(&w, &mut st);
        }
        let rows = db.scan_all(w.tables().history).unwrap();
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
        let done = Done {
            ledger: crate::workloads::Ledger {
                by_kind: Vec::new(),
                commits: vec![vec![0, 0, 0, 0, 0, 2]],
            },
            tally: [2, 0],
        };
        assert!(w.check(db.as_ref(), &done).is_ok());
    }
}
