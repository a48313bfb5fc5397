//! Model-based random test of the public API: random single-threaded operation sequences
//! against a BTreeMap model, random commit/abort/drop, random checkpoints and reopens of a
//! durable database, under every concurrency control. Every read is compared with the model.
//!
//! SHOAL_MODEL_SEEDS=n (default 3) seeds per mode; SHOAL_MODEL_STEPS=n (default 400) txns.

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::{ConcurrencyControl, Database, Error, Options, Table, Transaction};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;
const TABLES: [&str; 2] = ["t0", "t1"];

fn gen_key(rng: &mut StdRng) -> Vec<u8> {
    let c = rng.gen_range(0u8..4);
    match rng.gen_range(0..7) {
        // Short keys.
        0 | 1 => vec![b'a' + c],
        // Keys sharing a 16-byte head, differing after it.
        2 => {
            let mut k = b"pppppppppppppppp".to_vec();
            for _ in 0..rng.gen_range(0..3) {
                k.push(b'x' + rng.gen_range(0u8..2));
            }
            k
        }
        // 40-byte keys differing only in the last byte.
        3 => {
            let mut k = vec![b'q'; 39];
            k.push(c);
            k
        }
        // Keys of the longest length, differing in the last byte / first bytes.
        4 => {
            let mut k = vec![b'm'; 4096];
            k[4095] = c;
            k
        }
        // Prefixes of one another, with zero and 0xff bytes.
        5 => {
            let mut k = vec![0u8, 0xff, 0];
            k.truncate(1 + (c as usize % 3));
            k
        }
        _ => {
            let mut k = vec![b'z'; 15 + c as usize];
            k.push(0);
            k
        }
    }
}

fn gen_value(rng: &mut StdRng) -> Vec<u8> {
    let len = match rng.gen_range(0..14) {
        0 => 0,
        1 => 1,
        2..=4 => 8,
        5 => 2047,
        6 => 2048,
        7 => 2049,
        8 => 2064,
        9 => 32 << 10,
        10 => (32 << 10) + 1,
        11 => 70_001,
        12 => 16,
        _ => rng.gen_range(0..300),
    };
    let b: u8 = rng.gen();
    (0..len).map(|i| b.wrapping_add(i as u8)).collect()
}

fn gen_int(rng: &mut StdRng) -> i64 {
    match rng.gen_range(0..6) {
        0 => i64::MAX,
        1 => i64::MIN,
        2 => i64::MAX - 1,
        _ => rng.gen_range(-1000..1000),
    }
}

fn gen_bound(rng: &mut StdRng) -> Bound<Vec<u8>> {
    match rng.gen_range(0..3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(gen_key(rng)),
        _ => Bound::Excluded(gen_key(rng)),
    }
}

fn int_of(v: &[u8]) -> Option<i64> {
    v.try_into().ok().map(i64::from_le_bytes)
}

fn short(k: &[u8]) -> String {
    if k.len() > 24 {
        format!(
            "{:?}..({} bytes, last {})",
            &k[..8],
            k.len(),
            k[k.len() - 1]
        )
    } else {
        format!("{k:?}")
    }
}

fn keys(rows: &[(Vec<u8>, Vec<u8>)]) -> Vec<String> {
    rows.iter()
        .map(|(k, v)| format!("{}={}b", short(k), v.len()))
        .collect()
}

fn in_range(lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>, k: &[u8]) -> bool {
    (lo.as_ref().map(|v| &v[..]), hi.as_ref().map(|v| &v[..])).contains(k)
}

fn model_scan(m: &Model, lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
    m.iter()
        .filter(|(k, _)| in_range(lo, hi, k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// One random operation in `tx`, checked against `m` (the transaction's view).
fn step(
    rng: &mut StdRng,
    tx: &mut Transaction<'_>,
    tables: &[Table],
    models: &mut [Model],
    log: &mut Vec<String>,
) {
    let ti = rng.gen_range(0..tables.len());
    let t = &tables[ti];
    let m = &mut models[ti];
    let key = gen_key(rng);
    let op = rng.gen_range(0..20);
    let ctx = |log: &Vec<String>| log[log.len().saturating_sub(30)..].join("\n");
    macro_rules! check {
        ($got:expr, $want:expr, $what:expr) => {{
            let (g, w) = ($got, $want);
            if g != w {
                panic!(
                    "{} on table {} key {}:\n got  {:?}\n want {:?}\nrecent:\n{}",
                    $what,
                    ti,
                    short(&key),
                    g,
                    w,
                    ctx(log)
                );
            }
        }};
    }
    match op {
        0 | 1 => {
            let v = gen_value(rng);
            log.push(format!("put t{ti} {} {}b", short(&key), v.len()));
            tx.put(t, &key, &v).expect("put");
            m.insert(key.clone(), v);
        }
        2 => {
            let v = gen_value(rng);
            log.push(format!("insert t{ti} {} {}b", short(&key), v.len()));
            let r = tx.insert(t, &key, &v);
            if m.contains_key(&key) {
                check!(
                    matches!(r, Err(Error::DuplicateKey { .. })),
                    true,
                    format!("insert dup {r:?}")
                );
            } else {
                r.expect("insert");
                m.insert(key.clone(), v);
            }
        }
        3 | 4 => {
            log.push(format!("delete t{ti} {}", short(&key)));
            let r = tx.delete(t, &key).expect("delete");
            check!(r, m.remove(&key).is_some(), "delete");
        }
        5 | 6 => {
            log.push(format!("get t{ti} {}", short(&key)));
            let g = tx.get(t, &key).expect("get");
            check!(
                g.as_ref().map(|v| v.len()),
                m.get(&key).map(|v| v.len()),
                "get len"
            );
            check!(g.as_ref(), m.get(&key), "get");
        }
        7 => {
            log.push(format!("get_for_update t{ti} {}", short(&key)));
            let g = tx.get_for_update(t, &key).expect("gfu");
            check!(g.as_ref(), m.get(&key), "get_for_update");
        }
        8 => {
            log.push(format!("get_i64 t{ti} {}", short(&key)));
            let g = tx.get_i64(t, &key);
            match m.get(&key) {
                None => check!(g.ok(), Some(None), "get_i64 none"),
                Some(v) => match int_of(v) {
                    Some(i) => check!(g.ok(), Some(Some(i)), "get_i64"),
                    None => check!(
                        matches!(g, Err(Error::NotAnInteger { .. })),
                        true,
                        "get_i64 not int"
                    ),
                },
            }
        }
        9..=13 => {
            let n = gen_int(rng);
            let which = op - 9; // 0 add_and_get 1 add 2 max/min_and_get 3 max/min 4 min
            let cur = m.get(&key).map(|v| int_of(v).ok_or(v.len()));
            let f: fn(Option<i64>, i64) -> Option<i64> = match which {
                0 | 1 => |c, n| c.unwrap_or(0).checked_add(n),
                2 | 3 => |c, n| Some(c.map_or(n, |c| c.max(n))),
                _ => |c, n| Some(c.map_or(n, |c| c.min(n))),
            };
            let want: Result<i64, &str> = match cur {
                Some(Err(_)) => Err("NotAnInteger"),
                Some(Ok(c)) => f(Some(c), n).ok_or("Overflow"),
                None => f(None, n).ok_or("Overflow"),
            };
            log.push(format!(
                "intop{which} t{ti} {} {n} (cur {cur:?})",
                short(&key)
            ));
            let got: Result<Option<i64>, Error> = match which {
                0 => tx.add_and_get(t, &key, n).map(Some),
                1 => tx.add(t, &key, n).map(|()| None),
                2 => tx.max_and_get(t, &key, n).map(Some),
                3 => tx.max(t, &key, n).map(|()| None),
                _ => {
                    if rng.gen() {
                        tx.min_and_get(t, &key, n).map(Some)
                    } else {
                        tx.min(t, &key, n).map(|()| None)
                    }
                }
            };
            match (&want, got) {
                (Ok(w), Ok(g)) => {
                    if let Some(g) = g {
                        check!(g, *w, "int op result");
                    }
                    m.insert(key.clone(), w.to_le_bytes().to_vec());
                }
                (Err("NotAnInteger"), Err(Error::NotAnInteger { .. })) => {}
                (Err("Overflow"), Err(Error::Overflow { .. })) => {}
                (w, g) => check!(format!("{g:?}"), format!("{w:?}"), "int op"),
            }
        }
        14 => {
            let extra: u8 = rng.gen();
            let replace = rng.gen_bool(0.3);
            let newv = gen_value(rng);
            log.push(format!("update t{ti} {} replace={replace}", short(&key)));
            let mut seen: Option<Option<Vec<u8>>> = None;
            let n = tx
                .update(t, &key, |cur| {
                    seen = Some(cur.map(<[u8]>::to_vec));
                    if replace {
                        newv.clone()
                    } else {
                        let mut v = cur.unwrap_or_default().to_vec();
                        v.push(extra);
                        v
                    }
                })
                .expect("update");
            check!(
                seen.as_ref().map(|s| s.as_ref()),
                Some(m.get(&key)),
                "update saw"
            );
            let mut v = m.get(&key).cloned().unwrap_or_default();
            if replace {
                v = newv.clone();
            } else {
                v.push(extra);
            }
            check!(n, v.len(), "update len");
            m.insert(key.clone(), v);
        }
        _ => {
            let lo = gen_bound(rng);
            let hi = gen_bound(rng);
            let r = (lo.clone(), hi.clone());
            let want = model_scan(m, &lo, &hi);
            let limit = rng.gen_range(0..4);
            let kind = op - 15;
            log.push(format!(
                "scan{kind} t{ti} {:?}..{:?} limit {limit}",
                lo.as_ref().map(|k| short(k)),
                hi.as_ref().map(|k| short(k))
            ));
            let (got, want) = match kind {
                0 | 1 => (tx.scan(t, r).expect("scan"), want),
                2 => (
                    tx.scan_limit(t, r, limit).expect("scan_limit"),
                    want.into_iter().take(limit).collect(),
                ),
                3 => (
                    tx.scan_rev(t, r).expect("scan_rev"),
                    want.into_iter().rev().collect(),
                ),
                _ => (
                    tx.scan_rev_limit(t, r, limit).expect("scan_rev_limit"),
                    want.into_iter().rev().take(limit).collect(),
                ),
            };
            check!(keys(&got), keys(&want), format!("scan kind {kind}"));
            check!(got, want, format!("scan values kind {kind}"));
        }
    }
}

fn open(dir: Option<&std::path::Path>, opts: &Options) -> (Database, Vec<Table>) {
    let db = match dir {
        Some(d) => Database::open(d, opts.clone()).expect("open"),
        None => Database::in_memory_with(opts.clone()),
    };
    let tables = TABLES
        .iter()
        .map(|n| db.table(n).or_else(|_| db.create_table(n)).expect("table"))
        .collect();
    (db, tables)
}

fn check_all(db: &Database, tables: &[Table], committed: &[Model], what: &str) {
    let mut tx = db.begin();
    for (i, t) in tables.iter().enumerate() {
        let got = tx.scan(t, ..).expect("scan all");
        let want = model_scan(&committed[i], &Bound::Unbounded, &Bound::Unbounded);
        assert_eq!(keys(&got), keys(&want), "{what}: table {i} keys");
        assert!(got == want, "{what}: table {i} values differ");
        for (k, v) in &committed[i] {
            assert_eq!(tx.get(t, k).expect("get").as_ref(), Some(v), "{what}: get");
        }
    }
    tx.commit().expect("commit check");
}

fn run_model(cc: ConcurrencyControl, durable: bool, seed: u64, txns: usize) {
    run_model_with(Options::default().with_cc(cc), durable, seed, txns)
}

fn run_model_with(opts: Options, durable: bool, seed: u64, txns: usize) {
    let cc = opts.cc;
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = durable.then(|| dir.path());
    let (mut db, mut tables) = open(path, &opts);
    let mut committed: Vec<Model> = vec![Model::new(); TABLES.len()];
    let mut log: Vec<String> = Vec::new();
    for n in 0..txns {
        let mut view = committed.clone();
        let mut tx = db.begin();
        log.push(format!("-- txn {n} ({})", tx.id()));
        for _ in 0..rng.gen_range(0..12) {
            step(&mut rng, &mut tx, &tables, &mut view, &mut log);
            if durable && rng.gen_range(0..40) == 0 {
                log.push("checkpoint inside txn".into());
                let r = db.checkpoint();
                if cc == ConcurrencyControl::Serial {
                    assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
                } else {
                    r.expect("checkpoint inside txn");
                }
            }
        }
        match rng.gen_range(0..10) {
            0 => {
                log.push("abort".into());
                tx.abort();
            }
            1 => {
                log.push("drop".into());
                drop(tx);
            }
            _ => {
                log.push("commit".into());
                tx.commit()
                    .unwrap_or_else(|e| panic!("commit: {e}\n{}", log.join("\n")));
                committed = view;
            }
        }
        if durable && rng.gen_range(0..15) == 0 {
            log.push("checkpoint".into());
            db.checkpoint().expect("checkpoint");
        }
        if durable && rng.gen_range(0..12) == 0 {
            log.push("reopen".into());
            check_all(&db, &tables, &committed, "before reopen");
            drop(tables);
            drop(db);
            (db, tables) = open(path, &opts);
            check_all(
                &db,
                &tables,
                &committed,
                &format!("after reopen at txn {n} seed {seed}"),
            );
        }
    }
    check_all(&db, &tables, &committed, "end");
    if durable {
        drop(tables);
        drop(db);
        let (db, tables) = open(path, &opts);
        check_all(&db, &tables, &committed, "final reopen");
    }
}

fn env(name: &str, d: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(d)
}

fn all(cc: ConcurrencyControl, durable: bool) {
    let base = env("SHOAL_MODEL_SEED", 1);
    for s in base..base + env("SHOAL_MODEL_SEEDS", 3) {
        run_model(cc, durable, s, env("SHOAL_MODEL_STEPS", 300) as usize);
    }
}

#[test]
fn model_2pl_memory() {
    all(ConcurrencyControl::TwoPhaseLocking, false);
}
#[test]
fn model_occ_memory() {
    all(ConcurrencyControl::Optimistic, false);
}
#[test]
fn model_doppel_memory() {
    all(ConcurrencyControl::Doppel, false);
}
#[test]
fn model_serial_memory() {
    all(ConcurrencyControl::Serial, false);
}
#[test]
fn model_2pl_durable() {
    all(ConcurrencyControl::TwoPhaseLocking, true);
}
#[test]
fn model_occ_durable() {
    all(ConcurrencyControl::Optimistic, true);
}
#[test]
fn model_doppel_durable() {
    all(ConcurrencyControl::Doppel, true);
}
#[test]
fn model_serial_durable() {
    all(ConcurrencyControl::Serial, true);
}

fn all_with(opts: Options) {
    let base = env("SHOAL_MODEL_SEED", 1);
    for s in base..base + env("SHOAL_MODEL_SEEDS", 3) {
        run_model_with(
            opts.clone(),
            true,
            s,
            env("SHOAL_MODEL_STEPS", 300) as usize,
        );
    }
}
#[test]
fn model_2pl_async_elr_sx() {
    all_with(
        Options::default()
            .with_log(shoal::LogMode::Async)
            .with_elr(shoal::Elr::Sx),
    );
}
#[test]
fn model_2pl_pipelined_elr_shared_latchfree() {
    all_with(
        Options::default()
            .with_log(shoal::LogMode::Pipelined)
            .with_elr(shoal::Elr::Shared)
            .with_lock_table(shoal::LockTableKind::LatchFree)
            .with_intent_locks(shoal::IntentLockKind::LockTable),
    );
}
#[test]
fn model_occ_async_small_segments() {
    all_with(
        Options::default()
            .with_cc(ConcurrencyControl::Optimistic)
            .with_log(shoal::LogMode::Async)
            .with_log_segment_size(64 << 10),
    );
}
#[test]
fn model_doppel_pipelined() {
    all_with(
        Options::default()
            .with_cc(ConcurrencyControl::Doppel)
            .with_log(shoal::LogMode::Pipelined),
    );
}
#[test]
fn model_2pl_lomet_waitdie_latched() {
    all_with(
        Options::default()
            .with_key_range_modes(shoal::KeyRangeModes::Lomet)
            .with_deadlock(shoal::DeadlockPolicy::WaitDie)
            .with_lock_table(shoal::LockTableKind::Latched),
    );
}
#[test]
fn model_2pl_sx_dreadlocks_elr_sx() {
    all_with(
        Options::default()
            .with_key_range_modes(shoal::KeyRangeModes::SharedExclusive)
            .with_deadlock(shoal::DeadlockPolicy::Dreadlocks(
                shoal::WaitStyle::SleepBackoff,
            ))
            .with_elr(shoal::Elr::Sx)
            .with_admission(shoal::Admission::Limit(1)),
    );
}
