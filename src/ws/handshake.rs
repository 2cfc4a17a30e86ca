//! The device handshake (design §4), in this order; the first step that refuses answers and
//! nothing later runs: 1 admission (429) → 2 node state (503) → 3 authentication (401) →
//! 4 placement (307) → 5 claim through Raft, deadline-bounded (409 / 503) → 6 upgrade (101).
//! Every refusal is a JSON `{"error": "<reason>", ...}` body (see `crate::answer`), counted by
//! reason.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use rand::RngCore;

use super::admission;
use super::placement::{place, successor};
use super::session::{self, Ended};
use super::stream::{Acker, StreamCursor};
use super::{Gate, Mode};
use crate::answer::{self, Refusal, Resp};
use crate::machine::{Claim, NodeId};
use crate::metrics::ResultLabel;
use crate::protocol::{close, ServerFrame, MAX_ATTEMPT};
use crate::server::Peer;
use crate::token::DeviceClaims;

/// A request's query parameters, read in place (a handshake's query holds a handful): `k=v`
/// pairs split on `&`, a key without `=` has the empty value, and a repeated key's last value
/// wins. Values are not percent-decoded.
#[derive(Clone, Copy)]
pub(crate) struct Query<'a>(&'a str);

impl<'a> Query<'a> {
    pub(crate) fn of<B>(req: &'a Request<B>) -> Query<'a> {
        Query(req.uri().query().unwrap_or(""))
    }

    pub(crate) fn get(&self, key: &str) -> Option<&'a str> {
        let pair = |kv: &'a str| kv.split_once('=').unwrap_or((kv, ""));
        self.0.rsplit('&').map(pair).find(|(k, _)| !k.is_empty() && *k == key).map(|(_, v)| v)
    }
}

/// The device's token: `Authorization: Bearer`, else `?token=`, else empty.
pub(crate) fn bearer<'a, B>(req: &'a Request<B>, q: &Query<'a>) -> &'a str {
    req.headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| q.get("token"))
        .unwrap_or_default()
}

/// Steps 1-3 shared with `/v1/placement`: admission, node state, authentication.
fn gatekeep(g: &Gate, req: &Request<Incoming>, q: &Query<'_>) -> Result<DeviceClaims, Refusal> {
    // Per source first: a flooding source must not spend the node's admission.
    if let (Some(sources), Some(Peer(peer))) = (&g.sources, req.extensions().get::<Peer>()) {
        if let Err(secs) = sources.admit(&source_key(peer.ip())) {
            return Err(Refusal::new(StatusCode::TOO_MANY_REQUESTS, "source_rate_limited").retry_after(secs));
        }
    }
    // A device that lost its node says so; the admission duty checks that node itself.
    if let Some(fallback) = q.get("fallback") {
        let view = g.cluster.view();
        fallbacks(&view, Some(fallback)).into_iter().for_each(|id| g.reported.add(id));
    }
    if let Err(wait) = g.admission.admit() {
        return Err(Refusal::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited")
            .retry_after(admission::retry_after_secs(wait))
            .field("retry_after_ms", admission::retry_after_ms(wait)));
    }
    let now = std::time::Instant::now();
    g.overload.observe_term(g.cluster.term(), now);
    g.overload.observe_apply_lag(g.cluster.apply_lag(), now);
    let shed = g.overload.admit(now, || g.admission.pacing());
    g.metrics.admitted_share.set((g.overload.share(now) * 1000.0).round() as i64);
    if let Some(s) = g.overload.take_shift() {
        let permille = |share: f64| (share * 1000.0).round() as u64;
        let (from, to) = (permille(s.from), permille(s.to));
        let (samples, slow_commits, lagging) = (s.samples, s.slow_commits, s.lagging);
        if s.to < s.from {
            tracing::warn!(from, to, samples, slow_commits, lagging, "overload: admitting fewer handshakes (permille)");
        } else {
            tracing::info!(from, to, "overload: admitting every handshake again (permille)");
        }
    }
    if let Err(secs) = shed {
        let msg =
            "claims are committing slowly (--overload-commit-ms) or the node is behind the log: fewer handshakes are admitted until they recover";
        return Err(Refusal::unavailable("overloaded").message(msg).retry_after(secs));
    }
    let mode = *g.mode.borrow();
    match mode {
        Mode::Starting => return Err(Refusal::unavailable("starting")),
        Mode::Draining => return Err(Refusal::unavailable("draining")),
        Mode::Fenced => return Err(Refusal::unavailable("no_quorum")),
        Mode::Serving => {}
    }
    // Whether this node may serve is decided by the applied state plus its own monotonic-clock
    // fence (Mode), never by comparing the leader's lease stamp with this node's wall clock.
    if !g.cluster.view().is_live(g.cluster.me()) {
        return Err(Refusal::unavailable("not_live"));
    }
    g.verifier.verify(bearer(req, q)).map_err(|e| Refusal::new(StatusCode::UNAUTHORIZED, e.reason()).message(e))
}

/// What a source is limited by: an IPv4 address, or an IPv6 address's /64 (one host's range).
fn source_key(ip: std::net::IpAddr) -> Vec<u8> {
    match ip {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.octets().to_vec(),
            None => v6.octets()[..8].to_vec(),
        },
    }
}

/// Nodes named in `?fallback=` that placement leaves out, at most this many (names the cluster
/// does not know are ignored).
const MAX_FALLBACKS: usize = 8;

/// The members `?fallback=a,b` names: nodes the device could not reach, or that were full and
/// sent it on.
fn fallbacks(view: &crate::view::ClusterView, fallback: Option<&str>) -> Vec<NodeId> {
    let names = fallback.map(|f| f.split(',').take(MAX_FALLBACKS).collect::<Vec<_>>()).unwrap_or_default();
    names.into_iter().filter_map(|f| view.resolve(f)).collect()
}

/// `exclude` with `me` added once and last; past [`MAX_FALLBACKS`] the oldest go (the next node
/// reads only the first ones).
fn with_fallback(mut exclude: Vec<NodeId>, me: NodeId) -> Vec<NodeId> {
    exclude.retain(|id| *id != me);
    exclude.push(me);
    exclude.drain(..exclude.len().saturating_sub(MAX_FALLBACKS));
    exclude
}

/// Where placement sends `device`, leaving out the nodes in `exclude`; `dialled` as for [`place`].
fn target(g: &Gate, device: &str, exclude: &[NodeId], dialled: Option<NodeId>) -> Option<NodeId> {
    let cached = g.cluster.cached_route(device);
    let source = if cached.is_some() { "cache" } else { "store" };
    g.metrics.placement_reads.get_or_create(&ResultLabel { result: source }).inc();
    let (route, floor) = match cached {
        Some(row) => row,
        None => g.cluster.route_in_place(device).unwrap_or_default(),
    };
    let view = g.cluster.view();
    place(&view, device, route.as_ref(), floor.as_ref(), exclude, dialled, g.cluster.now_ms())
}

/// This node is at `--max-connections`: a redirect to where placement sends `device` without
/// it, its name added to `?fallback=` so that the next node does not send the device back
/// before this node's renewed count shows it full; None when there is no such node.
fn elsewhere(g: &Gate, device: &str, q: &Query<'_>, query: &str) -> Option<Resp> {
    let view = g.cluster.view();
    let exclude = with_fallback(fallbacks(&view, q.get("fallback")), g.cluster.me());
    let node = target(g, device, &exclude, None)?;
    // The list is rebuilt from members' names, never copied from the request.
    let names: Vec<&str> = exclude.iter().filter_map(|id| view.member(*id)).map(|m| &*m.name).collect();
    let rest = query.split('&').filter(|kv| kv.split('=').next() != Some("fallback"));
    let query = rest.chain([format!("fallback={}", names.join(",")).as_str()]).collect::<Vec<_>>().join("&");
    redirect(g, node, &query, "sent_on_full")
}

/// `GET /v1/placement`: the `/ws` URL this device should use.
pub async fn placement(g: Arc<Gate>, req: Request<Incoming>) -> Resp {
    let q = Query::of(&req);
    let device = match gatekeep(&g, &req, &q) {
        Ok(v) => v.sub,
        Err(r) => return g.refuse(r),
    };
    let exclude = fallbacks(&g.cluster.view(), q.get("fallback"));
    let node = target(&g, &device, &exclude, None).unwrap_or(g.cluster.me());
    let view = g.cluster.view();
    let name = view.member(node).map(|m| m.name.clone()).unwrap_or_default();
    let body = serde_json::json!({"device": device, "node": name, "node_id": node, "url": view.ws_url(node)});
    answer::json(StatusCode::OK, &body)
}

/// `GET /ws?attempt=N`: the whole handshake.
pub async fn handshake(g: Arc<Gate>, mut req: Request<Incoming>) -> Resp {
    let q = Query::of(&req);
    let DeviceClaims { sub: device, epoch, tenant, .. } = match gatekeep(&g, &req, &q) {
        Ok(v) => v,
        Err(r) => return g.refuse(r),
    };
    if let Some(Err(secs)) = g.devices.as_ref().map(|d| d.admit(device.as_bytes())) {
        let msg = "this device reconnects too often (--device-reconnects): wait for Retry-After";
        return g.refuse(Refusal::new(StatusCode::TOO_MANY_REQUESTS, "flapping").message(msg).retry_after(secs));
    }
    let Some(attempt) = q.get("attempt").and_then(|a| a.parse::<u64>().ok()).filter(|a| *a <= MAX_ATTEMPT) else {
        let msg = "?attempt=N (a counter the device persists, at most 2^53) is required";
        return g.refuse(Refusal::new(StatusCode::BAD_REQUEST, "bad_attempt").message(msg));
    };
    // The whole upgrade is checked before the claim: a request that cannot upgrade must not take
    // the device over (and close its live connection) only to fail afterwards.
    if let Err(msg) = upgradable(&req) {
        return g.refuse(Refusal::new(StatusCode::BAD_REQUEST, "not_websocket").message(msg));
    }
    let me = g.cluster.me();
    let steer = q.get("steer") != Some("off");
    if steer {
        let exclude = fallbacks(&g.cluster.view(), q.get("fallback"));
        let dialled = (!exclude.is_empty()).then_some(me);
        if let Some(node) = target(&g, &device, &exclude, dialled).filter(|n| *n != me) {
            if let Some(redirect) = redirect(&g, node, req.uri().query().unwrap_or(""), "redirected") {
                return redirect;
            }
        }
    }

    // Register before the claim commits, so a kick that races the upgrade is not lost.
    let conn = rand::thread_rng().next_u64();
    let (registration, mailbox) = match g.registry.register(conn, &device) {
        Ok(v) => v,
        Err(full) => {
            if steer {
                if let Some(redirect) = elsewhere(&g, &device, &q, req.uri().query().unwrap_or("")) {
                    return redirect;
                }
            }
            let msg = format!("this node holds its maximum of {} connections (--max-connections)", full.max);
            return g.refuse(Refusal::unavailable("at_capacity").message(msg));
        }
    };
    let claim = Claim { device: device.clone(), node: me, conn, epoch, attempt };
    let (started, term) = (std::time::Instant::now(), g.cluster.term());
    let outcome = tokio::time::timeout(g.handshake_timeout, g.cluster.claim(claim, tenant.clone())).await;
    g.metrics.claim_seconds.observe(started.elapsed().as_secs_f64());
    // A claim that waited out an election says nothing about load (see `overload`).
    if g.cluster.term() == term {
        g.overload.observe(started.elapsed(), std::time::Instant::now());
    }
    let accepted = match outcome {
        Ok(outcome) => {
            // A write that got no reply may still commit and name a connection that does not
            // exist: release it in the background (conn-checked, harmless if it did not).
            if outcome.is_err() {
                release_later(&g, &device, conn);
            }
            answer::claim(outcome)
        }
        Err(_) => {
            release_later(&g, &device, conn);
            let msg = "the claim did not commit before the handshake deadline";
            Err(Refusal::unavailable("unavailable").message(msg))
        }
    };
    let (version, head) = match accepted {
        Ok(a) => (a.version, a.head),
        Err(r) => return g.refuse(r),
    };

    let (response, upgrade) = match fastwebsockets::upgrade::upgrade(&mut req) {
        Ok(v) => v,
        // Checked before the claim (`upgradable`): cannot happen; released all the same.
        Err(e) => {
            release(&g, &device, conn).await;
            return g.refuse(Refusal::new(StatusCode::BAD_REQUEST, "not_websocket").message(e));
        }
    };
    g.metrics.handshakes.get_or_create(&ResultLabel { result: "accepted" }).inc();
    g.registry.accepted(conn, version);
    // Every message up to this head is for `sync`; every later one is pushed to this connection
    // as the log applies it. A claim this node applied itself (it leads) answered the head as its
    // apply left it; a forwarded one is read back here, after the claim committed (the leader's
    // head may be ahead of what this node has applied). Either is at most this node's head now,
    // and a push past the announced head that is not the next one starts a catch-up read.
    let (stream_head, source) = match head {
        Some(head) => (head, "claim"),
        None => (g.cluster.stream_head(&device).unwrap_or(0), "read"),
    };
    g.metrics.stream_heads.get_or_create(&ResultLabel { result: source }).inc();
    // Where this device goes if this node fails: placement with this node left out. Told now, it
    // saves the fleet a dial to a dead node and a redirect each, in the storm that follows.
    let view = g.cluster.view();
    let next_url = successor(&view, &device, me, g.cluster.now_ms()).and_then(|n| view.ws_url(n));
    let hello = ServerFrame::Hello {
        device: device.clone(),
        node: g.cluster.member().name.to_string(),
        node_id: me,
        conn,
        route_version: version,
        stream_head,
        next_url,
    };
    let (cluster, tasks) = (g.cluster.clone(), g.tasks.clone());
    let acker: Acker = Arc::new(move |device: String, seq: u64| {
        let cluster = cluster.clone();
        let ack = async move {
            if let Err(e) = cluster.ack(&device, seq).await {
                tracing::debug!(error = %e, "ack did not commit; the next one covers it");
            }
        };
        tasks.spawn(tracing::Instrument::in_current_span(ack));
    });
    let cursor = StreamCursor::new(
        device.clone(),
        g.cluster.clone(),
        acker,
        stream_head,
        g.session.send_queue_bytes,
        g.sync_pages.clone(),
    );
    let gate = g.clone();
    let ups = session::Ups { service: g.upstream.clone(), device: device.clone(), tenant };
    // Boxed: awaited from the task's own future, it would be held there twice (as the captured
    // value and as the value being awaited).
    let running = Box::pin(session::run(upgrade, hello.to_json(), mailbox, cursor, g.session.clone(), ups));
    g.metrics.connections.inc();
    let span = tracing::debug_span!("session", %device, conn);
    let session_task = async move {
        let _registration = registration;
        let ended = running.await;
        if ended == Ended::Closed(close::SUPERSEDED) {
            gate.metrics.kicks.inc();
        }
        // A superseded or swept route is no longer ours, and Release is conn-checked.
        // Boxed: the release's future is larger than an idle session's.
        if !matches!(ended, Ended::Closed(close::SUPERSEDED) | Ended::Closed(close::ROUTE_LOST)) {
            Box::pin(release(&gate, &device, conn)).await;
        }
        gate.metrics.connections.dec();
        tracing::debug!(?ended, "session ended");
    };
    g.tasks.spawn(tracing::Instrument::instrument(session_task, span));
    let (parts, _) = response.into_parts();
    Response::from_parts(parts, Full::new(Bytes::new()))
}

/// Whether `req` is a WebSocket upgrade `fastwebsockets::upgrade::upgrade` will accept (RFC 6455
/// §4.2.1): `Connection: Upgrade`, `Upgrade: websocket`, version 13, and a key that is 16 bytes in
/// base64. The reason names the header, never its value.
pub(crate) fn upgradable<B>(req: &Request<B>) -> Result<(), &'static str> {
    if !fastwebsockets::upgrade::is_upgrade_request(req) {
        return Err("expected a WebSocket upgrade request (Connection: Upgrade, Upgrade: websocket)");
    }
    if req.headers().get("sec-websocket-version").map(|v| v.as_bytes()) != Some(b"13") {
        return Err("Sec-WebSocket-Version must be 13");
    }
    // 16 bytes in base64: 22 characters of the alphabet and "==".
    let key_ok = req.headers().get("sec-websocket-key").is_some_and(|k| {
        let k = k.as_bytes();
        k.len() == 24
            && k.ends_with(b"==")
            && k[..22].iter().all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
    });
    if !key_ok {
        return Err("Sec-WebSocket-Key must be 16 bytes in base64");
    }
    Ok(())
}

/// `307` to `node`'s `/ws` with `query`, or None when its URL is unknown; counted under `result`
/// (`redirected` by placement, `sent_on_full` by a node at its limit).
fn redirect(g: &Gate, node: NodeId, query: &str, result: &'static str) -> Option<Resp> {
    let view = g.cluster.view();
    let url = view.ws_url(node)?;
    let location = format!("{url}?{query}");
    let name = view.member(node).map(|m| m.name.clone()).unwrap_or_default();
    g.metrics.handshakes.get_or_create(&ResultLabel { result }).inc();
    // The Location header carries the query (a browser's `?token=` included, or it could not
    // follow); the body names the URL only: a token is never copied into a body.
    let body = serde_json::json!({"error": "wrong_node", "location": url, "node": name});
    let mut resp = answer::json(StatusCode::TEMPORARY_REDIRECT, &body);
    resp.headers_mut().insert(hyper::header::LOCATION, location.parse().ok()?);
    Some(resp)
}

/// The claim's outcome is unknown (timed out, forward failed): release it in the background.
fn release_later(g: &Arc<Gate>, device: &str, conn: u64) {
    let (gate, device) = (g.clone(), device.to_string());
    let span = tracing::debug_span!("release", %device, conn);
    g.tasks.spawn(tracing::Instrument::instrument(async move { release(&gate, &device, conn).await }, span));
}

/// Releases the route `conn` holds; one that does not commit is kept for a retry.
async fn release(g: &Gate, device: &str, conn: u64) {
    if let Err(e) = g.cluster.release(device, conn).await {
        super::unreleased::keep(g, device, conn, &e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_node_adds_itself_to_the_fallbacks_once_and_newest_last() {
        assert_eq!(with_fallback(vec![], 1), vec![1]);
        assert_eq!(with_fallback(vec![3, 1, 2], 1), vec![3, 2, 1]);
        let full: Vec<NodeId> = (10..10 + MAX_FALLBACKS as u64).collect();
        let next = with_fallback(full.clone(), 1);
        assert_eq!(next.len(), MAX_FALLBACKS);
        assert_eq!((next[0], next[MAX_FALLBACKS - 1]), (full[1], 1), "the oldest goes, this node is kept");
    }

    #[test]
    fn query_parameters_are_read_in_place_and_the_last_of_a_repeated_key_wins() {
        let r = Request::builder().uri("/ws?attempt=3&steer&&=x&attempt=4&token=a=b").body(()).unwrap();
        let q = Query::of(&r);
        assert_eq!(q.get("attempt"), Some("4"));
        assert_eq!(q.get("steer"), Some(""), "a key without `=` has the empty value");
        assert_eq!(q.get("token"), Some("a=b"), "split at the first `=`");
        assert_eq!((q.get("fallback"), q.get("")), (None, None), "absent, and empty keys are dropped");
        let bare = Request::builder().uri("/ws").body(()).unwrap();
        assert_eq!(Query::of(&bare).get("attempt"), None);
        let with_header = Request::builder().uri("/ws?token=q").header("authorization", "Bearer h").body(()).unwrap();
        assert_eq!(bearer(&with_header, &Query::of(&with_header)), "h", "the header wins over ?token=");
        let r = Request::builder().uri("/ws?token=q").body(()).unwrap();
        assert_eq!(bearer(&r, &Query::of(&r)), "q");
        assert_eq!(bearer(&bare, &Query::of(&bare)), "");
    }

    fn req(headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().method("GET").uri("/ws?attempt=1");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn only_a_complete_upgrade_passes() {
        let good = [
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ];
        assert_eq!(upgradable(&req(&good)), Ok(()));
        for (missing, _) in good {
            let without: Vec<_> = good.iter().copied().filter(|(k, _)| *k != missing).collect();
            assert!(upgradable(&req(&without)).is_err(), "without {missing}");
        }
        for bad_key in
            ["", "short==", "dGhlIHNhbXBsZSBub25jZQ", "dGhlIHNhbXBsZSBub25jZ!==", "dGhlIHNhbXBsZSBub25jZQ==="]
        {
            let mut h = good;
            h[3].1 = bad_key;
            assert_eq!(upgradable(&req(&h)), Err("Sec-WebSocket-Key must be 16 bytes in base64"), "{bad_key:?}");
        }
        let mut v12 = good;
        v12[2].1 = "12";
        assert_eq!(upgradable(&req(&v12)), Err("Sec-WebSocket-Version must be 13"));
    }
}
