//! Doppel's side of the database: the split hints and counters of the public API, and the
//! narrow handle the coordinator works through ([`Store`]: the records of the tables and the
//! log, nothing else of the database).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Database, DbInner, Table};
use crate::doppel::{Doppel, DoppelStats, Fold, SplitOp, Store};
use crate::error::{Error, Result};
use crate::lock::TableId;
use crate::log::record::{LogRecord, Write as LogWrite};

impl DbInner {
    /// Logs (durably) the recovered values of `keys`, whose split ADDs recovery replayed
    /// with no reconciliation after them (see `recovery::ExactAdds`): an after-image ends
    /// their phase in the log, as the reconciliation record would have.
    pub(super) fn log_recovered_adds(&self, keys: Vec<(TableId, Vec<u8>)>) -> Result<()> {
        let Some(log) = &self.log else {
            return Ok(());
        };
        let writes = keys
            .into_iter()
            .map(|(t, k)| {
                let value = self.live_value(t, &k).flatten();
                LogWrite {
                    table: t,
                    key: k,
                    value,
                }
            })
            .collect();
        if let Some(end) = self.log_in_records(writes)? {
            log.wait_durable(end)?;
        }
        Ok(())
    }

    /// Logs `writes` as commit records of their own (after-images of keys whose values the
    /// log's earlier records already decide), as many as the record limit needs; returns
    /// the end of the last one.
    fn log_in_records(&self, writes: Vec<LogWrite>) -> Result<Option<u64>> {
        let Some(log) = &self.log else {
            return Ok(None);
        };
        let mut end = None;
        let mut chunk = Vec::new();
        let mut bytes = 0u64;
        let mut flush = |chunk: &mut Vec<LogWrite>| -> Result<()> {
            if !chunk.is_empty() {
                let txn = self.next_txn.fetch_add(1, Ordering::Relaxed);
                let writes = std::mem::take(chunk);
                end = Some(log.insert(&LogRecord::Commit { txn, writes }.encode())?.1);
            }
            Ok(())
        };
        for w in writes {
            // As `Ctx::charge` counts a write: 16 bytes besides its key and value.
            let b = 16 + w.key.len() as u64 + w.value.as_ref().map_or(0, |v| v.len() as u64);
            if bytes + b > self.record_limit {
                flush(&mut chunk)?;
                bytes = 0;
            }
            bytes += b;
            chunk.push(w);
        }
        flush(&mut chunk)?;
        Ok(end)
    }

    /// The Doppel runtime, if this database runs Doppel.
    pub(crate) fn doppel(&self) -> Option<&Arc<crate::doppel::Doppel>> {
        self.doppel.as_ref().map(|d| &d.rt)
    }
}

impl Database {
    /// Doppel manual labelling (thesis §3.6): split `key` of `table` for `op` from the next
    /// split phase on, whatever the statistics say, until [`clear_split_hint`](Self::clear_split_hint).
    /// A record whose current value cannot hold `op`'s type (e.g. text for
    /// [`SplitOp::Add`](SplitOp::Add)) is not split. Fails with
    /// [`Error::Unsupported`] unless the database runs [`ConcurrencyControl::Doppel`](crate::ConcurrencyControl::Doppel).
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::{ConcurrencyControl, Database, Options};
    /// use shoal::doppel::SplitOp;
    /// let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Doppel));
    /// let t = db.create_table("items")?;
    /// db.split_hint(&t, "max_bid", SplitOp::Max)?;
    /// db.run(|tx| tx.max(&t, "max_bid", 30))?;
    /// assert_eq!(db.run(|tx| tx.get_i64(&t, "max_bid"))?, Some(30));
    /// assert!(Database::in_memory().split_hint(&Database::in_memory().create_table("x")?, "k", SplitOp::Add).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn split_hint(&self, table: &Table, key: impl AsRef<[u8]>, op: SplitOp) -> Result<()> {
        self.hint(table, key.as_ref(), Some(op))
    }

    /// Removes a [`split_hint`](Self::split_hint); the record is joined again at the next
    /// classification unless the statistics keep it split.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::{ConcurrencyControl, Database, Options};
    /// use shoal::doppel::SplitOp;
    /// let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Doppel));
    /// let t = db.create_table("t")?;
    /// db.split_hint(&t, "k", SplitOp::Add)?;
    /// db.clear_split_hint(&t, "k")?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn clear_split_hint(&self, table: &Table, key: impl AsRef<[u8]>) -> Result<()> {
        self.hint(table, key.as_ref(), None)
    }

    fn hint(&self, table: &Table, key: &[u8], op: Option<SplitOp>) -> Result<()> {
        if table.inner.db_id != self.inner.id {
            return Err(Error::ForeignTable {
                name: table.inner.name.clone(),
            });
        }
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        // A hint serves blind writes, which refuse keys over `max_key_len`.
        let max = self.inner.opts.max_key_len;
        if key.len() > max {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max,
            });
        }
        let Some(d) = &self.inner.doppel else {
            return Err(Error::Unsupported(
                "split hints need ConcurrencyControl::Doppel".into(),
            ));
        };
        d.hint((table.inner.id, key.into()), op);
        Ok(())
    }

    /// Counters of the Doppel runtime (`None` unless the database runs
    /// [`ConcurrencyControl::Doppel`](crate::ConcurrencyControl::Doppel)).
    ///
    /// ```
    /// use shoal::{ConcurrencyControl, Database, Options};
    /// let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Doppel));
    /// assert_eq!(db.doppel_stats().map(|s| s.stashed), Some(0));
    /// assert!(Database::in_memory().doppel_stats().is_none());
    /// ```
    pub fn doppel_stats(&self) -> Option<DoppelStats> {
        self.inner.doppel.as_ref().map(|d| d.stats())
    }

    /// The records split in the current (or, in a joined phase, the next) split phase, as
    /// `(table name, key, selected operation)`, sorted. Empty unless Doppel.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use shoal::{ConcurrencyControl, Database, Options};
    /// let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Doppel));
    /// assert!(db.split_keys().is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn split_keys(&self) -> Vec<(String, Vec<u8>, SplitOp)> {
        let Some(d) = &self.inner.doppel else {
            return Vec::new();
        };
        d.split_keys()
            .into_iter()
            .map(|(t, k, op)| {
                let name = self
                    .inner
                    .table_by_id(t)
                    .map_or_else(|| format!("table#{t}"), |t| t.inner.name.clone());
                (name, k, op)
            })
            .collect()
    }

    /// The Doppel runtime, for a [`StashQueue`](crate::doppel::StashQueue).
    pub(crate) fn doppel_runtime(&self) -> Option<&Arc<Doppel>> {
        self.inner.doppel()
    }
}

impl Store for DbInner {
    fn live_value(&self, table: TableId, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let t = self.by_id.get(table)?;
        Some(
            t.inner
                .tree
                .get(key, |r| r.filter(|r| !r.ghost).map(|r| r.value.clone())),
        )
    }

    fn reconcile(&self, table: TableId, key: &[u8], f: Fold<'_>) -> bool {
        let Some(t) = self.by_id.get(table) else {
            return false;
        };
        crate::txn::occ::install_reconciled(&t.inner.tree, key, f);
        true
    }

    fn logging(&self) -> bool {
        self.log.is_some()
    }

    fn max_value_len(&self) -> usize {
        self.opts.max_value_len
    }

    fn log_commit(&self, writes: Vec<LogWrite>) {
        // In records no larger than a commit's (one record of every reconciled key could
        // outgrow the log buffer). A failed log insert leaves the operation records, which
        // replay to the same values; the log reports its own failure to the next committer.
        let _ = self.log_in_records(writes);
    }
}
