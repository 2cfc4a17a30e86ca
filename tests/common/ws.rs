//! A WebSocket device for tests, synchronous over one shared tokio runtime. The handshake is done by
//! hand with hyper's http1 client so that a refusal's status, headers and JSON body can be asserted;
//! after a 101 a reader task and a writer task per connection turn frames into timestamped [`Event`]s
//! on a std channel. Every call has a deadline; dropping a [`Ws`] drops its TCP connection.

use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fastwebsockets::{Frame, OpCode, Payload, Role, WebSocket, WebSocketError};
use http_body_util::{BodyExt, Empty};
use hyper::header;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::{http, Cluster};

/// Budget of one client call (connect, handshake, a write, a close echo).
pub const CALL_BOUND: Duration = Duration::from_secs(10);

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("test runtime")
    })
}

/// What a connection observed, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A text frame, parsed as JSON (`{"_raw": text}` when it is not JSON).
    Text(Value),
    Binary(Vec<u8>),
    /// The server's close frame (code 1005 when it carried none).
    Close {
        code: u16,
        reason: String,
    },
    /// A server ping (only reported when auto-pong is off).
    Ping,
    Pong,
    /// The connection ended without (further) frames: the reader's error text.
    Eof(String),
    /// Nothing arrived before the deadline.
    Timeout,
}

/// A handshake answered with something other than 101.
#[derive(Debug, Clone)]
pub struct Refused {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Refused {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body's `error` reason ("" when absent).
    pub fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }

    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after").and_then(|v| v.trim().parse().ok())
    }
}

/// How to dial.
#[derive(Debug, Clone)]
pub struct Dial {
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Answer server pings automatically (a real device does); off to test idle closes.
    pub auto_pong: bool,
    /// Send the WebSocket upgrade headers (off: a plain GET).
    pub upgrade: bool,
}

impl Dial {
    pub fn token(token: &str) -> Dial {
        Dial { token: Some(token.to_string()), auto_pong: true, upgrade: true }
    }

    pub fn anonymous() -> Dial {
        Dial { token: None, auto_pong: true, upgrade: true }
    }

    pub fn no_auto_pong(mut self) -> Dial {
        self.auto_pong = false;
        self
    }
}

/// The answer to a handshake.
#[derive(Debug)]
pub enum Outcome {
    Open(Ws),
    Refused(Refused),
}

impl Outcome {
    /// The open connection, or a panic naming `what` and the refusal.
    pub fn open(self, what: &str) -> Ws {
        match self {
            Outcome::Open(ws) => ws,
            Outcome::Refused(r) => {
                panic!("{what}: expected 101, got {} {} (headers {:?})", r.status, r.body, r.headers)
            }
        }
    }

    /// The refusal, or a panic naming `what` (the unexpected connection is dropped).
    pub fn refused(self, what: &str) -> Refused {
        match self {
            Outcome::Refused(r) => r,
            Outcome::Open(mut ws) => {
                let first = ws.next_event(Duration::from_secs(1));
                panic!("{what}: expected a refusal, got 101; first frame {first:?}")
            }
        }
    }
}

type Out = (Frame<'static>, Option<oneshot::Sender<Result<(), String>>>);

/// One upgraded connection.
pub struct Ws {
    events: std_mpsc::Receiver<(Instant, Event)>,
    out: mpsc::UnboundedSender<Out>,
    reader: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Ws {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ws").finish_non_exhaustive()
    }
}

impl Drop for Ws {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

/// Dials `ws://addr{path_and_query}`; Err only for transport failures (connect, timeouts, bad 101).
pub fn try_dial(addr: SocketAddr, path_and_query: &str, dial: &Dial) -> Result<Outcome, String> {
    rt().block_on(dial_async(addr, path_and_query.to_string(), dial.clone()))
}

/// [`try_dial`] that panics on transport failures.
pub fn dial(addr: SocketAddr, path_and_query: &str, dial: &Dial) -> Outcome {
    try_dial(addr, path_and_query, dial).unwrap_or_else(|e| panic!("dial {addr}{path_and_query}: {e}"))
}

async fn within<T, E: std::fmt::Display>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_BOUND, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {CALL_BOUND:?}")),
    }
}

async fn dial_async(addr: SocketAddr, pq: String, dial: Dial) -> Result<Outcome, String> {
    let stream = within("connect", tokio::net::TcpStream::connect(addr)).await?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) =
        within("http1 handshake", hyper::client::conn::http1::handshake(TokioIo::new(stream))).await?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut b = hyper::Request::builder().method("GET").uri(pq).header(header::HOST, addr.to_string());
    if dial.upgrade {
        b = b
            .header(header::UPGRADE, "websocket")
            .header(header::CONNECTION, "Upgrade")
            .header(header::SEC_WEBSOCKET_KEY, fastwebsockets::handshake::generate_key())
            .header(header::SEC_WEBSOCKET_VERSION, "13");
    }
    if let Some(t) = &dial.token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = b.body(Empty::<Bytes>::new()).map_err(|e| format!("request: {e}"))?;
    let mut resp = within("send request", sender.send_request(req)).await?;
    let status = resp.status().as_u16();
    if status != 101 {
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let body = within("read body", resp.into_body().collect()).await?.to_bytes();
        let body = serde_json::from_slice(&body)
            .unwrap_or_else(|_| json!({ "_raw": String::from_utf8_lossy(&body).into_owned() }));
        return Ok(Outcome::Refused(Refused { status, headers, body }));
    }
    if resp.headers().get(header::SEC_WEBSOCKET_ACCEPT).is_none() {
        return Err(format!("101 without Sec-WebSocket-Accept: {:?}", resp.headers()));
    }
    let upgraded = within("upgrade", hyper::upgrade::on(&mut resp)).await?;
    let mut ws = WebSocket::after_handshake(TokioIo::new(upgraded), Role::Client);
    ws.set_auto_pong(dial.auto_pong);
    ws.set_auto_close(true);
    let (rx, tx) = ws.split(tokio::io::split);
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Out>();
    let (ev_tx, ev_rx) = std_mpsc::channel();
    let writer = tokio::spawn(write_loop(tx, out_rx));
    let reader = tokio::spawn(read_loop(rx, out_tx.clone(), ev_tx));
    Ok(Outcome::Open(Ws { events: ev_rx, out: out_tx, reader, writer }))
}

async fn write_loop<S: tokio::io::AsyncWrite + Unpin>(
    mut tx: fastwebsockets::WebSocketWrite<S>,
    mut rx: mpsc::UnboundedReceiver<Out>,
) {
    while let Some((frame, ack)) = rx.recv().await {
        let r = match tokio::time::timeout(CALL_BOUND, async {
            tx.write_frame(frame).await?;
            tx.flush().await
        })
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("write stalled for {CALL_BOUND:?}")),
        };
        let failed = r.is_err();
        if let Some(ack) = ack {
            let _ = ack.send(r);
        }
        if failed {
            return;
        }
    }
}

fn owned(f: Frame<'_>) -> Frame<'static> {
    Frame::new(f.fin, f.opcode, None, Payload::Owned(f.payload.to_vec()))
}

async fn read_loop<S: tokio::io::AsyncRead + Unpin>(
    mut rx: fastwebsockets::WebSocketRead<S>,
    out: mpsc::UnboundedSender<Out>,
    events: std_mpsc::Sender<(Instant, Event)>,
) {
    loop {
        let out2 = out.clone();
        // Pongs and the close echo go through the writer (the read half cannot write).
        let mut obligated = move |f: Frame<'_>| {
            let r = out2.send((owned(f), None)).map_err(|_| WebSocketError::ConnectionClosed);
            async move { r }
        };
        let ev = match rx.read_frame(&mut obligated).await {
            Ok(f) => match f.opcode {
                OpCode::Text => Event::Text(
                    serde_json::from_slice(&f.payload)
                        .unwrap_or_else(|_| json!({ "_raw": String::from_utf8_lossy(&f.payload).into_owned() })),
                ),
                OpCode::Binary => Event::Binary(f.payload.to_vec()),
                OpCode::Close => {
                    let p = &f.payload;
                    let (code, reason) = if p.len() >= 2 {
                        (u16::from_be_bytes([p[0], p[1]]), String::from_utf8_lossy(&p[2..]).into_owned())
                    } else {
                        (1005, String::new())
                    };
                    let _ = events.send((Instant::now(), Event::Close { code, reason }));
                    return;
                }
                OpCode::Ping => Event::Ping,
                OpCode::Pong => Event::Pong,
                OpCode::Continuation => continue,
            },
            Err(e) => {
                let _ = events.send((Instant::now(), Event::Eof(e.to_string())));
                return;
            }
        };
        if events.send((Instant::now(), ev)).is_err() {
            return;
        }
    }
}

impl Ws {
    /// The next event and when the reader saw it; `Timeout` after `timeout`, `Eof` once the reader ended.
    pub fn next_timed(&mut self, timeout: Duration) -> (Instant, Event) {
        match self.events.recv_timeout(timeout) {
            Ok(v) => v,
            Err(std_mpsc::RecvTimeoutError::Timeout) => (Instant::now(), Event::Timeout),
            Err(std_mpsc::RecvTimeoutError::Disconnected) => (Instant::now(), Event::Eof("reader ended".into())),
        }
    }

    pub fn next_event(&mut self, timeout: Duration) -> Event {
        self.next_timed(timeout).1
    }

    /// The next text frame, skipping pings and pongs; panics on anything else or at the deadline.
    pub fn next_text(&mut self, timeout: Duration, what: &str) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next_event(deadline.saturating_duration_since(Instant::now())) {
                Event::Text(v) => return v,
                Event::Ping | Event::Pong => {}
                other => panic!("{what}: expected a text frame within {timeout:?}, got {other:?}"),
            }
        }
    }

    /// The first frame after the upgrade, which must be `hello`.
    pub fn hello(&mut self) -> Value {
        self.hello_timed().1
    }

    /// [`Ws::hello`] with the moment it arrived.
    pub fn hello_timed(&mut self) -> (Instant, Value) {
        match self.next_timed(CALL_BOUND) {
            (at, Event::Text(v)) if v["t"] == "hello" => (at, v),
            (_, other) => panic!("the first frame after the upgrade must be hello, got {other:?}"),
        }
    }

    /// Waits for the server's close frame, skipping pings/pongs/texts; returns (when, code, reason).
    /// Panics on EOF without a close frame or at the deadline.
    pub fn expect_close(&mut self, bound: Duration, what: &str) -> (Instant, u16, String) {
        let deadline = Instant::now() + bound;
        loop {
            match self.next_timed(deadline.saturating_duration_since(Instant::now())) {
                (at, Event::Close { code, reason }) => return (at, code, reason),
                (_, Event::Ping | Event::Pong | Event::Text(_)) => {}
                (_, other) => panic!("{what}: expected a close frame within {bound:?}, got {other:?}"),
            }
        }
    }

    fn send(&self, frame: Frame<'static>) -> Result<(), String> {
        let (ack_tx, ack_rx) = oneshot::channel();
        self.out.send((frame, Some(ack_tx))).map_err(|_| "writer ended".to_string())?;
        rt().block_on(async {
            match tokio::time::timeout(CALL_BOUND, ack_rx).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => Err("writer ended".to_string()),
                Err(_) => Err(format!("write not acknowledged within {CALL_BOUND:?}")),
            }
        })
    }

    pub fn send_text(&self, text: &str) -> Result<(), String> {
        self.send(Frame::text(Payload::Owned(text.as_bytes().to_vec())))
    }

    /// One text message sent as frames of at most `chunk` bytes (first Text, then Continuation).
    pub fn send_text_fragmented(&self, text: &str, chunk: usize) -> Result<(), String> {
        let parts: Vec<&[u8]> = text.as_bytes().chunks(chunk.max(1)).collect();
        for (k, part) in parts.iter().enumerate() {
            let op = if k == 0 { OpCode::Text } else { OpCode::Continuation };
            self.send(Frame::new(k + 1 == parts.len(), op, None, Payload::Owned(part.to_vec())))?;
        }
        Ok(())
    }

    pub fn send_json(&self, v: &Value) -> Result<(), String> {
        self.send_text(&v.to_string())
    }

    pub fn send_binary(&self, bytes: &[u8]) -> Result<(), String> {
        self.send(Frame::binary(Payload::Owned(bytes.to_vec())))
    }

    /// A WebSocket-level ping frame.
    pub fn send_ping(&self) -> Result<(), String> {
        self.send(Frame::new(true, OpCode::Ping, None, Payload::Owned(b"t".to_vec())))
    }

    /// Sends a close frame with `code` and waits for the server's echo; returns its code.
    pub fn close(&mut self, code: u16) -> Result<u16, String> {
        self.send(Frame::close(code, b"bye"))?;
        let deadline = Instant::now() + CALL_BOUND;
        loop {
            match self.next_event(deadline.saturating_duration_since(Instant::now())) {
                Event::Close { code, .. } => return Ok(code),
                Event::Ping | Event::Pong | Event::Text(_) => {}
                other => return Err(format!("no close echo: {other:?}")),
            }
        }
    }
}

// ---- cluster helpers for device tests ------------------------------------------------------------

impl Cluster {
    pub fn public_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.nodes[i].public_port))
    }

    /// The URL nodes advertise for node `i` (the default `public_url` is `ws://<listen>`, or
    /// `wss://` with TLS).
    pub fn public_url(&self, i: usize) -> String {
        let scheme = if self.tls.is_some() { "wss" } else { "ws" };
        format!("{scheme}://127.0.0.1:{}", self.nodes[i].public_port)
    }

    /// The device-token secret as the binary uses it (trailing newline stripped).
    pub fn device_secret(&self) -> Vec<u8> {
        let raw = std::fs::read_to_string(&self.device_secret_file).unwrap();
        raw.trim_end_matches(['\n', '\r']).as_bytes().to_vec()
    }

    /// `gateway token --device D --epoch E --device-secret-file <this cluster's>`; asserts exit 0.
    pub fn token(&self, device: &str, epoch: u64) -> String {
        let f = self.device_secret_file.display().to_string();
        let e = epoch.to_string();
        let out = self.cli(&["token", "--device", device, "--epoch", &e, "--device-secret-file", &f]);
        assert_eq!(out.code, Some(0), "gateway token failed: {out:#?}");
        let t = out.stdout.trim().to_string();
        assert_eq!(t.split('.').count(), 3, "token output is a JWT: {out:#?}");
        t
    }

    /// `gateway token --device D --tenant T` (epoch 0) with this cluster's device secret.
    pub fn tenant_token(&self, device: &str, tenant: &str) -> String {
        let f = self.device_secret_file.display().to_string();
        let out = self.cli(&["token", "--device", device, "--tenant", tenant, "--device-secret-file", &f]);
        assert_eq!(out.code, Some(0), "gateway token --tenant: {out:#?}");
        out.stdout.trim().to_string()
    }

    /// Dials node `i`'s public listener.
    pub fn dial(&self, i: usize, path_and_query: &str, how: &Dial) -> Outcome {
        dial(self.public_addr(i), path_and_query, how)
    }

    /// Connects a device as a client does: from node `start`, following 307s, honouring
    /// Retry-After on refusals, a new `attempt` per dial, until `TIMING.settle_bound()`.
    pub fn connect_following(&self, device: &str, token: &str, start: usize, attempt: &mut u64) -> Ws {
        let mut node = start;
        super::wait_until(super::TIMING.settle_bound(), &format!("{device} to connect"), || {
            *attempt += 1;
            match self.dial(node, &format!("/ws?attempt={attempt}"), &Dial::token(token)) {
                Outcome::Open(ws) => Ok(ws),
                Outcome::Refused(r) if r.status == 307 => {
                    let to = r.header("location").unwrap_or_default().to_string();
                    node = (0..self.nodes.len()).find(|i| to.starts_with(&self.public_url(*i))).unwrap_or(start);
                    Err(format!("redirected to {to}"))
                }
                Outcome::Refused(r) => {
                    // Retry-After is the protocol's own wait, not a test's guess.
                    std::thread::sleep(Duration::from_secs(r.retry_after().unwrap_or(1)));
                    Err(format!("{} {}", r.status, r.error()))
                }
            }
        })
    }

    /// A plain (non-upgrade) request to node `i`'s public listener.
    pub fn public_get(&self, i: usize, path: &str, token: Option<&str>) -> http::Response {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        http::request(self.public_addr(i), "GET", path, &headers, None, http::REQUEST_TIMEOUT)
            .unwrap_or_else(|e| panic!("GET {path} on {} public: {e:#}", self.nodes[i].name))
    }

    /// One sample of node `i`'s `/metrics` with exactly these labels (`result="accepted"`), or None.
    pub fn metric_labeled(&self, i: usize, name: &str, labels: &str) -> Option<f64> {
        let text = self.get(i, "/metrics").ok()?.text();
        let key = format!("{name}{{{labels}}}");
        text.lines().filter_map(|l| l.rsplit_once(' ')).find(|(k, _)| *k == key).and_then(|(_, v)| v.parse().ok())
    }
}
