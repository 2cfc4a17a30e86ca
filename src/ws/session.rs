//! One device session after the upgrade: a reader task and a writer task. `read_frame` is not
//! cancel-safe, so the reader never sits in a `select!`; every frame it must answer (pong, close
//! echo) goes through the writer's queue. The writer pings every `ping_ms`, closes after `idle_ms`
//! without traffic, and obeys [`Control`] commands (kicks, drain, fencing).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fastwebsockets::upgrade::UpgradeFut;
use fastwebsockets::{FragmentCollectorRead, Frame, OpCode, Payload, WebSocketError};
use tokio::sync::mpsc;

use super::registry::Control;
use crate::protocol::{close, ClientFrame, ServerFrame};

/// Per-session limits.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub ping_ms: u64,
    pub idle_ms: u64,
    pub max_message_bytes: usize,
    pub send_queue: usize,
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

fn owned(f: Frame<'_>) -> Frame<'static> {
    Frame::new(f.fin, f.opcode, None, Payload::Owned(f.payload.to_vec()))
}

fn text(s: String) -> Frame<'static> {
    Frame::text(Payload::Owned(s.into_bytes()))
}

/// Runs the session until it closes. `hello` is the first frame sent.
pub async fn run(
    upgrade: UpgradeFut,
    hello: ServerFrame,
    ctl_tx: mpsc::Sender<Control>,
    mut ctl_rx: mpsc::Receiver<Control>,
    cfg: SessionConfig,
) -> Ended {
    let mut ws = match upgrade.await {
        Ok(ws) => ws,
        Err(e) => {
            tracing::debug!(error = %e, "websocket upgrade failed");
            return Ended::UpgradeFailed;
        }
    };
    ws.set_max_message_size(cfg.max_message_bytes);
    ws.set_auto_close(true);
    ws.set_auto_pong(true);
    let (rx, mut tx) = ws.split(tokio::io::split);
    let started = Instant::now();
    let last_seen_ms = Arc::new(AtomicU64::new(0));
    let (out_tx, mut out_rx) = mpsc::channel::<Frame<'static>>(cfg.send_queue.max(4));
    let reader = tokio::spawn(read_loop(FragmentCollectorRead::new(rx), out_tx, ctl_tx, last_seen_ms.clone(), started));

    let write_timeout = Duration::from_millis(cfg.idle_ms.max(1000));
    let mut ended = Ended::Peer;
    let mut ping = tokio::time::interval(Duration::from_millis(cfg.ping_ms.max(10)));
    ping.tick().await;
    let mut close_with: Option<(u16, String)> = None;
    if tokio::time::timeout(write_timeout, tx.write_frame(text(hello.to_json()))).await.map_or(true, |r| r.is_err()) {
        reader.abort();
        return Ended::Peer;
    }
    loop {
        let frame = tokio::select! {
            ctl = ctl_rx.recv() => match ctl {
                Some(Control::Close { code, reason }) => {
                    close_with = Some((code, reason));
                    break;
                }
                Some(Control::Goaway { reason }) => {
                    let _ = tokio::time::timeout(write_timeout, tx.write_frame(text(ServerFrame::Goaway { reason: reason.clone() }.to_json()))).await;
                    close_with = Some((close::GOING_AWAY, reason));
                    break;
                }
                None => break,
            },
            out = out_rx.recv() => match out {
                Some(f) => f,
                None => break, // the reader ended: the peer closed or the connection dropped
            },
            _ = ping.tick() => {
                let idle = started.elapsed().as_millis() as u64 - last_seen_ms.load(Ordering::Relaxed);
                if idle > cfg.idle_ms {
                    close_with = Some((close::NORMAL, "idle timeout".into()));
                    break;
                }
                Frame::new(true, OpCode::Ping, None, Payload::Owned(Vec::new()))
            }
        };
        let is_close = frame.opcode == OpCode::Close;
        match tokio::time::timeout(write_timeout, tx.write_frame(frame)).await {
            Ok(Ok(())) if !is_close => {}
            _ => break, // echoed the peer's close, or the write failed / stalled
        }
    }
    if let Some((code, reason)) = close_with {
        let _ = tokio::time::timeout(write_timeout, tx.write_frame(Frame::close(code, reason.as_bytes()))).await;
        ended = Ended::Closed(code);
    }
    let _ = tokio::time::timeout(write_timeout, tx.flush()).await;
    // The reader may be blocked in `read_frame`; the connection is being dropped, so aborting is safe.
    reader.abort();
    ended
}

async fn read_loop<S>(
    mut rx: FragmentCollectorRead<S>,
    out: mpsc::Sender<Frame<'static>>,
    ctl: mpsc::Sender<Control>,
    last_seen_ms: Arc<AtomicU64>,
    started: Instant,
) where
    S: tokio::io::AsyncRead + Unpin,
{
    let closing = |code: u16, reason: &str| Control::Close { code, reason: reason.to_string() };
    loop {
        let out2 = out.clone();
        let mut obligated = move |f: Frame<'_>| {
            let (out, f) = (out2.clone(), owned(f));
            async move { out.send(f).await.map_err(|_| WebSocketError::ConnectionClosed) }
        };
        let frame = match rx.read_frame(&mut obligated).await {
            Ok(f) => f,
            Err(WebSocketError::FrameTooLarge) => {
                let _ = ctl.try_send(closing(close::TOO_BIG, "message too large"));
                return;
            }
            Err(WebSocketError::ConnectionClosed)
            | Err(WebSocketError::UnexpectedEOF)
            | Err(WebSocketError::IoError(_)) => {
                return;
            }
            Err(e) => {
                let _ = ctl.try_send(closing(close::POLICY, &e.to_string()));
                return;
            }
        };
        last_seen_ms.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        match frame.opcode {
            OpCode::Text => {
                let reply = match serde_json::from_slice::<ClientFrame>(&frame.payload) {
                    Ok(ClientFrame::Ping) => ServerFrame::Pong,
                    Err(e) => ServerFrame::Error { error: format!("unknown frame: {e}") },
                };
                // A device that does not read its replies fills its queue: drop the reply rather
                // than grow memory.
                let _ = out.try_send(text(reply.to_json()));
            }
            OpCode::Binary => {
                let _ = ctl.try_send(closing(close::POLICY, "binary frames are not supported"));
                return;
            }
            OpCode::Close => return, // auto-close queued the echo
            _ => {}
        }
    }
}
