//! The configuration of `shoal bench` runs: the command-line names of concurrency control,
//! commit logging and transaction mixes ([`Cc`], [`Log`], [`Mix`]), the settings of a whole sweep ([`Params`]) and one run's
//! typed options ([`RunConfig`]), with the engine options it sweeps in [`engine`]. Kept apart
//! from the harness that runs them, so that the workloads, which read a `RunConfig`, and the
//! harness, which runs the workloads, do not import each other.

pub mod engine;
pub mod portable;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail};
use shoal::{ConcurrencyControl, LogMode, Options};

use crate::dist::KeyDist;
use crate::sweep::{Point, Value};
use crate::workloads::doppel_args::Variant;
use crate::workloads::{tpcc, txbench, ycsb, WorkloadKind};

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

impl fmt::Display for Cc {
    /// The command-line name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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

impl fmt::Display for Log {
    /// The command-line name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A transaction mix as `--mix` names it: TPC-C's or YCSB's (the names do not overlap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// A TPC-C mix: `full` or one transaction alone.
    Tpcc(tpcc::Mix),
    /// A YCSB core workload, `a` to `f`.
    Ycsb(ycsb::Mix),
}

impl Mix {
    /// Parses a `--mix` value (either case, spaces around it ignored); the error names the
    /// valid values.
    pub fn parse(s: &str) -> Result<Mix, String> {
        let m = s.trim().to_ascii_lowercase();
        if let Some(t) = tpcc::Mix::parse(&m) {
            return Ok(Mix::Tpcc(t));
        }
        ycsb::Mix::parse(&m).map(Mix::Ycsb).ok_or_else(|| {
            format!(
                "{s:?} is no transaction mix (TPC-C: full, new-order, payment, order-status, \
                 delivery, stock-level; YCSB: a to f)"
            )
        })
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Mix::Tpcc(m) => m.name(),
            Mix::Ycsb(m) => m.name(),
        }
    }

    /// The workload the mix belongs to.
    pub fn workload(self) -> WorkloadKind {
        match self {
            Mix::Tpcc(_) => WorkloadKind::Tpcc,
            Mix::Ycsb(_) => WorkloadKind::Ycsb,
        }
    }

    /// The TPC-C mix, if it is one.
    pub fn tpcc(self) -> Option<tpcc::Mix> {
        match self {
            Mix::Tpcc(m) => Some(m),
            Mix::Ycsb(_) => None,
        }
    }

    /// The YCSB mix, if it is one.
    pub fn ycsb(self) -> Option<ycsb::Mix> {
        match self {
            Mix::Ycsb(m) => Some(m),
            Mix::Tpcc(_) => None,
        }
    }
}

impl fmt::Display for Mix {
    /// The command-line name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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

/// One run's configuration: a sweep point with its values typed. Every option a workload
/// reads is a field here, typed from the point in one place ([`from_point`](Self::from_point)),
/// which refuses an axis no field reads: a name misspelt in `main.rs` or here fails the
/// sweep instead of leaving the run at a default in silence.
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
    /// TPC-B: probability that a transaction updates branch, teller, account in that order
    /// (`--reverse-fraction`; 0 when not swept).
    pub reverse_fraction: f64,
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
    pub mix: Option<Mix>,
    /// TPC-C: how a transaction's home warehouse is chosen (`--home`; default uniform).
    pub home: crate::workloads::tpcc::Home,
    /// txbench: rows in each table (`--table-rows`).
    pub table_rows: u64,
    /// txbench: rows per range scan (`--rows-per-scan`).
    pub rows_per_scan: u64,
    /// txbench: probability that a transaction is read-update (`--update-fraction`).
    pub update_fraction: f64,
    /// txbench: accesses confined to the first 5% of each table (`--hotspot`).
    pub hotspot: bool,
    /// intents: transactions per million that take an absolute X lock (`--absolute-locks`).
    pub absolute_locks: u64,
    /// incr1: share of the transactions on the hot counter (`--hot-fraction`); `None` on the
    /// other workloads (it tells incr1 from incrz).
    pub hot_fraction: Option<f64>,
    /// incr1: how often the hot counter moves (`--hot-move-every`); `None`: it stays.
    pub hot_move_every: Option<Duration>,
    /// incrz, like, rubis: Zipf exponent of the key popularity (`--alpha`); `None`: the
    /// workload's default.
    pub alpha: Option<f64>,
    /// like: share of the transactions that write (`--write-fraction`).
    pub write_fraction: f64,
    /// rubis: the transaction mix (`--variant`).
    pub variant: Variant,
    /// Doppel: records labelled split from the start (`--split-top`; 0: none).
    pub split_top: u64,
    /// TPC-C: the tiny scale (`tpcc-scale` = `tiny`, the axis `SHOAL_TPCC_TINY` adds).
    pub tpcc_tiny: bool,
    /// The engine options of this run's database.
    pub options: Options,
}

/// Reads a sweep point's values by axis name, noting each name read, so that
/// [`finish`](Self::finish) can refuse an axis that no option of the run reads.
struct Reader<'a> {
    p: &'a Point,
    read: Vec<&'static str>,
}

impl<'a> Reader<'a> {
    /// The value of axis `name`, if the point has it.
    fn get(&mut self, name: &'static str) -> Option<&'a Value> {
        self.read.push(name);
        self.p.get(name)
    }

    /// An integer option; `default` when the point has no such axis (`None`: required).
    fn int(&mut self, name: &'static str, default: Option<u64>) -> anyhow::Result<u64> {
        match (self.get(name), default) {
            (Some(Value::Int(v)), _) => Ok(*v),
            (None, Some(d)) => Ok(d),
            (other, _) => bail!("option {name}: expected an integer, got {other:?}"),
        }
    }

    /// A number option, if the point has it.
    fn opt_float(&mut self, name: &'static str) -> anyhow::Result<Option<f64>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Float(v)) => Ok(Some(*v)),
            Some(Value::Int(v)) => Ok(Some(*v as f64)),
            Some(other) => bail!("option {name}: expected a number, got {other:?}"),
        }
    }

    /// A number option; `default` when the point has no such axis.
    fn float(&mut self, name: &'static str, default: f64) -> anyhow::Result<f64> {
        Ok(self.opt_float(name)?.unwrap_or(default))
    }

    /// A name option, if the point has it.
    fn text(&mut self, name: &'static str) -> anyhow::Result<Option<&'a str>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Text(s)) => Ok(Some(s)),
            Some(other) => bail!("option {name}: expected a name, got {other:?}"),
        }
    }

    /// Fails if the point has an axis that was not read (engine options excepted: they are
    /// typed, and applied by [`Point::settings`]).
    fn finish(self) -> anyhow::Result<()> {
        match self
            .p
            .0
            .iter()
            .find(|(n, v)| !matches!(v, Value::Setting(_)) && !self.read.contains(n))
        {
            Some((n, _)) => bail!("option {n}: no option of a run has this name"),
            None => Ok(()),
        }
    }
}

impl RunConfig {
    /// Types the values of a sweep point; fails on a value of the wrong type and on an axis
    /// that names no option of a run.
    pub fn from_point(p: &Point) -> anyhow::Result<RunConfig> {
        let mut r = Reader {
            p,
            read: Vec::new(),
        };
        let cc = match r.get("cc") {
            Some(Value::Cc(c)) => *c,
            other => bail!("option cc: expected a concurrency control, got {other:?}"),
        };
        let log = match r.get("log") {
            Some(Value::Log(l)) => *l,
            other => bail!("option log: expected a commit logging mode, got {other:?}"),
        };
        let dist = match r.get("dist") {
            None => None,
            Some(Value::Dist(d)) => Some(*d),
            other => bail!("option dist: expected a key distribution, got {other:?}"),
        };
        let mix = match r.get("mix") {
            None => None,
            Some(Value::Mix(m)) => Some(*m),
            other => bail!("option mix: expected a transaction mix, got {other:?}"),
        };
        // TPC-C's scale is its warehouse count.
        let scale = r.int("scale", Some(1))?;
        let scale = r.int("warehouses", Some(scale))?;
        let mut options = Options::default()
            .with_cc(cc.engine())
            .with_log(log.engine());
        for s in p.settings() {
            s.apply(&mut options);
        }
        match r.get("phase-ms") {
            None => {}
            Some(Value::Float(ms)) if ms.is_finite() && *ms > 0.0 => {
                options.doppel.split_phase = Duration::from_secs_f64(ms / 1e3);
            }
            Some(Value::Int(ms)) if *ms > 0 => {
                options.doppel.split_phase = Duration::from_millis(*ms);
            }
            Some(v) => bail!("option phase-ms: expected a positive number, got {v}"),
        }
        let hot_move_every = match r.text("hot-move-every")? {
            None => None,
            Some(s) => {
                Some(engine::parse_duration(s).map_err(|e| anyhow!("option hot-move-every: {e}"))?)
            }
        };
        let variant = match r.text("variant")? {
            None => Variant::C,
            Some(s) => {
                clap::ValueEnum::from_str(s, false).map_err(|e| anyhow!("option variant: {e}"))?
            }
        };
        let home = match r.text("home")? {
            None => crate::workloads::tpcc::Home::Random,
            Some(s) => {
                clap::ValueEnum::from_str(s, false).map_err(|e| anyhow!("option home: {e}"))?
            }
        };
        let hotspot = match r.text("hotspot")? {
            None | Some("off") => false,
            Some("on") => true,
            Some(s) => bail!("option hotspot: expected on or off, got {s}"),
        };
        let tpcc_tiny = match r.text("tpcc-scale")? {
            None | Some("standard") => false,
            Some("tiny") => true,
            Some(s) => bail!("option tpcc-scale: expected standard or tiny, got {s}"),
        };
        let cfg = RunConfig {
            point: p.clone(),
            cc,
            threads: usize::try_from(r.int("threads", None)?)?,
            scale,
            read_ratio: r.float("read-ratio", 0.0)?,
            reverse_fraction: r.float("reverse-fraction", 0.0)?,
            seed: r.int("seed", None)?,
            dist,
            records: r.int("records", Some(1_000_000))?,
            existing_endpoints: r.float("existing-endpoints", 0.5)?,
            field_size: usize::try_from(r.int("field-size", Some(100))?)?,
            mix,
            home,
            table_rows: r.int("table-rows", Some(txbench::DEFAULT_ROWS))?,
            rows_per_scan: r.int("rows-per-scan", Some(10))?,
            update_fraction: r.float("update-fraction", 0.0)?,
            hotspot,
            absolute_locks: r.int("absolute-locks", Some(0))?,
            hot_fraction: r.opt_float("hot-fraction")?,
            hot_move_every,
            alpha: r.opt_float("alpha")?,
            write_fraction: r.float("write-fraction", 0.5)?,
            variant,
            split_top: r.int("split-top", Some(0))?,
            tpcc_tiny,
            options,
        };
        r.finish()?;
        Ok(cfg)
    }

    /// Every sweepable engine option's effective value, by axis name, in the form the
    /// command line takes (`lock-table` → `sharded`, `log-latency` → `0ms`; with Doppel,
    /// `phase-ms` → 20, a number as when swept).
    pub fn engine_options(&self) -> Vec<(&'static str, Value)> {
        let o = &self.options;
        let mut out: Vec<(&'static str, Value)> = engine::Setting::of(o)
            .into_iter()
            .map(|s| (s.axis(), Value::Setting(s)))
            .collect();
        if o.cc == ConcurrencyControl::Doppel {
            let ms = o.doppel.split_phase.as_secs_f64() * 1e3;
            out.push(("phase-ms", Value::Float(ms)));
        }
        out
    }

    /// A configuration for unit tests: the `extra` options, and where they do not say
    /// otherwise concurrency control `cc`, no log, two threads and seed 42 (the workload's
    /// defaults for the rest: scale 1, read ratio 0, ...).
    #[cfg(test)]
    pub fn for_test(cc: &str, extra: &[(&'static str, Value)]) -> RunConfig {
        use clap::ValueEnum;
        let mut p = Point(extra.to_vec());
        let cc = Cc::from_str(cc, false).expect("a --cc name");
        let defaults = [
            ("cc", Value::Cc(cc)),
            ("log", Value::Log(Log::None)),
            ("threads", Value::Int(2)),
            ("seed", Value::Int(42)),
        ];
        for (name, v) in defaults {
            if p.get(name).is_none() {
                p.0.push((name, v));
            }
        }
        RunConfig::from_point(&p).expect("a valid test configuration")
    }

    /// Why this combination cannot run for `workload`, if it cannot (see
    /// [`skip_reason`](Self::skip_reason); adds `--cc atomic` on workloads without an
    /// atomic form).
    pub fn skip_reason_for(&self, workload: Option<WorkloadKind>) -> Option<String> {
        if workload == Some(WorkloadKind::Intents) && self.cc != Cc::TwoPl {
            // Its transactions take intent locks and nothing else: under another control
            // they do nothing, and its check would pass without checking anything.
            return Some(format!(
                "skipping {}: intent locks exist under 2pl only",
                self.point.describe()
            ));
        }
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
        let o = &self.options;
        if o.victim != shoal::Victim::KillYoung
            && !matches!(o.deadlock, shoal::DeadlockPolicy::Dreadlocks(_))
        {
            // The engine refuses this pairing at open; a sweep skips it with its other
            // non-combinations instead of stopping half way.
            return Some(format!(
                "skipping {}: --victim applies to Dreadlocks only; the other --deadlock \
                 policies choose their own victim",
                self.point.describe()
            ));
        }
        None
    }

    /// The per-thread seed of worker `thread`: derived deterministically from `--seed` (the
    /// driver derives it for the runs; tests make the same workers with this).
    #[cfg(test)]
    pub fn thread_seed(&self, thread: usize) -> u64 {
        crate::driver::thread_seed(self.seed, thread)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(extra: &[(&'static str, Value)]) -> Point {
        let mut p = vec![
            ("cc", Value::Cc(Cc::Occ)),
            ("log", Value::Log(Log::Sync)),
            ("threads", Value::Int(2)),
            ("seed", Value::Int(1)),
        ];
        p.extend_from_slice(extra);
        Point(p)
    }

    #[test]
    fn an_axis_no_option_reads_is_refused() {
        let c = RunConfig::from_point(&point(&[("alpha", Value::Float(1.1))])).unwrap();
        assert_eq!(c.alpha, Some(1.1));
        assert_eq!((c.cc, c.options.log), (Cc::Occ, LogMode::Sync));
        let e = RunConfig::from_point(&point(&[("alhpa", Value::Float(1.1))])).unwrap_err();
        assert!(e.to_string().contains("option alhpa"), "{e}");
    }

    #[test]
    fn values_of_the_wrong_type_are_refused() {
        for (name, v) in [
            ("cc", Value::from("occ")),
            ("log", Value::from("sync")),
            ("mix", Value::from("a")),
            ("dist", Value::from("zipf:1")),
            ("alpha", Value::from("1")),
            ("records", Value::Float(1.0)),
            ("hotspot", Value::from("maybe")),
            ("variant", Value::from("z")),
            ("hot-move-every", Value::from("soon")),
        ] {
            let mut p = point(&[]);
            p.0.retain(|(n, _)| *n != name);
            p.0.push((name, v));
            assert!(RunConfig::from_point(&p).is_err(), "accepted {name}");
        }
    }
}
