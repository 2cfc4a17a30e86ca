//! One pooled HTTP/1 client for everything a node or the CLI sends to a cluster listener (Raft RPC,
//! forwarded writes, admin calls). Connections use TCP_NODELAY; every call has a deadline.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The largest request body the cluster listener reads (a Raft append, a snapshot chunk, a
/// forwarded batch): senders keep below it — the proposer bounds each batch in bytes far below, the
/// Raft network splits appends (`PayloadTooLarge`).
pub const MAX_RPC_BYTES: usize = 64 << 20;

/// The most a Raft append may carry: openraft 0.9 allows an append one heartbeat interval,
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
    client: Client<HttpConnector, Full<Bytes>>,
    bearer: String,
}

impl HttpClient {
    pub fn new(secret: &[u8]) -> HttpClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(8)
            .build(connector);
        HttpClient { client, bearer: format!("Bearer {}", String::from_utf8_lossy(secret)) }
    }

    /// Sends one request to `http://{addr}{path}` and reads the whole answer.
    pub async fn call(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), HttpError> {
        let req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header(hyper::header::AUTHORIZATION, &self.bearer)
            .header(hyper::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| HttpError::Transport { addr: addr.to_string(), reason: e.to_string() })?;
        let fut = async {
            let resp = self.client.request(req).await.map_err(|e| {
                if e.is_connect() {
                    HttpError::Connect { addr: addr.to_string(), reason: e.to_string() }
                } else {
                    HttpError::Transport { addr: addr.to_string(), reason: e.to_string() }
                }
            })?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| HttpError::Transport { addr: addr.to_string(), reason: e.to_string() })?
                .to_bytes();
            Ok((status, body))
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(HttpError::Timeout { addr: addr.to_string(), timeout }),
        }
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
