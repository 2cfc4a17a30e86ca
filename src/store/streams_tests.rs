//! Unit and property tests of the per-device message streams (design §6, V5): publish/ack through
//! `StateDb::apply`, reads through `StateDb::stream`, retention by count and age, idempotency keys
//! and the snapshot round trip.

use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;

use super::state_tests::{claim, install_copy, renew, Sm};
use super::streams::{Head, Message, StreamRead};
use crate::codec::encode;
use crate::raft::types::{Command, Reply};

/// Large enough that retention never drops anything.
const KEEP_ALL: u64 = 1_000_000;
const FOREVER: u64 = u64::MAX;

fn publish(device: &str, payload: &str, key: Option<&str>, at_ms: u64, keep_count: u64, keep_age_ms: u64) -> Command {
    Command::Publish {
        device: device.into(),
        payload: payload.into(),
        key: key.map(Into::into),
        at_ms,
        keep_count,
        keep_age_ms,
    }
}

/// A publish with retention that keeps everything.
fn pub_all(device: &str, payload: &str, key: Option<&str>) -> Command {
    publish(device, payload, key, 1_000, KEEP_ALL, FOREVER)
}

fn ack(device: &str, seq: u64) -> Command {
    Command::Ack { device: device.into(), seq }
}

fn published(seq: u64, duplicate: bool) -> Reply {
    Reply::Published { seq, duplicate }
}

fn head(head: u64, oldest: u64) -> Head {
    Head { head, oldest }
}

/// A state machine where node 1 is live and each of `devices` has been claimed once (so it is
/// known: it has a route floor).
fn sm_with(devices: &[&str]) -> Sm {
    let mut sm = Sm::new();
    sm.one(renew(1, 0, 1 << 40));
    for (i, d) in devices.iter().enumerate() {
        assert!(matches!(sm.one(claim(d, 1, i as u64 + 1, 1, 1)), Reply::Accepted { .. }), "claim {d}");
    }
    sm
}

fn read(sm: &Sm, device: &str, after: u64, limit: usize) -> StreamRead {
    sm.db.stream(device, after, limit).unwrap()
}

fn seqs(r: &StreamRead) -> Vec<u64> {
    r.messages.iter().map(|(s, _)| *s).collect()
}

fn payloads(r: &StreamRead) -> Vec<String> {
    r.messages.iter().map(|(_, m)| m.payload.clone()).collect()
}

/// The idempotency table of a device, as (key, seq) pairs.
fn idem(sm: &Sm, device: &str) -> Vec<(String, u64)> {
    let (_, body) = sm.db.dump().unwrap();
    body.idempotency.into_iter().filter(|(d, _, _)| d == device).map(|(_, k, s)| (k, s)).collect()
}

#[test]
fn publish_needs_a_known_device_then_seqs_count_up_and_reads_page() {
    let mut sm = sm_with(&[]);
    let before = sm.state_bytes();
    assert_eq!(sm.one(pub_all("a", "{\"n\":0}", None)), Reply::NoSuchDevice);
    assert_eq!(sm.one(pub_all("a", "{\"n\":0}", Some("k"))), Reply::NoSuchDevice);
    assert_eq!(sm.state_bytes(), before, "a publish to an unknown device changed state");
    let (_, body) = sm.db.dump().unwrap();
    assert!(body.heads.is_empty() && body.messages.is_empty() && body.idempotency.is_empty());
    assert_eq!(read(&sm, "a", 0, 10), StreamRead { head: head(0, 1), messages: vec![] });

    // Known once a claim was accepted; also after its route is gone (the floor stays).
    assert!(matches!(sm.one(claim("a", 1, 7, 1, 1)), Reply::Accepted { .. }));
    for n in 1..=3u64 {
        let r = sm.one(publish("a", &format!("{{\"n\":{n}}}"), None, 100 * n, KEEP_ALL, FOREVER));
        assert_eq!(r, published(n, false));
    }
    assert_eq!(sm.one(Command::Release { device: "a".into(), conn: 7 }), Reply::Released(true));
    assert_eq!(sm.route("a").0, None);
    // Several in one entry get consecutive seqs.
    let replies = sm.entry(vec![pub_all("a", "{\"n\":4}", None), pub_all("a", "{\"n\":5}", None)]);
    assert_eq!(replies, [published(4, false), published(5, false)]);
    // Other devices are still unknown.
    assert_eq!(sm.one(pub_all("b", "{}", None)), Reply::NoSuchDevice);
    assert_eq!(read(&sm, "b", 0, 10), StreamRead { head: head(0, 1), messages: vec![] });

    let all = read(&sm, "a", 0, 100);
    assert_eq!(all.head, head(5, 1));
    assert_eq!(seqs(&all), [1, 2, 3, 4, 5]);
    assert_eq!(payloads(&all), (1..=5).map(|n| format!("{{\"n\":{n}}}")).collect::<Vec<_>>());
    assert_eq!(all.messages[1].1, Message { at_ms: 200, payload: "{\"n\":2}".into(), key: None });
    // `after` is exclusive, `limit` caps the page; the head is reported whatever the page.
    assert_eq!(seqs(&read(&sm, "a", 2, 100)), [3, 4, 5]);
    assert_eq!(seqs(&read(&sm, "a", 0, 2)), [1, 2]);
    assert_eq!(seqs(&read(&sm, "a", 1, 3)), [2, 3, 4]);
    assert_eq!(seqs(&read(&sm, "a", 4, 1)), [5]);
    for (after, limit) in [(5, 10), (9, 10), (u64::MAX, 10), (0, 0)] {
        let r = read(&sm, "a", after, limit);
        assert_eq!(r, StreamRead { head: head(5, 1), messages: vec![] }, "after {after} limit {limit}");
    }
    // Reads survive a reopen.
    let sm = sm.reopen();
    assert_eq!(read(&sm, "a", 0, 100), all);
}

#[test]
fn idempotency_keys_dedupe_until_their_message_is_trimmed() {
    let mut sm = sm_with(&["a", "b"]);
    assert_eq!(sm.one(pub_all("a", "\"first\"", Some("k1"))), published(1, false));
    let before = sm.state_bytes();
    // A retry (any payload) answers the original seq and stores nothing.
    assert_eq!(sm.one(pub_all("a", "\"retry\"", Some("k1"))), published(1, true));
    assert_eq!(sm.state_bytes(), before, "a duplicate publish changed state");
    assert_eq!(payloads(&read(&sm, "a", 0, 10)), ["\"first\""]);
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
    let r = read(&sm, "a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(5, 1), vec![1, 2, 3, 4, 5]));
    assert_eq!(idem(&sm, "a"), [("k1".into(), 1), ("k2".into(), 2), ("k3".into(), 5)]);

    // Trimmed by an ack: the key is forgotten, a republish is a new message.
    assert_eq!(sm.one(ack("a", 1)), Reply::Count(1));
    assert_eq!(idem(&sm, "a"), [("k2".into(), 2), ("k3".into(), 5)]);
    assert_eq!(sm.one(pub_all("a", "\"re\"", Some("k1"))), published(6, false));
    // Trimmed by retention (count): same.
    assert_eq!(sm.one(publish("a", "\"y\"", None, 1_000, 3, FOREVER)), published(7, false));
    assert_eq!(read(&sm, "a", 0, 10).head, head(7, 5));
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

#[test]
fn retention_by_count_and_age_moves_oldest_and_spares_other_devices() {
    let mut sm = sm_with(&["a", "b"]);
    sm.entry(vec![publish("b", "\"b1\"", None, 0, KEEP_ALL, 10), publish("b", "\"b2\"", None, 1, KEEP_ALL, 10)]);
    let b = read(&sm, "b", 0, 10);
    assert_eq!((b.head, seqs(&b)), (head(2, 1), vec![1, 2]));

    // By count: keep the newest 3.
    let expect = [(1, 1), (2, 1), (3, 1), (4, 2), (5, 3)];
    for (n, (h, oldest)) in (1..=5u64).zip(expect) {
        assert_eq!(sm.one(publish("a", &n.to_string(), None, 10, 3, FOREVER)), published(n, false));
        assert_eq!(read(&sm, "a", 0, 10).head, head(h, oldest), "after publish {n}");
    }
    assert_eq!(payloads(&read(&sm, "a", 0, 10)), ["3", "4", "5"]);
    assert_eq!(seqs(&read(&sm, "a", 0, 10)), [3, 4, 5]);
    // A smaller count on a later publish trims down to it; reading from a trimmed cursor starts at oldest.
    assert_eq!(sm.one(publish("a", "6", None, 10, 1, FOREVER)), published(6, false));
    let r = read(&sm, "a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(6, 6), vec![6]));
    assert_eq!(seqs(&read(&sm, "a", 2, 10)), [6]);
    // keep_count 0 retains nothing, but the seq is still spent.
    assert_eq!(sm.one(publish("a", "7", None, 10, 0, FOREVER)), published(7, false));
    let r = read(&sm, "a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(7, 8), vec![]));

    // By age (keep_age_ms = 100): a message expires once a publish is strictly later than its
    // at_ms + 100.
    for (n, at) in [(8, 1000), (9, 1050), (10, 1100)] {
        assert_eq!(sm.one(publish("a", &n.to_string(), None, at, KEEP_ALL, 100)), published(n, false));
    }
    assert_eq!(read(&sm, "a", 0, 10).head, head(10, 8));
    // 1150: 1050 + 100 is not exceeded, 1000 + 100 is.
    assert_eq!(sm.one(publish("a", "11", None, 1150, KEEP_ALL, 100)), published(11, false));
    let r = read(&sm, "a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(11, 9), vec![9, 10, 11]));
    // 1201 drops 1050 and 1100 at once.
    assert_eq!(sm.one(publish("a", "12", None, 1201, KEEP_ALL, 100)), published(12, false));
    let r = read(&sm, "a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(12, 11), vec![11, 12]));
    // A publish far in the future with a tiny age keeps only itself.
    assert_eq!(sm.one(publish("a", "13", None, 1_000_000, KEEP_ALL, 0)), published(13, false));
    let r = read(&sm, "a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(13, 13), vec![13]));
    // An age larger than at_ms (cutoff saturates at 0) expires nothing.
    assert_eq!(sm.one(publish("a", "14", None, 5, KEEP_ALL, 1_000)), published(14, false));
    assert_eq!(seqs(&read(&sm, "a", 0, 10)), [13, 14]);

    // Device b was never touched, although its messages are far older than a's cutoffs.
    assert_eq!(read(&sm, "b", 0, 10), b);
}

#[test]
fn ack_trims_up_to_min_of_seq_and_head_idempotently_and_never_moves_head() {
    let mut sm = sm_with(&["a", "b"]);
    for n in 1..=5u64 {
        assert_eq!(sm.one(pub_all("a", &n.to_string(), None)), published(n, false));
    }
    sm.one(pub_all("b", "\"b\"", None));
    let b = read(&sm, "b", 0, 10);

    assert_eq!(sm.one(ack("a", 0)), Reply::Count(0));
    assert_eq!(sm.one(ack("a", 2)), Reply::Count(2));
    let r = read(&sm, "a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(5, 3), vec![3, 4, 5]));
    let before = sm.state_bytes();
    for s in [2, 1, 0] {
        assert_eq!(sm.one(ack("a", s)), Reply::Count(0), "re-ack {s}");
    }
    assert_eq!(sm.state_bytes(), before, "a repeated ack changed state");
    // Beyond the head: trims to the head only, head stays.
    assert_eq!(sm.one(ack("a", 100)), Reply::Count(3));
    assert_eq!(read(&sm, "a", 0, 10), StreamRead { head: head(5, 6), messages: vec![] });
    let before = sm.state_bytes();
    assert_eq!(sm.one(ack("a", 100)), Reply::Count(0));
    assert_eq!(sm.one(ack("a", u64::MAX)), Reply::Count(0));
    assert_eq!(sm.state_bytes(), before);
    // The next publish continues after the old head (an ack beyond it reserved nothing).
    assert_eq!(sm.one(pub_all("a", "6", None)), published(6, false));
    let r = read(&sm, "a", 0, 10);
    assert_eq!((r.head, seqs(&r)), (head(6, 6), vec![6]));
    // Acks in one entry.
    sm.one(pub_all("a", "7", None));
    assert_eq!(
        sm.entry(vec![ack("a", 6), ack("a", 7), ack("a", 7)]),
        [Reply::Count(1), Reply::Count(1), Reply::Count(0)]
    );
    assert_eq!(read(&sm, "a", 0, 10).head, head(7, 8));

    // Unknown devices and devices without messages: nothing.
    let before = sm.state_bytes();
    assert_eq!(sm.one(ack("nobody", 5)), Reply::Count(0));
    assert_eq!(sm.state_bytes(), before);
    // Other devices untouched throughout.
    assert_eq!(read(&sm, "b", 0, 10), b);
}

#[test]
fn snapshot_round_trip_keeps_streams_and_idempotency() {
    let mut sm = sm_with(&["a", "b", "c"]);
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

    let (_, body) = sm.db.dump().unwrap();
    assert_eq!(body.heads.len(), 3);
    assert_eq!(body.messages.len(), 3 + 2);
    assert_eq!(body.idempotency.len(), 2 + 2);

    let mut copy = install_copy(&sm);
    assert_eq!(copy.state_bytes(), sm.state_bytes());
    for d in ["a", "b", "c", "unknown"] {
        for (after, limit) in [(0, 100), (0, 1), (2, 1), (2, 100), (100, 100)] {
            assert_eq!(read(&copy, d, after, limit), read(&sm, d, after, limit), "{d} after {after} limit {limit}");
        }
    }
    assert_eq!(read(&copy, "c", 0, 10), StreamRead { head: head(1, 2), messages: vec![] });

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
        Reply::Count(2),
    ];
    assert_eq!(copy.entry(cmds.clone()), want, "installed copy");
    assert_eq!(sm.entry(cmds), want, "original");
    assert_eq!(copy.state_bytes(), sm.state_bytes());

    // Installing over a state machine that already has streams replaces them.
    let mut other = sm_with(&["a", "z"]);
    other.entry(vec![pub_all("a", "x", Some("k9")), pub_all("z", "z", Some("kz"))]);
    let (meta, body) = sm.db.dump().unwrap();
    let smeta = crate::raft::types::SnapshotMeta {
        last_log_id: meta.last_applied,
        last_membership: meta.membership,
        snapshot_id: "s".into(),
    };
    other.meta = other.db.install(&smeta, &encode(&body).unwrap()).unwrap();
    assert_eq!(other.state_bytes(), sm.state_bytes());
    assert_eq!(read(&other, "z", 0, 10), StreamRead { head: head(0, 1), messages: vec![] });
}

// ---- property test against a model ----

#[derive(Debug, Clone)]
enum Op {
    Publish { dev: usize, key: Option<u8>, dt: u64, keep_count: u64, keep_age_ms: u64 },
    Ack { dev: usize, seq: u64 },
}

const DEVICES: [&str; 2] = ["d0", "d1"];

#[derive(Debug, Default, Clone)]
struct Stream {
    head: u64,
    /// (seq, at_ms, payload, key)
    retained: VecDeque<(u64, u64, String, Option<String>)>,
}

impl Stream {
    fn dup(&self, key: &str) -> Option<u64> {
        self.retained.iter().find(|m| m.3.as_deref() == Some(key)).map(|m| m.0)
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2usize, prop::option::of(0..3u8), 0..60u64, 0..6u64, prop_oneof![Just(FOREVER), 0..150u64])
            .prop_map(|(dev, key, dt, keep_count, keep_age_ms)| Op::Publish { dev, key, dt, keep_count, keep_age_ms }),
        1 => (0..2usize, 0..25u64).prop_map(|(dev, seq)| Op::Ack { dev, seq }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn streams_match_a_model(entries in prop::collection::vec(prop::collection::vec(op(), 1..4), 1..40)) {
        let mut sm = sm_with(&DEVICES);
        let mut model: [Stream; 2] = Default::default();
        let mut now = 0u64;
        let mut n = 0u64;
        let mut last = [0u64; 2];
        for ops in entries {
            let mut cmds = Vec::new();
            let mut want = Vec::new();
            for op in ops {
                match op {
                    Op::Publish { dev, key, dt, keep_count, keep_age_ms } => {
                        now += dt;
                        n += 1;
                        let key = key.map(|k| format!("k{k}"));
                        let payload = format!("{{\"n\":{n}}}");
                        cmds.push(publish(DEVICES[dev], &payload, key.as_deref(), now, keep_count, keep_age_ms));
                        let s = &mut model[dev];
                        if let Some(seq) = key.as_deref().and_then(|k| s.dup(k)) {
                            want.push(published(seq, true));
                            continue;
                        }
                        s.head += 1;
                        s.retained.push_back((s.head, now, payload, key));
                        while s.retained.len() as u64 > keep_count
                            || s.retained.front().is_some_and(|m| m.1.saturating_add(keep_age_ms) < now)
                        {
                            s.retained.pop_front();
                        }
                        want.push(published(s.head, false));
                    }
                    Op::Ack { dev, seq } => {
                        cmds.push(ack(DEVICES[dev], seq));
                        let s = &mut model[dev];
                        let before = s.retained.len();
                        s.retained.retain(|m| m.0 > seq);
                        want.push(Reply::Count((before - s.retained.len()) as u64));
                    }
                }
            }
            let got = sm.entry(cmds.clone());
            prop_assert_eq!(&got, &want, "entry {:?}", cmds);
            for (cmd, reply) in cmds.iter().zip(&got) {
                if let (Command::Publish { device, .. }, Reply::Published { seq, duplicate: false }) = (cmd, reply) {
                    let dev = DEVICES.iter().position(|d| d == device).unwrap();
                    prop_assert!(*seq > last[dev], "seq {} after {} on {}", seq, last[dev], device);
                    last[dev] = *seq;
                }
            }
            for (d, s) in DEVICES.iter().zip(&model) {
                let r = read(&sm, d, 0, usize::MAX);
                let oldest = s.retained.front().map_or(s.head + 1, |m| m.0);
                prop_assert_eq!(r.head, head(s.head, oldest), "{}", d);
                let want: Vec<(u64, Message)> = s
                    .retained
                    .iter()
                    .map(|(seq, at_ms, payload, key)| (*seq, Message { at_ms: *at_ms, payload: payload.clone(), key: key.clone() }))
                    .collect();
                prop_assert_eq!(&r.messages, &want, "{}", d);
                prop_assert!(r.messages.windows(2).all(|w| w[0].0 < w[1].0), "seqs not increasing on {}", d);
                let keys: BTreeMap<String, u64> =
                    s.retained.iter().filter_map(|m| m.3.clone().map(|k| (k, m.0))).collect();
                prop_assert_eq!(idem(&sm, d).into_iter().collect::<BTreeMap<_, _>>(), keys, "{}", d);
            }
        }
        let copy = install_copy(&sm);
        for d in DEVICES {
            prop_assert_eq!(read(&copy, d, 0, usize::MAX), read(&sm, d, 0, usize::MAX));
        }
    }
}
