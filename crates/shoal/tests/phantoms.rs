//! Phantoms: a transaction that reads a key range (or an absent key) twice must see the same
//! rows both times, while other transactions insert and delete keys inside the range, at its
//! bounds and just outside it.
//!
//! The range under test is between `k10` and `k20` with every kind of bound. The keys the
//! writers toggle sit just below the lower bound (`k09z`, `k1`), on it (`k10`), just above
//! it (`k10a`), inside (`k15`), just below the upper bound (`k19z`, `k2`), on it (`k20`),
//! just above it (`k20a`) and further out (`k05`, `k3`). Some stable keys (`k00`, `k12`,
//! `k18`, `k99`) never change.

mod common;

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, Table};

use common::{enc, inconsistent, mode_name, modes, optimistic, reader_committed, show, KeyRange};

const LO: &[u8] = b"k10";
const HI: &[u8] = b"k20";
const STABLE: [&str; 4] = ["k00", "k12", "k18", "k99"];
const TOGGLED: [&str; 11] = [
    "k05", "k09z", "k1", "k10", "k10a", "k15", "k19z", "k2", "k20", "k20a", "k3",
];
const DURATION: Duration = Duration::from_millis(1000);
const WRITER_PAUSE_OCC: Duration = Duration::from_micros(200);

type Rows = Vec<(Vec<u8>, Vec<u8>)>;

fn ranges() -> Vec<KeyRange> {
    use Bound::{Excluded, Included, Unbounded};
    vec![
        KeyRange::new(Included(LO), Excluded(HI)),
        KeyRange::new(Included(LO), Included(HI)),
        KeyRange::new(Excluded(LO), Excluded(HI)),
        KeyRange::new(Excluded(LO), Included(HI)),
        KeyRange::new(Unbounded, Excluded(HI)),
        KeyRange::new(Included(LO), Unbounded),
        KeyRange::new(Excluded(LO), Unbounded),
        KeyRange::new(Unbounded, Included(HI)),
    ]
}

fn setup(o: &shoal::Options) -> (Database, Table) {
    let db = Database::in_memory_with(o.clone());
    let t = db.create_table("t").expect("create table");
    db.run(|tx| {
        for k in STABLE {
            tx.put(&t, k, enc(0))?;
        }
        Ok(())
    })
    .expect("load stable keys");
    (db, t)
}

fn scan(
    tx: &mut shoal::Transaction<'_>,
    t: &Table,
    r: &KeyRange,
    rev: bool,
) -> shoal::Result<Rows> {
    scan_limited(tx, t, r, rev, None)
}

/// A scan, or with `limit` the first rows only (`scan_limit`), or the last ones
/// (`scan_rev_limit`, with `rev`); rows always come back ascending.
fn scan_limited(
    tx: &mut shoal::Transaction<'_>,
    t: &Table,
    r: &KeyRange,
    rev: bool,
    limit: Option<usize>,
) -> shoal::Result<Rows> {
    if let Some(n) = limit {
        if !rev {
            return tx.scan_limit(t, r.clone(), n);
        }
        let mut rows = tx.scan_rev_limit(t, r.clone(), n)?;
        rows.reverse();
        return Ok(rows);
    }
    let mut rows = if rev {
        tx.scan_rev(t, r.clone())?
    } else {
        tx.scan(t, r.clone())?
    };
    if rev {
        rows.reverse();
    }
    Ok(rows)
}

/// Checks order and bounds of an (ascending-normalized) scan result; a limited scan returns
/// at most `limit` rows, the first ones (the last ones with `rev`), so only a stable key
/// below its last row (above its first) must be in it.
fn check_rows(what: &str, r: &KeyRange, rows: &Rows, limit: Option<usize>, rev: bool) {
    let keys: Vec<String> = rows.iter().map(|(k, _)| show(k)).collect();
    assert!(
        rows.windows(2).all(|w| w[0].0 < w[1].0),
        "{what}: scan {r} out of order: {keys:?}"
    );
    for (k, _) in rows {
        assert!(r.contains_key(k), "{what}: scan {r} returned {}", show(k));
    }
    if let Some(n) = limit {
        assert!(
            rows.len() <= n,
            "{what}: scan {r} limited to {n} returned {keys:?}"
        );
    }
    let edge = if rev { rows.first() } else { rows.last() }.map(|(k, _)| k.clone());
    for k in STABLE {
        let within = match (&edge, limit) {
            (Some(l), Some(_)) if rev => k.as_bytes() >= &l[..],
            (Some(l), Some(_)) => k.as_bytes() <= &l[..],
            (None, Some(_)) => false,
            (_, None) => true,
        };
        if r.contains_key(k.as_bytes()) && within {
            assert!(
                rows.iter().any(|(kk, _)| kk == k.as_bytes()),
                "{what}: scan {r} missed the stable key {k}: {keys:?}"
            );
        }
    }
}

fn keys(rows: &Rows) -> Vec<String> {
    rows.iter().map(|(k, _)| show(k)).collect()
}

/// Readers scan a range twice (with a pause between) while writers toggle keys in and around
/// it; readers also read a toggled key twice. Both reads must agree in every committed reader.
#[test]
fn range_scans_see_no_phantoms_under_concurrent_inserts_and_deletes() {
    for o in modes() {
        let what = format!("phantoms [{}]", mode_name(&o));
        let seed = common::seed(&what);
        let (db, t) = setup(&o);
        let writes = AtomicU64::new(0);
        let range_checks = AtomicU64::new(0);
        let point_checks = AtomicU64::new(0);
        let deadline = Instant::now() + DURATION;
        std::thread::scope(|s| {
            for th in 0..3u64 {
                let (db, t, writes, o) = (&db, &t, &writes, &o);
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ (th << 32));
                    let mut n = 0i64;
                    while Instant::now() < deadline {
                        let k1 = TOGGLED[rng.gen_range(0..TOGGLED.len())];
                        let k2 = TOGGLED[rng.gen_range(0..TOGGLED.len())];
                        n += 1;
                        db.run(|tx| {
                            for k in [k1, k2] {
                                if tx.get(t, k)?.is_some() {
                                    if !tx.delete(t, k)? {
                                        return Err(inconsistent(o, "delete of a present key"));
                                    }
                                } else {
                                    match tx.insert(t, k, enc(n)) {
                                        Err(shoal::Error::DuplicateKey { .. }) => {
                                            return Err(inconsistent(o, "insert of an absent key"))
                                        }
                                        r => r?,
                                    }
                                }
                            }
                            Ok(())
                        })
                        .expect("toggle keys");
                        writes.fetch_add(1, Ordering::Relaxed);
                        if optimistic(o) {
                            // Unthrottled writers starve OCC readers (every validation
                            // fails); leave them windows so the readers' checks run.
                            std::thread::sleep(WRITER_PAUSE_OCC);
                        }
                    }
                });
            }
            // Under locking a long pause widens the window for a phantom; under OCC it only
            // makes validation fail, so optimistic readers pause briefly.
            let (point_pause, scan_pause) = if optimistic(&o) {
                (Duration::from_micros(100), Duration::from_micros(100))
            } else {
                (Duration::from_millis(1), Duration::from_millis(2))
            };
            for th in 0..2u64 {
                let (db, t, range_checks, point_checks) = (&db, &t, &range_checks, &point_checks);
                let what = &what;
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ ((th + 100) << 32));
                    let all = ranges();
                    while Instant::now() < deadline {
                        if rng.gen_range(0..4) == 0 {
                            let k = TOGGLED[rng.gen_range(0..TOGGLED.len())];
                            let (a, b) = db
                                .run(|tx| {
                                    let a = tx.get(t, k)?;
                                    std::thread::sleep(point_pause);
                                    let b = tx.get(t, k)?;
                                    Ok((a, b))
                                })
                                .expect("point reader");
                            assert_eq!(a, b, "{what}: two reads of {k} in one transaction differ");
                            point_checks.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        let r = &all[rng.gen_range(0..all.len())];
                        let rev1 = rng.gen_bool(0.5);
                        // A third of the double scans read only the first rows, or the last
                        // ones (both scans the same number, in the same direction): the rows
                        // up to the last one read must not change.
                        let limit = rng.gen_bool(0.33).then(|| rng.gen_range(1..4));
                        let rev2 = if limit.is_some() {
                            rev1
                        } else {
                            rng.gen_bool(0.5)
                        };
                        let (a, b) = db
                            .run(|tx| {
                                let a = scan_limited(tx, t, r, rev1, limit)?;
                                if rng.gen_bool(0.5) {
                                    std::thread::sleep(scan_pause);
                                } else {
                                    std::thread::yield_now();
                                }
                                let b = scan_limited(tx, t, r, rev2, limit)?;
                                Ok((a, b))
                            })
                            .expect("range reader");
                        check_rows(what, r, &a, limit, rev1);
                        check_rows(what, r, &b, limit, rev2);
                        assert_eq!(
                            a,
                            b,
                            "{what}: PHANTOM: two scans of {r} (rev: {rev1}, {rev2}, limit: \
                             {limit:?}) in one transaction differ: {:?} then {:?}",
                            keys(&a),
                            keys(&b)
                        );
                        range_checks.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        let (w, rc, pc) = (
            writes.into_inner(),
            range_checks.into_inner(),
            point_checks.into_inner(),
        );
        eprintln!("{what}: {w} writer commits, {rc} double scans, {pc} double point reads");
        assert!(w > 0 && rc > 0 && pc > 0, "{what}: no progress");
    }
}

/// Deterministic: for every bound kind, direction and edge key, a reader scans, a writer
/// inserts (or deletes) the edge key, the reader scans again after a pause: both scans equal.
/// The writer's change must be in place after both finished.
#[test]
fn range_scan_edges_deterministic() {
    for o in modes() {
        range_scan_edges(&o);
    }
}

/// The coarser key-range lock designs (Lomet's, S/X only) must prevent phantoms as well.
#[test]
fn range_scan_edges_under_coarser_key_range_modes() {
    for m in [
        shoal::KeyRangeModes::Lomet,
        shoal::KeyRangeModes::SharedExclusive,
    ] {
        range_scan_edges(
            &common::options(shoal::ConcurrencyControl::TwoPhaseLocking).with_key_range_modes(m),
        );
    }
}

fn range_scan_edges(o: &shoal::Options) {
    {
        let o = o.clone();
        let what = format!("phantom edges [{} {:?}]", mode_name(&o), o.key_range_modes);
        for (ri, r) in ranges().iter().enumerate() {
            for k in ["k1", "k10", "k10a", "k15", "k2", "k20", "k20a"] {
                for present in [false, true] {
                    let rev = (ri + usize::from(present)) % 2 == 1;
                    let (db, t) = setup(&o);
                    if present {
                        db.run(|tx| tx.put(&t, k, enc(7))).expect("preload");
                    }
                    let mut tx = db.begin();
                    let a = scan(&mut tx, &t, r, rev).expect("first scan");
                    let (writer, done) = toggle_in_thread(&db, &t, k, present);
                    // Let the writer run (or block) before the second scan.
                    let _ = done.recv_timeout(Duration::from_millis(10));
                    let b = scan(&mut tx, &t, r, !rev).expect("second scan");
                    let committed = commit_both(&o, tx, writer, &what);
                    let case = format!(
                        "{what}: range {r}, key {k} {}, first scan {}",
                        if present { "deleted" } else { "inserted" },
                        if rev { "descending" } else { "ascending" }
                    );
                    check_rows(&case, r, &a, None, false);
                    check_rows(&case, r, &b, None, false);
                    if committed {
                        assert_eq!(keys(&a), keys(&b), "{case}: PHANTOM: the two scans differ");
                    }
                    assert_toggled(&db, &t, k, present, &case);
                }
            }
        }
    }
}

/// The writer of the deterministic tests, in a thread of its own: deletes `k` if it is
/// `present`, else inserts it. The receiver hears when its transaction is over.
fn toggle_in_thread(
    db: &Database,
    t: &Table,
    k: &'static str,
    present: bool,
) -> (std::thread::JoinHandle<shoal::Result<()>>, Receiver<()>) {
    let (done_tx, done_rx) = mpsc::channel();
    let (db, t) = (db.clone(), t.clone());
    let writer = std::thread::spawn(move || {
        let res = db.run(|tx| {
            if present {
                tx.delete(&t, k).map(|_| ())
            } else {
                tx.insert(&t, k, enc(8))
            }
        });
        let _ = done_tx.send(());
        res
    });
    (writer, done_rx)
}

/// Commits the reader (`true` if it could: see [`reader_committed`]) and waits for the
/// writer of [`toggle_in_thread`], which must commit.
fn commit_both(
    o: &shoal::Options,
    reader: shoal::Transaction<'_>,
    writer: std::thread::JoinHandle<shoal::Result<()>>,
    what: &str,
) -> bool {
    let committed = reader_committed(o, reader.commit(), what);
    writer
        .join()
        .expect("writer thread")
        .expect("writer committed eventually");
    committed
}

/// After the writer of [`toggle_in_thread`] finished: its change is in place.
fn assert_toggled(db: &Database, t: &Table, k: &str, present: bool, case: &str) {
    let after = db.run(|tx| tx.get(t, k)).expect("read after");
    assert_eq!(
        after.is_some(),
        !present,
        "{case}: the writer's change is missing"
    );
}

/// A point lookup of an absent key twice returns `None` both times while another transaction
/// inserts the key; likewise a present key deleted concurrently is read the same twice.
#[test]
fn point_lookup_phantom() {
    for o in modes() {
        let what = format!("point phantom [{}]", mode_name(&o));
        for present in [false, true] {
            for k in ["k15", "k10", "k0", "k999"] {
                let (db, t) = setup(&o);
                if present {
                    db.run(|tx| tx.put(&t, k, enc(7))).expect("preload");
                }
                let mut tx = db.begin();
                let a = tx.get(&t, k).expect("first get");
                let (writer, _) = toggle_in_thread(&db, &t, k, present);
                std::thread::sleep(Duration::from_millis(20));
                let b = tx.get(&t, k).expect("second get");
                let committed = commit_both(&o, tx, writer, &what);
                let case = format!(
                    "{what}: key {k} {}",
                    if present { "deleted" } else { "inserted" }
                );
                assert_eq!(a.is_some(), present, "{case}: first get");
                if committed {
                    assert_eq!(a, b, "{case}: PHANTOM: the two gets differ");
                }
                assert_toggled(&db, &t, k, present, &case);
            }
        }
    }
}

/// A limited scan sees the transaction's own writes like a full one (its deletes hide rows,
/// its inserts add them), under every concurrency control, and returns the same first rows
/// as a full scan cut to the limit.
#[test]
fn a_limited_scan_sees_its_own_writes() {
    for o in modes() {
        let what = format!("limited scan [{}]", mode_name(&o));
        let (db, t) = setup(&o);
        let mut tx = db.begin();
        tx.delete(&t, "k12").expect("delete");
        tx.insert(&t, "k11", enc(1)).expect("insert");
        tx.put(&t, "k18", enc(2)).expect("update");
        let full = tx.scan(&t, ..).expect("full scan");
        assert_eq!(
            keys(&full),
            ["k00", "k11", "k18", "k99"],
            "{what}: full scan"
        );
        for n in 1..6 {
            let want: Rows = full.iter().take(n).cloned().collect();
            assert_eq!(
                tx.scan_limit(&t, .., n).expect("limited scan"),
                want,
                "{what}: limit {n}"
            );
        }
        let from = tx.scan_limit(&t, "k10".., 1).expect("limited scan");
        assert_eq!(keys(&from), ["k11"], "{what}: first row from k10");
        let rows = tx.scan_limit(&t, "k12".."k99", 5).expect("limited scan");
        assert_eq!(
            keys(&rows),
            ["k18"],
            "{what}: an updated row, the deleted one gone"
        );
        assert_eq!(
            rows[0].1,
            enc(2).to_vec(),
            "{what}: the row's own new value"
        );
        tx.commit().expect("commit");
    }
}

/// `scan_rev_limit` returns the last rows of every kind of range, like a model, also over
/// deleted keys (ghosts under 2PL and OCC until they are reclaimed), in every mode.
#[test]
fn scan_rev_limit_matches_a_model() {
    for o in modes() {
        let what = format!("scan_rev_limit [{}]", mode_name(&o));
        let mut rng = StdRng::seed_from_u64(common::seed(&what));
        let db = Database::in_memory_with(o.clone());
        let t = db.create_table("t").expect("create table");
        let mut model = std::collections::BTreeMap::<Vec<u8>, Vec<u8>>::new();
        for round in 0..300u64 {
            // A few puts and deletes over 40 keys, so deletes leave holes and ghosts.
            let k = format!("k{:02}", rng.gen_range(0..40)).into_bytes();
            if rng.gen_bool(0.6) {
                db.run(|tx| tx.put(&t, &k, enc(round as i64))).expect("put");
                model.insert(k, enc(round as i64).to_vec());
            } else {
                db.run(|tx| tx.delete(&t, &k).map(|_| ())).expect("delete");
                model.remove(&k);
            }
            let mut ranges = ranges();
            ranges.push(KeyRange::new(Bound::Unbounded, Bound::Unbounded));
            let r = &ranges[rng.gen_range(0..ranges.len())];
            let limit = rng.gen_range(0..6);
            let got = db
                .run(|tx| tx.scan_rev_limit(&t, r.clone(), limit))
                .expect("scan_rev_limit");
            let want: Rows = model
                .iter()
                .rev()
                .filter(|(k, _)| r.contains_key(k))
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(
                got,
                want,
                "{what}: round {round}, {r} limit {limit}: {:?} against {:?}",
                keys(&got),
                keys(&want)
            );
        }
    }
}

/// OCC's scan validation by node set, on a range over many leaves: a key inserted into any
/// leaf of the range, the last included, fails the scanning transaction's commit; a key
/// inserted outside the range, or nothing, lets it commit. (A node set that checked only
/// some of its leaves would let the late insert through.)
#[test]
fn an_insert_into_any_leaf_of_a_scanned_range_fails_the_occ_scan() {
    let key = |i: u32| format!("r{i:06}").into_bytes();
    let o = shoal::Options::default().with_cc(shoal::ConcurrencyControl::Optimistic);
    // Rows of 200 bytes: 3,000 keys span about twenty 32 KiB leaves.
    let n = 3_000u32;
    for (what, insert, fails) in [
        ("nothing", None, false),
        ("first leaf", Some([key(1), b"a".to_vec()].concat()), true),
        ("middle", Some([key(n / 2), b"a".to_vec()].concat()), true),
        (
            "last leaf",
            Some([key(n - 2), b"a".to_vec()].concat()),
            true,
        ),
        ("past the range", Some(key(n + 5)), false),
    ] {
        let db = Database::in_memory_with(o.clone());
        let t = db.create_table("t").expect("create");
        for c in 0..n / 500 {
            db.run(|tx| {
                for i in c * 500..(c + 1) * 500 {
                    tx.put(&t, key(i), [7u8; 200])?;
                }
                Ok(())
            })
            .expect("load");
        }
        let mut a = db.begin();
        let rows = a.scan(&t, key(0)..key(n)).expect("scan");
        assert_eq!(rows.len(), n as usize);
        a.put(&t, b"zz", b"1")
            .expect("a write past the range (in the last leaf)");
        if let Some(k) = &insert {
            db.run(|tx| tx.insert(&t, k, b"phantom")).expect("insert");
        }
        let r = a.commit();
        assert_eq!(r.is_err(), fails, "{what}: {r:?}");
    }
}
