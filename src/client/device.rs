//! A reconnecting device (design §4 "Client reconnect", issue 4): dials with a persisted,
//! incremented `attempt`, keeps the connection (answering pings), and on every refusal, redirect,
//! 409 or close decides what to do next with [`Policy`]. Every step is reported as an [`Event`]
//! so callers (tests, the load tool) can count and time them.
//!
//! ```no_run
//! # async fn demo(token: String) {
//! use gateway::client::device::{Device, DeviceConfig, MemoryStore};
//! let cfg = DeviceConfig::new("ws://127.0.0.1:8080", "d1", &token, 0);
//! let stop = tokio_util::sync::CancellationToken::new();
//! let why = Device::new(cfg, Box::new(MemoryStore::new(0))).run(|e| println!("{e:?}"), stop).await;
//! # }
//! ```

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fastwebsockets::{FragmentCollectorRead, Frame, OpCode, Payload};
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;
use super::dial::{dial, Answer, Target, Ws};
pub use super::policy::StopReason;
use super::policy::{Outcome, Policy, Step};
use super::uplink::{Outbox, UpConfig, UplinkRx};
use crate::protocol::{close, ClientFrame, ServerFrame, MAX_ATTEMPT};

/// How one device connects and backs off.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// `ws://host:port` (or `wss://`) of any node (`/ws` is appended). More than one: the next is tried when one
    /// answers 503 or cannot be reached.
    pub urls: Vec<String>,
    pub device: String,
    /// Device JWT, sent as `Authorization: Bearer`.
    pub token: String,
    /// Install epoch, as in the token: a 409 with a newer floor epoch stops the device.
    pub epoch: u64,
    /// Full-jitter base and cap (design §4).
    pub base: Duration,
    pub cap: Duration,
    /// A connection up at least this long was stable: it resets the backoff.
    pub stable_after: Duration,
    /// Bound of one dial: connect, request, refusal body or upgrade and `hello`.
    pub handshake_timeout: Duration,
    /// Seed of the backoff's jitter (give each device its own).
    pub seed: u64,
    /// Local source address (e.g. spread over 127.0.0.0/8 by a load tool).
    pub bind: Option<IpAddr>,
    /// TLS for `wss://` URLs (the CAs to trust); a `wss://` dial without it fails.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl DeviceConfig {
    /// Defaults: base 1 s, cap 30 s, stable after 10 s, handshake 10 s, seed from the device id.
    pub fn new(url: &str, device: &str, token: &str, epoch: u64) -> DeviceConfig {
        let seed =
            device.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        DeviceConfig {
            urls: vec![url.to_string()],
            device: device.to_string(),
            token: token.to_string(),
            epoch,
            base: Duration::from_secs(1),
            cap: Duration::from_secs(30),
            stable_after: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            seed,
            bind: None,
            tls: None,
        }
    }
}

/// Where the device's `attempt` counter persists between handshakes (and restarts).
pub trait AttemptStore: Send {
    /// The last stored attempt (0 if none).
    fn load(&mut self) -> u64;
    fn store(&mut self, attempt: u64) -> std::io::Result<()>;
}

/// A counter in a file, replaced atomically (write + fsync a temp file, then rename).
#[derive(Debug, Clone)]
pub struct FileStore(pub PathBuf);

impl AttemptStore for FileStore {
    /// A missing or unreadable file reads as 0 (a stale attempt is then fixed by the 409).
    fn load(&mut self) -> u64 {
        std::fs::read_to_string(&self.0).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    fn store(&mut self, attempt: u64) -> std::io::Result<()> {
        let mut tmp = self.0.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            writeln!(f, "{attempt}")?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.0)
    }
}

/// A counter in memory (tests, load tools; the caller keeps it across restarts if it wants).
#[derive(Debug, Clone, Default)]
pub struct MemoryStore(pub u64);

impl MemoryStore {
    pub fn new(attempt: u64) -> MemoryStore {
        MemoryStore(attempt)
    }
}

impl AttemptStore for MemoryStore {
    fn load(&mut self) -> u64 {
        self.0
    }

    fn store(&mut self, attempt: u64) -> std::io::Result<()> {
        self.0 = attempt;
        Ok(())
    }
}

/// Everything the device does or is told, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A handshake starts (the attempt is already stored).
    Dialing {
        url: String,
        attempt: u64,
    },
    /// 101 and `hello`; `after` is the time since the last connection ended (or since `run`).
    Connected {
        node: String,
        conn: u64,
        route_version: u64,
        attempt: u64,
        after: Duration,
    },
    /// A refusal other than 307/409: status, the body's `error`, the parsed `Retry-After` (for
    /// a paced 429, the body's `retry_after_ms`: the wait the device keeps).
    Refused {
        status: u16,
        reason: String,
        retry_after: Option<Duration>,
    },
    /// A 307 (followed unless it is one too many in a row).
    Redirected {
        location: String,
        node: String,
    },
    /// A 409 `stale_attempt` floor.
    Stale {
        floor_epoch: u64,
        floor_attempt: u64,
    },
    /// The dial got no answer (`stage` "connect": no TCP connection).
    Unreachable {
        url: String,
        stage: &'static str,
        error: String,
    },
    /// Persisting the attempt failed; the device goes on with its in-memory counter.
    StoreFailed {
        error: String,
    },
    /// The decision: wait `delay` (zero when prompt) before the next dial, and why.
    Waiting {
        delay: Duration,
        why: &'static str,
    },
    /// A connection ended: the server's close code, or 1006 with the error when it just dropped.
    Closed {
        code: u16,
        reason: String,
    },
    /// A frame from the server, `hello` included.
    Frame(ServerFrame),
    /// A text frame this client does not understand (not JSON, or a frame of a newer protocol).
    BadFrame {
        error: String,
    },
    Stopped(StopReason),
}

/// One device; [`Device::run`] drives it until it must stop.
pub struct Device {
    cfg: DeviceConfig,
    store: Box<dyn AttemptStore>,
    /// The highest attempt used, in case the store fails.
    last: u64,
    /// The highest message seq received: every (re)connect syncs from it.
    cursor: u64,
    ups: Ups,
}

impl Device {
    pub fn new(cfg: DeviceConfig, store: Box<dyn AttemptStore>) -> Device {
        let outbox = Outbox::new(UpConfig::default(), cfg.seed);
        Device { cfg, store, last: 0, cursor: 0, ups: Ups { rx: None, outbox } }
    }

    /// Sends the ups submitted on `rx`'s [`super::uplink::Uplink`] handles, retried as `up` says
    /// (the same id each time), across reconnects.
    pub fn with_uplink(mut self, rx: UplinkRx, up: UpConfig) -> Device {
        self.ups = Ups { rx: Some(rx), outbox: Outbox::new(up, self.cfg.seed) };
        self
    }

    /// Starts the message cursor at `seq` (what the application already processed), so the first
    /// sync asks for what came after it.
    pub fn with_cursor(mut self, seq: u64) -> Device {
        self.cursor = seq;
        self
    }

    fn persist(&mut self, attempt: u64, events: &mut impl FnMut(Event)) {
        self.last = self.last.max(attempt);
        if let Err(e) = self.store.store(self.last) {
            events(Event::StoreFailed { error: e.to_string() });
        }
    }

    /// Connects, stays connected, reconnects, until a [`StopReason`] (also sent as the last event).
    /// Panics if `cfg.urls` is empty or names a URL that is not `ws://` or `wss://`.
    pub async fn run(mut self, mut events: impl FnMut(Event) + Send, shutdown: CancellationToken) -> StopReason {
        let seeds: Vec<Target> =
            self.cfg.urls.iter().map(|u| Target::parse(u).unwrap_or_else(|e| panic!("device URL: {e}"))).collect();
        let backoff = Backoff::new(self.cfg.base, self.cfg.cap, self.cfg.seed);
        let mut policy = Policy::new(seeds, self.cfg.epoch, self.cfg.stable_after, backoff);
        let mut since = Instant::now();
        let reason = loop {
            // Saturates at the server's bound (a floor pinned there needs a new install epoch).
            let attempt = self.store.load().max(self.last).saturating_add(1).min(MAX_ATTEMPT);
            self.persist(attempt, &mut events);
            let target = policy.current().clone();
            events(Event::Dialing { url: target.url(attempt), attempt });
            let (cfg, token) = (&self.cfg, self.cfg.token.as_str());
            let answer = tokio::select! {
                _ = shutdown.cancelled() => break StopReason::Shutdown,
                a = dial(&target, attempt, token, cfg.bind, cfg.tls.as_ref(), cfg.handshake_timeout) => a,
            };
            let outcome = match answer {
                Ok(Answer::Open(ws, hello)) => {
                    let connected = Instant::now();
                    policy.connected(&hello.node, hello.next);
                    let (node, conn, route_version) = (hello.node, hello.conn, hello.route_version);
                    events(Event::Connected { node, conn, route_version, attempt, after: connected - since });
                    events(Event::Frame(hello.frame));
                    let bound = cfg.handshake_timeout;
                    let end = session(*ws, &mut events, &shutdown, bound, &mut self.cursor, &mut self.ups).await;
                    self.ups.outbox.disconnected(std::time::Instant::now());
                    since = Instant::now();
                    let Some((code, reason, goaway)) = end else { break StopReason::Shutdown };
                    events(Event::Closed { code, reason });
                    Outcome::Ended { code, goaway, lasted: since - connected }
                }
                Ok(Answer::Refused { status, retry_after, location, body }) => {
                    let text = |k: &str| body[k].as_str().unwrap_or("").to_string();
                    match status {
                        307 => {
                            let location = location.unwrap_or_else(|| text("location"));
                            let node = text("node");
                            events(Event::Redirected { location: location.clone(), node: node.clone() });
                            Outcome::Redirected { location: Target::parse(&location).ok(), node }
                        }
                        409 if body["floor_attempt"].is_u64() => {
                            let floor_epoch = body["floor_epoch"].as_u64().unwrap_or(0);
                            let floor_attempt = body["floor_attempt"].as_u64().unwrap_or(0);
                            events(Event::Stale { floor_epoch, floor_attempt });
                            Outcome::Stale { floor_epoch, floor_attempt }
                        }
                        429 if body["retry_after_ms"].is_u64() => {
                            let wait = Duration::from_millis(body["retry_after_ms"].as_u64().unwrap_or(0));
                            events(Event::Refused { status, reason: text("error"), retry_after: Some(wait) });
                            Outcome::Paced { wait }
                        }
                        _ => {
                            events(Event::Refused { status, reason: text("error"), retry_after });
                            Outcome::Refused { status, retry_after }
                        }
                    }
                }
                Err(e) => {
                    events(Event::Unreachable { url: target.url(attempt), stage: e.stage, error: e.error });
                    Outcome::Unreachable
                }
            };
            match policy.next(outcome) {
                Step::Stop(reason) => break reason,
                Step::Dial { wait, why, raise_to, .. } => {
                    if let Some(floor) = raise_to {
                        self.persist(floor, &mut events);
                    }
                    events(Event::Waiting { delay: wait, why });
                    tokio::select! {
                        _ = shutdown.cancelled() => break StopReason::Shutdown,
                        _ = sleep(wait) => {}
                    }
                }
            }
        };
        self.ups.outbox.stop();
        events(Event::Stopped(reason.clone()));
        reason
    }
}

/// What the reader task hands the session: a whole message, or how the connection ended.
type Read = Result<(OpCode, Vec<u8>), String>;

/// Reads frames until the connection ends: `Some((code, reason, goaway_seen))`, or `None` after
/// closing with 1000 on shutdown (the close echo is awaited at most `bound`). `read_frame` is not
/// cancel-safe, so a reader task owns the read half and this loop selects over its channel, the
/// application's ups and the outbox's timer; every write (replies the reader owes included) is
/// made here.
async fn session(
    ws: Ws,
    events: &mut impl FnMut(Event),
    shutdown: &CancellationToken,
    bound: Duration,
    cursor: &mut u64,
    ups: &mut Ups,
) -> Option<(u16, String, bool)> {
    let (rx, mut tx) = ws.split(tokio::io::split);
    let mut rx = FragmentCollectorRead::new(rx);
    let (read_tx, mut read_rx) = mpsc::channel::<Read>(16);
    let (owed_tx, mut owed_rx) = mpsc::channel::<Frame<'static>>(4);
    let reader = tokio::spawn(async move {
        loop {
            let owed = owed_tx.clone();
            let mut send = move |f: Frame<'_>| {
                let (owed, f) = (owed.clone(), Frame::new(f.fin, f.opcode, None, Payload::Owned(f.payload.to_vec())));
                async move { owed.send(f).await.map_err(|_| fastwebsockets::WebSocketError::ConnectionClosed) }
            };
            let read =
                rx.read_frame(&mut send).await.map(|f| (f.opcode, f.payload.to_vec())).map_err(|e| e.to_string());
            let last = !matches!(read, Ok((op, _)) if op != OpCode::Close);
            if read_tx.send(read).await.is_err() || last {
                return;
            }
        }
    });
    let _abort = AbortOnDrop(reader);
    let text = |s: String| Frame::text(Payload::Owned(s.into_bytes()));
    let mut goaway = false;
    // Ask for everything after the cursor; then messages arrive in order, once each.
    let sync = ClientFrame::Sync { after: *cursor }.to_json();
    if let Err(e) = tx.write_frame(text(sync)).await {
        return Some((1006, e.to_string(), goaway));
    }
    loop {
        let mut out: Vec<Frame<'static>> = Vec::new();
        let next_up = ups.outbox.next_due().map(Instant::from_std);
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = timeout(bound, async {
                    tx.write_frame(Frame::close(close::NORMAL, b"shutdown")).await?;
                    while let Some(Ok((op, _))) = read_rx.recv().await {
                        if op == OpCode::Close {
                            break;
                        }
                    }
                    Ok::<_, fastwebsockets::WebSocketError>(())
                })
                .await;
                return None;
            }
            Some(f) = owed_rx.recv() => out.push(f),
            submit = async { match ups.rx.as_mut() { Some(rx) => rx.0.recv().await, None => std::future::pending().await } } => {
                match submit {
                    Some(s) => ups.outbox.add(s, std::time::Instant::now()),
                    None => ups.rx = None, // every Uplink handle is gone
                }
            }
            _ = async { match next_up { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {}
            read = read_rx.recv() => {
                let (op, payload) = match read {
                    Some(Ok(f)) => f,
                    Some(Err(e)) => return Some((1006, e, goaway)),
                    None => return Some((1006, "reader ended".into(), goaway)),
                };
                match op {
                    OpCode::Text => {
                        let frame = match serde_json::from_slice::<ServerFrame>(&payload) {
                            Ok(f) => f,
                            Err(e) => {
                                events(Event::BadFrame { error: e.to_string() });
                                continue;
                            }
                        };
                        goaway |= matches!(frame, ServerFrame::Goaway { .. });
                        let seq = match &frame {
                            ServerFrame::Msg { seq, .. } => Some(*seq),
                            // Messages before `oldest` are gone: the application resyncs from its backend.
                            ServerFrame::SyncGap { oldest } => Some(oldest.saturating_sub(1)),
                            _ => None,
                        };
                        ups.outbox.answer(&frame, std::time::Instant::now());
                        events(Event::Frame(frame));
                        if let Some(seq) = seq.filter(|s| *s > *cursor) {
                            *cursor = seq;
                            out.push(text(ClientFrame::Ack { seq }.to_json()));
                        }
                    }
                    OpCode::Close => {
                        // The reader already queued the echo (auto-close): send it before leaving.
                        if let Ok(echo) = owed_rx.try_recv() {
                            let _ = timeout(bound, tx.write_frame(echo)).await;
                        }
                        let (code, reason) = match payload.len() {
                            0 | 1 => (1005, String::new()),
                            _ => (u16::from_be_bytes([payload[0], payload[1]]), String::from_utf8_lossy(&payload[2..]).into_owned()),
                        };
                        return Some((code, reason, goaway));
                    }
                    _ => {}
                }
            }
        }
        out.extend(ups.outbox.due(std::time::Instant::now()).into_iter().map(text));
        for frame in out {
            if let Err(e) = tx.write_frame(frame).await {
                return Some((1006, e.to_string(), goaway));
            }
        }
    }
}

/// The application's ups: where they come in, and the ones not yet acked or given up.
struct Ups {
    rx: Option<UplinkRx>,
    outbox: Outbox,
}

/// Aborts the reader task when the session returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_store_round_trips_and_reads_missing_as_zero() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = FileStore(dir.path().join("attempt"));
        assert_eq!(s.load(), 0);
        s.store(41).unwrap();
        s.store(42).unwrap();
        assert_eq!(s.load(), 42);
        assert_eq!(FileStore(dir.path().join("attempt")).load(), 42, "a new instance reads it back");
        assert!(!dir.path().join("attempt.tmp").exists(), "the temp file was renamed into place");
    }

    #[tokio::test]
    async fn shutdown_stops_a_device_that_cannot_connect() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut cfg = DeviceConfig::new(&format!("ws://127.0.0.1:{port}"), "d", "t", 0);
        cfg.base = Duration::from_secs(60);
        let stop = CancellationToken::new();
        let mut seen = Vec::new();
        let run = Device::new(cfg, Box::new(MemoryStore::new(5))).run(
            |e| {
                if matches!(e, Event::Waiting { .. }) {
                    stop.cancel();
                }
                seen.push(e);
            },
            stop.clone(),
        );
        let reason = tokio::time::timeout(Duration::from_secs(10), run).await.expect("prompt shutdown");
        assert_eq!(reason, StopReason::Shutdown);
        assert!(matches!(&seen[0], Event::Dialing { attempt: 6, .. }), "{seen:?}");
        assert!(matches!(&seen[1], Event::Unreachable { stage: "connect", .. }), "{seen:?}");
        assert!(matches!(&seen[2], Event::Waiting { why: "unreachable", .. }), "{seen:?}");
        assert_eq!(seen.last(), Some(&Event::Stopped(StopReason::Shutdown)));
    }
}
