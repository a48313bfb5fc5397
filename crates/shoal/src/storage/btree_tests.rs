//! Tests of the paged B+-tree (a child module of `btree.rs`).

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<u8>, u8),
    Ghost(Vec<u8>),
    Remove(Vec<u8>),
    Get(Vec<u8>),
    Pred(Vec<u8>),
    Range(Bound<Vec<u8>>, Bound<Vec<u8>>, usize),
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0u8..6, 1..4)
}

fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        key().prop_map(Bound::Included),
        key().prop_map(Bound::Excluded),
        Just(Bound::Unbounded),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (key(), any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        1 => key().prop_map(Op::Ghost),
        2 => key().prop_map(Op::Remove),
        1 => key().prop_map(Op::Get),
        1 => key().prop_map(Op::Pred),
        1 => (bound(), bound(), 0usize..40).prop_map(|(a, b, n)| Op::Range(a, b, n)),
    ]
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// Keys around the inline limit with long shared prefixes and zero bytes (padding).
fn long_key() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), Just(255u8)], 0..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]
    #[test]
    fn matches_a_btreemap_model_with_long_keys(
        ops in proptest::collection::vec(
            (long_key(), any::<u8>(), 0u8..4), 1..300),
        cap in prop_oneof![3usize..6, 34usize..80],
    ) {
        let t = BTree::with_capacity(cap, cap);
        let mut m: BTreeMap<Vec<u8>, Record> = BTreeMap::new();
        for (k, v, op) in ops {
            if k.is_empty() {
                continue;
            }
            match op {
                0 => {
                    t.update(&k, |s| *s = None);
                    m.remove(&k);
                }
                1 => {
                    let want = m.range(..k.clone()).next_back().map(|(k, _)| k.clone());
                    prop_assert_eq!(t.predecessor(&k), want);
                    prop_assert_eq!(t.get(&k, |r| r.cloned()), m.get(&k).cloned());
                }
                2 => {
                    let got = t.range(Bound::Excluded(&k[..]), Bound::Unbounded, 7);
                    let want: Vec<(Vec<u8>, Record)> = m
                        .range((Bound::Excluded(k.clone()), Bound::Unbounded))
                        .take(7)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    prop_assert_eq!(got, want);
                }
                _ => {
                    let rec = Record { value: vec![v], ghost: false, tid: 0 };
                    t.update(&k, |s| *s = Some(rec.clone()));
                    m.insert(k, rec);
                }
            }
        }
        prop_assert_eq!(t.check_invariants(), Ok(()));
        let all = t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX);
        prop_assert_eq!(all, m.into_iter().collect::<Vec<_>>());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn matches_a_btreemap_model(ops in proptest::collection::vec(op(), 1..300), cap in prop_oneof![3usize..6, 34usize..80]) {
        let t = BTree::with_capacity(cap, cap);
        let mut m: BTreeMap<Vec<u8>, Record> = BTreeMap::new();
        for o in ops {
            match o {
                Op::Put(k, v) => {
                    let rec = Record { value: vec![v], ghost: false, tid: 0 };
                    t.update(&k, |s| *s = Some(rec.clone()));
                    m.insert(k, rec);
                }
                Op::Ghost(k) => {
                    t.update(&k, |s| if let Some(r) = s { r.ghost = true });
                    if let Some(r) = m.get_mut(&k) { r.ghost = true; }
                }
                Op::Remove(k) => {
                    t.update(&k, |s| *s = None);
                    m.remove(&k);
                }
                Op::Get(k) => {
                    prop_assert_eq!(t.get(&k, |r| r.cloned()), m.get(&k).cloned());
                }
                Op::Pred(k) => {
                    let want = m.range(..k.clone()).next_back().map(|(k, _)| k.clone());
                    prop_assert_eq!(t.predecessor(&k), want);
                }
                Op::Range(a, b, n) => {
                    let valid = match (&a, &b) {
                        (Bound::Included(x) | Bound::Excluded(x), Bound::Included(y) | Bound::Excluded(y)) => {
                            x < y || (x == y && matches!((&a, &b), (Bound::Included(_), Bound::Included(_))))
                        }
                        _ => true,
                    };
                    let got = t.range(as_ref(&a), as_ref(&b), n);
                    let want: Vec<(Vec<u8>, Record)> = if valid {
                        m.range((a.clone(), b.clone())).take(n).map(|(k, v)| (k.clone(), v.clone())).collect()
                    } else {
                        Vec::new()
                    };
                    prop_assert_eq!(got, want);
                }
            }
        }
        prop_assert_eq!(t.check_invariants(), Ok(()));
        prop_assert_eq!(t.check_compact(), Ok(()));
        prop_assert_eq!(t.len(), m.len());
        let s = t.stats();
        prop_assert_eq!(s.entries, m.len());
        prop_assert_eq!(s.ghosts, m.values().filter(|r| r.ghost).count());
        if m.is_empty() {
            // Everything merged back into the root.
            prop_assert_eq!((s.leaves, s.inner, s.height), (1, 0, 1));
        }
        let all = t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX);
        prop_assert_eq!(all, m.into_iter().collect::<Vec<_>>());
    }
}

fn rec(v: u8) -> Record {
    Record {
        value: vec![v],
        ghost: false,
        tid: u64::from(v),
    }
}

#[test]
fn a_valid_hint_is_used_and_returned() {
    let t = BTree::new();
    for i in 0u8..10 {
        t.update(&[i], |s| *s = Some(rec(i)));
    }
    let (r, h) = t.get_hinted(&[3], None, |r| r.cloned());
    assert_eq!(r, Some(rec(3)));
    // One leaf: the same leaf serves every key, found or not, read or updated.
    for i in 0u8..20 {
        let (r, h2) = t.get_hinted(&[i], Some(h), |r| r.cloned());
        assert_eq!(r, t.get(&[i], |r| r.cloned()));
        assert_eq!(h2, h);
        let ((), h3) = t.update_hinted(&[i], Some(h), |s| *s = Some(rec(i + 1)));
        assert_eq!(h3, h);
    }
    assert_eq!(t.len(), 20);
    assert_eq!(t.check_invariants(), Ok(()));
}

#[test]
fn stale_hints_after_splits_give_the_unhinted_answers() {
    let t = BTree::with_capacity(3, 3);
    // Hints taken while the root is still the only leaf (and then names an inner node).
    let ((), root_hint) = t.update_hinted(b"m", None, |s| *s = Some(rec(0)));
    let mut hints = vec![root_hint];
    for i in 0u8..200 {
        let k = [i.wrapping_mul(37), i];
        let h = hints[usize::from(i) % hints.len()];
        let ((), h) = t.update_hinted(&k, Some(h), |s| *s = Some(rec(i)));
        hints.push(h);
    }
    assert_eq!(t.check_invariants(), Ok(()));
    let all = t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX);
    assert_eq!(all.len(), 201);
    for (i, h) in hints.iter().enumerate() {
        for (k, _) in all.iter().skip(i % 7).step_by(7) {
            let (got, h2) = t.get_hinted(k, Some(*h), |r| r.cloned());
            assert_eq!(got, t.get(k, |r| r.cloned()));
            // The returned hint is fresh: it takes the hinted path.
            assert_eq!(t.get_hinted(k, Some(h2), |r| r.cloned()).1, h2);
        }
        // Absent keys, and updates through stale hints (inserting, so splitting).
        let k = [b'z', b'z', i as u8]; // 3 bytes: no key above has them
        assert!(t.get_hinted(&k, Some(*h), |r| r.is_none()).0);
        let (was, _) = t.update_hinted(&k, Some(*h), |s| s.replace(rec(1)).is_some());
        assert!(!was);
    }
    assert_eq!(t.check_invariants(), Ok(()));
    assert_eq!(t.len(), 201 + hints.len());
    // The root's old hint names an inner node now: it must not be used.
    assert!(t.get_hinted(b"m", Some(root_hint), |r| r.is_some()).0);
}

#[test]
fn a_hint_of_another_tree_is_ignored() {
    let a = BTree::new();
    let b = BTree::new();
    let ((), ha) = a.update_hinted(b"k", None, |s| *s = Some(rec(1)));
    // `b`'s leaf is empty: using `a`'s leaf would find the key.
    let (found, hb) = b.get_hinted(b"k", Some(ha), |r| r.is_some());
    assert!(!found);
    assert_ne!(ha, hb);
    let ((), _) = b.update_hinted(b"k", Some(ha), |s| *s = Some(rec(2)));
    assert_eq!(a.get(b"k", |r| r.cloned()), Some(rec(1)));
    assert_eq!(b.get(b"k", |r| r.cloned()), Some(rec(2)));
    // A dropped tree's hints are refused by a new tree, whatever its addresses.
    let hc = {
        let c = BTree::new();
        c.update_hinted(b"k", None, |s| *s = Some(rec(3))).1
    };
    let d = BTree::new();
    assert!(d.get_hinted(b"k", Some(hc), |r| r.is_none()).0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn hinted_calls_match_a_btreemap_model(
        ops in proptest::collection::vec((key(), any::<u8>(), 0u8..4, any::<prop::sample::Index>()), 1..300),
        cap in prop_oneof![3usize..6, 34usize..80],
    ) {
        let t = BTree::with_capacity(cap, cap);
        let other = BTree::with_capacity(cap, cap);
        let mut m: BTreeMap<Vec<u8>, Record> = BTreeMap::new();
        // Every hint handed out so far, and one of another tree; `None` too.
        let mut hints: Vec<Option<LeafHint>> =
            vec![None, Some(other.update_hinted(b"x", None, |s| *s = Some(rec(0))).1)];
        for (k, v, op, idx) in ops {
            let h = hints[idx.index(hints.len())];
            let got = match op {
                0 => {
                    let (r, h) = t.get_hinted(&k, h, |r| r.cloned());
                    prop_assert_eq!(r, m.get(&k).cloned());
                    h
                }
                1 => {
                    let (old, h) = t.update_hinted(&k, h, Option::take);
                    prop_assert_eq!(old, m.remove(&k));
                    h
                }
                2 => {
                    let (r, h) = t.update_hinted(&k, h, |s| {
                        if let Some(r) = s { r.ghost = true; }
                        s.clone()
                    });
                    if let Some(r) = m.get_mut(&k) { r.ghost = true; }
                    prop_assert_eq!(r, m.get(&k).cloned());
                    h
                }
                _ => {
                    let (old, h) = t.update_hinted(&k, h, |s| s.replace(rec(v)));
                    prop_assert_eq!(old, m.insert(k, rec(v)));
                    h
                }
            };
            hints.push(Some(got));
        }
        prop_assert_eq!(t.check_invariants(), Ok(()));
        prop_assert_eq!(t.check_compact(), Ok(()));
        let all = t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX);
        prop_assert_eq!(all, m.into_iter().collect::<Vec<_>>());
    }
}

/// Hinted counters race with inserters that split the leaves (and the root) under them:
/// every increment must land exactly once, in the one record of its key.
#[test]
fn hinted_updates_race_with_splits() {
    for _round in 0..10 {
        let t = BTree::with_capacity(3, 3);
        let keys = 40u32;
        std::thread::scope(|s| {
            for id in 0..2u32 {
                let t = &t;
                s.spawn(move || {
                    let mut hints: Vec<Option<LeafHint>> = vec![None; keys as usize];
                    for i in 0..3000u32 {
                        let k = (i * 7 + id) % keys;
                        let key = (k * 1000).to_be_bytes();
                        let h = &mut hints[k as usize];
                        let (n, nh) = t.update_hinted(&key, *h, |s| {
                            let r = s.get_or_insert_with(Record::default);
                            r.tid += 1;
                            r.tid
                        });
                        *h = Some(nh);
                        let (seen, nh) = t.get_hinted(&key, *h, |r| r.map(|r| r.tid));
                        assert!(seen.is_some_and(|s| s >= n));
                        *h = Some(nh);
                    }
                });
            }
            // Inserters between the counters' keys.
            for id in 0..2u32 {
                let t = &t;
                s.spawn(move || {
                    for i in 0..1500u32 {
                        let key = ((i % keys) * 1000 + 1 + (i / keys) * 2 + id).to_be_bytes();
                        t.update(&key, |s| *s = Some(Record::default()));
                    }
                });
            }
        });
        assert_eq!(t.check_invariants(), Ok(()));
        let total: u64 = (0..keys)
            .map(|k| t.get(&(k * 1000).to_be_bytes(), |r| r.unwrap().tid))
            .sum();
        assert_eq!(total, 2 * 3000);
        assert_eq!(t.len(), keys as usize + 3000);
    }
}

#[test]
fn concurrent_disjoint_writers_with_readers_and_scans() {
    let t = BTree::with_capacity(4, 4);
    let threads = 8u32;
    std::thread::scope(|s| {
        for id in 0..threads {
            let t = &t;
            s.spawn(move || {
                let mut model = BTreeMap::new();
                let mut x = 0x9E37_79B9u32.wrapping_mul(id + 1) | 1;
                for _ in 0..4000 {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    // Keys interleave between threads: k * threads + id.
                    let k = ((x % 300) * threads + id).to_be_bytes();
                    match x % 5 {
                        0 => {
                            t.update(&k, |s| *s = None);
                            model.remove(&k);
                        }
                        1 => {
                            let lo = ((x >> 8) % 2400).to_be_bytes();
                            let got = t.range(Bound::Included(&lo[..]), Bound::Unbounded, 50);
                            assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "scan out of order");
                            assert!(got.iter().all(|(k, _)| k[..] >= lo[..]), "scan below bound");
                        }
                        2 => {
                            let other = (x.rotate_left(7) % 2400).to_be_bytes();
                            let p = t.predecessor(&other);
                            assert!(p.is_none_or(|p| p[..] < other[..]));
                        }
                        _ => {
                            let v = x.to_le_bytes().to_vec();
                            t.update(&k, |s| {
                                *s = Some(Record {
                                    value: v.clone(),
                                    ghost: false,
                                    tid: 0,
                                })
                            });
                            model.insert(k, v);
                        }
                    }
                }
                for (k, v) in &model {
                    assert_eq!(t.get(k, |r| r.map(|r| r.value.clone())).as_ref(), Some(v));
                }
                // Keys this thread removed last are absent.
                for i in 0..300u32 {
                    let k = (i * threads + id).to_be_bytes();
                    if !model.contains_key(&k) {
                        assert!(t.get(&k, |r| r.is_none()));
                    }
                }
            });
        }
    });
    assert_eq!(t.check_invariants(), Ok(()));
}

/// Descents (which keep no reference count on the nodes they pass) race with writers that
/// grow a tree of tiny nodes from empty, so the root and inner nodes split all the time:
/// every key a writer has published must stay reachable by get, predecessor and range.
#[test]
fn descents_race_with_root_and_inner_splits() {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    for _round in 0..20 {
        let t = BTree::with_capacity(3, 3);
        // Writer w inserts keys w, w + 2, w + 4, ... and publishes how many it inserted.
        let done = [AtomicU32::new(0), AtomicU32::new(0)];
        let n = 600u32;
        std::thread::scope(|s| {
            for w in 0..2u32 {
                let (t, done) = (&t, &done);
                s.spawn(move || {
                    for i in 0..n {
                        let k = (i * 2 + w).to_be_bytes();
                        t.update(&k, |s| *s = Some(Record::default()));
                        done[w as usize].store(i + 1, SeqCst);
                    }
                });
            }
            for r in 0..2u32 {
                let (t, done) = (&t, &done);
                s.spawn(move || {
                    let mut x = 0x2545_F491u32.wrapping_mul(r + 1) | 1;
                    while done.iter().any(|d| d.load(SeqCst) < n) {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        let w = x & 1;
                        let have = done[w as usize].load(SeqCst);
                        if have == 0 {
                            continue;
                        }
                        let i = (x >> 1) % have;
                        let k = (i * 2 + w).to_be_bytes();
                        assert!(t.get(&k, |r| r.is_some()), "published key {i}/{w} lost");
                        let above = (i * 2 + w + 1).to_be_bytes();
                        let p = t.predecessor(&above).expect("a key below");
                        assert!(p[..] >= k[..], "predecessor skipped a published key");
                        let got = t.range(Bound::Included(&k[..]), Bound::Unbounded, 2);
                        assert_eq!(got.first().map(|(g, _)| &g[..]), Some(&k[..]));
                    }
                });
            }
        });
        assert_eq!(t.check_invariants(), Ok(()));
        assert_eq!(t.len(), 2 * n as usize);
    }
}

#[test]
fn concurrent_counters_on_shared_keys_are_exact() {
    let t = BTree::with_capacity(3, 3);
    std::thread::scope(|s| {
        for id in 0..8u64 {
            let t = &t;
            s.spawn(move || {
                for i in 0..2000u64 {
                    let k = ((i * 7 + id) % 97).to_be_bytes();
                    t.update(&k, |s| {
                        let r = s.get_or_insert_with(|| Record {
                            value: 0u64.to_le_bytes().to_vec(),
                            ghost: false,
                            tid: 0,
                        });
                        let n = u64::from_le_bytes(r.value[..8].try_into().unwrap()) + 1;
                        r.value = n.to_le_bytes().to_vec();
                    });
                }
            });
        }
    });
    let total: u64 = t
        .range(Bound::Unbounded, Bound::Unbounded, usize::MAX)
        .iter()
        .map(|(_, r)| u64::from_le_bytes(r.value[..8].try_into().unwrap()))
        .sum();
    assert_eq!(total, 8 * 2000);
    assert_eq!(t.check_invariants(), Ok(()));
}

/// A queue: inserts at the tail, removals at the head. Leaves emptied at the head merge
/// away, so the tree's size follows the queue's length, not the number of keys it ever
/// held (before merges, 100,000 keys through a 50-key queue left ~3,000 empty leaves).
#[test]
fn a_queue_keeps_the_tree_small() {
    for cap in [3usize, 4, 8, 64] {
        let t = BTree::with_capacity(cap, cap);
        let window = 50u32;
        let mut hints = Vec::new();
        let mut max_nodes = 0;
        for i in 0..100_000u32 {
            let ((), h) = t.update_hinted(&i.to_be_bytes(), None, |s| *s = Some(rec(1)));
            if i % 97 == 3 {
                hints.push(h);
            }
            if let Some(old) = i.checked_sub(window) {
                // Through a stale hint now and then: it must find the key wherever
                // merges moved it.
                let h = hints.get(i as usize % 7).copied();
                let (was, _) = t.update_hinted(&old.to_be_bytes(), h, Option::take);
                assert!(was.is_some(), "key {old} lost (cap {cap})");
            }
            if i % 1000 == 999 {
                let s = t.stats();
                max_nodes = max_nodes.max(s.leaves + s.inner + s.free);
            }
        }
        assert_eq!(t.check_invariants(), Ok(()));
        assert_eq!(t.check_compact(), Ok(()));
        let s = t.stats();
        assert_eq!(s.entries, window as usize);
        // 50 entries in nodes at least a quarter full (a leaf drops below that only
        // when it cannot merge), plus the free list, which is bounded by the peak.
        let bound = 4 * (window as usize) / (cap / 4).max(1) + 8;
        assert!(s.leaves + s.inner <= bound, "cap {cap}: {s:?} > {bound}");
        assert!(
            max_nodes <= 2 * bound,
            "cap {cap}: peak {max_nodes} > {}",
            2 * bound
        );
        for (i, h) in hints.iter().enumerate() {
            let k = 100_000 - 1 - i as u32 % window;
            assert!(t.get_hinted(&k.to_be_bytes(), Some(*h), |r| r.is_some()).0);
            let gone = (i as u32 * 97 + 3).to_be_bytes();
            assert!(t.get_hinted(&gone, Some(*h), |r| r.is_none()).0);
        }
        // Drain it: back to a single leaf.
        for k in 100_000 - window..100_000 {
            t.update(&k.to_be_bytes(), |s| *s = None);
        }
        let s = t.stats();
        assert_eq!((s.entries, s.leaves, s.inner, s.height), (0, 1, 0, 1));
        assert_eq!(t.check_invariants(), Ok(()));
    }
}

/// Merges race with everything else: two queue writers (each keeps every eighth key as an
/// anchor and removes the others 40 keys behind its tail, so leaves empty and merge
/// all the time, inner nodes too, and the root grows and collapses), counters that
/// increment anchors through hints that merges make stale, and readers that check
/// published anchors are found by get, hinted get, predecessor and range, removed keys
/// are gone, and scans stay ordered.
#[test]
fn merges_race_with_hinted_updates_reads_and_scans() {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
    const N: u32 = 2500;
    const BEHIND: u32 = 40;
    let key = |w: u32, i: u32| (i * 2 + w).to_be_bytes();
    let anchor = |i: u32| i & 7 == 0;
    for _round in 0..6 {
        let t = BTree::with_capacity(4, 4);
        // inserted[w]: keys 0..inserted of writer w are published (anchors stay);
        // removed[w]: its non-anchor keys below `removed` are gone.
        let inserted = [AtomicU32::new(0), AtomicU32::new(0)];
        let removed = [AtomicU32::new(0), AtomicU32::new(0)];
        let increments = AtomicU64::new(0);
        let writers_done = AtomicU32::new(0);
        std::thread::scope(|s| {
            for w in 0..2u32 {
                let (t, inserted, removed, done) = (&t, &inserted, &removed, &writers_done);
                s.spawn(move || {
                    for i in 0..N {
                        t.update(&key(w, i), |s| *s = Some(Record::default()));
                        inserted[w as usize].store(i + 1, SeqCst);
                        if let Some(old) = i.checked_sub(BEHIND) {
                            if !anchor(old) {
                                let gone = t.update(&key(w, old), Option::take);
                                assert!(gone.is_some());
                            }
                            removed[w as usize].store(old + 1, SeqCst);
                        }
                    }
                    done.fetch_add(1, SeqCst);
                });
            }
            for r in 0..2u32 {
                let (t, inserted, removed, done, increments) =
                    (&t, &inserted, &removed, &writers_done, &increments);
                s.spawn(move || {
                    let mut x = 0x2545_F491u32.wrapping_mul(r + 3) | 1;
                    let mut hints: Vec<Option<LeafHint>> = vec![None; 64];
                    while done.load(SeqCst) < 2 {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        let w = x & 1;
                        let have = inserted[w as usize].load(SeqCst);
                        if have == 0 {
                            continue;
                        }
                        let i = ((x >> 1) % have) / 8 * 8; // an anchor
                        let k = key(w, i);
                        let h = &mut hints[(x >> 20) as usize % 64];
                        if r == 0 {
                            // Counter: increment through a (possibly stale) hint.
                            let (n, nh) = t.update_hinted(&k, *h, |s| {
                                s.as_mut().map(|r| {
                                    r.tid += 1;
                                    r.tid
                                })
                            });
                            assert!(n.is_some(), "anchor {i}/{w} lost");
                            increments.fetch_add(1, SeqCst);
                            *h = Some(nh);
                            continue;
                        }
                        let (found, nh) = t.get_hinted(&k, *h, |r| r.is_some());
                        assert!(found, "anchor {i}/{w} lost to a hinted get");
                        *h = Some(nh);
                        assert!(t.get(&k, |r| r.is_some()), "anchor {i}/{w} lost");
                        let above = (i * 2 + w + 1).to_be_bytes();
                        let p = t.predecessor(&above).expect("a key below");
                        assert!(p[..] >= k[..], "predecessor skipped anchor {i}/{w}");
                        let got = t.range(Bound::Included(&k[..]), Bound::Unbounded, 3);
                        assert_eq!(got.first().map(|(g, _)| &g[..]), Some(&k[..]));
                        assert!(got.windows(2).all(|p| p[0].0 < p[1].0), "scan order");
                        let gone_below = removed[w as usize].load(SeqCst);
                        if gone_below > 1 {
                            let j = (x >> 3) % gone_below;
                            if !anchor(j) {
                                let (absent, _) = t.get_hinted(&key(w, j), *h, |r| r.is_none());
                                assert!(absent, "removed key {j}/{w} is back");
                            }
                        }
                    }
                });
            }
        });
        assert_eq!(t.check_invariants(), Ok(()));
        assert_eq!(t.check_compact(), Ok(()));
        let all = t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX);
        let total: u64 = all.iter().map(|(_, r)| r.tid).sum();
        assert_eq!(total, increments.load(SeqCst));
        let live = 2 * (N / 8 + BEHIND) as usize;
        assert!(all.len() <= live, "{} entries", all.len());
        let s = t.stats();
        // Before merges this tree kept ~2,000 empty leaves.
        assert!(s.leaves <= s.entries + 1, "{s:?}");
        assert_eq!(s.empty_leaves, 0, "{s:?}");
    }
}

impl BTree {
    /// What holds once every removal's `rebalance` has run (no concurrent writer): an empty
    /// leaf is the root or its parent's only child.
    fn check_compact(&self) -> Result<(), String> {
        self.walk(ROOT, 0, None, None, &mut |n, _, _, _, _| {
            if n.kind() == KIND_INNER && n.count() > 0 {
                for c in 0..=n.count() {
                    let cf = self.frame_of(n.child(c));
                    let cn = Node(cf);
                    if cn.is_leaf() && cn.count() == 0 {
                        return Err(format!(
                            "an empty leaf at {:?} has a sibling",
                            cn.fence(true)
                        ));
                    }
                }
            }
            Ok(())
        })
    }
}

/// Keys as TPC-B's accounts table has them: 8-byte big-endian integers.
fn account(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

#[test]
fn sequential_inserts_fill_pages_tpcb_accounts_within_1_5x_raw_bytes() {
    // TPC-B's accounts table: 8-byte keys, 100-byte rows, loaded in key order.
    let t = BTree::new();
    let rows = 100_000u64;
    for i in 0..rows {
        t.update(&account(i), |s| {
            *s = Some(Record {
                value: vec![7; 100],
                ghost: false,
                tid: 0,
            })
        });
    }
    assert_eq!(t.check_invariants(), Ok(()));
    let s = t.stats();
    assert_eq!(s.entries, rows as usize);
    let per_row = s.bytes as f64 / rows as f64;
    println!(
        "TPC-B accounts: {} pages of {} bytes for {rows} rows: {per_row:.1} bytes per row ({:.2}x the 108 raw bytes)",
        s.pages,
        PAGE_SIZE,
        per_row / 108.0
    );
    assert!(per_row <= 1.5 * 108.0, "{per_row} bytes per row");
}

#[test]
fn random_inserts_and_removals_on_full_pages_match_a_model() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    let t = BTree::new();
    let mut m: BTreeMap<Vec<u8>, Record> = BTreeMap::new();
    for round in 0..60_000u32 {
        let k = account(rng.gen_range(0..20_000u64)).to_vec();
        if rng.gen_bool(0.35) {
            t.update(&k, |s| *s = None);
            m.remove(&k);
        } else {
            // Values of varied sizes, some past the inline limit (overflow pages).
            let len = match rng.gen_range(0..100) {
                0 => rng.gen_range(INLINE_VALUE..3 * PAGE_SIZE),
                1..=10 => rng.gen_range(200..INLINE_VALUE),
                _ => rng.gen_range(0..120),
            };
            let rec = Record {
                value: vec![(round % 251) as u8; len],
                ghost: rng.gen_bool(0.1),
                tid: u64::from(round),
            };
            t.update(&k, |s| *s = Some(rec.clone()));
            m.insert(k, rec);
        }
        if round % 10_000 == 0 {
            assert_eq!(t.check_invariants(), Ok(()));
        }
    }
    assert_eq!(t.check_invariants(), Ok(()));
    let all = t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX);
    assert!(all == m.clone().into_iter().collect::<Vec<_>>());
    for (k, _) in m.iter().take(500) {
        t.update(k, |s| *s = None);
    }
    let keys: Vec<Vec<u8>> = m.keys().cloned().collect();
    for k in keys {
        t.update(&k, |s| *s = None);
    }
    assert_eq!(t.check_invariants(), Ok(()));
    let s = t.stats();
    // Everything merged back into the root, every overflow chain freed.
    assert_eq!(
        (s.entries, s.leaves, s.inner, s.overflow, s.pages),
        (0, 1, 0, 0, 1)
    );
}

#[test]
fn longest_keys_split_and_merge() {
    // Keys of the longest length a page guarantees room for, sharing long prefixes, with
    // inline values of the longest inline length: a few per page.
    let t = BTree::new();
    let key = |i: u16| {
        let mut k = vec![b'x'; MAX_KEY];
        k[MAX_KEY - 2..].copy_from_slice(&i.to_be_bytes());
        k
    };
    for i in (0..200u16).rev() {
        t.update(&key(i), |s| {
            *s = Some(Record {
                value: vec![1; INLINE_VALUE],
                ghost: false,
                tid: 0,
            })
        });
    }
    assert_eq!(t.check_invariants(), Ok(()));
    assert_eq!(t.len(), 200);
    assert!(t.stats().height >= 3);
    assert_eq!(t.predecessor(&key(100)), Some(key(99)));
    for i in 0..200u16 {
        assert!(t.get(&key(i), |r| r.map(|r| r.value.len())) == Some(INLINE_VALUE));
        t.update(&key(i), |s| *s = None);
    }
    assert_eq!(t.check_invariants(), Ok(()));
    assert_eq!(t.stats().pages, 1);
}

#[test]
fn a_value_that_grows_in_a_full_leaf_moves_to_overflow_pages() {
    let t = BTree::new();
    for i in 0..2_000u64 {
        t.update(&account(i), |s| {
            *s = Some(Record {
                value: vec![1; 100],
                ghost: false,
                tid: 0,
            })
        });
    }
    // Grow every row a little (full leaves on the optimistic path) and back.
    for i in 0..2_000u64 {
        t.update(&account(i), |s| {
            if let Some(r) = s {
                r.value.resize(300, 2);
            }
        });
    }
    assert_eq!(t.check_invariants(), Ok(()));
    for i in 0..2_000u64 {
        let v = t.get(&account(i), |r| r.map(|r| r.value.clone()));
        let mut want = vec![1; 100];
        want.resize(300, 2);
        assert!(v == Some(want));
        t.update(&account(i), |s| {
            if let Some(r) = s {
                r.value.truncate(10);
            }
        });
    }
    assert_eq!(t.check_invariants(), Ok(()));
    assert_eq!(t.stats().overflow, 0);
}

#[test]
fn optimistic_readers_never_see_torn_records_during_splits_and_merges() {
    // Each record's value is 64 copies of one byte and its TID that byte: a reader that
    // mixed two versions of a record, or of a page, would see a mismatch.
    let t = std::sync::Arc::new(BTree::new());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let t = t.clone();
            std::thread::spawn(move || {
                for round in 0..30_000u64 {
                    let k = account((round * 7919 + w) % 5_000);
                    let b = (round % 200) as u8;
                    if round % 5 == 4 {
                        t.update(&k, |s| *s = None);
                    } else {
                        t.update(&k, |s| {
                            *s = Some(Record {
                                value: vec![b; 64 + usize::from(b)],
                                ghost: false,
                                tid: u64::from(b),
                            })
                        });
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let t = t.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut seen = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (k, r) in t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX) {
                        assert_eq!(k.len(), 8);
                        let b = r.tid as u8;
                        assert_eq!(r.value.len(), 64 + usize::from(b));
                        assert!(r.value.iter().all(|&x| x == b), "a torn record");
                        seen += 1;
                    }
                    for i in (0..5_000u64).step_by(97) {
                        t.get(&account(i), |r| {
                            if let Some(r) = r {
                                let b = r.tid as u8;
                                assert!(r.value.len() == 64 + usize::from(b));
                                assert!(r.value.iter().all(|&x| x == b), "a torn record");
                            }
                        });
                    }
                }
                seen
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader");
    }
    assert_eq!(t.check_invariants(), Ok(()));
}

#[test]
fn appends_that_add_a_high_fence_still_split_at_the_right_edge() {
    // Full leaves whose keys all share a district prefix, appended to at the end of each
    // district: the left page of an append split keeps nearly everything even though it
    // gains a high fence.
    let t = BTree::new();
    for d in 0..4u8 {
        for o in 0..5_000u32 {
            let mut k = vec![d];
            k.extend_from_slice(&o.to_be_bytes());
            t.update(&k, |s| *s = Some(Record::default()));
        }
    }
    // Then append to each district in turn.
    for o in 5_000..20_000u32 {
        for d in 0..4u8 {
            let mut k = vec![d];
            k.extend_from_slice(&o.to_be_bytes());
            t.update(&k, |s| *s = Some(Record::default()));
        }
    }
    assert_eq!(t.check_invariants(), Ok(()));
    let s = t.stats();
    // 80,000 entries of 32 + 8 bytes: about 100 leaves when the run splits leave the left
    // pages full, about 200 at half full, and thousands if they misfire.
    assert!(
        s.leaves <= 140,
        "{} leaves for {} entries",
        s.leaves,
        s.entries
    );
}

thread_local! {
    /// Leaf splits this thread made through an owned image (not `split_off_append`).
    pub(super) static IMAGE_SPLITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[test]
fn runs_in_the_middle_of_a_leaf_go_on_by_appends() {
    // TPC-C's order lines: each district's rows grow at the district's end, in the middle
    // of a leaf that also holds the next district's rows. After one general split per run
    // the run should end its page, so that its further splits are appends that copy
    // nothing; a run that keeps the next district's rows in front of it copies them at
    // every split.
    let t = BTree::new();
    let key = |d: u8, o: u32| {
        let mut k = vec![d];
        k.extend_from_slice(&o.to_be_bytes());
        k
    };
    let record = || Record {
        value: vec![7; 100],
        ..Record::default()
    };
    for d in 0..4u8 {
        t.update(&key(d, 0), |s| *s = Some(record()));
    }
    let before = IMAGE_SPLITS.get();
    // Ten rows at a time, as a NewOrder inserts its order's lines.
    for batch in 0..1_000u32 {
        for d in 0..4u8 {
            for o in 1 + 10 * batch..11 + 10 * batch {
                t.update(&key(d, o), |s| *s = Some(record()));
            }
        }
    }
    let general = IMAGE_SPLITS.get() - before;
    assert_eq!(t.check_invariants(), Ok(()));
    let s = t.stats();
    // 40,000 records of about 150 bytes: about 180 full leaves (216 with 170 general
    // splits when the run started the right page instead).
    assert!(s.leaves <= 260, "{s:?}");
    assert!(
        general < s.leaves as u64 / 4,
        "{general} general splits for {} leaves",
        s.leaves
    );
}

/// Point reads that took the leaf's latch after failed validations (see `PESSIMISTIC_AFTER`).
pub(super) static PESSIMISTIC_READS: AtomicU64 = AtomicU64::new(0);

/// A reader whose leaf keeps changing under it falls back to latching the leaf, and still
/// reads only values a writer stored whole.
#[test]
fn a_reader_behind_a_stream_of_writers_latches_and_reads_whole_values() {
    use std::sync::atomic::AtomicBool;
    let t = BTree::new();
    for k in 0u8..20 {
        t.update(&[k], |s| *s = Some(Record::default()));
    }
    let stop = AtomicBool::new(false);
    let before = PESSIMISTIC_READS.load(AtomicOrdering::Relaxed);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Every value is 64 copies of one byte: a torn read would mix two.
            let mut i = 0u64;
            while !stop.load(AtomicOrdering::Relaxed) {
                i += 1;
                let v = vec![(i % 251) as u8; 64];
                t.update(&[(i % 20) as u8], |s| {
                    if let Some(r) = s.as_mut() {
                        r.value.clone_from(&v);
                    }
                });
            }
        });
        let mut reads = 0u64;
        while PESSIMISTIC_READS.load(AtomicOrdering::Relaxed) == before || reads < 20_000 {
            for k in 0u8..20 {
                let v = t
                    .get(&[k], |r| r.map(|r| r.value.clone()))
                    .expect("present");
                assert!(v.is_empty() || (v.len() == 64 && v.iter().all(|&b| b == v[0])));
                reads += 1;
            }
            assert!(reads < 50_000_000, "no read ever fell back to the latch");
        }
        stop.store(true, AtomicOrdering::Relaxed);
    });
}

/// Values that grow past their leaf's free space (an OCC insert's placeholder getting its
/// value at commit; a row that grows) stay inline: the leaf splits, on the root leaf too,
/// and no overflow page is spent on a value that fits a page.
#[test]
fn grown_values_stay_inline() {
    for keys in [60u32, 3000] {
        let t = BTree::new();
        let key = |i: u32| i.wrapping_mul(2_654_435_761).to_be_bytes();
        for i in 0..keys {
            t.update(&key(i), |s| *s = Some(Record::default()));
        }
        let val = |i: u32| vec![i as u8; 600 + (i % 300) as usize];
        for i in 0..keys {
            t.update(&key(i), |s| {
                if let Some(r) = s {
                    r.value = val(i);
                }
            });
        }
        for i in 0..keys {
            assert_eq!(t.get(&key(i), |r| r.map(|r| r.value.clone())), Some(val(i)));
        }
        assert_eq!(t.check_invariants(), Ok(()));
        let s = t.stats();
        assert_eq!(s.overflow, 0, "{keys} keys: {s:?}");
        // About 750 bytes per record; leaves at least a third full.
        let bytes = keys as usize * 800;
        assert!(s.pages <= 2 + 3 * bytes / PAGE_SIZE, "{keys} keys: {s:?}");
    }
}

/// `unchanged_since` holds only for a read's hint of this tree whose leaf no writer latched
/// since: a write to any key of the leaf, a split moving the key away, a hint from a write
/// (no version) or from another tree all say no.
#[test]
fn unchanged_since_holds_only_until_a_writer_latches_the_leaf() {
    let t = BTree::new();
    let other = BTree::new();
    let key = |i: u32| i.to_be_bytes();
    for i in 0..10 {
        t.update(&key(i), |s| *s = Some(Record::default()));
        other.update(&key(i), |s| *s = Some(Record::default()));
    }
    let (_, h) = t.get_hinted(&key(3), None, |r| r.is_some());
    assert!(t.unchanged_since(h));
    // Reads do not change the leaf.
    let _ = t.get_hinted(&key(4), Some(h), |r| r.is_some());
    assert!(t.unchanged_since(h));
    let (_, oh) = other.get_hinted(&key(3), None, |r| r.is_some());
    assert!(!t.unchanged_since(oh), "another tree's hint");
    let ((), wh) = t.update_hinted(&key(5), Some(h), |s| {
        if let Some(r) = s {
            r.tid = 7;
        }
    });
    assert!(!t.unchanged_since(h), "a write to the same leaf");
    assert!(!t.unchanged_since(wh), "a write's hint carries no version");
    let (_, h) = t.get_hinted(&key(3), None, |r| r.is_some());
    assert!(t.unchanged_since(h));
    // Enough inserts to split the leaf.
    for i in 10..5_000 {
        t.update(&key(i), |s| *s = Some(Record::default()));
    }
    assert!(t.stats().leaves > 1);
    assert!(!t.unchanged_since(h), "the leaf split");
}

#[test]
fn descents_prefetch_the_slot_arrays_of_small_leaves_only() {
    // Leaves of 1 KB records (YCSB's) hold some 30 slots: a descent asks for their whole
    // slot array with the header. Leaves of 100-byte records hold hundreds, searched from
    // their hints: a descent asks for the header lines only.
    let lines = |value: usize| {
        let t = BTree::new();
        for i in 0..2_000u64 {
            t.update(&i.to_be_bytes(), |s| {
                *s = Some(Record {
                    value: vec![1; value],
                    ..Record::default()
                })
            });
        }
        assert!(t.stats().leaves > 1);
        usize::from(t.leaf_lines.load(AtomicOrdering::Relaxed))
    };
    let big = lines(1_000);
    assert!(big > HEADER_LINES && big <= 24, "{big}");
    // A full leaf holds about 31 such records (1,040 bytes with their slots).
    assert!((28..=32).any(|n| leaf_prefetch_lines(n) == big), "{big}");
    assert_eq!(lines(100), HEADER_LINES);
}

/// Long keys (up to MAX_KEY, shared prefixes), values of every size class, in-place grow
/// and shrink through closures, ghosts, removals, hinted calls: the tree matches a model
/// and its page accounting (no leaked or doubly linked page) holds.
#[test]
fn long_keys_and_values_of_every_size_class_match_a_model() {
    use rand::{Rng, SeedableRng};
    for (seed, cap) in [
        (1u64, usize::MAX),
        (2, 3),
        (3, usize::MAX),
        (4, 5),
        (5, usize::MAX),
    ] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let t = BTree::with_capacity(cap, cap);
        let mut m: BTreeMap<Vec<u8>, Record> = BTreeMap::new();
        let mut hint: Option<LeafHint> = None;
        let mk_key = |rng: &mut rand::rngs::StdRng| -> Vec<u8> {
            let i: u16 = rng.gen_range(0..400);
            match rng.gen_range(0..4) {
                0 => {
                    let mut k = vec![b'x'; MAX_KEY];
                    k[MAX_KEY - 2..].copy_from_slice(&i.to_be_bytes());
                    k
                }
                1 => {
                    let mut k = vec![b'x'; rng.gen_range(17..MAX_KEY)];
                    k.extend_from_slice(&i.to_be_bytes());
                    k.truncate(MAX_KEY);
                    k
                }
                _ => i.to_be_bytes().to_vec(),
            }
        };
        let mk_len = |rng: &mut rand::rngs::StdRng| -> usize {
            match rng.gen_range(0..10) {
                0 => INLINE_VALUE,
                1 => INLINE_VALUE + 1,
                2 => rng.gen_range(INLINE_VALUE..3 * PAGE_SIZE),
                3 => INLINE_VALUE - 1,
                4 => 0,
                _ => rng.gen_range(1..300),
            }
        };
        for round in 0..6_000u32 {
            let k = mk_key(&mut rng);
            match rng.gen_range(0..10) {
                0 | 1 => {
                    t.update(&k, |s| *s = None);
                    m.remove(&k);
                }
                2 => {
                    // Grow or shrink an existing value in place.
                    let len = mk_len(&mut rng);
                    let b = (round % 251) as u8;
                    let (_, h) = t.update_hinted(&k, hint, |s| {
                        if let Some(r) = s {
                            r.value.resize(len, b);
                        }
                    });
                    hint = Some(h);
                    if let Some(r) = m.get_mut(&k) {
                        r.value.resize(len, b);
                    }
                }
                3 => {
                    t.update(&k, |s| {
                        if let Some(r) = s {
                            r.ghost = !r.ghost;
                        }
                    });
                    if let Some(r) = m.get_mut(&k) {
                        r.ghost = !r.ghost;
                    }
                }
                4 => {
                    let (got, h) = t.get_hinted(&k, hint, |r| r.cloned());
                    hint = Some(h);
                    assert_eq!(
                        got.as_ref().map(|r| r.value.len()),
                        m.get(&k).map(|r| r.value.len()),
                        "seed {seed} round {round}"
                    );
                    assert!(got == m.get(&k).cloned(), "seed {seed} round {round}");
                    let want = m.range(..k.clone()).next_back().map(|(k, _)| k.clone());
                    assert!(t.predecessor(&k) == want, "pred seed {seed} round {round}");
                }
                _ => {
                    let rec = Record {
                        value: vec![(round % 251) as u8; mk_len(&mut rng)],
                        ghost: rng.gen_bool(0.1),
                        tid: u64::from(round),
                    };
                    let (_, h) = t.update_hinted(&k, hint, |s| *s = Some(rec.clone()));
                    hint = Some(h);
                    m.insert(k, rec);
                }
            }
            if round % 500 == 0 {
                assert_eq!(t.check_invariants(), Ok(()), "seed {seed} round {round}");
            }
        }
        assert_eq!(t.check_invariants(), Ok(()), "seed {seed}");
        let all = t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX);
        assert!(
            all == m.clone().into_iter().collect::<Vec<_>>(),
            "seed {seed}"
        );
        for k in m.keys() {
            t.update(k, |s| *s = None);
        }
        assert_eq!(t.check_invariants(), Ok(()), "seed {seed}");
        let s = t.stats();
        assert_eq!(
            (s.entries, s.overflow, s.leaves, s.inner),
            (0, 0, 1, 0),
            "seed {seed} {s:?}"
        );
    }
}

/// A queue of keys of the longest length the database accepts (`MAX_KEY`): inserts at the
/// tail, removals at the head, thirty keys live at any time. Emptied leaves merge away (an
/// empty node always goes, though its two long fences fill more than a quarter of a page),
/// so the tree stays a few pages; it kept 530 (393 leaves empty) when only bytes counted.
#[test]
fn a_queue_of_the_longest_keys_keeps_the_tree_small() {
    let key = |i: u32| {
        let mut k = vec![b'q'; MAX_KEY];
        k[MAX_KEY - 4..].copy_from_slice(&i.to_be_bytes());
        k
    };
    let t = BTree::new();
    // One short key below the queue, so that the queue's leaves have long fences on
    // both sides.
    t.update(b"a", |s| *s = Some(Record::default()));
    let window = 30u32;
    for i in 0..2_000u32 {
        t.update(&key(i), |s| *s = Some(Record::default()));
        if let Some(old) = i.checked_sub(window) {
            t.update(&key(old), |s| *s = None);
        }
    }
    assert_eq!(t.check_invariants(), Ok(()));
    let s = t.stats();
    assert_eq!(s.entries, window as usize + 1);
    assert!(s.leaves + s.inner <= 16, "{s:?}");
    // Drain it: back to a single leaf.
    for i in 2_000 - window..2_000 {
        t.update(&key(i), |s| *s = None);
    }
    let s = t.stats();
    assert_eq!((s.entries, s.leaves, s.inner), (1, 1, 0), "{s:?}");
}

/// Overflow chains freed and reused while optimistic readers (hinted and not, point and
/// range) follow them: every validated value is whole (one byte repeated, its length a
/// function of that byte), and at the end no page leaked.
#[test]
fn readers_of_overflow_chains_never_see_torn_values() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let len_of = |b: u8| match b % 4 {
        0 => usize::from(b) * 3,
        1 => INLINE_VALUE + usize::from(b),
        2 => 2 * PAGE_SIZE + usize::from(b) * 11,
        _ => INLINE_VALUE - usize::from(b),
    };
    let key = |i: u64| {
        let mut k = vec![b'k'; if i.is_multiple_of(3) { 3000 } else { 8 }];
        k.extend_from_slice(&i.to_be_bytes());
        k
    };
    let t = BTree::new();
    let stop = AtomicBool::new(false);
    let writing = std::sync::atomic::AtomicUsize::new(2);
    std::thread::scope(|s| {
        for w in 0..2u64 {
            let (t, writing) = (&t, &writing);
            s.spawn(move || {
                let mut hint = None;
                for round in 0..4_000u64 {
                    let k = key((round * 7919 + w * 13) % 300);
                    let b = ((round * 31 + w) % 251) as u8;
                    if round % 6 == 5 {
                        let (_, h) = t.update_hinted(&k, hint, |s| *s = None);
                        hint = Some(h);
                    } else {
                        let (_, h) = t.update_hinted(&k, hint, |s| {
                            *s = Some(Record {
                                value: vec![b; len_of(b)],
                                ghost: false,
                                tid: u64::from(b),
                            })
                        });
                        hint = Some(h);
                    }
                }
                writing.fetch_sub(1, Relaxed);
            });
        }
        for _ in 0..2 {
            let (t, stop) = (&t, &stop);
            s.spawn(move || {
                let check = |r: &Record| {
                    let b = r.tid as u8;
                    assert_eq!(r.value.len(), len_of(b), "torn length");
                    assert!(r.value.iter().all(|&x| x == b), "torn value");
                };
                let mut hint = None;
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    i += 1;
                    let (_, h) = t.get_hinted(&key(i % 300), hint, |r| r.map(check));
                    hint = Some(h);
                    if i.is_multiple_of(50) {
                        for (_, r) in t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX) {
                            check(&r);
                        }
                    }
                }
            });
        }
        // Stop the readers once the writers are done.
        while writing.load(Relaxed) > 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        stop.store(true, Relaxed);
    });
    assert_eq!(t.check_invariants(), Ok(()));
}

/// The same through the database's API (default options: 4 KiB keys accepted): a queue of
/// long keys stays a few pages (17 MB for 31 rows when empty leaves with long fences
/// stayed).
#[test]
fn a_database_queue_of_long_keys_keeps_its_pages() {
    let db = crate::Database::in_memory();
    let t = db.create_table("q").expect("table");
    let key = |i: u32| {
        let mut k = vec![b'q'; 4096];
        k[4092..].copy_from_slice(&i.to_be_bytes());
        k
    };
    let mut tx = db.begin();
    tx.put(&t, "a", "v").expect("put");
    tx.commit().expect("commit");
    let mut at_100 = 0;
    for i in 0..2_000u32 {
        let mut tx = db.begin();
        tx.put(&t, key(i), "v").expect("put");
        if let Some(old) = i.checked_sub(30) {
            assert!(tx.delete(&t, key(old)).expect("delete"));
        }
        tx.commit().expect("commit");
        if i == 100 {
            at_100 = db.page_bytes();
        }
    }
    let end = db.page_bytes();
    assert!(
        end <= 2 * at_100,
        "31 rows: {at_100} bytes of pages at key 100, {end} at key 2000"
    );
}

#[test]
fn ascending_runs_split_without_an_image_whatever_the_record_size() {
    // Records of one size fill a leaf to the byte for some sizes: the append split then
    // finds no room for the leaf's new high fence and moves the leaf's last record along
    // instead of rewriting the page through an image.
    for vlen in 60..=200 {
        let t = BTree::new();
        let before = IMAGE_SPLITS.get();
        for k in 0..2_000u32 {
            t.update(&k.to_be_bytes(), |s| {
                *s = Some(Record {
                    value: vec![1; vlen],
                    ..Record::default()
                })
            });
        }
        assert_eq!(IMAGE_SPLITS.get() - before, 0, "values of {vlen} bytes");
        assert_eq!(t.check_invariants(), Ok(()), "values of {vlen} bytes");
        assert_eq!(t.stats().entries, 2_000);
    }
}
