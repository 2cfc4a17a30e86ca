//! The client's 409 handling: a device whose stored attempt is below the floor another instance
//! pushed gets `409 stale_attempt` once, jumps past the floor and connects; a device of an older
//! install epoch stops (`StaleEpoch`); a refused token stops (`Unauthorized`) without retrying.

mod client_util;
mod common;

use std::time::{Duration, Instant};

use client_util::{config, ms, start};
use common::{wait_until, Cluster, SLACK};
use gateway::client::device::{Event, MemoryStore, StopReason};

#[test]
fn stale_attempt_jumps_past_the_floor_and_hopeless_refusals_stop() {
    let (c, _) = Cluster::form(1, &[]);
    let url = c.public_url(0);
    let token = c.token("st1", 0);

    // Another instance pushes the floor to (0, 101), then goes away (the floor stays).
    let mut other = start("other", config(&url, "st1", &token, 0, 1), Box::new(MemoryStore::new(100)));
    let (_, e) = other.wait_for(SLACK, "connected", |e| matches!(e, Event::Connected { .. }));
    assert!(matches!(e, Event::Connected { attempt: 101, .. }), "{e:?}");
    let asked = Instant::now();
    assert_eq!(other.shutdown(SLACK).0, StopReason::Shutdown);
    let stopped = asked.elapsed();
    // It closed the connection (with 1000) promptly, and the node released the route.
    wait_until(SLACK, "the route released after the client's close", || match c.route(0, "st1") {
        (404, _) => Ok(()),
        other => Err(other),
    });
    println!("[client_stale] shutdown while connected returned in {}, route released", ms(stopped));

    let mut d = start("behind", config(&url, "st1", &token, 0, 2), Box::new(MemoryStore::new(5)));
    let (_, e) = d.wait_for(SLACK, "connected", |e| matches!(e, Event::Connected { .. }));
    assert!(matches!(e, Event::Connected { attempt: 102, .. }), "jumped past the floor: {e:?} {:#?}", d.log);
    let (_, log) = d.shutdown(SLACK);
    let events: Vec<&Event> = log.iter().map(|(_, e)| e).collect();
    assert!(matches!(events[0], Event::Dialing { attempt: 6, .. }), "{events:#?}");
    assert_eq!(events[1], &Event::Stale { floor_epoch: 0, floor_attempt: 101 });
    assert_eq!(events[2], &Event::Waiting { delay: Duration::ZERO, why: "stale_attempt" }, "a 409 is retried promptly");
    assert!(matches!(events[3], Event::Dialing { attempt: 102, .. }), "{events:#?}");
    let stale_to_dial = log[3].0 - log[1].0;
    println!(
        "[client_stale] 409 at attempt 6 (floor 101), redialed with 102 {} later and connected",
        ms(stale_to_dial)
    );
    assert!(stale_to_dial < SLACK);

    // An install epoch older than the floor's can never win: stop, say why.
    let new_install = c.token("st2", 1);
    let mut newer = start("epoch 1", config(&url, "st2", &new_install, 1, 3), Box::new(MemoryStore::new(0)));
    newer.wait_for(SLACK, "connected", |e| matches!(e, Event::Connected { .. }));
    let old = start("epoch 0", config(&url, "st2", &c.token("st2", 0), 0, 4), Box::new(MemoryStore::new(50)));
    let (reason, log) = old.join(SLACK);
    assert_eq!(reason, StopReason::StaleEpoch { floor_epoch: 1 }, "{log:#?}");
    assert_eq!(log.iter().filter(|(_, e)| matches!(e, Event::Dialing { .. })).count(), 1, "{log:#?}");
    drop(newer);

    // A token the cluster does not accept: one dial, then stop.
    let bad = start("bad token", config(&url, "st3", "not.a.jwt", 0, 5), Box::new(MemoryStore::new(0)));
    let (reason, log) = bad.join(SLACK);
    assert_eq!(reason, StopReason::Unauthorized, "{log:#?}");
    assert!(matches!(&log[1].1, Event::Refused { status: 401, .. }), "{log:#?}");
    assert_eq!(log.len(), 3, "dial, refusal, stop: {log:#?}");
}
