//! Lock manager: lock modes and their compatibility (Kimura et al. 2012, Tables 2-4), and the
//! lock table behind the [`LockTable`] interface.
//!
//! Lock names are logical: a key-range lock names a key value of a table (or the table's
//! `-infinity` low fence, [`LockId::NegInf`]), never a page, so B+-tree splits never move locks.
//! A key-range lock on key `k` covers `k` and the open gap up to the next key in the index
//! (prior-key locking, Kimura §2.2).
//!
//! The tables: [`simple::SimpleLockTable`], a sharded hash table with one mutex per shard and a
//! FIFO queue per lock (one shard: the single-latch baseline), and
//! [`latchfree::LatchFreeLockTable`] (Jung et al. 2013). Both run every [`DeadlockPolicy`]:
//! the policies' decisions and victim rules are shared ([`deadlock`]), each table supplies
//! who blocks a waiting request and the waiting.

pub mod deadlock;
pub mod dread;
pub mod intent;
pub mod latchfree;
pub mod modes;
pub mod simple;

use std::time::Duration;

pub use modes::LockMode;

/// Identifies a table inside one database.
pub type TableId = u32;
/// Identifies a transaction; ids grow with begin order (older = smaller).
pub type TxnId = u64;

/// The name of a lockable resource.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockId {
    /// The whole database (intent modes).
    Database,
    /// One table (intent modes).
    Table(TableId),
    /// The low fence `-infinity` of a table's leftmost leaf: its gap covers everything below
    /// the table's first key (key-range modes).
    NegInf(TableId),
    /// A key value of a table (key-range modes).
    Key(TableId, LockKey),
}

/// The key bytes of a [`LockId::Key`]: a key of up to [`LockKey::INLINE`] bytes is held in
/// the id itself, a longer one in a box.
///
/// A two-phase-locking transaction names one key per lock it takes and keeps the name until
/// it releases the lock; with the bytes inline, taking a lock on a short key (the common
/// case: TPC-C's and TPC-B's keys are 4 to 20 bytes) allocates nothing. It compares, orders
/// and hashes as its bytes.
///
/// ```
/// use shoal::lock::{LockId, LockKey};
///
/// let short = LockKey::from(&b"account-17"[..]);
/// let long = LockKey::from(vec![7u8; 100]);
/// assert_eq!(&*short, b"account-17");
/// assert_eq!(long.len(), 100);
/// assert_eq!(LockId::Key(1, short.clone()), LockId::Key(1, b"account-17".to_vec().into()));
/// ```
#[derive(Clone)]
pub struct LockKey(KeyRepr);

#[derive(Clone)]
enum KeyRepr {
    Inline(u8, [u8; LockKey::INLINE]),
    Boxed(Box<[u8]>),
}

impl LockKey {
    /// Longest key held inline (the id then stays as small as with a boxed key).
    pub const INLINE: usize = 22;
}

impl std::ops::Deref for LockKey {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match &self.0 {
            KeyRepr::Inline(n, b) => b.get(..usize::from(*n)).unwrap_or(b),
            KeyRepr::Boxed(b) => b,
        }
    }
}

impl std::ops::DerefMut for LockKey {
    /// The bytes, to overwrite in place (the length stays).
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            KeyRepr::Inline(n, b) => {
                let n = usize::from(*n).min(b.len());
                &mut b[..n]
            }
            KeyRepr::Boxed(b) => b,
        }
    }
}

impl AsRef<[u8]> for LockKey {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::borrow::Borrow<[u8]> for LockKey {
    fn borrow(&self) -> &[u8] {
        self
    }
}

impl From<&[u8]> for LockKey {
    #[inline]
    fn from(k: &[u8]) -> LockKey {
        match u8::try_from(k.len()) {
            Ok(n) if k.len() <= LockKey::INLINE => {
                let mut b = [0u8; LockKey::INLINE];
                b[..k.len()].copy_from_slice(k);
                LockKey(KeyRepr::Inline(n, b))
            }
            _ => LockKey(KeyRepr::Boxed(k.into())),
        }
    }
}

impl From<Box<[u8]>> for LockKey {
    /// Keeps a long key's box (no copy); a short key moves inline.
    fn from(k: Box<[u8]>) -> LockKey {
        if k.len() <= LockKey::INLINE {
            LockKey::from(&k[..])
        } else {
            LockKey(KeyRepr::Boxed(k))
        }
    }
}

impl From<Vec<u8>> for LockKey {
    fn from(k: Vec<u8>) -> LockKey {
        if k.len() <= LockKey::INLINE {
            LockKey::from(&k[..])
        } else {
            LockKey(KeyRepr::Boxed(k.into_boxed_slice()))
        }
    }
}

impl From<LockKey> for Box<[u8]> {
    fn from(k: LockKey) -> Box<[u8]> {
        match k.0 {
            KeyRepr::Boxed(b) => b,
            KeyRepr::Inline(..) => (*k).into(),
        }
    }
}

impl LockKey {
    /// The key's length and its first 16 bytes, zero padded, when it is inline and at most
    /// 16 bytes long: the lock table's entries keep such keys in this form, and compare
    /// them as two fixed arrays (a few word compares, not a call to `memcmp`).
    #[inline]
    pub(crate) fn head16(&self) -> Option<(u8, &[u8; 16])> {
        match &self.0 {
            KeyRepr::Inline(n, b) if usize::from(*n) <= 16 => {
                b.first_chunk::<16>().map(|h| (*n, h))
            }
            _ => None,
        }
    }
}

impl PartialEq for LockKey {
    #[inline]
    fn eq(&self, other: &LockKey) -> bool {
        match (&self.0, &other.0) {
            // Both zero padded past their length (no constructor or `DerefMut` writes
            // there): equal keys have equal arrays.
            (KeyRepr::Inline(n, a), KeyRepr::Inline(m, b)) => n == m && a == b,
            _ => **self == **other,
        }
    }
}

impl Eq for LockKey {}

impl PartialOrd for LockKey {
    fn partial_cmp(&self, other: &LockKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LockKey {
    fn cmp(&self, other: &LockKey) -> std::cmp::Ordering {
        (**self).cmp(&**other)
    }
}

impl std::hash::Hash for LockKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (**self).hash(h);
    }
}

impl std::fmt::Debug for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// Why a lock request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockFailure {
    /// The requester was chosen as a deadlock victim. `blocker` is a transaction it waited for.
    Deadlock {
        /// A transaction the requester waited for, if known.
        blocker: Option<TxnId>,
    },
    /// The request waited longer than its timeout.
    Timeout {
        /// A transaction the requester waited for, if known.
        blocker: Option<TxnId>,
        /// How long it waited.
        waited: Duration,
    },
    /// A conditional request (`try_lock`) could not be granted at once.
    WouldBlock,
}

/// Deadlock handling of the lock table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeadlockPolicy {
    /// Wait up to the timeout, then fail with [`Error::LockTimeout`](crate::Error::LockTimeout).
    Timeout,
    /// On blocking, search the waits-for graph for a cycle through the requester; if one is
    /// found the requester fails at once with [`Error::Deadlock`](crate::Error::Deadlock). Waits still time out.
    #[default]
    WaitForGraph,
    /// Never wait: a request that cannot be granted at once fails with
    /// [`Error::Deadlock`](crate::Error::Deadlock) (prevention; no deadlock can form).
    NoWait,
    /// Wait-die (prevention): an older requester waits for younger holders; a younger one
    /// dies (fails with [`Error::Deadlock`](crate::Error::Deadlock)) rather than wait for an older one.
    WaitDie,
    /// Wound-wait (prevention): an older requester wounds the younger transactions it waits
    /// for (a wounded transaction fails with [`Error::Deadlock`](crate::Error::Deadlock) the next time it waits
    /// on a lock); a younger requester waits for older ones.
    WoundWait,
    /// Dreadlocks (Koskinen and Herlihy; Kimura et al. 2012 §4.2, Algorithm 5): each waiting
    /// thread repeatedly ORs the Bloom-filter digests of the transactions it waits for into its
    /// own; finding its own fingerprint in a blocker's digest means a cycle, and the younger
    /// of the two (kill-young) fails with [`Error::Deadlock`](crate::Error::Deadlock).
    Dreadlocks(WaitStyle),
}

/// Which transaction of a deadlock Dreadlocks rolls back (Kimura et al. 2012 §4.3). The other
/// policies choose their own victim (the waits-for graph: the transaction whose search finds
/// the cycle on the sharded table, the youngest on it on the latch-free one; the prevention
/// policies: the requester, or for wound-wait the wounded younger transaction), so a
/// [`Database`](crate::Database) refuses another rule than the default with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Victim {
    /// The younger transaction (larger id): the least work lost, no starvation.
    #[default]
    KillYoung,
    /// The transaction whose thread has the shorter flush pipeline (fewer pipelined commits
    /// waiting to become durable): aborting it stalls less work. Ties: the younger.
    KillShort,
    /// The transaction whose thread has the longer flush pipeline. Ties: the younger.
    KillLong,
}

/// Which key-range lock modes the transaction layer may use (Kimura et al. 2012 §2, §6.3).
/// The protocol always asks for the most precise mode it needs; the coarser designs map each
/// request to the nearest mode they have, as Kimura §6.3 simulated Lomet's design. All three
/// are serializable: a mapped mode is never weaker than the requested one.
///
/// ```
/// let o = shoal::Options::default().with_key_range_modes(shoal::KeyRangeModes::Lomet);
/// let db = shoal::Database::in_memory_with(o);
/// let t = db.create_table("t")?;
/// db.run(|tx| tx.put(&t, "k", "v"))?;
/// # Ok::<(), shoal::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KeyRangeModes {
    /// Graefe's orthogonal modes: key and gap each free, shared or exclusive (N S X NS NX SN
    /// SX XN XS).
    #[default]
    Graefe,
    /// Lomet's modes (as in SQL Server: key-only S and X, RangeS-S, RangeI-N, RangeX-X): a
    /// gap-only shared lock (NS) becomes SS, and the mixed modes SX and XS become XX.
    Lomet,
    /// Only S and X on a key, covering the key and its gap (ARIES/KVL, the original Shore-MT):
    /// every shared request becomes SS, every exclusive one XX.
    SharedExclusive,
}

impl KeyRangeModes {
    /// The mode this design takes for a request of `m` on a key.
    pub fn map(self, m: LockMode) -> LockMode {
        use LockMode::*;
        match (self, m) {
            (KeyRangeModes::Graefe, m) => m,
            (KeyRangeModes::Lomet, NS) => S,
            (KeyRangeModes::Lomet, SX | XS) => X,
            (KeyRangeModes::Lomet, m) => m,
            (KeyRangeModes::SharedExclusive, NS | SN) => S,
            (KeyRangeModes::SharedExclusive, NX | XN | SX | XS) => X,
            (KeyRangeModes::SharedExclusive, m) => m,
        }
    }
}

/// How a Dreadlocks waiter waits between digest refreshes (Kimura §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WaitStyle {
    /// Spin (yielding the CPU between checks): fastest hand-over, burns a core per waiter.
    /// Releases mark waiters' digests stale as with `SleepBackoff`.
    Spin,
    /// Sleep between refreshes: cheap, but a sleeper's digest goes stale and may cause false
    /// deadlocks.
    Sleep,
    /// Sleep, and have every release mark the digests of the queue's waiters stale, so other
    /// threads ignore them until their owners refresh: no false deadlocks from sleepers.
    #[default]
    SleepBackoff,
    /// Spin while the machine's runnable threads fit on the cores (Linux: `/proc/loadavg`,
    /// sampled once a millisecond; elsewhere: while the spinners fit on the cores), sleep
    /// with backoff past that.
    Hybrid,
}

/// How a lock request ends: the mode now held, or why it was not granted.
pub type Granted = Result<LockMode, LockFailure>;

/// What [`LockTable::try_lock_tagged`] returns: the mode now held and the lock's
/// early-lock-release tag at the grant.
pub type TaggedGrant = Result<(LockMode, u64), LockFailure>;

/// The interface every lock table implements. Implementations are shared by all threads.
///
/// A transaction holds at most one request per [`LockId`]; asking again for a lock it holds is
/// a conversion to the supremum of the held and the requested mode. Grants are FIFO per lock
/// with the conversion rule of Kimura §4.2: a conversion is granted when the new mode is
/// compatible with every *other granted* mode; a new request is granted only when it is
/// compatible with every granted mode *and* with the requested mode of every request waiting
/// ahead of it (so a waiting conversion blocks later compatible requests).
pub trait LockTable: Send + Sync {
    /// What [`lock`](Self::lock) (`wait = Some(timeout)`) and [`try_lock`](Self::try_lock)
    /// (`None`) do: the one request path a table implements.
    fn acquire(&self, txn: TxnId, id: &LockId, mode: LockMode, wait: Option<Duration>) -> Granted;

    /// Acquires `mode` on `id` for `txn` (or converts its held lock), waiting up to `timeout`.
    /// Returns the mode now held (the supremum of held and requested).
    fn lock(&self, txn: TxnId, id: &LockId, mode: LockMode, timeout: Duration) -> Granted {
        self.acquire(txn, id, mode, Some(timeout))
    }

    /// Like [`lock`](Self::lock) but never waits: fails with [`LockFailure::WouldBlock`] and
    /// leaves no request behind when the lock cannot be granted at once.
    fn try_lock(&self, txn: TxnId, id: &LockId, mode: LockMode) -> Granted {
        self.acquire(txn, id, mode, None)
    }

    /// [`try_lock`](Self::try_lock), and with a grant the early-lock-release tag of `id` as
    /// [`tag`](Self::tag) reads it at the grant: a table that can read both in one visit to
    /// the lock saves the second (a transaction under SX-ELR reads the tag of every lock it
    /// takes).
    fn try_lock_tagged(&self, txn: TxnId, id: &LockId, mode: LockMode) -> TaggedGrant {
        let m = self.try_lock(txn, id, mode)?;
        Ok((m, self.tag(id)))
    }

    /// Releases whatever `txn` holds on `id` and grants waiters that become compatible.
    /// Releasing a lock that is not held is a no-op.
    fn unlock(&self, txn: TxnId, id: &LockId) {
        self.unlock_tagged(txn, id, 0);
    }

    /// True when no transaction holds or waits for `id` (used before removing a ghost).
    fn is_free(&self, id: &LockId) -> bool;

    /// Like [`unlock`](Self::unlock), and raises the early-lock-release tag of `id` to at
    /// least `tag` (the releasing transaction's commit LSN; Kimura §5.3, Algorithm 6). The tag
    /// outlives the queue: a queue created later for `id` must report at least this tag.
    fn unlock_tagged(&self, txn: TxnId, id: &LockId, tag: u64);

    /// Releases every `(id, tag)` of `txn` as [`unlock_tagged`](Self::unlock_tagged) does
    /// (tag 0: a plain [`unlock`](Self::unlock)), in any order; `locks` may be reordered. A
    /// table may release the locks that share a latch under one acquisition of it (a
    /// transaction's commit releases all its locks at once).
    fn unlock_all(&self, txn: TxnId, locks: &mut [(LockId, u64)]) {
        for (id, tag) in locks.iter() {
            self.unlock_tagged(txn, id, *tag);
        }
    }

    /// The early-lock-release tag of `id`: the highest commit LSN of a transaction that
    /// released an exclusive lock on it before its commit was durable (0 if none). May be
    /// larger than that (it may be shared with other resources), never smaller.
    fn tag(&self, id: &LockId) -> u64;

    /// What the table holds in memory, counted in lock names and request entries
    /// (diagnostics; the default reports nothing).
    fn footprint(&self) -> LockTableFootprint {
        LockTableFootprint::default()
    }
}

/// The memory a lock table holds, counted in its units
/// ([`Database::lock_table_footprint`](crate::Database::lock_table_footprint)).
///
/// ```
/// let db = shoal::Database::in_memory();
/// let f = db.lock_table_footprint();
/// assert_eq!(f.heads, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockTableFootprint {
    /// Lock names with a queue or lock head allocated (the latch-free table counts idle
    /// heads not yet reclaimed and reclaimed heads pooled for reuse too).
    pub heads: usize,
    /// Request entries allocated (the latch-free table counts its free lists too).
    pub entries: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_compare_hash_and_order_as_their_bytes_inline_or_boxed() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let h = |k: &LockKey| BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(k);
        let hs = |k: &[u8]| BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(k);
        let mut keys = Vec::new();
        for n in [
            0,
            1,
            15,
            16,
            17,
            LockKey::INLINE - 1,
            LockKey::INLINE,
            LockKey::INLINE + 1,
            300,
        ] {
            for b in [0u8, 7, 255] {
                let bytes = vec![b; n];
                let a = LockKey::from(&bytes[..]);
                let v = LockKey::from(bytes.clone());
                let bx = LockKey::from(bytes.clone().into_boxed_slice());
                for k in [&a, &v, &bx] {
                    assert_eq!(&**k, &bytes[..]);
                    assert_eq!(k, &a);
                    assert_eq!(h(k), hs(&bytes));
                }
                let back: Box<[u8]> = bx.into();
                assert_eq!(&back[..], &bytes[..]);
                keys.push((bytes, a));
            }
        }
        // Ordered and equal as their bytes, whatever their representation (keys of zero
        // bytes that differ only in length included).
        for (x, kx) in &keys {
            for (y, ky) in &keys {
                assert_eq!(kx.cmp(ky), x.cmp(y));
                assert_eq!(kx == ky, x == y, "{x:?} {y:?}");
            }
            match kx.head16() {
                Some((n, h)) => {
                    assert!(x.len() <= 16);
                    assert_eq!(usize::from(n), x.len());
                    assert_eq!(&h[..x.len()], &x[..]);
                    assert!(h[x.len()..].iter().all(|&b| b == 0));
                }
                None => assert!(x.len() > 16),
            }
        }
        // Overwritten in place, the length stays, and it equals the key built from the
        // new bytes.
        let mut k = LockKey::from(&b"abc"[..]);
        k.copy_from_slice(b"xyz");
        assert_eq!(&*k, b"xyz");
        assert_eq!(k, LockKey::from(&b"xyz"[..]));
        assert_ne!(k, LockKey::from(&b"xyz\0"[..]));
    }

    #[test]
    fn coarser_key_range_designs_never_weaken_a_request() {
        use LockMode::*;
        for d in [
            KeyRangeModes::Graefe,
            KeyRangeModes::Lomet,
            KeyRangeModes::SharedExclusive,
        ] {
            for m in [N, S, X, NS, NX, SN, SX, XN, XS] {
                assert!(d.map(m).covers(m), "{d:?} maps {m:?} to {:?}", d.map(m));
            }
        }
        assert_eq!(KeyRangeModes::Lomet.map(NS), S);
        assert_eq!(KeyRangeModes::Lomet.map(SN), SN);
        assert_eq!(KeyRangeModes::Lomet.map(NX), NX);
        assert_eq!(KeyRangeModes::SharedExclusive.map(SN), S);
        assert_eq!(KeyRangeModes::SharedExclusive.map(NX), X);
    }
}
