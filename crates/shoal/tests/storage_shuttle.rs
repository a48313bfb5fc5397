//! Model checking of the page protocol of the B+-tree (`src/storage/btree.rs`) with shuttle:
//! optimistic lock coupling with the engine's own page latch (`src/storage/olc.rs`,
//! compiled here a second time against shuttle's atomics through `super::sync`) on a model
//! tree of tiny pages, with splits, merges, in-place updates and optimistic reads racing.
//!
//! The model follows the tree's protocol: pages are arrays of atomic words; a reader
//! descends without latching (read the root's version, pick the child, read the child's
//! version, validate the root's; read the leaf, validate the leaf's) and restarts on any
//! failed validation; a split latches the parent and the leaf by upgrading the versions an
//! optimistic descent read; a merge latches the root and the children exclusively,
//! top-down; an in-place update latches only its leaf, by upgrading the version
//! its optimistic descent read. Freed pages are cleared and reused, as in the page store.
//!
//! The properties: a reader's validated result is never torn (each record's two value
//! words are written one after the other by the updater, and must be equal), the leaf it
//! read holds the key within its fences with sorted keys, a key that is never removed is
//! always found (a descent never lands in a stale leaf), and the tree's invariants hold at
//! the end.

use std::sync::Arc;

use shuttle::sync::atomic::{AtomicU64, Ordering};
use shuttle::sync::Mutex;
use shuttle::thread;

/// The synchronization `olc.rs` uses, from shuttle.
mod sync {
    pub(super) use shuttle::sync::atomic::{fence, AtomicU64, Ordering};

    pub(super) fn spin_wait(spins: &mut u32) {
        *spins = spins.saturating_add(1);
        shuttle::thread::yield_now();
    }
}

#[path = "../src/storage/olc.rs"]
#[allow(dead_code)]
mod olc;

use olc::Latch;

const FREE: u64 = 0;
const LEAF: u64 = 1;
const INNER: u64 = 2;
/// No fence (+infinity for a high fence).
const INF: u64 = u64::MAX;

/// Word layout: kind, count, low fence, high fence, then entries. A leaf entry is three
/// words (key, value, value again); an inner node has its first child at word 4 and then
/// (separator, child) pairs.
const W_KIND: usize = 0;
const W_COUNT: usize = 1;
const W_LOW: usize = 2;
const W_HIGH: usize = 3;
const LEAF_CAP: usize = 2;
const WORDS: usize = 4 + 3 * LEAF_CAP + 8;
const PAGES: usize = 6;

struct Page {
    latch: Latch,
    w: Vec<AtomicU64>,
}

impl Page {
    fn get(&self, i: usize) -> u64 {
        self.w.get(i).map_or(0, |x| x.load(Ordering::Relaxed))
    }
    fn set(&self, i: usize, v: u64) {
        self.w[i].store(v, Ordering::Relaxed);
    }
}

struct Tree {
    pages: Vec<Page>,
    free: Mutex<Vec<usize>>,
}

/// What a reader saw in a leaf: `(key, value, value)` entries and the fences.
type LeafCopy = (Vec<(u64, u64, u64)>, u64, u64);

impl Tree {
    /// Root 0 (inner) over one empty leaf, page 1.
    fn new() -> Tree {
        let pages = (0..PAGES)
            .map(|_| Page {
                latch: Latch::new(),
                w: (0..WORDS).map(|_| AtomicU64::new(0)).collect(),
            })
            .collect::<Vec<_>>();
        pages[0].set(W_KIND, INNER);
        pages[0].set(W_LOW, 0);
        pages[0].set(W_HIGH, INF);
        pages[0].set(4, 1);
        pages[1].set(W_KIND, LEAF);
        pages[1].set(W_LOW, 0);
        pages[1].set(W_HIGH, INF);
        Tree {
            pages,
            free: Mutex::new((2..PAGES).collect()),
        }
    }

    fn root_seps(&self) -> Vec<(u64, usize)> {
        let r = &self.pages[0];
        let n = (r.get(W_COUNT) as usize).min(4);
        (0..n)
            .map(|i| (r.get(5 + 2 * i), r.get(6 + 2 * i) as usize))
            .collect()
    }

    /// The child of the root for `k` and its index (0 = first child).
    fn child_for(&self, k: u64) -> (usize, usize) {
        let mut c = self.pages[0].get(4) as usize;
        let mut idx = 0;
        for (i, (sep, child)) in self.root_seps().into_iter().enumerate() {
            if sep <= k {
                c = child;
                idx = i + 1;
            }
        }
        (c.min(PAGES - 1), idx)
    }

    fn leaf_entries(&self, p: usize) -> Vec<(u64, u64, u64)> {
        let pg = &self.pages[p];
        let n = (pg.get(W_COUNT) as usize).min(LEAF_CAP);
        (0..n)
            .map(|i| (pg.get(4 + 3 * i), pg.get(5 + 3 * i), pg.get(6 + 3 * i)))
            .collect()
    }

    fn write_leaf(&self, p: usize, ents: &[(u64, u64, u64)], low: u64, high: u64) {
        let pg = &self.pages[p];
        pg.set(W_KIND, LEAF);
        pg.set(W_COUNT, ents.len() as u64);
        pg.set(W_LOW, low);
        pg.set(W_HIGH, high);
        for (i, e) in ents.iter().enumerate() {
            pg.set(4 + 3 * i, e.0);
            pg.set(5 + 3 * i, e.1);
            pg.set(6 + 3 * i, e.2);
        }
    }

    fn write_root_seps(&self, seps: &[(u64, usize)]) {
        let r = &self.pages[0];
        r.set(W_COUNT, seps.len() as u64);
        for (i, (s, c)) in seps.iter().enumerate() {
            r.set(5 + 2 * i, *s);
            r.set(6 + 2 * i, *c as u64);
        }
    }

    /// Optimistic lookup: the validated copy of the leaf for `k` and the leaf's page and
    /// version.
    fn read_leaf(&self, k: u64) -> (LeafCopy, usize, u64) {
        loop {
            let root = &self.pages[0];
            let rv = root.latch.optimistic();
            let (c, _) = self.child_for(k);
            let leaf = &self.pages[c];
            let lv = leaf.latch.optimistic();
            if !root.latch.validate(rv) {
                continue;
            }
            let kind = leaf.get(W_KIND);
            let copy = (self.leaf_entries(c), leaf.get(W_LOW), leaf.get(W_HIGH));
            if !leaf.latch.validate(lv) {
                continue;
            }
            assert_eq!(kind, LEAF, "a validated descent reached a non-leaf page");
            return (copy, c, lv);
        }
    }

    /// The reader: a validated lookup, checked.
    fn lookup(&self, k: u64) -> bool {
        let ((ents, low, high), _, _) = self.read_leaf(k);
        assert!(
            low <= k && k < high,
            "the leaf's fences do not hold the key"
        );
        assert!(ents.windows(2).all(|w| w[0].0 < w[1].0), "unsorted leaf");
        for &(key, a, b) in &ents {
            assert_eq!(a, b, "a torn record");
            assert!(low <= key && key < high, "a key outside its leaf's fences");
        }
        ents.iter().any(|e| e.0 == k)
    }

    /// In-place update with the leaf latch only (upgrade from the optimistic version).
    fn bump(&self, k: u64) {
        loop {
            let (_, c, lv) = self.read_leaf(k);
            let leaf = &self.pages[c];
            if !leaf.latch.try_upgrade(lv) {
                continue;
            }
            let ents = self.leaf_entries(c);
            match ents.iter().position(|e| e.0 == k) {
                Some(i) => {
                    // Two stores: a reader between them sees a torn record unless it fails
                    // validation.
                    let g = ents[i].1 + 1;
                    leaf.set(5 + 3 * i, g);
                    thread::yield_now();
                    leaf.set(6 + 3 * i, g);
                    leaf.latch.unlock();
                }
                None => leaf.latch.unlock_unchanged(lv),
            }
            return;
        }
    }

    /// Insert with a split when the leaf is full, as `BTree::split_under_parent` does it: an
    /// optimistic descent, then the parent (the root here) and the leaf latched by
    /// upgrading the versions the descent read, parent first; a failed upgrade releases
    /// what it holds and starts over.
    fn insert(&self, k: u64) {
        let root = &self.pages[0];
        let (c, idx, leaf) = loop {
            let rv = root.latch.optimistic();
            let (c, idx) = self.child_for(k);
            let leaf = &self.pages[c];
            let lv = leaf.latch.optimistic();
            if !root.latch.validate(rv) || !root.latch.try_upgrade(rv) {
                continue;
            }
            if !leaf.latch.try_upgrade(lv) {
                root.latch.unlock_unchanged(rv);
                continue;
            }
            break (c, idx, leaf);
        };
        let mut ents = self.leaf_entries(c);
        if ents.iter().any(|e| e.0 == k) {
            leaf.latch.unlock();
            root.latch.unlock();
            return;
        }
        let at = ents.partition_point(|e| e.0 < k);
        ents.insert(at, (k, 0, 0));
        let (low, high) = (leaf.get(W_LOW), leaf.get(W_HIGH));
        if ents.len() <= LEAF_CAP {
            self.write_leaf(c, &ents, low, high);
        } else {
            let np = self.free.lock().unwrap().pop().expect("a free page");
            let new = &self.pages[np];
            new.latch.lock();
            let right = ents.split_off(ents.len() / 2);
            let sep = right[0].0;
            self.write_leaf(np, &right, sep, high);
            new.latch.unlock();
            self.write_leaf(c, &ents, low, sep);
            let mut seps = self.root_seps();
            seps.insert(idx, (sep, np));
            self.write_root_seps(&seps);
        }
        leaf.latch.unlock();
        root.latch.unlock();
    }

    /// Remove; an emptied leaf merges with its right sibling (or its left one).
    fn remove(&self, k: u64) {
        let root = &self.pages[0];
        root.latch.lock();
        let (c, idx) = self.child_for(k);
        let leaf = &self.pages[c];
        leaf.latch.lock();
        let mut ents = self.leaf_entries(c);
        ents.retain(|e| e.0 != k);
        let (low, high) = (leaf.get(W_LOW), leaf.get(W_HIGH));
        self.write_leaf(c, &ents, low, high);
        let mut seps = self.root_seps();
        if ents.is_empty() && !seps.is_empty() {
            // Merge: the right page of the pair goes away.
            let (l, r, s) = if idx < seps.len() {
                (c, seps[idx].1, idx)
            } else {
                (seps[idx - 1].1.min(PAGES - 1), c, idx - 1)
            };
            let (lp, rp) = (&self.pages[l], &self.pages[r]);
            if l != c {
                lp.latch.lock();
            }
            if r != c {
                rp.latch.lock();
            }
            let mut all = self.leaf_entries(l);
            all.extend(self.leaf_entries(r));
            self.write_leaf(l, &all, lp.get(W_LOW), rp.get(W_HIGH));
            for w in 0..WORDS {
                rp.set(w, 0);
            }
            rp.set(W_KIND, FREE);
            seps.remove(s);
            self.write_root_seps(&seps);
            if l != c {
                lp.latch.unlock();
            }
            rp.latch.unlock();
            if r != c {
                leaf.latch.unlock();
            }
            self.free.lock().unwrap().push(r);
        } else {
            leaf.latch.unlock();
        }
        root.latch.unlock();
    }

    /// The structure, quiescent: fences match the root's separators, keys sorted within
    /// them, no torn record, every page either reachable or free.
    fn check(&self) {
        let seps = self.root_seps();
        let mut children = vec![self.pages[0].get(4) as usize];
        children.extend(seps.iter().map(|s| s.1));
        let mut bounds = vec![0];
        bounds.extend(seps.iter().map(|s| s.0));
        bounds.push(INF);
        for (i, &c) in children.iter().enumerate() {
            let p = &self.pages[c];
            assert_eq!(p.get(W_KIND), LEAF);
            assert_eq!((p.get(W_LOW), p.get(W_HIGH)), (bounds[i], bounds[i + 1]));
            let ents = self.leaf_entries(c);
            assert!(ents.windows(2).all(|w| w[0].0 < w[1].0));
            assert!(ents
                .iter()
                .all(|e| e.1 == e.2 && bounds[i] <= e.0 && e.0 < bounds[i + 1]));
        }
        let free = self.free.lock().unwrap().clone();
        assert_eq!(children.len() + free.len() + 1, PAGES, "a page leaked");
        for f in free {
            assert_eq!(self.pages[f].get(W_KIND), FREE);
        }
    }
}

/// Stable keys (never removed) and transient ones (inserted and removed).
const STABLE: [u64; 2] = [20, 50];

fn scenario() {
    let t = Arc::new(Tree::new());
    for k in STABLE {
        t.insert(k);
    }
    let mut hs = Vec::new();
    // Two writers split and merge at the same time (the splits race each other for the
    // root's version).
    for keys in [[10, 30], [40, 60]] {
        let t = t.clone();
        hs.push(thread::spawn(move || {
            for k in keys {
                t.insert(k);
            }
            for k in keys {
                t.remove(k);
            }
        }));
    }
    {
        let t = t.clone();
        hs.push(thread::spawn(move || {
            for k in STABLE {
                t.bump(k);
            }
        }));
    }
    for _ in 0..2 {
        let t = t.clone();
        hs.push(thread::spawn(move || {
            for k in [20, 30, 50, 10] {
                let found = t.lookup(k);
                if STABLE.contains(&k) {
                    assert!(found, "a key that is never removed was not found");
                }
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    t.check();
    for k in STABLE {
        assert!(t.lookup(k));
    }
}

#[test]
fn optimistic_reads_race_with_splits_merges_and_updates() {
    shuttle::check_random(scenario, 2000);
}

#[test]
fn optimistic_reads_race_with_splits_merges_and_updates_pct() {
    shuttle::check_pct(scenario, 2000, 3);
}
