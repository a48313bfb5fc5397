//! The operations of the workloads that both paths of `shoal bench` run (TPC-B, INCR1):
//! [`TxOps`], a transaction's row operations, and [`Scan`], the consistency check's reads,
//! each implemented by shoal (a [`Transaction`] and a [`Database`]: the shoal-native path,
//! called directly, so generic workload code costs nothing there) and by the engine-neutral
//! interface (a [`KvTx`] and a [`KvEngine`]: the portable path, `--engine`). A workload's
//! transaction body and check written once against them run unchanged on every engine.

use std::ops::Bound;

use anyhow::Context;
use shoal::{Database, Table, Transaction};

use crate::engines::{decode_i64, KvEngine, KvTx, TableId, TxError};

/// A transaction's row operations, over the path's table handles and errors.
pub trait TxOps {
    /// A table handle.
    type Table;
    /// An operation's error.
    type Error;

    /// Adds `delta` to an integer row and returns the new value.
    fn add_and_get(
        &mut self,
        table: &Self::Table,
        key: &[u8],
        delta: i64,
    ) -> Result<i64, Self::Error>;

    /// Reads an integer row.
    fn get_i64(&mut self, table: &Self::Table, key: &[u8]) -> Result<Option<i64>, Self::Error>;

    /// Writes a new row (its key must not exist).
    fn insert(&mut self, table: &Self::Table, key: &[u8], value: &[u8]) -> Result<(), Self::Error>;
}

impl TxOps for Transaction<'_> {
    type Table = Table;
    type Error = shoal::Error;

    fn add_and_get(&mut self, table: &Table, key: &[u8], delta: i64) -> shoal::Result<i64> {
        Transaction::add_and_get(self, table, key, delta)
    }

    fn get_i64(&mut self, table: &Table, key: &[u8]) -> shoal::Result<Option<i64>> {
        Transaction::get_i64(self, table, key)
    }

    fn insert(&mut self, table: &Table, key: &[u8], value: &[u8]) -> shoal::Result<()> {
        Transaction::insert(self, table, key, value)
    }
}

impl TxOps for dyn KvTx + '_ {
    type Table = TableId;
    type Error = TxError;

    fn add_and_get(&mut self, table: &TableId, key: &[u8], delta: i64) -> Result<i64, TxError> {
        KvTx::add(self, *table, key, delta)
    }

    fn get_i64(&mut self, table: &TableId, key: &[u8]) -> Result<Option<i64>, TxError> {
        self.get(*table, key)?.map(|v| decode_i64(&v)).transpose()
    }

    fn insert(&mut self, table: &TableId, key: &[u8], value: &[u8]) -> Result<(), TxError> {
        KvTx::insert(self, *table, key, value)
    }
}

/// What a consistency check does with each row it reads (key, value).
pub type RowFn<'a> = dyn FnMut(&[u8], &[u8]) -> anyhow::Result<()> + 'a;

/// What a consistency check reads: every row of a table, in key order, on a quiescent
/// database.
pub trait Scan {
    /// A table handle.
    type Table;

    /// Calls `f` on every row of `table` in key order. The ascending keys `bounds` split the
    /// table into pieces `(.., b0)`, `[b0, b1)`, ..., `[bn, ..)` that the engine may read in
    /// transactions of their own (shoal does, so no check transaction grows without bound;
    /// the engine-neutral interface reads the table whole).
    fn scan_rows(
        &self,
        table: &Self::Table,
        name: &str,
        bounds: &[Vec<u8>],
        f: &mut RowFn<'_>,
    ) -> anyhow::Result<()>;
}

/// Rows as an engine returns them: (key, value) pairs.
type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// A table's rows as an engine read them (or its error), handed to `f` one by one.
fn each<E: Into<anyhow::Error>>(
    rows: Result<Rows, E>,
    name: &str,
    f: &mut RowFn<'_>,
) -> anyhow::Result<()> {
    let rows = rows
        .map_err(Into::into)
        .with_context(|| format!("scanning table {name}"))?;
    rows.iter().try_for_each(|(k, v)| f(k, v))
}

/// Calls `f` on every row of the table `name`, read as [`Scan::scan_rows`] reads it (in one
/// piece); an error unless it holds `rows` rows.
pub fn scan_counted<S: Scan + ?Sized>(
    store: &S,
    table: &S::Table,
    name: &str,
    rows: u64,
    f: &mut RowFn<'_>,
) -> anyhow::Result<()> {
    let mut seen = 0u64;
    store.scan_rows(table, name, &[], &mut |k, v| {
        seen += 1;
        f(k, v)
    })?;
    anyhow::ensure!(seen == rows, "{name} has {seen} rows, expected {rows}");
    Ok(())
}

impl Scan for Database {
    type Table = Table;

    fn scan_rows(
        &self,
        table: &Table,
        name: &str,
        bounds: &[Vec<u8>],
        f: &mut RowFn<'_>,
    ) -> anyhow::Result<()> {
        for i in 0..=bounds.len() {
            let lo = match i.checked_sub(1).and_then(|j| bounds.get(j)) {
                Some(b) => Bound::Included(b.as_slice()),
                None => Bound::Unbounded,
            };
            let hi = match bounds.get(i) {
                Some(b) => Bound::Excluded(b.as_slice()),
                None => Bound::Unbounded,
            };
            each(self.run(|tx| tx.scan(table, (lo, hi))), name, f)?;
        }
        Ok(())
    }
}

impl Scan for dyn KvEngine + '_ {
    type Table = TableId;

    fn scan_rows(
        &self,
        table: &TableId,
        name: &str,
        _bounds: &[Vec<u8>],
        f: &mut RowFn<'_>,
    ) -> anyhow::Result<()> {
        each(self.scan_all(*table), name, f)
    }
}
