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
/// committed into one batch, so concurrent writers share one entry and one fsync. The commands
/// are shared: the log's tail keeps the entry, replication copies it out for every follower and
/// the leader's apply reads it back, and each of those copies is a count, not the commands (the
/// same bytes on the wire and on disk as a `Vec`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub cmds: std::sync::Arc<Vec<Command>>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode, encode};
    use crate::machine::Release;

    /// A member's shared strings are written as the three strings they were before: a node reads
    /// the memberships an older build stored (its log, snapshots, `state.redb`) and exchanges
    /// them with older members, in the project codec and in JSON alike.
    #[test]
    fn a_member_encodes_as_three_strings() {
        let m = Member { name: "n1".into(), cluster_addr: "10.0.0.1:7070".into(), public_url: "ws://h1".into() };
        let strings = ("n1".to_string(), "10.0.0.1:7070".to_string(), "ws://h1".to_string());
        assert_eq!(encode(&m).unwrap(), encode(&strings).unwrap());
        assert_eq!(decode::<Member>(&encode(&strings).unwrap()).unwrap(), m);
        let json = r#"{"name":"n1","cluster_addr":"10.0.0.1:7070","public_url":"ws://h1"}"#;
        assert_eq!(serde_json::to_string(&m).unwrap(), json);
        assert_eq!(serde_json::from_str::<Member>(json).unwrap(), m);
    }

    /// An entry's shared commands are written as the list they were before: logs and snapshots
    /// of an older build read back, and older members read what this one replicates.
    #[test]
    fn a_request_encodes_as_its_list_of_commands() {
        let cmds = vec![Command::Release(Release { device: "d1".into(), conn: 7 })];
        let req = Request { cmds: cmds.clone().into() };
        assert_eq!(encode(&req).unwrap(), encode(&(cmds.clone(),)).unwrap());
        assert_eq!(decode::<Request>(&encode(&(cmds,)).unwrap()).unwrap(), req);
    }
}
