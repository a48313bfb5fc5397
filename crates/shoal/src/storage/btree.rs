//! A B+-tree on fixed-size pages with fence keys, ghost records and optimistic lock coupling.
//!
//! Nodes are slotted pages (`node.rs`) of a [`PageStore`] (`page.rs`), named by page id;
//! an inner node holds its children's page ids. Page 0 is the root and is never replaced: a
//! root split moves its contents into two new children, and a root left with one child takes
//! that child's contents, so no root pointer exists to latch.
//!
//! **Optimistic lock coupling** (Leis et al., DaMoN 2016; LeanStore, ICDE 2018). Every page
//! has a version latch (`olc.rs`). A reader descends without latching: it reads a node's
//! version, picks the child, reads the child's version and validates the parent's (so the
//! child id it used was current), and at the leaf copies what it needs and validates the
//! leaf's version; any failed validation restarts from the root. Readers write no shared
//! memory, so the root's cache line stays shared by all cores. The closure passed to
//! [`BTree::get`] runs only on a validated copy of the record, after every latch check.
//!
//! A writer descends the same way and upgrades the leaf's version to an exclusive latch
//! ([`Latch::try_upgrade`](super::olc::Latch::try_upgrade); a failure restarts), if the leaf
//! has room for what the closure may do: for a key that is there, 16 bytes (a value that
//! no longer fits inline goes to overflow pages, see below); for a key that is absent, a
//! slot, the key and an inline value of the largest inline size. Otherwise it restarts in
//! pessimistic mode: exclusive latch coupling from the root with preemptive splits of full
//! inner nodes, so the leaf's parent, latched with the leaf, has room for a separator, and
//! the leaf is split after the closure ran only if its result does not fit. Splits keep
//! the left page full when the new key is the greatest in the leaf (sequential inserts: an
//! append-only table's leaves end up full), and halve the bytes otherwise.
//!
//! **Optimistic concurrency control on this tree.** The TID word and the ghost bit of each
//! record sit in its slot and record data. OCC reads them with [`BTree::get_hinted`] (an
//! optimistic, validated copy, so a TID and the value it stamps are read atomically), locks
//! and installs them with [`BTree::update_hinted`] (the leaf's exclusive latch), and
//! protects against phantoms by re-scanning its scanned ranges at validation with
//! [`BTree::range`], whose result is validated leaf by leaf: no node-set versions are kept
//! across the transaction, so splits and merges cause no false aborts.
//!
//! **Fence keys** (Kimura et al. 2012 §2.2, after Graefe): every node stores a low fence
//! (inclusive, `None` = -infinity) and a high fence (exclusive, `None` = +infinity), copies
//! of the separators around it in its parent. They replace sibling pointers: a range scan
//! goes on from a leaf's high fence with a new descent, and the predecessor of the first key
//! of a leaf is found by searching below its low fence. They also validate [`LeafHint`]s: a
//! hint is a page id; the hinted page is used only if, at a validated version, it is a leaf
//! whose fences hold the key (a merged page is free, a reused one has new fences).
//!
//! **Merges**: a removal that leaves a leaf empty or underfull (below a quarter of a page,
//! or of the slot capacity of [`BTree::with_capacity`]) merges it with a sibling after the
//! fact, top-down with exclusive latch coupling (`BTree::rebalance`), when both fit in one
//! page with a quarter to spare (an empty node always goes); the root collapses when it has
//! one child. Freed pages go to the store's free list, which splits and overflow chains
//! reuse.
//!
//! **Ghost records** are ordinary records with the ghost bit set; the transaction layer owns
//! the bit and removes ghosts when no transaction can need them.
//!
//! Deviations: merges are not guaranteed (an underfull node whose siblings are too full
//! stays; no redistribution). A present record whose value grows past the room in its leaf
//! on the optimistic path is stored in overflow pages even if it is short, rather than
//! splitting the leaf. No prefix truncation: heads are a key's first 16 bytes. A point read
//! ([`BTree::get_hinted`]) that failed validation 16 times latches the leaf exclusively
//! for its copy, so it cannot starve behind a stream of writers (LeanStore falls back to a
//! shared latch; this latch has no shared mode); range scans and predecessor searches still
//! only retry.

use std::cell::Cell;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering as AtomicOrdering};

use super::node::{
    is_overflow_len, leaf_prefetch_lines, Entry, Image, Item, Node, Probe, KIND_FREE, KIND_INNER,
    KIND_LEAF, OVF_REF,
};
use super::overflow;
use super::page::{Frame, PageId, PageStore, HEADER_LINES, INLINE_VALUE, MAX_KEY, PAGE_SIZE};

/// One record: the value bytes, the ghost bit and the TID word. A ghost is a logically deleted
/// record whose key still takes part in key-range locking (2PL) or carries the TID of the
/// delete (optimistic concurrency control).
///
/// ```
/// use shoal::storage::btree::Record;
/// let r = Record { value: b"v".to_vec(), ghost: false, tid: 0 };
/// assert!(!r.ghost);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Record {
    /// The value bytes.
    pub value: Vec<u8>,
    /// Logically deleted.
    pub ghost: bool,
    /// The TID word of optimistic concurrency control (Silo): the commit TID of the last
    /// transaction that wrote the record, with the top bit as the lock bit held by a committing
    /// writer. Written only under the leaf's exclusive latch. Always 0 under two-phase locking.
    pub tid: u64,
}

impl Record {
    /// A live record holding a copy of `value`, in the thread's spare buffer when it has one
    /// (the tree gives that buffer back once the record is in a page, so an insert through
    /// [`BTree::update`] allocates nothing).
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// let t = BTree::new();
    /// t.update(b"k", |s| *s = Some(Record::copied(b"v")));
    /// assert_eq!(t.get(b"k", |r| r.unwrap().value.clone()), b"v");
    /// ```
    pub fn copied(value: &[u8]) -> Record {
        // `try_with`: a thread being torn down has no buffer to lend.
        let mut v = SCRATCH.try_with(Cell::take).unwrap_or_default();
        v.clear();
        v.extend_from_slice(value);
        Record {
            value: v,
            ghost: false,
            tid: 0,
        }
    }
}

/// The root's page id.
const ROOT: PageId = 0;

/// The shape of a [`BTree`], from [`BTree::stats`] (for tests and diagnostics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Entries, ghosts included.
    pub entries: usize,
    /// Entries with the ghost bit set.
    pub ghosts: usize,
    /// Leaves reachable from the root.
    pub leaves: usize,
    /// Leaves without entries (only the root, or a leaf with no sibling to merge with).
    pub empty_leaves: usize,
    /// Inner nodes reachable from the root.
    pub inner: usize,
    /// Levels, leaves included.
    pub height: usize,
    /// Free pages kept for reuse.
    pub free: usize,
    /// Overflow pages reachable from records.
    pub overflow: usize,
    /// Pages allocated and not free (nodes and overflow pages).
    pub pages: usize,
    /// Bytes of the pages in use (`pages` times the page size).
    pub bytes: usize,
}

/// The id of the next [`BTree`]. Ids are never reused (a `u64` does not wrap in practice).
static NEXT_TREE_ID: AtomicU64 = AtomicU64::new(1);

/// An opaque handle to the leaf where an operation on a key ended, returned by
/// [`BTree::get_hinted`] and [`BTree::update_hinted`] and accepted back by them to skip the
/// root-to-leaf descent (Silo keeps record pointers for the same reason).
///
/// A hint is a tree id and a page id, and only ever a guess: the tree uses it only if it is
/// a hint of this very tree and, at a validated version, the page is still a leaf whose fence
/// keys hold the key; otherwise it descends from the root as usual. A stale hint, or one
/// from another tree, costs a version check and two comparisons, never a wrong answer.
///
/// ```
/// use shoal::storage::btree::{BTree, Record};
/// let t = BTree::new();
/// let ((), hint) = t.update_hinted(b"k", None, |s| *s = Some(Record::default()));
/// // The second access goes straight to the leaf.
/// let (found, _) = t.get_hinted(b"k", Some(hint), |r| r.is_some());
/// assert!(found);
/// // A hint is only a guess: any key works with any hint.
/// let (found, _) = t.get_hinted(b"other", Some(hint), |r| r.is_some());
/// assert!(!found);
/// ```
///
/// A hint from [`BTree::get_hinted`] also carries the leaf's version at which the read was
/// consistent: [`BTree::unchanged_since`] then says whether any writer has latched the leaf
/// since, which is how OCC validates a read without searching the leaf again.
#[derive(Clone, Copy, Debug)]
pub struct LeafHint {
    tree: u64,
    page: PageId,
    /// The leaf's version when a read of it was validated ([`NO_VERSION`]: unknown).
    version: u64,
}

/// Two hints are equal when they name the same leaf of the same tree, whatever versions
/// they carry.
impl PartialEq for LeafHint {
    fn eq(&self, other: &Self) -> bool {
        (self.tree, self.page) == (other.tree, other.page)
    }
}

impl Eq for LeafHint {}

/// A [`LeafHint`] that carries no version (never equal to a latch's version: that has the
/// writer bit clear whenever it validates).
const NO_VERSION: u64 = u64::MAX;

/// A concurrent ordered index from byte keys to [`Record`]s.
///
/// ```
/// use shoal::storage::btree::{BTree, Record};
/// use std::ops::Bound;
/// let t = BTree::new();
/// for k in [b"b", b"a", b"c"] {
///     t.update(k, |slot| *slot = Some(Record { value: k.to_vec(), ghost: false, tid: 0 }));
/// }
/// assert_eq!(t.get(b"b", |r| r.map(|r| r.value.clone())), Some(b"b".to_vec()));
/// assert_eq!(t.predecessor(b"b"), Some(b"a".to_vec()));
/// let all = t.range(Bound::Unbounded, Bound::Excluded(b"c"), 10);
/// assert_eq!(all.len(), 2);
/// ```
pub struct BTree {
    store: PageStore,
    /// Most entries of a leaf (`usize::MAX`: as many as fit in a page).
    leaf_cap: usize,
    /// Most separators of an inner node (`usize::MAX`: as many as fit).
    inner_cap: usize,
    /// Unique among all trees this process ever makes ([`NEXT_TREE_ID`]): a [`LeafHint`] is
    /// honoured only by the tree with its id.
    id: u64,
    /// Cache lines a descent prefetches from the leaf it reaches
    /// ([`leaf_prefetch_lines`](super::node::leaf_prefetch_lines) of the slot count of the
    /// last leaf that split full). Written at splits only, and only when it changes, so
    /// readers on other cores keep their copy of the line.
    leaf_lines: AtomicU8,
}

impl Default for BTree {
    fn default() -> Self {
        Self::new()
    }
}

thread_local! {
    /// A value buffer reused by lookups and updates, so that neither allocates.
    static SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    /// A key buffer for the prior key an insert is told (see
    /// [`BTree::update_with_prior`]), so that telling it allocates nothing.
    static PRIOR: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Keeps `v`'s allocation as the thread's [`SCRATCH`] buffer (unless it is larger than a
/// page: one huge value must not stay pinned per thread).
fn give_back(mut v: Vec<u8>) {
    if v.capacity() <= PAGE_SIZE {
        v.clear();
        // `try_with`: a thread being torn down keeps nothing.
        let _ = SCRATCH.try_with(|s| s.set(v));
    }
}

/// What a leaf operation found: the record copied out, or none.
struct Copied {
    found: bool,
    ghost: bool,
    tid: u64,
}

/// What the tree did with the closure's result.
enum Applied<R> {
    /// Done; `true` when a removal left the leaf empty or newly underfull.
    Done(R, bool),
    /// The new entry for slot `i` does not fit: the caller splits the leaf and inserts it.
    Split(R, usize, Item),
    /// Done, but a grown value that belongs inline went to an overflow chain because the
    /// leaf had no room and the caller could not split it: the caller, once it has
    /// unlatched, calls [`BTree::reinline`].
    Spilled(R),
}

/// Where a descent goes.
#[derive(Clone, Copy)]
enum Target<'a> {
    /// The leaf whose range holds the key.
    Key(&'a Probe<'a>),
    /// The leaf whose keys end just below the key.
    Below(&'a Probe<'a>),
    /// The leftmost leaf.
    First,
    /// The rightmost leaf.
    Last,
}

/// Bytes an entry for a key of `klen` bytes takes at most with an inline value.
fn max_entry(klen: usize) -> usize {
    32 + ((klen + INLINE_VALUE + 7) & !7)
}

/// Failed optimistic attempts after which a point read latches the leaf instead (tests use
/// a low count so that both paths run under their concurrent writers).
const PESSIMISTIC_AFTER: u32 = if cfg!(test) { 2 } else { 16 };

/// Optimistic tries of a split under the parent's latch before the pessimistic path.
const SPLIT_ATTEMPTS: u32 = 8;

/// Bytes a separator takes at most.
const MAX_SEP: usize = 32 + MAX_KEY;

impl BTree {
    /// An empty tree whose nodes hold as many entries as fit in a page.
    pub fn new() -> Self {
        Self::with_capacity(usize::MAX, usize::MAX)
    }

    /// An empty tree whose nodes hold at most the given numbers of entries (at least 3 each)
    /// besides the page size limit (tests use tiny nodes to force splits).
    ///
    /// ```
    /// let t = shoal::storage::btree::BTree::with_capacity(3, 3);
    /// assert!(t.is_empty());
    /// ```
    pub fn with_capacity(leaf_cap: usize, inner_cap: usize) -> Self {
        Self::build(PageStore::new(), leaf_cap, inner_cap)
    }

    /// An empty tree ([`new`](Self::new)) that counts its pages in `counts`, with the other
    /// trees given the same counts (a database's tables, for its memory limit), its pages on
    /// transparent huge pages when `huge` (see `Options::huge_pages`).
    pub fn counted(counts: std::sync::Arc<super::page::PageCounts>, huge: bool) -> Self {
        Self::build(PageStore::counted(counts, huge), usize::MAX, usize::MAX)
    }

    /// Pages this tree freed and has not reused yet (on its store's free list).
    pub fn free_pages(&self) -> usize {
        self.store.pages_free()
    }

    fn build(store: PageStore, leaf_cap: usize, inner_cap: usize) -> Self {
        let root = store.alloc();
        debug_assert_eq!(root, ROOT);
        let t = BTree {
            store,
            leaf_cap: leaf_cap.max(3),
            inner_cap: inner_cap.max(3),
            id: NEXT_TREE_ID.fetch_add(1, AtomicOrdering::Relaxed),
            leaf_lines: AtomicU8::new(HEADER_LINES as u8),
        };
        let f = t.frame_of(ROOT);
        f.latch.lock();
        Node(f).write_image(&Image::leaf(None, None));
        f.latch.unlock();
        t
    }

    /// The frame of a page that a latched node or the tree itself names.
    fn frame_of(&self, pid: PageId) -> &Frame {
        match self.store.frame(pid) {
            Some(f) => f,
            None => unreachable!("page {pid} of a latched node has no frame"),
        }
    }

    fn hint(&self, page: PageId) -> LeafHint {
        self.hint_at(page, NO_VERSION)
    }

    /// A hint to `page` whose reads were consistent at version `version`.
    fn hint_at(&self, page: PageId, version: u64) -> LeafHint {
        LeafHint {
            tree: self.id,
            page,
            version,
        }
    }

    /// True when the leaf of `hint`, a hint that [`get_hinted`](Self::get_hinted) returned,
    /// has not been latched by any writer since that read: every record in it, TID and lock
    /// bit included, is as the read saw it (every change of a leaf, a lock bit's too, takes
    /// its exclusive latch, and a page that is freed or reused is latched first). False
    /// when it has, or when the hint carries no version or is another tree's.
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// let t = BTree::new();
    /// t.update(b"a", |s| *s = Some(Record::default()));
    /// let (_, h) = t.get_hinted(b"a", None, |r| r.is_some());
    /// assert!(t.unchanged_since(h));
    /// t.update(b"b", |s| *s = Some(Record::default())); // same leaf
    /// assert!(!t.unchanged_since(h));
    /// ```
    pub fn unchanged_since(&self, hint: LeafHint) -> bool {
        hint.tree == self.id
            && hint.version != NO_VERSION
            && self
                .store
                .frame(hint.page)
                .is_some_and(|f| f.latch.validate(hint.version))
    }

    /// Optimistic descent to the leaf for `t`: the leaf's page id, frame and version, and
    /// its parent's frame and version (`None` for the root). `None` when a validation
    /// failed (restart).
    #[allow(clippy::type_complexity)]
    fn descend(&self, t: Target<'_>) -> Option<(PageId, &Frame, u64, Option<(&Frame, u64)>)> {
        let mut pid = ROOT;
        let mut f = self.frame_of(ROOT);
        let mut v = f.latch.optimistic();
        let mut parent = None;
        loop {
            let n = Node(f);
            match n.kind() {
                KIND_LEAF => return Some((pid, f, v, parent)),
                KIND_INNER => {}
                _ => return None,
            }
            let i = match t {
                Target::Key(p) => n.child_index(p),
                Target::Below(p) => n.child_index_below(p),
                Target::First => 0,
                Target::Last => n.count(),
            };
            let c = n.child(i);
            let cf = self.store.frame(c)?;
            if n.leaf_children() {
                // A small leaf's whole slot array comes with its header (`leaf_lines`).
                cf.prefetch_lines(usize::from(self.leaf_lines.load(AtomicOrdering::Relaxed)));
            } else {
                cf.prefetch_header();
            }
            let cv = cf.latch.optimistic();
            if !f.latch.validate(v) {
                return None;
            }
            parent = Some((f, v));
            (pid, f, v) = (c, cf, cv);
        }
    }

    /// The leaf for `p`, from `hint` if it holds (at a version to validate), else by descent.
    fn find_leaf(&self, p: &Probe<'_>, hint: Option<LeafHint>) -> Option<(PageId, &Frame, u64)> {
        if let Some(h) = hint.filter(|h| h.tree == self.id) {
            if let Some(f) = self.store.frame(h.page) {
                // The header with the search hints and the fences' heads (the hinted leaf
                // has usually left the cache since): `covers` mostly decides from those.
                f.prefetch_header();
                if let Some(v) = f.latch.try_optimistic() {
                    let n = Node(f);
                    if n.is_leaf() && n.covers(p) && f.latch.validate(v) {
                        return Some((h.page, f, v));
                    }
                }
            }
        }
        self.descend(Target::Key(p))
            .map(|(pid, f, v, _)| (pid, f, v))
    }

    /// Copies `key`'s record at slot `found` of `n` into `value` (cleared first).
    fn copy_record(&self, n: Node<'_>, found: Result<usize, usize>, value: &mut Vec<u8>) -> Copied {
        value.clear();
        match found {
            Err(_) => Copied {
                found: false,
                ghost: false,
                tid: 0,
            },
            Ok(i) => {
                let m = n.meta(i);
                if m.ovf {
                    let mut r = Vec::with_capacity(OVF_REF);
                    n.val_into(i, &mut r);
                    // A failed chain read is a torn read: the caller's validation fails.
                    let _ = overflow::read(&self.store, &r, value);
                } else {
                    n.val_into(i, value);
                }
                Copied {
                    found: true,
                    ghost: m.ghost,
                    tid: n.word(i),
                }
            }
        }
    }

    /// Calls `f` with the record at `key` (ghosts included), a validated copy.
    ///
    /// ```
    /// let t = shoal::storage::btree::BTree::new();
    /// assert!(t.get(b"k", |r| r.is_none()));
    /// ```
    pub fn get<R>(&self, key: &[u8], f: impl FnOnce(Option<&Record>) -> R) -> R {
        self.get_hinted(key, None, f).0
    }

    /// Like [`get`](Self::get), and first tries the leaf `hint` names (see [`LeafHint`]);
    /// also returns the hint of the leaf where `key` was looked up (whether or not it was
    /// found: an insert of `key` goes to that leaf, unless it splits first).
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// let t = BTree::with_capacity(3, 3);
    /// let (_, h) = t.update_hinted(b"a", None, |s| *s = Some(Record::default()));
    /// for i in 0u8..50 {
    ///     t.update(&[b'b', i], |s| *s = Some(Record::default())); // split the leaf
    /// }
    /// // The hint may be stale by now: the answer is still right.
    /// let (found, h) = t.get_hinted(b"a", Some(h), |r| r.is_some());
    /// assert!(found);
    /// assert!(t.get_hinted(b"a", Some(h), |r| r.is_some()).0);
    /// ```
    pub fn get_hinted<R>(
        &self,
        key: &[u8],
        hint: Option<LeafHint>,
        f: impl FnOnce(Option<&Record>) -> R,
    ) -> (R, LeafHint) {
        self.get_hinted_mut(key, hint, |r| f(r.map(|r| &*r)))
    }

    /// Like [`get_hinted`](Self::get_hinted), with the copy handed to `f` mutably: a caller
    /// that keeps the value takes it (`std::mem::take`) instead of cloning it.
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// let t = BTree::new();
    /// t.update(b"k", |s| *s = Some(Record { value: b"v".to_vec(), ..Record::default() }));
    /// let (v, _) = t.get_hinted_mut(b"k", None, |r| r.map(|r| std::mem::take(&mut r.value)));
    /// assert_eq!(v, Some(b"v".to_vec()));
    /// ```
    pub fn get_hinted_mut<R>(
        &self,
        key: &[u8],
        hint: Option<LeafHint>,
        f: impl FnOnce(Option<&mut Record>) -> R,
    ) -> (R, LeafHint) {
        let p = Probe::new(key);
        let mut rec = Record {
            // `try_with`: a thread being torn down has no buffer to lend.
            value: SCRATCH.try_with(Cell::take).unwrap_or_default(),
            ghost: false,
            tid: 0,
        };
        let mut hint = hint;
        let mut failed = 0u32;
        let (c, pid, at) = loop {
            let Some((pid, fr, v)) = self.find_leaf(&p, hint) else {
                failed += 1;
                continue;
            };
            let n = Node(fr);
            if failed >= PESSIMISTIC_AFTER {
                // Writers keep changing this leaf under the optimistic reads: latch it, as
                // writers do, so the read ends. Under the latch, a leaf whose fences hold
                // the key is the key's leaf.
                let v0 = fr.latch.lock();
                #[cfg(test)]
                tests::PESSIMISTIC_READS.fetch_add(1, AtomicOrdering::Relaxed);
                if n.is_leaf() && n.covers(&p) {
                    let c = self.copy_record(n, n.search(&p), &mut rec.value);
                    fr.latch.unlock_unchanged(v0);
                    break (c, pid, v0);
                }
                fr.latch.unlock_unchanged(v0);
                hint = None;
                continue;
            }
            let c = self.copy_record(n, n.search(&p), &mut rec.value);
            if fr.latch.validate(v) {
                break (c, pid, v);
            }
            failed += 1;
            hint = None;
        };
        rec.ghost = c.ghost;
        rec.tid = c.tid;
        let r = f(c.found.then_some(&mut rec));
        give_back(rec.value);
        (r, self.hint_at(pid, at))
    }

    /// Calls `f` with the slot of `key` under the leaf's exclusive latch: `None` if absent.
    /// Setting the slot to `Some` inserts, to `None` removes; `f` runs exactly once.
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// let t = BTree::new();
    /// t.update(b"k", |s| *s = Some(Record::default()));
    /// t.update(b"k", |s| s.as_mut().unwrap().ghost = true);
    /// assert!(t.get(b"k", |r| r.unwrap().ghost));
    /// t.update(b"k", |s| *s = None);
    /// assert!(t.is_empty());
    /// ```
    pub fn update<R>(&self, key: &[u8], f: impl FnOnce(&mut Option<Record>) -> R) -> R {
        self.update_impl(&Probe::new(key), None, false, |slot, _| f(slot))
            .0
    }

    /// Like [`update`](Self::update), and, when `key` is absent, also tells `f` the greatest
    /// key below it (ghosts included) if the latched leaf shows it: `Some(Some(k))`, or
    /// `Some(None)` when no key is below `key`; `None` when it is in another leaf (ask
    /// [`predecessor`](Self::predecessor)) or when `key` is present (an update needs no prior
    /// key, and copying it out would cost an allocation). Saves an inserter a descent, and
    /// lets it check the prior key under the same latch as the insert. Starts from the leaf
    /// `hint` names if it holds the key, and returns the hint of the leaf it latched.
    ///
    /// With `want_prior` false, `f` is told `None` always (as [`update_hinted`](Self::update_hinted)
    /// would, in the same shape).
    pub(crate) fn update_with_prior<R>(
        &self,
        key: &[u8],
        hint: Option<LeafHint>,
        want_prior: bool,
        f: impl FnOnce(&mut Option<Record>, Option<Option<&[u8]>>) -> R,
    ) -> (R, LeafHint) {
        let (r, pid) = self.update_impl(&Probe::new(key), hint, want_prior, f);
        (r, self.hint(pid))
    }

    /// Like [`update`](Self::update), and first tries the leaf `hint` names (see
    /// [`LeafHint`]); also returns the hint of the leaf that held the slot.
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// let t = BTree::new();
    /// let (_, h) = t.update_hinted(b"k", None, |s| *s = Some(Record::default()));
    /// let (_, h) = t.update_hinted(b"k", Some(h), |s| s.as_mut().unwrap().tid = 7);
    /// assert_eq!(t.get_hinted(b"k", Some(h), |r| r.unwrap().tid).0, 7);
    /// ```
    pub fn update_hinted<R>(
        &self,
        key: &[u8],
        hint: Option<LeafHint>,
        f: impl FnOnce(&mut Option<Record>) -> R,
    ) -> (R, LeafHint) {
        let (r, pid) = self.update_impl(&Probe::new(key), hint, false, |slot, _| f(slot));
        (r, self.hint(pid))
    }

    /// Whether `f` on `p`'s slot in `n` (exclusively latched) can do without a split, given
    /// `found`, `n.search(p)`.
    /// An existing key's record needs `grow` more bytes at most (`OVF_REF` for an
    /// ordinary update: a value that does not fit goes to an overflow chain and leaves a
    /// reference; see [`Applied::Spilled`]).
    fn room_for(
        &self,
        n: Node<'_>,
        p: &Probe<'_>,
        found: Result<usize, usize>,
        grow: usize,
    ) -> bool {
        match found {
            Ok(_) => n.free_total() >= grow,
            Err(_) => n.count() < self.leaf_cap && n.free_total() >= max_entry(p.bytes.len()),
        }
    }

    fn update_impl<R>(
        &self,
        p: &Probe<'_>,
        hint: Option<LeafHint>,
        want_prior: bool,
        f: impl FnOnce(&mut Option<Record>, Option<Option<&[u8]>>) -> R,
    ) -> (R, PageId) {
        let mut hint = hint;
        // Optimistic: latch the leaf only.
        loop {
            let Some((pid, fr, v)) = self.find_leaf(p, hint) else {
                continue;
            };
            if !fr.latch.try_upgrade(v) {
                hint = None;
                continue;
            }
            let n = Node(fr);
            let found = n.search(p);
            if !self.room_for(n, p, found, OVF_REF) {
                fr.latch.unlock_unchanged(v);
                return match self.split_under_parent(p, want_prior, f) {
                    Ok(out) => out,
                    Err(f) => self.update_pessimistic(p, want_prior, OVF_REF, f),
                };
            }
            match self.apply(n, p, found, want_prior, false, f) {
                Applied::Done(r, shrank) => {
                    fr.latch.unlock();
                    if shrank {
                        self.rebalance(p);
                    }
                    return (r, pid);
                }
                Applied::Spilled(r) => {
                    fr.latch.unlock();
                    self.reinline(p);
                    return (r, pid);
                }
                Applied::Split(..) => unreachable!("room_for guarantees room for the entry"),
            }
        }
    }

    /// The update of a full leaf, latching only the leaf and its parent (LeanStore's
    /// split): an optimistic descent finds both, and when the parent has room for one more
    /// separator the leaf splits under those two latches, so that a split does not latch
    /// the root and stop every other descent. `Err(f)` hands `f` back, unused, when the
    /// root is the leaf, the parent is full (it must split first, top-down: the caller's
    /// pessimistic path) or writers kept changing the two pages.
    #[allow(clippy::type_complexity)]
    fn split_under_parent<R, F>(
        &self,
        p: &Probe<'_>,
        want_prior: bool,
        f: F,
    ) -> Result<(R, PageId), F>
    where
        F: FnOnce(&mut Option<Record>, Option<Option<&[u8]>>) -> R,
    {
        for _ in 0..SPLIT_ATTEMPTS {
            let (pid, lf, lv, parent) = match self.descend(Target::Key(p)) {
                Some(d) => d,
                None => continue,
            };
            let Some((pf, pv)) = parent else {
                return Err(f); // the root is the leaf
            };
            if !pf.latch.try_upgrade(pv) {
                continue;
            }
            let parent = Node(pf);
            if self.inner_full(parent) {
                pf.latch.unlock_unchanged(pv);
                return Err(f);
            }
            if !lf.latch.try_upgrade(lv) {
                pf.latch.unlock_unchanged(pv);
                continue;
            }
            // Both versions are the ones the descent read: `pid` is still the parent's
            // child for `p`, at index `i`.
            let i = parent.child_index(p);
            let leaf = Node(lf);
            let (r, at, split, shrank) =
                match self.apply(leaf, p, leaf.search(p), want_prior, true, f) {
                    Applied::Done(r, shrank) => (r, pid, false, shrank),
                    Applied::Spilled(_) => unreachable!("apply spills only where it cannot split"),
                    Applied::Split(r, j, it) => (
                        r,
                        self.split_leaf(parent, i, pid, Some((j, it)), p),
                        true,
                        false,
                    ),
                };
            lf.latch.unlock();
            release(pf, pv, split);
            if shrank {
                self.rebalance(p);
            }
            return Ok((r, at));
        }
        Err(f)
    }

    /// Runs `f` on `p`'s slot in the exclusively latched leaf `n` and stores the result;
    /// `f` is told the prior key only if `want_prior` (else `None`, saving a copy).
    /// A value that grew past the leaf's free space makes the leaf split
    /// ([`Applied::Split`]) if `can_split`, else goes to an overflow chain
    /// ([`Applied::Spilled`]).
    #[allow(clippy::too_many_arguments)]
    fn apply<R>(
        &self,
        n: Node<'_>,
        p: &Probe<'_>,
        found: Result<usize, usize>,
        want_prior: bool,
        can_split: bool,
        f: impl FnOnce(&mut Option<Record>, Option<Option<&[u8]>>) -> R,
    ) -> Applied<R> {
        let i = match found {
            Ok(i) | Err(i) => i,
        };
        let want_prior = want_prior && found.is_err();
        let prior_key = (want_prior && i > 0).then(|| {
            let mut k = PRIOR.try_with(Cell::take).unwrap_or_default();
            k.clear();
            n.key_into(i - 1, &mut k);
            k
        });
        let prior = match &prior_key {
            Some(k) => Some(Some(&k[..])),
            None if want_prior && n.starts_at_neg_inf() => Some(None),
            None => None,
        };
        let underfull_before = self.underfull(n);
        // The thread's lookup buffer, given back once the record is in the page: an update
        // allocates nothing for its copy of the record (a nested call meanwhile finds the
        // buffer gone and allocates its own).
        let mut value = SCRATCH.try_with(Cell::take).unwrap_or_default();
        let c = self.copy_record(n, found, &mut value);
        let old_ref = match found {
            Ok(i) if n.meta(i).ovf => {
                let mut r = Vec::new();
                n.val_into(i, &mut r);
                Some((r, value.clone()))
            }
            _ => None,
        };
        let mut slot = if c.found {
            Some(Record {
                value,
                ghost: c.ghost,
                tid: c.tid,
            })
        } else {
            give_back(value);
            None
        };
        let r = f(&mut slot, prior);
        if let Some(k) = prior_key {
            if k.capacity() <= PAGE_SIZE {
                let _ = PRIOR.try_with(|s| s.set(k));
            }
        }
        match (found, slot) {
            (Err(_), None) => Applied::Done(r, false),
            (Ok(i), None) => {
                if let Some((oref, _)) = &old_ref {
                    overflow::free(&self.store, oref);
                }
                n.remove(i);
                let shrank = n.count() == 0 || (!underfull_before && self.underfull(n));
                Applied::Done(r, shrank)
            }
            (Ok(i), Some(rec)) => {
                // Unchanged overflow value: keep the chain (unless it belongs inline and the
                // leaf can split to take it: `reinline`).
                if let Some((oref, old)) = &old_ref {
                    if *old == rec.value && (is_overflow_len(old.len()) || !can_split) {
                        let ok = n.replace_value(i, oref, true, rec.ghost, rec.tid);
                        debug_assert!(ok);
                        give_back(rec.value);
                        return Applied::Done(r, false);
                    }
                    overflow::free(&self.store, oref);
                }
                let inline = !is_overflow_len(rec.value.len());
                if inline && n.replace_value(i, &rec.value, false, rec.ghost, rec.tid) {
                    give_back(rec.value);
                    return Applied::Done(r, false);
                }
                if inline && can_split {
                    // The value grew past the leaf's free space: split, keeping it inline.
                    // (An overflow chain spends a whole page on a small value: before this,
                    // every OCC insert landing on a full leaf left one, since its placeholder
                    // gets its value at commit.)
                    let key = n.key(i);
                    n.remove(i);
                    return Applied::Split(
                        r,
                        i,
                        Self::item(key, rec.tid, rec.ghost, rec.value, false),
                    );
                }
                let oref = overflow::write(&self.store, &rec.value);
                if n.replace_value(i, &oref, true, rec.ghost, rec.tid) {
                    give_back(rec.value);
                    return if inline {
                        Applied::Spilled(r)
                    } else {
                        Applied::Done(r, false)
                    };
                }
                let key = n.key(i);
                n.remove(i);
                Applied::Split(
                    r,
                    i,
                    Self::item(key, rec.tid, rec.ghost, oref.to_vec(), true),
                )
            }
            (Err(i), Some(rec)) => {
                let oref = is_overflow_len(rec.value.len())
                    .then(|| overflow::write(&self.store, &rec.value));
                let it = Entry {
                    key: p.bytes,
                    word: rec.tid,
                    val: oref.as_ref().map_or(&rec.value[..], |o| &o[..]),
                    ghost: rec.ghost,
                    ovf: oref.is_some(),
                };
                // The key and value go into the page from where they are; only a split
                // needs an owned copy.
                if n.count() < self.leaf_cap && n.insert_entry(i, it) {
                    give_back(rec.value);
                    Applied::Done(r, false)
                } else {
                    Applied::Split(r, i, it.to_item())
                }
            }
        }
    }

    fn item(key: Vec<u8>, word: u64, ghost: bool, val: Vec<u8>, ovf: bool) -> Item {
        Item {
            key,
            word,
            val,
            ghost,
            ovf,
        }
    }

    /// Exclusive latch coupling from the root with preemptive splits of full inner nodes:
    /// every inner node entered has room for one more separator, so the leaf's parent can
    /// take the separator of a split after `f` ran.
    /// `grow` as in [`room_for`](Self::room_for).
    fn update_pessimistic<R>(
        &self,
        p: &Probe<'_>,
        want_prior: bool,
        grow: usize,
        f: impl FnOnce(&mut Option<Record>, Option<Option<&[u8]>>) -> R,
    ) -> (R, PageId) {
        let root = self.frame_of(ROOT);
        let mut cur_v = root.latch.lock();
        let rn = Node(root);
        let mut cur_changed = false;
        if (rn.is_leaf() && !self.room_for(rn, p, rn.search(p), grow))
            || (!rn.is_leaf() && self.inner_full(rn))
        {
            self.split_root();
            cur_changed = true;
        }
        if rn.is_leaf() {
            // The root leaf has room now.
            let (r, shrank, spilled) = match self.apply(rn, p, rn.search(p), want_prior, false, f) {
                Applied::Done(r, shrank) => (r, shrank, false),
                Applied::Spilled(r) => (r, false, true),
                Applied::Split(..) => unreachable!("a split root leaves room for the entry"),
            };
            root.latch.unlock();
            if shrank {
                self.rebalance(p);
            }
            // A `reinline` asked for room for any inline value and split the root for it.
            if spilled && grow < max_entry(p.bytes.len()) {
                self.reinline(p);
            }
            return (r, ROOT);
        }
        let mut cur = root;
        loop {
            let n = Node(cur);
            let i = n.child_index(p);
            let c = n.child(i);
            let cf = self.frame_of(c);
            let cv = cf.latch.lock();
            let cn = Node(cf);
            if cn.is_leaf() {
                let (r, at, shrank) = match self.apply(cn, p, cn.search(p), want_prior, true, f) {
                    Applied::Done(r, shrank) => (r, c, shrank),
                    Applied::Spilled(_) => unreachable!("apply spills only where it cannot split"),
                    Applied::Split(r, j, it) => {
                        cur_changed = true;
                        (r, self.split_leaf(n, i, c, Some((j, it)), p), false)
                    }
                };
                cf.latch.unlock();
                release(cur, cur_v, cur_changed);
                if shrank {
                    self.rebalance(p);
                }
                return (r, at);
            }
            let (next, next_v, next_changed) = if self.inner_full(cn) {
                let right = self.split_inner(n, i, cf);
                cur_changed = true;
                if n.child_index(p) != i {
                    cf.latch.unlock();
                    let rf = self.frame_of(right);
                    let rv = rf.latch.lock();
                    (rf, rv, false)
                } else {
                    (cf, cv, true)
                }
            } else {
                (cf, cv, false)
            };
            release(cur, cur_v, cur_changed);
            (cur, cur_v, cur_changed) = (next, next_v, next_changed);
        }
    }

    /// Moves `p`'s value back inline from the overflow chain an update left it in
    /// ([`Applied::Spilled`]), splitting its leaf: an update that changes nothing, run on
    /// the paths that can split. Readers see the same value throughout.
    fn reinline(&self, p: &Probe<'_>) {
        let keep = |_: &mut Option<Record>, _: Option<Option<&[u8]>>| {};
        if let Err(keep) = self.split_under_parent(p, false, keep) {
            self.update_pessimistic(p, false, max_entry(p.bytes.len()), keep);
        }
    }

    fn inner_full(&self, n: Node<'_>) -> bool {
        n.count() >= self.inner_cap || n.free_total() < MAX_SEP
    }

    /// Where to split `items` (1..len) to halve their bytes.
    fn split_point(items: &[Item]) -> usize {
        let n = items.len();
        let total: usize = items.iter().map(Item::size).sum();
        let mut acc = 0;
        for (i, it) in items.iter().enumerate() {
            acc += it.size();
            if acc * 2 >= total {
                return (i + 1).clamp(1, n - 1);
            }
        }
        (n / 2).max(1)
    }

    /// A fresh page holding `img`.
    fn new_page(&self, img: &Image) -> PageId {
        let pid = self.store.alloc();
        let f = self.frame_of(pid);
        // Stale optimistic readers may be reading a reused page: latch it to change its
        // version.
        f.latch.lock();
        Node(f).write_image(img);
        f.latch.unlock();
        pid
    }

    /// Splits leaf `leaf` (child `i` of the latched `parent`, which has room for a
    /// separator), inserting `pending` (slot, entry); returns the page that holds `p` now.
    fn split_leaf(
        &self,
        parent: Node<'_>,
        i: usize,
        leaf: PageId,
        pending: Option<(usize, Item)>,
        p: &Probe<'_>,
    ) -> PageId {
        let lf = self.frame_of(leaf);
        self.note_full_leaf(Node(lf).count());
        let pending = match pending {
            Some((j, it)) if j == Node(lf).count() && j > 0 => {
                match self.split_off_append(parent, i, lf, it) {
                    Ok(rp) => return rp,
                    Err(it) => Some((j, it)),
                }
            }
            other => other,
        };
        #[cfg(test)]
        tests::IMAGE_SPLITS.set(tests::IMAGE_SPLITS.get() + 1);
        let mut img = Node(lf).image();
        let mut run_at = None;
        if let Some((j, it)) = pending {
            // An ascending run (the greatest key, or the key after the last insert): split
            // next to the new entry, so that the left page stays full.
            if j == img.items.len() || Node(lf).continues_run(j) {
                run_at = Some(j);
            }
            img.items.insert(j, it);
        }
        let mut s = match run_at {
            // A run in the middle of the leaf (one district's rows among the next
            // district's): the new entry ends the left page and the entries above it move
            // to the right page once. The run then goes on by appends at the end of a page
            // (and `split_off_append` once that is full), instead of shifting the entries
            // above it at every insert and carrying them along at every split.
            Some(j) if j + 1 < img.items.len() => j + 1,
            // At the top: the new entry starts the right page.
            Some(j) if j > 0 => j,
            _ => Self::split_point(&img.items),
        };
        let fits = |img: &Image, s: usize| {
            let sep = &img.items[s].key;
            let l: usize = img.items[..s].iter().map(Item::size).sum();
            let r: usize = img.items[s..].iter().map(Item::size).sum();
            let fence = |k: &Option<Vec<u8>>| k.as_ref().map_or(0, |k| pad8(k.len()));
            let lfix = HDR_BYTES + fence(&img.low) + pad8(sep.len());
            let rfix = HDR_BYTES + fence(&img.high) + pad8(sep.len());
            l + lfix <= PAGE_SIZE
                && r + rfix <= PAGE_SIZE
                && s <= self.leaf_cap
                && img.items.len() - s <= self.leaf_cap
        };
        if !fits(&img, s) {
            // The nearest split point that fits (the fences change the sizes: a full leaf
            // that gets a high fence no longer fits as it is).
            let n = img.items.len();
            s = (1..n)
                .flat_map(|d| [s.checked_sub(d), Some(s + d)])
                .flatten()
                .find(|&c| (1..n).contains(&c) && fits(&img, c))
                .unwrap_or_else(|| unreachable!("some split of a leaf fits"));
        }
        let (sep, right) = split_leaf_image(&mut img, s);
        let rp = self.new_page(&right);
        Node(lf).write_image(&img);
        let ok = parent.insert(i, &Self::item(sep.clone(), rp, false, Vec::new(), false));
        debug_assert!(ok, "the parent has room for a separator");
        if sep.as_slice() <= p.bytes {
            rp
        } else {
            leaf
        }
    }

    /// Sets what descents prefetch from a leaf after one of `count` slots filled up.
    fn note_full_leaf(&self, count: usize) {
        let lines = leaf_prefetch_lines(count) as u8;
        if self.leaf_lines.load(AtomicOrdering::Relaxed) != lines {
            self.leaf_lines.store(lines, AtomicOrdering::Relaxed);
        }
    }

    /// The split of an ascending run's leaf, without copying it: `it`, whose key is above
    /// every key of the full leaf `lf` (child `i` of the latched `parent`), starts a new
    /// right sibling, and the leaf only gets that key as its high fence, in place (or, when
    /// the leaf is too full for that fence, its last record moves to the new page too).
    /// Returns the new page, or hands `it` back when neither fits (the caller's general
    /// split then runs).
    fn split_off_append(
        &self,
        parent: Node<'_>,
        i: usize,
        lf: &Frame,
        it: Item,
    ) -> Result<PageId, Item> {
        let n = Node(lf);
        let high = n.fence(false);
        let fence = |k: &Option<Vec<u8>>| k.as_ref().map_or(0, |k| pad8(k.len()));
        // A right page of `items` bytes whose low fence is `low` bytes long fits.
        let fits =
            |items: usize, low: usize| HDR_BYTES + pad8(low) + fence(&high) + items <= PAGE_SIZE;
        if !fits(it.size(), it.key.len()) {
            return Err(it);
        }
        let items = if n.set_high_fence(&it.key) {
            vec![it]
        } else {
            // The leaf is too full even for its new high fence (records of one size fill
            // a page to the byte): its last record goes right too, ahead of the new one,
            // and the leaf is fenced by that record's key. Still no image of the page.
            let c = n.count();
            if c < 2 {
                return Err(it);
            }
            let (m, mut val) = (n.meta(c - 1), Vec::new());
            n.val_into(c - 1, &mut val);
            let last = Self::item(n.key(c - 1), n.word(c - 1), m.ghost, val, m.ovf);
            if !fits(last.size() + it.size(), last.key.len()) {
                return Err(it);
            }
            n.remove(c - 1);
            if !n.set_high_fence(&last.key) {
                // Not expected (the record's bytes are free now): put it back.
                let ok = n.insert(c - 1, &last);
                debug_assert!(ok, "a record just removed fits again");
                return Err(it);
            }
            vec![last, it]
        };
        let sep = items[0].key.clone();
        let right = Image {
            kind: KIND_LEAF,
            leaf_children: false,
            low: Some(sep.clone()),
            high,
            first: super::page::NO_PAGE,
            items,
        };
        let rp = self.new_page(&right);
        let ok = parent.insert(i, &Self::item(sep, rp, false, Vec::new(), false));
        debug_assert!(ok, "the parent has room for a separator");
        Ok(rp)
    }

    /// Splits the full inner node `child` (child `i` of the latched `parent`, both
    /// exclusively latched); returns the new right sibling.
    fn split_inner(&self, parent: Node<'_>, i: usize, child: &Frame) -> PageId {
        let (left, up, right) = Self::halve_inner(Node(child).image());
        let rp = self.new_page(&right);
        Node(child).write_image(&left);
        let ok = parent.insert(i, &Self::item(up, rp, false, Vec::new(), false));
        debug_assert!(ok, "the parent has room for a separator");
        rp
    }

    /// Splits an inner node's image into left, the separator that goes up, and right.
    fn halve_inner(mut img: Image) -> (Image, Vec<u8>, Image) {
        let s = Self::split_point(&img.items)
            .min(img.items.len().saturating_sub(2))
            .max(1);
        let mut rest = img.items.split_off(s);
        let up = rest.remove(0);
        let right = Image {
            kind: KIND_INNER,
            leaf_children: img.leaf_children,
            low: Some(up.key.clone()),
            high: img.high.take(),
            first: up.word,
            items: rest,
        };
        img.high = Some(up.key.clone());
        (img, up.key, right)
    }

    /// Moves the latched root's contents into two new children.
    fn split_root(&self) {
        let root = Node(self.frame_of(ROOT));
        let img = root.image();
        let was_leaf = img.kind == KIND_LEAF;
        let (left, sep, right) = if was_leaf {
            let mut img = img;
            let s = Self::split_point(&img.items);
            let (sep, right) = split_leaf_image(&mut img, s);
            (img, sep, right)
        } else {
            Self::halve_inner(img)
        };
        let lp = self.new_page(&left);
        let rp = self.new_page(&right);
        root.write_image(&Image {
            kind: KIND_INNER,
            leaf_children: was_leaf,
            low: None,
            high: None,
            first: lp,
            items: vec![Self::item(sep, rp, false, Vec::new(), false)],
        });
    }

    /// The greatest key strictly below `key`, ghosts included.
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// let t = BTree::new();
    /// t.update(b"m", |s| *s = Some(Record::default()));
    /// assert_eq!(t.predecessor(b"z"), Some(b"m".to_vec()));
    /// assert_eq!(t.predecessor(b"m"), None);
    /// ```
    pub fn predecessor(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.last_below(Some(key.to_vec()))
    }

    /// The greatest key within the upper bound `hi`, ghosts included: at most `h` for
    /// `Included(h)`, below `h` for `Excluded(h)`, the greatest of all for `Unbounded`. Where
    /// a descending scan starts.
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// use std::ops::Bound::*;
    /// let t = BTree::new();
    /// for k in [b"a", b"m", b"x"] {
    ///     t.update(k, |s| *s = Some(Record::default()));
    /// }
    /// assert_eq!(t.last_within(Included(&b"m"[..])), Some(b"m".to_vec()));
    /// assert_eq!(t.last_within(Excluded(&b"m"[..])), Some(b"a".to_vec()));
    /// assert_eq!(t.last_within(Unbounded), Some(b"x".to_vec()));
    /// assert_eq!(t.last_within(Excluded(&b"a"[..])), None);
    /// ```
    pub fn last_within(&self, hi: Bound<&[u8]>) -> Option<Vec<u8>> {
        match hi {
            // The keys at most `h` are the keys below `h` followed by a zero byte.
            Bound::Included(h) => {
                let mut k = Vec::with_capacity(h.len() + 1);
                k.extend_from_slice(h);
                k.push(0);
                self.last_below(Some(k))
            }
            Bound::Excluded(h) => self.last_below(Some(h.to_vec())),
            Bound::Unbounded => self.last_below(None),
        }
    }

    /// The greatest key strictly below `key` (`None`: +infinity), ghosts included.
    fn last_below(&self, key: Option<Vec<u8>>) -> Option<Vec<u8>> {
        let mut target = key;
        loop {
            let (f, v, i) = match &target {
                Some(k) => {
                    let t = Probe::new(k);
                    let Some((_, f, v, _)) = self.descend(Target::Below(&t)) else {
                        continue;
                    };
                    (f, v, Node(f).lower_bound(&t))
                }
                None => {
                    let Some((_, f, v, _)) = self.descend(Target::Last) else {
                        continue;
                    };
                    (f, v, Node(f).count())
                }
            };
            let n = Node(f);
            // The key below, or else the low fence to search below next.
            let res = if i > 0 {
                Ok(n.key(i - 1))
            } else {
                Err(n.fence(true))
            };
            if !f.latch.validate(v) {
                continue;
            }
            match res {
                Ok(k) => return Some(k),
                Err(Some(low)) => target = Some(low),
                Err(None) => return None,
            }
        }
    }

    /// Up to `limit` entries with keys within (`lo`, `hi`), ascending, ghosts included.
    /// Atomic per leaf (a validated copy of each), not across leaves.
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// use std::ops::Bound::*;
    /// let t = BTree::with_capacity(3, 3);
    /// for i in 0u8..20 {
    ///     t.update(&[i], |s| *s = Some(Record::default()));
    /// }
    /// let got = t.range(Excluded(&[3u8][..]), Included(&[9u8][..]), 100);
    /// assert_eq!(got.len(), 6);
    /// assert_eq!(t.range(Unbounded, Unbounded, 5).len(), 5);
    /// ```
    pub fn range(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        limit: usize,
    ) -> Vec<(Vec<u8>, Record)> {
        self.range_noting(lo, hi, limit, None)
    }

    /// [`range`](Self::range), also noting in `leaves` every leaf it read, with the version
    /// at which its part of the result was consistent (Silo's node set): while
    /// [`unchanged_since`](Self::unchanged_since) holds for all of them, the same call would
    /// return the same entries with the same TIDs, and no key has entered the part of the
    /// range it covered (an insert there latches one of those leaves, or a leaf split off
    /// one of them, which latches it too).
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// use std::ops::Bound::{Included, Unbounded};
    /// let t = BTree::new();
    /// for i in [1u8, 3, 5] {
    ///     t.update(&[i], |s| *s = Some(Record::default()));
    /// }
    /// let mut leaves = Vec::new();
    /// let got = t.range_noting(Included(&[2u8][..]), Unbounded, usize::MAX, Some(&mut leaves));
    /// assert_eq!(got.len(), 2);
    /// assert!(leaves.iter().all(|h| t.unchanged_since(*h)));
    /// t.update(&[4], |s| *s = Some(Record::default())); // a phantom
    /// assert!(!leaves.iter().all(|h| t.unchanged_since(*h)));
    /// ```
    pub fn range_noting(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        limit: usize,
        mut leaves: Option<&mut Vec<LeafHint>>,
    ) -> Vec<(Vec<u8>, Record)> {
        let mut out = Vec::new();
        let mut from: Bound<Vec<u8>> = lo.map(<[u8]>::to_vec);
        let below_hi = |k: &[u8]| match hi {
            Bound::Unbounded => true,
            Bound::Included(h) => k <= h,
            Bound::Excluded(h) => k < h,
        };
        let mut batch: Vec<(Vec<u8>, Record)> = Vec::new();
        while out.len() < limit {
            let fp = match &from {
                Bound::Unbounded => None,
                Bound::Included(k) | Bound::Excluded(k) => Some(Probe::new(k)),
            };
            let t = match &fp {
                None => Target::First,
                Some(p) => Target::Key(p),
            };
            let Some((pid, f, v, _)) = self.descend(t) else {
                continue;
            };
            let n = Node(f);
            let start = match (&from, &fp) {
                (Bound::Included(_), Some(p)) => n.lower_bound(p),
                (Bound::Excluded(_), Some(p)) => n.upper_bound(p),
                _ => 0,
            };
            batch.clear();
            let mut done = false;
            for i in start..n.count() {
                if out.len() + batch.len() >= limit {
                    done = true;
                    break;
                }
                let k = n.key(i);
                if !below_hi(&k) {
                    done = true;
                    break;
                }
                let mut value = Vec::new();
                let c = self.copy_record(n, Ok(i), &mut value);
                batch.push((
                    k,
                    Record {
                        value,
                        ghost: c.ghost,
                        tid: c.tid,
                    },
                ));
            }
            let high = n.fence(false);
            if !f.latch.validate(v) {
                continue;
            }
            if let Some(l) = leaves.as_deref_mut() {
                l.push(self.hint_at(pid, v));
            }
            out.append(&mut batch);
            if done {
                break;
            }
            match high {
                None => break,
                Some(h) if !below_hi(&h) => break,
                Some(h) => from = Bound::Included(h),
            }
        }
        out
    }

    /// Visits every node top-down under exclusive latch coupling (a node stays latched while
    /// its children are visited): `visit(frame, pid, depth, low, high)`.
    fn walk(
        &self,
        pid: PageId,
        depth: usize,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        visit: &mut Visit<'_>,
    ) -> Result<(), String> {
        let f = self.frame_of(pid);
        let v = f.latch.lock();
        let n = Node(f);
        let mut r = visit(n, pid, depth, low, high);
        if r.is_ok() && n.kind() == KIND_INNER {
            let seps: Vec<Vec<u8>> = (0..n.count()).map(|i| n.key(i)).collect();
            for c in 0..=n.count() {
                let cl = if c == 0 { low } else { Some(&seps[c - 1][..]) };
                let ch = if c == n.count() {
                    high
                } else {
                    Some(&seps[c][..])
                };
                r = self.walk(n.child(c), depth + 1, cl, ch, visit);
                if r.is_err() {
                    break;
                }
            }
        }
        f.latch.unlock_unchanged(v);
        r
    }

    /// Number of entries, ghosts included (walks the whole tree).
    ///
    /// ```
    /// assert_eq!(shoal::storage::btree::BTree::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.stats().entries
    }

    /// True when the tree holds no entries.
    ///
    /// ```
    /// assert!(shoal::storage::btree::BTree::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts the nodes, entries and pages (latching one path at a time).
    ///
    /// ```
    /// use shoal::storage::btree::{BTree, Record};
    /// let t = BTree::with_capacity(4, 4);
    /// for i in 0u8..100 {
    ///     t.update(&[i], |s| *s = Some(Record::default()));
    /// }
    /// for i in 0u8..100 {
    ///     t.update(&[i], |s| *s = None);
    /// }
    /// // Merges took the emptied leaves out again.
    /// let s = t.stats();
    /// assert_eq!((s.entries, s.leaves, s.height), (0, 1, 1));
    /// ```
    pub fn stats(&self) -> TreeStats {
        let mut s = TreeStats::default();
        let _ = self.walk(ROOT, 1, None, None, &mut |n, _, depth, _, _| {
            s.height = s.height.max(depth);
            if n.is_leaf() {
                s.leaves += 1;
                let c = n.count();
                s.entries += c;
                s.empty_leaves += usize::from(c == 0);
                for i in 0..c {
                    let m = n.meta(i);
                    s.ghosts += usize::from(m.ghost);
                    if m.ovf {
                        let mut r = Vec::new();
                        n.val_into(i, &mut r);
                        s.overflow += overflow::pages(&self.store, &r).len();
                    }
                }
            } else {
                s.inner += 1;
            }
            Ok(())
        });
        s.free = self.store.pages_free();
        s.pages = self.store.pages_in_use();
        s.bytes = s.pages * PAGE_SIZE;
        s
    }

    /// Checks ordering, fence keys, separators, heads, page accounting and that all leaves
    /// have the same depth; describes the first violation. Latches (exclusively, top-down),
    /// so it may run concurrently.
    ///
    /// ```
    /// assert!(shoal::storage::btree::BTree::new().check_invariants().is_ok());
    /// ```
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut leaf_depth = None;
        let mut live = std::collections::HashSet::new();
        let (leaf_cap, inner_cap) = (self.leaf_cap, self.inner_cap);
        self.walk(ROOT, 0, None, None, &mut |n, pid, depth, low, high| {
            if !live.insert(pid) {
                return Err(format!("page {pid} is reachable twice"));
            }
            let kind = n.kind();
            if kind != KIND_LEAF && kind != KIND_INNER {
                return Err(format!("page {pid} of kind {kind} is reachable as a node"));
            }
            let (nl, nh) = (n.fence(true), n.fence(false));
            if nl.as_deref() != low || nh.as_deref() != high {
                return Err(format!(
                    "fences {nl:?}..{nh:?} differ from the parent's separators {low:?}..{high:?}"
                ));
            }
            let keys: Vec<Vec<u8>> = (0..n.count()).map(|i| n.key(i)).collect();
            if keys.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("page {pid}: keys out of order"));
            }
            let within = |k: &[u8]| low.is_none_or(|l| k >= l) && high.is_none_or(|h| k < h);
            if let Some(k) = keys.iter().find(|k| !within(k)) {
                return Err(format!("page {pid}: key {k:?} outside its fences"));
            }
            if !n.fence_heads_match() {
                return Err(format!("page {pid}: a fence's head differs from its key"));
            }
            if (0..keys.len()).any(|i| n.head(i) != super::node::head_of(&keys[i])) {
                return Err(format!("page {pid}: a slot's head differs from its key"));
            }
            let img = n.image();
            if img.size() != n.bytes_used() {
                return Err(format!(
                    "page {pid}: {} bytes accounted, {} in the entries",
                    n.bytes_used(),
                    img.size()
                ));
            }
            if n.is_leaf() {
                if n.count() > leaf_cap {
                    return Err("overfull leaf".into());
                }
                for (i, it) in img.items.iter().enumerate() {
                    if it.ovf {
                        let mut v = Vec::new();
                        if !overflow::read(&self.store, &it.val, &mut v) {
                            return Err(format!("page {pid}: slot {i}'s overflow chain is broken"));
                        }
                        for o in overflow::pages(&self.store, &it.val) {
                            if !live.insert(o) {
                                return Err(format!("overflow page {o} is reachable twice"));
                            }
                        }
                    } else if is_overflow_len(it.val.len()) {
                        return Err(format!("page {pid}: an inline value is too long"));
                    }
                }
                match leaf_depth {
                    None => leaf_depth = Some(depth),
                    Some(d) if d != depth => return Err("leaves at different depths".into()),
                    _ => {}
                }
            } else {
                if n.count() > inner_cap {
                    return Err("overfull inner node".into());
                }
                for c in 0..=n.count() {
                    let Some(cf) = self.store.frame(n.child(c)) else {
                        return Err(format!("page {pid}: child {c} is no page"));
                    };
                    if Node(cf).is_leaf() != n.leaf_children() {
                        return Err("inner node: leaf_children does not match its children".into());
                    }
                }
            }
            Ok(())
        })?;
        for pid in self.store.free_list() {
            if live.contains(&pid) {
                return Err(format!("free page {pid} is reachable"));
            }
            if self
                .store
                .frame(pid)
                .is_some_and(|f| Node(f).kind() != KIND_FREE)
            {
                return Err(format!("free page {pid} is not marked free"));
            }
        }
        if live.len() != self.store.pages_in_use() {
            return Err(format!(
                "{} pages reachable, {} in use (a page leaked)",
                live.len(),
                self.store.pages_in_use()
            ));
        }
        Ok(())
    }

    /// Whether a node counts as underfull (a merge candidate). An empty node always is: by
    /// bytes alone, one whose two fence keys are long (about 4 KiB each) is not.
    fn underfull(&self, n: Node<'_>) -> bool {
        if n.count() == 0 {
            return true;
        }
        let cap = if n.is_leaf() {
            self.leaf_cap
        } else {
            self.inner_cap
        };
        if cap != usize::MAX {
            n.count() < (cap / 4).max(1)
        } else {
            n.bytes_used() < PAGE_SIZE / 4
        }
    }

    /// Whether a merged image fits: within the page and the slot capacity, with a quarter to
    /// spare unless one side was empty.
    fn fits(&self, merged: &Image, one_empty: bool) -> bool {
        let cap = if merged.kind == KIND_LEAF {
            self.leaf_cap
        } else {
            self.inner_cap
        };
        let n = merged.items.len();
        let size = merged.size();
        if size > PAGE_SIZE || n > cap {
            return false;
        }
        if one_empty {
            return true;
        }
        if cap != usize::MAX {
            n <= cap - cap / 4
        } else {
            size <= PAGE_SIZE - PAGE_SIZE / 4
        }
    }

    /// Merges underfull nodes on the path to `p`, after a removal left its leaf empty or
    /// underfull: exclusive latch coupling from the root, as preemptive splits descend.
    ///
    /// At each inner node (latched) the child on the path is latched; if it is underfull and
    /// it and its right sibling (or else its left one) fit in one page, the right one's
    /// contents move into the left one, whose high fence becomes the right one's, the parent
    /// drops the separator between them, and the right page is cleared (kind free, a new
    /// version) and freed, all under the latches of the parent and both children. An
    /// optimistic reader that was in either child fails its validation; one that read the
    /// parent before fails at the parent. The root, when it is an inner node with a single
    /// child, takes that child's contents (the tree gets one level shorter). Latch order
    /// stays parent before child; two siblings are latched together only under their
    /// parent's latch, which excludes every other multi-page holder.
    ///
    /// A merge lower down can leave a node above underfull (or the root with one child)
    /// after the pass went by; then the pass runs again, at most once per level.
    fn rebalance(&self, p: &Probe<'_>) {
        while self.rebalance_pass(p) {}
    }

    fn rebalance_pass(&self, p: &Probe<'_>) -> bool {
        let root = self.frame_of(ROOT);
        root.latch.lock();
        let rn = Node(root);
        loop {
            if rn.is_leaf() {
                root.latch.unlock();
                return false;
            }
            if rn.count() > 0 {
                break;
            }
            // A single child: its fences are the root's (-inf, +inf).
            let c = rn.child(0);
            let cf = self.frame_of(c);
            cf.latch.lock();
            let img = Node(cf).image();
            Node(cf).clear();
            cf.latch.unlock();
            rn.write_image(&img);
            self.store.free(c);
        }
        let mut again = false;
        let mut cur = root;
        loop {
            let n = Node(cur);
            let leaf_children = n.leaf_children();
            let i = n.child_index(p);
            let cf = self.frame_of(n.child(i));
            cf.latch.lock();
            let next = if self.underfull(Node(cf)) {
                let before = n.count();
                let next = self.merge_child(n, i, cf);
                again |= n.count() < before && self.underfull(n);
                next
            } else {
                cf
            };
            cur.latch.unlock();
            if leaf_children {
                next.latch.unlock();
                return again;
            }
            cur = next;
        }
    }

    /// Merges child `i` of `parent` (latched as `child`) with a sibling if they fit; returns
    /// the latched frame that now holds child `i`'s key range.
    fn merge_child<'t>(&'t self, parent: Node<'_>, i: usize, child: &'t Frame) -> &'t Frame {
        if i < parent.count() {
            let rf = self.frame_of(parent.child(i + 1));
            rf.latch.lock();
            if self.merge_pair(child, rf, parent, i) {
                return child;
            }
            rf.latch.unlock();
        }
        if i > 0 {
            let lf = self.frame_of(parent.child(i - 1));
            lf.latch.lock();
            if self.merge_pair(lf, child, parent, i - 1) {
                return lf;
            }
            lf.latch.unlock();
        }
        child
    }

    /// Moves `right`'s contents into `left` (children `s` and `s + 1` of `parent`) if they
    /// fit; then `right` is cleared, unlatched and freed. All three latched.
    fn merge_pair(&self, left: &Frame, right: &Frame, parent: Node<'_>, s: usize) -> bool {
        let mut l = Node(left).image();
        let r = Node(right).image();
        let one_empty = l.items.is_empty() || r.items.is_empty();
        let rpid = parent.child(s + 1);
        if l.kind == KIND_INNER {
            // The separator comes down between the two children lists.
            l.items
                .push(Self::item(parent.key(s), r.first, false, Vec::new(), false));
        }
        l.items.extend(r.items);
        l.high = r.high;
        if !self.fits(&l, one_empty) {
            return false;
        }
        Node(left).write_image(&l);
        Node(right).clear();
        right.latch.unlock();
        self.store.free(rpid);
        parent.remove(s);
        true
    }
}

/// What [`BTree::walk`] calls for each node: `(node, page, depth, low, high)`, the last two
/// the fences its parent's separators give it.
type Visit<'a> =
    dyn FnMut(Node<'_>, PageId, usize, Option<&[u8]>, Option<&[u8]>) -> Result<(), String> + 'a;

/// Releases an exclusive latch taken at version `v`, with a new version only if `changed`.
fn release(f: &Frame, v: u64, changed: bool) {
    if changed {
        f.latch.unlock();
    } else {
        f.latch.unlock_unchanged(v);
    }
}

const HDR_BYTES: usize = super::node::HDR_WORDS * 8;

fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

#[cfg(test)]
#[path = "btree_tests.rs"]
mod tests;

/// Splits a leaf's image before item `s` (`0 < s < len`): the items from `s` on go to the
/// returned right sibling, whose low fence is their first key (the separator, also
/// returned) and whose high fence is the leaf's; the leaf keeps the rest, fenced above by
/// the separator.
fn split_leaf_image(img: &mut Image, s: usize) -> (Vec<u8>, Image) {
    let right_items = img.items.split_off(s);
    let sep = right_items[0].key.clone();
    let right = Image {
        kind: KIND_LEAF,
        leaf_children: false,
        low: Some(sep.clone()),
        high: img.high.take(),
        first: super::page::NO_PAGE,
        items: right_items,
    };
    img.high = Some(sep.clone());
    (sep, right)
}
