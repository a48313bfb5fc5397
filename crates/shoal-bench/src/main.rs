//! `shoal`: the command-line tool of the shoal storage engine. Its `bench` command loads a
//! workload, runs it with worker threads for a fixed time and reports throughput, aborts and
//! latency, sweeping over every combination of the options given as comma-separated lists.
//!
//! ```text
//! shoal bench                                  # TPC-B: 2pl at 1 and 2 threads, none at 1
//! shoal bench tpcb --threads 1,2,4,8 --cc 2pl --duration 10 --json out.json
//! shoal bench tpcc --warehouses 1,4 --threads 2 --cc 2pl,occ --duration 10
//! shoal bench insert --threads 1,2,4 --cc 2pl
//! shoal bench tpcb --engine shoal-2pl,shoal-occ,sqlite   # peer engines: see src/portable
//! ```

mod config;
mod dist;
mod driver;
mod engines;
mod exp;
mod harness;
mod html;
mod interval;
mod plot;
mod portable;
mod recover;
mod report;
mod rss;
mod sweep;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use config::{Cc, Log, Mix, Params};
use report::Record;
use sweep::{Axis, Sweep};
use workloads::WorkloadKind;

/// The harness allocates with mimalloc: glibc's allocator slowed every run that followed a
/// large one in the same process (the insert microbenchmark's throughput halved from its
/// first run to its third, in `malloc_consolidate` and `_int_malloc`). The engine library
/// itself sets no allocator; an embedding application chooses its own.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// shoal: an in-memory transactional storage engine.
#[derive(Debug, Parser)]
#[command(name = "shoal", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Command {
    /// Run a benchmark workload and print a table of throughput, aborts and latency.
    ///
    /// Every option that picks a variant or a number takes a comma-separated list (or may be
    /// repeated); one process runs every combination and prints them side by side in one
    /// table. Combinations that do not apply (`--cc none` with more than one thread) are
    /// skipped with a note. After each run a consistency check verifies the data; if it
    /// fails, the command exits non-zero.
    Bench(BenchArgs),

    /// Run a registered experiment (`shoal exp list` lists them): its `shoal bench` sweeps,
    /// then write DIR/ID.csv, DIR/ID.json and an SVG plot DIR/ID.svg.
    Exp(exp::ExpArgs),

    /// Build one static HTML page (`DIR/index.html`) with every plot and run table that
    /// `shoal exp` wrote to DIR, plus the machine it ran on. Works offline.
    Report {
        /// The results directory.
        #[arg(default_value = "results")]
        dir: PathBuf,
    },

    /// Open (and so recover) the database in DIR and report recovery speed: checkpoint rows
    /// loaded, log records replayed, wall time, records per second. Checks TPC-B balances
    /// if DIR holds a TPC-B database (as left by `shoal bench tpcb --db DIR --log async`).
    Recover {
        /// The database directory.
        dir: PathBuf,
        /// Also count the rows of every table.
        #[arg(long)]
        tables: bool,
    },
}

#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// The workload.
    #[arg(value_enum, default_value = "tpcb")]
    workload: WorkloadKind,

    /// Concurrency control: `2pl` (two-phase locking), `occ` (Silo-style optimistic),
    /// `none` (no locks, transactions one at a time; single thread only), `doppel` (phase
    /// reconciliation; `--phase-ms`) or `atomic` (no transactions: an atomic add per
    /// operation; incr1 and incrz only).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "2pl,none"
    )]
    cc: Vec<Cc>,

    /// Commit logging: `none` (no write-ahead log: measures concurrency control alone),
    /// `sync` (commit waits for the log flush, group commit), `async` (commit returns once
    /// logged in memory; flushed within 10 ms), `pipelined` (flush pipelining: commit returns
    /// at once, locks are released when the commit is durable).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "none"
    )]
    log: Vec<Log>,

    /// Worker threads (1 to 4096).
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "1,2",
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    threads: Vec<u64>,

    /// TPC-B scale: branches, each with 10 tellers and 100,000 accounts.
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "20",
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    scale: Vec<u64>,

    /// TPC-C warehouses (each with 10 districts of 3,000 customers and 100,000 stock rows).
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "1",
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    warehouses: Vec<u64>,

    /// Probability (0 to 1) that each of the three balance updates of a TPC-B transaction
    /// is a read of the same row instead.
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "0", value_parser = parse_ratio)]
    read_ratio: Vec<f64>,

    /// TPC-B: probability (0 to 1) that a transaction updates branch, teller, account in
    /// that order instead of account, teller, branch. Opposite orders make true deadlocks
    /// (the deadlock-prone TPC-B of the victim-policy experiment, E5). Default 0.
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = parse_ratio)]
    reverse_fraction: Option<Vec<f64>>,

    /// Rows loaded: YCSB records (default 1,000,000), keyrange counters (default 200),
    /// incr1/incrz counters, like users and pages, rubis users (items: 1/30 of them; all
    /// default 1,000,000).
    #[arg(long, value_delimiter = ',', value_name = "LIST",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    records: Option<Vec<u64>>,

    /// keyrange: probability that a range search starts and ends on existing keys (else
    /// both ends fall between keys).
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "0.5", value_parser = parse_ratio)]
    existing_endpoints: Vec<f64>,

    /// YCSB: bytes in each of the ten fields of a record.
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "100",
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    field_size: Vec<u64>,

    /// The transaction mix. TPC-C: `full` (default: 45% NewOrder, 43% Payment, 4% each
    /// OrderStatus, Delivery, StockLevel) or one transaction alone (`new-order`, `payment`,
    /// `order-status`, `delivery`, `stock-level`). YCSB: `a` (default: 50% read, 50%
    /// update), `b` (95/5), `c` (read only), `d` (read latest, 5% insert), `e` (short scans,
    /// 5% insert), `f` (read-modify-write).
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = Mix::parse)]
    mix: Option<Vec<Mix>>,

    /// Seed of the workers' random generators (each thread's seed derives from it).
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "42")]
    seed: Vec<u64>,

    /// Seconds of measurement per run.
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = parse_positive_secs)]
    duration: f64,

    /// Seconds of warm-up before each measurement (not measured; its commits are checked).
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_secs)]
    warmup: f64,

    #[command(flatten)]
    engine: config::engine::EngineArgs,

    /// Zipfian key skew THETA (0 = uniform) for the hot keys (TPC-B: tellers, hence
    /// branches; YCSB: records, default 0.99).
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = dist::parse_theta)]
    zipf: Option<Vec<f64>>,

    /// Self-similar key skew H in (0, 0.5] (H = 0.2: 80% of the draws on 20% of the keys).
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = dist::parse_h)]
    self_similar: Option<Vec<f64>>,

    /// txbench: rows in each of its three tables (Jung et al.: 100,000).
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "100000",
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    table_rows: Vec<u64>,

    /// txbench: rows per range scan, S (Jung et al.: 10 and 100).
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "10",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    rows_per_scan: Vec<u64>,

    /// txbench: probability (0 to 1) that a transaction is read-update (the scan, then
    /// updates of 0.2·S rows of the next table) rather than read-only.
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "0", value_parser = parse_ratio)]
    update_fraction: Vec<f64>,

    /// TPC-C: how a transaction's home warehouse is chosen: `random` (default, uniform per
    /// transaction) or `thread` (worker `i` always at warehouse `i mod W + 1`, the
    /// specification's terminals bound to their warehouse). `--home random,thread` runs both.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "LIST")]
    home: Option<Vec<workloads::tpcc::Home>>,

    /// txbench: confine every access to the first 5% of each table's rows. `--hotspot` alone
    /// means `on`; `--hotspot off,on` runs both.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "LIST", num_args = 0..=1,
          default_missing_value = "on")]
    hotspot: Option<Vec<workloads::txbench::Hotspot>>,

    /// intents: transactions per million that take an absolute X lock (on one table, or on
    /// the database for one in four of them) instead of IS/IX on every table.
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "0",
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    absolute_locks: Vec<u64>,

    /// Database directory (created if missing; kept). Default: a fresh temporary directory
    /// per loaded database, removed afterwards.
    #[arg(long, value_name = "DIR")]
    db: Option<PathBuf>,

    /// Write the results as one JSON array (one object per run) to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,

    /// Write each run's latency histogram (all transactions, and each type) to DIR as
    /// HdrHistogram percentile-distribution text (`.hgrm`, readable by HdrHistogram's
    /// plotter), one file per run and type, named after the run number and its options.
    #[arg(long, value_name = "DIR")]
    hdr_out: Option<PathBuf>,

    /// Hide the progress bars.
    #[arg(long)]
    no_progress: bool,

    #[command(flatten)]
    interval: interval::IntervalArgs,
    /// Options of the Doppel workloads (incr1, incrz, like, rubis) and of Doppel.
    #[command(flatten)]
    doppel: workloads::doppel_args::DoppelArgs,
    /// Peer engines (`--engine`): see `src/portable`.
    #[command(flatten)]
    peers: portable::PeerArgs,
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not between 0 and 1"))
    }
}

fn parse_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && (0.0..=1e6).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{} is not a number of seconds between 0 and 1e6",
            s.trim()
        ))
    }
}

fn parse_positive_secs(s: &str) -> Result<f64, String> {
    let v = parse_secs(s)?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err("must be more than 0".into())
    }
}

impl BenchArgs {
    /// The swept options. Options that change the database (its options or its data) come
    /// first so that runs sharing a loaded database are adjacent.
    fn sweep(&self) -> Sweep {
        let mut axes = Vec::new();
        match self.workload {
            WorkloadKind::Tpcb => axes.push(Axis::new("scale", true, self.scale.iter().copied())),
            WorkloadKind::Tpcc => {
                let w = self.warehouses.iter().copied();
                axes.push(Axis::new("warehouses", true, w));
                if workloads::tpcc::tiny_asked() {
                    // Named in every record, so that the data does not read as standard
                    // TPC-C.
                    axes.push(Axis::new("tpcc-scale", true, ["tiny"]));
                }
            }
            _ => {}
        }
        if self.workload == WorkloadKind::Ycsb {
            let r = self.records.clone().unwrap_or_else(|| vec![1_000_000]);
            axes.push(Axis::new("records", true, r));
            let f = self.field_size.iter().copied();
            axes.push(Axis::new("field-size", true, f));
        }
        if self.workload == WorkloadKind::Keyrange {
            let r = self.records.clone().unwrap_or_else(|| vec![200]);
            axes.push(Axis::new("records", true, r));
        }
        if self.workload == WorkloadKind::Tellers {
            let r = self.records.clone();
            let r = r.unwrap_or_else(|| vec![workloads::tellers::DEFAULT_TELLERS]);
            axes.push(Axis::new("records", true, r));
        }
        axes.push(Axis::new("cc", true, self.cc.iter().copied()));
        axes.push(Axis::new("log", true, self.log.iter().copied()));
        // Engine options become axes only when given, so that runs name what was chosen.
        axes.extend(self.engine.axes());
        let records = self.records.as_deref();
        axes.extend(self.doppel.db_axes(self.workload, records));
        match self.workload {
            WorkloadKind::Txbench => {
                axes.insert(
                    0,
                    Axis::new("table-rows", true, self.table_rows.iter().copied()),
                );
                axes.push(Axis::new(
                    "rows-per-scan",
                    false,
                    self.rows_per_scan.iter().copied(),
                ));
                axes.push(Axis::new(
                    "update-fraction",
                    false,
                    self.update_fraction.iter().copied(),
                ));
                let hot = self.hotspot.clone().unwrap_or_default();
                if !hot.is_empty() {
                    axes.push(Axis::new("hotspot", false, hot.iter().map(|h| h.name())));
                }
            }
            WorkloadKind::Intents => axes.push(Axis::new(
                "absolute-locks",
                false,
                self.absolute_locks.iter().copied(),
            )),
            _ => {}
        }
        axes.push(Axis::new("threads", false, self.threads.iter().copied()));
        if self.workload == WorkloadKind::Tpcb {
            axes.push(Axis::new(
                "read-ratio",
                false,
                self.read_ratio.iter().copied(),
            ));
            if let Some(r) = &self.reverse_fraction {
                axes.push(Axis::new("reverse-fraction", false, r.iter().copied()));
            }
        }
        if self.workload == WorkloadKind::Keyrange {
            let e = self.existing_endpoints.iter().copied();
            axes.push(Axis::new("existing-endpoints", false, e));
        }
        match (&self.mix, self.workload) {
            (Some(m), _) => axes.push(Axis::new("mix", false, m.iter().copied())),
            (None, WorkloadKind::Tpcc) => {
                let full = Mix::Tpcc(workloads::tpcc::Mix::Full);
                axes.push(Axis::new("mix", false, [full]));
            }
            (None, _) => {}
        }
        if let Some(h) = &self.home {
            axes.push(Axis::new("home", false, h.iter().map(|h| h.name())));
        }
        let dists: Vec<dist::KeyDist> = self.key_dists().collect();
        if !dists.is_empty() {
            axes.push(Axis::new("dist", false, dists));
        }
        axes.extend(self.doppel.workload_axes(self.workload));
        axes.push(Axis::new("seed", false, self.seed.iter().copied()));
        Sweep { axes }
    }

    /// The key distributions given: `--zipf` values first, then `--self-similar` ones.
    fn key_dists(&self) -> impl Iterator<Item = dist::KeyDist> + '_ {
        let zipf = self.zipf.iter().flatten().map(|t| dist::KeyDist::Zipf(*t));
        let h = self.self_similar.iter().flatten();
        zipf.chain(h.map(|h| dist::KeyDist::SelfSimilar(*h)))
    }

    /// The options of the portable path (`--engine`); without `--engine` (INCR1 alone),
    /// shoal-2pl.
    fn portable_params(&self) -> portable::PortableParams {
        let mut engines = self.peers.engine.clone();
        if engines.is_empty() {
            engines.push(engines::EngineKind::Shoal2pl);
        }
        portable::PortableParams {
            workload: self.workload,
            engines,
            logs: self.log.clone(),
            threads: self.threads.clone(),
            scales: self.scale.clone(),
            records: self.records.clone(),
            field_sizes: self.field_size.clone(),
            mixes: self.mix.clone(),
            hot_fractions: (self.workload == WorkloadKind::Incr1)
                .then(|| self.doppel.hot_fraction.clone()),
            dist: self.key_dists().next(),
            seeds: self.seed.clone(),
            warmup: Duration::from_secs_f64(self.warmup),
            duration: Duration::from_secs_f64(self.duration),
            db_dir: self.db.clone(),
            json: self.json.clone(),
        }
    }

    fn params(&self) -> Params {
        Params {
            workload: self.workload,
            warmup: Duration::from_secs_f64(self.warmup),
            duration: Duration::from_secs_f64(self.duration),
            db_dir: self.db.clone(),
            progress: !self.no_progress,
            sampling: self.interval.sampling(),
        }
    }
}

/// Refuses `--zipf` and `--self-similar` for workloads that draw no keys from them: their
/// runs would be recorded with a distribution they never used.
fn check_dist_options(args: &BenchArgs) -> anyhow::Result<()> {
    let reads = matches!(
        args.workload,
        WorkloadKind::Tpcb | WorkloadKind::Ycsb | WorkloadKind::Tellers
    );
    if args.key_dists().next().is_some() && !reads {
        anyhow::bail!(
            "--zipf and --self-similar apply to tpcb, ycsb and tellers, not {} (it draws its \
             keys its own way)",
            args.workload.name()
        );
    }
    Ok(())
}

/// Refuses what the portable path (`--engine`) would silently leave out: it runs each
/// workload in its standard form, one key distribution, and writes JSON only.
fn check_portable_options(args: &BenchArgs) -> anyhow::Result<()> {
    let mut ignored = Vec::new();
    if args.read_ratio.iter().any(|&r| r != 0.0) {
        ignored.push("--read-ratio");
    }
    if args.reverse_fraction.is_some() {
        ignored.push("--reverse-fraction");
    }
    let dists = args.key_dists().count();
    if (dists > 0 && args.workload != WorkloadKind::Ycsb) || dists > 1 {
        ignored.push("--zipf/--self-similar (ycsb takes one)");
    }
    if args.cc != [Cc::TwoPl, Cc::None] {
        ignored.push("--cc (the engine list names the concurrency control)");
    }
    if args.interval.report_interval.is_some() || args.interval.csv.is_some() {
        ignored.push("--report-interval/--csv");
    }
    if args.hdr_out.is_some() {
        ignored.push("--hdr-out");
    }
    if !ignored.is_empty() {
        anyhow::bail!(
            "with --engine, {} would be ignored: leave them out, or run shoal alone without \
             --engine",
            ignored.join(", ")
        );
    }
    Ok(())
}

fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    if !args.peers.engine.is_empty() {
        if args.doppel.hot_move_every.is_some() || args.doppel.split_top.is_some() {
            anyhow::bail!(
                "--hot-move-every and --split-top are not supported with --engine (shoal bench only)"
            );
        }
        check_dist_options(args)?;
        check_workload_options(args)?;
        check_portable_options(args)?;
        if args.engine.any() {
            println!("note: --engine runs every engine with its default options; the shoal engine options given are ignored");
        }
        return portable::run(&args.portable_params());
    }
    run_bench(args).1
}

/// Refuses lock-table options (`--lock-table`, `--deadlock`, `--victim`, `--intent-locks`,
/// `--key-range-modes`) when no `--cc` value takes locks, `--elr` when none releases locks
/// or a serial turn early (2pl, none), and `--log-latency` without a logging `--log`: the
/// runs would not use them, yet their records would name them. (In a list that mixes
/// concurrency controls, the runs that do not use them drop them: see `harness::plan_for`.)
fn check_lock_options(args: &BenchArgs) -> anyhow::Result<()> {
    let ccs: Vec<&str> = args.cc.iter().map(|c| c.name()).collect();
    let given = args.engine.lock_options();
    if !given.is_empty() && !args.cc.contains(&Cc::TwoPl) {
        anyhow::bail!(
            "--{} applies to the lock table, which only --cc 2pl uses; --cc {} takes no locks \
             (add 2pl to --cc, or leave the option out)",
            given.join(", --"),
            ccs.join(",")
        );
    }
    if args.engine.elr_given() && !args.cc.iter().any(|c| matches!(c, Cc::TwoPl | Cc::None)) {
        anyhow::bail!(
            "--elr applies to --cc 2pl (and to none's read-only commits); --cc {} does not \
             release anything early (add 2pl to --cc, or leave the option out)",
            ccs.join(",")
        );
    }
    let log = args.engine.log_options();
    if !log.is_empty() && args.log.iter().all(|l| *l == Log::None) {
        anyhow::bail!(
            "--{} applies to log flushes; --log none writes no log (add sync, async or \
             pipelined to --log, or leave the option out)",
            log.join(", --")
        );
    }
    Ok(())
}

/// Refuses a workload option given to a workload that does not read it: the runs would go
/// ahead without it while the command line says otherwise. An option counts as given when
/// it differs from its default.
fn check_workload_options(args: &BenchArgs) -> anyhow::Result<()> {
    use WorkloadKind as W;
    const DOPPEL: [W; 4] = [W::Incr1, W::Incrz, W::Like, W::Rubis];
    let records: Vec<W> = [W::Ycsb, W::Keyrange, W::Tellers]
        .into_iter()
        .chain(DOPPEL)
        .collect();
    let d = &args.doppel;
    let options: [(&str, bool, &[W]); 16] = [
        ("scale", args.scale != [20], &[W::Tpcb]),
        ("warehouses", args.warehouses != [1], &[W::Tpcc]),
        ("read-ratio", args.read_ratio != [0.0], &[W::Tpcb]),
        (
            "reverse-fraction",
            args.reverse_fraction.is_some(),
            &[W::Tpcb],
        ),
        ("records", args.records.is_some(), &records),
        (
            "existing-endpoints",
            args.existing_endpoints != [0.5],
            &[W::Keyrange],
        ),
        ("field-size", args.field_size != [100], &[W::Ycsb]),
        ("table-rows", args.table_rows != [100_000], &[W::Txbench]),
        ("rows-per-scan", args.rows_per_scan != [10], &[W::Txbench]),
        (
            "update-fraction",
            args.update_fraction != [0.0],
            &[W::Txbench],
        ),
        ("hotspot", args.hotspot.is_some(), &[W::Txbench]),
        ("absolute-locks", args.absolute_locks != [0], &[W::Intents]),
        ("alpha", d.alpha.is_some(), &[W::Incrz, W::Like, W::Rubis]),
        ("hot-fraction", d.hot_fraction != [0.5], &[W::Incr1]),
        ("write-fraction", d.write_fraction != [0.5], &[W::Like]),
        (
            "variant",
            d.variant != [workloads::doppel_args::Variant::C],
            &[W::Rubis],
        ),
    ];
    let ignored: Vec<&str> = options
        .iter()
        .filter(|(_, given, used_by)| *given && !used_by.contains(&args.workload))
        .map(|(name, _, _)| *name)
        .collect();
    if !ignored.is_empty() {
        anyhow::bail!(
            "--{} does not apply to {} (it would be ignored): leave it out",
            ignored.join(", --"),
            args.workload.name()
        );
    }
    Ok(())
}

/// Refuses options that the runs `args` describe would not use (see the `check_*`
/// functions).
fn check_options(args: &BenchArgs) -> anyhow::Result<()> {
    check_lock_options(args)?;
    check_dist_options(args)?;
    check_workload_options(args)?;
    args.doppel.check(args.workload)
}

/// Runs the sweep `args` describe, prints its table and writes the files it asks for;
/// returns the records of the finished runs and whether the sweep succeeded.
fn run_bench(args: &BenchArgs) -> (Vec<Record>, anyhow::Result<()>) {
    let mut records: Vec<Record> = Vec::new();
    let res = run_bench_into(args, &mut records);
    (records, res)
}

fn run_bench_into(args: &BenchArgs, records: &mut Vec<Record>) -> anyhow::Result<()> {
    for m in args.mix.iter().flatten() {
        if m.workload() != args.workload {
            anyhow::bail!("--mix {m} does not apply to {}", args.workload.name());
        }
    }
    if args.home.is_some() && args.workload != WorkloadKind::Tpcc {
        anyhow::bail!("--home applies to tpcc only, not {}", args.workload.name());
    }
    check_options(args)?;
    let sweep = args.sweep();
    let params = args.params();
    let plan = harness::plan_for(&sweep, Some(args.workload))?;
    for note in &plan.skipped {
        println!("note: {note}");
    }
    if plan.runs.is_empty() {
        anyhow::bail!("no combination of the options given can run");
    }
    if let (Some(json), Some(csv)) = (&args.json, &args.interval.csv) {
        // Each would overwrite the other after every run.
        anyhow::ensure!(
            json != csv,
            "--json and --csv name the same file, {}",
            json.display()
        );
    }
    if let Some(path) = &args.json {
        // Fail before loading anything if the file cannot be written.
        report::write_json(path, records)?;
    }
    let mut series = Vec::new();
    if let Some(path) = &args.interval.csv {
        interval::write_csv(path, &series)?;
    }
    if let Some(dir) = &args.hdr_out {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    }
    let res = harness::run_plan(&params, &plan, |r| {
        if let Some(dir) = &args.hdr_out {
            report::write_hgrm(dir, records.len(), r)?;
        }
        records.push(Record::new(&params, r));
        if let Some(path) = &args.json {
            report::write_json(path, records)?;
        }
        if let Some(path) = &args.interval.csv {
            let name = params.workload.name().to_string();
            series.push((name, r.cfg.point.clone(), r.stats.intervals.clone()));
            interval::write_csv(path, &series)?;
        }
        Ok(())
    });
    if !records.is_empty() {
        print!("{}", report::render_table(&params, &sweep, records));
    }
    if let (Some(path), true) = (&args.json, res.is_ok()) {
        eprintln!("wrote {} records to {}", records.len(), path.display());
    }
    res
}

/// Keeps mimalloc's heaps off transparent huge pages. mimalloc asked for them on its arenas,
/// and each worker thread's heap then faulted in whole 2 MiB pages: at 512 worker threads
/// the harness alone held about 1.7 GB and spent about a third of the run zeroing pages
/// (`clear_page_erms`, txbench read-only); without them it held 300 MB. The crate's `no_thp`
/// feature stops it asking; where the system backs *all* memory with huge pages
/// (`enabled` is `always`), this turns them off for the process. Otherwise (`madvise`, the
/// usual default) huge pages stay available for the engine's page arena, which asks for
/// them itself.
fn keep_heaps_off_huge_pages() {
    #[cfg(target_os = "linux")]
    {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if mode.is_ok_and(|m| m.contains("[always]")) {
            // SAFETY: `prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)` takes no pointers and only
            // sets a flag on this process; failure (an old kernel) leaves THP as it was,
            // which is harmless.
            unsafe {
                libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
            }
        }
    }
}

fn main() -> ExitCode {
    keep_heaps_off_huge_pages();
    let cli = Cli::parse();
    let res = match &cli.command {
        Command::Bench(args) => bench(args),
        Command::Exp(args) => exp::run(args),
        Command::Report { dir } => html::build(dir).map(|p| println!("wrote {}", p.display())),
        Command::Recover { dir, tables } => recover::run(dir, *tables),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use sweep::Value;

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        let mut v = vec!["shoal", "bench"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).map(|c| match c.command {
            Command::Bench(b) => b,
            other => panic!("not a bench command: {other:?}"),
        })
    }

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_short_tpcb_run() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.workload, WorkloadKind::Tpcb);
        assert_eq!(a.cc, [Cc::TwoPl, Cc::None]);
        assert_eq!(a.threads, [1, 2]);
        assert_eq!(a.scale, [20]);
        assert_eq!(a.log, [Log::None]);
        assert_eq!((a.warmup, a.duration), (1.0, 3.0));
        let plan = harness::plan(&a.sweep()).unwrap();
        let runs: Vec<(Cc, usize)> = plan.runs.iter().map(|(c, _)| (c.cc, c.threads)).collect();
        assert_eq!(runs, [(Cc::TwoPl, 1), (Cc::TwoPl, 2), (Cc::None, 1)]);
        assert_eq!(plan.skipped.len(), 1);
    }

    #[test]
    fn lists_parse_and_dedupe() {
        let a = parse(&[
            "tpcb",
            "--threads",
            "1,2,4,2",
            "--cc",
            "none,2pl",
            "--read-ratio",
            "0,0.5",
            "--scale",
            "1",
            "--seed",
            "1,2",
            "--log",
            "none,sync,async,pipelined",
        ])
        .unwrap();
        assert_eq!(a.threads, [1, 2, 4, 2]);
        let s = a.sweep();
        assert_eq!(s.axis("threads").unwrap().values.len(), 3);
        assert_eq!(
            s.axis("cc").unwrap().values,
            [Value::Cc(Cc::None), Value::Cc(Cc::TwoPl)]
        );
        assert_eq!(s.axis("read-ratio").unwrap().values.len(), 2);
        assert_eq!(s.axis("log").unwrap().values.len(), 4);
        assert_eq!(s.points().len(), 3 * 2 * 2 * 2 * 4);
        // Repeating the option works as well as a list.
        let b = parse(&["--threads", "1", "--threads", "8"]).unwrap();
        assert_eq!(b.threads, [1, 8]);
    }

    #[test]
    fn tpcc_sweeps_warehouses_and_mixes() {
        let a = parse(&[
            "tpcc",
            "--warehouses",
            "1,4",
            "--mix",
            "full,payment",
            "--cc",
            "2pl",
            "--threads",
            "2",
        ])
        .unwrap();
        assert_eq!(a.workload, WorkloadKind::Tpcc);
        let s = a.sweep();
        assert!(s.axis("scale").is_none());
        assert_eq!(s.axis("warehouses").unwrap().values.len(), 2);
        use workloads::tpcc::Mix as T;
        assert_eq!(
            s.axis("mix").unwrap().values,
            [
                Value::Mix(Mix::Tpcc(T::Full)),
                Value::Mix(Mix::Tpcc(T::Payment))
            ]
        );
        let plan = harness::plan(&s).unwrap();
        let runs: Vec<(u64, &str)> = plan
            .runs
            .iter()
            .map(|(c, _)| (c.scale, c.mix.map_or("-", Mix::name)))
            .collect();
        assert_eq!(
            runs,
            [(1, "full"), (1, "payment"), (4, "full"), (4, "payment")]
        );
        // The two mixes share one load per warehouse count.
        assert_eq!(plan.runs[0].1, plan.runs[1].1);
        assert_ne!(plan.runs[1].1, plan.runs[2].1);
        // TPC-B keeps --scale and has no mix axis.
        let b = parse(&["tpcb"]).unwrap().sweep();
        assert!(b.axis("scale").is_some() && b.axis("mix").is_none());
    }

    #[test]
    fn lock_experiment_command_lines_parse() {
        for quick in [true, false] {
            let all = workloads::lockexp::e2(quick)
                .into_iter()
                .chain(workloads::lockexp::e7(quick).into_iter().flatten());
            for a in all {
                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                let b = parse(&a).unwrap_or_else(|e| panic!("{a:?}: {e}"));
                assert!(!harness::plan(&b.sweep()).unwrap().runs.is_empty());
            }
        }
        let b = parse(&["txbench", "--hotspot", "--threads", "1"]).unwrap();
        assert_eq!(
            b.sweep().axis("hotspot").unwrap().values,
            [Value::from("on")]
        );
        let b = parse(&["intents", "--absolute-locks", "0,10"]).unwrap();
        assert_eq!(b.sweep().axis("absolute-locks").unwrap().values.len(), 2);
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            &["--threads", "0"][..],
            &["--threads", "1,,2"],
            &["--threads", "x"],
            &["--cc", "mvcc"],
            &["--log", "fast"],
            &["--read-ratio", "1.5"],
            &["--scale", "0"],
            &["--duration", "0"],
            &["--warmup", "-1"],
            &["tpcd"],
            &["tpcc", "--mix", "bogus"],
            &["tpcc", "--warehouses", "0"],
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
        assert_eq!(parse(&["--cc", "serial"]).unwrap().cc, [Cc::None]);
    }

    #[test]
    fn key_distributions_are_refused_where_no_key_is_drawn_from_them() {
        let check = |a: &[&str]| check_dist_options(&parse(a).unwrap());
        for ok in [["tpcb", "--zipf", "1"], ["ycsb", "--self-similar", "0.2"]] {
            check(&ok).unwrap();
        }
        for w in ["txbench", "tpcc", "insert", "incrz"] {
            let e = check(&[w, "--zipf", "1"]).unwrap_err();
            assert!(e.to_string().contains(w), "{e}");
        }
        check(&["txbench"]).unwrap();
    }

    #[test]
    fn the_portable_path_refuses_options_it_would_ignore() {
        let check = |a: &[&str]| check_portable_options(&parse(a).unwrap());
        check(&["ycsb", "--engine", "shoal-2pl", "--zipf", "0.99"]).unwrap();
        check(&["tpcb", "--engine", "shoal-2pl,shoal-occ"]).unwrap();
        for (bad, named) in [
            (
                &["tpcb", "--engine", "shoal-2pl", "--read-ratio", "1"][..],
                "--read-ratio",
            ),
            (
                &["tpcb", "--engine", "shoal-2pl", "--reverse-fraction", "1"],
                "--reverse",
            ),
            (
                &["tpcb", "--engine", "shoal-2pl", "--zipf", "1.2"],
                "--zipf",
            ),
            (
                &["ycsb", "--engine", "shoal-2pl", "--zipf", "0,0.99"],
                "--zipf",
            ),
            (&["tpcb", "--engine", "shoal-2pl", "--cc", "occ"], "--cc"),
            (
                &["incr1", "--engine", "shoal-2pl", "--csv", "x.csv"],
                "--csv",
            ),
            (
                &["incr1", "--engine", "shoal-2pl", "--hdr-out", "h"],
                "--hdr-out",
            ),
        ] {
            let e = check(bad).unwrap_err();
            assert!(e.to_string().contains(named), "{bad:?}: {e}");
        }
    }

    #[test]
    fn lock_options_need_a_cc_that_takes_locks() {
        let check = |a: &[&str]| check_lock_options(&parse(a).unwrap());
        let e = check(&["--cc", "occ", "--deadlock", "no-wait"]).unwrap_err();
        assert!(e.to_string().contains("--deadlock"), "{e}");
        assert!(e.to_string().contains("--cc occ"), "{e}");
        let e = check(&[
            "--cc",
            "doppel,none",
            "--lock-table",
            "latched",
            "--victim",
            "kill-short",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("--lock-table, --victim"), "{e}");
        // One cc value that locks is enough; other engine options are not lock options.
        check(&["--cc", "occ,2pl", "--deadlock", "no-wait"]).unwrap();
        check(&["--deadlock", "wait-die"]).unwrap();
        check(&["--cc", "occ", "--lock-timeout", "1s"]).unwrap();
        // ELR releases locks (or, under none, a serial turn) early: OCC has neither.
        assert!(check(&["--cc", "occ", "--elr", "sx"]).is_err());
        check(&["--cc", "none", "--elr", "sx"]).unwrap();
    }

    /// Every option of every workload reaches its run's configuration typed: an axis whose
    /// name the configuration does not read fails the plan, and each value is checked.
    #[test]
    fn every_workload_option_reaches_the_run_typed() {
        use std::time::Duration;
        let cfg = |args: &str| {
            let a: Vec<&str> = args.split_whitespace().collect();
            let b = parse(&a).unwrap_or_else(|e| panic!("{args}: {e}"));
            let plan = harness::plan_for(&b.sweep(), Some(b.workload));
            let mut runs = plan.unwrap_or_else(|e| panic!("{args}: {e}")).runs;
            assert_eq!(runs.len(), 1, "{args}");
            runs.remove(0).0
        };
        let c = cfg("tpcb --scale 3 --read-ratio 0.1 --reverse-fraction 0.5 --zipf 0.5 --cc 2pl --threads 1");
        assert_eq!((c.scale, c.read_ratio, c.reverse_fraction), (3, 0.1, 0.5));
        assert_eq!(c.dist, Some(dist::KeyDist::Zipf(0.5)));
        let c = cfg("tpcc --warehouses 2 --home thread --cc occ --threads 1");
        assert_eq!(c.home, workloads::tpcc::Home::Thread);
        let c = cfg("tpcc --warehouses 2 --mix payment --cc occ --threads 1");
        assert_eq!(c.home, workloads::tpcc::Home::Random);
        assert_eq!(c.scale, 2);
        assert_eq!(c.mix, Some(Mix::Tpcc(workloads::tpcc::Mix::Payment)));
        let c = cfg(
            "ycsb --records 100 --field-size 10 --mix B --self-similar 0.2 --cc occ --threads 1",
        );
        assert_eq!((c.records, c.field_size), (100, 10));
        assert_eq!(c.mix, Some(Mix::Ycsb(workloads::ycsb::Mix::B)));
        assert_eq!(c.dist, Some(dist::KeyDist::SelfSimilar(0.2)));
        let c = cfg("keyrange --records 50 --existing-endpoints 0.3 --cc 2pl --threads 1");
        assert_eq!((c.records, c.existing_endpoints), (50, 0.3));
        let c = cfg("txbench --table-rows 100 --rows-per-scan 5 --update-fraction 0.2 --hotspot --cc 2pl --threads 1");
        assert_eq!((c.table_rows, c.rows_per_scan), (100, 5));
        assert_eq!((c.update_fraction, c.hotspot), (0.2, true));
        let c = cfg("intents --absolute-locks 10 --cc 2pl --threads 1");
        assert_eq!(c.absolute_locks, 10);
        let c = cfg(
            "incr1 --hot-fraction 0.3 --hot-move-every 5ms --phase-ms 5 --cc doppel --threads 1",
        );
        assert_eq!(c.hot_fraction, Some(0.3));
        assert_eq!(c.hot_move_every, Some(Duration::from_millis(5)));
        assert_eq!(c.options.doppel.split_phase, Duration::from_millis(5));
        let c = cfg("incrz --alpha 1.1 --split-top 3 --cc doppel --threads 1");
        assert_eq!((c.alpha, c.split_top, c.hot_fraction), (Some(1.1), 3, None));
        let c = cfg("like --alpha 1.2 --write-fraction 0.2 --cc occ --threads 1");
        assert_eq!((c.alpha, c.write_fraction), (Some(1.2), 0.2));
        let c = cfg("rubis --variant b --alpha 1.5 --cc occ --threads 1");
        assert_eq!(
            (c.variant, c.alpha),
            (workloads::doppel_args::Variant::B, Some(1.5))
        );
        let c = cfg("tellers --records 10 --cc 2pl --threads 1");
        assert_eq!(c.records, 10);
    }

    #[test]
    fn mixes_parse_typed_and_name_the_valid_values() {
        let a = parse(&["ycsb", "--mix", " A ,f"]).unwrap();
        use workloads::ycsb::Mix as Y;
        assert_eq!(a.mix, Some(vec![Mix::Ycsb(Y::A), Mix::Ycsb(Y::F)]));
        let e = parse(&["ycsb", "--mix", "g"]).unwrap_err().to_string();
        assert!(e.contains("full, new-order") && e.contains("a to f"), "{e}");
        let wrong = parse(&["tpcb", "--mix", "a", "--duration", "0.1"]).unwrap();
        let e = run_bench(&wrong).1.unwrap_err().to_string();
        assert!(e.contains("--mix a does not apply to tpcb"), "{e}");
        let wrong = parse(&["tpcb", "--home", "thread", "--duration", "0.1"]).unwrap();
        let e = run_bench(&wrong).1.unwrap_err().to_string();
        assert!(e.contains("--home applies to tpcc only"), "{e}");
    }

    /// Options the workload, the concurrency control or the log mode would not read are
    /// refused, not accepted and ignored (their records would name them).
    #[test]
    fn options_that_do_not_apply_are_refused() {
        for bad in [
            &["tpcb", "--hotspot"][..],
            &["tpcb", "--alpha", "1.5"],
            &["tpcb", "--records", "7"],
            &["tpcc", "--reverse-fraction", "0.5"],
            &["tpcc", "--read-ratio", "0.5"],
            &["tpcc", "--scale", "4"],
            &["ycsb", "--alpha", "1.5"],
            &["ycsb", "--warehouses", "9"],
            &["ycsb", "--rows-per-scan", "50"],
            &["incr1", "--alpha", "1.5"],
            &["like", "--variant", "b"],
            &["tpcb", "--cc", "occ", "--elr", "sx"],
            &["tpcb", "--cc", "occ,doppel", "--key-range-modes", "lomet"],
            &["tpcb", "--cc", "occ", "--intent-locks", "table"],
            &["tpcb", "--log", "none", "--log-latency", "10ms"],
        ] {
            let a = parse(bad).unwrap();
            assert!(check_options(&a).is_err(), "accepted: {bad:?}");
        }
        for good in [
            &["tpcb", "--scale", "4", "--read-ratio", "0.5"][..],
            &["tpcc", "--warehouses", "4"],
            &["ycsb", "--records", "7", "--field-size", "10"],
            &["txbench", "--hotspot", "--rows-per-scan", "50"],
            &["incrz", "--alpha", "1.5", "--records", "10"],
            &["tpcb", "--cc", "none", "--elr", "sx"],
            &[
                "tpcb",
                "--cc",
                "2pl,occ",
                "--elr",
                "off,sx",
                "--lock-table",
                "latched",
            ],
            &["tpcb", "--log", "none,sync", "--log-latency", "10ms"],
        ] {
            let a = parse(good).unwrap();
            check_options(&a).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
    }

    /// In a list mixing concurrency controls, the runs that take no locks drop the lock
    /// table's options: one OCC run, not one per lock table, and its record names none.
    #[test]
    fn runs_without_locks_drop_the_lock_options() {
        let a = parse(&[
            "tpcb",
            "--cc",
            "2pl,occ,none",
            "--lock-table",
            "sharded,latch-free",
            "--elr",
            "off,sx",
            "--threads",
            "1",
        ])
        .unwrap();
        let plan = harness::plan(&a.sweep()).unwrap();
        let count = |cc: Cc| plan.runs.iter().filter(|(c, _)| c.cc == cc).count();
        assert_eq!(
            (count(Cc::TwoPl), count(Cc::Occ), count(Cc::None)),
            (4, 1, 2)
        );
        for (c, _) in &plan.runs {
            let named = |axis: &str| c.point.get(axis).is_some();
            assert_eq!(named("lock-table"), c.cc == Cc::TwoPl, "{:?}", c.point);
            assert_eq!(named("elr"), c.cc != Cc::Occ, "{:?}", c.point);
            if c.cc == Cc::Occ {
                assert_eq!(c.options.elr, shoal::Options::default().elr);
                assert_eq!(c.options.lock_table, shoal::Options::default().lock_table);
            }
        }
    }

    /// YCSB's updates are single-record transactions: under 2PL they must not deadlock
    /// (a read's shared lock upgraded at the write let two updates of one record do so).
    #[test]
    fn ycsb_updates_of_hot_records_never_deadlock() {
        let a = parse(&[
            "ycsb",
            "--records",
            "4",
            "--mix",
            "a,f",
            "--cc",
            "2pl",
            "--threads",
            "2",
            "--duration",
            "0.5",
            "--warmup",
            "0",
        ])
        .unwrap();
        let (records, res) = run_bench(&a);
        res.unwrap();
        assert_eq!(records.len(), 2);
        for r in &records {
            assert!(r.window.committed > 0);
            assert_eq!(r.window.aborts.aborted_deadlock, 0, "{:?}", r.window);
        }
    }
}
