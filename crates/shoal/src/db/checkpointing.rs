//! Taking checkpoints, on demand and in the background.

use super::*;

impl Database {
    pub(super) fn spawn_checkpointer(&self, every: Duration) -> Result<()> {
        let weak = Arc::downgrade(&self.inner);
        let stop = Arc::clone(&self.inner.stop);
        std::thread::Builder::new()
            .name("shoal-checkpointer".into())
            .spawn(move || {
                let tick = Duration::from_millis(20).min(every);
                let mut waited = Duration::ZERO;
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(tick);
                    waited += tick;
                    if waited < every {
                        continue;
                    }
                    waited = Duration::ZERO;
                    let Some(inner) = weak.upgrade() else { return };
                    let db = Database { inner };
                    // A failed background checkpoint leaves the previous one and the log in
                    // place, so nothing is lost; the next attempt tries again.
                    let _ = db.checkpoint();
                }
            })
            .map_err(|source| Error::Io {
                path: PathBuf::from("<checkpoint thread>"),
                source,
            })?;
        Ok(())
    }
    /// Writes a checkpoint (a snapshot of every table plus the LSN it covers) and deletes the
    /// log segments and older checkpoints it makes unnecessary. Transactions keep running
    /// meanwhile. Returns the checkpoint's LSN, or `None` without a log.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// {
    ///     let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    ///     let t = db.create_table("t")?;
    ///     db.run(|tx| tx.put(&t, "k", "v"))?;
    ///     assert!(db.checkpoint()?.is_some());
    /// }
    /// let db = shoal::Database::open(dir.path(), shoal::Options::default())?;
    /// let t = db.table("t")?;
    /// assert_eq!(db.run(|tx| tx.get(&t, "k"))?, Some(b"v".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn checkpoint(&self) -> Result<Option<u64>> {
        let inner = &*self.inner;
        let (Some(log), Some(dir), Some(disk)) = (&inner.log, &inner.dir, &inner.disk) else {
            return Ok(None);
        };
        let vfs = &*disk.vfs;
        let _one_at_a_time = inner.checkpoint_lock.lock();
        // Under Doppel a checkpoint runs inside a joined phase: no slice is unreconciled.
        let _pin = match inner.doppel() {
            Some(d) => Some(crate::doppel::Pin::new(d)?),
            None => None,
        };
        let lsn = log.released();
        let mut w = CheckpointWriter::create(vfs, dir, lsn)?;
        let mut tables: Vec<Table> = inner.tables.read().values().cloned().collect();
        tables.sort_by_key(|t| t.inner.id);
        let ckpt_txn = inner.next_txn.fetch_add(1, Ordering::Relaxed);
        for t in &tables {
            w.table(t.inner.id, &t.inner.name)?;
            let mut start: Bound<Vec<u8>> = Bound::Unbounded;
            loop {
                let chunk = {
                    let _serial =
                        (inner.opts.cc == ConcurrencyControl::Serial).then(|| inner.serial.lock());
                    let b = match &start {
                        Bound::Unbounded => Bound::Unbounded,
                        Bound::Excluded(k) => Bound::Excluded(&k[..]),
                        Bound::Included(k) => Bound::Included(&k[..]),
                    };
                    t.inner.tree.range(b, Bound::Unbounded, 1024)
                };
                let Some((last, _)) = chunk.last() else { break };
                let next = Bound::Excluded(last.clone());
                let full = chunk.len() == 1024;
                let mut rows = Vec::with_capacity(chunk.len());
                for (key, rec) in chunk {
                    let value = if matches!(
                        inner.opts.cc,
                        ConcurrencyControl::Optimistic | ConcurrencyControl::Doppel
                    ) {
                        // Wait out a committer's lock bit: a commit whose record is below
                        // `lsn` installs its values before it unlocks them.
                        crate::txn::occ::read_committed(&t.inner.tree, &key)
                    } else if inner.opts.cc == ConcurrencyControl::Serial {
                        // Read under the serial mutex: no transaction is half done.
                        let _serial = inner.serial.lock();
                        t.inner
                            .tree
                            .get(&key, |r| r.filter(|r| !r.ghost).map(|r| r.value.clone()))
                    } else {
                        // Instant shared key lock: never read an uncommitted value.
                        let id = LockId::Key(t.inner.id, key.clone().into_boxed_slice());
                        match inner
                            .locks
                            .lock(ckpt_txn, &id, LockMode::SN, inner.opts.lock_timeout)
                        {
                            Ok(_) => {
                                let v = t
                                    .inner
                                    .tree
                                    .get(&key, |r| r.filter(|r| !r.ghost).map(|r| r.value.clone()));
                                inner.locks.unlock(ckpt_txn, &id);
                                v
                            }
                            Err(_) => {
                                return Err(Error::LockTimeout {
                                    txn: ckpt_txn,
                                    resource: format!(
                                        "a key of table {:?} (checkpoint)",
                                        t.inner.name
                                    ),
                                    blocker: "?".into(),
                                    waited_ms: inner.opts.lock_timeout.as_millis() as u64,
                                })
                            }
                        }
                    };
                    let _ = rec;
                    if let Some(v) = value {
                        rows.push(LogWrite {
                            table: t.inner.id,
                            key,
                            value: Some(v),
                        });
                    }
                }
                w.rows(rows)?;
                if !full {
                    break;
                }
                start = next;
            }
        }
        // Every value read above was committed with a record below `released` now: make it
        // durable before the checkpoint that contains it can replace the log.
        log.flush()?;
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
}
