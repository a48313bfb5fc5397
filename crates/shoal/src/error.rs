//! Typed errors. A caller tells a retryable error (`Conflict`, `Deadlock`, `LockTimeout`,
//! `Stashed`) from a
//! fatal one with [`Error::is_retryable`]; [`Database::run`](crate::Database::run) retries
//! exactly those.

use std::path::PathBuf;

/// The result type of every fallible shoal operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in shoal.
///
/// ```
/// use shoal::{Database, Error};
/// let db = Database::in_memory();
/// let err = db.table("missing").unwrap_err();
/// assert!(matches!(err, Error::NoSuchTable { .. }));
/// assert!(!err.is_retryable());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Optimistic validation failed: another transaction changed what this one read.
    /// Retryable.
    #[error("transaction {txn} conflicted with a concurrent transaction: {detail}")]
    Conflict {
        /// The transaction that had to abort.
        txn: u64,
        /// What conflicted.
        detail: String,
    },
    /// Doppel: in a split phase the transaction read a split record, or used it with an
    /// operation other than its selected one; it was rolled back and runs again in the next
    /// joined phase. Retryable: [`Database::run`](crate::Database::run) re-runs it without
    /// counting a retry, and the thread's next `begin()` waits for the joined phase (unless
    /// the thread sets the transaction aside in a [`StashQueue`](crate::doppel::StashQueue)
    /// and goes on with other work).
    #[error("transaction {txn} was stashed until the next joined phase: {detail}")]
    Stashed {
        /// The transaction that was stashed.
        txn: u64,
        /// What it touched.
        detail: String,
    },
    /// A value was not of the type an operation needs (an ordered tuple, a top-K set).
    #[error("key {key} does not hold {expected}")]
    WrongType {
        /// The key, rendered for humans.
        key: String,
        /// What the operation expected.
        expected: &'static str,
    },
    /// The transaction was chosen as the victim of a deadlock. Retryable.
    #[error("transaction {txn} aborted to break a deadlock while locking {resource} (blocked by {blocker})")]
    Deadlock {
        /// The transaction that had to abort.
        txn: u64,
        /// The lock it was waiting for, rendered for humans.
        resource: String,
        /// The transaction it was waiting behind, if known (`?` otherwise).
        blocker: String,
    },
    /// A lock wait exceeded [`Options::lock_timeout`](crate::Options::lock_timeout). Retryable.
    #[error("transaction {txn} timed out after {waited_ms} ms waiting to lock {resource} (blocked by {blocker})")]
    LockTimeout {
        /// The transaction that had to abort.
        txn: u64,
        /// The lock it was waiting for, rendered for humans.
        resource: String,
        /// The transaction it was waiting behind, if known (`?` otherwise).
        blocker: String,
        /// How long it waited.
        waited_ms: u64,
    },
    /// A key was empty. Keys must hold at least one byte.
    #[error("empty key: keys must hold at least one byte")]
    EmptyKey,
    /// A key was longer than [`Options::max_key_len`](crate::Options::max_key_len) (a write's)
    /// or than the 4096 bytes a page guarantees room for (a lookup's).
    #[error("key of {len} bytes exceeds the limit of {max} bytes")]
    KeyTooLarge {
        /// Length of the offending key.
        len: usize,
        /// The limit: `max_key_len` for a write, 4096 for a lookup or a scan bound.
        max: usize,
    },
    /// A value was longer than [`Options::max_value_len`](crate::Options::max_value_len).
    #[error("value of {len} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge {
        /// Length of the offending value.
        len: usize,
        /// The configured limit.
        max: usize,
    },
    /// A write (or `create_table`) found the database's tables holding as many bytes of pages
    /// as [`Options::memory_limit`](crate::Options::memory_limit) allows, or would have taken
    /// them there. Not retryable: reads
    /// and deletes go on, and writes succeed again once deletes have freed pages (or the
    /// database is reopened with a higher limit).
    #[error(
        "the tables hold {used} bytes of pages, at the memory limit of {limit} bytes: delete \
         rows or reopen with a higher Options::memory_limit"
    )]
    MemoryLimit {
        /// Bytes of table pages in use when the write was refused (under OCC and Doppel,
        /// with the bytes the transaction's buffered writes would add).
        used: u64,
        /// The configured limit.
        limit: u64,
    },
    /// No table has this name.
    #[error("no table named {name:?}")]
    NoSuchTable {
        /// The name asked for.
        name: String,
    },
    /// A table with this name exists already.
    #[error("a table named {name:?} exists already")]
    TableExists {
        /// The name asked for.
        name: String,
    },
    /// A table name was empty, too long (over 255 bytes) or contained a control character, or
    /// the database holds as many tables as it can (65,535).
    #[error("invalid table name {name:?}: {reason}")]
    InvalidTableName {
        /// The name given.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A [`Table`](crate::Table) handle from another database was used.
    #[error("table {name:?} belongs to another database")]
    ForeignTable {
        /// The table's name.
        name: String,
    },
    /// `insert` found the key present.
    #[error("key {key} exists already")]
    DuplicateKey {
        /// The key, rendered for humans.
        key: String,
    },
    /// An integer operation met a value that is not an 8-byte little-endian i64.
    #[error("key {key} holds {len} bytes, not an 8-byte integer")]
    NotAnInteger {
        /// The key, rendered for humans.
        key: String,
        /// The length of the value found.
        len: usize,
    },
    /// An integer operation overflowed i64.
    #[error("integer overflow at key {key}")]
    Overflow {
        /// The key, rendered for humans.
        key: String,
    },
    /// The transaction failed earlier (a deadlock, a timeout, a fatal error) and can only be
    /// dropped or aborted now. It is retryable when that earlier failure was: code that
    /// caught a [`Deadlock`](Error::Deadlock) and went on still has its transaction run
    /// again by [`Database::run`](crate::Database::run).
    #[error("transaction {txn} is no longer active: an earlier operation failed with: {cause}")]
    TransactionAborted {
        /// The transaction.
        txn: u64,
        /// The earlier failure.
        cause: String,
        /// The earlier failure was retryable ([`Error::is_retryable`]).
        retryable: bool,
    },
    /// A transaction's writes outgrew what one commit record of the log can hold (the log
    /// buffer's size, at most 1 GiB). Every write counts, rewrites of a key too. Not
    /// retryable: split the work into smaller transactions, or raise
    /// [`Options::log_buffer`](crate::Options::log_buffer).
    #[error(
        "transaction {txn} writes more than one commit record can hold ({bytes} bytes of \
         writes, limit {max}): split it or raise Options::log_buffer"
    )]
    TransactionTooLarge {
        /// The transaction.
        txn: u64,
        /// Bytes its writes would take in the log.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// [`Options`](crate::Options) that contradict each other or the limits of the log.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// A feature was asked for that this build or configuration does not provide.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Persistent state is damaged; the message names the file and offset.
    #[error("corrupt data in {path} at offset {offset}: {detail}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Byte offset of the damage.
        offset: u64,
        /// What was wrong.
        detail: String,
    },
    /// An I/O operation failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// True for errors that a retry of the whole transaction may cure: `Conflict`,
    /// `Deadlock`, `LockTimeout` and `Stashed`, and `TransactionAborted` after one of them.
    ///
    /// ```
    /// use shoal::Error;
    /// assert!(!Error::EmptyKey.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Conflict { .. }
                | Error::Deadlock { .. }
                | Error::LockTimeout { .. }
                | Error::Stashed { .. }
                | Error::TransactionAborted {
                    retryable: true,
                    ..
                }
        )
    }
}

/// Render a key for error messages: UTF-8 text when printable, hex otherwise, shortened.
pub(crate) fn show_key(key: &[u8]) -> String {
    const MAX: usize = 64;
    let k = &key[..key.len().min(MAX)];
    let mut s = match std::str::from_utf8(k) {
        Ok(t) if t.chars().all(|c| !c.is_control()) => format!("{t:?}"),
        _ => {
            let mut h = String::from("0x");
            for b in k {
                h.push_str(&format!("{b:02x}"));
            }
            h
        }
    };
    if key.len() > MAX {
        s.push_str(&format!("..({} bytes)", key.len()));
    }
    s
}
