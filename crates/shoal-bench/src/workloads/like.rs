//! Doppel's LIKE benchmark (Narula 2015, §7.5, Fig. 7-5).
//!
//! Two tables of `--records` rows each (default 1,000,000): `users` (key `u` + 15 hex
//! digits; value: the page the user last liked, 8-byte little-endian, −1 when none) and
//! `pages` (key `p` + 15 hex digits; value: the page's like count). Users are drawn uniformly,
//! pages Zipfian(`--alpha`). A share `--write-fraction` of the transactions are `write`s:
//! PUT the user's last like, ADD 1 to the page's count ([`Transaction::add`] under
//! Doppel, so the count can be split; [`Transaction::add_and_get`] otherwise). The rest are `read`s:
//! GET the user's last like and the page's count (stashed while the page is split).
//!
//! The check: the page counts add up to the committed writes, and every user's last like is
//! a page (or none).

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, Table, Transaction};

use super::doppel_args::{key16, label_top, parse_key16};
use super::{load_ids, Ledger, Load, Workload};
use crate::config::{Cc, RunConfig};
use crate::dist::{KeyDist, Sampler};

const LOAD_CHUNK: u64 = 10_000;
const CHECK_CHUNK: u64 = 100_000;

/// The loaded tables.
pub struct Like {
    users: Table,
    pages: Table,
    n: u64,
    /// Write transactions committed on this database.
    writes: AtomicU64,
}

/// A worker's state.
#[derive(Clone)]
pub struct LikeWorker {
    rng: SmallRng,
    blind: bool,
    write_fraction: f64,
    pages: Sampler,
    write: bool,
    page: u64,
    user_key: [u8; 16],
    page_key: [u8; 16],
}

impl Like {
    /// Scans `table` in chunks, calling `f(id, value)` for every row; returns the rows seen.
    fn scan(
        &self,
        db: &Database,
        table: &Table,
        prefix: u8,
        mut f: impl FnMut(u64, &[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<u64> {
        let mut rows = 0;
        let mut lo = 0u64;
        while lo < self.n {
            let hi = (lo + CHECK_CHUNK).min(self.n);
            let (mut a, mut b) = ([0u8; 16], [0u8; 16]);
            let (a, b) = (
                key16(prefix, lo, &mut a).to_vec(),
                key16(prefix, hi, &mut b).to_vec(),
            );
            let chunk = db
                .run(|tx| tx.scan(table, a.clone()..b.clone()))
                .with_context(|| format!("scanning {}", table.name()))?;
            for (k, v) in &chunk {
                let id = parse_key16(k).with_context(|| format!("bad key {k:02x?}"))?;
                f(id, v)?;
            }
            rows += chunk.len() as u64;
            lo = hi;
        }
        Ok(rows)
    }
}

fn int(v: &[u8]) -> anyhow::Result<i64> {
    let b: [u8; 8] = v.try_into().context("an 8-byte integer")?;
    Ok(i64::from_le_bytes(b))
}

impl Workload for Like {
    type Worker = LikeWorker;

    fn rows(cfg: &RunConfig) -> u64 {
        2 * cfg.records
    }

    fn load(l: Load<'_>) -> anyhow::Result<Like> {
        let n = l.cfg.records;
        let users = super::create_table(l.db, "users")?;
        let pages = super::create_table(l.db, "pages")?;
        load_ids(
            l.db,
            n,
            LOAD_CHUNK,
            l.load_threads,
            l.progress,
            "users and pages",
            |tx, i| {
                let mut k = [0u8; 16];
                tx.insert(&users, key16(b'u', i, &mut k), (-1i64).to_le_bytes())?;
                tx.insert(&pages, key16(b'p', i, &mut k), 0i64.to_le_bytes())?;
                Ok(2)
            },
        )?;
        label_top(l.db, l.cfg, &pages, b'p', n)?;
        Ok(Like {
            users,
            pages,
            n,
            writes: AtomicU64::new(0),
        })
    }

    fn worker(&self, cfg: &RunConfig, _run: u16, _thread: u16, seed: u64) -> LikeWorker {
        LikeWorker {
            rng: SmallRng::seed_from_u64(seed),
            blind: cfg.cc == Cc::Doppel,
            write_fraction: cfg.write_fraction.clamp(0.0, 1.0),
            pages: KeyDist::Zipf(cfg.alpha.unwrap_or(1.4)).over(self.n),
            write: false,
            page: 0,
            user_key: [0; 16],
            page_key: [0; 16],
        }
    }

    fn next(&self, w: &mut LikeWorker) {
        w.write = w.rng.gen_bool(w.write_fraction);
        let user = w.rng.gen_range(0..self.n);
        w.page = w.pages.sample(&mut w.rng);
        key16(b'u', user, &mut w.user_key);
        key16(b'p', w.page, &mut w.page_key);
    }

    fn execute(&self, w: &LikeWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        if w.write {
            tx.put(&self.users, w.user_key, (w.page as i64).to_le_bytes())?;
            if w.blind {
                tx.add(&self.pages, w.page_key, 1)
            } else {
                tx.add_and_get(&self.pages, w.page_key, 1).map(|_| ())
            }
        } else {
            let last = tx.get(&self.users, w.user_key)?;
            let count = tx.get_i64(&self.pages, w.page_key)?;
            std::hint::black_box((last, count));
            Ok(())
        }
    }

    fn committed(&self, w: &mut LikeWorker) {
        if w.write {
            self.writes.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn save(&self, w: &mut LikeWorker) -> Option<LikeWorker> {
        let copy = w.clone();
        Some(copy)
    }

    fn kinds(&self) -> &'static [&'static str] {
        &["read", "write"]
    }

    fn kind(&self, w: &LikeWorker) -> usize {
        usize::from(w.write)
    }

    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String> {
        let writes = self.writes.load(Ordering::Relaxed);
        if writes > ledger.total() {
            bail!("{writes} writes counted, but {} commits", ledger.total());
        }
        let mut likes = 0i64;
        let pages = self.scan(db, &self.pages, b'p', |_, v| {
            let c = int(v)?;
            if c < 0 {
                bail!("a negative like count {c}");
            }
            likes += c;
            Ok(())
        })?;
        let mut liked = 0u64;
        let n = self.n;
        let users = self.scan(db, &self.users, b'u', |id, v| {
            let p = int(v)?;
            if p >= 0 {
                liked += 1;
            }
            if p < -1 || p >= n as i64 {
                bail!("user {id} last liked page {p}, which does not exist");
            }
            Ok(())
        })?;
        if pages != n || users != n {
            bail!("{users} users and {pages} pages, expected {n} of each");
        }
        if likes as u64 != writes {
            bail!("page counts add up to {likes}, but {writes} write transactions committed");
        }
        if liked > writes {
            bail!("{liked} users liked a page, but only {writes} writes committed");
        }
        Ok(format!(
            "page counts add up to the {writes} writes; {liked} users liked a page"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Value;
    use crate::workloads::testutil::{config_cc, open, run_split};

    #[test]
    fn like_checks_under_every_cc() {
        for cc in ["2pl", "occ", "doppel"] {
            let cfg = config_cc(
                cc,
                &[
                    ("records", Value::Int(300)),
                    ("alpha", Value::Float(1.4)),
                    ("write-fraction", Value::Float(0.5)),
                ],
            );
            let db = open(&cfg);
            let w = crate::workloads::testutil::load::<Like>(&db, &cfg, 2);
            let (ledger, stats) = run_split(&w, &db, &cfg, 300, 0, |w| {
                db.split_hint(&w.pages, b"p000000000000000", shoal::doppel::SplitOp::Add)
                    .unwrap();
            });
            if let Some(s) = stats {
                // Reads of the split page were stashed and re-run in joined phases.
                assert!(s.stashed > 0, "{s:?}");
            }
            let writes = w.writes.load(Ordering::Relaxed);
            assert!((150..450).contains(&writes), "{cc}: {writes} writes");
            w.check(&db, &ledger)
                .unwrap_or_else(|e| panic!("{cc}: {e:#}"));
            // One more counted write than made breaks the check.
            w.writes.fetch_add(1, Ordering::Relaxed);
            assert!(w.check(&db, &ledger).is_err());
        }
    }
}
