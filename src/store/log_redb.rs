//! `log.redb`, the Raft log of builds before the segment files (`log/`, see [`super::log`]): read
//! once, raw, to migrate it; after that the file is replaced by a note that an older build cannot
//! open, so it can never start on a log that went backwards.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::StoreError;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("log_meta");

/// What replaces `log.redb` once migrated (not a redb file: an older build refuses to open it).
pub const MOVED_NOTE: &[u8] = b"gateway: this data dir's Raft log moved to log/ (segment files); \
this file stops an older build from starting on an empty log\n";

/// A `log.redb` as stored: every value as its codec bytes.
#[derive(Debug, Default)]
pub struct Legacy {
    pub vote: Option<Vec<u8>>,
    /// `Option<LogId>`'s bytes.
    pub last_purged: Option<Vec<u8>>,
    /// `Option<LogId>`'s bytes.
    pub committed: Option<Vec<u8>>,
    /// `(index, entry bytes)`, in index order.
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// Reads the whole of `path`.
pub fn read(path: &Path) -> Result<Legacy, StoreError> {
    let db = Database::open(path)?;
    let txn = db.begin_read()?;
    let mut out = Legacy::default();
    let meta = txn.open_table(META)?;
    let get = |k: &str| -> Result<Option<Vec<u8>>, StoreError> { Ok(meta.get(k)?.map(|v| v.value().to_vec())) };
    out.vote = get("vote")?;
    out.last_purged = get("last_purged")?;
    out.committed = get("committed")?;
    for row in txn.open_table(LOG)?.iter()? {
        let (k, v) = row?;
        out.entries.push((k.value(), v.value().to_vec()));
    }
    Ok(out)
}

/// Writes a `log.redb` as the older builds did (for the migration's tests).
#[cfg(test)]
pub fn write(path: &Path, legacy: &Legacy) -> Result<(), StoreError> {
    let db = Database::create(path)?;
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        for (k, v) in [("vote", &legacy.vote), ("last_purged", &legacy.last_purged), ("committed", &legacy.committed)] {
            if let Some(v) = v {
                meta.insert(k, v.as_slice())?;
            }
        }
        let mut log = txn.open_table(LOG)?;
        for (i, e) in &legacy.entries {
            log.insert(*i, e.as_slice())?;
        }
    }
    txn.commit()?;
    Ok(())
}
