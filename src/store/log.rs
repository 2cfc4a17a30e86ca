//! `log.redb`: the Raft log (index → entry) and its meta (vote, last purged, committed). Every
//! append and vote is fsynced (`Durability::Immediate`) before it is acknowledged; a purge deletes
//! entries and records `last_purged` in one transaction.

use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::StoreError;
use crate::codec::{decode, encode};
use crate::raft::types::{Entry, LogId, Vote};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("log_meta");

const VOTE: &str = "vote";
const LAST_PURGED: &str = "last_purged";
const COMMITTED: &str = "committed";

/// Handle on `log.redb`. Cheap to clone; the log reader is a clone.
#[derive(Clone)]
pub struct LogDb {
    db: Arc<Database>,
}

impl LogDb {
    pub fn open(dir: &Path) -> Result<LogDb, StoreError> {
        let db = Database::create(dir.join("log.redb"))?;
        let txn = db.begin_write()?;
        txn.open_table(LOG)?;
        txn.open_table(META)?;
        txn.commit()?;
        Ok(LogDb { db: Arc::new(db) })
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(META)?;
        let v = t.get(key)?;
        Ok(v.map(|v| decode(v.value())).transpose()?)
    }

    fn put_meta<T: serde::Serialize>(&self, key: &str, value: &T, durability: Durability) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(durability)?;
        txn.open_table(META)?.insert(key, encode(value)?.as_slice())?;
        txn.commit()?;
        Ok(())
    }

    /// (last purged log id, last log id).
    pub fn state(&self) -> Result<(Option<LogId>, Option<LogId>), StoreError> {
        let purged: Option<LogId> = self.get_meta::<Option<LogId>>(LAST_PURGED)?.flatten();
        let txn = self.db.begin_read()?;
        let t = txn.open_table(LOG)?;
        let last = match t.last()? {
            Some((_, v)) => Some(decode::<Entry>(v.value())?.log_id),
            None => purged,
        };
        Ok((purged, last))
    }

    pub fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, StoreError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => Some(e),
            Bound::Excluded(&0) => return Ok(Vec::new()),
            Bound::Excluded(&e) => Some(e - 1),
            Bound::Unbounded => None,
        };
        if end.is_some_and(|e| e < start) {
            return Ok(Vec::new());
        }
        let txn = self.db.begin_read()?;
        let t = txn.open_table(LOG)?;
        let iter = match end {
            Some(e) => t.range(start..=e)?,
            None => t.range(start..)?,
        };
        iter.map(|row| Ok(decode(row?.1.value())?)).collect()
    }

    /// Appends entries durably (one fsync for the whole call).
    pub fn append(&self, entries: Vec<Entry>) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut t = txn.open_table(LOG)?;
            for e in &entries {
                t.insert(e.log_id.index, encode(e)?.as_slice())?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Deletes entries with index >= `from` (conflicting suffix).
    pub fn truncate(&self, from: u64) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.open_table(LOG)?.retain_in(from.., |_, _| false)?;
        txn.commit()?;
        Ok(())
    }

    /// Deletes entries up to and including `upto` and records it as last purged, atomically.
    pub fn purge(&self, upto: LogId) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.open_table(LOG)?.retain_in(..=upto.index, |_, _| false)?;
        txn.open_table(META)?.insert(LAST_PURGED, encode(&Some(upto))?.as_slice())?;
        txn.commit()?;
        Ok(())
    }

    pub fn save_vote(&self, vote: &Vote) -> Result<(), StoreError> {
        self.put_meta(VOTE, vote, Durability::Immediate)
    }

    pub fn read_vote(&self) -> Result<Option<Vote>, StoreError> {
        self.get_meta(VOTE)
    }

    /// The committed index is a hint for replay at start-up: it rides along with the next fsync.
    pub fn save_committed(&self, committed: &Option<LogId>) -> Result<(), StoreError> {
        self.put_meta(COMMITTED, committed, Durability::None)
    }

    pub fn read_committed(&self) -> Result<Option<LogId>, StoreError> {
        Ok(self.get_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }
}
