//! A node's serving lifecycle on the `Mode` watch: Serving → Draining (V6) and Serving ⇄ Fenced
//! (V7). Drain: refuse handshakes, leave the ring everywhere at once (`Drain`), tell every device
//! (`goaway` + 1001, paced by `drain_rate`), wait for them or `drain_timeout`, then `ReleaseNode`.
//! Fencing: when no lease renewal has committed for `lease - margin` (margin = lease/5), refuse
//! handshakes; close the connections still open `margin/2` later with 1013 (apply events may close them first with
//! 4001/4002); when a renewal commits again, close every connection whose route was taken over or
//! swept, and serve again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::proposer::Proposer;
use crate::protocol::close;
use crate::raft::types::{Command, NodeId};
use crate::ws::registry::Control;
use crate::ws::{self, Gate, Mode};

/// Fencing starts `lease / 5` before the lease could lapse (renewals are timed from when they were
/// sent, before the leader stamps them, so the margin only covers clock-rate drift and delivery);
/// connections still open a further `lease / 10` later (before the lease can lapse) are closed with 1013.
pub const FENCE_MARGIN_DIVISOR: u32 = 5;

/// Drain pacing knobs.
#[derive(Debug, Clone)]
pub struct DrainConfig {
    pub drain_rate: f64,
    pub drain_timeout: Duration,
}

/// Runs the drain to the end; the caller then stops the process.
pub async fn drain(me: NodeId, gate: &Gate, mode: &watch::Sender<Mode>, proposer: &Proposer, cfg: &DrainConfig) {
    let started = Instant::now();
    mode.send_replace(Mode::Draining);
    tracing::info!("draining: refusing new handshakes");
    match proposer.propose(Command::Drain { node: me, at_ms: 0 }).await {
        Ok(_) => tracing::info!("draining: left the ring"),
        Err(e) => {
            tracing::warn!(error = %e, "draining: could not commit Drain; leaving the ring when the lease lapses")
        }
    }
    let deadline = tokio::time::Instant::now() + cfg.drain_timeout;
    let sessions = gate.registry.sessions();
    let total = sessions.len();
    let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / cfg.drain_rate.max(0.001)));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for s in sessions {
        let conn = s.conn;
        if tokio::time::timeout_at(deadline, pace.tick()).await.is_err() {
            break;
        }
        gate.registry.send(conn, Control::Goaway { reason: "drain".into() });
        gate.metrics.drained.inc();
    }
    while !gate.registry.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = gate.registry.len();
    match proposer.propose(Command::ReleaseNode { node: me }).await {
        Ok(_) => tracing::info!(total, left, elapsed = ?started.elapsed(), "drained: released this node's routes"),
        Err(e) => tracing::warn!(error = %e, "drained, but ReleaseNode did not commit; the lease covers it"),
    }
}

/// A stop without a drain (the node was removed): tell every device to go elsewhere (`goaway` +
/// 1001) instead of dropping its TCP connection, waiting at most `bound` for them to close.
pub async fn say_goodbye(gate: &Gate, bound: Duration) {
    for s in gate.registry.sessions() {
        gate.registry.send(s.conn, Control::Goaway { reason: "stopping".into() });
    }
    let deadline = tokio::time::Instant::now() + bound;
    while !gate.registry.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Watches renewals and fences this node while they fail (V7).
pub async fn fence_loop(
    gate: Arc<Gate>,
    mode: Arc<watch::Sender<Mode>>,
    mut renewed: watch::Receiver<Instant>,
    lease: Duration,
    cancel: CancellationToken,
) {
    let margin = lease / FENCE_MARGIN_DIVISOR;
    let mut tick = tokio::time::interval((lease / 20).max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fenced_at: Option<Instant> = None;
    let mut closed = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
            r = renewed.changed() => if r.is_err() { return },
        }
        let since = renewed.borrow().elapsed();
        // A node outside the membership (standby) holds no lease to lose.
        let member = gate.view.borrow().member(gate.me).is_some();
        let lapsing = member && since > lease - margin;
        let current = *mode.borrow();
        match (current, lapsing, fenced_at) {
            (Mode::Serving, true, _) => {
                tracing::warn!(since_renewal = ?since, "no lease renewal committed: fencing (refusing handshakes)");
                mode.send_replace(Mode::Fenced);
                gate.metrics.fence_events.inc();
                fenced_at = Some(Instant::now());
                closed = false;
            }
            (Mode::Fenced, true, Some(at)) if !closed && at.elapsed() >= margin / 2 => {
                let n = gate.registry.len();
                for s in gate.registry.sessions() {
                    gate.registry.send(
                        s.conn,
                        Control::Close { code: close::TRY_AGAIN_LATER, reason: "node lost quorum".into() },
                    );
                }
                tracing::warn!(connections = n, "fenced: closed connections with 1013");
                closed = true;
            }
            (Mode::Fenced, false, _) => {
                // Back: the apply events have caught up with what happened meanwhile; close
                // whatever still holds a route that is no longer ours.
                ws::reconcile(&gate).await;
                mode.send_replace(Mode::Serving);
                tracing::info!("lease renewal committed again: serving");
                fenced_at = None;
            }
            _ => {}
        }
    }
}
