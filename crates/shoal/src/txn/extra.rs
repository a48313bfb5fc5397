//! Table-level locks and read-modify-write of whole values.
//!
//! [`Transaction::lock_table`] and [`Transaction::lock_database`] take a coarse lock on a table
//! or on the whole database and nothing else, through the same path as the intent locks that
//! every operation takes (lightweight intent locks or the lock table, per
//! [`Options::intent_locks`](crate::Options)). They serve scans and bulk changes that want one
//! absolute lock instead of many key locks, and benchmarks of the intent-lock machinery itself
//! (Kimura et al. 2012, Fig. 4). [`Transaction::update`] rewrites a value from its current
//! contents under one exclusive key lock (no shared-to-exclusive conversion).

use super::{dispatch, Cc, Protocol, Transaction};
use crate::db::Table;
use crate::error::{Error, Result};
use crate::lock::{LockId, LockMode};

/// The database intent that must accompany `mode` on a table (Table 4: IS under IS and S, IX
/// under IX, SIX and X).
fn parent_intent(mode: LockMode) -> LockMode {
    match mode {
        LockMode::IS | LockMode::S => LockMode::IS,
        _ => LockMode::IX,
    }
}

fn check_coarse(mode: LockMode) -> Result<()> {
    match mode {
        LockMode::IS | LockMode::IX | LockMode::S | LockMode::X => Ok(()),
        LockMode::SIX => Ok(()),
        m => Err(Error::Unsupported(format!(
            "{m:?} is a key-range mode; tables and the database take IS, IX, S, SIX or X"
        ))),
    }
}

impl Transaction<'_> {
    /// Takes `mode` (IS, IX, S, SIX or X) on `table` until the transaction ends, with the
    /// matching intent lock on the database (IS for IS and S, IX otherwise), and no key lock.
    /// An absolute lock (S, SIX or X) waits for transactions holding conflicting intent locks
    /// (that is, for writers or readers of the table) and blocks later ones. Under optimistic
    /// or serial concurrency control it does nothing.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::lock::LockMode;
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// let mut a = db.begin();
    /// a.lock_table(&t, LockMode::IX)?;
    /// let mut b = db.begin();
    /// b.lock_table(&t, LockMode::IS)?; // intents are compatible
    /// b.commit()?;
    /// a.commit()?;
    /// db.run(|tx| tx.lock_table(&t, LockMode::X))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_table(&mut self, table: &Table, mode: LockMode) -> Result<()> {
        self.cx.active()?;
        check_coarse(mode)?;
        // No slot in `self.tables`: a coarse lock needs only the id (and the handle's
        // reference count is a cache line every thread using the table would write).
        self.cx.check_table(table)?;
        let tid = table.inner.id;
        let locks = [
            (0, LockId::Database, parent_intent(mode)),
            (tid, LockId::Table(tid), mode),
        ];
        dispatch!(&mut self.cc, p => p.lock_coarse(&mut self.cx, &locks))
    }

    /// Takes `mode` (IS, IX, S, SIX or X) on the whole database until the transaction ends.
    /// Under optimistic or serial concurrency control it does nothing.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::lock::LockMode;
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| {
    ///     tx.lock_database(LockMode::X)?; // no one else runs until this commits
    ///     tx.put(&t, "k", "v")
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_database(&mut self, mode: LockMode) -> Result<()> {
        self.cx.active()?;
        check_coarse(mode)?;
        let locks = [(0, LockId::Database, mode)];
        dispatch!(&mut self.cc, p => p.lock_coarse(&mut self.cx, &locks))
    }

    /// Replaces the value of `key` with `f(current value)` (`None` when the key is absent,
    /// which `update` then creates), under one exclusive key lock held to commit; returns the
    /// new value's length. Unlike [`get`](Self::get) followed by [`put`](Self::put) it never
    /// converts a shared lock to an exclusive one, so two concurrent read-modify-writes of one
    /// key queue instead of deadlocking.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| tx.put(&t, "k", "ab"))?;
    /// db.run(|tx| tx.update(&t, "k", |cur| [cur.unwrap_or_default(), b"c"].concat()))?;
    /// assert_eq!(db.run(|tx| tx.get(&t, "k"))?, Some(b"abc".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn update(
        &mut self,
        table: &Table,
        key: impl AsRef<[u8]>,
        mut f: impl FnMut(Option<&[u8]>) -> Vec<u8>,
    ) -> Result<usize> {
        let key = key.as_ref();
        let slot = self.open_write(table, key)?;
        let inner = self.cx.inner();
        let max = inner.opts.max_value_len;
        let pending = self.pending_bytes();
        let f = |cur: Option<&[u8]>| {
            let v = f(cur);
            if v.len() > max {
                return Err(Error::ValueTooLarge { len: v.len(), max });
            }
            // The new value counts against the memory limit, as `put`'s does.
            let stored = crate::storage::stored_len(v.len());
            super::room(inner, table, pending, key.len() + stored)?;
            Ok(v)
        };
        dispatch!(&mut self.cc, p => p.update(&mut self.cx, slot, key, f))
    }
}
