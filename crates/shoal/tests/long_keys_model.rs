//! Long keys (up to 4096 bytes, so leaves hold few and split often) and values at every
//! size boundary (inline, just past the inline limit, one and two overflow pages), under
//! every concurrency control: point reads, scans with every limit in both directions, and
//! the transaction's own uncommitted writes, all checked against a `BTreeMap` model.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::{ConcurrencyControl, Database, Options};
use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};

fn key(rng: &mut StdRng) -> Vec<u8> {
    let mut k = vec![b'k'; 4096];
    match rng.gen_range(0..4) {
        0 => k[0] = rng.gen_range(0..40),
        1 => k[2000] = rng.gen_range(0..40),
        2 => k[4095] = rng.gen_range(0..40),
        _ => {
            k.truncate(rng.gen_range(1..4096));
            let l = k.len();
            k[l - 1] = rng.gen_range(0..40);
        }
    }
    k
}
fn val(rng: &mut StdRng) -> Vec<u8> {
    let n = [0usize, 1, 2047, 2048, 2049, 32584, 32585, 100][rng.gen_range(0..8)];
    let b: u8 = rng.gen();
    (0..n).map(|i| b.wrapping_add(i as u8)).collect()
}
fn bound(rng: &mut StdRng, keys: &[Vec<u8>]) -> Bound<Vec<u8>> {
    let k = if !keys.is_empty() && rng.gen_bool(0.5) {
        keys[rng.gen_range(0..keys.len())].clone()
    } else {
        key(rng)
    };
    match rng.gen_range(0..3) {
        0 => Bound::Included(k),
        1 => Bound::Excluded(k),
        _ => Bound::Unbounded,
    }
}

#[test]
fn long_keys_scans_match_model() {
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
        ConcurrencyControl::Serial,
        ConcurrencyControl::Doppel,
    ] {
        for seed in 0..3u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let db = Database::in_memory_with(Options::default().with_cc(cc));
            let t = db.create_table("t").unwrap();
            let mut m: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            for _round in 0..8 {
                let mut tx = db.begin();
                let mut mm = m.clone();
                for _ in 0..40 {
                    let k = key(&mut rng);
                    if rng.gen_bool(0.3) {
                        assert_eq!(tx.delete(&t, &k).unwrap(), mm.remove(&k).is_some());
                    } else {
                        let v = val(&mut rng);
                        tx.put(&t, &k, &v).unwrap();
                        mm.insert(k, v);
                    }
                }
                let keys: Vec<Vec<u8>> = mm.keys().cloned().collect();
                // Point reads into one reused buffer, of present and absent keys.
                let mut buf = vec![0xAA; 9];
                for i in 0..10 {
                    let k = match keys.get(rng.gen_range(0..keys.len().max(1))) {
                        Some(k) if i % 3 != 0 => k.clone(),
                        _ => key(&mut rng),
                    };
                    let found = if i % 2 == 0 {
                        tx.get_into(&t, &k, &mut buf).unwrap()
                    } else {
                        tx.get_for_update_into(&t, &k, &mut buf).unwrap()
                    };
                    let want = mm.get(&k);
                    assert_eq!(found, want.is_some(), "{cc:?} get_into found");
                    assert_eq!(&buf, want.unwrap_or(&Vec::new()), "{cc:?} get_into value");
                    assert_eq!(tx.get(&t, &k).unwrap().as_ref(), want, "{cc:?} get");
                }
                for _ in 0..30 {
                    let lo = bound(&mut rng, &keys);
                    let hi = bound(&mut rng, &keys);
                    let limit = [0usize, 1, 2, 5, usize::MAX][rng.gen_range(0..5)];
                    let want: Vec<_> = mm
                        .iter()
                        .filter(|(k, _)| (lo.clone(), hi.clone()).contains(*k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    let r = (lo.clone(), hi.clone());
                    let a = tx.scan_limit(&t, r.clone(), limit).unwrap();
                    assert_eq!(
                        a,
                        want.iter().take(limit).cloned().collect::<Vec<_>>(),
                        "{cc:?} fwd"
                    );
                    let b = tx.scan_rev_limit(&t, r.clone(), limit).unwrap();
                    assert_eq!(
                        b,
                        want.iter().rev().take(limit).cloned().collect::<Vec<_>>(),
                        "{cc:?} rev"
                    );
                }
                if rng.gen_bool(0.7) {
                    tx.commit().unwrap();
                    m = mm;
                } else {
                    tx.abort();
                }
                let all = db.run(|tx| tx.scan(&t, ..)).unwrap();
                assert_eq!(
                    all,
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect::<Vec<_>>()
                );
            }
            assert_eq!(db.debug_index_check("t").unwrap(), Ok(()));
        }
    }
}
