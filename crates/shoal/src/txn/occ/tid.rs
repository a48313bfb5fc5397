//! TID words (Silo §4.2): the lock bit, reading a record with its TID, taking and giving up
//! a committer's lock bits, and validating what a transaction read. The word is written only
//! under the leaf's exclusive latch and read in one version-validated copy of the leaf
//! (optimistic lock coupling), which makes the page version Silo's atomic word.

use std::time::{Duration, Instant};

use super::{OccState, Seen, WriteEntry};
use crate::db::Table;
use crate::error::show_key;
use crate::storage::btree::{BTree, LeafHint, Record};
use crate::storage::page::INLINE_VALUE;
use crate::txn::as_ref_bound;

/// The lock bit of a TID word.
pub(crate) const LOCK_BIT: u64 = 1 << 63;

/// How long a reader or committer waits for another committer's lock bit before it aborts.
const LOCK_WAIT: Duration = Duration::from_millis(5);

/// Bounded waiting for a lock bit: a few spins, then yields until [`LOCK_WAIT`] has passed.
pub(super) struct Spin {
    n: u32,
    start: Option<Instant>,
}

impl Spin {
    pub(super) fn new() -> Self {
        Spin { n: 0, start: None }
    }

    /// Waits a little; false once the wait is over.
    pub(super) fn wait(&mut self) -> bool {
        self.n += 1;
        if self.n < 64 {
            std::hint::spin_loop();
            return true;
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        if start.elapsed() > LOCK_WAIT {
            return false;
        }
        std::thread::yield_now();
        true
    }
}

pub(super) fn locked(tid: u64) -> bool {
    tid & LOCK_BIT != 0
}

/// What a read found: what to record and whether the key is live (its value then in the
/// caller's buffer); `None` while the record is locked.
pub(super) type Found = Option<(Seen, bool)>;

/// Value and TID of `key` in one version-validated copy of its leaf; `None` while a committer holds
/// the record's lock bit. Also the hint of the leaf (tried first when `hint` is given). A live
/// value goes to `out` by trading buffers with the tree's copy (no second copy); `out` is
/// left as it was otherwise.
pub(super) fn read_once(
    tree: &BTree,
    key: &[u8],
    hint: Option<LeafHint>,
    out: &mut Vec<u8>,
) -> (Found, LeafHint) {
    tree.get_hinted_mut(key, hint, |rec| match rec {
        None => Some((Seen::Absent, false)),
        Some(r) if locked(r.tid) => None,
        Some(r) => {
            if !r.ghost {
                std::mem::swap(&mut r.value, out);
            }
            Some((Seen::Tid(r.tid), !r.ghost))
        }
    })
}

/// The committed live value of `key`, waiting (without a time limit) while a committer holds
/// its lock bit. Used by checkpoints: a commit whose log record is below the checkpoint's LSN
/// has installed its values by the time it unlocks them.
pub(crate) fn read_committed(tree: &BTree, key: &[u8]) -> Option<Vec<u8>> {
    let mut n = 0u32;
    let mut hint = None;
    loop {
        let mut v = Vec::new();
        let (got, h) = read_once(tree, key, hint, &mut v);
        if let Some((_, live)) = got {
            return live.then_some(v);
        }
        hint = Some(h);
        n += 1;
        if n < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

pub(super) fn table_of<'t>(tables: &[&'t Table], slot: u16) -> &'t Table {
    tables[slot as usize]
}

/// Takes the lock bit of `key` for `w`; false if another committer holds it.
pub(super) fn lock_one(tree: &BTree, key: &[u8], w: &mut WriteEntry) -> bool {
    let (ok, hint) = tree.update_hinted(key, w.hint, |slot| match slot {
        None => {
            // The placeholder takes the room of the value it will get at install (zeros:
            // a locked ghost's bytes are never read). Empty, it would grow at install, and
            // a leaf packed with empty placeholders would split in the middle as each one
            // grew: TPC-C's order lines, inserted ten at a time at the end of a district's
            // run, filled their pages to two thirds instead of as full as 2PL's. A value
            // too long for its leaf gets no more room than fits inline.
            *slot = Some(Record {
                value: vec![0; w.value.as_ref().map_or(0, Vec::len).min(INLINE_VALUE)],
                ghost: true,
                tid: LOCK_BIT,
            });
            w.created = true;
            w.old_tid = 0;
            w.locked = true;
            true
        }
        Some(r) if locked(r.tid) => false,
        Some(r) => {
            w.old_tid = r.tid;
            r.tid |= LOCK_BIT;
            w.created = false;
            w.locked = true;
            true
        }
    });
    w.hint = Some(hint);
    ok
}

/// Gives up the lock bit of `key` without installing: a placeholder goes away.
fn unlock_one(tree: &BTree, key: &[u8], w: &mut WriteEntry) {
    if !w.locked {
        return;
    }
    let created = w.created;
    tree.update_hinted(key, w.hint, |slot| {
        if created {
            *slot = None;
        } else if let Some(r) = slot {
            r.tid &= !LOCK_BIT;
        }
    });
    w.locked = false;
    w.created = false;
}

pub(super) fn unlock_all(tables: &[&Table], st: &mut OccState) {
    for m in st.writes.values_mut() {
        for (key, w) in m.iter_mut() {
            unlock_one(&table_of(tables, w.slot).inner.tree, key, w);
        }
    }
}

/// What failed validation: a description and the key (slot, key) it names.
pub(super) type Failure = (String, (u16, Box<[u8]>));

/// True when a read that saw `seen` still holds for the record now in the tree, given our
/// own write entry for the key (if any).
fn unchanged(seen: Seen, rec: Option<&Record>, ours: Option<&WriteEntry>) -> bool {
    match (seen, rec) {
        (Seen::Absent, None) => true,
        (Seen::Absent, Some(_)) => ours.is_some_and(|w| w.created),
        (Seen::Tid(tid), Some(rec)) => {
            rec.tid & !LOCK_BIT == tid && (!locked(rec.tid) || ours.is_some_and(|w| w.locked))
        }
        (Seen::Tid(_), None) => false,
    }
}

/// Checks the read set and the scan sets; describes the first failure.
pub(super) fn validate(tables: &[&Table], st: &OccState) -> std::result::Result<(), Failure> {
    for r in &st.reads {
        let t = table_of(tables, r.slot);
        let ours = st.own(t.inner.id, &r.key);
        let ok = match ours {
            // We hold the key's lock bit, so its record is as `lock_one` left it: nobody
            // else changes a locked record, and Doppel reconciles only while no transaction
            // runs. That is our placeholder (`created`, `old_tid` 0) or the record it found,
            // with TID `old_tid` and our lock bit. The tree test below would therefore give
            // (Absent, placeholder) -> true, (Absent, record) -> false, (Tid(t), either) ->
            // t == old_tid (a placeholder has TID 0 = old_tid; our own lock bit is allowed).
            // So compare without the tree.
            Some(w) if w.locked => {
                let ok = match r.seen {
                    Seen::Absent => w.created,
                    Seen::Tid(tid) => tid == w.old_tid,
                };
                debug_assert_eq!(
                    ok,
                    t.inner.tree.get(&r.key, |rec| unchanged(r.seen, rec, ours)),
                    "a locked record changed under its lock bit"
                );
                ok
            }
            // The leaf has not been latched since the read: the record (or its absence) is
            // as the read saw it, unlocked (`read_once` records no locked record), so the
            // tree test below would say `true`. One version check instead of a search.
            _ if t.inner.tree.unchanged_since(r.hint) => true,
            _ => {
                let tree = &t.inner.tree;
                tree.get_hinted(&r.key, Some(r.hint), |rec| unchanged(r.seen, rec, ours))
                    .0
            }
        };
        if !ok {
            return Err((
                format!(
                    "key {} of table {:?} changed after it was read",
                    show_key(&r.key),
                    t.inner.name
                ),
                (r.slot, r.key.clone()),
            ));
        }
    }
    for s in &st.scans {
        let t = table_of(tables, s.slot);
        // No leaf the scan read has been latched since: every entry is as it saw it (none
        // locked: the scan retried until none was), and no key entered the range, so the
        // comparison below would pass. A leaf that changed, even by our own lock bits,
        // sends the scan to the full comparison.
        if !s.leaves.is_empty() && s.leaves.iter().all(|h| t.inner.tree.unchanged_since(*h)) {
            continue;
        }
        let now = t
            .inner
            .tree
            .range(as_ref_bound(&s.lo), as_ref_bound(&s.hi), usize::MAX);
        let mut seen = s.seen.iter();
        let changed = |k: &[u8]| {
            Err((
                format!(
                    "a scan of table {:?} saw key {} change or appear (phantom)",
                    t.inner.name,
                    show_key(k)
                ),
                (s.slot, k.into()),
            ))
        };
        for (k, rec) in &now {
            let ours = st.own(t.inner.id, k);
            if ours.is_some_and(|w| w.created) {
                continue; // our own placeholder: the key was absent for the scan too
            }
            if locked(rec.tid) && !ours.is_some_and(|w| w.locked) {
                return changed(k);
            }
            match seen.next() {
                Some((sk, tid)) if sk[..] == k[..] && *tid == rec.tid & !LOCK_BIT => {}
                _ => return changed(k),
            }
        }
        if let Some((k, _)) = seen.next() {
            return changed(k);
        }
    }
    Ok(())
}

/// Replaces the record of `key` with `f(live value)` as a committed write would, unless `f`
/// gives `None`: Doppel's reconciliation of split operations (while no transaction runs, so
/// no lock bit is set). The new TID is one above the record's, so a transaction that read
/// the record before sees it change.
pub(crate) fn install_reconciled(
    tree: &BTree,
    key: &[u8],
    f: impl FnOnce(Option<&[u8]>) -> Option<Vec<u8>>,
) {
    tree.update(key, |rec| {
        let (cur, tid) = match rec {
            Some(r) if !r.ghost => (Some(&r.value[..]), r.tid),
            Some(r) => (None, r.tid),
            None => (None, 0),
        };
        if let Some(value) = f(cur) {
            *rec = Some(Record {
                value,
                ghost: false,
                tid: ((tid & !LOCK_BIT) + 1) & !LOCK_BIT,
            });
        }
    });
}
