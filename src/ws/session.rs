//! One device session after the upgrade, in one task: a session loop, and the reader as a
//! future it polls. The reader ([`super::frames`]) keeps its place across awaits, so it is pinned
//! for the session's life and polled by reference as one branch of the loop's `select!` (never
//! restarted mid-message while the session lives); every frame it must answer (pong, close echo,
//! a reply) goes through the reply queue, and the reader waits for room there: a device that does
//! not read its replies stops being read. The loop pings every `ping_ms`, closes after `idle_ms` without traffic,
//! obeys [`Control`] commands (kicks, drain, fencing), and sends a `sync` one page at a time
//! between them. Memory per session is bounded in bytes: one message being read
//! (`max_message_bytes`, reassembly included), the reply queue (`send_queue` small frames:
//! replies never quote the device), the mailbox (`send_queue_bytes` of payloads) and one sync
//! page ([`super::stream::PAGE_BYTES`], held against the node's `--sync-buffer-bytes`: a page
//! that finds no room waits, and the device is told `sync_busy`). `up` frames are handed to
//! [`Upstream::submit`] (refusals answered at once like any reply); the answers of admitted ones
//! come back on the session's lane, at most `--upstream-max-in-flight-per-device` small frames.
//! An idle session holds no lane, no write state and no timer beyond its ping interval.
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fastwebsockets::upgrade::UpgradeFut;
use fastwebsockets::{Frame, OpCode, Payload, WebSocketError, WebSocketWrite};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;

use super::frames::{FrameReader, InFrame};
use super::queue;
use super::registry::{Control, Mailbox};
use super::stream::{Page, StreamCursor};
use crate::protocol::{close, ClientFrame, ServerFrame};
use crate::upstream::{Answer, Lane, Upstream};

/// The session's way to the backend: `up` frames are handed to `service` on a lane opened on the
/// device's first `up` (an idle session holds none); its answers come back on that lane (bounded
/// by the device's in-flight limit) and are written in turn.
pub struct Ups {
    pub service: Arc<Upstream>,
    pub device: String,
    pub tenant: Option<String>,
}

/// Per-session limits, and the node's ping counters.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub ping_ms: u64,
    pub idle_ms: u64,
    pub max_message_bytes: usize,
    pub send_queue: usize,
    pub send_queue_bytes: usize,
    pub pings_sent: Counter,
    pub pongs_received: Counter,
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The server closed with this code.
    Closed(u16),
    /// The peer closed or the connection dropped.
    Peer,
    /// The upgrade itself failed.
    UpgradeFailed,
}

fn text(s: String) -> Frame<'static> {
    Frame::text(Payload::Owned(s.into_bytes()))
}

/// The receiver of the up lane, once the reader opened it.
type AnswerSlot = Mutex<Option<mpsc::Receiver<Box<Answer>>>>;

fn lock(slot: &AnswerSlot) -> std::sync::MutexGuard<'_, Option<mpsc::Receiver<Box<Answer>>>> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// The next answer on the lane; pending while no lane is open. The lock is held only inside
/// `poll`, never across an await.
fn next_answer(slot: &AnswerSlot) -> impl std::future::Future<Output = Option<Box<Answer>>> + '_ {
    std::future::poll_fn(move |cx| match lock(slot).as_mut() {
        Some(rx) => rx.poll_recv(cx),
        None => std::task::Poll::Pending,
    })
}

/// Resolves when the timer (if any) fires; pending forever without one.
async fn fired(timer: &mut Option<Pin<Box<Sleep>>>) {
    match timer {
        Some(t) => t.as_mut().await,
        None => std::future::pending().await,
    }
}

/// How writing a batch of frames ended.
enum Wrote {
    /// All written; go on.
    Ok,
    /// A close frame was written, or a write failed or timed out.
    Over,
    /// The mailbox overflowed while a write was blocked: the socket is mid-frame.
    Stuck,
    /// A kick was not written within [`KICK_GRACE`]: end with this code.
    Kicked(u16),
}

/// Writes `frames` in order. Boxed by its caller: an idle session's future does not carry a
/// write's state.
async fn write_frames<W: tokio::io::AsyncWrite + Unpin>(
    tx: &mut WebSocketWrite<W>,
    frames: Vec<Frame<'static>>,
    mailbox: (&CancellationToken, &CancellationToken, &mut queue::Receiver<Control>),
    write_timeout: Duration,
) -> Wrote {
    let (overflow, kicked, ctl_rx) = mailbox;
    for frame in frames {
        let is_close = frame.opcode == OpCode::Close;
        let written = tokio::select! {
            r = tokio::time::timeout(write_timeout, tx.write_frame(frame)) => r,
            // A device that stopped reading blocks the write itself: its queue overflowing
            // ends the session now, not after the write timeout, and so does a kick that the
            // write does not finish within KICK_GRACE of. The socket is mid-frame, so no
            // close frame can follow; the device recovers by sync on reconnect.
            _ = overflow.cancelled() => return Wrote::Stuck,
            _ = async { kicked.cancelled().await; tokio::time::sleep(KICK_GRACE).await } => {
                // Ended with the close it was told to send (4001 counts as a kick, and a
                // superseded route is not released).
                let code = std::iter::from_fn(|| ctl_rx.try_recv()).find_map(|ctl| match ctl {
                    Control::Close { code, .. } => Some(code),
                    Control::Goaway { .. } => Some(close::GOING_AWAY),
                    _ => None,
                });
                return Wrote::Kicked(code.unwrap_or(close::TRY_AGAIN_LATER));
            }
        };
        match written {
            Ok(Ok(())) if !is_close => {}
            _ => return Wrote::Over, // echoed the peer's close, or the write failed / stalled
        }
    }
    Wrote::Ok
}

/// Runs the session until it closes. `hello` is the first frame sent (its JSON).
///
/// One task drives both halves: the reader is a future pinned here and polled, by reference,
/// as one branch of the loop's `select!`, so it is never dropped mid-frame while the session
/// lives (it is dropped with the session, as an aborted reader task was). What is rarely awaited
/// (writes, sync pages, the close) is boxed, so that an idle session's future stays small.
pub async fn run(
    upgrade: UpgradeFut,
    hello: String,
    mailbox: Mailbox,
    mut cursor: StreamCursor,
    cfg: SessionConfig,
    ups: Ups,
) -> Ended {
    let Mailbox { tx: ctl_tx, rx: mut ctl_rx, overflow, kicked, queued } = mailbox;
    let ws = match upgrade.await {
        Ok(ws) => ws,
        Err(e) => {
            tracing::debug!(error = %e, "websocket upgrade failed");
            return Ended::UpgradeFailed;
        }
    };
    // fastwebsockets writes; the device's frames are read by our own reader, which holds no
    // buffer between frames (fastwebsockets' read half, and its 8 KiB, is dropped right here).
    let (rx, mut tx) = {
        let read_half = std::cell::Cell::new(None);
        let (_unused, tx) = ws.split(|io| {
            let (r, w) = tokio::io::split(io);
            read_half.set(Some(r));
            (tokio::io::empty(), w)
        });
        let r = read_half.take().expect("split hands over the read half");
        // A frame of exactly the limit is refused; the whole-message bound is in read_loop.
        (FrameReader::new(r, cfg.max_message_bytes + 1), tx)
    };
    let started = Instant::now();
    let last_seen_ms = AtomicU64::new(0);
    let answers: AnswerSlot = Mutex::new(None);
    // The reader's replies (pongs, answers, the close echo), bounded: the reader waits for room.
    let (out_tx, mut out_rx) = queue::bounded::<Frame<'static>>(cfg.send_queue.max(4));
    let seen = (&answers, &last_seen_ms, &cfg.pongs_received);
    let reading = read_loop(rx, out_tx, ctl_tx, ups, seen, started, cfg.max_message_bytes);
    tokio::pin!(reading);
    let mut read_done = false;

    let write_timeout = Duration::from_millis(cfg.idle_ms.max(1000));
    let mut ended = Ended::Peer;
    let mut ping = tokio::time::interval(Duration::from_millis(cfg.ping_ms.max(10)));
    ping.tick().await;
    let mut close_with: Option<(u16, String)> = None;
    let mut stuck = false;
    if Box::pin(tokio::time::timeout(write_timeout, tx.write_frame(text(hello)))).await.map_or(true, |r| r.is_err()) {
        return Ended::Peer;
    }
    // Live pushes wait this long for the device's first sync (see StreamCursor::stop_waiting).
    let mut sync_grace = Some(Box::pin(tokio::time::sleep(SYNC_GRACE)));
    // A sync the page budget refused waits here; the device is told once per pause streak.
    let mut sync_resume: Option<Pin<Box<Sleep>>> = None;
    let mut busy_told = false;
    'session: loop {
        if !cursor.awaiting_sync() {
            sync_grace = None;
        }
        // The sync page being written holds its bytes of the node's budget until the writes end.
        let mut page_permit = None;
        let sync_paused = sync_resume.is_some();
        // Biased: a close the reader asked for must win over the reader's channel closing; the
        // reader comes before the up answers (it opens their lane) and before the sync pages (a
        // long sync must not starve it).
        let frames: Vec<Frame<'static>> = tokio::select! {
            biased;
            _ = overflow.cancelled() => {
                close_with = Some((close::TRY_AGAIN_LATER, "send queue full: reconnect and sync".into()));
                break;
            }
            ctl = ctl_rx.recv() => match ctl {
                Some(Control::Close { code, reason }) => {
                    close_with = Some((code, reason));
                    break;
                }
                Some(Control::Goaway { reason }) => {
                    let goaway = text(ServerFrame::Goaway { reason: reason.clone() }.to_json());
                    let _ = Box::pin(tokio::time::timeout(write_timeout, tx.write_frame(goaway))).await;
                    close_with = Some((close::GOING_AWAY, reason));
                    break;
                }
                Some(Control::Deliver { seq, payload }) => {
                    queued.fetch_sub(payload.len(), Ordering::Relaxed);
                    let frame = cursor.deliver(seq, &payload);
                    if cursor.over_budget() {
                        close_with = Some((close::TRY_AGAIN_LATER, "send queue full: reconnect and sync".into()));
                        break;
                    }
                    frame.map(text).into_iter().collect()
                }
                Some(Control::Sync { after }) => {
                    cursor.request_sync(after);
                    continue;
                }
                Some(Control::CatchUp) => {
                    cursor.catch_up();
                    continue;
                }
                Some(Control::Ack { seq }) => {
                    cursor.ack(seq);
                    continue;
                }
                None => break,
            },
            out = out_rx.recv() => match out {
                Some(f) => vec![f],
                // The reader ended: the peer closed, the connection dropped, or the reader just
                // asked for a close (1008/1009) that must still be sent.
                None => match ctl_rx.try_recv() {
                    Some(Control::Close { code, reason }) => {
                        close_with = Some((code, reason));
                        break;
                    }
                    _ => break,
                },
            },
            // The reader returns when the peer closed or the connection failed; its sender
            // dropped, `out` then ends the loop (after what it queued).
            () = &mut reading, if !read_done => {
                read_done = true;
                continue;
            }
            // Taking the answer frees its slot of the device's in-flight bound.
            Some(answer) = next_answer(&answers) => vec![text(answer.frame.to_json())],
            _ = ping.tick() => {
                let idle = (started.elapsed().as_millis() as u64).saturating_sub(last_seen_ms.load(Ordering::Relaxed));
                if idle > cfg.idle_ms {
                    close_with = Some((close::NORMAL, "idle timeout".into()));
                    break;
                }
                cursor.flush_ack();
                cfg.pings_sent.inc();
                vec![Frame::new(true, OpCode::Ping, None, Payload::Owned(Vec::new()))]
            }
            _ = fired(&mut sync_grace), if cursor.awaiting_sync() => {
                sync_grace = None;
                cursor.stop_waiting().into_iter().map(text).collect()
            }
            // Lowest priority: the next page of a sync, between everything else.
            _ = fired(&mut sync_resume), if sync_paused => {
                sync_resume = None;
                continue;
            }
            _ = std::future::ready(()), if cursor.syncing() && !sync_paused => match Box::pin(cursor.sync_page()).await {
                Page::Frames(frames, permit) => {
                    page_permit = permit;
                    busy_told = false;
                    frames.into_iter().map(text).collect()
                }
                Page::Busy => {
                    let wait = cursor.retry_after(started.elapsed().as_nanos() as u64);
                    sync_resume = Some(Box::pin(tokio::time::sleep(wait)));
                    if std::mem::replace(&mut busy_told, true) {
                        continue;
                    }
                    vec![text(ServerFrame::SyncBusy { retry_after_ms: wait.as_millis() as u64 }.to_json())]
                }
            },
        };
        match Box::pin(write_frames(&mut tx, frames, (&overflow, &kicked, &mut ctl_rx), write_timeout)).await {
            Wrote::Ok => {}
            Wrote::Over => break 'session,
            Wrote::Stuck => {
                stuck = true;
                break 'session;
            }
            Wrote::Kicked(code) => {
                cursor.flush_ack();
                return Ended::Closed(code);
            }
        }
        drop(page_permit);
    }
    cursor.flush_ack();
    if stuck {
        return Ended::Closed(close::TRY_AGAIN_LATER);
    }
    let closing = async {
        if let Some((code, reason)) = close_with {
            let _ = tokio::time::timeout(write_timeout, tx.write_frame(Frame::close(code, reason.as_bytes()))).await;
            ended = Ended::Closed(code);
        }
        let _ = tokio::time::timeout(write_timeout, tx.flush()).await;
        // Give the peer a moment to echo our close (the reader returns on it), then drop the
        // connection; the reader may be blocked in `read_frame`, so it is dropped, not awaited
        // forever.
        if ended != Ended::Peer && !read_done {
            let _ = tokio::time::timeout(CLOSE_LINGER, reading.as_mut()).await;
        }
        ended
    };
    Box::pin(closing).await
}

/// How long a closing session waits for the peer's close echo.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// How long live pushes wait for a device's first `sync` after `hello`.
const SYNC_GRACE: Duration = Duration::from_secs(1);

/// How long a write may still take after a kick before the connection is dropped unclosed.
const KICK_GRACE: Duration = Duration::from_millis(250);

/// Most frames one fragmented message may take (a flood of empty continuations is refused).
const MAX_FRAGMENTS: usize = 1024;

/// Reassembles messages from the raw read half, bounding the whole message (not just each frame)
/// by `max_bytes` and its number of fragments by [`MAX_FRAGMENTS`]. After asking the writer to
/// close, it keeps reading and discarding until the peer's close echo, so that the close frame is
/// not lost to a TCP reset caused by unread data. Opens the up lane on the first `up` and puts
/// its receiver in `answers`. Yields after each message it hands to the mailbox, so that the
/// session loop (in the same task) drains it between a flood's frames.
async fn read_loop<S>(
    mut rx: FrameReader<S>,
    out: queue::Sender<Frame<'static>>,
    ctl: queue::Sender<Control>,
    mut ups: Ups,
    (answers, last_seen_ms, pongs): (&AnswerSlot, &AtomicU64, &Counter),
    started: Instant,
    max_bytes: usize,
) where
    S: tokio::io::AsyncRead + Unpin,
{
    let request_close = |code: u16, reason: &str| {
        let _ = ctl.try_send(Control::Close { code, reason: reason.to_string() });
    };
    let mut lane: Option<Lane> = None;
    let mut partial: Option<(OpCode, Vec<u8>, usize)> = None;
    let mut closing = false;
    loop {
        let frame = match rx.read_frame().await {
            Ok(f) => f,
            // The stream is mid-frame after these: nothing more can be parsed.
            Err(WebSocketError::FrameTooLarge) => {
                request_close(close::TOO_BIG, "message too large");
                return;
            }
            Err(WebSocketError::ConnectionClosed)
            | Err(WebSocketError::UnexpectedEOF)
            | Err(WebSocketError::IoError(_)) => {
                return;
            }
            Err(e) => {
                request_close(close::POLICY, &e.to_string());
                return;
            }
        };
        last_seen_ms.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        if frame.opcode == OpCode::Pong {
            pongs.inc();
        }
        if frame.opcode == OpCode::Close {
            // Echoed (or this is the echo of ours: the writer stops after its own close).
            match close_echo(&frame.payload) {
                Ok(echo) => {
                    let _ = out.send(echo).await;
                }
                Err(e) => request_close(close::POLICY, &e.to_string()),
            }
            return;
        }
        if closing {
            continue;
        }
        match message(frame, &mut partial, max_bytes) {
            Ok(None) => {}
            Ok(Some(Incoming::Ping(payload))) => {
                // Waits for room: a device that does not read its pongs stops being read.
                if out.send(Frame::pong(Payload::Owned(payload))).await.is_err() {
                    return;
                }
            }
            Ok(Some(Incoming::Text(bytes))) => {
                let reply = match std::str::from_utf8(&bytes) {
                    Err(_) => {
                        request_close(close::POLICY, "text message is not UTF-8");
                        closing = true;
                        continue;
                    }
                    Ok(text) => match serde_json::from_str::<ClientFrame>(text) {
                        Ok(ClientFrame::Ping) => ServerFrame::Pong,
                        // The session loop owns the stream cursor: hand these over (dropped if
                        // its queue is full — a device flooding syncs gets no more than that).
                        Ok(ClientFrame::Sync { after }) => {
                            let _ = ctl.try_send(Control::Sync { after });
                            tokio::task::yield_now().await;
                            continue;
                        }
                        Ok(ClientFrame::Ack { seq }) => {
                            let _ = ctl.try_send(Control::Ack { seq });
                            tokio::task::yield_now().await;
                            continue;
                        }
                        // Admitted ups are answered later on the lane; refusals right here.
                        Ok(ClientFrame::Up { id, payload }) => {
                            let lane = lane.get_or_insert_with(|| {
                                let (lane, rx) = ups.service.lane(&ups.device, ups.tenant.take());
                                *lock(answers) = Some(rx);
                                lane
                            });
                            match ups.service.submit(lane, id, &payload) {
                                Some(refusal) => refusal,
                                None => continue,
                            }
                        }
                        Err(e) => ServerFrame::Error { error: unknown_frame(&e) },
                    },
                };
                // Waits for room: a device that does not read its replies stops being read (its
                // writes then stall in its own socket buffers, not in this node's memory).
                if out.send(text(reply.to_json())).await.is_err() {
                    return;
                }
            }
            Err((code, reason)) => {
                request_close(code, reason);
                closing = true;
            }
        }
    }
}

/// The reply to a text message that is not a known frame: where and what kind of error, never the
/// device's own text (serde's messages quote unknown variants and field values).
fn unknown_frame(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let what = match e.classify() {
        Category::Syntax | Category::Eof => "not JSON",
        Category::Data => "not a known frame (ping, sync, ack, up with an id and a payload)",
        Category::Io => "unreadable",
    };
    format!("unknown frame: {what} (line {}, column {})", e.line(), e.column())
}

/// The echo of a device's close frame: its code alone (never its reason: nothing a device sends
/// is quoted back), or why the frame is refused (RFC 6455 §5.5.1, §7.4).
fn close_echo(payload: &[u8]) -> Result<Frame<'static>, WebSocketError> {
    match payload {
        [] => Ok(Frame::close_raw(Payload::Owned(Vec::new()))),
        [_] => Err(WebSocketError::InvalidCloseFrame),
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            if std::str::from_utf8(reason).is_err() {
                Err(WebSocketError::InvalidUTF8)
            } else if !fastwebsockets::CloseCode::from(code).is_allowed() {
                Err(WebSocketError::InvalidCloseCode)
            } else {
                Ok(Frame::close(code, &[]))
            }
        }
    }
}

/// A complete thing the device said.
enum Incoming {
    Ping(Vec<u8>),
    Text(Vec<u8>),
}

/// Folds one frame into the message being reassembled; `Err` is the close to send.
fn message(
    frame: InFrame,
    partial: &mut Option<(OpCode, Vec<u8>, usize)>,
    max_bytes: usize,
) -> Result<Option<Incoming>, (u16, &'static str)> {
    let complete = match (frame.opcode, partial.take()) {
        (OpCode::Ping, p) => {
            *partial = p;
            return Ok(Some(Incoming::Ping(frame.payload)));
        }
        (OpCode::Pong, p) => {
            *partial = p;
            return Ok(None);
        }
        (OpCode::Text | OpCode::Binary, None) if frame.fin => (frame.opcode, frame.payload),
        (OpCode::Text | OpCode::Binary, None) => {
            *partial = Some((frame.opcode, frame.payload, 1));
            return Ok(None);
        }
        (OpCode::Continuation, Some((op, mut buf, n))) => {
            buf.extend_from_slice(&frame.payload);
            if buf.len() > max_bytes {
                return Err((close::TOO_BIG, "message too large"));
            }
            if n + 1 > MAX_FRAGMENTS {
                return Err((close::POLICY, "too many fragments"));
            }
            if !frame.fin {
                *partial = Some((op, buf, n + 1));
                return Ok(None);
            }
            (op, buf)
        }
        _ => return Err((close::POLICY, "unexpected continuation or interleaved message")),
    };
    match complete {
        (OpCode::Text, bytes) => Ok(Some(Incoming::Text(bytes))),
        _ => Err((close::POLICY, "binary frames are not supported")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_is_echoed_with_its_code_alone() {
        let payload = |f: Frame<'static>| f.payload.to_vec();
        assert_eq!(payload(close_echo(&[]).unwrap()), Vec::<u8>::new());
        let mut from_device = 1000u16.to_be_bytes().to_vec();
        from_device.extend_from_slice(b"bye from <script>");
        assert_eq!(payload(close_echo(&from_device).unwrap()), 1000u16.to_be_bytes());
        assert!(matches!(close_echo(&[3]), Err(WebSocketError::InvalidCloseFrame)));
        assert!(matches!(close_echo(&[0x03, 0xe8, 0xff]), Err(WebSocketError::InvalidUTF8)));
        // 1005 and 1006 are never sent on the wire; 999 is not a close code.
        for code in [1005u16, 1006, 999] {
            assert!(matches!(close_echo(&code.to_be_bytes()), Err(WebSocketError::InvalidCloseCode)), "{code}");
        }
    }
}
