//! Rule tests of the message streams (design §6, V5), generic over the backend like
//! [`super::tests`]: publish and seqs, idempotency keys, retention by count and age, acks, and
//! streams through a snapshot.

use super::testkit::*;
use super::tests::sm_with;
use super::*;

/// Large enough that retention never drops anything.
pub const KEEP_ALL: u64 = 1_000_000;
pub const FOREVER: u64 = u64::MAX;

/// A publish with retention that keeps everything.
fn pub_all(device: &str, payload: &str, key: Option<&str>) -> Command {
    publish(device, payload, key, 1_000, KEEP_ALL, FOREVER)
}

/// A stream's (head, oldest) as the tests compare them (the key count is checked apart).
fn head(head: u64, oldest: u64) -> (u64, u64) {
    (head, oldest)
}

fn bounds(r: &StreamRead) -> (u64, u64) {
    (r.head.head, r.head.oldest)
}

/// An empty read with these bounds.
fn empty(r: &StreamRead) -> Option<(u64, u64)> {
    r.messages.is_empty().then(|| bounds(r))
}

fn seqs(r: &StreamRead) -> Vec<u64> {
    r.messages.iter().map(|(s, _)| *s).collect()
}

fn payloads(r: &StreamRead) -> Vec<String> {
    r.messages.iter().map(|(_, m)| m.payload.clone()).collect()
}

/// The idempotency table of a device, as (key, seq) pairs.
pub fn idem<B: Backend>(sm: &Sm<B>, device: &str) -> Vec<(String, u64)> {
    let t = sm.b.dump();
    let keys: Vec<(String, u64)> =
        t.idempotency.iter().filter(|((d, _), _)| d == device).map(|((_, k), u)| (k.clone(), u.seq)).collect();
    let indexed = t.key_order.iter().filter(|((d, ..), _)| d == device).count();
    assert_eq!(indexed, keys.len(), "{device}: the key index and the keys differ");
    keys
}

pub fn publish_needs_a_known_device_then_seqs_count_up_and_reads_page<B: Backend>() {
    let mut sm = sm_with::<B>(&[]);
    let before = sm.everything();
    assert_eq!(sm.one(pub_all("a", "{\"n\":0}", None)), Reply::Publish(PublishReply::NoSuchDevice));
    assert_eq!(sm.one(pub_all("a", "{\"n\":0}", Some("k"))), Reply::Publish(PublishReply::NoSuchDevice));
    assert_eq!(sm.everything(), before, "a publish to an unknown device changed state");
    let t = sm.b.dump();
    assert!(t.heads.is_empty() && t.messages.is_empty() && t.idempotency.is_empty());
    assert_eq!(empty(&sm.read("a", 0, 10)), Some(head(0, 1)));

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
    assert_eq!(empty(&sm.read("b", 0, 10)), Some(head(0, 1)));

    let all = sm.read("a", 0, 100);
    assert_eq!(bounds(&all), head(5, 1));
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
        assert_eq!(empty(&r), Some(head(5, 1)), "after {after} limit {limit}");
    }
    // Reads survive a reopen.
    let sm = sm.reopen();
    assert_eq!(sm.read("a", 0, 100), all);
}

pub fn idempotency_keys_dedupe_within_their_window_whatever_was_trimmed<B: Backend>() {
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
    assert_eq!((bounds(&r), seqs(&r), r.head.keys), (head(5, 1), vec![1, 2, 3, 4, 5], 3));
    assert_eq!(idem(&sm, "a"), [("k1".into(), 1), ("k2".into(), 2), ("k3".into(), 5)]);

    // Acked and trimmed by retention: the keys stay, a retry is still a duplicate (delivered once).
    assert_eq!(sm.one(ack("a", 2)), Reply::Ack(2));
    assert_eq!(sm.one(publish("a", "\"y\"", None, 1_000, 1, FOREVER)), published(6, false));
    assert_eq!(sm.read("a", 0, 10).messages.len(), 1);
    assert_eq!(sm.one(pub_all("a", "\"re\"", Some("k1"))), published(1, true));
    assert_eq!(sm.one(pub_all("a", "\"re\"", Some("k3"))), published(5, true));
    assert_eq!(idem(&sm, "a"), [("k1".into(), 1), ("k2".into(), 2), ("k3".into(), 5)]);
}

pub fn idempotency_keys_expire_after_their_window_and_are_bounded_per_device<B: Backend>() {
    let mut sm = sm_with::<B>(&["a", "b"]);
    const WINDOW: u64 = 1_000;
    let keyed = |key: &str, at_ms: u64| publish_keyed("a", "{}", key, at_ms, WINDOW, 3);
    assert_eq!(sm.one(keyed("k1", 100)), published(1, false));
    assert_eq!(sm.one(keyed("k1", 100 + WINDOW)), published(1, true), "the window's last ms");
    // After the window the key is forgotten: the same key is a new message.
    assert_eq!(sm.one(keyed("k1", 101 + WINDOW)), published(2, false));
    assert_eq!(idem(&sm, "a"), [("k1".into(), 2)]);
    assert_eq!(sm.one(keyed("k1", 200 + WINDOW)), published(2, true));
    // Older keys expire as newer publishes pass their window, whatever their key.
    assert_eq!(sm.one(keyed("k2", 1_500)), published(3, false));
    assert_eq!(sm.one(keyed("k3", 2_200)), published(4, false));
    assert_eq!(idem(&sm, "a"), [("k2".into(), 3), ("k3".into(), 4)], "k1 (used at 1101) expired at 2200");
    // At most 3 keys per device: the oldest goes first.
    for (k, seq) in [("k4", 5), ("k5", 6)] {
        assert_eq!(sm.one(keyed(k, 2_400)), published(seq, false));
    }
    assert_eq!(idem(&sm, "a"), [("k3".into(), 4), ("k4".into(), 5), ("k5".into(), 6)]);
    assert_eq!(sm.read("a", 0, 0).head.keys, 3);
    assert_eq!(sm.one(keyed("k2", 2_400)), published(7, false), "k2 was pushed out by the bound");
    // Another device's keys are its own.
    assert_eq!(sm.one(publish_keyed("b", "{}", "k5", 2_400, WINDOW, 3)), published(1, false));
    assert_eq!(idem(&sm, "a").len(), 3);
}

pub fn retention_by_count_and_age_moves_oldest_and_spares_other_devices<B: Backend>() {
    let mut sm = sm_with::<B>(&["a", "b"]);
    sm.entry(vec![publish("b", "\"b1\"", None, 0, KEEP_ALL, 10), publish("b", "\"b2\"", None, 1, KEEP_ALL, 10)]);
    let b = sm.read("b", 0, 10);
    assert_eq!((bounds(&b), seqs(&b)), (head(2, 1), vec![1, 2]));

    // By count: keep the newest 3.
    let expect = [(1, 1), (2, 1), (3, 1), (4, 2), (5, 3)];
    for (n, (h, oldest)) in (1..=5u64).zip(expect) {
        assert_eq!(sm.one(publish("a", &n.to_string(), None, 10, 3, FOREVER)), published(n, false));
        assert_eq!(bounds(&sm.read("a", 0, 10)), head(h, oldest), "after publish {n}");
    }
    assert_eq!(payloads(&sm.read("a", 0, 10)), ["3", "4", "5"]);
    assert_eq!(seqs(&sm.read("a", 0, 10)), [3, 4, 5]);
    // A smaller count on a later publish trims down to it; reading from a trimmed cursor starts at oldest.
    assert_eq!(sm.one(publish("a", "6", None, 10, 1, FOREVER)), published(6, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((bounds(&r), seqs(&r)), (head(6, 6), vec![6]));
    assert_eq!(seqs(&sm.read("a", 2, 10)), [6]);
    // keep_count 0 retains nothing, but the seq is still spent.
    assert_eq!(sm.one(publish("a", "7", None, 10, 0, FOREVER)), published(7, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((bounds(&r), seqs(&r)), (head(7, 8), vec![]));

    // By age (keep_age_ms = 100): a message expires once a publish is strictly later than its
    // at_ms + 100.
    for (n, at) in [(8, 1000), (9, 1050), (10, 1100)] {
        assert_eq!(sm.one(publish("a", &n.to_string(), None, at, KEEP_ALL, 100)), published(n, false));
    }
    assert_eq!(bounds(&sm.read("a", 0, 10)), head(10, 8));
    // 1150: 1050 + 100 is not exceeded, 1000 + 100 is.
    assert_eq!(sm.one(publish("a", "11", None, 1150, KEEP_ALL, 100)), published(11, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((bounds(&r), seqs(&r)), (head(11, 9), vec![9, 10, 11]));
    // 1201 drops 1050 and 1100 at once.
    assert_eq!(sm.one(publish("a", "12", None, 1201, KEEP_ALL, 100)), published(12, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((bounds(&r), seqs(&r)), (head(12, 11), vec![11, 12]));
    // A publish far in the future with a tiny age keeps only itself.
    assert_eq!(sm.one(publish("a", "13", None, 1_000_000, KEEP_ALL, 0)), published(13, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((bounds(&r), seqs(&r)), (head(13, 13), vec![13]));
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
    assert_eq!((bounds(&r), seqs(&r)), (head(5, 3), vec![3, 4, 5]));
    let before = sm.everything();
    for s in [2, 1, 0] {
        assert_eq!(sm.one(ack("a", s)), Reply::Ack(0), "re-ack {s}");
    }
    assert_eq!(sm.everything(), before, "a repeated ack changed state");
    // Beyond the head: trims to the head only, head stays.
    assert_eq!(sm.one(ack("a", 100)), Reply::Ack(3));
    assert_eq!(empty(&sm.read("a", 0, 10)), Some(head(5, 6)));
    let before = sm.everything();
    assert_eq!(sm.one(ack("a", 100)), Reply::Ack(0));
    assert_eq!(sm.one(ack("a", u64::MAX)), Reply::Ack(0));
    assert_eq!(sm.everything(), before);
    // The next publish continues after the old head (an ack beyond it reserved nothing).
    assert_eq!(sm.one(pub_all("a", "6", None)), published(6, false));
    let r = sm.read("a", 0, 10);
    assert_eq!((bounds(&r), seqs(&r)), (head(6, 6), vec![6]));
    // Acks in one entry.
    sm.one(pub_all("a", "7", None));
    assert_eq!(sm.entry(vec![ack("a", 6), ack("a", 7), ack("a", 7)]), [Reply::Ack(1), Reply::Ack(1), Reply::Ack(0)]);
    assert_eq!(bounds(&sm.read("a", 0, 10)), head(7, 8));

    // Unknown devices and devices without messages: nothing.
    let before = sm.everything();
    assert_eq!(sm.one(ack("nobody", 5)), Reply::Ack(0));
    assert_eq!(sm.everything(), before);
    // Other devices untouched throughout.
    assert_eq!(sm.read("b", 0, 10), b);
}

pub fn snapshot_round_trip_keeps_streams_and_idempotency<B: Backend>() {
    // Device b keeps messages for 1 s and keys for 15 ms.
    let pub_b = |payload: &str, key: &str, at_ms: u64, keep_count: u64| -> Command {
        let key = Some(key.to_string());
        let (device, payload) = ("b".to_string(), payload.to_string());
        Publish { device, payload, key, at_ms, keep_count, keep_age_ms: 1_000, keep_key_ms: 15, max_keys: 100 }.into()
    };
    let mut sm = sm_with::<B>(&["a", "b", "c"]);
    sm.entry(vec![
        pub_all("a", "1", Some("k1")),
        pub_all("a", "2", Some("k2")),
        pub_all("a", "3", None),
        pub_all("a", "4", Some("k4")),
        pub_b("1", "k1", 10, KEEP_ALL),
        pub_b("2", "k2", 20, KEEP_ALL),
        pub_b("3", "k3", 30, 2),
    ]);
    sm.one(ack("a", 1));
    // c: every message trimmed, its head and key remain.
    sm.one(pub_all("c", "1", Some("kc")));
    sm.one(ack("c", 1));

    let t = sm.b.dump();
    assert_eq!(t.heads.len(), 3);
    assert_eq!(t.messages.len(), 3 + 2);
    assert_eq!(t.idempotency.len(), 3 + 2 + 1, "b's k1 expired at 30");

    let mut copy = sm.install_copy();
    assert_eq!(copy.everything(), sm.everything());
    for d in ["a", "b", "c", "unknown"] {
        for (after, limit) in [(0, 100), (0, 1), (2, 1), (2, 100), (100, 100)] {
            assert_eq!(copy.read(d, after, limit), sm.read(d, after, limit), "{d} after {after} limit {limit}");
        }
    }
    assert_eq!(empty(&copy.read("c", 0, 10)), Some(head(1, 2)));

    // The same commands give the same replies on both: retried keys are still duplicates (also
    // after their message was acked), expired keys are new messages, seqs continue from the heads.
    let cmds = vec![
        pub_all("a", "retry", Some("k2")),
        pub_all("a", "retry", Some("k4")),
        pub_all("a", "acked", Some("k1")),
        pub_b("retry", "k3", 40, 2),
        pub_b("expired", "k1", 40, 2),
        pub_all("c", "acked", Some("kc")),
        ack("a", 3),
    ];
    let want = [
        published(2, true),
        published(4, true),
        published(1, true),
        published(3, true),
        published(4, false),
        published(1, true),
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
    assert_eq!(empty(&other.read("z", 0, 10)), Some(head(0, 1)));
}

/// A claim applied by the node that made it answers the device's stream head as the apply left
/// it (what that node's `hello` announces); anywhere else it answers none. The state is the same
/// whichever node applies.
pub fn a_claim_applied_by_its_own_node_answers_the_stream_head<B: Backend>() {
    fn head_of(r: &Reply) -> Option<u64> {
        match r {
            Reply::Claim(ClaimReply::Accepted { head, .. }) => *head,
            other => panic!("not accepted: {other:?}"),
        }
    }
    let entries: Vec<Vec<Command>> = vec![
        vec![renew(2, 0, 1 << 40)],
        vec![claim("a", 1, 1, 1, 1)],
        vec![pub_all("a", "{\"n\":1}", None), pub_all("a", "{\"n\":2}", None)],
        vec![claim("a", 1, 2, 1, 2)],
        vec![claim("a", 1, 2, 1, 2)],
        vec![claim("a", 2, 3, 1, 3)],
        vec![pub_all("a", "{\"n\":3}", None), claim("a", 1, 4, 1, 4), pub_all("a", "{\"n\":4}", None)],
        vec![claim("b", 1, 5, 1, 1), claim("b", 2, 6, 1, 2)],
    ];
    let mut on_1 = sm_with::<B>(&[]);
    on_1.local = Some(1);
    let mut elsewhere = sm_with::<B>(&[]);
    let replies: Vec<Vec<Reply>> = entries.iter().map(|e| on_1.entry(e.clone())).collect();
    for e in &entries {
        for r in elsewhere.entry(e.clone()) {
            if let Reply::Claim(c @ ClaimReply::Accepted { .. }) = r {
                assert_eq!(head_of(&Reply::Claim(c)), None, "a node answered a head for a claim it applies for others");
            }
        }
    }
    // A first claim: the device has no stream yet (publishing needs a floor).
    assert_eq!(head_of(&replies[1][0]), Some(0));
    // Reclaimed after two messages, and the same claim replayed.
    assert_eq!(head_of(&replies[3][0]), Some(2));
    assert_eq!(head_of(&replies[4][0]), Some(2));
    // Node 2's claim: node 1 applies it for node 2, whose hello it is not.
    assert_eq!(head_of(&replies[5][0]), None);
    // In one entry: the message before the claim counts, the one after it is pushed.
    assert_eq!(head_of(&replies[6][1]), Some(3));
    assert_eq!(head_of(&replies[7][0]), Some(0));
    assert_eq!(head_of(&replies[7][1]), None);
    assert_eq!(bounds(&on_1.read("a", 0, 10)).0, 4);
    assert_eq!(on_1.everything(), elsewhere.everything(), "the applying node changed the state");
}
