//! The lock hash table and its latch-free lists (Jung et al. 2013 §3.1, Fig. 4-5; §4.5):
//! bucket lists of lock heads (appended with a CAS, dead heads unlinked as in Michael's
//! list), request lists appended by swapping the tail and then linking the old tail (a walk
//! waits for a half-linked tail), and the unlinking of obsolete entries as in Harris' list.

use super::*;

/// What a bucket traversal does after looking at a lock head (see `unlink_dead`).
pub(super) enum Step {
    /// The head is live: go on.
    Next,
    /// Read the same link again.
    Reload,
    /// The link changed under us: start again from the bucket.
    Restart,
}

impl LatchFreeLockTable {
    // ---- hash table and lists ----

    /// The hash of `id` that picks its bucket and is kept in its lock head.
    pub(super) fn hash(id: &LockId) -> u64 {
        FxBuildHasher
            .hash_one(id)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// The bucket of a lock head of hash `hash`: a group from the high bits, a bucket of
    /// the group from other bits.
    pub(super) fn bucket_of(&self, hash: u64) -> usize {
        let group = (hash >> 32) as usize & (self.groups.len() - 1);
        group * self.per_group + (hash >> 8) as usize % self.per_group
    }

    /// Bucket `b` (an index below `params.buckets`).
    pub(super) fn bucket(&self, b: usize) -> &AtomicPtr<LockHead> {
        &self.groups[b / self.per_group].buckets[b % self.per_group]
    }

    /// Starts an operation on `id`'s lock head: pinned on its bucket's group. Returns the
    /// id's hash too, for [`find_head`](Self::find_head).
    pub(super) fn pin_id(&self, id: &LockId) -> (Guard<'_>, u64) {
        let hash = Self::hash(id);
        (self.pin(self.bucket_of(hash)), hash)
    }

    pub(super) fn tag_floor(&self, bucket: usize) -> &AtomicU64 {
        &self.tag_floor[bucket % self.tag_floor.len()]
    }

    /// Helps unlink the lock head `h` = `cur`, read from `link`, if it is dead (Michael's
    /// list): marks its `next` (so nothing is appended after it or unlinked through it any
    /// more), then unlinks it with a CAS on `link`, and the thread whose CAS succeeds retires
    /// it.
    ///
    /// Takes the head as a raw pointer, not a reference: `retire_head` may free it at once
    /// (reclaimed immediately, and the slot's pool is full), and a reference parameter must
    /// stay valid until the function returns.
    pub(super) fn unlink_dead(
        &self,
        g: &Guard<'_>,
        link: &AtomicPtr<LockHead>,
        cur: *mut LockHead,
    ) -> Step {
        // SAFETY: reached from the bucket while pinned: not freed before we unpin, or before
        // the `retire_head` below (after which `h` is not used).
        let h = unsafe { &*cur };
        if !h.is_dead() {
            return Step::Next;
        }
        let next = h.next.load(SeqCst);
        if !is_marked(next) {
            // Fails only if `next` changed (an append after `h`, or its successor unlinked):
            // then try again.
            let _ = h.next.compare_exchange(next, marked(next), SeqCst, SeqCst);
            return Step::Reload;
        }
        if link
            .compare_exchange(cur, unmarked(next), SeqCst, SeqCst)
            .is_ok()
        {
            let b = self.bucket_of(h.hash);
            self.retire_head(g, cur, b);
            Step::Reload
        } else {
            Step::Restart
        }
    }

    /// Kills `h` if every request on it is obsolete: marks its tail with a CAS from the tail
    /// read before the check, so that no request was appended since (an appender's CAS of the
    /// tail fails on a marked one). Folds its tag into the bucket's tag floor first.
    pub(super) fn try_kill(&self, h: &LockHead, bucket: usize) -> bool {
        let t = h.tail.load(SeqCst);
        if t.is_null() || is_marked(t) {
            // Empty: its creator is about to append. Or already dead.
            return false;
        }
        // An obsolete entry never becomes live again (only a fresh, unlinked one is), so
        // entries up to `t` found obsolete stay so.
        let mut idle = true;
        self.walk(h, |e| {
            idle &= e.state.load(SeqCst) & OBSOLETE != 0;
            idle && !ptr::eq(e, t)
        });
        if !idle {
            return false;
        }
        // Tags are raised only by the holder of a live entry (before it becomes obsolete), so
        // the tag is final if the CAS below succeeds. Raised first, so that a lookup that
        // skips the dead head then reads a floor covering its tag.
        self.tag_floor(bucket).fetch_max(h.tag.load(SeqCst), SeqCst);
        h.tail
            .compare_exchange(t, marked(t), SeqCst, SeqCst)
            .is_ok()
    }

    /// Unlinks every dead lock head of bucket `b`, killing the idle ones first if `kill`.
    pub(super) fn sweep_bucket(&self, g: &Guard<'_>, b: usize, kill: bool) {
        debug_assert!(g.group.is_none() || g.group == Some(b / self.per_group));
        let bucket = self.bucket(b);
        'restart: loop {
            let mut link = bucket;
            loop {
                let cur = unmarked(link.load(SeqCst));
                if cur.is_null() {
                    return;
                }
                // SAFETY: reached from the bucket while pinned: not freed before we unpin.
                let h = unsafe { &*cur };
                match self.unlink_dead(g, link, cur) {
                    Step::Next => {}
                    Step::Reload => continue,
                    Step::Restart => continue 'restart,
                }
                if kill && self.try_kill(h, b) {
                    continue; // unlink it
                }
                link = &h.next;
            }
        }
    }

    /// The live lock head of `id`, appended to its bucket with a CAS if `create` and missing.
    /// Must be pinned (the head stays allocated while the guard lives). Skips dead heads and
    /// helps unlink them. There is at most one live head per id: a new one is appended only
    /// by a traversal that reached the end of the bucket without seeing a live one, and a
    /// dead head never comes back to life.
    pub(super) fn find_head(
        &self,
        g: &Guard<'_>,
        id: &LockId,
        hash: u64,
        create: bool,
    ) -> Option<&LockHead> {
        let b = self.bucket_of(hash);
        debug_assert!(g.group.is_none() || g.group == Some(b / self.per_group));
        let bucket = self.bucket(b);
        let mut fresh: *mut LockHead = ptr::null_mut();
        'restart: loop {
            let mut link = bucket;
            loop {
                let raw = link.load(SeqCst);
                let cur = unmarked(raw);
                if cur.is_null() {
                    if !create {
                        return None;
                    }
                    if is_marked(raw) {
                        continue 'restart; // the last head is dead: nothing goes after it
                    }
                    if fresh.is_null() {
                        fresh = self.new_head(g, hash, id);
                    }
                    if link
                        .compare_exchange(ptr::null_mut(), fresh, SeqCst, SeqCst)
                        .is_ok()
                    {
                        g.count_head(true);
                        self.created_head(g);
                        // SAFETY: just published; freed only after being killed (it has no
                        // request yet, so it is not killed before its creator appends) and
                        // two epochs after being unlinked, and we are pinned.
                        return Some(unsafe { &*fresh });
                    }
                    continue; // someone appended: look at their head
                }
                // SAFETY: reached from the bucket while pinned: not freed before we unpin.
                let h = unsafe { &*cur };
                match self.unlink_dead(g, link, cur) {
                    Step::Next => {}
                    Step::Reload => continue,
                    Step::Restart => continue 'restart,
                }
                if h.hash == hash && h.id == *id {
                    if !fresh.is_null() {
                        // `fresh` was never published: back to the pool.
                        self.pool_head(g, g.local(), fresh);
                    }
                    return Some(h);
                }
                link = &h.next;
            }
        }
    }

    /// An unpublished lock head for `id`, owned by the caller: a reclaimed one from the slot's
    /// pool (its key buffer reused when the length matches), else a fresh allocation.
    pub(super) fn new_head(&self, g: &Guard<'_>, hash: u64, id: &LockId) -> *mut LockHead {
        let local = g.local();
        let Some(hp) = local.free_heads.pop() else {
            return Box::into_raw(Box::new(LockHead {
                hash,
                id: id.clone(),
                next: AtomicPtr::new(ptr::null_mut()),
                first: AtomicPtr::new(ptr::null_mut()),
                tail: AtomicPtr::new(ptr::null_mut()),
                tag: AtomicU64::new(0),
                poison: AtomicU32::new(0),
            }));
        };
        self.slots[g.slot]
            .heads_pooled
            .store(local.free_heads.len(), Relaxed);
        // SAFETY: a pooled head was reclaimed (no pinned operation can reach it) or never
        // published: this slot's occupant owns it exclusively.
        let h = unsafe { &mut *hp };
        h.hash = hash;
        match (&mut h.id, id) {
            (LockId::Key(t, k), LockId::Key(nt, nk)) if k.len() == nk.len() => {
                *t = *nt;
                k.copy_from_slice(nk);
            }
            (old, _) => *old = id.clone(),
        }
        h.next.store(ptr::null_mut(), SeqCst);
        h.first.store(ptr::null_mut(), SeqCst);
        h.tail.store(ptr::null_mut(), SeqCst);
        h.tag.store(0, SeqCst);
        hp
    }

    /// Keeps the unreachable lock head `hp` in the slot's pool for reuse, or frees it beyond
    /// [`Params::free_cap`]. `hp` came from `Box::into_raw` and is owned by the caller: never
    /// published, or reclaimed (no pinned operation can reach it).
    pub(super) fn pool_head(&self, g: &Guard<'_>, local: &mut SlotLocal, hp: *mut LockHead) {
        if local.free_heads.len() < self.params.free_cap {
            local.free_heads.push(hp);
            // Read only by `pooled_heads` (statistics): no ordering needed.
            self.slots[g.slot]
                .heads_pooled
                .store(local.free_heads.len(), Relaxed);
        } else {
            // SAFETY: the caller's guarantee above.
            drop(unsafe { Box::from_raw(hp) });
        }
    }

    /// Visits every lock head linked in a bucket, live or dead. Must be pinned (or own the
    /// table).
    pub(super) fn for_each_head(&self, mut f: impl FnMut(&LockHead)) {
        for b in self
            .groups
            .iter()
            .flat_map(|g| &g.buckets[..self.per_group])
        {
            let mut cur = unmarked(b.load(SeqCst));
            while !cur.is_null() {
                // SAFETY: reached from a bucket while pinned: not freed before we unpin.
                let h = unsafe { &*cur };
                h.check();
                f(h);
                cur = unmarked(h.next.load(SeqCst));
            }
        }
    }

    /// Appends `e` at the tail of `h`'s request list (Jung Fig. 4): CAS the tail, then link
    /// the old tail to `e`. Between the two steps the list is half-linked; `walk` waits.
    /// Fails (returns false, `e` stays unlinked) if `h` is dead: look the head up again.
    pub(super) fn append(&self, h: &LockHead, e: *mut Entry) -> bool {
        let mut step = 0;
        let old = loop {
            let t = h.tail.load(SeqCst);
            if is_marked(t) {
                return false;
            }
            if h.tail.compare_exchange(t, e, SeqCst, SeqCst).is_ok() {
                break t;
            }
            backoff(&mut step);
        };
        h.check();
        if old.is_null() {
            h.first.store(e, SeqCst);
        } else {
            // SAFETY: `old` is the previous tail; the last entry of a list is never unlinked,
            // so it is still allocated.
            unsafe { &*old }.next.store(e, SeqCst);
        }
        true
    }

    /// Visits the entries of `h` in list order until `f` returns false. Must be pinned. Waits
    /// for a half-linked tail to be linked (Jung Fig. 5), so every entry appended before the
    /// walk reached the end is visited.
    pub(super) fn walk(&self, h: &LockHead, mut f: impl FnMut(&Entry) -> bool) {
        h.check();
        let mut step = 0;
        let Some(mut cur) = first(h, &mut step) else {
            return; // empty
        };
        loop {
            // SAFETY: reached from the list while pinned: not recycled before we unpin.
            let e = unsafe { &*cur };
            debug_assert!(
                e.state.load(SeqCst) & POISON == 0,
                "reached a reclaimed entry"
            );
            if !f(e) {
                return;
            }
            let mut next = unmarked(e.next.load(SeqCst));
            debug_assert!(
                e.state.load(SeqCst) & POISON == 0,
                "an entry was reclaimed while a walk stood on it"
            );
            while next.is_null() {
                if unmarked(h.tail.load(SeqCst)) == cur {
                    return;
                }
                backoff(&mut step); // half-linked tail
                next = unmarked(e.next.load(SeqCst));
            }
            cur = next;
        }
    }

    /// Walks `h`'s list like [`walk`](Self::walk) (visiting every entry, `f` returns nothing)
    /// and unlinks the obsolete entries it passes, in the manner of Harris' list: an obsolete
    /// entry that is not the last one gets its `next` pointer marked (so nothing can be
    /// unlinked through it any more), then is unlinked with a CAS on its predecessor's
    /// unmarked link (or the list head) and retired by whoever's CAS succeeds. The last entry
    /// is never unlinked, so unlinking never races with an append (which only writes a null
    /// `next`). Jung §4.5 advances only the list head; this also cleans the middle.
    pub(super) fn walk_clean(&self, g: &Guard<'_>, h: &LockHead, mut f: impl FnMut(&Entry)) {
        h.check();
        let mut step = 0;
        let mut link: &AtomicPtr<Entry> = &h.first;
        let Some(mut cur) = first(h, &mut step) else {
            return; // empty
        };
        loop {
            // SAFETY: reached from the list while pinned: not recycled before we unpin.
            let e = unsafe { &*cur };
            let state = e.state.load(SeqCst);
            debug_assert!(state & POISON == 0, "reached a reclaimed entry");
            f(e);
            let mut raw = e.next.load(SeqCst);
            while raw.is_null() {
                if unmarked(h.tail.load(SeqCst)) == cur {
                    return;
                }
                backoff(&mut step); // half-linked tail
                raw = e.next.load(SeqCst);
            }
            let next = unmarked(raw);
            if state & OBSOLETE != 0 {
                // Freeze `next` by marking it (or find it marked, hence frozen). If the mark
                // fails, `next` was just changed (its successor was unlinked): leave `e` for a
                // later pass rather than relink a removed entry.
                let frozen = raw != next
                    || e.next
                        .compare_exchange(raw, marked(raw), SeqCst, SeqCst)
                        .is_ok();
                if frozen && link.compare_exchange(cur, next, SeqCst, SeqCst).is_ok() {
                    self.retire(g, cur, self.bucket_of(h.hash));
                    cur = next;
                    continue; // `link` now points to `next`
                }
            }
            link = &e.next;
            cur = next;
        }
    }

    /// The live entry of `txn` on `h`.
    pub(super) fn find_entry(&self, h: &LockHead, txn: TxnId) -> Option<*mut Entry> {
        let mut found = None;
        self.walk(h, |e| {
            if e.state.load(SeqCst) & OBSOLETE == 0 && e.txn.load(SeqCst) == txn {
                found = Some(e as *const Entry as *mut Entry);
                return false;
            }
            true
        });
        found
    }
}

/// The first entry of `h`'s list, waiting out a first append that is half done (the tail
/// is set, the head not yet); `None` when the list is empty.
fn first(h: &LockHead, step: &mut u32) -> Option<*mut Entry> {
    loop {
        let cur = h.first.load(SeqCst);
        if !cur.is_null() {
            return Some(cur);
        }
        if h.tail.load(SeqCst).is_null() {
            return None;
        }
        backoff(step); // first append half-done
    }
}
