//! The key-range locking microbenchmark of Kimura et al. 2012 §6.3 (Fig. 3; experiment E1).
//!
//! One small table of `--rows N` counters (default 200, TPC-B's teller table at scale 20),
//! stored under even ids (`2i`, 8-byte big-endian), so odd ids fall between existing keys. A
//! transaction does four range searches and then one update: each search reads an inclusive
//! range of up to [`MAX_SPAN`] ids starting at a uniformly chosen position; with probability
//! `--existing-endpoints P` both of its end points are existing keys, otherwise both fall in
//! gaps between keys. The update adds 1 to a uniformly chosen existing counter.
//!
//! Under 2PL a search that ends in a gap needs only the gap (NS on the prior key in Graefe's
//! design), one that ends on a key locks the key as well; the update takes XN on its key.
//! Graefe's modes let the update run next to a search that only covers the gap below its key;
//! Lomet's modes (`--key-range-modes lomet`) turn that NS into SS, S/X-only locking into SS and
//! XX everywhere. The consistency check: the counters add up to the number of commits.

use std::ops::Bound;

use anyhow::{bail, ensure, Context};
use indicatif::ProgressBar;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, Table, Transaction};

use super::{Ledger, Load, Workload};
use crate::config::RunConfig;

/// Longest search, in ids (so up to about half as many keys).
pub const MAX_SPAN: u64 = 10;
/// Searches per transaction.
const SEARCHES: usize = 4;

fn key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

/// The loaded table.
pub struct KeyRange {
    table: Table,
    rows: u64,
}

/// A worker's state: the current transaction's searches and update.
pub struct KeyRangeWorker {
    rng: SmallRng,
    existing: f64,
    searches: [(u64, u64); SEARCHES],
    update: u64,
}

impl KeyRange {
    /// Creates table `counters` with `rows` counters at 0.
    pub fn load(db: &Database, rows: u64, progress: &ProgressBar) -> anyhow::Result<KeyRange> {
        ensure!(rows >= 2, "--records must be at least 2");
        let table = super::create_table(db, "counters")?;
        for lo in (0..rows).step_by(1000) {
            let hi = (lo + 1000).min(rows);
            db.run(|tx| {
                for i in lo..hi {
                    tx.insert(&table, key(2 * i), 0i64.to_le_bytes())?;
                }
                Ok(())
            })?;
            progress.inc(hi - lo);
        }
        Ok(KeyRange { table, rows })
    }
}

impl Workload for KeyRange {
    type Worker = KeyRangeWorker;

    fn load(l: Load<'_>) -> anyhow::Result<KeyRange> {
        KeyRange::load(l.db, l.cfg.records, l.progress)
    }

    fn worker(&self, cfg: &RunConfig, _run: u16, _thread: u16, seed: u64) -> KeyRangeWorker {
        KeyRangeWorker {
            rng: SmallRng::seed_from_u64(seed),
            existing: cfg.existing_endpoints,
            searches: [(0, 0); SEARCHES],
            update: 0,
        }
    }

    fn next(&self, w: &mut KeyRangeWorker) {
        let top = 2 * self.rows - 1; // the last gap's odd id
        for s in &mut w.searches {
            let on_keys = w.rng.gen_bool(w.existing.clamp(0.0, 1.0));
            let span = w.rng.gen_range(1..=MAX_SPAN);
            let lo = w.rng.gen_range(0..=top.saturating_sub(span));
            // Even ids are keys, odd ids gaps: move both ends to the wanted parity.
            let fix = |x: u64| {
                if x.is_multiple_of(2) == on_keys {
                    x
                } else {
                    x + 1
                }
            };
            let (a, b) = (fix(lo), fix(lo + span));
            *s = (a.min(top), b.min(if on_keys { top - 1 } else { top }));
        }
        w.update = 2 * w.rng.gen_range(0..self.rows);
    }

    fn execute(&self, w: &KeyRangeWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        let mut sum = 0i64;
        for &(a, b) in &w.searches {
            let (a, b) = (key(a), key(b));
            for (_, v) in tx.scan(
                &self.table,
                (Bound::Included(&a[..]), Bound::Included(&b[..])),
            )? {
                sum = sum.wrapping_add(v.first().map_or(0, |&x| i64::from(x)));
            }
        }
        std::hint::black_box(sum);
        tx.add_and_get(&self.table, key(w.update), 1)?;
        Ok(())
    }

    fn committed(&self, _w: &mut KeyRangeWorker) {}

    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String> {
        let mut sum: i64 = 0;
        super::ops::scan_counted(db, &self.table, "counters", self.rows, &mut |k, v| {
            let v: [u8; 8] = v.try_into().context("a counter value")?;
            if k.len() != 8 || k[7] % 2 == 1 {
                bail!("unexpected key {k:02x?}");
            }
            sum += i64::from_le_bytes(v);
            Ok(())
        })?;
        if sum as u64 != ledger.total() {
            bail!(
                "counters add up to {sum}, but {} transactions committed",
                ledger.total()
            );
        }
        Ok(format!("{} counters add up to {sum} commits", self.rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Value;

    #[test]
    fn searches_end_on_keys_or_in_gaps_as_asked() {
        let db = Database::in_memory();
        let k = KeyRange::load(&db, 50, &ProgressBar::hidden()).unwrap();
        for (p, even) in [(1.0, true), (0.0, false)] {
            let cfg = RunConfig::for_test(
                "2pl",
                &[
                    ("existing-endpoints", Value::Float(p)),
                    ("threads", Value::Int(1)),
                ],
            );
            let mut w = k.worker(&cfg, 0, 0, 9);
            for _ in 0..500 {
                k.next(&mut w);
                for &(a, b) in &w.searches {
                    assert!(a <= b && b < 100, "{a}..{b}");
                    assert_eq!((a % 2 == 0, b % 2 == 0), (even, even), "{a}..{b}");
                }
                assert!(w.update.is_multiple_of(2) && w.update < 100);
            }
        }
    }

    #[test]
    fn runs_and_checks() {
        let db = Database::in_memory();
        let k = KeyRange::load(&db, 20, &ProgressBar::hidden()).unwrap();
        let cfg = RunConfig::for_test(
            "2pl",
            &[
                ("existing-endpoints", Value::Float(0.5)),
                ("threads", Value::Int(1)),
            ],
        );
        let mut w = k.worker(&cfg, 0, 0, 1);
        for _ in 0..100 {
            k.next(&mut w);
            db.run(|tx| k.execute(&w, tx)).unwrap();
        }
        let ledger = Ledger {
            by_kind: Vec::new(),
            commits: vec![vec![100]],
        };
        k.check(&db, &ledger).unwrap();
        let wrong = Ledger {
            by_kind: Vec::new(),
            commits: vec![vec![99]],
        };
        assert!(k.check(&db, &wrong).is_err());
    }
}
