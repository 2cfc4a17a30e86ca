//! The device handshake (design §4), in this order; the first step that refuses answers and
//! nothing later runs: 1 admission (429) → 2 node state (503) → 3 authentication (401) →
//! 4 placement (307) → 5 claim through Raft, deadline-bounded (409 / 503) → 6 upgrade (101).
//! Every refusal is a JSON `{"error": "<reason>", ...}` body, counted by reason.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use rand::RngCore;

use super::placement::place;
use super::session::{self, Ended};
use super::stream::{Acker, StreamCursor};
use super::{Gate, Mode};
use crate::metrics::ResultLabel;
use crate::proposer::now_ms;
use crate::protocol::{close, ServerFrame};
use crate::raft::types::{Command, NodeId, Reply};
use crate::ws::registry::Control;

pub type Resp = Response<Full<Bytes>>;

/// A refusal: status, reason, extra JSON fields, optional Retry-After seconds.
pub(crate) fn refuse(
    g: &Gate,
    status: StatusCode,
    reason: &'static str,
    extra: serde_json::Value,
    retry_after: Option<u64>,
) -> Resp {
    g.metrics.handshakes.get_or_create(&ResultLabel { result: reason }).inc();
    let mut body = serde_json::json!({ "error": reason });
    if let (Some(obj), serde_json::Value::Object(more)) = (body.as_object_mut(), extra) {
        obj.extend(more);
    }
    let mut b = Response::builder().status(status).header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(secs) = retry_after {
        b = b.header(hyper::header::RETRY_AFTER, secs.to_string());
    }
    b.body(Full::new(Bytes::from(body.to_string()))).expect("static response parts")
}

pub(crate) fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(crate) fn bearer(req: &Request<Incoming>, q: &HashMap<String, String>) -> String {
    req.headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string)
        .or_else(|| q.get("token").cloned())
        .unwrap_or_default()
}

/// Steps 1-3 shared with `/v1/placement`: admission, node state, authentication.
fn gatekeep(g: &Gate, req: &Request<Incoming>, q: &HashMap<String, String>) -> Result<(String, u64), Box<Resp>> {
    let unavailable =
        |reason| Box::new(refuse(g, StatusCode::SERVICE_UNAVAILABLE, reason, serde_json::json!({}), Some(1)));
    if let Err(secs) = g.admission.admit() {
        let empty = serde_json::json!({});
        return Err(Box::new(refuse(g, StatusCode::TOO_MANY_REQUESTS, "rate_limited", empty, Some(secs))));
    }
    let mode = *g.mode.borrow();
    match mode {
        Mode::Draining => return Err(unavailable("draining")),
        Mode::Fenced => return Err(unavailable("no_quorum")),
        Mode::Serving => {}
    }
    // Whether this node may serve is decided by the applied state plus its own monotonic-clock
    // fence (Mode), never by comparing the leader's lease stamp with this node's wall clock.
    let live = g.view.borrow().lease(g.me).is_some_and(|l| l.state == crate::raft::types::LeaseState::Live);
    if !live {
        return Err(unavailable("not_live"));
    }
    g.verifier.verify(&bearer(req, q)).map(|c| (c.sub, c.epoch)).map_err(|e| {
        Box::new(refuse(g, StatusCode::UNAUTHORIZED, e.reason(), serde_json::json!({"message": e.to_string()}), None))
    })
}

/// Where placement sends `device`, given the optional unreachable `fallback` node.
async fn target(g: &Gate, device: &str, fallback: Option<&String>) -> Option<NodeId> {
    let lookup = g.routes.clone();
    let d = device.to_string();
    let (route, floor) = match tokio::task::spawn_blocking(move || lookup.lookup(&d)).await {
        Ok(Ok(v)) => v,
        _ => (None, None),
    };
    let view = g.view.borrow().clone();
    let exclude = fallback.and_then(|f| view.resolve(f));
    place(&view, device, route.as_ref(), floor.as_ref(), exclude, now_ms())
}

fn ws_url(g: &Gate, node: NodeId) -> Option<String> {
    g.view.borrow().member(node).map(|m| format!("{}/ws", m.public_url.trim_end_matches('/')))
}

/// `GET /v1/placement`: the `/ws` URL this device should use.
pub async fn placement(g: Arc<Gate>, req: Request<Incoming>) -> Resp {
    let q = query(&req);
    let (device, _) = match gatekeep(&g, &req, &q) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let node = target(&g, &device, q.get("fallback")).await.unwrap_or(g.me);
    let name = g.view.borrow().member(node).map(|m| m.name.clone()).unwrap_or_default();
    let body = serde_json::json!({"device": device, "node": name, "node_id": node, "url": ws_url(&g, node)});
    Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("static response parts")
}

/// `GET /ws?attempt=N`: the whole handshake.
pub async fn handshake(g: Arc<Gate>, mut req: Request<Incoming>) -> Resp {
    let q = query(&req);
    let (device, epoch) = match gatekeep(&g, &req, &q) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Some(attempt) = q.get("attempt").and_then(|a| a.parse::<u64>().ok()) else {
        let msg = serde_json::json!({"message": "?attempt=N (a counter the device persists) is required"});
        return refuse(&g, StatusCode::BAD_REQUEST, "bad_attempt", msg, None);
    };
    if !fastwebsockets::upgrade::is_upgrade_request(&req) {
        let msg = serde_json::json!({"message": "expected a WebSocket upgrade request"});
        return refuse(&g, StatusCode::BAD_REQUEST, "not_websocket", msg, None);
    }
    if q.get("steer").map(String::as_str) != Some("off") {
        if let Some(node) = target(&g, &device, q.get("fallback")).await.filter(|n| *n != g.me) {
            if let Some(url) = ws_url(&g, node) {
                let location = format!("{url}?{}", req.uri().query().unwrap_or(""));
                let name = g.view.borrow().member(node).map(|m| m.name.clone()).unwrap_or_default();
                g.metrics.handshakes.get_or_create(&ResultLabel { result: "redirected" }).inc();
                return Response::builder()
                    .status(StatusCode::TEMPORARY_REDIRECT)
                    .header(hyper::header::LOCATION, location.clone())
                    .header(hyper::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from(
                        serde_json::json!({"error": "wrong_node", "location": location, "node": name}).to_string(),
                    )))
                    .expect("static response parts");
            }
        }
    }

    // Register before the claim commits, so a kick that races the upgrade is not lost.
    let conn = rand::thread_rng().next_u64();
    let (registration, ctl_tx, ctl_rx, overflow) = g.registry.register(conn, &device, g.session.send_queue);
    let cmd = Command::Claim { device: device.clone(), node: g.me, conn, epoch, attempt };
    let started = std::time::Instant::now();
    let reply = tokio::time::timeout(g.handshake_timeout, g.proposer.propose(cmd)).await;
    g.metrics.claim_seconds.observe(started.elapsed().as_secs_f64());
    let version = match reply {
        Ok(Ok(Reply::Accepted { version, .. })) => version,
        Ok(Ok(Reply::Stale { floor_epoch, floor_attempt })) => {
            let floor = serde_json::json!({"floor_epoch": floor_epoch, "floor_attempt": floor_attempt});
            return refuse(&g, StatusCode::CONFLICT, "stale_attempt", floor, None);
        }
        Ok(Ok(Reply::NodeNotLive)) => {
            return refuse(&g, StatusCode::SERVICE_UNAVAILABLE, "not_live", serde_json::json!({}), Some(1));
        }
        Ok(Ok(other)) => {
            tracing::error!(?other, "unexpected reply to a claim");
            return refuse(&g, StatusCode::INTERNAL_SERVER_ERROR, "internal", serde_json::json!({}), None);
        }
        Ok(Err(e)) => {
            release_later(&g, &device, conn);
            let msg = serde_json::json!({"message": e.to_string()});
            return refuse(&g, StatusCode::SERVICE_UNAVAILABLE, "unavailable", msg, Some(1));
        }
        Err(_) => {
            release_later(&g, &device, conn);
            let msg = serde_json::json!({"message": "the claim did not commit before the handshake deadline"});
            return refuse(&g, StatusCode::SERVICE_UNAVAILABLE, "unavailable", msg, Some(1));
        }
    };

    let (response, upgrade) = match fastwebsockets::upgrade::upgrade(&mut req) {
        Ok(v) => v,
        Err(e) => {
            release(&g, &device, conn).await;
            let msg = serde_json::json!({"message": e.to_string()});
            return refuse(&g, StatusCode::BAD_REQUEST, "not_websocket", msg, None);
        }
    };
    g.metrics.handshakes.get_or_create(&ResultLabel { result: "accepted" }).inc();
    g.registry.accepted(conn, version);
    // Read after the claim committed: every message up to this head is for `sync`; every later
    // one is pushed to this connection as the log applies it.
    let (lookup, d) = (g.routes.clone(), device.clone());
    let stream_head = match tokio::task::spawn_blocking(move || lookup.stream(&d, u64::MAX, 0)).await {
        Ok(Ok(read)) => read.head.head,
        _ => 0,
    };
    let hello = ServerFrame::Hello {
        device: device.clone(),
        node: g.name.clone(),
        node_id: g.me,
        conn,
        route_version: version,
        stream_head,
    };
    let proposer = g.proposer.clone();
    let acker: Acker = Arc::new(move |device: String, seq: u64| {
        let proposer = proposer.clone();
        tokio::spawn(async move {
            if let Err(e) = proposer.propose(Command::Ack { device, seq }).await {
                tracing::debug!(error = %e, "ack did not commit; the next one covers it");
            }
        });
    });
    let cursor = StreamCursor::new(device.clone(), g.routes.clone(), acker, stream_head);
    let gate = g.clone();
    let cfg = g.session.clone();
    g.metrics.connections.inc();
    g.tracker.spawn(async move {
        let _registration = registration;
        let ended = session::run(upgrade, hello, (ctl_tx, ctl_rx, overflow), cursor, cfg).await;
        if ended == Ended::Closed(close::SUPERSEDED) {
            gate.metrics.kicks.inc();
        }
        // Best effort: a superseded or swept route is no longer ours, and Release is conn-checked.
        if !matches!(ended, Ended::Closed(close::SUPERSEDED) | Ended::Closed(close::ROUTE_LOST)) {
            release(&gate, &device, conn).await;
        }
        gate.metrics.connections.dec();
        tracing::debug!(%device, conn, ?ended, "session ended");
    });
    let (parts, _) = response.into_parts();
    Response::from_parts(parts, Full::new(Bytes::new()))
}

/// The claim's outcome is unknown (timed out, forward failed): it may still commit and name a
/// connection that does not exist, so release it in the background (conn-checked, harmless if not).
fn release_later(g: &Arc<Gate>, device: &str, conn: u64) {
    let (gate, device) = (g.clone(), device.to_string());
    g.tracker.spawn(async move { release(&gate, &device, conn).await });
}

async fn release(g: &Gate, device: &str, conn: u64) {
    if let Err(e) = g.proposer.propose(Command::Release { device: device.to_string(), conn }).await {
        tracing::debug!(%device, conn, error = %e, "release did not commit; the lease covers it");
    }
}

/// Closes `conn` with `code` if it is one of ours.
pub fn kick(g: &Gate, conn: u64, code: u16, reason: &str) -> bool {
    g.registry.send(conn, Control::Close { code, reason: reason.to_string() })
}
