//! Portable YCSB (core workloads A, B, C and F) on one table of `--records` records, one
//! operation per transaction. A record's key is its 8-byte big-endian id; its value is the id
//! and an update counter (8 bytes little-endian each) followed by `10 · --field-size` filler
//! bytes. Records are drawn scrambled-Zipfian with theta 0.99 (`--zipf`/`--self-similar`
//! change it). A read is a `get` (a read-only transaction); an update (A: 50%, B: 5%) and
//! F's read-modify-write (50%) read the record with `get_for_update` and write it back with
//! its counter incremented. The check verifies every record's id, the record count and that
//! the counters add up to the committed updates.
//!
//! The mixes, the scrambling of Zipfian draws and the record header are the shoal-native
//! YCSB's (`src/workloads/ycsb.rs`: [`Mix`], [`fnv`], [`header`]). That variant stays apart:
//! it rewrites one field of a record, inserts (mixes d and e) through a shared id counter and
//! scans (mix e), which the engine-neutral interface has no operation for.

use anyhow::ensure;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{Done, LoadCfg, PortableWorkload, RunCfg};
use crate::dist::Sampler;
use crate::engines::{load_rows, KvEngine, KvTx, LoadValue, TableId, TxError, TxResult};
use crate::workloads::ops::scan_counted;
use crate::workloads::ycsb::{fnv, header, Mix, Op};

/// A loaded YCSB table.
pub struct Ycsb {
    records: u64,
    value_len: usize,
    table: TableId,
}

/// A worker's state.
pub struct Worker {
    rng: SmallRng,
    sampler: Sampler,
    mix: Mix,
    key: u64,
    update: bool,
}

fn record(id: u64, counter: u64, len: usize) -> Vec<u8> {
    let mut v = vec![b'y'; len.max(16)];
    v[..8].copy_from_slice(&id.to_le_bytes());
    v[8..16].copy_from_slice(&counter.to_le_bytes());
    v
}

impl PortableWorkload for Ycsb {
    type Worker = Worker;

    fn load(engine: &dyn KvEngine, cfg: &LoadCfg) -> anyhow::Result<Self> {
        let w = Ycsb {
            records: cfg.records.max(1),
            value_len: 16 + 10 * cfg.field_size,
            table: engine.create_table("usertable")?,
        };
        let (t, len) = (w.table, w.value_len);
        let mut s = engine.session()?;
        let mut rows = (0..w.records).map(move |i| {
            (
                t,
                i.to_be_bytes().to_vec(),
                LoadValue::Bytes(record(i, 0, len)),
            )
        });
        load_rows(s.as_mut(), &mut rows, 2_000)?;
        Ok(w)
    }

    fn rows(&self) -> u64 {
        self.records
    }

    fn worker(&self, run: &RunCfg, _thread: u16, seed: u64) -> Worker {
        Worker {
            rng: SmallRng::seed_from_u64(seed),
            sampler: run.dist.over(self.records),
            mix: run.mix,
            key: 0,
            update: false,
        }
    }

    fn next(&self, st: &mut Worker) {
        let item = st.sampler.sample(&mut st.rng);
        st.key = if matches!(st.sampler, Sampler::Zipf(..)) {
            fnv(item) % self.records
        } else {
            item
        };
        // The shoal-native YCSB's draw of the operation: its mixes a, b, c and f.
        st.update = st.mix.op(st.rng.gen()) != Op::Read;
    }

    fn read_only(&self, st: &Worker) -> bool {
        !st.update
    }

    fn execute(&self, st: &mut Worker, tx: &mut dyn KvTx) -> TxResult<()> {
        let key = st.key.to_be_bytes();
        let missing = || TxError::Fatal(anyhow::anyhow!("record {} is missing", st.key));
        if !st.update {
            tx.get(self.table, &key)?.ok_or_else(missing)?;
            return Ok(());
        }
        let v = tx.get_for_update(self.table, &key)?.ok_or_else(missing)?;
        let (id, c) = header(&v).ok_or_else(missing)?;
        tx.put(self.table, &key, &record(id, c + 1, self.value_len))
    }

    fn committed(&self, st: &mut Worker) -> [u64; 2] {
        [u64::from(st.update), 0]
    }

    fn check(&self, engine: &dyn KvEngine, done: &Done) -> anyhow::Result<String> {
        let mut updates = 0u64;
        scan_counted(
            engine,
            &self.table,
            "usertable",
            self.records,
            &mut |k, v| {
                let kid =
                    u64::from_be_bytes(k.try_into().map_err(|_| anyhow::anyhow!("bad key {k:?}"))?);
                let (id, c) =
                    header(v).ok_or_else(|| anyhow::anyhow!("record {kid}: short value"))?;
                ensure!(id == kid, "record {kid} holds id {id}");
                ensure!(v.len() == self.value_len, "record {kid}: {} bytes", v.len());
                updates += c;
                Ok(())
            },
        )?;
        ensure!(
            updates == done.tally[0],
            "counters add up to {updates}, {} updates committed",
            done.tally[0]
        );
        Ok(format!("{} records, {updates} updates", self.records))
    }
}
