//! The device side of a node: admission, placement, the handshake, the session loop and the
//! session registry. Sees the cluster only through the typed [`Handle`] and its applied view —
//! never a raw command, the proposer, openraft or redb.

pub mod admission;
pub mod frames;
pub mod handshake;
pub mod overload;
pub mod placement;
pub mod queue;
pub mod registry;
pub mod reported;
pub mod session;
pub mod stream;
pub mod sync_budget;
pub mod unreleased;

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::answer::{Refusal, Resp};
use crate::cluster::{EventReceiver, Handle};
use crate::machine::Event;
use crate::metrics::Metrics;
use crate::protocol::close;
use crate::token::Verifier;

/// Whether this node takes devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Started, but this process's first lease renewal, which releases the routes a previous
    /// process left, has not committed yet (`node::lifecycle::serve_once_renewed`): new
    /// handshakes get 503.
    Starting,
    Serving,
    /// Draining (SIGTERM / `gateway drain`): new handshakes get 503.
    Draining,
    /// No lease renewal committed for too long (V7): 503 and connections closed with 1013.
    Fenced,
}

/// Everything the device listener needs.
pub struct Gate {
    pub cluster: Handle,
    /// Shared with the duty that keeps it at this node's share of the cluster budget.
    pub admission: Arc<admission::Admission>,
    /// Members that handshakes name in `?fallback=` (devices that lost them), for the admission
    /// duty to check.
    pub reported: reported::Reported,
    /// Sheds handshakes while claim commits are slow (`--overload-commit-ms`).
    pub overload: overload::Overload,
    /// Per source address (`--source-rate`), checked first; None when off.
    pub sources: Option<admission::Keyed>,
    /// Per device (`--device-reconnects`), checked on handshakes once the token is verified.
    pub devices: Option<admission::Keyed>,
    pub verifier: Verifier,
    pub mode: watch::Receiver<Mode>,
    pub registry: registry::Registry,
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub session: session::SessionConfig,
    /// The node's room for `sync` pages (`--sync-buffer-bytes`).
    pub sync_pages: sync_budget::SyncBudget,
    /// Where devices' `up` frames go (issue 13).
    pub upstream: Arc<crate::upstream::Upstream>,
    pub metrics: Arc<Metrics>,
    /// Releases that did not commit, kept for a retry ([`unreleased::retry`]).
    pub unreleased: unreleased::Unreleased,
    /// Sessions and the work they leave behind are tracked here (hyper stops tracking upgraded
    /// connections).
    pub tasks: TaskTracker,
}

impl Gate {
    /// Answers a refusal, counted by reason.
    pub(crate) fn refuse(&self, refusal: Refusal) -> Resp {
        self.metrics.handshakes.get_or_create(&crate::metrics::ResultLabel { result: refusal.reason }).inc();
        refusal.response()
    }

    /// Closes `conn` with `code` if it is one of ours.
    pub fn kick(&self, conn: u64, code: u16, reason: &str) -> bool {
        self.registry.send(conn, registry::Control::Close { code, reason: reason.to_string() })
    }
}

async fn route(g: Arc<Gate>, req: Request<Incoming>) -> Resp {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/ws") => handshake::handshake(g, req).await,
        (&Method::GET, "/v1/placement") => handshake::placement(g, req).await,
        (&Method::GET, "/healthz") => crate::answer::json(StatusCode::OK, &serde_json::json!({"ok": true})),
        _ => Refusal::new(StatusCode::NOT_FOUND, "not_found").message("no such path").response(),
    }
}

/// hyper's read buffer for a device's request head (a token is at most 4 KiB, in a header or the
/// query): a head that outgrows it (hyper reads in doubling chunks, so about twice this) gets 431,
/// and 10,000 slow clients cannot hold hyper's default ~400 KB each.
const MAX_HEAD_BYTES: usize = 16 << 10;

/// Serves the public listener (over TLS with `tls`) until `shutdown` fires; connections are
/// tracked on `conns`.
pub async fn run(
    listener: TcpListener,
    tls: Option<crate::server::Tls>,
    gate: Arc<Gate>,
    conns: TaskTracker,
    shutdown: CancellationToken,
) {
    let timeout = gate.header_read_timeout;
    let handler = move |req| route(gate.clone(), req);
    // A reconnect storm is thousands of handshakes a second, counted by reason in the metrics: their
    // access lines are at debug level (`GATEWAY_LOG=info,gateway::server=debug` shows them).
    let what = crate::server::Listener {
        name: "public",
        header_read_timeout: timeout,
        max_head_bytes: MAX_HEAD_BYTES,
        quiet: |_| true,
        quiet_when_ok: |_| true,
    };
    crate::server::serve(what, listener, tls, conns, shutdown, None, handler).await
}

/// Closes this node's sessions when the applied log says they lost their route: 4001 when a newer
/// claim took the device over, 4002 when a sweep removed this node's routes.
pub async fn enforce_routes(gate: Arc<Gate>, mut events: EventReceiver, shutdown: CancellationToken) {
    let me = gate.cluster.me();
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = events.recv() => ev,
        };
        match ev {
            Ok(Event::Superseded { node, conn }) if node == me => {
                gate.kick(conn, close::SUPERSEDED, "superseded by a newer claim");
            }
            Ok(Event::Swept { nodes }) if nodes.contains(&me) => {
                let sessions = gate.registry.sessions();
                tracing::warn!(
                    sessions = sessions.len(),
                    "this node's lease lapsed and its routes were swept: closing its sessions (4002)"
                );
                for s in sessions {
                    gate.kick(s.conn, close::ROUTE_LOST, "this node's lease lapsed; route swept");
                }
            }
            Ok(Event::Installed) => {
                reconcile(&gate).await;
                catch_up(&gate);
            }
            Ok(Event::Published(d)) if d.node == me => {
                gate.registry.send(d.conn, registry::Control::Deliver { seq: d.seq, payload: d.payload });
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "apply events lagged; reconciling sessions with the routes and the streams");
                gate.metrics.event_lags.inc();
                reconcile(&gate).await;
                catch_up(&gate);
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Tells every session to send what its device's stream holds beyond what it sent: pushes may
/// have been missed (lagged events, a snapshot installed instead of entries applied).
fn catch_up(gate: &Gate) {
    for s in gate.registry.sessions() {
        gate.registry.send(s.conn, registry::Control::CatchUp);
    }
}

/// Closes every accepted session whose route was taken over (4001) or deleted (4002) according
/// to the applied state. Sessions whose claim is still pending, or that this node has not applied
/// yet (the local route is older than the session's), are left alone.
pub async fn reconcile(gate: &Arc<Gate>) {
    let me = gate.cluster.me();
    let sessions: Vec<_> = gate.registry.sessions().into_iter().filter(|s| s.version.is_some()).collect();
    // One read transaction for them all: one blocking hop each took 3.7 s for 19,000 sessions
    // on a node busy with a reconnect storm, while it went on refusing handshakes.
    let devices = sessions.iter().map(|s| s.device.clone()).collect();
    let routes = match gate.cluster.routes(devices).await {
        Ok(routes) => routes,
        Err(e) => return tracing::warn!(error = %e, "reconciling sessions: the routes could not be read"),
    };
    let (mut superseded, mut lost) = (0, 0);
    for (s, (route, floor)) in sessions.into_iter().zip(routes) {
        let Some(version) = s.version else { continue };
        match route {
            Some(r) if r.node == me && r.conn == s.conn => {}
            Some(r) if r.version > version => {
                superseded += 1;
                gate.kick(s.conn, close::SUPERSEDED, "superseded by a newer claim");
            }
            None if floor.is_some_and(|f| f.max_version >= version) => {
                lost += 1;
                gate.kick(s.conn, close::ROUTE_LOST, "route lost");
            }
            _ => {} // this node has not applied the session's own claim yet
        }
    }
    if superseded + lost > 0 {
        tracing::info!(
            superseded,
            lost,
            "reconciled sessions with the routes: closed the superseded (4001) and lost (4002)"
        );
    }
}
