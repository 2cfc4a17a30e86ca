//! V5, the recovery experiment: N devices on node A get 5 messages each; A is killed; 10 more are
//! published to each while they are away; they re-home to the survivors with the project's client
//! (which syncs from its cursor on every connect) and every device ends with exactly the 15
//! messages, in order, none twice. Also: a publish retried with the same Idempotency-Key returns
//! the same seq and is delivered once; bad publishes get clear 4xx errors.

mod client_util;
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use client_util::{config, holds, pinned, received, start};
use common::{http, wait_until, Cluster, TIMING};
use gateway::client::device::{Event, MemoryStore};
use serde_json::json;

const N: usize = 12;

#[test]
fn devices_recover_every_message_after_their_node_is_killed() {
    let (mut c, _) = Cluster::form(3, &[]);
    let (a, survivors) = (0usize, [1usize, 2usize]);
    let mut devices = pinned(&c, a, &survivors, "msg", N, 0);
    for r in devices.iter_mut() {
        r.wait_for(
            TIMING.settle_bound(),
            "connect to n1",
            |e| matches!(e, Event::Connected { node, .. } if node == "n1"),
        );
    }

    let expected = |device: &str, i: u64| json!({"device": device, "n": i});
    for r in &devices {
        for i in 1..=5u64 {
            let seq = c.publish_ok(&[0, 1, 2], &r.name, &expected(&r.name, i), &format!("{}-{i}", r.name));
            assert_eq!(seq, i, "{}: seqs count up from 1", r.name);
        }
    }
    wait_until(TIMING.settle_bound(), "every device to receive its first 5 messages", || {
        let short: Vec<String> =
            devices.iter_mut().filter_map(|r| (received(r).len() < 5).then(|| r.name.clone())).collect();
        if short.is_empty() {
            Ok(())
        } else {
            Err(short)
        }
    });

    c.kill9(a);
    let killed = Instant::now();
    for r in &devices {
        for i in 6..=15u64 {
            c.publish_ok(&survivors, &r.name, &expected(&r.name, i), &format!("{}-{i}", r.name));
        }
    }
    println!(
        "[messages_recovery] 10 more messages to each of {N} devices published {:?} after the kill",
        killed.elapsed()
    );

    let bound = TIMING.settle_bound() + Duration::from_secs(8);
    wait_until(bound, "every device to hold 15 messages", || {
        let short: BTreeMap<String, usize> =
            devices.iter_mut().map(|r| (r.name.clone(), received(r).len())).filter(|(_, n)| *n < 15).collect();
        if short.is_empty() {
            Ok(())
        } else {
            Err(short)
        }
    });
    println!("[messages_recovery] all {N} devices hold 15 messages {:?} after the kill", killed.elapsed());
    for r in devices.iter_mut() {
        let got = received(r);
        let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, (1..=15).collect::<Vec<_>>(), "{}: every message once, in order", r.name);
        for (seq, payload) in &got {
            assert_eq!(payload, &expected(&r.name, *seq), "{}: payload of {seq}", r.name);
        }
        let last = r.log.iter().rev().find_map(|(_, e)| match e {
            Event::Connected { node, .. } => Some(node.clone()),
            _ => None,
        });
        assert_ne!(last.as_deref(), Some("n1"), "{} is on a survivor", r.name);
    }
}

#[test]
fn idempotent_retry_delivers_once_and_bad_publishes_are_refused() {
    let (c, _) = Cluster::form(1, &["--max-payload-bytes", "256"]);
    let r = c.publish(0, "nobody", &json!({"x": 1}), None);
    assert_eq!((r.0, r.1["error"].as_str()), (404, Some("unknown_device")), "{r:?}");

    let d = "once";
    let mut dev = start(d, config(&c.public_url(0), d, &c.token(d, 0), 0, 1), Box::new(MemoryStore(0)));
    dev.wait_for(TIMING.settle_bound(), "connect", |e| matches!(e, Event::Connected { .. }));
    let first = c.publish(0, d, &json!({"hello": 1}), Some("k-1"));
    // The reply was "lost": the backend retries with the same key.
    let retry = c.publish(0, d, &json!({"hello": 1}), Some("k-1"));
    assert_eq!(first.0, 200, "{first:?}");
    assert_eq!(
        (retry.0, &retry.1["seq"], retry.1["duplicate"].as_bool()),
        (200, &first.1["seq"], Some(true)),
        "{retry:?}"
    );
    let second = c.publish(0, d, &json!({"hello": 2}), Some("k-2"));
    assert_eq!(second.1["seq"].as_u64(), Some(first.1["seq"].as_u64().unwrap() + 1), "{second:?}");
    wait_until(TIMING.settle_bound(), "both messages delivered", || holds(&mut dev, 2));
    let got = received(&mut dev);
    assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1, 2], "delivered once each: {got:?}");

    let big = json!({"pad": "x".repeat(300)});
    assert_eq!(c.publish(0, d, &big, None).0, 413);
    let auth = c.bearer();
    let bad = http::request(
        c.nodes[0].cluster_addr(),
        "POST",
        "/v1/devices/once/messages",
        &[("Authorization", auth.as_str())],
        Some(b"{not json"),
        http::REQUEST_TIMEOUT,
    )
    .unwrap();
    assert_eq!((bad.status, bad.json()["error"].as_str()), (400, Some("bad_json")));
    let long_key = "k".repeat(200);
    let r = c.publish(0, d, &json!({}), Some(&long_key));
    assert_eq!((r.0, r.1["error"].as_str()), (400, Some("bad_idempotency_key")), "{r:?}");
}
