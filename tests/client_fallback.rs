//! A 307 to a node the device cannot reach (SIGKILLed while its lease still makes it live): the
//! client reports the failed redirect, asks its seed URL again at once with `?fallback=<node>`, and
//! placement sends it to a node it can reach. (Placement still picks n1 only while its lease is
//! live, `TIMING.lease_ms`; the device dials right after the kill.)

mod client_util;
mod common;

use std::time::{Duration, Instant};

use client_util::{config, ms, start};
use common::{Cluster, TIMING};
use gateway::client::device::{Event, MemoryStore};

#[test]
fn an_unreachable_redirect_target_is_reported_and_avoided() {
    let (mut c, _) = Cluster::form(3, &[]);
    let (n1, n2) = (0, 1);
    let (device, token) = (0..64)
        .map(|k| format!("fb{k}"))
        .find_map(|d| {
            let t = c.token(&d, 0);
            (c.public_get(n2, "/v1/placement", Some(&t)).json()["node"] == "n1").then_some((d, t))
        })
        .expect("one of 64 devices hashes to n1");

    c.kill9(n1);
    let killed = Instant::now();
    let mut d = start("device", config(&c.public_url(n2), &device, &token, 0, 11), Box::new(MemoryStore::new(0)));
    // n1 led: the device's claim on n2 waits for the survivors' election, which a loaded machine
    // stretched past 3 s (a vote unanswered within the election timeout, a renewal fence on n2).
    let (connected_at, e) = d.wait_for(TIMING.settle_bound(), "connected", |e| matches!(e, Event::Connected { .. }));
    let Event::Connected { node, .. } = e else { unreachable!() };
    assert_ne!(node, "n1");
    let events: Vec<&Event> = d.log.iter().map(|(_, e)| e).collect();
    assert!(matches!(events[1], Event::Redirected { node, .. } if node == "n1"), "{events:#?}");
    assert!(matches!(events[4], Event::Unreachable { stage: "connect", .. }), "{events:#?}");
    assert_eq!(events[5], &Event::Waiting { delay: Duration::ZERO, why: "redirect_unreachable" });
    assert!(
        matches!(events[6], Event::Dialing { url, .. } if url.starts_with(&c.public_url(n2)) && url.ends_with("&fallback=n1")),
        "{events:#?}"
    );
    let unavailable = d.count(|e| matches!(e, Event::Refused { status: 503, .. }));
    println!(
        "[client_fallback] {device}: 307 to the killed n1, redial with fallback=n1 {} after the kill; \
         connected to {node} {} after the kill ({unavailable} × 503 while a new leader was elected)",
        ms(d.log[6].0 - killed),
        ms(connected_at - killed)
    );
}
