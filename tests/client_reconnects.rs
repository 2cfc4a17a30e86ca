//! The client across a drain and a takeover: a device steered (307) from n2 to n1 sees `goaway`
//! and 1001 when n1 drains (SIGTERM), reconnects promptly through its seed URL to a survivor with a
//! higher persisted attempt, and stops with `Superseded` when a second instance of it (a higher
//! attempt) takes over.

mod client_util;
mod common;

use std::time::{Duration, Instant};

use client_util::{config, ms, start};
use common::{Cluster, SLACK};
use gateway::client::device::{Event, FileStore, MemoryStore, StopReason};
use gateway::protocol::ServerFrame;

#[test]
fn drain_moves_the_device_promptly_and_a_newer_instance_supersedes_it() {
    let (c, _) = Cluster::form(3, &[]);
    let (n1, n2) = (0, 1);
    // A device that placement puts on n1 when it dials n2 (so it needs the 307).
    let (device, token) = (0..64)
        .map(|k| format!("rc{k}"))
        .find_map(|d| {
            let t = c.token(&d, 0);
            let r = c.public_get(n2, "/v1/placement", Some(&t));
            assert_eq!(r.status, 200, "placement: {}", r.text());
            (r.json()["node"] == "n1").then_some((d, t))
        })
        .expect("one of 64 devices hashes to n1");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("attempt");
    let url = c.public_url(n2);

    let mut a = start("instance A", config(&url, &device, &token, 0, 7), Box::new(FileStore(file.clone())));
    let (_, e) = a.wait_for(SLACK, "connected", |e| matches!(e, Event::Connected { .. }));
    let Event::Connected { node, attempt: first_attempt, .. } = e else { unreachable!() };
    assert_eq!(node, "n1", "steered to n1: {:#?}", a.log);
    assert_eq!(a.count(|e| matches!(e, Event::Redirected { node, .. } if node == "n1")), 1, "{:#?}", a.log);
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), first_attempt.to_string(), "persisted");
    assert_eq!(first_attempt, 2, "one attempt for n2 (307), one for n1");

    c.sigterm(n1);
    let drained = Instant::now();
    a.wait_for(SLACK, "goaway", |e| matches!(e, Event::Frame(ServerFrame::Goaway { .. })));
    let (closed_at, e) = a.wait_for(SLACK, "close", |e| matches!(e, Event::Closed { .. }));
    assert!(matches!(e, Event::Closed { code: 1001, .. }), "drain closes with 1001: {e:?}");
    let (_, e) = a.wait_for(SLACK, "decision", |e| matches!(e, Event::Waiting { .. }));
    assert_eq!(e, Event::Waiting { delay: Duration::ZERO, why: "goaway" }, "goaway reconnects promptly");
    let (back_at, e) = a.wait_for(SLACK, "reconnected", |e| matches!(e, Event::Connected { .. }));
    let Event::Connected { node, attempt, after, .. } = e else { unreachable!() };
    assert_ne!(node, "n1", "reconnected to a survivor");
    assert!(attempt > first_attempt, "attempt grew: {first_attempt} -> {attempt}");
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), attempt.to_string(), "persisted");
    assert!(after < SLACK, "reconnect took {after:?}");
    let refusals = a.count(|e| matches!(e, Event::Refused { .. } | Event::Unreachable { .. }));
    println!(
        "[client_reconnects] {device}: close 1001 {} after SIGTERM, back on {node} {} after the close \
         (attempt {first_attempt} -> {attempt}, {refusals} refusals on the way)",
        ms(closed_at - drained),
        ms(back_at - closed_at)
    );

    // A second instance with a higher attempt claims the device: A is told 4001 and stops for good.
    let mut b = start("instance B", config(&url, &device, &token, 0, 8), Box::new(MemoryStore::new(attempt + 10)));
    let (b_at, e) = b.wait_for(SLACK, "B connected", |e| matches!(e, Event::Connected { .. }));
    assert!(matches!(e, Event::Connected { attempt: a2, .. } if a2 > attempt + 10), "{e:?}");
    let (reason, log) = a.join(SLACK);
    assert_eq!(reason, StopReason::Superseded, "{log:#?}");
    let closes: Vec<&Event> = log.iter().map(|(_, e)| e).filter(|e| matches!(e, Event::Closed { .. })).collect();
    assert!(matches!(closes.last(), Some(Event::Closed { code: 4001, .. })), "{log:#?}");
    let (stopped_at, last) = log.last().unwrap();
    assert_eq!(last, &Event::Stopped(StopReason::Superseded));
    let (order, gap) = if *stopped_at >= b_at { ("after", *stopped_at - b_at) } else { ("before", b_at - *stopped_at) };
    println!("[client_reconnects] instance A stopped Superseded {} {order} B saw its hello", ms(gap));
    assert!(!log.iter().any(|(t, e)| *t > b_at && matches!(e, Event::Dialing { .. })), "A never redials");
    let (reason, _) = b.shutdown(SLACK);
    assert_eq!(reason, StopReason::Shutdown);
}
