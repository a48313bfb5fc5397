//! Stress probes of the B+-tree: scans, predecessor searches and reads racing splits and
//! merges; values at the inline/overflow boundary; page accounting.

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal::storage::btree::{BTree, Record};
use shoal::storage::page::PageCounts;

fn k(i: u32) -> [u8; 5] {
    let b = i.to_be_bytes();
    [b'k', b[0], b[1], b[2], b[3]]
}

fn xs(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Stable keys (even) never change; churners insert and remove odd keys in bursts so
/// leaves split and merge all the time. Every full scan holds each stable key exactly
/// once, in order; `predecessor(2i + 1)` is exactly `2i`; paged scans see no duplicate.
fn scan_race(leaf_cap: usize, inner_cap: usize, secs: u64) {
    const M: u32 = 400;
    let t = BTree::with_capacity(leaf_cap, inner_cap);
    for i in 0..M {
        t.update(&k(2 * i), |s| *s = Some(Record::default()));
    }
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(secs);
    std::thread::scope(|s| {
        for c in 0..2u64 {
            let (t, stop) = (&t, &stop);
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (c + 1);
                while !stop.load(SeqCst) {
                    // A burst over a window: fill it, then empty it (merges).
                    let base = (xs(&mut x) % u64::from(M)) as u32;
                    let w = 1 + (xs(&mut x) % 40) as u32;
                    for j in base..(base + w).min(M) {
                        t.update(&k(2 * j + 1), |s| *s = Some(Record::default()));
                    }
                    for j in base..(base + w).min(M) {
                        t.update(&k(2 * j + 1), |s| *s = None);
                    }
                }
            });
        }
        let (t, stop) = (&t, &stop);
        s.spawn(move || {
            let mut x = 77u64;
            while Instant::now() < deadline {
                let all = t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX);
                assert!(
                    all.windows(2).all(|w| w[0].0 < w[1].0),
                    "full scan out of order"
                );
                let stable: Vec<&Vec<u8>> = all
                    .iter()
                    .map(|(key, _)| key)
                    .filter(|key| key[4] % 2 == 0)
                    .collect();
                assert_eq!(
                    stable.len(),
                    M as usize,
                    "full scan lost or duplicated stable keys"
                );
                // Paged scan.
                let mut from: Option<Vec<u8>> = None;
                let mut seen = 0usize;
                let mut last: Option<Vec<u8>> = None;
                loop {
                    let lo = match &from {
                        None => Bound::Unbounded,
                        Some(f) => Bound::Excluded(&f[..]),
                    };
                    let page = t.range(lo, Bound::Unbounded, 7);
                    if page.is_empty() {
                        break;
                    }
                    for (key, _) in &page {
                        if let Some(l) = &last {
                            assert!(key > l, "paged scan went back");
                        }
                        last = Some(key.clone());
                        seen += usize::from(key[4] % 2 == 0);
                    }
                    from = last.clone();
                }
                assert_eq!(seen, M as usize, "paged scan lost stable keys");
                for _ in 0..50 {
                    let i = (xs(&mut x) % u64::from(M)) as u32;
                    assert_eq!(
                        t.predecessor(&k(2 * i + 1)),
                        Some(k(2 * i).to_vec()),
                        "predecessor of {}",
                        2 * i + 1
                    );
                    let lw = t.last_within(Bound::Included(&k(2 * i)[..]));
                    assert_eq!(lw, Some(k(2 * i).to_vec()));
                    assert!(
                        t.get(&k(2 * i), |r| r.is_some()),
                        "stable key {} lost",
                        2 * i
                    );
                }
            }
            stop.store(true, SeqCst);
        });
    });
    assert_eq!(t.check_invariants(), Ok(()));
}

#[test]
fn scans_and_predecessors_race_splits_and_merges_tiny_nodes() {
    scan_race(3, 3, 3);
}

#[test]
fn scans_and_predecessors_race_splits_and_merges_cap_8() {
    scan_race(8, 4, 3);
}

/// Value lengths around the inline limit (2048) and the overflow page payload (32584).
const LENS: [usize; 10] = [0, 8, 2047, 2048, 2049, 2056, 32583, 32584, 32585, 65169];

fn value(key: u32, ver: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, b) in v.iter_mut().enumerate() {
        *b = (ver as usize * 31 + key as usize * 7 + i) as u8;
    }
    v
}

/// Writers flip values between inline and overflow sizes (and delete/reinsert) while
/// readers check every value they read is one a writer wrote whole; at the end no page
/// leaked and the shared page counts match the store.
#[test]
fn values_at_the_overflow_boundary_race_readers_without_leaks() {
    const KEYS: u32 = 24;
    let counts = Arc::new(PageCounts::default());
    let t = BTree::counted(counts.clone(), false);
    // A version table: the value's length and pattern is a function of (key, ver).
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(3);
    let key = |i: u32| {
        let mut kk = vec![b'v'; 300];
        kk.extend_from_slice(&i.to_be_bytes());
        kk
    };
    std::thread::scope(|s| {
        for w in 0..2u32 {
            let (t, stop) = (&t, &stop);
            s.spawn(move || {
                let mut x = 0x1234_5678u64 + u64::from(w);
                let mut ver = u64::from(w) << 40;
                while !stop.load(SeqCst) {
                    let i = (xs(&mut x) % u64::from(KEYS)) as u32;
                    ver += 1;
                    let len = LENS[(xs(&mut x) % LENS.len() as u64) as usize];
                    if xs(&mut x).is_multiple_of(8) {
                        t.update(&key(i), |s| *s = None);
                    } else {
                        let v = value(i, ver, len);
                        t.update(&key(i), |s| {
                            *s = Some(Record {
                                value: v,
                                ghost: false,
                                tid: ver,
                            })
                        });
                    }
                }
            });
        }
        let (t, stop) = (&t, &stop);
        s.spawn(move || {
            let mut x = 99u64;
            while Instant::now() < deadline {
                let i = (xs(&mut x) % u64::from(KEYS)) as u32;
                t.get(&key(i), |r| {
                    if let Some(r) = r {
                        assert!(
                            LENS.contains(&r.value.len()),
                            "torn length {}",
                            r.value.len()
                        );
                        assert_eq!(r.value, value(i, r.tid, r.value.len()), "torn value");
                    }
                });
                let all = t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX);
                for (kk, r) in &all {
                    let i = u32::from_be_bytes(kk[300..304].try_into().unwrap());
                    assert_eq!(
                        r.value,
                        value(i, r.tid, r.value.len()),
                        "torn scanned value"
                    );
                }
            }
            stop.store(true, SeqCst);
        });
    });
    assert_eq!(t.check_invariants(), Ok(()));
    let st = t.stats();
    assert_eq!(counts.in_use.load(SeqCst) as usize, st.pages, "{st:?}");
    for i in 0..KEYS {
        t.update(&key(i), |s| *s = None);
    }
    assert_eq!(t.check_invariants(), Ok(()));
    let st = t.stats();
    assert_eq!(st.overflow, 0);
    assert_eq!(
        st.pages, 1,
        "only the root leaf should remain in use: {st:?}"
    );
    assert_eq!(counts.in_use.load(SeqCst), 1);
    drop(t);
    assert_eq!(counts.in_use.load(SeqCst), 0);
    assert_eq!(counts.held.load(SeqCst), 0);
}

/// Keys of exactly 4096 bytes with inline values of the largest inline size, inserted in
/// an order that fills pages, then removed: no panic, invariants hold, pages come back.
#[test]
fn longest_keys_with_largest_inline_values() {
    let t = BTree::new();
    let key = |i: u32| {
        let mut kk = vec![0xaau8; 4092];
        kk.extend_from_slice(&i.to_be_bytes());
        kk
    };
    let order: Vec<u32> = (0..200).map(|i| (i * 37) % 200).collect();
    for &i in &order {
        t.update(&key(i), |s| {
            *s = Some(Record {
                value: vec![i as u8; 2048],
                ghost: false,
                tid: 0,
            })
        });
    }
    assert_eq!(t.check_invariants(), Ok(()));
    // Grow every value to overflow and back.
    for &i in &order {
        t.update(&key(i), |s| s.as_mut().unwrap().value = vec![1; 2049]);
    }
    for &i in &order {
        t.update(&key(i), |s| s.as_mut().unwrap().value = vec![2; 2048]);
    }
    assert_eq!(t.check_invariants(), Ok(()));
    for &i in &order {
        assert_eq!(t.get(&key(i), |r| r.unwrap().value.clone()), vec![2; 2048]);
    }
    for &i in &order {
        t.update(&key(i), |s| *s = None);
    }
    assert_eq!(t.check_invariants(), Ok(()));
    let st = t.stats();
    assert_eq!(st.entries, 0);
    assert!(st.pages <= 2, "{st:?}");
}

/// Silo's node set as `range_noting` promises it: while every leaf noted by a scan is
/// unchanged, the same scan returns the same entries with the same TIDs, and a hinted
/// read's leaf that is unchanged means the same record. Writers insert, update (TIDs),
/// and remove keys with long shared heads, so leaves split and merge.
fn node_set_race(leaf_cap: usize, long: bool) {
    const M: u32 = 300;
    let t = BTree::with_capacity(leaf_cap, 4);
    let key = move |i: u32| {
        let mut kk = if long { vec![0x55u8; 40] } else { Vec::new() };
        kk.extend_from_slice(&i.to_be_bytes());
        kk
    };
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(3);
    let checked = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for c in 0..2u64 {
            let (t, stop) = (&t, &stop);
            s.spawn(move || {
                let mut x = 0xdead_beefu64 ^ (c * 1000 + 1);
                let mut tid = c << 50;
                while !stop.load(SeqCst) {
                    let i = (xs(&mut x) % u64::from(M)) as u32;
                    tid += 1;
                    match xs(&mut x) % 3 {
                        0 => {
                            t.update(&key(i), |s| *s = None);
                        }
                        _ => {
                            t.update(&key(i), |s| {
                                *s = Some(Record {
                                    value: vec![1; (tid % 50) as usize],
                                    ghost: tid % 5 == 0,
                                    tid,
                                })
                            });
                        }
                    }
                }
            });
        }
        let (t, stop, checked) = (&t, &stop, &checked);
        s.spawn(move || {
            let mut x = 5u64;
            while Instant::now() < deadline {
                let a = (xs(&mut x) % u64::from(M)) as u32;
                let b = a + (xs(&mut x) % 60) as u32;
                let limit = [usize::MAX, 3, 10][(xs(&mut x) % 3) as usize];
                let (ka, kb) = (key(a), key(b));
                let lo = Bound::Included(&ka[..]);
                let hi = Bound::Excluded(&kb[..]);
                let mut leaves = Vec::new();
                let first = t.range_noting(lo, hi, limit, Some(&mut leaves));
                let second = t.range(lo, hi, limit);
                if leaves.iter().all(|h| t.unchanged_since(*h)) {
                    checked.fetch_add(1, SeqCst);
                    assert_eq!(first, second, "unchanged leaves, different scan");
                }
                let i = (xs(&mut x) % u64::from(M)) as u32;
                let (r1, h) = t.get_hinted(&key(i), None, |r| r.cloned());
                let r2 = t.get(&key(i), |r| r.cloned());
                if t.unchanged_since(h) {
                    assert_eq!(r1, r2, "unchanged leaf, different record");
                }
            }
            stop.store(true, SeqCst);
        });
    });
    assert!(checked.load(SeqCst) > 10);
    assert_eq!(t.check_invariants(), Ok(()));
}

#[test]
fn node_sets_hold_under_splits_and_merges_tiny() {
    node_set_race(3, false);
}

#[test]
fn node_sets_hold_under_splits_and_merges_long_heads() {
    node_set_race(6, true);
}

/// Hints that go stale as their pages are freed and recycled as overflow pages and as
/// other nodes: hinted reads of stable keys always see their value, hinted reads of keys
/// never written see nothing, hinted increments are never lost.
#[test]
fn recycled_pages_behind_stale_hints() {
    use shoal::storage::btree::LeafHint;
    const M: u32 = 200;
    let t = BTree::with_capacity(5, 4);
    let stable = |i: u32| k(4 * i);
    let churn = |i: u32| k(4 * i + 1);
    let never = |i: u32| k(4 * i + 2);
    let sval = |i: u32| vec![(i % 251) as u8; 10 + (i as usize % 7)];
    for i in 0..M {
        t.update(&stable(i), |s| {
            *s = Some(Record {
                value: sval(i),
                ghost: false,
                tid: 0,
            })
        });
    }
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(3);
    let incs = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        {
            let (t, stop) = (&t, &stop);
            s.spawn(move || {
                let mut x = 0xabcdefu64;
                while !stop.load(SeqCst) {
                    let base = (xs(&mut x) % u64::from(M)) as u32;
                    let w = 1 + (xs(&mut x) % 30) as u32;
                    for j in base..(base + w).min(M) {
                        let len = [3000usize, 40_000, 2049][(j % 3) as usize];
                        t.update(&churn(j), |s| {
                            *s = Some(Record {
                                value: vec![7; len],
                                ghost: false,
                                tid: 0,
                            })
                        });
                    }
                    for j in base..(base + w).min(M) {
                        t.update(&churn(j), |s| *s = None);
                    }
                }
            });
        }
        for r in 0..2u64 {
            let (t, stop, incs) = (&t, &stop, &incs);
            s.spawn(move || {
                let mut x = 0x5555u64 + r;
                let mut hints: Vec<Option<LeafHint>> = vec![None; 32];
                let end = deadline;
                while Instant::now() < end {
                    let i = (xs(&mut x) % u64::from(M)) as u32;
                    let hslot = (xs(&mut x) % 32) as usize;
                    let h = hints[hslot];
                    match xs(&mut x) % 3 {
                        0 => {
                            let (v, nh) =
                                t.get_hinted(&stable(i), h, |r| r.map(|r| r.value.clone()));
                            assert_eq!(v, Some(sval(i)), "stable key {i} via hint");
                            hints[hslot] = Some(nh);
                        }
                        1 => {
                            let (v, nh) = t.get_hinted(&never(i), h, |r| r.is_some());
                            assert!(!v, "a key never written was found");
                            hints[hslot] = Some(nh);
                        }
                        _ => {
                            let (ok, nh) = t.update_hinted(&stable(i), h, |s| {
                                s.as_mut().map(|r| r.tid += 1).is_some()
                            });
                            assert!(ok, "stable key {i} lost to a hinted update");
                            incs.fetch_add(1, SeqCst);
                            hints[hslot] = Some(nh);
                        }
                    }
                }
                stop.store(true, SeqCst);
            });
        }
    });
    assert_eq!(t.check_invariants(), Ok(()));
    let total: u64 = (0..M).map(|i| t.get(&stable(i), |r| r.unwrap().tid)).sum();
    assert_eq!(total, incs.load(SeqCst));
}

/// The longest keys (4096 bytes, so fences and separators take 4 KiB each) on full-size
/// pages: stable keys stay found and exact predecessors hold while churn keys with values
/// at the inline/overflow boundary come and go (splits, appends, merges, root changes).
#[test]
fn longest_keys_race_splits_and_merges_on_full_pages() {
    const M: u32 = 120;
    let t = BTree::new();
    let key = |i: u32| {
        let mut kk = vec![0x33u8; 4092];
        kk.extend_from_slice(&i.to_be_bytes());
        kk
    };
    for i in 0..M {
        t.update(&key(2 * i), |s| {
            *s = Some(Record {
                value: vec![9; 2048],
                ..Record::default()
            })
        });
    }
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(3);
    std::thread::scope(|s| {
        for c in 0..2u64 {
            let (t, stop) = (&t, &stop);
            s.spawn(move || {
                let mut x = 0x77u64 + c;
                while !stop.load(SeqCst) {
                    let base = (xs(&mut x) % u64::from(M)) as u32;
                    let w = 1 + (xs(&mut x) % 20) as u32;
                    for j in base..(base + w).min(M) {
                        let len = [0usize, 2048, 2049, 40_000][(xs(&mut x) % 4) as usize];
                        t.update(&key(2 * j + 1), |s| {
                            *s = Some(Record {
                                value: vec![1; len],
                                ..Record::default()
                            })
                        });
                    }
                    for j in base..(base + w).min(M) {
                        t.update(&key(2 * j + 1), |s| *s = None);
                    }
                }
            });
        }
        let (t, stop) = (&t, &stop);
        s.spawn(move || {
            let mut x = 3u64;
            while Instant::now() < deadline {
                let i = (xs(&mut x) % u64::from(M)) as u32;
                assert_eq!(t.predecessor(&key(2 * i + 1)), Some(key(2 * i)));
                assert_eq!(t.get(&key(2 * i), |r| r.map(|r| r.value.len())), Some(2048));
                let got = t.range(Bound::Included(&key(2 * i)[..]), Bound::Unbounded, 4);
                assert_eq!(got.first().map(|g| &g.0), Some(&key(2 * i)));
                let all = t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX);
                let st = all.iter().filter(|(kk, _)| kk[4095] % 2 == 0).count();
                assert_eq!(st, M as usize);
            }
            stop.store(true, SeqCst);
        });
    });
    assert_eq!(t.check_invariants(), Ok(()));
    for i in 0..M {
        t.update(&key(2 * i), |s| *s = None);
    }
    assert_eq!(t.check_invariants(), Ok(()));
    let st = t.stats();
    assert_eq!((st.entries, st.overflow), (0, 0), "{st:?}");
}
