//! Model checking of the epoch pins that decide when an optimistic ghost may be removed
//! (`src/txn/epoch.rs`, used by `src/txn/reclaim.rs`) with `shuttle`: the file is compiled
//! here a second time against shuttle's atomics (it reaches them only through
//! `super::epoch_sync`), and shuttle's randomized scheduler explores interleavings (a fixed
//! number of schedules per scenario, so it runs under plain `cargo test`).
//!
//! The model: one key in one leaf (a shuttle mutex standing for the leaf latch) goes
//! absent → live → ghost → removed. A reader pins, reads the key, reads it again (its
//! commit-time validation) and unpins. A writer inserts, deletes (installing the ghost),
//! draws the tag and lists the ghost. A collector removes the ghost once no pin is at or
//! below the tag. The property is the one optimistic validation needs: a reader that saw the
//! key absent before the insert never finds it absent again (removed) at validation, since
//! then it would miss the insert and the delete. With too few slots the overflow path is
//! exercised too.

use std::sync::Arc;

use shuttle::sync::Mutex;
use shuttle::thread;

/// The atomics `epoch.rs` uses, from shuttle.
mod epoch_sync {
    pub(super) use shuttle::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
}

#[path = "../src/txn/epoch.rs"]
#[allow(dead_code)]
mod epoch;

use epoch::Epochs;

const ABSENT: u8 = 0;
const LIVE: u8 = 1;
const GHOST: u8 = 2;
const REMOVED: u8 = 3;

struct World {
    epochs: Epochs,
    /// The key's state under its leaf latch.
    leaf: Mutex<u8>,
    /// The listed ghost's tag, once the writer drew it.
    retired: Mutex<Option<u64>>,
}

/// As `Reclaim::collect_retired` does it: the pins first, then the list of what was
/// retired (a ghost listed in between must not pass).
fn collect(w: &World) {
    let oldest = w.epochs.oldest_pinned();
    thread::yield_now();
    let tag = *w.retired.lock().unwrap();
    let Some(tag) = tag else { return };
    if oldest > tag {
        let mut leaf = w.leaf.lock().unwrap();
        if *leaf == GHOST {
            *leaf = REMOVED;
        }
    }
}

fn scenario(slots: usize, readers: usize) {
    let w = Arc::new(World {
        epochs: Epochs::new(slots),
        leaf: Mutex::new(ABSENT),
        retired: Mutex::new(None),
    });
    let mut hs = Vec::new();
    for _ in 0..readers {
        let w = Arc::clone(&w);
        hs.push(thread::spawn(move || {
            let pin = w.epochs.pin();
            let first = *w.leaf.lock().unwrap();
            thread::yield_now();
            let again = *w.leaf.lock().unwrap();
            assert!(
                !(first == ABSENT && again == REMOVED),
                "a ghost went while a reader of the key's absence ran"
            );
            w.epochs.unpin(pin);
            collect(&w);
        }));
    }
    {
        let w = Arc::clone(&w);
        hs.push(thread::spawn(move || {
            let pin = w.epochs.pin();
            *w.leaf.lock().unwrap() = LIVE;
            w.epochs.unpin(pin);
            let pin = w.epochs.pin();
            *w.leaf.lock().unwrap() = GHOST;
            let tag = w.epochs.advance();
            *w.retired.lock().unwrap() = Some(tag);
            w.epochs.unpin(pin);
            collect(&w);
        }));
    }
    {
        let w = Arc::clone(&w);
        hs.push(thread::spawn(move || {
            for _ in 0..3 {
                collect(&w);
                thread::yield_now();
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    // Everyone ended: the ghost can go now.
    collect(&w);
    assert_eq!(*w.leaf.lock().unwrap(), REMOVED, "a ghost was leaked");
}

#[test]
fn shuttle_a_reader_of_an_absence_holds_the_ghost_back() {
    shuttle::check_random(|| scenario(8, 2), 3000);
}

#[test]
fn shuttle_overflow_pins_hold_the_ghost_back() {
    // One slot for three transactions at a time: some pin through the overflow count.
    shuttle::check_random(|| scenario(1, 2), 3000);
}

#[test]
fn shuttle_pct_a_reader_of_an_absence_holds_the_ghost_back() {
    shuttle::check_pct(|| scenario(2, 2), 3000, 3);
}
