//! Storage: each table is a B+-tree ([`btree::BTree`]) on fixed-size pages ([`page`]) with a
//! slotted layout (`node.rs`), fence keys and ghost records (Kimura §2.2), overflow pages
//! for long values (`overflow.rs`) and optimistic lock coupling ([`olc`]).

pub mod btree;
mod node;
pub(crate) use node::stored_len;
pub mod olc;
mod overflow;
pub mod page;

/// The synchronization primitives `olc.rs` uses (the shuttle model swaps in its own).
mod sync {
    pub(super) use std::sync::atomic::{fence, AtomicU64, Ordering};

    /// One step of waiting for a latch: spin a little, then yield the core.
    #[inline]
    pub(super) fn spin_wait(spins: &mut u32) {
        if *spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        *spins = spins.saturating_add(1);
    }
}
