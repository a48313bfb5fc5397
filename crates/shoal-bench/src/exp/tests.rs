use std::collections::BTreeMap;

use super::output::*;
use super::*;
use crate::sweep::Value;

#[test]
fn options_only_some_runs_carry_are_not_series_keys() {
    let g = Group::new("t", "alpha");
    let run = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let mine = vec![
        run(&[("cc", "occ"), ("alpha", "1"), ("seed", "1")]),
        run(&[
            ("cc", "doppel"),
            ("alpha", "1"),
            ("phase_ms", "20"),
            ("seed", "2"),
        ]),
        run(&[
            ("cc", "doppel"),
            ("alpha", "2"),
            ("phase_ms", "20"),
            ("seed", "1"),
        ]),
    ];
    assert_eq!(varying_keys(&g, &mine), ["cc"]);
    let mut swept = mine.clone();
    swept[2].insert("phase_ms".into(), "5".into());
    assert_eq!(varying_keys(&g, &swept), ["cc", "phase_ms"]);
}
use crate::harness;
use crate::interval::Sample;
use crate::sweep::json_name;

/// The record of a fake run of the `shoal bench` command line `args` (its first planned
/// run), with `tps` commits per second over one second and the given samples.
fn record(args: &str, tps: u64, intervals: Vec<Sample>) -> Record {
    let b = parse_bench(&super::registry::args(args)).unwrap();
    let cfg = harness::plan(&b.sweep()).unwrap().runs.remove(0).0;
    let stats = crate::driver::RunStats {
        total_by_type: Vec::new(),
        committed: tps,
        total_committed: tps,
        aborts: [1, 0, 0],
        measured: std::time::Duration::from_secs(1),
        latency_ns: hdrhistogram::Histogram::new_with_bounds(1, 1 << 40, 3).unwrap(),
        per_thread: vec![tps],
        rolled_back: 0,
        per_type: Vec::new(),
        rss_start_kb: None,
        rss_end_kb: None,
        peak_rss_kb: None,
        lock_footprint: None,
        intervals,
        stashed: 0,
        doppel: None,
        worker_cpu: None,
    };
    let res = harness::RunResult {
        cfg,
        stats,
        check: Ok("fine".into()),
        db_run: 0,
        load_s: 0.0,
    };
    Record::new(&b.params(), &res)
}

/// A sample `t_s` seconds into the window: 10 commits at `tps`, `total_commits` so far.
fn sample(t_s: f64, total_commits: u64, tps: f64) -> Sample {
    Sample {
        t_s,
        commits: 10,
        total_commits,
        tps,
        aborts: 0,
        p99_us: 1.0,
        gauges: Default::default(),
    }
}

/// An unlabelled finished run in group 0 for each command line of `args`, 20 commits per
/// second, with the samples `intervals`.
fn runs(args: impl IntoIterator<Item = String>, intervals: &[Sample]) -> Vec<Done> {
    args.into_iter()
        .map(|a| Done {
            group: 0,
            label: String::new(),
            rec: record(&a, 20, intervals.to_vec()),
        })
        .collect()
}

#[test]
fn series_name_the_sweep_and_the_options_varying_in_it() {
    let groups = vec![Group::new("g", "threads")
        .metrics(&[Metric::ThroughputPerThread])
        .log_y()
        .sweep("insert", "insert")
        .sweep("payment", "tpcc --mix payment")];
    let done: Vec<Done> = [
        ("insert", "insert --threads 1", 100),
        ("insert", "insert --threads 4", 200),
        ("payment", "tpcc --mix payment --cc 2pl --threads 1", 50),
        ("payment", "tpcc --mix payment --cc occ --threads 4", 80),
    ]
    .into_iter()
    .map(|(label, a, tps)| Done {
        group: 0,
        label: label.into(),
        rec: record(a, tps, Vec::new()),
    })
    .collect();
    let labels = series_labels(&groups, &done);
    assert_eq!(
        labels,
        ["insert", "insert", "payment cc=2pl", "payment cc=occ"]
    );
    let e = find("E8").unwrap();
    let csv = render_csv(e, &groups, &done);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "{csv}");
    assert!(lines[0].starts_with("experiment,group,series,workload,"));
    assert!(lines[2].starts_with("E8,g,insert,insert,"), "{csv}");
    assert!(lines[2].contains(",200,50.0,200,1,1,"), "{csv}");
    let p = panels(e, &groups, &done);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].series.len(), 3);
    assert_eq!(p[0].series[0].points.len(), 2);
    assert_eq!(
        p[0].series[0].points[1],
        (crate::plot::XValue::Num(4.0), 50.0)
    );
    assert!(render_intervals_csv(e, &groups, &done).is_none());
}

#[test]
fn time_panels_plot_the_samples() {
    let groups = vec![Group::new("t", TIME)
        .metrics(&[Metric::Completed, Metric::IntervalTps])
        .sweep(
            "",
            "tpcb --deadlock dreadlocks-backoff --victim kill-short,kill-long --csv x.csv",
        )];
    let done = runs(
        ["kill-short", "kill-long"]
            .map(|v| format!("tpcb --deadlock dreadlocks-backoff --victim {v}")),
        &[sample(1.0, 10, 10.0), sample(2.0, 20, 10.0)],
    );
    let e = find("E5").unwrap();
    let p = panels(e, &groups, &done);
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].series[0].name, "victim=kill-short");
    // Completed starts at the origin.
    assert_eq!(p[0].series[0].points.len(), 3);
    assert_eq!(p[1].series[1].points[1].1, 10.0);
    let iv = render_intervals_csv(e, &groups, &done).unwrap();
    assert_eq!(iv.lines().count(), 5, "{iv}");
    assert!(crate::plot::render(&p).unwrap().contains("<svg"));
}

#[test]
fn time_panels_mark_the_hot_key_moves() {
    let groups = (find("E10").unwrap().groups)(true);
    assert_eq!(groups[0].x, TIME);
    let b = parse_bench(&groups[0].runs[0].args).unwrap();
    assert_eq!(b.doppel.hot_move_every, Some(vec!["1.5s".to_string()]));
    assert!(b.params().sampling.is_some_and(|s| s.print));
    let done = runs(
        ["0", "1"].map(|warmup| {
            format!(
                "incr1 --cc occ --hot-fraction 0.1 --hot-move-every 1500ms --duration 6 \
                 --warmup {warmup}"
            )
        }),
        &[sample(0.1, 10, 100.0), sample(0.2, 10, 100.0)],
    );
    assert_eq!(done[0].rec.options["hot_move_every"], Value::from("1500ms"));
    assert_eq!(workload_changes(&done[0].rec), [1.5, 3.0, 4.5]);
    assert_eq!(workload_changes(&done[1].rec), [0.5, 2.0, 3.5, 5.0]);
    let p = panels(find("E10").unwrap(), &groups[..1], &done[..1]);
    assert_eq!(p[0].x_marks, [1.5, 3.0, 4.5]);
    assert!(crate::plot::render(&p).unwrap().contains("<svg"));
}

#[test]
fn registry_entries_parse_into_valid_bench_configurations() {
    let mut ids = Vec::new();
    for e in REGISTRY {
        assert!(!ids.contains(&e.id), "duplicate {}", e.id);
        ids.push(e.id);
        for quick in [true, false] {
            let groups = (e.groups)(quick);
            assert!(!groups.is_empty(), "{}", e.id);
            for g in &groups {
                assert!(!g.metrics.is_empty() && !g.runs.is_empty(), "{}", e.id);
                for r in &g.runs {
                    let b = parse_bench(&r.args).unwrap_or_else(|err| panic!("{err}"));
                    crate::check_options(&b)
                        .unwrap_or_else(|err| panic!("{} {:?}: {err}", e.id, r.args));
                    let sweep = b.sweep();
                    let plan = harness::plan(&sweep).unwrap();
                    assert!(!plan.runs.is_empty(), "{} {:?}", e.id, r.args);
                    if g.x == TIME {
                        assert!(b.params().sampling.is_some(), "{} samples", e.id);
                    } else {
                        assert!(
                            sweep.axes.iter().any(|a| json_name(a.name) == g.x),
                            "{}: no axis {} in {:?}",
                            e.id,
                            g.x,
                            r.args
                        );
                    }
                    if quick {
                        assert!(b.duration <= 10.0, "{} quick run too long", e.id);
                    }
                }
            }
        }
    }
    assert_eq!(
        ids,
        ["E1", "E2", "E3", "E4", "E5", "E6", "E7", "E8", "E9", "E10", "E11", "E12", "E13", "E14"]
    );
    assert!(find("e3").is_some() && find("E99").is_none());
}

#[test]
fn admission_override_runs_every_sweep_once_per_value_and_refuses_a_second_one() {
    use shoal::Admission;
    let admissions = |adm: Option<&str>| -> Vec<Admission> {
        let mut seen = Vec::new();
        for id in ["E3", "E4", "E7"] {
            for g in (find(id).unwrap().groups)(true) {
                for r in &g.runs {
                    let b = parse_bench(&bench_args(r, adm).unwrap()).unwrap();
                    for (cfg, _) in harness::plan(&b.sweep()).unwrap().runs {
                        if !seen.contains(&cfg.options.admission) {
                            seen.push(cfg.options.admission);
                        }
                    }
                }
            }
        }
        seen
    };
    assert_eq!(admissions(None), [Admission::Auto], "the engine's default");
    assert_eq!(admissions(Some("off")), [Admission::Off]);
    let mut both = admissions(Some("off,auto"));
    both.sort_by_key(|a| format!("{a:?}"));
    assert_eq!(both, [Admission::Auto, Admission::Off]);
    assert_eq!(admissions(Some("4")), [Admission::Limit(4)]);
    // A bad value fails when the command line is parsed, before anything runs.
    let r = &(find("E4").unwrap().groups)(true)[0].runs[0];
    assert!(parse_bench(&bench_args(r, Some("lots")).unwrap()).is_err());
    let own = Run {
        label: String::new(),
        args: super::registry::args("tpcb --admission 2"),
    };
    assert!(bench_args(&own, Some("off")).is_err());
    assert_eq!(bench_args(&own, None).unwrap(), own.args);
}
