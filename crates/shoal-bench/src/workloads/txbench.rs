//! txbench: the microbenchmark of Jung et al. 2013 §5.1.2.
//!
//! Three tables `txbench1`, `txbench2`, `txbench3` of `--table-rows` rows each (default
//! 100,000). A row's key is its id as 8 bytes big-endian (so key order is id order); its value
//! is an integer (8 bytes little-endian, initially uniform in `0..1000`) followed by ten
//! variable-size strings, each a length byte and 5 to 20 random letters.
//!
//! Two transaction types, on a table `i` drawn uniformly:
//!
//! - **read-only**: the sum of the integer over `S` consecutive rows `[id, id + S)` of table
//!   `i` (one range scan; `S` = `--rows-per-scan`), multiplied by a random number, as in the
//!   paper's `SELECT sum(b_int_value) * rand_number ... WHERE b_int_key > :id AND b_int_key <=
//!   :id + S`;
//! - **read-update** (with probability `--update-fraction`): the same scan of table `i`, then an
//!   update of `max(1, round(0.2 S))` distinct random rows of table `(i + 1) mod 3`, in key
//!   order. Each update replaces one random string column with a new random string (the
//!   paper's `SET b_value-k = rand_str`) and adds a random delta in `-100..=100` to the integer,
//!   which the consistency check accounts for.
//!
//! Scans of table `i` conflict with updates of table `i` by transactions that scanned table
//! `i - 1`, so read-update transactions can form cycles (deadlocks) across the three tables.
//!
//! `--hotspot on` confines every scan and update to the first 5% of each table's rows.
//!
//! The consistency check scans every table and verifies that each row decodes (an integer and
//! exactly ten strings of 5 to 20 letters), that each table still holds exactly its rows, and
//! that each table's integer sum equals its sum after the load plus the deltas of every
//! committed update.

use std::ops::Bound;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use anyhow::{ensure, Context};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, Table, Transaction};

use super::{Ledger, Load, Workload};
use crate::config::RunConfig;

/// Rows per table unless `--table-rows` says otherwise (Jung et al.: 100k).
pub const DEFAULT_ROWS: u64 = 100_000;
/// Number of string columns.
pub const STRINGS: usize = 10;
/// Shortest string column.
pub const MIN_STR: usize = 5;
/// Longest string column.
pub const MAX_STR: usize = 20;
/// Share of each table the hotspot variant touches.
pub const HOTSPOT: f64 = 0.05;
/// Rows updated per scanned row by a read-update transaction.
pub const UPDATE_SHARE: f64 = 0.2;
/// Largest magnitude of an update's delta.
const MAX_DELTA: i64 = 100;
/// Rows per load transaction.
const LOAD_BATCH: u64 = 5_000;
/// Rows per transaction of the consistency check's scans.
const CHECK_CHUNK: u64 = 10_000;

/// The key of row `id`.
pub fn row_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

fn random_string(rng: &mut SmallRng, out: &mut Vec<u8>) {
    let len = rng.gen_range(MIN_STR..=MAX_STR);
    out.push(len as u8);
    out.extend((0..len).map(|_| rng.gen_range(b'a'..=b'z')));
}

/// A fresh row value: `value` and ten random strings.
pub fn encode_row(value: i64, rng: &mut SmallRng) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + STRINGS * (1 + MAX_STR));
    v.extend_from_slice(&value.to_le_bytes());
    for _ in 0..STRINGS {
        random_string(rng, &mut v);
    }
    v
}

/// Splits a row value into its integer and the byte ranges of its ten strings; `None` if it is
/// malformed.
pub fn decode_row(v: &[u8]) -> Option<(i64, [std::ops::Range<usize>; STRINGS])> {
    let value = i64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    let mut cols: [std::ops::Range<usize>; STRINGS] = Default::default();
    let mut at = 8;
    for c in &mut cols {
        let len = *v.get(at)? as usize;
        if !(MIN_STR..=MAX_STR).contains(&len) {
            return None;
        }
        let s = v.get(at + 1..at + 1 + len)?;
        if !s.iter().all(u8::is_ascii_lowercase) {
            return None;
        }
        *c = at + 1..at + 1 + len;
        at += 1 + len;
    }
    (at == v.len()).then_some((value, cols))
}

/// The row after an update: integer plus `delta`, string column `col` replaced by `new`.
/// A malformed or missing row is returned as is (the consistency check reports it).
fn apply_update(cur: Option<&[u8]>, delta: i64, col: usize, new: &[u8]) -> Vec<u8> {
    let Some(cur) = cur else {
        return Vec::new();
    };
    let Some((value, cols)) = decode_row(cur) else {
        return cur.to_vec();
    };
    let mut v = Vec::with_capacity(cur.len() + MAX_STR);
    v.extend_from_slice(&value.wrapping_add(delta).to_le_bytes());
    for (i, r) in cols.iter().enumerate() {
        let s = if i == col { new } else { &cur[r.clone()] };
        v.push(s.len() as u8);
        v.extend_from_slice(s);
    }
    v
}

/// `--hotspot`: whether accesses are confined to the first 5% of each table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Hotspot {
    /// Accesses spread over the whole table.
    Off,
    /// Accesses confined to the first 5% of the rows.
    On,
}

impl Hotspot {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Hotspot::Off => "off",
            Hotspot::On => "on",
        }
    }
}

/// The txbench options of one run, read from its sweep point (defaults where absent).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TxbenchParams {
    /// Rows per table.
    pub rows: u64,
    /// Rows per scan (`S`).
    pub rows_per_scan: u64,
    /// Probability that a transaction is read-update.
    pub update_fraction: f64,
    /// Confine accesses to the first 5% of each table.
    pub hotspot: bool,
}

impl TxbenchParams {
    /// The txbench options of `cfg` (`table-rows`, `rows-per-scan`, `update-fraction`,
    /// `hotspot`).
    pub fn of(cfg: &RunConfig) -> TxbenchParams {
        TxbenchParams {
            rows: cfg.table_rows.max(1),
            rows_per_scan: cfg.rows_per_scan.max(1),
            update_fraction: cfg.update_fraction,
            hotspot: cfg.hotspot,
        }
    }

    /// Rows a transaction may touch: the whole table, or its hot 5% (at least `S`).
    pub fn region(&self) -> u64 {
        let r = if self.hotspot {
            ((self.rows as f64 * HOTSPOT).round() as u64).max(self.rows_per_scan)
        } else {
            self.rows
        };
        r.min(self.rows)
    }

    /// Rows a read-update transaction updates.
    pub fn updates(&self) -> u64 {
        ((self.rows_per_scan as f64 * UPDATE_SHARE).round() as u64)
            .max(1)
            .min(self.region())
    }
}

/// A loaded txbench database.
pub struct Txbench {
    tables: [Table; 3],
    rows: u64,
    /// Sum of each table's integers after the load.
    loaded_sum: [i64; 3],
    /// Sum of the deltas of committed updates, per table.
    applied: [AtomicI64; 3],
    /// Committed read-update transactions.
    update_txns: AtomicU64,
}

/// One update of a read-update transaction.
#[derive(Clone, Debug)]
struct RowUpdate {
    id: u64,
    delta: i64,
    col: usize,
    text: Vec<u8>,
}

/// A worker thread's state and current transaction.
pub struct TxbenchWorker {
    rng: SmallRng,
    params: TxbenchParams,
    table: usize,
    start: u64,
    factor: i64,
    updates: Vec<RowUpdate>,
}

impl Txbench {
    fn sum_of(&self, db: &Database, t: usize) -> anyhow::Result<(u64, i64, Vec<String>)> {
        let table = &self.tables[t];
        let mut bad = Vec::new();
        let (mut n, mut sum) = (0u64, 0i64);
        let mut lo = 0u64;
        loop {
            let hi = lo + CHECK_CHUNK;
            let last = hi >= self.rows;
            let upper = if last {
                Bound::Unbounded
            } else {
                Bound::Excluded(row_key(hi))
            };
            let rows = db
                .run(|tx| tx.scan(table, (Bound::Included(row_key(lo)), upper)))
                .with_context(|| format!("scanning {}", table.name()))?;
            for (k, v) in &rows {
                let id = <[u8; 8]>::try_from(k.as_slice()).map(u64::from_be_bytes);
                match (id, decode_row(v)) {
                    (Ok(id), Some((value, _))) if id < self.rows => {
                        n += 1;
                        sum = sum.wrapping_add(value);
                    }
                    _ => bad.push(format!("{}: malformed row {k:02x?}", table.name())),
                }
            }
            if last {
                break;
            }
            lo = hi;
        }
        Ok((n, sum, bad))
    }
}

impl Workload for Txbench {
    type Worker = TxbenchWorker;

    fn rows(cfg: &RunConfig) -> u64 {
        3 * TxbenchParams::of(cfg).rows
    }

    fn load(l: Load<'_>) -> anyhow::Result<Txbench> {
        let rows = TxbenchParams::of(l.cfg).rows;
        let create = |name: &str| super::create_table(l.db, name);
        let tables = [
            create("txbench1")?,
            create("txbench2")?,
            create("txbench3")?,
        ];
        let mut items: Vec<(usize, u64, u64)> = Vec::new();
        for t in 0..3 {
            let mut lo = 0;
            while lo < rows {
                let hi = (lo + LOAD_BATCH).min(rows);
                items.push((t, lo, hi));
                lo = hi;
            }
        }
        let sums: [AtomicI64; 3] = Default::default();
        let next = AtomicU64::new(0);
        std::thread::scope(|s| -> anyhow::Result<()> {
            let handles: Vec<_> = (0..l.load_threads.clamp(1, items.len()))
                .map(|_| {
                    s.spawn(|| -> anyhow::Result<()> {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                            let Some(&(t, lo, hi)) = items.get(i) else {
                                return Ok(());
                            };
                            // Deterministic contents: one generator per batch.
                            let seed = (t as u64) << 40 | lo;
                            let mut sum = 0;
                            l.db.run(|tx| {
                                let mut rng = SmallRng::seed_from_u64(seed);
                                sum = 0;
                                for id in lo..hi {
                                    let value = rng.gen_range(0..1000);
                                    sum += value;
                                    tx.insert(
                                        &tables[t],
                                        row_key(id),
                                        encode_row(value, &mut rng),
                                    )?;
                                }
                                Ok(())
                            })
                            .with_context(|| format!("loading txbench{} rows {lo}..{hi}", t + 1))?;
                            sums[t].fetch_add(sum, Ordering::Relaxed);
                            l.progress.inc(hi - lo);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
            }
            Ok(())
        })?;
        Ok(Txbench {
            tables,
            rows,
            loaded_sum: sums.map(AtomicI64::into_inner),
            applied: Default::default(),
            update_txns: AtomicU64::new(0),
        })
    }

    fn worker(&self, cfg: &RunConfig, _run: u16, _thread: u16, seed: u64) -> TxbenchWorker {
        let mut params = TxbenchParams::of(cfg);
        params.rows = self.rows;
        params.rows_per_scan = params.rows_per_scan.min(self.rows);
        TxbenchWorker {
            rng: SmallRng::seed_from_u64(seed),
            params,
            table: 0,
            start: 0,
            factor: 1,
            updates: Vec::new(),
        }
    }

    fn next(&self, w: &mut TxbenchWorker) {
        let p = w.params;
        let region = p.region();
        w.table = w.rng.gen_range(0..3);
        w.start = w.rng.gen_range(0..=region - p.rows_per_scan);
        w.factor = w.rng.gen_range(1..=10);
        w.updates.clear();
        if p.update_fraction > 0.0 && w.rng.gen_bool(p.update_fraction.min(1.0)) {
            let n = p.updates() as usize;
            let mut ids: Vec<u64> = Vec::with_capacity(n);
            while ids.len() < n {
                let id = w.rng.gen_range(0..region);
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            ids.sort_unstable();
            for id in ids {
                let mut text = Vec::new();
                random_string(&mut w.rng, &mut text);
                text.remove(0);
                w.updates.push(RowUpdate {
                    id,
                    delta: w.rng.gen_range(-MAX_DELTA..=MAX_DELTA),
                    col: w.rng.gen_range(0..STRINGS),
                    text,
                });
            }
        }
    }

    fn execute(&self, w: &TxbenchWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        let table = &self.tables[w.table];
        let lo = row_key(w.start);
        let hi = row_key(w.start + w.params.rows_per_scan);
        let rows = tx.scan(table, lo..hi)?;
        let sum: i64 = rows
            .iter()
            .filter_map(|(_, v)| {
                v.get(..8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            })
            .sum();
        std::hint::black_box(sum.wrapping_mul(w.factor));
        let target = &self.tables[(w.table + 1) % 3];
        for u in &w.updates {
            tx.update(target, row_key(u.id), |cur| {
                apply_update(cur, u.delta, u.col, &u.text)
            })?;
        }
        Ok(())
    }

    fn committed(&self, w: &mut TxbenchWorker) {
        if !w.updates.is_empty() {
            let d: i64 = w.updates.iter().map(|u| u.delta).sum();
            self.applied[(w.table + 1) % 3].fetch_add(d, Ordering::Relaxed);
            self.update_txns.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Checks every row's format, each table's row count, and that each table's integer sum
    /// is its loaded sum plus the deltas of the committed updates.
    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String> {
        let mut bad = Vec::new();
        let mut sums = Vec::new();
        for t in 0..3 {
            let (n, sum, b) = self.sum_of(db, t)?;
            bad.extend(b);
            if n != self.rows {
                bad.push(format!(
                    "{} has {n} well-formed rows, expected {}",
                    self.tables[t].name(),
                    self.rows
                ));
            }
            let expected = self.loaded_sum[t] + self.applied[t].load(Ordering::Relaxed);
            if sum != expected {
                bad.push(format!(
                    "{}: sum of values {sum}, expected {} (loaded) + {} (committed deltas)",
                    self.tables[t].name(),
                    self.loaded_sum[t],
                    self.applied[t].load(Ordering::Relaxed)
                ));
            }
            sums.push(sum);
        }
        super::fail_if_bad("txbench", bad)?;
        ensure!(
            self.update_txns.load(Ordering::Relaxed) <= ledger.total(),
            "more read-update commits than commits"
        );
        Ok(format!(
            "3 x {} rows well-formed; sums {:?} = loaded + deltas of {} committed read-update \
             transactions (of {} commits)",
            self.rows,
            sums,
            self.update_txns.load(Ordering::Relaxed),
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
    fn rows_round_trip_and_update() {
        let mut rng = SmallRng::seed_from_u64(1);
        let v = encode_row(42, &mut rng);
        let (value, cols) = decode_row(&v).unwrap();
        assert_eq!(value, 42);
        let u = apply_update(Some(&v), -50, 3, b"hello");
        let (value2, cols2) = decode_row(&u).unwrap();
        assert_eq!(value2, -8);
        assert_eq!(&u[cols2[3].clone()], b"hello");
        assert_eq!(&u[cols2[9].clone()], &v[cols[9].clone()]);
        assert!(decode_row(&v[..v.len() - 1]).is_none());
    }

    #[test]
    fn params_and_regions() {
        let cfg = config(
            "txbench",
            &[
                ("table-rows", Value::Int(1000)),
                ("rows-per-scan", Value::Int(100)),
                ("update-fraction", Value::Float(0.2)),
                ("hotspot", Value::from("on")),
            ],
        );
        let p = TxbenchParams::of(&cfg);
        assert_eq!((p.rows, p.rows_per_scan, p.hotspot), (1000, 100, true));
        assert_eq!(p.region(), 100);
        assert_eq!(p.updates(), 20);
    }

    #[test]
    fn runs_and_checks_a_tiny_instance() {
        for (hot, uf) in [("off", 0.0), ("off", 0.5), ("on", 1.0)] {
            let cfg = config(
                "txbench",
                &[
                    ("table-rows", Value::Int(2_000)),
                    ("rows-per-scan", Value::Int(10)),
                    ("update-fraction", Value::Float(uf)),
                    ("hotspot", Value::from(hot)),
                ],
            );
            let db = Database::in_memory_with(cfg.options.clone());
            let w = crate::workloads::testutil::load::<Txbench>(&db, &cfg, 2);
            let ledger = run_txns(&w, &db, &cfg, 200);
            let msg = w.check(&db, &ledger).unwrap();
            assert!(msg.contains("2000 rows"), "{msg}");
            if uf > 0.0 {
                assert!(w.update_txns.load(Ordering::Relaxed) > 0);
            }
            // Corrupt one row: the check must notice.
            db.run(|tx| tx.add_and_get(&w.tables[1], row_key(0), 1).map(|_| ()))
                .unwrap_err();
            db.run(|tx| {
                tx.update(&w.tables[1], row_key(0), |c| {
                    apply_update(c, 1, 0, b"abcde")
                })
            })
            .unwrap();
            assert!(w.check(&db, &ledger).is_err());
        }
    }
}
