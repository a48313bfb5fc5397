//! A read-only transaction that returns must not have reported data that a crash right after
//! it returned can take back (safe SX-ELR, Kimura et al. 2012 §5.2-5.3), whatever released
//! the data early: SX-ELR, an `Async` commit under two-phase locking, or a pipelined commit
//! under `Serial` (which gives up the serial turn before it is durable). Each test copies the
//! database directory as a crash image the moment the reader returned, and recovers it.

use std::path::Path;
use std::time::Duration;

use shoal::{ConcurrencyControl, Database, Elr, LogMode, Options};

fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(from).expect("read dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_file() {
            std::fs::copy(e.path(), to.path().join(e.file_name())).expect("copy");
        }
    }
    to
}

fn recovered_x(image: &Path, o: &Options) -> i64 {
    let db = Database::open(image, o.clone()).expect("recover the crash image");
    let t = db.table("t").expect("table");
    db.run(|tx| tx.get_i64(&t, b"x")).expect("read").expect("x")
}

/// T1 writes x = 2 and commits with `commit_pipelined` (not durable yet: the device takes
/// 400 ms); read-only T2 reads x and returns; the machine crashes right then.
fn pipelined_then_reader(o: Options) -> (i64, i64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Database::open(dir.path(), o.clone()).expect("open");
    let t = db.create_table("t").expect("create");
    db.run(|tx| tx.put(&t, b"x", 1i64.to_le_bytes()))
        .expect("seed");
    db.flush().expect("flush");
    let mut t1 = db.begin();
    t1.put(&t, b"x", 2i64.to_le_bytes()).expect("put");
    let ticket = t1.commit_pipelined().expect("commit T1");
    assert!(!ticket.is_durable());
    let seen = db
        .run(|tx| tx.get_i64(&t, b"x"))
        .expect("read-only T2")
        .expect("x");
    let crash = copy_dir(dir.path());
    ticket.wait().expect("T1 durable later");
    (seen, recovered_x(crash.path(), &o))
}

#[test]
fn a_serial_reader_does_not_return_a_pipelined_commit_before_it_is_durable() {
    let o = Options::default()
        .with_cc(ConcurrencyControl::Serial)
        .with_log_latency(Duration::from_millis(400));
    let (seen, recovered) = pipelined_then_reader(o);
    assert_eq!(
        recovered, seen,
        "read-only T2 returned x = {seen}, a crash right after it returned recovered x = {recovered}"
    );
}

#[test]
fn a_2pl_reader_does_not_return_a_pipelined_commit_before_it_is_durable() {
    // 2PL without ELR keeps T1's locks until it is durable, so T2 waits.
    let o = Options::default().with_log_latency(Duration::from_millis(400));
    let (seen, recovered) = pipelined_then_reader(o);
    assert_eq!(recovered, seen);
}

/// T1 commits with a per-transaction `LogMode::Async` in a database whose commits are `Sync`;
/// read-only T2 (a `Sync` commit) reads x and returns; crash.
fn async_writer_sync_reader(o: Options) -> (i64, i64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Database::open(dir.path(), o.clone()).expect("open");
    let t = db.create_table("t").expect("create");
    db.run(|tx| tx.put(&t, b"x", 1i64.to_le_bytes()))
        .expect("seed");
    let mut t1 = db.begin();
    t1.set_log_mode(LogMode::Async);
    t1.put(&t, b"x", 2i64.to_le_bytes()).expect("put");
    t1.commit().expect("commit T1");
    let seen = db
        .run(|tx| tx.get_i64(&t, b"x"))
        .expect("read-only T2")
        .expect("x");
    let crash = copy_dir(dir.path());
    db.flush().expect("flush");
    (seen, recovered_x(crash.path(), &o))
}

#[test]
fn a_sync_reader_of_an_async_commit_waits_for_it_under_2pl_without_elr() {
    let o = Options::default().with_log_latency(Duration::from_millis(400));
    let (seen, recovered) = async_writer_sync_reader(o);
    assert_eq!(recovered, seen, "2PL, ELR off");
}

#[test]
fn a_sync_reader_of_an_async_commit_waits_for_it_under_2pl_with_sx_elr() {
    let o = Options::default()
        .with_elr(Elr::Sx)
        .with_log_latency(Duration::from_millis(400));
    let (seen, recovered) = async_writer_sync_reader(o);
    assert_eq!(recovered, seen, "2PL, SX-ELR");
}

#[test]
fn a_sync_reader_of_an_async_commit_waits_for_it_under_occ() {
    let o = Options::default()
        .with_cc(ConcurrencyControl::Optimistic)
        .with_log_latency(Duration::from_millis(400));
    let (seen, recovered) = async_writer_sync_reader(o);
    assert_eq!(recovered, seen, "OCC");
}
