//! The cluster listener: Raft RPC, admin API, route lookup and claims, health. Every path except
//! `/healthz` and `/readyz` needs `Authorization: Bearer <cluster secret>` (constant-time compare);
//! a request without it gets 401 and changes nothing. This module owns the HTTP-status mapping.

mod admin;
mod messages;
mod raft_rpc;

/// Request and reply bodies of the admin API, shared with the client in `crate::admin`.
pub mod admin_types {
    pub use super::admin::{IdentityReply, JoinRequest, LeaveRequest, PromoteRequest};
}

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cluster::ClusterWatch;
use crate::config::Timing;
use crate::http::HttpClient;
use crate::metrics::Metrics;
use crate::proposer::Proposer;
use crate::raft::types::{Member, NodeId, Raft};
use crate::store::state::StateDb;

/// Largest request body: a Raft snapshot chunk or append batch fits well below it.
const MAX_BODY: usize = 64 << 20;

/// What the cluster-listener handlers need.
pub struct Api {
    pub me: NodeId,
    pub member: Member,
    pub raft: Raft,
    pub proposer: Proposer,
    pub view: ClusterWatch,
    pub state: StateDb,
    pub timing: Timing,
    /// Device-side knobs (message retention and payload limit).
    pub device: crate::config::DeviceConfig,
    pub secret: Arc<Vec<u8>>,
    pub http: HttpClient,
    /// Highest committed log index this node has learned (maintained by the log store).
    pub committed: Arc<AtomicU64>,
    pub metrics: Arc<Metrics>,
    /// Cancelled to stop the node (e.g. when the leader says it was removed).
    pub stop: CancellationToken,
    /// Serving, draining or fenced (readiness).
    pub mode: tokio::sync::watch::Receiver<crate::ws::Mode>,
    /// Cancelled to start a drain (`POST /cluster/drain`), as SIGTERM does.
    pub drain: CancellationToken,
}

pub type Resp = Response<Full<Bytes>>;

/// Serves the cluster listener until `shutdown` fires.
pub async fn run(listener: TcpListener, api: Arc<Api>, shutdown: CancellationToken) {
    let handler = move |req| {
        let api = api.clone();
        async move { handle(&api, req).await }
    };
    crate::server::serve("cluster", listener, Duration::from_secs(10), shutdown, handler).await
}

async fn handle(api: &Api, req: Request<Incoming>) -> Resp {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let target: Option<NodeId> = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("target=")))
        .and_then(|v| v.parse().ok());
    match (&method, path.as_str()) {
        (&Method::GET, "/healthz") => return json(StatusCode::OK, &serde_json::json!({"ok": true})),
        (&Method::GET, "/readyz") => return admin::readyz(api),
        (&Method::GET, "/metrics") => return admin::metrics(api),
        _ => {}
    }
    if !authorized(api, &req) {
        tracing::debug!(%method, %path, "refused an unauthenticated request");
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong cluster secret");
    }
    let idempotency_key =
        req.headers().get("idempotency-key").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(StatusCode::PAYLOAD_TOO_LARGE, "bad_body", &e.to_string()),
    };
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // Messages meant for one identity (Raft RPC, removal notices) name it: a wiped node answering
    // on its old address must not act on its former identity's behalf.
    let addressed = segments.first() == Some(&"raft") || segments.as_slice() == ["cluster", "removed"];
    if addressed && target != Some(api.me) {
        return error(
            StatusCode::CONFLICT,
            "wrong_target",
            &format!("this is node {}, not {}", api.me, target.map_or("(none)".into(), |t| t.to_string())),
        );
    }
    match (&method, segments.as_slice()) {
        (&Method::POST, ["raft", "append"]) => raft_rpc::append(api, &body).await,
        (&Method::POST, ["raft", "vote"]) => raft_rpc::vote(api, &body).await,
        (&Method::POST, ["raft", "snapshot"]) => raft_rpc::snapshot(api, &body).await,
        (&Method::POST, ["cluster", "propose"]) => raft_rpc::propose(api, &body).await,
        (&Method::GET, ["cluster", "status"]) => admin::status(api),
        (&Method::GET, ["cluster", "identity"]) => admin::identity(api),
        (&Method::POST, ["cluster", "join"]) => admin::join(api, &path, &body).await,
        (&Method::POST, ["cluster", "promote"]) => admin::promote(api, &path, &body).await,
        (&Method::POST, ["cluster", "leave"]) => admin::leave(api, &path, &body).await,
        (&Method::POST, ["cluster", "removed"]) => admin::removed(api),
        (&Method::POST, ["cluster", "drain"]) => admin::drain(api),
        (&Method::GET, ["v1", "devices", device, "route"]) => admin::route(api, device).await,
        (&Method::POST, ["v1", "devices", device, "claim"]) => admin::claim(api, device, &body).await,
        (&Method::POST, ["v1", "devices", device, "messages"]) => {
            messages::publish(api, device, idempotency_key, &body).await
        }
        _ => error(StatusCode::NOT_FOUND, "not_found", &format!("no route for {method} {path}")),
    }
}

fn authorized(api: &Api, req: &Request<Incoming>) -> bool {
    let Some(value) = req.headers().get(hyper::header::AUTHORIZATION) else {
        return false;
    };
    let Some(token) = value.as_bytes().strip_prefix(b"Bearer ") else {
        return false;
    };
    token.ct_eq(api.secret.as_slice()).into()
}

pub(crate) fn json<T: Serialize>(status: StatusCode, body: &T) -> Resp {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .expect("static response parts")
}

pub(crate) fn error(status: StatusCode, reason: &str, message: &str) -> Resp {
    json(status, &serde_json::json!({"error": reason, "message": message}))
}

pub(crate) fn binary(bytes: Vec<u8>) -> Resp {
    Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
        .body(Full::new(Bytes::from(bytes)))
        .expect("static response parts")
}
