//! Elastic scaling endpoints (issue 15): the replicated cluster event log (`GET /cluster/events`)
//! and the serial scale-in lock (`POST /cluster/scale-in/{lock,unlock}`) that `gateway scale-in`
//! holds while it drains and removes a node. Cluster secret only.

use hyper::StatusCode;

use super::{bad_json, error, Api};
use crate::answer::{self, json, Resp};
use crate::machine::{ScaleInOutcome, ScaleInReply};
use crate::wire::{EventView, EventsReply, ScaleInLockRequest, ScaleInUnlockRequest};

/// Most events one `GET /cluster/events` answers (the log keeps 256).
pub const MAX_EVENTS_PAGE: usize = 256;
/// Longest a scale-in lock may last without an extension.
pub const MAX_LOCK_TTL_MS: u64 = 3_600_000;

/// `GET /cluster/events?after=S&limit=N`: the events after seq S (default 0), oldest first.
pub async fn events(api: &Api, query: Option<&str>) -> Resp {
    let param = |name: &str| -> Result<Option<u64>, String> {
        let Some(v) = query.into_iter().flat_map(|q| q.split('&')).find_map(|kv| kv.strip_prefix(name)) else {
            return Ok(None);
        };
        v.parse().map(Some).map_err(|_| format!("{name}N: N a number"))
    };
    let (after, limit) = match (param("after="), param("limit=")) {
        (Ok(a), Ok(l)) => (a.unwrap_or(0), l.map_or(MAX_EVENTS_PAGE, |l| (l as usize).clamp(1, MAX_EVENTS_PAGE))),
        (Err(m), _) | (_, Err(m)) => return error(StatusCode::BAD_REQUEST, "bad_query", m),
    };
    match api.cluster.cluster_events(after, limit).await {
        Ok(events) => {
            let last_seq = api.cluster.view().state.event_seq;
            let events = events.into_iter().map(EventView::from).collect();
            json(StatusCode::OK, &EventsReply { events, last_seq })
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "store", e),
    }
}

/// `POST /cluster/scale-in/lock` `{"node", "owner", "ttl_ms", "force"}`: 200 when taken or
/// extended; 409 with the reason (`busy`, `joining`, `quorum`, `capacity`) otherwise.
pub async fn lock(api: &Api, body: &[u8]) -> Resp {
    let req: ScaleInLockRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad_json(&e),
    };
    if !(1..=MAX_LOCK_TTL_MS).contains(&req.ttl_ms) {
        return error(StatusCode::BAD_REQUEST, "bad_ttl", format!("ttl_ms must be in 1..={MAX_LOCK_TTL_MS}"));
    }
    let view = api.cluster.view();
    let name = |id: u64| view.name_of(id);
    let reply = match api.cluster.begin_scale_in(req.node, req.owner, req.ttl_ms, req.force).await {
        Ok(r) => r,
        Err(e) => return answer::operator_write_error(&e).response(),
    };
    let conflict = |reason: &'static str, message: String, body: serde_json::Value| {
        let mut v = body;
        v["error"] = reason.into();
        v["message"] = message.into();
        json(StatusCode::CONFLICT, &v)
    };
    match reply {
        ScaleInReply::Locked { expires_at_ms } => {
            json(StatusCode::OK, &serde_json::json!({"locked": true, "node": req.node, "expires_at_ms": expires_at_ms}))
        }
        ScaleInReply::Busy { node, started_at_ms, expires_at_ms, .. } => conflict(
            "busy",
            format!(
                "a scale-in of {} is in progress (started at {started_at_ms} ms, its lock lapses at {expires_at_ms} ms \
                 unless extended): one membership change at a time",
                name(node)
            ),
            serde_json::json!({"node": node, "started_at_ms": started_at_ms, "expires_at_ms": expires_at_ms}),
        ),
        ScaleInReply::Joining { node } => conflict(
            "joining",
            format!("{} joined but has not renewed a lease yet: a join is in progress", name(node)),
            serde_json::json!({"node": node}),
        ),
        ScaleInReply::NotMember => {
            error(StatusCode::NOT_FOUND, "not_a_member", format!("{} is not a member", req.node))
        }
        ScaleInReply::Quorum { voters_after, healthy_after, needed } => conflict(
            "quorum",
            format!(
                "removing {} would leave {voters_after} voters, {healthy_after} of them live; at least {needed} live \
                 voters must remain (2 at least, and a majority of the voters after)",
                name(req.node)
            ),
            serde_json::json!({"voters_after": voters_after, "healthy_after": healthy_after, "needed": needed}),
        ),
        ScaleInReply::Capacity { connections, capacity_after } => conflict(
            "capacity",
            format!(
                "the cluster holds {connections} connections and the live nodes that stay are designed for \
                 {capacity_after}: scale out first, or pass --force"
            ),
            serde_json::json!({"connections": connections, "capacity_after": capacity_after}),
        ),
    }
}

/// `POST /cluster/scale-in/unlock` `{"node", "owner", "outcome": "done"|"aborted"}`.
pub async fn unlock(api: &Api, body: &[u8]) -> Resp {
    let req: ScaleInUnlockRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad_json(&e),
    };
    let outcome = match req.outcome.as_str() {
        "done" => ScaleInOutcome::Done,
        "aborted" => ScaleInOutcome::Aborted,
        _ => return error(StatusCode::BAD_REQUEST, "bad_outcome", "outcome is done or aborted"),
    };
    match api.cluster.end_scale_in(req.node, req.owner, outcome).await {
        Ok(released) => json(StatusCode::OK, &serde_json::json!({"released": released})),
        Err(e) => answer::operator_write_error(&e).response(),
    }
}
