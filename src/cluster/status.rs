//! The status report a node answers: its Raft progress (openraft metrics), the applied members,
//! leases and ring.

use std::sync::atomic::Ordering;

use super::Handle;
use crate::machine::NodeId;
use crate::wire::{MemberStatus, NodeRef, RingStatus, ScaleInStatus, StatusReport};
use openraft::async_runtime::WatchReceiver as _;

pub(super) fn report(h: &Handle) -> StatusReport {
    let inner = &h.inner;
    let m = inner.raft.metrics().borrow_watched().clone();
    let view = h.view();
    let now = h.now_ms() as i64;
    let name_of = |id: NodeId| view.name_of(id);
    let replication = m.replication.clone().unwrap_or_default();
    let members = view
        .members()
        .map(|(id, member)| {
            let lease = view.lease(id);
            let capacity = view.state.capacity.get(&id).copied();
            MemberStatus {
                capacity_connections: capacity,
                max_connections: view.state.max_connections.get(&id).copied(),
                utilization: capacity.map(|c| lease.map_or(0, |l| l.connections) as f64 / c as f64),
                id,
                name: member.name.to_string(),
                cluster_addr: member.cluster_addr.to_string(),
                public_url: member.public_url.to_string(),
                role: if view.is_voter(id) { "voter" } else { "learner" }.to_string(),
                state: lease.map_or("joining", |l| l.state.as_str()).to_string(),
                lease_remaining_ms: lease.map(|l| l.lease_until_ms as i64 - now),
                routes: lease.map_or(0, |l| l.routes),
                connections: lease.map_or(0, |l| l.connections),
                matched_index: if id == inner.me && m.current_leader == Some(inner.me) {
                    m.last_log_index
                } else {
                    replication.get(&id).cloned().flatten().map(|l| l.index)
                },
            }
        })
        .collect();
    StatusReport {
        cluster_id: view.state.cluster_id.clone(),
        node: NodeRef { id: inner.me, name: inner.member.name.to_string() },
        leader: m.current_leader.map(|id| NodeRef { id, name: name_of(id) }),
        server_state: format!("{:?}", m.state).to_lowercase(),
        term: m.current_term,
        commit_index: inner.committed.load(Ordering::Relaxed).max(m.last_applied.map_or(0, |l| l.index)),
        applied_index: m.last_applied.map_or(0, |l| l.index),
        last_log_index: m.last_log_index.unwrap_or(0),
        snapshot_index: m.snapshot.map(|l| l.index),
        purged_index: m.purged.map(|l| l.index),
        config: inner.timing.clone(),
        admission: None,
        admission_budget: None,
        members,
        connections_here: None,
        scale_in: view.state.scale_in.as_ref().map(|l| ScaleInStatus {
            node: NodeRef { id: l.node, name: name_of(l.node) },
            started_at_ms: l.started_at_ms,
            expires_at_ms: l.expires_at_ms,
        }),
        scaling: None,
        ring: RingStatus {
            version: view.state.ring_version,
            live: view.ring.nodes().to_vec(),
            share: view.ring.shares(),
        },
    }
}
