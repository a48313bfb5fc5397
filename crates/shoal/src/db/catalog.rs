//! The catalog: tables with their ids and names, and the registry by id that transactions
//! borrow their tables from.

use std::sync::Arc;

use super::{Database, DbInner};
use crate::error::{Error, Result};
use crate::lock::TableId;
use crate::log::record::LogRecord;
use crate::storage::btree::BTree;

pub(crate) struct TableInner {
    pub(crate) id: TableId,
    pub(crate) name: String,
    pub(crate) db_id: u64,
    pub(crate) tree: BTree,
}

/// A handle to a table: cheap to clone, valid for the life of its database.
///
/// ```
/// # fn main() -> shoal::Result<()> {
/// let db = shoal::Database::in_memory();
/// let t = db.create_table("users")?;
/// assert_eq!(t.name(), "users");
/// assert_eq!(db.table("users")?.name(), "users");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Table {
    pub(crate) inner: Arc<TableInner>,
}

impl Table {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("id", &self.inner.id)
            .field("name", &self.inner.name)
            .finish()
    }
}

/// Table ids a database can hold (ids are dense from 1).
pub(crate) const MAX_TABLES: usize = TABLE_CHUNK * TABLE_CHUNKS;
const TABLE_CHUNK: usize = 256;
const TABLE_CHUNKS: usize = 256;

/// Append-only map from table id to table, with stable addresses: a slot is set once and
/// never cleared, so `get` hands out references that live as long as the database.
pub(crate) struct TableSlots {
    chunks: Box<[std::sync::OnceLock<TableChunk>]>,
}

/// `TABLE_CHUNK` consecutive table ids.
type TableChunk = Box<[std::sync::OnceLock<Table>]>;

impl TableSlots {
    /// Slots holding `tables` (recovery refuses ids of [`MAX_TABLES`] or more).
    pub(super) fn with<'t>(tables: impl Iterator<Item = &'t Table>) -> TableSlots {
        let slots = TableSlots {
            chunks: (0..TABLE_CHUNKS)
                .map(|_| std::sync::OnceLock::new())
                .collect(),
        };
        for t in tables {
            let _ = slots.set(t);
        }
        slots
    }

    /// Records `t` under its id (a second table with the same id keeps the first).
    pub(super) fn set(&self, t: &Table) -> Result<()> {
        let id = t.inner.id as usize;
        let chunk = self
            .chunks
            .get(id / TABLE_CHUNK)
            .ok_or_else(|| Error::InvalidTableName {
                name: t.inner.name.clone(),
                reason: "too many tables",
            })?
            .get_or_init(|| {
                (0..TABLE_CHUNK)
                    .map(|_| std::sync::OnceLock::new())
                    .collect()
            });
        let _ = chunk[id % TABLE_CHUNK].set(t.clone());
        Ok(())
    }

    /// The table with id `id`, borrowed for as long as `self`.
    pub(crate) fn get(&self, id: TableId) -> Option<&Table> {
        let id = id as usize;
        self.chunks.get(id / TABLE_CHUNK)?.get()?[id % TABLE_CHUNK].get()
    }
}

impl DbInner {
    /// The table with this id.
    pub(crate) fn table_by_id(&self, id: TableId) -> Option<Table> {
        self.by_id.get(id).cloned()
    }
}

impl Database {
    /// Creates an empty table. Names are 1 to 255 bytes without control characters.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// db.create_table("a")?;
    /// assert!(matches!(db.create_table("a"), Err(shoal::Error::TableExists { .. })));
    /// assert!(db.create_table("").is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn create_table(&self, name: &str) -> Result<Table> {
        if let Some(reason) = bad_table_name(name) {
            return Err(Error::InvalidTableName {
                name: name.to_string(),
                reason,
            });
        }
        let mut tables = self.inner.tables.write();
        if tables.contains_key(name) {
            return Err(Error::TableExists {
                name: name.to_string(),
            });
        }
        // A table takes a page at once (its root): refused at the memory limit like a write.
        self.inner.check_memory(self.inner.held_bytes())?;
        // One past the highest id (ids are dense, but a recovered catalog is not trusted to
        // be: reusing an id would mix two tables' rows on the next recovery).
        let next = tables
            .values()
            .map(|t| t.inner.id as usize)
            .max()
            .unwrap_or(0)
            + 1;
        let id = TableId::try_from(next)
            .ok()
            .filter(|&id| (id as usize) < MAX_TABLES)
            .ok_or_else(|| Error::InvalidTableName {
                name: name.to_string(),
                reason: "too many tables",
            })?;
        if let Some(log) = &self.inner.log {
            let rec = LogRecord::CreateTable {
                id,
                name: name.to_string(),
            };
            let (_, end) = log.insert(&rec.encode())?;
            log.wait_durable(end)?;
        }
        let t = new_table(
            id,
            name,
            self.inner.id,
            &self.inner.pages,
            self.inner.opts.huge_pages,
        );
        self.inner.by_id.set(&t)?;
        tables.insert(name.to_string(), t.clone());
        Ok(t)
    }

    /// Looks a table up by name.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// db.create_table("t")?;
    /// assert!(db.table("t").is_ok());
    /// assert!(db.table("u").is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn table(&self, name: &str) -> Result<Table> {
        self.inner
            .tables
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NoSuchTable {
                name: name.to_string(),
            })
    }

    /// The names of all tables, sorted.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// db.create_table("b")?;
    /// db.create_table("a")?;
    /// assert_eq!(db.tables(), vec!["a".to_string(), "b".to_string()]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tables(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.tables.read().keys().cloned().collect();
        v.sort();
        v
    }

    /// Number of entries in a table's index, ghosts included (for tests of ghost removal).
    #[doc(hidden)]
    pub fn debug_index_len(&self, name: &str) -> Result<usize> {
        Ok(self.table(name)?.inner.tree.len())
    }

    /// The shape of a table's index: nodes, entries and ghosts (for tests of ghost removal
    /// and merges).
    #[doc(hidden)]
    pub fn debug_index_stats(&self, name: &str) -> Result<crate::storage::btree::TreeStats> {
        Ok(self.table(name)?.inner.tree.stats())
    }

    /// Checks the structure of a table's index ([`BTree::check_invariants`]): `Ok(Err(..))`
    /// describes the first violation.
    #[doc(hidden)]
    pub fn debug_index_check(&self, name: &str) -> Result<std::result::Result<(), String>> {
        Ok(self.table(name)?.inner.tree.check_invariants())
    }
}

/// Why `name` cannot name a table, if it cannot: empty, longer than 255 bytes, or holding a
/// control character.
pub(super) fn bad_table_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("empty")
    } else if name.len() > 255 {
        Some("longer than 255 bytes")
    } else if name.chars().any(char::is_control) {
        Some("contains a control character")
    } else {
        None
    }
}

/// A new, empty table whose pages count in `pages` (the database's pages in use), on huge
/// pages when `huge` ([`Options::huge_pages`](crate::Options::huge_pages)).
pub(super) fn new_table(
    id: TableId,
    name: &str,
    db_id: u64,
    pages: &Arc<crate::storage::page::PageCounts>,
    huge: bool,
) -> Table {
    Table {
        inner: Arc::new(TableInner {
            id,
            name: name.to_string(),
            db_id,
            tree: BTree::counted(Arc::clone(pages), huge),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_slots_hand_out_the_table_of_each_id_and_refuse_ids_past_the_limit() {
        let pages = Arc::default();
        let a = new_table(1, "a", 7, &pages, true);
        let b = new_table(300, "b", 7, &pages, true);
        let slots = TableSlots::with([&a].into_iter());
        slots.set(&b).unwrap();
        assert_eq!(slots.get(1).map(|t| t.inner.name.as_str()), Some("a"));
        assert_eq!(slots.get(300).map(|t| t.inner.name.as_str()), Some("b"));
        assert!(slots.get(2).is_none());
        assert!(slots.get(299).is_none());
        // A second table under a taken id keeps the first.
        slots.set(&new_table(1, "c", 7, &pages, true)).unwrap();
        assert_eq!(slots.get(1).map(|t| t.inner.name.as_str()), Some("a"));
        let far = new_table(MAX_TABLES as TableId, "far", 7, &pages, true);
        assert!(matches!(
            slots.set(&far),
            Err(Error::InvalidTableName { .. })
        ));
        assert!(slots.get(MAX_TABLES as TableId).is_none());
        assert!(slots.get(TableId::MAX).is_none());
    }
}
