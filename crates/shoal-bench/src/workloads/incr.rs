//! Doppel's INCR microbenchmarks (Narula 2015, §7.2 and §7.4).
//!
//! One table `counters` of `--records` counters (default 1,000,000) under 16-byte keys
//! `k` + 15 hex digits, each an 8-byte little-endian integer loaded as 0. Every transaction
//! adds 1 to one counter:
//!
//! * **incr1** (`--hot-fraction X`): counter 0 is hot; with probability X the transaction adds
//!   to it, otherwise to a uniformly chosen other counter. Types `hot` and `other`. With
//!   `--hot-move-every D` (thesis §7.3, Fig. 7-3) the hot counter moves every D of wall-clock
//!   time since the run started: every thread derives it from the elapsed time since one
//!   start instant shared by the run's workers, and the counter of each period from the run's
//!   seed ([`hot_counter`]), so runs with the same seed move through the same counters.
//! * **incrz** (`--alpha A`): the counter is drawn Zipfian(A) (counter 0 the most popular);
//!   A = 0 is uniform.
//!
//! Under `2pl`, `occ` and `none` the increment is [`Transaction::add_and_get`] (a read-modify-write);
//! under `doppel` it is [`Transaction::add`], which Doppel can split; under `atomic` it
//! is an atomic `fetch_add` on an in-memory array of counters, with no transaction (the
//! thesis' Atomic upper bound). The check: the counters (plus the atomic array) add up to the
//! transactions committed.
//!
//! The portable INCR1 (`crate::portable::incr`, `--engine`) draws its counters with the same
//! [`draw_incr1`]; this shoal-native variant stays apart for what the engine-neutral interface
//! cannot express: Doppel's `add` and split hints, `--cc atomic`, `--hot-move-every`
//! and INCRZ's per-type statistics.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, Table, Transaction};

use super::doppel_args::{key16, label_top, parse_key16};
use super::{load_ids, Ledger, Load, Workload};
use crate::config::{Cc, RunConfig};
use crate::dist::{KeyDist, Sampler};

/// INCR1's draw, both paths' (the portable INCR1 in `crate::portable::incr` too): the hot
/// counter `hot` with probability `hot_fraction`, else one of the other `n - 1` uniformly.
/// Returns the counter and whether it is the hot one.
pub fn draw_incr1(rng: &mut SmallRng, hot_fraction: f64, n: u64, hot: u64) -> (u64, bool) {
    if rng.gen_bool(hot_fraction) {
        (hot, true)
    } else {
        // Uniform over the other counters.
        let r = rng.gen_range(0..n - 1);
        (r + u64::from(r >= hot), false)
    }
}

/// Counters per load transaction.
const LOAD_CHUNK: u64 = 10_000;
/// Counters per check transaction.
const CHECK_CHUNK: u64 = 100_000;

/// The loaded counters.
pub struct Incr {
    table: Table,
    n: u64,
    /// `--cc atomic`: the in-memory counters.
    atomic: Option<Box<[AtomicI64]>>,
    /// Which variant: incr1 (with a hot key) or incrz.
    hot_key: bool,
    /// `--hot-move-every`: the start instant of the current run (by run number), shared by
    /// its workers.
    run_start: Mutex<Option<(u16, Instant)>>,
    /// `--hot-move-every`: the seed of the last run that moved the hot counter and the last
    /// period its workers reached (for the check's summary).
    moves: Mutex<Option<(u64, u64)>>,
}

/// incr1 `--hot-move-every`: when the hot counter moves, and which it is now.
#[derive(Clone, Debug)]
pub struct HotMove {
    start: Instant,
    every: Duration,
    seed: u64,
    n: u64,
    /// The period the worker's current hot counter belongs to.
    period: u64,
}

/// The hot counter of the `period`-th period (0 = the first) of a run with seed `seed` over
/// `n` counters: counter 0 first, then each period a counter other than the previous
/// period's, drawn from the seed and the period number.
pub fn hot_counter(seed: u64, n: u64, period: u64) -> u64 {
    let mut id = 0;
    if n < 2 {
        return id;
    }
    for p in 1..=period {
        let mut rng = SmallRng::seed_from_u64(seed ^ p.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        id = (id + rng.gen_range(1..n)) % n;
    }
    id
}

/// Which period of `every` the instant `now` falls in, counting from `start`.
pub fn hot_period(start: Instant, every: Duration, now: Instant) -> u64 {
    let n = now.saturating_duration_since(start).as_nanos() / every.as_nanos().max(1);
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// A worker's state: the generator and the current counter.
pub struct IncrWorker {
    rng: SmallRng,
    blind: bool,
    /// incr1: share of hot transactions.
    hot_fraction: f64,
    /// incrz: the counter distribution.
    sampler: Sampler,
    id: u64,
    hot: bool,
    key: [u8; 16],
    /// incr1: the hot counter now.
    hot_id: u64,
    /// incr1 `--hot-move-every`: its schedule.
    moving: Option<HotMove>,
}

impl Incr {
    /// Whether the run is incr1 (its point has `hot-fraction`) rather than incrz.
    fn is_incr1(cfg: &RunConfig) -> bool {
        cfg.hot_fraction.is_some()
    }

    fn scan_sum(&self, db: &Database) -> anyhow::Result<(u64, i64)> {
        let (mut rows, mut sum) = (0u64, 0i64);
        let mut lo = 0u64;
        while lo < self.n {
            let hi = (lo + CHECK_CHUNK).min(self.n);
            let (mut a, mut b) = ([0u8; 16], [0u8; 16]);
            let (a, b) = (
                key16(b'k', lo, &mut a).to_vec(),
                key16(b'k', hi, &mut b).to_vec(),
            );
            let chunk = db
                .run(|tx| tx.scan(&self.table, a.clone()..b.clone()))
                .context("scanning counters")?;
            for (k, v) in &chunk {
                let id = parse_key16(k).with_context(|| format!("bad key {k:02x?}"))?;
                let v: [u8; 8] = v.as_slice().try_into().context("a counter value")?;
                if id >= self.n {
                    bail!("counter {id} beyond the {} loaded", self.n);
                }
                sum += i64::from_le_bytes(v);
            }
            rows += chunk.len() as u64;
            lo = hi;
        }
        Ok((rows, sum))
    }
}

impl Workload for Incr {
    type Worker = IncrWorker;

    fn load(l: Load<'_>) -> anyhow::Result<Incr> {
        let n = l.cfg.records.max(2);
        let table = super::create_table(l.db, "counters")?;
        load_ids(
            l.db,
            n,
            LOAD_CHUNK,
            l.load_threads,
            l.progress,
            "counters",
            |tx, i| {
                let mut k = [0u8; 16];
                tx.insert(&table, key16(b'k', i, &mut k), 0i64.to_le_bytes())?;
                Ok(1)
            },
        )?;
        label_top(l.db, l.cfg, &table, b'k', n)?;
        let atomic = (l.cfg.cc == Cc::Atomic).then(|| (0..n).map(|_| AtomicI64::new(0)).collect());
        Ok(Incr {
            table,
            n,
            atomic,
            hot_key: Incr::is_incr1(l.cfg),
            run_start: Mutex::new(None),
            moves: Mutex::new(None),
        })
    }

    fn worker(&self, cfg: &RunConfig, run: u16, _thread: u16, seed: u64) -> IncrWorker {
        let every = cfg.hot_move_every.filter(|d| self.hot_key && !d.is_zero());
        let moving = every.map(|every| {
            // The harness makes every worker of a run before it starts any; the first one
            // made fixes the run's start.
            let mut g = self
                .run_start
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let start = match *g {
                Some((r, t)) if r == run => t,
                _ => {
                    let t = Instant::now();
                    *g = Some((run, t));
                    t
                }
            };
            *self.moves.lock().unwrap_or_else(PoisonError::into_inner) = Some((cfg.seed, 0));
            HotMove {
                start,
                every,
                seed: cfg.seed,
                n: self.n,
                period: 0,
            }
        });
        IncrWorker {
            rng: SmallRng::seed_from_u64(seed),
            blind: cfg.cc == Cc::Doppel,
            hot_fraction: cfg.hot_fraction.unwrap_or(0.0).clamp(0.0, 1.0),
            sampler: KeyDist::Zipf(cfg.alpha.unwrap_or(0.0)).over(self.n),
            id: 0,
            hot: false,
            key: [0; 16],
            hot_id: 0,
            moving,
        }
    }

    fn next(&self, w: &mut IncrWorker) {
        if self.hot_key {
            if let Some(m) = &mut w.moving {
                let p = hot_period(m.start, m.every, Instant::now());
                if p != m.period {
                    m.period = p;
                    w.hot_id = hot_counter(m.seed, m.n, p);
                    let mut g = self.moves.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some((_, last)) = g.as_mut() {
                        *last = (*last).max(p);
                    }
                }
            }
            (w.id, w.hot) = draw_incr1(&mut w.rng, w.hot_fraction, self.n, w.hot_id);
        } else {
            w.id = w.sampler.sample(&mut w.rng);
            w.hot = false;
        }
        key16(b'k', w.id, &mut w.key);
    }

    fn execute(&self, w: &IncrWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        if w.blind {
            tx.add(&self.table, w.key, 1)
        } else {
            tx.add_and_get(&self.table, w.key, 1).map(|_| ())
        }
    }

    fn execute_atomic(&self, w: &IncrWorker) -> bool {
        match &self.atomic {
            Some(a) => {
                a[w.id as usize].fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    fn committed(&self, _w: &mut IncrWorker) {}

    fn kinds(&self) -> &'static [&'static str] {
        if self.hot_key {
            &["hot", "other"]
        } else {
            &["incr"]
        }
    }

    fn kind(&self, w: &IncrWorker) -> usize {
        usize::from(self.hot_key && !w.hot)
    }

    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String> {
        let (rows, sum) = self.scan_sum(db)?;
        if rows != self.n {
            bail!("{rows} counters, expected {}", self.n);
        }
        let atomic: i64 = self
            .atomic
            .iter()
            .flat_map(|a| a.iter())
            .map(|c| c.load(Ordering::Relaxed))
            .sum();
        let total = sum + atomic;
        if total < 0 || total as u64 != ledger.total() {
            bail!(
                "counters add up to {sum} (+ {atomic} atomic adds), but {} transactions \
                 committed",
                ledger.total()
            );
        }
        let hot = if self.hot_key {
            let mut k = [0u8; 16];
            let k = key16(b'k', 0, &mut k);
            let v = db.run(|tx| tx.get_i64(&self.table, k))?.unwrap_or(0);
            let a = self
                .atomic
                .as_ref()
                .map_or(0, |a| a[0].load(Ordering::Relaxed));
            let moves = *self.moves.lock().unwrap_or_else(PoisonError::into_inner);
            match moves {
                Some((seed, last)) => {
                    // The hot counters of the last run, as their keys' hex ids.
                    let ids: Vec<String> = (0..=last.min(99))
                        .map(|p| format!("{:x}", hot_counter(seed, self.n, p)))
                        .collect();
                    format!(
                        ", first hot counter {}; hot counters (hex) {}{}",
                        v + a,
                        ids.join(" "),
                        if last > 99 { " ..." } else { "" }
                    )
                }
                None => format!(", hot counter {}", v + a),
            }
        } else {
            String::new()
        };
        Ok(format!(
            "{} counters add up to {total} commits{}{hot}",
            self.n,
            if self.atomic.is_some() {
                " (atomic adds)"
            } else {
                ""
            }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Value;
    use crate::workloads::testutil::{config_cc as config, open, run_split};

    #[test]
    fn incr1_draws_the_hot_counter_at_its_fraction_and_the_others_uniformly() {
        let mut rng = SmallRng::seed_from_u64(3);
        let mut seen = [0u32; 5];
        for _ in 0..10_000 {
            let (id, hot) = draw_incr1(&mut rng, 0.2, 5, 2);
            assert_eq!(hot, id == 2);
            seen[id as usize] += 1;
        }
        assert!((1_800..2_200).contains(&seen[2]), "{seen:?}");
        for other in [0, 1, 3, 4] {
            assert!((1_800..2_200).contains(&seen[other]), "{seen:?}");
        }
        assert_eq!(draw_incr1(&mut rng, 1.0, 5, 4), (4, true));
        assert_ne!(draw_incr1(&mut rng, 0.0, 5, 4).0, 4);
    }

    /// INCR1 loaded (one thread) under `cc` with `records` counters, a `hot` fraction of the
    /// transactions on the hot counter, and the `extra` options.
    fn hot_incr(
        cc: &str,
        records: u64,
        hot: f64,
        extra: &[(&'static str, Value)],
    ) -> (RunConfig, Database, Incr) {
        let mut x = vec![
            ("records", Value::Int(records)),
            ("hot-fraction", Value::Float(hot)),
        ];
        x.extend_from_slice(extra);
        let cfg = config(cc, &x);
        let db = open(&cfg);
        let w = crate::workloads::testutil::load::<Incr>(&db, &cfg, 1);
        (cfg, db, w)
    }

    /// [`run`] under 2PL, OCC and Doppel.
    fn under_every_cc(extra: &[(&'static str, Value)]) {
        for cc in ["2pl", "occ", "doppel"] {
            run(cc, extra);
        }
    }

    /// 300 transactions on 500 counters (the hottest split under Doppel), checked.
    fn run(cc: &str, extra: &[(&'static str, Value)]) {
        let mut x = vec![("records", Value::Int(500))];
        x.extend_from_slice(extra);
        let cfg = config(cc, &x);
        let db = open(&cfg);
        let w = crate::workloads::testutil::load::<Incr>(&db, &cfg, 2);
        // Split the hottest counter from the start (the classification needs longer).
        let (ledger, _) = run_split(&w, &db, &cfg, 300, 1, |w| {
            db.split_hint(&w.table, b"k000000000000000", shoal::doppel::SplitOp::Add)
                .unwrap();
        });
        let msg = w
            .check(&db, &ledger)
            .unwrap_or_else(|e| panic!("{cc}: {e:#}"));
        assert!(msg.contains("600 commits"), "{msg}");
        let wrong = Ledger {
            by_kind: Vec::new(),
            commits: vec![vec![599]],
        };
        assert!(w.check(&db, &wrong).is_err());
    }

    #[test]
    fn incr1_checks_under_every_cc() {
        under_every_cc(&[("hot-fraction", Value::Float(0.9))]);
    }

    #[test]
    fn incr1_with_a_moving_hot_key_checks_under_every_cc() {
        let moving = [
            ("hot-fraction", Value::Float(0.5)),
            ("hot-move-every", Value::from("1ms")),
        ];
        under_every_cc(&moving);
    }

    #[test]
    fn the_hot_counter_schedule_is_reproducible_and_always_moves() {
        let n = 1000;
        let a: Vec<u64> = (0..50).map(|p| hot_counter(7, n, p)).collect();
        assert_eq!(a[0], 0);
        assert!(a.iter().all(|&id| id < n));
        assert!(a.windows(2).all(|w| w[0] != w[1]), "{a:?}");
        assert_eq!(a, (0..50).map(|p| hot_counter(7, n, p)).collect::<Vec<_>>());
        let b: Vec<u64> = (0..50).map(|p| hot_counter(8, n, p)).collect();
        assert_ne!(a, b, "another seed, other counters");
        assert_eq!(hot_counter(7, 2, 3), 1, "two counters alternate");
        let t0 = Instant::now();
        let every = Duration::from_millis(100);
        assert_eq!(hot_period(t0, every, t0), 0);
        assert_eq!(hot_period(t0, every, t0 + Duration::from_millis(99)), 0);
        assert_eq!(hot_period(t0, every, t0 + Duration::from_millis(250)), 2);
    }

    #[test]
    fn workers_of_a_run_share_the_moving_hot_key() {
        let every = [("hot-move-every", Value::from("5ms"))];
        let (cfg, _db, w) = hot_incr("occ", 1000, 1.0, &every);
        let (mut a, mut b) = (w.worker(&cfg, 0, 0, 1), w.worker(&cfg, 0, 1, 2));
        let start = a.moving.as_ref().unwrap().start;
        assert_eq!(b.moving.as_ref().unwrap().start, start);
        let mut seen = Vec::new();
        while start.elapsed() < Duration::from_millis(30) {
            for st in [&mut a, &mut b] {
                w.next(st);
                assert!(st.hot);
                let p = st.moving.as_ref().unwrap().period;
                assert_eq!(st.id, hot_counter(42, 1000, p));
                if !seen.contains(&st.id) {
                    seen.push(st.id);
                }
            }
        }
        assert!(seen.len() >= 3, "{seen:?}");
        // The next run on this database starts its own schedule.
        let c = w.worker(&cfg, 1, 0, 1);
        assert!(c.moving.as_ref().unwrap().start > start);
    }

    #[test]
    fn incrz_checks_under_every_cc() {
        under_every_cc(&[("alpha", Value::Float(1.4))]);
    }

    #[test]
    fn atomic_adds_count_in_the_check() {
        let (cfg, db, w) = hot_incr("atomic", 100, 1.0, &[]);
        let mut st = w.worker(&cfg, 0, 0, 1);
        for _ in 0..50 {
            w.next(&mut st);
            assert_eq!((st.id, st.hot), (0, true));
            assert!(w.execute_atomic(&st));
        }
        let ledger = Ledger {
            by_kind: Vec::new(),
            commits: vec![vec![50]],
        };
        let msg = w.check(&db, &ledger).unwrap();
        assert!(msg.contains("hot counter 50"), "{msg}");
    }

    #[test]
    fn incrz_popularity_matches_the_thesis_table() {
        // Thesis Table 7.1: with alpha 1.4 over 1M keys the most popular key takes 32.30% of
        // the writes, the second 12.24%.
        let s = KeyDist::Zipf(1.4).over(1_000_000);
        let mut rng = SmallRng::seed_from_u64(5);
        let (mut first, mut second) = (0u32, 0u32);
        for _ in 0..100_000 {
            match s.sample(&mut rng) {
                0 => first += 1,
                1 => second += 1,
                _ => {}
            }
        }
        assert!((31_000..33_600).contains(&first), "{first}");
        assert!((11_500..13_000).contains(&second), "{second}");
    }

    #[test]
    fn incr1_hot_share_follows_the_fraction() {
        let (cfg, _db, w) = hot_incr("2pl", 100, 0.25, &[]);
        let mut st = w.worker(&cfg, 0, 0, 3);
        let mut hot = 0;
        for _ in 0..10_000 {
            w.next(&mut st);
            assert!(st.id < 100);
            assert_eq!(st.hot, st.id == 0);
            hot += usize::from(st.hot);
        }
        assert!((2_200..2_800).contains(&hot), "{hot}");
    }
}
