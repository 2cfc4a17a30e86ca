//! openraft's `RaftStateMachine` over [`StateDb`]; the only publisher of [`ClusterView`].

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder};
use tokio::sync::{broadcast, watch};

use super::types::{Entry, LogId, Reply, Response, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig};
use crate::cluster::{ApplyEvent, ClusterView};
use crate::codec::encode;
use crate::metrics::Metrics;
use crate::store::state::{Meta, StateDb};
use crate::store::StoreError;

/// The replicated state machine.
pub struct StateMachine {
    db: StateDb,
    meta: Meta,
    view: watch::Sender<Arc<ClusterView>>,
    snapshots_built: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
    events: broadcast::Sender<ApplyEvent>,
}

impl StateMachine {
    /// Opens on `db` with its loaded `meta` and publishes the first view.
    pub fn new(db: StateDb, meta: Meta, metrics: Arc<Metrics>) -> (StateMachine, watch::Receiver<Arc<ClusterView>>) {
        let (view, rx) = watch::channel(Arc::new(ClusterView::new(meta.clone(), None)));
        let (events, _) = broadcast::channel(4096);
        (StateMachine { db, meta, view, snapshots_built: Arc::default(), metrics, events }, rx)
    }

    /// Subscribes to what applies did (kicks and sweeps); a lagging subscriber must reconcile.
    pub fn events(&self) -> broadcast::Receiver<ApplyEvent> {
        self.events.subscribe()
    }

    /// A read handle for point lookups (routes) outside the Raft core.
    pub fn db(&self) -> StateDb {
        self.db.clone()
    }

    fn publish(&mut self, meta: Meta) {
        self.meta = meta.clone();
        self.view.send_modify(|v| *v = Arc::new(ClusterView::new(meta, Some(v))));
    }
}

async fn blocking<T, F>(subject: ErrorSubject<u64>, verb: ErrorVerb, f: F) -> Result<T, StorageError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| e.into_raft(subject, verb)),
        Err(join) => Err(StoreError::Corrupt(format!("state task failed: {join}")).into_raft(subject, verb)),
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.meta.last_applied, self.meta.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let (db, meta) = (self.db.clone(), self.meta.clone());
        let (responses, meta, deliveries) = blocking(ErrorSubject::StateMachine, ErrorVerb::Write, move || {
            let mut deliveries = Vec::new();
            let (responses, meta) = db.apply_with(&meta, entries, &mut deliveries)?;
            Ok((responses, meta, deliveries))
        })
        .await?;
        self.publish(meta);
        for d in deliveries {
            let _ = self.events.send(ApplyEvent::Published(d));
        }
        for reply in responses.iter().flat_map(|r| &r.replies) {
            let ev = match reply {
                Reply::Accepted { superseded: Some(s), .. } => ApplyEvent::Superseded { node: s.node, conn: s.conn },
                Reply::Swept { expired, .. } if !expired.is_empty() => ApplyEvent::Swept { nodes: expired.clone() },
                _ => continue,
            };
            // No subscriber (tests, or before the device listener starts) is fine.
            let _ = self.events.send(ev);
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder { db: self.db.clone(), built: self.snapshots_built.clone(), metrics: self.metrics.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let (db, smeta, data) = (self.db.clone(), meta.clone(), snapshot.into_inner());
        let subject = ErrorSubject::Snapshot(Some(meta.signature()));
        let meta = blocking(subject, ErrorVerb::Write, move || db.install(&smeta, &data)).await?;
        self.metrics.snapshots_installed.inc();
        let _ = self.events.send(ApplyEvent::Installed);
        tracing::info!(last_log_id = ?meta.last_applied, "installed a snapshot from the leader");
        self.publish(meta);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let db = self.db.clone();
        let current = blocking(ErrorSubject::Snapshot(None), ErrorVerb::Read, move || db.load_snapshot()).await?;
        Ok(current.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
    }
}

/// Builds a snapshot from one read transaction while applies continue.
pub struct SnapshotBuilder {
    db: StateDb,
    built: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let db = self.db.clone();
        let n = self.built.fetch_add(1, Ordering::Relaxed) + 1;
        let (meta, data) = blocking(ErrorSubject::Snapshot(None), ErrorVerb::Read, move || {
            let (meta, body) = db.dump()?;
            let data = encode(&body)?;
            let snapshot_id = match meta.last_applied {
                Some(l) => format!("{}-{}-{n}", l.leader_id, l.index),
                None => format!("none-{n}"),
            };
            let smeta = SnapshotMeta { last_log_id: meta.last_applied, last_membership: meta.membership, snapshot_id };
            db.save_snapshot(&smeta, &data)?;
            Ok((smeta, data))
        })
        .await?;
        self.metrics.snapshots_built.inc();
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}
