//! A device side that falls behind the apply events loses no push (issue 10, item 6). With the
//! event buffer shrunk to two (a test hook), bursts of publishes to many connected devices make the
//! node's device side lag; every device still receives every acknowledged message, in order, once
//! — the lagged sessions catch up from the store. Before, only kicks were reconciled on a lag: a
//! device whose last pushes fell in the gap waited for its next message, or its next connection.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::ws::{Dial, Event, Ws};
use common::{Cluster, Start};
use serde_json::json;

const DEVICES: usize = 10;
const PER_ROUND: usize = 5;
const MAX_ROUNDS: usize = 40;

#[test]
fn lagged_apply_events_are_caught_up_from_the_store() {
    let mut c = Cluster::new();
    c.env.push(("GATEWAY_TEST_EVENT_CAPACITY".into(), "2".into()));
    c.spawn("n1", Start::Bootstrap);
    let mut sockets: Vec<Ws> = (0..DEVICES)
        .map(|d| {
            let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token(&format!("d{d}"), 1))).open("device");
            ws.hello();
            ws
        })
        .collect();
    let (addr, bearer) = (c.nodes[0].cluster_addr(), c.bearer());
    let mut acked: BTreeMap<usize, u64> = BTreeMap::new();
    let mut rounds = 0;
    // Bursts to every device at once (one log entry holds many of them) until the node reports a lag.
    while c.metric(0, "gateway_event_lags_total").unwrap_or(0.0) == 0.0 {
        assert!(rounds < MAX_ROUNDS, "no lag after {rounds} rounds of {} publishes", DEVICES * PER_ROUND);
        rounds += 1;
        let seqs: Vec<(usize, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..DEVICES * PER_ROUND)
                .map(|k| {
                    let bearer = &bearer;
                    s.spawn(move || {
                        let d = k % DEVICES;
                        let body = json!({ "k": k });
                        let timeout = Duration::from_secs(10);
                        match common::api::publish_at(addr, bearer, &format!("d{d}"), &body, None, timeout) {
                            Ok((200, v)) => (d, v["seq"].as_u64().unwrap()),
                            other => panic!("publish to d{d}: {other:?}"),
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (d, seq) in seqs {
            let last = acked.entry(d).or_default();
            *last = (*last).max(seq);
        }
    }
    println!("lagged after {rounds} rounds");
    // Every device gets 1..=its last acknowledged seq, in order, once.
    let bound = Duration::from_secs(10);
    for (d, ws) in sockets.iter_mut().enumerate() {
        let last = acked[&d];
        let mut seen = Vec::new();
        let started = Instant::now();
        while seen.last() != Some(&last) {
            let left = bound.saturating_sub(started.elapsed());
            assert!(!left.is_zero(), "d{d} got {} of {last} messages: {seen:?}", seen.len());
            match ws.next_event(left) {
                Event::Text(v) if v["t"] == "msg" => seen.push(v["seq"].as_u64().unwrap()),
                Event::Text(_) | Event::Ping | Event::Pong | Event::Timeout => {}
                other => panic!("d{d}: {other:?} after {seen:?}"),
            }
        }
        assert_eq!(seen, (1..=last).collect::<Vec<_>>(), "d{d}: lost, repeated or reordered");
    }
    assert_eq!(c.get(0, "/readyz").unwrap().status, 200, "the node still serving");
}
