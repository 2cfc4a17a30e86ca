//! The accept loop both listeners share: HTTP/1 with upgrades, TCP_NODELAY, a header-read deadline
//! (slowloris guard; hyper needs a timer for it to work), graceful stop on shutdown.

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

/// Serves `listener` with `handler` until `shutdown` fires; `name` labels accept errors. Every
/// connection task is tracked on `conns` (upgraded WebSocket sessions track themselves).
pub async fn serve<H, Fut>(
    name: &'static str,
    listener: TcpListener,
    header_read_timeout: Duration,
    max_head_bytes: usize,
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
                    tracing::warn!(listener = name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (handler, stop) = (handler.clone(), shutdown.clone());
        let span = tracing::trace_span!("conn", listener = name, %peer);
        let serving = async move {
            let svc = service_fn(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(Peer(peer));
                let fut = handler(req);
                async move { Ok::<_, Infallible>(fut.await) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .max_buf_size(max_head_bytes)
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
