//! Membership changes, run on the leader: join as learner, promote to voter while voter slots are
//! free, leave for good, finish a joint configuration.
//!
//! Two things may change the membership at once: an operator's request and the leader's own duty
//! of finishing a joint configuration. openraft serializes the entries, but a two-step change
//! (joint, then uniform) fails its second step with a precondition error when another change
//! lands between its steps. So each change here (1) holds the node's membership lock (`Handle`'s)
//! for its whole run, and (2) is re-planned from the current membership on every attempt: an attempt
//! that finds its goal reached (by whatever change got there first) is done.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, Membership};

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

fn current(raft: &Raft) -> Membership<NodeId, Member> {
    raft.metrics().borrow_watched().membership_config.membership().clone()
}

/// Whether `mem` is a joint configuration (two voter sets, between a change's steps).
fn joint(mem: &Membership<NodeId, Member>) -> bool {
    mem.get_joint_config().len() > 1
}

pub fn summary(raft: &Raft) -> MembershipSummary {
    let mem = current(raft);
    let voters: BTreeSet<NodeId> = mem.voter_ids().collect();
    let mut s = MembershipSummary::default();
    for (id, node) in mem.nodes() {
        let entry = (*id, node.name.to_string());
        if voters.contains(id) {
            s.voters.push(entry);
        } else {
            s.learners.push(entry);
        }
    }
    s
}

/// The voters (of both sets, in a joint configuration) with their cluster addresses.
pub fn voters(raft: &Raft) -> Vec<(NodeId, std::sync::Arc<str>)> {
    let mem = current(raft);
    mem.voter_ids().filter_map(|id| mem.get_node(&id).map(|node| (id, node.cluster_addr.clone()))).collect()
}

/// Adds `id` as a learner unless it already is a member. Refuses a name or address clash.
/// Returns `false` when it was already a member (a no-op).
pub async fn add_learner(raft: &Raft, id: NodeId, member: Member, timeout: Duration) -> Result<bool, MembershipError> {
    for (oid, om) in current(raft).nodes() {
        if *oid == id {
            if *om == member {
                return Ok(false);
            }
            return Err(MembershipError::Clash(format!(
                "node id {id} is already a member as {om}, with another name or address than the joining node's"
            )));
        }
        if om.name == member.name || om.cluster_addr == member.cluster_addr {
            return Err(MembershipError::Clash(format!(
                "member {oid} ({om}) already uses the joining node's name or address (id {id}); \
                 if that is an old identity of this node, remove it first: gateway leave --node {oid}"
            )));
        }
    }
    retry(timeout, || match current(raft).get_node(&id) {
        Some(_) => None,
        None => Some(raft.add_learner(id, member.clone(), false)),
    })
    .await?;
    Ok(true)
}

/// Promotes a learner to voter while fewer than `max_voters` voters exist; answers whether it is a voter.
pub async fn promote(raft: &Raft, id: NodeId, max_voters: usize, timeout: Duration) -> Result<bool, MembershipError> {
    let mem = current(raft);
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
    // Done once `id` is a voter of a uniform configuration; on a joint one the same change
    // settles it (openraft applies a change to a joint configuration's last half).
    retry(timeout, || {
        let mem = current(raft);
        let settled = !joint(&mem) && mem.voter_ids().any(|v| v == id);
        (!settled).then(|| raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true))
    })
    .await?;
    Ok(true)
}

/// Removes `id` from the membership for good, then refills voter slots from learners.
pub async fn remove(raft: &Raft, id: NodeId, max_voters: usize, timeout: Duration) -> Result<(), MembershipError> {
    if current(raft).get_node(&id).is_none() {
        return Err(MembershipError::NotMember(id.to_string()));
    }
    retry(timeout, || {
        // Done once `id` is in no configuration and no node list. A voter, or any joint
        // configuration, is settled by removing it from the voters (without retaining it as a
        // learner); a learner is removed from the nodes.
        let mem = current(raft);
        let set = BTreeSet::from([id]);
        if joint(&mem) || mem.voter_ids().any(|v| v == id) {
            Some(raft.change_membership(ChangeMembers::RemoveVoters(set), false))
        } else if mem.get_node(&id).is_some() {
            Some(raft.change_membership(ChangeMembers::RemoveNodes(set), false))
        } else {
            None
        }
    })
    .await?;
    refill_voters(raft, max_voters, timeout).await
}

/// Promotes learners (lowest id first) until `max_voters` voters exist or none is left.
pub async fn refill_voters(raft: &Raft, max_voters: usize, timeout: Duration) -> Result<(), MembershipError> {
    retry(timeout, || {
        let s = summary(raft);
        let free = max_voters.saturating_sub(s.voters.len());
        let add: BTreeSet<NodeId> = s.learners.iter().take(free).map(|(id, _)| *id).collect();
        (!add.is_empty()).then(|| raft.change_membership(ChangeMembers::AddVoterIds(add), true))
    })
    .await
}

/// Finishes a joint configuration a previous leader left behind; whether there was one.
pub async fn finish_joint(raft: &Raft, timeout: Duration) -> Result<bool, MembershipError> {
    if !joint(&current(raft)) {
        return Ok(false);
    }
    retry(timeout, || {
        let mem = current(raft);
        let last: BTreeSet<NodeId> = mem.get_joint_config().last().cloned().unwrap_or_default();
        joint(&mem).then(|| raft.change_membership(ChangeMembers::ReplaceAllVoters(last), false))
    })
    .await?;
    Ok(true)
}

/// What an attempt's error means for the change.
#[derive(Debug, PartialEq)]
enum Next {
    /// Wait and plan again: a change is in progress, the new leader has not committed its first
    /// entry yet, or another change landed between this one's steps (a precondition failed).
    Replan,
    NotLeader,
    Fail(String),
}

fn classify(e: &RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Next {
    match e {
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(_) | ChangeMembershipError::UncommittedLeaderLog(_),
        ))
        | RaftError::APIError(ClientWriteError::PreconditionFailed(_)) => Next::Replan,
        RaftError::APIError(ClientWriteError::ForwardToLeader(_) | ClientWriteError::LogEntryDiscarded(_)) => {
            Next::NotLeader
        }
        e => Next::Fail(e.to_string()),
    }
}

/// Runs `plan`'s changes until `plan` finds nothing left to do (`None`: the goal holds, reached by
/// this change or by another), backing off 50 ms → 500 ms after a refused attempt, within
/// `timeout`. A change that succeeds is planned again at once: one applied to a joint
/// configuration may only have settled it.
async fn retry<F, Fut, T>(timeout: Duration, mut plan: F) -> Result<(), MembershipError>
where
    F: FnMut() -> Option<Fut>,
    Fut: std::future::Future<Output = Result<T, RaftError<TypeConfig, ClientWriteError<TypeConfig>>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(attempt) = plan() else { return Ok(()) };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(MembershipError::Timeout(timeout));
        }
        match tokio::time::timeout(left, attempt).await {
            Err(_) => return Err(MembershipError::Timeout(timeout)),
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => match classify(&e) {
                Next::Replan => tracing::debug!(error = %e, "membership change: planning again"),
                Next::NotLeader => return Err(MembershipError::NotLeader),
                Next::Fail(m) => return Err(MembershipError::Raft(m)),
            },
        }
        tokio::time::sleep(backoff.min(left)).await;
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

#[cfg(test)]
#[path = "membership_tests.rs"]
mod tests;
