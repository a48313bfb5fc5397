//! Durability: reopen after clean shutdown, checkpoints, torn log tails, corruption, and a
//! crash test that SIGKILLs a real process in the middle of TPC-B-style transfers.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

use common::dump;
use shoal::{Database, Error, LogMode, Options};

fn opts() -> Options {
    Options::default()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

#[test]
fn committed_work_survives_reopen_and_aborted_work_does_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut model = BTreeMap::new();
    let mut changed = 0u64;
    {
        let db = Database::open(dir.path(), opts()).expect("open");
        let t = db.create_table("t").expect("create");
        for i in 0u32..200 {
            let k = (i % 50).to_be_bytes().to_vec();
            if i % 7 == 3 {
                // Deleting an absent key changes nothing and logs nothing.
                if db.run(|tx| tx.delete(&t, &k)).expect("delete") {
                    changed += 1;
                }
                model.remove(&k);
            } else {
                let v = i.to_le_bytes().to_vec();
                db.run(|tx| tx.put(&t, &k, &v)).expect("put");
                changed += 1;
                model.insert(k, v);
            }
        }
        let mut tx = db.begin();
        tx.put(&t, b"aborted", b"x").expect("put");
        tx.abort();
        db.run(|tx| tx.add_and_get(&t, b"counter", 5).map(|_| ()))
            .expect("add");
        model.insert(b"counter".to_vec(), 5i64.to_le_bytes().to_vec());
    }
    let db = Database::open(dir.path(), opts()).expect("reopen");
    assert_eq!(dump(&db, "t"), model);
    let stats = db.recovery_stats().expect("stats");
    assert_eq!(
        stats.log_records,
        changed + 2,
        "one record per changing commit, the counter and the table"
    );
    // And the reopened database keeps logging after the old tail.
    let t = db.table("t").expect("table");
    db.run(|tx| tx.put(&t, b"after", b"1")).expect("put");
    drop(db);
    let db = Database::open(dir.path(), opts()).expect("reopen again");
    model.insert(b"after".to_vec(), b"1".to_vec());
    assert_eq!(dump(&db, "t"), model);
}

#[test]
fn checkpoint_truncates_the_log_and_recovery_uses_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let small = opts().with_log_segment_size(4096);
    {
        let db = Database::open(dir.path(), small.clone()).expect("open");
        let t = db.create_table("t").expect("create");
        for i in 0u32..300 {
            db.run(|tx| tx.put(&t, i.to_be_bytes(), [7u8; 40]))
                .expect("put");
        }
        assert!(segments(dir.path()).len() > 2, "segments rotate");
        db.checkpoint().expect("checkpoint").expect("has a log");
        assert!(segments(dir.path()).len() <= 2, "old segments removed");
        for i in 300u32..320 {
            db.run(|tx| tx.put(&t, i.to_be_bytes(), [8u8; 40]))
                .expect("put");
        }
        db.run(|tx| tx.delete(&t, 0u32.to_be_bytes()))
            .expect("delete");
    }
    let db = Database::open(dir.path(), small).expect("reopen");
    let stats = db.recovery_stats().expect("stats").clone();
    assert!(stats.checkpoint_lsn.is_some());
    assert_eq!(stats.checkpoint_rows, 300);
    assert_eq!(stats.log_records, 21);
    let rows = dump(&db, "t");
    assert_eq!(rows.len(), 319);
    assert!(!rows.contains_key(0u32.to_be_bytes().as_slice()));
}

/// The end of the records in a segment file: the offset of the first frame header whose
/// length is zero (the zeros the log writes ahead of its end), or the file's end.
fn log_end(seg: &Path) -> u64 {
    let bytes = std::fs::read(seg).expect("read segment");
    let mut off = 0usize;
    while let Some(h) = bytes.get(off..off + 8) {
        // The top bit marks a flush's first frame.
        let len = (u32::from_le_bytes(h[..4].try_into().expect("4 bytes"))
            & !shoal::log::record::FLUSH_START) as usize;
        if len == 0 {
            break;
        }
        off += 8 + len;
    }
    off.min(bytes.len()) as u64
}

/// Writes a log of `n` single-put commits; returns the database dir and the end of the log's
/// records after each commit (sync commits: the record is in the file when commit returns).
/// After the database closes, the segment ends with the close's record.
fn small_log(n: u32) -> (tempfile::TempDir, Vec<u64>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ends = Vec::new();
    let seg;
    {
        let db = Database::open(dir.path(), opts()).expect("open");
        let t = db.create_table("t").expect("create");
        seg = segments(dir.path()).pop().expect("segment");
        ends.push(log_end(&seg));
        for i in 0..n {
            db.run(|tx| tx.put(&t, i.to_be_bytes(), i.to_le_bytes()))
                .expect("put");
            ends.push(log_end(&seg));
        }
    }
    // A clean close ends the log with its own record (`LogRecord::Close`) and cuts the zeros
    // after it.
    let closed = shoal::log::record::LogRecord::Close.encode().len() as u64;
    assert_eq!(
        std::fs::metadata(&seg).expect("meta").len(),
        *ends.last().expect("ends") + closed,
        "a clean close writes its record and cuts the zeros after the log's end"
    );
    (dir, ends)
}

fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(from).expect("read") {
        let e = e.expect("entry");
        if e.file_name() != "LOCK" {
            std::fs::copy(e.path(), to.path().join(e.file_name())).expect("copy");
        }
    }
    to
}

#[test]
fn torn_tail_at_every_offset_recovers_the_whole_records_before_it() {
    let (dir, ends) = small_log(6);
    let seg_name = segments(dir.path())
        .pop()
        .expect("segment")
        .file_name()
        .expect("name")
        .to_owned();
    let total = *ends.last().expect("ends");
    let first_cut = ends[ends.len() - 4]; // the last three records
    for cut in first_cut..total {
        let copy = copy_dir(dir.path());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(copy.path().join(&seg_name))
            .expect("open seg");
        f.set_len(cut).expect("truncate");
        drop(f);
        let db = Database::open(copy.path(), opts()).expect("recovery succeeds at a torn tail");
        let whole = ends.iter().filter(|&&e| e <= cut).count() - 1; // commits fully present
        let rows = dump(&db, "t");
        assert_eq!(rows.len(), whole, "cut at {cut}");
        let torn = db.recovery_stats().expect("stats").torn_bytes;
        assert_eq!(torn, cut - ends[whole], "cut at {cut}");
    }
}

/// A crash image of an open database: its last segment ends in the zeros the log writes
/// ahead of its end. Returns the image, the segment's name, where its records end, and the
/// rows committed.
fn crash_image_with_zeros() -> (tempfile::TempDir, std::ffi::OsString, u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Database::open(dir.path(), opts()).expect("open");
    let t = db.create_table("t").expect("create");
    for i in 0u32..50 {
        db.run(|tx| tx.put(&t, i.to_be_bytes(), [9u8; 30]))
            .expect("put");
    }
    let seg = segments(dir.path()).pop().expect("segment");
    let end = log_end(&seg);
    let bytes = std::fs::read(&seg).expect("read");
    assert!(
        bytes.len() as u64 > end,
        "the log writes zeros ahead of its end ({} bytes, records end at {end})",
        bytes.len()
    );
    assert!(bytes[end as usize..].iter().all(|&b| b == 0));
    let crash = copy_dir(dir.path());
    drop(db);
    (crash, seg.file_name().expect("name").to_owned(), end)
}

#[test]
fn recovery_tells_a_clean_close_from_a_crash() {
    let (crash, _, _) = crash_image_with_zeros();
    let db = Database::open(crash.path(), opts()).expect("open the crash image");
    assert!(!db.recovery_stats().expect("stats").closed_cleanly);
    drop(db);
    let db = Database::open(crash.path(), opts()).expect("reopen after a clean close");
    let stats = db.recovery_stats().expect("stats");
    assert!(stats.closed_cleanly, "{stats:?}");
    assert_eq!(stats.log_records, 51, "the close record is not counted");
}

#[test]
fn zeros_after_the_log_in_a_crash_image_end_the_log_and_are_cut() {
    let (crash, name, end) = crash_image_with_zeros();
    let db = Database::open(crash.path(), opts()).expect("recover the crash image");
    let stats = db.recovery_stats().expect("stats").clone();
    assert_eq!(stats.torn_bytes, 0, "zeros are not a torn tail");
    assert_eq!(stats.torn_file, None);
    assert_eq!(dump(&db, "t").len(), 50, "every commit is there");
    let seg = crash.path().join(&name);
    assert_eq!(std::fs::metadata(&seg).expect("meta").len(), end);
    // The database goes on, and opens again.
    let t = db.table("t").expect("table");
    db.run(|tx| tx.put(&t, b"after", b"1")).expect("put");
    drop(db);
    let db = Database::open(crash.path(), opts()).expect("reopen");
    assert_eq!(dump(&db, "t").len(), 51);
}

#[test]
fn a_torn_record_before_the_zeros_is_kept_aside_without_them() {
    let (crash, name, end) = crash_image_with_zeros();
    let seg = crash.path().join(&name);
    let mut bytes = std::fs::read(&seg).expect("read");
    // Part of a record that a flush cut short, written over the zeros.
    let e = end as usize;
    bytes[e..e + 100].fill(0xab);
    std::fs::write(&seg, &bytes).expect("write");
    let db = Database::open(crash.path(), opts()).expect("a torn tail opens");
    let stats = db.recovery_stats().expect("stats").clone();
    assert_eq!(dump(&db, "t").len(), 50);
    let kept = std::fs::read(stats.torn_file.expect("torn bytes kept")).expect("read kept");
    // Kept to the end of the 4 KiB block holding the last non-zero byte.
    let block_end = (e + 100).div_ceil(4096) * 4096;
    assert_eq!(kept, &bytes[e..block_end.min(bytes.len())]);
    assert_eq!(stats.torn_bytes, kept.len() as u64);
    assert!(
        kept.len() < bytes.len() - e,
        "the zeros after it are not kept"
    );
    assert_eq!(std::fs::metadata(&seg).expect("meta").len(), end);
}

#[test]
fn a_bit_flip_in_a_middle_record_is_reported_as_corruption() {
    let (dir, ends) = small_log(6);
    let seg = segments(dir.path()).pop().expect("segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    let mid = ((ends[2] + ends[3]) / 2) as usize;
    bytes[mid] ^= 0x10;
    std::fs::write(&seg, &bytes).expect("write");
    match Database::open(dir.path(), opts()) {
        Err(Error::Corrupt { path, offset, .. }) => {
            assert_eq!(path, seg);
            assert_eq!(offset, ends[2]);
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("corruption went unnoticed"),
    }
}

#[test]
fn async_commits_are_durable_after_flush() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = opts().with_log(LogMode::Async);
    {
        let db = Database::open(dir.path(), o.clone()).expect("open");
        let t = db.create_table("t").expect("create");
        for i in 0u32..100 {
            db.run(|tx| tx.put(&t, i.to_be_bytes(), b"v")).expect("put");
        }
        db.flush().expect("flush");
    }
    let db = Database::open(dir.path(), o).expect("reopen");
    assert_eq!(dump(&db, "t").len(), 100);
}

// ----- crash test with a real process --------------------------------------------------------

const ACCOUNTS: u64 = 200;
const TELLERS: u64 = 20;
const BRANCHES: u64 = 2;

fn k(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

/// The child: TPC-B-style transfers with sync commits, printing `ack <seq> <delta>` after
/// each acknowledged commit. Only does anything when started by the parent test.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var("SHOAL_CRASH_CHILD_DIR") else {
        return;
    };
    let seed: u64 = std::env::var("SHOAL_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let db = Database::open(&dir, child_options(seed)).expect("child open");
    let names = ["account", "teller", "branch", "history"];
    let tables: Vec<_> = names
        .iter()
        .map(|n| db.table(n).or_else(|_| db.create_table(n)).expect("table"))
        .collect();
    let start = dump(&db, "history").len() as u64;
    let mut x = seed | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    use std::io::Write;
    let out = std::io::stdout();
    for seq in start.. {
        let a = rnd() % ACCOUNTS;
        let t = rnd() % TELLERS;
        let b = t % BRANCHES;
        let delta = (rnd() % 1999) as i64 - 999;
        db.run(|tx| {
            tx.add_and_get(&tables[0], k(a), delta)?;
            tx.add_and_get(&tables[1], k(t), delta)?;
            tx.add_and_get(&tables[2], k(b), delta)?;
            tx.insert(&tables[3], k(seq), delta.to_le_bytes())
        })
        .expect("transfer");
        let mut o = out.lock();
        writeln!(o, "ack {seq} {delta}").expect("stdout");
        o.flush().expect("flush");
    }
}

/// The child's options: odd seeds use 64 KiB segments and a checkpoint every 20 ms, so
/// kills also land in segment rollovers, checkpoints and the removal of old segments (the
/// default 64 MiB segments are never filled by a round).
fn child_options(seed: u64) -> Options {
    let o = Options::default();
    if seed.is_multiple_of(2) {
        return o;
    }
    o.with_log_segment_size(64 << 10)
        .with_checkpoint_interval(Some(Duration::from_millis(20)))
}

fn sum(db: &Database, table: &str) -> i64 {
    dump(db, table)
        .values()
        .map(|v| i64::from_le_bytes(v[..8].try_into().expect("8 bytes")))
        .sum()
}

fn crash_once(seed: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let mut acked: BTreeMap<u64, i64> = BTreeMap::new();
    // Two crashes into the same directory: the second child recovers the first one's log.
    for round in 0..2 {
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env("SHOAL_CRASH_CHILD_DIR", dir.path())
            .env("SHOAL_CRASH_SEED", (seed * 31 + round).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut it = line.split_whitespace();
                if it.next() == Some("ack") {
                    let seq: u64 = it.next().and_then(|s| s.parse().ok()).expect("seq");
                    let d: i64 = it.next().and_then(|s| s.parse().ok()).expect("delta");
                    acks.push((seq, d));
                }
            }
            acks
        });
        // Let it commit for a while, then kill it without warning.
        let wait = 150 + (seed * 37 + round * 11) % 250;
        std::thread::sleep(Duration::from_millis(wait));
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("reap");
        // Killed, not exited: a child that failed on its own (say, recovering the last
        // one's log) would leave nothing to check, and the round would pass vacuously.
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                status.signal(),
                Some(9),
                "the child exited by itself: {status:?} (seed {seed}, round {round})"
            );
        }
        #[cfg(not(unix))]
        let _ = status;
        acked.extend(reader.join().expect("reader"));
    }
    let db = Database::open(dir.path(), Options::default()).expect("recovery after SIGKILL");
    if !seed.is_multiple_of(2) {
        // The children checkpointed (and so rolled segments and removed old ones).
        let stats = db.recovery_stats().expect("recovered");
        assert!(
            stats.checkpoint_lsn.is_some(),
            "no checkpoint (seed {seed}): {stats:?}"
        );
    }
    let history = dump(&db, "history");
    for (seq, d) in &acked {
        let v = history
            .get(k(*seq).as_slice())
            .unwrap_or_else(|| panic!("acknowledged commit {seq} lost (seed {seed})"));
        assert_eq!(i64::from_le_bytes(v[..8].try_into().expect("8")), *d);
    }
    // No partial transaction: the three balances and the history agree.
    let h: i64 = history
        .values()
        .map(|v| i64::from_le_bytes(v[..8].try_into().expect("8")))
        .sum();
    assert_eq!(sum(&db, "account"), h, "seed {seed}");
    assert_eq!(sum(&db, "teller"), h, "seed {seed}");
    assert_eq!(sum(&db, "branch"), h, "seed {seed}");
    // History keys are dense: every transaction before the last recovered one is there.
    let n = history.len() as u64;
    assert!(
        history.keys().cloned().eq((0..n).map(|i| k(i).to_vec())),
        "seed {seed}"
    );
    assert!(
        !acked.is_empty(),
        "the child committed nothing (seed {seed})"
    );
}

#[test]
fn sigkill_during_transfers_loses_no_acknowledged_commit() {
    for seed in 1..=5 {
        crash_once(seed);
    }
}

#[test]
#[ignore = "long: 100 seeds, two kills each"]
fn sigkill_soak() {
    for seed in 1..=100 {
        crash_once(seed);
    }
}

// ----- early lock release and pipelining -------------------------------------------------

/// Kimura et al. §5.2, Table 6: T1 updates x and commits with SX-ELR (locks released when the
/// commit record is in the buffer); read-only T2 reads x and commits. A crash right after T2
/// returns must not take back what T2 saw. `sx-unsafe` shows the anomaly; `sx` prevents it.
fn elr_anomaly(elr: shoal::Elr) -> (i64, i64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = opts()
        .with_elr(elr)
        .with_log_latency(Duration::from_millis(400));
    let db = Database::open(dir.path(), o.clone()).expect("open");
    let t = db.create_table("t").expect("create");
    db.run(|tx| tx.put(&t, b"x", 1i64.to_le_bytes()))
        .expect("seed");
    let (seen, recovered) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut tx = db.begin();
            tx.put(&t, b"x", 2i64.to_le_bytes()).expect("put");
            tx.commit().expect("commit T1");
        });
        // Let T1 reach its commit (record in the buffer, locks released under ELR).
        std::thread::sleep(Duration::from_millis(100));
        let mut tx = db.begin();
        let seen = tx.get_i64(&t, b"x").expect("read").expect("x");
        tx.commit().expect("commit T2");
        // "Crash" now: what is on disk at the moment T2 returned.
        let crash = copy_dir(dir.path());
        writer.join().expect("writer");
        let db2 = Database::open(crash.path(), o.clone()).expect("recover the crash image");
        let t2 = db2.table("t").expect("table");
        let recovered = db2
            .run(|tx| tx.get_i64(&t2, b"x"))
            .expect("read")
            .expect("x");
        (seen, recovered)
    });
    (seen, recovered)
}

#[test]
fn unsafe_sx_elr_shows_the_read_only_anomaly() {
    let (seen, recovered) = elr_anomaly(shoal::Elr::SxUnsafe);
    assert_eq!(seen, 2, "T2 read T1's early-released write");
    assert_eq!(recovered, 1, "and a crash right after T2 returned lost it");
}

#[test]
fn safe_sx_elr_makes_the_reader_wait_for_durability() {
    let (seen, recovered) = elr_anomaly(shoal::Elr::Sx);
    assert_eq!(seen, 2, "T2 still reads T1's write early");
    assert_eq!(recovered, 2, "but returns only once it is durable");
}

/// The same anomaly through a delete and a scan: T1 deletes x and commits with SX-ELR;
/// read-only T2 scans the table. The scan locks x's neighbours, not x: before, x's ghost went
/// as soon as T1 released its locks, so T2 found no lock of T1's to wait on, reported x gone
/// and returned before T1 was durable; a crash then brought x back.
#[test]
fn safe_sx_elr_makes_a_scan_wait_for_a_delete_to_be_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = opts()
        .with_elr(shoal::Elr::Sx)
        .with_log_latency(Duration::from_millis(400));
    let db = Database::open(dir.path(), o.clone()).expect("open");
    let t = db.create_table("t").expect("create");
    db.run(|tx| {
        for k in ["a", "x", "z"] {
            tx.put(&t, k, "v")?;
        }
        Ok(())
    })
    .expect("seed");
    let keys = |rows: Vec<(Vec<u8>, Vec<u8>)>| -> Vec<Vec<u8>> {
        rows.into_iter().map(|(k, _)| k).collect()
    };
    let (seen, recovered) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut tx = db.begin();
            assert!(tx.delete(&t, "x").expect("delete"));
            tx.commit().expect("commit T1");
        });
        std::thread::sleep(Duration::from_millis(100));
        let mut tx = db.begin();
        let seen = keys(tx.scan(&t, ..).expect("scan"));
        tx.commit().expect("commit T2");
        let crash = copy_dir(dir.path());
        writer.join().expect("writer");
        let db2 = Database::open(crash.path(), o.clone()).expect("recover the crash image");
        let t2 = db2.table("t").expect("table");
        let recovered = keys(db2.run(|tx| tx.scan(&t2, ..)).expect("scan"));
        (seen, recovered)
    });
    assert_eq!(
        seen,
        [b"a".to_vec(), b"z".to_vec()],
        "T2 saw the delete early"
    );
    assert_eq!(recovered, seen, "and returned only once it was durable");
}

#[test]
fn pipelined_commit_reports_durability_only_after_the_flush() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = opts().with_log_latency(Duration::from_millis(200));
    let db = Database::open(dir.path(), o.clone()).expect("open");
    let t = db.create_table("t").expect("create");
    let mut tx = db.begin();
    tx.put(&t, b"k", b"v").expect("put");
    let ticket = tx.commit_pipelined().expect("commit");
    assert!(!ticket.is_durable(), "durable before the flush");
    let image = copy_dir(dir.path());
    // Without ELR the locks stay held until durable: a reader waits for the flush.
    let got = db.run(|tx| tx.get(&t, b"k")).expect("read");
    assert_eq!(got, Some(b"v".to_vec()));
    assert!(
        ticket.is_durable(),
        "the reader got the lock before the commit was durable"
    );
    ticket.wait().expect("durable");
    let early = Database::open(image.path(), o.clone()).expect("recover early image");
    let te = early.table("t").expect("table");
    assert_eq!(early.run(|tx| tx.get(&te, b"k")).expect("read"), None);
    let late = copy_dir(dir.path());
    let late = Database::open(late.path(), o).expect("recover late image");
    let tl = late.table("t").expect("table");
    assert_eq!(
        late.run(|tx| tx.get(&tl, b"k")).expect("read"),
        Some(b"v".to_vec())
    );
}
