//! Taking checkpoints, on demand and in the background.
//!
//! A checkpoint is fuzzy: transactions keep running while it reads every table. Under 2PL it
//! reads each key under an instant shared key lock taken with `try_lock`, which never waits
//! and never enqueues, so a checkpoint neither waits behind a transaction nor delays one, and
//! does not depend on the deadlock policy. A key that is busy (an exclusive lock on it) is
//! retried a few times; if it stays busy, its *committed* value is taken from the durable log
//! instead: the last after-image below the checkpoint's LSN, found in the previous checkpoint
//! and the log segments after it. That is right because the log is redo-only with
//! after-images and replay is idempotent: a key locked by an uncommitted transaction has as
//! committed value the last after-image logged before it, and every commit at or after the
//! checkpoint's LSN is replayed by recovery anyway.

use super::recovery::{redo, Redo};
use super::*;

/// Rows per checkpoint record, at most.
const CHUNK_ROWS: usize = 1024;
/// Key and value bytes a checkpoint record holds at most, unless one row alone is larger
/// (that row then has a record of its own: a row fits in a record, as `check_limits`
/// makes a commit of one row fit, but a row of up to 1 GiB next to 4 MiB of others did not).
const CHUNK_BYTES: usize = 4 << 20;
/// Rows read from the tree at once: adapted to the row size, so that one read of large rows
/// does not copy much more than a record's worth.
const SCAN_ROWS: usize = 1024;
/// How often, and how long apart, keys found busy are tried again before their committed
/// values are taken from the log.
const BUSY_RETRIES: u32 = 5;
const BUSY_PAUSE: Duration = Duration::from_millis(1);

/// What the background checkpointer has done, from [`Database::checkpoint_status`].
///
/// ```
/// # fn main() -> shoal::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
/// let st = db.checkpoint_status();
/// assert_eq!((st.background_runs, st.background_failures), (0, 0));
/// assert!(st.last_error.is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointStatus {
    /// Background checkpoints attempted so far (successful or not).
    pub background_runs: u64,
    /// Background checkpoints that failed. A failed checkpoint leaves the previous one and
    /// the log in place, so nothing is lost; the next attempt tries again.
    pub background_failures: u64,
    /// The message of the last failed background checkpoint, if any failed.
    pub last_error: Option<String>,
}

/// The background checkpointer's controls (shared with its thread) and its reports.
#[derive(Default)]
pub(super) struct Checkpointer {
    stop: AtomicBool,
    /// The thread sleeps on `cv` between checkpoints; `stop` is set under `sleep`.
    sleep: Mutex<()>,
    cv: parking_lot::Condvar,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    status: Mutex<Reports>,
}

#[derive(Default)]
struct Reports {
    status: CheckpointStatus,
    /// A background failure not yet returned by an explicit checkpoint.
    pending: Option<String>,
}

impl Checkpointer {
    /// Sleeps for `d`; false if stopped meanwhile (or before).
    fn sleep(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut g = self.sleep.lock();
        while !self.stop.load(Ordering::Acquire) {
            if self.cv.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        !self.stop.load(Ordering::Acquire)
    }

    /// Stops the thread and waits until it has exited (a checkpoint it is taking stops at its
    /// next chunk). A call from the thread itself only stops it.
    pub(super) fn shutdown(&self) {
        {
            let _g = self.sleep.lock();
            self.stop.store(true, Ordering::Release);
            self.cv.notify_all();
        }
        let Some(h) = self.thread.lock().take() else {
            return;
        };
        if h.thread().id() != std::thread::current().id() {
            // A panic of the thread has been reported on it already.
            let _ = h.join();
        }
    }

    fn report(&self, res: &Result<Option<u64>>) {
        let mut r = self.status.lock();
        r.status.background_runs += 1;
        if let Err(e) = res {
            let msg = e.to_string();
            r.status.background_failures += 1;
            r.status.last_error = Some(msg.clone());
            r.pending = Some(msg);
        }
    }
}

/// Gathers checkpoint rows into records of at most [`CHUNK_ROWS`] rows and [`CHUNK_BYTES`]
/// of keys and values (or one larger row alone).
#[derive(Default)]
struct Rows {
    writes: Vec<LogWrite>,
    bytes: usize,
}

impl Rows {
    fn push(
        &mut self,
        w: &mut CheckpointWriter<'_>,
        table: TableId,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> Result<()> {
        let n = key.len() + value.len();
        if !self.writes.is_empty() && self.bytes + n > CHUNK_BYTES {
            self.flush(w)?;
        }
        self.bytes += n;
        self.writes.push(LogWrite {
            table,
            key,
            value: Some(value),
        });
        if self.writes.len() >= CHUNK_ROWS || self.bytes >= CHUNK_BYTES {
            self.flush(w)?;
        }
        Ok(())
    }

    fn flush(&mut self, w: &mut CheckpointWriter<'_>) -> Result<()> {
        self.bytes = 0;
        w.rows(std::mem::take(&mut self.writes))
    }
}

/// Values (`None`: absent) by table and key.
type KeyValues = BTreeMap<(TableId, Vec<u8>), Option<Vec<u8>>>;

/// What a checkpoint read of one key found.
enum Read {
    Value(Vec<u8>),
    Absent,
    /// Under 2PL: another transaction holds a lock that excludes readers.
    Busy,
}

impl DbInner {
    /// Reads the committed value of `key` for a checkpoint (see the module documentation).
    fn checkpoint_read(&self, t: &Table, key: &[u8], ckpt_txn: u64) -> Read {
        let get = || {
            t.inner
                .tree
                .get(key, |r| r.filter(|r| !r.ghost).map(|r| r.value.clone()))
        };
        let v = match self.opts.cc {
            // Wait out a committer's lock bit: a commit whose record is below `lsn` installs
            // its values before it unlocks them.
            ConcurrencyControl::Optimistic | ConcurrencyControl::Doppel => {
                crate::txn::occ::read_committed(&t.inner.tree, key)
            }
            // Read under the serial mutex: no transaction is half done.
            ConcurrencyControl::Serial => {
                let _serial = self.serial.lock();
                get()
            }
            _ => {
                // An instant shared key lock that never waits: never an uncommitted value.
                let id = LockId::Key(t.inner.id, key.into());
                if self.locks.try_lock(ckpt_txn, &id, LockMode::SN).is_err() {
                    return Read::Busy;
                }
                let v = get();
                self.locks.unlock(ckpt_txn, &id);
                v
            }
        };
        v.map_or(Read::Absent, Read::Value)
    }

    /// Takes a checkpoint (see [`Database::checkpoint`]); a background one passes its stop
    /// flag and gives up at the next chunk once it is set.
    fn take_checkpoint(&self, stop: Option<&AtomicBool>) -> Result<Option<u64>> {
        let (Some(log), Some(dir), Some(disk)) = (&self.log, &self.dir, &self.disk) else {
            return Ok(None);
        };
        let vfs = &*disk.vfs;
        // A failed log ends the database's work: what memory holds may include commits that
        // never became durable, and the log's error is the one to report.
        log.check()?;
        let stopped = || -> Result<()> {
            if stop.is_some_and(|s| s.load(Ordering::Acquire)) {
                return Err(Error::Io {
                    path: dir.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::Interrupted,
                        "checkpoint abandoned: the database is closing",
                    ),
                });
            }
            Ok(())
        };
        // Under Doppel a checkpoint runs inside a joined phase: no slice is unreconciled. The
        // pin comes before the lock: a checkpoint waiting for a joined phase must not hold up
        // one asked for inside a split-phase transaction, which fails at once instead (holding
        // the lock, the waiter kept that transaction, and so the split phase, from ending).
        // An explicit checkpoint waits at most `DoppelOptions::stash_wait` for it, as a
        // stashed re-run does (a split-phase transaction may stay open waiting for this very
        // thread); the background checkpointer waits on.
        let _pin = match self.doppel() {
            Some(d) => {
                let wait = stop.is_none().then_some(self.opts.doppel.stash_wait);
                match crate::doppel::Pin::new(d, wait) {
                    Ok(p) => Some(p),
                    Err(Error::Io { source, .. }) => {
                        return Err(Error::Io {
                            path: dir.clone(),
                            source,
                        })
                    }
                    Err(e) => return Err(e),
                }
            }
            None => None,
        };
        if self.opts.cc == ConcurrencyControl::Serial && crate::txn::holds_serial_turn(self.id) {
            // It would wait for the mutex its own transaction holds.
            return Err(Error::Unsupported(
                "a checkpoint inside a transaction of the same thread under Serial".into(),
            ));
        }
        let _one_at_a_time = self.checkpoint_lock.lock();
        let lsn = log.released();
        // Nothing was logged since the newest checkpoint: it holds this state already. A
        // second file at the same LSN would replace it by its rename, and a failed read-back
        // of the new one would then remove the only checkpoint, the log below it gone.
        if checkpoint::list(vfs, dir)?
            .last()
            .is_some_and(|&(l, _)| l == lsn)
        {
            return Ok(Some(lsn));
        }
        // Dropped unfinished (an error, or abandoned), the writer removes its file: the
        // previous checkpoint and the log stay as they were.
        let mut w = CheckpointWriter::create(vfs, dir, lsn)?;
        let mut tables: Vec<Table> = self.tables.read().values().cloned().collect();
        tables.sort_by_key(|t| t.inner.id);
        let ckpt_txn = self.next_txn.fetch_add(1, Ordering::Relaxed);
        let mut rows = Rows::default();
        let mut busy: Vec<(Table, Vec<u8>)> = Vec::new();
        for t in &tables {
            w.table(t.inner.id, &t.inner.name)?;
            let mut start: Bound<Vec<u8>> = Bound::Unbounded;
            let mut limit = 32;
            loop {
                stopped()?;
                let chunk = {
                    let _serial =
                        (self.opts.cc == ConcurrencyControl::Serial).then(|| self.serial.lock());
                    let b = match &start {
                        Bound::Unbounded => Bound::Unbounded,
                        Bound::Excluded(k) => Bound::Excluded(&k[..]),
                        Bound::Included(k) => Bound::Included(&k[..]),
                    };
                    t.inner.tree.range(b, Bound::Unbounded, limit)
                };
                let Some((last, _)) = chunk.last() else { break };
                let next = Bound::Excluded(last.clone());
                let full = chunk.len() == limit;
                let bytes: usize = chunk.iter().map(|(k, r)| k.len() + r.value.len()).sum();
                let n = chunk.len();
                for (key, _) in chunk {
                    match self.checkpoint_read(t, &key, ckpt_txn) {
                        Read::Value(v) => rows.push(&mut w, t.inner.id, key, v)?,
                        Read::Absent => {}
                        Read::Busy => busy.push((t.clone(), key)),
                    }
                }
                if !full {
                    break;
                }
                start = next;
                limit = (CHUNK_BYTES / (bytes / n).max(1)).clamp(1, SCAN_ROWS);
            }
            rows.flush(&mut w)?;
        }
        // Busy keys: their lock holders usually finish in a moment.
        for _ in 0..BUSY_RETRIES {
            if busy.is_empty() {
                break;
            }
            stopped()?;
            std::thread::sleep(BUSY_PAUSE);
            let mut still = Vec::new();
            for (t, key) in busy {
                match self.checkpoint_read(&t, &key, ckpt_txn) {
                    Read::Value(v) => rows.push(&mut w, t.inner.id, key, v)?,
                    Read::Absent => {}
                    Read::Busy => still.push((t, key)),
                }
            }
            busy = still;
        }
        if !busy.is_empty() {
            stopped()?;
            let keys = busy.into_iter().map(|(t, k)| (t.inner.id, k)).collect();
            for ((table, key), value) in self.committed_below(vfs, log, dir, lsn, keys)? {
                if let Some(v) = value {
                    rows.push(&mut w, table, key, v)?;
                }
            }
        }
        rows.flush(&mut w)?;
        // Every value read above was committed with a record below `released` now: make it
        // durable before the checkpoint that contains it can replace the log.
        log.flush()?;
        stopped()?;
        w.finish()?;
        let segs = segment::list(vfs, log.dir())?;
        for pair in segs.windows(2) {
            if pair[1].0 <= lsn {
                vfs.remove(&pair[0].1)
                    .map_err(crate::vfs::on("remove", &pair[0].1))?;
            }
        }
        Ok(Some(lsn))
    }

    /// The committed values of `keys` as of LSN `lsn`: the last after-image below `lsn` of
    /// each, from the newest checkpoint and the log after it (`None`: absent). Flushes the log
    /// up to `lsn` first.
    fn committed_below(
        &self,
        vfs: &dyn Vfs,
        log: &LogBuffer,
        dir: &Path,
        lsn: u64,
        keys: Vec<(TableId, Vec<u8>)>,
    ) -> Result<KeyValues> {
        let mut values: KeyValues = keys.into_iter().map(|k| (k, None)).collect();
        log.wait_durable(lsn)?;
        let mut exact = super::recovery::ExactAdds::default();
        let mut after = |table, key: Vec<u8>, r: Redo| {
            let k = (table, key);
            if let Some(v) = values.get_mut(&k) {
                *v = exact.after(table, &k.1, r, v.as_deref());
            }
            Ok(())
        };
        // The previous checkpoint cannot go meanwhile: checkpoints run one at a time.
        let from = match checkpoint::load_latest(vfs, dir)? {
            Some(prev) => {
                for rec in prev.records {
                    redo(rec, (dir, prev.lsn), &mut after)?;
                }
                prev.lsn
            }
            None => 0,
        };
        segment::replay(vfs, log.dir(), from, Some(lsn), |at, rec| {
            redo(rec, (log.dir(), at), &mut after).map(|_| ())
        })?;
        Ok(values)
    }
}

impl Database {
    pub(super) fn spawn_checkpointer(&self, every: Duration) -> Result<()> {
        // The thread holds the database only weakly, and strongly only while it checkpoints;
        // it never holds a user handle. The last user handle's drop stops and joins it.
        let weak = Arc::downgrade(&self.inner);
        let ctl = Arc::clone(&self.inner.checkpointer);
        let h = std::thread::Builder::new()
            .name("shoal-checkpointer".into())
            .spawn(move || {
                while ctl.sleep(every) {
                    let Some(inner) = weak.upgrade() else { return };
                    let res = inner.take_checkpoint(Some(&ctl.stop));
                    if ctl.stop.load(Ordering::Acquire) {
                        return;
                    }
                    ctl.report(&res);
                }
            })
            .map_err(|source| Error::Io {
                path: PathBuf::from("<checkpoint thread>"),
                source,
            })?;
        *self.inner.checkpointer.thread.lock() = Some(h);
        Ok(())
    }

    /// Writes a checkpoint (a snapshot of every table plus the LSN it covers) and deletes the
    /// log segments and older checkpoints it makes unnecessary. Transactions keep running
    /// meanwhile: under two-phase locking a checkpoint neither waits for a lock nor makes a
    /// transaction wait, whatever the deadlock policy (the committed value of a key a
    /// transaction holds locked comes from the log). Returns the checkpoint's LSN, or `None`
    /// without a log.
    ///
    /// Under Doppel a checkpoint runs in a joined phase; this call waits at most
    /// [`DoppelOptions::stash_wait`](crate::doppel::DoppelOptions::stash_wait) for one and
    /// then returns an [`Error::Io`] of kind [`TimedOut`](std::io::ErrorKind::TimedOut) (a
    /// split-phase transaction of another thread stayed open); call again later.
    ///
    /// If a background checkpoint ([`Options::checkpoint_interval`]) failed since the last
    /// call, this call returns that failure instead (once), as an [`Error::Io`] whose message
    /// starts with `background checkpoint failed`, without taking a checkpoint; call again to
    /// take one. [`checkpoint_status`](Self::checkpoint_status) counts the failures.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// {
    ///     let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    ///     let t = db.create_table("t")?;
    ///     db.run(|tx| tx.put(&t, "k", "v"))?;
    ///     // A transaction holding a lock does not hold the checkpoint up.
    ///     let mut tx = db.begin();
    ///     tx.put(&t, "k", "uncommitted")?;
    ///     assert!(db.checkpoint()?.is_some());
    ///     tx.abort();
    /// }
    /// let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    /// let t = db.table("t")?;
    /// assert_eq!(db.run(|tx| tx.get(&t, "k"))?, Some(b"v".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn checkpoint(&self) -> Result<Option<u64>> {
        let pending = self.inner.checkpointer.status.lock().pending.take();
        if let Some(msg) = pending {
            return Err(Error::Io {
                path: self.inner.dir.clone().unwrap_or_default(),
                source: std::io::Error::other(format!("background checkpoint failed: {msg}")),
            });
        }
        self.inner.take_checkpoint(None)
    }

    /// What the background checkpointer ([`Options::checkpoint_interval`]) has done: how many
    /// checkpoints it attempted, how many failed, and the last failure's message. A failure
    /// is also returned once by the next [`checkpoint`](Self::checkpoint) call.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = shoal::Options::default().with_checkpoint_interval(Some(Duration::from_millis(1)));
    /// let db = shoal::Database::open(dir.path(), opts)?;
    /// while db.checkpoint_status().background_runs == 0 {
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// let st = db.checkpoint_status();
    /// assert_eq!(st.background_failures, 0);
    /// assert_eq!(st.last_error, None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn checkpoint_status(&self) -> CheckpointStatus {
        self.inner.checkpointer.status.lock().status.clone()
    }
}
