//! Running the built `shoal` binary from the integration tests.

#![allow(dead_code)] // each test file uses some of these

use std::path::Path;
use std::process::Command;

/// Runs `shoal` in `dir` with the whitespace-separated arguments `args` and the environment
/// `env`; asserts it succeeded and returns its stdout and stderr.
pub fn shoal_env(dir: &Path, env: &[(&str, &str)], args: &str) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .current_dir(dir)
        .envs(env.iter().copied())
        .args(args.split_whitespace())
        .output()
        .expect("run shoal");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "shoal {args} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}

/// [`shoal_env`] without extra environment.
pub fn shoal(dir: &Path, args: &str) -> (String, String) {
    shoal_env(dir, &[], args)
}

/// The JSON array of records in `path`.
pub fn records(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_array().expect("a JSON array").clone()
}

/// `shoal bench ARGS` without warm-up, writing `out.json` in `dir`: its stdout and records.
pub fn bench(dir: &Path, args: &str) -> (String, Vec<serde_json::Value>) {
    let all = format!("bench {args} --warmup 0 --json out.json --no-progress");
    let (stdout, _) = shoal(dir, &all);
    (stdout, records(&dir.join("out.json")))
}

/// The transaction types of a record's `per_type` list, in order.
pub fn types(r: &serde_json::Value) -> Vec<&str> {
    let per_type = r["per_type"].as_array().expect("per_type in the record");
    per_type
        .iter()
        .map(|t| t["type"].as_str().unwrap())
        .collect()
}
