//! Membership changes, run on the leader: join as learner, promote to voter while voter slots are
//! free, leave for good. openraft serializes membership changes; we retry its `InProgress`.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::ChangeMembers;

use crate::machine::{Member, NodeId};
use crate::raft::types::{Raft, TypeConfig};
use crate::wire::MembershipSummary;
use openraft::async_runtime::WatchReceiver as _;

#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("{0}")]
    Clash(String),
    #[error("{0} is not a member")]
    NotMember(String),
    #[error("this node is not the leader")]
    NotLeader,
    #[error("membership change did not finish within {0:?}")]
    Timeout(Duration),
    #[error("raft: {0}")]
    Raft(String),
}

pub fn summary(raft: &Raft) -> MembershipSummary {
    let m = raft.metrics().borrow_watched().membership_config.clone();
    let mem = m.membership();
    let voters: BTreeSet<NodeId> = mem.voter_ids().collect();
    let mut s = MembershipSummary::default();
    for (id, node) in mem.nodes() {
        let entry = (*id, node.name.clone());
        if voters.contains(id) {
            s.voters.push(entry);
        } else {
            s.learners.push(entry);
        }
    }
    s
}

/// Adds `id` as a learner unless it already is a member. Refuses a name or address clash.
/// Returns `false` when it was already a member (a no-op).
pub async fn add_learner(raft: &Raft, id: NodeId, member: Member, timeout: Duration) -> Result<bool, MembershipError> {
    {
        let m = raft.metrics().borrow_watched().membership_config.clone();
        for (oid, om) in m.membership().nodes() {
            if *oid == id {
                if *om == member {
                    return Ok(false);
                }
                return Err(MembershipError::Clash(format!("node id {id} is already a member as {om}, not {member}")));
            }
            if om.name == member.name || om.cluster_addr == member.cluster_addr {
                return Err(MembershipError::Clash(format!(
                    "member {oid} ({om}) already uses the name or address of {member} (id {id}); \
                     if that is an old identity of this node, remove it first: gateway leave --node {oid}"
                )));
            }
        }
    }
    retry(timeout, || raft.add_learner(id, member.clone(), false)).await?;
    Ok(true)
}

/// Promotes a learner to voter while fewer than `max_voters` voters exist; answers whether it is a voter.
pub async fn promote(raft: &Raft, id: NodeId, max_voters: usize, timeout: Duration) -> Result<bool, MembershipError> {
    let m = raft.metrics().borrow_watched().membership_config.clone();
    let mem = m.membership();
    if mem.get_node(&id).is_none() {
        return Err(MembershipError::NotMember(id.to_string()));
    }
    let voters: BTreeSet<NodeId> = mem.voter_ids().collect();
    if voters.contains(&id) {
        return Ok(true);
    }
    if voters.len() >= max_voters {
        return Ok(false);
    }
    retry(timeout, || raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true)).await?;
    Ok(true)
}

/// Removes `id` from the membership for good, then refills voter slots from learners.
pub async fn remove(raft: &Raft, id: NodeId, max_voters: usize, timeout: Duration) -> Result<(), MembershipError> {
    let m = raft.metrics().borrow_watched().membership_config.clone();
    let mem = m.membership();
    if mem.get_node(&id).is_none() {
        return Err(MembershipError::NotMember(id.to_string()));
    }
    let is_voter = mem.voter_ids().any(|v| v == id);
    let set = BTreeSet::from([id]);
    if is_voter {
        retry(timeout, || raft.change_membership(ChangeMembers::RemoveVoters(set.clone()), false)).await?;
    } else {
        retry(timeout, || raft.change_membership(ChangeMembers::RemoveNodes(set.clone()), false)).await?;
    }
    refill_voters(raft, max_voters, timeout).await
}

/// Promotes learners (lowest id first) until `max_voters` voters exist or none is left.
pub async fn refill_voters(raft: &Raft, max_voters: usize, timeout: Duration) -> Result<(), MembershipError> {
    let s = summary(raft);
    let free = max_voters.saturating_sub(s.voters.len());
    let add: BTreeSet<NodeId> = s.learners.iter().take(free).map(|(id, _)| *id).collect();
    if add.is_empty() {
        return Ok(());
    }
    retry(timeout, || raft.change_membership(ChangeMembers::AddVoterIds(add.clone()), true)).await
}

/// Finishes a joint configuration a previous leader left behind.
pub async fn finish_joint(raft: &Raft, timeout: Duration) -> Result<bool, MembershipError> {
    let m = raft.metrics().borrow_watched().membership_config.clone();
    let joint = m.membership().get_joint_config();
    if joint.len() <= 1 {
        return Ok(false);
    }
    let last: BTreeSet<NodeId> = joint.last().cloned().unwrap_or_default();
    retry(timeout, || raft.change_membership(ChangeMembers::ReplaceAllVoters(last.clone()), false)).await?;
    Ok(true)
}

async fn retry<F, Fut, T>(timeout: Duration, mut op: F) -> Result<(), MembershipError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, RaftError<TypeConfig, ClientWriteError<TypeConfig>>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut backoff = Duration::from_millis(50);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(MembershipError::Timeout(timeout));
        }
        match tokio::time::timeout(left, op()).await {
            Err(_) => return Err(MembershipError::Timeout(timeout)),
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                ChangeMembershipError::InProgress(_),
            )))) => {}
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => {
                return Err(MembershipError::NotLeader)
            }
            Ok(Err(e)) => return Err(MembershipError::Raft(e.to_string())),
        }
        tokio::time::sleep(backoff.min(left)).await;
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}
