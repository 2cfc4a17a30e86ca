//! The accept loop both listeners share: HTTP/1 with upgrades, TCP_NODELAY, a header-read deadline
//! (slowloris guard; hyper needs a timer for it to work), graceful stop on shutdown. Every request
//! runs in a `request` span carrying its [`RequestId`] (also answered in `x-request-id`) and ends
//! with one access line: method, path (never the query: a device may carry its token there),
//! status and time. The line is at debug level for the paths `quiet` names (and for successes on
//! those `quiet_when_ok` names), info otherwise.
//! A client has the header-read deadline to send its first bytes (until then its socket holds
//! only a small task, no buffers) and as long again for each request head once hyper reads it.
//! With [`Tls`] a connection first completes a TLS handshake within the deadline counted from
//! the accept (a client that never sends its hello is dropped); failures are counted, never fatal.

mod primed;
pub mod request_id;
pub mod spill;

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

/// The accept queue each listener asks the kernel for (capped by `net.core.somaxconn`). With the
/// default of 128 a connect burst larger than that between two turns of the accept loop has its
/// SYNs dropped and its clients retry after 1 s, 3 s, 7 s: 10,000 connects took ~50 s here instead
/// of 0.3 s. A reconnect storm must reach admission control, not wait in the kernel.
pub const ACCEPT_BACKLOG: u32 = 4096;

/// Binds a listener on `addr` with an accept queue of [`ACCEPT_BACKLOG`] (`SO_REUSEADDR` set, as
/// `TcpListener::bind` does, so a restart does not wait out `TIME_WAIT`) and `TCP_NODELAY`, which
/// the sockets it accepts inherit on Linux (saving a `setsockopt` a connection; see [`serve`]).
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

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

impl Tls {
    /// Counts one handshake on `listener` by `result` (`ok`, `failed`, `timeout`).
    fn count(&self, listener: &'static str, result: &'static str) {
        self.handshakes.get_or_create(&TlsLabel { listener, result }).inc();
    }
}

/// Serves `listener` with `handler` until `shutdown` fires, over TLS when `tls` is set. Every
/// connection task is tracked on `conns` (upgraded WebSocket sessions track themselves). With
/// `spill`, a connection past its near ones is served on its other runtime (see [`spill`]).
pub async fn serve<H, Fut>(
    what: Listener,
    listener: TcpListener,
    tls: Option<Tls>,
    conns: TaskTracker,
    shutdown: CancellationToken,
    spill: Option<spill::Spill>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    // Whether accepted sockets come with TCP_NODELAY (a listener from `bind`, on Linux): asked of
    // the first one; where they do not, it is set on each.
    let mut inherits_nodelay = None;
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
        if !*inherits_nodelay.get_or_insert_with(|| stream.nodelay().unwrap_or(false)) {
            let _ = stream.set_nodelay(true);
        }
        let (handler, stop, tls) = (handler.clone(), shutdown.clone(), tls.clone());
        let span = tracing::trace_span!("conn", listener = what.name, %peer);
        let serving = move |mut stream: tokio::net::TcpStream| async move {
            // Until its first bytes, a socket holds only this small task: hyper's connection (an
            // 8 KiB read buffer, an 8 KiB write buffer, the service's slot) and the TLS state
            // are built, boxed, when there is something to read. A client that sends nothing
            // within the header-read deadline is dropped here, as hyper would have.
            // The deadline also bounds a TLS handshake, so an idle TLS socket counts as a timeout.
            let deadline = tokio::time::Instant::now() + what.header_read_timeout;
            let first_bytes = tokio::select! {
                _ = stop.cancelled() => return,
                r = tokio::time::timeout_at(deadline, primed::first_bytes(&mut stream)) => r,
            };
            let first = match first_bytes {
                Ok(Ok(first)) if first.is_empty() => return, // closed without a byte
                Ok(Ok(first)) => first,
                Ok(Err(e)) => return tracing::debug!(error = %e, "connection failed before its first bytes"),
                Err(_) => {
                    if let Some(tls) = &tls {
                        tls.count(what.name, "timeout");
                    }
                    return tracing::debug!("nothing sent within the header-read deadline");
                }
            };
            let stream = primed::Primed::new(first, stream);
            Box::pin(serve_stream(what, deadline, stream, peer, tls, stop, handler)).await
        };
        match spill.as_ref().map(spill::Spill::place) {
            // The socket is registered with this runtime's I/O driver: moved to the other's, so
            // that its readiness does not wake this one's worker first.
            Some(spill::Place::Far(far)) => match stream.into_std() {
                Ok(std) => drop(
                    conns.spawn_on(
                        async move {
                            match tokio::net::TcpStream::from_std(std) {
                                Ok(stream) => serving(stream).await,
                                Err(e) => tracing::debug!(error = %e, "connection not moved to the other runtime"),
                            }
                        }
                        .instrument(span),
                        &far,
                    ),
                ),
                Err(e) => tracing::debug!(error = %e, "connection not moved to the other runtime"),
            },
            // Served here, holding its near slot (if any) until it ends.
            near => drop(
                conns.spawn(
                    async move {
                        let _slot = near;
                        serving(stream).await
                    }
                    .instrument(span),
                ),
            ),
        }
    }
}

/// Serves one accepted connection that has bytes to read: TLS first when `tls` is set, then HTTP.
async fn serve_stream<H, Fut>(
    what: Listener,
    deadline: tokio::time::Instant,
    stream: primed::Primed<tokio::net::TcpStream>,
    peer: std::net::SocketAddr,
    tls: Option<Tls>,
    stop: CancellationToken,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let svc = service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(Peer(peer));
        let id = RequestId::for_request(req.headers());
        // The URI shares the request's bytes; the path is cut for an access line only when one is
        // written (most are at debug level).
        let (method, uri) = (req.method().clone(), req.uri().clone());
        let (quiet, quiet_when_ok) = ((what.quiet)(uri.path()), (what.quiet_when_ok)(uri.path()));
        let span = tracing::info_span!("request", listener = what.name, request_id = %id);
        let fut = handler(req);
        async move {
            let started = std::time::Instant::now();
            let mut resp = fut.await;
            resp.headers_mut().insert(&request_id::HEADER, id.header_value());
            let (status, elapsed_ms) = (resp.status().as_u16(), started.elapsed().as_millis() as u64);
            if quiet || (quiet_when_ok && status < 400) {
                tracing::debug!(%method, path = %logged_path(uri.path()), status, elapsed_ms, "request");
            } else {
                tracing::info!(%method, path = %logged_path(uri.path()), status, elapsed_ms, "request");
            }
            Ok::<_, Infallible>(resp)
        }
        .instrument(span)
    });
    let Some(tls) = tls else { return serve_conn(what, TokioIo::new(stream), svc, stop).await };
    match tokio::time::timeout_at(deadline, tls.config.acceptor().accept(stream)).await {
        Ok(Ok(stream)) => {
            tls.count(what.name, "ok");
            serve_conn(what, TokioIo::new(stream), svc, stop).await
        }
        Ok(Err(e)) => {
            tls.count(what.name, "failed");
            tracing::debug!(error = %e, "tls handshake failed");
        }
        Err(_) => {
            tls.count(what.name, "timeout");
            tracing::debug!("tls handshake not done within the header-read deadline");
        }
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
fn logged_path(path: &str) -> &str {
    let mut end = path.len().min(MAX_LOGGED_PATH);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    &path[..end]
}

#[cfg(test)]
mod tests {
    /// What saves the per-connection `setsockopt`: a socket accepted from a listener [`super::bind`]
    /// made already has TCP_NODELAY.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn accepted_sockets_come_with_nodelay() {
        let listener = super::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(accepted.nodelay().unwrap());
        assert!(!client.nodelay().unwrap(), "a connect does not, so the listener's option is what set it");
    }
}
