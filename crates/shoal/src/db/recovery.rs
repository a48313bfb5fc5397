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

/// The exact value, unclamped, of every key that split ADDs changed since its last
/// after-image. Replay clamps a split phase's additions once, at the end, as reconciliation
/// does (see [`Delta::Add`](crate::doppel::Delta)): clamped one by one, `-10, +MAX, +MAX,
/// -MAX` would come back as 0 where the database held `MAX - 10`.
#[derive(Default)]
pub(super) struct ExactAdds(rustc_hash::FxHashMap<TableId, rustc_hash::FxHashMap<Vec<u8>, i128>>);

/// Keys whose split ADDs recovery replayed with no after-image after them.
pub(super) type Unreconciled = Vec<(TableId, Vec<u8>)>;

impl ExactAdds {
    /// The keys whose split ADDs were replayed with no after-image after them: their split
    /// phase was never reconciled in the log (a crash or a close in the middle of it).
    pub(super) fn keys(self) -> Unreconciled {
        self.0
            .into_iter()
            .flat_map(|(t, m)| m.into_keys().map(move |k| (t, k)))
            .collect()
    }

    /// [`Redo::after`], with a split ADD summed exactly on top of the key's earlier ones.
    pub(super) fn after(
        &mut self,
        table: TableId,
        key: &[u8],
        r: Redo,
        cur: Option<&[u8]>,
    ) -> Option<Vec<u8>> {
        let Redo::Op(crate::doppel::Delta::Add(n)) = r else {
            if let Some(m) = self.0.get_mut(&table) {
                m.remove(key);
            }
            return r.after(key, cur);
        };
        let keys = self.0.entry(table).or_default();
        let base = match (keys.get(key), cur) {
            (Some(&exact), _) => exact,
            (None, None) => 0,
            (None, Some(v)) => match <[u8; 8]>::try_from(v) {
                Ok(b) => i128::from(i64::from_le_bytes(b)),
                // Not an integer: the operation changed nothing when it ran.
                Err(_) => return Some(v.to_vec()),
            },
        };
        let exact = base.saturating_add(n);
        keys.insert(key.to_vec(), exact);
        Some(crate::doppel::clamp_i64(exact).to_le_bytes().to_vec())
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
    // No database accepts a longer key (`Options::max_key_len` is at most this), and the
    // tree has no room for one.
    let key = |k: Vec<u8>| {
        if k.len() > crate::storage::page::MAX_KEY {
            return Err(corrupt(&format!(
                "a key of {} bytes, more than any database accepts",
                k.len()
            )));
        }
        Ok(k)
    };
    for w in writes {
        f(w.table, key(w.key)?, Redo::Put(w.value))?;
    }
    for o in ops {
        let d = crate::doppel::Delta::decode(&o.op)
            .ok_or_else(|| corrupt("an undecodable split operation"))?;
        f(o.table, key(o.key)?, Redo::Op(d))?;
    }
    Ok(n)
}

/// Rebuilds the tables from the newest checkpoint and the log after it, as tables of
/// database `db_id` on huge pages when `huge` (`Options::huge_pages`).
pub(super) fn recover(
    vfs: &dyn Vfs,
    dir: &Path,
    log_dir: &Path,
    (db_id, huge): (u64, bool),
    pages: &Arc<crate::storage::page::PageCounts>,
) -> Result<(HashMap<String, Table>, RecoveryStats, Unreconciled)> {
    let t0 = Instant::now();
    let mut by_id: BTreeMap<TableId, Table> = BTreeMap::new();
    let mut stats = RecoveryStats::default();
    let mut from = 0;
    let mut exact = ExactAdds::default();
    let apply = |by_id: &mut BTreeMap<TableId, Table>,
                 exact: &mut ExactAdds,
                 rec: LogRecord,
                 at: (&Path, u64)|
     -> Result<u64> {
        if let LogRecord::CreateTable { id, name } = &rec {
            let corrupt = |detail: String| Error::Corrupt {
                path: at.0.to_path_buf(),
                offset: at.1,
                detail,
            };
            if *id == 0 || *id as usize >= MAX_TABLES {
                return Err(corrupt(format!(
                    "a create-table record names table id {id}, outside 1..{MAX_TABLES}"
                )));
            }
            if let Some(why) = super::catalog::bad_table_name(name) {
                return Err(corrupt(format!(
                    "a create-table record names table {name:?}, which is {why}"
                )));
            }
            // A table is created once under one name and one id (a checkpoint and the log
            // after it may both name it): any other pairing would put one table's rows
            // under another's name.
            if let Some(t) = by_id.get(id) {
                if t.inner.name != *name {
                    return Err(corrupt(format!(
                        "a create-table record names table id {id} {name:?}, already {:?}",
                        t.inner.name
                    )));
                }
                return Ok(0);
            }
            if let Some(t) = by_id.values().find(|t| t.inner.name == *name) {
                return Err(corrupt(format!(
                    "a create-table record names table {name:?} id {id}, already id {}",
                    t.inner.id
                )));
            }
            by_id.insert(*id, new_table(*id, name, db_id, pages, huge));
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
                *slot = exact.after(table, &key, r, cur).map(|value| Record {
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
            stats.checkpoint_rows += apply(&mut by_id, &mut exact, rec, (dir, 0))?;
        }
    }
    let mut records = 0u64;
    let mut closed = false;
    let scan = segment::replay(vfs, log_dir, from, None, |lsn, rec| {
        closed = matches!(rec, LogRecord::Close);
        records += u64::from(!closed);
        apply(&mut by_id, &mut exact, rec, (log_dir, lsn)).map(|_| ())
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
    Ok((tables, stats, exact.keys()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::record::Write;

    /// Appends `rec` to the log of `db` and waits until it is durable, as a commit would.
    fn log_raw(db: &Database, rec: &LogRecord) {
        let log = db.inner.log.as_ref().expect("a logged database");
        let (_, end) = log.insert(&rec.encode()).expect("insert");
        log.wait_durable(end).expect("durable");
    }

    /// A database with `tables`, then `rec` logged as it stands, then a reopen: the
    /// directory and what the reopen gave.
    fn reopened_after(tables: &[&str], rec: LogRecord) -> (tempfile::TempDir, Result<Database>) {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::open(dir.path(), Options::default()).unwrap();
            for t in tables {
                db.create_table(t).unwrap();
            }
            log_raw(&db, &rec);
        }
        let r = Database::open(dir.path(), Options::default());
        (dir, r)
    }

    fn is_corrupt(r: Result<Database>, what: &str) -> bool {
        match r {
            Err(Error::Corrupt { detail, .. }) => detail.contains(what),
            Err(e) => panic!("expected Corrupt ({what}), got {e}"),
            Ok(_) => false,
        }
    }

    #[test]
    fn a_logged_key_longer_than_any_database_accepts_fails_open_as_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::open(dir.path(), Options::default()).unwrap();
            let t = db.create_table("t").unwrap();
            db.run(|tx| tx.put(&t, "k", "v")).unwrap();
            // Two keys a page cannot hold beside each other: replaying them used to panic
            // in the tree's split.
            for b in [1u8, 2] {
                log_raw(
                    &db,
                    &LogRecord::Commit {
                        txn: 1_000 + u64::from(b),
                        writes: vec![Write {
                            table: t.inner.id,
                            key: vec![b; 20_000],
                            value: Some(b"v".to_vec()),
                        }],
                    },
                );
            }
        }
        let r = Database::open(dir.path(), Options::default());
        assert!(is_corrupt(r, "more than any database accepts"));
    }

    #[test]
    fn a_table_id_logged_under_two_names_fails_open_as_corrupt() {
        let b = LogRecord::CreateTable {
            id: 1,
            name: "b".into(),
        };
        assert!(is_corrupt(reopened_after(&["a"], b).1, "already \"a\""));
    }

    #[test]
    fn a_table_name_logged_under_two_ids_fails_open_as_corrupt() {
        let a = LogRecord::CreateTable {
            id: 7,
            name: "a".into(),
        };
        assert!(is_corrupt(reopened_after(&["a"], a).1, "already id 1"));
    }

    #[test]
    fn a_table_name_no_database_accepts_fails_open_as_corrupt() {
        for name in [String::new(), "a\nb".into(), "x".repeat(300)] {
            let (_dir, r) = reopened_after(&[], LogRecord::CreateTable { id: 1, name });
            assert!(is_corrupt(r, "a create-table record names table"));
        }
    }

    #[test]
    fn a_new_table_never_reuses_the_id_of_a_recovered_one() {
        // Ids with a gap (1 and 3): a new table numbered by the table count would be 3 too,
        // and its rows would be replayed into "c".
        let c = LogRecord::CreateTable {
            id: 3,
            name: "c".into(),
        };
        let (dir, r) = reopened_after(&["a"], c);
        {
            let db = r.unwrap();
            let c = db.table("c").unwrap();
            let d = db.create_table("d").unwrap();
            assert_ne!(c.inner.id, d.inner.id);
            db.run(|tx| {
                tx.put(&c, "k", "in c")?;
                tx.put(&d, "k", "in d")
            })
            .unwrap();
        }
        let db = Database::open(dir.path(), Options::default()).unwrap();
        let (c, d) = (db.table("c").unwrap(), db.table("d").unwrap());
        assert_eq!(
            db.run(|tx| tx.get(&c, "k")).unwrap(),
            Some(b"in c".to_vec())
        );
        assert_eq!(
            db.run(|tx| tx.get(&d, "k")).unwrap(),
            Some(b"in d".to_vec())
        );
    }

    #[test]
    fn a_log_file_named_past_any_lsn_fails_open_as_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::open(dir.path(), Options::default()).unwrap();
            db.create_table("a").unwrap();
        }
        for lsn in [u64::MAX, crate::log::record::MAX_LSN + 1] {
            let p = segment::path(dir.path(), lsn);
            std::fs::write(&p, []).unwrap();
            let r = Database::open(dir.path(), Options::default());
            assert!(is_corrupt(r, "beyond any log's end"));
            std::fs::remove_file(&p).unwrap();
        }
        let p = dir.path().join(format!("checkpoint-{}.ckpt", u64::MAX));
        std::fs::write(&p, []).unwrap();
        assert!(is_corrupt(
            Database::open(dir.path(), Options::default()),
            "beyond any log's end"
        ));
        std::fs::remove_file(&p).unwrap();
        assert!(Database::open(dir.path(), Options::default()).is_ok());
    }
}
