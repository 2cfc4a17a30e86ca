//! The JSON bodies of the cluster listener's admin API, shared by the server (`api`) and the admin
//! client (`tools::admin`): join/promote/leave/identity, the membership summary, and the status
//! report (`GET /cluster/status`, `gateway status [--json]`, `gateway watch`) — one shape scripts
//! rely on (add fields freely, rename none) — with its human rendering.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::config::{ScalingConfig, Timing};
use crate::machine::{ClusterEvent, Member, NodeId};

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

impl JoinRequest {
    /// What is wrong with the joining member, if anything, without quoting it: its name, cluster
    /// address and public URL pass the checks a node's own configuration does (they end up in
    /// every member's status, logs and device redirects).
    pub fn problem(&self) -> Option<&'static str> {
        let m = &self.member;
        if self.id == 0 {
            Some("id must not be 0")
        } else if !crate::config::is_node_name(&m.name) {
            Some("member.name must be 1-64 characters of [A-Za-z0-9._-]")
        } else if !crate::config::is_cluster_addr(&m.cluster_addr) {
            Some("member.cluster_addr must be host:port (or http[s]://host:port)")
        } else if !crate::config::is_public_url(&m.public_url) {
            Some("member.public_url must be a ws, wss, http or https URL of at most 512 printable ASCII characters")
        } else {
            None
        }
    }
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
    /// Its declared capacity (`--capacity-connections`) and connections / capacity.
    #[serde(default)]
    pub capacity_connections: Option<u64>,
    #[serde(default)]
    pub utilization: Option<f64>,
    /// The connection limit it published (`--max-connections`): placement sends it no new
    /// device once `connections` reaches it.
    #[serde(default)]
    pub max_connections: Option<u64>,
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
    /// Device connections open on the answering node right now (its registry, not a renewal).
    #[serde(default)]
    pub connections_here: Option<u64>,
    /// The serial scale-in holding the lock, if one does.
    #[serde(default)]
    pub scale_in: Option<ScaleInStatus>,
    /// Capacity signals and the scaling hint, as the answering node evaluates them.
    #[serde(default)]
    pub scaling: Option<ScalingStatus>,
}

/// The scale-in lock as applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleInStatus {
    pub node: NodeRef,
    pub started_at_ms: u64,
    pub expires_at_ms: u64,
}

/// The scaling hint: `scale_out`, `scale_in` or `steady`, why, and the signals it read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalingStatus {
    pub hint: String,
    pub reasons: Vec<String>,
    pub cluster_utilization: Option<f64>,
    pub max_node_utilization: Option<f64>,
    /// New connections per second accepted by the answering node, and that as a share of its
    /// admission rate.
    pub new_connections_per_s: f64,
    pub accept_share: Option<f64>,
    /// Share of its CPUs the answering process used over the last second.
    #[serde(default)]
    pub cpu: Option<f64>,
    /// How long every signal has been below its low-water mark (None: not low).
    pub low_for_ms: Option<u64>,
    pub thresholds: ScalingConfig,
}

/// One event of the replicated cluster event log (`GET /cluster/events`, `gateway events`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventView {
    pub seq: u64,
    pub index: u64,
    pub at_ms: u64,
    /// `join`, `leave`, `drain`, `suspicion`, `sweep`, `lease_recovery` or `scale_in`.
    pub trigger: String,
    pub node: Option<u64>,
    pub detail: String,
    pub connections: u64,
    pub routes: u64,
    pub live_before: Vec<String>,
    pub live_after: Vec<String>,
    pub ring_version: u64,
}

impl From<ClusterEvent> for EventView {
    fn from(e: ClusterEvent) -> EventView {
        EventView {
            seq: e.seq,
            index: e.index,
            at_ms: e.at_ms,
            trigger: e.trigger.as_str().to_string(),
            node: e.node,
            detail: e.detail,
            connections: e.connections,
            routes: e.routes,
            live_before: e.live_before,
            live_after: e.live_after,
            ring_version: e.ring_version,
        }
    }
}

impl EventView {
    /// One line for people.
    pub fn render(&self) -> String {
        format!(
            "#{:<4} index {:<7} {:<14} {}  (connections {}, routes {}; live [{}] -> [{}]; ring v{})",
            self.seq,
            self.index,
            self.trigger,
            self.detail,
            self.connections,
            self.routes,
            self.live_before.join(", "),
            self.live_after.join(", "),
            self.ring_version
        )
    }
}

/// `GET /cluster/events?after=S&limit=N`: events after S, oldest first, and the newest seq.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventsReply {
    pub events: Vec<EventView>,
    pub last_seq: u64,
}

/// `POST /cluster/scale-in/lock`: take or extend the lock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScaleInLockRequest {
    pub node: u64,
    pub owner: u64,
    pub ttl_ms: u64,
    #[serde(default)]
    pub force: bool,
}

/// `POST /cluster/scale-in/unlock`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScaleInUnlockRequest {
    pub node: u64,
    pub owner: u64,
    /// `done` or `aborted`.
    pub outcome: String,
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
            "\n{:<16} {:<20} {:<22} {:<8} {:<9} {:>10} {:>8} {:>8} {:>7} {:>6}",
            "NAME", "ID", "CLUSTER ADDR", "ROLE", "STATE", "LEASE", "ROUTES", "CONNS", "MATCHED", "UTIL"
        );
        for m in &self.members {
            let lease = m.lease_remaining_ms.map_or("-".to_string(), |ms| format!("{:.1}s", ms as f64 / 1000.0));
            let matched = m.matched_index.map_or("-".to_string(), |i| i.to_string());
            let util = m.utilization.map_or("-".to_string(), |u| format!("{:.0}%", u * 100.0));
            let _ = writeln!(
                s,
                "{:<16} {:<20} {:<22} {:<8} {:<9} {:>10} {:>8} {:>8} {:>7} {:>6}",
                m.name, m.id, m.cluster_addr, m.role, m.state, lease, m.routes, m.connections, matched, util
            );
        }
        if let Some(l) = &self.scale_in {
            let _ = writeln!(s, "scale-in of {} in progress (lock until {} ms)", l.node.name, l.expires_at_ms);
        }
        if let Some(h) = &self.scaling {
            let pct = |u: Option<f64>| u.map_or("-".to_string(), |u| format!("{:.0}%", u * 100.0));
            let _ = writeln!(
                s,
                "scaling: {}  utilization cluster {} busiest {}  new connections {:.1}/s  cpu {}  ({})",
                h.hint,
                pct(h.cluster_utilization),
                pct(h.max_node_utilization),
                h.new_connections_per_s,
                pct(h.cpu),
                h.reasons.join("; ")
            );
        }
        let shares: Vec<String> = self.ring.share.iter().map(|(n, f)| format!("{n} {:.1}%", f * 100.0)).collect();
        let _ = writeln!(s, "\nring version {}  live [{}]", self.ring.version, self.ring.live.join(", "));
        let _ = writeln!(s, "share {}", shares.join("  "));
        s
    }
}
