//! The status page on the cluster listener: `GET /ui` (the document) and `GET /ui/live` (its live
//! part, fetched every 2 s by the page's script): members, leases, suspicion and drain states,
//! connections per node, the ring as an SVG circle of arcs coloured per node, recent events.
//!
//! Auth: the cluster secret, as a bearer token (scripts) or as the password of HTTP Basic auth
//! (browsers; any user name), which browsers prompt for on the 401's `WWW-Authenticate`. Basic
//! credentials are accepted on these two read-only GETs only: a browser sends cached Basic
//! credentials along with any request to the origin, forged cross-site ones included, so they must
//! not reach a path that changes anything. Answers are `no-store`, may not be framed and run no
//! script but their own (Content-Security-Policy with a nonce). Plain HTTP carries the secret as
//! readably as the bearer header does: reach the page over a trusted network or a tunnel.

pub mod events;
pub mod page;
pub mod ring_svg;

use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use subtle::ConstantTimeEq;

use super::{error, Api};
use crate::answer::Resp;

/// Whether `path` is one of the status page's.
pub fn is_ui_path(path: &str) -> bool {
    path == "/ui" || path == "/ui/" || path == "/ui/live"
}

/// Whether the request carries the cluster secret, as a bearer token or as a Basic password.
fn authorized(api: &Api, req: &Request<Incoming>) -> bool {
    let Some(value) = req.headers().get(hyper::header::AUTHORIZATION).map(|v| v.as_bytes()) else {
        return false;
    };
    let secret = api.secret.as_slice();
    if let Some(token) = value.strip_prefix(b"Bearer ") {
        return bool::from(token.ct_eq(secret));
    }
    let Some(encoded) = value.strip_prefix(b"Basic ") else { return false };
    // A Basic credential is at most a short user name and the secret: refuse long ones unread.
    if encoded.len() > 1024 {
        return false;
    }
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded) else { return false };
    let Some(colon) = decoded.iter().position(|b| *b == b':') else { return false };
    bool::from(decoded[colon + 1..].ct_eq(secret))
}

/// Replicated events the page shows (newest first).
const SHOWN_CLUSTER_EVENTS: u64 = 50;

/// Serves `/ui` and `/ui/live` (GET only; the caller checked the path).
pub async fn serve(api: &Api, req: &Request<Incoming>) -> Resp {
    if req.method() != hyper::Method::GET {
        return error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "the status page is read with GET");
    }
    if !authorized(api, req) {
        let mut resp = error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the status page needs the cluster secret (Basic or Bearer)",
        );
        let challenge = hyper::header::HeaderValue::from_static("Basic realm=\"gateway status\", charset=\"UTF-8\"");
        resp.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, challenge);
        return resp;
    }
    let report = super::admin::report(api);
    let view = api.cluster.view();
    let arcs = view.ring.arcs();
    let events = api.ui_events.recent();
    let after = view.state.event_seq.saturating_sub(SHOWN_CLUSTER_EVENTS);
    let mut cluster_events: Vec<crate::wire::EventView> = match api.cluster.cluster_events(after, 64).await {
        Ok(e) => e.into_iter().map(Into::into).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "reading the cluster event log for the status page failed");
            Vec::new()
        }
    };
    cluster_events.reverse();
    let live = page::Live {
        report: &report,
        arcs: arcs.iter().map(|a| (a.node.as_str(), a.start, a.end)).collect(),
        events: &events,
        cluster_events: &cluster_events,
    };
    let nonce = format!("{:032x}", rand::random::<u128>());
    let (body, csp) = if req.uri().path() == "/ui/live" {
        (page::live(&live), "default-src 'none'".to_string())
    } else {
        let csp = format!(
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'nonce-{nonce}'; \
             connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        );
        (page::document(&live, &nonce), csp)
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "text/html; charset=utf-8")
        .header(hyper::header::CACHE_CONTROL, "no-store")
        .header(hyper::header::CONTENT_SECURITY_POLICY, csp)
        .header(hyper::header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(hyper::header::X_FRAME_OPTIONS, "DENY")
        .header(hyper::header::REFERRER_POLICY, "no-referrer")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts")
}
