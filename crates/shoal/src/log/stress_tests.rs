//! Stress tests of the log under concurrency: ring wrap, segment rotation, failed I/O and checkpoints, with power-loss images.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use super::buffer::{FlushPolicy, LogBuffer, LogConfig};
use super::record::{LogRecord, Write};
use super::segment;
use crate::vfs::mem::MemFs;
use crate::vfs::Vfs;

const CAP: usize = 1 << 16;

fn start(fs: &MemFs, seg: u64, policy: FlushPolicy) -> LogBuffer {
    let dir = PathBuf::from("/log");
    fs.create_dir_all(&dir).unwrap();
    LogBuffer::start(
        LogConfig {
            vfs: Arc::new(fs.clone()),
            dir,
            capacity: CAP,
            segment_size: seg,
            extra_latency: Duration::ZERO,
            policy,
        },
        0,
    )
    .unwrap()
}

/// A commit record whose frame is exactly `size` bytes (size >= 42).
fn rec(txn: u64, size: usize) -> (LogRecord, Vec<u8>) {
    let r = LogRecord::Commit {
        txn,
        writes: vec![Write {
            table: 1,
            key: txn.to_le_bytes().to_vec(),
            value: Some(vec![(txn % 251) as u8; size - 42]),
        }],
    };
    let b = r.encode();
    assert_eq!(b.len(), size);
    (r, b)
}

fn replay_all(fs: &MemFs) -> (Vec<(u64, LogRecord)>, u64) {
    let mut out = Vec::new();
    let scan = segment::replay(fs, &PathBuf::from("/log"), 0, None, |lsn, r| {
        out.push((lsn, r));
        Ok(())
    })
    .unwrap();
    (out, scan.end)
}

#[test]
fn concurrent_inserts_of_odd_sizes_wrap_and_rotate_and_replay_in_order() {
    for policy in [
        FlushPolicy::Eager,
        FlushPolicy::Periodic(Duration::from_millis(1)),
    ] {
        let fs = MemFs::new();
        let log = Arc::new(start(&fs, 5000, policy));
        let sizes = [
            42usize,
            43,
            100,
            511,
            512,
            513,
            4096,
            CAP / 2,
            CAP / 2 + 1,
            CAP - 1,
            CAP,
            7777,
        ];
        let stop = Arc::new(AtomicBool::new(false));
        // A checker: durable D, then a power loss, must replay at least up to D.
        let checker = {
            let (fs, log, stop) = (fs.clone(), Arc::clone(&log), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut seed = 0;
                while !stop.load(SeqCst) {
                    let d = log.durable();
                    let after = fs.power_loss(seed);
                    seed += 1;
                    let (recs, end) = replay_all(&after);
                    assert!(end >= d, "power loss: log ends at {end} < durable {d}");
                    assert!(recs.windows(2).all(|w| w[0].0 < w[1].0));
                    std::thread::sleep(Duration::from_millis(2));
                }
                seed
            })
        };
        let threads = 6u64;
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let log = Arc::clone(&log);
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..60u64 {
                        let txn = t * 1000 + i;
                        let size = sizes[((t * 7 + i * 3) % sizes.len() as u64) as usize];
                        let (r, b) = rec(txn, size);
                        let (lsn, end) = log.insert(&b).unwrap();
                        assert_eq!(end - lsn, size as u64);
                        if i % 3 == 0 {
                            log.wait_durable(end).unwrap();
                            assert!(log.durable() >= end);
                        }
                        mine.push((lsn, r));
                    }
                    mine
                })
            })
            .collect();
        let mut all: Vec<(u64, LogRecord)> =
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
        stop.store(true, SeqCst);
        let _ = checker.join().unwrap();
        all.sort_by_key(|x| x.0);
        let end = log.released();
        log.wait_durable(end).unwrap();
        drop(log);
        let (got, _) = replay_all(&fs.snapshot());
        let got: Vec<_> = got
            .into_iter()
            .filter(|(_, r)| !matches!(r, LogRecord::Close))
            .collect();
        assert_eq!(got.len(), all.len());
        for (g, w) in got.iter().zip(&all) {
            assert_eq!(g.0, w.0);
            assert!(g.1 == w.1, "record at {} differs", g.0);
        }
    }
}

mod db_level {
    use std::collections::BTreeSet;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::keys_of;
    use crate::vfs::mem::{Fault, MemFs};
    use crate::{Admission, Database, Elr, LogMode, Options};

    fn opts(log: LogMode, elr: Elr, adm: Admission) -> Options {
        Options {
            log,
            elr,
            admission: adm,
            log_segment_size: 2000,
            lock_timeout: Duration::from_millis(500),
            ..Options::default()
        }
    }

    /// Threads commit unique keys while the file system fails operation `n`; every commit
    /// acknowledged must survive a power loss, and no thread may hang.
    fn run(log: LogMode, elr: Elr, adm: Admission, n: u64, fault: Fault, sticky: bool) {
        let fs = MemFs::new();
        let db = Arc::new(
            Database::open_on(Arc::new(fs.clone()), Path::new("/db"), opts(log, elr, adm)).unwrap(),
        );
        let t = db.create_table("t").unwrap();
        db.flush().unwrap();
        fs.fail_at(fs.ops() + n, fault, sticky);
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        let done = Arc::new(AtomicBool::new(false));
        let hs: Vec<_> = (0..4u64)
            .map(|th| {
                let (db, t, acked) = (Arc::clone(&db), t.clone(), Arc::clone(&acked));
                std::thread::spawn(move || {
                    for i in 0..25u64 {
                        let k = format!("k{th}-{i}");
                        let mut tx = db.begin();
                        if tx.put(&t, &k, "v").is_err() {
                            return;
                        }
                        let ok = match log {
                            LogMode::Pipelined => match tx.commit_pipelined() {
                                Ok(tk) => tk.wait().is_ok(),
                                Err(_) => false,
                            },
                            _ => tx.commit().is_ok(),
                        };
                        if ok {
                            acked.lock().unwrap().insert(k);
                        }
                    }
                })
            })
            .collect();
        let t0 = Instant::now();
        for h in hs {
            while !h.is_finished() {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "a committer hangs ({log:?} {elr:?} {adm:?}, {fault:?} at +{n})"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            h.join().unwrap();
        }
        done.store(true, SeqCst);
        let acked = acked.lock().unwrap().clone();
        drop(db);
        for seed in 0..3u64 {
            let after = fs.power_loss(seed);
            let db = Database::open_on(Arc::new(after), Path::new("/db"), opts(log, elr, adm))
                .unwrap_or_else(|e| panic!("reopen: {e} ({log:?} {elr:?}, {fault:?} at +{n})"));
            let rows = keys_of(&db);
            let lost: Vec<_> = acked.difference(&rows).collect();
            assert!(
                lost.is_empty(),
                "acknowledged commits lost after power loss {seed}: {lost:?} ({log:?} {elr:?} {adm:?}, {fault:?} at +{n}, sticky {sticky})"
            );
        }
    }

    #[test]
    fn concurrent_commits_with_a_failing_io_lose_no_acknowledged_commit() {
        for (log, elr) in [
            (LogMode::Sync, Elr::Off),
            (LogMode::Sync, Elr::Sx),
            (LogMode::Pipelined, Elr::Off),
        ] {
            for adm in [Admission::Off, Admission::Limit(1), Admission::Limit(2)] {
                for n in [0u64, 1, 2, 3, 5, 8, 13, 21, 34] {
                    for (fault, sticky) in [(Fault::Eio, false), (Fault::NoSpace, true)] {
                        run(log, elr, adm, n, fault, sticky);
                    }
                }
            }
        }
    }
}

mod ckpt_level {
    use std::collections::BTreeSet;
    use std::path::Path;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::keys_of;
    use crate::vfs::mem::MemFs;
    use crate::{ConcurrencyControl, Database, Elr, LogMode, Options};

    fn opts(cc: ConcurrencyControl, log: LogMode, elr: Elr) -> Options {
        Options {
            cc,
            log,
            elr,
            log_segment_size: 700,
            checkpoint_interval: Some(Duration::from_millis(3)),
            lock_timeout: Duration::from_millis(500),
            ..Options::default()
        }
    }

    #[test]
    fn checkpoints_under_concurrent_commits_keep_every_acknowledged_commit() {
        for (cc, log, elr) in [
            (ConcurrencyControl::TwoPhaseLocking, LogMode::Sync, Elr::Off),
            (ConcurrencyControl::TwoPhaseLocking, LogMode::Sync, Elr::Sx),
            (
                ConcurrencyControl::TwoPhaseLocking,
                LogMode::Pipelined,
                Elr::Off,
            ),
            (ConcurrencyControl::Optimistic, LogMode::Sync, Elr::Off),
        ] {
            let fs = MemFs::new();
            let db = Arc::new(
                Database::open_on(Arc::new(fs.clone()), Path::new("/db"), opts(cc, log, elr))
                    .unwrap(),
            );
            let t = db.create_table("t").unwrap();
            db.flush().unwrap();
            let acked = Arc::new(Mutex::new(BTreeSet::new()));
            let images = Arc::new(Mutex::new(Vec::new()));
            let hs: Vec<_> = (0..4u64)
                .map(|th| {
                    let (db, t, acked, fs, images) = (
                        Arc::clone(&db),
                        t.clone(),
                        Arc::clone(&acked),
                        fs.clone(),
                        Arc::clone(&images),
                    );
                    std::thread::spawn(move || {
                        for i in 0..150u64 {
                            let k = format!("k{th}-{i:03}");
                            let mut tx = db.begin();
                            tx.put(&t, &k, vec![b'v'; 40]).unwrap();
                            // and a shared hot key, updated by everyone
                            tx.put(&t, "hot", format!("{th}-{i}")).ok();
                            let ok = match log {
                                LogMode::Pipelined => {
                                    tx.commit_pipelined().and_then(|tk| tk.wait()).is_ok()
                                }
                                _ => tx.commit().is_ok(),
                            };
                            if ok {
                                acked.lock().unwrap().insert(k);
                            }
                            if th == 0 && i % 15 == 7 {
                                let a = acked.lock().unwrap().clone();
                                let img = fs.power_loss(i);
                                images.lock().unwrap().push((a, img));
                            }
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            let st = db.checkpoint_status();
            drop(db);
            let mut imgs = std::mem::take(&mut *images.lock().unwrap());
            imgs.push((acked.lock().unwrap().clone(), fs.power_loss(99)));
            for (n, (a, img)) in imgs.into_iter().enumerate() {
                let db = Database::open_on(Arc::new(img), Path::new("/db"), opts(cc, log, elr))
                    .unwrap_or_else(|e| panic!("image {n}: reopen: {e} ({cc:?} {log:?} {elr:?})"));
                let rows = keys_of(&db);
                let lost: Vec<_> = a.difference(&rows).collect();
                assert!(
                    lost.is_empty(),
                    "image {n}: lost {lost:?} ({cc:?} {log:?} {elr:?}) {st:?}"
                );
            }
            eprintln!("{cc:?} {log:?} {elr:?}: {st:?}");
        }
    }
}

/// The keys of table `t` of `db`, as text.
fn keys_of(db: &crate::Database) -> std::collections::BTreeSet<String> {
    let t = db.table("t").unwrap();
    db.run(|tx| tx.scan(&t, ..))
        .unwrap()
        .into_iter()
        .map(|(k, _)| String::from_utf8(k).unwrap())
        .collect()
}
