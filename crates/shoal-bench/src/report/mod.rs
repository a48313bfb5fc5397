//! Results: one [`Record`] per run, printed as a table and written as JSON; the portable
//! path's ([`portable`]) share their parts ([`Window`], [`Aborts`], [`Latency`]), the JSON
//! writer and the table layout.
//!
//! `--json FILE` writes a single JSON **array** with one object per run, in run order. The file
//! is rewritten after every run, so it holds the finished runs even if a later one fails.

pub mod portable;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::config::Params;
use crate::driver::{RunStats, TypeStats};
use crate::harness::RunResult;
use crate::sweep::{json_name, Sweep, Value};

/// Latency percentiles of committed transactions, retries included, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Latency {
    /// The column names of [`cells`](Self::cells).
    pub const HEADER: [&'static str; 4] = ["p50 µs", "p99 µs", "p99.9 µs", "max µs"];

    /// The median, p99, p99.9 and largest latency as table cells.
    pub fn cells(&self) -> [String; 4] {
        [self.p50, self.p99, self.p999, self.max].map(|v| format!("{v:.1}"))
    }

    /// Percentiles of a histogram of nanoseconds, in microseconds.
    pub fn from_ns(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        let us = |ns: f64| (ns / 100.0).round() / 10.0;
        Latency {
            p50: us(h.value_at_quantile(0.5) as f64),
            p90: us(h.value_at_quantile(0.9) as f64),
            p99: us(h.value_at_quantile(0.99) as f64),
            p999: us(h.value_at_quantile(0.999) as f64),
            max: us(h.max() as f64),
            mean: us(h.mean()),
        }
    }
}

/// Aborts (each retried) in a measurement window, all reasons and by reason; in the JSON
/// records of both drivers and of each transaction type.
#[derive(Clone, Debug, Serialize)]
pub struct Aborts {
    /// All aborts.
    pub aborted: u64,
    /// Aborts reported as deadlocks: cycles a detecting policy found (the waits-for graph,
    /// Dreadlocks, including its false positives) and the aborts of the prevention policies
    /// (no-wait, wait-die, wound-wait), which abort on a wait that could close a cycle.
    pub aborted_deadlock: u64,
    /// Aborts by lock timeout (SQLite: busy).
    pub aborted_lock_timeout: u64,
    /// Aborts by optimistic conflict.
    pub aborted_conflict: u64,
}

impl Aborts {
    /// The aborts counted as deadlock, lock timeout and conflict.
    pub fn of(by_reason: [u64; 3]) -> Aborts {
        let [deadlock, lock_timeout, conflict] = by_reason;
        Aborts {
            aborted: deadlock + lock_timeout + conflict,
            aborted_deadlock: deadlock,
            aborted_lock_timeout: lock_timeout,
            aborted_conflict: conflict,
        }
    }

    /// The column names of [`cells`](Self::cells).
    pub const HEADER: [&'static str; 4] = ["aborts", "deadlock", "timeout", "conflict"];

    /// The four counts as table cells.
    pub fn cells(&self) -> [String; 4] {
        [
            self.aborted,
            self.aborted_deadlock,
            self.aborted_lock_timeout,
            self.aborted_conflict,
        ]
        .map(|n| n.to_string())
    }
}

/// A run's measurement window and what committed and aborted in it; in the JSON records of
/// both drivers.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    /// Configured measurement window, seconds.
    pub duration_s: f64,
    /// Configured warm-up, seconds.
    pub warmup_s: f64,
    /// Actual measurement window, seconds (throughput divides by this).
    pub measured_s: f64,
    /// Commits in the measurement window.
    pub committed: u64,
    /// Aborts in the measurement window, by reason.
    #[serde(flatten)]
    pub aborts: Aborts,
}

impl Window {
    /// The window of a run measured for `measured_s` seconds (configured: `duration`
    /// after `warmup`) with the counts of `s`.
    pub fn new(duration: Duration, warmup: Duration, measured_s: f64, s: &RunStats) -> Window {
        Window {
            duration_s: duration.as_secs_f64(),
            warmup_s: warmup.as_secs_f64(),
            measured_s,
            committed: s.committed,
            aborts: Aborts::of(s.aborts),
        }
    }
}

/// One transaction type's measurements in a run's JSON record.
#[derive(Clone, Debug, Serialize)]
pub struct TypeRecord {
    /// The transaction type, e.g. `new-order`.
    #[serde(rename = "type")]
    pub name: String,
    /// Commits in the measurement window.
    pub committed: u64,
    /// Expected rollbacks in the measurement window (TPC-C NewOrder's invalid item).
    pub rolled_back: u64,
    /// Aborts in the measurement window, by reason.
    #[serde(flatten)]
    pub aborts: Aborts,
    /// Doppel: attempts stashed (re-run in the next joined phase; not aborts).
    pub stashed: u64,
    /// Aborts per attempt: aborted / (committed + rolled back + aborted), 0 to 1.
    pub abort_rate: f64,
    /// Commits per second in the measurement window.
    pub throughput: f64,
    /// Latency percentiles of the type's commits in microseconds.
    pub latency_us: Latency,
}

impl TypeRecord {
    /// The record of one type's statistics over a window of `secs` seconds.
    pub fn new(t: &TypeStats, secs: f64) -> TypeRecord {
        let aborted = t.aborted();
        let attempts = t.committed + t.rolled_back + aborted;
        TypeRecord {
            name: t.name.to_string(),
            committed: t.committed,
            rolled_back: t.rolled_back,
            aborts: Aborts::of(t.aborts),
            stashed: t.stashed,
            abort_rate: if attempts == 0 {
                0.0
            } else {
                (aborted as f64 / attempts as f64 * 1e6).round() / 1e6
            },
            throughput: if secs > 0.0 {
                (t.committed as f64 / secs * 10.0).round() / 10.0
            } else {
                0.0
            },
            latency_us: Latency::from_ns(&t.latency_ns),
        }
    }
}

/// One run's JSON record.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// Workload name, e.g. `tpcb`.
    pub workload: String,
    /// Always `shoal`.
    pub engine: &'static str,
    /// The shoal version the binary was built with.
    pub engine_version: &'static str,
    /// Every swept option's value, keyed by its name with `-` → `_` (`cc`, `threads`,
    /// `scale`, `read_ratio`, `seed`, …).
    #[serde(flatten)]
    pub options: BTreeMap<String, Value>,
    /// Every engine option of the run's database (swept or default), as the engine prints it.
    pub engine_options: String,
    /// The measurement window and what committed and aborted in it.
    #[serde(flatten)]
    pub window: Window,
    /// Doppel: attempts stashed in the measurement window, each re-run in the next joined
    /// phase (not aborts; the wait counts in the latency).
    pub stashed: u64,
    /// Doppel: the runtime's counters over the run (split keys, split phases, stashes);
    /// absent unless `cc` is `doppel`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub doppel: Option<crate::workloads::doppel_args::DoppelRun>,
    /// Expected rollbacks in the measurement window (not retried, not failures).
    pub rolled_back: u64,
    /// Commits per second in the measurement window.
    pub throughput: f64,
    /// Latency percentiles in microseconds.
    pub latency_us: Latency,
    /// The same measurements per transaction type, in the workload's order.
    pub per_type: Vec<TypeRecord>,
    /// Commits in the whole run, warm-up included.
    pub total_committed: u64,
    /// Whether the consistency check passed.
    pub consistent: bool,
    /// The consistency check's summary or failure.
    pub check: String,
    /// Which run on its loaded database this was (0 = right after the load).
    pub db_run: usize,
    /// Seconds its database took to load.
    pub load_s: f64,
    /// Resident memory (KiB) at the start of the run, database loaded.
    pub rss_start_kb: Option<u64>,
    /// Resident memory (KiB) at the end of the measurement window.
    pub rss_end_kb: Option<u64>,
    /// Peak resident memory (KiB) during the run.
    pub peak_rss_kb: Option<u64>,
    /// CPU time of the worker threads per commit in the measurement window, microseconds
    /// (their CPU clocks: unlike throughput, not lowered by other processes holding a core).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_us_per_commit: Option<f64>,
    /// Lock names (queues or lock heads) the lock table held at the start of the run and at
    /// the end of the measurement window (the latch-free table counts idle heads not yet
    /// reclaimed), and its request entries at the same moments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_heads: Option<[u64; 2]>,
    /// See `lock_heads`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_entries: Option<[u64; 2]>,
    /// Per-interval samples of the measurement window (only when sampling:
    /// `--report-interval`, `--csv`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub intervals: Vec<crate::interval::Sample>,
}

impl Record {
    /// The record of a finished run.
    pub fn new(params: &Params, r: &RunResult) -> Record {
        let s = &r.stats;
        Record {
            workload: params.workload.name().to_string(),
            engine: "shoal",
            engine_version: env!("CARGO_PKG_VERSION"),
            options: {
                // The engine options not swept, at their effective values, then the sweep
                // point (which names the swept ones as given).
                let mut o: BTreeMap<String, Value> = r
                    .cfg
                    .engine_options()
                    .into_iter()
                    .map(|(n, v)| (json_name(n), v))
                    .collect();
                o.extend(r.cfg.point.0.iter().map(|(n, v)| (json_name(n), v.clone())));
                o
            },
            engine_options: format!("{:?}", r.cfg.options),
            window: Window::new(params.duration, params.warmup, s.measured.as_secs_f64(), s),
            stashed: s.stashed,
            doppel: s.doppel.clone(),
            rolled_back: s.rolled_back,
            throughput: (s.throughput() * 10.0).round() / 10.0,
            latency_us: Latency::from_ns(&s.latency_ns),
            per_type: s
                .per_type
                .iter()
                .map(|t| TypeRecord::new(t, s.measured.as_secs_f64()))
                .collect(),
            total_committed: s.total_committed,
            consistent: r.check.is_ok(),
            check: match &r.check {
                Ok(m) | Err(m) => m.clone(),
            },
            db_run: r.db_run,
            load_s: (r.load_s * 1000.0).round() / 1000.0,
            rss_start_kb: s.rss_start_kb,
            rss_end_kb: s.rss_end_kb,
            peak_rss_kb: s.peak_rss_kb,
            cpu_us_per_commit: s
                .worker_cpu
                .filter(|_| s.committed > 0)
                .map(|c| (c.as_secs_f64() * 1e9 / s.committed as f64).round() / 1000.0),
            lock_heads: s.lock_footprint.map(|[a, b]| [a.0 as u64, b.0 as u64]),
            lock_entries: s.lock_footprint.map(|[a, b]| [a.1 as u64, b.1 as u64]),
            intervals: s.intervals.clone(),
        }
    }
}

/// Formats a histogram of nanoseconds as HdrHistogram's percentile distribution text, in
/// microseconds (5 ticks per half distance, as HdrHistogram's `outputPercentileDistribution`).
pub fn hgrm(h: &Histogram<u64>) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "{:>12} {:>14} {:>10} {:>14}\n\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    for v in h.iter_quantiles(5) {
        total += v.count_since_last_iteration();
        let q = v.quantile_iterated_to();
        let inv = if q < 1.0 {
            format!("{:>14.2}", 1.0 / (1.0 - q))
        } else {
            format!("{:>14}", "")
        };
        let _ = writeln!(
            out,
            "{:>12.3} {:>2.12} {:>10} {inv}",
            v.value_iterated_to() as f64 / 1000.0,
            q,
            total
        );
    }
    let _ = write!(
        out,
        "#[Mean    = {:>12.3}, StdDeviation   = {:>12.3}]\n\
         #[Max     = {:>12.3}, Total count    = {:>12}]\n",
        h.mean() / 1000.0,
        h.stdev() / 1000.0,
        h.max() as f64 / 1000.0,
        h.len(),
    );
    out
}

/// Writes run number `n`'s latency histograms to `dir` as `.hgrm` files: `NNN-OPTIONS.hgrm`
/// for all transactions and `NNN-OPTIONS-TYPE.hgrm` per type when there are several.
pub fn write_hgrm(dir: &Path, n: usize, r: &RunResult) -> anyhow::Result<()> {
    let name: String = r
        .cfg
        .point
        .0
        .iter()
        .map(|(k, v)| format!("{k}-{v}"))
        .collect::<Vec<_>>()
        .join("_")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut files = vec![(format!("{n:03}-{name}.hgrm"), &r.stats.latency_ns)];
    if r.stats.per_type.len() > 1 {
        for t in &r.stats.per_type {
            files.push((format!("{n:03}-{name}-{}.hgrm", t.name), &t.latency_ns));
        }
    }
    for (f, h) in files {
        let path = dir.join(f);
        std::fs::write(&path, hgrm(h)).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Writes `records` to `path` as one JSON array (the shoal-native [`Record`]s and the portable
/// path's records alike).
pub fn write_json<R: Serialize>(path: &Path, records: &[R]) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(records)?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The options shown as table columns: those given more than one value, plus `cc` and
/// `threads` always.
fn column_axes(sweep: &Sweep) -> Vec<&'static str> {
    sweep
        .axes
        .iter()
        .filter(|a| a.values.len() > 1 || a.name == "cc" || a.name == "threads")
        .map(|a| a.name)
        .collect()
}

/// The results table: a heading naming the settings common to all runs, then one row per run.
pub fn render_table(params: &Params, sweep: &Sweep, records: &[Record]) -> String {
    let cols = column_axes(sweep);
    let fixed: Vec<String> = sweep
        .axes
        .iter()
        .filter(|a| !cols.contains(&a.name))
        .map(|a| {
            let v: Vec<String> = a.values.iter().map(Value::to_string).collect();
            format!("{}={}", a.name, v.join(","))
        })
        .collect();
    let mut out = format!(
        "{} on shoal {}: {}; warmup {} s, measured {} s per run\n",
        params.workload.name(),
        env!("CARGO_PKG_VERSION"),
        fixed.join(" "),
        params.warmup.as_secs_f64(),
        params.duration.as_secs_f64(),
    );
    let after: Vec<&str> = ["stashed"]
        .into_iter()
        .chain(Latency::HEADER)
        .chain(["cpu µs", "rss MiB", "check"])
        .collect();
    let mut rows = vec![header(&cols, &["tps", "commits"], &after)];
    for r in records {
        let mut row = option_cells(&cols, r);
        row.extend([
            format!("{:.0}", r.throughput),
            r.window.committed.to_string(),
        ]);
        row.extend(r.window.aborts.cells());
        row.push(r.stashed.to_string());
        row.extend(r.latency_us.cells());
        row.extend([
            r.cpu_us_per_commit
                .map_or_else(|| "-".to_string(), |c| format!("{c:.2}")),
            r.rss_end_kb
                .map_or_else(|| "-".to_string(), |k| format!("{:.0}", k as f64 / 1024.0)),
            check_cell(r.consistent),
        ]);
        rows.push(row);
    }
    push_aligned(&mut out, &rows, 0);
    if records.iter().any(|r| r.per_type.len() > 1) {
        out.push_str("\nper transaction type (abort% = aborts per attempt):\n");
        out.push_str(&render_per_type(&cols, records));
    }
    out
}

/// A table's cell for a consistency check that passed (`ok`) or not (`FAILED`).
pub fn check_cell(ok: bool) -> String {
    if ok { "ok" } else { "FAILED" }.to_string()
}

/// A table's header: the option columns `cols`, then `before`, the abort columns and `after`.
fn header(cols: &[&str], before: &[&str], after: &[&str]) -> Vec<String> {
    let names = cols
        .iter()
        .chain(before)
        .chain(&Aborts::HEADER)
        .chain(after);
    names.map(|c| c.to_string()).collect()
}

/// The values of the options `cols` in record `r` (`-` where it has none).
fn option_cells(cols: &[&'static str], r: &Record) -> Vec<String> {
    let cell = |c: &&str| {
        r.options
            .get(&json_name(c))
            .map_or_else(|| "-".into(), Value::to_string)
    };
    cols.iter().map(cell).collect()
}

/// The per-transaction-type table: one row per run and type.
fn render_per_type(cols: &[&'static str], records: &[Record]) -> String {
    let before = ["type", "tps", "commits", "rollbacks"];
    let after = [
        "stashed",
        "abort%",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
    ];
    let mut rows = vec![header(cols, &before, &after)];
    for r in records {
        // Types the mix never drew (e.g. `--mix payment`) are left out.
        for t in r
            .per_type
            .iter()
            .filter(|t| t.committed + t.rolled_back + t.aborts.aborted > 0)
        {
            let mut row = option_cells(cols, r);
            let l = &t.latency_us;
            row.extend([
                t.name.clone(),
                format!("{:.0}", t.throughput),
                t.committed.to_string(),
                t.rolled_back.to_string(),
            ]);
            row.extend(t.aborts.cells());
            row.extend([
                t.stashed.to_string(),
                format!("{:.2}", t.abort_rate * 100.0),
                format!("{:.1}", l.p50),
                format!("{:.1}", l.p90),
                format!("{:.1}", l.p99),
                format!("{:.1}", l.p999),
                format!("{:.1}", l.max),
            ]);
            rows.push(row);
        }
    }
    let mut out = String::new();
    push_aligned(&mut out, &rows, 0);
    out
}

/// Appends `rows` in columns, the first `left` of them left-aligned and the others
/// right-aligned, with a rule under the first (header) row.
pub fn push_aligned(out: &mut String, rows: &[Vec<String>], left: usize) {
    let ncol = rows[0].len();
    let widths: Vec<usize> = (0..ncol)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for (n, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < left {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if n == 0 {
            let total = widths.iter().sum::<usize>() + 2 * (ncol - 1);
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hgrm_lists_percentiles_up_to_the_max() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1 << 40, 3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap(); // 1..1000 µs
        }
        let text = hgrm(&h);
        let rows: Vec<&str> = text
            .lines()
            .skip(2)
            .take_while(|l| !l.starts_with('#'))
            .collect();
        assert!(rows.len() > 20, "{text}");
        let last: Vec<&str> = rows.last().unwrap().split_whitespace().collect();
        assert_eq!(last[2], "1000", "{text}");
        assert!(last[0].starts_with("100"), "{text}");
        assert!(text.contains("Total count    =         1000"), "{text}");
    }
    use crate::driver::RunStats;
    use crate::harness::plan;
    use crate::sweep::Axis;
    use crate::workloads::WorkloadKind;
    use std::time::Duration;

    fn params() -> Params {
        Params {
            workload: WorkloadKind::Tpcb,
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(3),
            db_dir: None,
            progress: false,
            sampling: None,
        }
    }

    fn sweep() -> Sweep {
        Sweep {
            axes: vec![
                Axis::new("scale", true, [2u64]),
                Axis::new("cc", true, [crate::config::Cc::TwoPl]),
                Axis::new("log", true, [crate::config::Log::Sync]),
                Axis::new("threads", false, [1u64, 8]),
                Axis::new("read-ratio", false, [0.0, 0.25]),
                Axis::new("seed", false, [7u64]),
            ],
        }
    }

    fn records() -> Vec<Record> {
        plan(&sweep())
            .unwrap()
            .runs
            .into_iter()
            .enumerate()
            .map(|(i, (cfg, _))| {
                let mut h = Histogram::new_with_bounds(1, 1 << 40, 3).unwrap();
                for ns in [1_000u64, 2_000, 3_000, 50_000] {
                    h.record(ns).unwrap();
                }
                let res = RunResult {
                    cfg,
                    stats: RunStats {
                        total_by_type: Vec::new(),
                        committed: 4,
                        total_committed: 5,
                        aborts: [1, 2, 0],
                        measured: Duration::from_secs(2),
                        latency_ns: h.clone(),
                        per_thread: vec![5],
                        rolled_back: 0,
                        per_type: vec![TypeStats {
                            name: "txn",
                            committed: 4,
                            rolled_back: 0,
                            aborts: [1, 2, 0],
                            stashed: 0,
                            latency_ns: h,
                        }],
                        rss_start_kb: Some(2048),
                        rss_end_kb: Some(4096),
                        peak_rss_kb: None,
                        lock_footprint: None,
                        intervals: Vec::new(),
                        stashed: 0,
                        doppel: None,
                        worker_cpu: None,
                    },
                    check: if i == 3 {
                        Err("bad".into())
                    } else {
                        Ok("fine".into())
                    },
                    db_run: i,
                    load_s: 0.5,
                };
                Record::new(&params(), &res)
            })
            .collect()
    }

    #[test]
    fn json_record_has_the_promised_fields() {
        let recs = records();
        let v = serde_json::to_value(&recs).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr.len(), 4);
        let r = arr[1].as_object().unwrap();
        for f in [
            "workload",
            "engine",
            "engine_version",
            "cc",
            "log",
            "threads",
            "scale",
            "read_ratio",
            "seed",
            "duration_s",
            "warmup_s",
            "committed",
            "aborted",
            "aborted_deadlock",
            "aborted_lock_timeout",
            "aborted_conflict",
            "throughput",
            "latency_us",
            "consistent",
        ] {
            assert!(r.contains_key(f), "missing {f}: {r:?}");
        }
        assert_eq!(r["workload"], "tpcb");
        assert_eq!(r["engine"], "shoal");
        assert_eq!(r["cc"], "2pl");
        assert_eq!(r["threads"], 1);
        assert_eq!(r["read_ratio"], 0.25);
        assert_eq!(r["scale"], 2);
        assert_eq!(r["committed"], 4);
        assert_eq!(r["aborted"], 3);
        assert_eq!(r["throughput"], 2.0);
        let l = r["latency_us"].as_object().unwrap();
        for f in ["p50", "p99", "p999", "max"] {
            assert!(l.contains_key(f), "missing latency_us.{f}");
        }
        assert_eq!(l["p50"], 2.0);
        assert_eq!(l["max"], 50.0);
        assert_eq!(arr[3]["consistent"], false);
    }

    #[test]
    fn per_type_records_and_table() {
        let mut recs = records();
        let r = &recs[0];
        assert_eq!(r.per_type.len(), 1);
        assert_eq!(r.per_type[0].name, "txn");
        assert!((r.per_type[0].abort_rate - 3.0 / 7.0).abs() < 1e-5);
        // One type: no second table.
        assert!(!render_table(&params(), &sweep(), &recs).contains("per transaction type"));
        let mut t = TypeStats::new("payment");
        t.committed = 10;
        t.rolled_back = 2;
        t.aborts = [1, 0, 1];
        t.latency_ns.record(5_000).unwrap();
        let tr = TypeRecord::new(&t, 2.0);
        assert_eq!((tr.aborts.aborted, tr.throughput), (2, 5.0));
        assert!((tr.abort_rate - 2.0 / 14.0).abs() < 1e-5);
        assert_eq!(tr.latency_us.p90, 5.0);
        for r in &mut recs {
            r.per_type.push(tr.clone());
        }
        let v = serde_json::to_value(&recs[0]).unwrap();
        assert_eq!(v["per_type"][1]["type"], "payment");
        assert_eq!(v["per_type"][1]["rolled_back"], 2);
        assert!(v["per_type"][1]["latency_us"]["p90"].is_number());
        let table = render_table(&params(), &sweep(), &recs);
        let lines: Vec<&str> = table.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("per transaction type"))
            .expect(&table);
        // Header, rule, two types per run.
        assert_eq!(lines.len(), at + 1 + 2 + 2 * recs.len(), "{table}");
        assert!(lines[at + 1].contains("rollbacks"), "{table}");
        assert!(lines[at + 4].contains("payment"), "{table}");
    }

    #[test]
    fn json_file_is_one_array() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        write_json(&p, &records()).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 4);
    }

    #[test]
    fn table_shows_varying_options_as_columns() {
        let t = render_table(&params(), &sweep(), &records());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 1 + 2 + 4, "{t}");
        assert!(lines[0].contains("scale=2 log=sync seed=7"), "{t}");
        assert!(!lines[0].contains("threads="), "{t}");
        let head: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            &head[..5],
            ["cc", "threads", "read-ratio", "tps", "commits"]
        );
        assert!(lines[3].starts_with("2pl"), "{t}");
        assert!(lines[4].contains(" 0.25 "), "{t}");
        assert!(lines[6].ends_with("FAILED"), "{t}");
        assert!(lines[2].chars().all(|c| c == '-'));
        // All rows have the same width.
        assert_eq!(lines[1].chars().count(), lines[2].chars().count());
    }
}
