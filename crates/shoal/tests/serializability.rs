//! Serializability of random transactions, checked on the direct serialization graph of the
//! recorded history (`common::dsg`).
//!
//! Several threads run random transactions of 2-5 operations on a few keys. Every value
//! written is unique (it carries the writer's test-assigned id and a sequence number), every
//! write first reads the key in the same transaction, so the history names for each read the
//! version seen and for each write the version overwritten. The checker builds ww / wr / rw
//! edges and fails on any cycle, printing it. A variant mixes range scans (ascending and
//! descending, all kinds of bounds) over keys that start absent.
//!
//! The checker itself is tested first on hand-made histories.

mod common;

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, Table};

use common::dsg::{find_cycle, v, History, Recorder, TxnRecord, Version, Violation};
use common::{mode_name, modes, KeyRange};

// ---------------------------------------------------------------------------------------
// The checker on hand-made histories.

const I: Version = Version::INITIAL;

fn expect_cycle(h: &History, class: &str, len: usize) {
    match h.check() {
        Err(Violation::Cycle { class: c, edges }) => {
            assert_eq!(c, class, "class of the cycle {edges:?}");
            assert_eq!(edges.len(), len, "length of the cycle {edges:?}");
            for w in edges.windows(2) {
                assert_eq!(w[0].to, w[1].from, "edges chain: {edges:?}");
            }
            assert_eq!(edges.last().expect("edges").to, edges[0].from, "closed");
        }
        other => panic!("expected a {class} cycle, got {other:?}"),
    }
}

#[test]
fn checker_finds_write_skew() {
    // Both read x and y initial, T1 writes x, T2 writes y: T1 -rw(y)-> T2 -rw(x)-> T1.
    let mut h = History::new();
    h.push(TxnRecord::new(1).r("x", I).r("y", I).w("x", v(1, 1), I));
    h.push(TxnRecord::new(2).r("x", I).r("y", I).w("y", v(2, 1), I));
    expect_cycle(&h, "G2", 2);
}

#[test]
fn checker_finds_read_skew() {
    // T1 reads x initial, T2 writes x and y, T1 reads T2's y: T1 -rw-> T2 -wr-> T1.
    let mut h = History::new();
    h.push(TxnRecord::new(1).r("x", I).r("y", v(2, 2)));
    h.push(
        TxnRecord::new(2)
            .r("x", I)
            .w("x", v(2, 1), I)
            .r("y", I)
            .w("y", v(2, 2), I),
    );
    expect_cycle(&h, "G-single", 2);
}

#[test]
fn checker_finds_write_cycle() {
    // T2 overwrote T1's x, T1 overwrote T2's y: G0.
    let mut h = History::new();
    h.push(
        TxnRecord::new(1)
            .w("x", v(1, 1), I)
            .w("y", v(1, 2), v(2, 2)),
    );
    h.push(
        TxnRecord::new(2)
            .w("x", v(2, 1), v(1, 1))
            .w("y", v(2, 2), I),
    );
    expect_cycle(&h, "G0", 2);
}

#[test]
fn checker_finds_circular_information_flow() {
    let mut h = History::new();
    h.push(TxnRecord::new(1).w("x", v(1, 1), I).r("y", v(2, 1)));
    h.push(TxnRecord::new(2).w("y", v(2, 1), I).r("x", v(1, 1)));
    expect_cycle(&h, "G1c", 2);
}

#[test]
fn checker_finds_lost_update() {
    let mut h = History::new();
    h.push(TxnRecord::new(1).r("x", I).w("x", v(1, 1), I));
    h.push(TxnRecord::new(2).r("x", I).w("x", v(2, 1), I));
    assert!(
        matches!(h.check(), Err(Violation::ForkedVersion { .. })),
        "{:?}",
        h.check()
    );
}

#[test]
fn checker_finds_aborted_and_intermediate_reads() {
    let mut h = History::new();
    h.push(TxnRecord::new(1).r("x", v(9, 1)));
    assert!(
        matches!(h.check(), Err(Violation::AbortedRead { reader: 1, .. })),
        "{:?}",
        h.check()
    );
    let mut h = History::new();
    h.push(
        TxnRecord::new(1)
            .w("x", v(1, 1), I)
            .w("x", v(1, 2), v(1, 1)),
    );
    h.push(TxnRecord::new(2).r("x", v(1, 1)));
    assert!(
        matches!(
            h.check(),
            Err(Violation::IntermediateRead { reader: 2, .. })
        ),
        "{:?}",
        h.check()
    );
}

#[test]
fn checker_finds_long_cycle() {
    // A ww chain T1 -> T2 -> ... -> T50 on x, closed by T50 reading y initial, which T1
    // overwrote: T50 -rw-> T1.
    let mut h = History::new();
    h.push(TxnRecord::new(1).w("x", v(1, 1), I).w("y", v(1, 2), I));
    for t in 2..=50 {
        h.push(TxnRecord::new(t).w("x", v(t, 1), v(t - 1, 1)));
    }
    h.push(TxnRecord::new(51).r("z", I)); // unrelated
    h.txns[49].reads.push(("y".to_string(), I));
    expect_cycle(&h, "G-single", 50);
}

#[test]
fn checker_accepts_serializable_histories() {
    // Serial: T1 then T2 then T3.
    let mut h = History::new();
    h.push(TxnRecord::new(1).r("x", I).w("x", v(1, 1), I));
    h.push(
        TxnRecord::new(2)
            .r("x", v(1, 1))
            .w("x", v(2, 1), v(1, 1))
            .r("y", I),
    );
    h.push(TxnRecord::new(3).r("y", I).r("x", v(2, 1)));
    let s = h.check().expect("serial history");
    assert_eq!((s.txns, s.ww, s.wr), (3, 1, 2));
    // Not serial but serializable: T1 read x before T2 overwrote it, both wrote their own
    // keys: only T1 -rw-> T2.
    let mut h = History::new();
    h.push(TxnRecord::new(2).r("x", I).w("x", v(2, 1), I));
    h.push(TxnRecord::new(1).r("x", I).r("y", I).w("z", v(1, 1), I));
    let s = h.check().expect("serializable history");
    assert_eq!(s.rw, 1);
    assert!(find_cycle(&[]).is_none());
    assert_eq!(h.final_versions()["x"], v(2, 1));
}

#[test]
fn checker_treats_adds_as_commutative_writes() {
    // Concurrent adders of one counter conflict with nobody; a reader sees a prefix of them.
    let mut h = History::new();
    h.push(TxnRecord::new(1).add("c", 0));
    h.push(TxnRecord::new(2).add("c", 1));
    h.push(TxnRecord::new(3).sum("c", 0b01).r("x", I));
    h.push(TxnRecord::new(4).sum("c", 0b11));
    let stats = h.check().expect("serializable");
    assert_eq!((stats.wr, stats.rw), (3, 1), "{stats:?}");
    assert_eq!(h.final_sums()["c"], 0b11);
    // Write skew through two split counters: each reads the other's counter without the
    // other's add.
    let mut h = History::new();
    h.push(TxnRecord::new(1).sum("c", 0).add("d", 0));
    h.push(TxnRecord::new(2).sum("d", 0).add("c", 0));
    expect_cycle(&h, "G2", 2);
    // A reader that saw T1's add on c but not T1's write of x: read skew.
    let mut h = History::new();
    h.push(TxnRecord::new(1).add("c", 5).w("x", v(1, 1), I));
    h.push(TxnRecord::new(2).sum("c", 1 << 5).r("x", I));
    expect_cycle(&h, "G-single", 2);
    // A bit nobody (committed) added: an aborted read.
    let mut h = History::new();
    h.push(TxnRecord::new(1).add("c", 0));
    h.push(TxnRecord::new(2).sum("c", 0b10));
    assert!(
        matches!(h.check(), Err(Violation::AbortedRead { reader: 2, .. })),
        "{:?}",
        h.check()
    );
}

// ---------------------------------------------------------------------------------------
// Random workloads.

const KEYS: usize = 8;
const THREADS: usize = 4;
const DURATION: Duration = Duration::from_millis(1000);

/// Transactions with test ids in one block of `EPOCH` work on that block's own `KEYS` keys,
/// which start absent: so keys keep being created into scanned ranges and absent keys keep
/// being read all through the run (with a fixed key set every key exists after a few
/// milliseconds and phantoms could no longer happen).
const EPOCH: u64 = 256;

fn key(epoch: u64, i: usize) -> String {
    format!("e{epoch:06}/k{i}")
}

struct Shared {
    next_id: AtomicU64,
    history: Mutex<History>,
    aborts: AtomicU64,
    scans: AtomicU64,
}

/// A random range inside the key space of `epoch`: bounds on its keys, inclusive or
/// exclusive, or the epoch's own low / high fence (standing in for unbounded ends).
fn random_range(rng: &mut StdRng, epoch: u64) -> KeyRange {
    let a = rng.gen_range(0..KEYS);
    let b = rng.gen_range(a..=KEYS);
    let (ka, kb) = (key(epoch, a).into_bytes(), key(epoch, b).into_bytes());
    let lo = match rng.gen_range(0..3) {
        0 => Bound::Included(ka),
        1 => Bound::Excluded(ka),
        _ => Bound::Included(format!("e{epoch:06}/").into_bytes()),
    };
    let hi = match rng.gen_range(0..3) {
        0 if b < KEYS => Bound::Included(kb),
        1 if b < KEYS => Bound::Excluded(kb),
        _ => Bound::Excluded(format!("e{epoch:06}0").into_bytes()),
    };
    KeyRange { lo, hi }
}

/// One attempt of a random transaction with test id `id`.
fn attempt(
    db: &Database,
    t: &Table,
    id: u64,
    rng: &mut StdRng,
    with_scans: bool,
    shared: &Shared,
) -> shoal::Result<TxnRecord> {
    let mut tx = db.begin();
    let mut rec = Recorder::new(id);
    let epoch = id / EPOCH;
    for _ in 0..rng.gen_range(2..=5) {
        let op = rng.gen_range(0..if with_scans { 10 } else { 8 });
        if op < 8 {
            let k = key(epoch, rng.gen_range(0..KEYS));
            let old = rec.get(&mut tx, t, &k)?;
            if op >= 4 {
                rec.put(&mut tx, t, k, old)?;
            }
        } else {
            let r = random_range(rng, epoch);
            let rev = op == 9;
            let mut rows = if rev {
                tx.scan_rev(t, r.clone())?
            } else {
                tx.scan(t, r.clone())?
            };
            shared.scans.fetch_add(1, Ordering::Relaxed);
            if rev {
                rows.reverse();
            }
            assert!(
                rows.windows(2).all(|w| w[0].0 < w[1].0),
                "scan{} {r} not in order: {:?}",
                if rev { "_rev" } else { "" },
                rows.iter()
                    .map(|(k, _)| common::show(k))
                    .collect::<Vec<_>>()
            );
            let mut found: HashMap<String, Version> = HashMap::new();
            for (k, val) in rows {
                assert!(r.contains_key(&k), "scan {r} returned {}", common::show(&k));
                let k = String::from_utf8(k).expect("utf-8 key");
                found.insert(k, Version::decode(Some(&val)));
            }
            for i in 0..KEYS {
                let k = key(epoch, i);
                if r.contains_key(k.as_bytes()) {
                    let seen = found.remove(&k).unwrap_or(Version::INITIAL);
                    rec.observe(&k, seen);
                }
            }
            assert!(found.is_empty(), "scan {r} returned unknown keys {found:?}");
        }
    }
    tx.commit()?;
    Ok(rec.rec)
}

fn random_workload(name: &str, with_scans: bool) {
    for o in modes() {
        let what = format!("{name} [{}]", mode_name(&o));
        let seed = common::seed(&what);
        let db = Database::in_memory_with(o.clone());
        let t = db.create_table("t").expect("create table");
        let shared = Shared {
            next_id: AtomicU64::new(1),
            history: Mutex::new(History::new()),
            aborts: AtomicU64::new(0),
            scans: AtomicU64::new(0),
        };
        let deadline = Instant::now() + DURATION;
        std::thread::scope(|s| {
            for th in 0..THREADS {
                let (db, t, shared) = (&db, &t, &shared);
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(th as u64));
                    while Instant::now() < deadline {
                        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
                        match attempt(db, t, id, &mut rng, with_scans, shared) {
                            Ok(rec) => shared.history.lock().expect("history").push(rec),
                            Err(e) if e.is_retryable() => {
                                shared.aborts.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("T{id}: unexpected error {e:?}"),
                        }
                    }
                });
            }
        });
        let history = shared.history.into_inner().expect("history");
        let stats = history.assert_serializable(&what);
        eprintln!(
            "{what}: {} committed, {} aborted, {} scans, edges ww {} wr {} rw {}",
            stats.txns,
            shared.aborts.load(Ordering::Relaxed),
            shared.scans.load(Ordering::Relaxed),
            stats.ww,
            stats.wr,
            stats.rw
        );
        assert!(stats.txns >= 20, "{what}: too little progress: {stats:?}");
        assert!(
            stats.ww > 0 && stats.wr > 0 && stats.rw > 0,
            "{what}: the workload produced no conflicts to check: {stats:?}"
        );
        if with_scans {
            assert!(
                shared.scans.load(Ordering::Relaxed) > 0,
                "{what}: no scan ran"
            );
        }
        // The final state holds the last version of every key.
        let heads = history.final_versions();
        let fin = db.run(|tx| tx.scan(&t, ..)).expect("final scan");
        let fin: HashMap<String, Version> = fin
            .into_iter()
            .map(|(k, val)| {
                (
                    String::from_utf8(k).expect("utf-8 key"),
                    Version::decode(Some(&val)),
                )
            })
            .collect();
        assert_eq!(
            fin, heads,
            "{what}: final state is not the last committed versions"
        );
    }
}

#[test]
fn random_point_transactions_are_serializable() {
    random_workload("point reads and writes", false);
}

#[test]
fn random_scan_transactions_are_serializable() {
    random_workload("scans, point reads and writes", true);
}

// ---------------------------------------------------------------------------------------
// Split (commutative) operations mixed with reads and writes.

/// Transactions with test ids in one block of `ADD_EPOCH` share that block's `COUNTERS`
/// counter keys; each adds the bit `id % ADD_EPOCH`, so a counter's value names its adders.
const ADD_EPOCH: u64 = 60;
const COUNTERS: usize = 2;
/// Counter keys of this many blocks are hinted as split under Doppel before the run starts
/// (hints on absent keys are fine); the run stops when the ids run past them.
const HINTED_EPOCHS: u64 = 400;

fn counter(epoch: u64, j: usize) -> String {
    format!("c{epoch:06}/{j}")
}

/// One attempt of a transaction that either adds its bit to one or two counters (blind, so
/// Doppel can apply it to a split record) or reads them, mixed with point reads and writes.
fn split_attempt(db: &Database, t: &Table, id: u64, rng: &mut StdRng) -> shoal::Result<TxnRecord> {
    let mut tx = db.begin();
    let mut rec = Recorder::new(id);
    let (cepoch, bit) = (id / ADD_EPOCH, (id % ADD_EPOCH) as u32);
    let adder = rng.gen_bool(0.5);
    let mut touched = [false; COUNTERS];
    for _ in 0..rng.gen_range(2..=5) {
        if rng.gen_bool(0.5) {
            let j = rng.gen_range(0..COUNTERS);
            if std::mem::replace(&mut touched[j], true) {
                continue;
            }
            let k = counter(cepoch, j);
            if adder {
                tx.add(t, &k, 1i64 << bit)?;
                rec.rec.adds.push((k, bit));
            } else {
                let seen = tx.get_i64(t, &k)?.unwrap_or(0);
                rec.rec.sums.push((k, seen as u64));
            }
        } else {
            let k = key(id / EPOCH, rng.gen_range(0..KEYS));
            let old = rec.get(&mut tx, t, &k)?;
            if rng.gen_bool(0.5) {
                rec.put(&mut tx, t, k, old)?;
            }
        }
    }
    tx.commit()?;
    Ok(rec.rec)
}

/// Under every mode (2PL and OCC run the adds as ordinary read-modify-writes; Doppel splits
/// the hinted counters), random transactions mixing blind adds, counter reads and point
/// reads/writes give a serializable history, and every counter ends as the sum of its
/// committed adds.
#[test]
fn random_split_operations_are_serializable() {
    for o in modes() {
        let what = format!("split adds, reads and writes [{}]", mode_name(&o));
        let seed = common::seed(&what);
        let db = Database::in_memory_with(o.clone());
        let t = db.create_table("t").expect("create table");
        if matches!(o.cc, shoal::ConcurrencyControl::Doppel) {
            for e in 0..HINTED_EPOCHS {
                for j in 0..COUNTERS {
                    db.split_hint(&t, counter(e, j), shoal::doppel::SplitOp::Add)
                        .expect("hint");
                }
            }
        }
        let next_id = AtomicU64::new(1);
        let history = Mutex::new(History::new());
        let aborts = AtomicU64::new(0);
        let deadline = Instant::now() + DURATION;
        std::thread::scope(|s| {
            for th in 0..THREADS {
                let (db, t, next_id, history, aborts) = (&db, &t, &next_id, &history, &aborts);
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(th as u64));
                    while Instant::now() < deadline {
                        let id = next_id.fetch_add(1, Ordering::Relaxed);
                        if id / ADD_EPOCH >= HINTED_EPOCHS {
                            break;
                        }
                        match split_attempt(db, t, id, &mut rng) {
                            Ok(rec) => history.lock().expect("history").push(rec),
                            Err(e) if e.is_retryable() => {
                                aborts.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("T{id}: unexpected error {e:?}"),
                        }
                    }
                });
            }
        });
        let history = history.into_inner().expect("history");
        let stats = history.assert_serializable(&what);
        let sums = history.final_sums();
        eprintln!(
            "{what}: {} committed, {} aborted or stashed, {} counters, edges ww {} wr {} rw {}",
            stats.txns,
            aborts.load(Ordering::Relaxed),
            sums.len(),
            stats.ww,
            stats.wr,
            stats.rw
        );
        assert!(stats.txns >= 20, "{what}: too little progress: {stats:?}");
        assert!(
            stats.wr > 0 && stats.rw > 0,
            "{what}: no conflicts: {stats:?}"
        );
        if let Some(d) = db.doppel_stats() {
            eprintln!("{what}: {d:?}");
            // The history really went through split phases (adds on split records).
            assert!(d.split_phases > 0, "{what}: no split phase ran: {d:?}");
        }
        for (k, want) in &sums {
            let got = db.run(|tx| tx.get_i64(&t, k)).expect("read counter");
            assert_eq!(
                got.map(|v| v as u64),
                Some(*want),
                "{what}: counter {k} is not the sum of its committed adds"
            );
        }
    }
}
