//! Many keys that share long heads (the B-tree compares 16-byte heads), with random lengths
//! and bytes 0x00/0xff, through the public API against a BTreeMap, with reopens.

use std::collections::BTreeMap;
use std::ops::Bound;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::{ConcurrencyControl, Database, Options};

fn key(rng: &mut StdRng) -> Vec<u8> {
    let heads: [&[u8]; 5] = [
        b"",
        b"0123456789abcde",
        b"0123456789abcdef",
        b"0123456789abcdefg",
        &[0xff; 31],
    ];
    let mut k = heads[rng.gen_range(0..heads.len())].to_vec();
    for _ in 0..rng.gen_range(0..4) {
        k.push([0u8, 1, 0x7f, 0xff, b'a'][rng.gen_range(0..5)]);
    }
    if rng.gen_range(0..20) == 0 {
        k.resize(rng.gen_range(100..4097), 0x41);
        k.push(rng.gen_range(0..3));
        k.truncate(4096);
    }
    if k.is_empty() {
        k.push(0);
    }
    k
}

fn bound(rng: &mut StdRng) -> Bound<Vec<u8>> {
    match rng.gen_range(0..3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(key(rng)),
        _ => Bound::Excluded(key(rng)),
    }
}

fn run(cc: ConcurrencyControl, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let o = Options::default().with_cc(cc);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut m: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut db = Database::open(dir.path(), o.clone()).unwrap();
    let mut t = db.create_table("t").unwrap();
    for round in 0..12 {
        db.run(|tx| {
            let mut mm = m.clone();
            let mut r2 = rng.clone();
            for _ in 0..400 {
                let k = key(&mut r2);
                if r2.gen_range(0..3) == 0 {
                    assert_eq!(tx.delete(&t, &k)?, mm.remove(&k).is_some());
                } else {
                    let v = vec![r2.gen::<u8>(); r2.gen_range(0..40)];
                    tx.put(&t, &k, &v)?;
                    mm.insert(k, v);
                }
            }
            Ok(())
        })
        .unwrap();
        // Same stream again for the model.
        for _ in 0..400 {
            let k = key(&mut rng);
            if rng.gen_range(0..3) == 0 {
                m.remove(&k);
            } else {
                let v = vec![rng.gen::<u8>(); rng.gen_range(0..40)];
                m.insert(k, v);
            }
        }
        if round % 3 == 2 {
            drop(t);
            drop(db);
            db = Database::open(dir.path(), o.clone()).unwrap();
            t = db.table("t").unwrap();
        }
        let mut tx = db.begin();
        for _ in 0..50 {
            let (lo, hi) = (bound(&mut rng), bound(&mut rng));
            let want: Vec<(Vec<u8>, Vec<u8>)> = m
                .iter()
                .filter(|(k, _)| {
                    std::ops::RangeBounds::contains(
                        &(lo.as_ref().map(|v| &v[..]), hi.as_ref().map(|v| &v[..])),
                        &k[..],
                    )
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let got = tx.scan(&t, (lo.clone(), hi.clone())).unwrap();
            assert!(
                got == want,
                "{cc:?} seed {seed} round {round}: scan {} rows, want {}",
                got.len(),
                want.len()
            );
            let lim = rng.gen_range(1..5);
            let got = tx
                .scan_rev_limit(&t, (lo.clone(), hi.clone()), lim)
                .unwrap();
            let w: Vec<_> = want.iter().rev().take(lim).cloned().collect();
            assert!(got == w, "{cc:?} seed {seed} round {round}: scan_rev_limit");
            let k = key(&mut rng);
            assert_eq!(tx.get(&t, &k).unwrap().as_ref(), m.get(&k));
        }
        tx.commit().unwrap();
        assert_eq!(db.debug_index_check("t").unwrap(), Ok(()));
    }
}

#[test]
fn long_shared_heads_2pl() {
    for s in 0..3 {
        run(ConcurrencyControl::TwoPhaseLocking, s);
    }
}

#[test]
fn long_shared_heads_occ() {
    for s in 0..3 {
        run(ConcurrencyControl::Optimistic, s);
    }
}
