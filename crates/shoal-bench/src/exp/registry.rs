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
    Experiment::new("E12", "Doppel Fig. 7-6, Table 7.3", "LIKE over the share of writes, alpha 1.4", e12),
    Experiment::new("E13", "Doppel Fig. 7-7", "LIKE over the split phase length", e13),
    Experiment::new("E14", "Doppel Table 7.4, Fig. 7-8", "RUBiS-C over alpha, and RUBiS-B", e14),
];

pub(super) fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

pub(super) fn sweep(label: &str, a: &str) -> Run {
    Run {
        label: label.to_string(),
        args: args(a),
    }
}

pub(super) fn group(
    title: &str,
    x: &'static str,
    metrics: &[Metric],
    log_y: bool,
    runs: Vec<Run>,
) -> Group {
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
pub(super) fn throughput(title: &str, x: &'static str, log_y: bool, a: &str) -> Group {
    group(title, x, &[Metric::Throughput], log_y, vec![sweep("", a)])
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
    if quick {
        "--duration 0.5 --warmup 0.2"
    } else {
        "--duration 5 --warmup 1"
    }
}

/// The Doppel experiments' windows (Doppel needs a few classification intervals of 200 ms
/// before it splits anything, so even quick runs last 1.5 s).
pub(super) fn doppel_window(quick: bool) -> &'static str {
    if quick {
        "--duration 1.5 --warmup 0.5 --records 100000"
    } else {
        "--duration 5 --warmup 1"
    }
}
