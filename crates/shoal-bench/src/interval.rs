//! Per-interval reporting: throughput, p99 latency and aborts of each interval of a run's
//! measurement window (`--report-interval SECS`, `--csv FILE`).
//!
//! Design: the workers already bump a per-thread atomic commit counter after every commit
//! (for the progress bar). When sampling is on, each worker also bumps a per-thread atomic
//! abort counter on each measured abort and records each measured commit's latency into its
//! own interval histogram behind its own mutex — uncontended except for the instant, once per
//! interval, when the harness's control thread (which already wakes every 10 ms) swaps it for
//! an empty one. So the cost per commit is one uncontended lock and a histogram increment,
//! and only when sampling was asked for. The control thread sums the counters' deltas and
//! merges the swapped histograms into one [`Sample`] per interval.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::driver::{new_hist, Padded};
use crate::sweep::Point;

/// The command-line options of per-interval reporting (flattened into `shoal bench`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct IntervalArgs {
    /// While a run measures, print one line per SECS seconds: elapsed time, throughput, p99
    /// latency and aborts of that interval (instead of the progress bar). The JSON records
    /// then carry the series in `intervals`.
    #[arg(long, value_name = "SECS", value_parser = parse_interval_secs)]
    pub report_interval: Option<f64>,

    /// Write the per-interval samples to FILE as CSV: one row per run per interval, with the
    /// run's option values as columns. Samples every `--report-interval` seconds (1 s if not
    /// given, then without printing lines).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
}

impl IntervalArgs {
    /// The sampling these options ask for, if any.
    pub fn sampling(&self) -> Option<Sampling> {
        match (self.report_interval, &self.csv) {
            (Some(s), _) => Some(Sampling {
                every: Duration::from_secs_f64(s),
                print: true,
            }),
            (None, Some(_)) => Some(Sampling {
                every: Duration::from_secs(1),
                print: false,
            }),
            (None, None) => None,
        }
    }
}

/// Parses an interval length in seconds (0.01 to 3600).
pub fn parse_interval_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && (0.01..=3600.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{v} is not a number of seconds between 0.01 and 3600"
        ))
    }
}

/// How a run samples its measurement window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Interval length.
    pub every: Duration,
    /// Print one line per interval.
    pub print: bool,
}

/// One interval of a run's measurement window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds from the start of the measurement window to the end of this interval.
    pub t_s: f64,
    /// Commits in this interval.
    pub commits: u64,
    /// Commits since the start of the measurement window, this interval included.
    pub total_commits: u64,
    /// Commits per second in this interval.
    pub tps: f64,
    /// Aborts (each retried) in this interval.
    pub aborts: u64,
    /// 99th percentile latency of this interval's commits, microseconds (0 if none).
    pub p99_us: f64,
    /// Memory gauges read at the end of the interval.
    #[serde(flatten)]
    pub gauges: Gauges,
}

/// Gauges read at the end of each interval (memory, rather than rates).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Gauges {
    /// Resident set size, KiB.
    pub rss_kb: Option<u64>,
    /// The lock table's lock names with a queue or lock head allocated (the latch-free
    /// table's pooled heads included).
    pub lock_heads: usize,
    /// Lock request entries allocated.
    pub lock_entries: usize,
}

/// What the workers record for the sampler: per-thread abort counters and interval latency
/// histograms.
pub struct Probe {
    aborts: Vec<Padded>,
    hists: Vec<Mutex<Histogram<u64>>>,
}

impl Probe {
    /// A probe for `threads` workers.
    pub fn new(threads: usize) -> Probe {
        Probe {
            aborts: (0..threads).map(|_| Padded::default()).collect(),
            hists: (0..threads).map(|_| Mutex::new(new_hist())).collect(),
        }
    }

    /// Worker `thread` aborted a transaction in the measurement window.
    pub fn abort(&self, thread: usize) {
        self.aborts[thread].0.fetch_add(1, Ordering::Relaxed);
    }

    /// Worker `thread` committed a transaction of latency `ns` in the measurement window.
    pub fn commit(&self, thread: usize, ns: u64) {
        if let Ok(mut h) = self.hists[thread].lock() {
            h.saturating_record(ns);
        }
    }

    fn aborts(&self) -> u64 {
        self.aborts
            .iter()
            .map(|p| p.0.load(Ordering::Relaxed))
            .sum()
    }

    /// Takes every worker's interval histogram, leaving empty ones, merged into one.
    fn take_latency(&self) -> Histogram<u64> {
        let mut all = new_hist();
        for h in &self.hists {
            let mine = match h.lock() {
                Ok(mut g) => std::mem::replace(&mut *g, new_hist()),
                Err(_) => continue,
            };
            let _ = all.add(&mine);
        }
        all
    }
}

/// The control thread's side: cuts the measurement window into intervals.
pub struct Sampler {
    every: Duration,
    print: bool,
    start: Option<Instant>,
    last: Instant,
    last_commits: u64,
    base_commits: u64,
    last_aborts: u64,
    /// The samples so far.
    pub samples: Vec<Sample>,
}

impl Sampler {
    /// A sampler cutting intervals of `s.every`; prints a heading naming the run when
    /// printing.
    pub fn new(s: Sampling, run: &Point) -> Sampler {
        if s.print {
            println!("intervals of {}:", run.describe());
        }
        let now = Instant::now();
        Sampler {
            every: s.every,
            print: s.print,
            start: None,
            last: now,
            last_commits: 0,
            base_commits: 0,
            last_aborts: 0,
            samples: Vec::new(),
        }
    }

    /// The measurement window started at `now`, with `commits` commits counted so far.
    pub fn start(&mut self, now: Instant, commits: u64, probe: &Probe) {
        self.start = Some(now);
        self.last = now;
        self.last_commits = commits;
        self.base_commits = commits;
        self.last_aborts = probe.aborts();
        let _ = probe.take_latency();
    }

    /// Called by the control loop with the time and the commit counter: closes an interval
    /// when one is due.
    pub fn tick(&mut self, now: Instant, commits: u64, probe: &Probe, gauges: impl Fn() -> Gauges) {
        if self.start.is_some() && now - self.last >= self.every {
            self.cut(now, commits, probe, gauges());
        }
    }

    /// The measurement window ended at `now`: closes the last, possibly shorter, interval
    /// (unless it is shorter than a millisecond).
    pub fn finish(
        &mut self,
        now: Instant,
        commits: u64,
        probe: &Probe,
        gauges: impl Fn() -> Gauges,
    ) {
        if self.start.is_some() && now - self.last >= Duration::from_millis(1) {
            self.cut(now, commits, probe, gauges());
        }
    }

    fn cut(&mut self, now: Instant, commits: u64, probe: &Probe, g: Gauges) {
        let Some(start) = self.start else { return };
        let secs = (now - self.last).as_secs_f64();
        let n = commits.saturating_sub(self.last_commits);
        let aborts = probe.aborts();
        let lat = probe.take_latency();
        let s = Sample {
            t_s: round3((now - start).as_secs_f64()),
            commits: n,
            total_commits: commits.saturating_sub(self.base_commits),
            tps: if secs > 0.0 {
                (n as f64 / secs * 10.0).round() / 10.0
            } else {
                0.0
            },
            aborts: aborts.saturating_sub(self.last_aborts),
            p99_us: if lat.is_empty() {
                0.0
            } else {
                (lat.value_at_quantile(0.99) as f64 / 100.0).round() / 10.0
            },
            gauges: g,
        };
        if self.print {
            let g = &s.gauges;
            let rss = g
                .rss_kb
                .map_or_else(|| "?".to_string(), |k| format!("{:.0}", k as f64 / 1024.0));
            println!(
                "  t={:>8.2}s  tps={:>10.0}  p99={:>10.1}us  aborts={}  rss={rss}MiB  \
                 lock heads={} entries={}",
                s.t_s, s.tps, s.p99_us, s.aborts, g.lock_heads, g.lock_entries
            );
        }
        self.last = now;
        self.last_commits = commits;
        self.last_aborts = aborts;
        self.samples.push(s);
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Quotes a CSV field if it needs it.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Renders per-interval rows as CSV: `run`, `workload`, then every option named by any run
/// (in first-seen order; empty where a run lacks it), then the sample's fields.
pub fn render_csv(runs: &[(String, Point, Vec<Sample>)]) -> String {
    let mut cols: Vec<&'static str> = Vec::new();
    for (_, p, _) in runs {
        for (n, _) in &p.0 {
            if !cols.contains(n) {
                cols.push(n);
            }
        }
    }
    let mut out = String::from("run,workload");
    for c in &cols {
        out.push(',');
        out.push_str(&crate::sweep::json_name(c));
    }
    out.push_str(",t_s,commits,total_commits,tps,aborts,p99_us,rss_kb,lock_heads,lock_entries\n");
    for (i, (workload, p, samples)) in runs.iter().enumerate() {
        let mut prefix = format!("{i},{}", csv_field(workload));
        for c in &cols {
            prefix.push(',');
            if let Some(v) = p.get(c) {
                prefix.push_str(&csv_field(&v.to_string()));
            }
        }
        for s in samples {
            let _ = writeln!(
                out,
                "{prefix},{},{},{},{},{},{},{},{},{}",
                s.t_s,
                s.commits,
                s.total_commits,
                s.tps,
                s.aborts,
                s.p99_us,
                s.gauges.rss_kb.map_or_else(String::new, |k| k.to_string()),
                s.gauges.lock_heads,
                s.gauges.lock_entries
            );
        }
    }
    out
}

/// Writes per-interval rows to `path` ([`render_csv`]).
pub fn write_csv(path: &Path, runs: &[(String, Point, Vec<Sample>)]) -> anyhow::Result<()> {
    std::fs::write(path, render_csv(runs)).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Value;

    #[test]
    fn sampler_cuts_intervals_with_deltas() {
        let probe = Probe::new(2);
        let run = Point(vec![("threads", Value::Int(2))]);
        let mut s = Sampler::new(
            Sampling {
                every: Duration::from_millis(100),
                print: false,
            },
            &run,
        );
        let t0 = Instant::now();
        probe.abort(0);
        s.start(t0, 10, &probe);
        probe.commit(0, 1_000);
        probe.commit(1, 2_000_000);
        probe.abort(1);
        let gauges = || Gauges {
            rss_kb: Some(2048),
            lock_heads: 3,
            lock_entries: 4,
        };
        s.tick(t0 + Duration::from_millis(50), 12, &probe, gauges);
        assert!(s.samples.is_empty());
        s.tick(t0 + Duration::from_millis(100), 12, &probe, gauges);
        s.finish(t0 + Duration::from_millis(150), 13, &probe, gauges);
        assert_eq!(s.samples.len(), 2);
        let a = &s.samples[0];
        assert_eq!((a.commits, a.total_commits, a.aborts), (2, 2, 1));
        assert_eq!(a.tps, 20.0);
        assert!((a.p99_us - 2000.0).abs() < 5.0, "{a:?}");
        let b = &s.samples[1];
        assert_eq!(
            (b.commits, b.total_commits, b.aborts, b.p99_us),
            (1, 3, 0, 0.0)
        );
        assert_eq!(b.t_s, 0.15);
        assert_eq!(b.gauges, gauges());
    }

    #[test]
    fn csv_has_a_row_per_interval_and_option_columns() {
        let sample = |t| Sample {
            t_s: t,
            commits: 5,
            total_commits: 5,
            tps: 5.0,
            aborts: 0,
            p99_us: 1.5,
            gauges: Gauges {
                rss_kb: Some(100),
                lock_heads: 7,
                lock_entries: 8,
            },
        };
        let runs = vec![
            (
                "tpcb".to_string(),
                Point(vec![
                    ("threads", Value::Int(1)),
                    ("read-ratio", Value::Float(0.5)),
                ]),
                vec![sample(1.0), sample(2.0)],
            ),
            (
                "tpcb".to_string(),
                Point(vec![
                    ("threads", Value::Int(2)),
                    ("dist", Value::from("a,b")),
                ]),
                vec![sample(1.0)],
            ),
        ];
        let text = render_csv(&runs);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "run,workload,threads,read_ratio,dist,t_s,commits,total_commits,tps,aborts,p99_us,\
             rss_kb,lock_heads,lock_entries"
        );
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1], "0,tpcb,1,0.5,,1,5,5,5,0,1.5,100,7,8");
        assert_eq!(lines[3], "1,tpcb,2,,\"a,b\",1,5,5,5,0,1.5,100,7,8");
    }

    #[test]
    fn interval_option_bounds() {
        assert!(parse_interval_secs("0.5").is_ok());
        assert!(parse_interval_secs("0").is_err());
        assert!(parse_interval_secs("x").is_err());
        let a = IntervalArgs {
            report_interval: None,
            csv: Some("x.csv".into()),
        };
        assert_eq!(a.sampling().map(|s| s.print), Some(false));
    }
}
