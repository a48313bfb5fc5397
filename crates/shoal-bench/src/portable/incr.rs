//! INCR1 (Narula et al., Doppel, OSDI 2014): `--records` counters (default 1,000,000, 8-byte
//! big-endian keys, loaded as 0) of which key 0 is hot. Each transaction is one `ADD(k, 1)`:
//! on the hot key with probability `--hot-fraction`, else on a uniformly drawn other key. The
//! check verifies that the counters add up to the commits and the hot counter to the hot
//! commits. The draw is the shoal-native INCR1's ([`draw_incr1`]).

use anyhow::ensure;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::{Done, LoadCfg, PortableWorkload, RunCfg};
use crate::engines::{decode_i64, load_rows, KvEngine, KvTx, LoadValue, TableId, TxResult};
use crate::workloads::incr::draw_incr1;
use crate::workloads::ops::scan_counted;

/// The loaded counters.
pub struct Incr1 {
    keys: u64,
    table: TableId,
}

/// A worker's state.
pub struct Worker {
    rng: SmallRng,
    hot_fraction: f64,
    key: u64,
}

impl PortableWorkload for Incr1 {
    type Worker = Worker;

    fn load(engine: &dyn KvEngine, cfg: &LoadCfg) -> anyhow::Result<Self> {
        let w = Incr1 {
            keys: cfg.records.max(2),
            table: engine.create_table("counters")?,
        };
        let t = w.table;
        let mut s = engine.session()?;
        let mut rows = (0..w.keys).map(move |i| (t, i.to_be_bytes().to_vec(), LoadValue::Int(0)));
        load_rows(s.as_mut(), &mut rows, 10_000)?;
        Ok(w)
    }

    fn rows(&self) -> u64 {
        self.keys
    }

    fn worker(&self, run: &RunCfg, _thread: u16, seed: u64) -> Worker {
        Worker {
            rng: SmallRng::seed_from_u64(seed),
            hot_fraction: run.hot_fraction,
            key: 0,
        }
    }

    fn next(&self, st: &mut Worker) {
        st.key = draw_incr1(&mut st.rng, st.hot_fraction, self.keys, 0).0;
    }

    fn execute(&self, st: &mut Worker, tx: &mut dyn KvTx) -> TxResult<()> {
        tx.add(self.table, &st.key.to_be_bytes(), 1).map(|_| ())
    }

    fn committed(&self, st: &mut Worker) -> [u64; 2] {
        [1, u64::from(st.key == 0)]
    }

    fn check(&self, engine: &dyn KvEngine, done: &Done) -> anyhow::Result<String> {
        let mut sum = 0i64;
        let mut hot = 0i64;
        scan_counted(engine, &self.table, "counters", self.keys, &mut |k, v| {
            let c = decode_i64(v).map_err(|e| anyhow::anyhow!("{e}"))?;
            if k == 0u64.to_be_bytes() {
                hot = c;
            }
            sum += c;
            Ok(())
        })?;
        ensure!(
            sum as u64 == done.tally[0],
            "counters add up to {sum}, {} commits",
            done.tally[0]
        );
        ensure!(
            hot as u64 == done.tally[1],
            "hot counter {hot}, {} hot commits",
            done.tally[1]
        );
        Ok(format!("{sum} increments, {hot} on the hot key"))
    }
}
