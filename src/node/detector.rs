//! The failure detector: the leader probes every live member each heartbeat and suspects one
//! that stops answering (or whose cluster port refuses connections), and a voter whose leader's
//! process is gone starts the election as soon as the leader's lease allows.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::cluster::Handle;
use crate::config::Timing;
use crate::http::{HttpClient, HttpError};
use crate::machine::{NodeId, NodeLease};
use crate::metrics::{Metrics, ReasonLabel};
use crate::view::ClusterView;

/// The leader's record of when each live member last answered a probe: a member that has not
/// answered for `window` is silent. Silence is only counted over time the leader itself was
/// watching. When its own cluster side stalled (a tick later than `every` + `window`/2: a
/// disconnect wave of 42,750 devices held a 57,000-device leader's runtime for ~2 s), answers
/// may be waiting unread and a member cannot be told from a silent one, so every member gets a
/// fresh window; false suspicions took both healthy followers out of the ring in that wave.
///
/// A lease renewal the member committed counts as an answer ([`Silence::renewed`]): a member that
/// was cut off when a new term began (its window starts then) and whose probes were still timing
/// out, or failing to resolve its name, when it came back has shown it is alive by renewing
/// through this very leader. Without that, the leader suspected a member a moment after the
/// member's renewal committed, when a partition healed within an election timeout of the election.
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
    /// member → its lease's end as last seen in the view.
    lease_until: BTreeMap<NodeId, u64>,
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
        let (heard, refused, lease_until) = Default::default();
        Silence { every, window, heard, refused, lease_until, last_tick: None }
    }

    /// Starts over (another term, or no longer the leader).
    fn forget(&mut self) {
        self.heard.clear();
        self.refused.clear();
        self.lease_until.clear();
        self.last_tick = None;
    }

    /// The view at `at` shows `lease`, `id`'s lease: when it ends later than last seen and was
    /// renewed since the last `ExtendLeases` (which moves every lease's end on a new term without
    /// word from anyone), `id` renewed it itself in the meantime: an answer.
    fn renewed(&mut self, id: NodeId, lease: &NodeLease, at: Instant) {
        let before = self.lease_until.insert(id, lease.lease_until_ms);
        if lease.extendable && before.is_some_and(|b| lease.lease_until_ms > b) {
            self.probed(id, Probe::Answered, at);
        }
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
        self.lease_until.retain(|id, _| live.contains(id));
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
pub(super) async fn port_refuses(addr: &str, within: Duration) -> bool {
    matches!(
        tokio::time::timeout(within, tokio::net::TcpStream::connect(addr)).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// Members this node has found gone itself, which its admission share counts out before the
/// ring drops them. A member's death sends its devices to the survivors within the client's
/// first backoff window (`?fallback=<it>`, [`Reported`](crate::ws::reported::Reported)), while the ring still counts it live for
/// most of a second (a leader's refused-port suspicion, two heartbeats and a commit) or seconds
/// (an election first, if it led): turns told to the refused devices at the old share (the
/// budget over all live nodes) would pace the whole storm at it. So a member that devices report
/// is probed here at once (at most once per half heartbeat); while its cluster port refuses
/// connections (its process is gone: [`port_refuses`]) this node takes its share of the budget
/// over the rest, as the cluster will once the ring drops it. Each member held is probed again
/// every heartbeat and let go as soon as a probe is not refused (it answers, or times out: a
/// partition or a pause is the ring's to judge) or the view no longer counts it live. A report
/// only starts a probe: what a client says never moves the share by itself.
#[derive(Debug, Default)]
pub struct Gone {
    held: BTreeSet<NodeId>,
    /// member → when it was last probed.
    probed: BTreeMap<NodeId, Instant>,
}

impl Gone {
    /// The members held gone.
    pub fn nodes(&self) -> &BTreeSet<NodeId> {
        &self.held
    }

    /// Lets go of members the view no longer counts live (nor `me`): the ring has taken over.
    pub fn follow(&mut self, view: &ClusterView, me: NodeId) {
        let live = |id: &NodeId| *id != me && view.is_live(*id) && view.member(*id).is_some();
        self.held.retain(live);
        self.probed.retain(|id, _| live(id));
    }

    /// Which of `ids` to probe at `now`: live members other than `me`, with their cluster
    /// addresses, none probed within half of `every`. Marks them probed.
    fn due(
        &mut self,
        view: &ClusterView,
        me: NodeId,
        ids: impl IntoIterator<Item = NodeId>,
        now: Instant,
        every: Duration,
    ) -> Vec<(NodeId, String)> {
        let mut due = Vec::new();
        for id in ids {
            let Some(m) = view.member(id).filter(|_| id != me && view.is_live(id)) else { continue };
            if self.probed.get(&id).is_some_and(|at| now.saturating_duration_since(*at) < every / 2) {
                continue;
            }
            self.probed.insert(id, now);
            due.push((id, m.cluster_addr.to_string()));
        }
        due
    }

    /// A probe's outcome; whether the set held changed.
    fn probed(&mut self, id: NodeId, refused: bool) -> bool {
        if refused {
            self.held.insert(id)
        } else {
            self.held.remove(&id)
        }
    }

    /// Probes those of `ids` that are due (each allowed `every` to be refused), all at once;
    /// whether the set held changed.
    pub async fn check(
        &mut self,
        view: &ClusterView,
        me: NodeId,
        ids: impl IntoIterator<Item = NodeId>,
        every: Duration,
    ) -> bool {
        let due = self.due(view, me, ids, Instant::now(), every);
        let probes = due.iter().map(|(id, addr)| async move { (*id, port_refuses(addr, every).await) });
        let mut changed = false;
        for (id, refused) in futures_util::future::join_all(probes).await {
            changed |= self.probed(id, refused);
        }
        changed
    }

    /// Probes every member held again (see [`Gone::check`]).
    pub async fn recheck(&mut self, view: &ClusterView, me: NodeId, every: Duration) -> bool {
        let held: Vec<NodeId> = self.held.iter().copied().collect();
        self.check(view, me, held, every).await
    }
}

/// When a voter whose leader's process is gone may start an election: once no voter can still
/// honour the dead leader's lease. openraft refuses votes for `election_timeout_max`
/// ([`Timing::election_timeout_max_ms`]) after a voter's last AppendEntries, and would itself wait that lease plus
/// a random election timeout; another voter may have heard from the leader up to a heartbeat
/// later than this one. `jitter` (up to half an election timeout) keeps two survivors from
/// splitting the vote.
pub fn prompt_election_after(timing: &Timing, jitter: Duration) -> Duration {
    Duration::from_millis(timing.soonest_election_ms()) + jitter
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
/// (or its restarted process's first renewal) deletes its routes.
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
            .map(|(id, m)| (id, m.cluster_addr.to_string()))
            .collect();
        let ids: Vec<NodeId> = live.iter().map(|(id, _)| *id).collect();
        let now = Instant::now();
        for (id, lease) in view.state.nodes.iter().filter(|(id, _)| ids.contains(id)) {
            silence.renewed(*id, lease, now);
        }
        let silent = silence.tick(now, &ids);
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A lease ending at `until`, renewed since the last `ExtendLeases` or not.
    fn lease(until: u64, extendable: bool, state: crate::machine::LeaseState) -> NodeLease {
        NodeLease {
            lease_until_ms: until,
            state,
            connections: 0,
            routes: 0,
            incarnation: 0,
            extendable,
            suspect_until_ms: 0,
        }
    }

    #[test]
    fn a_member_whose_renewal_commits_is_heard_though_its_probes_go_unanswered() {
        use crate::machine::LeaseState::Live;
        let (every, window) = (Duration::from_millis(250), Duration::from_millis(1000));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // A new term at 0: member 2 was cut off and no probe of it answers (they time out, or its
        // name does not resolve yet, after the partition heals).
        let run = |renews_at: Option<u64>| {
            let mut s = Silence::new(every, window);
            let mut suspected = None;
            for k in 0..=8u64 {
                let ms = k * 250;
                // The new leader's ExtendLeases moves the lease's end at 250 ms: no word from the
                // member. Its own renewal, when it comes, moves it again.
                let l = match renews_at {
                    Some(r) if ms >= r => lease(12_000 + r, true, Live),
                    _ if ms >= 250 => lease(12_000, false, Live),
                    _ => lease(10_000, true, Live),
                };
                s.renewed(2, &l, at(ms));
                if let Some((_, quiet, why)) = s.tick(at(ms), &[2]).into_iter().next() {
                    suspected.get_or_insert((ms, quiet, why));
                }
            }
            suspected
        };
        // Without a renewal: silent for the window, suspected at the first tick past it.
        assert_eq!(run(None), Some((1250, Duration::from_millis(1250), Why::Silent)));
        // Its renewal committed at 750 ms: heard then, so suspected only a window after it if
        // nothing else is heard.
        assert_eq!(run(Some(750)), Some((2000, Duration::from_millis(1250), Why::Silent)));
    }

    /// A view of members 1 (this node), 2, 3 and 4 at `addrs`; all live but 4, whose lease expired.
    fn members_at(addrs: [String; 4]) -> ClusterView {
        use crate::machine::{LeaseState, Member, State};
        let mut s = State::default();
        for (id, addr) in (1..).zip(addrs) {
            s.members
                .insert(id, Member { name: format!("n{id}").into(), cluster_addr: addr.into(), public_url: "".into() });
            let state = if id == 4 { LeaseState::Expired } else { LeaseState::Live };
            s.nodes.insert(id, lease(u64::MAX, true, state));
        }
        ClusterView::new(s, None)
    }

    #[tokio::test]
    async fn a_reported_member_counts_out_while_its_port_refuses_and_no_longer() {
        let every = Duration::from_millis(200);
        let answers = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let refuses = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let (answers, refuses) = (answers.local_addr().unwrap().to_string(), refuses.to_string());
        let view = members_at([refuses.clone(), answers, refuses.clone(), refuses.clone()]);
        let mut gone = Gone::default();
        // Reported: this node itself, a member that answers, one that refuses, one already out.
        assert!(gone.check(&view, 1, [1, 2, 3, 4], every).await);
        assert_eq!(gone.nodes(), &BTreeSet::from([3]));
        // Its process is back: the next probe lets it go.
        let back = tokio::net::TcpListener::bind(&refuses).await.unwrap();
        gone.probed.clear();
        assert!(gone.recheck(&view, 1, every).await);
        assert!(gone.nodes().is_empty());
        drop(back);
        // Gone again; then the ring drops it, and the ring's word is enough.
        gone.probed.clear();
        assert!(gone.check(&view, 1, [3], every).await);
        let mut state = (*view.state).clone();
        state.nodes.get_mut(&3).unwrap().state = crate::machine::LeaseState::Expired;
        gone.follow(&ClusterView::new(state, Some(&view)), 1);
        assert!(gone.nodes().is_empty());
    }

    #[test]
    fn a_member_is_probed_at_most_once_per_half_heartbeat_however_many_devices_report_it() {
        let every = Duration::from_millis(200);
        let view = members_at(["a1".into(), "a2".into(), "a3".into(), "a4".into()]);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut gone = Gone::default();
        assert_eq!(gone.due(&view, 1, [2, 3], at(0), every), vec![(2, "a2".into()), (3, "a3".into())]);
        assert!(gone.due(&view, 1, [2, 3, 2], at(99), every).is_empty());
        assert_eq!(gone.due(&view, 1, [3], at(100), every), vec![(3, "a3".into())]);
        // Names outside the live membership are never probed.
        assert!(gone.due(&view, 1, [1, 4, 9], at(500), every).is_empty());
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
}
