//! The replicated state machine as domain code (design §3): one type per command with its own
//! reply type, the rules as functions over a small table interface ([`Tables`]), and the events an
//! apply emits. Deterministic: it reads no clock and no config, only the commands it is given (the
//! leader stamps `at_ms`). It imports no runtime crate — no tokio, hyper, openraft or redb — so
//! the rules are tested against a model on in-memory tables.

pub mod admission;
pub mod claim;
pub mod events;
pub mod lease;
pub mod scale;
pub mod stream;
pub mod tables;
pub mod tenant;
pub mod types;

#[cfg(test)]
pub(crate) mod props;
#[cfg(test)]
pub(crate) mod scale_tests;
#[cfg(test)]
pub(crate) mod stream_tests;
#[cfg(test)]
pub(crate) mod tenant_tests;
#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use admission::{Budget, SetAdmission};
pub use claim::{Claim, ClaimReply, ClaimTenant, Release};
pub use events::{ClusterEvent, Trigger};
pub use lease::{Drain, ExtendLeases, FirstRenew, Forget, Init, ReleaseNode, Renew, Suspect, Sweep, Swept};
pub use scale::{BeginScaleIn, EndScaleIn, ScaleInLock, ScaleInOutcome, ScaleInReply, SetCapacity, SetMaxConnections};
pub use stream::{Ack, Delivery, Head, KeyUse, Message, Publish, PublishReply, StreamRead};
pub use tables::Tables;
pub use tenant::{Entry, EntryKind, Exhausted, Grant, GrantReply, Policy, PublishQuota, SetTenantPolicy, TenantRow};
pub use types::{Floor, LeaseState, Member, NodeId, NodeLease, Route, Superseded};

/// The small part of the state every node needs on every decision, kept in memory (the big
/// tables — routes, floors, streams — stay behind [`Tables`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub cluster_id: Option<String>,
    /// Log index of the last change to the live set.
    pub ring_version: u64,
    /// Cluster time: the newest `at_ms` a leader stamped into an applied command.
    pub clock_ms: u64,
    /// The term of the last applied `ExtendLeases`: sweeps of any other term are ignored.
    pub extended_term: u64,
    /// The cluster-wide admission budget, if one was set (`gateway admission set`).
    pub admission: Option<Budget>,
    /// The Raft membership as applied (voters and learners).
    pub members: BTreeMap<NodeId, Member>,
    pub voters: BTreeSet<NodeId>,
    pub nodes: BTreeMap<NodeId, NodeLease>,
    /// Events recorded in the cluster event log so far: the newest one's seq.
    pub event_seq: u64,
    /// The scale-in in progress, if one holds the lock.
    pub scale_in: Option<ScaleInLock>,
    /// Each member's declared connection capacity (`--capacity-connections`), when declared.
    pub capacity: BTreeMap<NodeId, u64>,
    /// Each member's hard connection limit (`--max-connections`), as it published it.
    pub max_connections: BTreeMap<NodeId, u64>,
}

impl State {
    /// Whether `other` equals this state in all but what nearly every claim and release moves
    /// (the per-node route counts and the cluster clock): what the view's watchers wake for.
    pub fn same_shape(&self, other: &State) -> bool {
        let State {
            cluster_id,
            ring_version,
            clock_ms: _,
            extended_term,
            admission,
            members,
            voters,
            nodes,
            event_seq,
            scale_in,
            capacity,
            max_connections,
        } = self;
        let same_lease = |a: &NodeLease, b: &NodeLease| {
            let NodeLease { lease_until_ms, state, connections, routes: _, incarnation, extendable, suspect_until_ms } =
                a;
            (*lease_until_ms, *state, *connections, *incarnation, *extendable, *suspect_until_ms)
                == (b.lease_until_ms, b.state, b.connections, b.incarnation, b.extendable, b.suspect_until_ms)
        };
        *cluster_id == other.cluster_id
            && *ring_version == other.ring_version
            && *extended_term == other.extended_term
            && *admission == other.admission
            && *members == other.members
            && *voters == other.voters
            && *event_seq == other.event_seq
            && *scale_in == other.scale_in
            && *capacity == other.capacity
            && *max_connections == other.max_connections
            && nodes.len() == other.nodes.len()
            && nodes.iter().zip(&other.nodes).all(|((ia, a), (ib, b))| ia == ib && same_lease(a, b))
    }

    pub fn is_member(&self, node: NodeId) -> bool {
        self.members.contains_key(&node)
    }

    /// Members whose applied lease state is live: the ring's input.
    pub fn live_set(&self) -> Vec<NodeId> {
        self.live().collect()
    }

    /// [`State::live_set`] in order, without collecting it.
    fn live(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.iter().filter(|(id, l)| l.state == LeaseState::Live && self.is_member(**id)).map(|(id, _)| *id)
    }
}

/// What an apply did that a node must act on at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A claim replaced the route held by `conn` on `node`.
    Superseded { node: NodeId, conn: u64 },
    /// A sweep expired these nodes and deleted their routes.
    Swept { nodes: Vec<NodeId> },
    /// A message was appended to a device's stream while its route named (node, conn).
    Published(Delivery),
    /// A snapshot replaced the whole state: what it folded in fired no events, so reconcile.
    Installed,
}

/// What one apply needs: the entry's term, the in-memory state, the tables, and where events go.
pub struct Ctx<'a, T> {
    /// The Raft term the entry was proposed in.
    pub term: u64,
    pub state: &'a mut State,
    pub tables: &'a mut T,
    pub events: &'a mut Vec<Event>,
    /// The node applying, when callers on it wait for this entry's replies (a leader's own
    /// proposals; None on followers, in replays and tests): lets a reply carry what only that
    /// node may use (a claim's [`ClaimReply`] head). The state an apply leaves never depends on it.
    pub local: Option<NodeId>,
}

/// A command's rule: applies it and answers its own reply type.
pub trait Apply {
    type Reply;
    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<Self::Reply, T::Error>;
}

/// A typed command: what the [`Command`] vocabulary carries and how its [`Reply`] unwraps.
pub trait Op: Apply + Into<Command> {
    /// The typed reply out of the crate-wide one; `Err` gives back a reply of another command
    /// (a bug, reported by the caller).
    fn unwrap_reply(reply: Reply) -> Result<Self::Reply, Reply>;
}

macro_rules! commands {
    ($($(#[$doc:meta])* $name:ident => $reply:ty,)*) => {
        /// The log's command vocabulary: one variant per command type. The variant order is the
        /// wire and log format: append new commands at the end.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        pub enum Command {
            $($(#[$doc])* $name($name),)*
        }

        /// One reply per command, the same variant as its command.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        pub enum Reply {
            $($name($reply),)*
        }

        impl Command {
            fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<Reply, T::Error> {
                match self {
                    $(Command::$name(c) => c.apply(cx).map(Reply::$name),)*
                }
            }
        }

        $(
            impl From<$name> for Command {
                fn from(c: $name) -> Command {
                    Command::$name(c)
                }
            }

            impl Op for $name {
                fn unwrap_reply(reply: Reply) -> Result<$reply, Reply> {
                    match reply {
                        Reply::$name(r) => Ok(r),
                        #[allow(unreachable_patterns)]
                        other => Err(other),
                    }
                }
            }
        )*
    };
}

commands! {
    /// Records the cluster id once.
    Init => (),
    /// Moves a device to (node, conn) iff its `(epoch, attempt)` beats the device's floor.
    Claim => ClaimReply,
    /// Deletes a device's route only if it still names the connection: whether it did.
    Release => bool,
    /// Renews a node's lease and publishes its load.
    Renew => (),
    /// Expires lapsed leases and deletes their routes.
    Sweep => Swept,
    /// Pushes every unexpired lease past an election gap.
    ExtendLeases => (),
    /// Takes a live node out of the ring: whether it was live.
    Drain => bool,
    /// Deletes a node's routes: how many.
    ReleaseNode => u64,
    /// Forgets a removed node's lease row and routes: how many routes.
    Forget => u64,
    /// Appends a message to a device's stream.
    Publish => PublishReply,
    /// Trims a device's stream up to a seq: how many messages.
    Ack => u64,
    /// Takes a live node the leader stopped hearing from out of the ring: whether it was live.
    Suspect => bool,
    /// Sets (or clears) the cluster-wide admission budget.
    SetAdmission => (),
    /// A claim by a device of a tenant, within the tenant's connection cap.
    ClaimTenant => ClaimReply,
    /// Sets a tenant's plan: its new revision.
    SetTenantPolicy => u64,
    /// Grants a tenant more publishes this period (once per grant id).
    Grant => GrantReply,
    /// Records a node's designed connection capacity.
    SetCapacity => (),
    /// Takes or extends the serial scale-in lock, after the quorum and capacity checks.
    BeginScaleIn => ScaleInReply,
    /// Releases the scale-in lock: whether the caller held it.
    EndScaleIn => bool,
    /// Records a node's hard connection limit (appended: older log entries decode unchanged).
    SetMaxConnections => (),
    /// A process's first lease renewal: deletes its previous process's routes, then renews. How
    /// many routes (appended last: older log entries decode unchanged).
    FirstRenew => u64,
}

/// The `at_ms` field of a time-dependent command, by reference (shared or mutable, as `$cmd` is).
macro_rules! at_ms_of {
    ($cmd:expr) => {
        match $cmd {
            Command::Renew(Renew { at_ms, .. })
            | Command::FirstRenew(FirstRenew(Renew { at_ms, .. }))
            | Command::Sweep(Sweep { at_ms, .. })
            | Command::ExtendLeases(ExtendLeases { at_ms, .. })
            | Command::Drain(Drain { at_ms, .. })
            | Command::Publish(Publish { at_ms, .. })
            | Command::Suspect(Suspect { at_ms, .. })
            | Command::SetTenantPolicy(SetTenantPolicy { at_ms, .. })
            | Command::Grant(Grant { at_ms, .. })
            | Command::BeginScaleIn(BeginScaleIn { at_ms, .. }) => Some(at_ms),
            _ => None,
        }
    };
}

impl Command {
    /// The time a time-dependent command carries, for [`Command::stamp`] to set.
    fn at_ms(&mut self) -> Option<&mut u64> {
        at_ms_of!(self)
    }

    /// The time a time-dependent command carries: what its apply advances cluster time to.
    fn stamped(&self) -> Option<u64> {
        at_ms_of!(self).copied()
    }

    /// Lease and leader duties: proposed ahead of claims and messages, so that a flood of those
    /// cannot delay a renewal past its node's fencing.
    pub fn urgent(&self) -> bool {
        matches!(
            self,
            Command::Renew(_)
                | Command::FirstRenew(_)
                | Command::ExtendLeases(_)
                | Command::Sweep(_)
                | Command::Suspect(_)
                | Command::Drain(_)
                | Command::Init(_)
        )
    }

    /// Whether applying this command may change a lease state, the live set or the scale-in
    /// lock: what the event log watches.
    fn watched(&self) -> bool {
        matches!(
            self,
            Command::Renew(_)
                | Command::FirstRenew(_)
                | Command::Sweep(_)
                | Command::Suspect(_)
                | Command::Drain(_)
                | Command::Forget(_)
                | Command::BeginScaleIn(_)
                | Command::EndScaleIn(_)
        )
    }

    /// About how many bytes this command takes in a log entry (an upper bound of its encoding):
    /// what the proposer bounds a batch by.
    pub fn weight(&self) -> usize {
        const FIXED: usize = 64;
        FIXED
            + match self {
                Command::Publish(p) => p.device.len() + p.payload.len() + p.key.as_ref().map_or(0, String::len),
                Command::Claim(c) => c.device.len(),
                Command::ClaimTenant(c) => c.claim.device.len() + c.tenant.len(),
                Command::SetTenantPolicy(p) => p.tenant.len(),
                Command::Grant(g) => g.tenant.len() + g.id.len(),
                Command::Release(r) => r.device.len(),
                Command::Ack(a) => a.device.len(),
                Command::Sweep(s) => 10 * s.candidates.len(),
                Command::Init(i) => i.cluster_id.len(),
                _ => 0,
            }
    }

    /// The leader's proposer stamps cluster time into time-dependent commands.
    pub fn stamp(&mut self, now_ms: u64) {
        if let Some(at_ms) = self.at_ms() {
            *at_ms = now_ms;
        }
    }
}

/// One log entry, as the machine sees it.
#[derive(Debug, Clone)]
pub enum Input {
    /// A leader's blank entry: nothing changes.
    Blank,
    /// A membership change committed: these are the members now.
    Membership { members: BTreeMap<NodeId, Member>, voters: BTreeSet<NodeId> },
    /// A batch of commands proposed in `term`, answered one reply each, in order. Shared: the
    /// apply reads the commands, so the log's in-memory tail and the apply need no copies.
    Commands { term: u64, cmds: Arc<Vec<Command>> },
}

/// Applies the entry at log `index` on the node `local` (see [`Ctx::local`]). The ring version
/// becomes `index` when the live set changed; cluster time advances to the newest stamp applied.
pub fn apply<T: Tables>(
    state: &mut State,
    tables: &mut T,
    index: u64,
    input: Input,
    local: Option<NodeId>,
    events: &mut Vec<Event>,
) -> Result<Vec<Reply>, T::Error> {
    let live_before = state.live_set();
    let replies = match input {
        Input::Blank => Vec::new(),
        Input::Membership { members, voters } => {
            let before = events::Before::of(state);
            state.members = members;
            state.voters = voters;
            if let Some((trigger, node, detail)) = events::membership_trigger(state, &before) {
                events::record(state, tables, index, trigger, node, detail, &before, &live_before)?;
            }
            Vec::new()
        }
        Input::Commands { term, cmds } => {
            let mut cx = Ctx { term, state: &mut *state, tables, events, local };
            let mut replies = Vec::with_capacity(cmds.len());
            for cmd in cmds.iter() {
                if let Some(at_ms) = cmd.stamped() {
                    cx.state.clock_ms = cx.state.clock_ms.max(at_ms);
                }
                let watch = cmd.watched().then(|| Watch::of(cx.state, cmd));
                replies.push(cmd.apply(&mut cx)?);
                if let Some(w) = watch {
                    w.record(&mut cx, index, &live_before)?;
                }
            }
            replies
        }
    };
    if !state.live().eq(live_before.iter().copied()) {
        state.ring_version = index;
    }
    Ok(replies)
}

/// What the event log compares a watched command's effect against.
struct Watch {
    before: events::Before,
    leases: BTreeMap<NodeId, LeaseState>,
    lock: Option<ScaleInLock>,
    outcome: Option<ScaleInOutcome>,
}

impl Watch {
    fn of(state: &State, cmd: &Command) -> Watch {
        Watch {
            before: events::Before::live_of(state),
            leases: state.nodes.iter().map(|(id, l)| (*id, l.state)).collect(),
            lock: state.scale_in.clone(),
            outcome: match cmd {
                Command::EndScaleIn(e) => Some(e.outcome),
                _ => None,
            },
        }
    }

    /// Records one event if the command changed a lease state (the first changed node names the
    /// trigger; the detail lists every change) or the scale-in lock.
    fn record<T: Tables>(self, cx: &mut Ctx<'_, T>, index: u64, entry_live: &[NodeId]) -> Result<(), T::Error> {
        let state = &*cx.state;
        let mut changes = Vec::new();
        for id in state.nodes.keys().chain(self.leases.keys().filter(|id| !state.nodes.contains_key(id))) {
            if let Some(change) = events::lease_trigger(state, *id, self.leases.get(id).copied()) {
                changes.push((*id, change));
            }
        }
        let lock_change = match (&self.lock, &state.scale_in) {
            (a, b) if a.as_ref().map(|l| (l.node, l.owner)) == b.as_ref().map(|l| (l.node, l.owner)) => None,
            (_, Some(l)) => Some((l.node, format!("scale-in of {} started", l.name))),
            (Some(l), None) => {
                let how = match self.outcome {
                    Some(ScaleInOutcome::Done) => "finished",
                    _ => "aborted",
                };
                Some((l.node, format!("scale-in of {} {how}", l.name)))
            }
            (None, None) => None,
        };
        let (trigger, node, detail) = match (changes.first(), lock_change) {
            (_, Some((node, detail))) => (Trigger::ScaleIn, node, detail),
            (Some((node, (trigger, _))), None) => {
                let detail: Vec<&str> = changes.iter().map(|(_, (_, d))| d.as_str()).collect();
                (*trigger, *node, detail.join("; "))
            }
            (None, None) => return Ok(()),
        };
        events::record(cx.state, cx.tables, index, trigger, Some(node), detail, &self.before, entry_live)
    }
}
