//! A push that reaches the node before the device's `sync` waits for it (V5): the device gets its
//! backlog first, then the newer message, each once. Before, the push went out first; the device
//! acked past its backlog (trimming it) before receiving it. A device that never syncs gets live
//! pushes after a short grace, none lost to retention meanwhile.

mod common;

use std::time::Duration;

use common::ws::{Dial, Event, Ws};
use common::{Cluster, Start};
use serde_json::json;

fn messages(ws: &mut Ws, n: usize) -> Vec<u64> {
    let mut seqs = Vec::new();
    while seqs.len() < n {
        match ws.next_event(Duration::from_secs(10)) {
            Event::Text(v) if v["t"] == "msg" => seqs.push(v["seq"].as_u64().unwrap()),
            Event::Text(_) | Event::Ping | Event::Pong => {}
            other => panic!("{other:?} after {seqs:?}"),
        }
    }
    seqs
}

#[test]
fn a_push_before_the_devices_sync_follows_its_backlog() {
    let mut c = Cluster::new();
    c.spawn("n1", Start::Bootstrap);
    let token = c.token("s1", 1);
    drop(c.dial(0, "/ws?attempt=1", &Dial::token(&token)).open("first connection"));
    for i in 1..=3 {
        assert_eq!(c.publish_ok(&[0], "s1", &json!({ "i": i }), &format!("k{i}")), i);
    }
    let mut ws = c.dial(0, "/ws?attempt=2", &Dial::token(&token)).open("second connection");
    assert_eq!(ws.hello()["stream_head"], 3);
    // Committed and applied before the device asks for its backlog.
    assert_eq!(c.publish_ok(&[0], "s1", &json!({ "i": 4 }), "k4"), 4);
    ws.send_json(&json!({"t": "sync", "after": 0})).unwrap();
    assert_eq!(messages(&mut ws, 4), vec![1, 2, 3, 4]);
}

#[test]
fn a_device_that_never_syncs_gets_every_live_push() {
    let mut c = Cluster::with_args(&["--retain-count", "2"]);
    c.spawn("n1", Start::Bootstrap);
    let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token("s2", 1))).open("device");
    assert_eq!(ws.hello()["stream_head"], 0);
    for i in 1..=6 {
        assert_eq!(c.publish_ok(&[0], "s2", &json!({ "i": i }), &format!("k{i}")), i);
    }
    // Retention keeps two, but the pushes held for the grace were kept in memory.
    assert_eq!(messages(&mut ws, 6), (1..=6).collect::<Vec<_>>());
}

#[test]
fn long_and_short_payloads_are_pushed_live_in_order() {
    // Apply events carry payloads and are weighed in bytes on their way to the sessions (bounded
    // queue, `raft::events`): long and short ones interleaved still arrive in order, whole.
    let mut c = Cluster::new();
    c.spawn("n1", Start::Bootstrap);
    let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token("s3", 1))).open("device");
    ws.hello();
    ws.send_json(&json!({"t": "sync", "after": 0})).unwrap();
    let body = |i: u64| match i % 2 {
        0 => json!({ "i": i, "pad": "p".repeat(10_000) }),
        _ => json!({ "i": i }),
    };
    let mut got = Vec::new();
    for i in 1..=6 {
        assert_eq!(c.publish_ok(&[0], "s3", &body(i), &format!("k{i}")), i);
        while got.len() < i as usize {
            match ws.next_event(Duration::from_secs(10)) {
                Event::Text(v) if v["t"] == "msg" => got.push(v),
                Event::Text(_) | Event::Ping | Event::Pong => {}
                other => panic!("{other:?} after {} messages", got.len()),
            }
        }
    }
    for (k, v) in got.iter().enumerate() {
        let i = k as u64 + 1;
        assert_eq!((v["seq"].as_u64(), &v["payload"]), (Some(i), &body(i)), "message {i}");
    }
}
