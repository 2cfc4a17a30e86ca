//! The cluster listener: Raft RPC, admin API, route lookup, claims and publishes, health and
//! metrics. Every path except `/healthz`, `/readyz` and `/metrics` needs `Authorization: Bearer
//! <secret>` (constant-time compare); a request without one gets 401 and changes nothing (its
//! body, at most a publish's or an admin body's limit, is read and dropped first, so that a
//! sender still writing it reads the 401 rather than a reset). The
//! cluster secret reaches every path; a backend secret only publishes and reads routes (403
//! elsewhere: never Raft RPC, membership, propose or admin). Request heads are read up to
//! [`MAX_HEAD_BYTES`]; bodies up to what the path needs: a Raft RPC or a forwarded batch up to
//! [`MAX_RPC_BYTES`], a publish up to `max_payload_bytes`, the rest (admin) [`MAX_ADMIN_BODY`].
//! Sees the cluster only through the typed [`Handle`]; answers through `crate::answer`.

mod admin;
mod messages;
mod raft_rpc;
mod scale;
pub mod scaling;
mod tenants;
pub mod ui;

pub use messages::{Budget as PublishBudget, PUBLISHES_IN_FLIGHT, PUBLISH_OVERHEAD};

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::answer::{Refusal, Resp};
use crate::cluster::{Handle, RpcKind, APPEND_STREAM_PATH};
use crate::http::{HttpClient, MAX_RPC_BYTES};
use crate::machine::NodeId;
use crate::metrics::Metrics;
use crate::secrets::BackendSecrets;

/// Largest body of an admin request (a join, a claim, a leave).
const MAX_ADMIN_BODY: usize = 64 << 10;

/// Largest request head (request line and headers) the cluster listener reads. A member's or an
/// operator's head is under 1 KiB (a bearer secret, a path, a request id); hyper's default
/// (~400 KiB) would let each unauthenticated connection hold that much until its head deadline.
/// It also caps hyper's read buffer, so a forwarded batch or an append is read in 64 KiB steps.
const MAX_HEAD_BYTES: usize = 64 << 10;

/// Longest a request other than a member's RPC may take to send its body.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Who is calling, by the bearer secret.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Caller {
    /// The cluster secret: members and operators.
    Cluster,
    /// A backend secret: publishes and route reads.
    Backend,
}

/// What the cluster-listener handlers need.
pub struct Api {
    pub cluster: Handle,
    /// The node's admission bucket, shared with the device gate (the status report's figures).
    pub admission: Arc<crate::ws::admission::Admission>,
    /// Device-side knobs (message retention and payload limit).
    pub device: crate::config::DeviceConfig,
    pub secret: Arc<Vec<u8>>,
    /// Backend secrets (publish, route reads).
    pub backend: BackendSecrets,
    /// Relays admin requests to the leader and tells removed nodes.
    pub http: HttpClient,
    pub metrics: Arc<Metrics>,
    /// Cancelled to stop the node (e.g. when the leader says it was removed).
    pub stop: CancellationToken,
    /// Serving, draining or fenced (readiness).
    pub mode: tokio::sync::watch::Receiver<crate::ws::Mode>,
    /// Cancelled to start a drain (`POST /cluster/drain`), as SIGTERM does.
    pub drain: CancellationToken,
    /// Leader changes seen by this node, for the status page (`ui::events::record` fills it).
    pub ui_events: Arc<ui::events::EventLog>,
    /// The scaling hint as last evaluated (`scaling::follow` fills it).
    pub scaling: Arc<scaling::Tracker>,
    /// The node's tasks: what a request starts that outlives it (a leader's append stream).
    pub tasks: TaskTracker,
    /// The bytes of publishes in flight on this node.
    pub publishes: messages::Budget,
}

/// `{"error": reason, "message": message}` with `status`.
pub(crate) fn error(status: StatusCode, reason: &'static str, message: impl std::fmt::Display) -> Resp {
    Refusal::new(status, reason).message(message).response()
}

/// `400 bad_json` for a body that did not parse as the JSON an endpoint takes. The message says
/// what kind of error and where, never serde's own text: it quotes the input (`unknown field
/// `...``, `invalid type: string "..."`), and a refusal never echoes what a client sent.
pub(crate) fn bad_json(e: &serde_json::Error) -> Resp {
    error(StatusCode::BAD_REQUEST, "bad_json", json_error_text(e))
}

fn json_error_text(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let what = match e.classify() {
        Category::Syntax => "is not valid JSON",
        Category::Eof => "ends before its JSON does",
        Category::Data => "has a field this endpoint does not take, or a value of the wrong type",
        Category::Io => "could not be read",
    };
    format!("the body {what} (line {}, column {})", e.line(), e.column())
}

/// Serves the cluster listener (over TLS with `tls`) until `shutdown` fires; connections are
/// tracked on `conns`, and those past the first few served on `spill`'s runtime.
pub async fn run(
    listener: TcpListener,
    tls: Option<crate::server::Tls>,
    api: Arc<Api>,
    conns: TaskTracker,
    shutdown: CancellationToken,
    spill: Option<crate::server::spill::Spill>,
) {
    let handler = move |req| {
        let api = api.clone();
        async move { handle(&api, req).await }
    };
    let what = crate::server::Listener {
        name: "cluster",
        header_read_timeout: Duration::from_secs(10),
        // Bodies are bounded per path below.
        max_head_bytes: MAX_HEAD_BYTES,
        quiet: quiet_path,
        // Claims, route lookups and publishes: the data plane.
        quiet_when_ok: |path| path.starts_with("/v1/devices/"),
    };
    crate::server::serve(what, listener, tls, conns, shutdown, spill, handler).await
}

/// Why a request's body was not read.
enum BodyError {
    TooLarge,
    Broken,
}

/// The body, if it is at most `keep` bytes. A longer one is read on to its end and dropped
/// before `TooLarge` (a sender still writing it reads the `413`; see [`discard_body`]), up to
/// `cap` bytes in all and within the caller's deadline; one declared longer than `cap` is not
/// read at all. Nothing past `keep` is kept. A request is read with `keep` its path's limit and
/// `cap` at least [`MAX_RPC_BYTES`]: a chunked body declares no length to refuse it by.
async fn read_body(mut body: Incoming, keep: usize, cap: usize) -> Result<bytes::Bytes, BodyError> {
    if hyper::body::Body::size_hint(&body).lower() > cap as u64 {
        return Err(BodyError::TooLarge);
    }
    let mut kept = Kept::default();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| BodyError::Broken)?.into_data() else { continue };
        seen = seen.saturating_add(data.len());
        if seen > cap {
            return Err(BodyError::TooLarge);
        }
        if seen <= keep {
            kept.push(data);
        }
    }
    if seen > keep {
        return Err(BodyError::TooLarge);
    }
    Ok(kept.into_bytes())
}

/// A body's frames as they arrive: the first as it came, then all of them copied into one buffer
/// (a snapshot of tens of megabytes arrives in thousands of frames; the buffer is the only copy
/// held, and it is handed on whole: `raft::rpc` takes the snapshot's data out of it in place).
#[derive(Default)]
enum Kept {
    #[default]
    Nothing,
    One(bytes::Bytes),
    Many(Vec<u8>),
}

impl Kept {
    fn push(&mut self, data: bytes::Bytes) {
        *self = match std::mem::take(self) {
            Kept::Nothing => Kept::One(data),
            Kept::One(first) => Kept::Many([&first[..], &data[..]].concat()),
            Kept::Many(mut all) => {
                all.extend_from_slice(&data);
                Kept::Many(all)
            }
        }
    }

    fn into_bytes(self) -> bytes::Bytes {
        match self {
            Kept::Nothing => bytes::Bytes::new(),
            Kept::One(one) => one,
            Kept::Many(all) => all.into(),
        }
    }
}

/// Reads and drops the body of a request refused before its body was read (at most `limit` bytes,
/// within [`BODY_READ_TIMEOUT`]; nothing is kept), so that a sender still writing it reads the
/// answer: a connection closed with unread bytes is reset, and the sender's next write fails
/// with a broken pipe instead of the refusal it would have acted on. A body declared longer
/// than `limit` is not read (the connection closes as before). A sender that waits for
/// `100 Continue` has sent no body and is answered at once.
async fn discard_body(req: Request<Incoming>, limit: usize) {
    let waits =
        req.headers().get(hyper::header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if waits {
        return;
    }
    let _ = tokio::time::timeout(BODY_READ_TIMEOUT, read_body(req.into_body(), 0, limit)).await;
}

/// Paths called many times a second by members and monitors: their access lines are at debug level.
fn quiet_path(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics" | "/cluster/ping" | "/cluster/status" | "/ui/live")
        || path.starts_with("/raft/")
        || path.starts_with("/cluster/propose/")
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
        (&Method::GET, "/healthz") => return crate::answer::json(StatusCode::OK, &serde_json::json!({"ok": true})),
        (&Method::GET, "/readyz") => return admin::readyz(api),
        (&Method::GET, "/metrics") => return admin::metrics(api).await,
        // Its own auth: the cluster secret, Basic auth too (read-only paths).
        (_, p) if ui::is_ui_path(p) => return ui::serve(api, &req).await,
        _ => {}
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let publish = matches!((&method, segments.as_slice()), (&Method::POST, ["v1", "devices", _, "messages"]));
    let route = matches!((&method, segments.as_slice()), (&Method::GET, ["v1", "devices", _, "route"]));
    // What a caller refused by its secret may have us read of its body, so that it reads the
    // refusal (see `discard_body`): a publish's payload limit, an admin body otherwise, never a
    // member's RPC size.
    let refused_body = if publish { api.device.max_payload_bytes } else { MAX_ADMIN_BODY };
    let Some(caller) = caller(api, &req) else {
        tracing::debug!(%method, %path, "refused an unauthenticated request");
        discard_body(req, refused_body).await;
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong cluster or backend secret");
    };
    if caller == Caller::Backend && !(publish || route) {
        tracing::debug!(%method, %path, "refused a backend request outside publish and route reads");
        discard_body(req, refused_body).await;
        return error(StatusCode::FORBIDDEN, "forbidden", "a backend secret publishes and reads routes only");
    }
    if method == Method::POST && path == APPEND_STREAM_PATH {
        return match wrong_target(api, target) {
            Some(refusal) => refusal,
            None => raft_rpc::stream(api, req),
        };
    }
    // Members' RPC bodies may be large and slow (a snapshot chunk over a thin link); any other
    // body arrives within a deadline, so that it cannot hold a connection (or a publish's charge)
    // forever.
    let (limit, deadline) = match segments.as_slice() {
        ["raft", ..] | ["cluster", "propose", _] => (MAX_RPC_BYTES, None),
        _ if publish => (api.device.max_payload_bytes, Some(BODY_READ_TIMEOUT)),
        _ => (MAX_ADMIN_BODY, Some(BODY_READ_TIMEOUT)),
    };
    let query = req.uri().query().map(str::to_string);
    let idempotency_key =
        req.headers().get("idempotency-key").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let too_large = || {
        if publish {
            let msg = format!("payload exceeds max_payload_bytes {limit}");
            return error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", msg);
        }
        error(StatusCode::PAYLOAD_TOO_LARGE, "bad_body", format!("the body exceeds {limit} bytes"))
    };
    // hyper's reading of `Content-Length` (None when the body is chunked).
    let declared = hyper::body::Body::size_hint(req.body()).exact();
    if declared.is_some_and(|n| n > limit as u64) {
        // Read to its end (up to the largest body any path takes), so that a backend learns
        // its payload is too large instead of retrying a broken pipe.
        discard_body(req, MAX_RPC_BYTES).await;
        return too_large();
    }
    // Held until the answer: a publish's body, command and forward count against the budget.
    let _charge = match publish.then(|| api.publishes.charge(declared.map_or(limit, |n| n as usize))) {
        Some(Err(refusal)) => {
            api.metrics.publishes.get_or_create(&crate::metrics::ResultLabel { result: refusal.reason }).inc();
            discard_body(req, limit).await;
            return refusal.response();
        }
        charge => charge,
    };
    let read = read_body(req.into_body(), limit, limit.max(MAX_RPC_BYTES));
    let read = match deadline {
        None => Ok(read.await),
        Some(d) => tokio::time::timeout(d, read).await,
    };
    let body = match read {
        Ok(Ok(b)) => b,
        Ok(Err(BodyError::TooLarge)) => return too_large(),
        Ok(Err(BodyError::Broken)) => return error(StatusCode::BAD_REQUEST, "bad_body", "the body could not be read"),
        Err(_) => {
            let msg = format!("the body did not arrive within {} s", BODY_READ_TIMEOUT.as_secs());
            return error(StatusCode::REQUEST_TIMEOUT, "body_timeout", msg);
        }
    };
    // Messages meant for one identity (Raft RPC, removal notices) name it: a wiped node answering
    // on its old address must not act on its former identity's behalf.
    let addressed = segments.first() == Some(&"raft") || matches!(segments.as_slice(), ["cluster", "removed" | "ping"]);
    if let Some(refusal) = addressed.then(|| wrong_target(api, target)).flatten() {
        return refusal;
    }
    match (&method, segments.as_slice()) {
        (&Method::POST, ["raft", "v2", "append"]) => raft_rpc::raft(api, RpcKind::Append, body).await,
        (&Method::POST, ["raft", "v2", "vote"]) => raft_rpc::raft(api, RpcKind::Vote, body).await,
        (&Method::POST, ["raft", "v2", "snapshot"]) => raft_rpc::raft(api, RpcKind::Snapshot, body).await,
        (&Method::POST, ["raft", "v2", "transfer-leader"]) => raft_rpc::raft(api, RpcKind::TransferLeader, body).await,
        (&Method::POST, ["cluster", "propose", "v2"]) => raft_rpc::propose(api, &body).await,
        (&Method::GET, ["cluster", "status"]) => admin::status(api),
        (&Method::GET, ["cluster", "identity"]) => admin::identity(api),
        (&Method::POST, ["cluster", "join"]) => admin::join(api, &path, &body).await,
        (&Method::POST, ["cluster", "promote"]) => admin::promote(api, &path, &body).await,
        (&Method::POST, ["cluster", "leave"]) => admin::leave(api, &path, &body).await,
        (&Method::POST, ["cluster", "removed"]) => admin::removed(api),
        (&Method::GET, ["cluster", "ping"]) => admin::ping(api),
        (&Method::POST, ["cluster", "drain"]) => admin::drain(api),
        (&Method::POST, ["cluster", "admission"]) => admin::set_admission(api, &body).await,
        (&Method::GET, ["cluster", "events"]) => scale::events(api, query.as_deref()).await,
        (&Method::POST, ["cluster", "scale-in", "lock"]) => scale::lock(api, &body).await,
        (&Method::POST, ["cluster", "scale-in", "unlock"]) => scale::unlock(api, &body).await,
        (&Method::GET, ["cluster", "tenants", tenant]) => tenants::show(api, tenant).await,
        (&Method::POST, ["cluster", "tenants", tenant]) => tenants::set_policy(api, tenant, &body).await,
        (&Method::POST, ["cluster", "tenants", tenant, "grants"]) => tenants::grant(api, tenant, &body).await,
        (&Method::GET, ["v1", "devices", device, "route"]) => admin::route(api, device),
        (&Method::POST, ["v1", "devices", device, "claim"]) => admin::claim(api, device, &body).await,
        (&Method::POST, ["v1", "devices", device, "messages"]) => {
            messages::publish(api, device, idempotency_key, &body).await
        }
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such path"),
    }
}

/// `409 wrong_target` unless `target` (a request's `?target=`) is this node.
fn wrong_target(api: &Api, target: Option<NodeId>) -> Option<Resp> {
    let me = api.cluster.me();
    let wanted = target.map_or("(none)".into(), |t| t.to_string());
    (target != Some(me))
        .then(|| error(StatusCode::CONFLICT, "wrong_target", format!("this is node {me}, not {wanted}")))
}

fn caller(api: &Api, req: &Request<Incoming>) -> Option<Caller> {
    let token = req.headers().get(hyper::header::AUTHORIZATION)?.as_bytes().strip_prefix(b"Bearer ")?;
    if bool::from(token.ct_eq(api.secret.as_slice())) {
        Some(Caller::Cluster)
    } else if api.backend.accepts(token) {
        Some(Caller::Backend)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        rate: Option<f64>,
    }

    #[test]
    fn json_refusals_never_quote_the_body() {
        // serde's own message quotes the unknown field and the mistyped value.
        let serde_says = serde_json::from_str::<Body>(r#"{"zz_secret_zz": 1}"#).unwrap_err().to_string();
        assert!(serde_says.contains("zz_secret_zz"), "{serde_says}");
        for body in
            [r#"{"zz_secret_zz": 1}"#, r#"{"rate": "zz_secret_zz"}"#, r#"{"rate": 1, zz_secret_zz"#, "zz_secret_zz"]
        {
            let e = serde_json::from_str::<Body>(body).unwrap_err();
            let said = super::json_error_text(&e);
            assert!(!said.contains("zz_secret_zz"), "{said} quotes the body");
            assert!(said.contains("line 1"), "{said}");
        }
    }

    #[test]
    fn a_body_of_many_frames_is_kept_in_one_buffer_and_a_lone_frame_as_it_came() {
        use super::Kept;
        let frame = bytes::Bytes::from_static(b"one frame");
        let mut kept = Kept::default();
        kept.push(frame.clone());
        let one = kept.into_bytes();
        assert_eq!((one.as_ptr(), one.len()), (frame.as_ptr(), frame.len()), "a lone frame is not copied");
        let mut kept = Kept::default();
        for part in [&b"ab"[..], b"", b"cde", b"f"] {
            kept.push(bytes::Bytes::copy_from_slice(part));
        }
        assert_eq!(&kept.into_bytes()[..], b"abcdef");
        assert!(Kept::default().into_bytes().is_empty());
    }
}
