//! Admin endpoints: status, identity, join/promote/leave (run on the leader; others forward),
//! route lookup and claims.

use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::StatusCode;
use serde::{Deserialize, Serialize};

use super::{error, json, Api, Resp};
use crate::metrics::ResultLabel;
use crate::node::membership::{self, MembershipError};
use crate::proposer::{now_ms, ProposeError};
use crate::raft::types::{Command, LeaseState, Member, NodeId, Reply};
use crate::status::{MemberStatus, NodeRef, RingStatus, StatusReport};
use crate::ws::auth::valid_device_id;

/// Builds this node's status report from its Raft metrics and applied view.
pub fn report(api: &Api) -> StatusReport {
    let m = api.raft.metrics().borrow().clone();
    let view = api.view.borrow().clone();
    let now = now_ms() as i64;
    let name_of = |id: NodeId| view.member(id).map_or_else(|| id.to_string(), |m| m.name.clone());
    let replication = m.replication.clone().unwrap_or_default();
    let members = view
        .members()
        .map(|(id, member)| {
            let lease = view.lease(id);
            MemberStatus {
                id,
                name: member.name.clone(),
                cluster_addr: member.cluster_addr.clone(),
                public_url: member.public_url.clone(),
                role: if view.is_voter(id) { "voter" } else { "learner" }.to_string(),
                state: lease.map_or("joining", |l| l.state.as_str()).to_string(),
                lease_remaining_ms: lease.map(|l| l.lease_until_ms as i64 - now),
                routes: lease.map_or(0, |l| l.routes),
                connections: lease.map_or(0, |l| l.connections),
                matched_index: if id == api.me && m.current_leader == Some(api.me) {
                    m.last_log_index
                } else {
                    replication.get(&id).cloned().flatten().map(|l| l.index)
                },
            }
        })
        .collect();
    StatusReport {
        cluster_id: view.meta.cluster_id.clone(),
        node: NodeRef { id: api.me, name: api.member.name.clone() },
        leader: m.current_leader.map(|id| NodeRef { id, name: name_of(id) }),
        server_state: format!("{:?}", m.state).to_lowercase(),
        term: m.current_term,
        commit_index: api.committed.load(Ordering::Relaxed).max(m.last_applied.map_or(0, |l| l.index)),
        applied_index: m.last_applied.map_or(0, |l| l.index),
        last_log_index: m.last_log_index.unwrap_or(0),
        snapshot_index: m.snapshot.map(|l| l.index),
        purged_index: m.purged.map(|l| l.index),
        config: api.timing.clone(),
        members,
        ring: RingStatus {
            version: view.meta.ring_version,
            live: view.ring.nodes().to_vec(),
            share: view.ring.shares(),
        },
    }
}

pub fn status(api: &Api) -> Resp {
    json(StatusCode::OK, &report(api))
}

/// Prometheus text; Raft and cluster gauges are refreshed from the current state first.
pub fn metrics(api: &Api) -> Resp {
    let r = report(api);
    let m = &api.metrics;
    let g = |v: u64| v.min(i64::MAX as u64) as i64;
    m.raft_term.set(g(r.term));
    m.raft_is_leader.set(i64::from(r.leader.as_ref().is_some_and(|l| l.id == api.me)));
    m.raft_last_log_index.set(g(r.last_log_index));
    m.raft_applied_index.set(g(r.applied_index));
    m.raft_commit_index.set(g(r.commit_index));
    m.raft_apply_lag.set(g(r.commit_index.saturating_sub(r.applied_index)));
    m.members.set(r.members.len() as i64);
    m.live_nodes.set(r.ring.live.len() as i64);
    m.routes.set(g(r.total_routes()));
    m.ring_version.set(g(r.ring.version));
    super::Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(http_body_util::Full::new(bytes::Bytes::from(m.encode())))
        .expect("static response parts")
}

/// Ready when a leader is known and this node holds a live lease.
pub fn readyz(api: &Api) -> Resp {
    let has_leader = api.raft.metrics().borrow().current_leader.is_some();
    let live = api.view.borrow().lease(api.me).is_some_and(|l| l.state == LeaseState::Live);
    let mode = *api.mode.borrow();
    let ready = has_leader && live && mode == crate::ws::Mode::Serving;
    let body = serde_json::json!({
        "ready": ready, "leader_known": has_leader, "live": live, "mode": format!("{mode:?}").to_lowercase(),
    });
    json(if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, &body)
}

/// Who this node is: `gateway join` asks the new node before asking the cluster to add it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdentityReply {
    pub id: NodeId,
    pub member: Member,
    pub cluster_id: Option<String>,
}

pub fn identity(api: &Api) -> Resp {
    json(
        StatusCode::OK,
        &IdentityReply {
            id: api.me,
            member: api.member.clone(),
            cluster_id: api.view.borrow().meta.cluster_id.clone(),
        },
    )
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

fn op_timeout(api: &Api) -> Duration {
    Duration::from_millis(api.timing.propose_timeout_ms.max(api.timing.election_timeout_ms * 4))
}

/// Runs `op` here if this node leads, else relays the same request to the leader.
async fn on_leader<F, Fut>(api: &Api, path: &str, body: &[u8], op: F) -> Resp
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Resp>,
{
    let leader = api.raft.metrics().borrow().current_leader;
    match leader {
        Some(id) if id == api.me => op().await,
        Some(id) => {
            let Some(addr) = api.view.borrow().member(id).map(|m| m.cluster_addr.clone()) else {
                return error(StatusCode::SERVICE_UNAVAILABLE, "no_leader", "leader address unknown; retry");
            };
            let body = body.to_vec();
            match api.http.call(hyper::Method::POST, &addr, path, "application/json", body, op_timeout(api) * 2).await {
                Ok((status, bytes)) => super::Response::builder()
                    .status(status)
                    .header(hyper::header::CONTENT_TYPE, "application/json")
                    .body(http_body_util::Full::new(bytes))
                    .expect("static response parts"),
                Err(e) => error(StatusCode::BAD_GATEWAY, "leader_unreachable", &e.to_string()),
            }
        }
        None => error(StatusCode::SERVICE_UNAVAILABLE, "no_leader", "no leader is known; retry"),
    }
}

fn membership_error(e: MembershipError) -> Resp {
    match e {
        MembershipError::Clash(m) => error(StatusCode::CONFLICT, "clash", &m),
        MembershipError::NotMember(m) => error(StatusCode::NOT_FOUND, "not_a_member", &format!("{m} is not a member")),
        MembershipError::NotLeader => error(StatusCode::SERVICE_UNAVAILABLE, "no_leader", "leadership moved; retry"),
        MembershipError::Timeout(_) => error(StatusCode::SERVICE_UNAVAILABLE, "timeout", &e.to_string()),
        MembershipError::Raft(m) => error(StatusCode::INTERNAL_SERVER_ERROR, "raft", &m),
    }
}

pub async fn join(api: &Api, path: &str, body: &[u8]) -> Resp {
    let req: JoinRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", &e.to_string()),
    };
    on_leader(api, path, body, || async {
        match membership::add_learner(&api.raft, req.id, req.member.clone(), op_timeout(api)).await {
            Ok(added) => {
                let summary = membership::summary(&api.raft);
                let outcome = if added { "learner_added" } else { "already_member" };
                json(StatusCode::OK, &serde_json::json!({"outcome": outcome, "membership": summary}))
            }
            Err(e) => membership_error(e),
        }
    })
    .await
}

pub async fn promote(api: &Api, path: &str, body: &[u8]) -> Resp {
    let req: PromoteRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", &e.to_string()),
    };
    on_leader(api, path, body, || async {
        match membership::promote(&api.raft, req.id, api.timing.max_voters, op_timeout(api)).await {
            Ok(voter) => {
                let role = if voter { "voter" } else { "learner" };
                json(StatusCode::OK, &serde_json::json!({"role": role, "membership": membership::summary(&api.raft)}))
            }
            Err(e) => membership_error(e),
        }
    })
    .await
}

pub async fn leave(api: &Api, path: &str, body: &[u8]) -> Resp {
    let req: LeaveRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", &e.to_string()),
    };
    on_leader(api, path, body, || async {
        let (id, addr) = {
            let view = api.view.borrow();
            match view.resolve(&req.node) {
                Some(id) => (id, view.member(id).map(|m| m.cluster_addr.clone())),
                None => return error(StatusCode::NOT_FOUND, "not_a_member", &format!("{} is not a member", req.node)),
            }
        };
        if let Err(e) = membership::remove(&api.raft, id, api.timing.max_voters, op_timeout(api)).await {
            return membership_error(e);
        }
        if let Err(e) = api.proposer.propose(Command::Forget { node: id }).await {
            tracing::warn!(node = id, error = %e, "forgetting the removed node's lease failed; its routes go with the next sweep");
        }
        if let Some(addr) = addr.filter(|_| id != api.me) {
            // Best effort: a removed node does not learn it was removed from the log alone.
            let path = format!("/cluster/removed?target={id}");
            let _ = api.http.call(hyper::Method::POST, &addr, &path, "application/json", Vec::new(), Duration::from_secs(2)).await;
        } else if id == api.me {
            api.stop.cancel();
        }
        json(StatusCode::OK, &serde_json::json!({"removed": id, "membership": membership::summary(&api.raft)}))
    })
    .await
}

/// Starts draining this node (it exits when done).
pub fn drain(api: &Api) -> Resp {
    tracing::info!("drain requested over the admin API");
    api.drain.cancel();
    json(StatusCode::ACCEPTED, &serde_json::json!({"draining": true, "node": api.member.name}))
}

/// The leader says this node was removed: stop.
pub fn removed(api: &Api) -> Resp {
    tracing::warn!("the leader removed this node from the cluster; stopping");
    api.stop.cancel();
    json(StatusCode::OK, &serde_json::json!({"stopping": true}))
}

pub async fn route(api: &Api, device: &str) -> Resp {
    if !valid_device_id(device) {
        return error(StatusCode::BAD_REQUEST, "bad_device_id", "device ids are 1-128 characters of [A-Za-z0-9._:@-]");
    }
    let db = api.state.clone();
    let d = device.to_string();
    let found = match tokio::task::spawn_blocking(move || db.route(&d)).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return error(StatusCode::INTERNAL_SERVER_ERROR, "store", &e.to_string()),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "store", &e.to_string()),
    };
    let view = api.view.borrow().clone();
    let node_ref =
        |id: NodeId| NodeRef { id, name: view.member(id).map_or_else(|| id.to_string(), |m| m.name.clone()) };
    let floor = found.1.map(|f| {
        serde_json::json!({"version": f.max_version, "epoch": f.max_epoch, "attempt": f.max_attempt, "last_node": node_ref(f.last_node)})
    });
    match found.0 {
        Some(r) => json(
            StatusCode::OK,
            &serde_json::json!({"device": device, "node": node_ref(r.node), "conn": r.conn, "version": r.version, "floor": floor}),
        ),
        None => {
            json(StatusCode::NOT_FOUND, &serde_json::json!({"error": "no_route", "device": device, "floor": floor}))
        }
    }
}

#[derive(Debug, Deserialize)]
struct ClaimRequest {
    conn: u64,
    #[serde(default)]
    epoch: u64,
    attempt: u64,
}

/// Claims a device for this node through Raft (the handshake's claim, callable by operators/benches).
pub async fn claim(api: &Api, device: &str, body: &[u8]) -> Resp {
    if !valid_device_id(device) {
        return error(StatusCode::BAD_REQUEST, "bad_device_id", "device ids are 1-128 characters of [A-Za-z0-9._:@-]");
    }
    let req: ClaimRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", &e.to_string()),
    };
    let cmd = Command::Claim {
        device: device.to_string(),
        node: api.me,
        conn: req.conn,
        epoch: req.epoch,
        attempt: req.attempt,
    };
    let result = api.proposer.propose(cmd).await;
    let label = match &result {
        Ok(Reply::Accepted { .. }) => "accepted",
        Ok(Reply::Stale { .. }) => "stale",
        Ok(Reply::NodeNotLive) => "node_not_live",
        _ => "error",
    };
    api.metrics.claims.get_or_create(&ResultLabel { result: label }).inc();
    match result {
        Ok(Reply::Accepted { version, superseded }) => json(
            StatusCode::OK,
            &serde_json::json!({
                "result": "accepted", "version": version,
                "node": {"id": api.me, "name": api.member.name},
                "superseded": superseded.map(|s| serde_json::json!({"node": s.node, "conn": s.conn})),
            }),
        ),
        Ok(Reply::Stale { floor_epoch, floor_attempt }) => json(
            StatusCode::CONFLICT,
            &serde_json::json!({"error": "stale_attempt", "floor_epoch": floor_epoch, "floor_attempt": floor_attempt}),
        ),
        Ok(Reply::NodeNotLive) => {
            error(StatusCode::SERVICE_UNAVAILABLE, "node_not_live", "this node holds no live lease")
        }
        Ok(other) => error(StatusCode::INTERNAL_SERVER_ERROR, "unexpected_reply", &format!("{other:?}")),
        Err(e @ ProposeError::Rejected(_)) => error(StatusCode::INTERNAL_SERVER_ERROR, "rejected", &e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", &e.to_string()),
    }
}
