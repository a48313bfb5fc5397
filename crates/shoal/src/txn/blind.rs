//! The blind commutative operations (Doppel thesis §4.4) and the reads of their values.
//! Every protocol runs them, as read-modify-writes; Doppel runs them on per-worker slices
//! when the record is split for the operation (see [`crate::doppel`] and `txn::doppel`).

use super::{dispatch, Cc, Protocol, Transaction};
use crate::db::Table;
use crate::doppel::{worker_id, Delta, OrderedTuple};
use crate::error::Result;

impl Transaction<'_> {
    /// Applies a blind operation: to the split write set when the record is split for it in
    /// this split phase, otherwise as a read-modify-write under the current protocol.
    fn blind(&mut self, table: &Table, key: &[u8], delta: Delta) -> Result<()> {
        let slot = self.open_write(table, key)?;
        // What it may add (a tuple's payload, a top-K entry) counts against the memory
        // limit by the pages it will take, as `put`'s value does. (A top-K set that this
        // entry pushes past the inline limit moves to an overflow page this does not count:
        // at most one page past the limit, and the next write sees it.)
        let adding = crate::storage::stored_len(delta.encoded_len());
        self.check_room(table, key.len() + adding)?;
        dispatch!(&mut self.cc, p => p.blind(&mut self.cx, slot, key, delta))
    }

    /// ADD(k, n) without a result (thesis §4.4): adds `n` to the 8-byte integer at `key` (a
    /// missing key counts as 0). Under [`ConcurrencyControl::Doppel`](crate::ConcurrencyControl::Doppel)
    /// it runs on a per-worker slice when `key` is split for ADD; under every other mode (and
    /// in joined phases) it is [`add_and_get`](Self::add_and_get) without the result. Overflow fails with
    /// [`Error::Overflow`](crate::Error::Overflow), except on a split record: there the split phase's
    /// additions are summed exactly, and the record's value plus that sum is clamped to the
    /// `i64` bounds once, when the phase ends (recovery replays them the same way).
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
        self.blind(table, key.as_ref(), Delta::Add(n.into()))
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
        let t = self.own_tuple(order, value.as_ref())?;
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
        let t = self.own_tuple(order, value.as_ref())?;
        self.blind(table, key.as_ref(), Delta::TopK(k, vec![t]))
    }

    /// The tuple `(order, worker_id(), value)` that OPUT and TOPKINSERT write, after the
    /// value length check.
    fn own_tuple(&self, order: i64, value: &[u8]) -> Result<OrderedTuple> {
        self.cx.check_value(value)?;
        Ok(OrderedTuple {
            order,
            writer: worker_id(),
            value: value.to_vec(),
        })
    }

    /// Reads the ordered tuple at `key` (written by [`oput`](Self::oput)), or `None` when
    /// absent; [`Error::WrongType`](crate::Error::WrongType) when the value is not a tuple. A read like
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
    /// order first; empty when absent; [`Error::WrongType`](crate::Error::WrongType) when the value is not a set.
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
