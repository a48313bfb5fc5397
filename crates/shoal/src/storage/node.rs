//! The slotted layout of a B+-tree node in one page (after Graefe, "Modern B-tree
//! techniques", §3.3, and LeanStore's node layout, without prefix truncation).
//!
//! ```text
//! word 0      kind (8 bits) | leaf_children (bit 8) | slot count (bits 16..32)
//! word 1      data start (byte offset, bits 0..32) | live data bytes (bits 32..64)
//! word 2, 3   low and high fence: present (bit 63) | length (bits 32..48) | offset (0..32)
//! word 4      inner: the child below the first separator; overflow: the next page
//! word 5      overflow: the bytes of the value in this page
//! word 6      one more than the slot of the last insert (sequential-insert detection)
//! word 7..23  search hints: the first 8 bytes (big-endian) of the keys of slots
//!             d, 2d, .. 16d with d = count / 17, when count is at least 34
//! word 23..27 the heads of the low and high fence (first 16 bytes, two words each)
//! word 27..   the slot array, four words (32 bytes) a slot, growing up:
//!               head  the key's first 16 bytes, zero padded, as a big-endian integer
//!               meta  data offset (bits 0..16) | key length (16..32) | inline value length
//!                     (32..62) | ghost (bit 62) | value in overflow pages (bit 63)
//!               word  leaf: the TID word; inner: the child right of the separator
//! ...         free space
//! ..end       record data, growing down from the end of the page, 8-byte aligned:
//!               leaf   [key][value, or the overflow reference]
//!               inner  [separator key]
//!             and the two fence keys.
//! ```
//!
//! The word sits in the slot, not with the record: a descent reads the child id from the
//! line the search ended on instead of missing the cache once more in the data area, and an
//! OCC validation reads a TID without touching the record. A slot is 32 bytes, so two share a
//! cache line and none straddles two (with 24-byte slots a quarter did); per record the page
//! holds the same bytes as with the word in the data area.
//!
//! A binary search compares the heads, integers in the slot array, and reads a record's key
//! bytes only when two keys share their first 16 bytes and both are longer (16, not 8: the
//! benchmarks' composite keys, such as TPC-C's warehouse, district and customer numbers,
//! share their first 8 bytes across hundreds of neighbours). The ghost bit and
//! the TID word of optimistic concurrency control (Silo) sit in the page with the record, so
//! neither a lookup nor a TID check allocates. A value longer than [`INLINE_VALUE`] lives in a
//! chain of overflow pages; the record then holds its first page and its length.
//!
//! Removing a record leaves a hole in the data area (the live byte count drops); an insert
//! that finds the contiguous free space too small but enough bytes free in total compacts
//! the page first. Splits, merges and compaction go through an owned [`Image`] of the node.
//!
//! Every read accessor here is safe to call on a page a writer may be changing (optimistic
//! readers do): indices are clamped to the page, and the caller validates the page version
//! before using the result. Every writing accessor requires the page's exclusive latch.

use std::cmp::Ordering;

use super::page::{Frame, PageId, INLINE_VALUE, NO_PAGE, PAGE_SIZE, PAGE_WORDS};

/// A page on the free list (or never used).
pub const KIND_FREE: u64 = 0;
/// A leaf node.
pub const KIND_LEAF: u64 = 1;
/// An inner node.
pub const KIND_INNER: u64 = 2;
/// A page of an overflow chain.
pub const KIND_OVERFLOW: u64 = 3;

const W_KIND: usize = 0;
const W_DATA: usize = 1;
const W_LOW: usize = 2;
const W_HIGH: usize = 3;
/// First child (inner) or next page (overflow).
pub const W_LINK: usize = 4;
/// Bytes in an overflow page.
pub const W_OVLEN: usize = 5;
/// One more than the slot of the last insert (0: none since the page was written whole).
const W_LAST: usize = 6;
/// The search hints: the first 8 bytes of every `count / (HINTS + 1)`-th key (see
/// [`Node::window`]).
const W_HINTS: usize = 7;
/// Number of search hints.
const HINTS: usize = 16;
/// The low fence's head (two words), then the high fence's: a leaf reached through a
/// [`LeafHint`](super::btree::LeafHint) is checked against its fences ([`Node::covers`])
/// from the header's lines, without missing the cache twice more in the data area where the
/// fence keys are, unless a fence and the key share their first 16 bytes.
const W_FENCE_HEADS: usize = W_HINTS + HINTS;
/// Nodes with fewer slots keep no hints (a plain binary search touches a few lines anyway).
const HINT_MIN: usize = 2 * (HINTS + 1);
/// Words before the slot array (and before an overflow page's bytes): with the frame's
/// latch word in front, the header, the hints and the fence heads take 224 bytes (three
/// and a half cache lines), so every slot starts at a multiple of 32 bytes and none
/// straddles two lines.
pub const HDR_WORDS: usize = W_FENCE_HEADS + 4;
const HDR: usize = HDR_WORDS * 8;
/// Bytes of an overflow page's payload.
pub const OVERFLOW_BYTES: usize = PAGE_SIZE - HDR;
/// Most slots a page can have (bounds loops over a torn page).
const MAX_SLOTS: usize = (PAGE_SIZE - HDR) / SLOT;
/// Words of a slot: the head (two) and the meta word.
const SLOT_WORDS: usize = 4;
/// Bytes of a slot.
const SLOT: usize = SLOT_WORDS * 8;
/// A binary search over at most this many slots (32 cache lines) first prefetches them all.
const PREFETCH_SLOTS: usize = 64;

/// The cache lines a descent asks for at once when it reaches a leaf, in a tree whose full
/// leaves hold `count` slots: the frame's latch and the page's header (with the search
/// hints), and when leaves are small (at most [`SMALL_LEAF`] slots, mostly searched
/// without hints, over the whole slot array) the slot array too. The search then waits
/// for one round of misses instead of two: the header's, then the slots' it names.
pub fn leaf_prefetch_lines(count: usize) -> usize {
    if count > SMALL_LEAF {
        crate::storage::page::HEADER_LINES
    } else {
        1 + (HDR + SLOT * count).div_ceil(64)
    }
}

/// Most slots of a full leaf whose slot array a descent prefetches (25 lines in all).
pub const SMALL_LEAF: usize = 40;

const GHOST: u64 = 1 << 62;
const OVF: u64 = 1 << 63;
const PRESENT: u64 = 1 << 63;
/// Bytes of an overflow reference in a record: first page, total length.
pub const OVF_REF: usize = 16;

fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// A search key with its head precomputed.
#[derive(Clone, Copy)]
pub struct Probe<'a> {
    /// The first 16 bytes, zero padded, big-endian.
    pub head: u128,
    /// The whole key.
    pub bytes: &'a [u8],
}

/// The head of `k`: its first 16 bytes, zero padded, as a big-endian integer.
#[inline]
pub fn head_of(k: &[u8]) -> u128 {
    // Fixed-size reads only: a copy of a variable length into a padded buffer is a call to
    // `memcpy`, which costs more than the few loads here (one per descent and per insert).
    if let Some(h) = k.first_chunk::<16>() {
        return u128::from_be_bytes(*h);
    }
    let (hi, lo) = match k.split_first_chunk::<8>() {
        Some((h, rest)) => (u64::from_be_bytes(*h), short_word(rest)),
        None => (short_word(k), 0),
    };
    (u128::from(hi) << 64) | u128::from(lo)
}

/// The first 8 bytes of `k`, zero padded, as a big-endian integer, read as at most one
/// 4-, one 2- and one 1-byte load.
#[inline]
fn short_word(k: &[u8]) -> u64 {
    if let Some(h) = k.first_chunk::<8>() {
        return u64::from_be_bytes(*h);
    }
    let mut w = 0u64;
    let mut rest = k;
    let mut shift = 64;
    if let Some((h, r)) = rest.split_first_chunk::<4>() {
        shift -= 32;
        w |= u64::from(u32::from_be_bytes(*h)) << shift;
        rest = r;
    }
    if let Some((h, r)) = rest.split_first_chunk::<2>() {
        shift -= 16;
        w |= u64::from(u16::from_be_bytes(*h)) << shift;
        rest = r;
    }
    if let Some(&b) = rest.first() {
        shift -= 8;
        w |= u64::from(b) << shift;
    }
    w
}

impl<'a> Probe<'a> {
    /// Prepares `bytes` for searching.
    #[inline]
    pub fn new(bytes: &'a [u8]) -> Self {
        Probe {
            head: head_of(bytes),
            bytes,
        }
    }
}

/// A slot's meta word, decoded.
#[derive(Clone, Copy, Debug)]
pub struct Meta {
    /// Byte offset of the record data.
    pub off: usize,
    /// Key length.
    pub klen: usize,
    /// Inline value length (the overflow reference's length when `ovf`).
    pub vlen: usize,
    /// Ghost bit.
    pub ghost: bool,
    /// The value is in overflow pages.
    pub ovf: bool,
}

impl Meta {
    fn decode(m: u64) -> Meta {
        Meta {
            off: (m & 0xffff) as usize,
            klen: ((m >> 16) & 0xffff) as usize,
            vlen: ((m >> 32) & 0x3fff_ffff) as usize,
            ghost: m & GHOST != 0,
            ovf: m & OVF != 0,
        }
    }

    fn encode(&self) -> u64 {
        (self.off as u64 & 0xffff)
            | ((self.klen as u64 & 0xffff) << 16)
            | ((self.vlen as u64 & 0x3fff_ffff) << 32)
            | if self.ghost { GHOST } else { 0 }
            | if self.ovf { OVF } else { 0 }
    }

    /// Bytes of record data (excluding the slot).
    fn data_bytes(&self) -> usize {
        pad8(self.klen + self.vlen)
    }
}

/// One entry of an [`Image`].
#[derive(Clone, Debug)]
pub struct Item {
    /// The key (a leaf's record key or an inner node's separator).
    pub key: Vec<u8>,
    /// The TID word (leaf) or the child to the right of the separator (inner).
    pub word: u64,
    /// Inline value bytes, or the overflow reference when `ovf` (leaf only).
    pub val: Vec<u8>,
    /// Ghost bit (leaf only).
    pub ghost: bool,
    /// `val` is an overflow reference.
    pub ovf: bool,
}

impl Item {
    /// Bytes this item takes in a page, slot included.
    pub fn size(&self) -> usize {
        self.entry().size()
    }

    /// The item, borrowed.
    pub fn entry(&self) -> Entry<'_> {
        Entry {
            key: &self.key,
            word: self.word,
            val: &self.val,
            ghost: self.ghost,
            ovf: self.ovf,
        }
    }
}

/// An [`Item`] whose key and value are borrowed: an insert writes them into the page
/// straight from the caller's buffers, with no copy of its own to allocate.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    /// The key (a leaf's record key or an inner node's separator).
    pub key: &'a [u8],
    /// The TID word (leaf) or the child to the right of the separator (inner).
    pub word: u64,
    /// Inline value bytes, or the overflow reference when `ovf` (leaf only).
    pub val: &'a [u8],
    /// Ghost bit (leaf only).
    pub ghost: bool,
    /// `val` is an overflow reference.
    pub ovf: bool,
}

impl Entry<'_> {
    /// Bytes this entry takes in a page, slot included.
    pub fn size(&self) -> usize {
        SLOT + pad8(self.key.len() + self.val.len())
    }

    /// An owned copy.
    pub fn to_item(self) -> Item {
        Item {
            key: self.key.to_vec(),
            word: self.word,
            val: self.val.to_vec(),
            ghost: self.ghost,
            ovf: self.ovf,
        }
    }
}

/// An owned copy of a node, for splits, merges and compaction.
#[derive(Clone, Debug)]
pub struct Image {
    /// [`KIND_LEAF`] or [`KIND_INNER`].
    pub kind: u64,
    /// Inner node whose children are leaves.
    pub leaf_children: bool,
    /// Low fence (inclusive), `None` = -infinity.
    pub low: Option<Vec<u8>>,
    /// High fence (exclusive), `None` = +infinity.
    pub high: Option<Vec<u8>>,
    /// The child below the first separator (inner).
    pub first: PageId,
    /// The entries in key order.
    pub items: Vec<Item>,
}

impl Image {
    /// An empty leaf with the given fences.
    pub fn leaf(low: Option<Vec<u8>>, high: Option<Vec<u8>>) -> Image {
        Image {
            kind: KIND_LEAF,
            leaf_children: false,
            low,
            high,
            first: NO_PAGE,
            items: Vec::new(),
        }
    }

    /// Bytes the fences and the header take.
    pub fn fixed_bytes(&self) -> usize {
        HDR + self.low.as_ref().map_or(0, |k| pad8(k.len()))
            + self.high.as_ref().map_or(0, |k| pad8(k.len()))
    }

    /// Bytes this image takes in a page.
    pub fn size(&self) -> usize {
        self.fixed_bytes() + self.items.iter().map(Item::size).sum::<usize>()
    }
}

/// A node view of a frame.
#[derive(Clone, Copy)]
pub struct Node<'a>(pub &'a Frame);

impl<'a> Node<'a> {
    /// The page kind (`KIND_*`).
    #[inline]
    pub fn kind(&self) -> u64 {
        self.0.load(W_KIND) & 0xff
    }

    /// True for a leaf.
    #[inline]
    pub fn is_leaf(&self) -> bool {
        self.kind() == KIND_LEAF
    }

    /// An inner node whose children are leaves.
    #[inline]
    pub fn leaf_children(&self) -> bool {
        self.0.load(W_KIND) & (1 << 8) != 0
    }

    /// Slots (entries or separators), clamped to what a page can hold.
    #[inline]
    pub fn count(&self) -> usize {
        (((self.0.load(W_KIND) >> 16) & 0xffff) as usize).min(MAX_SLOTS)
    }

    fn set_count(&self, n: usize) {
        let w = self.0.load(W_KIND);
        self.0
            .store(W_KIND, (w & !(0xffff << 16)) | ((n as u64 & 0xffff) << 16));
    }

    fn data_start(&self) -> usize {
        (self.0.load(W_DATA) & 0xffff_ffff) as usize
    }

    /// Live bytes in the data area (records and fences).
    pub fn used(&self) -> usize {
        (self.0.load(W_DATA) >> 32) as usize
    }

    fn set_data(&self, start: usize, used: usize) {
        self.0.store(W_DATA, start as u64 | ((used as u64) << 32));
    }

    /// Bytes free in total (after a compaction).
    pub fn free_total(&self) -> usize {
        PAGE_SIZE.saturating_sub(HDR + SLOT * self.count() + self.used())
    }

    /// Bytes the page holds (header, slots, live data).
    pub fn bytes_used(&self) -> usize {
        PAGE_SIZE - self.free_total()
    }

    fn gap(&self) -> usize {
        self.data_start().saturating_sub(HDR + SLOT * self.count())
    }

    /// Slot `i`'s head.
    #[inline]
    pub fn head(&self, i: usize) -> u128 {
        let w = HDR_WORDS + SLOT_WORDS * i;
        (u128::from(self.0.load(w)) << 64) | u128::from(self.0.load(w + 1))
    }

    /// Slot `i`'s meta word.
    #[inline]
    pub fn meta(&self, i: usize) -> Meta {
        Meta::decode(self.0.load(HDR_WORDS + SLOT_WORDS * i + 2))
    }

    /// The TID word (leaf) or right child (inner) of slot `i`.
    #[inline]
    pub fn word(&self, i: usize) -> u64 {
        self.0.load(HDR_WORDS + SLOT_WORDS * i + 3)
    }

    /// Appends slot `i`'s key to `out`.
    pub fn key_into(&self, i: usize, out: &mut Vec<u8>) {
        let m = self.meta(i);
        self.0.read_bytes(m.off, m.klen, out);
    }

    /// Slot `i`'s key.
    pub fn key(&self, i: usize) -> Vec<u8> {
        let mut k = Vec::new();
        self.key_into(i, &mut k);
        k
    }

    /// Appends slot `i`'s stored value bytes (inline value or overflow reference).
    pub fn val_into(&self, i: usize, out: &mut Vec<u8>) {
        let m = self.meta(i);
        let at = pad8_key_end(m.off, m.klen);
        self.0.read_bytes(at, m.vlen, out);
    }

    /// Orders slot `i`'s key against `p`.
    #[inline]
    pub fn cmp(&self, i: usize, p: &Probe<'_>) -> Ordering {
        let h = self.head(i);
        if h != p.head {
            return h.cmp(&p.head);
        }
        let m = self.meta(i);
        if m.klen <= 16 || p.bytes.len() <= 16 {
            return m.klen.cmp(&p.bytes.len());
        }
        self.0.cmp_bytes(m.off + 16, m.klen - 16, &p.bytes[16..])
    }

    /// Slots whose keys are below `p`.
    pub fn lower_bound(&self, p: &Probe<'_>) -> usize {
        self.partition(|o| o == Ordering::Less, p)
    }

    /// Slots whose keys are at or below `p`.
    pub fn upper_bound(&self, p: &Probe<'_>) -> usize {
        self.partition(|o| o != Ordering::Greater, p)
    }

    /// The slots `lo..hi` where a search for `p` ends (its answer lies in `lo..=hi`),
    /// narrowed by the hints (LeanStore's hint array): a slot whose first 8 key bytes are
    /// below `p`'s is below `p`, one whose first 8 bytes are above is above it. The hints
    /// take two adjacent cache lines; the binary search then spans a seventeenth of the slots
    /// and misses the cache some four times fewer on a large node.
    #[inline]
    fn window(&self, p: &Probe<'_>) -> (usize, usize) {
        let n = self.count();
        if n < HINT_MIN {
            return (0, n);
        }
        let d = n / (HINTS + 1);
        let h = (p.head >> 64) as u64;
        let (mut below, mut at_most) = (0, 0);
        for w in self.0.span_words(W_HINTS, W_HINTS + HINTS) {
            let x = w.load(std::sync::atomic::Ordering::Relaxed);
            below += usize::from(x < h);
            at_most += usize::from(x <= h);
        }
        let lo = if below == 0 { 0 } else { d * below + 1 };
        let hi = if at_most == HINTS {
            n
        } else {
            d * (at_most + 1)
        };
        (lo.min(n), hi.min(n))
    }

    /// Rewrites the hints whose slots are at `from` or after (all of them when the hint
    /// spacing changed from what `old_count` slots gave). Exclusive latch.
    fn update_hints(&self, from: usize, old_count: usize) {
        let n = self.count();
        if n < HINT_MIN {
            return;
        }
        let d = n / (HINTS + 1);
        let from = if old_count < HINT_MIN || old_count / (HINTS + 1) != d {
            0
        } else {
            from
        };
        for k in 0..HINTS {
            let s = d * (k + 1);
            if s >= from {
                self.0
                    .store(W_HINTS + k, self.0.load(HDR_WORDS + SLOT_WORDS * s));
            }
        }
    }

    /// The first slot whose key is not `below` `p`: a binary search whose step is a
    /// conditional move rather than a branch (the answer lies in `base..=base + size`; a
    /// mispredicted branch per level cost more than the comparisons).
    #[inline]
    fn partition(&self, below: impl Fn(Ordering) -> bool, p: &Probe<'_>) -> usize {
        let (lo, hi) = self.window(p);
        if hi <= lo {
            return lo;
        }
        if hi - lo <= PREFETCH_SLOTS {
            // The search will touch about log2(hi - lo) of these lines, each load depending
            // on the one before: ask for all of them at once.
            self.0.prefetch(HDR + SLOT * lo, HDR + SLOT * hi);
        }
        let (mut base, mut size) = (lo, hi - lo);
        while size > 1 {
            let half = size / 2;
            let mid = base + half;
            base = if below(self.cmp(mid, p)) { mid } else { base };
            size -= half;
        }
        base + usize::from(below(self.cmp(base, p)))
    }

    /// `Ok(slot)` of `p`, or `Err(insertion point)`.
    pub fn search(&self, p: &Probe<'_>) -> Result<usize, usize> {
        let i = self.lower_bound(p);
        if i < self.count() && self.cmp(i, p) == Ordering::Equal {
            Ok(i)
        } else {
            Err(i)
        }
    }

    /// Child `i` of an inner node (0 is the first child).
    #[inline]
    pub fn child(&self, i: usize) -> PageId {
        match i {
            0 => self.0.load(W_LINK),
            i => self.word(i - 1),
        }
    }

    /// The child whose range holds `p`.
    #[inline]
    pub fn child_index(&self, p: &Probe<'_>) -> usize {
        self.upper_bound(p)
    }

    /// The child whose keys end just below `p` (a separator equal to `p` sends us left).
    pub fn child_index_below(&self, p: &Probe<'_>) -> usize {
        self.lower_bound(p)
    }

    fn fence_word(&self, low: bool) -> u64 {
        self.0.load(if low { W_LOW } else { W_HIGH })
    }

    /// The low (`low`) or high fence; `None` is -infinity or +infinity.
    pub fn fence(&self, low: bool) -> Option<Vec<u8>> {
        let w = self.fence_word(low);
        if w & PRESENT == 0 {
            return None;
        }
        let mut k = Vec::new();
        self.0.read_bytes(
            (w & 0xffff_ffff) as usize,
            ((w >> 32) & 0xffff) as usize,
            &mut k,
        );
        Some(k)
    }

    /// Orders the low (`low`) or high fence against `p` (`None`: the fence is infinite),
    /// from the fence's head in the header as [`cmp`](Self::cmp) orders a slot's key.
    fn cmp_fence(&self, low: bool, p: &Probe<'_>) -> Option<Ordering> {
        let w = self.fence_word(low);
        (w & PRESENT != 0).then(|| {
            let h = self.fence_head(low);
            if h != p.head {
                return h.cmp(&p.head);
            }
            let len = ((w >> 32) & 0xffff) as usize;
            if len <= 16 || p.bytes.len() <= 16 {
                return len.cmp(&p.bytes.len());
            }
            self.0
                .cmp_bytes((w & 0xffff_ffff) as usize + 16, len - 16, &p.bytes[16..])
        })
    }

    /// True when both fence heads are those of the fence keys (an invariant check).
    pub fn fence_heads_match(&self) -> bool {
        [true, false]
            .into_iter()
            .all(|low| self.fence_head(low) == self.fence(low).map_or(0, |k| head_of(&k)))
    }

    /// The head of the low (`low`) or high fence (0 when it is infinite).
    #[inline]
    fn fence_head(&self, low: bool) -> u128 {
        let w = W_FENCE_HEADS + if low { 0 } else { 2 };
        (u128::from(self.0.load(w)) << 64) | u128::from(self.0.load(w + 1))
    }

    /// Sets the low (`low`) or high fence's word and head for `key` stored at byte `start`
    /// (`None`: infinite). Exclusive latch.
    fn set_fence(&self, low: bool, fence: Option<(&[u8], usize)>) {
        let (word, head) = match fence {
            Some((key, start)) => (
                PRESENT | ((key.len() as u64) << 32) | start as u64,
                head_of(key),
            ),
            None => (0, 0),
        };
        let hw = W_FENCE_HEADS + if low { 0 } else { 2 };
        self.0.store(hw, (head >> 64) as u64);
        self.0.store(hw + 1, head as u64);
        self.0.store(if low { W_LOW } else { W_HIGH }, word);
    }

    /// True when the node has no low fence (its range starts at -infinity).
    pub fn starts_at_neg_inf(&self) -> bool {
        self.fence_word(true) & PRESENT == 0
    }

    /// True when `p` lies within the fences, [low, high).
    pub fn covers(&self, p: &Probe<'_>) -> bool {
        self.cmp_fence(true, p)
            .is_none_or(|o| o != Ordering::Greater)
            && self
                .cmp_fence(false, p)
                .is_none_or(|o| o == Ordering::Greater)
    }

    /// An owned copy of the node.
    pub fn image(&self) -> Image {
        let n = self.count();
        let leaf = self.is_leaf();
        let items = (0..n)
            .map(|i| {
                let m = self.meta(i);
                let mut val = Vec::new();
                if leaf {
                    self.val_into(i, &mut val);
                }
                Item {
                    key: self.key(i),
                    word: self.word(i),
                    val,
                    ghost: m.ghost,
                    ovf: m.ovf,
                }
            })
            .collect();
        Image {
            kind: self.kind(),
            leaf_children: self.leaf_children(),
            low: self.fence(true),
            high: self.fence(false),
            first: self.0.load(W_LINK),
            items,
        }
    }

    /// Rewrites the page as `img`, which must fit ([`Image::size`] at most [`PAGE_SIZE`]).
    pub fn write_image(&self, img: &Image) {
        debug_assert!(img.size() <= PAGE_SIZE);
        self.0.zero_words(0, HDR_WORDS);
        self.0.store(
            W_KIND,
            img.kind | (u64::from(img.leaf_children) << 8) | ((img.items.len() as u64) << 16),
        );
        self.0.store(W_LINK, img.first);
        let mut start = PAGE_SIZE;
        for (low, f) in [(true, &img.low), (false, &img.high)] {
            if let Some(k) = f {
                start -= pad8(k.len());
                self.0.write_bytes(start, k);
                self.set_fence(low, Some((k, start)));
            }
        }
        for (i, it) in img.items.iter().enumerate() {
            start -= pad8(it.key.len() + it.val.len());
            self.put_item(i, start, it.entry());
        }
        self.set_data(start, PAGE_SIZE - start);
        self.update_hints(0, 0);
    }

    /// Writes `it`'s record at byte offset `at` and fills slot `i` for it.
    fn put_item(&self, i: usize, at: usize, it: Entry<'_>) {
        self.0.write_bytes(at, it.key);
        self.0.write_unaligned(at + it.key.len(), it.val);
        let m = Meta {
            off: at,
            klen: it.key.len(),
            vlen: it.val.len(),
            ghost: it.ghost,
            ovf: it.ovf,
        };
        self.set_slot(i, it.key, m, it.word);
    }

    /// Packs the records and fences at the end of the page, so that the free bytes are one
    /// gap; the slot order and contents stay. Exclusive latch.
    ///
    /// The data area is first copied to a thread-local buffer: records are then copied back
    /// from it, in slot order, without caring how old and new places overlap, and without
    /// the allocations of going through an [`Image`].
    pub fn compact(&self) {
        thread_local! {
            static SNAP: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        // A thread being torn down has no buffer to lend: it uses a fresh one.
        if SNAP
            .try_with(|snap| self.compact_via(&mut snap.borrow_mut()))
            .is_err()
        {
            self.compact_via(&mut Vec::new());
        }
    }

    /// [`compact`](Self::compact) with `snap` as its copy of the data area.
    fn compact_via(&self, snap: &mut Vec<u64>) {
        snap.clear();
        snap.extend((0..PAGE_WORDS).map(|w| self.0.load(w)));
        let mut start = PAGE_SIZE;
        // Moves `bytes` (a multiple of 8) of data from byte offset `from` to just below
        // `start`; returns the new offset.
        let mut place = |from: usize, bytes: usize| -> usize {
            start -= bytes;
            let (src, dst) = (from / 8, start / 8);
            for k in 0..bytes / 8 {
                self.0
                    .store(dst + k, snap.get(src + k).copied().unwrap_or(0));
            }
            start
        };
        for w in [W_LOW, W_HIGH] {
            let f = snap[w];
            if f & PRESENT != 0 {
                let len = ((f >> 32) & 0xffff) as usize;
                let at = place((f & 0xffff_ffff) as usize, pad8(len));
                self.0.store(w, PRESENT | ((len as u64) << 32) | at as u64);
            }
        }
        for i in 0..self.count() {
            let mw = HDR_WORDS + SLOT_WORDS * i + 2;
            let m = Meta::decode(snap[mw]);
            let at = place(m.off, m.data_bytes());
            self.0.store(mw, Meta { off: at, ..m }.encode());
        }
        self.set_data(start, PAGE_SIZE - start);
    }

    /// Inserts an entry at slot `i` if it fits (compacting the page if that makes room);
    /// false if the page is too full. Exclusive latch.
    pub fn insert(&self, i: usize, it: &Item) -> bool {
        self.insert_entry(i, it.entry())
    }

    /// [`insert`](Self::insert) of a borrowed entry.
    pub fn insert_entry(&self, i: usize, it: Entry<'_>) -> bool {
        let need = it.size();
        if self.gap() < need {
            if self.free_total() < need {
                return false;
            }
            self.compact();
        }
        let n = self.count();
        let bytes = need - SLOT;
        let start = self.data_start() - bytes;
        let s = HDR_WORDS + SLOT_WORDS * i;
        self.0.move_words(s, s + SLOT_WORDS, SLOT_WORDS * (n - i));
        self.put_item(i, start, it);
        self.set_count(n + 1);
        self.set_data(start, self.used() + bytes);
        self.0.store(W_LAST, i as u64 + 1);
        self.update_hints(i, n);
        true
    }

    /// Sets the high fence to `key` in place (the old fence's bytes become a hole),
    /// compacting the page if that makes room; false, and the page unchanged, if it is too
    /// full. Exclusive latch.
    pub fn set_high_fence(&self, key: &[u8]) -> bool {
        let old = self.fence_word(false);
        let old_bytes = if old & PRESENT != 0 {
            pad8(((old >> 32) & 0xffff) as usize)
        } else {
            0
        };
        let need = pad8(key.len());
        if self.gap() < need && self.free_total() + old_bytes < need {
            return false;
        }
        self.set_fence(false, None);
        self.set_data(self.data_start(), self.used().saturating_sub(old_bytes));
        if self.gap() < need {
            self.compact();
        }
        let start = self.data_start() - need;
        self.0.write_bytes(start, key);
        self.set_fence(false, Some((key, start)));
        self.set_data(start, self.used() + need);
        true
    }

    /// True when an insert at slot `i` follows the last insert (at `i - 1`): a run of
    /// ascending inserts into this page.
    pub fn continues_run(&self, i: usize) -> bool {
        i > 0 && self.0.load(W_LAST) == i as u64
    }

    fn set_slot(&self, i: usize, key: &[u8], m: Meta, word: u64) {
        let w = HDR_WORDS + SLOT_WORDS * i;
        let h = head_of(key);
        self.0.store(w, (h >> 64) as u64);
        self.0.store(w + 1, h as u64);
        self.0.store(w + 2, m.encode());
        self.0.store(w + 3, word);
    }

    /// Removes slot `i`. Exclusive latch.
    pub fn remove(&self, i: usize) {
        let n = self.count();
        let bytes = self.meta(i).data_bytes();
        let s = HDR_WORDS + SLOT_WORDS * i;
        self.0
            .move_words(s + SLOT_WORDS, s, SLOT_WORDS * (n - i - 1));
        self.0
            .zero_words(HDR_WORDS + SLOT_WORDS * (n - 1), HDR_WORDS + SLOT_WORDS * n);
        self.set_count(n - 1);
        self.set_data(self.data_start(), self.used().saturating_sub(bytes));
        self.update_hints(i, n);
    }

    /// Replaces slot `i`'s value (inline bytes or overflow reference) and ghost bit, in place
    /// when the size is unchanged; false if it does not fit (the slot is then unchanged).
    /// Exclusive latch.
    pub fn replace_value(&self, i: usize, val: &[u8], ovf: bool, ghost: bool, tid: u64) -> bool {
        let m = self.meta(i);
        let s = HDR_WORDS + SLOT_WORDS * i;
        if pad8(m.klen + m.vlen) == pad8(m.klen + val.len()) {
            self.0.store(s + 3, tid);
            self.0.write_unaligned(m.off + m.klen, val);
            let nm = Meta {
                vlen: val.len(),
                ghost,
                ovf,
                ..m
            };
            self.0.store(s + 2, nm.encode());
            return true;
        }
        // A different size: write the record anew in the free gap when it fits there (the
        // slot stays where it is; the old bytes become a hole that compaction reclaims).
        let bytes = pad8(m.klen + val.len());
        if self.gap() >= bytes {
            let start = self.data_start() - bytes;
            self.0.store(s + 3, tid);
            // The key's words, the last one partly value bytes that the value overwrites.
            self.0.move_words(m.off / 8, start / 8, m.klen.div_ceil(8));
            self.0.write_unaligned(start + m.klen, val);
            let nm = Meta {
                off: start,
                vlen: val.len(),
                ghost,
                ovf,
                ..m
            };
            self.0.store(s + 2, nm.encode());
            self.set_data(start, self.used() - m.data_bytes() + bytes);
            return true;
        }
        let it = Item {
            key: self.key(i),
            word: tid,
            val: val.to_vec(),
            ghost,
            ovf,
        };
        // Room once the old record is gone?
        if self.free_total() + m.data_bytes() + SLOT < it.size() {
            return false;
        }
        self.remove(i);
        let ok = self.insert(i, &it);
        debug_assert!(ok);
        ok
    }

    /// Makes the page a free page. Exclusive latch.
    pub fn clear(&self) {
        self.0.zero_words(0, HDR_WORDS);
    }
}

/// The byte offset just after a record's key (where its value starts).
fn pad8_key_end(off: usize, klen: usize) -> usize {
    off + klen
}

/// Whether a value of `len` bytes is stored in overflow pages.
pub fn is_overflow_len(len: usize) -> bool {
    len > INLINE_VALUE
}

/// Bytes of table pages a value of `len` bytes takes once stored: its bytes when inline,
/// else the whole pages of its overflow chain and the reference left in the leaf (a value
/// just past [`INLINE_VALUE`] takes a page 16 times its size).
pub fn stored_len(len: usize) -> usize {
    if is_overflow_len(len) {
        len.div_ceil(OVERFLOW_BYTES)
            .saturating_mul(PAGE_SIZE)
            .saturating_add(OVF_REF)
    } else {
        len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::page::PageStore;

    #[test]
    fn a_head_is_the_first_sixteen_bytes_zero_padded_whatever_the_length() {
        let reference = |k: &[u8]| {
            let mut b = [0u8; 16];
            let n = k.len().min(16);
            b[..n].copy_from_slice(&k[..n]);
            u128::from_be_bytes(b)
        };
        let bytes: Vec<u8> = (0..40u8)
            .map(|i| i.wrapping_mul(37).wrapping_add(11))
            .collect();
        for start in 0..4 {
            for n in 0..=24 {
                let k = &bytes[start..start + n];
                assert_eq!(head_of(k), reference(k), "{k:?}");
                let ones = vec![0xffu8; n];
                assert_eq!(head_of(&ones), reference(&ones), "{n} bytes of 0xff");
            }
        }
    }

    #[test]
    fn an_overflow_value_is_counted_by_its_whole_pages() {
        assert_eq!(stored_len(0), 0);
        assert_eq!(stored_len(INLINE_VALUE), INLINE_VALUE);
        assert_eq!(stored_len(INLINE_VALUE + 1), PAGE_SIZE + OVF_REF);
        assert_eq!(stored_len(OVERFLOW_BYTES), PAGE_SIZE + OVF_REF);
        assert_eq!(stored_len(OVERFLOW_BYTES + 1), 2 * PAGE_SIZE + OVF_REF);
    }

    fn item(k: u32, vlen: usize) -> Item {
        Item {
            key: k.to_be_bytes().to_vec(),
            word: u64::from(k),
            val: vec![k as u8; vlen],
            ghost: k.is_multiple_of(7),
            ovf: false,
        }
    }

    /// Searches with hints give the linear scan's answers, on nodes from a few slots to
    /// hundreds, with keys that share their first 8 bytes in runs (so hints tie), after
    /// inserts and removes at random places.
    #[test]
    fn hinted_searches_match_a_linear_scan() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let store = PageStore::new();
        let f = store.frame(store.alloc()).expect("frame");
        let n = Node(f);
        let key = |rng: &mut rand::rngs::StdRng| -> Vec<u8> {
            let mut k = vec![0u8; 8];
            k[7] = rng.gen_range(0..4u8) * 60;
            let tail: usize = rng.gen_range(0..12);
            k.extend((0..tail).map(|_| rng.gen_range(0..3u8)));
            k
        };
        for _round in 0..4 {
            n.write_image(&Image::leaf(None, None));
            let mut model: Vec<Vec<u8>> = Vec::new();
            for step in 0..900 {
                let k = key(&mut rng);
                match model.binary_search(&k) {
                    Ok(i) if step % 3 == 0 => {
                        n.remove(i);
                        model.remove(i);
                    }
                    Ok(_) => {}
                    Err(i) => {
                        let it = Item {
                            key: k.clone(),
                            word: 1,
                            val: vec![1; 3],
                            ghost: false,
                            ovf: false,
                        };
                        if n.insert(i, &it) {
                            model.insert(i, k);
                        }
                    }
                }
                let probe = key(&mut rng);
                let p = Probe::new(&probe);
                let lower = model.iter().filter(|m| **m < probe).count();
                let upper = model.iter().filter(|m| **m <= probe).count();
                assert_eq!(
                    n.lower_bound(&p),
                    lower,
                    "lower bound, {} slots",
                    model.len()
                );
                assert_eq!(
                    n.upper_bound(&p),
                    upper,
                    "upper bound, {} slots",
                    model.len()
                );
            }
            assert!(
                model.len() > 3 * HINT_MIN,
                "the node grew past the hint threshold"
            );
        }
    }

    /// Removes, regrows and compacts records, and checks every survivor against a model
    /// after each step: compaction and the in-gap rewrite of `replace_value` keep keys,
    /// values, TID words and ghost bits, and leave the free bytes in one gap.
    /// `n` holds exactly `model`'s records, in order.
    fn assert_records(n: Node<'_>, model: &[Item]) {
        assert_eq!(n.count(), model.len());
        for (i, it) in model.iter().enumerate() {
            assert_eq!(n.key(i), it.key);
            let mut v = Vec::new();
            n.val_into(i, &mut v);
            assert_eq!(v, it.val, "slot {i}");
            assert_eq!(n.word(i), it.word);
            assert_eq!(n.meta(i).ghost, it.ghost);
        }
    }

    /// A full leaf takes a new high fence in place when the holes its removals left make
    /// room (compacting), refuses it, unchanged, when they do not, and keeps every record
    /// either way.
    #[test]
    fn a_high_fence_is_set_in_place() {
        let store = PageStore::new();
        let f = store.frame(store.alloc()).expect("frame");
        let n = Node(f);
        n.write_image(&Image::leaf(Some(b"\x00".to_vec()), Some(b"\xff".to_vec())));
        let mut model: Vec<Item> = Vec::new();
        while n.insert(model.len(), &item(model.len() as u32, 40)) {
            model.push(item(model.len() as u32, 40));
        }
        let check = |model: &[Item], high: &[u8]| {
            assert_records(n, model);
            assert_eq!(n.fence(true), Some(b"\x00".to_vec()));
            assert_eq!(n.fence(false), Some(high.to_vec()));
        };
        // A fence longer than the free bytes: refused.
        let long = vec![0xfe; n.free_total() + 9];
        assert!(!n.set_high_fence(&long));
        check(&model, b"\xff");
        // Holes in the middle make room, but not in the gap: compaction.
        for i in [3, 10, 20] {
            n.remove(i);
            model.remove(i);
        }
        let fence = vec![0xfe; pad8(n.gap() + 1)];
        assert!(
            n.free_total() >= fence.len() + 8,
            "{} {}",
            n.gap(),
            n.free_total()
        );
        assert!(n.set_high_fence(&fence));
        check(&model, &fence);
        // Shorter again, in the gap the old fence's compaction left.
        assert!(n.set_high_fence(b"\xfd"));
        check(&model, b"\xfd");
        assert_eq!(
            n.free_total(),
            n.gap() + fence.len(),
            "the old fence: the only hole"
        );
    }

    #[test]
    fn compaction_and_regrowth_keep_every_record() {
        let store = PageStore::new();
        let f = store.frame(store.alloc()).expect("frame");
        let n = Node(f);
        n.write_image(&Image::leaf(
            Some(b"\x00".to_vec()),
            Some(b"\xff\xff\xff\xff\xff".to_vec()),
        ));
        let mut model: Vec<Item> = Vec::new();
        let mut k = 0u32;
        while n.insert(model.len(), &item(k, 5 + (k as usize * 13) % 90)) {
            model.push(item(k, 5 + (k as usize * 13) % 90));
            k += 1;
        }
        assert!(model.len() > 100);
        let check = |model: &[Item]| {
            assert_records(n, model);
            assert_eq!(n.fence(true), Some(b"\x00".to_vec()));
            assert_eq!(n.fence(false), Some(b"\xff\xff\xff\xff\xff".to_vec()));
        };
        check(&model);
        for round in 0..6 {
            // Drop every third record, grow or shrink the others' values.
            let mut i = 0;
            while i < model.len() {
                if (i + round) % 3 == 0 {
                    n.remove(i);
                    model.remove(i);
                    continue;
                }
                let len = (model[i].val.len() * 7 + round * 11) % 120;
                let val = vec![(i + round) as u8; len];
                if n.replace_value(i, &val, false, round % 2 == 0, 99) {
                    model[i].val = val;
                    model[i].ghost = round % 2 == 0;
                    model[i].word = 99;
                }
                i += 1;
            }
            check(&model);
            n.compact();
            check(&model);
            assert_eq!(n.gap(), n.free_total());
            // Refill at the end.
            while n.insert(model.len(), &item(k, 40)) {
                model.push(item(k, 40));
                k += 1;
            }
            check(&model);
        }
    }
}
