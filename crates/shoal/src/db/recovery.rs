//! Rebuilding the tables from the newest checkpoint and the log after it.

use super::*;

/// What [`Database::open`] found and replayed.
#[derive(Clone, Debug, Default)]
pub struct RecoveryStats {
    /// LSN of the checkpoint loaded, if any.
    pub checkpoint_lsn: Option<u64>,
    /// Rows loaded from the checkpoint.
    pub checkpoint_rows: u64,
    /// Log records replayed after the checkpoint.
    pub log_records: u64,
    /// Bytes of a torn tail cut from the end of the log (a flush cut short by a crash).
    pub torn_bytes: u64,
    /// Where those bytes were kept (`torn-<LSN>.bin` in the log directory), if any.
    pub torn_file: Option<PathBuf>,
    /// The LSN the log continues from.
    pub end_lsn: u64,
    /// The log ends with the record a clean close writes: the database was closed, not
    /// crashed, after its last commit. False for a new database and after a crash.
    pub closed_cleanly: bool,
    /// Wall time of the whole recovery.
    pub elapsed: Duration,
}

/// What a log record does to one key.
pub(super) enum Redo {
    /// Sets its value (`None`: deletes it).
    Put(Option<Vec<u8>>),
    /// Applies a Doppel split operation to its current value.
    Op(crate::doppel::Delta),
}

impl Redo {
    /// The key's value after this, given its value `cur` before (`None`: absent).
    pub(super) fn after(self, key: &[u8], cur: Option<&[u8]>) -> Option<Vec<u8>> {
        match self {
            Redo::Put(v) => v,
            // An operation that does not apply (a value of the wrong type) changes nothing,
            // as it did when it ran.
            Redo::Op(d) => match d.apply(key, cur, true) {
                Ok(v) => Some(v),
                Err(_) => cur.map(<[u8]>::to_vec),
            },
        }
    }
}

/// Calls `f(table, key, redo)` for every key a commit record (`Commit` or `Ops`) changes, in
/// replay order; returns how many. A checkpoint marker in the log or a split operation that
/// does not decode is `Error::Corrupt` at `at`; `CreateTable` records are the caller's.
pub(super) fn redo(
    rec: LogRecord,
    at: (&Path, u64),
    mut f: impl FnMut(TableId, Vec<u8>, Redo) -> Result<()>,
) -> Result<u64> {
    let corrupt = |detail: &str| Error::Corrupt {
        path: at.0.to_path_buf(),
        offset: at.1,
        detail: detail.to_string(),
    };
    let (writes, ops) = match rec {
        LogRecord::Commit { writes, .. } => (writes, Vec::new()),
        LogRecord::Ops { writes, ops, .. } => (writes, ops),
        LogRecord::CreateTable { .. } | LogRecord::Close => return Ok(0),
        LogRecord::CheckpointEnd { .. } => {
            return Err(corrupt("a checkpoint marker inside the log"))
        }
    };
    let n = (writes.len() + ops.len()) as u64;
    for w in writes {
        f(w.table, w.key, Redo::Put(w.value))?;
    }
    for o in ops {
        let d = crate::doppel::Delta::decode(&o.op)
            .ok_or_else(|| corrupt("an undecodable split operation"))?;
        f(o.table, o.key, Redo::Op(d))?;
    }
    Ok(n)
}

/// Rebuilds the tables from the newest checkpoint and the log after it.
pub(super) fn recover(
    vfs: &dyn Vfs,
    dir: &Path,
    log_dir: &Path,
    db_id: u64,
) -> Result<(HashMap<String, Table>, RecoveryStats)> {
    let t0 = Instant::now();
    let mut by_id: BTreeMap<TableId, Table> = BTreeMap::new();
    let mut stats = RecoveryStats::default();
    let mut from = 0;
    let apply = |by_id: &mut BTreeMap<TableId, Table>,
                 rec: LogRecord,
                 at: (&Path, u64)|
     -> Result<u64> {
        if let LogRecord::CreateTable { id, name } = &rec {
            if *id as usize >= MAX_TABLES {
                return Err(Error::Corrupt {
                    path: at.0.to_path_buf(),
                    offset: at.1,
                    detail: format!(
                        "a create-table record names table id {id}, beyond the limit of {} \
                             tables",
                        MAX_TABLES - 1
                    ),
                });
            }
            by_id
                .entry(*id)
                .or_insert_with(|| new_table(*id, name, db_id));
            return Ok(0);
        }
        redo(rec, at, |table, key, r| {
            let t = by_id.get(&table).ok_or_else(|| Error::Corrupt {
                path: at.0.to_path_buf(),
                offset: at.1,
                detail: format!("a commit record names table id {table} that was never created"),
            })?;
            t.inner.tree.update(&key, |slot| {
                let cur = slot.as_ref().filter(|r| !r.ghost).map(|r| &r.value[..]);
                *slot = r.after(&key, cur).map(|value| Record {
                    value,
                    ghost: false,
                    tid: 0,
                });
            });
            Ok(())
        })
    };
    if let Some(ck) = checkpoint::load_latest(vfs, dir)? {
        from = ck.lsn;
        stats.checkpoint_lsn = Some(ck.lsn);
        for rec in ck.records {
            stats.checkpoint_rows += apply(&mut by_id, rec, (dir, 0))?;
        }
    }
    let mut records = 0u64;
    let mut closed = false;
    let scan = segment::replay(vfs, log_dir, from, None, |lsn, rec| {
        closed = matches!(rec, LogRecord::Close);
        records += u64::from(!closed);
        apply(&mut by_id, rec, (log_dir, lsn)).map(|_| ())
    })?;
    stats.log_records = records;
    stats.closed_cleanly = closed && scan.torn_bytes == 0;
    stats.torn_bytes = scan.torn_bytes;
    stats.torn_file = scan.torn_file;
    stats.end_lsn = scan.end;
    stats.elapsed = t0.elapsed();
    let tables = by_id
        .into_values()
        .map(|t| (t.inner.name.clone(), t))
        .collect();
    Ok((tables, stats))
}
