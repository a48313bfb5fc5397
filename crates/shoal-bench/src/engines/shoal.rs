//! shoal behind the engine-neutral interface: `shoal-2pl` and `shoal-occ`, with the engine's
//! default options apart from the concurrency control and the commit logging.

use std::path::Path;

use anyhow::{anyhow, Context};
use shoal::{ConcurrencyControl, Database, Error, LogMode, Options, Table, Transaction};

use super::TxResult;
use super::{
    AbortKind, Durability, EngineKind, KvEngine, KvSession, KvTx, TableId, TableList, TxError,
};

/// A shoal database.
pub struct ShoalEngine {
    db: Database,
    tables: TableList<Table>,
}

impl ShoalEngine {
    /// Opens a fresh database in `dir` with 2PL (`Shoal2pl`) or OCC (`ShoalOcc`).
    pub fn open(dir: &Path, kind: EngineKind, durability: Durability) -> anyhow::Result<Self> {
        let cc = match kind {
            EngineKind::ShoalOcc => ConcurrencyControl::Optimistic,
            _ => ConcurrencyControl::TwoPhaseLocking,
        };
        let log = match durability {
            Durability::None => LogMode::None,
            Durability::Sync => LogMode::Sync,
        };
        let opts = Options::default().with_cc(cc).with_log(log);
        let db = Database::open(dir, opts)
            .with_context(|| format!("opening shoal in {}", dir.display()))?;
        Ok(ShoalEngine {
            db,
            tables: TableList::new(),
        })
    }
}

/// Maps a shoal error to a retryable abort or a fatal error.
fn classify(e: Error) -> TxError {
    match e {
        Error::Deadlock { .. } => TxError::Retry(AbortKind::Deadlock, e.to_string()),
        Error::LockTimeout { .. } => TxError::Retry(AbortKind::LockTimeout, e.to_string()),
        e if e.is_retryable() => TxError::Retry(AbortKind::Conflict, e.to_string()),
        e => TxError::Fatal(e.into()),
    }
}

impl KvEngine for ShoalEngine {
    fn create_table(&self, name: &str) -> anyhow::Result<TableId> {
        self.tables.push(self.db.create_table(name)?)
    }

    fn session(&self) -> anyhow::Result<Box<dyn KvSession + '_>> {
        Ok(Box::new(ShoalSession {
            db: &self.db,
            tables: self.tables.all()?,
        }))
    }

    fn scan_all(&self, table: TableId) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let t = self.tables.get(table)?;
        Ok(self.db.run(|tx| tx.scan(&t, ..))?)
    }

    fn describe(&self) -> String {
        format!("{:?}", self.db.options())
    }
}

struct ShoalSession<'a> {
    db: &'a Database,
    tables: Vec<Table>,
}

impl KvSession for ShoalSession<'_> {
    fn begin(&mut self, _read_only: bool) -> TxResult<Box<dyn KvTx + '_>> {
        Ok(Box::new(ShoalTx {
            tx: self.db.begin(),
            tables: &self.tables,
        }))
    }
}

struct ShoalTx<'a> {
    tx: Transaction<'a>,
    tables: &'a [Table],
}

fn table_of(tables: &[Table], t: TableId) -> TxResult<&Table> {
    tables
        .get(t.0)
        .ok_or_else(|| TxError::Fatal(anyhow!("no table {} in this session", t.0)))
}

impl KvTx for ShoalTx<'_> {
    fn get(&mut self, table: TableId, key: &[u8]) -> TxResult<Option<Vec<u8>>> {
        let t = table_of(self.tables, table)?;
        self.tx.get(t, key).map_err(classify)
    }

    fn get_for_update(&mut self, table: TableId, key: &[u8]) -> TxResult<Option<Vec<u8>>> {
        let t = table_of(self.tables, table)?;
        self.tx.get_for_update(t, key).map_err(classify)
    }

    fn put(&mut self, table: TableId, key: &[u8], value: &[u8]) -> TxResult<()> {
        let t = table_of(self.tables, table)?;
        self.tx.put(t, key, value).map_err(classify)
    }

    fn insert(&mut self, table: TableId, key: &[u8], value: &[u8]) -> TxResult<()> {
        let t = table_of(self.tables, table)?;
        self.tx.insert(t, key, value).map_err(classify)
    }

    fn add(&mut self, table: TableId, key: &[u8], delta: i64) -> TxResult<i64> {
        let t = table_of(self.tables, table)?;
        self.tx.add_and_get(t, key, delta).map_err(classify)
    }

    fn commit(self: Box<Self>) -> TxResult<()> {
        self.tx.commit().map_err(classify)
    }

    fn abort(self: Box<Self>) {
        self.tx.abort()
    }
}
