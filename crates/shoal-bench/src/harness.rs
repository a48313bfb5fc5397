//! The measurement harness: turns sweep points into run configurations, loads databases
//! (sharing one load between runs with the same database options), runs worker threads through
//! a warm-up and a measurement window, collects per-thread latency histograms and abort counts,
//! and runs the workload's consistency check after every run.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal::doppel::StashQueue;
use shoal::{ConcurrencyControl, Database, Error, LogMode, Options};

use crate::dist::{parse_dist, KeyDist};
use crate::engine_opts;
use crate::rss;
use crate::sweep::{Point, Sweep, Value};
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
use crate::workloads::{Ledger, Workload, WorkloadKind};

/// Concurrency control as named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Cc {
    /// Strict two-phase locking with key-range locks.
    #[value(name = "2pl")]
    TwoPl,
    /// Silo-style optimistic concurrency control.
    #[value(name = "occ")]
    Occ,
    /// No locking: transactions run one at a time (single worker thread only).
    #[value(name = "none", alias = "serial")]
    None,
    /// Doppel phase reconciliation: OCC in joined phases, per-worker slices for hot records
    /// in split phases; the harness's worker threads are Doppel's workers.
    #[value(name = "doppel")]
    Doppel,
    /// No transaction: one atomic add per operation on an in-memory array (Doppel thesis
    /// §7.2's upper bound; INCR workloads only).
    #[value(name = "atomic")]
    Atomic,
}

impl Cc {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Cc::TwoPl => "2pl",
            Cc::Occ => "occ",
            Cc::None => "none",
            Cc::Doppel => "doppel",
            Cc::Atomic => "atomic",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<Cc> {
        match s {
            "2pl" => Some(Cc::TwoPl),
            "occ" => Some(Cc::Occ),
            "none" | "serial" => Some(Cc::None),
            "doppel" => Some(Cc::Doppel),
            "atomic" => Some(Cc::Atomic),
            _ => None,
        }
    }

    /// The engine setting (`atomic` runs no transactions: its database, used for the load
    /// and the check only, runs OCC).
    pub fn engine(self) -> ConcurrencyControl {
        match self {
            Cc::TwoPl => ConcurrencyControl::TwoPhaseLocking,
            Cc::Occ | Cc::Atomic => ConcurrencyControl::Optimistic,
            Cc::None => ConcurrencyControl::Serial,
            Cc::Doppel => ConcurrencyControl::Doppel,
        }
    }
}

/// Commit logging as named on the command line ([`LogMode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Log {
    /// No write-ahead log: nothing survives the process.
    None,
    /// `commit` returns once its log record is durable (group commit).
    Sync,
    /// `commit` returns once its log record is in the log buffer; flushed within 10 ms.
    Async,
    /// Flush pipelining: `commit` returns once its record is in the buffer, locks are
    /// released when it is durable.
    Pipelined,
}

impl Log {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Log::None => "none",
            Log::Sync => "sync",
            Log::Async => "async",
            Log::Pipelined => "pipelined",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<Log> {
        [Log::None, Log::Sync, Log::Async, Log::Pipelined]
            .into_iter()
            .find(|l| l.name() == s)
    }

    /// The engine setting.
    pub fn engine(self) -> LogMode {
        match self {
            Log::None => LogMode::None,
            Log::Sync => LogMode::Sync,
            Log::Async => LogMode::Async,
            Log::Pipelined => LogMode::Pipelined,
        }
    }
}

/// Settings that hold for the whole sweep (not swept).
#[derive(Clone, Debug)]
pub struct Params {
    /// The workload.
    pub workload: WorkloadKind,
    /// Warm-up before each measurement window.
    pub warmup: Duration,
    /// Length of each measurement window.
    pub duration: Duration,
    /// Database directory; `None` = a fresh temporary directory per loaded database.
    pub db_dir: Option<PathBuf>,
    /// Show progress bars (they are hidden anyway when stderr is not a terminal).
    pub progress: bool,
    /// Per-interval sampling of the measurement window (`--report-interval`, `--csv`).
    pub sampling: Option<crate::interval::Sampling>,
}

/// One run's configuration: a sweep point with its values typed.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The sweep point it came from (every swept option's value).
    pub point: Point,
    /// Concurrency control.
    pub cc: Cc,
    /// Worker threads.
    pub threads: usize,
    /// Workload scale (TPC-B: branches, from `scale`; TPC-C: warehouses, from `warehouses`).
    pub scale: u64,
    /// Probability that a balance update becomes a read.
    pub read_ratio: f64,
    /// Base of the per-thread random seeds.
    pub seed: u64,
    /// How the workload draws its hot keys (TPC-B: the teller, hence the branch); `None`:
    /// the workload's default (uniform for TPC-B, Zipfian 0.99 for YCSB).
    pub dist: Option<KeyDist>,
    /// YCSB: records loaded; keyrange: counters.
    pub records: u64,
    /// keyrange: probability that a search's end points are existing keys.
    pub existing_endpoints: f64,
    /// YCSB: bytes per field.
    pub field_size: usize,
    /// The workload's transaction mix as given (`--mix`), if any (YCSB: `a` to `f`, default
    /// `a`; TPC-C: `full` (default), `new-order`, ...).
    pub mix: Option<String>,
    /// The engine options of this run's database.
    pub options: Options,
}

impl RunConfig {
    /// Types the values of a sweep point.
    pub fn from_point(p: &Point) -> anyhow::Result<RunConfig> {
        let int = |name: &str| match p.get(name) {
            Some(Value::Int(v)) => Ok(*v),
            other => Err(anyhow!("option {name}: expected an integer, got {other:?}")),
        };
        let cc = match p.get("cc") {
            Some(Value::Text(s)) => Cc::parse(s).ok_or_else(|| anyhow!("unknown --cc {s}"))?,
            other => bail!("option cc: expected a name, got {other:?}"),
        };
        let log = match p.get("log") {
            Some(Value::Text(s)) => Log::parse(s).ok_or_else(|| anyhow!("unknown --log {s}"))?,
            other => bail!("option log: expected a name, got {other:?}"),
        };
        let read_ratio = match p.get("read-ratio") {
            None => 0.0,
            Some(Value::Float(v)) => *v,
            other => bail!("option read-ratio: expected a number, got {other:?}"),
        };
        let dist = match p.get("dist") {
            None => None,
            Some(Value::Text(s)) => {
                Some(parse_dist(s).ok_or_else(|| anyhow!("bad key distribution {s}"))?)
            }
            other => bail!("option dist: expected a name, got {other:?}"),
        };
        let opt_int = |name: &str, default: u64| match p.get(name) {
            None => Ok(default),
            Some(Value::Int(v)) => Ok(*v),
            other => Err(anyhow!("option {name}: expected an integer, got {other:?}")),
        };
        let mix = match p.get("mix") {
            None => None,
            Some(Value::Text(s)) => Some(s.clone()),
            other => bail!("option mix: expected a name, got {other:?}"),
        };
        let scale = match p.get("warehouses") {
            Some(_) => int("warehouses")?,
            None => opt_int("scale", 1)?,
        };
        let mut options = Options {
            cc: cc.engine(),
            log: log.engine(),
            ..Options::default()
        };
        engine_opts::apply(p, &mut options)?;
        Ok(RunConfig {
            point: p.clone(),
            cc,
            threads: usize::try_from(int("threads")?)?,
            scale,
            read_ratio,
            seed: int("seed")?,
            dist,
            records: opt_int("records", 1_000_000)?,
            existing_endpoints: match p.get("existing-endpoints") {
                None => 0.5,
                Some(Value::Float(v)) => *v,
                other => bail!("option existing-endpoints: expected a number, got {other:?}"),
            },
            field_size: usize::try_from(opt_int("field-size", 100)?)?,
            mix,
            options,
        })
    }

    /// A configuration for unit tests: scale 1, one thread, 2PL without log, plus the given
    /// axes.
    #[cfg(test)]
    pub fn for_test(extra: &[(&'static str, Value)]) -> RunConfig {
        let mut p = Point(vec![
            ("scale", Value::Int(1)),
            ("cc", Value::from("2pl")),
            ("log", Value::from("none")),
            ("threads", Value::Int(1)),
            ("read-ratio", Value::Float(0.0)),
            ("seed", Value::Int(42)),
        ]);
        p.0.extend(extra.iter().cloned());
        RunConfig::from_point(&p).expect("a valid test configuration")
    }

    /// Why this combination cannot run for `workload`, if it cannot (see
    /// [`skip_reason`](Self::skip_reason); adds `--cc atomic` on workloads without an
    /// atomic form).
    pub fn skip_reason_for(&self, workload: Option<WorkloadKind>) -> Option<String> {
        crate::workloads::doppel_args::skip_reason(self, workload).or_else(|| self.skip_reason())
    }

    /// Why this combination cannot run, if it cannot.
    pub fn skip_reason(&self) -> Option<String> {
        if self.cc == Cc::None && self.threads > 1 {
            return Some(format!(
                "skipping {}: --cc none runs transactions one at a time without locks, \
                 so it runs with one thread only",
                self.point.describe()
            ));
        }
        None
    }

    /// The per-thread seed of worker `thread`: derived deterministically from `--seed`.
    pub fn thread_seed(&self, thread: usize) -> u64 {
        splitmix64(self.seed ^ splitmix64(thread as u64 + 1))
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

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
        match cfg.skip_reason_for(workload) {
            Some(why) if skipped.contains(&why) => {}
            Some(why) => skipped.push(why),
            None => runs.push((cfg, sweep.db_key(&p))),
        }
    }
    Ok(Plan { runs, skipped })
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

/// What one run measured for one transaction type.
#[derive(Clone, Debug)]
pub struct TypeStats {
    /// The type's name ([`Workload::kinds`]).
    pub name: &'static str,
    /// Commits inside the measurement window.
    pub committed: u64,
    /// Expected rollbacks inside the measurement window ([`Workload::rollback`]).
    pub rolled_back: u64,
    /// Aborts inside the measurement window, by reason: deadlock, lock timeout, conflict.
    pub aborts: [u64; 3],
    /// Doppel: attempts stashed inside the measurement window (each re-run in the next
    /// joined phase; not aborts).
    pub stashed: u64,
    /// Latency of committed transactions in the window, retries included, in nanoseconds.
    pub latency_ns: Histogram<u64>,
}

impl TypeStats {
    /// Empty statistics for the type called `name`.
    pub fn new(name: &'static str) -> TypeStats {
        TypeStats {
            name,
            committed: 0,
            rolled_back: 0,
            aborts: [0; 3],
            stashed: 0,
            latency_ns: new_hist(),
        }
    }

    /// All measured aborts of this type.
    pub fn aborted(&self) -> u64 {
        self.aborts.iter().sum()
    }

    fn merge(&mut self, o: &TypeStats) {
        self.committed += o.committed;
        self.rolled_back += o.rolled_back;
        self.stashed += o.stashed;
        for (a, b) in self.aborts.iter_mut().zip(o.aborts) {
            *a += b;
        }
        self.latency_ns
            .add(&o.latency_ns)
            .expect("same histogram bounds");
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RunStats {
    /// Commits inside the measurement window.
    pub committed: u64,
    /// Commits in the whole run, warm-up included (= history rows written).
    pub total_committed: u64,
    /// Aborts inside the measurement window, by reason: deadlock, lock timeout, conflict.
    pub aborts: [u64; 3],
    /// Actual length of the measurement window.
    pub measured: Duration,
    /// Latency of committed transactions in the window, retries included, in nanoseconds.
    pub latency_ns: Histogram<u64>,
    /// Commits per thread in the whole run.
    pub per_thread: Vec<u64>,
    /// Expected rollbacks inside the measurement window (not retried, not failures).
    pub rolled_back: u64,
    /// The same measurements per transaction type, in [`Workload::kinds`] order.
    pub per_type: Vec<TypeStats>,
    /// Resident memory (KiB) when the run started (database loaded, no worker yet).
    pub rss_start_kb: Option<u64>,
    /// Resident memory (KiB) at the end of the measurement window, workers still alive.
    pub rss_end_kb: Option<u64>,
    /// Peak resident memory (KiB) during the run (the peak is reset at its start).
    pub peak_rss_kb: Option<u64>,
    /// The lock table's footprint (lock names, request entries) when the run started and
    /// at the end of its measurement window.
    pub lock_footprint: Option<[(usize, usize); 2]>,
    /// Per-interval samples of the measurement window (empty unless sampling).
    pub intervals: Vec<crate::interval::Sample>,
    /// Doppel: attempts stashed inside the measurement window (re-run in a joined phase).
    pub stashed: u64,
    /// Doppel: the runtime's counters over the run (`None` unless `--cc doppel`).
    pub doppel: Option<crate::workloads::doppel_args::DoppelRun>,
}

impl RunStats {
    /// Measured commits per second.
    pub fn throughput(&self) -> f64 {
        let s = self.measured.as_secs_f64();
        if s > 0.0 {
            self.committed as f64 / s
        } else {
            0.0
        }
    }

    /// All measured aborts.
    pub fn aborted(&self) -> u64 {
        self.aborts.iter().sum()
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

fn bar(params: &Params, len: u64, template: &str) -> ProgressBar {
    if !params.progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb
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
            tmp = tempfile::Builder::new()
                .prefix("shoal-bench-")
                .tempdir()
                .context("creating a temporary database directory")?;
            tmp.path().to_path_buf()
        }
    };
    let mut opts = first.options.clone();
    if let Some(log_dir) = &opts.log_dir {
        // A fresh log directory per database, inside the one given, removed afterwards.
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("creating the log directory {}", log_dir.display()))?;
        log_tmp = tempfile::Builder::new()
            .prefix("shoal-bench-log-")
            .tempdir_in(log_dir)
            .with_context(|| format!("creating a log directory in {}", log_dir.display()))?;
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
    let pb = bar(
        params,
        rows,
        "{prefix} [{bar:30}] {human_pos}/{human_len} rows {per_sec} eta {eta}",
    );
    pb.set_prefix(format!("load {}", db_key.describe()));
    let t0 = Instant::now();
    let load_threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let w = W::load(db, first, load_threads, &pb)?;
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
        let spin = bar(params, 0, "{spinner} {msg}");
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

/// Phases of a run's control word (shared with the portable path).
pub(crate) const WARMUP: u8 = 0;
pub(crate) const MEASURE: u8 = 1;
pub(crate) const STOP: u8 = 2;

/// A counter on its own cache line, so per-thread progress counters do not false-share.
#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicU64);

struct Control {
    phase: AtomicU8,
    fatal: Mutex<Option<String>>,
    commits: Vec<Padded>,
    /// Per-interval sampling's counters and histograms, when sampling.
    probe: Option<crate::interval::Probe>,
}

impl Control {
    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }

    fn fail(&self, msg: String) {
        self.fatal.lock().unwrap().get_or_insert(msg);
        self.phase.store(STOP, Ordering::Release);
    }
}

struct WorkerOut {
    total: u64,
    per_type: Vec<TypeStats>,
}

pub(crate) fn new_hist() -> Histogram<u64> {
    // 1 ns .. ~18 minutes at 3 significant digits.
    Histogram::new_with_bounds(1, 1 << 40, 3).expect("valid histogram bounds")
}

/// Waits before retry `attempt` of an aborted transaction: yield at first, then a random sleep
/// growing to about a millisecond.
pub(crate) fn backoff(attempt: u32, rng: &mut SmallRng) {
    if attempt <= 2 {
        std::thread::yield_now();
    } else {
        let cap = 1u64 << attempt.min(10);
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..cap)));
    }
}

/// How one transaction of a worker ended.
enum Outcome {
    Committed,
    RolledBack,
    /// Doppel stashed it and its inputs went to the worker's stash queue.
    Stashed,
    /// The run is over (or failed).
    Stop,
}

/// A worker's Doppel stash queue: the saved inputs and first start of stashed transactions.
type Stash<W> = StashQueue<(<W as Workload>::Worker, Instant)>;

fn worker<W: Workload>(
    w: &W,
    db: &Database,
    ctl: &Control,
    mut st: W::Worker,
    thread: usize,
    seed: u64,
) -> WorkerOut {
    let mut out = WorkerOut {
        total: 0,
        per_type: w.kinds().iter().map(|n| TypeStats::new(n)).collect(),
    };
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
    // Doppel: stashed transactions wait here while the worker goes on with new ones.
    let mut stash: Option<Stash<W>> = db.doppel_stats().map(|_| StashQueue::new(db));
    while ctl.phase() != STOP {
        // Stashed transactions whose split phase ended run first, then new work.
        let (mut rerun, start) = match stash.as_mut().and_then(|q| q.pop_ready()) {
            Some((saved, first_start)) => (Some(saved), first_start),
            None => {
                w.next(&mut st);
                (None, Instant::now())
            }
        };
        let cur = rerun.as_mut().unwrap_or(&mut st);
        let kind = w.kind(cur).min(out.per_type.len() - 1);
        match run_one(
            w, db, ctl, cur, kind, start, &mut stash, &mut out, thread, &mut rng,
        ) {
            Outcome::Stop => break,
            Outcome::Stashed => continue,
            Outcome::RolledBack => {
                if ctl.phase() == MEASURE {
                    out.per_type[kind].rolled_back += 1;
                }
                continue;
            }
            Outcome::Committed => {}
        }
        let elapsed = start.elapsed();
        w.committed(cur);
        out.total += 1;
        ctl.commits[thread].0.fetch_add(1, Ordering::Relaxed);
        if ctl.phase() == MEASURE {
            let t = &mut out.per_type[kind];
            t.committed += 1;
            let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
            t.latency_ns.saturating_record(ns);
            if let Some(p) = &ctl.probe {
                p.commit(thread, ns);
            }
        }
    }
    out
}

/// Runs the transaction `cur` describes until it commits, rolls back as the workload asks,
/// is stashed into `stash`, or the run stops; aborts are counted and backed off.
#[allow(clippy::too_many_arguments)]
fn run_one<W: Workload>(
    w: &W,
    db: &Database,
    ctl: &Control,
    cur: &mut W::Worker,
    kind: usize,
    start: Instant,
    stash: &mut Option<Stash<W>>,
    out: &mut WorkerOut,
    thread: usize,
    rng: &mut SmallRng,
) -> Outcome {
    let mut attempt = 0u32;
    // A restart keeps the first attempt's age (wait-die and wound-wait order by it).
    let mut age = None;
    loop {
        let mut tx = age.map_or_else(|| db.begin(), |a| db.begin_retry(a));
        age = Some(tx.age());
        let res = match w.execute(cur, &mut tx) {
            Ok(()) if w.rollback(cur) => {
                tx.abort();
                return Outcome::RolledBack;
            }
            Ok(()) => tx.commit(),
            Err(e) => {
                tx.abort();
                Err(e)
            }
        };
        match res {
            Ok(()) => return Outcome::Committed,
            // Doppel: neither an abort nor a reason to back off. The inputs go to the stash
            // queue and the worker goes on; a workload that cannot save them makes the next
            // begin() wait for the joined phase (the wait counts in the latency).
            Err(Error::Stashed { .. }) => {
                if ctl.phase() == MEASURE {
                    out.per_type[kind].stashed += 1;
                }
                if ctl.phase() == STOP {
                    return Outcome::Stop;
                }
                if let Some(q) = stash.as_mut() {
                    if let Some(saved) = w.save(cur) {
                        q.push((saved, start));
                        return Outcome::Stashed;
                    }
                }
            }
            Err(e) => match abort_reason(&e) {
                Some(r) => {
                    if ctl.phase() == MEASURE {
                        out.per_type[kind].aborts[r] += 1;
                        if let Some(p) = &ctl.probe {
                            p.abort(thread);
                        }
                    }
                    if ctl.phase() == STOP {
                        return Outcome::Stop;
                    }
                    attempt += 1;
                    backoff(attempt, rng);
                }
                None => {
                    ctl.fail(format!("worker thread {thread}: fatal engine error: {e}"));
                    return Outcome::Stop;
                }
            },
        }
    }
}

/// `--cc atomic`: each operation of a transaction is a plain atomic memory operation
/// ([`Workload::execute_atomic`]), with no transaction around it.
fn atomic_worker<W: Workload>(w: &W, ctl: &Control, mut st: W::Worker, thread: usize) -> WorkerOut {
    let mut out = WorkerOut {
        total: 0,
        per_type: w.kinds().iter().map(|n| TypeStats::new(n)).collect(),
    };
    while ctl.phase() != STOP {
        w.next(&mut st);
        let kind = w.kind(&st).min(out.per_type.len() - 1);
        let start = Instant::now();
        if !w.execute_atomic(&st) {
            ctl.fail(format!(
                "worker thread {thread}: this workload has no --cc atomic form"
            ));
            break;
        }
        let elapsed = start.elapsed();
        w.committed(&mut st);
        out.total += 1;
        ctl.commits[thread].0.fetch_add(1, Ordering::Relaxed);
        if ctl.phase() == MEASURE {
            let t = &mut out.per_type[kind];
            t.committed += 1;
            t.latency_ns
                .saturating_record(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
        }
    }
    out
}

/// Runs one configuration on a loaded database: warm-up, then the measurement window.
fn measure<W: Workload>(
    params: &Params,
    db: &Database,
    w: &W,
    cfg: &RunConfig,
    run: u16,
) -> anyhow::Result<RunStats> {
    let ctl = Control {
        phase: AtomicU8::new(if params.warmup.is_zero() {
            MEASURE
        } else {
            WARMUP
        }),
        fatal: Mutex::new(None),
        commits: (0..cfg.threads).map(|_| Padded::default()).collect(),
        probe: params
            .sampling
            .map(|_| crate::interval::Probe::new(cfg.threads)),
    };
    let mut sampler = params
        .sampling
        .map(|s| crate::interval::Sampler::new(s, &cfg.point));
    let total = params.warmup + params.duration;
    let pb = if params.sampling.is_some_and(|s| s.print) {
        ProgressBar::hidden() // the interval lines replace the bar
    } else {
        bar(
            params,
            total.as_secs().max(1),
            "{prefix} [{bar:30}] {pos}/{len}s {msg}",
        )
    };
    let commits_now = |ctl: &Control| -> u64 {
        ctl.commits
            .iter()
            .map(|p| p.0.load(Ordering::Relaxed))
            .sum()
    };
    pb.set_prefix(cfg.point.describe());
    rss::reset_peak();
    let rss_start_kb = rss::current_kb();
    let mut rss_end_kb = None;
    let footprint = |db: &Database| {
        let f = db.lock_table_footprint();
        (f.heads, f.entries)
    };
    let lock_start = footprint(db);
    let gauges = || {
        let (lock_heads, lock_entries) = footprint(db);
        crate::interval::Gauges {
            rss_kb: rss::current_kb(),
            lock_heads,
            lock_entries,
        }
    };
    let mut lock_end = lock_start;
    let mut dop = crate::workloads::doppel_args::DoppelSampler::new(db);
    let mut dop_end = None;
    let (outs, measured) = std::thread::scope(|s| -> anyhow::Result<_> {
        let mut handles = Vec::with_capacity(cfg.threads);
        for t in 0..cfg.threads {
            let seed = cfg.thread_seed(t);
            let st = w.worker(cfg, run, t as u16, seed);
            let ctl = &ctl;
            let h = std::thread::Builder::new()
                .name(format!("bench-{t}"))
                .spawn_scoped(s, move || {
                    if cfg.cc == Cc::Atomic {
                        atomic_worker(w, ctl, st, t)
                    } else {
                        worker(w, db, ctl, st, t, seed)
                    }
                })
                .context("spawning a worker thread")?;
            handles.push(h);
        }
        let start = Instant::now();
        let mut measure_start = if params.warmup.is_zero() {
            Some(start)
        } else {
            None
        };
        if let (Some(s), Some(p), Some(t)) = (&mut sampler, &ctl.probe, measure_start) {
            s.start(t, 0, p);
        }
        let mut last_tick = start;
        let mut last_commits = 0u64;
        let measured = loop {
            std::thread::sleep(Duration::from_millis(10));
            let now = Instant::now();
            let el = now - start;
            if ctl.phase() == STOP {
                break Duration::ZERO; // a fatal error
            }
            if measure_start.is_none() && el >= params.warmup {
                ctl.phase.store(MEASURE, Ordering::Release);
                measure_start = Some(now);
                if let (Some(s), Some(p)) = (&mut sampler, &ctl.probe) {
                    s.start(now, commits_now(&ctl), p);
                }
            }
            if measure_start.is_some() {
                dop.tick(db);
            }
            // The window ends `duration` after it started (not at warm-up + duration from
            // the start: on a loaded machine the first tick can come late).
            if measure_start.is_some_and(|m| now - m >= params.duration) {
                rss_end_kb = rss::current_kb();
                lock_end = footprint(db);
                dop_end = dop.finish(db);
                ctl.phase.store(STOP, Ordering::Release);
                if let (Some(s), Some(p)) = (&mut sampler, &ctl.probe) {
                    s.finish(now, commits_now(&ctl), p, gauges);
                }
                break now - measure_start.unwrap_or(now);
            }
            if let (Some(s), Some(p)) = (&mut sampler, &ctl.probe) {
                s.tick(now, commits_now(&ctl), p, gauges);
            }
            if now - last_tick >= Duration::from_secs(1) {
                let c: u64 = ctl
                    .commits
                    .iter()
                    .map(|p| p.0.load(Ordering::Relaxed))
                    .sum();
                let tps = (c - last_commits) as f64 / (now - last_tick).as_secs_f64();
                last_commits = c;
                last_tick = now;
                let phase = if measure_start.is_some() {
                    "measure"
                } else {
                    "warmup"
                };
                pb.set_message(format!("{phase} {tps:.0} tps"));
                pb.set_position(el.as_secs());
            }
        };
        let outs: Vec<WorkerOut> = handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("a worker thread panicked")))
            .collect::<anyhow::Result<_>>()?;
        Ok((outs, measured))
    })?;
    pb.finish_and_clear();
    if let Some(msg) = ctl.fatal.lock().unwrap().take() {
        bail!("{}: {msg}", cfg.point.describe());
    }
    let mut stats = RunStats {
        committed: 0,
        total_committed: 0,
        aborts: [0; 3],
        measured,
        latency_ns: new_hist(),
        per_thread: Vec::with_capacity(outs.len()),
        rolled_back: 0,
        per_type: w.kinds().iter().map(|n| TypeStats::new(n)).collect(),
        rss_start_kb,
        rss_end_kb,
        peak_rss_kb: rss::peak_kb(),
        lock_footprint: Some([lock_start, lock_end]),
        intervals: sampler.map(|s| s.samples).unwrap_or_default(),
        stashed: 0,
        doppel: dop_end,
    };
    for o in outs {
        stats.total_committed += o.total;
        stats.per_thread.push(o.total);
        for (mine, theirs) in stats.per_type.iter_mut().zip(&o.per_type) {
            mine.merge(theirs);
        }
    }
    for t in &stats.per_type {
        stats.committed += t.committed;
        stats.rolled_back += t.rolled_back;
        stats.stashed += t.stashed;
        for (a, b) in stats.aborts.iter_mut().zip(t.aborts) {
            *a += b;
        }
        stats
            .latency_ns
            .add(&t.latency_ns)
            .expect("same histogram bounds");
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Axis;

    fn sweep(cc: &[&str], threads: &[u64]) -> Sweep {
        Sweep {
            axes: vec![
                Axis::new("scale", true, [1u64]),
                Axis::new("cc", true, cc.iter().copied()),
                Axis::new("log", true, ["sync"]),
                Axis::new("threads", false, threads.iter().copied()),
                Axis::new("read-ratio", false, [0.0]),
                Axis::new("seed", false, [42u64]),
                Axis::new("elr", true, ["sx"]),
            ],
        }
    }

    #[test]
    fn none_with_many_threads_is_skipped() {
        let p = plan(&sweep(&["2pl", "none"], &[1, 2])).unwrap();
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
        let p = plan(&sweep(&["none"], &[1])).unwrap();
        let c = &p.runs[0].0;
        assert_eq!((c.cc, c.threads, c.scale, c.seed), (Cc::None, 1, 1, 42));
        assert_eq!(c.cc.engine(), ConcurrencyControl::Serial);
        assert_eq!(c.options.cc, ConcurrencyControl::Serial);
        assert_eq!(c.options.elr, shoal::Elr::Sx);
        assert_eq!(c.dist, None);
    }

    #[test]
    fn thread_seeds_are_deterministic_and_distinct() {
        let c = plan(&sweep(&["2pl"], &[4])).unwrap().runs.remove(0).0;
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
