//! Runs the built `shoal` binary on tiny sweeps of the Doppel workloads (incr1, like, rubis)
//! with `--cc doppel` and `--cc atomic`, and checks their JSON records.

mod common;

use common::bench;

#[test]
fn incr1_runs_every_cc_including_doppel_and_atomic() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, recs) = bench(dir.path(), "incr1 --records 2000 --cc 2pl,occ,doppel,atomic --hot-fraction 1 --threads 2 --phase-ms 5 --duration 0.5");
    assert!(stdout.contains("stashed"), "{stdout}");
    let ccs: Vec<&str> = recs.iter().map(|r| r["cc"].as_str().unwrap()).collect();
    assert_eq!(ccs, ["2pl", "occ", "doppel", "atomic"]);
    for r in &recs {
        assert_eq!(r["workload"], "incr1");
        assert_eq!(r["records"], 2000);
        assert_eq!(r["hot_fraction"], 1.0);
        assert_eq!(r["consistent"], true, "{r:#}");
        assert!(r["committed"].as_u64().unwrap() > 0, "{r:#}");
        assert!(r["stashed"].is_u64(), "{r:#}");
        let doppel = r["cc"] == "doppel";
        assert_eq!(r.get("doppel").is_some(), doppel, "{r:#}");
        if doppel {
            assert_eq!(r["phase_ms"], 5.0, "{r:#}");
            let d = &r["doppel"];
            for f in [
                "split_keys",
                "split_keys_max",
                "max_split_keys",
                "split_phases",
                "stashed",
            ] {
                assert!(d[f].is_u64(), "missing doppel.{f}: {r:#}");
            }
        }
    }
    assert!(
        recs[3]["check"].as_str().unwrap().contains("atomic"),
        "{:#}",
        recs[3]
    );
}

#[test]
fn like_and_rubis_run_under_doppel_and_skip_atomic() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, recs) = bench(dir.path(), "like --records 1000 --cc occ,doppel,atomic --alpha 1.4 --write-fraction 0.5 --threads 2 --duration 0.3");
    assert!(
        stdout.contains("note: skipping") && stdout.contains("atomic"),
        "{stdout}"
    );
    assert_eq!(recs.len(), 2);
    for r in &recs {
        assert_eq!(r["consistent"], true, "{r:#}");
        assert_eq!(r["write_fraction"], 0.5);
        let types = common::types(r);
        assert_eq!(types, ["read", "write"]);
    }
    let (_, recs) = bench(
        dir.path(),
        "rubis --records 3000 --cc 2pl,doppel --variant b,c --threads 2 --duration 0.3",
    );
    assert_eq!(recs.len(), 4);
    for r in &recs {
        assert_eq!(r["consistent"], true, "{r:#}");
        assert_eq!(r["alpha"], 1.8);
        assert!(r["check"].as_str().unwrap().contains("bids on"), "{r:#}");
    }
}
