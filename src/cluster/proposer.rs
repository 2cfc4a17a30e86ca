//! The batching proposer (design §2 "Batching"). Every log entry costs each node an append and an
//! apply transaction and the leader a replication message per follower, so one entry per write
//! would cost that per write (the log writer folds queued appends into one fsync, but not the
//! rest). The proposer folds every
//! command that queued while the previous entry committed into one `Request` (bounded) and hands
//! each caller its own reply. A batch waits briefly for the callers the last commits answered
//! (see [`Fill`]): a client that writes again as soon as it is answered then shares the next entry
//! with the others instead of going out alone. On a follower the batch is forwarded to the
//! leader's `/cluster/propose/v2`, where the leader's proposer batches it again and stamps time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::forward::ForwardFailed::{Failed, Unreached};
use super::forward::{forward, unless_replaced, Lane, MAX_FORWARDS};
use crate::clock::ClusterClock;
use crate::http::{HttpClient, MAX_APPEND_BYTES};
use crate::machine::{Command, Reply};
use crate::metrics::Metrics;
use crate::raft::types::{Raft, Request, TypeConfig};
use openraft::async_runtime::WatchReceiver as _;

/// Most commands folded into one log entry.
pub const MAX_BATCH: usize = 1024;

/// Most bytes (by [`Command::weight`]) folded into one log entry, half an append's budget: an
/// entry always fits in an append (the network splits appends of several) and in a forward. A
/// single larger command still goes alone (a publish is at most
/// [`crate::config::MAX_PAYLOAD_LIMIT`], well inside an append).
pub const MAX_BATCH_BYTES: usize = MAX_APPEND_BYTES / 2;

/// Most bytes (by [`Command::weight`]) of bulk commands a node holds from the moment a caller
/// queues one until it is answered: queued, batched, in flight, forwarded, or waiting for a
/// leader. Sixteen full batches. The queue's bound in commands (`16 × MAX_BATCH`) alone let it hold
/// 16,384 publishes of up to 1 MiB each: a publish answered `503` on its timeout gives its share
/// of the publish budget back and may still wait here, so a backend that retried through a quorum
/// loss could grow it by the whole publish budget every timeout. A caller that finds the queue full
/// waits for room within its own deadline (then `Timeout`; nothing was queued).
pub const QUEUED_BYTES: usize = 16 * MAX_BATCH_BYTES;

/// Batches proposed (or forwarded) at once. With one, every caller waits a whole commit behind
/// the batch in flight (benches/claims.rs measured ~C/2 commands per entry and 1.00 entries per
/// fsync); with two, the next batch is already queued in openraft when the log flushes.
pub const MAX_IN_FLIGHT: usize = 2;

/// Longest a bulk batch waits for the callers the last commits answered (see [`Fill`]).
pub const MAX_LINGER: Duration = Duration::from_millis(1);

/// Why a write did not get a reply. All are retryable except `Rejected`.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ProposeError {
    #[error("no leader is known (election in progress?)")]
    NoLeader,
    #[error("the write did not commit within {0} ms")]
    Timeout(u64),
    #[error("forwarding to the leader failed: {0}")]
    Forward(String),
    #[error("raft refused the write: {0}")]
    Rejected(String),
    #[error("the node is shutting down")]
    Stopped,
}

impl ProposeError {
    /// The error without the detail a forward or Raft added (which can name a leader's internal
    /// address): what a device or a backend is told.
    pub fn summary(&self) -> String {
        match self {
            ProposeError::Forward(_) => "forwarding to the leader failed".to_string(),
            ProposeError::Rejected(_) => "raft refused the write".to_string(),
            other => other.to_string(),
        }
    }
}

/// A queued command and its caller.
struct Pending {
    cmd: Command,
    waiter: Waiter,
}

/// A command's caller: kept apart from the command once its batch hands the commands to Raft
/// (see [`write_batch`]).
struct Waiter {
    /// Forwarded from another node: never forward again (no loops between stale leaders).
    local_only: bool,
    reply: oneshot::Sender<Result<Reply, ProposeError>>,
    /// A bulk command's share of [`QUEUED_BYTES`], given back when it is answered (dropped).
    _bytes: Option<OwnedSemaphorePermit>,
}

impl Pending {
    fn split(self) -> (Command, Waiter) {
        (self.cmd, self.waiter)
    }
}

/// Handle to submit commands; cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
    /// Lease and leader duties: batched apart from the bulk, on slots of their own (see
    /// [`batches`]), so that a flood of writes never holds up a renewal (and fences the node).
    urgent: mpsc::Sender<Pending>,
    /// [`QUEUED_BYTES`], for bulk commands.
    bytes: Arc<Semaphore>,
    timeout: Duration,
    /// The batches being written; closed when the batching loop ends.
    writing: TaskTracker,
}

impl Proposer {
    /// Starts the batching loop on `tasks`; it ends when `cancel` fires, and so does every batch
    /// still being written (its callers are answered `Stopped`).
    pub fn spawn(
        raft: Raft,
        http: HttpClient,
        timeout: Duration,
        metrics: Arc<Metrics>,
        clock: Arc<ClusterClock>,
        tasks: TaskTracker,
        cancel: CancellationToken,
    ) -> Proposer {
        let (tx, rx) = mpsc::channel(16 * MAX_BATCH);
        let (urgent, urgent_rx) = mpsc::channel(MAX_BATCH);
        let writing = TaskTracker::new();
        let ctx = Ctx {
            raft,
            http: Arc::new(http),
            timeout,
            metrics,
            clock,
            tasks: writing.clone(),
            stop: cancel.clone(),
            fill: None,
            forwards: None,
        };
        let proposing = run(ctx, urgent_rx, rx, cancel);
        let closing = writing.clone();
        tasks.spawn(
            async move {
                proposing.await;
                closing.close()
            }
            .instrument(tracing::info_span!("proposer")),
        );
        Proposer { tx, urgent, bytes: Arc::new(Semaphore::new(QUEUED_BYTES)), timeout, writing }
    }

    /// Resolves once the batching loop and every batch it was writing have ended (after the stop;
    /// before Raft is shut down: a write still in Raft then makes openraft log an error).
    pub async fn stopped(&self) {
        self.writing.wait().await
    }

    /// Proposes one command and waits for its reply, at most the configured deadline.
    pub async fn propose(&self, cmd: Command) -> Result<Reply, ProposeError> {
        self.submit(cmd, false).await
    }

    /// Proposes commands forwarded by a follower; all are queued before any is awaited, so they
    /// share entries. Replies come back in order.
    pub async fn propose_forwarded(&self, cmds: Vec<Command>) -> Vec<Result<Reply, ProposeError>> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut waiting = Vec::with_capacity(cmds.len());
        for cmd in cmds {
            waiting.push(self.enqueue(cmd, true, deadline, self.timeout).await);
        }
        let mut out = Vec::with_capacity(waiting.len());
        for rx in waiting {
            out.push(match rx {
                Ok(rx) => self.wait(rx, deadline, self.timeout).await,
                Err(e) => Err(e),
            });
        }
        out
    }

    /// Proposes on this node only, never forwarding: for the leader's own duties (ExtendLeases,
    /// Sweep), which must not land in another leader's term, before its ExtendLeases.
    pub async fn propose_local(&self, cmd: Command) -> Result<Reply, ProposeError> {
        self.submit(cmd, true).await
    }

    /// Like [`Proposer::propose`], but waits at most `deadline` (for callers on a period shorter
    /// than the propose timeout, such as lease renewals: a forward to a frozen leader must not
    /// hold up the next renewal).
    pub async fn propose_within(&self, cmd: Command, deadline: Duration) -> Result<Reply, ProposeError> {
        self.submit_within(cmd, false, deadline.min(self.timeout)).await
    }

    async fn submit(&self, cmd: Command, local_only: bool) -> Result<Reply, ProposeError> {
        self.submit_within(cmd, local_only, self.timeout).await
    }

    /// Queues `cmd` and waits for its reply, both within `within`.
    async fn submit_within(&self, cmd: Command, local_only: bool, within: Duration) -> Result<Reply, ProposeError> {
        let deadline = tokio::time::Instant::now() + within;
        let rx = self.enqueue(cmd, local_only, deadline, within).await?;
        self.wait(rx, deadline, within).await
    }

    /// Queues `cmd` once there is room for it (a bulk command's share of [`QUEUED_BYTES`], a
    /// place in its queue) by `deadline`; `Timeout` naming `within` otherwise.
    async fn enqueue(
        &self,
        cmd: Command,
        local_only: bool,
        deadline: tokio::time::Instant,
        within: Duration,
    ) -> Result<oneshot::Receiver<Result<Reply, ProposeError>>, ProposeError> {
        let timed_out = || ProposeError::Timeout(within.as_millis() as u64);
        let urgent = cmd.urgent();
        let bytes = if urgent {
            None
        } else {
            // A command larger than the whole budget (none is: a publish is at most 1 MiB) waits
            // for all of it.
            let n = u32::try_from(cmd.weight().min(QUEUED_BYTES)).unwrap_or(u32::MAX);
            match tokio::time::timeout_at(deadline, self.bytes.clone().acquire_many_owned(n)).await {
                Ok(Ok(permit)) => Some(permit),
                Ok(Err(_)) => return Err(ProposeError::Stopped),
                Err(_) => return Err(timed_out()),
            }
        };
        let (reply, rx) = oneshot::channel();
        let queue = if urgent { &self.urgent } else { &self.tx };
        match tokio::time::timeout_at(
            deadline,
            queue.send(Pending { cmd, waiter: Waiter { local_only, reply, _bytes: bytes } }),
        )
        .await
        {
            Ok(Ok(())) => Ok(rx),
            Ok(Err(_)) => Err(ProposeError::Stopped),
            Err(_) => Err(timed_out()),
        }
    }

    /// The reply by `deadline`, or a timeout that names the wait it was given (`within`: a
    /// renewal waits one renewal period, not the propose timeout).
    async fn wait(
        &self,
        rx: oneshot::Receiver<Result<Reply, ProposeError>>,
        deadline: tokio::time::Instant,
        within: Duration,
    ) -> Result<Reply, ProposeError> {
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(ProposeError::Stopped),
            Err(_) => Err(ProposeError::Timeout(within.as_millis() as u64)),
        }
    }
}

/// What the batching loop and its batches share.
#[derive(Clone)]
struct Ctx {
    raft: Raft,
    http: Arc<HttpClient>,
    timeout: Duration,
    metrics: Arc<Metrics>,
    /// Cluster time, stamped into time-dependent commands (only the leader's stamps commit).
    clock: Arc<ClusterClock>,
    /// Where batches are written.
    tasks: TaskTracker,
    /// The node's stop: a batch still being written ends with it.
    stop: CancellationToken,
    /// The bulk queue's: what its local writes answered (none for the urgent queue).
    fill: Option<Arc<Fill>>,
    /// The bulk queue's forward lanes ([`MAX_FORWARDS`]); none for the urgent queue.
    forwards: Option<Arc<Semaphore>>,
}

/// A batch that waits to fill. Clients that write again as soon as they are answered (a
/// handshake's claim, then its release; a backend's next write) come back within a round trip of
/// their answer. Without a wait the first of them takes the free slot alone and the rest queue
/// for the next, so eight such clients split into groups of one to four (2.5 claims per entry)
/// and every entry costs three nodes an append, a replication round and an apply. So a bulk batch
/// that holds fewer commands than the last commits answered waits for the rest, at most
/// [`MAX_LINGER`] (tokio's timers tick by the millisecond, so a shorter wait would end on the
/// same tick); callers answered by the other batch in flight while it waits are waited for too,
/// so groups merge into one entry (eight per entry at eight clients). Nobody answered (a single
/// client, a quiet node, a follower, whose writes go to the leader) means no wait.
#[derive(Default)]
struct Fill {
    /// Callers answered by local writes since the batching loop last looked.
    answered: AtomicUsize,
}

impl Fill {
    /// A local write of `callers` commands committed.
    fn committed(&self, callers: usize) {
        self.answered.fetch_add(callers, Ordering::Relaxed);
    }

    /// Callers answered since the last look.
    fn take_answered(&self) -> usize {
        self.answered.swap(0, Ordering::Relaxed)
    }
}

async fn run(ctx: Ctx, urgent: mpsc::Receiver<Pending>, rx: mpsc::Receiver<Pending>, cancel: CancellationToken) {
    let spawn = |ctx: Ctx| {
        move |batch: Vec<Pending>, permit: OwnedSemaphorePermit| {
            let (ctx2, stop) = (ctx.clone(), ctx.stop.clone());
            let write = async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = write_batch(ctx2, batch, permit) => {}
                }
            };
            ctx.tasks.spawn(write.in_current_span());
        }
    };
    let fill = Arc::new(Fill::default());
    let bulk = Ctx { fill: Some(fill.clone()), forwards: Some(Arc::new(Semaphore::new(MAX_FORWARDS))), ..ctx.clone() };
    let abandoned = ctx.metrics.propose_abandoned.clone();
    tokio::join!(
        batches(urgent, cancel.clone(), None, abandoned.clone(), spawn(ctx)),
        batches(rx, cancel, Some(fill), abandoned, spawn(bulk))
    );
}

/// The batching loop of one queue. Urgent commands (lease and leader duties) have a loop, batches
/// and [`MAX_IN_FLIGHT`] slots of their own, apart from the bulk of writes: a renewal never waits
/// for a slot behind bulk batches in flight, and a renewal forwarded to the leader is answered when
/// it commits, not when a thousand releases forwarded in the same batch do (a disconnect wave of a
/// whole fleet once held follower renewals past the fence that way).
async fn batches(
    mut rx: mpsc::Receiver<Pending>,
    cancel: CancellationToken,
    fill: Option<Arc<Fill>>,
    abandoned: Counter,
    mut spawn: impl FnMut(Vec<Pending>, OwnedSemaphorePermit),
) {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    // A command that did not fit in the last batch: the first of the next.
    let mut carry: Option<Pending> = None;
    loop {
        // Wait for a free slot first: whatever queues meanwhile joins the next batch.
        let permit = tokio::select! {
            _ = cancel.cancelled() => return,
            p = in_flight.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        };
        let first = loop {
            let p = match carry.take() {
                Some(p) => p,
                None => tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    p = rx.recv() => match p { Some(p) => p, None => return },
                },
            };
            if !p.waiter.reply.is_closed() {
                break p;
            }
            abandoned.inc();
        };
        let mut bytes = first.cmd.weight();
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH && bytes <= MAX_BATCH_BYTES {
            let Ok(p) = rx.try_recv() else { break };
            carry = add(&mut batch, &mut bytes, p, &abandoned);
            if carry.is_some() {
                break;
            }
        }
        if let Some(fill) = &fill {
            let mut want = fill.take_answered();
            let until = tokio::time::Instant::now() + MAX_LINGER;
            while carry.is_none() && batch.len() < want.min(MAX_BATCH) {
                let p = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    p = rx.recv() => match p { Some(p) => p, None => break },
                    _ = tokio::time::sleep_until(until) => break,
                };
                carry = add(&mut batch, &mut bytes, p, &abandoned);
                // The other batch in flight committed meanwhile: its callers join this one.
                want += fill.take_answered();
            }
        }
        spawn(batch, permit);
    }
}

/// Adds `p` to `batch` (of `bytes`), or hands it back if it would take the batch over
/// [`MAX_BATCH_BYTES`]: the first of the next batch. A command nobody waits for any more (its
/// caller timed out, or went away) is dropped instead: after a stall the queue holds the
/// commands of callers that were answered `Timeout` and retried, and writing those again would
/// cost the log what the retries already cost it. (Not writing a timed-out command is one of the
/// outcomes its caller was told to expect.)
fn add(batch: &mut Vec<Pending>, bytes: &mut usize, p: Pending, abandoned: &Counter) -> Option<Pending> {
    if p.waiter.reply.is_closed() {
        abandoned.inc();
        return None;
    }
    *bytes += p.cmd.weight();
    if *bytes > MAX_BATCH_BYTES {
        return Some(p);
    }
    batch.push(p);
    None
}

/// Proposes one batch as one log entry and hands each caller its reply, within the propose
/// timeout. On a follower the batch is forwarded to the leader. While no leader is known (an
/// election), or the leader it was sent to cannot be reached (it died), it waits for the next
/// leader instead of failing at once: a handshake parks through an election rather than making
/// its device retry into it. Leader duties (`local_only`) fail at once on a non-leader.
async fn write_batch(ctx: Ctx, batch: Vec<Pending>, permit: OwnedSemaphorePermit) {
    let deadline = tokio::time::Instant::now() + ctx.timeout;
    // The slot is for a write here; a bulk forward holds one of the queue's lanes instead (see
    // `MAX_FORWARDS`), an urgent one neither. A pause (a leader's lease, an election) holds none.
    let mut slot = Some(permit);
    // The commands go to Raft shared, not copied: a refused write (this node does not lead, or
    // leads without its lease) drops Raft's share, so they come back for the next round.
    let (cmds, mut batch): (Vec<Command>, Vec<Waiter>) = batch.into_iter().map(Pending::split).unzip();
    let mut cmds = Arc::new(cmds);
    loop {
        let now = ctx.clock.now_ms();
        Arc::make_mut(&mut cmds).iter_mut().for_each(|c| c.stamp(now));
        let write = tokio::time::timeout_at(deadline, ctx.raft.client_write(Request { cmds: cmds.clone() })).await;
        if let (Some(fill), Ok(Ok(_)), Some(_)) = (&ctx.fill, &write, &slot) {
            fill.committed(batch.len());
        }
        let f = match write {
            Ok(Ok(resp)) => {
                ctx.metrics.proposed_batches.inc();
                ctx.metrics.proposed_commands.inc_by(batch.len() as u64);
                for (w, r) in batch.into_iter().zip(resp.data.replies) {
                    let _ = w.reply.send(Ok(r));
                }
                return;
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => f,
            Ok(Err(RaftError::Fatal(_))) => return answer_all(batch, ProposeError::Stopped),
            // Appended, then truncated by another leader before it committed: it will not commit,
            // and leadership moved; as retryable as no leader at all.
            Ok(Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)))) => {
                return answer_all(batch, ProposeError::NoLeader)
            }
            Ok(Err(e)) => return answer_all(batch, ProposeError::Rejected(e.to_string())),
            Err(_) => return answer_all(batch, ProposeError::Timeout(ctx.timeout.as_millis() as u64)),
        };
        if f.leader_id.is_none() && leads(&ctx.raft) {
            // openraft 0.10 refuses writes while this leader has not heard from a quorum within
            // its lease: just elected, or cut off. Retry after a pause (not a spin) until the
            // deadline; if it lost the leadership meanwhile, the next round forwards.
            let pause = LEASE_RETRY.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            if pause.is_zero() {
                return answer_all(batch, ProposeError::Timeout(ctx.timeout.as_millis() as u64));
            }
            ctx.metrics.propose_lease_waits.inc();
            drop(slot.take());
            tokio::time::sleep(pause).await;
            continue;
        }
        answer_all(split_off(&mut cmds, &mut batch, |w| !w.local_only), ProposeError::NoLeader);
        if batch.is_empty() {
            return;
        }
        let gone = match (f.leader_id, f.leader_node) {
            (Some(id), Some(leader)) => {
                // The batch keeps its slot until a lane is free: with every lane out, what queues
                // meanwhile joins the next batch instead of making forwards of its own. The
                // leader replaced meanwhile (or an election begun): ask Raft again.
                let lane = match &ctx.forwards {
                    None => None,
                    Some(lanes) => {
                        let free = tokio::time::timeout_at(deadline, lanes.clone().acquire_owned());
                        match unless_replaced(&ctx.raft, id, free).await {
                            Some(Ok(Ok(permit))) => Some(Lane::new(permit, &ctx.metrics.forward_lanes_busy)),
                            Some(Ok(Err(_))) => return answer_all(batch, ProposeError::Stopped),
                            Some(Err(_)) => {
                                return answer_all(batch, ProposeError::Timeout(ctx.timeout.as_millis() as u64))
                            }
                            None => continue,
                        }
                    }
                };
                drop(slot.take());
                // Callers that gave up while the batch waited for a lane are not forwarded.
                let gave_up = split_off(&mut cmds, &mut batch, |w| !w.reply.is_closed());
                ctx.metrics.propose_abandoned.inc_by(gave_up.len() as u64);
                if batch.is_empty() {
                    return;
                }
                let sent = {
                    let cmds: Vec<&Command> = cmds.iter().collect();
                    let sent = forward(&ctx.http, &leader.cluster_addr, &cmds, deadline);
                    tokio::pin!(sent);
                    // A lane is held while its leader leads: forwards stuck on a leader that froze
                    // or is cut off do not hold up the forwards to the next one.
                    match lane {
                        None => sent.await,
                        Some(lane) => match unless_replaced(&ctx.raft, id, &mut sent).await {
                            Some(out) => out,
                            None => {
                                drop(lane);
                                sent.await
                            }
                        },
                    }
                };
                match sent {
                    Ok(replies) => {
                        ctx.metrics.forwarded_batches.inc();
                        ctx.metrics.forwarded_commands.inc_by(batch.len() as u64);
                        for (w, r) in batch.into_iter().zip(replies) {
                            let _ = w.reply.send(r);
                        }
                        return;
                    }
                    // The leader is not there (killed): the next one will be.
                    Err(Unreached) => Some(id),
                    Err(Failed(e)) => return answer_all(batch, e),
                }
            }
            _ => None,
        };
        drop(slot.take());
        if !next_leader(&ctx.raft, gone, deadline).await {
            return answer_all(batch, ProposeError::NoLeader);
        }
    }
}

/// How long a leader waits before it retries a write refused for want of a valid leader lease.
const LEASE_RETRY: Duration = Duration::from_millis(10);

/// Whether this node's Raft instance sees itself as the leader.
fn leads(raft: &Raft) -> bool {
    let m = raft.metrics();
    let m = m.borrow_watched();
    m.current_leader == Some(m.id)
}

/// Waits until a leader other than `gone` is known, or `deadline`; whether one is.
async fn next_leader(raft: &Raft, gone: Option<u64>, deadline: tokio::time::Instant) -> bool {
    let mut metrics = raft.metrics();
    let known = metrics
        .wait_until(|m: &openraft::RaftMetrics<TypeConfig>| m.current_leader.is_some() && m.current_leader != gone);
    let found = matches!(tokio::time::timeout_at(deadline, known).await, Ok(Ok(_)));
    found
}

/// Keeps the commands whose callers `keep` keeps, in order; the others' callers are returned.
fn split_off(cmds: &mut Arc<Vec<Command>>, batch: &mut Vec<Waiter>, keep: impl Fn(&Waiter) -> bool) -> Vec<Waiter> {
    if batch.iter().all(&keep) {
        return Vec::new();
    }
    let all = std::mem::take(Arc::make_mut(cmds)).into_iter().zip(std::mem::take(batch));
    let (kept, out): (Vec<_>, Vec<_>) = all.partition(|(_, w)| keep(w));
    let (kept_cmds, kept): (Vec<Command>, Vec<Waiter>) = kept.into_iter().unzip();
    *Arc::make_mut(cmds) = kept_cmds;
    *batch = kept;
    out.into_iter().map(|(_, w)| w).collect()
}

fn answer_all(batch: Vec<Waiter>, e: ProposeError) {
    for w in batch {
        let _ = w.reply.send(Err(e.clone()));
    }
}

#[cfg(test)]
#[path = "proposer_tests.rs"]
mod tests;
