//! Stresses aimed at the Silo-style OCC's node-set validation, ghosts and
//! re-inserts, and overflow values.

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::{ConcurrencyControl, Database, Options, Table};

const PAD: usize = 2500;
const SLOTS: u32 = 12;
const START: i64 = 100;

fn slot_key(slot: u32, generation: u64) -> Vec<u8> {
    let mut k = format!("a{slot:03}/{generation:010}/").into_bytes();
    k.resize(PAD, b'.');
    k
}

fn slot_bounds(slot: u32) -> (Vec<u8>, Vec<u8>) {
    (
        format!("a{slot:03}/").into_bytes(),
        format!("a{slot:03}0").into_bytes(),
    )
}

fn enc(v: i64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn dec(v: &[u8]) -> i64 {
    i64::from_le_bytes(v.try_into().unwrap())
}

/// The one live row of `slot`, found by one of several scan kinds.
fn find(
    tx: &mut shoal::Transaction<'_>,
    t: &Table,
    slot: u32,
    how: u32,
) -> shoal::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let (lo, hi) = slot_bounds(slot);
    match how % 4 {
        0 => tx.scan(t, lo..hi),
        1 => tx.scan_limit(t, lo..hi, 2),
        2 => tx.scan_rev_limit(t, lo..hi, 2),
        _ => tx.scan_rev(t, lo..hi),
    }
}

fn bank(o: Options, what: &str, millis: u64) {
    let db = Database::in_memory_with(o.with_max_retries(0));
    let t = db.create_table("t").unwrap();
    db.run(|tx| {
        for s in 0..SLOTS {
            tx.put(&t, slot_key(s, 0), enc(START))?;
        }
        Ok(())
    })
    .unwrap();
    let next_gen = AtomicU64::new(1);
    let audits = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_millis(millis);
    std::thread::scope(|sc| {
        for th in 0..3u64 {
            let (db, t, next_gen, audits) = (&db, &t, &next_gen, &audits);
            sc.spawn(move || {
                let mut rng = StdRng::seed_from_u64(th * 31 + 7);
                while Instant::now() < deadline {
                    let kind = rng.gen_range(0..10);
                    let mut tx = db.begin();
                    let mut audit = None;
                    let res: shoal::Result<()> = (|| {
                        if kind < 4 {
                            // transfer between two slots, found by scans
                            let a = rng.gen_range(0..SLOTS);
                            let b = (a + rng.gen_range(1..SLOTS)) % SLOTS;
                            let ra = find(&mut tx, t, a, rng.gen())?;
                            let rb = find(&mut tx, t, b, rng.gen())?;
                            if ra.len() != 1 || rb.len() != 1 {
                                return Err(shoal::Error::Conflict {
                                    txn: 0,
                                    detail: "inconsistent read".into(),
                                });
                            }
                            let d = rng.gen_range(1..5);
                            tx.put(t, &ra[0].0, enc(dec(&ra[0].1) - d))?;
                            tx.put(t, &rb[0].0, enc(dec(&rb[0].1) + d))?;
                        } else if kind < 7 {
                            // move a slot's row to a new key (delete + insert)
                            let a = rng.gen_range(0..SLOTS);
                            let ra = find(&mut tx, t, a, rng.gen())?;
                            if ra.len() != 1 {
                                return Err(shoal::Error::Conflict {
                                    txn: 0,
                                    detail: "inconsistent read".into(),
                                });
                            }
                            let g = next_gen.fetch_add(1, Ordering::Relaxed);
                            if !tx.delete(t, &ra[0].0)? {
                                // OCC is not opaque: a concurrent delete is caught at commit
                                return Err(shoal::Error::Conflict {
                                    txn: 0,
                                    detail: "inconsistent read".into(),
                                });
                            }
                            // sometimes move back to an older (maybe ghost) key
                            let nk = if rng.gen_bool(0.3) {
                                slot_key(a, g.saturating_sub(rng.gen_range(1..4)))
                            } else {
                                slot_key(a, g)
                            };
                            if nk != ra[0].0 {
                                tx.insert(t, &nk, &ra[0].1)?;
                            } else {
                                tx.put(t, &nk, &ra[0].1)?;
                            }
                        } else {
                            // audit
                            let mut sum = 0;
                            let mut per = vec![0; SLOTS as usize];
                            let how = rng.gen_range(0..3);
                            let rows = match how {
                                0 => tx.scan(t, ..)?,
                                1 => {
                                    let mut all = Vec::new();
                                    for s in 0..SLOTS {
                                        all.extend(find(&mut tx, t, s, rng.gen())?);
                                    }
                                    all
                                }
                                _ => tx.scan_limit(
                                    t,
                                    (Bound::<&[u8]>::Unbounded, Bound::Unbounded),
                                    64,
                                )?,
                            };
                            for (k, v) in &rows {
                                let s: usize =
                                    std::str::from_utf8(&k[1..4]).unwrap().parse().unwrap();
                                per[s] += 1;
                                sum += dec(v);
                            }
                            audit = Some((sum, per));
                        }
                        Ok(())
                    })();
                    match res.and_then(|()| tx.commit()) {
                        Ok(()) => {
                            if let Some((sum, per)) = audit {
                                audits.fetch_add(1, Ordering::Relaxed);
                                assert!(
                                    per.iter().all(|&n| n == 1),
                                    "{what}: a committed audit saw rows per slot {per:?}"
                                );
                                assert_eq!(
                                    sum,
                                    START * SLOTS as i64,
                                    "{what}: a committed audit saw the wrong total"
                                );
                            }
                        }
                        Err(e) if e.is_retryable() => {}
                        Err(shoal::Error::DuplicateKey { .. }) => {}
                        Err(e) => panic!("{what}: {e:?}"),
                    }
                }
            });
        }
    });
    let rows = db.run(|tx| tx.scan(&t, ..)).unwrap();
    let sum: i64 = rows.iter().map(|(_, v)| dec(v)).sum();
    assert_eq!(rows.len(), SLOTS as usize, "{what}: final rows");
    assert_eq!(sum, START * SLOTS as i64, "{what}: final total");
    assert!(
        audits.load(Ordering::Relaxed) > 0,
        "{what}: no audit committed"
    );
    eprintln!("{what}: {} audits", audits.load(Ordering::Relaxed));
}

#[test]
fn occ_bank_with_moving_keys_stays_consistent() {
    bank(
        Options::default().with_cc(ConcurrencyControl::Optimistic),
        "occ",
        4000,
    );
}

/// A value of `len` bytes that is `n` repeated (so a torn copy shows).
fn big(n: i64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        v.extend_from_slice(&n.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn unbig(v: &[u8]) -> i64 {
    let n = i64::from_le_bytes(v[..8].try_into().unwrap());
    assert_eq!(v, &big(n, v.len())[..], "torn value");
    n
}

#[test]
fn occ_overflow_values_transfer_and_audit() {
    let db = Database::in_memory_with(
        Options::default()
            .with_cc(ConcurrencyControl::Optimistic)
            .with_max_retries(0),
    );
    let t = db.create_table("t").unwrap();
    const K: i64 = 6;
    db.run(|tx| {
        for i in 0..K {
            tx.put(&t, format!("k{i}"), big(100, 3000 + 700 * i as usize))?;
        }
        Ok(())
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_millis(3000);
    let audits = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for th in 0..3u64 {
            let (db, t, audits) = (&db, &t, &audits);
            sc.spawn(move || {
                let mut rng = StdRng::seed_from_u64(th + 99);
                while Instant::now() < deadline {
                    let mut tx = db.begin();
                    let mut sum = None;
                    let res: shoal::Result<()> = (|| {
                        if rng.gen_bool(0.6) {
                            let a = rng.gen_range(0..K);
                            let b = (a + rng.gen_range(1..K)) % K;
                            let va = tx.get(t, format!("k{a}"))?.unwrap();
                            let vb = tx.get(t, format!("k{b}"))?.unwrap();
                            let (na, nb) = (
                                i64::from_le_bytes(va[..8].try_into().unwrap()),
                                i64::from_le_bytes(vb[..8].try_into().unwrap()),
                            );
                            // vary the lengths: inline <-> overflow
                            let la = rng.gen_range(100..9000);
                            let lb = rng.gen_range(100..9000);
                            tx.put(t, format!("k{a}"), big(na - 1, la))?;
                            tx.put(t, format!("k{b}"), big(nb + 1, lb))?;
                        } else {
                            let mut s = 0;
                            if rng.gen_bool(0.5) {
                                for (_, v) in tx.scan(t, ..)? {
                                    s += i64::from_le_bytes(v[..8].try_into().unwrap());
                                }
                            } else {
                                for i in 0..K {
                                    let v = tx.get(t, format!("k{i}"))?.unwrap();
                                    s += i64::from_le_bytes(v[..8].try_into().unwrap());
                                }
                            }
                            sum = Some(s);
                        }
                        Ok(())
                    })();
                    match res.and_then(|()| tx.commit()) {
                        Ok(()) => {
                            if let Some(s) = sum {
                                audits.fetch_add(1, Ordering::Relaxed);
                                assert_eq!(s, 100 * K, "a committed audit saw a wrong total");
                            }
                        }
                        Err(e) if e.is_retryable() => {}
                        Err(e) => panic!("{e:?}"),
                    }
                }
            });
        }
    });
    db.run(|tx| {
        let mut s = 0;
        for (_, v) in tx.scan(&t, ..)? {
            s += unbig(&v);
        }
        assert_eq!(s, 100 * K);
        Ok(())
    })
    .unwrap();
    assert!(audits.load(Ordering::Relaxed) > 0);
}
