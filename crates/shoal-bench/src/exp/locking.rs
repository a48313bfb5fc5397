//! The locking papers' experiments: Kimura et al. 2012 (key-range modes, intent locks,
//! deadlock handling, victims, early lock release), Jung et al. 2013 (the lock table) and
//! Shore-MT (per-thread throughput).

use super::registry::{values, window};
use super::{Group, Metric, TIME};
use crate::workloads::lockexp;

pub(super) fn e1(quick: bool) -> Vec<Group> {
    let w = window(quick);
    let a = format!(
        "keyrange --cc 2pl --threads 6 --existing-endpoints 0,0.25,0.5,0.75,1 \
         --key-range-modes graefe,lomet,sx {w}"
    );
    vec![Group::new("key-range lock modes", "existing_endpoints").sweep("", &a)]
}

pub(super) fn e2(quick: bool) -> Vec<Group> {
    lockexp::e2(quick)
        .into_iter()
        .map(|args| {
            Group::new("intent locks", "absolute_locks")
                .log_y()
                .run("", args)
        })
        .collect()
}

pub(super) fn e3(quick: bool) -> Vec<Group> {
    let t = values(quick, "1,4,16,64", "1,2,4,8,16,32,64,128,256");
    let scale = values(quick, "--scale 1", "");
    let w = window(quick);
    let a = format!(
        "tpcb {scale} --cc 2pl --log none --deadlock \
         dreadlocks-spin,dreadlocks-sleep,dreadlocks-backoff,dreadlocks-hybrid \
         --threads {t} {w}"
    );
    vec![Group::new("TPC-B, no log", "threads")
        .metrics(&[Metric::Throughput, Metric::Aborts])
        .sweep("", &a)]
}

pub(super) fn e4(quick: bool) -> Vec<Group> {
    let t = values(quick, "1,4,16", "1,2,4,8,16,32,64");
    let w = values(quick, "--duration 0.3 --warmup 0.1", window(false));
    let a = format!(
        "tellers --cc 2pl --deadlock dreadlocks-spin,dreadlocks-hybrid,dreadlocks-backoff,wound-wait,wait-die,no-wait \
         --threads {t} {w}"
    );
    vec![Group::new("5 tellers in canonical order", "threads")
        .metrics(&[Metric::Throughput, Metric::Aborts])
        .sweep("", &a)]
}

pub(super) fn e5(quick: bool) -> Vec<Group> {
    let w = values(
        quick,
        "--scale 1 --threads 6 --duration 2 --warmup 0.2 --report-interval 0.25",
        "--threads 6 --duration 30 --warmup 1 --report-interval 1",
    );
    let a = format!(
        "tpcb --cc 2pl --log pipelined --log-latency 10ms --reverse-fraction 0.5 \
         --deadlock dreadlocks-backoff --victim kill-short,kill-long,kill-young {w}"
    );
    let title =
        "deadlock-prone TPC-B (half the transactions in reverse order), pipelined log, 10 ms flush";
    vec![Group::new(title, TIME)
        .metrics(&[Metric::Completed, Metric::IntervalTps])
        .sweep("", &a)]
}

pub(super) fn e6(quick: bool) -> Vec<Group> {
    // Commits wait for 10 ms flushes: quick windows need more than 0.5 s to count enough.
    let w = values(quick, "--duration 1.5 --warmup 0.3", window(false));
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
    let read_ratio = format!("{base} --log-latency 10ms --zipf 1 --read-ratio {rr} {w}");
    let skewed = format!("{base} --log-latency 10ms {skew} {w}");
    let latency = format!("{base} --log-latency 100us,1ms,10ms {w}");
    vec![
        Group::new("read ratio, Zipf 1, 10 ms log", "read_ratio").sweep("", &read_ratio),
        Group::new("skew, 10 ms log", "dist").sweep("", &skewed),
        Group::new("log device latency", "log_latency")
            .log_y()
            .sweep("", &latency),
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
        .map(|(i, sweeps)| {
            let title = titles.get(i).copied().unwrap_or("txbench");
            // Sweeps of one group share the empty label: their records form one series per
            // lock table, and the plot takes the median per MPL.
            sweeps
                .into_iter()
                .fold(Group::new(title, "threads").log_y(), |g, args| {
                    g.run("", args)
                })
        })
        .collect()
}

pub(super) fn e8(quick: bool) -> Vec<Group> {
    let t = values(quick, "1,2,4", "1,2,4,8,16,32,64");
    let w = window(quick);
    let tpcc = |mix: &str| format!("tpcc --mix {mix} --cc 2pl --threads {t} {w}");
    vec![Group::new("per-thread throughput", "threads")
        .metrics(&[Metric::ThroughputPerThread])
        .log_y()
        .sweep("insert", &format!("insert --cc 2pl --threads {t} {w}"))
        .sweep("payment", &tpcc("payment"))
        .sweep("new-order", &tpcc("new-order"))]
}
