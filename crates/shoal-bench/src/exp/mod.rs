//! `shoal exp ID`: the registry of the papers' experiments (`../shared/EXPERIMENTS.md`,
//! `docs/results.md`), each a named set of `shoal bench` sweeps with a full and a `--quick`
//! variant. Running one runs its sweeps in-process through the bench machinery, then writes
//! `DIR/ID.json` (the bench JSON records, each with `experiment`, `group` and `series` added),
//! `DIR/ID.csv` (one row per run), `DIR/ID-intervals.csv` (per-interval samples, when the
//! experiment samples over time) and `DIR/ID.svg` (one plot panel per group and metric: x =
//! the varied option, y = the metric, one line per compared variant).
//!
//! Adding an experiment: write a function returning its [`Group`]s (in `locking.rs` or
//! `doppel.rs`, by the paper it comes from) and add one line to [`REGISTRY`]
//! (`registry.rs`). `output.rs` writes the files and draws the panels.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use clap::Parser;

use crate::report::Record;
use crate::{BenchArgs, Cli, Command};

mod doppel;
mod locking;
mod output;
mod registry;
#[cfg(test)]
mod tests;

use output::{write_json, write_outputs};
pub use registry::REGISTRY;

/// `shoal exp` options.
#[derive(Debug, clap::Args)]
pub struct ExpArgs {
    /// The experiment's id (`E1`, `E2`, ...), or `list` to print the registry.
    pub id: String,

    /// The quick variant: seconds-long runs on small data.
    #[arg(long)]
    pub quick: bool,

    /// The directory to write ID.csv, ID.json and ID.svg to (created if missing).
    #[arg(long, value_name = "DIR", default_value = "results")]
    pub out: PathBuf,

    /// Override every run's measurement window, seconds.
    #[arg(long, value_name = "SECS", value_parser = crate::parse_positive_secs)]
    pub duration: Option<f64>,

    /// Override every run's warm-up, seconds.
    #[arg(long, value_name = "SECS", value_parser = crate::parse_secs)]
    pub warmup: Option<f64>,

    /// Print per-interval lines every SECS seconds in every run (as `shoal bench
    /// --report-interval`).
    #[arg(long, value_name = "SECS", value_parser = crate::interval::parse_interval_secs)]
    pub report_interval: Option<f64>,

    /// Hide the progress bars.
    #[arg(long)]
    pub no_progress: bool,

    /// Load control in every run, as `shoal bench --admission`: `off`, `auto` or a number of
    /// running transactions, or a comma-separated list (each sweep then runs once per value,
    /// in one process, and the series are named by it). Default: the engine's (`auto`).
    #[arg(long, value_name = "LIST")]
    pub admission: Option<String>,
}

/// The `shoal bench` arguments of sweep `r` with the experiment-wide overrides that are
/// engine options (`--admission`) appended. A sweep that sets the option itself is refused
/// rather than silently overridden.
pub fn bench_args(r: &Run, admission: Option<&str>) -> anyhow::Result<Vec<String>> {
    let mut args = r.args.clone();
    if let Some(a) = admission {
        if args
            .iter()
            .any(|x| x == "--admission" || x.starts_with("--admission="))
        {
            bail!(
                "--admission: the sweep `shoal bench {}` sets it already",
                r.args.join(" ")
            );
        }
        args.push("--admission".into());
        args.push(a.into());
    }
    Ok(args)
}

/// What a plot panel puts on its y axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Commits per second.
    Throughput,
    /// Commits per second divided by the worker threads.
    ThroughputPerThread,
    /// Aborts (each retried) in the measurement window, all reasons.
    Aborts,
    /// Commits since the measurement started, over time (x must be [`TIME`]).
    Completed,
    /// Commits per second of each interval, over time (x must be [`TIME`]).
    IntervalTps,
    /// Mean latency of the transactions of type `read` (LIKE), in microseconds.
    ReadMean,
    /// 99th-percentile latency of the transactions of type `read`, in microseconds.
    ReadP99,
    /// Mean latency of the transactions of type `write` (LIKE), in microseconds.
    WriteMean,
    /// 99th-percentile latency of the transactions of type `write`, in microseconds.
    WriteP99,
}

impl Metric {
    /// The axis label.
    pub fn label(self) -> &'static str {
        match self {
            Metric::Throughput => "throughput (commits/s)",
            Metric::ThroughputPerThread => "throughput per thread (commits/s)",
            Metric::Aborts => "aborts in the window",
            Metric::Completed => "transactions completed",
            Metric::IntervalTps => "throughput per interval (commits/s)",
            Metric::ReadMean => "read latency, mean (µs)",
            Metric::ReadP99 => "read latency, p99 (µs)",
            Metric::WriteMean => "write latency, mean (µs)",
            Metric::WriteP99 => "write latency, p99 (µs)",
        }
    }

    fn over_time(self) -> bool {
        matches!(self, Metric::Completed | Metric::IntervalTps)
    }
}

/// The x "option" of panels plotted over the measurement window's time.
pub const TIME: &str = "time";

/// One `shoal bench` sweep of an experiment.
#[derive(Clone, Debug)]
pub struct Run {
    /// Its name in series labels (e.g. the workload), empty for none.
    pub label: String,
    /// The arguments after `shoal bench`.
    pub args: Vec<String>,
}

/// Sweeps plotted together: one panel per metric.
#[derive(Clone, Debug)]
pub struct Group {
    /// The panel title.
    pub title: String,
    /// The x axis: a swept option's JSON name (`threads`, `read_ratio`, ...) or [`TIME`].
    pub x: &'static str,
    /// The y axes, one panel each.
    pub metrics: Vec<Metric>,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// The sweeps.
    pub runs: Vec<Run>,
}

/// A registered experiment.
#[derive(Clone, Copy, Debug)]
pub struct Experiment {
    /// Its id, e.g. `E3`.
    pub id: &'static str,
    /// Where the paper shows it.
    pub paper: &'static str,
    /// What it compares.
    pub what: &'static str,
    /// Its groups, full (`false`) or quick (`true`).
    pub groups: fn(bool) -> Vec<Group>,
}

impl Experiment {
    const fn new(
        id: &'static str,
        paper: &'static str,
        what: &'static str,
        groups: fn(bool) -> Vec<Group>,
    ) -> Experiment {
        Experiment {
            id,
            paper,
            what,
            groups,
        }
    }
}

/// The registered experiment called `id` (case-insensitive).
pub fn find(id: &str) -> Option<&'static Experiment> {
    REGISTRY.iter().find(|e| e.id.eq_ignore_ascii_case(id))
}

/// Parses the arguments of a `shoal bench` command line (without `shoal bench`).
pub fn parse_bench(args: &[String]) -> anyhow::Result<BenchArgs> {
    let argv = ["shoal", "bench"]
        .into_iter()
        .map(String::from)
        .chain(args.iter().cloned());
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Bench(b),
        }) => Ok(b),
        Ok(_) => bail!("not a bench command line"),
        Err(e) => Err(anyhow!("shoal bench {}: {e}", args.join(" "))),
    }
}

/// Prints the registry.
fn list() {
    for e in REGISTRY {
        println!("{:<4} {:<32} {}", e.id, e.paper, e.what);
        for g in (e.groups)(false) {
            for r in &g.runs {
                println!("       shoal bench {}", r.args.join(" "));
            }
        }
    }
}

/// One finished run of an experiment.
struct Done {
    group: usize,
    label: String,
    rec: Record,
}

/// `shoal exp`.
pub fn run(a: &ExpArgs) -> anyhow::Result<()> {
    if a.id.eq_ignore_ascii_case("list") {
        list();
        return Ok(());
    }
    let e = find(&a.id).ok_or_else(|| {
        let ids: Vec<&str> = REGISTRY.iter().map(|e| e.id).collect();
        anyhow!("no experiment {:?}; registered: {}", a.id, ids.join(", "))
    })?;
    let groups = (e.groups)(a.quick);
    // Parse every sweep before running any.
    let mut benches = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        for (ri, r) in g.runs.iter().enumerate() {
            let mut b = parse_bench(&bench_args(r, a.admission.as_deref())?)?;
            if let Some(d) = a.duration {
                b.duration = d;
            }
            if let Some(w) = a.warmup {
                b.warmup = w;
            }
            if a.report_interval.is_some() {
                b.interval.report_interval = a.report_interval;
            }
            b.no_progress |= a.no_progress;
            b.json = None;
            b.interval.csv = None;
            benches.push((gi, ri, r.label.clone(), b));
        }
    }
    if a.quick && std::env::var_os("SHOAL_TPCC_TINY").is_none() {
        // Quick TPC-C runs load the tiny scale (1,000 items, 30 customers per district).
        std::env::set_var("SHOAL_TPCC_TINY", "1");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut done: Vec<Done> = Vec::new();
    let mut failure = None;
    for (gi, ri, label, b) in &benches {
        // This sweep's own command (several sweeps of a group may share a label).
        println!(
            "== {} {}: shoal bench {}",
            e.id,
            groups[*gi].title,
            bench_args(&groups[*gi].runs[*ri], a.admission.as_deref())
                .map(|args| args.join(" "))
                .unwrap_or_default()
        );
        let (recs, res) = crate::run_bench(b);
        done.extend(recs.into_iter().map(|rec| Done {
            group: *gi,
            label: label.clone(),
            rec,
        }));
        write_json(e, &groups, &done, &a.out)?;
        if let Err(err) = res {
            failure = Some(err);
            break;
        }
    }
    let files = write_outputs(e, &groups, &done, &a.out)?;
    for f in files {
        println!("wrote {}", f.display());
    }
    match failure {
        Some(err) => Err(err.context(format!("experiment {} stopped", e.id))),
        None => Ok(()),
    }
}
