//! The shoal-native path of `shoal bench`: turns sweep points into run configurations, loads
//! databases (sharing one load between runs with the same database options), runs each
//! configuration through the shared [`driver`] (its adapter, [`Native`], runs a [`Workload`] on
//! a shoal [`Database`]) and runs the workload's consistency check after every run.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use shoal::doppel::StashQueue;
use shoal::{Database, Error};

use crate::config::{Cc, Params, RunConfig};
use crate::driver::{self, Attempt, RunStats};
use crate::sweep::{Point, Sweep};
use crate::workloads::incr::Incr;
use crate::workloads::insert::Insert;
use crate::workloads::intents::Intents;
use crate::workloads::keyrange::KeyRange;
use crate::workloads::like::Like;
use crate::workloads::rubis::Rubis;
use crate::workloads::tpcb::Tpcb;
use crate::workloads::tpcc::Tpcc;
use crate::workloads::txbench::Txbench;
use crate::workloads::ycsb::Ycsb;
use crate::workloads::Load;
use crate::workloads::{Ledger, Workload, WorkloadKind};

/// The runs of a sweep, in order, and the notes about skipped combinations.
#[derive(Debug)]
pub struct Plan {
    /// Runs to do, with the database key they share loads by.
    pub runs: Vec<(RunConfig, Point)>,
    /// One note per skipped combination.
    pub skipped: Vec<String>,
}

/// Expands the sweep and drops the combinations that do not apply (whatever the workload;
/// see [`plan_for`]).
#[cfg_attr(not(test), allow(dead_code))]
pub fn plan(sweep: &Sweep) -> anyhow::Result<Plan> {
    plan_for(sweep, None)
}

/// [`plan`] for `workload`: also drops combinations the workload cannot run.
pub fn plan_for(sweep: &Sweep, workload: Option<WorkloadKind>) -> anyhow::Result<Plan> {
    let mut runs = Vec::new();
    let mut skipped = Vec::new();
    for p in sweep.points() {
        let mut cfg = RunConfig::from_point(&p)?;
        if crate::workloads::doppel_args::repeats_without_doppel_axes(&mut cfg, &runs) {
            continue; // --phase-ms and --split-top apply to Doppel only
        }
        if repeats_without_lock_axes(&mut cfg, &runs) {
            continue; // the lock table's options apply to 2PL only
        }
        match cfg.skip_reason_for(workload) {
            Some(why) if skipped.contains(&why) => {}
            Some(why) => skipped.push(why),
            None => runs.push((cfg, sweep.db_key(&p))),
        }
    }
    Ok(Plan { runs, skipped })
}

/// The sweep axes of the lock table, which only 2PL uses; `elr` also changes when a
/// read-only `none` (Serial) commit waits for the log, so it stays on those runs.
const LOCK_ONLY: [&str; 6] = [
    "lock-table",
    "deadlock",
    "victim",
    "intent-locks",
    "key-range-modes",
    "elr",
];

/// Whether `cfg` repeats a planned run once the lock table's options, which its concurrency
/// control does not use, are dropped: as for Doppel's own options, runs that differ only in
/// those are dropped, and the first one kept loses them (its record names no lock table it
/// did not use, and its engine options are the defaults for them).
fn repeats_without_lock_axes(cfg: &mut RunConfig, planned: &[(RunConfig, Point)]) -> bool {
    let cc = cfg.cc;
    let unused = move |axis: &str| {
        LOCK_ONLY.contains(&axis)
            && match cc {
                Cc::TwoPl => false,
                Cc::None => axis != "elr",
                _ => true,
            }
    };
    if !cfg.point.0.iter().any(|(n, _)| unused(n)) {
        return false;
    }
    cfg.point.0.retain(|(n, _)| !unused(n));
    let d = shoal::Options::default();
    let o = &mut cfg.options;
    (o.lock_table, o.deadlock, o.victim) = (d.lock_table, d.deadlock, d.victim);
    (o.intent_locks, o.key_range_modes) = (d.intent_locks, d.key_range_modes);
    if cc != Cc::None {
        o.elr = d.elr;
    }
    planned.iter().any(|(c, _)| c.point == cfg.point)
}

/// Index of a retryable error in [`RunStats::aborts`]; `None` for a fatal error.
fn abort_reason(e: &Error) -> Option<usize> {
    match e {
        Error::Deadlock { .. } => Some(0),
        Error::LockTimeout { .. } => Some(1),
        Error::Conflict { .. } => Some(2),
        _ => None,
    }
}

/// A finished run.
#[derive(Debug)]
pub struct RunResult {
    /// Its configuration.
    pub cfg: RunConfig,
    /// Its measurements.
    pub stats: RunStats,
    /// The consistency check: a summary, or what is wrong.
    pub check: Result<String, String>,
    /// Which run on its loaded database this was (0 = first after the load).
    pub db_run: usize,
    /// Seconds the load of its database took.
    pub load_s: f64,
}

/// Runs every planned run, calling `on_run` after each. Stops at the first fatal engine error
/// or failed consistency check (after reporting that run to `on_run`) and returns it.
///
/// Runs with equal database keys (adjacent, because database axes come first in the sweep)
/// share one loaded database. The consistency check then covers everything committed on that
/// database so far: a [`Ledger`] accumulates each run's commits, warm-up included, and history
/// keys carry the run number, so nothing needs reloading.
pub fn run_plan(
    params: &Params,
    plan: &Plan,
    mut on_run: impl FnMut(&RunResult) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let groups = plan
        .runs
        .iter()
        .enumerate()
        .filter(|(i, (_, k))| *i == 0 || plan.runs[i - 1].1 != *k)
        .count();
    let mut i = 0;
    while i < plan.runs.len() {
        let key = &plan.runs[i].1;
        let end = i + plan.runs[i..].iter().take_while(|(_, k)| k == key).count();
        let group: Vec<&RunConfig> = plan.runs[i..end].iter().map(|(c, _)| c).collect();
        // With --db DIR and several databases, each gets its own subdirectory of DIR.
        let sub = (groups > 1).then(|| {
            key.0
                .iter()
                .map(|(n, v)| format!("{n}-{v}"))
                .collect::<Vec<_>>()
                .join("_")
        });
        run_group(params, &group, key, sub, &mut on_run)?;
        i = end;
    }
    Ok(())
}

/// Loads one database and runs the runs that share it.
fn run_group(
    params: &Params,
    group: &[&RunConfig],
    db_key: &Point,
    group_dir: Option<String>,
    on_run: &mut impl FnMut(&RunResult) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let first = group[0];
    // The temporary directories must outlive the database: declared first, dropped last.
    let tmp;
    let log_tmp;
    let dir = match &params.db_dir {
        Some(d) => match group_dir {
            Some(sub) => d.join(sub),
            None => d.clone(),
        },
        None => {
            tmp = driver::fresh_dir(None, "shoal-bench-")?;
            tmp.path().to_path_buf()
        }
    };
    let mut opts = first.options.clone();
    if let Some(log_dir) = &opts.log_dir {
        // A fresh log directory per database, inside the one given, removed afterwards.
        log_tmp = driver::fresh_dir(Some(log_dir), "shoal-bench-log-")?;
        opts.log_dir = Some(log_tmp.path().to_path_buf());
    }
    let db = Database::open(&dir, opts)
        .with_context(|| format!("opening the database in {}", dir.display()))?;
    if !db.tables().is_empty() {
        bail!(
            "{} already holds a database (tables {}); give --db an empty or new directory",
            dir.display(),
            db.tables().join(", ")
        );
    }
    match params.workload {
        WorkloadKind::Tpcb => run_loaded::<Tpcb>(params, &db, group, db_key, on_run),
        WorkloadKind::Ycsb => run_loaded::<Ycsb>(params, &db, group, db_key, on_run),
        WorkloadKind::Keyrange => run_loaded::<KeyRange>(params, &db, group, db_key, on_run),
        WorkloadKind::Tpcc => run_loaded::<Tpcc>(params, &db, group, db_key, on_run),
        WorkloadKind::Insert => run_loaded::<Insert>(params, &db, group, db_key, on_run),
        WorkloadKind::Txbench => run_loaded::<Txbench>(params, &db, group, db_key, on_run),
        WorkloadKind::Intents => run_loaded::<Intents>(params, &db, group, db_key, on_run),
        WorkloadKind::Tellers => {
            use crate::workloads::tellers::Tellers;
            run_loaded::<Tellers>(params, &db, group, db_key, on_run)
        }
        WorkloadKind::Incr1 | WorkloadKind::Incrz => {
            run_loaded::<Incr>(params, &db, group, db_key, on_run)
        }
        WorkloadKind::Like => run_loaded::<Like>(params, &db, group, db_key, on_run),
        WorkloadKind::Rubis => run_loaded::<Rubis>(params, &db, group, db_key, on_run),
    }
}

/// Loads workload `W` into the empty database `db` and runs the group's runs on it.
fn run_loaded<W: Workload>(
    params: &Params,
    db: &Database,
    group: &[&RunConfig],
    db_key: &Point,
    on_run: &mut impl FnMut(&RunResult) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let first = group[0];
    let rows = W::rows(first);
    let pb = driver::bar(
        params.progress,
        rows,
        "{prefix} [{bar:30}] {human_pos}/{human_len} rows {per_sec} eta {eta}",
    );
    pb.set_prefix(format!("load {}", db_key.describe()));
    let t0 = Instant::now();
    let load_threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let w = W::load(Load {
        db,
        cfg: first,
        load_threads,
        progress: &pb,
    })?;
    let load_s = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    eprintln!(
        "loaded {} ({rows} rows) for {} in {load_s:.1} s",
        params.workload.name(),
        db_key.describe()
    );

    let mut ledger = Ledger::default();
    for (n, cfg) in group.iter().enumerate() {
        let run = u16::try_from(n).context("too many runs on one database")?;
        let stats = measure(params, db, &w, cfg, run)?;
        ledger.commits.push(stats.per_thread.clone());
        ledger.by_kind.push(stats.total_by_type.clone());
        let spin = driver::bar(params.progress, 0, "{spinner} {msg}");
        spin.set_message(format!(
            "checking consistency after {}",
            cfg.point.describe()
        ));
        spin.enable_steady_tick(Duration::from_millis(100));
        let check = w.check(db, &ledger).map_err(|e| format!("{e:#}"));
        spin.finish_and_clear();
        let res = RunResult {
            cfg: (*cfg).clone(),
            stats,
            check,
            db_run: n,
            load_s,
        };
        eprintln!(
            "{}: {:.0} tps, consistency {}",
            cfg.point.describe(),
            res.stats.throughput(),
            if res.check.is_ok() { "ok" } else { "FAILED" }
        );
        on_run(&res)?;
        if let Err(e) = &res.check {
            bail!("{}: {e}", cfg.point.describe());
        }
    }
    Ok(())
}

/// Runs one configuration on a loaded database: warm-up, then the measurement window.
fn measure<W: Workload>(
    params: &Params,
    db: &Database,
    w: &W,
    cfg: &RunConfig,
    run: u16,
) -> anyhow::Result<RunStats> {
    let win = driver::Window {
        warmup: params.warmup,
        duration: params.duration,
        progress: params.progress,
        sampling: params.sampling.map(|s| (s, &cfg.point)),
        label: cfg.point.describe(),
    };
    let native = Native { w, db, cfg, run };
    driver::measure(&win, &native, cfg.threads, cfg.seed)?
        .map_err(|msg| anyhow!("{}: {msg}", cfg.point.describe()))
}

/// The shoal-native adapter of the driver: a [`Workload`] on a [`Database`], begun with
/// `begin_retry` after an abort (wait-die and wound-wait order by the first attempt's age),
/// with Doppel's stash queue and `--cc atomic` (no transaction at all).
struct Native<'a, W> {
    w: &'a W,
    db: &'a Database,
    cfg: &'a RunConfig,
    run: u16,
}

impl<W: Workload> driver::Adapter for Native<'_, W> {
    type Prepared = W::Worker;
    type Loop<'l>
        = NativeLoop<'l, W>
    where
        Self: 'l;

    fn kinds(&self) -> &'static [&'static str] {
        self.w.kinds()
    }

    fn prepare(&self, thread: usize, seed: u64) -> anyhow::Result<W::Worker> {
        Ok(self.w.worker(self.cfg, self.run, thread as u16, seed))
    }

    fn open(&self, st: W::Worker, thread: usize) -> Result<NativeLoop<'_, W>, String> {
        let atomic = self.cfg.cc == Cc::Atomic;
        Ok(NativeLoop {
            w: self.w,
            db: self.db,
            st,
            rerun: None,
            // Doppel: stashed transactions wait here while the worker goes on with new ones.
            stash: (!atomic)
                .then(|| self.db.doppel_stats().map(|_| StashQueue::new(self.db)))
                .flatten(),
            age: None,
            atomic,
            thread,
        })
    }

    fn database(&self) -> Option<&Database> {
        Some(self.db)
    }
}

/// A worker's Doppel stash queue: the saved inputs and first start of stashed transactions.
type Stash<W> = StashQueue<(<W as Workload>::Worker, Instant)>;

/// One shoal-native worker.
struct NativeLoop<'a, W: Workload> {
    w: &'a W,
    db: &'a Database,
    st: W::Worker,
    /// A stashed transaction taken back from the queue: the current one, instead of `st`.
    rerun: Option<W::Worker>,
    stash: Option<Stash<W>>,
    /// The first attempt's age, kept by the restarts of the current transaction.
    age: Option<u64>,
    /// `--cc atomic`: [`Workload::execute_atomic`] instead of a transaction.
    atomic: bool,
    thread: usize,
}

impl<W: Workload> NativeLoop<'_, W> {
    fn cur(&mut self) -> &mut W::Worker {
        self.rerun.as_mut().unwrap_or(&mut self.st)
    }
}

impl<W: Workload> driver::WorkerLoop for NativeLoop<'_, W> {
    fn next(&mut self) -> (usize, Instant) {
        self.age = None;
        // Stashed transactions whose split phase ended run first, then new work.
        let start = match self.stash.as_mut().and_then(|q| q.pop_ready()) {
            Some((saved, first_start)) => {
                self.rerun = Some(saved);
                first_start
            }
            None => {
                self.rerun = None;
                self.w.next(&mut self.st);
                Instant::now()
            }
        };
        let kind = self.w.kind(self.cur());
        (kind, if self.atomic { Instant::now() } else { start })
    }

    fn attempt(&mut self, start: Instant) -> Attempt {
        let (w, db, thread) = (self.w, self.db, self.thread);
        if self.atomic {
            return if w.execute_atomic(&self.st) {
                Attempt::Committed
            } else {
                Attempt::Fatal(format!(
                    "worker thread {thread}: this workload has no --cc atomic form"
                ))
            };
        }
        let mut tx = self.age.map_or_else(|| db.begin(), |a| db.begin_retry(a));
        self.age = Some(tx.age());
        let cur = self.rerun.as_mut().unwrap_or(&mut self.st);
        let res = match w.execute(cur, &mut tx) {
            Ok(()) if w.rollback(cur) => {
                tx.abort();
                return Attempt::RolledBack;
            }
            Ok(()) => tx.commit(),
            Err(e) => {
                tx.abort();
                Err(e)
            }
        };
        match res {
            Ok(()) => Attempt::Committed,
            Err(Error::Stashed { .. }) => {
                let saved = match (self.stash.as_mut(), w.save(cur)) {
                    (Some(q), Some(saved)) => {
                        q.push((saved, start));
                        true
                    }
                    _ => false,
                };
                Attempt::Stashed { saved }
            }
            Err(e) => match abort_reason(&e) {
                Some(r) => Attempt::Abort(r),
                None => Attempt::Fatal(format!("worker thread {thread}: fatal engine error: {e}")),
            },
        }
    }

    fn committed(&mut self) {
        let w = self.w;
        w.committed(self.cur());
    }

    fn finish(self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::engine::Setting;
    use crate::sweep::Axis;
    use shoal::ConcurrencyControl;

    fn sweep(cc: &[Cc], threads: &[u64]) -> Sweep {
        Sweep {
            axes: vec![
                Axis::new("scale", true, [1u64]),
                Axis::new("cc", true, cc.iter().copied()),
                Axis::new("log", true, [crate::config::Log::Sync]),
                Axis::new("threads", false, threads.iter().copied()),
                Axis::new("read-ratio", false, [0.0]),
                Axis::new("seed", false, [42u64]),
                Axis::new("elr", true, [Setting::value("elr", "sx")]),
            ],
        }
    }

    #[test]
    fn none_with_many_threads_is_skipped() {
        let p = plan(&sweep(&[Cc::TwoPl, Cc::None], &[1, 2])).unwrap();
        let runs: Vec<String> = p.runs.iter().map(|(c, _)| c.point.describe()).collect();
        assert_eq!(
            runs,
            [
                "scale=1 cc=2pl log=sync threads=1 read-ratio=0 seed=42 elr=sx",
                "scale=1 cc=2pl log=sync threads=2 read-ratio=0 seed=42 elr=sx",
                "scale=1 cc=none log=sync threads=1 read-ratio=0 seed=42 elr=sx",
            ]
        );
        assert_eq!(p.skipped.len(), 1);
        assert!(
            p.skipped[0].contains("cc=none log=sync threads=2"),
            "{}",
            p.skipped[0]
        );
        // The two 2pl runs share a database, the none run gets its own.
        assert_eq!(p.runs[0].1, p.runs[1].1);
        assert_ne!(p.runs[1].1, p.runs[2].1);
    }

    #[test]
    fn config_is_typed_from_the_point() {
        let p = plan(&sweep(&[Cc::None], &[1])).unwrap();
        let c = &p.runs[0].0;
        assert_eq!((c.cc, c.threads, c.scale, c.seed), (Cc::None, 1, 1, 42));
        assert_eq!(c.cc.engine(), ConcurrencyControl::Serial);
        assert_eq!(c.options.cc, ConcurrencyControl::Serial);
        assert_eq!(c.options.elr, shoal::Elr::Sx);
        assert_eq!(c.dist, None);
    }

    #[test]
    fn thread_seeds_are_deterministic_and_distinct() {
        let c = plan(&sweep(&[Cc::TwoPl], &[4])).unwrap().runs.remove(0).0;
        let seeds: Vec<u64> = (0..4).map(|t| c.thread_seed(t)).collect();
        assert_eq!(seeds, (0..4).map(|t| c.thread_seed(t)).collect::<Vec<_>>());
        for i in 0..4 {
            for j in 0..i {
                assert_ne!(seeds[i], seeds[j]);
            }
        }
    }

    #[test]
    fn abort_reasons_classify_retryable_errors() {
        let d = Error::Deadlock {
            txn: 1,
            resource: "k".into(),
            blocker: "?".into(),
        };
        assert_eq!(abort_reason(&d), Some(0));
        assert_eq!(abort_reason(&Error::EmptyKey), None);
    }
}
