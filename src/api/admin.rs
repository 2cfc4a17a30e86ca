//! Admin endpoints: status, identity, join/promote/leave (run on the leader; others forward),
//! route lookup and claims.

use std::time::Duration;

use hyper::StatusCode;
use serde::Deserialize;

use super::{bad_json, error, Api};
use crate::answer::{self, json, Resp};
use crate::cluster::membership::MembershipError;
use crate::machine::{Budget, Claim, ClaimReply, NodeId};
use crate::metrics::ResultLabel;
use crate::protocol::MAX_ATTEMPT;
use crate::token::{valid_device_id, valid_tenant};
use crate::wire::{AdmissionStatus, IdentityReply, JoinRequest, LeaveRequest, NodeRef, PromoteRequest};

pub fn status(api: &Api) -> Resp {
    json(StatusCode::OK, &report(api))
}

/// The status report with this node's admission figures.
pub fn report(api: &Api) -> crate::wire::StatusReport {
    let mut report = api.cluster.report();
    let view = api.cluster.view();
    let (rate_per_s, burst) = api.admission.current();
    report.admission = Some(AdmissionStatus { rate_per_s, burst });
    report.admission_budget = view.state.admission.map(|b| AdmissionStatus { rate_per_s: b.rate(), burst: b.burst });
    report.connections_here = Some(api.metrics.connections.get().max(0) as u64);
    report.scaling = api.scaling.status();
    report
}

/// `POST /cluster/admission` `{"rate": R, "burst": B}` sets the cluster-wide admission budget
/// (the live nodes share it evenly); `{"clear": true}` goes back to each node's `--admit-rate`.
pub async fn set_admission(api: &Api, body: &[u8]) -> Resp {
    let req: AdmissionRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad_json(&e),
    };
    let refused = || {
        let msg = "send {\"rate\": 0.01..=1e9, \"burst\": 1..=1e9} or {\"clear\": true}";
        error(StatusCode::BAD_REQUEST, "bad_admission", msg)
    };
    let budget = match req {
        AdmissionRequest { clear: true, .. } => None,
        AdmissionRequest { rate: Some(rate), burst: Some(burst), .. } => {
            let b = Budget { milli_rate: (rate * 1000.0).round() as u64, burst };
            if !b.is_valid() {
                return refused();
            }
            Some(b)
        }
        _ => return refused(),
    };
    match api.cluster.set_admission(budget).await {
        Ok(()) => {
            tracing::info!(?budget, "admission budget set over the admin API");
            let b = budget.map(|b| AdmissionStatus { rate_per_s: b.rate(), burst: b.burst });
            json(StatusCode::OK, &serde_json::json!({ "admission_budget": b }))
        }
        Err(e) => answer::operator_write_error(&e).response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdmissionRequest {
    rate: Option<f64>,
    burst: Option<u32>,
    #[serde(default)]
    clear: bool,
}

/// Prometheus text; Raft and cluster gauges are refreshed from the current state first.
pub async fn metrics(api: &Api) -> Resp {
    refresh_tenants(api).await;
    let r = api.cluster.report();
    let m = &api.metrics;
    let g = |v: u64| v.min(i64::MAX as u64) as i64;
    m.raft_term.set(g(r.term));
    m.raft_is_leader.set(i64::from(r.leader.as_ref().is_some_and(|l| l.id == r.node.id)));
    m.raft_last_log_index.set(g(r.last_log_index));
    m.raft_applied_index.set(g(r.applied_index));
    m.raft_commit_index.set(g(r.commit_index));
    m.raft_apply_lag.set(g(r.commit_index.saturating_sub(r.applied_index)));
    m.members.set(r.members.len() as i64);
    m.live_nodes.set(r.ring.live.len() as i64);
    m.suspect_nodes.set(r.members.iter().filter(|m| m.state == "suspect").count() as i64);
    m.routes.set(g(r.total_routes()));
    m.ring_version.set(g(r.ring.version));
    let capacity = r.members.iter().find(|x| x.id == r.node.id).and_then(|x| x.capacity_connections).unwrap_or(0);
    m.capacity_connections.set(g(capacity));
    let here = m.connections.get().max(0) as f64;
    m.utilization.set(if capacity > 0 { here / capacity as f64 } else { 0.0 });
    m.publish_bytes_in_flight.set(api.publishes.in_use() as i64);
    hyper::Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(http_body_util::Full::new(bytes::Bytes::from(m.encode())))
        .expect("static response parts")
}

/// Per-tenant usage from the applied state; on a failed read the last figures stay.
async fn refresh_tenants(api: &Api) {
    use crate::metrics::tenants::{TenantUsage, EXPORTED};
    let (total, rows) = match api.cluster.busiest_tenants(EXPORTED).await {
        Ok(read) => read,
        Err(e) => return tracing::warn!(error = %e, "reading tenants for metrics failed"),
    };
    let now_ms = api.cluster.now_ms();
    let rows = rows
        .into_iter()
        .map(|(tenant, row)| {
            // The row counts the period of its last entry: one that ended since counts nothing.
            let row = row.as_of(now_ms);
            TenantUsage {
                connections: row.connections,
                max_connections: row.policy.max_connections,
                publishes_used: row.used,
                publishes_allowance: row.allowance(),
                tenant,
            }
        })
        .collect();
    api.metrics.tenants.set(total, rows);
}

/// Ready when a leader is known and this node holds a live lease.
pub fn readyz(api: &Api) -> Resp {
    let has_leader = api.cluster.leader().is_some();
    let live = api.cluster.view().is_live(api.cluster.me());
    let mode = *api.mode.borrow();
    let ready = has_leader && live && mode == crate::ws::Mode::Serving;
    let body = serde_json::json!({
        "ready": ready, "leader_known": has_leader, "live": live, "mode": format!("{mode:?}").to_lowercase(),
    });
    json(if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, &body)
}

pub fn identity(api: &Api) -> Resp {
    json(
        StatusCode::OK,
        &IdentityReply {
            id: api.cluster.me(),
            member: api.cluster.member().clone(),
            cluster_id: api.cluster.view().state.cluster_id.clone(),
        },
    )
}

/// Runs `op` here if this node leads, else relays the same request to the leader.
async fn on_leader<F, Fut>(api: &Api, path: &str, body: &[u8], op: F) -> Resp
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Resp>,
{
    match api.cluster.leader() {
        Some(id) if id == api.cluster.me() => op().await,
        Some(id) => {
            let Some(addr) = api.cluster.view().member(id).map(|m| m.cluster_addr.clone()) else {
                return error(StatusCode::SERVICE_UNAVAILABLE, "no_leader", "leader address unknown; retry");
            };
            let (body, timeout) = (body.to_vec(), api.cluster.op_timeout() * 2);
            match api.http.call(hyper::Method::POST, &addr, path, "application/json", body, timeout).await {
                Ok((status, bytes)) => hyper::Response::builder()
                    .status(status)
                    .header(hyper::header::CONTENT_TYPE, "application/json")
                    .body(http_body_util::Full::new(bytes))
                    .expect("static response parts"),
                Err(e) => error(StatusCode::BAD_GATEWAY, "leader_unreachable", e),
            }
        }
        None => error(StatusCode::SERVICE_UNAVAILABLE, "no_leader", "no leader is known; retry"),
    }
}

fn membership_error(e: MembershipError) -> Resp {
    match e {
        MembershipError::Clash(m) => error(StatusCode::CONFLICT, "clash", m),
        MembershipError::NotMember(m) => error(StatusCode::NOT_FOUND, "not_a_member", format!("{m} is not a member")),
        MembershipError::NotLeader => error(StatusCode::SERVICE_UNAVAILABLE, "no_leader", "leadership moved; retry"),
        MembershipError::Timeout(_) => error(StatusCode::SERVICE_UNAVAILABLE, "timeout", e),
        MembershipError::Raft(m) => error(StatusCode::INTERNAL_SERVER_ERROR, "raft", m),
    }
}

pub async fn join(api: &Api, path: &str, body: &[u8]) -> Resp {
    let req: JoinRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad_json(&e),
    };
    if let Some(problem) = req.problem() {
        return error(StatusCode::BAD_REQUEST, "bad_member", problem);
    }
    on_leader(api, path, body, || async {
        // One membership change at a time: a join waits for a scale-in in progress (a joining
        // node retries; `gateway join` says why).
        let view = api.cluster.view();
        if let Some(l) = view.state.scale_in.as_ref().filter(|l| l.expires_at_ms >= api.cluster.now_ms()) {
            let already = view.member(req.id).is_some();
            if !already {
                let msg = format!("a scale-in of {} is in progress: join again once it is done", l.name);
                return error(StatusCode::CONFLICT, "busy", msg);
            }
        }
        match api.cluster.add_learner(req.id, req.member.clone()).await {
            Ok(added) => {
                let summary = api.cluster.membership();
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
        Err(e) => return bad_json(&e),
    };
    on_leader(api, path, body, || async {
        match api.cluster.promote(req.id).await {
            Ok(voter) => {
                let role = if voter { "voter" } else { "learner" };
                json(StatusCode::OK, &serde_json::json!({"role": role, "membership": api.cluster.membership()}))
            }
            Err(e) => membership_error(e),
        }
    })
    .await
}

pub async fn leave(api: &Api, path: &str, body: &[u8]) -> Resp {
    let req: LeaveRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad_json(&e),
    };
    on_leader(api, path, body, || async {
        let view = api.cluster.view();
        let Some(id) = view.resolve(&req.node) else {
            return error(StatusCode::NOT_FOUND, "not_a_member", "no member has that name or id");
        };
        let addr = view.member(id).map(|m| m.cluster_addr.clone());
        if let Err(e) = api.cluster.remove_member(id).await {
            return membership_error(e);
        }
        if let Err(e) = api.cluster.forget(id).await {
            tracing::warn!(node = id, error = %e, "forgetting the removed node's lease failed; its routes go with the next sweep");
        }
        let me = api.cluster.me();
        if let Some(addr) = addr.filter(|_| id != me) {
            // Best effort: a removed node does not learn it was removed from the log alone.
            let path = format!("/cluster/removed?target={id}");
            let _ = api.http.call(hyper::Method::POST, &addr, &path, "application/json", Vec::new(), Duration::from_secs(2)).await;
        } else if id == me {
            api.stop.cancel();
        }
        json(StatusCode::OK, &serde_json::json!({"removed": id, "membership": api.cluster.membership()}))
    })
    .await
}

/// Starts draining this node (it exits when done).
pub fn drain(api: &Api) -> Resp {
    tracing::info!("drain requested over the admin API");
    api.drain.cancel();
    json(StatusCode::ACCEPTED, &serde_json::json!({"draining": true, "node": api.cluster.member().name}))
}

/// The leader's failure detector asks whether this node is there (addressed: `?target=` is checked
/// by the caller, so a wiped node on the old address does not answer for the old identity). A node
/// whose store stopped answering says so with `503`: the leader then suspects it as it suspects a
/// silent one, and its devices are placed elsewhere.
pub fn ping(api: &Api) -> Resp {
    if api.metrics.store_writes.is_stalled() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "store_stalled", "this node's store stopped answering");
    }
    json(StatusCode::OK, &serde_json::json!({"ok": true, "node": api.cluster.me()}))
}

/// The leader says this node was removed: stop.
pub fn removed(api: &Api) -> Resp {
    tracing::warn!("the leader removed this node from the cluster; stopping");
    api.stop.cancel();
    json(StatusCode::OK, &serde_json::json!({"stopping": true}))
}

pub fn route(api: &Api, device: &str) -> Resp {
    if !valid_device_id(device) {
        return error(StatusCode::BAD_REQUEST, "bad_device_id", "device ids are 1-128 characters of [A-Za-z0-9._:@-]");
    }
    // As placement does: the row cache, else one point read in place (`Handle::route_in_place`).
    let read = api.cluster.cached_route(device).map_or_else(|| api.cluster.route_in_place(device), Ok);
    let (route, floor) = match read {
        Ok(v) => v,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "store", e),
    };
    let view = api.cluster.view();
    let node_ref = |id: NodeId| NodeRef { id, name: view.name_of(id) };
    let floor = floor.map(|f| {
        serde_json::json!({"version": f.max_version, "epoch": f.max_epoch, "attempt": f.max_attempt, "last_node": node_ref(f.last_node)})
    });
    match route {
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
    /// The tenant a device token would name.
    #[serde(default)]
    tenant: Option<String>,
}

/// Claims a device for this node through Raft (the handshake's claim, callable by operators and
/// benches); answered through the same mapping as the handshake.
pub async fn claim(api: &Api, device: &str, body: &[u8]) -> Resp {
    if !valid_device_id(device) {
        return error(StatusCode::BAD_REQUEST, "bad_device_id", "device ids are 1-128 characters of [A-Za-z0-9._:@-]");
    }
    let req: ClaimRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad_json(&e),
    };
    if req.attempt > MAX_ATTEMPT {
        return error(StatusCode::BAD_REQUEST, "bad_attempt", "attempt must be at most 2^53");
    }
    if req.tenant.as_deref().is_some_and(|t| !valid_tenant(t)) {
        return error(StatusCode::BAD_REQUEST, "bad_tenant", "tenants are 1-64 characters of [A-Za-z0-9._-]");
    }
    if *api.mode.borrow() == crate::ws::Mode::Starting {
        return answer::Refusal::unavailable("starting").response();
    }
    let me = api.cluster.me();
    let claim = Claim { device: device.to_string(), node: me, conn: req.conn, epoch: req.epoch, attempt: req.attempt };
    let reply = api.cluster.claim(claim, req.tenant).await;
    let label = match &reply {
        Ok(ClaimReply::Accepted { .. }) => "accepted",
        Ok(ClaimReply::Stale { .. }) => "stale",
        Ok(ClaimReply::NodeNotLive) => "not_live",
        Ok(ClaimReply::QuotaExhausted { .. }) => "quota_exhausted",
        Err(_) => "error",
    };
    api.metrics.claims.get_or_create(&ResultLabel { result: label }).inc();
    match answer::claim(reply) {
        Ok(a) => json(
            StatusCode::OK,
            &serde_json::json!({
                "result": "accepted", "version": a.version,
                "node": {"id": me, "name": api.cluster.member().name},
                "superseded": a.superseded.map(|s| serde_json::json!({"node": s.node, "conn": s.conn})),
            }),
        ),
        Err(refusal) => refusal.response(),
    }
}
