//! Portable TPC-B: the same transaction as `src/workloads/tpcb.rs` (read ratio 0), written
//! against [`KvTx`]. Scale `B`: `B` branches, `10·B` tellers, `100,000·B` accounts, balances 0,
//! keys 8-byte big-endian ids. Each transaction picks a teller uniformly (its branch is the
//! teller's), an account of that branch with 85% probability or of another branch otherwise,
//! a delta uniform in [-99999, 99999], adds the delta to the account, the teller and the branch
//! (in that order) and inserts a 50-byte history row keyed (run, thread, sequence).
//!
//! The check: history rows = commits so far (warm-up included), every balance = the sum of the
//! history deltas that updated it, and sum(branch) = sum(teller) = sum(account) = sum(deltas).

use anyhow::{bail, ensure};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{LoadCfg, PortableWorkload, RunCfg};
use crate::engines::{decode_i64, load_rows, KvEngine, KvTx, LoadValue, TableId, TxResult};

/// Tellers per branch.
const TELLERS: u64 = 10;
/// Accounts per branch.
const ACCOUNTS: u64 = 100_000;
/// History row length.
const HISTORY_LEN: usize = 50;

/// A loaded TPC-B database.
pub struct Tpcb {
    scale: u64,
    branch: TableId,
    teller: TableId,
    account: TableId,
    history: TableId,
}

/// A worker's state.
pub struct Worker {
    rng: SmallRng,
    run: u16,
    thread: u16,
    seq: u64,
    aid: u64,
    tid: u64,
    bid: u64,
    delta: i64,
}

fn id(k: u64) -> [u8; 8] {
    k.to_be_bytes()
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
            branch: engine.create_table("branch")?,
            teller: engine.create_table("teller")?,
            account: engine.create_table("account")?,
            history: engine.create_table("history")?,
        };
        let mut s = engine.session()?;
        let (br, te, ac) = (w.branch, w.teller, w.account);
        let mut rows = (0..b)
            .map(move |i| (br, id(i).to_vec(), LoadValue::Int(0)))
            .chain((0..b * TELLERS).map(move |i| (te, id(i).to_vec(), LoadValue::Int(0))))
            .chain((0..b * ACCOUNTS).map(move |i| (ac, id(i).to_vec(), LoadValue::Int(0))));
        load_rows(s.as_mut(), &mut rows, 10_000)?;
        Ok(w)
    }

    fn rows(&self) -> u64 {
        self.scale * (1 + TELLERS + ACCOUNTS)
    }

    fn worker(&self, run: &RunCfg, thread: u16, seed: u64) -> Worker {
        Worker {
            rng: SmallRng::seed_from_u64(seed),
            run: run.run,
            thread,
            seq: 0,
            aid: 0,
            tid: 0,
            bid: 0,
            delta: 0,
        }
    }

    fn next(&self, st: &mut Worker) {
        let b = self.scale;
        st.tid = st.rng.gen_range(0..b * TELLERS);
        st.bid = st.tid / TELLERS;
        let abranch = if b > 1 && st.rng.gen_bool(0.15) {
            let other = st.rng.gen_range(0..b - 1);
            if other >= st.bid {
                other + 1
            } else {
                other
            }
        } else {
            st.bid
        };
        st.aid = abranch * ACCOUNTS + st.rng.gen_range(0..ACCOUNTS);
        st.delta = st.rng.gen_range(-99_999..=99_999);
    }

    fn read_only(&self, _st: &Worker) -> bool {
        false
    }

    fn execute(&self, st: &mut Worker, tx: &mut dyn KvTx) -> TxResult<()> {
        tx.add(self.account, &id(st.aid), st.delta)?;
        tx.add(self.teller, &id(st.tid), st.delta)?;
        tx.add(self.branch, &id(st.bid), st.delta)?;
        let mut key = [0u8; 12];
        key[..2].copy_from_slice(&st.run.to_be_bytes());
        key[2..4].copy_from_slice(&st.thread.to_be_bytes());
        key[4..].copy_from_slice(&st.seq.to_be_bytes());
        let mut row = [b'h'; HISTORY_LEN];
        row[..8].copy_from_slice(&st.aid.to_le_bytes());
        row[8..16].copy_from_slice(&st.tid.to_le_bytes());
        row[16..24].copy_from_slice(&st.bid.to_le_bytes());
        row[24..32].copy_from_slice(&st.delta.to_le_bytes());
        tx.insert(self.history, &key, &row)
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
        let history = engine.scan_all(self.history)?;
        ensure!(
            history.len() as u64 == tally[0],
            "{} history rows but {} commits",
            history.len(),
            tally[0]
        );
        let mut sum = 0i64;
        let field = |v: &[u8], i: usize| -> anyhow::Result<i64> {
            decode_i64(v.get(i * 8..).unwrap_or(&[]))
                .map_err(|e| anyhow::anyhow!("history row: {e}"))
        };
        for (_, v) in &history {
            ensure!(v.len() == HISTORY_LEN, "history row of {} bytes", v.len());
            let (a, t, br, d) = (field(v, 0)?, field(v, 1)?, field(v, 2)?, field(v, 3)?);
            let slot = |w: &mut Vec<i64>, i: i64| -> anyhow::Result<()> {
                let x = usize::try_from(i)
                    .ok()
                    .and_then(|i| w.get_mut(i))
                    .ok_or_else(|| anyhow::anyhow!("history names a missing row {i}"))?;
                *x += d;
                Ok(())
            };
            slot(&mut want_a, a)?;
            slot(&mut want_t, t)?;
            slot(&mut want_b, br)?;
            sum += d;
        }
        for (name, table, want) in [
            ("account", self.account, &want_a),
            ("teller", self.teller, &want_t),
            ("branch", self.branch, &want_b),
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
