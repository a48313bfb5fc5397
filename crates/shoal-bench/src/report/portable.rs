//! The portable path's results (`shoal bench --engine LIST`, [`crate::portable`]): one
//! [`PortableRecord`] per run, written as JSON with the shoal-native records' writer
//! ([`super::write_json`]) and printed as one table with each run's throughput beside its
//! ratio to shoal-2pl's.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Latency, Window};
use crate::config::portable::PortableParams;

/// One run's result.
#[derive(Clone, Debug, Serialize)]
pub struct PortableRecord {
    /// Workload name.
    pub workload: String,
    /// Engine name (`shoal-2pl`, `sqlite`, ...).
    pub engine: String,
    /// The engine's configuration.
    pub engine_options: String,
    /// `--log`.
    pub log: String,
    /// Worker threads.
    pub threads: usize,
    /// Workload options of this run (`scale`, `records`, `mix`, `hot_fraction`, ...).
    pub options: BTreeMap<String, String>,
    /// Seed.
    pub seed: u64,
    /// Seconds the load took.
    pub load_s: f64,
    /// The measurement window and what committed and aborted in it.
    #[serde(flatten)]
    pub window: Window,
    /// Commits per second in the window.
    pub throughput: f64,
    /// Throughput divided by shoal-2pl's on the same options, if shoal-2pl ran.
    pub vs_shoal_2pl: Option<f64>,
    /// Latency percentiles of commits (retries included), microseconds.
    pub latency_us: Latency,
    /// Consistency check: `ok: summary` or `FAILED: reason`.
    pub check: String,
}

impl PortableRecord {
    /// The options other than the engine, identifying comparable runs.
    pub fn peer_key(&self) -> String {
        format!(
            "{} {} {} {:?} {}",
            self.workload, self.log, self.threads, self.options, self.seed
        )
    }
}

/// The result table: one row per run, with the throughput ratio to shoal-2pl.
pub fn render_table(p: &PortableParams, records: &[PortableRecord]) -> String {
    let mut s = format!(
        "{} through the portable path: warm-up {:.1} s, {:.1} s per run\n",
        p.workload.name(),
        p.warmup.as_secs_f64(),
        p.duration.as_secs_f64()
    );
    let head = [
        "engine", "log", "options", "threads", "tps", "vs 2pl", "commits", "aborts", "dl/to/cf",
    ];
    let head = head.into_iter().chain(Latency::HEADER).chain(["check"]);
    let mut rows: Vec<Vec<String>> = vec![head.map(String::from).collect()];
    for r in records {
        let opts: Vec<String> = r.options.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let a = &r.window.aborts;
        rows.push(vec![
            r.engine.clone(),
            r.log.clone(),
            opts.join(" "),
            r.threads.to_string(),
            format!("{:.0}", r.throughput),
            r.vs_shoal_2pl.map_or("-".into(), |v| format!("{v:.2}")),
            r.window.committed.to_string(),
            a.aborted.to_string(),
            format!(
                "{}/{}/{}",
                a.aborted_deadlock, a.aborted_lock_timeout, a.aborted_conflict
            ),
        ]);
        let row = rows.last_mut().expect("just pushed");
        row.extend(r.latency_us.cells());
        row.push(super::check_cell(r.check.starts_with("ok")));
    }
    // Engine, log and options left-aligned, the figures right-aligned.
    super::push_aligned(&mut s, &rows, 3);
    s.push_str("vs 2pl: throughput / shoal-2pl's with the same options; dl/to/cf: aborts by deadlock / lock timeout (SQLite: busy) / conflict\n");
    s
}
