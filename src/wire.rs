//! The JSON bodies of the cluster listener's admin API, shared by the server (`api`) and the admin
//! client (`tools::admin`): join/promote/leave/identity, the membership summary, and the status
//! report (`GET /cluster/status`, `gateway status [--json]`, `gateway watch`) — one shape scripts
//! rely on (add fields freely, rename none) — with its human rendering.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::config::Timing;
use crate::machine::{Member, NodeId};

/// Who a node is: `gateway join` asks the new node before asking the cluster to add it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdentityReply {
    pub id: NodeId,
    pub member: Member,
    pub cluster_id: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct JoinRequest {
    pub id: NodeId,
    pub member: Member,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PromoteRequest {
    pub id: NodeId,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct LeaveRequest {
    pub node: String,
}

/// The membership as the answer of every change.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MembershipSummary {
    pub voters: Vec<(NodeId, String)>,
    pub learners: Vec<(NodeId, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRef {
    pub id: u64,
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: u64,
    pub name: String,
    pub cluster_addr: String,
    pub public_url: String,
    /// `voter` or `learner`.
    pub role: String,
    /// `live`, `draining`, `expired`, or `joining` (a member that has not renewed a lease yet).
    pub state: String,
    /// Lease end minus the answering node's clock; negative once lapsed.
    pub lease_remaining_ms: Option<i64>,
    pub routes: u64,
    pub connections: u64,
    /// Highest log index replicated to this member (known on the leader only).
    pub matched_index: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RingStatus {
    /// Log index of the last change to the live set.
    pub version: u64,
    pub live: Vec<String>,
    /// Fraction of the hash space each live node owns.
    pub share: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReport {
    pub cluster_id: Option<String>,
    /// The node that answered.
    pub node: NodeRef,
    pub leader: Option<NodeRef>,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`, as the answering node sees itself.
    pub server_state: String,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_log_index: u64,
    pub snapshot_index: Option<u64>,
    /// Highest log index purged after a snapshot (entries at or below it are gone from the log).
    pub purged_index: Option<u64>,
    pub config: Timing,
    /// The answering node's handshake admission (per node): what `gateway bench` feeds the
    /// storm model with.
    #[serde(default)]
    pub admission: Option<AdmissionStatus>,
    /// The cluster-wide admission budget (`gateway admission set`), which the live nodes share
    /// evenly; absent when each node uses its own `--admit-rate`.
    #[serde(default)]
    pub admission_budget: Option<AdmissionStatus>,
    pub members: Vec<MemberStatus>,
    pub ring: RingStatus,
}

/// A node's admission bucket: `rate_per_s` handshakes per second, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdmissionStatus {
    pub rate_per_s: f64,
    pub burst: u32,
}

impl StatusReport {
    /// The routes currently held, summed over members.
    pub fn total_routes(&self) -> u64 {
        self.members.iter().fold(0u64, |total, m| total.saturating_add(m.routes))
    }

    /// A table for people (`gateway status`, `gateway watch`).
    pub fn render(&self) -> String {
        let mut s = String::new();
        let leader = self.leader.as_ref().map_or("none".to_string(), |l| format!("{} ({})", l.name, l.id));
        let _ = writeln!(
            s,
            "cluster {}  answered by {} ({})",
            self.cluster_id.as_deref().unwrap_or("-"),
            self.node.name,
            self.server_state
        );
        let _ = writeln!(
            s,
            "leader {leader}  term {}  commit {}  applied {}  last log {}  routes {}",
            self.term,
            self.commit_index,
            self.applied_index,
            self.last_log_index,
            self.total_routes()
        );
        if let Some(a) = &self.admission {
            let budget = self.admission_budget.map_or("its own --admit-rate".to_string(), |b| {
                format!("its share of the cluster budget {}/s burst {}", b.rate_per_s, b.burst)
            });
            let _ = writeln!(s, "admission {:.2}/s burst {} ({budget})", a.rate_per_s, a.burst);
        }
        let _ = writeln!(
            s,
            "lease {} ms  sweep {} ms  election timeout {} ms",
            self.config.lease_ms, self.config.sweep_ms, self.config.election_timeout_ms
        );
        let _ = writeln!(
            s,
            "\n{:<16} {:<20} {:<22} {:<8} {:<9} {:>10} {:>8} {:>8} {:>7}",
            "NAME", "ID", "CLUSTER ADDR", "ROLE", "STATE", "LEASE", "ROUTES", "CONNS", "MATCHED"
        );
        for m in &self.members {
            let lease = m.lease_remaining_ms.map_or("-".to_string(), |ms| format!("{:.1}s", ms as f64 / 1000.0));
            let matched = m.matched_index.map_or("-".to_string(), |i| i.to_string());
            let _ = writeln!(
                s,
                "{:<16} {:<20} {:<22} {:<8} {:<9} {:>10} {:>8} {:>8} {:>7}",
                m.name, m.id, m.cluster_addr, m.role, m.state, lease, m.routes, m.connections, matched
            );
        }
        let shares: Vec<String> = self.ring.share.iter().map(|(n, f)| format!("{n} {:.1}%", f * 100.0)).collect();
        let _ = writeln!(s, "\nring version {}  live [{}]", self.ring.version, self.ring.live.join(", "));
        let _ = writeln!(s, "share {}", shares.join("  "));
        s
    }
}
