//! openraft type configuration: a log entry's payload is a batch of the domain's commands
//! ([`crate::machine::Command`]), its response one reply per command, a node is a
//! [`crate::machine::Member`]. Written into the log and snapshots forever: change shapes only with
//! a codec version bump.

use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::machine::{Command, Member, NodeId, Reply};

openraft::declare_raft_types!(
    /// The gateway's Raft type configuration.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = Member,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig, super::state_machine::StateMachine>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;

impl crate::store::log::Indexed for LogId {
    fn index(&self) -> u64 {
        self.index
    }
}
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;
pub type SnapshotData = Cursor<Vec<u8>>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
/// A committed leader id (term and node), as log ids carry it.
pub type CommittedLeaderId = openraft::alias::CommittedLeaderIdOf<TypeConfig>;

/// One log entry's payload: the proposer folds every command queued while the previous entry
/// committed into one batch, so concurrent writers share one entry and one fsync.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub cmds: Vec<Command>,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} commands", self.cmds.len())
    }
}

/// One reply per command of the entry, in order; blank and membership entries reply empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub replies: Vec<Reply>,
}

impl std::fmt::Display for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} replies", self.replies.len())
    }
}

/// The log id of entry `index`, proposed by `node` as leader of `term`.
pub fn log_id(term: u64, node: NodeId, index: u64) -> LogId {
    LogId::new(CommittedLeaderId { term, node_id: node }, index)
}
