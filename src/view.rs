//! `ClusterView`: the applied cluster state every decision reads (members, leases, ring), built
//! from the state machine's in-memory [`State`] after each apply. Pure data: the Raft adapter
//! publishes it on a watch channel (`cluster::ClusterWatch`); nothing else builds it.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::machine::{LeaseState, Member, NodeId, NodeLease, State};
use crate::ring::Ring;

/// An immutable view of the applied state; cheap to clone (`Arc`).
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    pub state: Arc<State>,
    pub ring: Arc<Ring>,
}

impl ClusterView {
    /// Builds a view, reusing `prev`'s ring when the live set did not change.
    pub fn new(state: impl Into<Arc<State>>, prev: Option<&ClusterView>) -> ClusterView {
        let state = state.into();
        let ring = match prev {
            Some(p) if p.state.ring_version == state.ring_version && p.state.members == state.members => p.ring.clone(),
            _ => Arc::new(Ring::new(live_names(&state))),
        };
        ClusterView { state, ring }
    }

    /// A live node's share of the cluster's admission budget (rate per second, burst), if a
    /// budget is set: divided by the live nodes as of the last ring change, less the members in
    /// `gone` (those this node has found gone itself before the ring drops them:
    /// `node::detector::Gone`).
    pub fn admission_share(&self, gone: &BTreeSet<NodeId>) -> Option<(f64, u32)> {
        let live = self.state.live_set().into_iter().filter(|id| !gone.contains(id)).count();
        self.state.admission.map(|b| b.share(live))
    }

    pub fn member(&self, id: NodeId) -> Option<&Member> {
        self.state.members.get(&id)
    }

    /// A member's name, or its id as text when it is not (or no longer) a member.
    pub fn name_of(&self, id: NodeId) -> String {
        self.member(id).map_or_else(|| id.to_string(), |m| m.name.to_string())
    }

    pub fn members(&self) -> impl Iterator<Item = (NodeId, &Member)> {
        self.state.members.iter().map(|(id, m)| (*id, m))
    }

    pub fn is_voter(&self, id: NodeId) -> bool {
        self.state.voters.contains(&id)
    }

    pub fn lease(&self, id: NodeId) -> Option<&NodeLease> {
        self.state.nodes.get(&id)
    }

    /// Whether `id` holds a live lease as applied (not draining, not expired).
    pub fn is_live(&self, id: NodeId) -> bool {
        self.lease(id).is_some_and(|l| l.state == LeaseState::Live)
    }

    /// Resolves an operator's `NAME_OR_ID` against the membership.
    pub fn resolve(&self, name_or_id: &str) -> Option<NodeId> {
        self.members().find(|(id, m)| &*m.name == name_or_id || id.to_string() == name_or_id).map(|(id, _)| id)
    }

    pub fn id_of_name(&self, name: &str) -> Option<NodeId> {
        self.members().find(|(_, m)| &*m.name == name).map(|(id, _)| id)
    }

    /// The `/ws` URL of a member's public listener.
    pub fn ws_url(&self, id: NodeId) -> Option<String> {
        self.member(id).map(|m| format!("{}/ws", m.public_url.trim_end_matches('/')))
    }
}

/// Names of members whose applied lease state is live, sorted (the ring's input).
fn live_names(state: &State) -> Vec<String> {
    let mut names: Vec<String> =
        state.live_set().iter().filter_map(|id| state.members.get(id)).map(|m| m.name.to_string()).collect();
    names.sort();
    names
}
