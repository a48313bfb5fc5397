//! RocksDB behind the engine-neutral interface: `TransactionDB` (pessimistic: row locks taken
//! by writes and `GetForUpdate`, deadlock detection on, lock timeout 2 s like shoal's default)
//! and `OptimisticTransactionDB` (writes buffered, keys read with `GetForUpdate` or written
//! validated at commit).
//!
//! All tables share the default column family; a row's key is its table number (4 bytes,
//! big-endian) followed by the key. `--log none` = `WriteOptions::disable_wal(true)`,
//! `--log sync` = `WriteOptions::set_sync(true)`. No compression, a 512 MiB memtable and a
//! 1 GiB block cache, so that the short runs stay in memory as far as RocksDB allows.
//!
//! `insert` is `GetForUpdate` + `Put` (the interface's default [`KvTx::insert`]) and fails
//! (fatally, like shoal's and SQLite's insert) when the key exists: the pessimistic engine
//! locks the key before it looks, the optimistic one validates at commit that nobody wrote the
//! key since it looked.
//!
//! After the load, [`KvEngine::settle`] flushes the memtable and waits until no flush and no
//! compaction runs or is pending (untimed, before the first warm-up); it compacts nothing
//! itself. The crate's safe API (0.20.1) has neither `flush` nor properties on a
//! `TransactionDB`, so for both kinds alike the transactional database is closed, the
//! directory opened as a plain `DB` for the flush and the wait, closed again, and the
//! transactional database reopened.

use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rocksdb::{
    BlockBasedOptions, Cache, DBCompressionType, Direction, ErrorKind, IteratorMode,
    OptimisticTransactionDB, OptimisticTransactionOptions, Options, Transaction, TransactionDB,
    TransactionDBOptions, TransactionOptions, WriteOptions, DB,
};

use super::TxResult;
use super::{AbortKind, Durability, EngineKind, KvEngine, KvSession, KvTx, TableId, TxError};

/// Lock wait limit of the pessimistic engine, milliseconds (shoal's default `--lock-timeout`).
const LOCK_TIMEOUT_MS: i64 = 2000;

/// The properties that [`KvEngine::settle`] waits to read 0: a flush or a compaction that
/// runs, or that RocksDB would schedule.
const BUSY_PROPERTIES: [&str; 4] = [
    "rocksdb.num-running-flushes",
    "rocksdb.mem-table-flush-pending",
    "rocksdb.num-running-compactions",
    "rocksdb.compaction-pending",
];

/// How often [`KvEngine::settle`] reads [`BUSY_PROPERTIES`].
const SETTLE_POLL: Duration = Duration::from_millis(10);

/// How long [`KvEngine::settle`] waits for RocksDB to go idle before it fails the run.
const SETTLE_LIMIT: Duration = Duration::from_secs(30 * 60);

/// LSM levels whose SST file counts the recorded options list (RocksDB's default
/// `num_levels`).
const LEVELS: usize = 7;

enum Db {
    Pessimistic(TransactionDB),
    Optimistic(OptimisticTransactionDB),
}

/// A RocksDB transactional database.
pub struct RocksEngine {
    /// `None` only while [`KvEngine::settle`] has the database closed (or failed to reopen
    /// it). Declared before `cache`, so that the database closes first.
    db: Option<Db>,
    kind: EngineKind,
    path: PathBuf,
    durability: Durability,
    tables: RwLock<Vec<String>>,
    cache: Cache,
    /// What [`KvEngine::settle`] did, for the recorded options.
    settled: Option<String>,
}

/// The database options (the same for the plain `DB` that [`KvEngine::settle`] opens).
fn db_options(cache: &Cache) -> Options {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.set_compression_type(DBCompressionType::None);
    opts.set_write_buffer_size(512 << 20);
    let mut bb = BlockBasedOptions::default();
    bb.set_block_cache(cache);
    opts.set_block_based_table_factory(&bb);
    opts
}

/// Opens (or creates) the transactional database of `kind` at `path`.
fn open_db(kind: EngineKind, path: &Path, cache: &Cache) -> anyhow::Result<Db> {
    let opts = db_options(cache);
    let what = || format!("opening RocksDB in {}", path.display());
    Ok(match kind {
        EngineKind::RocksdbOptimistic => {
            Db::Optimistic(OptimisticTransactionDB::open(&opts, path).with_context(what)?)
        }
        _ => {
            let mut topts = TransactionDBOptions::default();
            topts.set_default_lock_timeout(LOCK_TIMEOUT_MS);
            topts.set_txn_lock_timeout(LOCK_TIMEOUT_MS);
            Db::Pessimistic(TransactionDB::open(&opts, &topts, path).with_context(what)?)
        }
    })
}

/// An integer property of `db`; fails if RocksDB does not know it.
fn property(db: &DB, name: &str) -> anyhow::Result<u64> {
    db.property_int_value(name)
        .with_context(|| format!("reading RocksDB property {name}"))?
        .ok_or_else(|| anyhow!("RocksDB has no property {name}"))
}

/// Flushes `db`'s memtable and waits until every one of [`BUSY_PROPERTIES`] reads 0; returns
/// the number of polls that found RocksDB busy.
fn flush_and_wait(db: &DB) -> anyhow::Result<u64> {
    db.flush().context("flushing RocksDB's memtable")?;
    let t0 = Instant::now();
    let mut busy_polls = 0u64;
    loop {
        let mut busy = Vec::new();
        for name in BUSY_PROPERTIES {
            let v = property(db, name)?;
            if v > 0 {
                busy.push(format!("{name}={v}"));
            }
        }
        if busy.is_empty() {
            return Ok(busy_polls);
        }
        if t0.elapsed() > SETTLE_LIMIT {
            bail!(
                "RocksDB still busy {} s after the load: {}",
                SETTLE_LIMIT.as_secs(),
                busy.join(" ")
            );
        }
        busy_polls += 1;
        std::thread::sleep(SETTLE_POLL);
    }
}

/// `db`'s SST files per level, the levels that have any (`L0=1 L6=3`), or `none`.
fn level_files(db: &DB) -> anyhow::Result<String> {
    let mut out = Vec::new();
    for level in 0..LEVELS {
        let n = property(db, &format!("rocksdb.num-files-at-level{level}"))?;
        if n > 0 {
            out.push(format!("L{level}={n}"));
        }
    }
    Ok(if out.is_empty() {
        "none".to_string()
    } else {
        out.join(" ")
    })
}

impl RocksEngine {
    /// Creates a database in `dir` (`RocksdbPessimistic` or `RocksdbOptimistic`).
    pub fn open(dir: &Path, kind: EngineKind, durability: Durability) -> anyhow::Result<Self> {
        let path = dir.join("rocksdb");
        let cache = Cache::new_lru_cache(1 << 30).map_err(|e| anyhow!("block cache: {e}"))?;
        let db = open_db(kind, &path, &cache)?;
        Ok(RocksEngine {
            db: Some(db),
            kind,
            path,
            durability,
            tables: RwLock::new(Vec::new()),
            cache,
            settled: None,
        })
    }

    /// The open database.
    fn db(&self) -> anyhow::Result<&Db> {
        self.db
            .as_ref()
            .ok_or_else(|| anyhow!("RocksDB in {} is closed", self.path.display()))
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
        let it: Box<dyn Iterator<Item = _>> = match self.db()? {
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

    fn settle(&mut self) -> anyhow::Result<Option<String>> {
        let t0 = Instant::now();
        // Closing flushes what was written without a WAL (`--log none`); with a WAL, the plain
        // DB replays it into its memtable, which its flush then writes out.
        drop(self.db.take());
        let (busy_polls, files) = {
            let db = DB::open(&db_options(&self.cache), &self.path).with_context(|| {
                format!("opening RocksDB in {} as a plain DB", self.path.display())
            })?;
            let busy_polls = flush_and_wait(&db)?;
            (busy_polls, level_files(&db)?)
        };
        self.db = Some(open_db(self.kind, &self.path, &self.cache)?);
        let secs = t0.elapsed().as_secs_f64();
        let note = format!(
            "after_load=[closed, opened as DB, flush(), polled until no flush or compaction ran \
             or was pending ({busy_polls} polls found one), SST files {files}, reopened; no \
             manual compaction; {secs:.2}s]"
        );
        self.settled = Some(note.clone());
        Ok(Some(note))
    }

    fn describe(&self) -> String {
        let kind = match self.kind {
            EngineKind::RocksdbOptimistic => "OptimisticTransactionDB".to_string(),
            _ => format!("TransactionDB deadlock_detect=on lock_timeout={LOCK_TIMEOUT_MS}ms"),
        };
        let wal = match self.durability {
            Durability::None => "disable_wal",
            Durability::Sync => "sync",
        };
        let settled = self
            .settled
            .as_deref()
            .unwrap_or("after_load=[not settled]");
        format!(
            "rocksdb {kind} {wal} compression=none write_buffer=512MiB block_cache=1GiB \
             insert=GetForUpdate+Put(fails if the key exists) {settled}"
        )
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
        Ok(match self.engine.db()? {
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

    // `insert` is the trait's: `get_for_update` (`GetForUpdate`: the pessimistic engine locks
    // the key before it looks, so a concurrent insert of the same key waits and then finds it;
    // the optimistic commit fails, a retried conflict, if another transaction wrote the key
    // after the look), a fatal error if the key exists, else `put`.

    fn commit(self: Box<Self>) -> TxResult<()> {
        self.tx.commit().map_err(classify)
    }

    fn abort(self: Box<Self>) {
        // Dropping an uncommitted RocksDB transaction rolls it back; an explicit rollback
        // first releases its locks at once. It fails only if nothing is left to undo.
        let _ = self.tx.rollback();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::{load_rows, LoadValue};

    const KINDS: [EngineKind; 2] = [
        EngineKind::RocksdbPessimistic,
        EngineKind::RocksdbOptimistic,
    ];

    fn fresh(kind: EngineKind, durability: Durability) -> (tempfile::TempDir, RocksEngine) {
        let dir = tempfile::tempdir().unwrap();
        let db = RocksEngine::open(dir.path(), kind, durability).unwrap();
        (dir, db)
    }

    /// A concurrent insert of the same key: the pessimistic one waits for the first one's lock
    /// (and times out here, as the first one stays open); the optimistic one that commits
    /// second conflicts. Retried after the other's commit, either finds the key.
    #[test]
    fn concurrent_inserts_of_one_key_do_not_both_commit() {
        for kind in KINDS {
            let (_dir, db) = fresh(kind, Durability::None);
            let t = db.create_table("t").unwrap();
            let (mut s1, mut s2) = (db.session().unwrap(), db.session().unwrap());
            let mut tx1 = s1.begin(false).unwrap();
            tx1.insert(t, b"k", b"1").unwrap();
            let mut tx2 = s2.begin(false).unwrap();
            match kind {
                EngineKind::RocksdbPessimistic => {
                    match tx2.insert(t, b"k", b"2") {
                        Err(TxError::Retry(AbortKind::LockTimeout, _)) => {}
                        other => panic!("second insert: {other:?}"),
                    }
                    tx2.abort();
                    tx1.commit().unwrap();
                }
                _ => {
                    tx2.insert(t, b"k", b"2").unwrap();
                    tx2.commit().unwrap();
                    match tx1.commit() {
                        Err(TxError::Retry(AbortKind::Conflict, _)) => {}
                        other => panic!("first commit: {other:?}"),
                    }
                }
            }
            let mut retry = s2.begin(false).unwrap();
            assert!(matches!(
                retry.insert(t, b"k", b"3"),
                Err(TxError::Fatal(_))
            ));
            retry.abort();
            assert_eq!(db.scan_all(t).unwrap().len(), 1, "{}", kind.name());
        }
    }

    /// `settle` flushes the load (written without a WAL, or with one) into an SST file,
    /// reopens the database with every row, records what it did, and the reopened database
    /// runs transactions.
    #[test]
    fn settle_flushes_the_load_and_reopens() {
        for kind in KINDS {
            for durability in [Durability::None, Durability::Sync] {
                let what = format!("{} {durability:?}", kind.name());
                let (_dir, mut db) = fresh(kind, durability);
                assert!(db.describe().contains("after_load=[not settled]"), "{what}");
                let t = db.create_table("t").unwrap();
                {
                    let mut s = db.session().unwrap();
                    let mut rows =
                        (0..1000u64).map(|i| (t, i.to_be_bytes().to_vec(), LoadValue::Int(0)));
                    assert_eq!(load_rows(s.as_mut(), &mut rows, 300).unwrap(), 1000);
                }
                let note = db.settle().unwrap().expect("a note");
                assert!(note.contains("SST files L0=1,"), "{what}: {note}");
                assert!(db.describe().contains(&note), "{what}");
                assert_eq!(db.scan_all(t).unwrap().len(), 1000, "{what}");
                let mut s = db.session().unwrap();
                let mut tx = s.begin(false).unwrap();
                assert!(matches!(
                    tx.insert(t, &5u64.to_be_bytes(), b"x"),
                    Err(TxError::Fatal(_))
                ));
                tx.abort();
                let mut tx = s.begin(false).unwrap();
                tx.insert(t, &1000u64.to_be_bytes(), b"x").unwrap();
                assert_eq!(tx.add(t, &7u64.to_be_bytes(), 3).unwrap(), 3);
                tx.commit().unwrap();
                assert_eq!(db.scan_all(t).unwrap().len(), 1001, "{what}");
            }
        }
    }

    /// Four L0 files make RocksDB compact (its default `level0_file_num_compaction_trigger`):
    /// `flush_and_wait` returns only after that compaction, with fewer than four left in L0.
    #[test]
    fn flush_and_wait_waits_for_the_compaction_of_l0() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new_lru_cache(1 << 20).unwrap();
        let db = DB::open(&db_options(&cache), dir.path()).unwrap();
        for i in 0..4u64 {
            db.put(i.to_be_bytes(), b"v").unwrap();
            db.put(b"same", i.to_be_bytes()).unwrap();
            db.flush().unwrap();
        }
        flush_and_wait(&db).unwrap();
        let l0 = property(&db, "rocksdb.num-files-at-level0").unwrap();
        assert!(l0 < 4, "{}", level_files(&db).unwrap());
        for name in BUSY_PROPERTIES {
            assert_eq!(property(&db, name).unwrap(), 0, "{name}");
        }
        assert_eq!(db.get(b"same").unwrap(), Some(3u64.to_be_bytes().to_vec()));
    }
}
