//! The device side of a node: admission, device-token authentication, placement, the handshake,
//! the session loop and the session registry. Sees the cluster only through [`ClusterWatch`], the
//! proposer and a [`RouteLookup`] — never redb.

pub mod admission;
pub mod auth;
pub mod handshake;
pub mod placement;
pub mod registry;
pub mod session;
pub mod stream;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cluster::{ApplyEvent, ClusterWatch};
use crate::metrics::Metrics;
use crate::proposer::Proposer;
use crate::protocol::close;
use crate::raft::types::{Floor, NodeId, Route};
use crate::store::streams::StreamRead;

/// Whether this node takes devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Serving,
    /// Draining (SIGTERM / `gateway drain`): new handshakes get 503.
    Draining,
    /// No lease renewal committed for too long (V7): 503 and connections closed with 1013.
    Fenced,
}

/// Point lookups of the applied state (implemented over the store by the composition root).
pub trait RouteLookup: Send + Sync + 'static {
    fn lookup(&self, device: &str) -> Result<(Option<Route>, Option<Floor>), String>;
    /// The device's stream bounds and up to `limit` retained messages after `after`.
    fn stream(&self, device: &str, after: u64, limit: usize) -> Result<StreamRead, String>;
}

/// Everything the device listener needs.
pub struct Gate {
    pub me: NodeId,
    pub name: String,
    pub admission: admission::Admission,
    pub verifier: auth::Verifier,
    pub view: ClusterWatch,
    pub mode: watch::Receiver<Mode>,
    pub proposer: Proposer,
    pub routes: Arc<dyn RouteLookup>,
    pub registry: registry::Registry,
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub session: session::SessionConfig,
    pub metrics: Arc<Metrics>,
    /// Sessions are tracked here (hyper stops tracking upgraded connections).
    pub tracker: TaskTracker,
}

fn not_found(path: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"error": "not_found", "message": format!("no route for {path}")});
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("static response parts")
}

async fn route(g: Arc<Gate>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/ws") => handshake::handshake(g, req).await,
        (&Method::GET, "/v1/placement") => handshake::placement(g, req).await,
        (&Method::GET, "/healthz") => Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}"))),
        (_, path) => not_found(path),
    }
}

/// Serves the public listener until `shutdown` fires.
pub async fn run(listener: TcpListener, gate: Arc<Gate>, shutdown: CancellationToken) {
    let timeout = gate.header_read_timeout;
    let handler = move |req| route(gate.clone(), req);
    crate::server::serve("public", listener, timeout, shutdown, handler).await
}

/// Closes this node's sessions when the applied log says they lost their route: 4001 when a newer
/// claim took the device over, 4002 when a sweep removed this node's routes.
pub async fn enforce_routes(gate: Arc<Gate>, mut events: broadcast::Receiver<ApplyEvent>, shutdown: CancellationToken) {
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = events.recv() => ev,
        };
        match ev {
            Ok(ApplyEvent::Superseded { node, conn }) if node == gate.me => {
                handshake::kick(&gate, conn, close::SUPERSEDED, "superseded by a newer claim");
            }
            Ok(ApplyEvent::Swept { nodes }) if nodes.contains(&gate.me) => {
                for s in gate.registry.sessions() {
                    handshake::kick(&gate, s.conn, close::ROUTE_LOST, "this node's lease lapsed; route swept");
                }
            }
            Ok(ApplyEvent::Installed) => reconcile(&gate).await,
            Ok(ApplyEvent::Published(d)) if d.node == gate.me => {
                gate.registry.send(d.conn, registry::Control::Deliver { seq: d.seq, payload: d.payload });
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "apply events lagged; reconciling sessions with the routes");
                reconcile(&gate).await;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Closes every accepted session whose route was taken over (4001) or deleted (4002) according
/// to the applied state. Sessions whose claim is still pending, or that this node has not applied
/// yet (the local route is older than the session's), are left alone.
pub async fn reconcile(gate: &Arc<Gate>) {
    for s in gate.registry.sessions() {
        let Some(version) = s.version else { continue };
        let lookup = gate.routes.clone();
        let d = s.device.clone();
        let Ok(Ok((route, floor))) = tokio::task::spawn_blocking(move || lookup.lookup(&d)).await else {
            continue;
        };
        match route {
            Some(r) if r.node == gate.me && r.conn == s.conn => {}
            Some(r) if r.version > version => {
                handshake::kick(gate, s.conn, close::SUPERSEDED, "superseded by a newer claim");
            }
            None if floor.is_some_and(|f| f.max_version >= version) => {
                handshake::kick(gate, s.conn, close::ROUTE_LOST, "route lost");
            }
            _ => {} // this node has not applied the session's own claim yet
        }
    }
}
