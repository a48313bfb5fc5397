//! Group commit: many committers share a flush, each is durable when its wait returns, a
//! failed fsync reaches every waiter of its batch, and a committer waiting for the log holds
//! no admission slot.
//!
//! The file system is the in-memory one behind a wrapper that can hold a log fsync until the
//! test lets it go (so that waiters gather for one flush) and fail it, and that records how
//! far the log files are synced.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::buffer::{FlushPolicy, LogBuffer, LogConfig};
use super::record::{LogRecord, Write};
use crate::vfs::mem::MemFs;
use crate::vfs::{DirLock, VFile, Vfs};
use crate::{Admission, Database, Elr, LogMode, Options};

/// What the wrapper shares with the test.
#[derive(Default)]
struct Control {
    /// While set, a log fsync waits.
    hold: AtomicBool,
    /// Set: the next log fsync fails (after the hold).
    fail: AtomicBool,
    /// Log fsyncs begun.
    syncs: AtomicUsize,
    /// Bytes written to log files up to the last successful log fsync.
    synced: AtomicU64,
    written: AtomicU64,
}

#[derive(Clone)]
struct GatedFs {
    inner: MemFs,
    ctl: Arc<Control>,
}

struct GatedFile {
    inner: Box<dyn VFile>,
    log: bool,
    ctl: Arc<Control>,
}

fn is_log(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "seg")
}

impl VFile for GatedFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_all(buf)?;
        if self.log {
            self.ctl.written.fetch_add(buf.len() as u64, SeqCst);
        }
        Ok(())
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, buf)?;
        if self.log {
            self.ctl.written.fetch_add(buf.len() as u64, SeqCst);
        }
        Ok(())
    }
    fn allocate(&mut self, len: u64) -> io::Result<()> {
        self.inner.allocate(len)
    }
    fn sync(&mut self) -> io::Result<()> {
        if self.log {
            self.ctl.syncs.fetch_add(1, SeqCst);
            while self.ctl.hold.load(SeqCst) {
                std::thread::sleep(Duration::from_micros(200));
            }
            if self.ctl.fail.load(SeqCst) {
                return Err(io::Error::from_raw_os_error(5));
            }
        }
        self.inner.sync()?;
        if self.log {
            self.ctl.synced.store(self.ctl.written.load(SeqCst), SeqCst);
        }
        Ok(())
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

impl GatedFs {
    fn wrap(&self, path: &Path, f: Box<dyn VFile>) -> Box<dyn VFile> {
        Box::new(GatedFile {
            inner: f,
            log: is_log(path),
            ctl: Arc::clone(&self.ctl),
        })
    }
}

impl Vfs for GatedFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        self.inner.lock_dir(dir)
    }
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn VFile>> {
        let f = self.inner.create_new(path)?;
        Ok(self.wrap(path, f))
    }
    fn open_write(&self, path: &Path) -> io::Result<Box<dyn VFile>> {
        let f = self.inner.open_write(path)?;
        Ok(self.wrap(path, f))
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.inner.read(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
    fn canonical(&self, path: &Path) -> io::Result<PathBuf> {
        self.inner.canonical(path)
    }
}

fn gated() -> (GatedFs, Arc<Control>) {
    let ctl = Arc::new(Control::default());
    let fs = GatedFs {
        inner: MemFs::new(),
        ctl: Arc::clone(&ctl),
    };
    (fs, ctl)
}

fn start_log(fs: &GatedFs) -> LogBuffer {
    start_log_with(fs, FlushPolicy::Eager)
}

fn start_log_with(fs: &GatedFs, policy: FlushPolicy) -> LogBuffer {
    let dir = PathBuf::from("/log");
    fs.create_dir_all(&dir).expect("mkdir");
    let cfg = LogConfig {
        vfs: Arc::new(fs.clone()),
        dir,
        capacity: 1 << 16,
        segment_size: 1 << 20,
        extra_latency: Duration::ZERO,
        policy,
    };
    LogBuffer::start(cfg, 0).expect("log starts")
}

fn record(i: u64) -> Vec<u8> {
    LogRecord::Commit {
        txn: i,
        writes: vec![Write {
            table: 0,
            key: format!("k{i}").into_bytes(),
            value: Some(vec![7; 40]),
        }],
    }
    .encode()
}

/// Polls until `f` holds (waits for states, never for times).
fn until(f: impl Fn() -> bool) {
    while !f() {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn every_committer_is_durable_when_its_wait_returns_and_flushes_are_shared() {
    let (fs, ctl) = gated();
    let log = Arc::new(start_log(&fs));
    let threads = 16;
    let per = 50;
    let go = Arc::new(Barrier::new(threads));
    let hs: Vec<_> = (0..threads as u64)
        .map(|t| {
            let (log, ctl, go) = (Arc::clone(&log), Arc::clone(&ctl), Arc::clone(&go));
            std::thread::spawn(move || {
                go.wait();
                for i in 0..per {
                    let (_, end) = log.insert(&record(t * 1000 + i)).expect("insert");
                    log.wait_durable(end).expect("durable");
                    assert!(log.durable() >= end);
                    assert!(
                        ctl.synced.load(SeqCst) >= end,
                        "the wait returned before the fsync that covers it"
                    );
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("committer");
    }
    assert_eq!(log.pending(), 0);
}

/// Waiters are served at once whatever the flush period: with a period of a minute, a
/// waiter the flusher missed (registered while it was busy, say, and never woke it) would
/// wait that minute, so every wait here must end long before. (A version of the flusher
/// that skipped the wake-up while busy and looked for waiters before sleeping hung here
/// when that look was left out.)
#[test]
fn no_waiter_is_missed_while_the_flusher_is_busy() {
    let (fs, _ctl) = gated();
    let log = Arc::new(start_log_with(
        &fs,
        FlushPolicy::Periodic(Duration::from_secs(60)),
    ));
    let started = std::time::Instant::now();
    let hs: Vec<_> = (0..8u64)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for i in 0..300 {
                    let (_, end) = log.insert(&record(t * 1000 + i)).expect("insert");
                    log.wait_durable(end).expect("durable");
                    assert!(log.durable() >= end);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("committer");
    }
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "a waiter slept until the periodic flush"
    );
    assert_eq!(log.pending(), 0);
}

#[test]
fn committers_that_arrive_during_a_flush_share_the_next_one() {
    let (fs, ctl) = gated();
    let log = Arc::new(start_log(&fs));
    let before = ctl.syncs.load(SeqCst);
    ctl.hold.store(true, SeqCst);
    let n = 16;
    let hs: Vec<_> = (0..n)
        .map(|i| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                let (_, end) = log.insert(&record(i)).expect("insert");
                log.wait_durable(end).expect("durable");
                end
            })
        })
        .collect();
    until(|| log.pending() == n as usize);
    // At most the flush held now (begun for the first records) and one more for the rest.
    ctl.hold.store(false, SeqCst);
    for h in hs {
        let end = h.join().expect("committer");
        assert!(ctl.synced.load(SeqCst) >= end);
    }
    let syncs = ctl.syncs.load(SeqCst) - before;
    assert!((1..=2).contains(&syncs), "{syncs} fsyncs for {n} commits");
}

#[test]
fn a_failed_fsync_is_reported_to_every_waiter_of_its_batch() {
    let (fs, ctl) = gated();
    let log = Arc::new(start_log(&fs));
    // The first flush is held: the waiters gather behind it.
    ctl.hold.store(true, SeqCst);
    let before = ctl.syncs.load(SeqCst);
    let (_, first) = log.insert(&record(0)).expect("insert");
    log.request_flush();
    until(|| ctl.syncs.load(SeqCst) == before + 1);
    let n = 12;
    let hs: Vec<_> = (1..=n)
        .map(|i| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                let (_, end) = log.insert(&record(i)).expect("insert");
                log.wait_durable(end)
            })
        })
        .collect();
    until(|| log.pending() == n as usize);
    ctl.fail.store(true, SeqCst);
    ctl.hold.store(false, SeqCst);
    for h in hs {
        let r = h.join().expect("waiter");
        assert!(r.is_err(), "a waiter of the failed batch was told durable");
    }
    assert!(log.wait_durable(first).is_err());
    assert!(log.check().is_err());
    assert!(
        log.durable() < first,
        "nothing of the failed flush is durable"
    );
}

#[allow(clippy::field_reassign_with_default)]
fn gated_db(fs: &GatedFs, admission: Admission, elr: Elr) -> Database {
    let mut o = Options::default();
    o.log = LogMode::Sync;
    o.elr = elr;
    o.admission = admission;
    o.lock_timeout = Duration::from_secs(10);
    Database::open_on(Arc::new(fs.clone()), Path::new("/db"), o).expect("open")
}

/// Sync commits of `n` threads while the log is held, then released with `fail`.
fn commits_behind_a_held_flush(elr: Elr, fail: bool) {
    let (fs, ctl) = gated();
    let db = Arc::new(gated_db(&fs, Admission::Limit(1), elr));
    let t = db.create_table("t").expect("table");
    ctl.hold.store(true, SeqCst);
    let n = 6;
    let hs: Vec<_> = (0..n)
        .map(|i| {
            let (db, t) = (Arc::clone(&db), t.clone());
            std::thread::spawn(move || {
                let mut tx = db.begin();
                tx.put(&t, format!("k{i}"), "v")?;
                tx.commit()
            })
        })
        .collect();
    let log = db.inner.log.as_ref().expect("a log");
    // All of them wait for the log at once, with one slot: a waiting committer holds none.
    until(|| log.pending() >= n);
    let s = db.admission_stats().expect("admission on");
    assert_eq!(s.running, 0, "a committer waiting for the log holds a slot");
    // Meanwhile another transaction runs (it reads nothing the committers wrote under 2PL
    // without ELR: those keys stay locked until durable).
    let other = db.run(|tx| tx.get(&t, "unrelated")).expect("runs");
    assert_eq!(other, None);
    ctl.fail.store(fail, SeqCst);
    ctl.hold.store(false, SeqCst);
    for h in hs {
        let r = h.join().expect("committer");
        assert_eq!(r.is_err(), fail, "{r:?}");
    }
    if fail {
        assert!(
            db.run(|tx| tx.get(&t, "k0")).is_err(),
            "the failed log refuses work"
        );
    } else {
        let end = log.released();
        assert!(ctl.synced.load(SeqCst) >= end);
        for i in 0..n {
            let v = db.run(|tx| tx.get(&t, format!("k{i}"))).expect("read");
            assert_eq!(v.as_deref(), Some(&b"v"[..]));
        }
        let s = db.admission_stats().expect("admission on");
        assert_eq!((s.running, s.waiting), (0, 0));
    }
}

#[test]
fn sync_committers_wait_for_one_flush_without_slots_sx_elr() {
    commits_behind_a_held_flush(Elr::Sx, false);
}

#[test]
fn sync_committers_wait_for_one_flush_without_slots_no_elr() {
    commits_behind_a_held_flush(Elr::Off, false);
}

#[test]
fn a_failed_flush_fails_every_waiting_commit_sx_elr() {
    commits_behind_a_held_flush(Elr::Sx, true);
}

#[test]
fn a_failed_flush_fails_every_waiting_commit_no_elr() {
    commits_behind_a_held_flush(Elr::Off, true);
}
