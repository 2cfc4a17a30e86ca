//! Device → backend delivery (issue 13) against a real HTTP backend in this process
//! (`common::upstream`): an up is acked exactly when the backend answered 2xx to its key; every
//! try of one up, and a device's retry of it, carries the same `Idempotency-Key: <device>:<id>`;
//! a 4xx is never retried; in-flight bounds nack `overloaded` at once instead of queueing; bad up
//! frames get a clear answer and never an echo; a slow backend within the try timeout is waited
//! for; a node without an upstream nacks `no_upstream`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::upstream::{Behave, Upstream};
use common::ws::{Dial, Ws};
use common::{wait_until, Cluster, SLACK};
use serde_json::{json, Value};

/// Sends `{"t":"up","id":id,"payload":payload}`.
fn up(ws: &Ws, id: u64, payload: Value) {
    ws.send_json(&json!({"t": "up", "id": id, "payload": payload})).expect("send up");
}

/// The next `n` up answers (`up_ack` / `up_nack`) by id, with when each arrived.
fn answers(ws: &mut Ws, n: usize, bound: Duration) -> BTreeMap<u64, (Instant, Value)> {
    let deadline = Instant::now() + bound;
    let mut got = BTreeMap::new();
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = ws.next_text(left, &format!("{} of {n} up answers", got.len()));
        if v["t"] == "up_ack" || v["t"] == "up_nack" {
            let id = v["id"].as_u64().expect("an answer names its id");
            assert!(got.insert(id, (Instant::now(), v.clone())).is_none(), "two answers for id {id}: {v}");
        }
    }
    got
}

fn open(c: &Cluster, device: &str) -> Ws {
    let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token(device, 0))).open(device);
    ws.hello();
    ws
}

#[test]
fn ups_are_acked_exactly_on_2xx_with_one_key_per_up() {
    let backend = Upstream::start(Behave::Ok);
    let url = backend.url();
    let (c, _) = Cluster::form(
        1,
        &[
            "--upstream-url",
            &url,
            "--upstream-max-in-flight-per-device",
            "4",
            "--upstream-max-in-flight",
            "6",
            "--upstream-max-payload-bytes",
            "1024",
            "--upstream-breaker-failures",
            "1000",
        ],
    );
    let bound = Duration::from_secs(5) + SLACK; // the default deadline, and the machine's slack
    let mut ws = open(&c, "d1");
    // Every answer of the test, by key: acks and nacks are checked against the backend at the end.
    let mut acked = BTreeSet::new();
    let mut note = |device: &str, got: &BTreeMap<u64, (Instant, Value)>| {
        for (id, (_, v)) in got {
            if v["t"] == "up_ack" {
                acked.insert(format!("{device}:{id}"));
            }
        }
    };

    // 1. A healthy backend: four ups, four acks, four requests with their keys and bodies.
    for id in 1..=4 {
        up(&ws, id, json!({"n": id}));
    }
    let got = answers(&mut ws, 4, bound);
    note("d1", &got);
    assert!(got.values().all(|(_, v)| v["t"] == "up_ack"), "{got:?}");
    let seen = backend.seen();
    let keys: BTreeSet<_> = seen.iter().filter_map(|s| s.key.clone()).collect();
    assert_eq!(keys, (1..=4).map(|i| format!("d1:{i}")).collect::<BTreeSet<_>>(), "one key per up");
    let body = &seen.iter().find(|s| s.key.as_deref() == Some("d1:2")).unwrap().body;
    assert_eq!(body, &json!({"device": "d1", "tenant": null, "id": 2, "payload": {"n": 2}}));

    // A burst far beyond the device's bound of 4: every up is answered (acked, or overloaded at
    // once), none dropped, however the answers and the new ups interleave.
    for id in 100..140 {
        up(&ws, id, json!({"n": id}));
    }
    let burst = answers(&mut ws, 40, bound);
    note("d1", &burst);
    assert!(burst.values().all(|(_, v)| v["t"] == "up_ack" || v["reason"] == "overloaded"), "{burst:?}");
    assert!(burst.values().any(|(_, v)| v["t"] == "up_ack"), "{burst:?}");

    // 2. A flaky phase: 503 for a while, then healthy; the device retries nacked ids. Acked ids
    // are exactly the keys the backend answered 2xx to, and every request of an id has its key.
    backend.set(Behave::Status(503));
    for id in 10..14 {
        up(&ws, id, json!({"n": id}));
    }
    let flaky = answers(&mut ws, 4, bound);
    assert!(flaky.values().all(|(_, v)| v["t"] == "up_nack" && v["retry_after_ms"].is_u64()), "{flaky:?}");
    backend.set(Behave::Ok);
    for id in 10..14 {
        up(&ws, id, json!({"n": id}));
    }
    let retried = answers(&mut ws, 4, bound);
    note("d1", &flaky);
    note("d1", &retried);
    assert!(retried.values().all(|(_, v)| v["t"] == "up_ack"), "{retried:?}");
    let tries_of_10 = backend.seen().iter().filter(|s| s.key.as_deref() == Some("d1:10")).count();
    assert!(tries_of_10 >= 2, "the 503'd up reached the backend again under its key: {tries_of_10}");

    // A slow backend within the try timeout (2 s by default): acked once it answers, one try each.
    backend.set(Behave::Slow(Duration::from_millis(300)));
    let (before, t0) = (backend.count(), Instant::now());
    for id in 60..62 {
        up(&ws, id, json!({"n": id}));
    }
    let slow = answers(&mut ws, 2, bound);
    note("d1", &slow);
    assert!(slow.values().all(|(at, v)| v["t"] == "up_ack" && *at - t0 >= Duration::from_millis(300)), "{slow:?}");
    assert_eq!(backend.count(), before + 2, "no second try while the first is within its timeout");

    // 3. A 4xx is final: one try, nacked `rejected` with the status and no retry_after.
    backend.set(Behave::Status(422));
    let before = backend.count();
    up(&ws, 20, json!({}));
    let rejected = answers(&mut ws, 1, bound);
    note("d1", &rejected);
    let v = rejected[&20].1.clone();
    assert_eq!(
        (v["t"].as_str(), v["reason"].as_str(), v["status"].as_u64()),
        (Some("up_nack"), Some("rejected"), Some(422))
    );
    assert!(v.get("retry_after_ms").is_none(), "a 4xx is not worth retrying: {v}");
    assert_eq!(backend.count(), before + 1, "a 4xx is never retried");

    // 4. Bounds: a hanging backend holds 4 ups of this device; the 5th and 6th are nacked
    // overloaded at once. A second device gets the node's last 2 slots, then overloaded too.
    backend.set(Behave::Hang);
    let t0 = Instant::now();
    for id in 30..36 {
        up(&ws, id, json!({}));
    }
    let quick = answers(&mut ws, 2, SLACK);
    note("d1", &quick);
    assert_eq!(quick.keys().copied().collect::<Vec<_>>(), [34, 35], "the ups beyond the device's 4: {quick:?}");
    assert!(quick.values().all(|(_, v)| v["reason"] == "overloaded" && v["retry_after_ms"].is_u64()), "{quick:?}");
    let mut ws2 = open(&c, "d2");
    for id in 1..=4 {
        up(&ws2, id, json!({}));
    }
    let second = answers(&mut ws2, 2, SLACK);
    note("d2", &second);
    assert_eq!(second.keys().copied().collect::<Vec<_>>(), [3, 4], "the node's 6 slots are taken: {second:?}");
    let in_flight = wait_until(SLACK, "ups_in_flight at the node's bound", || {
        let v = c.metric(0, "gateway_ups_in_flight").unwrap_or(-1.0);
        if v == 6.0 {
            Ok(v)
        } else {
            Err(v)
        }
    });
    println!("[upstream] in flight at the bound: {in_flight}; overloaded answered within {:?}", t0.elapsed());
    // The held ups are answered within their deadline (their retries may reach the healthy
    // backend: then acked), never dropped, and free their slots.
    backend.set(Behave::Ok);
    let held = answers(&mut ws, 4, bound);
    note("d1", &held);
    note("d2", &answers(&mut ws2, 2, bound));
    up(&ws, 40, json!({}));
    let again = answers(&mut ws, 1, bound);
    note("d1", &again);
    assert_eq!(again[&40].1["t"], "up_ack", "slots are free again");

    // 5. Bad ups: too large is nacked (not retryable); no id is an error frame; the connection
    // stays open, and no answer quotes what the device sent.
    let big = "x".repeat(2000);
    up(&ws, 50, json!({"blob": big}));
    let (_, v) = answers(&mut ws, 1, bound).remove(&50).unwrap();
    assert_eq!(v["reason"], "payload_too_large", "{v}");
    assert!(v.get("retry_after_ms").is_none());
    ws.send_json(&json!({"t": "up", "payload": {"secret": "s3cr3t"}})).unwrap();
    let e = ws.next_text(bound, "error for an up without id");
    assert_eq!(e["t"], "error", "{e}");
    assert!(!e.to_string().contains("s3cr3t"), "never echo the device: {e}");
    up(&ws, 51, json!({}));
    let last = answers(&mut ws, 1, bound);
    note("d1", &last);
    assert_eq!(last[&51].1["t"], "up_ack", "the connection is still fine");

    // Acked exactly the keys the backend answered 2xx to; every request carried its up's key.
    let seen = backend.seen();
    let ok_keys: BTreeSet<_> = seen.iter().filter(|s| s.status / 100 == 2).filter_map(|s| s.key.clone()).collect();
    assert_eq!(acked, ok_keys, "acked exactly the keys the backend took with a 2xx");
    for s in &seen {
        let (device, id) = (s.body["device"].as_str().unwrap_or("?"), s.body["id"].as_u64().unwrap_or(0));
        assert_eq!(s.key.clone(), Some(format!("{device}:{id}")), "every try carries its up's key");
    }
    let metric = |r: &str| c.metric_labeled(0, "gateway_ups_total", &format!("result=\"{r}\"")).unwrap_or(0.0);
    assert!(metric("ack") >= 10.0 && metric("overloaded") >= 4.0 && metric("rejected") == 1.0);
}

#[test]
fn without_an_upstream_ups_are_nacked_no_upstream() {
    let (c, _) = Cluster::form(1, &[]);
    let mut ws = open(&c, "d1");
    up(&ws, 1, json!({"a": 1}));
    let (_, v) = answers(&mut ws, 1, SLACK).remove(&1).unwrap();
    assert_eq!((v["t"].as_str(), v["reason"].as_str()), (Some("up_nack"), Some("no_upstream")), "{v}");
    assert!(v.get("retry_after_ms").is_none());
    ws.send_json(&json!({"t": "ping"})).unwrap();
    assert_eq!(ws.next_text(SLACK, "pong after the nack")["t"], "pong", "the session goes on");
}
