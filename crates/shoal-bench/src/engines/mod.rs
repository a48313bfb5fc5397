//! Engine-neutral transactional key-value interface for `shoal bench --engine ...`: shoal
//! (2PL and OCC) and the peer engines (SQLite, RocksDB `TransactionDB` and
//! `OptimisticTransactionDB`, each behind a cargo feature) implement [`KvEngine`], and the
//! portable workloads in [`crate::portable`] are written once against it, so every engine runs
//! identical workload code.
//!
//! Values are byte strings; counters are 8-byte little-endian `i64`s ([`KvTx::add`]). Each
//! worker thread opens its own [`KvSession`] (SQLite needs one connection per thread) and runs
//! one [`KvTx`] at a time on it.

#[cfg(feature = "rocksdb")]
pub mod rocksdb;
pub mod shoal;
#[cfg(feature = "sqlite")]
pub mod sqlite;

use std::path::Path;
use std::sync::RwLock;

use anyhow::anyhow;

/// Why a transaction aborted in a way that retrying can fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortKind {
    /// Chosen as a deadlock victim.
    Deadlock,
    /// A lock wait (or SQLite's busy wait) ran out of time.
    LockTimeout,
    /// Optimistic validation (or a write-write conflict) failed.
    Conflict,
}

impl AbortKind {
    /// Index in the harness's abort counters: deadlock, lock timeout, conflict.
    pub fn index(self) -> usize {
        match self {
            AbortKind::Deadlock => 0,
            AbortKind::LockTimeout => 1,
            AbortKind::Conflict => 2,
        }
    }
}

/// An error of a transaction operation: retryable or fatal.
#[derive(Debug)]
pub enum TxError {
    /// The transaction must be rolled back and may be retried.
    Retry(AbortKind, String),
    /// Anything else: the run stops.
    Fatal(anyhow::Error),
}

impl std::fmt::Display for TxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TxError::Retry(k, m) => write!(f, "retryable {k:?}: {m}"),
            TxError::Fatal(e) => write!(f, "{e:#}"),
        }
    }
}

impl std::error::Error for TxError {}

impl From<anyhow::Error> for TxError {
    fn from(e: anyhow::Error) -> TxError {
        TxError::Fatal(e)
    }
}

/// The result of a transaction operation.
pub type TxResult<T> = Result<T, TxError>;

/// A table handle: an index into the engine's tables, valid for the engine that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableId(pub usize);

/// The tables an engine created, its own handle of each by [`TableId`].
pub struct TableList<T>(RwLock<Vec<T>>);

impl<T: Clone> TableList<T> {
    /// No tables.
    pub fn new() -> TableList<T> {
        TableList(RwLock::new(Vec::new()))
    }

    /// Adds a table's handle; returns its id.
    pub fn push(&self, t: T) -> anyhow::Result<TableId> {
        let mut tables = self.0.write().map_err(|_| anyhow!("table list poisoned"))?;
        tables.push(t);
        Ok(TableId(tables.len() - 1))
    }

    fn read(&self) -> anyhow::Result<std::sync::RwLockReadGuard<'_, Vec<T>>> {
        self.0.read().map_err(|_| anyhow!("table list poisoned"))
    }

    /// The handle of table `id`.
    pub fn get(&self, id: TableId) -> anyhow::Result<T> {
        (self.read()?.get(id.0).cloned()).ok_or_else(|| anyhow!("no table {}", id.0))
    }

    /// Every table's handle, by id (a session's copy).
    pub fn all(&self) -> anyhow::Result<Vec<T>> {
        Ok(self.read()?.clone())
    }
}

impl<T: Clone> Default for TableList<T> {
    fn default() -> Self {
        TableList::new()
    }
}

/// Commit durability, the same meaning for every engine (`--log`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// No write-ahead log or no sync: shoal `LogMode::None`, RocksDB `disable_wal`, SQLite
    /// `synchronous=OFF`.
    None,
    /// Every commit waits for an fsync of its log: shoal `LogMode::Sync` (group commit),
    /// RocksDB `WriteOptions::set_sync(true)`, SQLite `synchronous=FULL` in WAL mode.
    Sync,
}

/// An engine as named by `--engine`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// shoal with strict two-phase locking.
    Shoal2pl,
    /// shoal with Silo-style optimistic concurrency control.
    ShoalOcc,
    /// RocksDB `TransactionDB` (pessimistic row locks).
    RocksdbPessimistic,
    /// RocksDB `OptimisticTransactionDB`.
    RocksdbOptimistic,
    /// SQLite (one connection per thread, WAL, `BEGIN IMMEDIATE`).
    Sqlite,
}

impl EngineKind {
    /// Every engine, in the order tables print them.
    pub const ALL: [EngineKind; 5] = [
        EngineKind::Shoal2pl,
        EngineKind::ShoalOcc,
        EngineKind::RocksdbPessimistic,
        EngineKind::RocksdbOptimistic,
        EngineKind::Sqlite,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Shoal2pl => "shoal-2pl",
            EngineKind::ShoalOcc => "shoal-occ",
            EngineKind::RocksdbPessimistic => "rocksdb-pessimistic",
            EngineKind::RocksdbOptimistic => "rocksdb-optimistic",
            EngineKind::Sqlite => "sqlite",
        }
    }

    /// Parses a command-line name (the engine need not be compiled in).
    pub fn parse(s: &str) -> Option<EngineKind> {
        let s = s.trim().to_ascii_lowercase();
        EngineKind::ALL.into_iter().find(|e| e.name() == s)
    }

    /// The cargo feature the engine needs, if any.
    pub fn feature(self) -> Option<&'static str> {
        match self {
            EngineKind::Shoal2pl | EngineKind::ShoalOcc => None,
            EngineKind::RocksdbPessimistic | EngineKind::RocksdbOptimistic => Some("rocksdb"),
            EngineKind::Sqlite => Some("sqlite"),
        }
    }

    /// Whether this binary was built with the engine.
    pub fn available(self) -> bool {
        match self.feature() {
            None => true,
            Some("rocksdb") => cfg!(feature = "rocksdb"),
            Some("sqlite") => cfg!(feature = "sqlite"),
            Some(_) => false,
        }
    }

    /// Opens a fresh database of this engine in the empty directory `dir`.
    pub fn open(self, dir: &Path, durability: Durability) -> anyhow::Result<Box<dyn KvEngine>> {
        match self {
            EngineKind::Shoal2pl | EngineKind::ShoalOcc => {
                Ok(Box::new(shoal::ShoalEngine::open(dir, self, durability)?))
            }
            #[cfg(feature = "rocksdb")]
            EngineKind::RocksdbPessimistic | EngineKind::RocksdbOptimistic => {
                Ok(Box::new(rocksdb::RocksEngine::open(dir, self, durability)?))
            }
            #[cfg(feature = "sqlite")]
            EngineKind::Sqlite => Ok(Box::new(sqlite::SqliteEngine::open(dir, durability)?)),
            #[allow(unreachable_patterns)]
            other => anyhow::bail!(
                "engine {} is not built into this binary: rebuild with `--features {}` \
                 (or `--features peers`)",
                other.name(),
                other.feature().unwrap_or("?")
            ),
        }
    }
}

/// Parses `--engine LIST` items.
pub fn parse_engine(s: &str) -> Result<EngineKind, String> {
    EngineKind::parse(s).ok_or_else(|| {
        let names: Vec<&str> = EngineKind::ALL.iter().map(|e| e.name()).collect();
        format!("{s:?} is no engine (one of {})", names.join(", "))
    })
}

/// An open database of one engine, shared by the worker threads.
pub trait KvEngine: Send + Sync {
    /// Creates the table `name` (empty) and returns its handle.
    fn create_table(&self, name: &str) -> anyhow::Result<TableId>;

    /// Opens a session (a connection) for one thread.
    fn session(&self) -> anyhow::Result<Box<dyn KvSession + '_>>;

    /// Every row of a table in key order, read outside any measured transaction (for the
    /// consistency checks).
    fn scan_all(&self, table: TableId) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>>;

    /// Brings the loaded database to rest before the measured runs (called once, after the
    /// load and before the first warm-up, untimed; no session is open): RocksDB flushes its
    /// memtable and waits until no flush or compaction runs or is pending; the other engines
    /// have nothing to do. Returns what it did, for the progress output, or `None`.
    fn settle(&mut self) -> anyhow::Result<Option<String>> {
        Ok(None)
    }

    /// The engine's configuration in one line, for the report (RocksDB's names what
    /// [`KvEngine::settle`] did).
    fn describe(&self) -> String;
}

/// One thread's connection to an engine.
pub trait KvSession {
    /// Starts a transaction; `read_only` says that it will only read (SQLite then starts it
    /// `DEFERRED` instead of `IMMEDIATE`; the others ignore the hint).
    fn begin(&mut self, read_only: bool) -> TxResult<Box<dyn KvTx + '_>>;
}

/// A transaction. Dropping it without [`KvTx::commit`] rolls it back.
pub trait KvTx {
    /// Reads a row (RocksDB: a plain read, not locked or validated; use
    /// [`KvTx::get_for_update`] for a read that is followed by a write).
    fn get(&mut self, table: TableId, key: &[u8]) -> TxResult<Option<Vec<u8>>>;

    /// Reads a row that the transaction goes on to write (RocksDB: `GetForUpdate`, which
    /// locks the key or validates it at commit; the others: as [`KvTx::get`]).
    fn get_for_update(&mut self, table: TableId, key: &[u8]) -> TxResult<Option<Vec<u8>>> {
        self.get(table, key)
    }

    /// Writes a row, replacing any value.
    fn put(&mut self, table: TableId, key: &[u8], value: &[u8]) -> TxResult<()>;

    /// Writes a new row. Its key must not exist: if it does (committed, or written earlier by
    /// this transaction), every engine fails with [`TxError::Fatal`] (shoal's `DuplicateKey`,
    /// SQLite's constraint error; RocksDB's is this default: [`KvTx::get_for_update`], then
    /// [`KvTx::put`] if the key is absent).
    fn insert(&mut self, table: TableId, key: &[u8], value: &[u8]) -> TxResult<()> {
        if self.get_for_update(table, key)?.is_some() {
            return Err(TxError::Fatal(anyhow!(
                "insert: key {} of table {} exists already",
                show_key(key),
                table.0
            )));
        }
        self.put(table, key, value)
    }

    /// Writes an integer row (8-byte little-endian for the key-value engines).
    fn put_i64(&mut self, table: TableId, key: &[u8], v: i64) -> TxResult<()> {
        self.put(table, key, &v.to_le_bytes())
    }

    /// Adds `delta` to an integer row (a missing row counts as 0) and returns the new value.
    fn add(&mut self, table: TableId, key: &[u8], delta: i64) -> TxResult<i64> {
        let old = match self.get_for_update(table, key)? {
            Some(v) => decode_i64(&v)?,
            None => 0,
        };
        let new = old.wrapping_add(delta);
        self.put_i64(table, key, new)?;
        Ok(new)
    }

    /// Commits.
    fn commit(self: Box<Self>) -> TxResult<()>;

    /// Rolls back.
    fn abort(self: Box<Self>);
}

/// A key for error messages: hex, at most its first 32 bytes.
fn show_key(key: &[u8]) -> String {
    let mut s: String = key.iter().take(32).map(|b| format!("{b:02x}")).collect();
    if key.len() > 32 {
        s.push_str("..");
    }
    s
}

/// Decodes an 8-byte little-endian integer value.
pub fn decode_i64(v: &[u8]) -> TxResult<i64> {
    v.get(..8)
        .and_then(|b| b.try_into().ok())
        .map(i64::from_le_bytes)
        .ok_or_else(|| TxError::Fatal(anyhow::anyhow!("value of {} bytes is no i64", v.len())))
}

/// Loads rows in transactions of up to `batch` rows each, retrying aborted batches.
pub fn load_rows(
    session: &mut dyn KvSession,
    rows: &mut dyn Iterator<Item = (TableId, Vec<u8>, LoadValue)>,
    batch: usize,
) -> anyhow::Result<u64> {
    let mut n = 0u64;
    let mut pending: Vec<(TableId, Vec<u8>, LoadValue)> = Vec::with_capacity(batch);
    loop {
        pending.clear();
        pending.extend((&mut *rows).take(batch));
        if pending.is_empty() {
            return Ok(n);
        }
        let mut attempts = 0;
        loop {
            let res = (|| -> TxResult<()> {
                let mut tx = session.begin(false)?;
                for (t, k, v) in &pending {
                    match v {
                        LoadValue::Int(i) => tx.put_i64(*t, k, *i)?,
                        LoadValue::Bytes(b) => tx.put(*t, k, b)?,
                    }
                }
                tx.commit()
            })();
            match res {
                Ok(()) => break,
                Err(TxError::Retry(..)) if attempts < 100 => attempts += 1,
                Err(e) => anyhow::bail!("loading: {e}"),
            }
        }
        n += pending.len() as u64;
    }
}

/// A value to load.
#[derive(Clone, Debug)]
pub enum LoadValue {
    /// A counter.
    Int(i64),
    /// Bytes.
    Bytes(Vec<u8>),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inserting a key that exists, committed or written earlier by the same transaction, fails
    /// fatally on every engine built in and changes nothing (RocksDB's insert was a blind
    /// `Put` that overwrote the row).
    #[test]
    fn insert_of_an_existing_key_fails_on_every_engine() {
        for kind in EngineKind::ALL.into_iter().filter(|k| k.available()) {
            let dir = tempfile::tempdir().unwrap();
            let db = kind.open(dir.path(), Durability::None).unwrap();
            let t = db.create_table("t").unwrap();
            let mut s = db.session().unwrap();
            let mut tx = s.begin(false).unwrap();
            tx.insert(t, b"a", b"1").unwrap();
            tx.commit().unwrap();

            let mut tx = s.begin(false).unwrap();
            match tx.insert(t, b"a", b"2") {
                Err(TxError::Fatal(_)) => {}
                other => panic!("{}: insert of a committed key: {other:?}", kind.name()),
            }
            tx.abort();

            let mut tx = s.begin(false).unwrap();
            tx.insert(t, b"b", b"1").unwrap();
            match tx.insert(t, b"b", b"2") {
                Err(TxError::Fatal(_)) => {}
                other => panic!("{}: insert of its own key: {other:?}", kind.name()),
            }
            tx.abort();

            let rows = db.scan_all(t).unwrap();
            assert_eq!(rows, [(b"a".to_vec(), b"1".to_vec())], "{}", kind.name());
        }
    }
}
