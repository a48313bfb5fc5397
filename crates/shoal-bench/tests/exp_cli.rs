//! Runs the built `shoal` binary: `shoal exp` on a cheap experiment, and `shoal bench` with
//! per-interval reporting.

mod common;

use common::{records, shoal};

#[test]
fn exp_list_prints_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, _) = shoal(dir.path(), "exp list");
    for id in ["E1", "E2", "E3", "E4", "E5", "E6", "E7", "E8"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(id)),
            "{id} missing:\n{stdout}"
        );
    }
    assert!(stdout.contains("shoal bench tellers"), "{stdout}");
}

#[test]
fn exp_quick_writes_csv_json_and_a_plot_line_per_series() {
    let dir = tempfile::tempdir().unwrap();
    shoal(
        dir.path(),
        "exp E4 --quick --out res --duration 0.1 --warmup 0 --no-progress",
    );
    let res = dir.path().join("res");
    let recs = records(&res.join("E4.json"));
    assert_eq!(recs.len(), 6 * 3, "{recs:#?}");
    let mut series: Vec<&str> = Vec::new();
    for r in &recs {
        assert_eq!(r["workload"], "tellers");
        assert_eq!(r["experiment"], "E4");
        assert_eq!(r["consistent"], true, "{r:#}");
        assert!(r["aborted"].is_u64() && r["throughput"].is_number());
        let s = r["series"].as_str().unwrap();
        if !series.contains(&s) {
            series.push(s);
        }
    }
    assert_eq!(series.len(), 6, "{series:?}");
    assert!(series.contains(&"deadlock=wound-wait"), "{series:?}");

    let csv = std::fs::read_to_string(res.join("E4.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    for col in [
        "series",
        "deadlock",
        "threads",
        "throughput",
        "aborted",
        "aborted_deadlock",
    ] {
        assert!(header.contains(&col), "{col} missing: {header:?}");
    }
    assert_eq!(lines.count(), 18, "{csv}");

    let svg = std::fs::read_to_string(res.join("E4.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.trim_end().ends_with("</svg>"));
    // Two panels (throughput, aborts), one 2-pixel line per series in each.
    let lines = svg
        .lines()
        .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"2\""))
        .count();
    assert_eq!(lines, 2 * series.len(), "{svg}");
    for s in &series {
        assert!(svg.contains(s), "legend lacks {s}");
    }
}

#[test]
fn report_interval_prints_lines_and_csv_writes_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, _) = shoal(dir.path(), "bench tellers --cc 2pl --threads 1,2 --warmup 0 --duration 1 --report-interval 0.2 --csv iv.csv --json out.json --no-progress");
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("t="))
        .collect();
    assert!(lines.len() >= 2 * 3, "{stdout}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("tps=") && l.contains("p99=") && l.contains("aborts=")),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(dir.path().join("iv.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert!(
        rows[0].starts_with("run,workload,records,cc,log,threads,seed,t_s,commits"),
        "{csv}"
    );
    assert_eq!(rows.len() - 1, lines.len(), "{csv}\n{stdout}");
    assert!(
        rows[1..].iter().any(|r| r.starts_with("1,tellers,")),
        "{csv}"
    );
    for r in records(&dir.path().join("out.json")) {
        let iv = r["intervals"].as_array().expect("intervals in the record");
        assert!(iv.len() >= 3, "{r:#}");
        let sum: u64 = iv.iter().map(|i| i["commits"].as_u64().unwrap()).sum();
        let last = iv.last().unwrap()["total_commits"].as_u64().unwrap();
        assert_eq!(sum, last);
    }
}
