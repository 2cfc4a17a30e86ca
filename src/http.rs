//! One pooled HTTP/1 client for everything a node or the CLI sends to a cluster listener (Raft RPC,
//! forwarded writes, admin calls). Connections use TCP_NODELAY; every call has a deadline. An
//! address is `host:port` (dialled with the client's default scheme: https when it has a TLS
//! configuration) or a URL base `http://host:port` / `https://host:port`.

use std::sync::Arc;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::upgrade::Upgraded;
use hyper::{Method, Request, Response, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The largest request body the cluster listener reads (a Raft append, a snapshot chunk, a
/// forwarded batch): senders keep below it — the proposer bounds each batch in bytes far below, the
/// Raft network splits appends (`PayloadTooLarge`).
pub const MAX_RPC_BYTES: usize = 64 << 20;

/// The most a Raft append may carry: openraft allows an append one heartbeat interval,
/// transfer, decoding and the follower's fsync included, so appends stay small; a larger one is
/// split (the network answers `PayloadTooLarge` with a hint of how many entries fit).
pub const MAX_APPEND_BYTES: usize = 2 << 20;

/// Why a call failed before a status came back.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("{addr} did not answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("request to {addr} failed: {reason}")]
    Transport { addr: String, reason: String },
}

/// A cluster-listener client carrying the cluster secret as a bearer token.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    bearer: String,
    /// Whether TLS is configured: `host:port` addresses are then dialled with https.
    tls: bool,
}

impl HttpClient {
    /// A plain-text client (`https://` addresses are refused).
    pub fn new(secret: &[u8]) -> HttpClient {
        HttpClient::with_tls(secret, None)
    }

    /// A client that speaks https with `tls` (trusted CAs, the certificate it presents), and
    /// dials `host:port` addresses with https; without it, plain text only.
    pub fn with_tls(secret: &[u8], tls: Option<Arc<rustls::ClientConfig>>) -> HttpClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        connector.enforce_http(false);
        let has_tls = tls.is_some();
        // Without a configuration, an empty trust store: `call` refuses https before dialling.
        let config = tls.map(|c| (*c).clone()).unwrap_or_else(|| {
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        });
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(8)
            .build(https);
        HttpClient { client, bearer: format!("Bearer {}", String::from_utf8_lossy(secret)), tls: has_tls }
    }

    /// The URL of `path` at `addr` (`host:port` or `http[s]://host:port`).
    pub fn url(&self, addr: &str, path: &str) -> String {
        if addr.starts_with("http://") || addr.starts_with("https://") {
            format!("{}{path}", addr.trim_end_matches('/'))
        } else if self.tls {
            format!("https://{addr}{path}")
        } else {
            format!("http://{addr}{path}")
        }
    }

    /// Sends one request to `{addr}{path}` (see [`HttpClient::url`]) and reads the whole answer.
    pub async fn call(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), HttpError> {
        let req = self.request(method, addr, path, content_type, body)?;
        let fut = async {
            let resp = self.send(addr, req).await?;
            Ok((resp.status(), whole(addr, resp).await?))
        };
        within(addr, timeout, fut).await
    }

    /// Asks `{addr}{path}` (a POST without a body) to switch the connection to `protocol`
    /// (`Connection: upgrade`): the upgraded connection on `101`, otherwise the status and body
    /// answered. The connection leaves the pool.
    pub async fn upgrade(
        &self,
        addr: &str,
        path: &str,
        protocol: &'static str,
        timeout: Duration,
    ) -> Result<Result<Upgraded, (StatusCode, Bytes)>, HttpError> {
        let mut req = self.request(Method::POST, addr, path, "application/octet-stream", Vec::new())?;
        req.headers_mut().insert(hyper::header::CONNECTION, HeaderValue::from_static("upgrade"));
        req.headers_mut().insert(hyper::header::UPGRADE, HeaderValue::from_static(protocol));
        let fut = async {
            let mut resp = self.send(addr, req).await?;
            if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
                return Ok(Err((resp.status(), whole(addr, resp).await?)));
            }
            let upgraded = hyper::upgrade::on(&mut resp)
                .await
                .map_err(|e| HttpError::Transport { addr: addr.to_string(), reason: error_chain(&e) })?;
            Ok(Ok(upgraded))
        };
        within(addr, timeout, fut).await
    }

    fn request(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<Request<Full<Bytes>>, HttpError> {
        let url = self.url(addr, path);
        if !self.tls && url.starts_with("https://") {
            let reason = "https needs a CA to trust: --ca-file (GATEWAY_CA_FILE)".to_string();
            return Err(HttpError::Connect { addr: addr.to_string(), reason });
        }
        Request::builder()
            .method(method)
            .uri(url)
            .header(hyper::header::AUTHORIZATION, &self.bearer)
            .header(hyper::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| HttpError::Transport { addr: addr.to_string(), reason: e.to_string() })
    }

    async fn send(&self, addr: &str, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, HttpError> {
        self.client.request(req).await.map_err(|e| {
            // hyper's Display says only "client error (Connect)": the cause (refused, a
            // TLS alert, an untrusted certificate) is what an operator needs.
            let reason = error_chain(&e);
            if e.is_connect() {
                HttpError::Connect { addr: addr.to_string(), reason }
            } else {
                HttpError::Transport { addr: addr.to_string(), reason }
            }
        })
    }

    pub async fn post_bin(
        &self,
        addr: &str,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), HttpError> {
        self.call(Method::POST, addr, path, "application/octet-stream", body, timeout).await
    }

    pub async fn post_json<T: serde::Serialize>(
        &self,
        addr: &str,
        path: &str,
        body: &T,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), HttpError> {
        let body = serde_json::to_vec(body).expect("serializing a plain struct");
        self.call(Method::POST, addr, path, "application/json", body, timeout).await
    }

    pub async fn get(&self, addr: &str, path: &str, timeout: Duration) -> Result<(StatusCode, Bytes), HttpError> {
        self.call(Method::GET, addr, path, "application/json", Vec::new(), timeout).await
    }
}

/// `fut`, or `HttpError::Timeout` once `timeout` passes.
async fn within<T>(
    addr: &str,
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, HttpError>>,
) -> Result<T, HttpError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(HttpError::Timeout { addr: addr.to_string(), timeout }),
    }
}

/// The most of an answer a call reads: as much as a listener takes in a request. A peer (or
/// whatever answers on its address) that sends more fails the call instead of filling memory.
pub const MAX_ANSWER_BYTES: usize = MAX_RPC_BYTES;

/// The whole body of `resp`, at most [`MAX_ANSWER_BYTES`].
async fn whole(addr: &str, resp: Response<Incoming>) -> Result<Bytes, HttpError> {
    let too_large = || HttpError::Transport {
        addr: addr.to_string(),
        reason: format!("the answer exceeds {MAX_ANSWER_BYTES} bytes"),
    };
    // A declared length over the cap fails before a byte is read.
    if hyper::body::Body::size_hint(resp.body()).lower() > MAX_ANSWER_BYTES as u64 {
        return Err(too_large());
    }
    let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER_BYTES).collect().await;
    body.map(|b| b.to_bytes()).map_err(|e| match e.is::<http_body_util::LengthLimitError>() {
        true => too_large(),
        false => HttpError::Transport { addr: addr.to_string(), reason: e.to_string() },
    })
}

/// At most the first 200 bytes of an answer, as text, for an error message.
pub fn excerpt(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
}

/// An error and its sources, `: `-separated.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers one request with `head`, then `body` over and over for as long as
    /// it is read; its address.
    async fn endless_answer(head: String, body: Vec<u8>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = s.read(&mut request).await;
            s.write_all(head.as_bytes()).await.unwrap();
            while s.write_all(&body).await.is_ok() {}
        });
        addr
    }

    #[tokio::test]
    async fn an_answer_larger_than_the_cap_fails_the_call_instead_of_filling_memory() {
        let zeros = vec![0u8; 1 << 16];
        let declared = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", 2 * MAX_ANSWER_BYTES);
        // A length over the cap is refused up front; a chunked answer is cut at the cap.
        let chunked = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_string();
        let chunk = [b"10000\r\n".as_slice(), &zeros, b"\r\n"].concat();
        for (head, body) in [(declared, zeros.clone()), (chunked, chunk)] {
            let addr = endless_answer(head, body).await;
            let e = HttpClient::new(b"s").get(&addr, "/", Duration::from_secs(60)).await.unwrap_err();
            assert!(matches!(e, HttpError::Transport { .. }) && e.to_string().contains("exceeds"), "{e}");
        }
    }

    #[tokio::test]
    async fn addresses_take_the_default_scheme_and_https_needs_a_ca() {
        let plain = HttpClient::new(b"s");
        assert_eq!(plain.url("h:1", "/x"), "http://h:1/x");
        assert_eq!(plain.url("https://h:1/", "/x"), "https://h:1/x");
        let e = plain.get("https://127.0.0.1:1", "/", Duration::from_secs(1)).await.unwrap_err();
        assert!(matches!(e, HttpError::Connect { .. }) && e.to_string().contains("--ca-file"), "{e}");
    }
}
