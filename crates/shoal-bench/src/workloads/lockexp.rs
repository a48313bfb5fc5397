//! The command lines of the lock-manager experiments E2 and E7 (see `docs/results-e7.md`),
//! for an experiment runner to hand to `shoal bench` (each is the argument list after
//! `shoal bench`; add `--json FILE` and `--no-progress` as needed).

/// MPL (worker threads) swept by E7: 1, 2, 4, ..., 512 (1, 8, 64, 512 when `quick`).
fn e7_threads(quick: bool) -> &'static str {
    if quick {
        "1,8,64,512"
    } else {
        "1,2,4,8,16,32,64,128,256,512"
    }
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// E2 (Kimura et al. 2012 Fig. 4): intent-lock-only transactions on four tables and the
/// database, LIL against intent locks in each lock table, at 2 threads (the must-show point)
/// and more, for 0 to 100 absolute-lock transactions per million.
pub fn e2(quick: bool) -> Vec<Vec<String>> {
    let (dur, abs) = if quick {
        ("1", "0,100")
    } else {
        ("3", "0,10,100,1000,10000")
    };
    vec![args(&format!(
        "intents --cc 2pl --lock-table sharded,latched,latch-free --intent-locks lil,table \
         --threads 1,2,4,8 --absolute-locks {abs} --duration {dur} --warmup 0.5"
    ))]
}

/// E7 (Jung et al. 2013 Figs. 10, 13, 15), as groups of sweeps (each sweep is one `shoal
/// bench` command line): txbench read-only and 20% read-update with S = 10 and 100, then the
/// 5% hotspot variant of S = 10 with 20% read-update, MPL 1 to 512, for the three lock
/// tables; then the must-show point (read-only, S = 10, latched vs latch-free) again in three
/// passes over the MPLs with longer runs, one seed each, the middle pass from MPL 512 down:
/// the plot takes the median of the three per point, and the opposite orders keep a slow
/// spell of the machine (its speed drifts by up to a third over minutes) from landing on one
/// end of the sweep only; then the 60 s TPC-B run at MPL 128 whose records report resident
/// memory at start and end.
pub fn e7(quick: bool) -> Vec<Vec<Vec<String>>> {
    let t = e7_threads(quick);
    let down: Vec<&str> = t.split(',').rev().collect();
    let down = down.join(",");
    let dur = if quick { "1" } else { "1.5" };
    let tpcb = if quick { "10" } else { "60" };
    let long = if quick { "1" } else { "3" };
    let pass = |threads: &str, seed: u32| {
        args(&format!(
            "txbench --cc 2pl --lock-table latched,latch-free --rows-per-scan 10 \
             --update-fraction 0 --threads {threads} --seed {seed} --duration {long} \
             --warmup 0.5"
        ))
    };
    vec![
        vec![args(&format!(
            "txbench --cc 2pl --lock-table sharded,latched,latch-free --rows-per-scan 10,100 \
             --update-fraction 0,0.2 --threads {t} --duration {dur} --warmup 0.5"
        ))],
        vec![args(&format!(
            "txbench --cc 2pl --lock-table sharded,latched,latch-free --rows-per-scan 10 \
             --update-fraction 0.2 --hotspot on --threads {t} --duration {dur} --warmup 0.5"
        ))],
        vec![pass(t, 1), pass(&down, 2), pass(t, 3)],
        vec![args(&format!(
            "tpcb --cc 2pl --lock-table latch-free,latched --threads 128 --duration {tpcb} \
             --warmup 1"
        ))],
    ]
}
