//! The accept loop both listeners share: HTTP/1 with upgrades, TCP_NODELAY, a header-read deadline
//! (slowloris guard; hyper needs a timer for it to work), graceful stop on shutdown. Every request
//! runs in a `request` span carrying its [`RequestId`] (also answered in `x-request-id`) and ends
//! with one access line: method, path (never the query: a device may carry its token there),
//! status and time. The line is at debug level for the paths `quiet` names (and for successes on
//! those `quiet_when_ok` names), info otherwise.

pub mod request_id;

pub use request_id::RequestId;

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

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

/// Serves `listener` with `handler` until `shutdown` fires. Every connection task is tracked on
/// `conns` (upgraded WebSocket sessions track themselves).
pub async fn serve<H, Fut>(
    what: Listener,
    listener: TcpListener,
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
        let (handler, stop) = (handler.clone(), shutdown.clone());
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
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(what.header_read_timeout)
                .max_buf_size(what.max_head_bytes)
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.cancelled() => {
                    // Finish the request in flight (idle keep-alive connections close at once).
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        };
        conns.spawn(serving.instrument(span));
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
