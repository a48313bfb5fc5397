//! The Doppel thesis' experiments (chapter 7): INCR1, INCRZ, LIKE and RUBiS.

use super::registry::{doppel_window, group, sweep, throughput, values};
use super::{Group, Metric, TIME};

pub(super) fn e9(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let hot = values(quick, "0,0.5,1", "0,0.1,0.2,0.4,0.6,0.8,1");
    ["2", "16"]
        .iter()
        .map(|t| {
            throughput(
                &format!("INCR1, {t} threads"),
                "hot_fraction",
                true,
                &format!("incr1 --cc 2pl,occ,doppel,atomic --hot-fraction {hot} --threads {t} {w}"),
            )
        })
        .collect()
}

pub(super) fn e10(quick: bool) -> Vec<Group> {
    // No warm-up: the hot key moves every `every` from the start of the run, so the moves
    // fall at multiples of `every` on the time axis (and the first period shows Doppel
    // finding the first hot key). The thesis' 10% on 2 cores conflicts rarely; the 50% panel
    // (not in the thesis) is where splitting pays on 2 cores, so a dip has room to show.
    let (every, w) = if quick {
        ("1.5s", "--duration 6 --warmup 0 --records 100000")
    } else {
        ("5s", "--duration 20 --warmup 0")
    };
    [
        ("2", "10%", "0.1"),
        ("16", "10%", "0.1"),
        ("2", "50%", "0.5"),
    ]
    .iter()
    .map(|(t, pct, hot)| {
        group(
            &format!("INCR1, {pct} hot, the hot key moving every {every}, {t} threads"),
            TIME,
            &[Metric::IntervalTps],
            false,
            vec![sweep(
                "",
                &format!(
                    "incr1 --cc occ,doppel --hot-fraction {hot} --hot-move-every {every} \
                         --threads {t} --report-interval 0.1 {w}"
                ),
            )],
        )
    })
    .collect()
}

pub(super) fn e11(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let alpha = values(quick, "0,0.8,1.4,2", "0,0.4,0.8,1,1.2,1.4,1.6,1.8,2");
    let a = format!("incrz --cc 2pl,occ,doppel,atomic --alpha {alpha} --threads 2 {w}");
    vec![throughput("INCRZ, 2 threads", "alpha", true, &a)]
}

pub(super) fn e12(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let wf = values(quick, "0.1,0.5,1", "0,0.1,0.2,0.3,0.5,0.7,0.9,1");
    let a = format!("like --cc 2pl,occ,doppel --alpha 1.4 --write-fraction {wf} --threads 2 {w}");
    vec![throughput(
        "LIKE, alpha 1.4, 2 threads",
        "write_fraction",
        false,
        &a,
    )]
}

pub(super) fn e13(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let ms = values(quick, "1,5,20", "1,2,5,10,20,50,100");
    let a =
        format!("like --cc doppel --alpha 1.4 --write-fraction 1 --phase-ms {ms} --threads 2 {w}");
    vec![throughput(
        "LIKE, alpha 1.4, 100% writes, 2 threads",
        "phase_ms",
        false,
        &a,
    )]
}

pub(super) fn e14(quick: bool) -> Vec<Group> {
    let w = doppel_window(quick);
    let alpha = values(quick, "0,1,1.8", "0,0.5,1,1.4,1.8,2");
    vec![group(
        "RUBiS, 2 threads",
        "alpha",
        &[Metric::Throughput],
        false,
        vec![
            sweep(
                "RUBiS-C",
                &format!("rubis --variant c --cc 2pl,occ,doppel --alpha {alpha} --threads 2 {w}"),
            ),
            sweep(
                "RUBiS-B",
                &format!("rubis --variant b --cc 2pl,occ,doppel --alpha {alpha} --threads 2 {w}"),
            ),
        ],
    )]
}
