//! Runs the built `shoal` binary on a tiny TPC-B sweep and checks its JSON output.

mod common;

use std::process::Command;

use common::{records, shoal, shoal_env};

#[test]
fn tiny_tpcb_sweep_writes_three_consistent_records() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let (stdout, _) = shoal(
        dir.path(),
        "bench --scale 1 --threads 1,2 --cc 2pl,none --warmup 0 --duration 1 --json out.json",
    );
    assert!(stdout.contains("note: skipping"), "{stdout}");
    assert!(
        stdout.contains("cc=none") && stdout.contains("threads=2"),
        "{stdout}"
    );

    let recs = records(&json);
    assert_eq!(recs.len(), 3, "{recs:#?}");
    // Each record carries the lock table's footprint at the start and end of its window.
    for r in &recs {
        let heads = r["lock_heads"].as_array().expect("lock_heads [start, end]");
        assert_eq!(heads.len(), 2, "{r:#}");
        assert!(r["lock_entries"].as_array().is_some(), "{r:#}");
    }
    let combos: Vec<(String, u64)> = recs
        .iter()
        .map(|r| {
            (
                r["cc"].as_str().unwrap().to_string(),
                r["threads"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        combos,
        [
            ("2pl".to_string(), 1),
            ("2pl".to_string(), 2),
            ("none".to_string(), 1)
        ]
    );
    for r in &recs {
        let fields = "workload engine engine_version cc threads duration_s warmup_s committed \
                      aborted aborted_deadlock aborted_lock_timeout aborted_conflict \
                      throughput latency_us scale read_ratio seed";
        for f in fields.split_whitespace() {
            assert!(r.get(f).is_some(), "missing {f} in {r:#}");
        }
        for f in ["p50", "p99", "p999", "max"] {
            assert!(r["latency_us"].get(f).is_some(), "missing latency_us.{f}");
        }
        assert_eq!(r["workload"], "tpcb");
        assert_eq!(r["engine"], "shoal");
        assert_eq!(r["scale"], 1);
        assert!(r["committed"].as_u64().unwrap() > 0, "{r:#}");
        assert!(r["throughput"].as_f64().unwrap() > 0.0, "{r:#}");
        assert_eq!(r["consistent"], true, "{r:#}");
    }
}

#[test]
fn bad_options_fail_with_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["bench", "--threads", "0"])
        .output()
        .expect("run shoal");
    assert!(!out.status.success());
}

/// Runs `shoal bench ARGS` on a tiny TPC-B, expecting it to fail; returns its stderr.
fn bench_fails(args: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .current_dir(dir.path())
        .args("bench tpcb --scale 1 --threads 1 --warmup 0 --duration 0.2 --no-progress".split(' '))
        .args(args.split_whitespace())
        .output()
        .expect("run shoal");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "shoal bench {args} succeeded; stderr:\n{stderr}"
    );
    stderr
}

/// `--lock-table`, `--deadlock` and `--victim` mean something only to a run that takes
/// locks: without `2pl` among the `--cc` values they are refused, not recorded unused.
#[test]
fn lock_options_without_a_locking_cc_are_refused() {
    for args in [
        "--cc occ --deadlock no-wait",
        "--cc occ,none --lock-table latch-free",
        "--cc doppel --victim kill-short --deadlock dreadlocks-spin",
    ] {
        let stderr = bench_fails(args);
        assert!(stderr.contains("only --cc 2pl uses"), "{args}: {stderr}");
        let first = args.split_whitespace().nth(2).unwrap();
        assert!(stderr.contains(first), "{args}: {stderr}");
    }
}

/// A victim rule other than kill-young with a policy that chooses its own victim cannot
/// run: alone, the sweep has nothing left to run and fails.
#[test]
fn a_victim_rule_without_dreadlocks_is_refused() {
    let stderr = bench_fails("--cc 2pl --deadlock no-wait --victim kill-short");
    assert!(stderr.contains("no combination"), "{stderr}");
}

#[test]
fn tiny_tpcc_full_mix_reports_per_type_and_passes_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, _) = shoal_env(
        dir.path(),
        &[("SHOAL_TPCC_TINY", "1")],
        "bench tpcc --warehouses 2 --threads 2 --cc 2pl,occ --warmup 0 --duration 1 \
         --json out.json --no-progress",
    );
    assert!(stdout.contains("per transaction type"), "{stdout}");
    assert!(stdout.contains("new-order"), "{stdout}");
    let recs = records(&dir.path().join("out.json"));
    assert_eq!(recs.len(), 2, "{recs:#?}");
    for r in &recs {
        assert_eq!(r["workload"], "tpcc");
        assert_eq!(r["warehouses"], 2);
        assert_eq!(r["mix"], "full");
        assert_eq!(r["consistent"], true, "{r:#}");
        assert!(r["check"].as_str().unwrap().contains("conditions 1-4 hold"));
        let types = common::types(r);
        assert_eq!(
            types,
            [
                "new-order",
                "payment",
                "order-status",
                "delivery",
                "stock-level"
            ]
        );
        let per = r["per_type"].as_array().unwrap();
        let commits: u64 = per.iter().map(|t| t["committed"].as_u64().unwrap()).sum();
        assert_eq!(commits, r["committed"].as_u64().unwrap());
        assert!(per[0]["committed"].as_u64().unwrap() > 0, "{r:#}");
        assert!(per[0]["latency_us"]["p90"].is_number());
        let rolled: u64 = per.iter().map(|t| t["rolled_back"].as_u64().unwrap()).sum();
        assert_eq!(rolled, per[0]["rolled_back"].as_u64().unwrap());
        assert_eq!(rolled, r["rolled_back"].as_u64().unwrap());
    }
}

/// `shoal recover` on a directory without a database refuses, and leaves the directory as
/// it was: opening it would have created an empty database and reported it recovered.
#[test]
fn recover_refuses_a_directory_without_a_database() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    std::fs::create_dir(dir.path().join("other")).unwrap();
    std::fs::write(dir.path().join("other/notes.txt"), "not a database").unwrap();
    for d in ["empty", "other"] {
        let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .current_dir(dir.path())
            .args(["recover", d])
            .output()
            .expect("run shoal");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "recover {d} succeeded");
        assert!(stderr.contains("no shoal database"), "{stderr}");
        let left: Vec<_> = std::fs::read_dir(dir.path().join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), usize::from(d == "other"), "{d}: {left:?}");
    }
}

/// A victim rule with a policy that chooses its own victim is skipped with a note, like the
/// sweep's other non-combinations; before, the sweep stopped there with the engine's error.
#[test]
fn a_victim_rule_is_skipped_where_the_deadlock_policy_chooses_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, stderr) = shoal(
        dir.path(),
        "bench tpcb --scale 1 --threads 1 --warmup 0 --duration 0.2 --no-progress --cc 2pl \
         --deadlock dreadlocks-spin,wait-die --victim kill-short",
    );
    let all = format!("{stdout}{stderr}");
    assert!(all.contains("deadlock=wait-die victim=kill-short"), "{all}");
    assert!(
        all.contains("the other --deadlock policies choose their own"),
        "{all}"
    );
    assert!(stdout.contains("dreadlocks-spin"), "{stdout}");
}

/// `--json` and `--csv` naming one file would overwrite each other after every run.
#[test]
fn json_and_csv_into_one_file_are_refused() {
    let stderr = bench_fails("--json out.json --csv out.json");
    assert!(stderr.contains("same file"), "{stderr}");
}

/// Values that would overflow a duration or allocate without bound are usage errors.
#[test]
fn out_of_range_windows_and_admission_are_usage_errors() {
    for args in [
        "exp E1 --quick --duration 1e20",
        "exp E1 --quick --warmup 1e300",
        "exp E1 --quick --duration 0",
        "bench --admission 100000000000",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(args.split_whitespace())
            .output()
            .expect("run shoal");
        assert_eq!(out.status.code(), Some(2), "shoal {args}");
    }
}

/// `shoal recover` reopens a database a logged TPC-B run left behind, replays its log and
/// finds the balances consistent.
#[test]
fn recover_replays_a_logged_tpcb_run() {
    let dir = tempfile::tempdir().unwrap();
    shoal(
        dir.path(),
        "bench tpcb --cc 2pl --log async --scale 1 --threads 2 --warmup 0 --duration 1 --db db",
    );
    let (stdout, _) = shoal(dir.path(), "recover db --tables");
    assert!(stdout.contains("log replayed:"), "{stdout}");
    assert!(stdout.contains("TPC-B check:"), "{stdout}");
    // Every committed transfer left one history row, and replay brought them all back.
    let history = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("table history: "))
        .and_then(|l| l.strip_suffix(" rows"))
        .and_then(|n| n.parse::<u64>().ok())
        .expect("a history row count");
    assert!(history > 0, "{stdout}");
}
