//! The registry of experiments and the helpers their definitions share.

use super::doppel::{e10, e11, e12, e13, e14, e9};
use super::locking::{e1, e2, e3, e4, e5, e6, e7, e8};
use super::{Experiment, Group, Metric, Run};

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
    Experiment::new("E12", "Doppel Fig. 7-6, Table 7.3", "LIKE over the share of writes (alpha 1.4, uniform): throughput, read and write latency", e12),
    Experiment::new("E13", "Doppel Fig. 7-7", "LIKE over the split phase length: throughput and read latency", e13),
    Experiment::new("E14", "Doppel Table 7.4, Fig. 7-8", "RUBiS-C over alpha, and RUBiS-B", e14),
];

pub(super) fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

impl Group {
    /// A panel titled `title` over the option `x` (a JSON name, or [`TIME`](super::TIME)):
    /// throughput on a linear axis, no sweeps yet.
    pub(super) fn new(title: impl Into<String>, x: &'static str) -> Group {
        Group {
            title: title.into(),
            x,
            metrics: vec![Metric::Throughput],
            log_y: false,
            runs: Vec::new(),
        }
    }

    /// The y axes, one panel each (instead of throughput alone).
    pub(super) fn metrics(mut self, metrics: &[Metric]) -> Group {
        self.metrics = metrics.to_vec();
        self
    }

    /// A logarithmic y axis.
    pub(super) fn log_y(mut self) -> Group {
        self.log_y = true;
        self
    }

    /// Adds the sweep `shoal bench ARGS` (`args` separated by white space), its series
    /// labelled `label` (empty: by the options that vary).
    pub(super) fn sweep(self, label: &str, args: &str) -> Group {
        self.run(label, super::registry::args(args))
    }

    /// Adds a sweep given as `shoal bench`'s argument list.
    pub(super) fn run(mut self, label: &str, args: Vec<String>) -> Group {
        let label = label.to_string();
        self.runs.push(Run { label, args });
        self
    }
}

/// `quick`'s value list or the full one.
pub(super) fn values(quick: bool, quick_values: &'static str, full: &'static str) -> &'static str {
    if quick {
        quick_values
    } else {
        full
    }
}

/// Duration and warm-up arguments.
pub(super) fn window(quick: bool) -> &'static str {
    values(
        quick,
        "--duration 0.5 --warmup 0.2",
        "--duration 5 --warmup 1",
    )
}

/// The Doppel experiments' windows (Doppel needs a few classification intervals of 200 ms
/// before it splits anything, so even quick runs last 1.5 s).
pub(super) fn doppel_window(quick: bool) -> &'static str {
    let quick_window = "--duration 1.5 --warmup 0.5 --records 100000";
    values(quick, quick_window, "--duration 5 --warmup 1")
}
