//! [`StashQueue`]: a worker's queue of stashed transactions (thesis §3.3).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{epoch_of, Doppel, CHANGING, SPLIT, STASHED};

/// A worker's queue of transactions that Doppel stashed, for a thread that keeps running new
/// transactions while they wait, as the thesis' workers do (§3.3: a stashed transaction is
/// saved and re-run in the next joined phase; the worker moves on).
///
/// By default, after a transaction fails with [`Error::Stashed`](crate::Error::Stashed), the thread's next
/// [`Database::begin`](crate::Database::begin) waits for the next joined phase. A thread that
/// instead [`push`](Self::push)es the stashed transaction's inputs here goes on at once: its
/// next `begin()` runs in the current (split) phase. Before each new transaction it asks
/// [`pop_ready`](Self::pop_ready) for inputs whose split phase has ended and re-runs those
/// first. Until the queue has been drained in a joined phase, the coordinator counts the
/// queue as stashed work that waits (the joined phase lasts until it is drained, at most
/// [`DoppelOptions::max_joined`](super::DoppelOptions::max_joined); the split phase ends after t_s), exactly like a waiting
/// thread.
///
/// `T` is whatever the caller needs to re-run a transaction: its inputs, a boxed closure, a
/// start time for latency. A queue belongs to one database; under any other concurrency
/// control nothing is ever stashed and the queue stays empty.
///
/// ```
/// use shoal::{ConcurrencyControl, Database, Error, Options};
/// use shoal::doppel::{SplitOp, StashQueue};
/// let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Doppel));
/// let t = db.create_table("likes")?;
/// db.split_hint(&t, b"hot", SplitOp::Add)?;
/// let mut queue: StashQueue<u64> = StashQueue::new(&db);
/// let (mut reads, mut next) = (0, 0u64);
/// while reads < 20 {
///     // Inputs whose phase ended first, then new work.
///     let input = queue.pop_ready().unwrap_or_else(|| { next += 1; next });
///     let mut tx = db.begin();
///     let res = if input % 2 == 0 {
///         tx.add(&t, b"hot", 1)
///     } else {
///         tx.get(&t, b"hot").map(|_| ())              // stashed while `hot` is split
///     };
///     match res.and_then(|()| tx.commit()) {
///         Ok(()) => reads += u32::from(input % 2 == 1),
///         Err(Error::Stashed { .. }) => queue.push(input), // no wait: go on with new work
///         Err(e) if e.is_retryable() => {}            // a real workload would retry `input`
///         Err(e) => return Err(e),
///     }
/// }
/// # Ok::<(), shoal::Error>(())
/// ```
pub struct StashQueue<T> {
    rt: Option<Arc<Doppel>>,
    items: std::collections::VecDeque<T>,
    /// The newest split phase an item was stashed in.
    epoch: u64,
    /// Whether this queue counts in the coordinator's pending stashed work.
    registered: bool,
}

impl<T> StashQueue<T> {
    /// An empty queue for `db`'s transactions.
    pub fn new(db: &crate::Database) -> StashQueue<T> {
        StashQueue {
            rt: db.doppel_runtime().cloned(),
            items: std::collections::VecDeque::new(),
            epoch: 0,
            registered: false,
        }
    }

    /// Sets aside `item`, the inputs of the transaction that just failed with
    /// [`Error::Stashed`](crate::Error::Stashed) on this thread, so that this thread's next `begin()` does not wait
    /// for the joined phase. Call it on the thread that ran the stashed transaction, before
    /// that thread begins another one.
    pub fn push(&mut self, item: T) {
        let Some(rt) = &self.rt else {
            self.items.push_back(item);
            return;
        };
        if !self.registered {
            rt.pending.fetch_add(1, Ordering::AcqRel);
            self.registered = true;
        }
        // The thread's wait mark (and its pending count) passes to the queue.
        let db = rt.db;
        // `try_with`: a thread being torn down (a queue in a thread-local) has no marks.
        let marked = STASHED
            .try_with(|s| {
                let mut s = s.borrow_mut();
                let e = s.iter().find(|m| m.db == db).map(|m| m.epoch);
                s.retain(|m| m.db != db);
                e
            })
            .ok()
            .flatten();
        let w = rt.word.load(Ordering::SeqCst);
        self.epoch = self.epoch.max(marked.unwrap_or(epoch_of(w)));
        self.items.push_back(item);
    }

    /// The oldest queued item, once the split phase it was stashed in has ended and the
    /// database is in a joined phase; `None` otherwise. Re-run what it returns before new
    /// work. Calling it on an empty queue tells the coordinator that this queue's stashed
    /// work is done.
    pub fn pop_ready(&mut self) -> Option<T> {
        if self.items.is_empty() {
            self.unregister();
            return None;
        }
        if let Some(rt) = &self.rt {
            let w = rt.word.load(Ordering::SeqCst);
            if w & (SPLIT | CHANGING) != 0 || epoch_of(w) <= self.epoch {
                return None;
            }
        }
        self.items.pop_front()
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no item waits.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn unregister(&mut self) {
        if let (Some(rt), true) = (&self.rt, self.registered) {
            rt.pending.fetch_sub(1, Ordering::AcqRel);
            self.registered = false;
        }
    }
}

impl<T> Drop for StashQueue<T> {
    fn drop(&mut self) {
        self.unregister();
    }
}

impl<T> std::fmt::Debug for StashQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StashQueue")
            .field("len", &self.items.len())
            .field("epoch", &self.epoch)
            .finish()
    }
}
