//! The lock tables `Database` builds ([`LockTableKind`]), for the tests that run one scenario
//! on each: [`AnyTable`] and the [`every_table!`](every_table) macro.

use std::sync::Arc;
use std::time::Duration;

use shoal::lock::latchfree::LatchFreeLockTable;
use shoal::lock::simple::SimpleLockTable;
use shoal::lock::{
    DeadlockPolicy, Granted, LockId, LockMode, LockTable, LockTableFootprint, TaggedGrant, TxnId,
    Victim,
};
use shoal::LockTableKind;

/// A lock table of one of the kinds, as `Database` builds it, with the diagnostics the tests
/// read beyond [`LockTable`].
pub enum AnyTable {
    /// `Sharded` and `Latched` (one shard).
    Simple(SimpleLockTable),
    /// `LatchFree`.
    LatchFree(Box<LatchFreeLockTable>),
}

impl AnyTable {
    /// A table of `kind` with deadlock `policy` and `victim` rule.
    pub fn new(kind: LockTableKind, policy: DeadlockPolicy, victim: Victim) -> Arc<AnyTable> {
        Arc::new(match kind {
            LockTableKind::Sharded => {
                AnyTable::Simple(SimpleLockTable::new(policy).with_victim(victim))
            }
            LockTableKind::Latched => {
                AnyTable::Simple(SimpleLockTable::with_shards(policy, 1).with_victim(victim))
            }
            LockTableKind::LatchFree => AnyTable::LatchFree(Box::new(
                LatchFreeLockTable::new(policy).with_victim(victim),
            )),
        })
    }

    /// The table as the engine sees it.
    pub fn t(&self) -> &dyn LockTable {
        match self {
            AnyTable::Simple(t) => t,
            AnyTable::LatchFree(t) => &**t,
        }
    }

    /// Requests waiting on `id`.
    pub fn waiters(&self, id: &LockId) -> usize {
        match self {
            AnyTable::Simple(t) => t.waiters(id),
            AnyTable::LatchFree(t) => t.waiters(id),
        }
    }

    /// The mode `txn` holds on `id` (`N` if none).
    pub fn held_mode(&self, txn: TxnId, id: &LockId) -> LockMode {
        match self {
            AnyTable::Simple(t) => t.held_mode(txn, id),
            AnyTable::LatchFree(t) => t.held_mode(txn, id),
        }
    }

    /// Locks with a live request.
    pub fn queue_count(&self) -> usize {
        match self {
            AnyTable::Simple(t) => t.queue_count(),
            AnyTable::LatchFree(t) => t.queue_count(),
        }
    }

    /// Back at rest: nothing queued (and, for the simple table, no waits-for edge left and no
    /// shard grown for a burst).
    pub fn is_idle(&self) -> bool {
        match self {
            AnyTable::Simple(t) => t.is_idle(),
            AnyTable::LatchFree(t) => t.queue_count() == 0,
        }
    }
}

impl LockTable for AnyTable {
    fn acquire(&self, txn: TxnId, id: &LockId, mode: LockMode, wait: Option<Duration>) -> Granted {
        self.t().acquire(txn, id, mode, wait)
    }

    fn try_lock_tagged(&self, txn: TxnId, id: &LockId, mode: LockMode) -> TaggedGrant {
        self.t().try_lock_tagged(txn, id, mode)
    }

    fn is_free(&self, id: &LockId) -> bool {
        self.t().is_free(id)
    }

    fn unlock_tagged(&self, txn: TxnId, id: &LockId, tag: u64) {
        self.t().unlock_tagged(txn, id, tag)
    }

    fn tag(&self, id: &LockId) -> u64 {
        self.t().tag(id)
    }

    fn unlock_all(&self, txn: TxnId, locks: &mut [(LockId, u64)]) {
        self.t().unlock_all(txn, locks)
    }

    fn footprint(&self) -> LockTableFootprint {
        self.t().footprint()
    }
}

/// Runs each scenario `name(kind: LockTableKind)` on every lock table `Database` builds, as
/// `#[test] name::sharded`, `name::latched` and `name::latchfree`.
#[allow(unused_macros)] // each test file uses part of `common`
macro_rules! every_table {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use shoal::LockTableKind;
            #[test]
            fn sharded() {
                super::$name(LockTableKind::Sharded);
            }
            #[test]
            fn latched() {
                super::$name(LockTableKind::Latched);
            }
            #[test]
            fn latchfree() {
                super::$name(LockTableKind::LatchFree);
            }
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use every_table;
