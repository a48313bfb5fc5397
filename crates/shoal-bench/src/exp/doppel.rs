//! The Doppel thesis' experiments (chapter 7): INCR1, INCRZ, LIKE and RUBiS.

use super::registry::{doppel_window, values};
use super::{Group, Metric, TIME};

pub(super) fn e9(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let hot = values(quick, "0,0.5,1", "0,0.1,0.2,0.4,0.6,0.8,1");
    ["2", "16"]
        .iter()
        .map(|t| {
            let a =
                format!("incr1 --cc 2pl,occ,doppel,atomic --hot-fraction {hot} --threads {t} {w}");
            Group::new(format!("INCR1, {t} threads"), "hot_fraction")
                .log_y()
                .sweep("", &a)
        })
        .collect()
}

pub(super) fn e10(quick: bool) -> Vec<Group> {
    // No warm-up: the hot key moves every `every` from the start of the run, so the moves
    // fall at multiples of `every` on the time axis (and the first period shows Doppel
    // finding the first hot key). The thesis' 10% on 2 cores conflicts rarely; the 50% panel
    // (not in the thesis) is where splitting pays on 2 cores, so a dip has room to show.
    let every = values(quick, "1.5s", "5s");
    let w = values(
        quick,
        "--duration 6 --warmup 0 --records 100000",
        "--duration 20 --warmup 0",
    );
    [
        ("2", "10%", "0.1"),
        ("16", "10%", "0.1"),
        ("2", "50%", "0.5"),
    ]
    .iter()
    .map(|(t, pct, hot)| {
        let title = format!("INCR1, {pct} hot, the hot key moving every {every}, {t} threads");
        let a = format!(
            "incr1 --cc occ,doppel --hot-fraction {hot} --hot-move-every {every} \
             --threads {t} --report-interval 0.1 {w}"
        );
        Group::new(title, TIME)
            .metrics(&[Metric::IntervalTps])
            .sweep("", &a)
    })
    .collect()
}

pub(super) fn e11(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let alpha = values(quick, "0,0.8,1.4,2", "0,0.4,0.8,1,1.2,1.4,1.6,1.8,2");
    let a = format!("incrz --cc 2pl,occ,doppel,atomic --alpha {alpha} --threads 2 {w}");
    vec![Group::new("INCRZ, 2 threads", "alpha")
        .log_y()
        .sweep("", &a)]
}

/// Throughput and Table 7.3's mean and p99 latencies of reads and writes.
const LATENCIES: [Metric; 5] = [
    Metric::Throughput,
    Metric::ReadMean,
    Metric::ReadP99,
    Metric::WriteMean,
    Metric::WriteP99,
];

pub(super) fn e12(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let wf = values(quick, "0.1,0.5,1", "0,0.1,0.2,0.3,0.5,0.7,0.9,1");
    // Fig. 7-6 sweeps the writes at alpha 1.4; Table 7.3 also has a uniform workload.
    [
        ("LIKE, alpha 1.4, 2 threads", "1.4"),
        ("LIKE, uniform, 2 threads", "0"),
    ]
    .into_iter()
    .map(|(title, alpha)| {
        let a = format!(
            "like --cc 2pl,occ,doppel --alpha {alpha} --write-fraction {wf} --threads 2 {w}"
        );
        Group::new(title, "write_fraction")
            .metrics(&LATENCIES)
            .sweep("", &a)
    })
    .collect()
}

pub(super) fn e13(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let ms = values(quick, "1,5,20", "1,2,5,10,20,50,100");
    // Fig. 7-7's three workloads: uniform with half reads, alpha 1.4 with half reads, and
    // alpha 1.4 with a tenth reads.
    let like = |alpha: &str, wf: &str| {
        format!("like --cc doppel --alpha {alpha} --write-fraction {wf} --phase-ms {ms} --threads 2 {w}")
    };
    vec![Group::new("LIKE, Doppel, 2 threads", "phase_ms")
        .metrics(&[Metric::Throughput, Metric::ReadMean, Metric::ReadP99])
        .sweep("uniform, 50% reads", &like("0", "0.5"))
        .sweep("alpha 1.4, 50% reads", &like("1.4", "0.5"))
        .sweep("alpha 1.4, 10% reads", &like("1.4", "0.9"))]
}

pub(super) fn e14(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let alpha = values(quick, "0,1,1.8", "0,0.5,1,1.4,1.8,2");
    let rubis = |v: &str| {
        format!("rubis --variant {v} --cc 2pl,occ,doppel --alpha {alpha} --threads 2 {w}")
    };
    vec![Group::new("RUBiS, 2 threads", "alpha")
        .sweep("RUBiS-C", &rubis("c"))
        .sweep("RUBiS-B", &rubis("b"))]
}
