//! The typed port to the replicated state: [`Handle`] (claim, release, publish, ack, renew,
//! route, stream, membership, Raft RPC, status) and the applied [`ClusterView`] on a watch. The
//! edges (`ws`, `api`, the node's duties) use only these: they never see the proposer, a raw
//! [`Command`], the crate-wide [`Reply`], openraft or redb. Behind it: the batching proposer
//! (follower → leader forwarding included), blocking-pool reads of `state.redb`, and openraft.

mod forward;
pub mod membership;
pub mod proposer;
mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::Fatal;
use tokio::sync::watch;

use crate::clock::ClusterClock;
use crate::codec::{decode, encode};
use crate::config::Timing;
use crate::machine::{
    Ack, BeginScaleIn, Budget, Claim, ClaimReply, ClaimTenant, ClusterEvent, Command, Drain, EndScaleIn, ExtendLeases,
    FirstRenew, Floor, Forget, Grant, GrantReply, Init, Member, NodeId, Op, Publish, PublishQuota, PublishReply,
    Release, ReleaseNode, Renew, Reply, Route, ScaleInOutcome, ScaleInReply, SetAdmission, SetCapacity,
    SetMaxConnections, SetTenantPolicy, StreamRead, Suspect, Sweep, Swept, TenantRow,
};
pub use crate::raft::events::EventReceiver;
pub use crate::raft::rpc::{RpcError, RpcKind};
pub use crate::raft::stream::{PATH as APPEND_STREAM_PATH, PROTOCOL as APPEND_STREAM_PROTOCOL};
use crate::raft::types::{Raft, TypeConfig};
use crate::raft::{rpc, stream};
use crate::store::state::{LedgerRows, StateDb};
use crate::view::ClusterView;
use crate::wire::{MembershipSummary, StatusReport};
use membership::MembershipError;
use openraft::async_runtime::WatchReceiver as _;
pub use proposer::ProposeError;
use proposer::Proposer;

/// The applied view, replaced after every apply: `borrow()` always reads the newest. `changed()`
/// wakes only when something other than the route counts and the cluster clock changed (see
/// [`crate::machine::State::same_shape`]): claims and releases, nearly every apply of a busy
/// cluster, would otherwise wake every watcher on every commit.
pub type ClusterWatch = watch::Receiver<Arc<ClusterView>>;

/// A read of the applied state failed (the store or its blocking task).
#[derive(Debug, Clone, thiserror::Error)]
#[error("reading the applied state failed: {0}")]
pub struct ReadError(String);

impl From<crate::store::StoreError> for ReadError {
    fn from(e: crate::store::StoreError) -> Self {
        ReadError(e.to_string())
    }
}

/// The port. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    inner: Arc<Inner>,
}

struct Inner {
    me: NodeId,
    member: Member,
    raft: Raft,
    proposer: Proposer,
    state: StateDb,
    view: ClusterWatch,
    timing: Timing,
    /// Highest committed log index this node has learned (maintained by the log store).
    committed: Arc<AtomicU64>,
    clock: Arc<ClusterClock>,
    /// When this node last took an AppendEntries (see [`Handle::since_last_append`]).
    last_append: std::sync::Mutex<Option<std::time::Instant>>,
    /// One membership change at a time on this node: held by each for its whole run (both steps
    /// of a joint change), so the leader's duties never slip an entry between an operator's two.
    changing: tokio::sync::Mutex<()>,
}

impl Inner {
    /// Notes that this node took an AppendEntries now.
    fn appended(&self) {
        *self.last_append.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }
}

/// What a [`Handle`] is built from (by the composition root).
pub struct Parts {
    pub me: NodeId,
    pub member: Member,
    pub raft: Raft,
    pub proposer: Proposer,
    pub state: StateDb,
    pub view: ClusterWatch,
    pub timing: Timing,
    pub committed: Arc<AtomicU64>,
    pub clock: Arc<ClusterClock>,
}

/// Who leads, as this node's Raft instance sees it. It watches openraft's server metrics (vote,
/// role, leader, membership), which are sent only when they change: the full metrics are sent
/// after every append, commit and apply, and a task watching them woke (a thread hand-off) for
/// every entry on every node.
pub struct Leadership {
    rx: openraft::type_config::alias::WatchReceiverOf<TypeConfig, openraft::metrics::RaftServerMetrics<TypeConfig>>,
}

impl Leadership {
    /// (leader, term) now.
    pub fn now(&self) -> (Option<NodeId>, u64) {
        let m = self.rx.borrow_watched();
        (m.current_leader, m.vote.leader_id.term)
    }

    /// Waits for the next change of the vote, the role, the leader or the membership; false once
    /// Raft stopped.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

impl Handle {
    pub fn new(p: Parts) -> Handle {
        let Parts { me, member, raft, proposer, state, view, timing, committed, clock } = p;
        let last_append = std::sync::Mutex::new(None);
        Handle {
            inner: Arc::new(Inner {
                me,
                member,
                raft,
                proposer,
                state,
                view,
                timing,
                committed,
                clock,
                last_append,
                changing: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// This node's id.
    pub fn me(&self) -> NodeId {
        self.inner.me
    }

    /// This node's membership record (name, addresses).
    pub fn member(&self) -> &Member {
        &self.inner.member
    }

    /// Cluster time now (see [`ClusterClock`]): what lease stamps are compared with.
    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// A receiver of the applied view.
    pub fn watch(&self) -> ClusterWatch {
        self.inner.view.clone()
    }

    /// The applied view now.
    pub fn view(&self) -> Arc<ClusterView> {
        self.inner.view.borrow().clone()
    }

    /// Proposes a typed command (forwarded to the leader from a follower) and unwraps its reply.
    async fn write<C: Op>(&self, cmd: C) -> Result<C::Reply, ProposeError> {
        typed::<C>(self.inner.proposer.propose(cmd.into()).await?)
    }

    /// A leader duty: proposed here only, never forwarded, so that it cannot land in another
    /// leader's term (before that term's `ExtendLeases`).
    async fn write_local<C: Op>(&self, cmd: C) -> Result<C::Reply, ProposeError> {
        typed::<C>(self.inner.proposer.propose_local(cmd.into()).await?)
    }

    /// Claims a device for (node, conn): accepted, stale, or node not live.
    /// A device whose token names a tenant claims within the tenant's connection cap.
    pub async fn claim(&self, claim: Claim, tenant: Option<String>) -> Result<ClaimReply, ProposeError> {
        match tenant {
            Some(tenant) => self.write(ClaimTenant { claim, tenant }).await,
            None => self.write(claim).await,
        }
    }

    /// Sets a tenant's plan; its new revision.
    pub async fn set_tenant_policy(
        &self,
        tenant: &str,
        max_connections: Option<u64>,
        publishes: Option<PublishQuota>,
    ) -> Result<u64, ProposeError> {
        self.write(SetTenantPolicy { tenant: tenant.to_string(), max_connections, publishes, at_ms: 0 }).await
    }

    /// Grants a tenant `publishes` more this period, once per `id`.
    pub async fn grant(&self, tenant: &str, id: &str, publishes: u64) -> Result<GrantReply, ProposeError> {
        self.write(Grant { tenant: tenant.to_string(), id: id.to_string(), publishes, at_ms: 0 }).await
    }

    /// Deletes the device's route if it still names `conn`; whether it did.
    pub async fn release(&self, device: &str, conn: u64) -> Result<bool, ProposeError> {
        self.write(Release { device: device.to_string(), conn }).await
    }

    /// Appends a message to a device's stream (the leader stamps its time).
    pub async fn publish(&self, publish: Publish) -> Result<PublishReply, ProposeError> {
        self.write(publish).await
    }

    /// The device has every message up to `seq`; how many were trimmed.
    pub async fn ack(&self, device: &str, seq: u64) -> Result<u64, ProposeError> {
        self.write(Ack { device: device.to_string(), seq }).await
    }

    /// Renews this node's lease, waiting at most `within` (a renewal must not wait out a
    /// forward to a frozen leader: the next one is due).
    pub async fn renew(&self, renew: Renew, within: Duration) -> Result<(), ProposeError> {
        typed::<Renew>(self.inner.proposer.propose_within(renew.into(), within).await?)
    }

    /// This process's first lease renewal ([`FirstRenew`]): also deletes the routes a previous
    /// process of this node left; how many. Waits at most `within`, as [`Handle::renew`] does.
    pub async fn renew_first(&self, renew: Renew, within: Duration) -> Result<u64, ProposeError> {
        typed::<FirstRenew>(self.inner.proposer.propose_within(FirstRenew(renew).into(), within).await?)
    }

    /// Takes a node out of the ring (drain); whether it was live.
    pub async fn drain(&self, node: NodeId) -> Result<bool, ProposeError> {
        self.write(Drain { node, at_ms: 0 }).await
    }

    /// Sets (or, with `None`, clears) the cluster-wide admission budget.
    pub async fn set_admission(&self, budget: Option<Budget>) -> Result<(), ProposeError> {
        self.write(SetAdmission { budget }).await
    }

    /// If this node leads, hands leadership to the voter whose log is furthest along among those
    /// that acknowledged this leader within an election timeout and are not in `gone` (voters
    /// known to have stopped), and waits, at most one leader lease, until another node leads: a
    /// stopping leader costs the cluster one election round trip instead of its leader lease plus
    /// an election timeout. Answers the new leader, or why there is none.
    pub async fn hand_over_leadership(&self, gone: &BTreeSet<NodeId>) -> Result<NodeId, String> {
        let within = Duration::from_millis(self.inner.timing.election_timeout_max_ms());
        let (me, raft) = (self.inner.me, &self.inner.raft);
        self.transfer_leadership(gone).await?;
        let mut rx = raft.metrics();
        let moved = rx.wait_until(|m: &openraft::RaftMetrics<TypeConfig>| m.current_leader.is_some_and(|l| l != me));
        match tokio::time::timeout(within, moved).await {
            Ok(Ok(m)) => m.current_leader.ok_or_else(|| "no leader".into()),
            Ok(Err(_)) => Err("raft stopped".into()),
            Err(_) => Err(format!("no other leader within {within:?}")),
        }
    }

    /// Asks the voter [`Handle::hand_over_leadership`] would pick to take leadership over, and
    /// returns it without waiting for the election (a leader whose store hangs cannot record the
    /// new term, so it would not see it).
    pub async fn transfer_leadership(&self, gone: &BTreeSet<NodeId>) -> Result<NodeId, String> {
        let within = Duration::from_millis(self.inner.timing.election_timeout_max_ms());
        let me = self.inner.me;
        let raft = &self.inner.raft;
        let m = raft.metrics().borrow_watched().clone();
        if m.current_leader != Some(me) {
            return Err("not the leader".into());
        }
        let matched = |id: &NodeId| m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map(|l| l.index);
        // A stopped peer addressed by name times out (or no longer resolves) instead of refusing.
        let recent = within / 2;
        let heard = |id: &NodeId| {
            let acked = m.heartbeat.as_ref().and_then(|h| h.get(id).cloned().flatten());
            acked.is_some_and(|at| openraft::Instant::elapsed(&*at) < recent)
        };
        let voters = m.membership_config.membership().voter_ids().filter(|v| *v != me && !gone.contains(v));
        let to = voters.filter(heard).max_by_key(matched).ok_or("no other voter acknowledged this leader lately")?;
        raft.trigger().transfer_leader(to).await.map_err(|e| e.to_string())?;
        Ok(to)
    }

    /// Leading: how long ago a quorum of voters last acknowledged this leader (openraft's clock
    /// progress, which every AppendEntries answer feeds, heartbeats included). `None` when not
    /// leading, or not acknowledged yet in this term.
    pub fn quorum_acked_ago(&self) -> Option<Duration> {
        self.inner
            .raft
            .metrics()
            .borrow_watched()
            .last_quorum_acked
            .as_ref()
            .map(|at| openraft::Instant::elapsed(&**at))
    }

    /// The voters (of both sets, in a joint configuration) with their cluster addresses.
    pub fn voters(&self) -> Vec<(NodeId, Arc<str>)> {
        membership::voters(&self.inner.raft)
    }

    /// Deletes every route of a node (the end of a drain); how many.
    pub async fn release_node(&self, node: NodeId) -> Result<u64, ProposeError> {
        self.write(ReleaseNode { node }).await
    }

    /// Forgets a removed node's lease row and routes; how many routes.
    pub async fn forget(&self, node: NodeId) -> Result<u64, ProposeError> {
        self.write(Forget { node }).await
    }

    /// Leader duty: pushes every live lease past the election gap.
    pub async fn extend_leases(&self, lease_ms: u64) -> Result<(), ProposeError> {
        self.write_local(ExtendLeases { at_ms: 0, lease_ms }).await
    }

    /// Leader duty: expires the candidates whose lease lapsed as of the leader's clock.
    pub async fn sweep(&self, candidates: Vec<NodeId>) -> Result<Swept, ProposeError> {
        self.write_local(Sweep { at_ms: 0, grace_ms: 0, candidates }).await
    }

    /// Leader duty: takes a live node this leader stopped hearing from out of the ring; it
    /// rejoins with a renewal of its own, `hold_ms` later at the earliest. Whether it was live.
    pub async fn suspect(&self, node: NodeId, hold_ms: u64) -> Result<bool, ProposeError> {
        self.write_local(Suspect { node, at_ms: 0, hold_ms }).await
    }

    /// Publishes this node's designed connection capacity (0: undeclared).
    pub async fn set_capacity(&self, capacity_connections: u64) -> Result<(), ProposeError> {
        self.write(SetCapacity { node: self.inner.me, capacity_connections }).await
    }

    /// Publishes this node's hard connection limit, which placement respects.
    pub async fn set_max_connections(&self, max_connections: u64) -> Result<(), ProposeError> {
        self.write(SetMaxConnections { node: self.inner.me, max_connections }).await
    }

    /// Takes (or, by its holder `owner`, extends for `ttl_ms`) the serial scale-in lock for
    /// `node`, after the quorum and (unless `force`) capacity checks; the leader stamps the time.
    pub async fn begin_scale_in(
        &self,
        node: NodeId,
        owner: u64,
        ttl_ms: u64,
        force: bool,
    ) -> Result<ScaleInReply, ProposeError> {
        self.write(BeginScaleIn { node, owner, at_ms: 0, ttl_ms, force }).await
    }

    /// Releases the scale-in lock `owner` holds; whether it held it.
    pub async fn end_scale_in(&self, node: NodeId, owner: u64, outcome: ScaleInOutcome) -> Result<bool, ProposeError> {
        self.write(EndScaleIn { node, owner, outcome }).await
    }

    /// Up to `limit` events of the replicated cluster event log after seq `after`, oldest first.
    pub async fn cluster_events(&self, after: u64, limit: usize) -> Result<Vec<ClusterEvent>, ReadError> {
        let db = self.inner.state.clone();
        read(move || db.cluster_events(after, limit)).await
    }

    /// Records the cluster id (the first one wins).
    pub async fn init(&self, cluster_id: String) -> Result<(), ProposeError> {
        self.write(Init { cluster_id }).await
    }

    /// Commands a follower forwarded (`POST` [`forward::FORWARD_PATH`], project codec): they
    /// join this node's next batches; the encoded replies come back in order.
    pub async fn propose_forwarded(&self, body: &[u8]) -> Result<Vec<u8>, RpcError> {
        let cmds: Vec<Command> = decode(body).map_err(RpcError::BadRequest)?;
        encode(&self.inner.proposer.propose_forwarded(cmds).await).map_err(RpcError::Encode)
    }

    /// A device's route and floor as applied here, if the store's row cache holds them: no read
    /// transaction. Else [`Handle::route_in_place`] reads them.
    pub fn cached_route(&self, device: &str) -> Option<(Option<Route>, Option<Floor>)> {
        self.inner.state.cached_route(device)
    }

    /// A device's route and floor as applied here, read in place, for a device the row cache does
    /// not hold (placement, the route lookup): the held row, or one point read of one `devices`
    /// row, as for [`Handle::stream_head`].
    pub fn route_in_place(&self, device: &str) -> Result<(Option<Route>, Option<Floor>), ReadError> {
        Ok(self.inner.state.route(device)?)
    }

    /// The route and floor of each device, as applied here, read at one point of the log.
    pub async fn routes(&self, devices: Vec<String>) -> Result<Vec<crate::store::state::RouteAndFloor>, ReadError> {
        let db = self.inner.state.clone();
        read(move || db.routes(&devices)).await
    }

    /// A tenant's row and its last `limit` ledger entries, as applied here.
    pub async fn tenant(&self, tenant: &str, limit: usize) -> Result<(Option<TenantRow>, LedgerRows), ReadError> {
        let (db, tenant) = (self.inner.state.clone(), tenant.to_string());
        read(move || db.tenant(&tenant, limit)).await
    }

    /// How many tenants there are and the `keep` with the most connections, as applied here.
    pub async fn busiest_tenants(&self, keep: usize) -> Result<(u64, Vec<(String, TenantRow)>), ReadError> {
        let db = self.inner.state.clone();
        read(move || db.busiest_tenants(keep)).await
    }

    /// A device's stream head as applied here, read in place: one point read of one `heads` row,
    /// which costs less than the blocking pool's hand-off there and back (benches/LEVERS.md, "A
    /// hello's head read in place"). [`Handle::route_in_place`] reads one row the same way; a
    /// session's sync pages and the other reads go to the pool.
    pub fn stream_head(&self, device: &str) -> Result<u64, ReadError> {
        Ok(self.inner.state.stream_page(device, u64::MAX, 0, 0)?.head.head)
    }

    /// A device's stream bounds and up to `limit` retained messages after `after`, stopping once
    /// the payloads read reach `max_bytes` (one message at least): one page of a device's `sync`.
    pub async fn stream_page(
        &self,
        device: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<StreamRead, ReadError> {
        let (db, device) = (self.inner.state.clone(), device.to_string());
        read(move || db.stream_page(&device, after, limit, max_bytes)).await
    }

    /// Committed log entries this node has not applied yet.
    pub fn apply_lag(&self) -> u64 {
        let applied = self.inner.raft.metrics().borrow_watched().last_applied.map_or(0, |l| l.index);
        self.inner.committed.load(std::sync::atomic::Ordering::Relaxed).saturating_sub(applied)
    }

    /// The leader as this node knows it.
    pub fn leader(&self) -> Option<NodeId> {
        self.inner.raft.metrics().borrow_watched().current_leader
    }

    /// The Raft term this node's Raft instance is in.
    pub fn term(&self) -> u64 {
        self.inner.raft.metrics().borrow_watched().current_term
    }

    pub fn leadership(&self) -> Leadership {
        Leadership { rx: self.inner.raft.server_metrics() }
    }

    /// Waits until Raft stops on its own, and says why: a write of its log or its state failed (a
    /// full disk, a file too large, an I/O error) or its task ended. Never answers while Raft runs,
    /// nor after [`Handle::shutdown`] stopped it. Watches the server metrics, which change only
    /// with the vote, the role, the leader or the membership, and whose sender goes with the task.
    pub async fn fatal(&self) -> String {
        let mut server = self.inner.raft.server_metrics();
        while server.changed().await.is_ok() {}
        // The task ended: on an error, stopped by `shutdown` (no answer), or (still `Ok`) by a panic.
        let why = match &self.inner.raft.metrics().borrow_watched().running_state {
            Err(Fatal::Stopped) => None,
            Err(fatal) => Some(fatal.to_string()),
            Ok(()) => Some("Raft's task ended".to_string()),
        };
        match why {
            Some(why) => why,
            None => std::future::pending().await,
        }
    }

    /// Hands a Raft RPC (`/raft/*`) to the local Raft instance.
    pub async fn rpc(&self, kind: RpcKind, body: bytes::Bytes) -> Result<Vec<u8>, RpcError> {
        let reply = rpc::serve(&self.inner.raft, kind, body).await;
        if kind == RpcKind::Append {
            self.inner.appended();
        }
        reply
    }

    /// Serves a leader's append stream on an upgraded connection until it ends (see
    /// [`crate::raft::stream`]).
    pub async fn serve_append_stream(&self, io: impl stream::Io, stop: tokio_util::sync::CancellationToken) {
        let (raft, inner) = (self.inner.raft.clone(), self.inner.clone());
        // Boxed so that the stream's type does not name the borrow of `raft` it was made from.
        let follow = move |input| -> openraft::base::BoxStream<'static, _> { Box::pin(raft.stream_append(input)) };
        stream::serve(io, stream::Limits::default(), follow, move || inner.appended(), stop).await
    }

    /// How long ago this node last answered an AppendEntries (a leader's heartbeat or entries);
    /// None before the first. openraft refuses votes for its leader lease after the last one.
    pub fn since_last_append(&self) -> Option<Duration> {
        self.inner.last_append.lock().unwrap_or_else(|p| p.into_inner()).map(|at| at.elapsed())
    }

    /// Starts an election now (this node becomes a candidate of the next term).
    pub async fn elect(&self) -> Result<(), String> {
        self.inner.raft.trigger().elect(false).await.map_err(|e| e.to_string())
    }

    /// The membership as this node's Raft instance knows it.
    pub fn membership(&self) -> MembershipSummary {
        membership::summary(&self.inner.raft)
    }

    /// Leader only: adds a learner; false when it already was a member.
    pub async fn add_learner(&self, id: NodeId, member: Member) -> Result<bool, MembershipError> {
        let _one = self.inner.changing.lock().await;
        membership::add_learner(&self.inner.raft, id, member, self.op_timeout()).await
    }

    /// Leader only: promotes a learner while voter slots are free; whether it is a voter.
    pub async fn promote(&self, id: NodeId) -> Result<bool, MembershipError> {
        let _one = self.inner.changing.lock().await;
        membership::promote(&self.inner.raft, id, self.inner.timing.max_voters, self.op_timeout()).await
    }

    /// Leader only: removes a member for good and refills voter slots from learners.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), MembershipError> {
        let _one = self.inner.changing.lock().await;
        membership::remove(&self.inner.raft, id, self.inner.timing.max_voters, self.op_timeout()).await
    }

    /// Leader only: finishes a joint configuration a previous leader (or a change cut short) left,
    /// within the propose timeout; whether there was one. Skipped while another change runs: that
    /// change holds the lock until its configuration is uniform, and the next call looks again.
    pub async fn finish_joint(&self) -> Result<bool, MembershipError> {
        let timeout = Duration::from_millis(self.inner.timing.propose_timeout_ms);
        let Ok(_one) = self.inner.changing.try_lock() else { return Ok(false) };
        membership::finish_joint(&self.inner.raft, timeout).await
    }

    /// How long a membership change may take (an election included).
    pub fn op_timeout(&self) -> Duration {
        let t = &self.inner.timing;
        Duration::from_millis(t.propose_timeout_ms.max(t.election_timeout_ms * 4))
    }

    /// This node's status report (Raft progress, members, leases, ring).
    pub fn report(&self) -> StatusReport {
        status::report(self)
    }

    /// Makes this node a one-node cluster (a fresh data dir with neither `--join` nor
    /// `--standby`); an error when it already belongs to one.
    pub async fn bootstrap(&self) -> Result<(), String> {
        let me = BTreeMap::from([(self.inner.me, self.inner.member.clone())]);
        self.inner.raft.initialize(me).await.map_err(|e| e.to_string())
    }

    /// Whether this node's Raft state has a membership (it was bootstrapped or added).
    pub async fn is_initialized(&self) -> bool {
        self.inner.raft.is_initialized().await.unwrap_or(false)
    }

    /// Stops the Raft instance (its connection tasks with it).
    pub async fn shutdown(&self) {
        // After the node's stop, which ends the proposer's batches (the callers of a write still in
        // Raft would each make openraft log an error).
        let writes_end = Duration::from_secs(1);
        if tokio::time::timeout(writes_end, self.inner.proposer.stopped()).await.is_err() {
            tracing::warn!(?writes_end, "the proposer's writes did not end; stopping Raft under them");
        }
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}

fn typed<C: Op>(reply: Reply) -> Result<C::Reply, ProposeError> {
    C::unwrap_reply(reply).map_err(|other| ProposeError::Rejected(format!("a reply of another command: {other:?}")))
}

async fn read<T, F>(f: F) -> Result<T, ReadError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, crate::store::StoreError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(ReadError::from),
        Err(e) => Err(ReadError(e.to_string())),
    }
}
