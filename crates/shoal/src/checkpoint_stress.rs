//! Stress tests: checkpoints and crash recovery under concurrent commits, with process crashes,
//! power losses and injected I/O errors (MemFs); set `CKPT_REPS` for more repetitions.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::doppel::SplitOp;
use crate::vfs::mem::MemFs;
use crate::{ConcurrencyControl, Database, DeadlockPolicy, Elr, LogMode, Options};

const DIR: &str = "/db";
const LOGDIR: &str = "/log";
const ACCTS: u64 = 8;
const THREADS: usize = 3;

#[derive(Clone, Copy, Debug)]
struct Cfg {
    cc: ConcurrencyControl,
    log: LogMode,
    elr: Elr,
    sep_log: bool,
}

fn opts(c: Cfg) -> Options {
    let mut o = Options {
        cc: c.cc,
        log: c.log,
        elr: c.elr,
        deadlock: DeadlockPolicy::NoWait,
        log_segment_size: 2048,
        async_flush_delay: Duration::from_millis(1),
        lock_timeout: Duration::from_millis(200),
        ..Options::default()
    };
    o.doppel.split_phase = Duration::from_millis(2);
    if c.sep_log {
        o.log_dir = Some(LOGDIR.into());
    }
    o
}

fn open(fs: &MemFs, c: Cfg) -> crate::Result<Database> {
    Database::open_on(Arc::new(fs.clone()), Path::new(DIR), opts(c))
}

/// Checks one crash image: reopens, the accounts sum to 0, `hot` equals the done keys, and
/// every acknowledged commit of every thread is there (each thread's done keys a prefix).
fn check_image(fs: &MemFs, c: Cfg, acked: &[u64], tables_acked: u64, how: &str) {
    let db = open(fs, c).unwrap_or_else(|e| panic!("{c:?} {how}: reopen failed: {e}"));
    let t = db.table("t").unwrap_or_else(|e| panic!("{c:?} {how}: {e}"));
    let rows = db.run(|tx| tx.scan(&t, ..)).unwrap();
    let mut sum = 0i64;
    let mut hot = 0i64;
    let mut done = vec![Vec::new(); THREADS];
    for (k, v) in &rows {
        if k.starts_with(b"acct") {
            sum += i64::from_le_bytes(v[..8].try_into().unwrap());
        } else if k == b"hot" {
            hot = i64::from_le_bytes(v[..8].try_into().unwrap());
        } else if k.starts_with(b"done") {
            let s = std::str::from_utf8(k).unwrap();
            let mut p = s[4..].split('-');
            let th: usize = p.next().unwrap().parse().unwrap();
            let n: u64 = p.next().unwrap().parse().unwrap();
            done[th].push(n);
        }
    }
    assert_eq!(sum, 0, "{c:?} {how}: accounts sum to {sum}");
    let ndone: usize = done.iter().map(Vec::len).sum();
    assert_eq!(
        hot, ndone as i64,
        "{c:?} {how}: hot {hot} vs {ndone} done keys"
    );
    for (th, d) in done.iter_mut().enumerate() {
        d.sort();
        let m = d.len() as u64;
        assert!(
            d.iter().enumerate().all(|(i, &n)| n == i as u64 + 1),
            "{c:?} {how}: thread {th} done keys not a prefix: {:?}",
            &d[..d.len().min(20)]
        );
        assert!(
            m >= acked[th],
            "{c:?} {how}: thread {th}: {m} survive, {} acked",
            acked[th]
        );
    }
    for i in 0..tables_acked {
        let name = format!("x{i}");
        let tx = db
            .table(&name)
            .unwrap_or_else(|e| panic!("{c:?} {how}: table {name}: {e}"));
        let v = db.run(|q| q.get(&tx, "k")).unwrap();
        assert_eq!(v.as_deref(), Some(&b"v"[..]), "{c:?} {how}: row of {name}");
    }
}

fn stress(c: Cfg, rounds: usize, seed: u64) {
    stress_fault(c, rounds, seed, None)
}

fn stress_fault(c: Cfg, rounds: usize, seed: u64, fault: Option<u64>) {
    let fs = MemFs::new();
    let db = open(&fs, c).unwrap();
    let t = db.create_table("t").unwrap();
    db.run(|tx| {
        for a in 0..ACCTS {
            tx.put(&t, format!("acct{a}"), 0i64.to_le_bytes())?;
        }
        tx.put(&t, "hot", 0i64.to_le_bytes())
    })
    .unwrap();
    db.flush().unwrap();
    if c.cc == ConcurrencyControl::Doppel {
        db.split_hint(&t, "hot", SplitOp::Add).unwrap();
    }
    if let Some(n) = fault {
        fs.fail_at(fs.ops() + n, crate::vfs::mem::Fault::Eio, false);
    }
    let stop = AtomicBool::new(false);
    let acked: Vec<AtomicU64> = (0..THREADS).map(|_| AtomicU64::new(0)).collect();
    let tables_acked = AtomicU64::new(0);
    let mut images = Vec::new();
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let (db, t, stop, acked) = (&db, &t, &stop, &acked);
            s.spawn(move || {
                let mut n = 0u64;
                let mut x = seed ^ (th as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let (a, b) = (x % ACCTS, (x >> 8) % ACCTS);
                    let amt = (x >> 16) as i64 % 100;
                    let r = db.run(|tx| {
                        tx.add(t, "hot", 1)?;
                        let va = tx.get_i64(t, format!("acct{a}"))?.unwrap();
                        tx.put(t, format!("acct{a}"), (va - amt).to_le_bytes())?;
                        let vb = tx.get_i64(t, format!("acct{b}"))?.unwrap();
                        tx.put(t, format!("acct{b}"), (vb + amt).to_le_bytes())?;
                        tx.put(t, format!("done{th}-{n}"), b"")
                    });
                    // With a retry budget, a commit may fail for good: not counted.
                    match r {
                        Ok(()) => {}
                        Err(e) if e.is_retryable() => {
                            n -= 1;
                            continue;
                        }
                        Err(e) if fault.is_some() => {
                            let _ = e;
                            break;
                        }
                        Err(e) => panic!("{e}"),
                    }
                    match c.log {
                        LogMode::Async | LogMode::Pipelined => {
                            if n.is_multiple_of(4) {
                                if db.flush().is_err() {
                                    break;
                                }
                                acked[th].store(n, Ordering::SeqCst);
                            }
                        }
                        _ => acked[th].store(n, Ordering::SeqCst),
                    }
                }
            });
        }
        {
            let (db, stop, tables_acked) = (&db, &stop, &tables_acked);
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) && i < 30 {
                    let Ok(x) = db.create_table(&format!("x{i}")) else {
                        break;
                    };
                    if db.run(|tx| tx.put(&x, "k", "v")).is_err() {
                        break;
                    }
                    if db.flush().is_err() {
                        break;
                    }
                    i += 1;
                    tables_acked.store(i, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(3));
                }
            });
        }
        {
            let (db, stop) = (&db, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let r = db.checkpoint();
                    if fault.is_none() {
                        r.unwrap();
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
        }
        for r in 0..rounds {
            std::thread::sleep(Duration::from_millis(15 + (r as u64 * 7) % 11));
            let a: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
            let ta = tables_acked.load(Ordering::SeqCst);
            images.push((format!("crash {r}"), a.clone(), ta, fs.snapshot()));
            images.push((
                format!("power loss {r}"),
                a,
                ta,
                fs.power_loss(seed.wrapping_add(r as u64)),
            ));
        }
        stop.store(true, Ordering::Relaxed);
    });
    drop(db);
    let a: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    images.push((
        "clean".into(),
        a,
        tables_acked.load(Ordering::SeqCst),
        fs.snapshot(),
    ));
    for (how, a, ta, img) in images {
        check_image(&img, c, &a, ta, &how);
        // Recovery twice: reopen the image recovered once, after a power loss.
        let after = img.power_loss(seed ^ 77);
        check_image(&after, c, &a, ta, &format!("{how}, reopened twice"));
    }
}

fn all() -> Vec<Cfg> {
    use ConcurrencyControl::*;
    let mut v = Vec::new();
    for sep_log in [false, true] {
        for (cc, log, elr) in [
            (TwoPhaseLocking, LogMode::Sync, Elr::Off),
            (TwoPhaseLocking, LogMode::Sync, Elr::Sx),
            (TwoPhaseLocking, LogMode::Pipelined, Elr::Off),
            (TwoPhaseLocking, LogMode::Async, Elr::Off),
            (Optimistic, LogMode::Sync, Elr::Off),
            (Optimistic, LogMode::Async, Elr::Off),
            (Doppel, LogMode::Sync, Elr::Off),
            (Doppel, LogMode::Async, Elr::Off),
            (Serial, LogMode::Sync, Elr::Off),
        ] {
            v.push(Cfg {
                cc,
                log,
                elr,
                sep_log,
            });
        }
    }
    v
}

#[test]
fn concurrent_commits_checkpoints_and_crashes_lose_nothing() {
    let reps: u64 = std::env::var("CKPT_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for r in 0..reps {
        for (i, c) in all().into_iter().enumerate() {
            eprintln!("{c:?}");
            stress(c, 3, 1000 + i as u64 + 100 * r);
        }
    }
}

#[test]
fn concurrent_commits_checkpoints_and_one_io_error_lose_nothing() {
    let reps: u64 = std::env::var("CKPT_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for (i, c) in all().into_iter().enumerate() {
        for r in 0..reps {
            for n in [3u64, 10, 25, 60, 120] {
                eprintln!("{c:?} fault at +{n}");
                stress_fault(c, 2, 5000 + i as u64 + 31 * n + 1000 * r, Some(n + r * 7));
            }
        }
    }
}

/// Many tables, long keys and overflow-sized values, some keys held locked by an uncommitted
/// transaction during the checkpoint (their values come from the log), then two crashes.
#[test]
fn large_checkpoint_with_busy_keys_round_trips() {
    let fs = MemFs::new();
    let c = Cfg {
        cc: ConcurrencyControl::TwoPhaseLocking,
        log: LogMode::Sync,
        elr: Elr::Off,
        sep_log: true,
    };
    let mut model = std::collections::BTreeMap::new();
    {
        let db = open(&fs, c).unwrap();
        let mut tables = Vec::new();
        for i in 0..300u32 {
            tables.push(db.create_table(&format!("t{i:04}")).unwrap());
        }
        for (i, t) in tables.iter().enumerate() {
            let n = if i % 50 == 0 { 40 } else { 2 };
            db.run(|tx| {
                for j in 0..n {
                    let k = format!("{j:05}-{}", "k".repeat(if j % 7 == 0 { 3000 } else { 10 }));
                    let len = if j % 3 == 0 { 200_000 } else { 50 };
                    let v = vec![(i + j) as u8; len];
                    tx.put(t, &k, &v)?;
                }
                Ok(())
            })
            .unwrap();
            for j in 0..n {
                let k = format!("{j:05}-{}", "k".repeat(if j % 7 == 0 { 3000 } else { 10 }));
                let len = if j % 3 == 0 { 200_000 } else { 50 };
                model.insert((i, k.into_bytes()), vec![(i + j) as u8; len]);
            }
        }
        db.checkpoint().unwrap();
        // Update some keys after the first checkpoint, then hold them locked (uncommitted).
        db.run(|tx| tx.put(&tables[0], "00000-kkk", vec![9u8; 300_000]))
            .unwrap();
        model.insert((0, b"00000-kkk".to_vec()), vec![9u8; 300_000]);
        db.run(|tx| tx.delete(&tables[50], format!("00001-{}", "k".repeat(10))))
            .unwrap();
        model.remove(&(50, format!("00001-{}", "k".repeat(10)).into_bytes()));
        let mut holder = db.begin();
        holder.put(&tables[0], "00000-kkk", vec![7u8; 10]).unwrap();
        holder
            .put(&tables[50], format!("00001-{}", "k".repeat(10)), b"ghost")
            .unwrap();
        holder.put(&tables[100], "00000-kkk", b"x").unwrap();
        db.checkpoint().unwrap();
        db.checkpoint().unwrap();
        holder.abort();
        db.run(|tx| tx.put(&tables[299], "late", b"late")).unwrap();
        model.insert((299, b"late".to_vec()), b"late".to_vec());
        // crash
        let img = fs.power_loss(3);
        for (how, img) in [("power loss", img.clone()), ("twice", img.power_loss(4))] {
            let db = open(&img, c).unwrap_or_else(|e| panic!("{how}: {e}"));
            let mut got = std::collections::BTreeMap::new();
            for i in 0..300usize {
                let t = db.table(&format!("t{i:04}")).unwrap();
                for (k, v) in db.run(|tx| tx.scan(&t, ..)).unwrap() {
                    got.insert((i, k), v);
                }
            }
            let diff: Vec<_> = model
                .iter()
                .filter(|(k, v)| got.get(*k) != Some(*v))
                .map(|(k, _)| {
                    (
                        k.0,
                        String::from_utf8_lossy(&k.1[..20.min(k.1.len())]).to_string(),
                    )
                })
                .chain(got.keys().filter(|k| !model.contains_key(*k)).map(|k| {
                    (
                        k.0,
                        format!(
                            "extra {}",
                            String::from_utf8_lossy(&k.1[..20.min(k.1.len())])
                        ),
                    )
                }))
                .collect();
            assert!(diff.is_empty(), "{how}: {diff:?}");
        }
        drop(db);
    }
}
