//! YCSB core workloads A-F (Cooper et al. 2010) on shoal.
//!
//! One table `usertable` of `--records N` rows (default 1,000,000). Keys are 8-byte big-endian
//! record ids (`0..N` loaded, inserts take the next ids), so a scan of `L` records starting at
//! id `s` is the key range `[s, s + L)`. A value is a 16-byte header (the record's id and an
//! update counter, both u64 little-endian) followed by ten fields of `--field-size` bytes
//! (default 100).
//!
//! | mix | operations |
//! |---|---|
//! | `a` | 50% read, 50% update |
//! | `b` | 95% read, 5% update |
//! | `c` | 100% read |
//! | `d` | 95% read of recent records, 5% insert |
//! | `e` | 95% scan of 1-100 records, 5% insert |
//! | `f` | 50% read, 50% read-modify-write |
//!
//! Each operation is one transaction. A read reads the whole record; an update rewrites one
//! random field and bumps the update counter (a read-modify-write of the record: shoal stores a
//! record as one value); a read-modify-write reads the record, then does the same. Records are
//! chosen Zipfian with theta 0.99 by default (YCSB's "zipfian", item numbers scrambled by a hash
//! so the hot records spread over the key space), `--zipf THETA` changes theta (`0` = uniform),
//! `--self-similar H` uses the self-similar distribution instead. Mix `d` reads the latest
//! records: record `newest - X` with `X` drawn from the distribution. Inserts take ids from a
//! shared counter.
//!
//! The consistency check verifies that every row is well formed and carries its own id, that
//! the table holds the loaded records plus every committed insert, and that the update counters
//! add up to the number of committed updates and read-modify-writes.

use std::cell::Cell;
use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, ensure, Context};
use indicatif::ProgressBar;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, Table, Transaction};

use super::{Ledger, Load, Workload};
use crate::config::RunConfig;
use crate::dist::{KeyDist, Sampler};

/// Fields per record.
pub const FIELDS: usize = 10;
/// Bytes before the fields: id and update counter.
const HEADER: usize = 16;
/// Rows per load transaction.
const LOAD_BATCH: u64 = 2_000;
/// Rows per check transaction.
const CHECK_CHUNK: u64 = 10_000;
/// Longest scan of mix `e`.
const MAX_SCAN: u64 = 100;

/// A YCSB core workload mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// 50% read, 50% update.
    A,
    /// 95% read, 5% update.
    B,
    /// Read only.
    C,
    /// 95% read latest, 5% insert.
    D,
    /// 95% short scan, 5% insert.
    E,
    /// 50% read, 50% read-modify-write.
    F,
}

impl Mix {
    /// The command-line name (`a` to `f`).
    pub fn name(self) -> &'static str {
        match self {
            Mix::A => "a",
            Mix::B => "b",
            Mix::C => "c",
            Mix::D => "d",
            Mix::E => "e",
            Mix::F => "f",
        }
    }

    /// Parses a mix name (`a` to `f`, either case).
    pub fn parse(s: &str) -> Option<Mix> {
        match s.to_ascii_lowercase().as_str() {
            "a" => Some(Mix::A),
            "b" => Some(Mix::B),
            "c" => Some(Mix::C),
            "d" => Some(Mix::D),
            "e" => Some(Mix::E),
            "f" => Some(Mix::F),
            _ => None,
        }
    }

    /// Draws an operation: `(update-like fraction, insert fraction)` applied to `x` in [0, 1).
    pub fn op(self, x: f64) -> Op {
        match self {
            Mix::A if x < 0.5 => Op::Update,
            Mix::B if x < 0.05 => Op::Update,
            Mix::D | Mix::E if x < 0.05 => Op::Insert,
            Mix::E => Op::Scan,
            Mix::F if x < 0.5 => Op::ReadModifyWrite,
            _ => Op::Read,
        }
    }
}

/// One YCSB operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Op {
    /// Read one record.
    #[default]
    Read,
    /// Rewrite one field of a record.
    Update,
    /// Insert a new record.
    Insert,
    /// Read up to 100 consecutive records.
    Scan,
    /// Read a record, then rewrite one of its fields.
    ReadModifyWrite,
}

/// The 8-byte key of record `id`.
pub fn key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

/// A record's header: its id and update counter (u64 little-endian each), as both paths
/// write it (the portable YCSB's records too).
pub fn header(v: &[u8]) -> Option<(u64, u64)> {
    let id = u64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    let counter = u64::from_le_bytes(v.get(8..HEADER)?.try_into().ok()?);
    Some((id, counter))
}

/// Per-worker counts, on their own cache line.
#[repr(align(128))]
#[derive(Default)]
struct Counts {
    inserts: AtomicU64,
    updates: AtomicU64,
}

/// A loaded YCSB database.
pub struct Ycsb {
    table: Table,
    records: u64,
    field_size: usize,
    /// Next id to insert.
    next_id: AtomicU64,
    /// Ids below this are known inserted (for mix `d`'s "latest").
    acked: AtomicU64,
    /// Committed inserts and updates, per (run, thread).
    counts: Mutex<HashMap<(u16, u16), Arc<Counts>>>,
}

/// A worker's state.
pub struct YcsbWorker {
    rng: SmallRng,
    mix: Mix,
    sampler: Sampler,
    counts: Arc<Counts>,
    op: Op,
    id: u64,
    len: u64,
    field: usize,
    /// Whether the current update found its record (an id handed out to an insert that has
    /// not committed reads as absent).
    applied: Cell<bool>,
}

/// FNV-1a of the 8 bytes of `x`: scrambles Zipfian item numbers over the key space.
pub fn fnv(x: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in x.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Ycsb {
    /// Creates `usertable` in `db` and loads `records` records of ten `field_size`-byte fields.
    pub fn load(
        db: &Database,
        records: u64,
        field_size: usize,
        load_threads: usize,
        progress: &ProgressBar,
    ) -> anyhow::Result<Ycsb> {
        ensure!(records >= 1, "--records must be at least 1");
        let table = super::create_table(db, "usertable")?;
        let y = Ycsb {
            table,
            records,
            field_size,
            next_id: AtomicU64::new(records),
            acked: AtomicU64::new(records),
            counts: Mutex::new(HashMap::new()),
        };
        let batches: Vec<u64> = (0..records.div_ceil(LOAD_BATCH)).collect();
        super::parallel_load(&batches, load_threads, progress, |&b| {
            let (lo, hi) = (b * LOAD_BATCH, ((b + 1) * LOAD_BATCH).min(records));
            let mut rng = SmallRng::seed_from_u64(records ^ b);
            let rows: Vec<Vec<u8>> = (lo..hi).map(|id| y.new_value(id, &mut rng)).collect();
            db.run(|tx| {
                for (id, v) in (lo..hi).zip(&rows) {
                    tx.insert(&y.table, key(id), v)?;
                }
                Ok(())
            })
            .with_context(|| format!("loading records {lo}..{hi}"))?;
            Ok(hi - lo)
        })?;
        Ok(y)
    }

    fn value_len(&self) -> usize {
        HEADER + FIELDS * self.field_size
    }

    fn new_value(&self, id: u64, rng: &mut SmallRng) -> Vec<u8> {
        let mut v = vec![0u8; self.value_len()];
        v[..8].copy_from_slice(&id.to_le_bytes());
        rng.fill(&mut v[HEADER..]);
        v
    }

    /// Rewrites field `field` of `v` with random bytes and bumps its update counter.
    fn update_value(&self, v: &mut [u8], field: usize, rng_seed: u64) -> shoal::Result<()> {
        if v.len() != self.value_len() {
            return Err(shoal::Error::Unsupported(format!(
                "a usertable value of {} bytes (expected {})",
                v.len(),
                self.value_len()
            )));
        }
        let mut c = [0u8; 8];
        c.copy_from_slice(&v[8..16]);
        v[8..16].copy_from_slice(&(u64::from_le_bytes(c) + 1).to_le_bytes());
        let at = HEADER + field * self.field_size;
        SmallRng::seed_from_u64(rng_seed).fill(&mut v[at..at + self.field_size]);
        Ok(())
    }

    /// Draws a record among those known to exist.
    fn existing(&self, w: &mut YcsbWorker) -> u64 {
        let n = self.acked.load(Ordering::Acquire);
        let x = w.sampler.sample(&mut w.rng);
        if w.mix == Mix::D {
            // Latest: the newest records are the most popular.
            n - 1 - x.min(n - 1)
        } else if matches!(w.sampler, Sampler::Zipf(..)) {
            fnv(x) % n
        } else {
            x.min(n - 1)
        }
    }
}

impl Workload for Ycsb {
    type Worker = YcsbWorker;

    fn load(l: Load<'_>) -> anyhow::Result<Ycsb> {
        Ycsb::load(
            l.db,
            l.cfg.records,
            l.cfg.field_size,
            l.load_threads,
            l.progress,
        )
    }

    fn worker(&self, cfg: &RunConfig, run: u16, thread: u16, seed: u64) -> YcsbWorker {
        let counts = Arc::clone(
            self.counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry((run, thread))
                .or_default(),
        );
        let dist = cfg.dist.unwrap_or(KeyDist::Zipf(0.99));
        YcsbWorker {
            rng: SmallRng::seed_from_u64(seed),
            mix: cfg.mix.and_then(crate::config::Mix::ycsb).unwrap_or(Mix::A),
            sampler: dist.over(self.records),
            counts,
            op: Op::Read,
            id: 0,
            len: 0,
            field: 0,
            applied: Cell::new(false),
        }
    }

    fn next(&self, w: &mut YcsbWorker) {
        w.op = w.mix.op(w.rng.gen());
        w.field = w.rng.gen_range(0..FIELDS);
        w.len = w.rng.gen_range(1..=MAX_SCAN);
        w.id = match w.op {
            Op::Insert => self.next_id.fetch_add(1, Ordering::Relaxed),
            _ => self.existing(w),
        };
    }

    fn execute(&self, w: &YcsbWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        let t = &self.table;
        match w.op {
            Op::Read => {
                tx.get(t, key(w.id))?;
            }
            Op::Scan => {
                let (lo, hi) = (key(w.id), key(w.id + w.len));
                tx.scan(t, (Bound::Included(&lo[..]), Bound::Excluded(&hi[..])))?;
            }
            Op::Update | Op::ReadModifyWrite => {
                // shoal stores the record as one value, so both rewrite it whole. The read
                // takes the record for update (an exclusive lock under 2PL, as the portable
                // path does): a shared lock upgraded at the write would let two updates of
                // one record deadlock, which single-record transactions cannot otherwise do.
                w.applied.set(false);
                if let Some(mut v) = tx.get_for_update(t, key(w.id))? {
                    self.update_value(&mut v, w.field, w.id ^ w.len)?;
                    tx.put(t, key(w.id), v)?;
                    w.applied.set(true);
                }
            }
            Op::Insert => {
                let mut rng = SmallRng::seed_from_u64(w.id);
                tx.insert(t, key(w.id), self.new_value(w.id, &mut rng))?;
            }
        }
        Ok(())
    }

    fn committed(&self, w: &mut YcsbWorker) {
        match w.op {
            Op::Insert => {
                w.counts.inserts.fetch_add(1, Ordering::Relaxed);
                // Later reads may pick ids up to this one; a lower id whose insert has not
                // committed yet (or was given up when a run ended) reads as absent.
                self.acked.fetch_max(w.id + 1, Ordering::AcqRel);
            }
            Op::Update | Op::ReadModifyWrite => {
                if w.applied.get() {
                    w.counts.updates.fetch_add(1, Ordering::Relaxed);
                }
            }
            Op::Read | Op::Scan => {}
        }
    }

    fn check(&self, db: &Database, _ledger: &Ledger) -> anyhow::Result<String> {
        let (mut inserts, mut updates) = (0u64, 0u64);
        for c in self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            inserts += c.inserts.load(Ordering::Relaxed);
            updates += c.updates.load(Ordering::Relaxed);
        }
        let end = self.next_id.load(Ordering::Relaxed);
        let (mut rows, mut counter_sum) = (0u64, 0u64);
        let mut lo = 0;
        while lo < end {
            let hi = (lo + CHECK_CHUNK).min(end);
            let (a, b) = (key(lo), key(hi));
            let chunk = db
                .run(|tx| {
                    tx.scan(
                        &self.table,
                        (Bound::Included(&a[..]), Bound::Excluded(&b[..])),
                    )
                })
                .context("scanning usertable")?;
            for (k, v) in &chunk {
                let id = <[u8; 8]>::try_from(k.as_slice()).map(u64::from_be_bytes)?;
                if v.len() != self.value_len() {
                    bail!(
                        "record {id} has {} bytes, expected {}",
                        v.len(),
                        self.value_len()
                    );
                }
                let (own, counter) = header(v).context("a record's header")?;
                if own != id {
                    bail!("record {id} carries id {own}");
                }
                counter_sum += counter;
                rows += 1;
            }
            lo = hi;
        }
        let beyond = db
            .run(|tx| {
                tx.scan(
                    &self.table,
                    (Bound::Included(&key(end)[..]), Bound::Unbounded),
                )
            })
            .context("scanning usertable")?;
        if !beyond.is_empty() {
            bail!("{} records beyond the last id handed out", beyond.len());
        }
        if rows != self.records + inserts {
            bail!(
                "usertable has {rows} records, expected {} loaded + {inserts} inserted",
                self.records
            );
        }
        if counter_sum != updates {
            bail!("update counters add up to {counter_sum}, but {updates} updates committed");
        }
        Ok(format!(
            "{rows} records ({inserts} inserted), {updates} updates, all well formed"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_have_the_specified_proportions() {
        let mut rng = SmallRng::seed_from_u64(3);
        let n = 100_000;
        let share = |m: Mix, op: Op, rng: &mut SmallRng| {
            (0..n).filter(|_| m.op(rng.gen()) == op).count() as f64 / n as f64
        };
        assert!((share(Mix::A, Op::Update, &mut rng) - 0.5).abs() < 0.01);
        assert!((share(Mix::B, Op::Update, &mut rng) - 0.05).abs() < 0.005);
        assert_eq!(share(Mix::C, Op::Read, &mut rng), 1.0);
        assert!((share(Mix::D, Op::Insert, &mut rng) - 0.05).abs() < 0.005);
        assert!((share(Mix::E, Op::Scan, &mut rng) - 0.95).abs() < 0.005);
        assert!((share(Mix::F, Op::ReadModifyWrite, &mut rng) - 0.5).abs() < 0.01);
        assert_eq!(Mix::parse("E"), Some(Mix::E));
        assert_eq!(Mix::parse("g"), None);
    }

    #[test]
    fn load_run_and_check_every_mix() {
        let db = Database::in_memory();
        let y = Ycsb::load(&db, 500, 8, 2, &ProgressBar::hidden()).unwrap();
        let mixes = [Mix::A, Mix::B, Mix::C, Mix::D, Mix::E, Mix::F];
        for (run, mix) in mixes.into_iter().enumerate() {
            let given = crate::config::Mix::Ycsb(mix).into();
            let cfg = RunConfig::for_test("2pl", &[("mix", given), ("threads", 1u64.into())]);
            let mut w = y.worker(&cfg, run as u16, 0, 7);
            assert_eq!(w.mix, mix);
            for _ in 0..300 {
                y.next(&mut w);
                db.run(|tx| y.execute(&w, tx)).unwrap();
                y.committed(&mut w);
            }
        }
        let msg = y.check(&db, &Ledger::default()).unwrap();
        assert!(msg.contains("all well formed"), "{msg}");
        // An update that bypasses the ledger breaks the counter sum.
        db.run(|tx| {
            let mut v = tx.get(&y.table, key(3))?.unwrap();
            y.update_value(&mut v, 0, 1)?;
            tx.put(&y.table, key(3), v)
        })
        .unwrap();
        assert!(y.check(&db, &Ledger::default()).is_err());
    }
}
