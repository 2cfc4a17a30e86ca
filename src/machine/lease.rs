//! Node leases (V3, V6): renewals, the leader's extension on election, sweeps of lapsed leases,
//! suspicion, drains, and forgetting removed nodes. A lease only grows while the node is not
//! expired; a sweep re-checks every candidate against the entry's own `at_ms`, so a duplicate or
//! stale sweep is harmless, and applies only in the term whose `ExtendLeases` applied last; routes
//! are deleted by sweeps, drains (`ReleaseNode`), `Forget` and a restarted process's first
//! renewal only, floors never.

use serde::{Deserialize, Serialize};

use super::claim::delete_node_routes;
use super::types::{LeaseState, NodeId, NodeLease};
use super::{Apply, Ctx, Event, Tables};

/// Records the cluster id once; later ones change nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Init {
    pub cluster_id: String,
}

impl Apply for Init {
    type Reply = ();

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<(), T::Error> {
        cx.state.cluster_id.get_or_insert_with(|| self.cluster_id.clone());
        Ok(())
    }
}

/// Renews `node`'s lease to `at_ms + lease_ms` (never shorter) and publishes its load.
/// `incarnation` is random per process start: a draining node stays draining until a renewal
/// from a new incarnation (a restart), so a renewal that raced a `Drain` cannot put the node
/// back into the ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renew {
    pub node: NodeId,
    pub at_ms: u64,
    pub lease_ms: u64,
    pub connections: u64,
    pub draining: bool,
    pub incarnation: u64,
}

impl Apply for Renew {
    type Reply = ();

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<(), T::Error> {
        if !cx.state.is_member(self.node) {
            return Ok(());
        }
        let lease = cx.state.nodes.entry(self.node).or_insert(NodeLease {
            lease_until_ms: 0,
            state: LeaseState::Live,
            connections: 0,
            routes: 0,
            incarnation: self.incarnation,
            extendable: true,
            suspect_until_ms: 0,
        });
        lease.lease_until_ms = lease.lease_until_ms.max(self.at_ms.saturating_add(self.lease_ms));
        let same_process = lease.incarnation == self.incarnation;
        lease.state = match lease.state {
            _ if self.draining => LeaseState::Draining,
            LeaseState::Draining if same_process => LeaseState::Draining,
            // Hysteresis: a node that answers again rejoins the ring only after the hold, so a
            // flapping node cannot make the ring oscillate faster than that.
            LeaseState::Suspect if self.at_ms < lease.suspect_until_ms => LeaseState::Suspect,
            _ => LeaseState::Live,
        };
        lease.incarnation = self.incarnation;
        lease.connections = self.connections;
        lease.extendable = true;
        Ok(())
    }
}

/// A process's first lease renewal. When the node's lease carries another incarnation, the routes
/// naming the node are its previous process's (killed and restarted before its lease lapsed, so
/// no sweep will delete them): they are deleted first, floors kept. The same process's later
/// renewals are plain [`Renew`]s, proposed only once one of these committed, so they land after it;
/// a duplicate of it (a retry whose first try committed too) finds its own incarnation and only
/// renews. Replies how many routes it deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstRenew(pub Renew);

impl Apply for FirstRenew {
    type Reply = u64;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<u64, T::Error> {
        let Renew { node, incarnation, .. } = self.0;
        let previous =
            cx.state.is_member(node) && cx.state.nodes.get(&node).is_some_and(|l| l.incarnation != incarnation);
        let deleted = if previous { delete_node_routes(cx.state, cx.tables, node)? } else { 0 };
        self.0.apply(cx)?;
        Ok(deleted)
    }
}

/// Expires each candidate whose `lease_until + grace_ms < at_ms` and deletes its routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sweep {
    pub at_ms: u64,
    pub grace_ms: u64,
    pub candidates: Vec<NodeId>,
}

/// What a sweep did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Swept {
    pub expired: Vec<NodeId>,
    pub routes_deleted: u64,
}

impl Apply for Sweep {
    type Reply = Swept;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<Swept, T::Error> {
        let mut swept = Swept { expired: Vec::new(), routes_deleted: 0 };
        // A sweep proposed in another term than the last lease extension (a leader re-elected
        // between its check and its proposal, a stale one committed by a successor) could expire
        // leases the election gap starved of renewals: it does nothing.
        if cx.term != cx.state.extended_term {
            return Ok(swept);
        }
        for &node in &self.candidates {
            let lapsed = cx.state.nodes.get(&node).is_some_and(|l| {
                l.state != LeaseState::Expired && l.lease_until_ms.saturating_add(self.grace_ms) < self.at_ms
            });
            if lapsed {
                swept.routes_deleted += delete_node_routes(cx.state, cx.tables, node)?;
                if let Some(l) = cx.state.nodes.get_mut(&node) {
                    l.state = LeaseState::Expired;
                }
                swept.expired.push(node);
            }
        }
        if !swept.expired.is_empty() {
            cx.events.push(Event::Swept { nodes: swept.expired.clone() });
        }
        Ok(swept)
    }
}

/// A new leader's first command, before any sweep of its term: pushes every unexpired lease
/// that was renewed since the last extension to at least `at_ms + lease_ms`, covering the
/// election gap in which renewals could not commit. A lease that was not renewed since is left
/// alone, so a dead node is swept however often leadership changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtendLeases {
    pub at_ms: u64,
    pub lease_ms: u64,
}

impl Apply for ExtendLeases {
    type Reply = ();

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<(), T::Error> {
        cx.state.extended_term = cx.state.extended_term.max(cx.term);
        for l in cx.state.nodes.values_mut().filter(|l| l.state != LeaseState::Expired && l.extendable) {
            l.lease_until_ms = l.lease_until_ms.max(self.at_ms.saturating_add(self.lease_ms));
            l.extendable = false;
        }
        Ok(())
    }
}

/// Takes a live `node` out of the ring and of placement on every node at this entry: the leader
/// has not heard from it (probes) for a while. Its lease and routes stay: only a sweep deletes
/// them (or its restarted process's first renewal). A renewal of its own stamped at or after
/// `at_ms + hold_ms` makes it live again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspect {
    pub node: NodeId,
    pub at_ms: u64,
    pub hold_ms: u64,
}

impl Apply for Suspect {
    type Reply = bool;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<bool, T::Error> {
        match cx.state.nodes.get_mut(&self.node) {
            Some(l) if l.state == LeaseState::Live => {
                l.state = LeaseState::Suspect;
                l.suspect_until_ms = self.at_ms.saturating_add(self.hold_ms);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// Marks `node` draining: it leaves the ring everywhere at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    pub node: NodeId,
    pub at_ms: u64,
}

impl Apply for Drain {
    type Reply = bool;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<bool, T::Error> {
        match cx.state.nodes.get_mut(&self.node) {
            Some(l) if l.state == LeaseState::Live => {
                l.state = LeaseState::Draining;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// Deletes every route still naming `node` (the end of a drain).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseNode {
    pub node: NodeId,
}

impl Apply for ReleaseNode {
    type Reply = u64;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<u64, T::Error> {
        delete_node_routes(cx.state, cx.tables, self.node)
    }
}

/// Forgets a node that left the membership: its lease row and routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forget {
    pub node: NodeId,
}

impl Apply for Forget {
    type Reply = u64;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<u64, T::Error> {
        let n = delete_node_routes(cx.state, cx.tables, self.node)?;
        cx.state.nodes.remove(&self.node);
        cx.state.capacity.remove(&self.node);
        cx.state.max_connections.remove(&self.node);
        Ok(n)
    }
}
