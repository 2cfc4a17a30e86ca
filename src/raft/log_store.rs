//! openraft's `RaftLogStorage` over [`LogDb`]: every call runs on the blocking pool.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader};

use super::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use crate::metrics::Metrics;
use crate::store::log::LogDb;
use crate::store::StoreError;

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

    async fn blocking<T, F>(&self, subject: ErrorSubject<u64>, verb: ErrorVerb, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&LogDb) -> Result<T, StoreError> + Send + 'static,
    {
        let db = self.db.clone();
        match tokio::task::spawn_blocking(move || f(&db)).await {
            Ok(r) => r.map_err(|e| e.into_raft(subject, verb)),
            Err(join) => Err(StoreError::Corrupt(format!("log store task failed: {join}")).into_raft(subject, verb)),
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        self.blocking(ErrorSubject::Logs, ErrorVerb::Read, move |db| db.entries(range)).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let (last_purged_log_id, last_log_id) =
            self.blocking(ErrorSubject::Logs, ErrorVerb::Read, |db| db.state()).await?;
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let vote = *vote;
        self.blocking(ErrorSubject::Vote, ErrorVerb::Write, move |db| db.save_vote(&vote)).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.blocking(ErrorSubject::Vote, ErrorVerb::Read, |db| db.read_vote()).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        if let Some(c) = committed {
            self.committed.fetch_max(c.index, Ordering::Relaxed);
        }
        self.blocking(ErrorSubject::Store, ErrorVerb::Write, move |db| db.save_committed(&committed)).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        self.blocking(ErrorSubject::Store, ErrorVerb::Read, |db| db.read_committed()).await
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        self.metrics.log_fsyncs.inc();
        self.metrics.log_entries.inc_by(entries.len() as u64);
        let res = self.blocking(ErrorSubject::Logs, ErrorVerb::Write, move |db| db.append(entries)).await;
        match &res {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        res
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.blocking(ErrorSubject::Log(log_id), ErrorVerb::Delete, move |db| db.truncate(log_id.index)).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.blocking(ErrorSubject::Log(log_id), ErrorVerb::Delete, move |db| db.purge(log_id)).await
    }
}
