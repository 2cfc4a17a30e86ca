//! One device handshake (design §4), done by hand over hyper's http1 client so that a refusal's
//! status, `Retry-After`, `Location` and JSON body can be read (a WebSocket library would only say
//! "not 101"). The whole dial, up to and including the first frame (`hello`), has one deadline.
//! `wss://` dials TLS (rustls) first, with the trust the caller configured.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fastwebsockets::{OpCode, Role, WebSocket};
use http_body_util::{BodyExt, Empty};
use hyper::header;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{timeout_at, Instant};

use super::backoff::parse_retry_after;
use crate::protocol::ServerFrame;

/// An open device connection. The session splits it and reassembles fragmented messages; the
/// `hello` is read whole (the server never fragments it).
pub type Ws = WebSocket<TokioIo<Upgraded>>;

/// A `/ws` endpoint: `ws://authority/path?params` or `wss://` (`http://`, `https://` too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `wss://`: TLS first.
    pub tls: bool,
    pub authority: String,
    pub path: String,
    /// Query parameters other than `attempt`, which every dial sets anew.
    pub params: Vec<(String, String)>,
}

impl Target {
    /// Parses `ws[s]://host:port[/path][?query]`. A path that does not end in `/ws` gets `/ws`
    /// appended, so the URL of a node (`ws://host:port`) and of its endpoint both work.
    pub fn parse(url: &str) -> Result<Target, String> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("ws://").or_else(|| url.strip_prefix("http://")) {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("wss://").or_else(|| url.strip_prefix("https://")) {
            (true, rest)
        } else {
            return Err(format!("{url:?}: only ws:// and wss:// (or http://, https://) URLs are supported"));
        };
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match before_query.find('/') {
            Some(k) => before_query.split_at(k),
            None => (before_query, ""),
        };
        if authority.is_empty() {
            return Err(format!("{url:?}: no host"));
        }
        let trimmed = path.trim_end_matches('/');
        let path = if trimmed.ends_with("/ws") { trimmed.to_string() } else { format!("{trimmed}/ws") };
        let params = query
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
            .filter(|(k, _)| *k != "attempt")
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok(Target { tls, authority: authority.to_string(), path, params })
    }

    /// This target with `key=value` set (replacing an earlier value).
    pub fn with_param(mut self, key: &str, value: &str) -> Target {
        self.params.retain(|(k, _)| k != key);
        self.params.push((key.to_string(), value.to_string()));
        self
    }

    /// `/ws?attempt=N&...` (attempt first, then the other parameters in order).
    pub fn path_and_query(&self, attempt: u64) -> String {
        let mut pq = format!("{}?attempt={attempt}", self.path);
        for (k, v) in &self.params {
            pq.push('&');
            pq.push_str(k);
            if !v.is_empty() {
                pq.push('=');
                pq.push_str(v);
            }
        }
        pq
    }

    pub fn url(&self, attempt: u64) -> String {
        let scheme = if self.tls { "wss" } else { "ws" };
        format!("{scheme}://{}{}", self.authority, self.path_and_query(attempt))
    }

    /// The host as TLS names it (no port, no IPv6 brackets).
    fn host(&self) -> &str {
        let a = self.authority.as_str();
        if let Some(rest) = a.strip_prefix('[') {
            return rest.split(']').next().unwrap_or(rest);
        }
        a.rsplit_once(':').map_or(a, |(h, _)| h)
    }

    /// `host:port` for the resolver (port 80, or 443 for wss, when the URL names none).
    fn host_port(&self) -> String {
        let has_port = match self.authority.rfind(']') {
            Some(k) => self.authority[k..].contains(':'),
            None => self.authority.contains(':'),
        };
        if has_port {
            self.authority.clone()
        } else {
            format!("{}:{}", self.authority, if self.tls { 443 } else { 80 })
        }
    }
}

/// The `hello` frame's fields a client needs (the whole frame is kept as well).
#[derive(Debug, Clone)]
pub struct Hello {
    pub node: String,
    pub conn: u64,
    pub route_version: u64,
    /// Where to go first if this connection is lost (see [`ServerFrame::Hello`]).
    pub next: Option<Target>,
    pub frame: ServerFrame,
}

/// What a node answered.
pub enum Answer {
    /// `101` and a `hello`.
    Open(Box<Ws>, Hello),
    /// Any other status. `body` is the JSON refusal (`Value::Null` when it was not JSON).
    Refused { status: u16, retry_after: Option<Duration>, location: Option<String>, body: Value },
}

/// The dial failed before the node answered: `connect` (no TCP connection: refused, unroutable,
/// no answer) or a later step (deadline, protocol error).
#[derive(Debug, Clone)]
pub struct DialError {
    pub stage: &'static str,
    pub error: String,
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.stage, self.error)
    }
}

async fn step<T, E: std::fmt::Display>(
    deadline: Instant,
    stage: &'static str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, DialError> {
    match timeout_at(deadline, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(DialError { stage, error: e.to_string() }),
        Err(_) => Err(DialError { stage, error: "handshake deadline passed".into() }),
    }
}

async fn connect(target: &Target, bind: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let addrs = tokio::net::lookup_host(target.host_port()).await?;
    let addr: SocketAddr = addrs
        .into_iter()
        .find(|a| bind.is_none_or(|b| b.is_ipv4() == a.is_ipv4()))
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address of the bind family"))?;
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if let Some(ip) = bind {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let stream = socket.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Dials `target` with `?attempt=N` and `Authorization: Bearer <token>`; everything, including
/// reading a refusal body or the `hello` frame, finishes within `timeout`. A `wss://` target
/// needs `tls` (the CAs to trust): without it the dial fails at stage `tls`.
pub async fn dial(
    target: &Target,
    attempt: u64,
    token: &str,
    bind: Option<IpAddr>,
    tls: Option<&Arc<rustls::ClientConfig>>,
    timeout: Duration,
) -> Result<Answer, DialError> {
    let deadline = Instant::now() + timeout;
    let stream = step(deadline, "connect", connect(target, bind)).await?;
    if !target.tls {
        return exchange(stream, target, attempt, token, deadline).await;
    }
    let bad = |error: String| DialError { stage: "tls", error };
    let config = tls.ok_or_else(|| bad("a wss:// URL needs a CA file to trust".into()))?;
    let name = ServerName::try_from(target.host().to_string()).map_err(|e| bad(e.to_string()))?;
    let connector = tokio_rustls::TlsConnector::from(config.clone());
    let stream = step(deadline, "tls", connector.connect(name, stream)).await?;
    exchange(stream, target, attempt, token, deadline).await
}

/// The HTTP/1 upgrade and the `hello`, over a plain or a TLS stream.
async fn exchange<S>(
    stream: S,
    target: &Target,
    attempt: u64,
    token: &str,
    deadline: Instant,
) -> Result<Answer, DialError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        step(deadline, "http1 handshake", hyper::client::conn::http1::handshake(TokioIo::new(stream))).await?;
    // Ends by itself once the request is answered and `sender` is dropped, or after the upgrade.
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let req = hyper::Request::builder()
        .method("GET")
        .uri(target.path_and_query(attempt))
        .header(header::HOST, target.authority.as_str())
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header(header::SEC_WEBSOCKET_KEY, fastwebsockets::handshake::generate_key())
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Empty::<Bytes>::new())
        .map_err(|e| DialError { stage: "request", error: e.to_string() })?;
    let mut resp = step(deadline, "request", sender.send_request(req)).await?;
    let status = resp.status().as_u16();
    if status != 101 {
        let text = |name| resp.headers().get(name).and_then(|v: &header::HeaderValue| v.to_str().ok());
        let retry_after = text(header::RETRY_AFTER).and_then(parse_retry_after);
        let location = text(header::LOCATION).map(str::to_string);
        let body = step(deadline, "refusal body", resp.into_body().collect()).await?.to_bytes();
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        return Ok(Answer::Refused { status, retry_after, location, body });
    }
    let upgraded = step(deadline, "upgrade", hyper::upgrade::on(&mut resp)).await?;
    let mut ws = WebSocket::after_handshake(TokioIo::new(upgraded), Role::Client);
    ws.set_auto_pong(true);
    ws.set_auto_close(true);
    let frame = step(deadline, "hello", ws.read_frame()).await?;
    let bad = |what: String| DialError { stage: "hello", error: what };
    if frame.opcode != OpCode::Text {
        return Err(bad(format!("expected a text frame, got {:?}", frame.opcode)));
    }
    let first: ServerFrame = serde_json::from_slice(&frame.payload).map_err(|e| bad(e.to_string()))?;
    let ServerFrame::Hello { node, conn, route_version, next_url, .. } = &first else {
        return Err(bad(format!("the first frame is not a hello: {first:?}")));
    };
    let next = next_url.as_deref().and_then(|u| Target::parse(u).ok());
    let hello = Hello { node: node.clone(), conn: *conn, route_version: *route_version, next, frame: first.clone() };
    Ok(Answer::Open(Box::new(ws), hello))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_urls_get_the_ws_path_and_attempt_is_replaced() {
        let t = Target::parse("ws://127.0.0.1:9000").unwrap();
        assert_eq!(t.url(3), "ws://127.0.0.1:9000/ws?attempt=3");
        assert_eq!(Target::parse("ws://h:1/").unwrap().path, "/ws");
        assert_eq!(Target::parse("http://h:1/ws").unwrap().path, "/ws");
        assert_eq!(Target::parse("ws://h:1/gw").unwrap().path, "/gw/ws");
        // A 307 Location carries the old attempt and other parameters: attempt is set per dial.
        let loc = Target::parse("ws://127.0.0.1:9001/ws?attempt=7&fallback=n3&steer").unwrap();
        assert_eq!(loc.url(8), "ws://127.0.0.1:9001/ws?attempt=8&fallback=n3&steer");
        let t = loc.with_param("fallback", "n2");
        assert_eq!(t.path_and_query(9), "/ws?attempt=9&steer&fallback=n2");
        assert!(Target::parse("ftp://h:1").is_err());
        assert!(Target::parse("ws:///ws").is_err());
        let t = Target::parse("wss://h:1/ws?x=1").unwrap();
        assert!(t.tls && !Target::parse("ws://h:1").unwrap().tls);
        assert_eq!((t.url(2).as_str(), t.host()), ("wss://h:1/ws?attempt=2&x=1", "h"));
        assert_eq!(Target::parse("wss://[::1]:5").unwrap().host(), "::1");
    }

    #[test]
    fn the_resolver_gets_a_port() {
        let hp = |u| Target::parse(u).unwrap().host_port();
        assert_eq!(hp("ws://example.org"), "example.org:80");
        assert_eq!(hp("ws://example.org:81"), "example.org:81");
        assert_eq!(hp("ws://[::1]"), "[::1]:80");
        assert_eq!(hp("ws://[::1]:82"), "[::1]:82");
        assert_eq!(hp("wss://example.org"), "example.org:443");
    }

    #[tokio::test]
    async fn a_closed_port_is_a_connect_error_within_the_deadline() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let t = Target::parse(&format!("ws://127.0.0.1:{port}")).unwrap();
        let e = dial(&t, 1, "x", None, None, Duration::from_secs(5)).await.err().expect("nothing listens there");
        assert_eq!(e.stage, "connect", "{e}");
    }
}
