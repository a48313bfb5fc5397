//! The undo list of a two-phase-locking transaction (and of `Serial` and `None`, which share
//! its path): the before-image and the after-image of every record it changed, newest last.
//!
//! The keys and values live in one byte buffer, the entries name ranges of it. A write copies
//! its key, the old value and the new one there (a few hundred bytes, usually in cache)
//! instead of allocating a key and a value of their own, and the buffer, emptied, serves the
//! thread's next transaction: a transaction's writes then allocate nothing for their undo.
//! The after-images make the commit record ([`UndoLog::redo`]) without a second descent of
//! the tree per written key.

use std::borrow::Borrow;
use std::cell::Cell;

use rustc_hash::FxHashSet;

use crate::db::Table;
use crate::storage::btree::Record;

/// Where one entry's bytes are in [`UndoLog::bytes`].
#[derive(Clone, Copy, Debug)]
struct Entry {
    table: u16,
    /// The record existed (live or ghost) before the write.
    existed: bool,
    ghost: bool,
    tid: u64,
    /// Start of the key; the before-image follows it, then the after-image.
    at: usize,
    klen: usize,
    vlen: usize,
    /// The write left a live record (else a ghost: a delete).
    live: bool,
    alen: usize,
}

/// A record's state before a write: `None` if it did not exist.
#[derive(Clone, Copy, Debug)]
pub(super) struct Before<'a> {
    pub(super) value: &'a [u8],
    pub(super) ghost: bool,
    pub(super) tid: u64,
}

impl<'a> Before<'a> {
    /// The before-image of `r`.
    pub(super) fn of(r: &'a Record) -> Before<'a> {
        Before {
            value: &r.value,
            ghost: r.ghost,
            tid: r.tid,
        }
    }
}

/// One key of a commit record: table slot, key, the value left (`None`: deleted).
pub(super) type Redo<'a> = (u16, &'a [u8], Option<&'a [u8]>);

/// The before-images of a transaction's writes, in write order.
#[derive(Default, Debug)]
pub(super) struct UndoLog {
    entries: Vec<Entry>,
    bytes: Vec<u8>,
    /// After-images are kept (the database has a log, so commit writes a record from them).
    /// Without a log they would only be copied and thrown away.
    redo: bool,
}

thread_local! {
    /// The undo list of this thread's last finished transaction, emptied, for the next one.
    static SPARE: Cell<UndoLog> = Cell::new(UndoLog::default());
}

/// Largest buffer (bytes) and entry list kept for the thread's next transaction.
const SPARE_BYTES: usize = 64 << 10;
const SPARE_ENTRIES: usize = 1024;

impl UndoLog {
    /// An empty list, reusing the thread's spare buffers; `redo`: keep after-images for
    /// [`UndoLog::redo`] (only a database with a log needs them).
    pub(super) fn new(redo: bool) -> UndoLog {
        // `try_with`: a thread being torn down starts from nothing.
        let mut u = SPARE.try_with(Cell::take).unwrap_or_default();
        u.redo = redo;
        u
    }

    /// Records the state of `table`'s `key` before a write, and the value it leaves (`None`:
    /// a ghost).
    pub(super) fn push(
        &mut self,
        table: u16,
        key: &[u8],
        before: Option<Before<'_>>,
        after: Option<&[u8]>,
    ) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(key);
        let (existed, ghost, tid, value) = match before {
            Some(b) => (true, b.ghost, b.tid, b.value),
            None => (false, false, 0, &[][..]),
        };
        self.bytes.extend_from_slice(value);
        let after_image = if self.redo {
            after.unwrap_or_default()
        } else {
            &[]
        };
        self.bytes.extend_from_slice(after_image);
        self.entries.push(Entry {
            table,
            existed,
            ghost,
            tid,
            at,
            klen: key.len(),
            vlen: value.len(),
            live: after.is_some(),
            alen: after_image.len(),
        });
    }

    /// Each written key once, in the order of its last write, with the value the
    /// transaction left it (`None`: deleted): the contents of the commit record.
    pub(super) fn redo(&self) -> Vec<Redo<'_>> {
        debug_assert!(self.redo, "an undo list made without after-images");
        let mut seen: FxHashSet<(u16, &[u8])> = FxHashSet::default();
        let mut last: Vec<Redo<'_>> = Vec::with_capacity(self.entries.len());
        // Newest first: the first entry met for a key holds its final value.
        for e in self.entries.iter().rev() {
            let key = self.key(e);
            if seen.insert((e.table, key)) {
                let a = e.at + e.klen + e.vlen;
                last.push((e.table, key, e.live.then(|| &self.bytes[a..a + e.alen])));
            }
        }
        // Back to the order of the writes.
        last.reverse();
        last
    }

    /// Number of writes listed.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// No write listed.
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every write (the buffers stay).
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.bytes.clear();
    }

    /// Empties the list and keeps its buffers for the thread's next transaction (unless they
    /// grew large).
    pub(super) fn recycle(mut self) {
        if self.bytes.capacity() <= SPARE_BYTES && self.entries.capacity() <= SPARE_ENTRIES {
            self.clear();
            // `try_with`: nothing to keep during thread teardown.
            let _ = SPARE.try_with(|s| s.set(self));
        }
    }

    fn key(&self, e: &Entry) -> &[u8] {
        &self.bytes[e.at..e.at + e.klen]
    }

    /// The `(table slot, key)` of every write, oldest first (a key written twice appears
    /// twice).
    #[cfg(test)]
    pub(super) fn keys(&self) -> impl Iterator<Item = (u16, &[u8])> + '_ {
        self.entries.iter().map(|e| (e.table, self.key(e)))
    }

    /// Puts back the before-image of every write, newest first, and empties the list; keys
    /// that did not exist become ghosts (listed in `ghosts` for removal).
    pub(super) fn undo(
        &mut self,
        tables: &[impl Borrow<Table>],
        ghosts: &mut Vec<(u16, Box<[u8]>)>,
    ) {
        for e in self.entries.iter().rev() {
            let table: &Table = tables[usize::from(e.table)].borrow();
            let key = &self.bytes[e.at..e.at + e.klen];
            let value = &self.bytes[e.at + e.klen..e.at + e.klen + e.vlen];
            let mut ghost = false;
            table.inner.tree.update(key, |rec| {
                if e.existed {
                    // A ghost this transaction had revived is a ghost again: its deleter's
                    // entry may have been dropped while the key was live, so list it here
                    // too.
                    ghost = e.ghost;
                    match rec {
                        Some(r) => {
                            r.value.clear();
                            r.value.extend_from_slice(value);
                            r.ghost = e.ghost;
                            r.tid = e.tid;
                        }
                        None => {
                            *rec = Some(Record {
                                value: value.to_vec(),
                                ghost: e.ghost,
                                tid: e.tid,
                            });
                        }
                    }
                } else if let Some(r) = rec.as_mut() {
                    r.ghost = true;
                    r.value.clear();
                    ghost = true;
                }
            });
            if ghost {
                ghosts.push((e.table, key.into()));
            }
        }
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_their_keys_and_before_images_apart() {
        let mut u = UndoLog::new(true);
        let r = Record {
            value: b"old".to_vec(),
            ghost: true,
            tid: 9,
        };
        u.push(3, b"k1", Some(Before::of(&r)), Some(b"new"));
        u.push(4, b"key-two", None, Some(b"v"));
        u.push(3, b"", Some(Before::of(&Record::default())), None);
        assert_eq!(u.len(), 3);
        let keys: Vec<_> = u.keys().collect();
        assert_eq!(
            keys,
            vec![(3, &b"k1"[..]), (4, &b"key-two"[..]), (3, &b""[..])]
        );
        // Each key once, in the order of its last write, with its last value.
        u.push(3, b"k1", Some(Before::of(&r)), Some(b"newer"));
        assert_eq!(
            u.redo(),
            vec![
                (4, &b"key-two"[..], Some(&b"v"[..])),
                (3, &b""[..], None),
                (3, &b"k1"[..], Some(&b"newer"[..])),
            ]
        );
        let e = u.entries[0];
        assert!(e.existed && e.ghost && e.tid == 9);
        assert_eq!(&u.bytes[e.at + e.klen..e.at + e.klen + e.vlen], b"old");
        assert!(!u.entries[1].existed);
        u.clear();
        assert!(u.is_empty() && u.keys().next().is_none());
    }

    #[test]
    fn without_a_log_no_after_image_is_copied_and_undo_still_restores() {
        let mut u = UndoLog::new(false);
        let r = Record {
            value: b"old".to_vec(),
            ghost: false,
            tid: 9,
        };
        u.push(
            3,
            b"k1",
            Some(Before::of(&r)),
            Some(b"a much longer new value"),
        );
        // Key and before-image only.
        assert_eq!(u.bytes, b"k1old");
        let e = u.entries[0];
        assert!(e.live && e.existed && e.alen == 0);
        assert_eq!(&u.bytes[e.at + e.klen..e.at + e.klen + e.vlen], b"old");
    }
}
