//! openraft's `RaftStateMachine` over `state.redb`: turns each entry into the domain's
//! [`Input`], runs [`machine::apply`] on the store's tables in one transaction per batch, keeps
//! the applied meta (last log id, membership) beside it, and is the only publisher of
//! [`ClusterView`] and of the apply [`Event`]s.

use std::io::{self, Cursor};
use std::sync::Arc;

use futures_util::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::events::{self, EventReceiver, EventSender};
use super::pace::{Mark, Pace};
use super::types::{LogId, Response, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig};
use super::{apply_on, blocking};
use crate::clock::ClusterClock;
use crate::codec::{decode, decode_with_bytes, encode, head_for_bytes};
use crate::machine::{self, Command, Event, Input, State};
use crate::metrics::writes::Part;
use crate::metrics::Metrics;
use crate::store::state::{Loaded, StateDb};
use crate::store::StoreError;
use crate::view::ClusterView;

/// What openraft needs back after a restart, stored with every apply.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    membership: StoredMembership,
}

/// The machine's state as loaded, with the membership restored from the applied meta.
fn restore(loaded: Loaded) -> Result<(State, Applied), StoreError> {
    let applied: Applied = loaded.applied.as_deref().map(decode).transpose()?.unwrap_or_default();
    let mut state = loaded.state;
    set_members(&mut state, &applied.membership);
    Ok((state, applied))
}

fn members_input(m: &StoredMembership) -> Input {
    let mem = m.membership();
    Input::Membership {
        members: mem.nodes().map(|(id, n)| (*id, n.clone())).collect(),
        voters: mem.voter_ids().collect(),
    }
}

fn set_members(state: &mut State, m: &StoredMembership) {
    if let Input::Membership { members, voters } = members_input(m) {
        (state.members, state.voters) = (members, voters);
    }
}

/// Tests only: a smaller event buffer, so that a test can make the device side lag.
pub const TEST_EVENT_CAPACITY_ENV: &str = "GATEWAY_TEST_EVENT_CAPACITY";

/// The replicated state machine.
pub struct StateMachine {
    db: StateDb,
    /// The applied state, shared with the published view: an apply copies it once and compares
    /// its result with it ([`crate::store::txn::StateTxn::save`]).
    state: Arc<State>,
    applied: Applied,
    view: watch::Sender<Arc<ClusterView>>,
    metrics: Arc<Metrics>,
    events: EventSender,
    /// Told the cluster time of every applied state.
    clock: Arc<ClusterClock>,
    /// This node, whose own claims are answered with its stream head (`machine::Ctx::local`)
    /// when a caller here waits for them.
    me: Option<machine::NodeId>,
    /// Whether a snapshot the policy asks for is due (see [`super::pace`]).
    pace: Pace,
}

impl StateMachine {
    /// Opens on `db` with what it loaded and publishes the first view; `me` is the node applying.
    pub fn new(
        db: StateDb,
        loaded: Loaded,
        me: Option<machine::NodeId>,
        metrics: Arc<Metrics>,
        clock: Arc<ClusterClock>,
    ) -> Result<(StateMachine, watch::Receiver<Arc<ClusterView>>), StoreError> {
        let (state, applied) = restore(loaded)?;
        clock.observe(state.clock_ms);
        let state = Arc::new(state);
        let (view, rx) = watch::channel(Arc::new(ClusterView::new(state.clone(), None)));
        // No consumer until `events` is called: until then, events are dropped.
        let (events, _) = events::channel(0, 0);
        let pace = Pace::default();
        Ok((StateMachine { db, state, applied, view, metrics, events, clock, me, pace }, rx))
    }

    /// The queue of what applies did (kicks, sweeps, deliveries) for its one consumer, which
    /// must reconcile when told it lagged; a later call replaces the consumer.
    pub fn events(&mut self) -> EventReceiver {
        let capacity =
            std::env::var(TEST_EVENT_CAPACITY_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(events::MAX_EVENTS);
        let (tx, rx) = events::channel(capacity, events::MAX_EVENT_BYTES);
        self.events = tx;
        rx
    }

    fn publish(&mut self, state: State, applied: Applied) {
        self.clock.observe(state.clock_ms);
        let state = Arc::new(state);
        self.state = state.clone();
        self.applied = applied;
        // Every reader sees the new view; watchers wake only when its shape changed (see
        // `cluster::ClusterWatch`).
        self.view.send_if_modified(|v| {
            let reshaped = !v.state.same_shape(&state);
            *v = Arc::new(ClusterView::new(state, Some(v)));
            reshaped
        });
    }
}

/// Most commands an apply runs on the cluster worker that took its entries ([`in_place`]). Eight:
/// that worker is the cluster runtime's only one and runs Raft's heartbeats and appends too; with
/// 64, a 256-client load's entries of 45–61 commands were applied on it, and came smaller.
pub(crate) const IN_PLACE_COMMANDS: usize = 8;

/// Whether an apply of `entries` is small enough to run on the cluster worker that took them
/// instead of the blocking pool: at most [`IN_PLACE_COMMANDS`] claims, releases and renewals,
/// each of which changes one device's row or one lease (and, when the held transaction is due,
/// commits at most `store::held::HOLD_ROWS` rows). The pool's hand-off there and back costs a
/// small apply more than the apply (benches/LEVERS.md, "Small applies in place"); a sweep, a
/// node's release, a membership change or a larger batch still goes to the pool, so the cluster
/// worker is never held for long from Raft's heartbeats.
pub(crate) fn in_place(entries: &[super::types::Entry]) -> bool {
    let mut commands = 0;
    entries.iter().all(|e| match &e.payload {
        EntryPayload::Blank => true,
        EntryPayload::Membership(_) => false,
        EntryPayload::Normal(req) => {
            commands += req.cmds.len();
            commands <= IN_PLACE_COMMANDS
                && req.cmds.iter().all(|c| matches!(c, Command::Claim(_) | Command::Release(_) | Command::Renew(_)))
        }
    })
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok((self.applied.last_applied, self.applied.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut stream: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let (mut entries, mut responders) = (Vec::new(), Vec::new());
        while let Some((entry, responder)) = stream.try_next().await? {
            entries.push(entry);
            responders.push(responder);
        }
        if entries.is_empty() {
            return Ok(());
        }
        self.pace.applied(entries.iter().map(|e| super::tail::weight(e) as u64).sum());
        let (db, before, mut applied, me) = (self.db.clone(), self.state.clone(), self.applied.clone(), self.me);
        // Entries a caller on this node waits for (a leader's own proposals): only their replies
        // are read, so only they are applied as this node's (a follower's own claims are answered
        // by the leader; reading their heads here would be wasted).
        let waited: Vec<bool> = responders.iter().map(Option::is_some).collect();
        let here = in_place(&entries);
        // Timed from here, waiting for the store included: the fence acts on a store write that
        // makes no progress (`metrics::writes`).
        let running = self.metrics.store_writes.begin(Part::State);
        let (responses, state, applied, events) = apply_on(here, "state apply", move || {
            db.apply(|tx| {
                let mut state = State::clone(&before);
                let mut events = Vec::new();
                let mut responses = Vec::with_capacity(entries.len());
                for (entry, waited) in entries.into_iter().zip(waited) {
                    let local = if waited { me } else { None };
                    let input = match entry.payload {
                        EntryPayload::Blank => Input::Blank,
                        EntryPayload::Membership(m) => {
                            applied.membership = StoredMembership::new(Some(entry.log_id), m);
                            members_input(&applied.membership)
                        }
                        // The apply reads the commands the log's tail shares: no copy.
                        EntryPayload::Normal(req) => {
                            Input::Commands { term: entry.log_id.leader_id.term, cmds: req.cmds }
                        }
                    };
                    let replies = machine::apply(&mut state, tx, entry.log_id.index, input, local, &mut events)?;
                    applied.last_applied = Some(entry.log_id);
                    responses.push(Response { replies });
                    running.progress();
                }
                tx.save(&before, &state, &encode(&applied)?)?;
                Ok((responses, state, applied, events))
            })
        })
        .await?;
        self.publish(state, applied);
        // Only what concerns this node's sessions: every node applies every publish and claim,
        // and the others' would only fill the queue.
        for ev in events.into_iter().filter(|ev| events::concerns(ev, self.me)) {
            // No subscriber (tests, or before the device listener starts) is fine.
            self.events.send(ev);
        }
        for (responder, response) in responders.into_iter().zip(responses) {
            if let Some(r) = responder {
                r.send(response);
            }
        }
        Ok(())
    }

    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<Self::SnapshotBuilder> {
        if let Err(missing) = self.pace.due(force) {
            self.metrics.snapshots_deferred.inc();
            tracing::debug!(missing_bytes = missing, "snapshot deferred: the entries since the last one weigh less");
            // What the snapshot's save would have made durable still is: a crash replays no more
            // of the log than before, and redb reuses the pages the applies since have freed.
            let (db, running) = (self.db.clone(), self.metrics.store_writes.begin(Part::State));
            let sync = move || {
                let _running = running;
                db.sync()
            };
            if let Err(e) = blocking("state sync", sync).await {
                tracing::warn!(error = %e, "could not make the applied state durable");
            }
            return None;
        }
        Some(self.get_snapshot_builder().await)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            metrics: self.metrics.clone(),
            mark: self.pace.mark(),
            pace: self.pace.clone(),
        }
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: SnapshotData) -> Result<(), io::Error> {
        let (db, smeta, data) = (self.db.clone(), meta.clone(), snapshot.into_inner());
        let stored_len = data.len();
        let (state, applied) = blocking("snapshot install", move || {
            let applied = Applied { last_applied: smeta.last_log_id, membership: smeta.last_membership.clone() };
            let head = head_for_bytes(&smeta, data.len())?;
            restore(db.install(&data, &encode(&applied)?, order(&smeta), &[&head, &data])?)
        })
        .await?;
        self.pace.installed(stored_len);
        self.metrics.snapshots_installed.inc();
        self.events.send(Event::Installed);
        tracing::info!(last_log_id = ?applied.last_applied, "installed a snapshot from the leader");
        self.publish(state, applied);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let db = self.db.clone();
        let current = blocking("snapshot read", move || {
            db.read_snapshot()?.map(decode_snapshot).transpose().map_err(StoreError::from)
        })
        .await?;
        Ok(current.map(|(meta, data)| Snapshot { meta, snapshot: Cursor::new(data) }))
    }
}

/// A snapshot's meta as openraft 0.9 wrote it, with an id that 0.10 no longer has: read from stores
/// written before the upgrade.
#[derive(Deserialize)]
struct SnapshotMetaV09 {
    last_log_id: Option<LogId>,
    last_membership: StoredMembership,
    #[allow(dead_code)]
    snapshot_id: String,
}

/// A stored snapshot (its meta and data), in either layout. The layouts cannot be confused: the
/// 0.9 one read as the current one always leaves its data behind as trailing bytes.
/// The data is what is left of `bytes` once the meta in front of it is taken out (moved within
/// the buffer: no second buffer of a snapshot's size).
pub fn decode_snapshot(mut bytes: Vec<u8>) -> Result<(SnapshotMeta, Vec<u8>), crate::codec::CodecError> {
    let (meta, data_len) = decode_with_bytes::<SnapshotMeta>(&bytes)
        .or_else(|e| match decode_with_bytes::<SnapshotMetaV09>(&bytes) {
            Ok((m, data)) => {
                Ok((SnapshotMeta { last_log_id: m.last_log_id, last_membership: m.last_membership }, data))
            }
            Err(_) => Err(e),
        })
        .map(|(meta, data)| (meta, data.len()))?;
    // The data runs to the end: `decode_with_bytes` refuses trailing bytes.
    bytes.drain(..bytes.len() - data_len);
    Ok((meta, bytes))
}

/// Snapshots are ordered by the index they were taken at (committed log ids with one index are
/// equal); none sorts first.
fn order(meta: &SnapshotMeta) -> u64 {
    meta.last_log_id.map_or(0, |l| l.index + 1)
}

/// Builds a snapshot from one read transaction while applies continue.
pub struct SnapshotBuilder {
    db: StateDb,
    metrics: Arc<Metrics>,
    /// The state's mark when the builder was made, reported to `pace` with the snapshot's size.
    mark: Mark,
    pace: Pace,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let db = self.db.clone();
        let (meta, data) = blocking("snapshot build", move || {
            let dump = db.dump()?;
            let applied: Applied = dump.applied.as_deref().map(decode).transpose()?.unwrap_or_default();
            let smeta = SnapshotMeta { last_log_id: applied.last_applied, last_membership: applied.membership };
            db.save_snapshot(order(&smeta), &[&head_for_bytes(&smeta, dump.data.len())?, &dump.data])?;
            Ok((smeta, dump.data))
        })
        .await?;
        self.pace.built(self.mark, data.len());
        self.metrics.snapshots_built.inc();
        Ok(Snapshot { meta, snapshot: Cursor::new(data) })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::Membership;

    use super::*;
    use crate::machine::{Claim, Member, ReleaseNode, Renew, Sweep};
    use crate::raft::types::{log_id, Entry, Request};

    fn normal(index: u64, cmds: Vec<Command>) -> Entry {
        Entry { log_id: log_id(1, 1, index), payload: EntryPayload::Normal(Request { cmds: cmds.into() }) }
    }

    fn claims(n: usize) -> Vec<Command> {
        (0..n)
            .map(|i| Claim { device: format!("d{i}"), node: 1, conn: i as u64, epoch: 0, attempt: 1 }.into())
            .collect()
    }

    #[test]
    fn only_a_few_claims_releases_and_renewals_are_applied_in_place() {
        let renew = Renew { node: 1, at_ms: 1, lease_ms: 1000, connections: 0, draining: false, incarnation: 1 };
        let release = crate::machine::Release { device: "d0".into(), conn: 0 };
        let blank = Entry { log_id: log_id(1, 1, 1), payload: EntryPayload::Blank };
        assert!(in_place(&[blank.clone(), normal(2, vec![renew.into(), release.into()]), normal(3, claims(3))]));
        // The bound counts every entry's commands together.
        let half = IN_PLACE_COMMANDS / 2;
        assert!(in_place(&[normal(1, claims(half)), normal(2, claims(IN_PLACE_COMMANDS - half))]));
        assert!(!in_place(&[normal(1, claims(half)), normal(2, claims(IN_PLACE_COMMANDS - half + 1))]));
        // A node's routes at once, or a membership change, go to the blocking pool.
        let sweep = Sweep { at_ms: 1, grace_ms: 0, candidates: vec![2] };
        assert!(!in_place(&[normal(1, claims(1)), normal(2, vec![sweep.into()])]));
        assert!(!in_place(&[normal(1, vec![ReleaseNode { node: 2 }.into()])]));
        let member = Member { name: "n1".into(), cluster_addr: "a1".into(), public_url: "".into() };
        let membership = Membership::new(vec![BTreeSet::from([1])], BTreeMap::from([(1, member)])).unwrap();
        assert!(!in_place(&[blank, Entry { log_id: log_id(1, 1, 2), payload: EntryPayload::Membership(membership) }]));
    }
}
