//! Command-line options of the Doppel workloads (INCR1, INCRZ, LIKE, RUBiS) and of Doppel
//! itself (`--phase-ms`), the sweep axes they become, the skip rules of `--cc atomic`, and the
//! Doppel counters a run's record carries.

use serde::Serialize;
use shoal::doppel::DoppelStats;
use shoal::Database;

use super::WorkloadKind;
use crate::config::{Cc, RunConfig};
use crate::sweep::Axis;

/// `--variant` of RUBiS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Variant {
    /// RUBiS-B: the bidding mix, 15% read-write transactions.
    B,
    /// RUBiS-C: half the transactions are StoreBid.
    C,
}

impl Variant {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Variant::B => "b",
            Variant::C => "c",
        }
    }
}

/// The options of the Doppel workloads, flattened into `shoal bench`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct DoppelArgs {
    /// incr1: share (0 to 1) of the transactions that ADD to the one hot counter.
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "0.5",
          value_parser = crate::parse_ratio)]
    pub hot_fraction: Vec<f64>,

    /// incr1: move the hot counter every DURATION (`5s`, `500ms`) of wall-clock time since
    /// the run started (warm-up included): counter 0 first, then each period another counter
    /// drawn from `--seed`. Off when not given.
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = parse_hot_move)]
    pub hot_move_every: Option<Vec<String>>,

    /// incrz, like, rubis: Zipf exponent of the key (page, item) popularity; 0 = uniform.
    /// Defaults: incrz 1.4, like 1.4, rubis 1.8.
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = parse_alpha)]
    pub alpha: Option<Vec<f64>>,

    /// like: share (0 to 1) of the transactions that write (like a page); the rest read.
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "0.5",
          value_parser = crate::parse_ratio)]
    pub write_fraction: Vec<f64>,

    /// rubis: `b` (RUBiS-B, the bidding mix) or `c` (RUBiS-C: 50% StoreBid).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "c"
    )]
    pub variant: Vec<Variant>,

    /// Doppel: split phase length t_s in milliseconds (`DoppelOptions::split_phase`;
    /// default 20). Changes the database: each value gets its own load.
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = parse_phase_ms)]
    pub phase_ms: Option<Vec<f64>>,

    /// Doppel: label the N most popular records split from the start with
    /// `Database::split_hint` (the thesis' manual labelling, §3.6), on top of the automatic
    /// classification: counters 0..N for incr1 (counter 0 is the hot one) and incrz (the
    /// Zipfian's most popular first), pages 0..N for like, all split for ADD. 0 labels
    /// nothing (the default). Changes the database: each value gets its own load. Not for
    /// rubis, nor with `--hot-move-every` (the labels would not follow the hot counter).
    #[arg(long, value_delimiter = ',', value_name = "LIST",
          value_parser = clap::value_parser!(u64).range(0..=MAX_SPLIT_TOP))]
    pub split_top: Option<Vec<u64>>,
}

/// Most records `--split-top` labels.
pub const MAX_SPLIT_TOP: u64 = 10_000;

/// Parses `--hot-move-every`: a duration of at least 1 ms, kept as given for display.
pub fn parse_hot_move(s: &str) -> Result<String, String> {
    let d = crate::config::engine::parse_duration(s)?;
    if d < std::time::Duration::from_millis(1) {
        return Err(format!("{s:?}: the hot key moves at most every 1ms"));
    }
    Ok(s.trim().to_string())
}

fn parse_alpha(s: &str) -> Result<f64, String> {
    crate::dist::parse_theta(s)
}

fn parse_phase_ms(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 && v <= 60_000.0 {
        Ok(v)
    } else {
        Err(format!(
            "{v}: a phase length in ms, more than 0 and at most 60000"
        ))
    }
}

/// Whether `w` is one of the workloads of this module.
pub fn is_doppel_workload(w: WorkloadKind) -> bool {
    matches!(
        w,
        WorkloadKind::Incr1 | WorkloadKind::Incrz | WorkloadKind::Like | WorkloadKind::Rubis
    )
}

/// Whether `w` has a `--cc atomic` form.
pub fn has_atomic(w: WorkloadKind) -> bool {
    matches!(w, WorkloadKind::Incr1 | WorkloadKind::Incrz)
}

impl DoppelArgs {
    /// Axes that change the database, to go with the engine options: `records` for these
    /// workloads (`given`, default 1,000,000) and `phase-ms` when given.
    pub fn db_axes(&self, w: WorkloadKind, records: Option<&[u64]>) -> Vec<Axis> {
        let mut axes = Vec::new();
        if is_doppel_workload(w) {
            let r = records.map_or_else(|| vec![1_000_000], <[u64]>::to_vec);
            axes.push(Axis::new("records", true, r));
        }
        if let Some(p) = &self.phase_ms {
            axes.push(Axis::new("phase-ms", true, p.iter().copied()));
        }
        if let Some(n) = &self.split_top {
            axes.push(Axis::new("split-top", true, n.iter().copied()));
        }
        axes
    }

    /// Why these options cannot run on `w`, if they cannot.
    pub fn check(&self, w: WorkloadKind) -> anyhow::Result<()> {
        if self.hot_move_every.is_some() && w != WorkloadKind::Incr1 {
            anyhow::bail!("--hot-move-every applies to incr1 only");
        }
        if self.split_top.is_some() {
            if !matches!(
                w,
                WorkloadKind::Incr1 | WorkloadKind::Incrz | WorkloadKind::Like
            ) {
                anyhow::bail!("--split-top applies to incr1, incrz and like only");
            }
            if self.hot_move_every.is_some() {
                anyhow::bail!(
                    "--split-top labels counter 0 and would not follow \
                     --hot-move-every; give one or the other"
                );
            }
        }
        Ok(())
    }

    /// The workload's own axes (not changing the database).
    pub fn workload_axes(&self, w: WorkloadKind) -> Vec<Axis> {
        let alpha = |default: f64| {
            let a = self.alpha.clone().unwrap_or_else(|| vec![default]);
            Axis::new("alpha", false, a)
        };
        match w {
            WorkloadKind::Incr1 => {
                let mut axes = vec![Axis::new(
                    "hot-fraction",
                    false,
                    self.hot_fraction.iter().copied(),
                )];
                if let Some(m) = &self.hot_move_every {
                    axes.push(Axis::new(
                        "hot-move-every",
                        false,
                        m.iter().map(String::as_str),
                    ));
                }
                axes
            }
            WorkloadKind::Incrz => vec![alpha(1.4)],
            WorkloadKind::Like => vec![
                alpha(1.4),
                Axis::new("write-fraction", false, self.write_fraction.iter().copied()),
            ],
            WorkloadKind::Rubis => vec![
                Axis::new("variant", false, self.variant.iter().map(|v| v.name())),
                alpha(1.8),
            ],
            _ => Vec::new(),
        }
    }
}

/// The sweep axes that only Doppel uses.
const DOPPEL_ONLY: [&str; 2] = ["phase-ms", "split-top"];

/// Whether `cfg` repeats a planned run: `--phase-ms` and `--split-top` do not apply to other
/// concurrency controls than Doppel, so their runs that differ only in those are dropped, and
/// the first one kept loses the options (its record does not name a phase length or labels
/// it did not use).
pub fn repeats_without_doppel_axes(
    cfg: &mut RunConfig,
    planned: &[(RunConfig, crate::sweep::Point)],
) -> bool {
    if cfg.cc == Cc::Doppel || DOPPEL_ONLY.iter().all(|a| cfg.point.get(a).is_none()) {
        return false;
    }
    cfg.point.0.retain(|(n, _)| !DOPPEL_ONLY.contains(n));
    planned.iter().any(|(c, _)| c.point == cfg.point)
}

/// `--split-top N` on a Doppel run: labels the records `prefix` 0..N of `table` (at most
/// `rows`) split for ADD. Does nothing for other concurrency controls or without the option.
pub fn label_top(
    db: &Database,
    cfg: &RunConfig,
    table: &shoal::Table,
    prefix: u8,
    rows: u64,
) -> anyhow::Result<()> {
    let n = cfg.split_top;
    if cfg.cc != Cc::Doppel || n == 0 {
        return Ok(());
    }
    let mut k = [0u8; 16];
    for i in 0..n.min(rows) {
        db.split_hint(table, key16(prefix, i, &mut k), shoal::doppel::SplitOp::Add)
            .map_err(|e| anyhow::anyhow!("--split-top: labelling {}: {e}", table.name()))?;
    }
    Ok(())
}

/// Why `cfg` cannot run on `workload`: `--cc atomic` on a workload without an atomic form.
pub fn skip_reason(cfg: &RunConfig, workload: Option<WorkloadKind>) -> Option<String> {
    if cfg.cc == Cc::Atomic && workload.is_some_and(|w| !has_atomic(w)) {
        return Some(format!(
            "skipping {}: --cc atomic (plain atomic adds, no transactions) applies to the \
             INCR workloads only",
            cfg.point.describe()
        ));
    }
    None
}

/// Doppel's counters over one run, for its record.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DoppelRun {
    /// Records split at the end of the measurement window (0 if the window ended in a
    /// joined phase with nothing split for the next one).
    pub split_keys: usize,
    /// Most records split at once in the window (sampled every 10 ms).
    pub split_keys_max: usize,
    /// Mean number of records split in the window (sampled every 10 ms).
    pub split_keys_mean: f64,
    /// Share of the window's samples that found the database in a split phase.
    pub split_time: f64,
    /// Most records split at once so far on this database.
    pub max_split_keys: usize,
    /// Split phases entered during the run (warm-up included).
    pub split_phases: u64,
    /// Transactions the engine stashed during the run (warm-up included).
    pub stashed: u64,
    /// Phase changes cancelled during the run (transactions did not drain in time).
    pub cancelled_changes: u64,
    /// Every record split at some sample of the window, as `table/key:OP`, most often split
    /// first (at most 32).
    pub split: Vec<String>,
    /// When the set of records split changed during the window: one entry per split phase
    /// whose set differs from the previous entry's, and an empty set once a joined phase has
    /// lasted [`JOINED_SAMPLES`] samples (the short joined phases between split phases are
    /// left out); at most [`MAX_SPLIT_CHANGES`] entries.
    pub split_changes: Vec<SplitChange>,
}

/// Most entries of [`DoppelRun::split_changes`].
pub const MAX_SPLIT_CHANGES: usize = 256;

/// Consecutive joined samples (10 ms apart) after which [`DoppelRun::split_changes`] notes
/// that nothing is split.
pub const JOINED_SAMPLES: u32 = 5;

/// A split phase whose set of split records differs from the previous split phase's.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SplitChange {
    /// Seconds since the window's first sample (10 ms samples; the first comes at most 10 ms
    /// after the window starts).
    pub t_s: f64,
    /// The records split, as `table/key:OP`.
    pub split: Vec<String>,
}

/// Samples Doppel's state during a run's measurement window.
pub struct DoppelSampler {
    start: Option<DoppelStats>,
    samples: u64,
    in_split: u64,
    sum: u64,
    max: usize,
    seen: Vec<(String, u64)>,
    first: Option<std::time::Instant>,
    changes: Vec<SplitChange>,
    /// The current run of joined samples: its length and its first sample's time.
    joined: (u32, f64),
}

impl DoppelSampler {
    /// Starts sampling `db` (does nothing unless it runs Doppel).
    pub fn new(db: &Database) -> DoppelSampler {
        DoppelSampler {
            start: db.doppel_stats(),
            samples: 0,
            in_split: 0,
            sum: 0,
            max: 0,
            seen: Vec::new(),
            first: None,
            changes: Vec::new(),
            joined: (0, 0.0),
        }
    }

    /// Takes one sample (called every 10 ms of the measurement window).
    pub fn tick(&mut self, db: &Database) {
        let Some(s) = db.doppel_stats() else { return };
        let now = std::time::Instant::now();
        let t0 = *self.first.get_or_insert(now);
        let t_s = ((now - t0).as_secs_f64() * 1000.0).round() / 1000.0;
        self.samples += 1;
        if s.phase != Some(shoal::doppel::Phase::Split) {
            if self.joined.0 == 0 {
                self.joined.1 = t_s;
            }
            self.joined.0 += 1;
            if self.joined.0 == JOINED_SAMPLES {
                self.note_change(self.joined.1, Vec::new());
            }
            return;
        }
        self.joined.0 = 0;
        self.in_split += 1;
        let keys = db.split_keys();
        self.sum += keys.len() as u64;
        self.max = self.max.max(keys.len());
        let names: Vec<String> = keys
            .into_iter()
            .map(|(t, k, op)| format!("{t}/{}:{op:?}", String::from_utf8_lossy(&k)))
            .collect();
        for name in &names {
            match self.seen.iter_mut().find(|(n, _)| n == name) {
                Some(e) => e.1 += 1,
                None => self.seen.push((name.clone(), 1)),
            }
        }
        self.note_change(t_s, names);
    }

    /// Notes that the records split are `split` from `t_s` on, unless they already were.
    fn note_change(&mut self, t_s: f64, split: Vec<String>) {
        let last = self.changes.last().map(|c| &c.split);
        // The window starts with nothing split unless a split phase says otherwise.
        let unchanged = last.map_or(split.is_empty(), |l| *l == split);
        if !unchanged && self.changes.len() < MAX_SPLIT_CHANGES {
            self.changes.push(SplitChange { t_s, split });
        }
    }

    /// The run's counters; `None` unless the database runs Doppel.
    pub fn finish(mut self, db: &Database) -> Option<DoppelRun> {
        let end = db.doppel_stats()?;
        let s = self.start.clone().unwrap_or_default();
        self.seen
            .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let n = self.samples.max(1) as f64;
        Some(DoppelRun {
            split_keys: end.split_keys,
            split_keys_max: self.max,
            split_keys_mean: (self.sum as f64 / n * 100.0).round() / 100.0,
            split_time: (self.in_split as f64 / n * 1000.0).round() / 1000.0,
            max_split_keys: end.max_split_keys,
            split_phases: end.split_phases.saturating_sub(s.split_phases),
            stashed: end.stashed.saturating_sub(s.stashed),
            cancelled_changes: end.cancelled_changes.saturating_sub(s.cancelled_changes),
            split: self.seen.into_iter().take(32).map(|(n, _)| n).collect(),
            split_changes: self.changes,
        })
    }
}

/// Fixed-width key `PREFIX` + 15 hex digits of `id` (16 bytes with a one-byte prefix, the
/// thesis' 16-byte keys), written into `buf` without allocating.
pub fn key16(prefix: u8, id: u64, buf: &mut [u8; 16]) -> &[u8; 16] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf[0] = prefix;
    for (i, b) in buf[1..].iter_mut().enumerate() {
        let shift = 4 * (14 - i);
        *b = HEX[((id >> shift) & 0xf) as usize];
    }
    buf
}

/// Parses a key written by [`key16`] back into its id.
pub fn parse_key16(key: &[u8]) -> Option<u64> {
    if key.len() != 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(&key[1..]).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of a 2-thread LIKE sweep over `ccs` and the database axis `axis`, and its
    /// runs described.
    fn like_plan(ccs: &[Cc], axis: crate::sweep::Axis) -> (crate::harness::Plan, Vec<String>) {
        use crate::sweep::{Axis, Sweep};
        let sweep = Sweep {
            axes: vec![
                Axis::new("cc", true, ccs.iter().copied()),
                Axis::new("log", true, [crate::config::Log::None]),
                axis,
                Axis::new("threads", false, [2u64]),
                Axis::new("seed", false, [1u64]),
            ],
        };
        let plan = crate::harness::plan_for(&sweep, Some(WorkloadKind::Like)).unwrap();
        let runs = plan.runs.iter().map(|(c, _)| c.point.describe()).collect();
        (plan, runs)
    }

    #[test]
    fn phase_ms_applies_to_doppel_only() {
        let axis = crate::sweep::Axis::new("phase-ms", true, [1.0, 5.0]);
        let (plan, runs) = like_plan(&[Cc::Occ, Cc::Doppel, Cc::Atomic], axis);
        assert_eq!(
            runs,
            [
                "cc=occ log=none threads=2 seed=1",
                "cc=doppel log=none phase-ms=1 threads=2 seed=1",
                "cc=doppel log=none phase-ms=5 threads=2 seed=1",
            ]
        );
        let phase = |i: usize| plan.runs[i].0.options.doppel.split_phase;
        assert_eq!(phase(2), std::time::Duration::from_millis(5));
        // atomic is skipped (like has no atomic form) with one note per point.
        assert_eq!(plan.skipped.len(), 1, "{:?}", plan.skipped);
        assert!(plan.skipped[0].contains("cc=atomic"));
    }

    #[test]
    fn split_top_applies_to_doppel_only_and_labels_the_top_records() {
        let axis = crate::sweep::Axis::new("split-top", true, [0u64, 2]);
        let (plan, runs) = like_plan(&[Cc::Occ, Cc::Doppel], axis);
        assert_eq!(
            runs,
            [
                "cc=occ log=none threads=2 seed=1",
                "cc=doppel log=none split-top=0 threads=2 seed=1",
                "cc=doppel log=none split-top=2 threads=2 seed=1",
            ]
        );
        // The labels are the records 0 and 1, split for ADD once a split phase starts.
        let cfg = &plan.runs[2].0;
        let db = Database::in_memory_with(cfg.options.clone());
        let t = db.create_table("pages").unwrap();
        label_top(&db, cfg, &t, b'p', 1_000).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut split = db.split_keys();
        while split.len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            split = db.split_keys();
        }
        let mut keys: Vec<Vec<u8>> = split.into_iter().map(|(_, k, _)| k).collect();
        keys.sort();
        assert_eq!(
            keys,
            [b"p000000000000000".to_vec(), b"p000000000000001".to_vec()]
        );
        // With `--split-top 0` nothing is labelled: no split phase follows.
        let none = Database::in_memory_with(plan.runs[1].0.options.clone());
        let t = none.create_table("pages").unwrap();
        label_top(&none, &plan.runs[1].0, &t, b'p', 1_000).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(none.split_keys().is_empty());
        assert_eq!(none.doppel_stats().unwrap().split_phases, 0);
    }

    #[test]
    fn split_top_is_refused_where_it_cannot_apply() {
        let args = |split: bool, moves: bool| DoppelArgs {
            hot_fraction: vec![0.5],
            hot_move_every: moves.then(|| vec!["5s".to_string()]),
            alpha: None,
            write_fraction: vec![0.5],
            variant: vec![Variant::C],
            phase_ms: None,
            split_top: split.then(|| vec![1]),
        };
        assert!(args(true, false).check(WorkloadKind::Like).is_ok());
        assert!(args(true, false).check(WorkloadKind::Incrz).is_ok());
        let rubis = args(true, false)
            .check(WorkloadKind::Rubis)
            .unwrap_err()
            .to_string();
        assert!(rubis.contains("incr1, incrz and like"), "{rubis}");
        assert!(args(true, true).check(WorkloadKind::Incr1).is_err());
        assert!(args(false, true).check(WorkloadKind::Incr1).is_ok());
        assert!(args(false, true).check(WorkloadKind::Like).is_err());
    }

    #[test]
    fn keys_are_sixteen_bytes_and_parse_back() {
        let mut b = [0u8; 16];
        assert_eq!(key16(b'k', 0x2a, &mut b), b"k00000000000002a");
        assert_eq!(parse_key16(&b), Some(0x2a));
        assert_eq!(parse_key16(b"short"), None);
    }
}
