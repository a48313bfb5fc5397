//! Deadlock handling of the latch-free lock table (Jung et al. 2013 §3.3): the registry of
//! waiting entries, the blockers of a waiting entry read off its lock's list (the same rule
//! as granting), the latch-free waits-for search of [`DeadlockPolicy::WaitForGraph`], and the
//! wake-ups the shared policies (`lock::deadlock`) ask for.

use super::*;

/// Bound on the transactions the deadlock search visits from one request.
pub(super) const DEADLOCK_BUDGET: u32 = 256;
/// Bound on the length of a waits-for path the deadlock search follows.
pub(super) const DEADLOCK_DEPTH: usize = 32;

impl LatchFreeLockTable {
    // ---- deadlock detection ----

    pub(super) fn register_waiter(&self, txn: TxnId, e: *mut Entry) -> Option<usize> {
        let n = self.waiting.len();
        let start = (txn as usize).wrapping_mul(0x9E37_79B9) % n;
        (0..n).map(|i| (start + i) % n).find(|&i| {
            self.waiting[i]
                .compare_exchange(ptr::null_mut(), e, SeqCst, SeqCst)
                .is_ok()
        })
    }

    /// The waiting entry of `txn`, if registered. Must be pinned.
    pub(super) fn waiting_entry(&self, txn: TxnId) -> Option<&Entry> {
        let n = self.waiting.len();
        let start = (txn as usize).wrapping_mul(0x9E37_79B9) % n;
        (0..n).find_map(|i| {
            let p = self.waiting[(start + i) % n].load(SeqCst);
            if p.is_null() {
                return None;
            }
            // SAFETY: a registered entry is live; it is unregistered before it can become
            // obsolete, and it is not recycled while we are pinned.
            let e = unsafe { &*p };
            (e.txn.load(SeqCst) == txn).then_some(e)
        })
    }

    /// The transactions blocking the waiting entry `e` (empty if it does not wait).
    pub(super) fn blockers(&self, e: &Entry) -> Vec<TxnId> {
        let mut out = Vec::new();
        self.for_each_blocker(e, |o| out.push(o.txn.load(SeqCst)));
        out
    }

    /// The transactions blocking the waiting entry `e`, with the ages and pipeline lengths
    /// their entries recorded, for the shared policies' decisions.
    pub(super) fn blocker_set(&self, e: &Entry, out: &mut Vec<Blocker>) {
        out.clear();
        self.for_each_blocker(e, |o| {
            out.push(Blocker {
                txn: o.txn.load(SeqCst),
                age: o.age.load(SeqCst),
                pipe: o.pipe.load(SeqCst),
                fp: o.fp.load(SeqCst),
            })
        });
    }

    /// Calls `f` with each live entry blocking the waiting entry `e` (none if it does not
    /// wait): Kimura's rule, as in `evaluate`. Must be pinned where `e`'s lock head is.
    pub(super) fn for_each_blocker(&self, e: &Entry, mut f: impl FnMut(&Entry)) {
        let s = e.state.load(SeqCst);
        if s & WAITING == 0 || s & OBSOLETE != 0 {
            return;
        }
        let (target, new) = (requested_of(s), granted_of(s) == LockMode::N);
        // SAFETY: `e` was live (not obsolete) when its state was read above, and we were
        // pinned then: a lock head with a live entry is not killed, so it is retired (if ever)
        // after that read and stays allocated while we are pinned.
        let h = unsafe { &*e.head.load(SeqCst) };
        let mut ahead = true;
        self.walk(h, |o| {
            if ptr::eq(o, e) {
                ahead = false;
                return true;
            }
            let so = o.state.load(SeqCst);
            if so & OBSOLETE == 0
                && (!granted_of(so).compatible(target)
                    || (new && ahead && so & WAITING != 0 && !requested_of(so).compatible(target)))
            {
                f(o);
            }
            true
        });
    }

    /// Wakes `txn` if it waits (registered): a policy decided it should decide again now.
    pub(super) fn wake_txn(&self, txn: TxnId) {
        // The registry reaches other groups' lock heads' entries.
        let _all = self.enter_all();
        if let Some(e) = self.waiting_entry(txn) {
            e.unpark();
        }
    }

    /// Searches the waits-for relation from `me`'s waiting entry through the lock lists and
    /// the waiting registry (bounded). On a cycle on which `me` is the youngest (largest id)
    /// transaction, returns the transaction `me` waits for on it: `me` is the victim. On a
    /// cycle with a younger member, unparks that member so that it runs its own search at
    /// once and aborts itself.
    pub(super) fn deadlock_victim(&self, me: TxnId, e: &Entry) -> Option<TxnId> {
        // The search reaches other groups' lock heads (through the waiting registry).
        let _all = self.enter_all();
        let mut budget = DEADLOCK_BUDGET;
        let mut visited = Vec::new();
        let mut path = Vec::new();
        let mut youngest = Vec::new();
        let victim = self.dfs(me, e, &mut path, &mut visited, &mut budget, &mut youngest);
        if victim.is_none() {
            for y in youngest {
                if let Some(ye) = self.waiting_entry(y) {
                    ye.unpark();
                }
            }
        }
        victim
    }

    pub(super) fn dfs(
        &self,
        me: TxnId,
        e: &Entry,
        path: &mut Vec<TxnId>,
        visited: &mut Vec<TxnId>,
        budget: &mut u32,
        youngest: &mut Vec<TxnId>,
    ) -> Option<TxnId> {
        for b in self.blockers(e) {
            if b == me {
                match path.iter().max() {
                    Some(&y) if y > me => {
                        if !youngest.contains(&y) {
                            youngest.push(y);
                        }
                    }
                    _ => return Some(*path.first().unwrap_or(&me)),
                }
                continue;
            }
            if visited.contains(&b) || path.len() >= DEADLOCK_DEPTH || *budget == 0 {
                continue;
            }
            visited.push(b);
            *budget -= 1;
            if let Some(be) = self.waiting_entry(b) {
                path.push(b);
                let r = self.dfs(me, be, path, visited, budget, youngest);
                path.pop();
                if r.is_some() {
                    return r;
                }
            }
        }
        None
    }
}
