//! The cluster event log (issue 15): every membership or ring change, recorded by apply itself
//! (so every node holds the same log, and snapshots carry it) with what triggered it, the
//! cluster's connections and routes at that moment, the live nodes before and after, and the
//! ring version. Bounded: the newest [`KEEP`] events, each at most about [`MAX_EVENT_BYTES`].
//! Time is the entry's (cluster time, `State::clock_ms`): apply reads no clock.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::types::{LeaseState, NodeId};
use super::{State, Tables};

/// Events kept: older ones are deleted as new ones are recorded.
pub const KEEP: u64 = 256;
/// Node names kept per list (live before / after, sorted); longer lists end with `+N more`.
pub const MAX_NAMES: usize = 32;
/// Bytes kept of a name or of the detail line.
const MAX_NAME_BYTES: usize = 64;
const MAX_DETAIL_BYTES: usize = 160;
/// About the largest encoded event: two lists of [`MAX_NAMES`] names, the detail, the numbers.
/// [`KEEP`] of them bound the table (≈ 1.1 MB at worst; ≈ 50 KB for a few nodes).
pub const MAX_EVENT_BYTES: usize = 2 * (MAX_NAMES + 1) * (MAX_NAME_BYTES + 1) + MAX_DETAIL_BYTES + 96;

/// What made the cluster change. The variant order is the persisted format: append only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Trigger {
    /// A member was added (learner) or promoted to voter, or a new member's first lease made it live.
    Join,
    /// A member was removed from the membership.
    Leave,
    /// A node started draining (SIGTERM, `gateway drain`): out of the ring.
    Drain,
    /// The leader stopped hearing from a node: out of the ring.
    Suspicion,
    /// A lapsed lease was swept: the node expired and its routes were deleted.
    Sweep,
    /// A suspect, expired or restarted node renewed its lease and is live again.
    LeaseRecovery,
    /// A serial scale-in started, drained or removed its node, finished or was aborted.
    ScaleIn,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Join => "join",
            Trigger::Leave => "leave",
            Trigger::Drain => "drain",
            Trigger::Suspicion => "suspicion",
            Trigger::Sweep => "sweep",
            Trigger::LeaseRecovery => "lease_recovery",
            Trigger::ScaleIn => "scale_in",
        }
    }
}

/// One recorded change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterEvent {
    /// 1, 2, 3, … in apply order: the cursor of `GET /cluster/events?after=`.
    pub seq: u64,
    /// The log index of the entry that made the change.
    pub index: u64,
    /// Cluster time of the entry (the newest leader stamp applied).
    pub at_ms: u64,
    pub trigger: Trigger,
    /// The node the change is about, if one.
    pub node: Option<NodeId>,
    /// One line for people, e.g. `n4 added as a learner`.
    pub detail: String,
    /// Connections (as last renewed) and routes over all nodes at the change.
    pub connections: u64,
    pub routes: u64,
    /// Names of the live nodes (the ring) before and after.
    pub live_before: Vec<String>,
    pub live_after: Vec<String>,
    /// The ring version after the change (the log index of the last live-set change).
    pub ring_version: u64,
}

/// What the log needs of the state before a change: the live set (cheap: taken before every
/// command that may change it) and, for membership changes only, the members and their names.
pub(super) struct Before {
    live: Vec<NodeId>,
    members: BTreeMap<NodeId, String>,
    voters: BTreeSet<NodeId>,
}

impl Before {
    /// Before a command: commands do not change the membership, so names are read after.
    pub(super) fn live_of(state: &State) -> Before {
        Before { live: state.live_set(), members: BTreeMap::new(), voters: BTreeSet::new() }
    }

    /// Before a membership change.
    pub(super) fn of(state: &State) -> Before {
        let members = state.members.iter().map(|(id, m)| (*id, truncate(&m.name, MAX_NAME_BYTES))).collect();
        Before { live: state.live_set(), members, voters: state.voters.clone() }
    }

    fn name(&self, state: &State, id: NodeId) -> String {
        self.members.get(&id).cloned().unwrap_or_else(|| node_name(state, id))
    }

    fn names(&self, state: &State) -> Vec<String> {
        let mut out: Vec<String> = self.live.iter().take(MAX_NAMES).map(|id| self.name(state, *id)).collect();
        out.sort();
        if self.live.len() > MAX_NAMES {
            out.push(format!("+{} more", self.live.len() - MAX_NAMES));
        }
        out
    }
}

/// A member's name (bounded), or its id once it is no member.
pub(super) fn node_name(state: &State, id: NodeId) -> String {
    state.members.get(&id).map_or_else(|| id.to_string(), |m| truncate(&m.name, MAX_NAME_BYTES))
}

fn names(state: &State, ids: &[NodeId]) -> Vec<String> {
    let mut out: Vec<String> = ids.iter().take(MAX_NAMES).map(|id| node_name(state, *id)).collect();
    out.sort();
    if ids.len() > MAX_NAMES {
        out.push(format!("+{} more", ids.len() - MAX_NAMES));
    }
    out
}

fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// What triggered a lease-state change of `node` from `was` to its state now, if one did.
pub(super) fn lease_trigger(state: &State, node: NodeId, was: Option<LeaseState>) -> Option<(Trigger, String)> {
    let now = state.nodes.get(&node).map(|l| l.state);
    let n = node_name(state, node);
    let scaling = state.scale_in.as_ref().is_some_and(|l| l.node == node);
    Some(match (was, now?) {
        (a, b) if a == Some(b) => return None,
        (None, LeaseState::Live) => (Trigger::Join, format!("{n} renewed its first lease: in the ring")),
        (Some(w), LeaseState::Live) => (Trigger::LeaseRecovery, format!("{n} is live again (was {})", w.as_str())),
        (_, LeaseState::Draining) if scaling => (Trigger::ScaleIn, format!("{n} draining for scale-in")),
        (_, LeaseState::Draining) => (Trigger::Drain, format!("{n} draining")),
        (_, LeaseState::Suspect) => (Trigger::Suspicion, format!("{n} suspected: the leader stopped hearing from it")),
        (_, LeaseState::Expired) => (Trigger::Sweep, format!("{n} expired: lease lapsed, routes deleted")),
    })
}

/// What a membership change did, in words, and its trigger: additions and promotions are joins,
/// removals leaves (a scale-in's own removal is a scale-in step).
pub(super) fn membership_trigger(state: &State, before: &Before) -> Option<(Trigger, Option<NodeId>, String)> {
    let added: Vec<NodeId> = state.members.keys().filter(|id| !before.members.contains_key(id)).copied().collect();
    let removed: Vec<NodeId> = before.members.keys().filter(|id| !state.members.contains_key(id)).copied().collect();
    let promoted: Vec<NodeId> = state
        .voters
        .iter()
        .filter(|id| !before.voters.contains(id) && before.members.contains_key(id))
        .copied()
        .collect();
    let scaling = |id: &NodeId| state.scale_in.as_ref().is_some_and(|l| l.node == *id);
    let role = |id: &NodeId| if state.voters.contains(id) { "voter" } else { "learner" };
    let mut lines: Vec<String> =
        removed.iter().map(|id| format!("{} removed from the membership", before.name(state, *id))).collect();
    lines.extend(added.iter().map(|id| format!("{} added as a {}", node_name(state, *id), role(id))));
    lines.extend(promoted.iter().map(|id| format!("{} promoted to voter", node_name(state, *id))));
    let (trigger, node) = match (removed.first(), added.first().or(promoted.first())) {
        (Some(id), _) if scaling(id) => (Trigger::ScaleIn, *id),
        (Some(id), _) => (Trigger::Leave, *id),
        (None, Some(id)) => (Trigger::Join, *id),
        (None, None) => return None,
    };
    Some((trigger, Some(node), lines.join("; ")))
}

/// Appends an event (seq = the next one) and deletes the one [`KEEP`] behind it. `entry_live`:
/// the live set when the entry's apply began.
#[allow(clippy::too_many_arguments)]
pub(super) fn record<T: Tables>(
    state: &mut State,
    tables: &mut T,
    index: u64,
    trigger: Trigger,
    node: Option<NodeId>,
    detail: String,
    before: &Before,
    entry_live: &[NodeId],
) -> Result<(), T::Error> {
    let live_after = state.live_set();
    // What `apply` sets at the end of the entry (the live set against the entry's start).
    let ring_version = if live_after != entry_live { index } else { state.ring_version };
    let (connections, routes) = state
        .nodes
        .values()
        .fold((0u64, 0u64), |(c, r), l| (c.saturating_add(l.connections), r.saturating_add(l.routes)));
    state.event_seq += 1;
    let event = ClusterEvent {
        seq: state.event_seq,
        index,
        at_ms: state.clock_ms,
        trigger,
        node,
        detail: truncate(&detail, MAX_DETAIL_BYTES),
        connections,
        routes,
        live_before: before.names(state),
        live_after: names(state, &live_after),
        ring_version,
    };
    tables.put_cluster_event(event.seq, &event)?;
    if event.seq > KEEP {
        tables.remove_cluster_event(event.seq - KEEP)?;
    }
    Ok(())
}
