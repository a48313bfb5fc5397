//! The transaction operations of the workloads that both paths of `shoal bench` run (TPC-B,
//! INCR1): [`TxOps`], implemented by a shoal [`Transaction`] (the shoal-native path, called
//! directly, so generic workload code costs nothing there) and by the engine-neutral
//! [`KvTx`] (the portable path, `--engine`). A workload's transaction body written once
//! against it runs unchanged on every engine.

use shoal::{Table, Transaction};

use crate::engines::{decode_i64, KvTx, TableId, TxError};

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
