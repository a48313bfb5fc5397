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
    /// Wall time of the whole recovery.
    pub elapsed: Duration,
}

fn table_of<'a>(
    by_id: &'a BTreeMap<TableId, Table>,
    id: TableId,
    at: (&Path, u64),
) -> Result<&'a Table> {
    by_id.get(&id).ok_or_else(|| Error::Corrupt {
        path: at.0.to_path_buf(),
        offset: at.1,
        detail: format!("a commit record names table id {id} that was never created"),
    })
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
    let apply =
        |by_id: &mut BTreeMap<TableId, Table>, rec: LogRecord, at: (&Path, u64)| -> Result<u64> {
            match rec {
                LogRecord::CreateTable { id, name } => {
                    if id as usize >= MAX_TABLES {
                        return Err(Error::Corrupt {
                            path: at.0.to_path_buf(),
                            offset: at.1,
                            detail: format!(
                                "a create-table record names table id {id}, beyond the limit of \
                                 {} tables",
                                MAX_TABLES - 1
                            ),
                        });
                    }
                    by_id
                        .entry(id)
                        .or_insert_with(|| new_table(id, &name, db_id));
                    Ok(0)
                }
                LogRecord::Commit { writes, .. } => {
                    let n = writes.len() as u64;
                    for w in writes {
                        let t = by_id.get(&w.table).ok_or_else(|| Error::Corrupt {
                            path: at.0.to_path_buf(),
                            offset: at.1,
                            detail: format!(
                                "a commit record names table id {} that was never created",
                                w.table
                            ),
                        })?;
                        let value = w.value;
                        t.inner.tree.update(&w.key, |slot| {
                            *slot = value.map(|value| Record {
                                value,
                                ghost: false,
                                tid: 0,
                            });
                        });
                    }
                    Ok(n)
                }
                LogRecord::Ops { writes, ops, .. } => {
                    let n = (writes.len() + ops.len()) as u64;
                    for w in writes {
                        let t = table_of(by_id, w.table, at)?;
                        let value = w.value;
                        t.inner.tree.update(&w.key, |slot| {
                            *slot = value.map(|value| Record {
                                value,
                                ghost: false,
                                tid: 0,
                            });
                        });
                    }
                    for o in ops {
                        let t = table_of(by_id, o.table, at)?;
                        let d =
                            crate::doppel::Delta::decode(&o.op).ok_or_else(|| Error::Corrupt {
                                path: at.0.to_path_buf(),
                                offset: at.1,
                                detail: "an undecodable split operation".into(),
                            })?;
                        t.inner.tree.update(&o.key, |slot| {
                            let cur = slot.as_ref().filter(|r| !r.ghost).map(|r| &r.value[..]);
                            if let Ok(value) = d.apply(&o.key, cur, true) {
                                *slot = Some(Record {
                                    value,
                                    ghost: false,
                                    tid: 0,
                                });
                            }
                        });
                    }
                    Ok(n)
                }
                LogRecord::CheckpointEnd { .. } => Err(Error::Corrupt {
                    path: at.0.to_path_buf(),
                    offset: at.1,
                    detail: "a checkpoint marker inside the log".into(),
                }),
            }
        };
    if let Some(ck) = checkpoint::load_latest(vfs, dir)? {
        from = ck.lsn;
        stats.checkpoint_lsn = Some(ck.lsn);
        for rec in ck.records {
            stats.checkpoint_rows += apply(&mut by_id, rec, (dir, 0))?;
        }
    }
    let mut records = 0u64;
    let scan = segment::replay(vfs, log_dir, from, |lsn, rec| {
        records += 1;
        apply(&mut by_id, rec, (log_dir, lsn)).map(|_| ())
    })?;
    stats.log_records = records;
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
