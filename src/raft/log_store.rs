//! openraft's `RaftLogStorage` over [`LogDb`]: every redb call runs on the blocking pool. Two
//! savings per entry: replication reads of recent entries come from the in-memory [`Tail`], and
//! the committed log id (a replay hint) rides with the next append instead of a write of its own.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader};

use super::blocking;
use super::tail::Tail;
use super::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use crate::metrics::Metrics;
use crate::store::log::LogDb;

/// The Raft log store; its clones are the log readers.
#[derive(Clone)]
pub struct LogStore {
    db: LogDb,
    committed: Arc<AtomicU64>,
    /// The last committed log id openraft reported and no append has written yet.
    unsaved_committed: Arc<Mutex<Option<Option<LogId>>>>,
    tail: Arc<Mutex<Tail>>,
    metrics: Arc<Metrics>,
}

impl LogStore {
    /// `committed` is kept current with the committed index openraft reports (for status).
    pub fn new(db: LogDb, committed: Arc<AtomicU64>, metrics: Arc<Metrics>) -> Self {
        LogStore { db, committed, unsaved_committed: Default::default(), tail: Default::default(), metrics }
    }

    fn tail(&self) -> std::sync::MutexGuard<'_, Tail> {
        lock(&self.tail)
    }

    fn unsaved_committed(&self) -> std::sync::MutexGuard<'_, Option<Option<LogId>>> {
        self.unsaved_committed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The tail, whether or not a holder panicked (it holds no invariant a panic could break).
fn lock(tail: &Mutex<Tail>) -> std::sync::MutexGuard<'_, Tail> {
    tail.lock().unwrap_or_else(|p| p.into_inner())
}

/// The inclusive index range `range` names, if it names any index.
fn inclusive(range: &impl RangeBounds<u64>) -> Option<(u64, u64)> {
    let start = match range.start_bound() {
        std::ops::Bound::Included(&s) => s,
        std::ops::Bound::Excluded(&s) => s.checked_add(1)?,
        std::ops::Bound::Unbounded => return None,
    };
    let end = match range.end_bound() {
        std::ops::Bound::Included(&e) => e,
        std::ops::Bound::Excluded(&e) => e.checked_sub(1)?,
        std::ops::Bound::Unbounded => return None,
    };
    (start <= end).then_some((start, end))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        if let Some(entries) = inclusive(&range).and_then(|(start, end)| self.tail().get(start, end)) {
            return Ok(entries);
        }
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        let db = self.db.clone();
        blocking(ErrorSubject::Logs, ErrorVerb::Read, move || db.entries(range)).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let db = self.db.clone();
        let (last_purged_log_id, last) = blocking(ErrorSubject::Logs, ErrorVerb::Read, move || {
            Ok((db.last_purged::<LogId>()?, db.last::<Entry>()?))
        })
        .await?;
        let last_log_id = last.map(|e| e.log_id).or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let (db, vote) = (self.db.clone(), *vote);
        blocking(ErrorSubject::Vote, ErrorVerb::Write, move || db.save_vote(&vote)).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let db = self.db.clone();
        blocking(ErrorSubject::Vote, ErrorVerb::Read, move || db.read_vote()).await
    }

    /// Kept for the next append to write (openraft calls this on every commit: a write of its
    /// own would cost every node a redb transaction and two thread hand-offs per entry).
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        if let Some(c) = committed {
            self.committed.fetch_max(c.index, Ordering::Relaxed);
        }
        *self.unsaved_committed() = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        if let Some(c) = *self.unsaved_committed() {
            return Ok(c);
        }
        let db = self.db.clone();
        blocking(ErrorSubject::Store, ErrorVerb::Read, move || db.read_committed()).await
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<(u64, Entry)> = entries.into_iter().map(|e| (e.log_id.index, e)).collect();
        self.metrics.log_fsyncs.inc();
        self.metrics.log_entries.inc_by(entries.len() as u64);
        let committed = self.unsaved_committed().take();
        let (db, tail) = (self.db.clone(), self.tail.clone());
        let res = blocking(ErrorSubject::Logs, ErrorVerb::Write, move || {
            db.append(&entries, committed.as_ref())?;
            let mut tail = lock(&tail);
            entries.iter().for_each(|(_, e)| tail.push(e));
            Ok(())
        })
        .await;
        match &res {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        res
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.tail().truncate(log_id.index);
        let db = self.db.clone();
        blocking(ErrorSubject::Log(log_id), ErrorVerb::Delete, move || db.truncate(log_id.index)).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.tail().purge(log_id.index);
        let db = self.db.clone();
        blocking(ErrorSubject::Log(log_id), ErrorVerb::Delete, move || db.purge(log_id.index, &log_id)).await
    }
}
