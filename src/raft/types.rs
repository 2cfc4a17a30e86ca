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
