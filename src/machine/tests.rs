//! Rule tests of the state machine (design §3), generic over the backend: they run here on the
//! in-memory tables and in `store` on redb (see [`super::testkit`]). Claims, sweeps, leases,
//! suspicion, terms, cluster time, ring version, events; the streams are in `stream_tests`.

use super::testkit::*;
use super::*;

/// A state machine where node 1 is live and each of `devices` has been claimed once (so it is
/// known: it has a route floor).
pub fn sm_with<B: Backend>(devices: &[&str]) -> Sm<B> {
    let mut sm = Sm::<B>::new();
    sm.one(renew(1, 0, 1 << 40));
    for (i, d) in devices.iter().enumerate() {
        assert!(matches!(sm.one(claim(d, 1, i as u64 + 1, 1, 1)), Reply::Claim(ClaimReply::Accepted { .. })), "{d}");
    }
    sm
}

pub fn apply_emits_the_events_nodes_act_on<B: Backend>() {
    let mut sm = sm_with::<B>(&[]);
    sm.one(renew(2, 0, 100));
    sm.events.clear();
    sm.one(claim("d", 1, 10, 1, 1));
    sm.one(claim("d", 1, 10, 1, 1)); // a replay supersedes nothing
    assert_eq!(sm.events, [], "a fresh claim and its replay kick nobody");
    sm.one(claim("d", 2, 20, 1, 2));
    assert_eq!(sm.events, [Event::Superseded { node: 1, conn: 10 }]);
    sm.events.clear();
    assert_eq!(sm.one(publish("d", "{\"n\":1}", Some("k"), 0, 10, u64::MAX)), published(1, false));
    sm.one(publish("d", "{\"n\":1}", Some("k"), 0, 10, u64::MAX)); // a duplicate delivers nothing more
    let delivery = Delivery { node: 2, conn: 20, device: "d".into(), seq: 1, payload: "{\"n\":1}".into() };
    assert_eq!(sm.events, [Event::Published(delivery)]);
    sm.events.clear();
    sm.one(sweep(50, 0, &[2])); // not lapsed: no event
    sm.one(sweep(500, 0, &[1, 2]));
    assert_eq!(sm.events, [Event::Swept { nodes: vec![2] }]);
    sm.events.clear();
    // A message to a device without a route is stored, not pushed.
    assert_eq!(sm.one(publish("d", "2", None, 0, 10, u64::MAX)), published(2, false));
    assert_eq!(sm.events, []);
}

pub fn a_sweep_applies_only_in_the_term_that_extended_leases<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.one(renew(1, 0, 100));
    sm.one(claim("d", 1, 1, 1, 1));
    // A new leader whose ExtendLeases has not applied yet: a sweep of its term (or of the old
    // one, committed late) changes nothing.
    sm.term += 1;
    let before = sm.everything();
    assert_eq!(sm.one(sweep(500, 0, &[1])), swept(&[], 0));
    assert_eq!(sm.everything(), before, "a sweep before its term's ExtendLeases changed state");
    // The new term extends (node 1 renewed since the last extension): now its sweeps apply...
    sm.one(extend(500, 100));
    assert_eq!(sm.state.extended_term, sm.term);
    assert_eq!(sm.one(sweep(700, 0, &[1])), swept(&[1], 1));
    // ...and a sweep of the older term that commits late does not.
    sm.one(renew(1, 800, 100));
    sm.term -= 1;
    assert_eq!(sm.one(sweep(5_000, 0, &[1])), swept(&[], 0));
    sm.term += 1;
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Live);
}

pub fn a_dead_node_is_extended_once_however_often_leadership_changes<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.entry(vec![renew(1, 0, 1_000), renew(2, 0, 1_000)]);
    // Leadership changes far more often than once per lease; node 1 keeps renewing, 2 is dead.
    for (round, at) in (1..=5u64).zip((500..).step_by(500)) {
        sm.term += 1;
        sm.one(extend(at, 1_000));
        sm.one(renew(1, at, 1_000));
        assert_eq!(sm.lease(2).unwrap().lease_until_ms, 1_500, "round {round}: node 2 extended again");
    }
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 3_500);
    assert_eq!(sm.one(sweep(3_000, 0, &[1, 2])), swept(&[2], 0));
    // A renewal earns the next extension again.
    sm.one(renew(1, 3_000, 100));
    sm.term += 1;
    sm.one(extend(3_000, 1_000));
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 4_000);
}

pub fn a_suspect_leaves_the_ring_keeps_its_routes_and_rejoins_after_the_hold<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.entry(vec![renew(1, 0, 10_000), renew(2, 0, 10_000)]);
    sm.one(claim("d", 2, 7, 0, 1));
    let ring_before = sm.state.ring_version;
    assert_eq!(sm.one(suspect(2, 1_000, 500)), Reply::Suspect(true));
    assert_eq!(sm.state.ring_version, sm.index, "the ring changes at the suspicion's index");
    assert!(sm.state.ring_version > ring_before);
    assert_eq!(sm.state.live_set(), [1]);
    assert_eq!(sm.route("d").0, route(2, 7, 1), "a suspect keeps its routes");
    assert_eq!(sm.lease(2).map(|l| l.routes), Some(1));
    // It takes no new device, but others may take its devices.
    assert_eq!(sm.one(claim("e", 2, 8, 0, 1)), not_live());
    assert_eq!(sm.one(suspect(2, 1_100, 500)), Reply::Suspect(false), "already suspect");
    // Its renewals still extend its lease; within the hold it stays out of the ring.
    sm.one(renew(2, 1_400, 10_000));
    assert_eq!(sm.lease(2).map(|l| (l.state, l.lease_until_ms)), Some((LeaseState::Suspect, 11_400)));
    let ring = sm.state.ring_version;
    sm.one(renew(2, 1_500, 10_000));
    assert_eq!(sm.lease(2).unwrap().state, LeaseState::Live, "cleared at suspicion + hold");
    assert_eq!(sm.state.ring_version, sm.index);
    assert!(sm.state.ring_version > ring);
    // Draining, expired and unknown nodes are not suspected.
    sm.one(drain(2, 1_600));
    assert_eq!(sm.one(suspect(2, 1_700, 500)), Reply::Suspect(false));
    assert_eq!(sm.one(suspect(9, 1_700, 500)), Reply::Suspect(false));
    // A sweep still expires a suspect whose lease lapsed.
    sm.one(suspect(1, 1_800, 500));
    assert_eq!(sm.one(sweep(20_000, 0, &[1, 2])), swept(&[1, 2], 1));
}

pub fn cluster_time_is_the_newest_stamp_applied<B: Backend>() {
    let mut sm = Sm::<B>::new();
    assert_eq!(sm.state.clock_ms, 0);
    sm.entry(vec![renew(1, 500, 10), claim("d", 1, 1, 0, 1)]);
    assert_eq!(sm.state.clock_ms, 500);
    sm.one(renew(2, 300, 10)); // an older stamp
    assert_eq!(sm.state.clock_ms, 500);
    sm.one(publish("d", "{}", None, 900, 10, 10));
    assert_eq!(sm.state.clock_ms, 900);
    let sm = sm.reopen();
    assert_eq!(sm.state.clock_ms, 900);
}

pub fn the_admission_budget_is_replicated_and_survives_a_reopen<B: Backend>() {
    use crate::machine::{Budget, SetAdmission};
    let mut sm = Sm::<B>::new();
    assert_eq!(sm.state.admission, None);
    let budget = Budget { milli_rate: 30_000, burst: 9 };
    let set = |budget| Command::SetAdmission(SetAdmission { budget });
    assert_eq!(sm.one(set(Some(budget))), Reply::SetAdmission(()));
    assert_eq!(sm.state.admission, Some(budget));
    // A budget the admin API would refuse (a forwarded command is not checked on the way in)
    // leaves the one in force: a rate of 0 would stall every node's bucket.
    for bad in [Budget { milli_rate: 0, burst: 9 }, Budget { milli_rate: 30_000, burst: 0 }] {
        assert_eq!(sm.one(set(Some(bad))), Reply::SetAdmission(()));
        assert_eq!(sm.state.admission, Some(budget));
    }
    let mut sm = sm.reopen();
    assert_eq!(sm.state.admission, Some(budget));
    sm.one(set(None));
    assert_eq!(sm.reopen().state.admission, None);
}

pub fn claim_accept_supersede_stale_and_epoch_order<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.entry(vec![renew(1, 1000, 10_000), renew(2, 1000, 10_000), renew(3, 1000, 10_000)]);
    assert_eq!(sm.one(claim("d", 1, 10, 1, 1)), accepted(1, None));
    assert_eq!(sm.route("d"), (route(1, 10, 1), floor(1, 1, 1, 1)));
    assert_eq!(sm.one(claim("d", 2, 20, 1, 2)), accepted(2, Some((1, 10))));
    assert_eq!(sm.route("d"), (route(2, 20, 2), floor(2, 1, 2, 2)));
    let before = sm.everything();
    // Equal, lower attempt, lower epoch with a higher attempt: all stale, naming the floor.
    for (node, conn, e, a) in [(3, 30, 1, 2), (1, 10, 1, 1), (3, 31, 0, 99), (2, 20, 1, 2 - 1)] {
        assert_eq!(sm.one(claim("d", node, conn, e, a)), stale(1, 2), "claim ({e}, {a}) on {node}/{conn}");
    }
    assert_eq!(sm.everything(), before, "a stale claim changed state");
    // A higher epoch wins even with a lower attempt.
    assert_eq!(sm.one(claim("d", 3, 30, 2, 0)), accepted(3, Some((2, 20))));
    assert_eq!(sm.route("d"), (route(3, 30, 3), floor(3, 2, 0, 3)));
    assert_eq!(sm.one(claim("d", 1, 10, 1, 100)), stale(2, 0));
    let counts: Vec<u64> = (1..=3).map(|n| sm.lease(n).unwrap().routes).collect();
    assert_eq!(counts, [0, 0, 1]);
}

pub fn claim_replay_is_idempotent<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.one(renew(1, 0, 10_000));
    sm.one(renew(2, 0, 10_000));
    assert_eq!(sm.one(claim("d", 1, 7, 3, 4)), accepted(1, None));
    assert_eq!(sm.one(claim("d", 2, 8, 3, 5)), accepted(2, Some((1, 7))));
    let before = sm.everything();
    // The exact replay (e.g. a forwarded proposal applied twice), also twice in one batch.
    assert_eq!(sm.one(claim("d", 2, 8, 3, 5)), accepted(2, None));
    assert_eq!(sm.entry(vec![claim("d", 2, 8, 3, 5), claim("d", 2, 8, 3, 5)]), [accepted(2, None), accepted(2, None)]);
    assert_eq!(sm.everything(), before, "a replayed claim changed state");
    assert_eq!(sm.lease(2).unwrap().routes, 1);
    // The same (epoch, attempt) on another conn or node is not a replay.
    assert_eq!(sm.one(claim("d", 2, 9, 3, 5)), stale(3, 5));
    assert_eq!(sm.one(claim("d", 1, 8, 3, 5)), stale(3, 5));
    // The next real claim gets exactly the next version.
    assert_eq!(sm.one(claim("d", 1, 9, 3, 6)), accepted(3, Some((2, 8))));
}

pub fn claim_by_node_without_live_lease_is_refused_and_changes_nothing<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.one(renew(1, 0, 100));
    sm.one(renew(2, 0, 10_000));
    sm.one(renew(4, 0, 10_000)); // not a member: no lease
    assert_eq!(sm.one(claim("held", 2, 1, 1, 1)), accepted(1, None));
    assert_eq!(sm.one(drain(2, 50)), Reply::Drain(true));
    assert_eq!(sm.one(sweep(200, 0, &[1])), swept(&[1], 0));
    let before = sm.everything();
    let meta_before = sm.state.nodes.clone();
    // 3: never renewed; 4: not a member; 2: draining; 1: expired.
    for node in [3, 4, 2, 1] {
        assert_eq!(sm.one(claim("fresh", node, 5, 1, 1)), not_live(), "node {node}");
        assert_eq!(sm.one(claim("held", node, 5, 9, 9)), not_live(), "node {node}");
    }
    assert_eq!(sm.everything(), before);
    assert_eq!(sm.state.nodes, meta_before);
    assert_eq!(sm.route("fresh"), (None, None));
    assert_eq!(sm.route("held"), (route(2, 1, 1), floor(1, 1, 1, 2)));
    // The refused claims raised no floor: the same (epoch, attempt) is accepted once live.
    sm.one(renew(3, 0, 10_000));
    assert_eq!(sm.one(claim("held", 3, 5, 9, 9)), accepted(2, Some((2, 1))));
    assert_eq!(sm.one(claim("fresh", 3, 5, 1, 1)), accepted(1, None));
}

pub fn sweep_never_deletes_a_floor<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.one(renew(1, 0, 100));
    sm.one(renew(2, 0, 1000));
    sm.entry(vec![claim("d0", 1, 1, 1, 5), claim("d1", 1, 2, 2, 3), claim("d2", 2, 3, 1, 1)]);
    let floors: Vec<_> = ["d0", "d1"].iter().map(|d| sm.route(d).1).collect();
    assert_eq!(sm.one(sweep(200, 10, &[1, 2])), swept(&[1], 2));
    assert_eq!(sm.lease(1).map(|l| (l.state, l.routes)), Some((LeaseState::Expired, 0)));
    assert_eq!(sm.lease(2).map(|l| (l.state, l.routes)), Some((LeaseState::Live, 1)));
    assert_eq!(sm.route("d0"), (None, floors[0].clone()));
    assert_eq!(sm.route("d1"), (None, floors[1].clone()));
    assert_eq!(sm.route("d2").0, route(2, 3, 1));
    // Late claims stay fenced by the floor, on any live node.
    assert_eq!(sm.one(claim("d0", 2, 9, 1, 5)), stale(1, 5));
    assert_eq!(sm.one(claim("d0", 2, 9, 1, 4)), stale(1, 5));
    assert_eq!(sm.one(claim("d1", 2, 9, 1, 9)), stale(2, 3));
    // A newer claim is accepted and its version continues from the floor.
    assert_eq!(sm.one(claim("d0", 2, 9, 1, 6)), accepted(2, None));
    // The same holds after ReleaseNode and Release: routes go, floors stay.
    assert_eq!(sm.one(ReleaseNode { node: 2 }.into()), Reply::ReleaseNode(2));
    assert_eq!(sm.route("d0"), (None, floor(2, 1, 6, 2)));
    assert_eq!(sm.one(claim("d0", 2, 9, 1, 6)), stale(1, 6));
}

pub fn duplicate_sweep_changes_nothing<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.one(renew(1, 0, 100));
    sm.one(renew(2, 0, 1000));
    sm.entry(vec![claim("a", 1, 1, 1, 1), claim("b", 2, 1, 1, 1)]);
    assert_eq!(sm.one(sweep(200, 0, &[1, 2])), swept(&[1], 1));
    let (before, meta) = (sm.everything(), sm.state.clone());
    assert_eq!(sm.one(sweep(200, 0, &[1, 2])), swept(&[], 0));
    assert_eq!(sm.entry(vec![sweep(200, 0, &[1, 1]), sweep(300, 0, &[1, 3, 4])]), [swept(&[], 0), swept(&[], 0)]);
    assert_eq!(sm.everything(), before);
    assert_eq!((sm.state.nodes.clone(), sm.state.ring_version), (meta.nodes, meta.ring_version));
}

pub fn sweep_before_lease_and_grace_lapse_changes_nothing<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.one(renew(1, 0, 100)); // lease_until 100
    sm.one(claim("a", 1, 1, 1, 1));
    let before = sm.everything();
    // lease_until + grace < at_ms is required: 100 + 10 < 110 is false.
    for (at, grace) in [(50, 0), (100, 0), (105, 10), (110, 10)] {
        assert_eq!(sm.one(sweep(at, grace, &[1])), swept(&[], 0), "sweep at {at} grace {grace}");
    }
    assert_eq!(sm.everything(), before);
    // A renewal that committed before a sweep proposed with stale candidates keeps the node.
    sm.one(renew(1, 90, 100)); // lease_until 190
    let before = sm.everything();
    assert_eq!(sm.one(sweep(150, 10, &[1])), swept(&[], 0));
    assert_eq!(sm.everything(), before);
    assert_eq!(sm.route("a").0, route(1, 1, 1));
    assert_eq!(sm.one(sweep(201, 10, &[1])), swept(&[1], 1));
}

pub fn renewal_never_shortens_a_lease<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.one(renew(1, 1000, 500));
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 1500);
    sm.one(renew(1, 900, 500)); // earlier at_ms
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 1500);
    sm.one(renew(1, 1000, 100)); // shorter lease
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 1500);
    sm.one(renew(1, 1200, 500));
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 1700);
    let sm = sm.reopen();
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 1700);
}

pub fn extend_leases_pushes_unexpired_leases_and_never_shortens<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.entry(vec![renew(1, 0, 1700), renew(2, 0, 5000), renew(3, 0, 100)]);
    assert_eq!(sm.one(sweep(500, 0, &[3])), swept(&[3], 0));
    sm.one(drain(2, 600));
    sm.one(ExtendLeases { at_ms: 2000, lease_ms: 1000 }.into());
    let leases: Vec<_> = (1..=3).map(|n| sm.lease(n).map(|l| (l.lease_until_ms, l.state)).unwrap()).collect();
    assert_eq!(leases, [(3000, LeaseState::Live), (5000, LeaseState::Draining), (100, LeaseState::Expired)]);
    sm.one(ExtendLeases { at_ms: 100, lease_ms: 100 }.into()); // an older leader's extension
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 3000);
    let sm = sm.reopen();
    assert_eq!(sm.lease(2).unwrap().lease_until_ms, 5000);
}

pub fn renew_from_non_member_changes_nothing<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.one(renew(1, 0, 1000));
    let (before, meta) = (sm.everything(), sm.state.clone());
    assert_eq!(
        sm.one(Renew { node: 9, at_ms: 10, lease_ms: 1000, connections: 3, draining: false, incarnation: 0 }.into()),
        Reply::Renew(())
    );
    assert_eq!(sm.everything(), before);
    assert_eq!((sm.state.nodes.clone(), sm.state.ring_version), (meta.nodes, meta.ring_version));
    assert_eq!(sm.one(claim("d", 9, 1, 1, 1)), not_live());
}

pub fn forget_removes_lease_and_routes_but_not_floors<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.entry(vec![renew(1, 0, 1000), renew(2, 0, 1000)]);
    sm.entry(vec![claim("a", 1, 1, 1, 4), claim("b", 1, 2, 1, 1), claim("c", 2, 3, 1, 1)]);
    let floor_a = sm.route("a").1;
    assert_eq!(sm.one(Forget { node: 1 }.into()), Reply::Forget(2));
    assert!(sm.lease(1).is_none());
    assert_eq!(sm.route("a"), (None, floor_a));
    assert_eq!(sm.route("c").0, route(2, 3, 1));
    assert_eq!(sm.one(claim("a", 2, 5, 1, 4)), stale(1, 4));
    let sm = sm.reopen();
    assert!(sm.lease(1).is_none(), "the forgotten lease row came back from disk");
    assert_eq!(sm.state.nodes.keys().copied().collect::<Vec<_>>(), [2]);
    assert_eq!(sm.b.dump().routes.keys().map(String::as_str).collect::<Vec<_>>(), ["c"]);
}

pub fn ring_version_changes_exactly_with_the_live_set<B: Backend>() {
    let mut sm = Sm::<B>::new();
    assert_eq!(sm.state.ring_version, 0);
    let mut expect = 0;
    let mut step = |sm: &mut Sm<B>, cmd: Command, changes: bool| {
        sm.one(cmd.clone());
        if changes {
            expect = sm.index;
        }
        assert_eq!(sm.state.ring_version, expect, "after {cmd:?}");
    };
    step(&mut sm, renew(1, 0, 100), true); // a new live node
    step(&mut sm, renew(1, 10, 100), false); // a plain renewal
    step(&mut sm, renew(2, 0, 1000), true);
    step(&mut sm, claim("d", 1, 1, 1, 1), false);
    step(&mut sm, Release { device: "d".into(), conn: 1 }.into(), false);
    step(&mut sm, ExtendLeases { at_ms: 0, lease_ms: 10 }.into(), false);
    step(&mut sm, sweep(50, 0, &[1, 2]), false); // nothing lapsed
    step(&mut sm, drain(2, 60), true);
    step(&mut sm, drain(2, 60), false);
    step(
        &mut sm,
        Renew { node: 3, at_ms: 0, lease_ms: 100, connections: 0, draining: true, incarnation: 0 }.into(),
        false,
    );
    step(&mut sm, sweep(500, 0, &[1]), true); // 1 expires
    step(&mut sm, sweep(500, 0, &[3]), false); // 3 was draining: not in the live set
    step(&mut sm, renew(9, 0, 100), false); // not a member
    step(&mut sm, renew(1, 600, 100), true); // back from expired
    step(&mut sm, Forget { node: 1 }.into(), true);
    step(&mut sm, renew(3, 700, 100), true);
    sm.membership(&[1, 2]); // 3 leaves the membership, so the live set
    assert_eq!(sm.state.ring_version, sm.index);
    let sm = sm.reopen();
    assert_eq!(sm.state.ring_version, sm.index);
}

pub fn state_survives_reopen<B: Backend>() {
    let mut sm = Sm::<B>::new();
    sm.entry(vec![Init { cluster_id: "c1".into() }.into(), renew(1, 0, 1000), renew(2, 5, 1000)]);
    sm.entry(vec![claim("a", 1, 1, 1, 1), claim("b", 2, 1, 1, 1), Init { cluster_id: "c2".into() }.into()]);
    sm.one(drain(2, 9));
    assert_eq!(sm.state.cluster_id.as_deref(), Some("c1"));
    let bytes = sm.everything();
    let sm = sm.reopen();
    assert_eq!(sm.state.voters.iter().copied().collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(sm.state.nodes[&2].state, LeaseState::Draining);
    assert_eq!(sm.everything(), bytes);
    assert_eq!(sm.route("a").0, route(1, 1, 1));
}

pub fn drain_sticks_until_a_new_incarnation_renews<B: Backend>() {
    let mut sm = Sm::<B>::new();
    let renew_as = |incarnation: u64, draining: bool| {
        Renew { node: 1, at_ms: 10, lease_ms: 1000, connections: 0, draining, incarnation }.into()
    };
    sm.one(renew_as(7, false));
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Live);
    sm.one(drain(1, 20));
    // A renewal from the same process that raced the drain (sent as not draining) keeps it out.
    sm.one(renew_as(7, false));
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Draining, "a stale renewal undid a drain");
    // A restarted process (new incarnation) is live again.
    sm.one(renew_as(8, false));
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Live);
    // An expired node of the same process comes back when it renews (paused and resumed).
    sm.one(Sweep { at_ms: 5_000, grace_ms: 0, candidates: vec![1] }.into());
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Expired);
    sm.one(Renew { node: 1, at_ms: 6_000, lease_ms: 1000, connections: 0, draining: false, incarnation: 8 }.into());
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Live);
}

pub fn a_restarted_process_first_renewal_releases_its_predecessors_routes_once<B: Backend>() {
    let mut sm = Sm::<B>::new();
    let renew_as = |incarnation: u64, at_ms: u64| Renew {
        node: 1,
        at_ms,
        lease_ms: 10_000,
        connections: 0,
        draining: false,
        incarnation,
    };
    // Process 7 of node 1 claims two devices; node 2 one.
    assert_eq!(sm.one(FirstRenew(renew_as(7, 10)).into()), Reply::FirstRenew(0), "a new node has nothing to release");
    sm.one(renew(2, 10, 10_000));
    for (device, node) in [("a", 1), ("b", 1), ("c", 2)] {
        assert!(matches!(sm.one(claim(device, node, 1, 0, 1)), Reply::Claim(ClaimReply::Accepted { .. })));
    }
    // Killed; process 8 starts within the lease: its first renewal deletes process 7's routes,
    // not node 2's, and keeps every floor.
    assert_eq!(sm.one(FirstRenew(renew_as(8, 20)).into()), Reply::FirstRenew(2));
    assert_eq!(sm.route("a").0, None);
    assert_eq!(sm.route("b").0, None);
    assert_eq!(sm.route("c").0.map(|r| r.node), Some(2));
    assert_eq!(sm.route("a").1.map(|f| f.max_attempt), Some(1), "the floor stays");
    assert_eq!(sm.lease(1).map(|l| (l.incarnation, l.routes)), Some((8, 0)));
    // Process 8 claims "a" again; a late duplicate of its first renewal (a retry whose first try
    // committed too) only renews.
    assert!(matches!(sm.one(claim("a", 1, 2, 0, 2)), Reply::Claim(ClaimReply::Accepted { .. })));
    assert_eq!(sm.one(FirstRenew(renew_as(8, 30)).into()), Reply::FirstRenew(0));
    assert_eq!(sm.route("a").0.map(|r| (r.node, r.conn)), Some((1, 2)), "the new process's route stays");
    assert_eq!(sm.lease(1).map(|l| l.lease_until_ms), Some(10_030));
}

mod on_mem {
    crate::machine::testkit::backend_tests!(crate::machine::testkit::MemBackend);
}
