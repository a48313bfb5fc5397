//! SQLite (through rusqlite, its bundled SQLite) behind the engine-neutral interface.
//!
//! Configuration (see the README's "Peer engines"): one database file, WAL journal mode, one
//! connection per worker thread; `--log none` = `synchronous=OFF`, `--log sync` =
//! `synchronous=FULL` (an fsync of the WAL at every commit). Each table is
//! `(k BLOB PRIMARY KEY, v) WITHOUT ROWID`; counters are SQLite integers, updated with one
//! `INSERT .. ON CONFLICT DO UPDATE SET v = v + ? RETURNING v`. Transactions that write start
//! with `BEGIN IMMEDIATE` (they take the database's single writer lock at once, so writers
//! run one at a time and never deadlock); read-only ones with `BEGIN DEFERRED` (WAL readers
//! run beside the writer). A busy connection waits in a busy handler that yields, then sleeps
//! 20 µs per try, and gives up (a lock-timeout abort, retried) after about 2 s.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Context};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, ErrorCode};

use super::{
    AbortKind, Durability, KvEngine, KvSession, KvTx, TableId, TableList, TxError, TxResult,
};

/// Page cache per connection, KiB (negative `cache_size` = KiB).
const CACHE_KIB: i64 = 512 * 1024;

/// Memory-mapped I/O for reads of the database file, bytes.
const MMAP_BYTES: i64 = 1 << 30;

/// A SQLite database file.
pub struct SqliteEngine {
    path: PathBuf,
    durability: Durability,
    tables: TableList<TableSql>,
    admin: Mutex<Connection>,
}

/// The statements of one table.
#[derive(Clone, Debug)]
struct TableSql {
    get: String,
    put: String,
    insert: String,
    add: String,
    scan: String,
}

impl TableSql {
    fn new(name: &str) -> TableSql {
        let t = format!("\"t_{name}\"");
        TableSql {
            get: format!("SELECT v FROM {t} WHERE k = ?1"),
            put: format!(
                "INSERT INTO {t} (k, v) VALUES (?1, ?2) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
            ),
            insert: format!("INSERT INTO {t} (k, v) VALUES (?1, ?2)"),
            add: format!(
                "INSERT INTO {t} (k, v) VALUES (?1, ?2) ON CONFLICT (k) DO UPDATE SET v = v + ?2 \
                 RETURNING v"
            ),
            scan: format!("SELECT k, v FROM {t} ORDER BY k"),
        }
    }
}

/// Waits for a busy lock: yields for the first tries, then sleeps 20 µs per try; gives up after
/// about 2 s (the busy handler's count is its only state).
fn busy_handler(count: i32) -> bool {
    if count < 50 {
        std::thread::yield_now();
        true
    } else if count < 50 + 30_000 {
        std::thread::sleep(Duration::from_micros(20));
        true
    } else {
        false
    }
}

fn connect(path: &Path, durability: Durability) -> anyhow::Result<Connection> {
    let c = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    let sync = match durability {
        Durability::None => "OFF",
        Durability::Sync => "FULL",
    };
    // The mode SQLite answers with: a file system without WAL support leaves the journal
    // in rollback mode, which the run would then measure under the name of WAL.
    let mode: String = c
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .context("setting SQLite's journal mode")?;
    anyhow::ensure!(
        mode.eq_ignore_ascii_case("wal"),
        "SQLite kept journal_mode={mode} for {} (WAL was asked for)",
        path.display()
    );
    c.execute_batch(&format!(
        "PRAGMA synchronous = {sync}; \
         PRAGMA cache_size = -{CACHE_KIB}; PRAGMA temp_store = MEMORY; \
         PRAGMA mmap_size = {MMAP_BYTES};"
    ))
    .context("configuring a SQLite connection")?;
    c.busy_handler(Some(busy_handler))?;
    c.set_prepared_statement_cache_capacity(64);
    Ok(c)
}

/// Maps a rusqlite error to a retryable abort (busy or locked) or a fatal error.
fn classify(e: rusqlite::Error) -> TxError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            TxError::Retry(AbortKind::LockTimeout, e.to_string())
        }
        _ => TxError::Fatal(e.into()),
    }
}

impl SqliteEngine {
    /// Creates `dir/shoal-bench.sqlite`.
    pub fn open(dir: &Path, durability: Durability) -> anyhow::Result<Self> {
        let path = dir.join("shoal-bench.sqlite");
        let admin = connect(&path, durability)?;
        Ok(SqliteEngine {
            path,
            durability,
            tables: TableList::new(),
            admin: Mutex::new(admin),
        })
    }
}

impl KvEngine for SqliteEngine {
    fn create_table(&self, name: &str) -> anyhow::Result<TableId> {
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            anyhow::bail!("table name {name:?}: letters, digits and _ only");
        }
        let admin = self
            .admin
            .lock()
            .map_err(|_| anyhow!("connection poisoned"))?;
        admin.execute_batch(&format!(
            "CREATE TABLE \"t_{name}\" (k BLOB PRIMARY KEY, v) WITHOUT ROWID"
        ))?;
        self.tables.push(TableSql::new(name))
    }

    fn session(&self) -> anyhow::Result<Box<dyn KvSession + '_>> {
        Ok(Box::new(SqliteSession {
            conn: connect(&self.path, self.durability)?,
            tables: self.tables.all()?,
        }))
    }

    fn scan_all(&self, table: TableId) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let sql = self.tables.get(table)?.scan;
        let admin = self
            .admin
            .lock()
            .map_err(|_| anyhow!("connection poisoned"))?;
        let mut st = admin.prepare(&sql)?;
        let rows = st.query_map([], |r| {
            Ok((r.get::<_, Vec<u8>>(0)?, value_bytes(r.get_ref(1)?)))
        })?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r?);
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        format!(
            "sqlite {} journal_mode=WAL synchronous={} cache_size={CACHE_KIB}KiB/connection \
             temp_store=MEMORY mmap_size={MMAP_BYTES} \
             BEGIN IMMEDIATE (writers) / DEFERRED (read-only), busy handler ~2s",
            rusqlite::version(),
            match self.durability {
                Durability::None => "OFF",
                Durability::Sync => "FULL",
            }
        )
    }
}

/// A value as bytes: integers as 8-byte little-endian, like the other engines' counters.
fn value_bytes(v: ValueRef<'_>) -> Vec<u8> {
    match v {
        ValueRef::Integer(i) => i.to_le_bytes().to_vec(),
        ValueRef::Blob(b) | ValueRef::Text(b) => b.to_vec(),
        ValueRef::Real(f) => f.to_le_bytes().to_vec(),
        ValueRef::Null => Vec::new(),
    }
}

/// Runs a statement without parameters through the connection's statement cache (BEGIN,
/// COMMIT and ROLLBACK are parsed once per connection, not once per transaction).
fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

struct SqliteSession {
    conn: Connection,
    tables: Vec<TableSql>,
}

impl KvSession for SqliteSession {
    fn begin(&mut self, read_only: bool) -> TxResult<Box<dyn KvTx + '_>> {
        let sql = if read_only {
            "BEGIN DEFERRED"
        } else {
            "BEGIN IMMEDIATE"
        };
        exec_cached(&self.conn, sql).map_err(classify)?;
        Ok(Box::new(SqliteTx {
            s: self,
            open: true,
        }))
    }
}

struct SqliteTx<'a> {
    s: &'a mut SqliteSession,
    /// The transaction still needs a COMMIT or ROLLBACK.
    open: bool,
}

impl SqliteTx<'_> {
    fn sql(&self, t: TableId) -> TxResult<&TableSql> {
        self.s
            .tables
            .get(t.0)
            .ok_or_else(|| TxError::Fatal(anyhow!("no table {}", t.0)))
    }

    fn rollback(&mut self) {
        if self.open {
            self.open = false;
            // Fails only if SQLite already rolled back (e.g. after some errors): nothing to do.
            let _ = exec_cached(&self.s.conn, "ROLLBACK");
        }
    }
}

impl Drop for SqliteTx<'_> {
    fn drop(&mut self) {
        self.rollback();
    }
}

impl KvTx for SqliteTx<'_> {
    fn get(&mut self, table: TableId, key: &[u8]) -> TxResult<Option<Vec<u8>>> {
        let sql = &self.sql(table)?.get;
        let mut st = self.s.conn.prepare_cached(sql).map_err(classify)?;
        let mut rows = st.query(params![key]).map_err(classify)?;
        match rows.next().map_err(classify)? {
            Some(r) => Ok(Some(value_bytes(r.get_ref(0).map_err(classify)?))),
            None => Ok(None),
        }
    }

    fn put(&mut self, table: TableId, key: &[u8], value: &[u8]) -> TxResult<()> {
        let sql = &self.sql(table)?.put;
        let mut st = self.s.conn.prepare_cached(sql).map_err(classify)?;
        st.execute(params![key, value]).map_err(classify)?;
        Ok(())
    }

    fn insert(&mut self, table: TableId, key: &[u8], value: &[u8]) -> TxResult<()> {
        let sql = &self.sql(table)?.insert;
        let mut st = self.s.conn.prepare_cached(sql).map_err(classify)?;
        st.execute(params![key, value]).map_err(classify)?;
        Ok(())
    }

    fn put_i64(&mut self, table: TableId, key: &[u8], v: i64) -> TxResult<()> {
        let sql = &self.sql(table)?.put;
        let mut st = self.s.conn.prepare_cached(sql).map_err(classify)?;
        st.execute(params![key, v]).map_err(classify)?;
        Ok(())
    }

    fn add(&mut self, table: TableId, key: &[u8], delta: i64) -> TxResult<i64> {
        let sql = &self.sql(table)?.add;
        let mut st = self.s.conn.prepare_cached(sql).map_err(classify)?;
        st.query_row(params![key, delta], |r| r.get::<_, i64>(0))
            .map_err(classify)
    }

    fn commit(mut self: Box<Self>) -> TxResult<()> {
        match exec_cached(&self.s.conn, "COMMIT") {
            Ok(()) => {
                self.open = false;
                Ok(())
            }
            Err(e) => {
                self.rollback();
                Err(classify(e))
            }
        }
    }

    fn abort(mut self: Box<Self>) {
        self.rollback();
    }
}
