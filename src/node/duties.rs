//! Periodic duties: every node renews its lease every `lease/5`; the leader extends leases on
//! election (before any sweep), records the cluster id, finishes half-done joint configurations,
//! sweeps lapsed leases every `sweep_ms`, and suspects members that stop answering its probes. A
//! node that sees itself removed from the membership stops.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngCore;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cluster::{ClusterWatch, Handle};
use crate::config::Timing;
use crate::http::{HttpClient, HttpError};
use crate::machine::{LeaseState, NodeId, Renew};
use crate::metrics::{Metrics, ReasonLabel};
use crate::ws::admission::Admission;
use crate::ws::registry::Registry;
use crate::ws::Mode;

/// The leader's record of when each live member last answered a probe: a member that has not
/// answered for `window` is silent. Silence is only counted over time the leader itself was
/// watching. When its own cluster side stalled (a tick later than `every` + `window`/2: a
/// disconnect wave of 42,750 devices held a 57,000-device leader's runtime for ~2 s), answers
/// may be waiting unread and a member cannot be told from a silent one, so every member gets a
/// fresh window; false suspicions took both healthy followers out of the ring in that wave.
///
/// A member whose cluster port refused the connection of [`REFUSED_PROBES`] probes in a row is
/// suspected at once, without waiting out the window: nothing listens there, so its process is
/// gone (a paused or partitioned member times out instead). That takes a killed member out of the
/// ring, and out of the admission budget's split, within two heartbeats rather than an election
/// timeout, while its devices are coming back.
struct Silence {
    every: Duration,
    window: Duration,
    /// member → when it last answered (or when its window began).
    heard: BTreeMap<NodeId, Instant>,
    /// member → probes refused in a row since it last answered.
    refused: BTreeMap<NodeId, u32>,
    last_tick: Option<Instant>,
}

/// Refused probes in a row that suspect a member before its window ends.
const REFUSED_PROBES: u32 = 2;

/// How a probe of a member ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Answered,
    /// Its cluster port refused the connection.
    Refused,
    /// No answer in time, or an error answer.
    Silent,
}

/// Why a member is suspected (the `reason` of `gateway_suspicions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Silent,
    Refused,
}

impl Why {
    fn label(self) -> &'static str {
        match self {
            Why::Silent => "silent",
            Why::Refused => "refused",
        }
    }
}

impl Silence {
    fn new(every: Duration, window: Duration) -> Silence {
        Silence { every, window, heard: BTreeMap::new(), refused: BTreeMap::new(), last_tick: None }
    }

    /// Starts over (another term, or no longer the leader).
    fn forget(&mut self) {
        self.heard.clear();
        self.refused.clear();
        self.last_tick = None;
    }

    fn probed(&mut self, id: NodeId, probe: Probe, at: Instant) {
        match probe {
            Probe::Answered => {
                self.heard.insert(id, at);
                self.refused.remove(&id);
            }
            Probe::Refused => *self.refused.entry(id).or_default() += 1,
            Probe::Silent => {
                self.refused.remove(&id);
            }
        }
    }

    /// A tick at `now` over the `live` members: those silent for longer than the window, or
    /// refused [`REFUSED_PROBES`] times in a row, for how long and why. A member that left the
    /// live set gets a fresh window if it comes back.
    fn tick(&mut self, now: Instant, live: &[NodeId]) -> Vec<(NodeId, Duration, Why)> {
        let stalled = self.last_tick.is_some_and(|t| now.saturating_duration_since(t) > self.every + self.window / 2);
        self.last_tick = Some(now);
        self.heard.retain(|id, _| live.contains(id));
        self.refused.retain(|id, _| live.contains(id));
        if stalled {
            self.heard.values_mut().for_each(|at| *at = now);
        }
        live.iter()
            .filter_map(|id| {
                let quiet = now.saturating_duration_since(*self.heard.entry(*id).or_insert(now));
                if quiet > self.window {
                    Some((*id, quiet, Why::Silent))
                } else if self.refused.get(id).is_some_and(|n| *n >= REFUSED_PROBES) {
                    Some((*id, quiet, Why::Refused))
                } else {
                    None
                }
            })
            .collect()
    }
}

/// Whether `addr`'s port refuses a TCP connection within `within`: nothing listens there (the
/// host answered for it). A timeout, or any other error, is not a refusal.
async fn port_refuses(addr: &str, within: Duration) -> bool {
    matches!(
        tokio::time::timeout(within, tokio::net::TcpStream::connect(addr)).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

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
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                Some(done) = in_flight.join_next() => {
                    let Ok((sent_at, result)) = done else { continue };
                    match result {
                        // The lease runs from after the renewal was sent: fencing measures from there.
                        Ok(()) => {
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
            in_flight
                .spawn(async move { (sent_at, cluster.renew(renew, 2 * period).await.map_err(|e| e.to_string())) });
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

/// When a voter whose leader's process is gone may start an election: once no voter can still
/// honour the dead leader's lease. openraft refuses votes for `election_timeout_max`
/// ([`Timing::election_timeout_max_ms`]) after a voter's last AppendEntries, and would itself wait that lease plus
/// a random election timeout; another voter may have heard from the leader up to a heartbeat
/// later than this one. `jitter` (up to half an election timeout) keeps two survivors from
/// splitting the vote.
pub fn prompt_election_after(timing: &Timing, jitter: Duration) -> Duration {
    Duration::from_millis(timing.election_timeout_max_ms() + timing.heartbeat_ms) + jitter
}

/// A voter's watch on its leader's process. openraft starts an election only after the
/// leader lease plus an election timeout of silence (3-4 s with the defaults), whatever the
/// reason for it. When the leader has been silent for two heartbeats and its cluster port refuses
/// connections (its process is gone: a pause or a partition times out instead), this voter starts
/// the election as soon as the lease allows ([`prompt_election_after`]), once per term. An
/// election is always safe; this only makes the one that must happen come sooner, and every
/// node's renewals wait for it (a node fences 4/5 of a lease after its last renewal).
pub async fn prompt_election_loop(cluster: Handle, timing: Timing, cancel: CancellationToken) {
    let heartbeat = Duration::from_millis(timing.heartbeat_ms.max(1));
    let leadership = cluster.leadership();
    let mut tried_term = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(heartbeat) => {}
        }
        let (Some(leader), term) = leadership.now() else { continue };
        let me = cluster.me();
        let view = cluster.view();
        if leader == me || tried_term == Some(term) || !view.is_voter(me) {
            continue;
        }
        let Some(silent) = cluster.since_last_append().filter(|s| *s >= 2 * heartbeat) else { continue };
        let Some(addr) = view.member(leader).map(|m| m.cluster_addr.clone()) else { continue };
        if !port_refuses(&addr, heartbeat).await {
            continue;
        }
        let jitter = Duration::from_millis(rand::random::<u64>() % (timing.election_timeout_ms / 2).max(1));
        let wait = prompt_election_after(&timing, jitter).saturating_sub(silent);
        tracing::info!(
            leader,
            term,
            ?silent,
            ?wait,
            "leader's cluster port refuses connections: electing once its lease allows"
        );
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        tried_term = Some(term);
        // Someone else may have been elected meanwhile.
        if leadership.now() != (Some(leader), term) {
            continue;
        }
        if let Err(e) = cluster.elect().await {
            tracing::warn!(error = %e, "starting an election failed");
        }
    }
}

/// How long after a suspicion a node's own renewal may clear it: the ring changes at most twice
/// per hold for a flapping node.
pub fn suspect_hold_ms(timing: &Timing) -> u64 {
    timing.lease_ms / 4
}

/// The leader's failure detector. Every heartbeat it probes each live member's cluster listener
/// (`/cluster/ping`, addressed to that member's id, at most one probe per member per heartbeat,
/// each allowed `suspect_after` to answer); a member with no answer for an election timeout is
/// suspected: out of the ring and of placement on every node at one log index, long before its
/// lease could lapse. Its own renewal brings it back (after [`suspect_hold_ms`]); only a sweep
/// deletes its routes.
pub async fn suspect_loop(
    cluster: Handle,
    http: HttpClient,
    timing: Timing,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let me = cluster.me();
    let every = Duration::from_millis(timing.heartbeat_ms.max(10));
    let suspect_after = Duration::from_millis(timing.election_timeout_ms);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probes = tokio::task::JoinSet::new();
    let mut silence = Silence::new(every, suspect_after);
    let mut term = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
            Some(Ok((id, probe))) = probes.join_next(), if !probes.is_empty() => {
                silence.probed(id, probe, Instant::now());
                continue;
            }
        }
        // Answers that came in while this task waited for its turn count before any judgment.
        while let Some(done) = probes.try_join_next() {
            if let Ok((id, probe)) = done {
                silence.probed(id, probe, Instant::now());
            }
        }
        let (leader, now_term) = cluster.leadership().now();
        if leader != Some(me) {
            term = None;
            silence.forget();
            probes.abort_all();
            continue;
        }
        if term != Some(now_term) {
            // A new term: every member gets a full window from now.
            term = Some(now_term);
            silence.forget();
        }
        let view = cluster.view();
        let live: Vec<(NodeId, String)> = view
            .members()
            .filter(|(id, _)| *id != me && view.is_live(*id))
            .map(|(id, m)| (id, m.cluster_addr.clone()))
            .collect();
        let ids: Vec<NodeId> = live.iter().map(|(id, _)| *id).collect();
        let silent = silence.tick(Instant::now(), &ids);
        for (id, addr) in &live {
            if let Some((_, quiet, why)) = silent.iter().find(|(s, ..)| s == id) {
                match cluster.suspect(*id, suspect_hold_ms(&timing)).await {
                    Ok(true) => {
                        metrics.suspicions.get_or_create(&ReasonLabel { reason: why.label() }).inc();
                        tracing::warn!(node = id, silent = ?quiet, why = why.label(), "leader: suspected a member; out of the ring");
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(node = id, error = %e, "leader: suspicion did not commit"),
                }
                continue;
            }
            let (http, addr, id) = (http.clone(), addr.clone(), *id);
            probes.spawn(async move {
                let path = format!("/cluster/ping?target={id}");
                let probe = match http.get(&addr, &path, suspect_after).await {
                    Ok((status, _)) if status.is_success() => Probe::Answered,
                    // The client's error does not keep the cause: ask the port itself.
                    Err(HttpError::Connect { .. }) if port_refuses(&addr, every).await => Probe::Refused,
                    _ => Probe::Silent,
                };
                (id, probe)
            });
        }
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
/// nodes, recomputed with every applied ring change), or at `local` (`--admit-rate`,
/// `--admit-burst`) while no budget is set.
pub async fn follow_admission(
    admission: Arc<Admission>,
    local: (f64, u32),
    mut view: ClusterWatch,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    loop {
        let want = view.borrow_and_update().admission_share().unwrap_or(local);
        if admission.current() != want {
            tracing::info!(rate_per_s = want.0, burst = want.1, "admission changed");
            admission.set(want.0, want.1);
        }
        metrics.admission_rate.set(want.0);
        metrics.admission_burst.set(i64::from(want.1));
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = view.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::lifecycle::FENCE_MARGIN_DIVISOR;

    #[test]
    fn a_member_whose_port_refuses_twice_in_a_row_is_suspected_before_its_window() {
        let (every, window) = (Duration::from_millis(250), Duration::from_millis(1000));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = Silence::new(every, window);
        for id in [1, 2, 3] {
            s.probed(id, Probe::Answered, at(0));
        }
        assert!(s.tick(at(0), &[1, 2, 3]).is_empty());
        // Member 2's port refuses from 250 ms on; member 3's refuses once, then times out once,
        // then refuses once more: never two refusals in a row.
        s.probed(2, Probe::Refused, at(250));
        s.probed(3, Probe::Refused, at(250));
        assert!(s.tick(at(250), &[1, 2, 3]).is_empty(), "one refusal is not enough");
        s.probed(2, Probe::Refused, at(500));
        s.probed(3, Probe::Silent, at(500));
        assert_eq!(s.tick(at(500), &[1, 2, 3]), vec![(2, Duration::from_millis(500), Why::Refused)]);
        s.probed(3, Probe::Refused, at(750));
        assert!(s.tick(at(750), &[1, 3]).is_empty());
        // An answer clears the streak; so does a new term.
        s.probed(1, Probe::Refused, at(800));
        s.probed(1, Probe::Answered, at(900));
        s.probed(1, Probe::Refused, at(1000));
        assert!(s.tick(at(1000), &[1, 3]).iter().all(|(id, ..)| *id != 1));
        s.forget();
        s.probed(1, Probe::Refused, at(1100));
        assert!(s.tick(at(1100), &[1]).is_empty());
    }

    #[test]
    fn a_member_is_silent_after_a_window_without_an_answer_the_leader_watched() {
        let (every, window) = (Duration::from_millis(250), Duration::from_millis(1000));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = Silence::new(every, window);
        // Ticks every 250 ms: member 1 answers throughout, member 2 never does.
        let mut suspects = Vec::new();
        for k in 0..=5 {
            s.probed(1, Probe::Answered, at(k * 250));
            suspects = s.tick(at(k * 250), &[1, 2]);
            if k < 5 {
                assert!(suspects.is_empty(), "tick {k}: {suspects:?}");
            }
        }
        assert_eq!(suspects, vec![(2, Duration::from_millis(1250), Why::Silent)], "silent for a whole window");
        // The leader's own ticks stop for 2 s (its runtime starved): nobody answers in between as
        // far as it can tell, but nobody is judged over a stretch it did not watch.
        let mut s = Silence::new(every, window);
        s.tick(at(0), &[1, 2]);
        s.probed(1, Probe::Answered, at(0));
        assert!(s.tick(at(2000), &[1, 2]).is_empty(), "a stalled leader suspects nobody at once");
        // Watching again: a member still silent a window later is suspected.
        for ms in [2250, 2500, 2750, 3000] {
            assert!(s.tick(at(ms), &[1, 2]).is_empty(), "{ms} ms");
        }
        assert_eq!(s.tick(at(3250), &[1, 2]).len(), 2, "both silent for a watched window");
        // A member that left the live set and comes back gets a fresh window.
        s.tick(at(3500), &[1]);
        assert!(s.tick(at(3750), &[1, 2]).iter().all(|(id, ..)| *id != 2));
    }

    #[test]
    fn a_prompt_election_waits_out_every_voters_lease_and_beats_openraft_s_own_timer() {
        let timing = Timing { election_timeout_ms: 1000, heartbeat_ms: 250, ..Timing::default() };
        // openraft's leader lease is election_timeout_max (twice the timeout); a voter may have
        // heard from the leader a heartbeat later than this one.
        let lease = Duration::from_millis(2 * timing.election_timeout_ms);
        let earliest = prompt_election_after(&timing, Duration::ZERO);
        assert!(earliest >= lease + Duration::from_millis(timing.heartbeat_ms));
        // openraft's own timer fires after the lease plus at least one election timeout.
        let latest = prompt_election_after(&timing, Duration::from_millis(timing.election_timeout_ms / 2 - 1));
        assert!(latest < lease + Duration::from_millis(timing.election_timeout_ms));
    }

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
