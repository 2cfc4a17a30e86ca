//! Elastic scaling (issue 15): each node's designed capacity, and the serial scale-in lock. A
//! scale-in (`gateway scale-in`) holds one replicated lock for its node while it drains, waits and
//! removes it, so two operators (or two shells) cannot take two nodes out at once; the lock
//! expires unless its holder keeps extending it, so a crashed CLI does not wedge the cluster.
//! Taking the lock also checks, at one log index on every node, that the removal keeps a quorum
//! of healthy voters and that the remaining capacity holds the connections.

use serde::{Deserialize, Serialize};

use super::types::{LeaseState, NodeId};
use super::{Apply, Ctx, Tables};

/// A node's designed connection capacity (`--capacity-connections`), published by the node
/// itself when the applied value differs from its flag; 0 clears it (undeclared).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetCapacity {
    pub node: NodeId,
    pub capacity_connections: u64,
}

impl Apply for SetCapacity {
    type Reply = ();

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<(), T::Error> {
        if !cx.state.is_member(self.node) {
            return Ok(());
        }
        set_or_clear(&mut cx.state.capacity, self.node, self.capacity_connections);
        Ok(())
    }
}

/// A node's hard connection limit (`--max-connections`, or the one derived from its open-file
/// limit), published by the node itself when the applied value differs: placement sends no device
/// to a node whose renewed count has reached it (issue 11). 0 clears it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetMaxConnections {
    pub node: NodeId,
    pub max_connections: u64,
}

impl Apply for SetMaxConnections {
    type Reply = ();

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<(), T::Error> {
        if !cx.state.is_member(self.node) {
            return Ok(());
        }
        set_or_clear(&mut cx.state.max_connections, self.node, self.max_connections);
        Ok(())
    }
}

/// A node's published value; 0 clears it.
fn set_or_clear(values: &mut std::collections::BTreeMap<NodeId, u64>, node: NodeId, value: u64) {
    if value == 0 {
        values.remove(&node);
    } else {
        values.insert(node, value);
    }
}

/// The scale-in in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleInLock {
    pub node: NodeId,
    /// The node's name when the lock was taken (it outlives the node's membership).
    pub name: String,
    /// Random per `gateway scale-in` run: only its holder extends or releases it.
    pub owner: u64,
    pub started_at_ms: u64,
    /// Cluster time after which another scale-in may take the lock over.
    pub expires_at_ms: u64,
}

/// Takes (or, by its holder, extends) the scale-in lock for `node`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeginScaleIn {
    pub node: NodeId,
    pub owner: u64,
    pub at_ms: u64,
    /// The lock lapses this long after the last extension.
    pub ttl_ms: u64,
    /// Skip the capacity check (not the quorum check).
    pub force: bool,
}

/// Why a scale-in may not start, or that it holds the lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScaleInReply {
    /// The lock is taken (or extended, for its holder) until `expires_at_ms`.
    Locked {
        expires_at_ms: u64,
    },
    /// Another scale-in holds the lock.
    Busy {
        node: NodeId,
        owner: u64,
        started_at_ms: u64,
        expires_at_ms: u64,
    },
    /// A member has not renewed a first lease yet: a join is still in progress.
    Joining {
        node: NodeId,
    },
    NotMember,
    /// Removing the node would leave `voters_after` voters of which `healthy_after` are live,
    /// fewer than `needed` (2 at least, and a majority of the voters after).
    Quorum {
        voters_after: u64,
        healthy_after: u64,
        needed: u64,
    },
    /// The connections of the cluster exceed the capacity of the live nodes that would remain.
    Capacity {
        connections: u64,
        capacity_after: u64,
    },
}

/// The fewest voters a scale-in may leave: one voter has no fault tolerance at all, and the
/// next failure would stop every write.
pub const MIN_VOTERS_AFTER: u64 = 2;

impl Apply for BeginScaleIn {
    type Reply = ScaleInReply;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<ScaleInReply, T::Error> {
        let s = &mut *cx.state;
        let expires_at_ms = self.at_ms.saturating_add(self.ttl_ms);
        if let Some(l) = s.scale_in.as_mut() {
            if l.owner == self.owner && l.node == self.node {
                l.expires_at_ms = l.expires_at_ms.max(expires_at_ms);
                return Ok(ScaleInReply::Locked { expires_at_ms: l.expires_at_ms });
            }
            if self.at_ms <= l.expires_at_ms {
                let l = l.clone();
                return Ok(ScaleInReply::Busy {
                    node: l.node,
                    owner: l.owner,
                    started_at_ms: l.started_at_ms,
                    expires_at_ms: l.expires_at_ms,
                });
            }
        }
        if !s.is_member(self.node) {
            return Ok(ScaleInReply::NotMember);
        }
        if let Some(joining) = s.members.keys().find(|id| !s.nodes.contains_key(id)) {
            return Ok(ScaleInReply::Joining { node: *joining });
        }
        if let Some(refusal) = quorum_refusal(s, self.node) {
            return Ok(refusal);
        }
        if !self.force {
            if let Some(refusal) = capacity_refusal(s, self.node) {
                return Ok(refusal);
            }
        }
        let name = s.members.get(&self.node).map(|m| m.name.chars().take(64).collect()).unwrap_or_default();
        s.scale_in =
            Some(ScaleInLock { node: self.node, name, owner: self.owner, started_at_ms: self.at_ms, expires_at_ms });
        Ok(ScaleInReply::Locked { expires_at_ms })
    }
}

/// Voters after removing `node` (learners refilled later are not counted: conservative) and how
/// many of them hold a live lease; refused below [`MIN_VOTERS_AFTER`] or below a majority.
fn quorum_refusal(s: &super::State, node: NodeId) -> Option<ScaleInReply> {
    if !s.voters.contains(&node) {
        return None;
    }
    let after: Vec<NodeId> = s.voters.iter().copied().filter(|v| *v != node).collect();
    let voters_after = after.len() as u64;
    let healthy_after =
        after.iter().filter(|v| s.nodes.get(v).is_some_and(|l| l.state == LeaseState::Live)).count() as u64;
    let needed = (voters_after / 2 + 1).max(MIN_VOTERS_AFTER);
    (voters_after < MIN_VOTERS_AFTER || healthy_after < needed).then_some(ScaleInReply::Quorum {
        voters_after,
        healthy_after,
        needed,
    })
}

/// Every connection of the cluster against the declared capacity of the live nodes that stay; no
/// check while a remaining live node has not declared one (its capacity is unknown).
fn capacity_refusal(s: &super::State, node: NodeId) -> Option<ScaleInReply> {
    let remaining: Vec<NodeId> = s.live_set().into_iter().filter(|id| *id != node).collect();
    let mut capacity_after = 0u64;
    for id in &remaining {
        capacity_after = capacity_after.saturating_add(*s.capacity.get(id)?);
    }
    let connections = s.nodes.values().fold(0u64, |c, l| c.saturating_add(l.connections));
    (connections > capacity_after).then_some(ScaleInReply::Capacity { connections, capacity_after })
}

/// How a scale-in ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScaleInOutcome {
    Done,
    Aborted,
}

/// Releases the lock its holder took: whether it held it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndScaleIn {
    pub node: NodeId,
    pub owner: u64,
    pub outcome: ScaleInOutcome,
}

impl Apply for EndScaleIn {
    type Reply = bool;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<bool, T::Error> {
        let held = cx.state.scale_in.as_ref().is_some_and(|l| l.owner == self.owner && l.node == self.node);
        if held {
            cx.state.scale_in = None;
        }
        Ok(held)
    }
}
