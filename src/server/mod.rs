//! The accept loop both listeners share: HTTP/1 with upgrades, TCP_NODELAY, a header-read deadline
//! (slowloris guard; hyper needs a timer for it to work), graceful stop on shutdown. Every request
//! runs in a `request` span carrying its [`RequestId`] (also answered in `x-request-id`) and ends
//! with one access line: method, path (never the query: a device may carry its token there),
//! status and time. The line is at debug level for the paths `quiet` names (and for successes on
//! those `quiet_when_ok` names), info otherwise.
//! With [`Tls`] a connection first completes a TLS handshake within the header-read deadline (a
//! client that never sends its hello is dropped); failures are counted, never fatal.

pub mod request_id;

pub use request_id::RequestId;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::metrics::TlsLabel;
use crate::tls::ServerTls;

/// The address a request came from (in the request's extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub std::net::SocketAddr);

/// The longest path an access line quotes (the rest is cut).
const MAX_LOGGED_PATH: usize = 128;

/// What a listener is, for its accept loop.
#[derive(Debug, Clone, Copy)]
pub struct Listener {
    /// Labels accept errors and the request spans (`public`, `cluster`).
    pub name: &'static str,
    pub header_read_timeout: Duration,
    pub max_head_bytes: usize,
    /// Paths whose access line is at debug level (health checks, Raft RPC, device handshakes).
    pub quiet: fn(&str) -> bool,
    /// Paths whose access line is at debug level when the answer is a success, at info level
    /// otherwise (the data plane: thousands a second, where a line each costs more CPU than the
    /// request and buries the refusals).
    pub quiet_when_ok: fn(&str) -> bool,
}

/// TLS on a listener: its (reloadable) configuration and the handshake counter.
#[derive(Clone)]
pub struct Tls {
    pub config: Arc<ServerTls>,
    /// `gateway_tls_handshakes_total{listener, result}`.
    pub handshakes: Family<TlsLabel, Counter>,
}

/// Serves `listener` with `handler` until `shutdown` fires, over TLS when `tls` is set. Every
/// connection task is tracked on `conns` (upgraded WebSocket sessions track themselves).
pub async fn serve<H, Fut>(
    what: Listener,
    listener: TcpListener,
    tls: Option<Tls>,
    conns: TaskTracker,
    shutdown: CancellationToken,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of file descriptors or similar: back off instead of spinning.
                    tracing::warn!(listener = what.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (handler, stop, tls) = (handler.clone(), shutdown.clone(), tls.clone());
        let span = tracing::trace_span!("conn", listener = what.name, %peer);
        let serving = async move {
            let svc = service_fn(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(Peer(peer));
                let id = RequestId::for_request(req.headers());
                req.extensions_mut().insert(id.clone());
                let (method, path) = (req.method().clone(), logged_path(req.uri().path()));
                let (quiet, quiet_when_ok) = ((what.quiet)(&path), (what.quiet_when_ok)(&path));
                let span = tracing::info_span!("request", listener = what.name, request_id = %id);
                let fut = handler(req);
                async move {
                    let started = std::time::Instant::now();
                    let mut resp = fut.await;
                    resp.headers_mut().insert(&request_id::HEADER, id.header_value());
                    let (status, elapsed_ms) = (resp.status().as_u16(), started.elapsed().as_millis() as u64);
                    if quiet || (quiet_when_ok && status < 400) {
                        tracing::debug!(%method, %path, status, elapsed_ms, "request");
                    } else {
                        tracing::info!(%method, %path, status, elapsed_ms, "request");
                    }
                    Ok::<_, Infallible>(resp)
                }
                .instrument(span)
            });
            let Some(tls) = tls else { return serve_conn(what, TokioIo::new(stream), svc, stop).await };
            let counted = |result| tls.handshakes.get_or_create(&TlsLabel { listener: what.name, result }).inc();
            match tokio::time::timeout(what.header_read_timeout, tls.config.acceptor().accept(stream)).await {
                Ok(Ok(stream)) => {
                    counted("ok");
                    serve_conn(what, TokioIo::new(stream), svc, stop).await
                }
                Ok(Err(e)) => {
                    counted("failed");
                    tracing::debug!(error = %e, "tls handshake failed");
                }
                Err(_) => {
                    counted("timeout");
                    tracing::debug!("tls handshake not done within the header-read deadline");
                }
            }
        };
        conns.spawn(serving.instrument(span));
    }
}

/// Serves HTTP/1 (with upgrades) on one connection until it ends; on `stop`, finishes the request
/// in flight (idle keep-alive connections close at once).
async fn serve_conn<I, S>(what: Listener, io: I, svc: S, stop: CancellationToken)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = Full<Bytes>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(what.header_read_timeout)
        .max_buf_size(what.max_head_bytes)
        .serve_connection(io, svc)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// The path as an access line quotes it: at most [`MAX_LOGGED_PATH`] bytes (hyper has already
/// refused a request target with bytes outside visible ASCII).
fn logged_path(path: &str) -> String {
    let mut end = path.len().min(MAX_LOGGED_PATH);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    path[..end].to_string()
}
