//! `shoal recover DIR`: opens (and so recovers) the database in DIR and reports what recovery
//! did and how fast: checkpoint rows loaded, log records replayed, log bytes, wall time and
//! records per second. With `--tables` it also counts each table's rows, and if DIR holds a
//! TPC-B database it checks that branch, teller and account balances sum to the same total.
//!
//! A database left by `shoal bench tpcb --db DIR --log async` (or `sync`) is a convenient
//! input: the bench keeps DIR, so the log holds every commit of the run.

use std::path::{Path, PathBuf};

use anyhow::Context;
use shoal::{Database, Options};

/// Bytes of the log segment files in `dir` (`log-*.seg`), and of checkpoint files (`*.ckpt`):
/// the database's own, not those of databases in subdirectories.
fn log_and_checkpoint_bytes(dir: &Path) -> (u64, u64) {
    let (mut log, mut ckpt) = (0, 0);
    let Ok(rd) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    for e in rd.flatten() {
        let Ok(md) = e.metadata() else { continue };
        if !md.is_file() {
            continue;
        }
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".ckpt") {
            ckpt += md.len();
        } else if name.ends_with(".seg") {
            log += md.len();
        }
    }
    (log, ckpt)
}

/// Sum of the 8-byte little-endian integers at the start of each value of `table`.
fn balance_sum(db: &Database, table: &str) -> anyhow::Result<Option<i64>> {
    let Ok(t) = db.table(table) else {
        return Ok(None);
    };
    let rows = db.run(|tx| tx.scan(&t, ..))?;
    let mut sum = 0i64;
    for (k, v) in rows {
        let b: [u8; 8] = v
            .get(..8)
            .and_then(|s| s.try_into().ok())
            .with_context(|| format!("{table}: row {k:?} has no 8-byte balance"))?;
        sum = sum.wrapping_add(i64::from_le_bytes(b));
    }
    Ok(Some(sum))
}

/// Runs `shoal recover`.
pub fn run(dir: &PathBuf, tables: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        dir.is_dir(),
        "{} is not a database directory",
        dir.display()
    );
    // Opening creates a database where there is none: recovering one that is not there
    // would report success and leave a new, empty database behind.
    anyhow::ensure!(
        dir.join("SHOAL-ID").is_file(),
        "{} holds no shoal database (no SHOAL-ID file); nothing to recover",
        dir.display()
    );
    let (log_bytes, ckpt_bytes) = log_and_checkpoint_bytes(dir);
    let db = Database::open(dir, Options::default())
        .with_context(|| format!("recovering {}", dir.display()))?;
    let s = db
        .recovery_stats()
        .cloned()
        .context("the database reports no recovery statistics")?;
    let secs = s.elapsed.as_secs_f64();
    let per_sec = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    println!("recovered {}", dir.display());
    match s.checkpoint_lsn {
        Some(lsn) => println!(
            "  checkpoint:   LSN {lsn}, {} rows ({:.1} MB of checkpoint files)",
            s.checkpoint_rows,
            ckpt_bytes as f64 / 1e6
        ),
        None => println!("  checkpoint:   none"),
    }
    println!(
        "  log replayed: {} records ({:.1} MB of log segments), torn tail cut: {} bytes",
        s.log_records,
        log_bytes as f64 / 1e6,
        s.torn_bytes
    );
    println!(
        "  end LSN:      {} ({})",
        s.end_lsn,
        if s.closed_cleanly {
            "closed cleanly"
        } else {
            "no clean close: a crash, or a new database"
        }
    );
    println!(
        "  time:         {:.3} s: {:.0} log records/s, {:.0} checkpoint rows/s, {:.1} MB/s of log",
        secs,
        per_sec(s.log_records),
        per_sec(s.checkpoint_rows),
        per_sec(log_bytes) / 1e6
    );
    if tables {
        for name in db.tables() {
            let t = db.table(&name)?;
            let n = db.run(|tx| tx.scan(&t, ..).map(|r| r.len()))?;
            println!("  table {name}: {n} rows");
        }
    }
    let sums = (
        balance_sum(&db, "branch")?,
        balance_sum(&db, "teller")?,
        balance_sum(&db, "account")?,
    );
    if let (Some(b), Some(t), Some(a)) = sums {
        anyhow::ensure!(
            b == t && t == a,
            "TPC-B balances differ after recovery: branches {b}, tellers {t}, accounts {a}"
        );
        println!("  TPC-B check:  branch = teller = account balance total = {b}");
    }
    Ok(())
}
