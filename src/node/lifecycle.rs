//! A node's lifecycle: how it starts (bootstrap, join or standby), and its serving mode on the
//! `Mode` watch: Serving → Draining (V6) and Serving ⇄ Fenced (V7). Drain: refuse handshakes, leave the ring everywhere at once (`Drain`), tell every device
//! (`goaway` + 1001, paced by `drain_rate`), wait for them or `drain_timeout`, then `ReleaseNode`.
//! Fencing: when no lease renewal has committed for `lease - margin` (margin = lease/5), refuse
//! handshakes; close the connections still open `margin/2` later with 1013 (apply events may close them first with
//! 4001/4002); when a renewal commits again, close every connection whose route was taken over or
//! swept, and serve again. A store write without progress for `lease / 4` (a disk that stopped
//! answering) fences the same way, and a leader asks a voter to take leadership over.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cluster::Handle;
use crate::config::{Config, Start};
use crate::http::HttpClient;
use crate::machine::Budget;

use crate::protocol::close;
use crate::tools::admin::OnClash;
use crate::tools::bootguard::{self, GuardError, Me, Verdict};
use crate::ws::registry::Control;
use crate::ws::{self, Gate, Mode};

use super::quorum;

/// Fencing starts `lease / 5` before the lease could lapse (renewals are timed from when they were
/// sent, before the leader stamps them, so the margin only covers clock-rate drift and delivery);
/// connections still open a further `lease / 10` later (before the lease can lapse) are closed with 1013.
pub const FENCE_MARGIN_DIVISOR: u32 = 5;

/// A task the node runs beside its others.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How a node starts: a fresh data dir with neither `--join` nor `--standby` bootstraps a
/// one-node cluster, unless the bootstrap guard (`--peers`) finds a peer already in a cluster:
/// then it joins that cluster instead (refusing to start when the peers name two clusters);
/// `--join ADDR` returns the task that asks that member to add this node until it is one;
/// `--standby` waits for `gateway join`. A data dir that holds a cluster ignores all of these; the
/// guard also runs on a data dir that holds none yet (a start that stopped inside its window).
pub async fn start(
    cluster: &Handle,
    cfg: &Config,
    fresh: bool,
    http: HttpClient,
    cancel: CancellationToken,
) -> Result<Option<Task>, GuardError> {
    let mut join: Option<Task> = None;
    let guarded = cfg.start == Start::Bootstrap && !cfg.peers.is_empty();
    let holds_cluster = !fresh && cluster.is_initialized().await;
    match (&cfg.start, fresh) {
        (Start::Bootstrap, _) if guarded && !holds_cluster => {
            let me = Me { id: cluster.me(), name: cluster.member().name.to_string(), cluster_addr: cfg.cluster_addr() };
            let wait = Duration::from_millis(cfg.peers_wait_ms);
            let verdict = match bootguard::decide(&http, &me, &cfg.peers, wait, &cancel).await {
                Err(GuardError::Cancelled) => return Ok(None),
                other => other?,
            };
            match verdict {
                Verdict::Join { via, cluster_id, old_self } => {
                    let cluster_id = cluster_id.unwrap_or_else(|| "-".into());
                    tracing::warn!(
                        via = %via, cluster_id = %cluster_id,
                        "bootstrap guard: {via} belongs to cluster {cluster_id}: joining it instead of bootstrapping a second cluster"
                    );
                    if let Some((old, name)) = old_self {
                        tracing::warn!(
                            old_id = old, old_name = %name,
                            "bootstrap guard: member {old} ({name}) is an old identity of this node (lost data dir): remove it with `gateway leave --cluster {via} --node {old}`; this node then joins by itself"
                        );
                    }
                    join = Some(join_task(http, via, cfg.cluster_addr(), cluster.me(), OnClash::Retry, cancel));
                }
                verdict => {
                    let why = match verdict {
                        Verdict::BootstrapAllOutside => "every peer answered and none is in a cluster",
                        _ => "no peer answered as a member within peers_wait_ms",
                    };
                    tracing::info!(peers = ?cfg.peers, "bootstrap guard: {why}: bootstrapping");
                    join = bootstrap(cluster, cfg, cancel).await;
                }
            }
        }
        (Start::Bootstrap, true) => join = bootstrap(cluster, cfg, cancel).await,
        (Start::Join(addr), _) => {
            join = Some(join_task(http, addr.clone(), cfg.cluster_addr(), cluster.me(), OnClash::GiveUp, cancel));
        }
        (Start::Standby, true) => tracing::info!("standby: waiting to be added with `gateway join`"),
        _ => {}
    }
    if guarded && holds_cluster {
        tracing::info!("data dir holds this node's identity: peers not asked (they guard a fresh data dir only)");
    }
    if let (false, Some((rate, burst))) = (fresh, cfg.cluster_budget) {
        tracing::info!(
            rate_per_s = rate,
            burst,
            "cluster_admit_rate applies when a cluster is bootstrapped; change this cluster's budget with `gateway admission set`"
        );
    }
    if !fresh && !guarded && !cluster.is_initialized().await {
        tracing::info!(
            "this node is not part of a cluster yet: add it with `gateway join --node {}`",
            cfg.cluster_addr()
        );
    }
    Ok(join)
}

/// Bootstraps a one-node cluster; the task it returns commits the configured cluster budget.
async fn bootstrap(cluster: &Handle, cfg: &Config, cancel: CancellationToken) -> Option<Task> {
    match cluster.bootstrap().await {
        Ok(()) => {
            tracing::info!("bootstrapped a one-node cluster");
            let budget = cfg.cluster_budget?;
            Some(Box::pin(seed_budget(cluster.clone(), budget, cancel)))
        }
        Err(e) => {
            tracing::warn!(error = %e, "bootstrap skipped");
            None
        }
    }
}

fn join_task(http: HttpClient, via: String, me: String, id: u64, on_clash: OnClash, cancel: CancellationToken) -> Task {
    Box::pin(async move {
        crate::tools::admin::join_until_member(&http, &via, &me, id, on_clash, cancel).await;
    })
}

/// Commits the configured cluster budget once this node's fresh cluster can commit (retrying
/// while it elects itself), unless a budget is already set.
async fn seed_budget(cluster: Handle, (rate, burst): (f64, u32), cancel: CancellationToken) {
    let budget = Budget { milli_rate: (rate * 1000.0).round() as u64, burst };
    loop {
        if cluster.view().state.admission.is_some() {
            return;
        }
        match cluster.set_admission(Some(budget)).await {
            Ok(()) => {
                tracing::info!(rate_per_s = rate, burst, "cluster admission budget committed from the configuration");
                return;
            }
            Err(e) => tracing::debug!(error = %e, "cluster budget not committed yet; retrying"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// A node's previous process may have left routes naming this node. Killed and restarted within
/// its lease (a supervisor's restart, an OOM kill), it renews that lease before any sweep could
/// lapse it, so nothing else would delete them: each would tell a route lookup that its device is
/// here and hold a connection of its tenant's quota until that device connected again. This
/// process's first lease renewal deletes them ([`crate::machine::FirstRenew`]), so a starting node
/// refuses handshakes and claims (`Mode::Starting`, 503 `starting`) until a renewal of its own has
/// committed (`renewed` moves): every claim of this process then lands after it in the log. A
/// standby node starts serving once it has been added and renewed.
pub async fn serve_once_renewed(
    mode: Arc<watch::Sender<Mode>>,
    mut renewed: watch::Receiver<Instant>,
    cancel: CancellationToken,
) {
    tokio::select! {
        _ = cancel.cancelled() => return,
        r = renewed.changed() => if r.is_err() { return },
    }
    // A drain begun meanwhile stays a drain.
    if swap(&mode, Mode::Starting, Mode::Serving) {
        tracing::info!("first lease renewal committed: serving");
    }
}

/// Sets the mode to `to` if it is `from`; whether it did.
fn swap(mode: &watch::Sender<Mode>, from: Mode, to: Mode) -> bool {
    mode.send_if_modified(|m| {
        let was = *m == from;
        if was {
            *m = to;
        }
        was
    })
}

/// How a node winds down: a drain (SIGTERM, `gateway drain`), or, when it was removed from the
/// cluster, a goodbye to its devices.
pub async fn stop(gate: &Gate, mode: &watch::Sender<Mode>, drain_with: Option<&DrainConfig>) {
    match drain_with {
        Some(cfg) => drain(gate, mode, cfg).await,
        None => say_goodbye(gate, Duration::from_secs(1)).await,
    }
}

/// Stops a node whose Raft stopped on its own (`why`): nothing commits or applies here any more,
/// so its devices go elsewhere now (the process's exit makes its peers suspect it at once), not
/// when its lease lapses. Returns `why`.
pub async fn stop_failed(gate: &Gate, mode: &watch::Sender<Mode>, why: String) -> String {
    tracing::error!(error = %why, "Raft stopped: this node can no longer commit or apply; telling its devices to go, then exiting");
    mode.send_replace(Mode::Draining);
    say_goodbye(gate, Duration::from_secs(1)).await;
    why
}

/// Drain pacing knobs, and how the drain checks that a quorum is left for its writes.
#[derive(Debug, Clone)]
pub struct DrainConfig {
    pub drain_rate: f64,
    pub drain_timeout: Duration,
    pub quorum: quorum::Check,
}

/// Runs the drain to the end; the caller then stops the process.
pub async fn drain(gate: &Gate, mode: &watch::Sender<Mode>, cfg: &DrainConfig) {
    let (started, me) = (Instant::now(), gate.cluster.me());
    mode.send_replace(Mode::Draining);
    tracing::info!("draining: refusing new handshakes");
    match cfg.quorum.unless_lost(&gate.cluster, gate.cluster.drain(me)).await {
        Ok(Ok(_)) => tracing::info!("draining: left the ring"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "draining: could not commit Drain; leaving the ring when the lease lapses")
        }
        Err(why) => tracing::warn!(why, "draining: no quorum left; leaving the ring when the lease lapses"),
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
    let _ = tokio::time::timeout_at(deadline, gate.registry.wait_empty()).await;
    let left = gate.registry.len();
    match cfg.quorum.unless_lost(&gate.cluster, gate.cluster.release_node(me)).await {
        Ok(Ok(_)) => tracing::info!(total, left, elapsed = ?started.elapsed(), "drained: released this node's routes"),
        Ok(Err(e)) => tracing::warn!(error = %e, "drained, but ReleaseNode did not commit; the lease covers it"),
        Err(why) => {
            tracing::warn!(why, total, left, "drained, but no quorum left for ReleaseNode; the lease covers it")
        }
    }
    hand_over(gate, cfg.quorum).await;
}

/// Followers refuse votes while the leader's lease runs: without a handover, a stopping leader
/// would leave the cluster without one for that lease plus an election timeout. Voters whose
/// process is gone are not handed to, and with no quorum left nobody would take over.
async fn hand_over(gate: &Gate, check: quorum::Check) {
    let cluster = &gate.cluster;
    if cluster.leader() != Some(cluster.me()) {
        return tracing::debug!("drained: not the leader, no leadership to hand over");
    }
    let gone = check.reach(cluster).await.gone;
    let handed = match check.unless_lost(cluster, cluster.hand_over_leadership(&gone)).await {
        Ok(handed) => handed,
        Err(why) => Err(format!("no quorum left: {why}")),
    };
    match handed {
        Ok(to) => tracing::info!(to, "drained: handed leadership over"),
        Err(why) => tracing::info!(why, "drained: leadership not handed over"),
    }
}

/// A stop without a drain (the node was removed): tell every device to go elsewhere (`goaway` +
/// 1001) instead of dropping its TCP connection, waiting at most `bound` for them to close.
pub async fn say_goodbye(gate: &Gate, bound: Duration) {
    for s in gate.registry.sessions() {
        gate.registry.send(s.conn, Control::Goaway { reason: "stopping".into() });
    }
    let _ = tokio::time::timeout(bound, gate.registry.wait_empty()).await;
}

/// Watches renewals and fences this node while they fail (V7), and while its store makes no
/// progress: a disk that stopped answering (an `fdatasync` that hangs) returns no error, yet a
/// node whose applies hang delivers nothing to its devices, and a leader whose applies hang
/// answers no write while its heartbeats keep the others from electing. A store write
/// (`metrics::writes`) that made no progress for a quarter of a lease (`StoreWrites::stalled`)
/// fences the node as a lapsing lease does, and a leader hands leadership to a voter. Runs on a
/// runtime of its own, which no store write can hold (`node::ClusterRuntime`): a hung write may
/// hold a thread of Raft's runtime.
pub async fn fence_loop(
    gate: Arc<Gate>,
    mode: Arc<watch::Sender<Mode>>,
    mut renewed: watch::Receiver<Instant>,
    lease: Duration,
    tasks: tokio_util::task::TaskTracker,
    cancel: CancellationToken,
) {
    let margin = lease / FENCE_MARGIN_DIVISOR;
    let stall_after = lease / crate::metrics::writes::STALL_LEASE_DIVISOR;
    let every = (lease / 20).max(Duration::from_millis(10));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fenced_at: Option<Instant> = None;
    let mut closed = false;
    let writes = &gate.metrics.store_writes;
    let mut stalled = false;
    let mut last_tick = Instant::now();
    let mut asked_at: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
            r = renewed.changed() => if r.is_err() { return },
        }
        let since = renewed.borrow().elapsed();
        // A node outside the membership (standby) holds no lease to lose.
        let me = gate.cluster.me();
        let member = gate.cluster.view().member(me).is_some();
        // A tick this late means the process was paused or starved (SIGSTOP, a VM pause): a write
        // caught in that pause looks stalled for a moment. Judge again at the next tick.
        let late = last_tick.elapsed() > every + stall_after / 2;
        last_tick = Instant::now();
        match (writes.stalled(lease), stalled) {
            (Some((part, waited)), false) if !late => {
                stalled = true;
                writes.mark_stalled(true);
                gate.metrics.store_stalls.inc();
                let part = part.name();
                tracing::warn!(part, without_progress = ?waited, "the store stopped answering: fencing (refusing handshakes)");
            }
            (None, true) => {
                stalled = false;
                writes.mark_stalled(false);
                tracing::info!("the store answers again");
            }
            _ => {}
        }
        // Again while a quorum still follows it (the hand-over failed, or it was elected again);
        // once another leads, the voters stop acknowledging it, though its core, unable to
        // record the new term while the store hangs, goes on seeing itself lead.
        // A one-node cluster has no one to hand over to.
        let followed = gate.cluster.quorum_acked_ago().is_some_and(|ago| ago < stall_after);
        let due = asked_at.is_none_or(|at| at.elapsed() >= stall_after);
        let others = gate.cluster.view().members().any(|(id, _)| id != me);
        if stalled && due && followed && others && gate.cluster.leader() == Some(me) {
            asked_at = Some(Instant::now());
            tasks.spawn(hand_over_stalled(gate.clone(), stall_after).in_current_span());
        }
        let lapsing = member && (stalled || since > lease - margin);
        let current = *mode.borrow();
        match (current, lapsing, fenced_at) {
            // Each change is made only from the mode it was read in: a drain may begin meanwhile
            // (on the device side) and must stay a drain.
            (Mode::Serving, true, _) => {
                if !swap(&mode, Mode::Serving, Mode::Fenced) {
                    continue;
                }
                if !stalled {
                    tracing::warn!(since_renewal = ?since, "no lease renewal committed: fencing (refusing handshakes)");
                }
                gate.metrics.fence_events.inc();
                fenced_at = Some(Instant::now());
                closed = false;
            }
            (Mode::Fenced, true, Some(at)) if !closed && at.elapsed() >= margin / 2 => {
                let n = gate.registry.len();
                let reason = if stalled { "the node's store stopped answering" } else { "node lost quorum" };
                for s in gate.registry.sessions() {
                    gate.registry.send(s.conn, Control::Close { code: close::TRY_AGAIN_LATER, reason: reason.into() });
                }
                tracing::warn!(connections = n, reason, "fenced: closed connections with 1013");
                closed = true;
            }
            (Mode::Fenced, false, _) => {
                // Back: the apply events have caught up with what happened meanwhile; close
                // whatever still holds a route that is no longer ours.
                ws::reconcile(&gate).await;
                if !swap(&mode, Mode::Fenced, Mode::Serving) {
                    continue;
                }
                tracing::info!("lease renewal committed again: serving");
                fenced_at = None;
            }
            _ => {}
        }
    }
}

/// A leader whose store stopped answering asks a voter that acknowledged it lately to take
/// leadership over (within `bound`: a Raft core held by the hung write takes no request, and its
/// silence elects another leader anyway). Its own core cannot record the new term while the store
/// hangs, so it does not wait to see it.
async fn hand_over_stalled(gate: Arc<Gate>, bound: Duration) {
    let asked = tokio::time::timeout(bound, gate.cluster.transfer_leadership(&Default::default())).await;
    match asked {
        Ok(Ok(to)) => tracing::info!(to, "the store stopped answering: asked a voter to take leadership over"),
        Ok(Err(why)) => tracing::warn!(why, "the store stopped answering: leadership not handed over"),
        Err(_) => tracing::warn!(within = ?bound, "the store stopped answering: leadership not handed over in time"),
    }
}
