//! Overflow pages: a value longer than [`INLINE_VALUE`](super::page::INLINE_VALUE) bytes
//! is stored in a chain of pages, and its record holds a 16-byte reference (first page,
//! length), so that one large value neither crowds a leaf nor forces a page size on
//! everyone.
//!
//! A chain is written before its record points to it and freed after its record stops
//! pointing to it, both under the leaf's exclusive latch; it is never changed in place. An
//! optimistic reader follows a chain from a record it read without a latch; the chain may be
//! freed and its pages reused meanwhile, so the reader validates the leaf's version after
//! reading the whole value (a freed chain means the leaf changed) and every read here
//! tolerates garbage (bounded length and page count, unknown pages rejected).

use super::node::{Node, HDR_WORDS, KIND_OVERFLOW, OVERFLOW_BYTES, OVF_REF, W_LINK, W_OVLEN};
use super::page::{PageId, PageStore, NO_PAGE};

/// The reference a record stores for `(first page, length)`.
pub fn encode_ref(first: PageId, len: usize) -> [u8; OVF_REF] {
    let mut r = [0u8; OVF_REF];
    r[..8].copy_from_slice(&first.to_le_bytes());
    r[8..].copy_from_slice(&(len as u64).to_le_bytes());
    r
}

/// `(first page, length)` of a reference (garbage in, garbage out; never panics).
pub fn decode_ref(r: &[u8]) -> (PageId, usize) {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    if r.len() >= OVF_REF {
        a.copy_from_slice(&r[..8]);
        b.copy_from_slice(&r[8..16]);
    }
    (
        u64::from_le_bytes(a),
        usize::try_from(u64::from_le_bytes(b)).unwrap_or(usize::MAX),
    )
}

/// Writes `bytes` into a new chain; returns its reference.
pub fn write(store: &PageStore, bytes: &[u8]) -> [u8; OVF_REF] {
    let mut next = NO_PAGE;
    for chunk in bytes.chunks(OVERFLOW_BYTES).rev() {
        let pid = store.alloc();
        let Some(f) = store.frame(pid) else {
            unreachable!("a page just allocated has a frame")
        };
        // A stale optimistic reader (a hint) may be reading this recycled page: latch it
        // so that its version changes.
        f.latch.lock();
        f.zero_words(0, HDR_WORDS);
        f.store(0, KIND_OVERFLOW);
        f.store(W_LINK, next);
        f.store(W_OVLEN, chunk.len() as u64);
        f.write_bytes(HDR_WORDS * 8, chunk);
        f.latch.unlock();
        next = pid;
    }
    encode_ref(next, bytes.len())
}

/// Appends the value `r` refers to; false if the chain is not a well-formed chain of that
/// length (a torn read: the caller's validation fails).
///
/// An optimistic reader may follow a reference or links torn by a concurrent writer, so the
/// walk is bounded by what the store holds, not only by the length the reference claims
/// (a torn length may be any number): it visits at most as many pages as the store ever
/// handed out, and each must hold at least one byte (a page caught between being cleared
/// and written holds none).
pub fn read(store: &PageStore, r: &[u8], out: &mut Vec<u8>) -> bool {
    let (mut pid, len) = decode_ref(r);
    let max_pages = (len / OVERFLOW_BYTES + 1).min(store.pages_made() as usize);
    let mut left = len;
    for _ in 0..max_pages {
        let Some(f) = store.frame(pid) else {
            return false;
        };
        if Node(f).kind() != KIND_OVERFLOW {
            return false;
        }
        let n = (f.load(W_OVLEN) as usize).min(OVERFLOW_BYTES).min(left);
        if n == 0 {
            return false;
        }
        f.read_bytes(HDR_WORDS * 8, n, out);
        left -= n;
        if left == 0 {
            return true;
        }
        pid = f.load(W_LINK);
    }
    false
}

/// Frees the chain `r` refers to (its record is gone or points elsewhere now; the leaf is
/// latched exclusively).
pub fn free(store: &PageStore, r: &[u8]) {
    let (mut pid, len) = decode_ref(r);
    let max_pages = len / OVERFLOW_BYTES + 1;
    for _ in 0..max_pages {
        let Some(f) = store.frame(pid) else {
            return;
        };
        if Node(f).kind() != KIND_OVERFLOW {
            return;
        }
        let next = f.load(W_LINK);
        f.latch.lock();
        Node(f).clear();
        f.latch.unlock();
        store.free(pid);
        pid = next;
    }
}

/// The pages of the chain `r` refers to (for invariant checks and statistics).
pub fn pages(store: &PageStore, r: &[u8]) -> Vec<PageId> {
    let (mut pid, len) = decode_ref(r);
    let mut v = Vec::new();
    for _ in 0..len / OVERFLOW_BYTES + 1 {
        if store.frame(pid).is_none() || pid == NO_PAGE {
            break;
        }
        v.push(pid);
        pid = store.frame(pid).map_or(NO_PAGE, |f| f.load(W_LINK));
    }
    v
}
