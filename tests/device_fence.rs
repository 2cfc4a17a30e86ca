//! V7, self-fencing. A node that cannot commit lease renewals refuses handshakes (503 no_quorum)
//! and closes its connections with 1013 within one lease; a paused node that is resumed after its
//! routes were swept closes its stale connections (4002/4001) and serves again after a renewal.

mod common;

use std::time::{Duration, Instant};

use common::ws::{Dial, Outcome};
use common::{wait_until, Cluster, SLACK, TIMING};

#[test]
fn a_node_cut_off_from_its_quorum_fences_itself() {
    let (mut c, _) = Cluster::form(3, &[]);
    let n1 = 0;
    let token = c.token("q1", 0);
    let mut ws = c.dial(n1, "/ws?attempt=1&steer=off", &Dial::token(&token)).open("q1 on n1");
    ws.hello();
    // How close a node runs to its fence is exported: the time from sending each renewal to its
    // commit (renewals go out every lease/5).
    let renewals = |c: &Cluster| c.metric(n1, "gateway_lease_renewal_seconds_count").unwrap_or(0.0);
    wait_until(TIMING.settle_bound(), "n1 to count committed renewals", || {
        let n = renewals(&c);
        if n >= 2.0 {
            Ok(n)
        } else {
            Err(n)
        }
    });
    let (sum, count) = (c.metric(n1, "gateway_lease_renewal_seconds_sum").expect("sum"), renewals(&c));
    assert!(sum / count < TIMING.lease_ms as f64 / 1000.0, "renewals commit well within a lease: {sum} s for {count}");

    c.kill9(1);
    c.kill9(2);
    let cut_at = Instant::now();
    let at_cut = renewals(&c);
    let bound = Duration::from_millis(TIMING.lease_ms) + SLACK;
    let (closed_at, code, _) = ws.expect_close(bound, "q1's connection on a node without quorum");
    println!(
        "[device_fence] n1 closed its connection with {code} {:?} after losing its quorum (bound {bound:?})",
        closed_at - cut_at
    );
    assert_eq!(code, 1013, "a node without quorum closes with 1013");
    // Only commits are timed: the renewals n1 kept sending (every lease/40 while failing, each given
    // up after two periods) are not. One may have been committing at the cut.
    let at_fence = renewals(&c);
    assert!(
        at_fence - at_cut <= 1.0,
        "renewals counted without a quorum: {at_cut} at the cut, {at_fence} at the fence"
    );
    let token2 = c.token("q2", 0);
    let r = c.dial(n1, "/ws?attempt=1&steer=off", &Dial::token(&token2)).refused("handshake on a fenced node");
    assert_eq!((r.status, r.error()), (503, "no_quorum"), "{r:?}");
    assert!(r.retry_after().is_some(), "503 carries Retry-After: {r:?}");
    assert_eq!(c.get(n1, "/readyz").map(|r| r.status).ok(), Some(503), "a fenced node is not ready");
}

#[test]
fn a_resumed_node_closes_stale_connections_and_serves_again() {
    let (c, _) = Cluster::form(3, &[]);
    let n1 = 0;
    let mut old = Vec::new();
    for k in 0..3 {
        let device = format!("p{k}");
        let token = c.token(&device, 0);
        let mut ws = c.dial(n1, "/ws?attempt=1&steer=off", &Dial::token(&token)).open(&device);
        ws.hello();
        old.push((device, token, ws));
    }
    c.sigstop(n1);
    let paused_at = Instant::now();
    c.wait_agreement(&[1, 2], TIMING.expiry_bound(), "the survivors to expire the paused n1", |v| {
        v.member("n1").is_some_and(|m| m.state == "expired")
    });
    println!("[device_fence] paused n1 expired after {:?}", paused_at.elapsed());
    // p0 moves to n2 while n1 is frozen.
    let mut moved = c.dial(1, "/ws?attempt=2&steer=off", &Dial::token(&old[0].1)).open("p0 on n2");
    assert_eq!(moved.hello()["node"], "n2");

    c.sigcont(n1);
    let resumed_at = Instant::now();
    for (device, _, ws) in old.iter_mut() {
        let (at, code, reason) = ws.expect_close(TIMING.settle_bound(), &format!("{device}'s stale connection on n1"));
        println!(
            "[device_fence] {device}: closed {code} {reason:?} {:?} after SIGCONT",
            at.saturating_duration_since(resumed_at)
        );
        assert!([4001, 4002].contains(&code), "{device}: a swept/taken-over route closes with 4001/4002, got {code}");
    }
    // n1 serves again once a renewal commits.
    let token = c.token("p-new", 0);
    wait_until(TIMING.settle_bound(), "n1 to accept handshakes again", || {
        match c.dial(n1, "/ws?attempt=1&steer=off", &Dial::token(&token)) {
            Outcome::Open(mut ws) => Ok(ws.hello()),
            Outcome::Refused(r) => Err(format!("{} {}", r.status, r.error())),
        }
    });
    println!("[device_fence] n1 serving again {:?} after SIGCONT", resumed_at.elapsed());
}
