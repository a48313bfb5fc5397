//! Staged allocation and reclamation of the latch-free lock table (Jung et al. 2013 §4):
//! pool slots with per-slot free lists and bags of retired entries and lock heads, the
//! reclamation gates (an epoch per bucket group and one table-wide, counter-based as in
//! sleepable RCU), bulk allocation, and the sweep that kills idle lock heads.

use super::*;

/// A retired (unlinked) entry or lock head, deferred until no operation can reach it: until
/// the gate of its bucket group and the table-wide gate have each advanced twice past the
/// epochs read when it was retired (see [`Gate`]).
pub(super) struct Retired<T> {
    pub(super) ptr: *mut T,
    /// Its bucket group.
    pub(super) group: usize,
    /// The group's gate epoch when it was retired.
    pub(super) group_epoch: u32,
    /// The table-wide gate epoch when it was retired.
    pub(super) all_epoch: u32,
}

/// Per-slot state only the thread that claimed the slot touches.
#[derive(Default)]
pub(super) struct SlotLocal {
    /// Unlinked entries waiting for their gates, in retirement order.
    pub(super) bag: Vec<Retired<Entry>>,
    /// Unlinked (dead) lock heads waiting for their gates, in retirement order.
    pub(super) heads: Vec<Retired<LockHead>>,
    /// Lock heads this slot created since its last sweep step.
    pub(super) created: usize,
    /// A sweep step is due when the operation ends (see `created_head`).
    pub(super) sweep_due: bool,
    /// Reclaimed lock heads kept allocated and poisoned ([`Params::poison_heads`]).
    pub(super) graveyard: Vec<*mut LockHead>,
    /// Reclaimed entries ready for reuse.
    pub(super) free: Vec<*mut Entry>,
    /// Reclaimed lock heads ready for reuse (unless [`Params::poison_heads`]).
    pub(super) free_heads: Vec<*mut LockHead>,
    /// Kills refused since the last reclamation attempt (see `may_kill`).
    pub(super) refused: usize,
    /// Bag size at which the next reclamation attempt runs (a failed attempt, with a gate
    /// held back by a pinned operation, is not repeated on every retirement).
    pub(super) collect_at: usize,
}

/// A pool slot: `busy` is 1 while an operation owns the slot's local state, 0 when free.
pub(super) struct Slot {
    pub(super) busy: AtomicU32,
    /// Lock heads this slot allocated and freed (written only by the slot's occupant, so
    /// without a read-modify-write; a table-wide counter bounced between cores on every
    /// lock once idle heads are killed at unlock).
    pub(super) heads_made: AtomicUsize,
    pub(super) heads_freed: AtomicUsize,
    /// Lock heads in this slot's free list (written only by the slot's occupant).
    pub(super) heads_pooled: AtomicUsize,
    pub(super) local: UnsafeCell<SlotLocal>,
}

// SAFETY: `local` is only accessed by the thread that claimed the slot with a successful CAS
// of `busy` from 0 (or by `Drop`, which has `&mut`), so it is never accessed concurrently; the
// raw entry and lock-head pointers it stores are owned by the table.
unsafe impl Sync for Slot {}
// SAFETY: as above; the pointers in `local` refer to heap entries owned by the table.
unsafe impl Send for Slot {}

/// A reclamation gate: an epoch and, per epoch parity, the number of operations pinned on
/// it (a counter-based epoch scheme, as in sleepable RCU).
///
/// An operation pins by incrementing the counter of the current epoch's parity and checking
/// that the epoch did not move meanwhile. The epoch advances from `e` to `e + 1` only when no
/// operation of epoch `e - 1` is pinned (the counter of `e + 1`'s parity is zero), so once it
/// reached `r + 2`, every operation pinned at or before epoch `r` has left. Something unlinked
/// before reading epoch `r` is therefore unreachable once the epoch reaches `r + 2`: only
/// operations pinned before the unlink could still hold it.
///
/// The table has one gate per bucket group (in the group's cache line, which a lookup loads
/// anyway) and one table-wide gate for the rare operations that reach lock heads other than
/// through their own bucket (deadlock search, sweeps, statistics). An operation on one lock
/// pins its group's gate only, so a descheduled pinned thread holds back the reclamation of
/// one group in [`BUCKETS`]` / `[`GROUP_BUCKETS`], not of the whole table (with a single
/// table-wide epoch, txbench read-only fell from 260k-300k tps at 2 threads to about 150k at
/// 8: a pinned thread was descheduled nearly all the time, so heads piled up unreclaimed and
/// the pools cycled through thousands of cold ones).
pub(super) struct Gate {
    pub(super) epoch: AtomicU32,
    pub(super) pinned: [AtomicU32; 2],
}

impl Gate {
    pub(super) fn new() -> Self {
        Gate {
            epoch: AtomicU32::new(0),
            pinned: [AtomicU32::new(0), AtomicU32::new(0)],
        }
    }

    /// Pins an operation; returns the epoch it is counted under.
    pub(super) fn enter(&self) -> u32 {
        loop {
            let e = self.epoch.load(SeqCst);
            self.pinned[(e & 1) as usize].fetch_add(1, SeqCst);
            if self.epoch.load(SeqCst) == e {
                return e;
            }
            self.pinned[(e & 1) as usize].fetch_sub(1, SeqCst);
        }
    }

    /// Unpins an operation that [`enter`](Self::enter) returned `e` to.
    pub(super) fn exit(&self, e: u32) {
        self.pinned[(e & 1) as usize].fetch_sub(1, SeqCst);
    }

    /// No operation is pinned.
    pub(super) fn idle(&self) -> bool {
        self.pinned[0].load(SeqCst) == 0 && self.pinned[1].load(SeqCst) == 0
    }

    /// The caller, pinned under epoch `mine`, is the only operation pinned.
    pub(super) fn alone(&self, mine: u32) -> bool {
        self.pinned[(mine & 1) as usize].load(SeqCst) == 1
            && self.pinned[(mine.wrapping_add(1) & 1) as usize].load(SeqCst) == 0
    }

    /// Advances the epoch if no operation of the epoch before it is pinned.
    pub(super) fn try_advance(&self) -> u32 {
        let e = self.epoch.load(SeqCst);
        if self.pinned[(e.wrapping_add(1) & 1) as usize].load(SeqCst) != 0 {
            return e;
        }
        match self
            .epoch
            .compare_exchange(e, e.wrapping_add(1), SeqCst, SeqCst)
        {
            Ok(_) => e.wrapping_add(1),
            Err(now) => now,
        }
    }

    /// Whether the epoch has reached `r + 2` (advancing it if it can): then nothing unlinked
    /// before `r` was read is reachable.
    pub(super) fn passed(&self, r: u32) -> bool {
        let mut now = self.epoch.load(SeqCst);
        for _ in 0..2 {
            if now.wrapping_sub(r) >= 2 {
                return true;
            }
            now = self.try_advance();
        }
        now.wrapping_sub(r) >= 2
    }
}

/// One cache line of the lock hash table: a reclamation gate and [`GROUP_BUCKETS`] buckets.
#[repr(align(64))]
pub(super) struct Group {
    pub(super) gate: Gate,
    pub(super) buckets: [AtomicPtr<LockHead>; GROUP_BUCKETS],
}

/// An operation pinned on a gate; unpins when dropped.
pub(super) struct Pin<'a> {
    pub(super) gate: &'a Gate,
    pub(super) epoch: u32,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        self.gate.exit(self.epoch);
    }
}

std::thread_local! {
    /// A per-thread starting index for slot claims (any slot is correct; this spreads them).
    static SLOT_HINT: Cell<usize> = const { Cell::new(usize::MAX) };
}

static NEXT_HINT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn slot_hint() -> usize {
    SLOT_HINT.with(|h| {
        if h.get() == usize::MAX {
            h.set(NEXT_HINT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        }
        h.get()
    })
}

pub(super) fn backoff(step: &mut u32) {
    if *step < 6 {
        for _ in 0..(1u32 << *step) {
            std::hint::spin_loop();
        }
    } else {
        yield_now();
    }
    *step += 1;
}

/// An operation in progress: owns a pool slot and is pinned on the gate of one bucket group
/// (it may reach the lock heads of that group's buckets and their entries), on the
/// table-wide gate (it may reach any), or on none (it only reclaims its slot's bags).
pub(super) struct Guard<'a> {
    pub(super) table: &'a LatchFreeLockTable,
    pub(super) slot: usize,
    /// The bucket group pinned, if any (`None` with a table-wide pin, or none).
    pub(super) group: Option<usize>,
    pub(super) pin: Option<Pin<'a>>,
}

impl Guard<'_> {
    #[allow(clippy::mut_from_ref)]
    pub(super) fn local(&self) -> &mut SlotLocal {
        // SAFETY: this guard claimed the slot (CAS of `busy` from 0), so no other thread
        // touches its `local` until the guard is dropped; callers never hold two of these
        // borrows.
        unsafe { &mut *self.table.slots[self.slot].local.get() }
    }

    /// Counts a lock head this slot allocated (`true`) or freed (`false`).
    pub(super) fn count_head(&self, made: bool) {
        let slot = &self.table.slots[self.slot];
        let c = if made {
            &slot.heads_made
        } else {
            &slot.heads_freed
        };
        // Only the slot's occupant writes it.
        c.store(c.load(SeqCst).wrapping_add(1), SeqCst);
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        drop(self.pin.take());
        if std::mem::take(&mut self.local().sweep_due) {
            self.table.sweep_step(self);
            drop(self.pin.take());
        }
        self.table.slots[self.slot].busy.store(0, SeqCst);
    }
}

impl LatchFreeLockTable {
    // ---- reclamation (a gate per bucket group, see `Gate`) ----

    /// Claims a free pool slot (its local state is ours until the guard drops).
    pub(super) fn claim_slot(&self) -> usize {
        let start = slot_hint();
        let mut step = 0;
        loop {
            let n = self.params.slots;
            for i in 0..n {
                let slot = (start + i) % n;
                let busy = &self.slots[slot].busy;
                if busy.load(Relaxed) == 0 && busy.compare_exchange(0, 1, SeqCst, SeqCst).is_ok() {
                    return slot;
                }
            }
            backoff(&mut step);
        }
    }

    /// Starts an operation on the lock heads of bucket `b`'s group (and their entries).
    pub(super) fn pin(&self, b: usize) -> Guard<'_> {
        let slot = self.claim_slot();
        let group = b / self.per_group;
        let gate = &self.groups[group].gate;
        let epoch = gate.enter();
        Guard {
            table: self,
            slot,
            group: Some(group),
            pin: Some(Pin { gate, epoch }),
        }
    }

    /// Starts an operation that may reach any lock head and entry.
    pub(super) fn pin_all(&self) -> Guard<'_> {
        let slot = self.claim_slot();
        Guard {
            table: self,
            slot,
            group: None,
            pin: Some(self.enter_all()),
        }
    }

    /// A table-wide pin (for a part of an operation that leaves its bucket group).
    pub(super) fn enter_all(&self) -> Pin<'_> {
        Pin {
            gate: &self.all,
            epoch: self.all.enter(),
        }
    }

    /// Reclaims in bulk what no running operation can still reach: kills and unlinks every
    /// idle lock head, then claims every idle slot in turn and reclaims its deferred
    /// retirements (Jung §4.4's lazy bulk de-allocation; what a background de-allocator
    /// would run now and then). Safe to call at any time, concurrently with everything else;
    /// deferred retirements of a slot are otherwise only reclaimed by operations using that
    /// slot.
    pub fn reclaim(&self) {
        {
            // Kill and unlink every idle lock head (retired into this guard's slot).
            let g = self.pin_all();
            for b in 0..self.params.buckets {
                self.sweep_bucket(&g, b, true);
            }
            g.local().created = 0;
        }
        for slot in 0..self.slots.len() {
            if self.slots[slot]
                .busy
                .compare_exchange(0, 1, SeqCst, SeqCst)
                .is_ok()
            {
                let g = Guard {
                    table: self,
                    slot,
                    group: None,
                    pin: None,
                };
                self.collect(&g);
                let local = g.local();
                local.collect_at = local.bag.len() + local.heads.len() + self.params.retire_batch;
            }
        }
    }

    /// Whether something unlinked from bucket `b` by `g` now can be reclaimed at once: `g` is
    /// the only operation pinned on the bucket's group, and none is pinned table-wide. Only
    /// operations pinned before the unlink could reach it; a later one starts from the
    /// bucket (or from a live entry, which this was not). Read after the unlink (both are
    /// `SeqCst`), against a pin's increment before its first read.
    pub(super) fn unreachable_now(&self, g: &Guard<'_>, b: usize) -> bool {
        let group = b / self.per_group;
        match (&g.pin, g.group) {
            (Some(pin), Some(mine)) if mine == group => {
                pin.gate.alone(pin.epoch) && self.all.idle()
            }
            _ => false,
        }
    }

    /// Debug check that `g`, which unlinked something from bucket `b`, is pinned where it
    /// could reach it: on `b`'s group, or table-wide. (Immediate reuse relies on it: an
    /// operation keeps no pointer across an unpin, except a waiter's own live entry and head.)
    pub(super) fn check_pinned(&self, g: &Guard<'_>, b: usize) {
        debug_assert!(
            g.pin.is_some() && g.group.is_none_or(|grp| grp == b / self.per_group),
            "unlinked from bucket {b} by an operation not pinned on its group"
        );
    }

    /// Defers something unlinked from bucket `b` until its gates have passed.
    pub(super) fn deferred<T>(&self, ptr: *mut T, b: usize) -> Retired<T> {
        let group = b / self.per_group;
        Retired {
            ptr,
            group,
            group_epoch: self.groups[group].gate.epoch.load(SeqCst),
            all_epoch: self.all.epoch.load(SeqCst),
        }
    }

    /// Hands an entry unlinked from a lock head of bucket `b` to the reclaimer: reused at
    /// once if no other operation can reach it, else once none can.
    pub(super) fn retire(&self, g: &Guard<'_>, e: *mut Entry, b: usize) {
        self.check_pinned(g, b);
        if self.unreachable_now(g, b) {
            // SAFETY: unlinked, and no other operation is pinned where it could reach it.
            unsafe { self.recycle(g.local(), e) };
            return;
        }
        let r = self.deferred(e, b);
        g.local().bag.push(r);
        self.collect_if_due(g);
    }

    /// Hands a lock head unlinked from bucket `b` to the reclaimer: reclaimed, with the
    /// entries still on its list, at once if no other operation can reach it, else once
    /// none can.
    pub(super) fn retire_head(&self, g: &Guard<'_>, h: *mut LockHead, b: usize) {
        self.check_pinned(g, b);
        if self.unreachable_now(g, b) {
            // SAFETY: unlinked, and no other operation is pinned where it could reach it.
            unsafe { self.reclaim_head(g, h) };
            return;
        }
        let r = self.deferred(h, b);
        g.local().heads.push(r);
        self.collect_if_due(g);
    }

    /// Runs a reclamation once the slot's bags have grown by a batch since the last one.
    pub(super) fn collect_if_due(&self, g: &Guard<'_>) {
        let local = g.local();
        if local.heads.len() + local.bag.len() >= local.collect_at.max(self.params.retire_batch) {
            self.collect(g);
            let local = g.local();
            local.collect_at = local.bag.len() + local.heads.len() + self.params.retire_batch;
        }
    }

    /// Counts a lock head this slot created; every `sweep_every` of them, a sweep step is
    /// due at the end of the operation.
    pub(super) fn created_head(&self, g: &Guard<'_>) {
        let local = g.local();
        local.created += 1;
        if local.created >= self.params.sweep_every {
            local.created = 0;
            local.sweep_due = true;
        }
    }

    /// A sweep step over the next `sweep_buckets` buckets, pinning each bucket's group in
    /// turn (`g` is unpinned; it is left pinned on the last group visited). Pinning group by
    /// group rather than table-wide keeps a sweeper that is descheduled mid-step from holding
    /// back the reclamation of the whole table.
    pub(super) fn sweep_step<'a>(&'a self, g: &mut Guard<'a>) {
        let n = self.params.sweep_buckets;
        let start = self.sweep_cursor.fetch_add(n, SeqCst);
        for i in 0..n {
            if !self.may_kill(g) {
                return;
            }
            let b = start.wrapping_add(i) % self.params.buckets;
            let group = b / self.per_group;
            if g.group != Some(group) || g.pin.is_none() {
                drop(g.pin.take());
                let gate = &self.groups[group].gate;
                g.pin = Some(Pin {
                    gate,
                    epoch: gate.enter(),
                });
                g.group = Some(group);
            }
            self.sweep_bucket(g, b, true);
        }
    }

    /// Whether this slot may kill idle lock heads now: only while fewer than
    /// [`KILL_BACKLOG`] of the heads it retired wait for reclamation. When the limit is
    /// reached it tries a reclamation first (at most once every [`RETIRE_BATCH`] refusals, as
    /// a reclamation visits every deferred head).
    pub(super) fn may_kill(&self, g: &Guard<'_>) -> bool {
        let local = g.local();
        if local.heads.len() < KILL_BACKLOG {
            return true;
        }
        local.refused += 1;
        if local.refused < self.params.retire_batch {
            return false;
        }
        local.refused = 0;
        self.collect(g);
        g.local().heads.len() < KILL_BACKLOG
    }

    /// Whether a deferred retirement is unreachable now: both its gates have passed.
    pub(super) fn passed<T>(&self, r: &Retired<T>) -> bool {
        self.all.passed(r.all_epoch) && self.groups[r.group].gate.passed(r.group_epoch)
    }

    /// Reclaims the deferred entries and lock heads of this slot that no operation can reach
    /// any more (advancing the gates where it can). It visits every deferred one: they are
    /// few unless operations stay pinned table-wide, and the groups' gates pass in no order.
    pub(super) fn collect(&self, g: &Guard<'_>) {
        let local = g.local();
        let mut heads = std::mem::take(&mut local.heads);
        heads.retain(|r| {
            if !self.passed(r) {
                return true;
            }
            // SAFETY: unlinked, and both gates passed: no pinned operation can reach it.
            unsafe { self.reclaim_head(g, r.ptr) };
            false
        });
        let local = g.local();
        debug_assert!(local.heads.is_empty(), "reclaiming a head retires nothing");
        local.heads = heads;
        let mut bag = std::mem::take(&mut local.bag);
        bag.retain(|r| {
            if !self.passed(r) {
                return true;
            }
            // SAFETY: unlinked, and both gates passed: no pinned operation can reach it.
            unsafe { self.recycle(g.local(), r.ptr) };
            false
        });
        g.local().bag = bag;
    }

    /// Reclaims an unlinked lock head and the entries still on its list: into the slot's
    /// pools (or the graveyard with [`Params::poison_heads`]).
    ///
    /// # Safety
    ///
    /// `hp` was unlinked from its bucket and no operation can reach it (nor an entry on its
    /// list: entries are reached through their lock head, or through the waiting registry,
    /// which holds live entries only, and a dead head has none); it came from
    /// `Box::into_raw`.
    pub(super) unsafe fn reclaim_head(&self, g: &Guard<'_>, hp: *mut LockHead) {
        let local = g.local();
        // SAFETY: the caller's guarantee.
        let h = unsafe { &*hp };
        let mut cur = h.first.load(SeqCst);
        while !cur.is_null() {
            // SAFETY: as above, the entries still linked on the list are unreachable;
            // each is linked once (unlinked ones are in some bag or pool instead).
            let next = unmarked(unsafe { &*cur }.next.load(SeqCst));
            // SAFETY: as above.
            unsafe { self.recycle(local, cur) };
            cur = next;
        }
        g.count_head(false);
        if self.params.poison_heads {
            h.poison.store(1, SeqCst);
            local.graveyard.push(hp);
        } else {
            self.pool_head(g, local, hp);
        }
    }

    /// Puts a reclaimed entry on the slot's free list (poisoned), or deallocates it beyond
    /// [`Params::free_cap`].
    ///
    /// # Safety
    ///
    /// `e` came from `Box::into_raw` in `alloc` and no thread can reach it any more.
    pub(super) unsafe fn recycle(&self, local: &mut SlotLocal, e: *mut Entry) {
        if local.free.len() < self.params.free_cap {
            // SAFETY: the caller guarantees `e` is live and unreachable: ours alone.
            unsafe { &*e }.state.store(POISON | OBSOLETE, SeqCst);
            local.free.push(e);
        } else {
            // SAFETY: as above, and it came from `Box::into_raw` (the caller's guarantee).
            drop(unsafe { Box::from_raw(e) });
            self.allocated.fetch_sub(1, SeqCst);
        }
    }

    /// A fresh entry owned by the caller, initialised and not yet linked.
    pub(super) fn alloc(
        &self,
        g: &Guard<'_>,
        txn: TxnId,
        state: u32,
        head: &LockHead,
    ) -> *mut Entry {
        let local = g.local();
        // Reuse the oldest free entry first (a stale reference, were there one, would meet a
        // poisoned entry rather than a recycled one).
        let e = match (!local.free.is_empty()).then(|| local.free.swap_remove(0)) {
            Some(e) => e,
            None => {
                // Bulk pre-allocation (Jung §4.3), on demand.
                local
                    .free
                    .extend((1..ALLOC_BATCH).map(|_| Box::into_raw(Box::new(Entry::blank()))));
                self.allocated.fetch_add(ALLOC_BATCH, SeqCst);
                Box::into_raw(Box::new(Entry::blank()))
            }
        };
        // SAFETY: `e` is from the free list or fresh: unreachable by any other thread.
        let entry = unsafe { &*e };
        entry.txn.store(txn, SeqCst);
        entry.state.store(state, SeqCst);
        let (age, pipe, fp) = if self.deadlocks.needs_blocker_ages() {
            (
                age_of(txn),
                pipeline_of(txn).min(u64::from(u32::MAX)) as u32,
                fingerprint_of(txn),
            )
        } else {
            (0, 0, 0)
        };
        entry.age.store(age, SeqCst);
        entry.pipe.store(pipe, SeqCst);
        entry.fp.store(fp, SeqCst);
        entry.next.store(ptr::null_mut(), SeqCst);
        entry
            .head
            .store(head as *const LockHead as *mut LockHead, SeqCst);
        // SAFETY: exclusive ownership (see above).
        unsafe { *entry.thread.get() = Some(current()) };
        e
    }
}
