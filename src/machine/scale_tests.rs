//! Rule tests of elastic scaling (issue 15), generic over the backend like [`super::tests`]: the
//! cluster event log (each change with its trigger, counts and ring version; bounded; carried by
//! snapshots and reopens), declared capacity, and the serial scale-in lock.

use super::testkit::*;
use super::*;

fn renew_with(node: NodeId, at_ms: u64, connections: u64, incarnation: u64) -> Command {
    Renew { node, at_ms, lease_ms: 10_000, connections, draining: false, incarnation }.into()
}

fn begin(node: NodeId, owner: u64, at_ms: u64, force: bool) -> Command {
    BeginScaleIn { node, owner, at_ms, ttl_ms: 1_000, force }.into()
}

fn end(node: NodeId, owner: u64, outcome: ScaleInOutcome) -> Command {
    EndScaleIn { node, owner, outcome }.into()
}

fn capacity(node: NodeId, capacity_connections: u64) -> Command {
    SetCapacity { node, capacity_connections }.into()
}

fn events<B: Backend>(sm: &Sm<B>) -> Vec<ClusterEvent> {
    sm.b.dump().cluster_events.into_values().collect()
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Nodes 1..=3 voters and live with 10, 20, 30 connections.
fn three_live<B: Backend>() -> Sm<B> {
    let mut sm = Sm::<B>::new();
    for id in 1..=3 {
        sm.one(renew_with(id, 100, id * 10, 0));
    }
    sm
}

pub fn the_event_log_records_each_change_with_its_trigger_counts_and_ring<B: Backend>() {
    let mut sm = three_live::<B>();
    let log = events(&sm);
    assert_eq!(log[0].trigger, Trigger::Join, "{:?}", log[0]);
    assert_eq!(log[0].detail, "n1 added as a voter; n2 added as a voter; n3 added as a voter");
    let first_leases: Vec<_> = log[1..].iter().map(|e| (e.trigger, e.node)).collect();
    assert_eq!(first_leases, [(Trigger::Join, Some(1)), (Trigger::Join, Some(2)), (Trigger::Join, Some(3))]);
    assert_eq!(log[3].live_before, names(&["n1", "n2"]));
    assert_eq!(log[3].live_after, names(&["n1", "n2", "n3"]));
    assert_eq!(log[3].ring_version, log[3].index);
    assert_eq!(log[3].connections, 60);

    // A claim, a renewal of a live node: no event.
    sm.one(claim("d", 3, 1, 0, 1));
    sm.one(renew_with(1, 200, 11, 0));
    assert_eq!(events(&sm).len(), 4);

    sm.one(drain(3, 300));
    let e = events(&sm).pop().unwrap();
    assert_eq!((e.trigger, e.node, e.index, e.ring_version), (Trigger::Drain, Some(3), sm.index, sm.index));
    assert_eq!((e.live_before, e.live_after), (names(&["n1", "n2", "n3"]), names(&["n1", "n2"])));
    assert_eq!((e.connections, e.routes, e.at_ms), (61, 1, 300));
    assert_eq!(sm.state.ring_version, e.ring_version);

    sm.one(suspect(2, 400, 50));
    let e = events(&sm).pop().unwrap();
    assert_eq!((e.trigger, e.live_after.clone()), (Trigger::Suspicion, names(&["n1"])));
    sm.one(renew_with(2, 500, 20, 0));
    let e = events(&sm).pop().unwrap();
    assert_eq!((e.trigger, e.live_after.clone()), (Trigger::LeaseRecovery, names(&["n1", "n2"])));

    // The drained node stops renewing: swept, its route deleted.
    sm.one(sweep(50_000, 0, &[3]));
    let e = events(&sm).pop().unwrap();
    assert_eq!((e.trigger, e.node, e.routes), (Trigger::Sweep, Some(3), 0));

    sm.membership(&[1, 2]);
    let e = events(&sm).pop().unwrap();
    assert_eq!((e.trigger, e.node, e.detail.as_str()), (Trigger::Leave, Some(3), "n3 removed from the membership"));
    let seqs: Vec<u64> = events(&sm).iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(sm.state.event_seq, seqs.len() as u64);

    // Two changes in one entry: each event reports the ring version the entry ends with.
    sm.entry(vec![drain(2, 600), drain(1, 600)]);
    let log = events(&sm);
    let last_two: Vec<_> =
        log[log.len() - 2..].iter().map(|e| (e.trigger, e.ring_version, e.live_after.len())).collect();
    assert_eq!(last_two, [(Trigger::Drain, sm.index, 1), (Trigger::Drain, sm.index, 0)]);
    assert_eq!(sm.state.ring_version, sm.index);

    // Snapshots and reopens carry the log (and its cursor) as it is.
    let copy = sm.install_copy();
    assert_eq!(events(&copy), events(&sm));
    assert_eq!(copy.state.event_seq, sm.state.event_seq);
    let before = events(&sm);
    let sm = sm.reopen();
    assert_eq!(events(&sm), before);
}

pub fn the_event_log_keeps_the_newest_events_only<B: Backend>() {
    let mut sm = three_live::<B>();
    let start = sm.state.event_seq;
    let mut incarnation = 0;
    while sm.state.event_seq < start + events::KEEP + 10 {
        sm.one(drain(3, 1_000));
        incarnation += 1;
        sm.one(renew_with(3, 1_000, 0, incarnation));
    }
    let log = events(&sm);
    assert_eq!(log.len() as u64, events::KEEP);
    assert_eq!(log.last().unwrap().seq, sm.state.event_seq);
    assert_eq!(log[0].seq, sm.state.event_seq - events::KEEP + 1);
    // Strings dominate an event's size (numbers are at most 10 bytes each in bincode's varints).
    let size = |e: &ClusterEvent| {
        let names: usize = e.live_before.iter().chain(&e.live_after).map(|n| n.len() + 1).sum();
        names + e.detail.len() + 96
    };
    assert!(log.iter().all(|e| size(e) <= events::MAX_EVENT_BYTES));
}

pub fn one_scale_in_at_a_time_and_the_lock_lapses_unless_extended<B: Backend>() {
    let mut sm = three_live::<B>();
    assert_eq!(sm.one(begin(3, 7, 1_000, false)), Reply::BeginScaleIn(ScaleInReply::Locked { expires_at_ms: 2_000 }));
    let e = events(&sm).pop().unwrap();
    assert_eq!((e.trigger, e.node, e.detail.as_str()), (Trigger::ScaleIn, Some(3), "scale-in of n3 started"));
    // Another scale-in (another node, or the same node from another shell) is refused.
    let busy =
        Reply::BeginScaleIn(ScaleInReply::Busy { node: 3, owner: 7, started_at_ms: 1_000, expires_at_ms: 2_000 });
    assert_eq!(sm.one(begin(2, 8, 1_500, false)), busy);
    assert_eq!(sm.one(begin(3, 8, 1_500, true)), busy);
    // The holder extends it.
    assert_eq!(sm.one(begin(3, 7, 1_800, false)), Reply::BeginScaleIn(ScaleInReply::Locked { expires_at_ms: 2_800 }));
    // A drain of the node being scaled in is recorded as a scale-in step.
    sm.one(drain(3, 1_900));
    assert_eq!(events(&sm).pop().unwrap().trigger, Trigger::ScaleIn);
    // Only the holder releases it.
    assert_eq!(sm.one(end(3, 8, ScaleInOutcome::Done)), Reply::EndScaleIn(false));
    assert_eq!(sm.one(end(3, 7, ScaleInOutcome::Done)), Reply::EndScaleIn(true));
    assert_eq!(events(&sm).pop().unwrap().detail, "scale-in of n3 finished");
    assert_eq!(sm.state.scale_in, None);

    // n3 restarts (a new incarnation): live again.
    sm.one(renew_with(3, 2_000, 30, 1));
    assert_eq!(events(&sm).pop().unwrap().trigger, Trigger::LeaseRecovery);
    // A lock whose holder vanished lapses: a later scale-in takes it over.
    assert!(matches!(sm.one(begin(1, 9, 3_000, true)), Reply::BeginScaleIn(ScaleInReply::Locked { .. })));
    assert!(matches!(sm.one(begin(2, 10, 3_900, true)), Reply::BeginScaleIn(ScaleInReply::Busy { .. })));
    assert!(matches!(sm.one(begin(2, 10, 4_100, true)), Reply::BeginScaleIn(ScaleInReply::Locked { .. })));
    let sm = sm.reopen();
    assert_eq!(sm.state.scale_in.as_ref().map(|l| (l.node, l.owner)), Some((2, 10)), "the lock survives a reopen");
}

pub fn a_scale_in_keeps_a_quorum_of_healthy_voters<B: Backend>() {
    let mut sm = three_live::<B>();
    // 3 voters, one suspect: removing a live one would leave 2 voters of which 1 is live.
    sm.one(suspect(2, 200, 1_000_000));
    assert_eq!(
        sm.one(begin(3, 1, 300, true)),
        Reply::BeginScaleIn(ScaleInReply::Quorum { voters_after: 2, healthy_after: 1, needed: 2 })
    );
    // Removing the suspect itself is fine: the two that stay are live.
    assert!(matches!(sm.one(begin(2, 1, 300, true)), Reply::BeginScaleIn(ScaleInReply::Locked { .. })));
    sm.one(end(2, 1, ScaleInOutcome::Aborted));
    assert_eq!(events(&sm).pop().unwrap().detail, "scale-in of n2 aborted");
    // Two voters: removing either leaves one, never allowed.
    sm.membership(&[1, 3]);
    assert_eq!(
        sm.one(begin(3, 1, 400, true)),
        Reply::BeginScaleIn(ScaleInReply::Quorum { voters_after: 1, healthy_after: 1, needed: 2 })
    );
    assert_eq!(sm.one(begin(9, 1, 400, true)), Reply::BeginScaleIn(ScaleInReply::NotMember));
    assert_eq!(sm.state.scale_in, None, "a refusal takes no lock");
}

pub fn a_scale_in_needs_the_remaining_capacity_unless_forced<B: Backend>() {
    let mut sm = three_live::<B>();
    // 60 connections; undeclared capacity: no check.
    assert!(matches!(sm.one(begin(3, 1, 200, false)), Reply::BeginScaleIn(ScaleInReply::Locked { .. })));
    sm.one(end(3, 1, ScaleInOutcome::Aborted));
    for id in 1..=3 {
        sm.one(capacity(id, 25));
    }
    assert_eq!(sm.state.capacity.get(&2), Some(&25));
    assert_eq!(
        sm.one(begin(3, 1, 300, false)),
        Reply::BeginScaleIn(ScaleInReply::Capacity { connections: 60, capacity_after: 50 })
    );
    assert!(matches!(sm.one(begin(3, 1, 300, true)), Reply::BeginScaleIn(ScaleInReply::Locked { .. })));
    sm.one(end(3, 1, ScaleInOutcome::Aborted));
    sm.one(capacity(1, 40));
    assert!(matches!(sm.one(begin(3, 1, 400, false)), Reply::BeginScaleIn(ScaleInReply::Locked { .. })));
    // A capacity of 0 clears it; a forgotten node's goes with it.
    sm.one(capacity(2, 0));
    assert_eq!(sm.state.capacity.get(&2), None);
    sm.one(Forget { node: 1 }.into());
    assert_eq!(sm.state.capacity.get(&1), None);
    let sm = sm.reopen();
    assert_eq!(sm.state.capacity.get(&3), Some(&25));
}

pub fn a_node_publishes_its_connection_limit_and_forgetting_it_clears_it<B: Backend>() {
    let mut sm = three_live::<B>();
    let limit = |node, max_connections| -> Command { SetMaxConnections { node, max_connections }.into() };
    for id in 1..=3 {
        sm.one(limit(id, 100 * id));
    }
    sm.one(limit(9, 5));
    assert_eq!(sm.state.max_connections.get(&9), None, "not a member: ignored");
    sm.one(limit(2, 0));
    assert_eq!(sm.state.max_connections.get(&2), None, "0 clears it");
    sm.one(Forget { node: 1 }.into());
    assert_eq!(sm.state.max_connections.get(&1), None, "a forgotten node's goes with it");
    let sm = sm.reopen();
    assert_eq!(sm.state.max_connections, BTreeMap::from([(3, 300)]), "it survives a reopen");
}
