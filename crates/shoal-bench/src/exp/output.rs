//! What `shoal exp` writes: the JSON records, the CSV files and the SVG panels.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{Done, Experiment, Group, Metric, TIME};
use crate::interval::csv_field;
use crate::report::Record;
use crate::sweep::Value;

/// The option values of a record as text, by JSON name.
pub(super) fn opts(r: &Record) -> BTreeMap<String, String> {
    r.options
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect()
}

/// The series label of every run: its sweep's label plus the options that vary among the
/// runs of its sweep (other than x and the seed).
pub(super) fn series_labels(groups: &[Group], done: &[Done]) -> Vec<String> {
    let mut varying: BTreeMap<(usize, String), Vec<String>> = BTreeMap::new();
    for (gi, g) in groups.iter().enumerate() {
        for r in &g.runs {
            let mine: Vec<BTreeMap<String, String>> = done
                .iter()
                .filter(|d| d.group == gi && d.label == r.label)
                .map(|d| opts(&d.rec))
                .collect();
            varying.insert((gi, r.label.clone()), varying_keys(g, &mine));
        }
    }
    done.iter()
        .map(|d| {
            let o = opts(&d.rec);
            let mut parts: Vec<String> = Vec::new();
            if !d.label.is_empty() {
                parts.push(d.label.clone());
            }
            let keys = varying.get(&(d.group, d.label.clone()));
            for k in keys.into_iter().flatten() {
                parts.push(format!("{k}={}", o.get(k).map_or("-", String::as_str)));
            }
            if parts.is_empty() {
                d.rec.workload.clone()
            } else {
                parts.join(" ")
            }
        })
        .collect()
}

/// The options whose values differ among `mine`, other than the group's x and the seed.
pub(super) fn varying_keys(g: &Group, mine: &[BTreeMap<String, String>]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for o in mine {
        for k in o.keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    keys.into_iter()
        .filter(|k| k != g.x && k != "seed")
        .filter(|k| {
            // Varies when it takes two values among the runs that have it: an option only
            // some runs carry with one value (Doppel's `phase_ms` beside 2PL and OCC) is
            // implied by the options that do vary.
            let mut present = mine.iter().filter_map(|o| o.get(k));
            let first = present.next();
            present.any(|v| Some(v) != first)
        })
        .collect()
}

pub(super) fn threads(r: &Record) -> f64 {
    match r.options.get("threads") {
        Some(Value::Int(t)) => *t as f64,
        _ => 1.0,
    }
}

/// The value of `m` for a whole run; `None` for the latency of a transaction type that
/// committed nothing in the window (a run of writes only has no read latency).
pub(super) fn metric(m: Metric, r: &Record) -> Option<f64> {
    let of_type = |name: &str, p99: bool| {
        r.per_type
            .iter()
            .find(|t| t.name == name && t.committed > 0)
            .map(|t| {
                if p99 {
                    t.latency_us.p99
                } else {
                    t.latency_us.mean
                }
            })
    };
    Some(match m {
        Metric::Throughput => r.throughput,
        Metric::ThroughputPerThread => r.throughput / threads(r).max(1.0),
        Metric::Aborts => r.window.aborts.aborted as f64,
        Metric::Completed => r.window.committed as f64,
        Metric::IntervalTps => r.throughput,
        Metric::ReadMean => return of_type("read", false),
        Metric::ReadP99 => return of_type("read", true),
        Metric::WriteMean => return of_type("write", false),
        Metric::WriteP99 => return of_type("write", true),
    })
}

pub(super) fn write_json(
    e: &Experiment,
    groups: &[Group],
    done: &[Done],
    dir: &Path,
) -> anyhow::Result<()> {
    let labels = series_labels(groups, done);
    let mut out = Vec::with_capacity(done.len());
    for (d, s) in done.iter().zip(&labels) {
        let mut v = serde_json::to_value(&d.rec)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("experiment".into(), e.id.into());
            o.insert("group".into(), groups[d.group].title.clone().into());
            o.insert("series".into(), s.clone().into());
        }
        out.push(v);
    }
    let path = dir.join(format!("{}.json", e.id));
    let mut text = serde_json::to_string_pretty(&out)?;
    text.push('\n');
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// One row per run: experiment, group, series, every option, then the results.
pub(super) fn render_csv(e: &Experiment, groups: &[Group], done: &[Done]) -> String {
    let labels = series_labels(groups, done);
    let mut keys: Vec<String> = Vec::new();
    for d in done {
        for k in d.rec.options.keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let mut out = String::from("experiment,group,series,workload");
    for k in &keys {
        out.push(',');
        out.push_str(&csv_field(k));
    }
    // Runs of several transaction types: each type's mean and p99 latency too.
    let mut types: Vec<&str> = Vec::new();
    for t in done
        .iter()
        .filter(|d| d.rec.per_type.len() > 1)
        .flat_map(|d| &d.rec.per_type)
    {
        if !types.contains(&t.name.as_str()) {
            types.push(&t.name);
        }
    }
    out.push_str(
        ",throughput,throughput_per_thread,committed,aborted,aborted_deadlock,\
         aborted_lock_timeout,aborted_conflict,rolled_back,p50_us,p99_us,measured_s,consistent",
    );
    for t in &types {
        let _ = write!(out, ",{0}_mean_us,{0}_p99_us", csv_field(t));
    }
    out.push('\n');
    for (d, s) in done.iter().zip(&labels) {
        let r = &d.rec;
        let o = opts(r);
        let _ = write!(out, "{},{}", lead(e, groups, d, s), r.workload);
        for k in &keys {
            out.push(',');
            out.push_str(&csv_field(o.get(k).map_or("", String::as_str)));
        }
        let _ = writeln!(
            out,
            ",{},{:.1},{},{},{},{},{},{},{},{},{},{}",
            r.throughput,
            r.throughput / threads(r).max(1.0),
            r.window.committed,
            r.window.aborts.aborted,
            r.window.aborts.aborted_deadlock,
            r.window.aborts.aborted_lock_timeout,
            r.window.aborts.aborted_conflict,
            r.rolled_back,
            r.latency_us.p50,
            r.latency_us.p99,
            r.window.measured_s,
            r.consistent
        );
        if !types.is_empty() {
            out.pop();
            for t in &types {
                match r.per_type.iter().find(|p| p.name == *t && p.committed > 0) {
                    Some(p) => {
                        let _ = write!(out, ",{},{}", p.latency_us.mean, p.latency_us.p99);
                    }
                    None => out.push_str(",,"),
                }
            }
            out.push('\n');
        }
    }
    out
}

/// The first cells of a run's CSV rows: experiment, group and series (`label`).
fn lead(e: &Experiment, groups: &[Group], d: &Done, label: &str) -> String {
    let group = csv_field(&groups[d.group].title);
    format!("{},{group},{}", e.id, csv_field(label))
}

/// Per-interval rows of the runs that sampled: experiment, group, series, then the sample.
pub(super) fn render_intervals_csv(
    e: &Experiment,
    groups: &[Group],
    done: &[Done],
) -> Option<String> {
    if done.iter().all(|d| d.rec.intervals.is_empty()) {
        return None;
    }
    let labels = series_labels(groups, done);
    let mut out =
        String::from("experiment,group,series,t_s,commits,total_commits,tps,aborts,p99_us\n");
    for (d, s) in done.iter().zip(&labels) {
        for i in &d.rec.intervals {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{}",
                lead(e, groups, d, s),
                i.t_s,
                i.commits,
                i.total_commits,
                i.tps,
                i.aborts,
                i.p99_us
            );
        }
    }
    Some(out)
}

/// Writes the JSON, CSV (and intervals CSV) and SVG files; returns their paths.
pub(super) fn write_outputs(
    e: &Experiment,
    groups: &[Group],
    done: &[Done],
    dir: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    write_json(e, groups, done, dir)?;
    let mut files = vec![dir.join(format!("{}.json", e.id))];
    let csv = dir.join(format!("{}.csv", e.id));
    std::fs::write(&csv, render_csv(e, groups, done))
        .with_context(|| format!("writing {}", csv.display()))?;
    files.push(csv);
    if let Some(text) = render_intervals_csv(e, groups, done) {
        let p = dir.join(format!("{}-intervals.csv", e.id));
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        files.push(p);
    }
    let svg = dir.join(format!("{}.svg", e.id));
    let panels = panels(e, groups, done);
    std::fs::write(&svg, crate::plot::render(&panels)?)
        .with_context(|| format!("writing {}", svg.display()))?;
    files.push(svg);
    Ok(files)
}

/// When the workload of a run changed during its measurement window, in seconds since the
/// window started: INCR1's hot key moves every `hot_move_every` since the run started
/// (warm-up included).
pub(super) fn workload_changes(r: &Record) -> Vec<f64> {
    let Some(Value::Text(t)) = r.options.get("hot_move_every") else {
        return Vec::new();
    };
    let Ok(every) = crate::config::engine::parse_duration(t) else {
        return Vec::new();
    };
    let every = every.as_secs_f64();
    if every <= 0.0 {
        return Vec::new();
    }
    let w = &r.window;
    let end = w.warmup_s + w.measured_s.max(w.duration_s);
    (1..)
        .map(|k| k as f64 * every)
        .take_while(|&x| x < end)
        .filter(|&x| x > w.warmup_s)
        .map(|x| ((x - w.warmup_s) * 1e6).round() / 1e6)
        .collect()
}

/// The plot panels of an experiment's runs.
pub(super) fn panels(e: &Experiment, groups: &[Group], done: &[Done]) -> Vec<crate::plot::Panel> {
    use crate::plot::{Panel, Series, XValue};
    let labels = series_labels(groups, done);
    let mut out = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        for &m in &g.metrics {
            let mut series: Vec<Series> = Vec::new();
            for (d, label) in done.iter().zip(&labels).filter(|(d, _)| d.group == gi) {
                let pts: Vec<(XValue, f64)> = if g.x == TIME || m.over_time() {
                    // Commits completed start from 0 at time 0.
                    let origin = (m == Metric::Completed && !d.rec.intervals.is_empty())
                        .then_some((XValue::Num(0.0), 0.0));
                    origin
                        .into_iter()
                        .chain(d.rec.intervals.iter().map(|i| {
                            let y = match m {
                                Metric::IntervalTps => i.tps,
                                _ => i.total_commits as f64,
                            };
                            (XValue::Num(i.t_s), y)
                        }))
                        .collect()
                } else {
                    let x = match d.rec.options.get(g.x) {
                        Some(Value::Int(v)) => XValue::Num(*v as f64),
                        Some(Value::Float(v)) => XValue::Num(*v),
                        Some(v) => XValue::Text(v.to_string()),
                        None => continue,
                    };
                    metric(m, &d.rec).map(|y| (x, y)).into_iter().collect()
                };
                match series.iter_mut().find(|s| &s.name == label) {
                    Some(s) => s.points.extend(pts),
                    None => series.push(Series {
                        name: label.clone(),
                        points: pts,
                    }),
                }
            }
            let x_marks = if g.x == TIME {
                done.iter()
                    .filter(|d| d.group == gi)
                    .flat_map(|d| workload_changes(&d.rec))
                    .fold(Vec::new(), |mut v, x| {
                        if !v.contains(&x) {
                            v.push(x);
                        }
                        v
                    })
            } else {
                Vec::new()
            };
            out.push(Panel {
                title: format!("{} ({}): {}", e.id, e.paper, g.title),
                x_label: if g.x == TIME {
                    "seconds since the measurement started".into()
                } else {
                    g.x.replace('_', "-")
                },
                y_label: m.label().into(),
                log_y: g.log_y,
                series,
                x_marks,
            });
        }
    }
    out
}
