//! openraft's `RaftLogStorage` over [`LogDb`]: every call runs on the blocking pool.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader};

use super::blocking;
use super::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use crate::metrics::Metrics;
use crate::store::log::LogDb;

/// The Raft log store; its clones are the log readers.
#[derive(Clone)]
pub struct LogStore {
    db: LogDb,
    committed: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
}

impl LogStore {
    /// `committed` is kept current with the committed index openraft reports (for status).
    pub fn new(db: LogDb, committed: Arc<AtomicU64>, metrics: Arc<Metrics>) -> Self {
        LogStore { db, committed, metrics }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
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

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        if let Some(c) = committed {
            self.committed.fetch_max(c.index, Ordering::Relaxed);
        }
        let db = self.db.clone();
        blocking(ErrorSubject::Store, ErrorVerb::Write, move || db.save_committed(&committed)).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
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
        let db = self.db.clone();
        let res = blocking(ErrorSubject::Logs, ErrorVerb::Write, move || db.append(&entries)).await;
        match &res {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        res
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let db = self.db.clone();
        blocking(ErrorSubject::Log(log_id), ErrorVerb::Delete, move || db.truncate(log_id.index)).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let db = self.db.clone();
        blocking(ErrorSubject::Log(log_id), ErrorVerb::Delete, move || db.purge(log_id.index, &log_id)).await
    }
}
