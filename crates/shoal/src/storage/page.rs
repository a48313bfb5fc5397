//! Fixed-size pages addressed by page id, and the store that holds them.
//!
//! **Page size: 32 KiB.** A page must hold a few records of the largest key the engine
//! accepts (`Options::max_key_len`, 4 KiB by default, see [`MAX_KEY`]) next to two fence keys
//! of that size: with 32 KiB, a leaf keeps at least three worst-case records (4 KiB key plus
//! an inline value of up to [`INLINE_VALUE`] bytes) beside 8 KiB of fences, and an inner node
//! five worst-case separators, so a split always leaves both halves non-empty. Smaller pages
//! (4 or 16 KiB) would need suffix-truncated separators or keys in overflow pages for that
//! guarantee. For the short keys of the benchmarks, a 32 KiB inner node has a fan-out of
//! about a thousand (three levels for a billion rows) and a leaf holds some 240 TPC-B rows, so
//! the slot shifting of an insert (half the slot array on average, a few KiB) stays below the
//! cost of the cache misses of a descent. It is also a size LeanStore and vmcache support.
//!
//! **Resident store.** Every page is in memory: frames live in chunks that double in size
//! (chunk `k` holds `2^k` frames, so a page id maps to its frame with one leading-zero
//! count and no lock, and a frame never moves), allocated on demand, zeroed lazily by the
//! allocator (chunks of 2 MiB and more on transparent huge pages, see `advise_huge`). Freed
//! pages go on a free list and are reused first; frames are returned to the
//! allocator only when the store is dropped, so a stale page id read by an optimistic reader
//! always names valid memory. A buffer manager would keep the same interface (ids, `frame`,
//! `alloc`, `free`) and add a residence check in `frame`.
//!
//! **Words, not bytes.** A page is an array of `AtomicU64`: readers read pages that writers
//! may be changing at the same moment (optimistic lock coupling, see `olc.rs`), and only
//! atomic accesses make that defined behaviour in Rust. Every access is `Relaxed` (a plain
//! load or store on x86-64 and AArch64); the latch's fences order them. Byte strings are
//! stored from 8-byte aligned offsets in little-endian word order.

use std::alloc::Layout;
use std::cmp::Ordering;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::olc::Latch;

/// Bytes per page.
pub const PAGE_SIZE: usize = 32 << 10;
/// 8-byte words per page.
pub const PAGE_WORDS: usize = PAGE_SIZE / 8;
/// The longest key a page layout guarantees room for (the default `Options::max_key_len`).
pub const MAX_KEY: usize = 4096;
/// Values longer than this go to overflow pages (a sixteenth of a page).
pub const INLINE_VALUE: usize = PAGE_SIZE / 16;

/// The id of a page in its [`PageStore`].
pub type PageId = u64;

/// No page (end of an overflow chain).
pub const NO_PAGE: PageId = u64::MAX;

/// Cache lines of a [`Frame`].
const FRAME_LINES: usize = std::mem::size_of::<Frame>() / 64;

/// Lines [`Frame::prefetch_header`] asks for: the latch's, then the page's header, search
/// hints and fence heads (and the first slot).
pub const HEADER_LINES: usize = 4;

/// One page and its latch.
#[repr(C, align(64))]
pub struct Frame {
    /// The optimistic latch (see `olc.rs`).
    pub latch: Latch,
    words: [AtomicU64; PAGE_WORDS],
}

impl Frame {
    /// Word `w` (0 for an index outside the page: an optimistic reader may compute one
    /// from a torn page; validation then rejects what it read).
    #[inline]
    pub fn load(&self, w: usize) -> u64 {
        match self.words.get(w) {
            Some(x) => x.load(AtomicOrdering::Relaxed),
            None => 0,
        }
    }

    /// Stores word `w`; called only under the exclusive latch, with in-page indices.
    #[inline]
    pub fn store(&self, w: usize, v: u64) {
        if let Some(x) = self.words.get(w) {
            x.store(v, AtomicOrdering::Relaxed);
        }
    }

    /// The words `from..to`, clamped to the page (empty when `from` is past it). Every bulk
    /// routine below checks its bounds once, here, instead of once per word.
    #[inline]
    fn span(&self, from: usize, to: usize) -> &[AtomicU64] {
        let to = to.min(PAGE_WORDS);
        self.words.get(from.min(to)..to).unwrap_or(&[])
    }

    /// Hints the processor to load the cache lines of bytes `from..to` (clamped to the
    /// page): a search or copy that is about to touch several lines then waits for one
    /// memory latency instead of one per line (the loads overlap).
    #[inline]
    pub fn prefetch(&self, from: usize, to: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let words = self.span(from / 8, to.div_ceil(8));
            let mut i = 0;
            while i < words.len() {
                // SAFETY: `_mm_prefetch` only hints the cache; the pointer is into `words`,
                // a live slice of this frame.
                unsafe {
                    std::arch::x86_64::_mm_prefetch(
                        words.as_ptr().add(i).cast::<i8>(),
                        std::arch::x86_64::_MM_HINT_T0,
                    );
                }
                i += 8;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (from, to);
    }

    /// Hints the processor to load the latch and the first 248 bytes of the page (a node's
    /// header, search hints and fence heads) at once: a descent reads all of them, one
    /// after the other.
    #[inline]
    pub fn prefetch_header(&self) {
        self.prefetch_lines(HEADER_LINES);
    }

    /// Hints the processor to load the first `lines` cache lines of the frame (its latch
    /// and the page's first `lines - 1` lines) at once.
    #[inline]
    pub fn prefetch_lines(&self, lines: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let base = (self as *const Frame).cast::<i8>();
            for line in 0..lines.min(FRAME_LINES) {
                // SAFETY: `_mm_prefetch` only hints the cache; the line lies inside this
                // frame (64-byte aligned, `FRAME_LINES` lines long).
                unsafe {
                    std::arch::x86_64::_mm_prefetch(
                        base.add(64 * line),
                        std::arch::x86_64::_MM_HINT_T0,
                    );
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = lines;
    }

    /// The words `from..to`, clamped to the page.
    #[inline]
    pub fn span_words(&self, from: usize, to: usize) -> &[AtomicU64] {
        self.span(from, to)
    }

    /// Appends the `len` bytes at any byte offset `off` to `out`, clamped to the page.
    ///
    /// The words are copied whole into `out` (8-byte stores) and the leading bytes of the
    /// first word, when `off` is not 8-aligned, shifted out after: two passes over a few
    /// cache-resident bytes cost less than a byte-wise copy.
    pub fn read_bytes(&self, off: usize, len: usize, out: &mut Vec<u8>) {
        let end = off.saturating_add(len).min(PAGE_SIZE);
        if end <= off {
            return;
        }
        if end - off > 128 {
            self.prefetch(off, end);
        }
        let src = self.span(off / 8, end.div_ceil(8));
        let skip = off % 8;
        let Some((first, rest)) = src.split_first() else {
            return;
        };
        // Each word goes whole to its place in `out` (the first one's leading `skip` bytes
        // left out), straight into spare capacity: no zero fill, no second pass to shift an
        // unaligned value into place. The last word may write up to 7 bytes past the
        // value, into capacity reserved for it, which the length then leaves out.
        let n = (end - off).min(src.len() * 8 - skip);
        let base = out.len();
        out.reserve(n + 8);
        let head = first.load(AtomicOrdering::Relaxed).to_le_bytes();
        let spare = out.spare_capacity_mut();
        for (d, b) in spare.iter_mut().zip(&head[skip..]) {
            d.write(*b);
        }
        let dst = spare.as_mut_ptr().cast::<u8>();
        for (k, w) in rest.iter().enumerate() {
            let bytes = w.load(AtomicOrdering::Relaxed).to_le_bytes();
            // SAFETY: word `k + 1` lands at `8 * (k + 1) - skip`, and its last byte at
            // `8 * rest.len() + 7 - skip <= n + 7` (as `n >= 8 * src.len() - skip - 7`,
            // `end` lying in the last word), inside the `n + 8` bytes of spare capacity
            // reserved above; `bytes` is a local array, so the ranges do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.add(8 * (k + 1) - skip), 8);
            }
        }
        // SAFETY: bytes `base..base + n` are initialized: the head loop wrote the first
        // `8 - skip` (or `n`, if fewer), the word loop every later one.
        unsafe { out.set_len(base + n) };
    }

    /// Writes `bytes` at byte offset `off` (8-aligned), zero padding the last word.
    pub fn write_bytes(&self, off: usize, bytes: &[u8]) {
        debug_assert_eq!(off % 8, 0);
        let dst = self.span(off / 8, (off + bytes.len()).div_ceil(8));
        let mut chunks = bytes.chunks_exact(8);
        let mut words = dst.iter();
        // `chunks` first: `zip` then stops without taking a word for the missing chunk.
        for (c, w) in chunks.by_ref().zip(words.by_ref()) {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            w.store(u64::from_le_bytes(b), AtomicOrdering::Relaxed);
        }
        let rest = chunks.remainder();
        if let (Some(w), false) = (words.next(), rest.is_empty()) {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            w.store(u64::from_le_bytes(b), AtomicOrdering::Relaxed);
        }
    }

    /// Writes `bytes` at any byte offset, keeping the other bytes of the words it touches.
    pub fn write_unaligned(&self, off: usize, bytes: &[u8]) {
        let skip = off % 8;
        // The partial first word, if `off` is not aligned.
        let head = if skip == 0 {
            0
        } else {
            (8 - skip).min(bytes.len())
        };
        if head > 0 {
            let mut b = self.load(off / 8).to_le_bytes();
            b[skip..skip + head].copy_from_slice(&bytes[..head]);
            self.store(off / 8, u64::from_le_bytes(b));
        }
        let rest = &bytes[head..];
        let at = off + head;
        let full = rest.len() / 8;
        let dst = self.span(at / 8, at / 8 + full);
        let mut chunks = rest.chunks_exact(8);
        for (w, c) in dst.iter().zip(chunks.by_ref()) {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            w.store(u64::from_le_bytes(b), AtomicOrdering::Relaxed);
        }
        // The partial last word.
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let w = at / 8 + full;
            let mut b = self.load(w).to_le_bytes();
            b[..tail.len()].copy_from_slice(tail);
            self.store(w, u64::from_le_bytes(b));
        }
    }

    /// Compares the `len` bytes at byte offset `off` (8-aligned) with `probe`.
    pub fn cmp_bytes(&self, off: usize, len: usize, probe: &[u8]) -> Ordering {
        let len = len.min(PAGE_SIZE.saturating_sub(off));
        let n = len.min(probe.len());
        let src = self.span(off / 8, (off + n).div_ceil(8));
        for (w, p) in src.iter().zip(probe[..n].chunks(8)) {
            // Eight bytes at a time as big-endian integers (byte order is numeric order);
            // a short last chunk compares its bytes only, zero padded on both sides.
            let mut b = w.load(AtomicOrdering::Relaxed).to_le_bytes();
            b[p.len()..].fill(0);
            let mut q = [0u8; 8];
            q[..p.len()].copy_from_slice(p);
            match u64::from_be_bytes(b).cmp(&u64::from_be_bytes(q)) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        len.cmp(&probe.len())
    }

    /// Moves `n` words from word `src` to word `dst` (overlap allowed); exclusive latch.
    ///
    /// Four words at a time, all loaded before any is stored: a slot shift moves kilobytes,
    /// and a load-store pair per word left the loop waiting on each store. Correct for any
    /// overlap: walking away from the destination's side, a group's stores land only on
    /// words already read.
    pub fn move_words(&self, src: usize, dst: usize, n: usize) {
        let n = n.min(PAGE_WORDS.saturating_sub(src.max(dst)));
        let (s, d) = (self.span(src, src + n), self.span(dst, dst + n));
        let n = s.len().min(d.len());
        let (s, d) = (&s[..n], &d[..n]);
        let relaxed = AtomicOrdering::Relaxed;
        #[inline(always)]
        fn group(to: &[AtomicU64], from: &[AtomicU64]) {
            let relaxed = AtomicOrdering::Relaxed;
            if let ([t0, t1, t2, t3], [f0, f1, f2, f3]) = (to, from) {
                let v = [f0, f1, f2, f3].map(|w| w.load(relaxed));
                t0.store(v[0], relaxed);
                t1.store(v[1], relaxed);
                t2.store(v[2], relaxed);
                t3.store(v[3], relaxed);
            }
        }
        if dst > src {
            let (sc, dc) = (s.rchunks_exact(4), d.rchunks_exact(4));
            let (sr, dr) = (sc.remainder(), dc.remainder());
            for (to, from) in dc.zip(sc) {
                group(to, from);
            }
            for (a, b) in dr.iter().rev().zip(sr.iter().rev()) {
                a.store(b.load(relaxed), relaxed);
            }
        } else {
            let (sc, dc) = (s.chunks_exact(4), d.chunks_exact(4));
            let (sr, dr) = (sc.remainder(), dc.remainder());
            for (to, from) in dc.zip(sc) {
                group(to, from);
            }
            for (a, b) in dr.iter().zip(sr) {
                a.store(b.load(relaxed), relaxed);
            }
        }
    }

    /// Zeroes words `from..to`; exclusive latch.
    pub fn zero_words(&self, from: usize, to: usize) {
        for w in self.span(from, to) {
            w.store(0, AtomicOrdering::Relaxed);
        }
    }
}

/// Chunks of frames: chunk `k` holds `2^k` frames, pages `2^k - 1 .. 2^(k+1) - 1`.
const CHUNKS: usize = 40;

/// Page counts of the stores that share them (a database's tables, for its memory limit).
#[derive(Debug, Default)]
pub struct PageCounts {
    /// Pages in use: allocated and not freed.
    pub in_use: AtomicU64,
    /// Pages held: in use, or freed and on their store's free list. A store keeps its
    /// frames until it is dropped, and only it reuses the pages it freed.
    pub held: AtomicU64,
}

/// The pages of one tree, all resident, with a free list.
pub struct PageStore {
    chunks: [AtomicPtr<Frame>; CHUNKS],
    /// The counts this store shares with the other stores of its database.
    counts: Arc<PageCounts>,
    /// Pages handed out so far (ids below are allocated or free), and the page up to which
    /// the prefaulter was asked to back memory (see [`prefault`]).
    next: Mutex<(PageId, PageId)>,
    /// `next`'s first half, for readers that must not write the mutex's cache line (an
    /// optimistic reader bounding its walk of an overflow chain).
    made: AtomicU64,
    /// Freed pages, reused before new ones.
    free: Mutex<Vec<PageId>>,
    /// Back chunks with transparent huge pages ([`advise_huge`]), else keep them on small
    /// pages.
    huge: bool,
}

fn chunk_of(pid: PageId) -> (usize, usize) {
    let n = pid.wrapping_add(1);
    let k = 63 - n.leading_zeros() as usize;
    (k, (n - (1u64 << k)) as usize)
}

/// Chunks of at least this many bytes are aligned to it and backed by transparent huge
/// pages where the kernel offers them (see [`advise_huge`]).
const HUGE_PAGE: usize = 2 << 20;

/// Prefault requests sent, completed, and refused by the kernel (see [`prefault`]).
static PREFAULT_SENT: AtomicUsize = AtomicUsize::new(0);
static PREFAULT_DONE: AtomicUsize = AtomicUsize::new(0);
static PREFAULT_FAILED: AtomicUsize = AtomicUsize::new(0);

/// Chunks from this one on (2^6 frames, 2 MiB) are prefaulted ahead of use.
const PREFAULT_MIN_CHUNK: usize = 6;
/// Pages a store keeps backed ahead of its allocation frontier (8 MiB); it asks for more
/// when half of that is used.
const PREFAULT_AHEAD: PageId = 256;

/// Backs `addr..addr + len` with memory now, on a background thread
/// (`madvise(MADV_POPULATE_WRITE)`, Linux 5.14+; elsewhere nothing). A growing tree touches
/// fresh memory at every new page, and on this project's machines (virtual, memory backed
/// by the host on first touch) the first touch of a 2 MiB huge page stalled the faulting
/// transaction for milliseconds: TPC-C's p99.9 rose from 0.7 to 5.6 ms with huge pages and
/// no prefaulting. The range may be freed before the thread reaches it: populating an
/// unmapped range fails harmlessly, and populating memory reused by something else changes
/// no byte of it.
///
/// [`PREFAULT_SENT`], [`PREFAULT_DONE`] and [`PREFAULT_FAILED`] count the requests, so a
/// test can tell whether the kernel took them.
fn prefault(addr: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        use std::sync::mpsc::{channel, Sender};
        use std::sync::OnceLock;
        static PREFAULTER: OnceLock<Option<Sender<(usize, usize)>>> = OnceLock::new();
        let tx = PREFAULTER.get_or_init(|| {
            let (tx, rx) = channel::<(usize, usize)>();
            std::thread::Builder::new()
                .name("shoal-prefault".into())
                .spawn(move || {
                    for (a, l) in rx {
                        // SAFETY: `madvise` only asks the kernel to back the range; it reads
                        // and writes no byte of it, and fails (ignored) if it is unmapped.
                        let r = unsafe {
                            libc::madvise(a as *mut libc::c_void, l, libc::MADV_POPULATE_WRITE)
                        };
                        if r != 0 {
                            PREFAULT_FAILED.fetch_add(1, AtomicOrdering::Relaxed);
                        }
                        PREFAULT_DONE.fetch_add(1, AtomicOrdering::Release);
                    }
                })
                .ok()
                .map(|_| tx)
        });
        // `madvise` wants a page-aligned start (frames are not a multiple of 4 KiB, so a
        // frame's address rarely is one): round the range outwards to whole small pages.
        const SMALL_PAGE: usize = 4096;
        let start = addr / SMALL_PAGE * SMALL_PAGE;
        let end = addr.saturating_add(len).next_multiple_of(SMALL_PAGE);
        if let Some(tx) = tx {
            if tx.send((start, end - start)).is_ok() {
                PREFAULT_SENT.fetch_add(1, AtomicOrdering::Relaxed);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (addr, len);
}

fn chunk_layout(k: usize) -> Option<Layout> {
    let l = Layout::array::<Frame>(1usize << k).ok()?;
    if l.size() >= HUGE_PAGE {
        l.align_to(HUGE_PAGE).ok()
    } else {
        Some(l)
    }
}

/// Asks the kernel to back a chunk's whole 2 MiB pages with transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`; it matters where the system setting is `madvise`, the common
/// default), or, when `huge` is false, never to (`MADV_NOHUGEPAGE`, which also holds where
/// the system setting is `always`). A lookup in a large tree misses the cache on every
/// level, and with 4 KiB pages it also misses the TLB: a dependent load into 1 GiB of pages
/// took 303 ns here with 4 KiB pages and 189 ns with huge ones (pointer chasing, this
/// machine), and YCSB-C over 1M rows ran 13% faster. But a fresh huge page can cost far more
/// to fault in than 512 small ones where the memory comes from a virtual machine's host on
/// first touch (see `Options::huge_pages`). The range is rounded inwards to whole huge
/// pages; failure (no THP, an old kernel) leaves the chunk as the system backs it.
fn advise_huge(p: *mut u8, len: usize, huge: bool) {
    #[cfg(target_os = "linux")]
    {
        let start = (p as usize).next_multiple_of(HUGE_PAGE);
        let end = (p as usize).saturating_add(len) / HUGE_PAGE * HUGE_PAGE;
        if end > start {
            let advice = if huge {
                libc::MADV_HUGEPAGE
            } else {
                libc::MADV_NOHUGEPAGE
            };
            // SAFETY: the range lies inside the allocation `p..p + len` just made and
            // `madvise` with `MADV_HUGEPAGE` or `MADV_NOHUGEPAGE` only changes how the kernel
            // backs it; no memory is read, written or unmapped.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, advice);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len, huge);
}

impl Default for PageStore {
    fn default() -> Self {
        Self::new()
    }
}

impl PageStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::counted(Arc::default(), true)
    }

    /// An empty store that counts its pages in `counts` (shared with other stores), with
    /// its memory on transparent huge pages when `huge` (see `advise_huge`) and on small
    /// pages otherwise.
    pub fn counted(counts: Arc<PageCounts>, huge: bool) -> Self {
        PageStore {
            counts,
            chunks: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            next: Mutex::new((0, 0)),
            made: AtomicU64::new(0),
            free: Mutex::new(Vec::new()),
            huge,
        }
    }

    /// The frame of page `pid`, or `None` if no such page was ever allocated (an optimistic
    /// reader may hold a garbage id; it gets `None` or some valid frame, never a dangling
    /// one).
    #[inline]
    pub fn frame(&self, pid: PageId) -> Option<&Frame> {
        if pid == NO_PAGE {
            return None;
        }
        let (k, i) = chunk_of(pid);
        let p = self.chunks.get(k)?.load(AtomicOrdering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-null chunk pointer was stored by `alloc` after allocating `2^k`
        // zeroed frames at it (all-zero bytes are valid atomics and a valid latch), `i <
        // 2^k` by `chunk_of`, and a chunk is deallocated only in `Drop`, which `&self`
        // excludes. Frames are only ever accessed through shared references (all their
        // fields are atomics).
        Some(unsafe { &*p.add(i) })
    }

    /// A page for a new node or overflow page: a freed one if any, else a new one. Its
    /// contents are whatever it held before (the caller latches and rewrites it).
    pub fn alloc(&self) -> PageId {
        self.counts.in_use.fetch_add(1, AtomicOrdering::Relaxed);
        if let Some(p) = self.free.lock().pop() {
            return p;
        }
        self.counts.held.fetch_add(1, AtomicOrdering::Relaxed);
        let mut next = self.next.lock();
        let (pid, asked) = *next;
        let (k, _) = chunk_of(pid);
        let slot = &self.chunks[k.min(CHUNKS - 1)];
        if slot.load(AtomicOrdering::Acquire).is_null() {
            let Some(layout) = chunk_layout(k) else {
                // 2^39 frames of 32 KiB exceed any address space: unreachable in practice.
                std::alloc::handle_alloc_error(Layout::new::<Frame>())
            };
            // SAFETY: `layout` has a non-zero size (at least one frame).
            let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Frame>();
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            advise_huge(p.cast(), layout.size(), self.huge);
            slot.store(p, AtomicOrdering::Release);
        }
        // Keep memory backed some way ahead of the pages handed out, from a background
        // thread: the first touch of a fresh huge page is then not paid by a transaction.
        let mut asked = asked.max(pid);
        let chunk_end = (1u64 << (k + 1)) - 1;
        if k >= PREFAULT_MIN_CHUNK && asked < chunk_end && asked < pid + PREFAULT_AHEAD / 2 {
            let to = (pid + PREFAULT_AHEAD).min(chunk_end);
            if let (Some(a), Some(_)) = (self.frame(asked), self.frame(to - 1)) {
                prefault(
                    a as *const Frame as usize,
                    (to - asked) as usize * size_of::<Frame>(),
                );
            }
            asked = to;
        }
        *next = (pid + 1, asked);
        self.made.store(pid + 1, AtomicOrdering::Release);
        pid
    }

    /// Returns a page that nothing in the tree links to any more. Optimistic readers may
    /// still read it (and fail validation); it is reused by a later `alloc`.
    pub fn free(&self, pid: PageId) {
        self.free.lock().push(pid);
        self.counts.in_use.fetch_sub(1, AtomicOrdering::Relaxed);
    }

    /// Pages ever handed out (allocated or free now): no chain of pages is longer.
    pub fn pages_made(&self) -> u64 {
        self.made.load(AtomicOrdering::Acquire)
    }

    /// Pages allocated and not free.
    pub fn pages_in_use(&self) -> usize {
        let next = self.next.lock().0;
        (next as usize).saturating_sub(self.free.lock().len())
    }

    /// Pages on the free list.
    pub fn pages_free(&self) -> usize {
        self.free.lock().len()
    }

    /// A copy of the free list (for invariant checks).
    pub fn free_list(&self) -> Vec<PageId> {
        self.free.lock().clone()
    }
}

impl Drop for PageStore {
    fn drop(&mut self) {
        self.counts
            .in_use
            .fetch_sub(self.pages_in_use() as u64, AtomicOrdering::Relaxed);
        self.counts
            .held
            .fetch_sub(self.pages_made(), AtomicOrdering::Relaxed);
        for (k, c) in self.chunks.iter().enumerate() {
            let p = c.load(AtomicOrdering::Acquire);
            if p.is_null() {
                continue;
            }
            if let Some(layout) = chunk_layout(k) {
                // SAFETY: `p` was allocated by `alloc` with exactly this layout and is freed
                // once, here; `&mut self` means no frame reference is alive.
                unsafe { std::alloc::dealloc(p.cast(), layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every prefault request a growing store sends is one the kernel accepts (frames are
    /// not a multiple of 4 KiB, and `madvise` refuses an unaligned start).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_kernel_takes_every_prefault_request() {
        let probe = Layout::from_size_align(1 << 16, 4096).expect("layout");
        // SAFETY: a non-zero-size layout; the buffer is freed below with the same layout.
        let buf = unsafe { std::alloc::alloc(probe) };
        assert!(!buf.is_null());
        // SAFETY: the range is the allocation just made; populating writes no byte of it.
        let supported =
            unsafe { libc::madvise(buf.cast(), probe.size(), libc::MADV_POPULATE_WRITE) } == 0;
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(buf, probe) };
        if !supported {
            eprintln!("MADV_POPULATE_WRITE unsupported here (Linux before 5.14): skipped");
            return;
        }
        let failed = PREFAULT_FAILED.load(AtomicOrdering::Relaxed);
        let store = PageStore::new();
        for _ in 0..1200 {
            store.alloc();
        }
        let sent = PREFAULT_SENT.load(AtomicOrdering::Relaxed);
        assert!(sent > 0, "a store of 1,200 pages asked for no prefaulting");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while PREFAULT_DONE.load(AtomicOrdering::Acquire) < sent {
            assert!(std::time::Instant::now() < deadline, "prefaulter stuck");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(PREFAULT_FAILED.load(AtomicOrdering::Relaxed), failed);
    }

    /// The `VmFlags` of the mapping of this process that holds `addr` (Linux's
    /// `/proc/self/smaps`), or `None` if no mapping does.
    #[cfg(target_os = "linux")]
    fn vm_flags_at(addr: usize) -> Option<Vec<String>> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if let (true, Some(flags)) = (inside, line.strip_prefix("VmFlags:")) {
                return Some(flags.split_whitespace().map(str::to_string).collect());
            }
        }
        None
    }

    /// A store's chunks of whole 2 MiB pages are marked for huge pages (`hg`) when it is
    /// made with `huge`, and kept off them (`nh`) when not, whatever the system's setting.
    #[cfg(target_os = "linux")]
    #[test]
    fn chunks_are_marked_for_huge_pages_or_kept_off_them_as_asked() {
        for huge in [true, false] {
            let store = PageStore::counted(Arc::default(), huge);
            // Chunk 7 holds pages 127..255: 128 frames, 4 MiB, so one whole aligned 2 MiB
            // page at least.
            let mut last = 0;
            while last < 200 {
                last = store.alloc();
            }
            let frame = store.frame(200).expect("an allocated page");
            let addr = frame as *const Frame as usize;
            let flags = vm_flags_at(addr).expect("the chunk's mapping");
            let (want, not) = if huge { ("hg", "nh") } else { ("nh", "hg") };
            assert!(
                flags.iter().any(|f| f == want) && !flags.iter().any(|f| f == not),
                "huge {huge}: flags {flags:?}"
            );
        }
    }

    /// One byte-level operation on a frame, checked against a plain byte array.
    #[derive(Debug, Clone)]
    enum Op {
        Write(usize, Vec<u8>),
        WriteAligned(usize, Vec<u8>),
        Read(usize, usize),
        Move(usize, usize, usize),
        Cmp(usize, Vec<u8>),
    }

    fn op() -> impl Strategy<Value = Op> {
        let at = 0usize..PAGE_SIZE;
        let bytes = proptest::collection::vec(any::<u8>(), 0..80);
        prop_oneof![
            (at.clone(), bytes.clone()).prop_map(|(a, b)| Op::Write(a, b)),
            (0usize..PAGE_WORDS, bytes.clone()).prop_map(|(w, b)| Op::WriteAligned(w * 8, b)),
            (at.clone(), 0usize..100).prop_map(|(a, n)| Op::Read(a, n)),
            (0usize..PAGE_WORDS, 0usize..PAGE_WORDS, 0usize..40)
                .prop_map(|(s, d, n)| Op::Move(s, d, n)),
            // Overlapping moves by a few words, as slot shifts make them.
            (8usize..PAGE_WORDS - 8, 0usize..=12, 0usize..40).prop_map(|(s, k, n)| Op::Move(
                s,
                s + k - 6,
                n
            )),
            (0usize..PAGE_WORDS, bytes).prop_map(|(w, b)| Op::Cmp(w * 8, b)),
        ]
    }

    fn frame() -> Box<Frame> {
        let layout = Layout::new::<Frame>();
        // SAFETY: a frame is all atomics, for which all-zero bytes are valid; the box takes
        // ownership of the allocation made with the frame's own layout.
        unsafe {
            let p = std::alloc::alloc_zeroed(layout).cast::<Frame>();
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(p)
        }
    }

    fn bytes_of(f: &Frame) -> Vec<u8> {
        (0..PAGE_WORDS)
            .flat_map(|w| f.load(w).to_le_bytes())
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn byte_routines_match_a_byte_array(ops in proptest::collection::vec(op(), 1..40)) {
            let f = frame();
            // Start from distinct bytes, so a move in the wrong direction shows.
            let mut model: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 + i / 256) as u8).collect();
            f.write_bytes(0, &model);
            for op in ops {
                match op {
                    Op::Write(at, b) => {
                        let b = &b[..b.len().min(PAGE_SIZE - at)];
                        f.write_unaligned(at, b);
                        model[at..at + b.len()].copy_from_slice(b);
                    }
                    Op::WriteAligned(at, b) => {
                        let b = &b[..b.len().min(PAGE_SIZE - at)];
                        f.write_bytes(at, b);
                        model[at..at + b.len()].copy_from_slice(b);
                        // The last word is zero padded.
                        let end = (at + b.len()).div_ceil(8) * 8;
                        model[at + b.len()..end].fill(0);
                    }
                    Op::Read(at, n) => {
                        let mut out = vec![7u8];
                        f.read_bytes(at, n, &mut out);
                        let end = (at + n).min(PAGE_SIZE);
                        prop_assert_eq!(&out[1..], &model[at..end]);
                        prop_assert_eq!(out[0], 7);
                    }
                    Op::Move(s, d, n) => {
                        f.move_words(s, d, n);
                        let n = n.min(PAGE_WORDS - s.max(d));
                        model.copy_within(s * 8..(s + n) * 8, d * 8);
                    }
                    Op::Cmp(at, probe) => {
                        let len = probe.len().min(PAGE_SIZE - at);
                        let want = model[at..at + len].cmp(&probe[..]);
                        prop_assert_eq!(f.cmp_bytes(at, len, &probe), want);
                    }
                }
                prop_assert!(bytes_of(&f) == model);
            }
        }
    }
}
