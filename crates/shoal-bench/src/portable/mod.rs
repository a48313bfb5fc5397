//! The portable benchmark path of `shoal bench --engine LIST`: TPC-B, YCSB and INCR1 written
//! once against the engine-neutral interface of [`crate::engines`], run on every engine in the
//! list (shoal's modes included) with the same workload code and the same consistency check
//! after every run, through the same [`driver`] as the shoal-native path (its adapter here,
//! `Portable`, opens one engine session per worker thread).
//!
//! Runs are grouped by loaded database: one load per engine and data option (`--scale`,
//! `--records`, `--field-size`), then every thread count, mix and hot fraction on it; the check
//! covers everything committed on that database so far. The table prints each run's throughput
//! beside its ratio to shoal-2pl's on the same workload options.

pub mod incr;
pub mod tpcb;
pub mod ycsb;

pub use crate::config::portable::{LoadCfg, PeerArgs, PortableParams, RunCfg};

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};

use crate::config::Log;
use crate::dist::KeyDist;
use crate::driver::{self, Adapter, Attempt, RunStats, WorkerLoop};
use crate::engines::{
    Durability, EngineKind, KvEngine, KvSession, KvTx, TableId, TxError, TxResult,
};
use crate::report::portable::{render_table, PortableRecord};
use crate::report::{self, Latency, Window};
use crate::workloads::tpcb::Tpcb;
use crate::workloads::{Ledger, WorkloadKind};

/// A workload written against [`KvTx`].
pub trait PortableWorkload: Sized + Sync {
    /// One worker thread's state (its generator and the transaction it is about to run).
    type Worker: Send;

    /// Creates the tables in `engine` and loads them.
    fn load(engine: &dyn KvEngine, cfg: &LoadCfg) -> anyhow::Result<Self>;

    /// Rows loaded, for the report.
    fn rows(&self) -> u64;

    /// The state of worker `thread` for run `run`.
    fn worker(&self, run: &RunCfg, thread: u16, seed: u64) -> Self::Worker;

    /// Draws the next transaction's parameters.
    fn next(&self, st: &mut Self::Worker);

    /// Whether the drawn transaction only reads (default: it may write).
    fn read_only(&self, _st: &Self::Worker) -> bool {
        false
    }

    /// Runs the drawn transaction's operations (not the commit).
    fn execute(&self, st: &mut Self::Worker, tx: &mut dyn KvTx) -> TxResult<()>;

    /// Notes that the drawn transaction committed; returns what the check counts for it
    /// (added up over every thread and run).
    fn committed(&self, st: &mut Self::Worker) -> [u64; 2];

    /// Checks the database against everything committed on it.
    fn check(&self, engine: &dyn KvEngine, done: &Done) -> anyhow::Result<String>;
}

/// Everything committed on one database so far, for its consistency check.
#[derive(Clone, Debug, Default)]
pub struct Done {
    /// The commits of every run and thread, warm-up included.
    pub ledger: Ledger,
    /// What [`PortableWorkload::committed`] counted, added up.
    pub tally: [u64; 2],
}

/// Runs the portable sweep, prints the table and writes the JSON; fails if a consistency check
/// failed or an engine hit a fatal error.
pub fn run(p: &PortableParams) -> anyhow::Result<()> {
    let (records, failure) = execute(p);
    if !records.is_empty() {
        print!("{}", render_table(p, &records));
    }
    if let Some(path) = &p.json {
        report::write_json(path, &records)?;
        eprintln!("wrote {} records to {}", records.len(), path.display());
    }
    if let Some(e) = failure {
        return Err(e);
    }
    if let Some(bad) = records.iter().find(|r| r.check.starts_with("FAILED")) {
        bail!(
            "{} {}: consistency {}",
            bad.engine,
            bad.peer_key(),
            bad.check
        );
    }
    Ok(())
}

/// Runs the sweep: the records of the runs done, and the error that stopped it, if any.
pub fn execute(p: &PortableParams) -> (Vec<PortableRecord>, Option<anyhow::Error>) {
    let mut records = Vec::new();
    let failure = sweep(p, &mut records).err();
    // Ratios to shoal-2pl on the same options.
    let base: BTreeMap<String, f64> = records
        .iter()
        .filter(|r| r.engine == EngineKind::Shoal2pl.name())
        .map(|r| (r.peer_key(), r.throughput))
        .collect();
    for r in &mut records {
        r.vs_shoal_2pl = base
            .get(&r.peer_key())
            .filter(|b| **b > 0.0)
            .map(|b| (r.throughput / b * 1000.0).round() / 1000.0);
    }
    (records, failure)
}

fn sweep(p: &PortableParams, records: &mut Vec<PortableRecord>) -> anyhow::Result<()> {
    for e in &p.engines {
        if !e.available() {
            bail!(
                "engine {} is not built into this binary: rebuild with `--features {}` \
                 (or `--features peers`)",
                e.name(),
                e.feature().unwrap_or("?")
            );
        }
    }
    let mut durabilities = Vec::new();
    for l in &p.logs {
        let d = match l {
            Log::None => Durability::None,
            Log::Sync => Durability::Sync,
            other => bail!(
                "--log {} has no equivalent in the peer engines; use none or sync with --engine",
                other.name()
            ),
        };
        if !durabilities.contains(&(*l, d)) {
            durabilities.push((*l, d));
        }
    }
    let mut loads = Vec::new();
    match p.workload {
        WorkloadKind::Tpcb => {
            for s in &p.scales {
                loads.push(LoadCfg {
                    scale: *s,
                    records: 0,
                    field_size: 0,
                });
            }
        }
        WorkloadKind::Ycsb | WorkloadKind::Incr1 => {
            let recs = p.records.clone().unwrap_or_else(|| vec![1_000_000]);
            let fields = if p.workload == WorkloadKind::Ycsb {
                p.field_sizes.clone()
            } else {
                vec![0]
            };
            for r in &recs {
                for f in &fields {
                    loads.push(LoadCfg {
                        scale: 0,
                        records: *r,
                        field_size: usize::try_from(*f)?,
                    });
                }
            }
        }
        other => bail!(
            "--engine runs tpcb, ycsb and incr1 (the portable workloads), not {}",
            other.name()
        ),
    }
    use crate::workloads::ycsb::Mix;
    let mixes = match (&p.mixes, p.workload) {
        (Some(m), WorkloadKind::Ycsb) => m
            .iter()
            .map(|x| match x.ycsb() {
                Some(y @ (Mix::A | Mix::B | Mix::C | Mix::F)) => Ok(y),
                _ => Err(anyhow!(
                    "--mix {x}: the portable YCSB runs mixes a, b, c and f"
                )),
            })
            .collect::<anyhow::Result<Vec<Mix>>>()?,
        (Some(_), _) => bail!("--mix applies to ycsb only with --engine"),
        // The other workloads draw no mix: one run each.
        (None, _) => vec![Mix::A],
    };
    let hots = match (&p.hot_fractions, p.workload) {
        (Some(h), WorkloadKind::Incr1) => h.clone(),
        (Some(_), _) => bail!("--hot-fraction applies to incr1 only"),
        (None, WorkloadKind::Incr1) => vec![0.1],
        (None, _) => vec![0.0],
    };
    let dist = p.dist.unwrap_or(KeyDist::Zipf(0.99));

    for load in &loads {
        for &(log, dur) in &durabilities {
            for &engine in &p.engines {
                let mut runs = Vec::new();
                for mix in &mixes {
                    for &hot in &hots {
                        for &threads in &p.threads {
                            for &seed in &p.seeds {
                                runs.push(RunCfg {
                                    threads: usize::try_from(threads)?,
                                    mix: *mix,
                                    hot_fraction: hot,
                                    dist,
                                    seed,
                                    run: u16::try_from(runs.len())
                                        .context("too many runs on one database")?,
                                });
                            }
                        }
                    }
                }
                let res = match p.workload {
                    WorkloadKind::Tpcb => {
                        run_group::<Tpcb<TableId>>(p, engine, log, dur, load, &runs, records)
                    }
                    WorkloadKind::Ycsb => {
                        run_group::<ycsb::Ycsb>(p, engine, log, dur, load, &runs, records)
                    }
                    _ => run_group::<incr::Incr1>(p, engine, log, dur, load, &runs, records),
                };
                res?;
            }
        }
    }
    Ok(())
}

/// Loads workload `W` into a fresh database of `engine` and runs `runs` on it.
fn run_group<W: PortableWorkload>(
    p: &PortableParams,
    engine: EngineKind,
    log: Log,
    dur: Durability,
    load: &LoadCfg,
    runs: &[RunCfg],
    out: &mut Vec<PortableRecord>,
) -> anyhow::Result<()> {
    let dir = driver::fresh_dir(
        p.db_dir.as_deref(),
        &format!("shoal-bench-{}-", engine.name()),
    )?;
    let mut db = engine.open(dir.path(), dur)?;
    let t0 = Instant::now();
    let w = W::load(db.as_ref(), load)
        .with_context(|| format!("loading {} into {}", p.workload.name(), engine.name()))?;
    let load_s = t0.elapsed().as_secs_f64();
    eprintln!(
        "loaded {} ({} rows) into {} in {load_s:.1} s",
        p.workload.name(),
        w.rows(),
        engine.name()
    );
    // Untimed (not in `load_s`), before the first warm-up.
    let settled = (db.settle()).with_context(|| format!("settling {}", engine.name()))?;
    if let Some(note) = settled {
        eprintln!("settled {}: {note}", engine.name());
    }
    let mut done = Done::default();
    for run in runs {
        let (m, t) = measure(p, db.as_ref(), &w, run)
            .with_context(|| format!("{} on {}", p.workload.name(), engine.name()))?;
        done.tally[0] += t[0];
        done.tally[1] += t[1];
        done.ledger.commits.push(m.per_thread.clone());
        let check = match w.check(db.as_ref(), &done) {
            Ok(s) => format!("ok: {s}"),
            Err(e) => format!("FAILED: {e:#}"),
        };
        let secs = m.measured.as_secs_f64();
        let rec = PortableRecord {
            workload: p.workload.name().to_string(),
            engine: engine.name().to_string(),
            engine_options: db.describe(),
            log: log.name().to_string(),
            threads: run.threads,
            options: run.options(p.workload, load),
            seed: run.seed,
            load_s: (load_s * 100.0).round() / 100.0,
            window: Window::new(p.duration, p.warmup, (secs * 1000.0).round() / 1000.0, &m),
            throughput: (m.throughput() * 10.0).round() / 10.0,
            vs_shoal_2pl: None,
            latency_us: Latency::from_ns(&m.latency_ns),
            check,
        };
        eprintln!(
            "{} {} threads={} {:?}: {:.0} tps, consistency {}",
            rec.engine,
            rec.log,
            rec.threads,
            rec.options,
            rec.throughput,
            if rec.check.starts_with("ok") {
                "ok"
            } else {
                "FAILED"
            }
        );
        let failed = rec.check.starts_with("FAILED");
        out.push(rec);
        if failed {
            break;
        }
    }
    Ok(())
}

/// Runs `run` on the loaded workload `w` through the shared driver: its statistics and what
/// its commits tally for the check (warm-up included).
fn measure<W: PortableWorkload>(
    p: &PortableParams,
    engine: &dyn KvEngine,
    w: &W,
    run: &RunCfg,
) -> anyhow::Result<(RunStats, [u64; 2])> {
    let win = driver::Window {
        warmup: p.warmup,
        duration: p.duration,
        progress: false,
        sampling: None,
        label: String::new(),
    };
    let a = Portable {
        w,
        engine,
        run,
        tally: Mutex::new([0; 2]),
    };
    let stats =
        driver::measure(&win, &a, run.threads, run.seed)?.map_err(|msg| anyhow!("{msg}"))?;
    let tally = a.tally.into_inner().map_err(|_| anyhow!("poisoned"))?;
    Ok((stats, tally))
}

/// The engine-neutral adapter of the driver: a portable workload on a [`KvEngine`], one
/// session per worker thread.
struct Portable<'a, W> {
    w: &'a W,
    engine: &'a dyn KvEngine,
    run: &'a RunCfg,
    /// What the workers' commits tally for the check, added up as each worker finishes.
    tally: Mutex<[u64; 2]>,
}

impl<W: PortableWorkload> Adapter for Portable<'_, W> {
    type Prepared = W::Worker;
    type Loop<'l>
        = PortableLoop<'l, W>
    where
        Self: 'l;

    fn prepare(&self, thread: usize, seed: u64) -> anyhow::Result<W::Worker> {
        Ok(self.w.worker(self.run, u16::try_from(thread)?, seed))
    }

    fn open(&self, st: W::Worker, _thread: usize) -> Result<PortableLoop<'_, W>, String> {
        let session = (self.engine.session()).map_err(|e| format!("opening a session: {e:#}"))?;
        Ok(PortableLoop {
            w: self.w,
            session,
            st,
            read_only: false,
            tally: [0; 2],
            total: &self.tally,
        })
    }
}

/// One engine-neutral worker: its session and its workload state.
struct PortableLoop<'a, W: PortableWorkload> {
    w: &'a W,
    session: Box<dyn KvSession + 'a>,
    st: W::Worker,
    /// The current transaction only reads (SQLite begins it `DEFERRED`).
    read_only: bool,
    tally: [u64; 2],
    total: &'a Mutex<[u64; 2]>,
}

impl<W: PortableWorkload> WorkerLoop for PortableLoop<'_, W> {
    fn next(&mut self) -> (usize, Instant) {
        self.w.next(&mut self.st);
        self.read_only = self.w.read_only(&self.st);
        (0, Instant::now())
    }

    fn attempt(&mut self, _start: Instant) -> Attempt {
        let res = match self.session.begin(self.read_only) {
            Ok(mut tx) => match self.w.execute(&mut self.st, tx.as_mut()) {
                Ok(()) => tx.commit(),
                Err(e) => {
                    tx.abort();
                    Err(e)
                }
            },
            Err(e) => Err(e),
        };
        match res {
            Ok(()) => Attempt::Committed,
            Err(TxError::Retry(kind, _)) => Attempt::Abort(kind.index()),
            Err(TxError::Fatal(e)) => Attempt::Fatal(format!("fatal engine error: {e:#}")),
        }
    }

    fn committed(&mut self) {
        let t = self.w.committed(&mut self.st);
        self.tally[0] += t[0];
        self.tally[1] += t[1];
    }

    fn finish(self) {
        if let Ok(mut total) = self.total.lock() {
            total[0] += self.tally[0];
            total[1] += self.tally[1];
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    /// A fresh unlogged shoal-2pl engine behind the engine-neutral interface, and the
    /// directory it lives in.
    pub fn shoal_engine() -> (tempfile::TempDir, Box<dyn KvEngine>) {
        let dir = tempfile::tempdir().unwrap();
        let db = EngineKind::Shoal2pl
            .open(dir.path(), Durability::None)
            .unwrap();
        (dir, db)
    }

    fn params(workload: WorkloadKind, engines: &[EngineKind]) -> PortableParams {
        PortableParams {
            workload,
            engines: engines.to_vec(),
            logs: vec![Log::None],
            threads: vec![1, 2],
            scales: vec![1],
            records: Some(vec![2_000]),
            field_sizes: vec![10],
            mixes: None,
            hot_fractions: None,
            dist: None,
            seeds: vec![7],
            warmup: Duration::ZERO,
            duration: Duration::from_millis(300),
            db_dir: None,
            json: None,
        }
    }

    /// `shoal report DIR` over a portable `--json` file names the engine of every row and
    /// the options of each engine: it listed the rows of shoal and its peers alike, under
    /// "engine options of the first run" (shoal's).
    #[test]
    fn the_report_page_names_the_engine_of_each_portable_run() {
        let mut p = params(
            WorkloadKind::Incr1,
            &[EngineKind::Shoal2pl, EngineKind::ShoalOcc],
        );
        p.threads = vec![1];
        p.hot_fractions = Some(vec![0.5]);
        p.duration = Duration::from_millis(100);
        let recs = all_ok(&p);
        let dir = tempfile::tempdir().unwrap();
        report::write_json(&dir.path().join("peers.json"), &recs).unwrap();
        let page = std::fs::read_to_string(crate::html::build(dir.path()).unwrap()).unwrap();
        let from = page.find("<details>").expect("a runs table");
        let table = &page[from..];
        let table = &table[..table.find("</details>").expect("its end")];
        assert!(table.contains("<th>engine</th>"), "{table}");
        for e in ["shoal-2pl", "shoal-occ"] {
            assert!(table.contains(&format!("<td>{e}</td>")), "{e}: {table}");
            assert!(
                table.contains(&format!("engine options of the first {e} run")),
                "{e}: {table}"
            );
        }
    }

    fn all_ok(p: &PortableParams) -> Vec<PortableRecord> {
        let (records, failure) = execute(p);
        if let Some(e) = failure {
            panic!("{e:#}");
        }
        assert_eq!(records.len(), p.engines.len() * p.threads.len());
        for r in &records {
            assert!(r.check.starts_with("ok"), "{} {}", r.engine, r.check);
            assert!(r.window.committed > 0, "{} committed nothing", r.engine);
        }
        records
    }

    /// Runs YCSB mix `mix` and INCR1 with hot fraction `hot` on `engines`, every run
    /// checked; returns INCR1's parameters.
    fn ycsb_and_incr1(engines: &[EngineKind], mix: &str, hot: f64) -> PortableParams {
        let mut y = params(WorkloadKind::Ycsb, engines);
        y.mixes = Some(vec![crate::config::Mix::parse(mix).unwrap()]);
        all_ok(&y);
        let mut i = params(WorkloadKind::Incr1, engines);
        i.hot_fractions = Some(vec![hot]);
        all_ok(&i);
        i
    }

    #[test]
    fn shoal_modes_run_every_portable_workload() {
        let engines = [EngineKind::Shoal2pl, EngineKind::ShoalOcc];
        let recs = all_ok(&params(WorkloadKind::Tpcb, &engines));
        assert_eq!(recs[0].vs_shoal_2pl, Some(1.0));
        assert!(recs[2].vs_shoal_2pl.is_some());
        let i = ycsb_and_incr1(&engines, "a", 0.5);
        let table = render_table(&i, &execute(&i).0);
        assert!(
            table.contains("shoal-occ") && table.contains("vs 2pl"),
            "{table}"
        );
        // Engine, log and options left-aligned under a rule as wide as the header.
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].starts_with("engine     log   options"), "{table}");
        assert_eq!(
            lines[2].chars().count(),
            lines[1].chars().count(),
            "{table}"
        );
        assert!(lines[2].chars().all(|c| c == '-'), "{table}");
        assert!(
            lines[3].starts_with("shoal-2pl  none  hot_fraction=0.5"),
            "{table}"
        );
    }

    #[test]
    fn the_tpcb_check_catches_a_lost_update() {
        let (_dir, db) = shoal_engine();
        let w = Tpcb::<TableId>::load(
            db.as_ref(),
            &LoadCfg {
                scale: 1,
                records: 0,
                field_size: 0,
            },
        )
        .unwrap();
        let none = Done::default();
        assert!(w.check(db.as_ref(), &none).is_ok());
        // Account 5 changes without a history row: the check must notice.
        let account = crate::engines::TableId(2);
        let mut s = db.session().unwrap();
        let mut tx = s.begin(false).unwrap();
        tx.add(account, &5u64.to_be_bytes(), 10).unwrap();
        tx.commit().unwrap();
        let err = w.check(db.as_ref(), &none).unwrap_err().to_string();
        assert!(err.contains("account 5"), "{err}");
    }

    #[test]
    fn engine_lists_parse() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            peers: PeerArgs,
        }
        let c = Cli::try_parse_from([
            "t",
            "--engine",
            "shoal-2pl,shoal-occ,rocksdb-pessimistic,rocksdb-optimistic,sqlite",
        ])
        .unwrap();
        assert_eq!(c.peers.engine, EngineKind::ALL);
        for bad in [
            &["t", "--engine", "mysql"][..],
            &["t", "--engine", "sqlite,,shoal-2pl"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn missing_features_and_logs_are_refused() {
        let mut p = params(WorkloadKind::Tpcb, &[EngineKind::Shoal2pl]);
        p.logs = vec![Log::Async];
        assert!(run(&p).is_err());
        if !EngineKind::Sqlite.available() {
            let p = params(WorkloadKind::Tpcb, &[EngineKind::Sqlite]);
            let err = run(&p).unwrap_err().to_string();
            assert!(err.contains("--features sqlite"), "{err}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_runs_tpcb_ycsb_and_incr1_consistently() {
        let e = [EngineKind::Shoal2pl, EngineKind::Sqlite];
        let recs = all_ok(&params(WorkloadKind::Tpcb, &e));
        assert!(recs[2].vs_shoal_2pl.is_some());
        let mut y = params(WorkloadKind::Ycsb, &[EngineKind::Sqlite]);
        y.mixes = Some(vec![crate::config::Mix::Ycsb(
            crate::workloads::ycsb::Mix::B,
        )]);
        y.threads = vec![2];
        all_ok(&y);
        let mut i = params(WorkloadKind::Incr1, &[EngineKind::Sqlite]);
        i.threads = vec![2];
        i.logs = vec![Log::Sync];
        all_ok(&i);
    }

    #[cfg(feature = "rocksdb")]
    #[test]
    fn rocksdb_runs_tpcb_ycsb_and_incr1_consistently() {
        let e = [
            EngineKind::RocksdbPessimistic,
            EngineKind::RocksdbOptimistic,
        ];
        all_ok(&params(WorkloadKind::Tpcb, &e));
        ycsb_and_incr1(&e, "a", 0.9);
    }
}
