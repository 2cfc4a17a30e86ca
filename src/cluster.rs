//! `ClusterView`: the applied cluster state every decision reads (members, leases, ring), published
//! by the state machine on a watch channel after each apply. Nothing else builds it.

use std::sync::Arc;

use tokio::sync::watch;

use crate::raft::types::{LeaseState, Member, NodeId, NodeLease};
use crate::ring::Ring;
use crate::store::state::Meta;

/// An immutable view of the applied state; cheap to clone (`Arc`).
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    pub meta: Arc<Meta>,
    pub ring: Arc<Ring>,
}

pub type ClusterWatch = watch::Receiver<Arc<ClusterView>>;

/// What an apply did that a node must act on at once (close a superseded or swept connection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyEvent {
    /// A claim replaced the route held by `conn` on `node`.
    Superseded { node: NodeId, conn: u64 },
    /// A sweep expired these nodes and deleted their routes.
    Swept { nodes: Vec<NodeId> },
    /// A snapshot replaced the whole state: what it folded in fired no events, so reconcile.
    Installed,
    /// A message was appended to a device's stream while its route named (node, conn).
    Published(crate::store::streams::Delivery),
}

impl ClusterView {
    /// Builds a view, reusing `prev`'s ring when the live set did not change.
    pub fn new(meta: Meta, prev: Option<&ClusterView>) -> ClusterView {
        let ring = match prev {
            Some(p) if p.meta.ring_version == meta.ring_version && p.meta.membership == meta.membership => {
                p.ring.clone()
            }
            _ => Arc::new(Ring::new(live_names(&meta))),
        };
        ClusterView { meta: Arc::new(meta), ring }
    }

    pub fn member(&self, id: NodeId) -> Option<&Member> {
        self.meta.membership.membership().get_node(&id)
    }

    pub fn members(&self) -> impl Iterator<Item = (NodeId, &Member)> {
        self.meta.membership.membership().nodes().map(|(id, m)| (*id, m))
    }

    pub fn is_voter(&self, id: NodeId) -> bool {
        self.meta.membership.membership().voter_ids().any(|v| v == id)
    }

    pub fn lease(&self, id: NodeId) -> Option<&NodeLease> {
        self.meta.nodes.get(&id)
    }

    /// Resolves an operator's `NAME_OR_ID` against the membership.
    pub fn resolve(&self, name_or_id: &str) -> Option<NodeId> {
        self.members().find(|(id, m)| m.name == name_or_id || id.to_string() == name_or_id).map(|(id, _)| id)
    }

    pub fn id_of_name(&self, name: &str) -> Option<NodeId> {
        self.members().find(|(_, m)| m.name == name).map(|(id, _)| id)
    }
}

/// Names of members whose applied lease state is live, sorted (the ring's input).
pub fn live_names(meta: &Meta) -> Vec<String> {
    let membership = meta.membership.membership();
    let mut names: Vec<String> = meta
        .nodes
        .iter()
        .filter(|(_, l)| l.state == LeaseState::Live)
        .filter_map(|(id, _)| membership.get_node(id).map(|m| m.name.clone()))
        .collect();
    names.sort();
    names
}
