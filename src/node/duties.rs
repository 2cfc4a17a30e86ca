//! Periodic duties: every node renews its lease every `lease/3`; the leader extends leases on
//! election (before any sweep), records the cluster id, finishes half-done joint configurations and
//! sweeps lapsed leases every `sweep_ms`. A node that sees itself removed from the membership stops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngCore;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::membership;
use crate::cluster::ClusterWatch;
use crate::config::Timing;
use crate::metrics::Metrics;
use crate::proposer::{now_ms, Proposer};
use crate::raft::types::{Command, LeaseState, NodeId, Raft, Reply};
use crate::ws::registry::Registry;
use crate::ws::Mode;

/// Renews this node's lease every `lease/3` while it is a member. The renewal carries this
/// node's connection count (placement's load overlay reads it) and whether it is draining.
pub struct Renewer {
    pub me: NodeId,
    pub proposer: Proposer,
    pub view: ClusterWatch,
    pub lease_ms: u64,
    pub sessions: Registry,
    pub mode: watch::Receiver<Mode>,
    /// When the last committed renewal was sent (fencing measures from it).
    pub renewed: watch::Sender<Instant>,
    /// Random per process start (see `Command::Renew`).
    pub incarnation: u64,
}

impl Renewer {
    pub async fn run(mut self, cancel: CancellationToken) {
        let period = Duration::from_millis((self.lease_ms / 3).max(1));
        let mut next = tokio::time::Instant::now();
        let mut failing = false;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
                // A node that just became a member renews at once instead of a period later.
                r = self.view.changed(), if self.awaiting_first_lease() => if r.is_err() { return },
            }
            if self.view.borrow().member(self.me).is_none() {
                next = tokio::time::Instant::now() + period;
                continue;
            }
            next = tokio::time::Instant::now() + period;
            let connections = self.sessions.len() as u64;
            // A draining node keeps renewing (it is alive) but stays out of the ring.
            let draining = *self.mode.borrow() == Mode::Draining;
            let sent_at = Instant::now();
            let cmd = Command::Renew {
                node: self.me,
                at_ms: 0,
                lease_ms: self.lease_ms,
                connections,
                draining,
                incarnation: self.incarnation,
            };
            match self.proposer.propose_within(cmd, period).await {
                // The lease runs from about when the renewal was sent: fencing measures from there.
                Ok(_) => {
                    self.renewed.send_replace(sent_at);
                    if std::mem::take(&mut failing) {
                        tracing::info!("lease renewals commit again");
                    }
                }
                Err(e) => {
                    // Retry soon rather than a period later: after a leader dies, the first
                    // renewal that can commit must not wait out a whole period (fencing counts).
                    next = tokio::time::Instant::now() + period / 8;
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(error = %e, "lease renewal did not commit; retrying every {:?}", period / 8);
                    }
                }
            }
        }
    }

    /// True while this node has no lease row yet (a fresh member, or not a member at all).
    fn awaiting_first_lease(&self) -> bool {
        self.view.borrow().lease(self.me).is_none()
    }
}

/// The leader's duties; idle on followers.
pub async fn leader_loop(
    me: NodeId,
    raft: Raft,
    proposer: Proposer,
    view: ClusterWatch,
    timing: Timing,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(timing.sweep_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut extended_term = None;
    let op_timeout = Duration::from_millis(timing.propose_timeout_ms);
    let mut raft_metrics = raft.metrics();
    loop {
        // Wake on the sweep tick, and as soon as this node becomes leader of a new term (so leases
        // are extended and the cluster id recorded without waiting a sweep period).
        let swept_tick = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => true,
            r = raft_metrics.changed() => {
                if r.is_err() {
                    return;
                }
                let m = raft_metrics.borrow_and_update();
                if m.current_leader != Some(me) || extended_term == Some(m.current_term) {
                    continue;
                }
                false
            }
        };
        let (leader, term) = {
            let m = raft.metrics().borrow().clone();
            (m.current_leader, m.current_term)
        };
        if leader != Some(me) {
            extended_term = None;
            continue;
        }
        if extended_term != Some(term) {
            // Push every live lease past the election gap before this term's first sweep.
            let extend = Command::ExtendLeases { at_ms: 0, lease_ms: timing.lease_ms };
            match proposer.propose_local(extend).await {
                Ok(_) => {
                    tracing::info!(term, "leader: leases extended, sweeping from now on");
                    extended_term = Some(term);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader: extending leases failed");
                    continue;
                }
            }
            if view.borrow().meta.cluster_id.is_none() {
                let mut raw = [0u8; 16];
                rand::thread_rng().fill_bytes(&mut raw);
                let cluster_id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
                if let Err(e) = proposer.propose(Command::Init { cluster_id }).await {
                    tracing::warn!(error = %e, "leader: recording the cluster id failed");
                }
            }
            match membership::finish_joint(&raft, op_timeout).await {
                Ok(true) => tracing::info!("leader: finished a joint membership change left by a previous leader"),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader: finishing a joint membership change failed"),
            }
            continue;
        }
        if swept_tick {
            sweep(&proposer, &view, &metrics).await;
        }
    }
}

async fn sweep(proposer: &Proposer, view: &ClusterWatch, metrics: &Metrics) {
    let now = now_ms();
    let candidates: Vec<NodeId> = view
        .borrow()
        .meta
        .nodes
        .iter()
        .filter(|(_, l)| l.state != LeaseState::Expired && l.lease_until_ms < now)
        .map(|(id, _)| *id)
        .collect();
    if candidates.is_empty() {
        return;
    }
    match proposer.propose_local(Command::Sweep { at_ms: 0, grace_ms: 0, candidates }).await {
        Ok(Reply::Swept { expired, routes_deleted }) if !expired.is_empty() => {
            metrics.nodes_expired.inc_by(expired.len() as u64);
            tracing::info!(?expired, routes_deleted, "leader: swept lapsed leases");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "leader: sweep did not commit"),
    }
}

/// Cancels `cancel` once this node, having been a member, is no longer in the applied membership.
pub async fn watch_removal(me: NodeId, mut view: ClusterWatch, cancel: CancellationToken) {
    let mut was_member = false;
    loop {
        let is_member = view.borrow_and_update().member(me).is_some();
        if was_member && !is_member {
            tracing::warn!("this node was removed from the cluster membership; stopping");
            cancel.cancel();
            return;
        }
        was_member |= is_member;
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = view.changed() => if r.is_err() { return },
        }
    }
}
