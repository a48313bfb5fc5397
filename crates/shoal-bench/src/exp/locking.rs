//! The locking papers' experiments: Kimura et al. 2012 (key-range modes, intent locks,
//! deadlock handling, victims, early lock release), Jung et al. 2013 (the lock table) and
//! Shore-MT (per-thread throughput).

use super::registry::{group, sweep, window};
use super::{Group, Metric, Run, TIME};
use crate::workloads::lockexp;

pub(super) fn e1(quick: bool) -> Vec<Group> {
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

pub(super) fn e2(quick: bool) -> Vec<Group> {
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

pub(super) fn e3(quick: bool) -> Vec<Group> {
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

pub(super) fn e4(quick: bool) -> Vec<Group> {
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

pub(super) fn e5(quick: bool) -> Vec<Group> {
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

pub(super) fn e6(quick: bool) -> Vec<Group> {
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

pub(super) fn e7(quick: bool) -> Vec<Group> {
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

pub(super) fn e8(quick: bool) -> Vec<Group> {
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
