//! RocksDB behind the engine-neutral interface: `TransactionDB` (pessimistic: row locks taken
//! by writes and `GetForUpdate`, deadlock detection on, lock timeout 2 s like shoal's default)
//! and `OptimisticTransactionDB` (writes buffered, keys read with `GetForUpdate` or written
//! validated at commit).
//!
//! All tables share the default column family; a row's key is its table number (4 bytes,
//! big-endian) followed by the key. `--log none` = `WriteOptions::disable_wal(true)`,
//! `--log sync` = `WriteOptions::set_sync(true)`. No compression, a 512 MiB memtable and a
//! 1 GiB block cache, so that the short runs stay in memory as far as RocksDB allows.

use std::path::Path;
use std::sync::RwLock;

use anyhow::{anyhow, Context};
use rocksdb::{
    BlockBasedOptions, Cache, DBCompressionType, Direction, ErrorKind, IteratorMode,
    OptimisticTransactionDB, OptimisticTransactionOptions, Options, Transaction, TransactionDB,
    TransactionDBOptions, TransactionOptions, WriteOptions,
};

use super::TxResult;
use super::{AbortKind, Durability, EngineKind, KvEngine, KvSession, KvTx, TableId, TxError};

/// Lock wait limit of the pessimistic engine, milliseconds (shoal's default `--lock-timeout`).
const LOCK_TIMEOUT_MS: i64 = 2000;

enum Db {
    Pessimistic(TransactionDB),
    Optimistic(OptimisticTransactionDB),
}

/// A RocksDB transactional database.
pub struct RocksEngine {
    db: Db,
    durability: Durability,
    tables: RwLock<Vec<String>>,
    _cache: Cache,
}

impl RocksEngine {
    /// Creates a database in `dir` (`RocksdbPessimistic` or `RocksdbOptimistic`).
    pub fn open(dir: &Path, kind: EngineKind, durability: Durability) -> anyhow::Result<Self> {
        let path = dir.join("rocksdb");
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(DBCompressionType::None);
        opts.set_write_buffer_size(512 << 20);
        let cache = Cache::new_lru_cache(1 << 30).map_err(|e| anyhow!("block cache: {e}"))?;
        let mut bb = BlockBasedOptions::default();
        bb.set_block_cache(&cache);
        opts.set_block_based_table_factory(&bb);
        let db = match kind {
            EngineKind::RocksdbOptimistic => Db::Optimistic(
                OptimisticTransactionDB::open(&opts, &path)
                    .with_context(|| format!("opening RocksDB in {}", path.display()))?,
            ),
            _ => {
                let mut topts = TransactionDBOptions::default();
                topts.set_default_lock_timeout(LOCK_TIMEOUT_MS);
                topts.set_txn_lock_timeout(LOCK_TIMEOUT_MS);
                Db::Pessimistic(
                    TransactionDB::open(&opts, &topts, &path)
                        .with_context(|| format!("opening RocksDB in {}", path.display()))?,
                )
            }
        };
        Ok(RocksEngine {
            db,
            durability,
            tables: RwLock::new(Vec::new()),
            _cache: cache,
        })
    }

    fn write_options(&self) -> WriteOptions {
        let mut w = WriteOptions::default();
        match self.durability {
            Durability::None => w.disable_wal(true),
            Durability::Sync => w.set_sync(true),
        }
        w
    }
}

/// The stored key of `key` in table `t`.
fn full_key(t: TableId, key: &[u8]) -> TxResult<Vec<u8>> {
    let id = u32::try_from(t.0).map_err(|_| TxError::Fatal(anyhow!("table number too large")))?;
    let mut k = Vec::with_capacity(4 + key.len());
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(key);
    Ok(k)
}

/// Maps a RocksDB error to a retryable abort or a fatal error.
fn classify(e: rocksdb::Error) -> TxError {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::Busy if msg.contains("Deadlock") => TxError::Retry(AbortKind::Deadlock, msg),
        ErrorKind::TimedOut => TxError::Retry(AbortKind::LockTimeout, msg),
        ErrorKind::Busy | ErrorKind::TryAgain => TxError::Retry(AbortKind::Conflict, msg),
        _ => TxError::Fatal(anyhow!("RocksDB: {msg}")),
    }
}

impl KvEngine for RocksEngine {
    fn create_table(&self, name: &str) -> anyhow::Result<TableId> {
        let mut tables = self
            .tables
            .write()
            .map_err(|_| anyhow!("table list poisoned"))?;
        tables.push(name.to_string());
        Ok(TableId(tables.len() - 1))
    }

    fn session(&self) -> anyhow::Result<Box<dyn KvSession + '_>> {
        let mut txn_opts = TransactionOptions::default();
        txn_opts.set_deadlock_detect(true);
        txn_opts.set_lock_timeout(LOCK_TIMEOUT_MS);
        Ok(Box::new(RocksSession {
            engine: self,
            write: self.write_options(),
            txn_opts,
            otxn_opts: OptimisticTransactionOptions::default(),
        }))
    }

    fn scan_all(&self, table: TableId) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let prefix = full_key(table, &[]).map_err(|e| anyhow!("{e}"))?;
        let mode = IteratorMode::From(&prefix, Direction::Forward);
        let it: Box<dyn Iterator<Item = _>> = match &self.db {
            Db::Pessimistic(db) => Box::new(db.iterator(mode)),
            Db::Optimistic(db) => Box::new(db.iterator(mode)),
        };
        let mut out = Vec::new();
        for item in it {
            let (k, v) = item.map_err(|e| anyhow!("RocksDB scan: {e}"))?;
            if !k.starts_with(&prefix) {
                break;
            }
            out.push((k[prefix.len()..].to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        let kind = match self.db {
            Db::Pessimistic(_) => {
                format!("TransactionDB deadlock_detect=on lock_timeout={LOCK_TIMEOUT_MS}ms")
            }
            Db::Optimistic(_) => "OptimisticTransactionDB".to_string(),
        };
        let wal = match self.durability {
            Durability::None => "disable_wal",
            Durability::Sync => "sync",
        };
        format!("rocksdb {kind} {wal} compression=none write_buffer=512MiB block_cache=1GiB")
    }
}

struct RocksSession<'a> {
    engine: &'a RocksEngine,
    write: WriteOptions,
    txn_opts: TransactionOptions,
    otxn_opts: OptimisticTransactionOptions,
}

impl KvSession for RocksSession<'_> {
    fn begin(&mut self, _read_only: bool) -> TxResult<Box<dyn KvTx + '_>> {
        Ok(match &self.engine.db {
            Db::Pessimistic(db) => Box::new(RocksTx {
                tx: db.transaction_opt(&self.write, &self.txn_opts),
            }),
            Db::Optimistic(db) => Box::new(RocksTx {
                tx: db.transaction_opt(&self.write, &self.otxn_opts),
            }),
        })
    }
}

struct RocksTx<'a, D> {
    tx: Transaction<'a, D>,
}

impl<D> KvTx for RocksTx<'_, D> {
    fn get(&mut self, table: TableId, key: &[u8]) -> TxResult<Option<Vec<u8>>> {
        self.tx.get(full_key(table, key)?).map_err(classify)
    }

    fn get_for_update(&mut self, table: TableId, key: &[u8]) -> TxResult<Option<Vec<u8>>> {
        self.tx
            .get_for_update(full_key(table, key)?, true)
            .map_err(classify)
    }

    fn put(&mut self, table: TableId, key: &[u8], value: &[u8]) -> TxResult<()> {
        self.tx.put(full_key(table, key)?, value).map_err(classify)
    }

    fn commit(self: Box<Self>) -> TxResult<()> {
        self.tx.commit().map_err(classify)
    }

    fn abort(self: Box<Self>) {
        // Dropping an uncommitted RocksDB transaction rolls it back; an explicit rollback
        // first releases its locks at once. It fails only if nothing is left to undo.
        let _ = self.tx.rollback();
    }
}
