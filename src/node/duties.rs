//! Periodic duties: every node renews its lease every `lease/5`; the leader extends leases on
//! election (before any sweep), records the cluster id, finishes half-done joint configurations
//! and sweeps lapsed leases every `sweep_ms` (its failure detector is [`super::detector`]). A
//! node that sees itself removed from the membership stops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngCore;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cluster::{ClusterWatch, Handle};
use crate::config::Timing;
use crate::machine::{LeaseState, NodeId, Renew};
use crate::metrics::Metrics;
use crate::ws::registry::Registry;
use crate::ws::Gate;
use crate::ws::Mode;

use super::detector;

/// Renewals per lease. A node fences itself when none of its renewals committed for 4/5 of a lease,
/// and a leader's death costs up to one renewal period (the last renewal went out just before it)
/// plus the election plus the new leader's first commits: at lease/3 the minimum lease (8 election
/// timeouts) left 3.7 election timeouts for an election that can take 4, and a leader kill under
/// load (57,000 devices) fenced every survivor. At lease/5 it leaves 4.8.
pub const RENEWALS_PER_LEASE: u64 = 5;

/// How often a node renews a lease of `lease_ms`.
pub fn renew_period(lease_ms: u64) -> Duration {
    Duration::from_millis((lease_ms / RENEWALS_PER_LEASE).max(1))
}

/// Renews this node's lease every [`renew_period`] while it is a member. The renewal carries this
/// node's connection count (placement's load overlay reads it) and whether it is draining.
pub struct Renewer {
    pub cluster: Handle,
    pub view: ClusterWatch,
    pub lease_ms: u64,
    pub sessions: Registry,
    pub mode: watch::Receiver<Mode>,
    /// When the last committed renewal was sent (fencing measures from it).
    pub renewed: watch::Sender<Instant>,
    /// Random per process start (see [`Renew`]).
    pub incarnation: u64,
    /// `--capacity-connections`: published once it differs from the applied value.
    pub capacity_connections: u64,
    /// The registry's hard limit (`--max-connections`, or derived): published the same way, so
    /// that placement on every node stops sending devices here once the renewed count reaches it.
    pub max_connections: u64,
    pub metrics: Arc<Metrics>,
}

/// Renewals a node keeps in flight at most while they fail to commit (one every period/8, each
/// awaited for two periods).
const MAX_RENEWALS_IN_FLIGHT: usize = 16;

impl Renewer {
    pub async fn run(mut self, cancel: CancellationToken) {
        let period = renew_period(self.lease_ms);
        let mut next = tokio::time::Instant::now();
        let mut failing = false;
        // Each renewal is awaited on its own task: one that commits after the next went out still
        // counts, from its own send time. Awaited in turn, a renewal held up behind a new
        // leader's first commits was given up a moment before it committed, and the node fenced
        // with its lease extended (a 57,000-device leader kill: renewals committed again 0.7 s
        // after the survivors fenced, and one closed 15,444 connections).
        let mut in_flight: JoinSet<(Instant, Result<(), String>)> = JoinSet::new();
        // Until one commits, each renewal is this process's first ([`crate::machine::FirstRenew`]:
        // it deletes the routes a previous process of this node left); later ones follow it.
        let mut first = true;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                Some(done) = in_flight.join_next() => {
                    let Ok((sent_at, result)) = done else { continue };
                    match result {
                        // The lease runs from after the renewal was sent: fencing measures from there.
                        Ok(()) => {
                            first = false;
                            self.metrics.renewal_seconds.observe(sent_at.elapsed().as_secs_f64());
                            self.renewed.send_if_modified(|at| (sent_at > *at).then(|| *at = sent_at).is_some());
                            if std::mem::take(&mut failing) {
                                tracing::info!("lease renewals commit again");
                                next = tokio::time::Instant::now() + period;
                            }
                            self.publish_limits().await;
                        }
                        Err(e) => {
                            // Retry soon rather than a period later: after a leader dies, the first
                            // renewal that can commit must not wait out a whole period (fencing counts).
                            next = next.min(tokio::time::Instant::now() + period / 8);
                            if !std::mem::replace(&mut failing, true) {
                                tracing::warn!(error = %e, "lease renewal did not commit; retrying every {:?}", period / 8);
                            }
                        }
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(next) => {}
                // A node that just became a member renews at once instead of a period later.
                r = self.view.changed(), if self.awaiting_first_lease() => if r.is_err() { return },
            }
            next = tokio::time::Instant::now() + if failing { period / 8 } else { period };
            if self.view.borrow().member(self.cluster.me()).is_none() || in_flight.len() >= MAX_RENEWALS_IN_FLIGHT {
                continue;
            }
            // A node whose store stopped answering is fenced and suspected (it answers the
            // leader's probes 503); a renewal of its own would make it live again, in the ring,
            // while it can deliver nothing. Its lease lapses if the stall outlasts it.
            if self.metrics.store_writes.is_stalled() {
                next = tokio::time::Instant::now() + period / 8;
                continue;
            }
            // A draining node keeps renewing (it is alive) but stays out of the ring.
            let renew = Renew {
                node: self.cluster.me(),
                at_ms: 0,
                lease_ms: self.lease_ms,
                connections: self.sessions.len() as u64,
                draining: *self.mode.borrow() == Mode::Draining,
                incarnation: self.incarnation,
            };
            let (cluster, sent_at) = (self.cluster.clone(), Instant::now());
            in_flight.spawn(
                async move {
                    let renewed = if first {
                        cluster.renew_first(renew, 2 * period).await.map(|routes| {
                            if routes > 0 {
                                tracing::info!(routes, "released the routes this node's previous process left");
                            }
                        })
                    } else {
                        cluster.renew(renew, 2 * period).await
                    };
                    (sent_at, renewed.map_err(|e| e.to_string()))
                }
                .in_current_span(),
            );
        }
    }

    /// Publishes `--capacity-connections` and the connection limit where the applied values
    /// differ (a start, a changed flag).
    async fn publish_limits(&self) {
        let me = self.cluster.me();
        let (capacity, limit) = {
            let view = self.view.borrow();
            let applied = |m: &std::collections::BTreeMap<_, u64>| m.get(&me).copied().unwrap_or(0);
            (applied(&view.state.capacity), applied(&view.state.max_connections))
        };
        if capacity != self.capacity_connections {
            match self.cluster.set_capacity(self.capacity_connections).await {
                Ok(()) => tracing::info!(capacity_connections = self.capacity_connections, "capacity published"),
                Err(e) => {
                    tracing::warn!(error = %e, "publishing the capacity did not commit; retrying with the next renewal")
                }
            }
        }
        if limit != self.max_connections {
            match self.cluster.set_max_connections(self.max_connections).await {
                Ok(()) => tracing::info!(max_connections = self.max_connections, "connection limit published"),
                Err(e) => tracing::warn!(
                    error = %e,
                    "publishing the connection limit did not commit; retrying with the next renewal"
                ),
            }
        }
    }

    /// True while this node has no lease row yet (a fresh member, or not a member at all).
    fn awaiting_first_lease(&self) -> bool {
        self.view.borrow().lease(self.cluster.me()).is_none()
    }
}

/// Tests only (fault injection): when set, a new leader proposes one sweep of every unexpired
/// member *before* its term's `ExtendLeases`: the race (a sweep landing in a term ahead of that
/// term's extension) that the machine's term rule must make harmless. It logs what that sweep did.
pub const TEST_SWEEP_BEFORE_EXTEND_ENV: &str = "GATEWAY_TEST_SWEEP_BEFORE_EXTEND";

/// The leader's duties; idle on followers.
pub async fn leader_loop(cluster: Handle, timing: Timing, metrics: Arc<Metrics>, cancel: CancellationToken) {
    let me = cluster.me();
    let sweep_before_extend = std::env::var_os(TEST_SWEEP_BEFORE_EXTEND_ENV).is_some();
    let mut tick = tokio::time::interval(Duration::from_millis(timing.sweep_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut extended_term = None;
    // The term this node leads and when it first saw itself leader of it, for the log.
    let mut leading: Option<(u64, Instant)> = None;
    let mut leadership = cluster.leadership();
    loop {
        // Wake on the sweep tick, and as soon as this node becomes leader of a new term (so leases
        // are extended and the cluster id recorded without waiting a sweep period).
        let swept_tick = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => true,
            changed = leadership.changed() => {
                if !changed {
                    return;
                }
                let (leader, term) = leadership.now();
                if leader != Some(me) || extended_term == Some(term) {
                    continue;
                }
                false
            }
        };
        let (leader, term) = leadership.now();
        if leader != Some(me) {
            extended_term = None;
            continue;
        }
        if extended_term != Some(term) {
            if leading.map(|(t, _)| t) != Some(term) {
                tracing::info!(term, "leader: elected; extending every lease before sweeping");
                leading = Some((term, Instant::now()));
            }
            if sweep_before_extend {
                let view = cluster.view();
                let everyone = view.state.nodes.iter().filter(|(_, l)| l.state != LeaseState::Expired);
                let result = cluster.sweep(everyone.map(|(id, _)| *id).collect()).await;
                tracing::warn!(term, ?result, "test fault: swept before this term's ExtendLeases");
            }
            // Push every live lease past the election gap before this term's first sweep.
            match cluster.extend_leases(timing.lease_ms).await {
                Ok(()) => {
                    let after = leading.map(|(_, at)| at.elapsed());
                    tracing::info!(term, since_elected = ?after, "leader: leases extended, sweeping from now on");
                    extended_term = Some(term);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader: extending leases failed");
                    continue;
                }
            }
            if cluster.view().state.cluster_id.is_none() {
                let mut raw = [0u8; 16];
                rand::thread_rng().fill_bytes(&mut raw);
                let cluster_id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
                if let Err(e) = cluster.init(cluster_id).await {
                    tracing::warn!(error = %e, "leader: recording the cluster id failed");
                }
            }
            finish_joint(&cluster).await;
            continue;
        }
        if swept_tick {
            sweep(&cluster, &metrics).await;
            finish_joint(&cluster).await;
        }
    }
}

/// Settles a joint membership a previous leader, or a change cut short, left behind (at once when
/// elected, then on every sweep tick: a no-op read while the configuration is uniform).
async fn finish_joint(cluster: &Handle) {
    match cluster.finish_joint().await {
        Ok(true) => tracing::info!("leader: finished a joint membership change left unfinished"),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "leader: finishing a joint membership change failed"),
    }
}

async fn sweep(cluster: &Handle, metrics: &Metrics) {
    let now = cluster.now_ms();
    let candidates: Vec<NodeId> = cluster
        .view()
        .state
        .nodes
        .iter()
        .filter(|(_, l)| l.state != LeaseState::Expired && l.lease_until_ms < now)
        .map(|(id, _)| *id)
        .collect();
    if candidates.is_empty() {
        return;
    }
    match cluster.sweep(candidates).await {
        Ok(swept) if !swept.expired.is_empty() => {
            metrics.nodes_expired.inc_by(swept.expired.len() as u64);
            tracing::info!(expired = ?swept.expired, routes_deleted = swept.routes_deleted, "leader: swept lapsed leases");
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

/// Keeps the node's admission bucket at its share of the cluster budget (divided by the live
/// nodes, recomputed with every applied ring change, less the members this node has found gone
/// itself: [`detector::Gone`]), or at `local` (`--admit-rate`, `--admit-burst`) while no budget is
/// set. While a budget is set, members that devices report gone are probed as the reports come,
/// and those held gone are probed again every `heartbeat`.
pub async fn follow_admission(
    gate: Arc<Gate>,
    local: (f64, u32),
    mut view: ClusterWatch,
    heartbeat: Duration,
    cancel: CancellationToken,
) {
    let me = gate.cluster.me();
    let mut gone = detector::Gone::default();
    loop {
        let applied = view.borrow_and_update().clone();
        // Without a cluster budget there is no share to correct: nothing is probed or held.
        let budget = applied.state.admission.is_some();
        if !budget {
            gone = detector::Gone::default();
        }
        gone.follow(&applied, me);
        let want = applied.admission_share(gone.nodes()).unwrap_or(local);
        if gate.admission.current() != want {
            let names: Vec<&str> = gone.nodes().iter().filter_map(|id| applied.member(*id)).map(|m| &*m.name).collect();
            if names.is_empty() {
                tracing::info!(rate_per_s = want.0, burst = want.1, "admission changed");
            } else {
                tracing::info!(
                    rate_per_s = want.0,
                    burst = want.1,
                    gone = ?names,
                    "admission changed: devices report these members gone and their cluster ports refuse connections; their share is taken over before the ring drops them"
                );
            }
            gate.admission.set(want.0, want.1);
        }
        gate.metrics.admission_rate.set(want.0);
        gate.metrics.admission_burst.set(i64::from(want.1));
        gate.metrics.admission_gone.set(gone.nodes().len() as i64);
        let held = !gone.nodes().is_empty();
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = view.changed() => if r.is_err() { return },
            ids = gate.reported.take() => if budget {
                gone.check(&applied, me, ids, heartbeat).await;
            },
            _ = tokio::time::sleep(heartbeat), if held => {
                gone.recheck(&applied, me, heartbeat).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::lifecycle::FENCE_MARGIN_DIVISOR;

    #[test]
    fn a_failover_fits_between_the_last_renewal_and_the_fence() {
        // The shortest lease the config allows is 8 election timeouts; an openraft election
        // can take 4. The last renewal may have gone out a whole period before the leader died.
        for election_ms in [100u64, 400, 1000, 5000] {
            let lease_ms = 8 * election_ms;
            let fence_after_ms = lease_ms - lease_ms / u64::from(FENCE_MARGIN_DIVISOR);
            let worst_ms = renew_period(lease_ms).as_millis() as u64 + 4 * election_ms;
            assert!(
                fence_after_ms >= worst_ms + election_ms / 2,
                "lease {lease_ms} ms: fencing after {fence_after_ms} ms leaves no room for the new leader's first \
                 commit after {worst_ms} ms"
            );
        }
    }
}
