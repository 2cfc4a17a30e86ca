//! The values the replicated state holds: members, routes, floors, node leases. Every type here is
//! written into the Raft log, a snapshot or `state.redb` forever: change shapes only with a codec
//! version bump.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A Raft node id: random, generated when a data dir is first created (see `node::identity`).
pub type NodeId = u64;

/// What the membership records about a node: its operator-chosen name and its two addresses.
/// Shared strings, so that a copy is three counts and no allocation: openraft copies the
/// leader's `Member` on every pass of a follower's core loop (the `ForwardToLeader` that
/// `Engine::try_leader_handler` builds, and drops, twice a pass), and every apply copies the
/// membership with the state. Encoded as three strings, as before (the codec, `state.redb`, JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: Arc<str>,
    /// `host:port` of the cluster listener (Raft RPC, admin API).
    pub cluster_addr: Arc<str>,
    /// Base URL devices use, e.g. `ws://127.0.0.1:8080`.
    pub public_url: Arc<str>,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.cluster_addr)
    }
}

/// A device's current route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub node: NodeId,
    pub conn: u64,
    pub version: u64,
}

/// The highest claim ever accepted for a device; never deleted by sweeps, so late claims stay fenced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Floor {
    pub max_version: u64,
    pub max_epoch: u64,
    pub max_attempt: u64,
    pub last_node: NodeId,
}

/// A node's state as applied. Only `Live` nodes are in the ring and take devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseState {
    Live,
    /// Draining: out of the ring, moving its devices away (sticky until a restart).
    Draining,
    /// Swept: its lease lapsed and its routes were deleted.
    Expired,
    /// The leader stopped hearing from it: out of the ring and of placement at once, but it keeps
    /// its lease and routes (only a sweep, or its restarted process's first renewal, deletes
    /// those); its own renewal clears it, after a hold.
    Suspect,
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Live => "live",
            LeaseState::Draining => "draining",
            LeaseState::Expired => "expired",
            LeaseState::Suspect => "suspect",
        }
    }
}

/// A node's lease row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLease {
    pub lease_until_ms: u64,
    pub state: LeaseState,
    pub connections: u64,
    /// Routes currently naming this node (maintained by apply).
    pub routes: u64,
    /// The renewing process's incarnation (see [`super::Renew`]).
    pub incarnation: u64,
    /// Renewed since the last `ExtendLeases`: the next one may extend it (so a dead node gets at
    /// most one extension, however often leadership changes).
    pub extendable: bool,
    /// While suspect: a renewal stamped at or after this clears the suspicion (hysteresis).
    pub suspect_until_ms: u64,
}

/// The previous owner of a route that a claim replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Superseded {
    pub node: NodeId,
    pub conn: u64,
}
