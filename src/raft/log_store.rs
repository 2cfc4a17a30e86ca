//! openraft's `RaftLogStorage` over [`LogDb`]. An append is readable as soon as it returns (the
//! entries go to the in-memory [`Tail`]) and durable when its callback fires: a dedicated writer
//! thread writes queued appends in one write and one `fdatasync` of the log's segment file, so the
//! leader's flush runs while the followers' appends are on the wire (openraft 0.10 replicates
//! without waiting for the leader's own flush). Every other write and every read of the log's
//! files goes through the same thread, in order. The committed log id (a replay hint) rides with
//! the next append; the vote is cached.

use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use tokio::sync::oneshot;

use super::tail::Tail;
use super::types::{Entry, LogId, TypeConfig, Vote};
use crate::metrics::writes::Part;
use crate::metrics::Metrics;
use crate::store::log::LogDb;
use crate::store::StoreError;

/// Most bytes (by [`super::tail::weight`]) one write folds from queued appends.
const MAX_GROUP_BYTES: usize = 8 << 20;

/// Work for the writer thread, done in the order it was queued.
enum Op {
    Append {
        entries: Vec<(u64, Entry)>,
        weight: usize,
        committed: Option<Option<LogId>>,
        done: IOFlushed<TypeConfig>,
    },
    /// `timed`: a write, timed as the store's (`metrics::writes`); a read (a startup replay reads
    /// the whole log at once) is not.
    Run {
        f: Box<dyn FnOnce(&LogDb) + Send>,
        timed: bool,
    },
}

/// The writer thread's queue; the thread ends when the last store clone is dropped.
struct Writer {
    tx: mpsc::Sender<Op>,
}

impl Writer {
    fn start(db: LogDb, metrics: Arc<Metrics>) -> io::Result<Writer> {
        let (tx, rx) = mpsc::channel::<Op>();
        std::thread::Builder::new().name("raft-log".into()).spawn(move || write_loop(&db, &rx, &metrics))?;
        Ok(Writer { tx })
    }

    fn send(&self, op: Op) -> io::Result<()> {
        self.tx.send(op).map_err(|_| io::Error::other("the log writer thread has stopped"))
    }

    /// Reads with `f` on the writer thread after every write queued before it.
    async fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&LogDb) -> Result<T, StoreError> + Send + 'static,
    ) -> io::Result<T> {
        self.queue(what, false, f).await
    }

    /// Writes with `f` on the writer thread after every write queued before it.
    async fn write<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&LogDb) -> Result<T, StoreError> + Send + 'static,
    ) -> io::Result<T> {
        self.queue(what, true, f).await
    }

    async fn queue<T: Send + 'static>(
        &self,
        what: &'static str,
        timed: bool,
        f: impl FnOnce(&LogDb) -> Result<T, StoreError> + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = oneshot::channel();
        let f = Box::new(move |db: &LogDb| {
            let _ = tx.send(f(db));
        });
        self.send(Op::Run { f, timed })?;
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(io::Error::other(format!("{what}: {e}"))),
            Err(_) => Err(io::Error::other(format!("{what}: the log writer thread has stopped"))),
        }
    }
}

/// Writes queued appends in groups (one write, one `fdatasync`) and runs the other operations
/// between them, in queue order.
fn write_loop(db: &LogDb, rx: &mpsc::Receiver<Op>, metrics: &Metrics) {
    let mut next = rx.recv().ok();
    while let Some(op) = next.take() {
        let (entries, weight, committed, done) = match op {
            Op::Run { f, timed } => {
                let running = timed.then(|| metrics.store_writes.begin(Part::Log));
                f(db);
                drop(running);
                next = rx.recv().ok();
                continue;
            }
            Op::Append { entries, weight, committed, done } => (entries, weight, committed, done),
        };
        let (mut rows, mut dones, mut committed, mut bytes) = (entries, vec![done], committed, weight);
        // Fold the appends queued behind this one, up to the first other operation.
        while bytes < MAX_GROUP_BYTES {
            match rx.try_recv() {
                Ok(Op::Append { entries, weight, committed: c, done }) => {
                    rows.extend(entries);
                    dones.push(done);
                    committed = c.or(committed);
                    bytes += weight;
                }
                Ok(other) => {
                    next = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        metrics.log_fsyncs.inc();
        let running = metrics.store_writes.begin(Part::Log);
        let res = db.append(&rows, committed.as_ref());
        drop(running);
        for done in dones {
            done.io_completed(res.as_ref().map(|_| ()).map_err(|e| io::Error::other(format!("log append: {e}"))));
        }
        if next.is_none() {
            next = rx.recv().ok();
        }
    }
}

/// The Raft log store; its clones are the log readers.
#[derive(Clone)]
pub struct LogStore {
    writer: Arc<Writer>,
    /// The vote as last saved (openraft reads it twice per replication read).
    vote: Arc<Mutex<Option<Option<Vote>>>>,
    committed: Arc<AtomicU64>,
    /// The last committed log id openraft reported and no append has written yet.
    unsaved_committed: Arc<Mutex<Option<Option<LogId>>>>,
    tail: Arc<Mutex<Tail>>,
    metrics: Arc<Metrics>,
}

impl LogStore {
    /// `committed` is kept current with the committed index openraft reports (for status).
    pub fn new(db: LogDb, committed: Arc<AtomicU64>, metrics: Arc<Metrics>) -> io::Result<Self> {
        let writer = Arc::new(Writer::start(db, metrics.clone())?);
        let (vote, unsaved_committed, tail) = Default::default();
        Ok(LogStore { writer, vote, committed, unsaved_committed, tail, metrics })
    }

    fn cached_vote(&self) -> std::sync::MutexGuard<'_, Option<Option<Vote>>> {
        self.vote.lock().unwrap_or_else(|p| p.into_inner())
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
    ) -> Result<Vec<Entry>, io::Error> {
        if let Some(entries) = inclusive(&range).and_then(|(start, end)| self.tail().get(start, end)) {
            return Ok(entries);
        }
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        self.writer.run("log read", move |db| db.entries(range)).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        if let Some(v) = *self.cached_vote() {
            return Ok(v);
        }
        let vote: Option<Vote> = self.writer.run("vote read", |db| db.read_vote()).await?;
        *self.cached_vote() = Some(vote);
        Ok(vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let (last_purged_log_id, last) =
            self.writer.run("log state read", move |db| Ok((db.last_purged::<LogId>()?, db.last::<Entry>()?))).await?;
        let last_log_id = last.map(|e| e.log_id).or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let v = *vote;
        self.writer.write("vote write", move |db| db.save_vote(&v)).await?;
        *self.cached_vote() = Some(Some(v));
        Ok(())
    }

    /// Kept for the next append to write (openraft calls this on every commit: a write of its
    /// own would cost every node a flush per entry).
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        if let Some(c) = committed {
            self.committed.fetch_max(c.index, Ordering::Relaxed);
        }
        *self.unsaved_committed() = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        if let Some(c) = *self.unsaved_committed() {
            return Ok(c);
        }
        self.writer.run("committed read", |db| db.read_committed()).await
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<(u64, Entry)> = entries.into_iter().map(|e| (e.log_id.index, e)).collect();
        self.metrics.log_entries.inc_by(entries.len() as u64);
        let weight = {
            let mut tail = self.tail();
            entries.iter().map(|(_, e)| tail.push(e)).sum()
        };
        let committed = self.unsaved_committed().take();
        self.writer.send(Op::Append { entries, weight, committed, done: callback })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        self.tail().truncate(from);
        self.writer.write("log truncate", move |db| db.truncate(from)).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.tail().purge(log_id.index);
        self.writer.write("log purge", move |db| db.purge(log_id.index, &log_id)).await
    }
}
