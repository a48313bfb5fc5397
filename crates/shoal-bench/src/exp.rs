//! `shoal exp ID`: the registry of the papers' experiments (`../shared/EXPERIMENTS.md`,
//! `docs/results.md`), each a named set of `shoal bench` sweeps with a full and a `--quick`
//! variant. Running one runs its sweeps in-process through the bench machinery, then writes
//! `DIR/ID.json` (the bench JSON records, each with `experiment`, `group` and `series` added),
//! `DIR/ID.csv` (one row per run), `DIR/ID-intervals.csv` (per-interval samples, when the
//! experiment samples over time) and `DIR/ID.svg` (one plot panel per group and metric: x =
//! the varied option, y = the metric, one line per compared variant).
//!
//! Adding an experiment: write a function returning its [`Group`]s and add one line to
//! [`REGISTRY`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use clap::Parser;

use crate::interval::csv_field;
use crate::report::Record;
use crate::sweep::Value;
use crate::workloads::lockexp;
use crate::{BenchArgs, Cli, Command};

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
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,

    /// Override every run's warm-up, seconds.
    #[arg(long, value_name = "SECS")]
    pub warmup: Option<f64>,

    /// Print per-interval lines every SECS seconds in every run (as `shoal bench
    /// --report-interval`).
    #[arg(long, value_name = "SECS", value_parser = crate::interval::parse_interval_secs)]
    pub report_interval: Option<f64>,

    /// Hide the progress bars.
    #[arg(long)]
    pub no_progress: bool,
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

/// Every registered experiment, one line each.
pub const REGISTRY: &[Experiment] = &[
    Experiment::new("E1", "Kimura Fig. 3", "key-range lock modes: Graefe vs Lomet vs S/X over % end points on existing keys", e1),
    Experiment::new("E2", "Kimura Fig. 4", "intent locks: LIL vs lock-table intent locks over absolute locks per million", e2),
    Experiment::new("E3", "Kimura Fig. 5", "Dreadlocks spin vs sleep vs backoff vs hybrid over MPL, TPC-B without log", e3),
    Experiment::new("E4", "Kimura Fig. 6", "5 tellers in canonical order: Dreadlocks vs wound-wait vs wait-die vs no-wait, with aborts", e4),
    Experiment::new("E5", "Kimura Fig. 7", "victim policy over time, TPC-B with flush pipelining on a slow log", e5),
    Experiment::new("E6", "Kimura Fig. 8; ELR Figs. 17-22", "early lock release off vs S vs SX over read ratio, skew and log latency", e6),
    Experiment::new("E7", "Jung Figs. 10, 13, 15", "latched vs latch-free lock table over MPL, txbench", e7),
    Experiment::new("E8", "Shore-MT Figs. 4, 5", "per-thread throughput of insert, TPC-C Payment and NewOrder over threads", e8),
    Experiment::new("E9", "Doppel Figs. 7-1, 7-2", "INCR1 hot-key share: Doppel vs OCC vs 2PL vs Atomic", e9),
    Experiment::new("E10", "Doppel Fig. 7-3", "INCR1 10% (and 50%) hot, the hot key moving every 5 s: Doppel vs OCC over time", e10),
    Experiment::new("E11", "Doppel Fig. 7-4, Tables 7.1, 7.2", "INCRZ over Zipf alpha: Doppel vs OCC vs 2PL vs Atomic", e11),
    Experiment::new("E12", "Doppel Fig. 7-6, Table 7.3", "LIKE over the share of writes, alpha 1.4", e12),
    Experiment::new("E13", "Doppel Fig. 7-7", "LIKE over the split phase length", e13),
    Experiment::new("E14", "Doppel Table 7.4, Fig. 7-8", "RUBiS-C over alpha, and RUBiS-B", e14),
];

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn sweep(label: &str, a: &str) -> Run {
    Run {
        label: label.to_string(),
        args: args(a),
    }
}

fn group(title: &str, x: &'static str, metrics: &[Metric], log_y: bool, runs: Vec<Run>) -> Group {
    Group {
        title: title.to_string(),
        x,
        metrics: metrics.to_vec(),
        log_y,
        runs,
    }
}

/// A panel of one throughput sweep with the `shoal bench` arguments `a` (the Doppel
/// experiments' shape).
fn throughput(title: &str, x: &'static str, log_y: bool, a: &str) -> Group {
    group(title, x, &[Metric::Throughput], log_y, vec![sweep("", a)])
}

/// `quick`'s value list or the full one.
fn values(quick: bool, quick_values: &'static str, full: &'static str) -> &'static str {
    if quick {
        quick_values
    } else {
        full
    }
}

/// Duration and warm-up arguments.
fn window(quick: bool) -> &'static str {
    if quick {
        "--duration 0.5 --warmup 0.2"
    } else {
        "--duration 5 --warmup 1"
    }
}

/// The Doppel experiments' windows (Doppel needs a few classification intervals of 200 ms
/// before it splits anything, so even quick runs last 1.5 s).
fn doppel_window(quick: bool) -> &'static str {
    if quick {
        "--duration 1.5 --warmup 0.5 --records 100000"
    } else {
        "--duration 5 --warmup 1"
    }
}

fn e9(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let hot = values(quick, "0,0.5,1", "0,0.1,0.2,0.4,0.6,0.8,1");
    ["2", "16"]
        .iter()
        .map(|t| {
            throughput(
                &format!("INCR1, {t} threads"),
                "hot_fraction",
                true,
                &format!("incr1 --cc 2pl,occ,doppel,atomic --hot-fraction {hot} --threads {t} {w}"),
            )
        })
        .collect()
}

fn e10(quick: bool) -> Vec<Group> {
    // No warm-up: the hot key moves every `every` from the start of the run, so the moves
    // fall at multiples of `every` on the time axis (and the first period shows Doppel
    // finding the first hot key). The thesis' 10% on 2 cores conflicts rarely; the 50% panel
    // (not in the thesis) is where splitting pays on 2 cores, so a dip has room to show.
    let (every, w) = if quick {
        ("1.5s", "--duration 6 --warmup 0 --records 100000")
    } else {
        ("5s", "--duration 20 --warmup 0")
    };
    [
        ("2", "10%", "0.1"),
        ("16", "10%", "0.1"),
        ("2", "50%", "0.5"),
    ]
    .iter()
    .map(|(t, pct, hot)| {
        group(
            &format!("INCR1, {pct} hot, the hot key moving every {every}, {t} threads"),
            TIME,
            &[Metric::IntervalTps],
            false,
            vec![sweep(
                "",
                &format!(
                    "incr1 --cc occ,doppel --hot-fraction {hot} --hot-move-every {every} \
                         --threads {t} --report-interval 0.1 {w}"
                ),
            )],
        )
    })
    .collect()
}

fn e11(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let alpha = values(quick, "0,0.8,1.4,2", "0,0.4,0.8,1,1.2,1.4,1.6,1.8,2");
    let a = format!("incrz --cc 2pl,occ,doppel,atomic --alpha {alpha} --threads 2 {w}");
    vec![throughput("INCRZ, 2 threads", "alpha", true, &a)]
}

fn e12(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let wf = values(quick, "0.1,0.5,1", "0,0.1,0.2,0.3,0.5,0.7,0.9,1");
    let a = format!("like --cc 2pl,occ,doppel --alpha 1.4 --write-fraction {wf} --threads 2 {w}");
    vec![throughput(
        "LIKE, alpha 1.4, 2 threads",
        "write_fraction",
        false,
        &a,
    )]
}

fn e13(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let ms = values(quick, "1,5,20", "1,2,5,10,20,50,100");
    let a =
        format!("like --cc doppel --alpha 1.4 --write-fraction 1 --phase-ms {ms} --threads 2 {w}");
    vec![throughput(
        "LIKE, alpha 1.4, 100% writes, 2 threads",
        "phase_ms",
        false,
        &a,
    )]
}

fn e14(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let alpha = values(quick, "0,1,1.8", "0,0.5,1,1.4,1.8,2");
    vec![group(
        "RUBiS, 2 threads",
        "alpha",
        &[Metric::Throughput],
        false,
        vec![
            sweep(
                "RUBiS-C",
                &format!("rubis --variant c --cc 2pl,occ,doppel --alpha {alpha} --threads 2 {w}"),
            ),
            sweep(
                "RUBiS-B",
                &format!("rubis --variant b --cc 2pl,occ,doppel --alpha {alpha} --threads 2 {w}"),
            ),
        ],
    )]
}

fn e1(quick: bool) -> Vec<Group> {
    let w = window(quick);
    vec![group(
        "key-range lock modes",
        "existing_endpoints",
        &[Metric::Throughput],
        false,
        vec![sweep(
            "",
            &format!(
                "keyrange --cc 2pl --threads 6 --existing-endpoints 0,0.25,0.5,0.75,1 \
                 --key-range-modes graefe,lomet,sx {w}"
            ),
        )],
    )]
}

fn e2(quick: bool) -> Vec<Group> {
    lockexp::e2(quick)
        .into_iter()
        .map(|args| Group {
            title: "intent locks".into(),
            x: "absolute_locks",
            metrics: vec![Metric::Throughput],
            log_y: true,
            runs: vec![Run {
                label: String::new(),
                args,
            }],
        })
        .collect()
}

fn e3(quick: bool) -> Vec<Group> {
    let (t, scale) = if quick {
        ("1,4,16,64", "--scale 1")
    } else {
        ("1,2,4,8,16,32,64,128,256", "")
    };
    let w = window(quick);
    vec![group(
        "TPC-B, no log",
        "threads",
        &[Metric::Throughput, Metric::Aborts],
        false,
        vec![sweep(
            "",
            &format!(
                "tpcb {scale} --cc 2pl --log none --deadlock \
                 dreadlocks-spin,dreadlocks-sleep,dreadlocks-backoff,dreadlocks-hybrid \
                 --threads {t} {w}"
            ),
        )],
    )]
}

fn e4(quick: bool) -> Vec<Group> {
    let t = if quick { "1,4,16" } else { "1,2,4,8,16,32,64" };
    let w = if quick {
        "--duration 0.3 --warmup 0.1"
    } else {
        window(false)
    };
    vec![group(
        "5 tellers in canonical order",
        "threads",
        &[Metric::Throughput, Metric::Aborts],
        false,
        vec![sweep(
            "",
            &format!(
                "tellers --cc 2pl --deadlock dreadlocks-spin,dreadlocks-hybrid,dreadlocks-backoff,wound-wait,wait-die,no-wait \
                 --threads {t} {w}"
            ),
        )],
    )]
}

fn e5(quick: bool) -> Vec<Group> {
    let a = if quick {
        "--scale 1 --threads 6 --duration 2 --warmup 0.2 --report-interval 0.25"
    } else {
        "--threads 6 --duration 30 --warmup 1 --report-interval 1"
    };
    vec![group(
        "deadlock-prone TPC-B (half the transactions in reverse order), pipelined log, 10 ms flush",
        TIME,
        &[Metric::Completed, Metric::IntervalTps],
        false,
        vec![sweep(
            "",
            &format!(
                "tpcb --cc 2pl --log pipelined --log-latency 10ms --reverse-fraction 0.5 \
                 --deadlock dreadlocks-backoff --victim kill-short,kill-long,kill-young {a}"
            ),
        )],
    )]
}

fn e6(quick: bool) -> Vec<Group> {
    // Commits wait for 10 ms flushes: quick windows need more than 0.5 s to count enough.
    let w = if quick {
        "--duration 1.5 --warmup 0.3"
    } else {
        window(false)
    };
    let (base, rr, skew) = if quick {
        (
            "tpcb --scale 2 --cc 2pl --log sync --elr off,s,sx --threads 6",
            "0,0.5,1",
            "--zipf 1 --self-similar 0.5,0.2",
        )
    } else {
        (
            "tpcb --cc 2pl --log sync --elr off,s,sx --threads 6",
            "0,0.25,0.5,0.75,1",
            "--zipf 1 --self-similar 0.5,0.4,0.3,0.2",
        )
    };
    vec![
        group(
            "read ratio, Zipf 1, 10 ms log",
            "read_ratio",
            &[Metric::Throughput],
            false,
            vec![sweep(
                "",
                &format!("{base} --log-latency 10ms --zipf 1 --read-ratio {rr} {w}"),
            )],
        ),
        group(
            "skew, 10 ms log",
            "dist",
            &[Metric::Throughput],
            false,
            vec![sweep("", &format!("{base} --log-latency 10ms {skew} {w}"))],
        ),
        group(
            "log device latency",
            "log_latency",
            &[Metric::Throughput],
            true,
            vec![sweep(
                "",
                &format!("{base} --log-latency 100us,1ms,10ms {w}"),
            )],
        ),
    ]
}

fn e7(quick: bool) -> Vec<Group> {
    let titles = [
        "txbench: S = 10, 100; read-only, 20% read-update",
        "txbench hotspot: S = 10, 20% read-update",
        "txbench read-only S = 10, three passes (median)",
        "TPC-B at MPL 128 (memory in the records)",
    ];
    lockexp::e7(quick)
        .into_iter()
        .enumerate()
        .map(|(i, sweeps)| Group {
            title: titles.get(i).copied().unwrap_or("txbench").to_string(),
            x: "threads",
            metrics: vec![Metric::Throughput],
            log_y: true,
            // Sweeps of one group share the empty label: their records form one series per
            // lock table, and the plot takes the median per MPL.
            runs: sweeps
                .into_iter()
                .map(|args| Run {
                    label: String::new(),
                    args,
                })
                .collect(),
        })
        .collect()
}

fn e8(quick: bool) -> Vec<Group> {
    let t = if quick { "1,2,4" } else { "1,2,4,8,16,32,64" };
    let w = window(quick);
    vec![group(
        "per-thread throughput",
        "threads",
        &[Metric::ThroughputPerThread],
        true,
        vec![
            sweep("insert", &format!("insert --cc 2pl --threads {t} {w}")),
            sweep(
                "payment",
                &format!("tpcc --mix payment --cc 2pl --threads {t} {w}"),
            ),
            sweep(
                "new-order",
                &format!("tpcc --mix new-order --cc 2pl --threads {t} {w}"),
            ),
        ],
    )]
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
    for (name, v) in [("duration", a.duration), ("warmup", a.warmup)] {
        if let Some(v) = v {
            if !(v.is_finite() && v >= 0.0 && (name == "warmup" || v > 0.0)) {
                bail!("--{name} {v} is not a valid number of seconds");
            }
        }
    }
    let groups = (e.groups)(a.quick);
    // Parse every sweep before running any.
    let mut benches = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        for r in &g.runs {
            let mut b = parse_bench(&r.args)?;
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
            benches.push((gi, r.label.clone(), b));
        }
    }
    if a.quick && std::env::var_os("SHOAL_TPCC_TINY").is_none() {
        // Quick TPC-C runs load the tiny scale (1,000 items, 30 customers per district).
        std::env::set_var("SHOAL_TPCC_TINY", "1");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut done: Vec<Done> = Vec::new();
    let mut failure = None;
    for (gi, label, b) in &benches {
        println!(
            "== {} {}: shoal bench {}",
            e.id,
            groups[*gi].title,
            groups[*gi]
                .runs
                .iter()
                .find(|r| &r.label == label)
                .map(|r| r.args.join(" "))
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

/// The option values of a record as text, by JSON name.
fn opts(r: &Record) -> BTreeMap<String, String> {
    r.options
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect()
}

/// The series label of every run: its sweep's label plus the options that vary among the
/// runs of its sweep (other than x and the seed).
fn series_labels(groups: &[Group], done: &[Done]) -> Vec<String> {
    let mut varying: BTreeMap<(usize, String), Vec<String>> = BTreeMap::new();
    for (gi, g) in groups.iter().enumerate() {
        for r in &g.runs {
            let mine: Vec<BTreeMap<String, String>> = done
                .iter()
                .filter(|d| d.group == gi && d.label == r.label)
                .map(|d| opts(&d.rec))
                .collect();
            varying.insert((gi, r.label.clone()), varying_keys(g, &mine));
        }
    }
    done.iter()
        .map(|d| {
            let o = opts(&d.rec);
            let mut parts: Vec<String> = Vec::new();
            if !d.label.is_empty() {
                parts.push(d.label.clone());
            }
            let keys = varying.get(&(d.group, d.label.clone()));
            for k in keys.into_iter().flatten() {
                parts.push(format!("{k}={}", o.get(k).map_or("-", String::as_str)));
            }
            if parts.is_empty() {
                d.rec.workload.clone()
            } else {
                parts.join(" ")
            }
        })
        .collect()
}

/// The options whose values differ among `mine`, other than the group's x and the seed.
fn varying_keys(g: &Group, mine: &[BTreeMap<String, String>]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for o in mine {
        for k in o.keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    keys.into_iter()
        .filter(|k| k != g.x && k != "seed")
        .filter(|k| {
            // Varies when it takes two values among the runs that have it: an option only
            // some runs carry with one value (Doppel's `phase_ms` beside 2PL and OCC) is
            // implied by the options that do vary.
            let mut present = mine.iter().filter_map(|o| o.get(k));
            let first = present.next();
            present.any(|v| Some(v) != first)
        })
        .collect()
}

fn threads(r: &Record) -> f64 {
    match r.options.get("threads") {
        Some(Value::Int(t)) => *t as f64,
        _ => 1.0,
    }
}

/// The value of `m` for a whole run.
fn metric(m: Metric, r: &Record) -> f64 {
    match m {
        Metric::Throughput => r.throughput,
        Metric::ThroughputPerThread => r.throughput / threads(r).max(1.0),
        Metric::Aborts => r.aborted as f64,
        Metric::Completed => r.committed as f64,
        Metric::IntervalTps => r.throughput,
    }
}

fn write_json(e: &Experiment, groups: &[Group], done: &[Done], dir: &Path) -> anyhow::Result<()> {
    let labels = series_labels(groups, done);
    let mut out = Vec::with_capacity(done.len());
    for (d, s) in done.iter().zip(&labels) {
        let mut v = serde_json::to_value(&d.rec)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("experiment".into(), e.id.into());
            o.insert("group".into(), groups[d.group].title.clone().into());
            o.insert("series".into(), s.clone().into());
        }
        out.push(v);
    }
    let path = dir.join(format!("{}.json", e.id));
    let mut text = serde_json::to_string_pretty(&out)?;
    text.push('\n');
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// One row per run: experiment, group, series, every option, then the results.
fn render_csv(e: &Experiment, groups: &[Group], done: &[Done]) -> String {
    let labels = series_labels(groups, done);
    let mut keys: Vec<String> = Vec::new();
    for d in done {
        for k in d.rec.options.keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let mut out = String::from("experiment,group,series,workload");
    for k in &keys {
        out.push(',');
        out.push_str(&csv_field(k));
    }
    out.push_str(
        ",throughput,throughput_per_thread,committed,aborted,aborted_deadlock,\
         aborted_lock_timeout,aborted_conflict,rolled_back,p50_us,p99_us,measured_s,consistent\n",
    );
    for (d, s) in done.iter().zip(&labels) {
        let r = &d.rec;
        let o = opts(r);
        let _ = write!(
            out,
            "{},{},{},{}",
            e.id,
            csv_field(&groups[d.group].title),
            csv_field(s),
            r.workload
        );
        for k in &keys {
            out.push(',');
            out.push_str(&csv_field(o.get(k).map_or("", String::as_str)));
        }
        let _ = writeln!(
            out,
            ",{},{:.1},{},{},{},{},{},{},{},{},{},{}",
            r.throughput,
            r.throughput / threads(r).max(1.0),
            r.committed,
            r.aborted,
            r.aborted_deadlock,
            r.aborted_lock_timeout,
            r.aborted_conflict,
            r.rolled_back,
            r.latency_us.p50,
            r.latency_us.p99,
            r.measured_s,
            r.consistent
        );
    }
    out
}

/// Per-interval rows of the runs that sampled: experiment, group, series, then the sample.
fn render_intervals_csv(e: &Experiment, groups: &[Group], done: &[Done]) -> Option<String> {
    if done.iter().all(|d| d.rec.intervals.is_empty()) {
        return None;
    }
    let labels = series_labels(groups, done);
    let mut out =
        String::from("experiment,group,series,t_s,commits,total_commits,tps,aborts,p99_us\n");
    for (d, s) in done.iter().zip(&labels) {
        for i in &d.rec.intervals {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{}",
                e.id,
                csv_field(&groups[d.group].title),
                csv_field(s),
                i.t_s,
                i.commits,
                i.total_commits,
                i.tps,
                i.aborts,
                i.p99_us
            );
        }
    }
    Some(out)
}

/// Writes the JSON, CSV (and intervals CSV) and SVG files; returns their paths.
fn write_outputs(
    e: &Experiment,
    groups: &[Group],
    done: &[Done],
    dir: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    write_json(e, groups, done, dir)?;
    let mut files = vec![dir.join(format!("{}.json", e.id))];
    let csv = dir.join(format!("{}.csv", e.id));
    std::fs::write(&csv, render_csv(e, groups, done))
        .with_context(|| format!("writing {}", csv.display()))?;
    files.push(csv);
    if let Some(text) = render_intervals_csv(e, groups, done) {
        let p = dir.join(format!("{}-intervals.csv", e.id));
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        files.push(p);
    }
    let svg = dir.join(format!("{}.svg", e.id));
    let panels = panels(e, groups, done);
    std::fs::write(&svg, crate::plot::render(&panels)?)
        .with_context(|| format!("writing {}", svg.display()))?;
    files.push(svg);
    Ok(files)
}

/// When the workload of a run changed during its measurement window, in seconds since the
/// window started: INCR1's hot key moves every `hot_move_every` since the run started
/// (warm-up included).
fn workload_changes(r: &Record) -> Vec<f64> {
    let Some(Value::Text(t)) = r.options.get("hot_move_every") else {
        return Vec::new();
    };
    let Ok(every) = crate::engine_opts::parse_duration(t) else {
        return Vec::new();
    };
    let every = every.as_secs_f64();
    if every <= 0.0 {
        return Vec::new();
    }
    let end = r.warmup_s + r.measured_s.max(r.duration_s);
    (1..)
        .map(|k| k as f64 * every)
        .take_while(|&x| x < end)
        .filter(|&x| x > r.warmup_s)
        .map(|x| ((x - r.warmup_s) * 1e6).round() / 1e6)
        .collect()
}

/// The plot panels of an experiment's runs.
fn panels(e: &Experiment, groups: &[Group], done: &[Done]) -> Vec<crate::plot::Panel> {
    use crate::plot::{Panel, Series, XValue};
    let labels = series_labels(groups, done);
    let mut out = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        for &m in &g.metrics {
            let mut series: Vec<Series> = Vec::new();
            for (d, label) in done.iter().zip(&labels).filter(|(d, _)| d.group == gi) {
                let pts: Vec<(XValue, f64)> = if g.x == TIME || m.over_time() {
                    // Commits completed start from 0 at time 0.
                    let origin = (m == Metric::Completed && !d.rec.intervals.is_empty())
                        .then_some((XValue::Num(0.0), 0.0));
                    origin
                        .into_iter()
                        .chain(d.rec.intervals.iter().map(|i| {
                            let y = match m {
                                Metric::IntervalTps => i.tps,
                                _ => i.total_commits as f64,
                            };
                            (XValue::Num(i.t_s), y)
                        }))
                        .collect()
                } else {
                    let x = match d.rec.options.get(g.x) {
                        Some(Value::Int(v)) => XValue::Num(*v as f64),
                        Some(Value::Float(v)) => XValue::Num(*v),
                        Some(Value::Text(t)) => XValue::Text(t.clone()),
                        None => continue,
                    };
                    vec![(x, metric(m, &d.rec))]
                };
                match series.iter_mut().find(|s| &s.name == label) {
                    Some(s) => s.points.extend(pts),
                    None => series.push(Series {
                        name: label.clone(),
                        points: pts,
                    }),
                }
            }
            let x_marks = if g.x == TIME {
                done.iter()
                    .filter(|d| d.group == gi)
                    .flat_map(|d| workload_changes(&d.rec))
                    .fold(Vec::new(), |mut v, x| {
                        if !v.contains(&x) {
                            v.push(x);
                        }
                        v
                    })
            } else {
                Vec::new()
            };
            out.push(Panel {
                title: format!("{} ({}): {}", e.id, e.paper, g.title),
                x_label: if g.x == TIME {
                    "seconds since the measurement started".into()
                } else {
                    g.x.replace('_', "-")
                },
                y_label: m.label().into(),
                log_y: g.log_y,
                series,
                x_marks,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_only_some_runs_carry_are_not_series_keys() {
        let g = group("t", "alpha", &[Metric::Throughput], false, Vec::new());
        let run = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let mine = vec![
            run(&[("cc", "occ"), ("alpha", "1"), ("seed", "1")]),
            run(&[
                ("cc", "doppel"),
                ("alpha", "1"),
                ("phase_ms", "20"),
                ("seed", "2"),
            ]),
            run(&[
                ("cc", "doppel"),
                ("alpha", "2"),
                ("phase_ms", "20"),
                ("seed", "1"),
            ]),
        ];
        assert_eq!(varying_keys(&g, &mine), ["cc"]);
        let mut swept = mine.clone();
        swept[2].insert("phase_ms".into(), "5".into());
        assert_eq!(varying_keys(&g, &swept), ["cc", "phase_ms"]);
    }
    use crate::harness;
    use crate::interval::Sample;
    use crate::sweep::json_name;

    /// The record of a fake run of the `shoal bench` command line `args` (its first planned
    /// run), with `tps` commits per second over one second and the given samples.
    fn record(args: &str, tps: u64, intervals: Vec<Sample>) -> Record {
        let b = parse_bench(&super::args(args)).unwrap();
        let cfg = harness::plan(&b.sweep()).unwrap().runs.remove(0).0;
        let stats = crate::driver::RunStats {
            committed: tps,
            total_committed: tps,
            aborts: [1, 0, 0],
            measured: std::time::Duration::from_secs(1),
            latency_ns: hdrhistogram::Histogram::new_with_bounds(1, 1 << 40, 3).unwrap(),
            per_thread: vec![tps],
            rolled_back: 0,
            per_type: Vec::new(),
            rss_start_kb: None,
            rss_end_kb: None,
            peak_rss_kb: None,
            lock_footprint: None,
            intervals,
            stashed: 0,
            doppel: None,
        };
        let res = harness::RunResult {
            cfg,
            stats,
            check: Ok("fine".into()),
            db_run: 0,
            load_s: 0.0,
        };
        Record::new(&b.params(), &res)
    }

    #[test]
    fn series_name_the_sweep_and_the_options_varying_in_it() {
        let groups = vec![group(
            "g",
            "threads",
            &[Metric::ThroughputPerThread],
            true,
            vec![
                sweep("insert", "insert"),
                sweep("payment", "tpcc --mix payment"),
            ],
        )];
        let done: Vec<Done> = [
            ("insert", "insert --threads 1", 100),
            ("insert", "insert --threads 4", 200),
            ("payment", "tpcc --mix payment --cc 2pl --threads 1", 50),
            ("payment", "tpcc --mix payment --cc occ --threads 4", 80),
        ]
        .into_iter()
        .map(|(label, a, tps)| Done {
            group: 0,
            label: label.into(),
            rec: record(a, tps, Vec::new()),
        })
        .collect();
        let labels = series_labels(&groups, &done);
        assert_eq!(
            labels,
            ["insert", "insert", "payment cc=2pl", "payment cc=occ"]
        );
        let e = find("E8").unwrap();
        let csv = render_csv(e, &groups, &done);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 5, "{csv}");
        assert!(lines[0].starts_with("experiment,group,series,workload,"));
        assert!(lines[2].starts_with("E8,g,insert,insert,"), "{csv}");
        assert!(lines[2].contains(",200,50.0,200,1,1,"), "{csv}");
        let p = panels(e, &groups, &done);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].series.len(), 3);
        assert_eq!(p[0].series[0].points.len(), 2);
        assert_eq!(
            p[0].series[0].points[1],
            (crate::plot::XValue::Num(4.0), 50.0)
        );
        assert!(render_intervals_csv(e, &groups, &done).is_none());
    }

    #[test]
    fn time_panels_plot_the_samples() {
        let groups = vec![group(
            "t",
            TIME,
            &[Metric::Completed, Metric::IntervalTps],
            false,
            vec![sweep("", "tpcb --victim kill-short,kill-long --csv x.csv")],
        )];
        let sample = |t_s, total_commits| Sample {
            t_s,
            commits: 10,
            total_commits,
            tps: 10.0,
            aborts: 0,
            p99_us: 1.0,
            gauges: Default::default(),
        };
        let done: Vec<Done> = ["kill-short", "kill-long"]
            .into_iter()
            .map(|v| Done {
                group: 0,
                label: String::new(),
                rec: record(
                    &format!("tpcb --victim {v}"),
                    20,
                    vec![sample(1.0, 10), sample(2.0, 20)],
                ),
            })
            .collect();
        let e = find("E5").unwrap();
        let p = panels(e, &groups, &done);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].series[0].name, "victim=kill-short");
        // Completed starts at the origin.
        assert_eq!(p[0].series[0].points.len(), 3);
        assert_eq!(p[1].series[1].points[1].1, 10.0);
        let iv = render_intervals_csv(e, &groups, &done).unwrap();
        assert_eq!(iv.lines().count(), 5, "{iv}");
        assert!(crate::plot::render(&p).unwrap().contains("<svg"));
    }

    #[test]
    fn time_panels_mark_the_hot_key_moves() {
        let groups = (find("E10").unwrap().groups)(true);
        assert_eq!(groups[0].x, TIME);
        let b = parse_bench(&groups[0].runs[0].args).unwrap();
        assert_eq!(b.doppel.hot_move_every, Some(vec!["1.5s".to_string()]));
        assert!(b.params().sampling.is_some_and(|s| s.print));
        let sample = |t_s| Sample {
            t_s,
            commits: 10,
            total_commits: 10,
            tps: 100.0,
            aborts: 0,
            p99_us: 1.0,
            gauges: Default::default(),
        };
        let done: Vec<Done> = ["0", "1"]
            .into_iter()
            .map(|warmup| Done {
                group: 0,
                label: String::new(),
                rec: record(
                    &format!(
                        "incr1 --cc occ --hot-fraction 0.1 --hot-move-every 1500ms \
                         --duration 6 --warmup {warmup}"
                    ),
                    20,
                    vec![sample(0.1), sample(0.2)],
                ),
            })
            .collect();
        assert_eq!(done[0].rec.options["hot_move_every"], Value::from("1500ms"));
        assert_eq!(workload_changes(&done[0].rec), [1.5, 3.0, 4.5]);
        assert_eq!(workload_changes(&done[1].rec), [0.5, 2.0, 3.5, 5.0]);
        let p = panels(find("E10").unwrap(), &groups[..1], &done[..1]);
        assert_eq!(p[0].x_marks, [1.5, 3.0, 4.5]);
        assert!(crate::plot::render(&p).unwrap().contains("<svg"));
    }

    #[test]
    fn registry_entries_parse_into_valid_bench_configurations() {
        let mut ids = Vec::new();
        for e in REGISTRY {
            assert!(!ids.contains(&e.id), "duplicate {}", e.id);
            ids.push(e.id);
            for quick in [true, false] {
                let groups = (e.groups)(quick);
                assert!(!groups.is_empty(), "{}", e.id);
                for g in &groups {
                    assert!(!g.metrics.is_empty() && !g.runs.is_empty(), "{}", e.id);
                    for r in &g.runs {
                        let b = parse_bench(&r.args).unwrap_or_else(|err| panic!("{err}"));
                        let sweep = b.sweep();
                        let plan = harness::plan(&sweep).unwrap();
                        assert!(!plan.runs.is_empty(), "{} {:?}", e.id, r.args);
                        if g.x == TIME {
                            assert!(b.params().sampling.is_some(), "{} samples", e.id);
                        } else {
                            assert!(
                                sweep.axes.iter().any(|a| json_name(a.name) == g.x),
                                "{}: no axis {} in {:?}",
                                e.id,
                                g.x,
                                r.args
                            );
                        }
                        if quick {
                            assert!(b.duration <= 10.0, "{} quick run too long", e.id);
                        }
                    }
                }
            }
        }
        assert_eq!(
            ids,
            [
                "E1", "E2", "E3", "E4", "E5", "E6", "E7", "E8", "E9", "E10", "E11", "E12", "E13",
                "E14"
            ]
        );
        assert!(find("e3").is_some() && find("E99").is_none());
    }
}
