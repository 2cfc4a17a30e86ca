//! Pipelined replication: AppendEntries over one long-lived connection per sender instead of one
//! HTTP request each. The leader's network asks `POST /raft/v2/stream?target=N` to switch to
//! [`PROTOCOL`] (`Connection: upgrade`); after `101` both sides speak length-prefixed frames (a
//! 4-byte big-endian length, then a value in the project codec): requests one way, exactly one
//! answer per request the other way, in order. The leader writes a request as soon as openraft
//! makes it, without waiting for the answers to the ones before, so a follower's log writer takes
//! several appends in one fsync, and an append costs two frames instead of an HTTP exchange. The
//! follower hands the requests to `Raft::stream_append` (which pipelines them into its core) and
//! writes each answer as it comes.
//!
//! - An answer that ends a stream (a conflict, a higher vote, the follower's Raft stopped) is the
//!   last frame of its connection: both sides close it.
//! - A connection whose every request was answered is kept for the sender's next stream (openraft
//!   opens one per replication session and one per heartbeat); one idle past [`REUSE_IDLE`] or
//!   closed by the follower is dialled anew. A stream with nothing asked of it for [`REUSE_IDLE`]
//!   ends and drops its connection (well inside the follower's idle timeout, so the two never race
//!   over a request); so does one whose connection the follower closes while nothing is asked (a
//!   restart), and openraft opens the next stream at once.
//! - A request left unanswered for the RPC's deadline (`RPCOption::hard_ttl`: the heartbeat
//!   interval, as for an HTTP append) fails the stream and closes the connection.
//! - Bytes: a frame is at most [`MAX_FRAME`]; a follower holds at most [`Limits::in_flight`] bytes
//!   of requests it has not answered (it stops reading until answers go out) and closes a
//!   connection that sends nothing, or reads no answer, for [`Limits::idle`]. An unreadable frame closes the connection
//!   with a log line and no answer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, SinkExt, Stream, StreamExt};
use openraft::base::BoxStream;
use openraft::error::{Fatal, NetworkError, RPCError, Unreachable};
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::codec::{Framed, FramedRead, FramedWrite, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

use super::types::TypeConfig;
use crate::codec::{decode, encode};
use crate::http::{MAX_APPEND_BYTES, MAX_RPC_BYTES};

/// Where a leader asks for a stream (with `?target=<node id>`, checked as for every Raft RPC).
pub const PATH: &str = "/raft/v2/stream";
/// The `Upgrade` protocol name.
pub const PROTOCOL: &str = "gateway-raft-append";
/// The largest frame either side reads: a Raft RPC's body limit (requests are cut to
/// [`MAX_APPEND_BYTES`] unless one entry alone is larger).
pub const MAX_FRAME: usize = MAX_RPC_BYTES;
/// A kept connection idle longer than this is not reused (the follower may be closing it).
pub const REUSE_IDLE: Duration = Duration::from_secs(60);

/// A connection the follower closes while no request is out ends its stream quietly (openraft opens
/// the next one at once) when it lasted this long, as a failure otherwise.
const QUIET_CLOSE_AFTER: Duration = Duration::from_secs(1);

/// A follower's bounds on one connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Request bytes read but not yet answered.
    pub in_flight: usize,
    /// How long a connection may send nothing before it is closed.
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { in_flight: 4 * MAX_APPEND_BYTES, idle: REUSE_IDLE * 2 }
    }
}

/// What a follower answers per request: openraft's result, or why its Raft cannot take appends.
type Answer = Result<StreamAppendResult<TypeConfig>, String>;
type Item = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;
type Request = AppendEntriesRequest<TypeConfig>;

/// A byte stream either side can frame (an upgraded connection; a duplex pipe in tests).
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder().max_frame_length(MAX_FRAME).new_codec()
}

fn network(msg: String) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::from_string(msg))
}

/// The leader's end of one connection to a follower.
pub struct Link {
    /// In a mutex only so that the link is `Sync` (openraft's network clients are); reached
    /// through `get_mut`, never locked.
    framed: Mutex<Framed<Box<dyn Io>, LengthDelimitedCodec>>,
    opened: Instant,
    idle_since: Instant,
}

impl Link {
    pub fn new(io: impl Io) -> Link {
        let now = Instant::now();
        Link { framed: Mutex::new(Framed::new(Box::new(io), codec())), opened: now, idle_since: now }
    }

    fn framed(&mut self) -> &mut Framed<Box<dyn Io>, LengthDelimitedCodec> {
        self.framed.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether another stream may use this connection: not idle past [`REUSE_IDLE`], and nothing
    /// (an answer nobody asked for, the follower's close) waiting on it.
    pub fn reusable(&mut self) -> bool {
        self.idle_since.elapsed() < REUSE_IDLE && self.framed().next().now_or_never().is_none()
    }
}

/// Sends `input`'s requests over `link` as they come and yields the answers in order. When every
/// request was answered and `input` ended, the link goes back into `slot` for the next stream; any
/// failure drops it. `fit` encodes a request (cut to a size limit: `Some(n)` when only `n` entries
/// went, after which the stream sends nothing more, as openraft expects of a partial append).
pub fn pipeline<'s, S, F>(
    link: Link,
    slot: &'s mut Option<Link>,
    input: S,
    ttl: Duration,
    idle: Duration,
    peer: String,
    fit: F,
) -> BoxStream<'s, Item>
where
    S: Stream<Item = Request> + Send + Unpin + 'static,
    F: Fn(&Request) -> Result<(Vec<u8>, Option<usize>), RPCError<TypeConfig>> + Send + 's,
{
    let last_active = link.idle_since;
    let sent = VecDeque::new();
    let session = Session { link: Some(link), slot, input, input_done: false, sent, ttl, idle, last_active, peer, fit };
    Box::pin(futures_util::stream::unfold(session, |mut s| async move {
        let item = s.step().await?;
        Some((item, s))
    }))
}

struct Session<'s, S, F> {
    /// None once the stream failed: it yields nothing more.
    link: Option<Link>,
    slot: &'s mut Option<Link>,
    input: S,
    input_done: bool,
    /// When each unanswered request went out.
    sent: VecDeque<Instant>,
    ttl: Duration,
    /// With nothing asked for this long since `last_active` (a request or an answer), the stream
    /// ends quietly and drops its connection, before the follower's idle timeout could race a
    /// request on it.
    idle: Duration,
    last_active: Instant,
    peer: String,
    fit: F,
}

impl<S, F> Session<'_, S, F>
where
    S: Stream<Item = Request> + Unpin,
    F: Fn(&Request) -> Result<(Vec<u8>, Option<usize>), RPCError<TypeConfig>>,
{
    async fn step(&mut self) -> Option<Item> {
        loop {
            if self.input_done && self.sent.is_empty() {
                let mut link = self.link.take()?;
                link.idle_since = Instant::now();
                *self.slot = Some(link);
                return None;
            }
            let link = self.link.as_mut()?;
            let waiting = !self.sent.is_empty();
            let deadline = self.sent.front().map_or(self.last_active + self.idle, |at| *at + self.ttl);
            tokio::select! {
                biased;
                frame = link.framed().next() => {
                    if self.sent.pop_front().is_none() {
                        // Closed (or spoken to) while nothing was asked: the follower's idle
                        // timeout, a restart. End quietly, so openraft opens the next stream on a
                        // new connection now; one that lasted under a second ends as a failure
                        // (openraft then backs off) rather than redialled in a loop.
                        let quiet = link.opened.elapsed() >= QUIET_CLOSE_AFTER;
                        tracing::debug!(peer = %self.peer, quiet, "append stream closed while idle");
                        self.link = None;
                        return (!quiet).then(|| Err(network(format!("{} closed the append stream", self.peer))));
                    }
                    self.last_active = Instant::now();
                    let answer = match frame {
                        Some(Ok(bytes)) => decode::<Answer>(&bytes).map_err(|e| format!("an unreadable answer: {e}")),
                        Some(Err(e)) => Err(e.to_string()),
                        None => Err("the connection closed".to_string()),
                    };
                    let item = match answer {
                        Ok(Ok(res)) => Ok(res),
                        Ok(Err(fatal)) => Err(RPCError::Unreachable(Unreachable::from_string(format!(
                            "{}: its Raft takes no appends: {fatal}", self.peer
                        )))),
                        Err(e) => Err(network(format!("append stream to {}: {e}", self.peer))),
                    };
                    if !matches!(item, Ok(Ok(_))) {
                        self.link = None;
                    }
                    return Some(item);
                }
                req = self.input.next(), if !self.input_done => {
                    let Some(req) = req else {
                        self.input_done = true;
                        continue;
                    };
                    let (body, partial) = match (self.fit)(&req) {
                        Ok(x) => x,
                        Err(e) => {
                            self.link = None;
                            return Some(Err(e));
                        }
                    };
                    self.input_done |= partial.is_some();
                    match tokio::time::timeout(self.ttl, link.framed().send(Bytes::from(body))).await {
                        Ok(Ok(())) => {
                            self.last_active = Instant::now();
                            self.sent.push_back(self.last_active);
                        }
                        Ok(Err(e)) => {
                            self.link = None;
                            return Some(Err(network(format!("append stream to {}: {e}", self.peer))));
                        }
                        Err(_) => {
                            self.link = None;
                            let msg = format!("append stream to {}: not writable for {} ms", self.peer, self.ttl.as_millis());
                            return Some(Err(network(msg)));
                        }
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    self.link = None;
                    if !waiting {
                        tracing::debug!(peer = %self.peer, "append stream idle; closing its connection");
                        return None;
                    }
                    let msg = format!("{} answered no append within {} ms", self.peer, self.ttl.as_millis());
                    return Some(Err(network(msg)));
                }
            }
        }
    }
}

/// The follower's end: reads requests from `io`, hands them to `follow` (`Raft::stream_append`)
/// and writes its answers, until the leader closes, an answer ends the stream, the connection is
/// idle past `limits.idle`, a frame does not read, or `stop` fires. `on_request` runs per request.
pub async fn serve<F, O>(
    io: impl Io,
    limits: Limits,
    follow: F,
    on_request: impl Fn() + Send + 'static,
    stop: CancellationToken,
) where
    F: FnOnce(BoxStream<'static, Request>) -> O,
    O: Stream<Item = Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>>> + Send,
{
    let (read, write) = tokio::io::split(io);
    let mut out = FramedWrite::new(write, codec());
    let held = Arc::new(Mutex::new(VecDeque::<OwnedSemaphorePermit>::new()));
    let input = requests(FramedRead::new(read, codec()), limits, held.clone(), on_request, stop.clone());
    let answers = follow(input);
    tokio::pin!(answers);
    loop {
        let answer = tokio::select! {
            _ = stop.cancelled() => break,
            a = answers.next() => a,
        };
        let Some(answer) = answer else { break };
        let last = !matches!(answer, Ok(Ok(_)));
        let frame = match encode(&answer.map_err(|fatal| fatal.to_string())) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "raft stream: cannot encode an answer; closing");
                break;
            }
        };
        // A leader that stops reading (paused, or cut off without a reset) would pin this task
        // and its requests' budget until TCP gave up: an answer not written within the idle
        // limit closes the connection.
        let sent = tokio::select! {
            _ = stop.cancelled() => return,
            sent = tokio::time::timeout(limits.idle, out.send(Bytes::from(frame))) => sent,
        };
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => break,
            Err(_) => {
                tracing::debug!(
                    idle_ms = limits.idle.as_millis() as u64,
                    "raft stream: the leader reads no answers; closing"
                );
                // Dropped unflushed: a close would wait on the same unread connection.
                return;
            }
        }
        drop(held.lock().unwrap_or_else(|p| p.into_inner()).pop_front());
        if last {
            break;
        }
    }
    // The leader sees the end of the stream; the reading side ends with the leader's close.
    let _ = tokio::time::timeout(limits.idle, SinkExt::<Bytes>::close(&mut out)).await;
}

/// The requests on one connection, each holding its share of the in-flight budget (released
/// when its answer is written).
fn requests<R: AsyncRead + Send + Unpin + 'static>(
    frames: FramedRead<R, LengthDelimitedCodec>,
    limits: Limits,
    held: Arc<Mutex<VecDeque<OwnedSemaphorePermit>>>,
    on_request: impl Fn() + Send + 'static,
    stop: CancellationToken,
) -> BoxStream<'static, Request> {
    let budget = Arc::new(Semaphore::new(limits.in_flight));
    let state = (frames, budget, held, on_request, stop);
    Box::pin(futures_util::stream::unfold(state, move |(mut frames, budget, held, on_request, stop)| async move {
        let frame = tokio::select! {
            _ = stop.cancelled() => return None,
            f = tokio::time::timeout(limits.idle, frames.next()) => f,
        };
        let bytes = match frame {
            Ok(Some(Ok(bytes))) => bytes,
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "raft stream: an unreadable frame; closing the connection");
                return None;
            }
            Ok(None) => return None,
            Err(_) => {
                tracing::debug!(idle_ms = limits.idle.as_millis() as u64, "raft stream: idle; closing the connection");
                return None;
            }
        };
        let share = u32::try_from(bytes.len().clamp(1, limits.in_flight)).unwrap_or(u32::MAX);
        let permit = tokio::select! {
            _ = stop.cancelled() => return None,
            p = budget.clone().acquire_many_owned(share) => p.ok()?,
        };
        let req: Request = match decode(&bytes) {
            Ok(req) => req,
            Err(e) => {
                tracing::warn!(error = %e, bytes = bytes.len(), "raft stream: an undecodable append; closing the connection");
                return None;
            }
        };
        held.lock().unwrap_or_else(|p| p.into_inner()).push_back(permit);
        on_request();
        Some((req, (frames, budget, held, on_request, stop)))
    }))
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
