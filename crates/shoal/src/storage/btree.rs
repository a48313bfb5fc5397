//! A concurrent B+-tree with fence keys and ghost records.
//!
//! Technique: a B+-tree with one reader-writer latch per node and latch coupling (Bayer and
//! Schkolnick): a thread holds a node's latch until it has latched the child it moves to, so
//! there is no global latch on any path (Shore-MT's first principle). Writers first descend
//! optimistically (read latches on inner nodes, a write latch on the leaf only) and restart
//! with write-latch coupling and preemptive top-down splits only when the leaf is full and the
//! operation may insert. The root node is never replaced: a root split moves its contents
//! into two new children, and a root left with one child takes that child's contents, so no
//! separate root-pointer latch exists.
//!
//! Merges: a removal that leaves a leaf empty, or just below a quarter full, merges it with a
//! sibling after the fact, top-down with write-latch coupling (`BTree::rebalance`): each
//! underfull node on the path moves into or absorbs an adjacent sibling under the parent's
//! latch when both fit in one node (with a quarter to spare, against split-merge
//! oscillation; an empty node always goes), and the root collapses when it has one child.
//! So a queue-like table, inserting at one end and deleting at the other, keeps a bounded
//! number of nodes, and a scan from the start of the range meets no run of empty leaves.
//! A removed node is marked dead and kept on a free list that splits reuse: [`LeafHint`]s
//! and pinned borrows name nodes by address, so no node's memory is freed before its tree.
//!
//! Fence keys (Kimura et al. 2012 §2.2, after Graefe): every node stores a low fence
//! (inclusive, `None` = -infinity) and a high fence (exclusive, `None` = +infinity), copies of
//! the separators around it in its parent. They replace sibling pointers: a range scan goes on
//! from a leaf's high fence with a new descent, and the predecessor of the first key of a
//! leaf is found by searching below its low fence. [`BTree::check_invariants`] uses them to
//! verify the whole structure.
//!
//! Leaf hints: [`BTree::get_hinted`] and [`BTree::update_hinted`] return a [`LeafHint`] for
//! the leaf they ended in and take one back, trying that leaf first (latch it, check it is
//! still a live leaf whose fences hold the key) before a root-to-leaf descent. Fence keys make
//! the check sound without sibling pointers or node versions (see `Leaf::covers`); a merged
//! node is dead (or reused with new fences), which the same check rejects. The optimistic
//! concurrency control keeps a hint per read and write, as Silo keeps record pointers.
//!
//! Ghost records are ordinary records with the ghost bit set; the transaction layer owns the
//! bit and removes ghosts when no transaction can need them.
//!
//! Deviations: merges are not guaranteed: an underfull node whose siblings are too full to
//! take it stays as it is (no redistribution of entries between siblings), and a leaf that
//! is underfull but not empty is tried only when it crosses the threshold, so underfull and
//! (rarely, next to a full sibling) empty nodes can remain; lookups and scans handle them.
//! Dead nodes are recycled, not freed, so the tree keeps the memory of its largest size in
//! node shells (about 200 bytes each; their entries are freed). Reader-writer latches rather
//! than optimistic lock coupling, whose version validation would also remove the
//! shared-latch cache-line traffic on the upper levels — future work.

use std::cmp::Ordering;
use std::ops::Bound;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

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
    /// writer. Read and written only under the leaf latch. Always 0 under two-phase locking.
    pub tid: u64,
}

type NodeRef = Arc<RwLock<Node>>;

/// Bytes of a key kept inline in the node (the rest of a longer key is on the heap).
const INLINE: usize = 16;

/// A key as the tree stores it (in leaves, separators and fences).
///
/// The first [`INLINE`] bytes sit in the node itself, zero padded, and compare as one
/// big-endian integer: a binary search over a node reads no other memory and calls no
/// `memcmp` unless two keys share those bytes and are both longer. Keys of at most
/// [`INLINE`] bytes need no heap buffer at all; a longer key keeps its whole value in `long`.
#[derive(Clone)]
struct Key {
    head: [u8; INLINE],
    len: u32,
    /// The whole key when it is longer than [`INLINE`] bytes.
    long: Option<Box<[u8]>>,
}

impl Key {
    fn new(k: &[u8]) -> Key {
        let mut head = [0u8; INLINE];
        let n = k.len().min(INLINE);
        head[..n].copy_from_slice(&k[..n]);
        Key {
            head,
            // Keys are bounded by `Options::max_key_len`, far below 4 GiB; saturate anyway
            // (a longer key keeps its exact length in `long`).
            len: u32::try_from(k.len()).unwrap_or(u32::MAX),
            long: (k.len() > INLINE).then(|| k.into()),
        }
    }

    fn bytes(&self) -> &[u8] {
        match &self.long {
            Some(b) => b,
            None => &self.head[..self.len as usize],
        }
    }

    /// Orders this key against `p` as the byte strings compare.
    #[inline]
    fn cmp_probe(&self, p: &Probe<'_>) -> Ordering {
        match u128::from_be_bytes(self.head).cmp(&p.head) {
            Ordering::Equal => {}
            o => return o,
        }
        // Equal heads: if either key fits inline, it is a prefix of the other, so the
        // lengths decide. Otherwise compare the rest.
        if self.len as usize <= INLINE || p.bytes.len() <= INLINE {
            return (self.len as usize).cmp(&p.bytes.len());
        }
        self.bytes()[INLINE..].cmp(&p.bytes[INLINE..])
    }

    /// The representation invariant: `head` holds the first bytes zero padded, `long` the
    /// whole key exactly when it does not fit inline.
    fn well_formed(&self) -> bool {
        let b = self.bytes();
        let n = b.len().min(INLINE);
        b.len() == self.len as usize
            && (b.len() > INLINE) == self.long.is_some()
            && self.head[..n] == b[..n]
            && self.head[n..].iter().all(|&x| x == 0)
    }

    /// The first [`INLINE`] bytes, zero padded, as a big-endian integer (see [`Heads`]).
    #[inline]
    fn prefix(&self) -> u128 {
        u128::from_be_bytes(self.head)
    }

    fn lt(&self, p: &Probe<'_>) -> bool {
        self.cmp_probe(p) == Ordering::Less
    }

    fn le(&self, p: &Probe<'_>) -> bool {
        self.cmp_probe(p) != Ordering::Greater
    }
}

impl std::ops::Deref for Key {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.bytes().fmt(f)
    }
}

/// A search key prepared for [`Key::cmp_probe`]: its first [`INLINE`] bytes as a big-endian
/// integer.
struct Probe<'a> {
    head: u128,
    bytes: &'a [u8],
}

impl<'a> Probe<'a> {
    /// The first [`INLINE`] bytes, zero padded, as a big-endian integer.
    #[inline]
    fn prefix(&self) -> u128 {
        self.head
    }

    #[inline]
    fn new(bytes: &'a [u8]) -> Self {
        let mut head = [0u8; INLINE];
        let n = bytes.len().min(INLINE);
        head[..n].copy_from_slice(&bytes[..n]);
        Probe {
            head: u128::from_be_bytes(head),
            bytes,
        }
    }
}

/// A leaf entry. Key and record sit side by side, so the record a search lands on is
/// usually in a cache line the search already loaded.
struct Entry {
    key: Key,
    rec: Record,
}

struct Leaf {
    low: Option<Key>,
    high: Option<Key>,
    /// `heads[i]` is `ents[i].key.prefix()`.
    heads: Heads,
    ents: Vec<Entry>,
}

/// The first [`INLINE`] (16) bytes of every key of a node (as [`Key::prefix`]), in a dense
/// array beside the entries: a binary search runs over these, 4 to a cache line, instead of
/// over the entries of 48 or 80 bytes, and reads an entry only to decide between keys that
/// share their first 16 bytes or to fetch what it found. That halves the cache misses of a
/// search in a node that is not cached. (With 8-byte prefixes, keys such as a type byte and
/// 15 hex digits, the Doppel workloads' keys, all shared their prefix below 16^7 records,
/// and every search fell through to the entries: 44% of a LIKE profile.)
#[derive(Default)]
struct Heads(Vec<u128>);

impl Heads {
    fn of<'a>(keys: impl Iterator<Item = &'a Key>) -> Heads {
        Heads(keys.map(Key::prefix).collect())
    }

    /// The number of leading items that are below the probe whose head is `h`: `below` must
    /// hold for every item with a smaller head and fail for every item with a larger one,
    /// and is called only on items whose head is `h`.
    #[inline]
    fn partition<T>(&self, items: &[T], h: u128, below: impl Fn(&T) -> bool) -> usize {
        let heads = &self.0[..];
        debug_assert_eq!(heads.len(), items.len());
        let lo = heads.partition_point(|&x| x < h);
        let n = heads.len();
        if lo == n || heads[lo] != h {
            return lo;
        }
        // The items with head `h` run from `lo` to `end`: gallop from `lo` (usually one
        // step: distinct heads), then bisect the last step.
        let mut known = lo; // heads[known] == h
        let mut step = 1;
        let end = loop {
            let at = lo + step;
            if at >= n || heads[at] != h {
                let upper = at.min(n);
                break known + 1 + heads[known + 1..upper].partition_point(|&x| x == h);
            }
            known = at;
            step *= 2;
        };
        lo + items[lo..end].partition_point(below)
    }
}

/// A separator with the child to its right (keys at or above it), side by side for the same
/// reason as [`Entry`].
struct Sep {
    key: Key,
    right: NodeRef,
}

struct Inner {
    low: Option<Key>,
    high: Option<Key>,
    /// The child below the first separator.
    first: NodeRef,
    /// `heads[i]` is `seps[i].key.prefix()`.
    heads: Heads,
    /// `seps[i].key` separates child `i` (keys below) from child `i + 1`, `seps[i].right`;
    /// child 0 is `first`.
    seps: Vec<Sep>,
    /// The children are leaves (all leaves are at one depth, and a leaf never becomes an
    /// inner node: only the root changes kind, and the root is nobody's child).
    leaf_children: bool,
}

enum Node {
    Leaf(Leaf),
    Inner(Inner),
    /// A node removed from the tree by a merge (or a root collapse). Its allocation stays
    /// on the tree's free list until a split reuses it or the tree is dropped, so a stale
    /// [`LeafHint`] still names valid memory; a hinted access sees `Dead` (or a reused node
    /// whose fences it checks) and descends from the root instead.
    Dead,
}

impl Inner {
    fn child_index(&self, key: &Probe<'_>) -> usize {
        self.heads
            .partition(&self.seps, key.prefix(), |s| s.key.le(key))
    }

    /// The index of the child whose keys end just below `key` (a separator equal to `key`
    /// sends us left).
    fn child_index_below(&self, key: &Probe<'_>) -> usize {
        self.heads
            .partition(&self.seps, key.prefix(), |s| s.key.lt(key))
    }

    fn insert_sep(&mut self, i: usize, sep: Sep) {
        self.heads.0.insert(i, sep.key.prefix());
        self.seps.insert(i, sep);
    }

    fn remove_sep(&mut self, i: usize) -> Sep {
        self.heads.0.remove(i);
        self.seps.remove(i)
    }

    fn child(&self, i: usize) -> &NodeRef {
        match i {
            0 => &self.first,
            i => &self.seps[i - 1].right,
        }
    }

    fn children(&self) -> impl Iterator<Item = &NodeRef> {
        std::iter::once(&self.first).chain(self.seps.iter().map(|s| &s.right))
    }
}

impl Leaf {
    /// Calls `f` with the record at `key`, if any.
    fn read<R>(&self, key: &Probe<'_>, f: impl FnOnce(Option<&Record>) -> R) -> R {
        match self.search(key) {
            Ok(i) => f(Some(&self.ents[i].rec)),
            Err(_) => f(None),
        }
    }

    /// Whether an update of `key` here could need a split: the leaf is full and `key` absent.
    fn may_split(&self, key: &Probe<'_>, cap: usize) -> bool {
        self.ents.len() >= cap && self.search(key).is_err()
    }

    /// True when `key` lies within this leaf's fences, [`low`, `high`).
    ///
    /// Under the leaf's latch this says that the leaf is *the* leaf of `key`: the one a
    /// descent for `key` would reach now, where `key`'s record is if it exists and where an
    /// insert of `key` goes. The fences of the leaves partition the key space: a split changes
    /// them only under the write latches of the parent and the splitting leaf (the leaf's
    /// `high` drops to the separator in the same critical section that moves the entries at
    /// or above it into the new right sibling, whose fences are set before the parent
    /// publishes it), every record sits in the leaf whose fences hold its key
    /// ([`BTree::check_invariants`]), and a merge widens the surviving leaf's fences in the
    /// same critical section (both leaves and the parent write-latched) that moves the other
    /// leaf's entries over and marks it [`Node::Dead`], so no *live* leaf keeps fences that
    /// another leaf now covers. A hinted access therefore checks that the node is a live
    /// leaf first: a dead node, the root while it is an inner node, or an inner node that a
    /// recycled allocation became, fail that check. A recycled node that is a leaf again
    /// has the fences of its new place, which is all `covers` relies on.
    #[inline]
    fn covers(&self, key: &Probe<'_>) -> bool {
        self.low.as_ref().is_none_or(|lo| lo.le(key))
            && self.high.as_ref().is_none_or(|hi| !hi.le(key))
    }

    fn search(&self, key: &Probe<'_>) -> Result<usize, usize> {
        let i = self.lower_bound(key);
        match self.ents.get(i) {
            Some(e) if self.heads.0[i] == key.prefix() && e.key.cmp_probe(key).is_eq() => Ok(i),
            _ => Err(i),
        }
    }

    /// The number of keys below `key`.
    fn lower_bound(&self, key: &Probe<'_>) -> usize {
        self.heads
            .partition(&self.ents, key.prefix(), |e| e.key.lt(key))
    }

    /// The number of keys at or below `key`.
    fn upper_bound(&self, key: &Probe<'_>) -> usize {
        self.heads
            .partition(&self.ents, key.prefix(), |e| e.key.le(key))
    }

    fn insert(&mut self, i: usize, e: Entry) {
        self.heads.0.insert(i, e.key.prefix());
        self.ents.insert(i, e);
    }

    fn remove(&mut self, i: usize) {
        self.heads.0.remove(i);
        self.ents.remove(i);
    }
}

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
    root: NodeRef,
    leaf_cap: usize,
    inner_cap: usize,
    /// Unique among all trees this process ever makes ([`NEXT_TREE_ID`]): a [`LeafHint`] is
    /// honoured only by the tree with its id.
    id: u64,
    /// Nodes that merges took out of the tree, all [`Node::Dead`]: kept allocated (hints and
    /// pinned borrows may still name them) and reused by splits, so their number is bounded
    /// by the most nodes the tree ever had at once.
    free: Mutex<Vec<NodeRef>>,
}

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
    /// Dead nodes kept for reuse.
    pub free: usize,
}

/// The id of the next [`BTree`]. Ids are never reused (a `u64` does not wrap in practice).
static NEXT_TREE_ID: AtomicU64 = AtomicU64::new(1);

/// An opaque handle to the leaf where an operation on a key ended, returned by
/// [`BTree::get_hinted`] and [`BTree::update_hinted`] and accepted back by them to skip the
/// root-to-leaf descent (Silo keeps record pointers for the same reason).
///
/// A hint is only ever a guess: the tree uses it only if it is a hint of this very tree and,
/// under the leaf's latch, the node is still a leaf whose fence keys hold the key; otherwise
/// it descends from the root as usual. A stale hint, or one from another tree, costs a latch
/// and a comparison, never a wrong answer. There is no way to reach the node through a hint.
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
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LeafHint {
    tree: u64,
    leaf: NonNull<RwLock<Node>>,
}

// SAFETY: a hint is an address and a tree id; it grants no access by itself. It is
// dereferenced only by `BTree::hinted_node`, under that function's own safety argument, and
// what it yields there is a `&RwLock<Node>`, which is `Sync`. So a hint may be sent to or
// shared with any thread.
unsafe impl Send for LeafHint {}
// SAFETY: as for `Send`.
unsafe impl Sync for LeafHint {}

impl std::fmt::Debug for LeafHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeafHint")
            .field("tree", &self.tree)
            .finish_non_exhaustive()
    }
}

impl Default for BTree {
    fn default() -> Self {
        Self::new()
    }
}

fn new_leaf(low: Option<Key>, high: Option<Key>) -> Node {
    Node::Leaf(Leaf {
        low,
        high,
        heads: Heads::default(),
        ents: Vec::new(),
    })
}

impl BTree {
    /// An empty tree with the default node sizes (64 records per leaf, 64 separators per inner
    /// node).
    pub fn new() -> Self {
        Self::with_capacity(64, 64)
    }

    /// An empty tree with the given node sizes, at least 3 each (tests use tiny nodes to force
    /// splits).
    ///
    /// ```
    /// let t = shoal::storage::btree::BTree::with_capacity(3, 3);
    /// assert!(t.is_empty());
    /// ```
    pub fn with_capacity(leaf_cap: usize, inner_cap: usize) -> Self {
        BTree {
            root: Arc::new(RwLock::new(new_leaf(None, None))),
            leaf_cap: leaf_cap.max(3),
            inner_cap: inner_cap.max(3),
            id: NEXT_TREE_ID.fetch_add(1, AtomicOrdering::Relaxed),
            free: Mutex::new(Vec::new()),
        }
    }

    /// A node for `n`: a dead one from the free list if any (its latch is free or held only
    /// briefly by a stale hint's check, which then sees the new contents), else a new one.
    fn alloc(&self, n: Node) -> NodeRef {
        let reused = self.free.lock().pop();
        match reused {
            Some(r) => {
                *r.write() = n;
                r
            }
            None => Arc::new(RwLock::new(n)),
        }
    }

    /// Puts a node that is no longer reachable (already [`Node::Dead`]) on the free list.
    fn retire(&self, n: NodeRef) {
        debug_assert!(matches!(&*n.read(), Node::Dead));
        self.free.lock().push(n);
    }

    /// Fewest entries of a leaf that is not underfull: a leaf that drops below merges with a
    /// sibling when their entries fit in one leaf with room to spare.
    fn min_leaf(&self) -> usize {
        (self.leaf_cap / 4).max(1)
    }

    /// Fewest separators of an inner node that is not underfull.
    fn min_inner(&self) -> usize {
        (self.inner_cap / 4).max(1)
    }

    /// The hint for `leaf`, a node of this tree.
    #[inline]
    fn hint(&self, leaf: &RwLock<Node>) -> LeafHint {
        LeafHint {
            tree: self.id,
            leaf: NonNull::from(leaf),
        }
    }

    /// The node `hint` names, if it is a hint of this tree.
    #[inline]
    fn hinted_node(&self, hint: Option<LeafHint>) -> Option<&RwLock<Node>> {
        let h = hint.filter(|h| h.tree == self.id)?;
        // SAFETY: ids are unique per tree (`NEXT_TREE_ID`; a `BTree` is neither `Clone` nor
        // rebuilt in place), so `h` was made by `self.hint` from a `&RwLock<Node>` that was a
        // node of this tree (the root, or a node borrowed through `pin`). As the SAFETY
        // comment on `pin` explains, no node is freed before its tree (a merged node stays
        // allocated on the free list), and moving the `BTree` value does not move its nodes
        // (each sits in its own `Arc` allocation). `&self` keeps the tree, hence the node,
        // alive for the returned borrow. The node is only ever accessed through shared
        // references (its latch provides the mutability); it may be dead or reused, which
        // the callers check under its latch.
        Some(unsafe { h.leaf.as_ref() })
    }

    /// A node of this tree, borrowed for as long as the tree: a descent can then latch a child
    /// and release the parent without cloning the child's `Arc` (reference counting on the
    /// upper levels is shared-cache-line traffic between all threads).
    #[inline]
    fn pin<'t>(&'t self, node: &NodeRef) -> &'t RwLock<Node> {
        // SAFETY: `node` was read from a node of this tree under its latch. No node of a tree
        // is ever dropped before the tree: a split moves the `Arc`s it splits off into the
        // new sibling (`split_off`), a root split moves the root's old contents into a new
        // child, a merge moves the `Arc`s of the dead node's children into the survivor and
        // the dead node's own `Arc` onto the free list (`retire`), a root collapse moves the
        // child's contents into the root and the child onto the free list, and a node leaves
        // the free list only to be linked into the tree again (`alloc`). `Arc`s leave `seps`
        // vectors only by moving. So the tree holds a strong reference to `node`'s allocation
        // until the tree itself is dropped, which cannot happen while `&'t self` is borrowed.
        // (The node may die while the borrow lasts; whoever latches it again through the
        // borrow without its parent, hints only, checks for that.)
        unsafe { &*Arc::as_ptr(node) }
    }

    /// Calls `f` with the record at `key` (ghosts included) under the leaf's read latch.
    ///
    /// ```
    /// let t = shoal::storage::btree::BTree::new();
    /// assert!(t.get(b"k", |r| r.is_none()));
    /// ```
    pub fn get<R>(&self, key: &[u8], f: impl FnOnce(Option<&Record>) -> R) -> R {
        self.get_descend(&Probe::new(key), f).0
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
        let key = &Probe::new(key);
        if let Some(node) = self.hinted_node(hint) {
            let g = node.read();
            if let Node::Leaf(l) = &*g {
                if l.covers(key) {
                    let r = l.read(key, f);
                    return (r, self.hint(node));
                }
            }
        }
        let (r, leaf) = self.get_descend(key, f);
        (r, self.hint(leaf))
    }

    /// [`get`](Self::get) from the root; also returns the leaf it ended in.
    fn get_descend<R>(
        &self,
        key: &Probe<'_>,
        f: impl FnOnce(Option<&Record>) -> R,
    ) -> (R, &RwLock<Node>) {
        let mut node: &RwLock<Node> = &self.root;
        let mut g = node.read();
        loop {
            let child = match &*g {
                Node::Leaf(l) => {
                    let r = l.read(key, f);
                    return (r, node);
                }
                Node::Inner(n) => self.pin(n.child(n.child_index(key))),
                Node::Dead => unreachable_leaf(),
            };
            node = child;
            g = child.read();
        }
    }

    /// Calls `f` with the slot of `key` under the leaf's write latch: `None` if absent.
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
        self.update_with_prior(key, |slot, _| f(slot))
    }

    /// Like [`update`](Self::update), and also tells `f` the greatest key below `key` (ghosts
    /// included) when the latched leaf shows it: `Some(Some(k))`, or `Some(None)` when no key
    /// is below `key`; `None` when it is in another leaf (ask [`predecessor`](Self::predecessor)).
    /// Saves an inserter a descent, and lets it check the prior key under the same latch as
    /// the insert.
    pub(crate) fn update_with_prior<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(&mut Option<Record>, Option<Option<&[u8]>>) -> R,
    ) -> R {
        self.update_descend(&Probe::new(key), f).0
    }

    /// Like [`update`](Self::update), and first tries the leaf `hint` names (see
    /// [`LeafHint`]); also returns the hint of the leaf that held the slot.
    ///
    /// The hinted leaf is used only if, under its write latch, it is still a leaf whose fences
    /// hold `key`, and `f` cannot need a split (the leaf has room or `key` is there): then `f`
    /// runs on exactly the slot a descent would have reached. Otherwise this descends as
    /// [`update`](Self::update) does. `f` runs exactly once either way.
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
        let key = &Probe::new(key);
        let f = |slot: &mut Option<Record>, _: Option<Option<&[u8]>>| f(slot);
        let f = match self.hinted_node(hint) {
            None => f,
            Some(node) => {
                let mut w = node.write();
                match &mut *w {
                    Node::Leaf(l) if l.covers(key) => {
                        if !l.may_split(key, self.leaf_cap) {
                            let (r, shrank) = self.apply(l, key, f);
                            drop(w);
                            if shrank {
                                self.rebalance(key);
                            }
                            return (r, self.hint(node));
                        }
                        f
                    }
                    _ => f,
                }
            }
        };
        let (r, leaf) = self.update_descend(key, f);
        (r, self.hint(leaf))
    }

    /// [`update_with_prior`](Self::update_with_prior) from the root; also returns the leaf it
    /// ended in.
    fn update_descend<R>(
        &self,
        key: &Probe<'_>,
        f: impl FnOnce(&mut Option<Record>, Option<Option<&[u8]>>) -> R,
    ) -> (R, &RwLock<Node>) {
        let (r, leaf, shrank) = match self.update_optimistic(key, f) {
            Ok(r) => r,
            Err(f) => self.update_pessimistic(key, f),
        };
        // No latch is held here: merging takes its own, from the root down.
        if shrank {
            self.rebalance(key);
        }
        (r, leaf)
    }

    /// Runs `f` on `key`'s slot in `l`; also says whether it removed an entry and so left
    /// the leaf empty or just below [`min_leaf`](Self::min_leaf) entries (then the caller
    /// calls [`rebalance`](Self::rebalance) once it has released its latches). Only those
    /// two crossings ask, so a leaf that cannot merge is not retried on every removal.
    fn apply<R>(
        &self,
        l: &mut Leaf,
        key: &Probe<'_>,
        f: impl FnOnce(&mut Option<Record>, Option<Option<&[u8]>>) -> R,
    ) -> (R, bool) {
        let found = l.search(key);
        let i = match found {
            Ok(i) | Err(i) => i,
        };
        // Slot `i` is `key`'s (found or to be inserted): the key below it is at `i - 1`, or
        // below the low fence (another leaf) unless this leaf starts at -infinity.
        let starts_at_neg_inf = l.low.is_none();
        let (below, rest) = l.ents.split_at_mut(i);
        let prior = match below.last() {
            Some(e) => Some(Some(&e.key[..])),
            None if starts_at_neg_inf => Some(None),
            None => None,
        };
        match found {
            Ok(_) => {
                let e = &mut rest[0];
                let mut slot = Some(std::mem::take(&mut e.rec));
                let r = f(&mut slot, prior);
                match slot {
                    Some(rec) => {
                        e.rec = rec;
                        (r, false)
                    }
                    None => {
                        l.remove(i);
                        let n = l.ents.len();
                        (r, n == 0 || n + 1 == self.min_leaf())
                    }
                }
            }
            Err(i) => {
                let mut slot = None;
                let r = f(&mut slot, prior);
                if let Some(rec) = slot {
                    l.insert(
                        i,
                        Entry {
                            key: Key::new(key.bytes),
                            rec,
                        },
                    );
                }
                (r, false)
            }
        }
    }

    /// Read latches down to the leaf's parent, a write latch on the leaf. Gives `f` back when
    /// the leaf is full and `key` absent (an insert could need a split).
    #[allow(clippy::type_complexity)]
    fn update_optimistic<R, F>(&self, key: &Probe<'_>, f: F) -> Result<(R, &RwLock<Node>, bool), F>
    where
        F: FnOnce(&mut Option<Record>, Option<Option<&[u8]>>) -> R,
    {
        let mut g = loop {
            // The root may itself be the leaf, and may turn from inner node into leaf (a
            // collapse, see `rebalance`) or back between any two of our latches.
            let g = self.root.read();
            if !matches!(&*g, Node::Leaf(_)) {
                break g;
            }
            drop(g);
            let mut w = self.root.write();
            if let Node::Leaf(l) = &mut *w {
                if l.may_split(key, self.leaf_cap) {
                    return Err(f);
                }
                let (r, shrank) = self.apply(l, key, f);
                return Ok((r, &self.root, shrank));
            }
            // It split between the two latches: descend normally.
        };
        loop {
            let (child, child_is_leaf) = match &*g {
                Node::Inner(n) => (self.pin(n.child(n.child_index(key))), n.leaf_children),
                // Only the root is ever a leaf above (handled before the loop), and a node we
                // reach from a latched parent is live.
                Node::Leaf(_) | Node::Dead => unreachable_leaf(),
            };
            if child_is_leaf {
                // The parent's read latch keeps the leaf from splitting or merging until we
                // hold its write latch.
                let mut w = child.write();
                drop(g);
                let Node::Leaf(l) = &mut *w else {
                    unreachable_leaf()
                };
                if l.may_split(key, self.leaf_cap) {
                    return Err(f);
                }
                let (r, shrank) = self.apply(l, key, f);
                return Ok((r, child, shrank));
            }
            g = child.read();
        }
    }

    /// Write-latch coupling with preemptive splits: every node entered has room for one more
    /// entry, so at most a parent and a child are latched at a time.
    fn update_pessimistic<R>(
        &self,
        key: &Probe<'_>,
        f: impl FnOnce(&mut Option<Record>, Option<Option<&[u8]>>) -> R,
    ) -> (R, &RwLock<Node>, bool) {
        let mut node: &RwLock<Node> = &self.root;
        let mut g = node.write();
        if self.is_full(&g) {
            self.split_root(&mut g);
        }
        loop {
            let (child, cg) = match &mut *g {
                Node::Leaf(l) => {
                    let (r, shrank) = self.apply(l, key, f);
                    return (r, node, shrank);
                }
                Node::Dead => unreachable_leaf(),
                Node::Inner(n) => {
                    let i = n.child_index(key);
                    let child = self.pin(n.child(i));
                    let mut cg = child.write();
                    if self.is_full(&cg) {
                        let (sep, right) = self.split(&mut cg);
                        n.insert_sep(i, Sep { key: sep, right });
                        // Re-pick between the two halves.
                        let j = n.child_index(key);
                        if j != i {
                            drop(cg);
                            let other = self.pin(n.child(j));
                            (other, other.write())
                        } else {
                            (child, cg)
                        }
                    } else {
                        (child, cg)
                    }
                }
            };
            node = child;
            g = cg;
        }
    }

    fn is_full(&self, n: &Node) -> bool {
        match n {
            Node::Leaf(l) => l.ents.len() >= self.leaf_cap,
            Node::Inner(n) => n.seps.len() >= self.inner_cap,
            Node::Dead => false,
        }
    }

    /// Splits a full node in place (it keeps the lower half); returns the separator and the
    /// new right sibling.
    fn split(&self, node: &mut Node) -> (Key, NodeRef) {
        match node {
            Node::Leaf(l) => {
                let mid = l.ents.len() / 2;
                let ents = l.ents.split_off(mid);
                let heads = Heads(l.heads.0.split_off(mid));
                let sep = ents[0].key.clone();
                let right = Leaf {
                    low: Some(sep.clone()),
                    high: l.high.take(),
                    heads,
                    ents,
                };
                l.high = Some(sep.clone());
                (sep, self.alloc(Node::Leaf(right)))
            }
            Node::Inner(n) => {
                let mid = n.seps.len() / 2;
                let mut seps = n.seps.split_off(mid);
                n.heads.0.truncate(mid);
                let Sep {
                    key: up,
                    right: first,
                } = seps.remove(0);
                let heads = Heads::of(seps.iter().map(|s| &s.key));
                let right = Inner {
                    low: Some(up.clone()),
                    high: n.high.take(),
                    first,
                    heads,
                    seps,
                    leaf_children: n.leaf_children,
                };
                n.high = Some(up.clone());
                (up, self.alloc(Node::Inner(right)))
            }
            Node::Dead => unreachable_leaf(),
        }
    }

    /// Moves the full root's contents into two new children.
    fn split_root(&self, root: &mut Node) {
        let mut left = std::mem::replace(root, new_leaf(None, None));
        let (sep, right) = self.split(&mut left);
        *root = Node::Inner(Inner {
            low: None,
            high: None,
            heads: Heads(vec![sep.prefix()]),
            seps: vec![Sep { key: sep, right }],
            leaf_children: matches!(left, Node::Leaf(_)),
            first: self.alloc(left),
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
        let mut target: Option<Key> = None;
        loop {
            let t = Probe::new(target.as_ref().map_or(key, |k| k.bytes()));
            // Descend to the leaf that holds `target`'s position.
            let mut g = self.root.read();
            let next_target = loop {
                let child = match &*g {
                    Node::Leaf(l) => {
                        let p = l.lower_bound(&t);
                        if p > 0 {
                            return Some(l.ents[p - 1].key.to_vec());
                        }
                        // Nothing below `target` here: look below the low fence.
                        match &l.low {
                            None => return None,
                            Some(low) => break low.clone(),
                        }
                    }
                    // The child whose keys end just below `target` (a separator equal to
                    // `target` sends us left).
                    Node::Inner(n) => self.pin(n.child(n.child_index_below(&t))),
                    Node::Dead => unreachable_leaf(),
                };
                g = child.read();
            };
            target = Some(next_target);
        }
    }

    /// Up to `limit` entries with keys within (`lo`, `hi`), ascending, ghosts included.
    /// Atomic per leaf, not across leaves.
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
        let mut out = Vec::new();
        let mut from: Bound<Key> = lo.map(Key::new);
        let hi = hi.map(Probe::new);
        let below_hi = |k: &Key| match &hi {
            Bound::Unbounded => true,
            Bound::Included(h) => k.le(h),
            Bound::Excluded(h) => k.lt(h),
        };
        while out.len() < limit {
            let from_probe = match &from {
                Bound::Unbounded => Bound::Unbounded,
                Bound::Included(k) => Bound::Included(Probe::new(k.bytes())),
                Bound::Excluded(k) => Bound::Excluded(Probe::new(k.bytes())),
            };
            let mut g = self.root.read();
            let next = loop {
                let child = match &*g {
                    Node::Leaf(l) => {
                        let start = match &from_probe {
                            Bound::Unbounded => 0,
                            Bound::Included(k) => l.lower_bound(k),
                            Bound::Excluded(k) => l.upper_bound(k),
                        };
                        for e in &l.ents[start..] {
                            if out.len() >= limit {
                                return out;
                            }
                            if !below_hi(&e.key) {
                                return out;
                            }
                            out.push((e.key.to_vec(), e.rec.clone()));
                        }
                        match &l.high {
                            None => return out,
                            Some(h) if !below_hi(h) => return out,
                            Some(h) => break h.clone(),
                        }
                    }
                    Node::Inner(n) => {
                        let i = match &from_probe {
                            Bound::Unbounded => 0,
                            Bound::Included(k) | Bound::Excluded(k) => n.child_index(k),
                        };
                        self.pin(n.child(i))
                    }
                    Node::Dead => unreachable_leaf(),
                };
                g = child.read();
            };
            from = Bound::Included(next);
        }
        out
    }

    /// Number of entries, ghosts included (walks the whole tree).
    ///
    /// ```
    /// assert_eq!(shoal::storage::btree::BTree::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        fn walk(n: &NodeRef) -> usize {
            match &*n.read() {
                Node::Leaf(l) => l.ents.len(),
                Node::Inner(i) => i.children().map(walk).sum(),
                Node::Dead => 0,
            }
        }
        walk(&self.root)
    }

    /// True when the tree holds no entries.
    ///
    /// ```
    /// assert!(shoal::storage::btree::BTree::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks ordering, fence keys and separators and that all leaves have the same depth;
    /// describes the first violation. Takes read latches, so it may run concurrently.
    ///
    /// ```
    /// assert!(shoal::storage::btree::BTree::new().check_invariants().is_ok());
    /// ```
    pub fn check_invariants(&self) -> Result<(), String> {
        let root = self.root.read();
        let (low, high) = match &*root {
            Node::Leaf(l) => (&l.low, &l.high),
            Node::Inner(n) => (&n.low, &n.high),
            Node::Dead => return Err("the root is dead".into()),
        };
        if low.is_some() || high.is_some() {
            return Err("the root's fences must be -inf and +inf".into());
        }
        drop(root);
        let mut leaf_depth = None;
        let mut live = std::collections::HashSet::new();
        self.check_node(&self.root, None, None, 0, &mut leaf_depth, &mut live)?;
        // The free list: dead nodes only, none of them reachable. (Copied first, so that no
        // latch is taken under the list's mutex.)
        let free: Vec<NodeRef> = self.free.lock().clone();
        for n in &free {
            if !matches!(&*n.read(), Node::Dead) {
                return Err("a node on the free list is not dead".into());
            }
            if live.contains(&Arc::as_ptr(n)) {
                return Err("a node on the free list is reachable".into());
            }
        }
        Ok(())
    }

    /// Counts the nodes and entries (read latches, one node at a time below its parent).
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
        fn walk(n: &NodeRef, depth: usize, s: &mut TreeStats) {
            s.height = s.height.max(depth);
            match &*n.read() {
                Node::Leaf(l) => {
                    s.leaves += 1;
                    s.entries += l.ents.len();
                    s.ghosts += l.ents.iter().filter(|e| e.rec.ghost).count();
                    s.empty_leaves += usize::from(l.ents.is_empty());
                }
                Node::Inner(i) => {
                    s.inner += 1;
                    for c in i.children() {
                        walk(c, depth + 1, s);
                    }
                }
                Node::Dead => {}
            }
        }
        let mut s = TreeStats::default();
        walk(&self.root, 1, &mut s);
        s.free = self.free.lock().len();
        s
    }

    /// Merges underfull nodes on the path to `key`, after a removal left its leaf empty or
    /// underfull: write-latch coupling from the root, as preemptive splits descend.
    ///
    /// At each inner node (write-latched) the child on the path is latched; if it is
    /// underfull and it and its right sibling (or else its left one) fit in one node, the
    /// right one's contents move into the left one, whose high fence becomes the right one's,
    /// the parent drops the separator between them, and the right node becomes
    /// [`Node::Dead`] and goes to the free list, all under the write latches of the parent
    /// and both children. A descent or scan never sees a half-merged pair (it holds the
    /// parent's latch while it moves to a child), and a hinted access latches one node and
    /// finds it dead or a live leaf with its up-to-date fences. The root, when it is an inner
    /// node with a single child, takes that child's contents (the tree gets one level
    /// shorter). Latch order stays parent before child; two siblings are latched together
    /// only under their parent's write latch, which excludes every other multi-node holder.
    ///
    /// A merge lower down can leave a node above underfull (or the root with one child)
    /// after the pass went by; then the pass runs again, at most once per level.
    fn rebalance(&self, key: &Probe<'_>) {
        while self.rebalance_pass(key) {}
    }

    /// One top-down pass of [`rebalance`](Self::rebalance); true when a merge left its
    /// parent underfull, so that another pass should look again.
    fn rebalance_pass(&self, key: &Probe<'_>) -> bool {
        let mut g = self.root.write();
        loop {
            let Node::Inner(n) = &mut *g else {
                return false; // a leaf root has nothing to merge with
            };
            if !n.seps.is_empty() {
                break;
            }
            // A single child: its fences are the root's (-inf, +inf), so its contents can
            // become the root's as they are.
            let mut cg = self.pin(&n.first).write();
            let contents = std::mem::replace(&mut *cg, Node::Dead);
            drop(cg);
            let Node::Inner(old) = std::mem::replace(&mut *g, contents) else {
                unreachable_leaf()
            };
            self.retire(old.first);
        }
        let mut again = false;
        loop {
            let Node::Inner(n) = &mut *g else {
                unreachable_leaf()
            };
            let leaf_children = n.leaf_children;
            let i = n.child_index(key);
            let child = self.pin(n.child(i));
            let cg = child.write();
            let next = if self.underfull(&cg) {
                let before = n.seps.len();
                let next = self.merge_child(n, i, cg);
                again |= n.seps.len() < before && n.seps.len() < self.min_inner();
                next
            } else {
                cg
            };
            if leaf_children {
                return again;
            }
            g = next;
        }
    }

    /// What holds once every removal's `rebalance` has run (no concurrent writer): an empty
    /// leaf is the root or its parent's only child. Test-only.
    #[cfg(test)]
    fn check_compact(&self) -> Result<(), String> {
        fn walk(n: &NodeRef) -> Result<(), String> {
            if let Node::Inner(i) = &*n.read() {
                for c in i.children() {
                    if let Node::Leaf(l) = &*c.read() {
                        if l.ents.is_empty() && !i.seps.is_empty() {
                            return Err(format!("an empty leaf at {:?} has a sibling", l.low));
                        }
                    }
                    walk(c)?;
                }
            }
            Ok(())
        }
        walk(&self.root)
    }

    fn underfull(&self, n: &Node) -> bool {
        match n {
            Node::Leaf(l) => l.ents.len() < self.min_leaf(),
            Node::Inner(i) => i.seps.len() < self.min_inner(),
            Node::Dead => false,
        }
    }

    /// Whether nodes of these sizes (entries, or separators) merge into one of `a + b +
    /// extra` (`extra` is 1 for inner nodes: their separator comes down): it must fit, with a
    /// quarter to spare so that a few inserts do not split it again at once, unless one of
    /// them is empty (an empty leaf, or an inner node with one child, always goes if it fits).
    fn fits(a: usize, b: usize, extra: usize, cap: usize) -> bool {
        let n = a + b + extra;
        n <= cap && (a == 0 || b == 0 || n <= cap - cap / 4)
    }

    /// Merges child `i` of `n` (write-latched as `cg`) with a sibling if they fit; returns
    /// the write guard of the node that now holds child `i`'s key range.
    fn merge_child<'t>(
        &'t self,
        n: &mut Inner,
        i: usize,
        mut cg: parking_lot::RwLockWriteGuard<'t, Node>,
    ) -> parking_lot::RwLockWriteGuard<'t, Node> {
        // Right sibling first: `cg` stays the survivor.
        if i < n.seps.len() {
            let mut rg = self.pin(&n.seps[i].right).write();
            if self.merge_pair(&mut cg, &mut rg, &n.seps[i].key) {
                drop(rg);
                let sep = n.remove_sep(i);
                self.retire(sep.right);
                return cg;
            }
        }
        if i > 0 {
            let mut lg = self.pin(n.child(i - 1)).write();
            if self.merge_pair(&mut lg, &mut cg, &n.seps[i - 1].key) {
                drop(cg);
                let sep = n.remove_sep(i - 1);
                self.retire(sep.right);
                return lg;
            }
        }
        cg
    }

    /// Moves `right`'s contents into `left` (adjacent siblings, `sep` the separator between
    /// them) if they fit; `right` becomes dead. Both write-latched, and their parent too.
    fn merge_pair(&self, left: &mut Node, right: &mut Node, sep: &Key) -> bool {
        match (&mut *left, &mut *right) {
            (Node::Leaf(l), Node::Leaf(r)) => {
                if !Self::fits(l.ents.len(), r.ents.len(), 0, self.leaf_cap) {
                    return false;
                }
                l.ents.append(&mut r.ents);
                l.heads.0.append(&mut r.heads.0);
                l.high = r.high.take();
            }
            (Node::Inner(l), Node::Inner(r)) => {
                // The separator comes down between the two children lists.
                if !Self::fits(l.seps.len(), r.seps.len(), 1, self.inner_cap) {
                    return false;
                }
                let first = std::mem::replace(&mut r.first, Arc::clone(&l.first));
                l.insert_sep(
                    l.seps.len(),
                    Sep {
                        key: sep.clone(),
                        right: first,
                    },
                );
                l.seps.append(&mut r.seps);
                l.heads.0.append(&mut r.heads.0);
                l.high = r.high.take();
            }
            _ => unreachable_leaf(),
        }
        *right = Node::Dead;
        true
    }

    fn check_node(
        &self,
        n: &NodeRef,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        depth: usize,
        leaf_depth: &mut Option<usize>,
        live: &mut std::collections::HashSet<*const RwLock<Node>>,
    ) -> Result<(), String> {
        if !live.insert(Arc::as_ptr(n)) {
            return Err("a node is reachable twice".into());
        }
        let g = n.read();
        let (nl, nh) = match &*g {
            Node::Leaf(l) => (&l.low, &l.high),
            Node::Inner(i) => (&i.low, &i.high),
            Node::Dead => return Err("a dead node is reachable".into()),
        };
        if nl.as_deref() != low || nh.as_deref() != high {
            return Err(format!(
                "fences {nl:?}..{nh:?} differ from the parent's separators {low:?}..{high:?}"
            ));
        }
        let within = |k: &[u8]| low.is_none_or(|l| k >= l) && high.is_none_or(|h| k < h);
        let (keys, heads): (Vec<&Key>, _) = match &*g {
            Node::Leaf(l) => (l.ents.iter().map(|e| &e.key).collect(), &l.heads),
            Node::Inner(i) => (i.seps.iter().map(|s| &s.key).collect(), &i.heads),
            Node::Dead => unreachable_leaf(),
        };
        if !heads.0.iter().copied().eq(keys.iter().map(|k| k.prefix())) {
            return Err("a node's key heads differ from its keys".into());
        }
        if let Some(k) = keys
            .iter()
            .copied()
            .chain(nl)
            .chain(nh)
            .find(|k| !k.well_formed())
        {
            return Err(format!("key {k:?} is not stored in its canonical form"));
        }
        match &*g {
            Node::Leaf(l) => {
                if l.ents.len() > self.leaf_cap {
                    return Err("overfull leaf".into());
                }
                if keys.windows(2).any(|w| w[0][..] >= w[1][..]) {
                    return Err("leaf keys out of order".into());
                }
                if let Some(k) = keys.iter().find(|k| !within(k)) {
                    return Err(format!("key {k:?} outside its leaf's fences"));
                }
                match leaf_depth {
                    None => *leaf_depth = Some(depth),
                    Some(d) if *d != depth => return Err("leaves at different depths".into()),
                    _ => {}
                }
                Ok(())
            }
            Node::Inner(i) => {
                if keys.windows(2).any(|w| w[0][..] >= w[1][..]) {
                    return Err("separators out of order".into());
                }
                if let Some(k) = keys.iter().find(|k| !within(k)) {
                    return Err(format!("separator {k:?} outside its node's fences"));
                }
                for (c, child) in i.children().enumerate() {
                    if matches!(&*child.read(), Node::Leaf(_)) != i.leaf_children {
                        return Err("inner node: leaf_children does not match its children".into());
                    }
                    let cl = if c == 0 {
                        low
                    } else {
                        Some(&i.seps[c - 1].key[..])
                    };
                    let ch = if c == i.seps.len() {
                        high
                    } else {
                        Some(&i.seps[c].key[..])
                    };
                    self.check_node(child, cl, ch, depth + 1, leaf_depth, live)?;
                }
                Ok(())
            }
            Node::Dead => unreachable_leaf(),
        }
    }
}

/// A descent met a node of the wrong kind: a leaf where its parent says inner nodes are, or
/// a dead node reached through a latched parent. Neither can happen: only the root changes
/// kind, and a node dies only under its parent's write latch, as it leaves the parent.
fn unreachable_leaf() -> ! {
    unreachable!("a descent met a node of the wrong kind (only the root changes kind)")
}

#[cfg(test)]
mod tests {
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
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn inline_keys_order_like_byte_strings(a in long_key(), b in long_key()) {
            let k = Key::new(&a);
            prop_assert!(k.well_formed());
            prop_assert_eq!(&k[..], &a[..]);
            prop_assert_eq!(k.cmp_probe(&Probe::new(&b)), a.cmp(&b));
            prop_assert_eq!(k.cmp_probe(&Probe::new(&a)), Ordering::Equal);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn head_search_finds_the_partition_point(
            mut keys in proptest::collection::vec(long_key(), 0..80),
            probe in long_key(),
        ) {
            keys.sort();
            keys.dedup();
            let ks: Vec<Key> = keys.iter().map(|k| Key::new(k)).collect();
            let heads = Heads::of(ks.iter());
            let p = Probe::new(&probe);
            let lt = heads.partition(&ks, p.prefix(), |k| k.lt(&p));
            let le = heads.partition(&ks, p.prefix(), |k| k.le(&p));
            prop_assert_eq!(lt, keys.partition_point(|k| k < &probe));
            prop_assert_eq!(le, keys.partition_point(|k| k <= &probe));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]
        #[test]
        fn matches_a_btreemap_model_with_long_keys(
            ops in proptest::collection::vec(
                (long_key(), any::<u8>(), 0u8..4), 1..300),
            cap in 3usize..6,
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
        fn matches_a_btreemap_model(ops in proptest::collection::vec(op(), 1..300), cap in 3usize..6) {
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
            cap in 3usize..6,
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
                                assert!(
                                    got.windows(2).all(|w| w[0].0 < w[1].0),
                                    "scan out of order"
                                );
                                assert!(
                                    got.iter().all(|(k, _)| k[..] >= lo[..]),
                                    "scan below bound"
                                );
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
}
