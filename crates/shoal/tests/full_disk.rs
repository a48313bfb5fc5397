//! Full disks on real file systems (small tmpfs mounts). Needs root (mount), so every test is
//! `#[ignore]`d: `cargo test -p shoal --test full_disk -- --ignored` as root; without root
//! each prints a note and passes.
//!
//! Each commit `i` writes two keys, `a<i>` and `b<i>`, with a value derived from `i`; a commit
//! is acknowledged when `commit()` returned Ok (Sync), its ticket completed Ok (Pipelined), or
//! a later `db.flush()` returned Ok (Async). After reopening: every acknowledged commit is
//! there, and no commit is half there.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use shoal::{ConcurrencyControl, Database, LogMode, Options, Table};

// ---------------------------------------------------------------------------------------
// Mounts

struct Mnt {
    path: PathBuf,
}

impl Mnt {
    /// A tmpfs of `kib` KiB at a fresh mount point, or None (with a note) if mounting fails.
    fn tmpfs(tag: &str, kib: u64) -> Option<Mnt> {
        Mnt::mount(tag, &format!("size={kib}k"))
    }

    /// A tmpfs mounted with `options` (`mount -o`) at a fresh mount point, or None (with a
    /// note) if mounting fails.
    fn mount(tag: &str, options: &str) -> Option<Mnt> {
        let path = PathBuf::from(format!("/mnt/shoal-fd-{tag}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&path);
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(&path)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            eprintln!(
                "NOTE: cannot mount a tmpfs at {} (not root?): skipping",
                path.display()
            );
            let _ = std::fs::remove_dir(&path);
            return None;
        }
        Some(Mnt { path })
    }

    fn resize(&self, kib: u64) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,size={kib}k")])
            .arg(&self.path)
            .status()
            .expect("remount")
            .success();
        assert!(ok, "remount failed");
    }

    /// Fills the file system with a filler file until ENOSPC; returns the filler's path.
    fn fill(&self) -> PathBuf {
        let p = self.path.join(format!(
            "filler-{}",
            FILLER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let mut f = std::fs::File::create(&p).expect("filler");
        let buf = vec![0x5au8; 4096];
        loop {
            match f.write(&buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        // The last bytes, one at a time.
        while let Ok(n) = f.write(&buf[..1]) {
            if n == 0 {
                break;
            }
        }
        let _ = f.sync_all();
        p
    }

    fn unfill(&self) {
        for e in std::fs::read_dir(&self.path).unwrap() {
            let p = e.unwrap().path();
            if p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("filler-")
            {
                std::fs::remove_file(p).unwrap();
            }
        }
    }

    fn db(&self) -> PathBuf {
        self.path.join("db")
    }
}

static FILLER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Drop for Mnt {
    fn drop(&mut self) {
        for _ in 0..50 {
            if Command::new("umount")
                .arg(&self.path)
                .status()
                .is_ok_and(|s| s.success())
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

fn listing(dir: &Path) -> String {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| {
                let e = e.unwrap();
                format!(
                    "{}({})",
                    e.file_name().to_string_lossy(),
                    e.metadata().map(|m| m.len()).unwrap_or(0)
                )
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.join(" ")
}

// ---------------------------------------------------------------------------------------
// Workload

const VAL: usize = 3000;

fn key(p: char, i: u64) -> Vec<u8> {
    format!("{p}{i:08}").into_bytes()
}

fn val(i: u64) -> Vec<u8> {
    let mut v = format!("value-{i}-").into_bytes();
    while v.len() < VAL {
        v.push(b'a' + (i % 26) as u8);
    }
    v
}

#[derive(Default, Debug)]
struct Outcome {
    acked: BTreeSet<u64>,
    attempted: BTreeSet<u64>,
    first_error: Option<String>,
    later_errors: Vec<String>,
}

/// Runs `f` on a thread; fails the test if it does not finish within `limit` (a hang).
fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!("HANG: {what} did not finish within {limit:?}"),
    }
}

/// Commits `a<i>`/`b<i>` from `start` on until the disk is full (or `max` commits), then tries
/// a few more operations, which must fail with errors.
fn commit_until_full(db: &Database, t: &Table, mode: LogMode, start: u64, max: u64) -> Outcome {
    let mut out = Outcome::default();
    let mut pending_async: Vec<u64> = Vec::new();
    let mut tickets: Vec<(u64, shoal::CommitTicket)> = Vec::new();
    for i in start..start + max {
        out.attempted.insert(i);
        let mut tx = db.begin();
        let r = tx
            .put(t, key('a', i), val(i))
            .and_then(|()| tx.put(t, key('b', i), val(i)));
        let r = match r {
            Err(e) => Err(e),
            Ok(()) => match mode {
                LogMode::Pipelined => tx.commit_pipelined().map(|tk| tickets.push((i, tk))),
                _ => tx.commit(),
            },
        };
        match r {
            Ok(()) => match mode {
                LogMode::Sync => {
                    out.acked.insert(i);
                }
                LogMode::Async => {
                    pending_async.push(i);
                    if i % 8 == 7 {
                        match db.flush() {
                            Ok(()) => out.acked.extend(pending_async.drain(..)),
                            Err(e) => {
                                out.first_error = Some(format!("flush: {e}"));
                                break;
                            }
                        }
                    }
                }
                _ => {
                    if tickets.len() >= 8 {
                        for (j, tk) in tickets.drain(..) {
                            if tk.wait().is_ok() {
                                out.acked.insert(j);
                            } else if out.first_error.is_none() {
                                out.first_error = Some("ticket failed".into());
                            }
                        }
                    }
                    if out.first_error.is_some() {
                        break;
                    }
                }
            },
            Err(e) => {
                out.first_error = Some(format!("{e:?}"));
                break;
            }
        }
    }
    for (j, tk) in tickets.drain(..) {
        if tk.wait().is_ok() {
            out.acked.insert(j);
        }
    }
    if mode == LogMode::Async && db.flush().is_ok() {
        out.acked.extend(pending_async.drain(..));
    }
    if out.first_error.is_some() {
        // More attempts: errors, not panics, not hangs.
        for i in 0..3u64 {
            let n = start + max + 1_000_000 + i;
            out.attempted.insert(n);
            let r = db.run(|tx| {
                tx.put(t, key('a', n), val(n))?;
                tx.put(t, key('b', n), val(n))
            });
            match r {
                Ok(()) => {
                    if mode == LogMode::Sync {
                        out.acked.insert(n);
                    }
                }
                Err(e) => out.later_errors.push(format!("{e}")),
            }
        }
    }
    out
}

/// Checks a reopened database against an outcome; returns a list of violations.
fn verify(db: &Database, acked: &BTreeSet<u64>, attempted: &BTreeSet<u64>) -> Vec<String> {
    let mut bad = Vec::new();
    let t = match db.table("t") {
        Ok(t) => t,
        Err(e) => return vec![format!("table t missing: {e}")],
    };
    let rows: BTreeMap<Vec<u8>, Vec<u8>> = db
        .run(|tx| tx.scan(&t, ..))
        .expect("scan")
        .into_iter()
        .collect();
    for &i in acked {
        for p in ['a', 'b'] {
            match rows.get(&key(p, i)) {
                Some(v) if *v == val(i) => {}
                Some(_) => bad.push(format!("acked commit {i}: {p} has a wrong value")),
                None => bad.push(format!("LOST acked commit {i} (key {p}{i})")),
            }
        }
    }
    for &i in attempted {
        let a = rows.contains_key(&key('a', i));
        let b = rows.contains_key(&key('b', i));
        if a != b {
            bad.push(format!("HALF commit {i}: a={a} b={b}"));
        }
    }
    bad
}

fn opts(mode: LogMode, cc: ConcurrencyControl, seg: Option<u64>) -> Options {
    let o = Options::default().with_log(mode).with_cc(cc);
    match seg {
        Some(s) => o.with_log_segment_size(s),
        None => o,
    }
}

// ---------------------------------------------------------------------------------------
// Scenario 1 + 4: commit until full, reopen while full, reopen after growing the FS.

fn scenario_full(
    tag: &str,
    mode: LogMode,
    cc: ConcurrencyControl,
    seg: Option<u64>,
) -> Vec<String> {
    let Some(m) = Mnt::tmpfs(tag, 8 << 10) else {
        return vec![];
    };
    let dir = m.db();
    let o = opts(mode, cc, seg);
    let mut report = Vec::new();
    let out = {
        let (dir, o) = (dir.clone(), o.clone());
        within("commit until full", Duration::from_secs(120), move || {
            let db = Database::open(&dir, o).expect("open");
            let t = db.create_table("t").expect("create");
            let out = commit_until_full(&db, &t, mode, 0, 100_000);
            // A checkpoint on the full disk: an error, never a panic.
            let ck = db.checkpoint();
            (out, format!("{ck:?}"))
        })
    };
    let (out, ck) = out;
    eprintln!(
        "[{tag}] acked {} attempted {} first_error {:?} later {:?} checkpoint-on-full {}",
        out.acked.len(),
        out.attempted.len(),
        out.first_error,
        out.later_errors.first(),
        &ck[..ck.len().min(200)]
    );
    if out.first_error.is_none() {
        report.push(format!("[{tag}] never hit an error"));
    }
    eprintln!("[{tag}] after close: {}", listing(&dir));
    // Reopen on the still-full file system (filled to the last byte).
    m.fill();
    for round in 0..2 {
        let r = {
            let (dir, o) = (dir.clone(), o.clone());
            let (acked, att) = (out.acked.clone(), out.attempted.clone());
            within(
                "reopen while full",
                Duration::from_secs(60),
                move || match Database::open(&dir, o) {
                    Ok(db) => {
                        let bad = verify(&db, &acked, &att);
                        // Try to commit on the full disk, then close.
                        let extra = db.table("t").map(|t| {
                            db.run(|tx| tx.put(&t, b"zz-full", b"x"))
                                .map_err(|e| e.to_string())
                        });
                        Ok((bad, format!("{extra:?}")))
                    }
                    Err(e) => Err(format!("{e}")),
                },
            )
        };
        match r {
            Ok((bad, extra)) => {
                eprintln!(
                    "[{tag}] reopen-while-full #{round}: Ok, extra commit {extra}, violations {}",
                    bad.len()
                );
                for b in bad.iter().take(5) {
                    report.push(format!("[{tag}] reopen-while-full #{round}: {b}"));
                }
                if bad.len() > 5 {
                    report.push(format!("[{tag}] ... {} violations in all", bad.len()));
                }
            }
            Err(e) => eprintln!("[{tag}] reopen-while-full #{round}: refused: {e}"),
        }
        eprintln!("[{tag}] after full reopen #{round}: {}", listing(&dir));
    }
    // Grow the file system and free the filler: must open, with everything.
    m.unfill();
    m.resize(64 << 10);
    let r = {
        let (dir, o) = (dir.clone(), o.clone());
        within("reopen after growing", Duration::from_secs(60), move || {
            Database::open(&dir, o).map_err(|e| e.to_string())
        })
    };
    match r {
        Ok(db) => {
            let bad = verify(&db, &out.acked, &out.attempted);
            eprintln!("[{tag}] reopen after growing: Ok, violations {}", bad.len());
            for b in bad.iter().take(5) {
                report.push(format!("[{tag}] after growing: {b}"));
            }
            // Keeps working: commit, close, reopen.
            let t = db.table("t").expect("t");
            let more = commit_until_full(&db, &t, LogMode::Sync, 5_000_000, 50);
            if more.first_error.is_some() {
                report.push(format!(
                    "[{tag}] commit after growing failed: {:?}",
                    more.first_error
                ));
            }
            drop(db);
            let db = Database::open(&dir, o).expect("reopen after more");
            let mut acked = out.acked.clone();
            acked.extend(&more.acked);
            let mut att = out.attempted.clone();
            att.extend(&more.attempted);
            for b in verify(&db, &acked, &att).iter().take(5) {
                report.push(format!("[{tag}] final: {b}"));
            }
        }
        Err(e) => report.push(format!("[{tag}] reopen after growing FAILED: {e}")),
    }
    drop(m);
    report
}

fn run_all(cases: Vec<(String, LogMode, ConcurrencyControl, Option<u64>)>) {
    let mut all = Vec::new();
    for (tag, mode, cc, seg) in cases {
        all.extend(scenario_full(&tag, mode, cc, seg));
    }
    assert!(all.is_empty(), "violations:\n{}", all.join("\n"));
}

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn s1_commit_until_full_2pl() {
    use ConcurrencyControl::TwoPhaseLocking as C;
    run_all(vec![
        ("sync-2pl".into(), LogMode::Sync, C, None),
        ("pipe-2pl".into(), LogMode::Pipelined, C, None),
        ("async-2pl".into(), LogMode::Async, C, None),
        ("sync-2pl-seg".into(), LogMode::Sync, C, Some(256 << 10)),
        (
            "pipe-2pl-seg".into(),
            LogMode::Pipelined,
            C,
            Some(256 << 10),
        ),
        ("async-2pl-seg".into(), LogMode::Async, C, Some(256 << 10)),
    ]);
}

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn s1_commit_until_full_occ() {
    use ConcurrencyControl::Optimistic as C;
    run_all(vec![
        ("sync-occ".into(), LogMode::Sync, C, None),
        ("pipe-occ".into(), LogMode::Pipelined, C, None),
        ("async-occ".into(), LogMode::Async, C, None),
        ("sync-occ-seg".into(), LogMode::Sync, C, Some(256 << 10)),
        (
            "pipe-occ-seg".into(),
            LogMode::Pipelined,
            C,
            Some(256 << 10),
        ),
        ("async-occ-seg".into(), LogMode::Async, C, Some(256 << 10)),
    ]);
}

// ---------------------------------------------------------------------------------------
// Helpers for the other scenarios

/// Every commit id whose keys are in table `t`, and a list of half commits.
fn ids_in(db: &Database) -> (BTreeSet<u64>, Vec<String>) {
    let t = db.table("t").expect("t");
    let rows: BTreeMap<Vec<u8>, Vec<u8>> = db
        .run(|tx| tx.scan(&t, ..))
        .expect("scan")
        .into_iter()
        .collect();
    let mut ids = BTreeSet::new();
    let mut half = Vec::new();
    for k in rows.keys() {
        let s = String::from_utf8_lossy(k).to_string();
        if let Ok(i) = s[1..].parse::<u64>() {
            ids.insert(i);
            let other = if s.starts_with('a') { 'b' } else { 'a' };
            if !rows.contains_key(&key(other, i)) {
                half.push(format!("HALF commit {i}"));
            }
        }
    }
    (ids, half)
}

fn files(dir: &Path, suffix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .filter(|n| n.ends_with(suffix))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Fills the file system, then frees `keep` bytes of the filler.
fn fill_leaving(m: &Mnt, keep: u64) {
    let p = m.fill();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len.saturating_sub(keep)).unwrap();
}

fn reopen_check(
    tag: &str,
    dir: &Path,
    o: &Options,
    acked: &BTreeSet<u64>,
    attempted: &BTreeSet<u64>,
    must_open: bool,
) -> Vec<String> {
    let (d, oo, a, at) = (
        dir.to_path_buf(),
        o.clone(),
        acked.clone(),
        attempted.clone(),
    );
    let r = within(
        "reopen",
        Duration::from_secs(60),
        move || match Database::open(&d, oo) {
            Ok(db) => Ok(verify(&db, &a, &at)),
            Err(e) => Err(format!("{e}")),
        },
    );
    match r {
        Ok(bad) => {
            eprintln!("[{tag}] reopen: Ok, {} violations", bad.len());
            bad.into_iter()
                .take(5)
                .map(|b| format!("[{tag}] {b}"))
                .collect()
        }
        Err(e) => {
            eprintln!("[{tag}] reopen refused: {e}");
            if must_open {
                vec![format!("[{tag}] reopen FAILED: {e}")]
            } else {
                vec![]
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Scenario 2: a checkpoint larger than the space left.

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn s2_checkpoint_runs_out_of_space_midway() {
    let Some(m) = Mnt::tmpfs("ckpt", 24 << 10) else {
        return;
    };
    let dir = m.db();
    let o = opts(
        LogMode::Sync,
        ConcurrencyControl::TwoPhaseLocking,
        Some(1 << 20),
    );
    let mut report = Vec::new();
    let mut acked = BTreeSet::new();
    let mut attempted = BTreeSet::new();
    {
        let db = Database::open(&dir, o.clone()).expect("open");
        let t = db.create_table("t").expect("t");
        let a = commit_until_full(&db, &t, LogMode::Sync, 0, 1500);
        assert!(a.first_error.is_none(), "{:?}", a.first_error);
        acked.extend(&a.acked);
        attempted.extend(&a.attempted);
        let c1 = db.checkpoint();
        eprintln!("[ckpt] first checkpoint: {c1:?}; files {}", listing(&dir));
        assert!(c1.is_ok());
        let b = commit_until_full(&db, &t, LogMode::Sync, 10_000, 1500);
        assert!(b.first_error.is_none(), "{:?}", b.first_error);
        acked.extend(&b.acked);
        attempted.extend(&b.attempted);
        fill_leaving(&m, 3 << 20);
        let c2 = within(
            "checkpoint on a nearly full disk",
            Duration::from_secs(60),
            {
                let db = db.clone();
                move || db.checkpoint().map_err(|e| format!("{e:?}"))
            },
        );
        eprintln!("[ckpt] second checkpoint: {c2:?}");
        eprintln!("[ckpt] files after: {}", listing(&dir));
        if c2.is_ok() {
            report.push("[ckpt] second checkpoint unexpectedly fit".into());
        }
        if !files(&dir, ".tmp").is_empty() {
            report.push(format!(
                "[ckpt] a .tmp checkpoint is left: {:?}",
                files(&dir, ".tmp")
            ));
        }
        // Commits still go on (the space of the failed checkpoint is back).
        let c = commit_until_full(&db, &t, LogMode::Sync, 20_000, 50);
        eprintln!(
            "[ckpt] commits after failed checkpoint: acked {} err {:?}",
            c.acked.len(),
            c.first_error
        );
        acked.extend(&c.acked);
        attempted.extend(&c.attempted);
    }
    m.fill();
    report.extend(reopen_check(
        "ckpt-full",
        &dir,
        &o,
        &acked,
        &attempted,
        false,
    ));
    m.unfill();
    report.extend(reopen_check(
        "ckpt-freed",
        &dir,
        &o,
        &acked,
        &attempted,
        true,
    ));
    assert!(report.is_empty(), "violations:\n{}", report.join("\n"));
}

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn s2_background_checkpoints_while_filling() {
    let mut report = Vec::new();
    for mode in [LogMode::Sync, LogMode::Pipelined] {
        let Some(m) = Mnt::tmpfs("bgckpt", 12 << 10) else {
            return;
        };
        let dir = m.db();
        let o = opts(mode, ConcurrencyControl::TwoPhaseLocking, Some(256 << 10))
            .with_checkpoint_interval(Some(Duration::from_millis(5)));
        let out = {
            let (dir, o) = (dir.clone(), o.clone());
            within("bg checkpoints", Duration::from_secs(120), move || {
                let db = Database::open(&dir, o).expect("open");
                let t = db.create_table("t").expect("t");
                let out = commit_until_full(&db, &t, mode, 0, 100_000);
                eprintln!("[bg {mode:?}] status {:?}", db.checkpoint_status());
                out
            })
        };
        eprintln!(
            "[bg {mode:?}] acked {} first_error {:?}; files {}",
            out.acked.len(),
            out.first_error,
            files(&dir, "").join(" ")
        );
        m.fill();
        report.extend(reopen_check(
            &format!("bg-{mode:?}-full"),
            &dir,
            &o,
            &out.acked,
            &out.attempted,
            false,
        ));
        m.unfill();
        m.resize(64 << 10);
        report.extend(reopen_check(
            &format!("bg-{mode:?}-grown"),
            &dir,
            &o,
            &out.acked,
            &out.attempted,
            true,
        ));
    }
    assert!(report.is_empty(), "violations:\n{}", report.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Scenario 3: database and log directories on different file systems.

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn s3_log_fs_full() {
    let Some(dm) = Mnt::tmpfs("s3a-db", 16 << 10) else {
        return;
    };
    let Some(lm) = Mnt::tmpfs("s3a-log", 6 << 10) else {
        return;
    };
    let (dir, ldir) = (dm.db(), lm.path.join("log"));
    let mut report = Vec::new();
    for mode in [LogMode::Sync, LogMode::Pipelined, LogMode::Async] {
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&ldir);
        lm.unfill();
        let o = opts(mode, ConcurrencyControl::TwoPhaseLocking, Some(512 << 10))
            .with_log_dir(Some(ldir.clone()));
        let out = {
            let (dir, o) = (dir.clone(), o.clone());
            within("log fs full", Duration::from_secs(120), move || {
                let db = Database::open(&dir, o).expect("open");
                let t = db.create_table("t").expect("t");
                let out = commit_until_full(&db, &t, mode, 0, 100_000);
                let ck = db.checkpoint();
                eprintln!("[s3a {mode:?}] checkpoint with the log fs full: {ck:?}");
                out
            })
        };
        eprintln!(
            "[s3a {mode:?}] acked {} err {:?}",
            out.acked.len(),
            out.first_error
        );
        eprintln!(
            "[s3a {mode:?}] db: {} log: {}",
            listing(&dir),
            files(&ldir, "").join(" ")
        );
        lm.fill();
        report.extend(reopen_check(
            &format!("s3a-{mode:?}-full"),
            &dir,
            &o,
            &out.acked,
            &out.attempted,
            false,
        ));
        lm.unfill();
        report.extend(reopen_check(
            &format!("s3a-{mode:?}-freed"),
            &dir,
            &o,
            &out.acked,
            &out.attempted,
            true,
        ));
    }
    assert!(report.is_empty(), "violations:\n{}", report.join("\n"));
}

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn s3_db_fs_full() {
    let Some(dm) = Mnt::tmpfs("s3b-db", 4 << 10) else {
        return;
    };
    let Some(lm) = Mnt::tmpfs("s3b-log", 32 << 10) else {
        return;
    };
    let (dir, ldir) = (dm.db(), lm.path.join("log"));
    let o = opts(
        LogMode::Sync,
        ConcurrencyControl::TwoPhaseLocking,
        Some(512 << 10),
    )
    .with_log_dir(Some(ldir.clone()));
    let mut report = Vec::new();
    // A first open on a full database file system: refused, and nothing broken.
    dm.fill();
    let r = Database::open(&dir, o.clone());
    eprintln!(
        "[s3b] first open with the db fs full: {:?}",
        r.as_ref().err()
    );
    drop(r);
    dm.unfill();
    let mut acked = BTreeSet::new();
    let mut attempted = BTreeSet::new();
    {
        let db = Database::open(&dir, o.clone()).expect("open after freeing");
        let t = db.create_table("t").expect("t");
        let a = commit_until_full(&db, &t, LogMode::Sync, 0, 300);
        acked.extend(&a.acked);
        attempted.extend(&a.attempted);
        dm.fill();
        let ck = db.checkpoint();
        eprintln!("[s3b] checkpoint with the db fs full: {ck:?}");
        let b = commit_until_full(&db, &t, LogMode::Sync, 10_000, 300);
        eprintln!(
            "[s3b] commits with the db fs full: acked {} err {:?}",
            b.acked.len(),
            b.first_error
        );
        acked.extend(&b.acked);
        attempted.extend(&b.attempted);
        if b.first_error.is_some() {
            report.push(format!(
                "[s3b] commits failed although the log fs has room: {:?}",
                b.first_error
            ));
        }
    }
    eprintln!(
        "[s3b] db: {} log: {}",
        listing(&dir),
        files(&ldir, "").join(" ")
    );
    report.extend(reopen_check(
        "s3b-full", &dir, &o, &acked, &attempted, false,
    ));
    dm.unfill();
    report.extend(reopen_check(
        "s3b-freed",
        &dir,
        &o,
        &acked,
        &attempted,
        true,
    ));
    assert!(report.is_empty(), "violations:\n{}", report.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Scenario 4: reopen while full with a torn tail to cut (recovery must write).

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn s4_torn_tail_reopened_while_full() {
    let Some(m) = Mnt::tmpfs("torn", 8 << 10) else {
        return;
    };
    let dir = m.db();
    let o = opts(LogMode::Sync, ConcurrencyControl::TwoPhaseLocking, None);
    let mut report = Vec::new();
    let a = {
        let db = Database::open(&dir, o.clone()).expect("open");
        let t = db.create_table("t").expect("t");
        commit_until_full(&db, &t, LogMode::Sync, 0, 200)
    };
    // A crash tore the next flush: garbage after the log's end.
    let segs = files(&dir, ".seg");
    let last = dir.join(segs.last().unwrap());
    {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&last)
            .unwrap();
        f.write_all(&vec![0xabu8; 6000]).unwrap();
    }
    m.fill();
    for round in 0..3 {
        report.extend(reopen_check(
            &format!("torn-full-{round}"),
            &dir,
            &o,
            &a.acked,
            &a.attempted,
            false,
        ));
        eprintln!("[torn] files: {}", listing(&dir));
    }
    m.unfill();
    report.extend(reopen_check(
        "torn-freed",
        &dir,
        &o,
        &a.acked,
        &a.attempted,
        true,
    ));
    eprintln!("[torn] files: {}", listing(&dir));
    assert!(report.is_empty(), "violations:\n{}", report.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Inodes run out (ENOSPC on file creation) while the log rotates segments.

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn s1_inodes_run_out_at_segment_rotation() {
    let mut report = Vec::new();
    for mode in [LogMode::Sync, LogMode::Pipelined] {
        // 12 inodes: the log can create only a few segments, then creat() fails with ENOSPC.
        let Some(m) = Mnt::mount("inodes", "size=32m,nr_inodes=12") else {
            return;
        };
        let dir = m.db();
        let o = opts(mode, ConcurrencyControl::TwoPhaseLocking, Some(64 << 10));
        let out = {
            let (dir, o) = (dir.clone(), o.clone());
            within("inodes", Duration::from_secs(60), move || {
                let db = Database::open(&dir, o).expect("open");
                let t = db.create_table("t").expect("t");
                commit_until_full(&db, &t, mode, 0, 100_000)
            })
        };
        let failed: BTreeSet<u64> = out.attempted.difference(&out.acked).copied().collect();
        eprintln!(
            "[inodes {mode:?}] acked {} failed {:?} first_error {:?}",
            out.acked.len(),
            failed,
            out.first_error
        );
        eprintln!("[inodes {mode:?}] files: {}", listing(&dir));
        let r = Database::open(&dir, o.clone());
        eprintln!(
            "[inodes {mode:?}] reopen with no inode left: {:?}",
            r.as_ref().err().map(|e| e.to_string())
        );
        drop(r);
        assert!(Command::new("mount")
            .args(["-o", "remount,nr_inodes=1000"])
            .arg(&m.path)
            .status()
            .unwrap()
            .success());
        let db = Database::open(&dir, o.clone()).expect("reopen");
        report.extend(
            verify(&db, &out.acked, &out.attempted)
                .into_iter()
                .map(|b| format!("[inodes {mode:?}] {b}")),
        );
        let (ids, half) = ids_in(&db);
        report.extend(half);
        for i in &failed {
            if ids.contains(i) {
                report.push(format!(
                    "[inodes {mode:?}] commit {i} FAILED with an error, yet it is in the database after reopen"
                ));
            }
        }
    }
    assert!(report.is_empty(), "violations:\n{}", report.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Scenario 4b: failed opens on a full disk left a torn-*.bin file each; after 1,000 of them
// the database could no longer be opened, even once space was freed.

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn s4_repeated_failed_opens_on_a_full_disk_then_space_freed() {
    let Some(m) = Mnt::tmpfs("torn-loop", 4 << 10) else {
        return;
    };
    let dir = m.db();
    let o = opts(LogMode::Sync, ConcurrencyControl::TwoPhaseLocking, None);
    let a = {
        let db = Database::open(&dir, o.clone()).expect("open");
        let t = db.create_table("t").expect("t");
        commit_until_full(&db, &t, LogMode::Sync, 0, 20)
    };
    // A crash tore the last flush.
    let last = dir.join(files(&dir, ".seg").last().unwrap());
    std::fs::OpenOptions::new()
        .append(true)
        .open(&last)
        .unwrap()
        .write_all(&[0xab; 100])
        .unwrap();
    // The disk is full; a service manager restarts the process, which tries to open, 1001 times.
    m.fill();
    let mut last_err = String::new();
    for _ in 0..1001 {
        match Database::open(&dir, o.clone()) {
            Ok(_) => panic!("opened on a full disk"),
            Err(e) => last_err = e.to_string(),
        }
    }
    eprintln!("last error while full: {last_err}");
    // Each failed open used to leave an empty torn-*.bin; after 1,000 no name was left.
    let torn = files(&dir, ".bin");
    assert!(
        torn.is_empty(),
        "failed opens left torn files: {}",
        torn.len()
    );
    // Space is freed: the database must open with every acknowledged commit.
    m.unfill();
    let r = Database::open(&dir, o.clone());
    match &r {
        Ok(db) => assert!(verify(db, &a.acked, &a.attempted).is_empty()),
        Err(e) => panic!("after freeing the disk, open still fails: {e}"),
    }
}

// ---------------------------------------------------------------------------------------
// Scenario 5: SIGKILL of a process working on a full disk (committing, then reopening in a
// loop).

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn fd_child() {
    let Ok(dir) = std::env::var("SHOAL_FD_CHILD_DIR") else {
        return;
    };
    let mode = match std::env::var("SHOAL_FD_MODE").as_deref() {
        Ok("pipe") => LogMode::Pipelined,
        _ => LogMode::Sync,
    };
    let ckpt = std::env::var("SHOAL_FD_CKPT").is_ok();
    let mut o = opts(
        mode,
        ConcurrencyControl::TwoPhaseLocking,
        if ckpt { Some(256 << 10) } else { None },
    );
    if ckpt {
        o = o.with_checkpoint_interval(Some(Duration::from_millis(5)));
    }
    let out = std::io::stdout();
    let say = |s: String| {
        let mut o = out.lock();
        writeln!(o, "{s}").unwrap();
        o.flush().unwrap();
    };
    let db = Database::open(&dir, o.clone()).expect("child open");
    let t = db.table("t").or_else(|_| db.create_table("t")).expect("t");
    let mut i = 0u64;
    let mut tickets = Vec::new();
    loop {
        let mut tx = db.begin();
        let r = tx
            .put(&t, key('a', i), val(i))
            .and_then(|()| tx.put(&t, key('b', i), val(i)));
        let r = r.and_then(|()| match mode {
            LogMode::Pipelined => tx.commit_pipelined().map(|tk| tickets.push((i, tk))),
            _ => tx.commit().map(|()| say(format!("ack {i}"))),
        });
        if tickets.len() >= 4 {
            for (j, tk) in tickets.drain(..) {
                if tk.wait().is_ok() {
                    say(format!("ack {j}"));
                }
            }
        }
        if r.is_err() {
            break;
        }
        i += 1;
    }
    for (j, tk) in tickets.drain(..) {
        if tk.wait().is_ok() {
            say(format!("ack {j}"));
        }
    }
    say("full".into());
    drop(db);
    // Keep trying: reopen (recovery on the full disk), commit, close.
    let mut n = 1_000_000u64;
    loop {
        if let Ok(db) = Database::open(&dir, o.clone()) {
            if let Ok(t) = db.table("t") {
                let mut tx = db.begin();
                let r = tx
                    .put(&t, key('a', n), val(n))
                    .and_then(|()| tx.put(&t, key('b', n), val(n)));
                match mode {
                    LogMode::Pipelined => {
                        if let Ok(tk) = r.and_then(|()| tx.commit_pipelined()) {
                            if tk.wait().is_ok() {
                                say(format!("ack {n}"));
                            }
                        }
                    }
                    _ => {
                        if r.and_then(|()| tx.commit()).is_ok() {
                            say(format!("ack {n}"));
                        }
                    }
                }
                n += 1;
            }
        }
    }
}

#[test]
#[ignore = "needs root to mount tmpfs: run with --ignored"]
fn s5_sigkill_while_full() {
    let exe = std::env::current_exe().unwrap();
    let mut report = Vec::new();
    let mut round = 0u64;
    for (mode, ckpt) in [
        ("sync", false),
        ("pipe", false),
        ("sync", true),
        ("pipe", true),
    ] {
        for delay_ms in [0u64, 7, 40, 150] {
            round += 1;
            let Some(m) = Mnt::tmpfs(&format!("kill{round}"), 6 << 10) else {
                return;
            };
            let dir = m.db();
            let mut cmd = Command::new(&exe);
            cmd.args([
                "fd_child",
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SHOAL_FD_CHILD_DIR", &dir)
            .env("SHOAL_FD_MODE", mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
            if ckpt {
                cmd.env("SHOAL_FD_CKPT", "1");
            }
            let mut child = cmd.spawn().expect("spawn");
            let stdout = child.stdout.take().unwrap();
            let (tx, rx) = mpsc::channel::<String>();
            std::thread::spawn(move || {
                for l in BufReader::new(stdout).lines() {
                    let Ok(l) = l else { break };
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            });
            let mut acked = BTreeSet::new();
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut full_at = None;
            loop {
                match rx.recv_timeout(Duration::from_millis(1)) {
                    Ok(l) if l == "full" => full_at = Some(Instant::now()),
                    Ok(l) => {
                        if let Some(n) = l.strip_prefix("ack ") {
                            acked.insert(n.parse::<u64>().unwrap());
                        }
                    }
                    Err(_) => {}
                }
                if full_at.is_some_and(|t| t.elapsed() >= Duration::from_millis(delay_ms)) {
                    break;
                }
                assert!(Instant::now() < deadline, "child never filled the disk");
            }
            child.kill().unwrap();
            let _ = child.wait();
            while let Ok(l) = rx.recv_timeout(Duration::from_millis(50)) {
                if let Some(n) = l.strip_prefix("ack ") {
                    acked.insert(n.parse::<u64>().unwrap());
                }
            }
            let tag = format!("kill-{mode}-ckpt{ckpt}-{delay_ms}ms");
            eprintln!("[{tag}] acked {}; files {}", acked.len(), listing(&dir));
            let o = opts(
                if mode == "pipe" {
                    LogMode::Pipelined
                } else {
                    LogMode::Sync
                },
                ConcurrencyControl::TwoPhaseLocking,
                None,
            );
            let none = BTreeSet::new();
            m.fill();
            report.extend(reopen_check(
                &format!("{tag}-full"),
                &dir,
                &o,
                &acked,
                &none,
                false,
            ));
            m.unfill();
            m.resize(64 << 10);
            report.extend(reopen_check(
                &format!("{tag}-grown"),
                &dir,
                &o,
                &acked,
                &none,
                true,
            ));
            if let Ok(db) = Database::open(&dir, o.clone()) {
                report.extend(ids_in(&db).1.into_iter().map(|h| format!("[{tag}] {h}")));
            }
        }
    }
    assert!(report.is_empty(), "violations:\n{}", report.join("\n"));
}
