//! The transaction side of Doppel (see [`crate::doppel`]) and the blind commutative
//! operations, which every concurrency control runs (as read-modify-writes outside Doppel's
//! split phases).

use std::ops::Bound;

use super::Transaction;
use crate::db::{Database, Table};
use crate::doppel::{worker_id, Delta, Entered, OrderedTuple};
use crate::error::{show_key, Error, Result};
use crate::lock::{LockMode, TableId};

pub(crate) use crate::doppel::OpClass;

/// A Doppel transaction's phase, split write set and statistics.
pub(crate) struct DopTxn {
    e: Entered,
    /// Split operations to fold into the slices at commit.
    sw: Vec<(TableId, Box<[u8]>, Delta)>,
    /// What the transaction did with which record (key hashes: no allocation), for the
    /// classification.
    ops: Vec<(TableId, u64, OpClass)>,
    /// The keys of `ops`, kept only by sampled transactions.
    keys: Vec<Box<[u8]>>,
    /// The record that failed this transaction's validation.
    conflict: Option<(TableId, Box<[u8]>)>,
}

impl DopTxn {
    pub(super) fn begin(db: &Database) -> Option<Box<DopTxn>> {
        let rt = db.inner.doppel()?;
        Some(Box::new(DopTxn {
            e: rt.enter(false),
            sw: Vec::new(),
            ops: Vec::new(),
            keys: Vec::new(),
            conflict: None,
        }))
    }
}

impl DopTxn {
    fn note(&mut self, table: TableId, key: &[u8], class: OpClass) {
        self.ops.push((table, crate::doppel::key_hash(key), class));
        if self.e.sampled {
            self.keys.push(key.into());
        }
    }
}

impl Transaction<'_> {
    /// Counts a non-blind access and stashes the transaction if it touches a split record.
    pub(super) fn dop_access(&mut self, slot: u16, key: &[u8], class: OpClass) -> Result<()> {
        let Some(d) = self.dop.as_deref_mut() else {
            return Ok(());
        };
        let table = self.tables[slot as usize].inner.id;
        d.note(table, key, class);
        if !d.e.split {
            return Ok(());
        }
        match d.e.split_op(table, key) {
            None => Ok(()),
            Some(op) => Err(self.dop_stash(format!("key {} is split for {op:?}", show_key(key)))),
        }
    }

    /// Stashes a scan over a range holding a split record.
    pub(super) fn dop_scan(&mut self, slot: u16, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Result<()> {
        let Some(d) = self.dop.as_deref() else {
            return Ok(());
        };
        if !d.e.split {
            return Ok(());
        }
        let table = self.tables[slot as usize].inner.id;
        if d.e.split_in_range(table, lo, hi) {
            return Err(self.dop_stash("a scanned range holds a split key".into()));
        }
        Ok(())
    }

    fn dop_stash(&mut self, detail: String) -> Error {
        let e = Error::Stashed {
            txn: self.id,
            detail,
        };
        self.failed = Some(e.to_string());
        if let Some(st) = self.occ.as_deref_mut() {
            st.clear();
        }
        if let (Some(rt), Some(d)) = (self.db.inner.doppel(), self.dop.as_deref_mut()) {
            d.sw.clear();
            rt.stash(d.e.epoch);
        }
        e
    }

    /// Remembers the record that failed validation (for the classification).
    pub(super) fn note_conflict(&mut self, slot: u16, key: &[u8]) {
        let table = self.tables[slot as usize].inner.id;
        if let Some(d) = self.dop.as_deref_mut() {
            d.conflict = Some((table, key.into()));
        }
    }

    pub(super) fn take_split_writes(&mut self) -> Vec<(TableId, Box<[u8]>, Delta)> {
        self.dop
            .as_deref_mut()
            .map(|d| std::mem::take(&mut d.sw))
            .unwrap_or_default()
    }

    pub(super) fn apply_split_writes(&mut self, sw: Vec<(TableId, Box<[u8]>, Delta)>) {
        if sw.is_empty() {
            return;
        }
        if let (Some(rt), Some(d)) = (self.db.inner.doppel(), self.dop.as_deref()) {
            rt.apply_slices(d.e.slot, sw);
        }
    }

    /// Leaves the phase (the transaction is over): records statistics.
    pub(super) fn dop_end(&mut self) {
        let Some(d) = self.dop.take() else { return };
        if let Some(rt) = self.db.inner.doppel() {
            rt.record(d.e.slot, &d.ops, &d.keys, d.e.sampled, d.conflict);
            rt.exit(d.e.slot);
        }
    }

    /// Applies a blind operation: to the split write set when the record is split for it in
    /// this split phase, otherwise as a read-modify-write under the current protocol.
    fn blind(&mut self, table: &Table, key: &[u8], delta: Delta) -> Result<()> {
        self.active()?;
        self.check_key(key)?;
        let slot = self.table_slot(table)?;
        if let Some(d) = self.dop.as_deref_mut() {
            let tid = self.tables[slot as usize].inner.id;
            let op = delta.op();
            if d.e.split {
                match d.e.split_op(tid, key) {
                    Some(sel) if sel == op => {
                        // A split operation cannot conflict: count it only when sampled.
                        if d.e.sampled {
                            d.note(tid, key, OpClass::Split(op));
                        }
                        d.sw.push((tid, key.into(), delta));
                        return Ok(());
                    }
                    Some(sel) => {
                        d.note(tid, key, OpClass::Split(op));
                        return Err(self.dop_stash(format!(
                            "key {} is split for {sel:?}, not {op:?}",
                            show_key(key)
                        )));
                    }
                    None => {}
                }
            }
            d.note(tid, key, OpClass::Split(op));
        }
        if self.occ.is_some() {
            let cur = self.occ_read(slot, key)?;
            let new = delta.apply(key, cur.as_deref(), false)?;
            self.check_value(&new)?;
            self.occ_buffer(slot, key, Some(new))?;
            return Ok(());
        }
        self.intent(slot, true)?;
        self.lock(self.key_id(slot, key), LockMode::XN)?;
        let max = self.db.inner.opts.max_value_len;
        self.modify(slot, key, |cur| {
            let v = delta.apply(key, cur, false)?;
            if v.len() > max {
                return Err(Error::ValueTooLarge { len: v.len(), max });
            }
            Ok(v)
        })
        .map(|_| ())
    }

    /// ADD(k, n) without a result (thesis §4.4): adds `n` to the 8-byte integer at `key` (a
    /// missing key counts as 0). Under [`ConcurrencyControl::Doppel`](crate::ConcurrencyControl::Doppel)
    /// it runs on a per-worker slice when `key` is split for ADD; under every other mode (and
    /// in joined phases) it is [`add_and_get`](Self::add_and_get) without the result. Overflow fails with
    /// [`Error::Overflow`], except on a split record, where the reconciled sum saturates at
    /// the `i64` bounds.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| tx.add(&t, "likes", 2))?;
    /// db.run(|tx| tx.add(&t, "likes", 3))?;
    /// assert_eq!(db.run(|tx| tx.get_i64(&t, "likes"))?, Some(5));
    /// # Ok(())
    /// # }
    /// ```
    pub fn add(&mut self, table: &Table, key: impl AsRef<[u8]>, n: i64) -> Result<()> {
        self.blind(table, key.as_ref(), Delta::Add(n))
    }

    /// MAX(k, n) without a result: stores the larger of the integer at `key` and `n` (a
    /// missing key takes `n`). Splittable like [`add`](Self::add).
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| { tx.max(&t, "hi", 4)?; tx.max(&t, "hi", 2) })?;
    /// assert_eq!(db.run(|tx| tx.get_i64(&t, "hi"))?, Some(4));
    /// # Ok(())
    /// # }
    /// ```
    pub fn max(&mut self, table: &Table, key: impl AsRef<[u8]>, n: i64) -> Result<()> {
        self.blind(table, key.as_ref(), Delta::Max(n))
    }

    /// MIN(k, n) without a result: stores the smaller of the integer at `key` and `n` (a
    /// missing key takes `n`). Splittable like [`add`](Self::add).
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| { tx.min(&t, "lo", 4)?; tx.min(&t, "lo", 2) })?;
    /// assert_eq!(db.run(|tx| tx.get_i64(&t, "lo"))?, Some(2));
    /// # Ok(())
    /// # }
    /// ```
    pub fn min(&mut self, table: &Table, key: impl AsRef<[u8]>, n: i64) -> Result<()> {
        self.blind(table, key.as_ref(), Delta::Min(n))
    }

    /// OPUT(k, o, x) (thesis §4.4): writes the ordered tuple `(order, worker_id(), value)` at
    /// `key` if it is larger, by `(order, writer)`, than the tuple there (any tuple beats an
    /// absent record). The writer is this thread's [`worker_id`](crate::doppel::worker_id).
    /// Splittable; read it back with [`get_tuple`](Self::get_tuple). Encoding: see
    /// [`crate::doppel`]'s `OrderedTuple`.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| { tx.oput(&t, "top_bid", 10, b"alice")?; tx.oput(&t, "top_bid", 7, b"bob") })?;
    /// let top = db.run(|tx| tx.get_tuple(&t, "top_bid"))?.unwrap();
    /// assert_eq!((top.order, &top.value[..]), (10, &b"alice"[..]));
    /// # Ok(())
    /// # }
    /// ```
    pub fn oput(
        &mut self,
        table: &Table,
        key: impl AsRef<[u8]>,
        order: i64,
        value: impl AsRef<[u8]>,
    ) -> Result<()> {
        let value = value.as_ref();
        self.check_value(value)?;
        let t = OrderedTuple {
            order,
            writer: worker_id(),
            value: value.to_vec(),
        };
        self.blind(table, key.as_ref(), Delta::Oput(t))
    }

    /// TOPKINSERT(k, o, x) (thesis §4.4): inserts `(order, worker_id(), value)` into the top-K
    /// set at `key` (created empty when absent), keeping one tuple per order (the highest
    /// writer id) and at most `k` tuples (dropping the smallest orders). `k` is part of the
    /// operation: a record split for `SplitOp::TopK(k)` stashes inserts with another `k`.
    /// Read it back with [`get_topk`](Self::get_topk). `k == 0` keeps nothing.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// db.run(|tx| {
    ///     for (o, v) in [(3, "c"), (1, "a"), (2, "b")] {
    ///         tx.topk_insert(&t, "recent", o, v, 2)?;
    ///     }
    ///     Ok(())
    /// })?;
    /// let set = db.run(|tx| tx.get_topk(&t, "recent"))?;
    /// let orders: Vec<i64> = set.iter().map(|e| e.order).collect();
    /// assert_eq!(orders, vec![3, 2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn topk_insert(
        &mut self,
        table: &Table,
        key: impl AsRef<[u8]>,
        order: i64,
        value: impl AsRef<[u8]>,
        k: u32,
    ) -> Result<()> {
        let value = value.as_ref();
        self.check_value(value)?;
        let t = OrderedTuple {
            order,
            writer: worker_id(),
            value: value.to_vec(),
        };
        self.blind(table, key.as_ref(), Delta::TopK(k, vec![t]))
    }

    /// Reads the ordered tuple at `key` (written by [`oput`](Self::oput)), or `None` when
    /// absent; [`Error::WrongType`] when the value is not a tuple. A read like
    /// [`get`](Self::get): stashed while `key` is split.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// assert_eq!(db.run(|tx| tx.get_tuple(&t, "none"))?, None);
    /// db.run(|tx| tx.put(&t, "bad", "x"))?;
    /// assert!(matches!(db.run(|tx| tx.get_tuple(&t, "bad")), Err(shoal::Error::WrongType { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn get_tuple(
        &mut self,
        table: &Table,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<OrderedTuple>> {
        let key = key.as_ref();
        self.get(table, key)?
            .map(|v| crate::doppel::decode_tuple_at(key, &v))
            .transpose()
    }

    /// Reads the top-K set at `key` (written by [`topk_insert`](Self::topk_insert)), largest
    /// order first; empty when absent; [`Error::WrongType`] when the value is not a set.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// assert!(db.run(|tx| tx.get_topk(&t, "none"))?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn get_topk(&mut self, table: &Table, key: impl AsRef<[u8]>) -> Result<Vec<OrderedTuple>> {
        let key = key.as_ref();
        match self.get(table, key)? {
            None => Ok(Vec::new()),
            Some(v) => crate::doppel::decode_topk_at(key, &v),
        }
    }
}
