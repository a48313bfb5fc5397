//! # shoal
//!
//! An embeddable, in-memory-first transactional key-value / ordered-table engine built to stay
//! fast when many threads fight over the same data.
//!
//! Tables are ordered maps from byte keys to byte values. Transactions are serializable: with
//! [`ConcurrencyControl::TwoPhaseLocking`] every read and write takes a key-range lock
//! (Graefe's orthogonal modes, Kimura et al. 2012) plus intent locks on the table and the
//! database, held to commit; with [`ConcurrencyControl::Optimistic`] they run Silo-style
//! optimistic concurrency control (buffered writes, per-record TID words, validation of reads
//! and scanned ranges at commit); with [`ConcurrencyControl::Doppel`] they run Doppel's phase
//! reconciliation (Narula 2015, see [`doppel`]): OCC in joined phases, and in split phases
//! the blind commutative operations ([`Transaction::add`], [`Transaction::max`],
//! [`Transaction::min`], [`Transaction::oput`], [`Transaction::topk_insert`]) on hot
//! records go to per-worker slices in parallel. The blind operations work under every mode.
//!
//! ```
//! use shoal::Database;
//!
//! # fn main() -> shoal::Result<()> {
//! let db = Database::in_memory();
//! let accounts = db.create_table("accounts")?;
//! db.run(|tx| {
//!     tx.put(&accounts, b"alice", 100i64.to_le_bytes())?;
//!     tx.add(&accounts, b"alice", -30)?;
//!     tx.add(&accounts, b"bob", 30)?; // a missing integer starts at 0
//!     Ok(())
//! })?;
//! let total: i64 = db.run(|tx| {
//!     let rows = tx.scan(&accounts, ..)?;
//!     Ok(rows.iter().map(|(_, v)| i64::from_le_bytes(v[..8].try_into().unwrap())).sum())
//! })?;
//! assert_eq!(total, 100);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

// The public surface is the re-exports below and `doppel`. The engine's components are
// public modules only so the integration tests, the `shoal` benchmark harness and the fuzz
// targets can reach inside; they are hidden from the documentation and are not an API.
#[doc(hidden)]
pub mod admission;
#[cfg(test)]
mod checkpoint_stress;
mod db;
pub mod doppel;
mod error;
#[cfg(test)]
mod fault_tests;
#[doc(hidden)]
pub mod lock;
#[doc(hidden)]
pub mod log;
mod setters;
#[doc(hidden)]
pub mod storage;
mod txn;
mod vfs;

pub use admission::{Admission, AdmissionStats};
pub use db::CheckpointStatus;
pub use db::{
    ConcurrencyControl, Database, Elr, IntentLockKind, LockTableKind, LogMode, Options,
    RecoveryStats, Table, MAX_DURATION,
};
pub use doppel::{DoppelOptions, DoppelStats, SplitOp, StashQueue};
pub use error::{Error, Result};
pub use lock::{DeadlockPolicy, KeyRangeModes, LockMode, LockTableFootprint, Victim, WaitStyle};
pub use txn::{CommitTicket, KeyRange, Transaction};
