//! Rule tests of the state machine (design §3 and §6), generic over the backend: they run here on
//! the in-memory tables and in `store` on redb (see [`super::testkit`]). Claims, sweeps, leases,
//! ring version, events, and the message streams (publish, idempotency, retention, ack).

use super::testkit::*;
use super::*;

/// Large enough that retention never drops anything.
pub const KEEP_ALL: u64 = 1_000_000;
pub const FOREVER: u64 = u64::MAX;

/// A publish with retention that keeps everything.
fn pub_all(device: &str, payload: &str, key: Option<&str>) -> Command {
    publish(device, payload, key, 1_000, KEEP_ALL, FOREVER)
}

fn head(head: u64, oldest: u64) -> Head {
    Head { head, oldest }
}

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

fn seqs(r: &StreamRead) -> Vec<u64> {
    r.messages.iter().map(|(s, _)| *s).collect()
}

fn payloads(r: &StreamRead) -> Vec<String> {
    r.messages.iter().map(|(_, m)| m.payload.clone()).collect()
}

/// The idempotency table of a device, as (key, seq) pairs.
pub fn idem<B: Backend>(sm: &Sm<B>, device: &str) -> Vec<(String, u64)> {
    sm.b.dump().idempotency.into_iter().filter(|((d, _), _)| d == device).map(|((_, k), s)| (k, s)).collect()
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
    assert_eq!(sm.one(pub_all("d", "{\"n\":1}", Some("k"))), published(1, false));
    sm.one(pub_all("d", "{\"n\":1}", Some("k"))); // a duplicate delivers nothing more
    let delivery = Delivery { node: 2, conn: 20, device: "d".into(), seq: 1, payload: "{\"n\":1}".into() };
    assert_eq!(sm.events, [Event::Published(delivery)]);
    sm.events.clear();
    sm.one(sweep(50, 0, &[2])); // not lapsed: no event
    sm.one(sweep(500, 0, &[1, 2]));
    assert_eq!(sm.events, [Event::Swept { nodes: vec![2] }]);
    sm.events.clear();
    // A message to a device without a route is stored, not pushed.
    assert_eq!(sm.one(pub_all("d", "2", None)), published(2, false));
    assert_eq!(sm.events, []);
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

pub fn publish_needs_a_known_device_then_seqs_count_up_and_reads_page<B: Backend>() {
    let mut sm = sm_with::<B>(&[]);
    let before = sm.everything();
    assert_eq!(sm.one(pub_all("a", "{\"n\":0}", None)), Reply::Publish(PublishReply::NoSuchDevice));
    assert_eq!(sm.one(pub_all("a", "{\"n\":0}", Some("k"))), Reply::Publish(PublishReply::NoSuchDevice));
    assert_eq!(sm.everything(), before, "a publish to an unknown device changed state");
    let t = sm.b.dump();
    assert!(t.heads.is_empty() && t.messages.is_empty() && t.idempotency.is_empty());
    assert_eq!(sm.read("a", 0, 10), StreamRead { head: head(0, 1), messages: vec![] });

    // Known once a claim was accepted; also after its route is gone (the floor stays).
    assert!(matches!(sm.one(claim("a", 1, 7, 1, 1)), Reply::Claim(ClaimReply::Accepted { .. })));
    for n in 1..=3u64 {
        let r = sm.one(publish("a", &format!("{{\"n\":{n}}}"), None, 100 * n, KEEP_ALL, FOREVER));
        assert_eq!(r, published(n, false));
    }
    assert_eq!(sm.one(Release { device: "a".into(), conn: 7 }.into()), Reply::Release(true));
    assert_eq!(sm.route("a").0, None);
    // Several in one entry get consecutive seqs.
    let replies = sm.entry(vec![pub_all("a", "{\"n\":4}", None), pub_all("a", "{\"n\":5}", None)]);
    assert_eq!(replies, [published(4, false), published(5, false)]);
    // Other devices are still unknown.
    assert_eq!(sm.one(pub_all("b", "{}", None)), Reply::Publish(PublishReply::NoSuchDevice));
    assert_eq!(sm.read("b", 0, 10), StreamRead { head: head(0, 1), messages: vec![] });

    let all = sm.read("a", 0, 100);
    assert_eq!(all.head, head(5, 1));
    assert_eq!(seqs(&all), [1, 2, 3, 4, 5]);
    assert_eq!(payloads(&all), (1..=5).map(|n| format!("{{\"n\":{n}}}")).collect::<Vec<_>>());
    assert_eq!(all.messages[1].1, Message { at_ms: 200, payload: "{\"n\":2}".into(), key: None });
    // `after` is exclusive, `limit` caps the page; the head is reported whatever the page.
    assert_eq!(seqs(&sm.read("a", 2, 100)), [3, 4, 5]);
    assert_eq!(seqs(&sm.read("a", 0, 2)), [1, 2]);
    assert_eq!(seqs(&sm.read("a", 1, 3)), [2, 3, 4]);
    assert_eq!(seqs(&sm.read("a", 4, 1)), [5]);
    for (after, limit) in [(5, 10), (9, 10), (u64::MAX, 10), (0, 0)] {
        let r = sm.read("a", after, limit);
        assert_eq!(r, StreamRead { head: head(5, 1), messages: vec![] }, "after {after} limit {limit}");
    }
    // Reads survive a reopen.
    let sm = sm.reopen();
    assert_eq!(sm.read("a", 0, 100), all);
}

pub fn idempotency_keys_dedupe_until_their_message_is_trimmed<B: Backend>() {
    let mut sm = sm_with::<B>(&["a", "b"]);
    assert_eq!(sm.one(pub_all("a", "\"first\"", Some("k1"))), published(1, false));
    let before = sm.everything();
    // A retry (any payload) answers the original seq and stores nothing.
    assert_eq!(sm.one(pub_all("a", "\"retry\"", Some("k1"))), published(1, true));
    assert_eq!(sm.everything(), before, "a duplicate publish changed state");
    assert_eq!(payloads(&sm.read("a", 0, 10)), ["\"first\""]);
    // Different keys, and no key, get new seqs; no key never dedupes.
    assert_eq!(sm.one(pub_all("a", "\"second\"", Some("k2"))), published(2, false));
    assert_eq!(sm.one(pub_all("a", "\"x\"", None)), published(3, false));
    assert_eq!(sm.one(pub_all("a", "\"x\"", None)), published(4, false));
    assert_eq!(sm.one(pub_all("a", "\"again\"", Some("k2"))), published(2, true));
    // Keys are per device.
    assert_eq!(sm.one(pub_all("b", "\"b\"", Some("k1"))), published(1, false));
    // A retry in the same entry as the original is a duplicate too.
    let replies = sm.entry(vec![pub_all("a", "\"k3\"", Some("k3")), pub_all("a", "\"k3\"", Some("k3"))]);
    assert_eq!(replies, [published(5, false), published(5, true)]);
    let r = sm.read("a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(5, 1), vec![1, 2, 3, 4, 5]));
    assert_eq!(idem(&sm, "a"), [("k1".into(), 1), ("k2".into(), 2), ("k3".into(), 5)]);

    // Trimmed by an ack: the key is forgotten, a republish is a new message.
    assert_eq!(sm.one(ack("a", 1)), Reply::Ack(1));
    assert_eq!(idem(&sm, "a"), [("k2".into(), 2), ("k3".into(), 5)]);
    assert_eq!(sm.one(pub_all("a", "\"re\"", Some("k1"))), published(6, false));
    // Trimmed by retention (count): same.
    assert_eq!(sm.one(publish("a", "\"y\"", None, 1_000, 3, FOREVER)), published(7, false));
    assert_eq!(sm.read("a", 0, 10).head, head(7, 5));
    assert_eq!(idem(&sm, "a"), [("k1".into(), 6), ("k3".into(), 5)]);
    assert_eq!(sm.one(pub_all("a", "\"re\"", Some("k2"))), published(8, false));
    assert_eq!(sm.one(pub_all("a", "\"re\"", Some("k3"))), published(5, true));
    // Trimmed by retention (age): same.
    assert_eq!(sm.one(publish("b", "\"late\"", None, 5_000, KEEP_ALL, 100)), published(2, false));
    assert_eq!(idem(&sm, "b"), []);
    assert_eq!(sm.one(pub_all("b", "\"b2\"", Some("k1"))), published(3, false));
    // Device a was untouched by b's trimming.
    assert_eq!(sm.one(pub_all("a", "\"dup\"", Some("k1"))), published(6, true));
}

pub fn retention_by_count_and_age_moves_oldest_and_spares_other_devices<B: Backend>() {
    let mut sm = sm_with::<B>(&["a", "b"]);
    sm.entry(vec![publish("b", "\"b1\"", None, 0, KEEP_ALL, 10), publish("b", "\"b2\"", None, 1, KEEP_ALL, 10)]);
    let b = sm.read("b", 0, 10);
    assert_eq!((b.head, seqs(&b)), (head(2, 1), vec![1, 2]));

    // By count: keep the newest 3.
    let expect = [(1, 1), (2, 1), (3, 1), (4, 2), (5, 3)];
    for (n, (h, oldest)) in (1..=5u64).zip(expect) {
        assert_eq!(sm.one(publish("a", &n.to_string(), None, 10, 3, FOREVER)), published(n, false));
        assert_eq!(sm.read("a", 0, 10).head, head(h, oldest), "after publish {n}");
    }
    assert_eq!(payloads(&sm.read("a", 0, 10)), ["3", "4", "5"]);
    assert_eq!(seqs(&sm.read("a", 0, 10)), [3, 4, 5]);
    // A smaller count on a later publish trims down to it; reading from a trimmed cursor starts at oldest.
    assert_eq!(sm.one(publish("a", "6", None, 10, 1, FOREVER)), published(6, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(6, 6), vec![6]));
    assert_eq!(seqs(&sm.read("a", 2, 10)), [6]);
    // keep_count 0 retains nothing, but the seq is still spent.
    assert_eq!(sm.one(publish("a", "7", None, 10, 0, FOREVER)), published(7, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(7, 8), vec![]));

    // By age (keep_age_ms = 100): a message expires once a publish is strictly later than its
    // at_ms + 100.
    for (n, at) in [(8, 1000), (9, 1050), (10, 1100)] {
        assert_eq!(sm.one(publish("a", &n.to_string(), None, at, KEEP_ALL, 100)), published(n, false));
    }
    assert_eq!(sm.read("a", 0, 10).head, head(10, 8));
    // 1150: 1050 + 100 is not exceeded, 1000 + 100 is.
    assert_eq!(sm.one(publish("a", "11", None, 1150, KEEP_ALL, 100)), published(11, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(11, 9), vec![9, 10, 11]));
    // 1201 drops 1050 and 1100 at once.
    assert_eq!(sm.one(publish("a", "12", None, 1201, KEEP_ALL, 100)), published(12, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(12, 11), vec![11, 12]));
    // A publish far in the future with a tiny age keeps only itself.
    assert_eq!(sm.one(publish("a", "13", None, 1_000_000, KEEP_ALL, 0)), published(13, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(13, 13), vec![13]));
    // An age larger than at_ms (cutoff saturates at 0) expires nothing.
    assert_eq!(sm.one(publish("a", "14", None, 5, KEEP_ALL, 1_000)), published(14, false));
    assert_eq!(seqs(&sm.read("a", 0, 10)), [13, 14]);

    // Device b was never touched, although its messages are far older than a's cutoffs.
    assert_eq!(sm.read("b", 0, 10), b);
}

pub fn ack_trims_up_to_min_of_seq_and_head_idempotently_and_never_moves_head<B: Backend>() {
    let mut sm = sm_with::<B>(&["a", "b"]);
    for n in 1..=5u64 {
        assert_eq!(sm.one(pub_all("a", &n.to_string(), None)), published(n, false));
    }
    sm.one(pub_all("b", "\"b\"", None));
    let b = sm.read("b", 0, 10);

    assert_eq!(sm.one(ack("a", 0)), Reply::Ack(0));
    assert_eq!(sm.one(ack("a", 2)), Reply::Ack(2));
    let r = sm.read("a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(5, 3), vec![3, 4, 5]));
    let before = sm.everything();
    for s in [2, 1, 0] {
        assert_eq!(sm.one(ack("a", s)), Reply::Ack(0), "re-ack {s}");
    }
    assert_eq!(sm.everything(), before, "a repeated ack changed state");
    // Beyond the head: trims to the head only, head stays.
    assert_eq!(sm.one(ack("a", 100)), Reply::Ack(3));
    assert_eq!(sm.read("a", 0, 10), StreamRead { head: head(5, 6), messages: vec![] });
    let before = sm.everything();
    assert_eq!(sm.one(ack("a", 100)), Reply::Ack(0));
    assert_eq!(sm.one(ack("a", u64::MAX)), Reply::Ack(0));
    assert_eq!(sm.everything(), before);
    // The next publish continues after the old head (an ack beyond it reserved nothing).
    assert_eq!(sm.one(pub_all("a", "6", None)), published(6, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(6, 6), vec![6]));
    // Acks in one entry.
    sm.one(pub_all("a", "7", None));
    assert_eq!(sm.entry(vec![ack("a", 6), ack("a", 7), ack("a", 7)]), [Reply::Ack(1), Reply::Ack(1), Reply::Ack(0)]);
    assert_eq!(sm.read("a", 0, 10).head, head(7, 8));

    // Unknown devices and devices without messages: nothing.
    let before = sm.everything();
    assert_eq!(sm.one(ack("nobody", 5)), Reply::Ack(0));
    assert_eq!(sm.everything(), before);
    // Other devices untouched throughout.
    assert_eq!(sm.read("b", 0, 10), b);
}

pub fn snapshot_round_trip_keeps_streams_and_idempotency<B: Backend>() {
    let mut sm = sm_with::<B>(&["a", "b", "c"]);
    sm.entry(vec![
        pub_all("a", "1", Some("k1")),
        pub_all("a", "2", Some("k2")),
        pub_all("a", "3", None),
        pub_all("a", "4", Some("k4")),
        publish("b", "1", Some("k1"), 10, KEEP_ALL, 1000),
        publish("b", "2", Some("k2"), 20, KEEP_ALL, 1000),
        publish("b", "3", Some("k3"), 30, 2, 1000),
    ]);
    sm.one(ack("a", 1));
    // c: everything trimmed, only the head remains.
    sm.one(pub_all("c", "1", Some("kc")));
    sm.one(ack("c", 1));

    let t = sm.b.dump();
    assert_eq!(t.heads.len(), 3);
    assert_eq!(t.messages.len(), 3 + 2);
    assert_eq!(t.idempotency.len(), 2 + 2);

    let mut copy = sm.install_copy();
    assert_eq!(copy.everything(), sm.everything());
    for d in ["a", "b", "c", "unknown"] {
        for (after, limit) in [(0, 100), (0, 1), (2, 1), (2, 100), (100, 100)] {
            assert_eq!(copy.read(d, after, limit), sm.read(d, after, limit), "{d} after {after} limit {limit}");
        }
    }
    assert_eq!(copy.read("c", 0, 10), StreamRead { head: head(1, 2), messages: vec![] });

    // The same commands give the same replies on both: retried keys are still duplicates,
    // forgotten keys and seqs continue from the heads.
    let cmds = vec![
        pub_all("a", "retry", Some("k2")),
        pub_all("a", "retry", Some("k4")),
        pub_all("a", "forgotten", Some("k1")),
        publish("b", "retry", Some("k3"), 40, 2, 1000),
        publish("b", "forgotten", Some("k1"), 40, 2, 1000),
        pub_all("c", "forgotten", Some("kc")),
        ack("a", 3),
    ];
    let want = [
        published(2, true),
        published(4, true),
        published(5, false),
        published(3, true),
        published(4, false),
        published(2, false),
        Reply::Ack(2),
    ];
    assert_eq!(copy.entry(cmds.clone()), want, "installed copy");
    assert_eq!(sm.entry(cmds), want, "original");
    assert_eq!(copy.everything(), sm.everything());

    // Installing over a state machine that already has streams replaces them.
    let mut other = sm_with::<B>(&["a", "z"]);
    other.entry(vec![pub_all("a", "x", Some("k9")), pub_all("z", "z", Some("kz"))]);
    other.install_from(&sm);
    assert_eq!(other.everything(), sm.everything());
    assert_eq!(other.read("z", 0, 10), StreamRead { head: head(0, 1), messages: vec![] });
}

mod on_mem {
    crate::machine::testkit::backend_tests!(crate::machine::testkit::MemBackend);
}
