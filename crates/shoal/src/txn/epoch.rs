//! Epoch pins for removing the ghosts of optimistic deletes (Silo, Tu et al. SOSP 2013 §4.8):
//! which deletes every running transaction began after. See `reclaim` for how ghosts use it.
//!
//! Every optimistic transaction pins the current epoch in a slot before its first read and
//! clears the slot when it ends. Whoever retires something (a ghost it just installed) draws
//! a tag with [`Epochs::advance`]; the thing may go once [`Epochs::oldest_pinned`] is above
//! the tag. Why that is enough: a transaction that read anything before the retirement
//! pinned before that read, so before the tag was drawn, so with an epoch at or below the
//! tag (the counter only grows), and its slot keeps that epoch until it ends. The collector
//! reads the slots after the tag was drawn, so it sees that pin (or the slot cleared by the
//! transaction's end). A transaction that pins while the counter moves may pin an epoch
//! older than the current one: that only holds things back longer.
//!
//! Reaches its atomics only through `super::epoch_sync`, so `tests/epoch_shuttle.rs`
//! model-checks it with `shuttle`.

use std::cell::Cell;

use crossbeam_utils::CachePadded;

use super::epoch_sync::{AtomicU64, AtomicUsize, Ordering::SeqCst};

/// A slot's value when no transaction holds it (epochs start at 1).
const IDLE: u64 = 0;

thread_local! {
    /// The slot this thread claimed last: usually free again for its next transaction.
    static SLOT_HINT: Cell<usize> = const { Cell::new(0) };
}

/// A transaction's pin; give it back with [`Epochs::unpin`].
#[derive(Debug)]
pub(crate) enum Pin {
    /// The slot holding the pinned epoch.
    Slot(usize),
    /// No slot was free: counted in `overflow`, which holds everything back while non-zero.
    Overflow,
}

/// The epoch counter and the pin slots.
pub(crate) struct Epochs {
    epoch: AtomicU64,
    slots: Box<[CachePadded<AtomicU64>]>,
    /// Slots at or above this index have never been claimed: collectors read below it.
    used: AtomicUsize,
    overflow: AtomicUsize,
}

impl Epochs {
    /// Counter at 1, `slots` pin slots (one per concurrently running transaction; more
    /// transactions at once go to the overflow count).
    pub(crate) fn new(slots: usize) -> Self {
        Epochs {
            epoch: AtomicU64::new(1),
            slots: (0..slots.max(1))
                .map(|_| CachePadded::new(AtomicU64::new(IDLE)))
                .collect(),
            used: AtomicUsize::new(0),
            overflow: AtomicUsize::new(0),
        }
    }

    /// Pins the current epoch; call before the transaction's first read.
    pub(crate) fn pin(&self) -> Pin {
        let e = self.epoch.load(SeqCst);
        let n = self.slots.len();
        let hint = SLOT_HINT.with(Cell::get) % n;
        for i in std::iter::once(hint).chain(0..n) {
            // Publish the slot's index to collectors before the slot can hold a pin.
            if self.used.load(SeqCst) <= i {
                self.used.fetch_max(i + 1, SeqCst);
            }
            if self.slots[i]
                .compare_exchange(IDLE, e, SeqCst, SeqCst)
                .is_ok()
            {
                SLOT_HINT.with(|h| h.set(i));
                return Pin::Slot(i);
            }
        }
        self.overflow.fetch_add(1, SeqCst);
        Pin::Overflow
    }

    /// Ends a pin taken by [`pin`](Self::pin).
    pub(crate) fn unpin(&self, pin: Pin) {
        match pin {
            Pin::Slot(i) => self.slots[i].store(IDLE, SeqCst),
            Pin::Overflow => {
                self.overflow.fetch_sub(1, SeqCst);
            }
        }
    }

    /// The tag of what is retired now (after it was unlinked or installed as a ghost):
    /// it may go once [`oldest_pinned`](Self::oldest_pinned) is above the tag.
    pub(crate) fn advance(&self) -> u64 {
        self.epoch.fetch_add(1, SeqCst)
    }

    /// The oldest epoch a running transaction may have pinned, and never above the epoch
    /// when the call began: a collector that finds no pin and only then looks at what was
    /// retired must not take something retired after its look at the slots, by a committer
    /// whose reader pinned after that look (its tag is at least the epoch read here).
    pub(crate) fn oldest_pinned(&self) -> u64 {
        let now = self.epoch.load(SeqCst);
        if self.overflow.load(SeqCst) > 0 {
            return 0;
        }
        let used = self.used.load(SeqCst).min(self.slots.len());
        self.slots[..used]
            .iter()
            .map(|s| s.load(SeqCst))
            .filter(|&e| e != IDLE)
            .fold(now, u64::min)
    }
}
