//! TPC-B on shoal.
//!
//! Schema: tables `branch`, `teller`, `account` and `history`. Keys of the three balance
//! tables are 8-byte big-endian ids (so key order is id order); their values are the balance
//! alone, an 8-byte little-endian i64 updated with [`Transaction::add_and_get`], which returns the new
//! balance and so stands in for TPC-B's read of the balance. TPC-B's 100-byte row filler is
//! omitted for these three tables because shoal's integer operations act on 8-byte values.
//! All balances start at 0.
//!
//! Scale `B` gives `B` branches, `10·B` tellers and `100,000·B` accounts. Teller `t` belongs to
//! branch `t / 10`, account `a` to branch `a / 100,000`.
//!
//! A transaction picks a teller uniformly; its branch is the teller's branch. The account
//! follows TPC-B clause 5.3.5: with probability 85% (or always, with one branch) it is a
//! uniform account of that branch, otherwise a uniform account of a uniformly chosen *other*
//! branch. The delta is uniform in `[-99999, 99999]`. The transaction then does, in this fixed
//! order (which avoids deadlocks between TPC-B transactions), `add(account)`, `add(teller)`,
//! `add(branch)`, and inserts a history row.
//!
//! With `--read-ratio R` each of the three balance updates independently becomes a read
//! ([`Transaction::get_i64`]) of the same row with probability `R` (Kimura et al. 2012 §6.2).
//! The history row records which of the three were updates, so the consistency check stays
//! exact. A transaction whose three updates all became reads is read-only and inserts no
//! history row (at read ratio 1 every transaction is read-only, as in Kimura et al.'s
//! "all of the transactions are read-only" point); the check counts those commits apart.
//!
//! History key: worker thread id (u16 BE) ++ sequence number (u64 BE), so concurrent inserts
//! do not all land on one hot key. The sequence's top 16 bits hold the number of the run on
//! this loaded database, its low 48 bits count the thread's commits in that run, so runs that
//! share a database never collide. History value (50 bytes): aid, tid, bid as u64 LE, delta as
//! i64 LE, one byte of [update flags](FLAG_ACCOUNT), 17 bytes of filler.

use anyhow::{bail, ensure, Context};
use indicatif::ProgressBar;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, Table, Transaction};
use std::sync::atomic::Ordering;

use super::ops::{Scan, TxOps};
use super::{parallel_load, Ledger, Load, Workload};
use crate::config::RunConfig;
use crate::dist::{KeyDist, Sampler};
use crate::driver::Padded;

/// Tellers per branch.
pub const TELLERS_PER_BRANCH: u64 = 10;
/// Accounts per branch.
pub const ACCOUNTS_PER_BRANCH: u64 = 100_000;
/// Length of a history row's value.
pub const HISTORY_VALUE_LEN: usize = 50;
/// History flag: the account balance was updated (not just read).
pub const FLAG_ACCOUNT: u8 = 1;
/// History flag: the teller balance was updated.
pub const FLAG_TELLER: u8 = 2;
/// History flag: the branch balance was updated.
pub const FLAG_BRANCH: u8 = 4;
/// All three balances updated: plain TPC-B.
pub const FLAG_ALL: u8 = FLAG_ACCOUNT | FLAG_TELLER | FLAG_BRANCH;

/// Rows per load transaction.
const LOAD_BATCH: u64 = 5_000;
/// Rows per transaction of the consistency check's scans.
const CHECK_CHUNK: u64 = 10_000;
/// Probability that the account is in another branch than the teller (TPC-B 5.3.5).
const REMOTE_ACCOUNT: f64 = 0.15;

/// The key of a branch, teller or account id.
pub fn id_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

/// The key of a history row.
pub fn history_key(thread: u16, seq: u64) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[..2].copy_from_slice(&thread.to_be_bytes());
    k[2..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// One history row's contents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistoryRow {
    /// Account id.
    pub aid: u64,
    /// Teller id.
    pub tid: u64,
    /// Branch id.
    pub bid: u64,
    /// The amount moved.
    pub delta: i64,
    /// Which balances were updated ([`FLAG_ACCOUNT`] etc.); the others were only read.
    pub flags: u8,
}

impl HistoryRow {
    /// The 50-byte value.
    pub fn encode(&self) -> [u8; HISTORY_VALUE_LEN] {
        let mut v = [b' '; HISTORY_VALUE_LEN];
        v[0..8].copy_from_slice(&self.aid.to_le_bytes());
        v[8..16].copy_from_slice(&self.tid.to_le_bytes());
        v[16..24].copy_from_slice(&self.bid.to_le_bytes());
        v[24..32].copy_from_slice(&self.delta.to_le_bytes());
        v[32] = self.flags;
        v
    }

    /// Parses a value written by [`encode`](Self::encode).
    pub fn decode(v: &[u8]) -> Option<HistoryRow> {
        if v.len() != HISTORY_VALUE_LEN {
            return None;
        }
        let u = |i: usize| u64::from_le_bytes(v[i..i + 8].try_into().unwrap());
        Some(HistoryRow {
            aid: u(0),
            tid: u(8),
            bid: u(16),
            delta: u(24) as i64,
            flags: v[32],
        })
    }
}

/// The four TPC-B tables, by the table handle of the path that runs them (a shoal [`Table`]
/// here, an engine-neutral `TableId` in `crate::portable::tpcb`).
pub struct Tables<T> {
    /// Branch balances.
    pub branch: T,
    /// Teller balances.
    pub teller: T,
    /// Account balances.
    pub account: T,
    /// History rows.
    pub history: T,
}

impl<T> Tables<T> {
    /// The TPC-B transaction, the one body both paths run: adds (or, with its flag clear,
    /// reads) the account, teller and branch balances of `h` in that order (`reversed`: the
    /// opposite one), then inserts `h` as the history row `key`.
    pub fn execute<O: TxOps<Table = T> + ?Sized>(
        &self,
        tx: &mut O,
        h: &HistoryRow,
        reversed: bool,
        key: &[u8],
    ) -> Result<(), O::Error> {
        let mut rows = [
            (FLAG_ACCOUNT, &self.account, h.aid),
            (FLAG_TELLER, &self.teller, h.tid),
            (FLAG_BRANCH, &self.branch, h.bid),
        ];
        if reversed {
            rows.reverse();
        }
        for (flag, table, id) in rows {
            if h.flags & flag != 0 {
                tx.add_and_get(table, &id_key(id), h.delta)?;
            } else {
                tx.get_i64(table, &id_key(id))?;
            }
        }
        if h.flags & FLAG_ALL == 0 {
            // Read-only: no history row (see the module documentation).
            return Ok(());
        }
        tx.insert(&self.history, key, &h.encode())
    }
}

/// A loaded TPC-B database, by the table handle of the path that runs it: a shoal [`Table`]
/// (the shoal-native path, [`Workload`] below) or an engine-neutral `TableId` (the portable
/// path, `crate::portable::tpcb`). Both run the same transaction ([`Tables::execute`]) on the
/// same inputs ([`draw`]), write the same history rows and run the same check
/// ([`Tables::check`]); the shoal-native one adds a parallel load with a progress bar and the
/// shoal-only options (`--read-ratio`, `--reverse-fraction`, `--zipf`/`--self-similar`
/// tellers).
pub struct Tpcb<T = Table> {
    tables: Tables<T>,
    branches: u64,
    /// Read-only commits on this database (they insert no history row), per worker thread
    /// (modulo [`READ_ONLY_SLOTS`]), each on its own cache line: at read ratio 1 every commit
    /// counts, and one shared counter would be a write every core makes per transaction.
    read_only: Vec<Padded>,
}

/// A worker thread's state.
pub struct TpcbWorker {
    rng: SmallRng,
    thread: u16,
    seq: u64,
    read_ratio: f64,
    /// Probability that a transaction touches its rows in reverse order (`--reverse-fraction`).
    reverse_fraction: f64,
    /// The current transaction goes branch, teller, account.
    reversed: bool,
    tellers: Sampler,
    cur: HistoryRow,
}

/// Counters of read-only commits (see [`Tpcb::read_only`]).
const READ_ONLY_SLOTS: usize = 64;

/// Rows a TPC-B load inserts at scale `branches`.
pub fn rows(branches: u64) -> u64 {
    branches * (1 + TELLERS_PER_BRANCH + ACCOUNTS_PER_BRANCH)
}

impl<T> Tpcb<T> {
    /// The workload over the loaded `tables` of `branches` branches.
    pub fn new(tables: Tables<T>, branches: u64) -> Tpcb<T> {
        Tpcb {
            tables,
            branches,
            read_only: (0..READ_ONLY_SLOTS).map(|_| Padded::default()).collect(),
        }
    }

    /// The tables.
    pub fn tables(&self) -> &Tables<T> {
        &self.tables
    }

    /// Read-only commits so far (each inserted no history row).
    pub fn read_only(&self) -> u64 {
        self.read_only
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum()
    }

    /// Branches (the scale).
    pub fn branches(&self) -> u64 {
        self.branches
    }

    fn tellers(&self) -> u64 {
        self.branches * TELLERS_PER_BRANCH
    }

    fn accounts(&self) -> u64 {
        self.branches * ACCOUNTS_PER_BRANCH
    }

    /// The state of worker `thread` (seed `seed`) in the `run`-th run on this database: each
    /// balance update a read with probability `read_ratio`, the rows in reverse order with
    /// probability `reverse_fraction`, tellers drawn from `tellers`.
    pub fn new_worker(
        &self,
        run: u16,
        thread: u16,
        seed: u64,
        read_ratio: f64,
        reverse_fraction: f64,
        tellers: KeyDist,
    ) -> TpcbWorker {
        TpcbWorker {
            rng: SmallRng::seed_from_u64(seed),
            thread,
            // The run number in the top 16 bits: runs sharing a database never collide.
            seq: u64::from(run) << 48,
            read_ratio,
            reverse_fraction,
            reversed: false,
            tellers: tellers.over(self.tellers()),
            cur: HistoryRow::default(),
        }
    }

    /// Draws the worker's next transaction.
    pub fn draw_next(&self, w: &mut TpcbWorker) {
        w.cur = draw(self.branches, &w.tellers, &mut w.rng, w.read_ratio);
        w.reversed = w.reverse_fraction > 0.0 && w.rng.gen_bool(w.reverse_fraction);
    }

    /// Runs the worker's current transaction in `tx` (not the commit).
    pub fn run_txn<O: TxOps<Table = T> + ?Sized>(
        &self,
        w: &TpcbWorker,
        tx: &mut O,
    ) -> Result<(), O::Error> {
        let key = history_key(w.thread, w.seq);
        self.tables.execute(tx, &w.cur, w.reversed, &key)
    }

    /// The worker's current transaction committed.
    pub fn note_commit(&self, w: &mut TpcbWorker) {
        if w.cur.flags & FLAG_ALL == 0 {
            let slot = usize::from(w.thread) % READ_ONLY_SLOTS;
            self.read_only[slot].0.fetch_add(1, Ordering::Relaxed);
        }
        w.seq += 1;
    }
}

impl Tpcb {
    /// Creates the four tables in `db` and loads `branches` branches with their tellers and
    /// accounts (balances 0), in batches of 5,000 rows per transaction spread over
    /// `load_threads` threads. Advances `progress` by the rows loaded.
    pub fn load(
        db: &Database,
        branches: u64,
        load_threads: usize,
        progress: &ProgressBar,
    ) -> anyhow::Result<Tpcb> {
        ensure!(branches >= 1, "scale must be at least 1");
        let create = |name: &str| super::create_table(db, name);
        let t = Tpcb::new(
            Tables {
                branch: create("branch")?,
                teller: create("teller")?,
                account: create("account")?,
                history: create("history")?,
            },
            branches,
        );
        let zero = 0i64.to_le_bytes();
        // Work items: (table, first id, end id), in batches.
        let mut items: Vec<(&Table, u64, u64)> = Vec::new();
        for (table, n) in [
            (&t.tables.branch, branches),
            (&t.tables.teller, t.tellers()),
            (&t.tables.account, t.accounts()),
        ] {
            let mut lo = 0;
            while lo < n {
                let hi = (lo + LOAD_BATCH).min(n);
                items.push((table, lo, hi));
                lo = hi;
            }
        }
        parallel_load(&items, load_threads, progress, |&(table, lo, hi)| {
            db.run(|tx| {
                for id in lo..hi {
                    tx.insert(table, id_key(id), zero)?;
                }
                Ok(())
            })
            .with_context(|| format!("loading {} rows {lo}..{hi}", table.name()))?;
            Ok(hi - lo)
        })?;
        Ok(t)
    }
}

/// Draws a transaction's inputs at scale `branches`: the teller from `tellers` (uniform by
/// default; skewed with `--zipf`/`--self-similar`, which so skews the branches too), the
/// account in the teller's branch with probability 85%, else in another branch, uniformly.
pub fn draw(branches: u64, tellers: &Sampler, rng: &mut SmallRng, read_ratio: f64) -> HistoryRow {
    let tid = tellers.sample(rng);
    let bid = tid / TELLERS_PER_BRANCH;
    let abranch = if branches > 1 && rng.gen_bool(REMOTE_ACCOUNT) {
        let other = rng.gen_range(0..branches - 1);
        if other >= bid {
            other + 1
        } else {
            other
        }
    } else {
        bid
    };
    let aid = abranch * ACCOUNTS_PER_BRANCH + rng.gen_range(0..ACCOUNTS_PER_BRANCH);
    let delta = rng.gen_range(-99_999..=99_999);
    let mut flags = 0;
    for f in [FLAG_ACCOUNT, FLAG_TELLER, FLAG_BRANCH] {
        if read_ratio <= 0.0 || !rng.gen_bool(read_ratio.min(1.0)) {
            flags |= f;
        }
    }
    HistoryRow {
        aid,
        tid,
        bid,
        delta,
        flags,
    }
}

/// Chunk bounds for a balance table of `n` rows.
fn id_bounds(n: u64) -> Vec<Vec<u8>> {
    (1..n.div_ceil(CHECK_CHUNK))
        .map(|c| id_key(c * CHECK_CHUNK).to_vec())
        .collect()
}

/// Chunk bounds for the history table given the ledger of commits per run and thread.
fn history_bounds(ledger: &Ledger) -> Vec<Vec<u8>> {
    let threads = ledger.commits.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::new();
    for t in 0..threads {
        for (r, per_thread) in ledger.commits.iter().enumerate() {
            let n = per_thread.get(t).copied().unwrap_or(0);
            for c in 0..n.div_ceil(CHECK_CHUNK).max(1) {
                out.push(history_key(t as u16, ((r as u64) << 48) + c * CHECK_CHUNK).to_vec());
            }
        }
    }
    out
}

/// Checks one balance table against the balances the history implies.
fn check_balances<S: Scan + ?Sized>(
    store: &S,
    table: &S::Table,
    name: &str,
    expected: &[i64],
) -> anyhow::Result<(i128, Vec<String>)> {
    let mut seen = 0u64;
    let mut sum: i128 = 0;
    let mut bad = Vec::new();
    let bounds = id_bounds(expected.len() as u64);
    store.scan_rows(table, name, &bounds, &mut |k, v| {
        let id = <[u8; 8]>::try_from(k)
            .map(u64::from_be_bytes)
            .map_err(|_| anyhow::anyhow!("{name}: key of {} bytes", k.len()))?;
        let bal = <[u8; 8]>::try_from(v)
            .map(i64::from_le_bytes)
            .map_err(|_| anyhow::anyhow!("{name} {id}: value of {} bytes", v.len()))?;
        seen += 1;
        sum += i128::from(bal);
        match usize::try_from(id).ok().and_then(|i| expected.get(i)) {
            None => bad.push(format!("{name} {id} should not exist")),
            Some(&e) if e != bal => bad.push(format!(
                "{name} {id} has balance {bal}, its history says {e}"
            )),
            _ => {}
        }
        Ok(())
    })?;
    if seen != expected.len() as u64 {
        bad.push(format!(
            "{name} has {seen} rows, expected {}",
            expected.len()
        ));
    }
    Ok((sum, bad))
}

impl<T> Tables<T> {
    /// The TPC-B consistency check, the one both paths run on a quiescent database of
    /// `branches` branches: history rows = `ledger`'s commits less the `read_only` ones;
    /// every branch, teller and
    /// account balance equals the sum of the deltas of the history rows that updated it; and
    /// so (with read ratio 0) sum(branch) = sum(teller) = sum(account) = sum(history deltas).
    pub fn check<S: Scan<Table = T> + ?Sized>(
        &self,
        store: &S,
        branches: u64,
        ledger: &Ledger,
        read_only: u64,
    ) -> anyhow::Result<String> {
        let (tellers, accounts) = (
            branches * TELLERS_PER_BRANCH,
            branches * ACCOUNTS_PER_BRANCH,
        );
        let mut exp_b = vec![0i64; usize::try_from(branches)?];
        let mut exp_t = vec![0i64; usize::try_from(tellers)?];
        let mut exp_a = vec![0i64; usize::try_from(accounts)?];
        let mut rows = 0u64;
        let mut delta_sum: i128 = 0;
        let mut reads = 0u64;
        let bounds = history_bounds(ledger);
        store.scan_rows(&self.history, "history", &bounds, &mut |k, v| {
            let h = HistoryRow::decode(v)
                .with_context(|| format!("history row {k:02x?} has {} bytes", v.len()))?;
            if k.len() != 10
                || h.bid != h.tid / TELLERS_PER_BRANCH
                || h.tid >= tellers
                || h.aid >= accounts
                || h.flags & !FLAG_ALL != 0
            {
                bail!("malformed history row {k:02x?}: {h:?}");
            }
            rows += 1;
            delta_sum += i128::from(h.delta);
            if h.flags != FLAG_ALL {
                reads += 1;
            }
            let add = |exp: &mut [i64], id: u64, flag: u8| {
                if h.flags & flag != 0 {
                    exp[id as usize] += h.delta;
                }
            };
            add(&mut exp_a, h.aid, FLAG_ACCOUNT);
            add(&mut exp_t, h.tid, FLAG_TELLER);
            add(&mut exp_b, h.bid, FLAG_BRANCH);
            Ok(())
        })?;
        let mut bad = Vec::new();
        if rows + read_only != ledger.total() {
            bad.push(format!(
                "history has {rows} rows and {read_only} read-only transactions committed, \
                 but {} transactions committed in all",
                ledger.total()
            ));
        }
        let (sb, b1) = check_balances(store, &self.branch, "branch", &exp_b)?;
        let (st, b2) = check_balances(store, &self.teller, "teller", &exp_t)?;
        let (sa, b3) = check_balances(store, &self.account, "account", &exp_a)?;
        if reads == 0 && !(sb == st && st == sa && sa == delta_sum) {
            bad.push(format!(
                "sum(branch) = {sb}, sum(teller) = {st}, sum(account) = {sa}, \
                 sum(history delta) = {delta_sum} are not all equal"
            ));
        }
        for b in [b1, b2, b3] {
            bad.extend(b);
        }
        super::fail_if_bad("TPC-B", bad)?;
        let commits = if read_only == 0 {
            format!("history rows = commits = {rows}")
        } else {
            format!(
                "history rows {rows} + read-only commits {read_only} = commits {}",
                ledger.total()
            )
        };
        Ok(if reads == 0 {
            format!(
                "sum(branch) = sum(teller) = sum(account) = sum(history delta) = {sb}; {commits}"
            )
        } else {
            format!("every balance = sum of its history deltas (sums {sb}, {st}, {sa}); {commits}")
        })
    }
}

impl Workload for Tpcb {
    type Worker = TpcbWorker;

    fn rows(cfg: &RunConfig) -> u64 {
        rows(cfg.scale)
    }

    fn load(l: Load<'_>) -> anyhow::Result<Tpcb> {
        Tpcb::load(l.db, l.cfg.scale, l.load_threads, l.progress)
    }

    fn worker(&self, cfg: &RunConfig, run: u16, thread: u16, seed: u64) -> TpcbWorker {
        let tellers = cfg.dist.unwrap_or(KeyDist::Uniform);
        self.new_worker(
            run,
            thread,
            seed,
            cfg.read_ratio,
            cfg.reverse_fraction,
            tellers,
        )
    }

    fn next(&self, w: &mut TpcbWorker) {
        self.draw_next(w);
    }

    fn execute(&self, w: &TpcbWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        self.run_txn(w, tx)
    }

    fn committed(&self, w: &mut TpcbWorker) {
        self.note_commit(w);
    }

    /// [`Tables::check`]: both paths' TPC-B check, here in bounded shoal transactions.
    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String> {
        self.tables
            .check(db, self.branches, ledger, self.read_only())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_row_round_trips() {
        let h = HistoryRow {
            aid: 1_999_999,
            tid: 199,
            bid: 19,
            delta: -99_999,
            flags: FLAG_ACCOUNT | FLAG_BRANCH,
        };
        let v = h.encode();
        assert_eq!(v.len(), 50);
        assert_eq!(HistoryRow::decode(&v), Some(h));
        assert_eq!(HistoryRow::decode(&v[..49]), None);
    }

    #[test]
    fn keys_sort_by_thread_then_sequence() {
        assert!(history_key(0, u64::MAX) < history_key(1, 0));
        assert!(history_key(3, 5) < history_key(3, 6));
        assert!(id_key(255) < id_key(256));
    }

    #[test]
    fn chunk_bounds_ascend() {
        assert!(id_bounds(CHECK_CHUNK).is_empty());
        assert_eq!(id_bounds(2 * CHECK_CHUNK + 1).len(), 2);
        let l = Ledger {
            by_kind: Vec::new(),
            commits: vec![vec![0, 25_000], vec![3]],
        };
        let b = history_bounds(&l);
        assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        // thread 0: run 0 and run 1; thread 1: 3 chunks of run 0, run 1 (empty).
        assert_eq!(b.len(), 2 + 3 + 1);
    }

    /// At read ratio 1 every transaction is read-only: it writes no history row, and the
    /// check counts it; at 0.5 the read-only ones (an eighth) are counted apart.
    #[test]
    fn read_only_transactions_write_nothing_and_the_check_counts_them() {
        use crate::workloads::testutil::{config, load, open, run_txns};
        for (ratio, all_read_only) in [(1.0, true), (0.5, false)] {
            let cfg = config(
                "tpcb",
                &[("read-ratio", ratio.into()), ("scale", 1u64.into())],
            );
            let db = open(&cfg);
            let w = load::<Tpcb>(&db, &cfg, 2);
            let ledger = run_txns(&w, &db, &cfg, 400);
            let rows = db.run(|tx| tx.scan(&w.tables.history, ..)).unwrap().len() as u64;
            assert_eq!(rows + w.read_only(), 800, "{ratio}");
            if all_read_only {
                assert_eq!(rows, 0);
            } else {
                assert!((40..=170).contains(&w.read_only()), "{}", w.read_only());
            }
            let summary = w.check(&db, &ledger).unwrap();
            assert!(summary.contains("read-only commits"), "{summary}");
            // A lost history row is still found.
            let k = db
                .run(|tx| tx.scan(&w.tables.history, ..))
                .unwrap()
                .first()
                .map(|(k, _)| k.clone());
            if let Some(k) = k {
                db.run(|tx| tx.delete(&w.tables.history, &k)).unwrap();
                assert!(w.check(&db, &ledger).is_err());
            }
        }
    }

    #[test]
    fn draws_follow_the_rules() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut remote = 0;
        let mut reads = 0;
        for _ in 0..10_000 {
            let h = draw(3, &KeyDist::Uniform.over(30), &mut rng, 0.0);
            assert_eq!(h.flags, FLAG_ALL);
            assert_eq!(h.bid, h.tid / TELLERS_PER_BRANCH);
            assert!(h.tid < 30 && h.aid < 300_000 && h.delta.abs() <= 99_999);
            remote += u32::from(h.aid / ACCOUNTS_PER_BRANCH != h.bid);
            let h = draw(3, &KeyDist::Uniform.over(30), &mut rng, 0.5);
            reads += (!h.flags & FLAG_ALL).count_ones();
        }
        assert!((1_200..1_800).contains(&remote), "{remote}");
        assert!((13_500..16_500).contains(&reads), "{reads}");
        assert_eq!(draw(3, &KeyDist::Uniform.over(30), &mut rng, 1.0).flags, 0);
    }
}
