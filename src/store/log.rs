//! `log.redb`: the Raft log (index → entry) and its meta (vote, last purged, committed). Every
//! append and vote is fsynced (`Durability::Immediate`) before it is acknowledged; a purge deletes
//! entries and records `last_purged` in one transaction. Generic over the values it stores (the
//! Raft adapter's entry, log id and vote types): this module knows redb, not openraft.

use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::StoreError;
use crate::codec::{decode, encode};

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
    /// Opens (or creates) `log.redb` in `dir` with a page cache of `cache_bytes`.
    pub fn open(dir: &Path, cache_bytes: usize) -> Result<LogDb, StoreError> {
        let db = redb::Builder::new().set_cache_size(cache_bytes).create(dir.join("log.redb"))?;
        let txn = db.begin_write()?;
        txn.open_table(LOG)?;
        txn.open_table(META)?;
        txn.commit()?;
        Ok(LogDb { db: Arc::new(db) })
    }

    fn get_meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(META)?;
        let v = t.get(key)?;
        Ok(v.map(|v| decode(v.value())).transpose()?)
    }

    /// Writes one meta row durably (the vote: it must survive a crash before it is answered).
    fn put_meta<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.open_table(META)?.insert(key, encode(value)?.as_slice())?;
        txn.commit()?;
        Ok(())
    }

    /// The last purged log id (see [`LogDb::purge`]).
    pub fn last_purged<L: DeserializeOwned>(&self) -> Result<Option<L>, StoreError> {
        Ok(self.get_meta::<Option<L>>(LAST_PURGED)?.flatten())
    }

    /// The entry with the highest index.
    pub fn last<E: DeserializeOwned>(&self) -> Result<Option<E>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(LOG)?;
        let last = t.last()?;
        Ok(last.map(|(_, v)| decode(v.value())).transpose()?)
    }

    pub fn entries<E: DeserializeOwned>(&self, range: impl RangeBounds<u64>) -> Result<Vec<E>, StoreError> {
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

    /// Appends `(index, entry)` pairs durably (one fsync for the whole call), and with them the
    /// committed log id hint, if one is given (see [`LogDb::save_committed`]).
    pub fn append<E: Serialize, L: Serialize>(
        &self,
        entries: &[(u64, E)],
        committed: Option<&Option<L>>,
    ) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut t = txn.open_table(LOG)?;
            for (index, e) in entries {
                t.insert(*index, encode(e)?.as_slice())?;
            }
        }
        if let Some(c) = committed {
            txn.open_table(META)?.insert(COMMITTED, encode(c)?.as_slice())?;
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

    /// Deletes entries up to and including `upto` and records `log_id` as last purged, atomically.
    pub fn purge<L: Serialize>(&self, upto: u64, log_id: &L) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.open_table(LOG)?.retain_in(..=upto, |_, _| false)?;
        txn.open_table(META)?.insert(LAST_PURGED, encode(&Some(log_id))?.as_slice())?;
        txn.commit()?;
        Ok(())
    }

    pub fn save_vote<V: Serialize>(&self, vote: &V) -> Result<(), StoreError> {
        self.put_meta(VOTE, vote)
    }

    pub fn read_vote<V: DeserializeOwned>(&self) -> Result<Option<V>, StoreError> {
        self.get_meta(VOTE)
    }

    /// The committed log id written by the last [`LogDb::append`] that carried one: a hint for
    /// replay at start-up (an older one only means more replay).
    pub fn read_committed<L: DeserializeOwned>(&self) -> Result<Option<L>, StoreError> {
        Ok(self.get_meta::<Option<L>>(COMMITTED)?.flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed hint rides with an append and survives a reopen; an append without one
    /// leaves the last one written.
    #[test]
    fn committed_hint_rides_with_appends() {
        let dir = tempfile::tempdir().unwrap();
        let db = LogDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
        assert_eq!(db.read_committed::<u64>().unwrap(), None);
        db.append(&[(1, "a".to_string()), (2, "b".to_string())], Some(&Some(1u64))).unwrap();
        db.append(&[(3, "c".to_string())], None::<&Option<u64>>).unwrap();
        drop(db);
        let db = LogDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
        assert_eq!(db.read_committed::<u64>().unwrap(), Some(1));
        assert_eq!(db.entries::<String>(1..=3).unwrap(), ["a", "b", "c"]);
    }
}
