//! openraft type configuration and the replicated command set (design §3). Every type here is
//! written into the Raft log or a snapshot forever: change shapes only with a codec version bump.

use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

/// A Raft node id: random, generated when a data dir is first created (see `node::identity`).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The gateway's Raft type configuration.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type Vote = openraft::Vote<NodeId>;

/// What the membership records about a node: its operator-chosen name and its two addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    /// `host:port` of the cluster listener (Raft RPC, admin API).
    pub cluster_addr: String,
    /// Base URL devices use, e.g. `ws://127.0.0.1:8080`.
    pub public_url: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.cluster_addr)
    }
}

/// One log entry's payload: the proposer folds every command queued while the previous entry
/// committed into one batch, so concurrent writers share one entry and one fsync.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub cmds: Vec<Command>,
}

/// One reply per command of the entry, in order; blank and membership entries reply empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub replies: Vec<Reply>,
}

/// Replicated commands. Time-dependent ones carry `at_ms`, stamped by the leader's proposer:
/// `apply` never reads a clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Records the cluster id once; later ones change nothing.
    Init { cluster_id: String },
    /// Moves `device` to (`node`, `conn`) iff `(epoch, attempt)` beats the device's floor.
    Claim { device: String, node: NodeId, conn: u64, epoch: u64, attempt: u64 },
    /// Deletes the device's route only if it still names `conn`.
    Release { device: String, conn: u64 },
    /// Renews `node`'s lease to `at_ms + lease_ms` (never shorter) and publishes its load.
    /// `incarnation` is random per process start: a draining node stays draining until a
    /// renewal from a new incarnation (a restart), so a renewal that raced a `Drain` cannot put
    /// the node back into the ring.
    Renew { node: NodeId, at_ms: u64, lease_ms: u64, connections: u64, draining: bool, incarnation: u64 },
    /// Expires each candidate whose `lease_until + grace_ms < at_ms` and deletes its routes.
    Sweep { at_ms: u64, grace_ms: u64, candidates: Vec<NodeId> },
    /// Pushes every unexpired lease to at least `at_ms + lease_ms` (new leader, before any sweep).
    ExtendLeases { at_ms: u64, lease_ms: u64 },
    /// Marks `node` draining: it leaves the ring everywhere at once.
    Drain { node: NodeId, at_ms: u64 },
    /// Deletes every route still naming `node`.
    ReleaseNode { node: NodeId },
    /// Forgets a node that left the membership: its lease row and routes.
    Forget { node: NodeId },
    /// Appends a message to a known device's stream (idempotent per `key`), then trims the stream
    /// to `keep_count` messages and to those newer than `at_ms - keep_age_ms`.
    Publish { device: String, payload: String, key: Option<String>, at_ms: u64, keep_count: u64, keep_age_ms: u64 },
    /// The device has every message up to `seq`: trim them.
    Ack { device: String, seq: u64 },
}

impl Command {
    /// The leader's proposer stamps its wall clock into time-dependent commands.
    pub fn stamp(&mut self, now_ms: u64) {
        match self {
            Command::Renew { at_ms, .. }
            | Command::Sweep { at_ms, .. }
            | Command::ExtendLeases { at_ms, .. }
            | Command::Drain { at_ms, .. }
            | Command::Publish { at_ms, .. } => *at_ms = now_ms,
            _ => {}
        }
    }
}

/// The previous owner of a route that a claim replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Superseded {
    pub node: NodeId,
    pub conn: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Done,
    Accepted {
        version: u64,
        superseded: Option<Superseded>,
    },
    Stale {
        floor_epoch: u64,
        floor_attempt: u64,
    },
    NodeNotLive,
    Released(bool),
    Swept {
        expired: Vec<NodeId>,
        routes_deleted: u64,
    },
    Count(u64),
    /// The message's sequence number; `duplicate` when the idempotency key was seen before.
    Published {
        seq: u64,
        duplicate: bool,
    },
    /// The device never connected: there is no stream to publish to.
    NoSuchDevice,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseState {
    Live,
    Draining,
    Expired,
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Live => "live",
            LeaseState::Draining => "draining",
            LeaseState::Expired => "expired",
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
    /// The renewing process's incarnation (see `Command::Renew`).
    pub incarnation: u64,
}
