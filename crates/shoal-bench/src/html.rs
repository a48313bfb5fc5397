//! `shoal report DIR`: one static HTML page (`DIR/index.html`) with every plot the
//! experiments wrote to DIR, each experiment's runs and configuration, and the machine.
//!
//! The page is self-contained and works offline: SVG plots are inlined, there are no external
//! scripts, styles or fonts. A small inline script marks the body with the number of plots and
//! of images that failed to render (`data-plots`, `data-broken`), which
//! `scripts/check-report.sh` reads back from headless Chromium.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// What the report says about the machine it was built on.
fn machine() -> Vec<(&'static str, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mem = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or_else(
            || "unknown".to_string(),
            |kb| format!("{:.1} GiB", kb as f64 / 1048576.0),
        );
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or_else(|| "unknown".to_string(), |s| s.trim().to_string());
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    vec![
        (
            "cores",
            std::thread::available_parallelism()
                .map_or(0, |n| n.get())
                .to_string(),
        ),
        ("cpu", cpu),
        ("memory", mem),
        (
            "kernel",
            if kernel.is_empty() {
                "unknown".into()
            } else {
                kernel
            },
        ),
        ("shoal", env!("CARGO_PKG_VERSION").to_string()),
    ]
}

/// An experiment's files: its plot and its records, if present.
type Files = (Option<PathBuf>, Option<PathBuf>);

/// Sorts names with their digit runs compared as numbers (`E2` before `E10`).
fn natural_key(name: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut num: Option<u64> = None;
    for c in name.chars() {
        match (c.to_digit(10), num) {
            (Some(d), n) => {
                num = Some(
                    n.unwrap_or(0)
                        .saturating_mul(10)
                        .saturating_add(u64::from(d)),
                )
            }
            (None, Some(n)) => {
                out.push((std::mem::take(&mut text), n));
                num = None;
                text.push(c);
            }
            (None, None) => text.push(c),
        }
    }
    out.push((text, num.unwrap_or(0)));
    out
}

/// The experiments found in `dir`: name (file stem) → (svg path, json path), in natural order.
fn experiments(dir: &Path) -> anyhow::Result<Vec<(String, Files)>> {
    let mut out: BTreeMap<String, Files> = BTreeMap::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        let (Some(stem), Some(ext)) = (
            p.file_stem().and_then(|s| s.to_str()),
            p.extension().and_then(|s| s.to_str()),
        ) else {
            continue;
        };
        let slot = out.entry(stem.to_string()).or_default();
        match ext {
            "svg" => slot.0 = Some(p.clone()),
            "json" => slot.1 = Some(p.clone()),
            _ => {}
        }
    }
    out.retain(|_, (svg, json)| svg.is_some() || json.is_some());
    let mut out: Vec<(String, Files)> = out.into_iter().collect();
    out.sort_by_cached_key(|(name, _)| natural_key(name));
    Ok(out)
}

/// The distinct `engine` names of `records`, in first-seen order.
fn engines(records: &[Value]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for e in records.iter().filter_map(|r| r.get("engine")?.as_str()) {
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// The columns of a runs table: the keys of the records that are options or results worth
/// showing, in first-seen order; `engine` first when the records come from more than one
/// engine (a portable run: without it, the rows of shoal and its peers looked alike).
fn columns(records: &[Value]) -> Vec<String> {
    const SKIP: [&str; 5] = [
        "engine_options",
        "engine",
        "engine_version",
        "per_type",
        "check",
    ];
    let mut cols: Vec<String> = Vec::new();
    if engines(records).len() > 1 {
        cols.push("engine".to_string());
    }
    for r in records {
        if let Some(o) = r.as_object() {
            for (k, v) in o {
                if !SKIP.contains(&k.as_str())
                    && !v.is_object()
                    && !v.is_array()
                    && !cols.contains(k)
                {
                    cols.push(k.clone());
                }
            }
        }
    }
    cols
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => esc(s),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|f| f.fract() != 0.0)
            .map_or_else(|| n.to_string(), |f| format!("{f:.3}")),
        Some(v) => esc(&v.to_string()),
    }
}

/// Builds `dir/index.html`; returns its path.
pub fn build(dir: &Path) -> anyhow::Result<PathBuf> {
    let exps = experiments(dir)?;
    let mut body = String::new();
    let mut plots = 0;
    for (name, (svg, json)) in &exps {
        let _ = writeln!(body, "<section id=\"{0}\"><h2>{0}</h2>", esc(name));
        if let Some(svg) = svg {
            let text = std::fs::read_to_string(svg)
                .with_context(|| format!("reading {}", svg.display()))?;
            let start = text
                .find("<svg")
                .with_context(|| format!("{} has no <svg>", svg.display()))?;
            body.push_str("<figure class=\"plot\">");
            body.push_str(&text[start..]);
            body.push_str("</figure>\n");
            plots += 1;
        }
        if let Some(json) = json {
            let text = std::fs::read_to_string(json)
                .with_context(|| format!("reading {}", json.display()))?;
            let v: Value = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", json.display()))?;
            let records: Vec<Value> = match v {
                Value::Array(a) => a,
                Value::Object(o) => o
                    .get("records")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_else(|| vec![Value::Object(o)]),
                other => vec![other],
            };
            let cols = columns(&records);
            let _ = writeln!(
                body,
                "<details><summary>{} runs</summary><table><tr>{}</tr>",
                records.len(),
                cols.iter()
                    .map(|c| format!("<th>{}</th>", esc(c)))
                    .collect::<String>()
            );
            for r in &records {
                let _ = writeln!(
                    body,
                    "<tr>{}</tr>",
                    cols.iter()
                        .map(|c| format!("<td>{}</td>", cell(r.get(c))))
                        .collect::<String>()
                );
            }
            body.push_str("</table>");
            // The options each engine ran with (its first run's): one line per engine, so
            // that a peer's row is not read as running with shoal's options.
            let names = engines(&records);
            for name in if names.is_empty() { vec![""] } else { names } {
                let first = records.iter().find(|r| {
                    name.is_empty() || r.get("engine").and_then(Value::as_str) == Some(name)
                });
                if let Some(o) = first.and_then(|r| r.get("engine_options")) {
                    let who = if name.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", esc(name))
                    };
                    let _ = write!(
                        body,
                        "<p class=\"cfg\">engine options of the first{who} run: <code>{}</code></p>",
                        cell(Some(o))
                    );
                }
            }
            body.push_str("</details>\n");
        }
        body.push_str("</section>\n");
    }
    let machine: String = machine()
        .iter()
        .map(|(k, v)| format!("<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v)))
        .collect();
    let toc: String = exps
        .iter()
        .map(|(n, _)| n)
        .map(|n| format!("<li><a href=\"#{0}\">{0}</a></li>", esc(n)))
        .collect();
    let page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<title>shoal results</title><style>\
body{{font-family:sans-serif;margin:2em;max-width:1100px}}\
table{{border-collapse:collapse;font-size:12px}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}\
figure.plot svg{{max-width:100%;height:auto;border:1px solid #eee}}p.cfg code{{font-size:11px}}\
</style></head>\n<body data-plots=\"pending\" data-broken=\"pending\">\n\
<h1>shoal results</h1>\n<p>Built by <code>shoal report {dir}</code>: {n} experiment(s), {plots} plot(s).</p>\n\
<h2>Machine</h2><table>{machine}</table>\n<ul>{toc}</ul>\n{body}\
<script>window.addEventListener('load',function(){{\
var b=0;document.querySelectorAll('img').forEach(function(i){{if(!i.complete||i.naturalWidth===0)b++;}});\
document.querySelectorAll('svg').forEach(function(s){{var r=s.getBoundingClientRect();if(r.width<10||r.height<10)b++;}});\
document.body.setAttribute('data-plots',String(document.querySelectorAll('figure.plot svg').length));\
document.body.setAttribute('data-broken',String(b));}});</script>\n</body></html>\n",
        dir = esc(&dir.display().to_string()),
        n = exps.len(),
    );
    let out = dir.join("index.html");
    std::fs::write(&out, page).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn experiments_come_in_natural_order() {
        let mut names = vec!["E10", "E2", "E1", "E14-intervals", "E9", "results-e7"];
        names.sort_by_cached_key(|n| natural_key(n));
        assert_eq!(
            names,
            ["E1", "E2", "E9", "E10", "E14-intervals", "results-e7"]
        );
    }

    #[test]
    fn page_inlines_every_plot_and_lists_runs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("E6.svg"),
            "<?xml version=\"1.0\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100\" height=\"50\"><text x=\"1\" y=\"20\">a&lt;b</text></svg>",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("E6.json"),
            r#"[{"cc":"2pl","threads":64,"throughput":1234.5,"engine_options":"Options { .. }"}]"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("E6.csv"), "x\n").unwrap();
        std::fs::write(dir.path().join("E7.json"), r#"[{"cc":"occ"}]"#).unwrap();
        let page = std::fs::read_to_string(build(dir.path()).unwrap()).unwrap();
        assert_eq!(page.matches("<figure class=\"plot\"><svg").count(), 1);
        assert!(!page.contains("<?xml"));
        assert!(page.contains("<td>1234.500</td>") && page.contains("<th>throughput</th>"));
        assert!(page.contains("href=\"#E7\""));
        assert!(page.contains("<th>cores</th>"));
        // Offline: nothing loaded from elsewhere.
        assert!(!page.contains("<script src") && !page.contains("<link") && !page.contains("<img"));
    }
}
