//! A closing connection releases its device's route through Raft. When that write cannot commit
//! (the node's quorum is out of reach for longer than the write timeout, yet not for a lease, so
//! no sweep comes), the node retries it until it does: a route left behind would name the node for
//! as long as it lives, send route lookups to a device that is gone, and hold one of its tenant's
//! connections, so that a tenant at its cap could connect no other device.

mod common;

use std::time::Duration;

use common::ws::Dial;
use common::{wait_until, Cluster, SLACK, TIMING};

/// The nodes' write timeout: short, so the release gives up well before the node would fence.
const PROPOSE_TIMEOUT_MS: u64 = 1_000;

#[test]
fn a_release_that_did_not_commit_is_retried_once_the_quorum_is_back() {
    // The peers are resumed once the release has failed: within a write timeout plus a moment,
    // well inside the lease after which a sweep would delete the route (a different path from the
    // one under test, ruled out at the end).
    assert!(Duration::from_millis(PROPOSE_TIMEOUT_MS) < Duration::from_millis(TIMING.lease_ms * 4 / 5));
    let timeout = PROPOSE_TIMEOUT_MS.to_string();
    let (c, view) = Cluster::form(3, &["--propose-timeout-ms", &timeout]);
    let leader = view.leader.expect("a leader");
    let i = (0..3).find(|&i| c.node_id(i) != leader).expect("a follower");
    let peers: Vec<usize> = (0..3).filter(|&k| k != i).collect();
    let n = c.nodes[i].cluster_addr_str();
    let set = ["quota", "set", "--cluster", &n, "--tenant", "acme", "--max-connections", "1"];
    let out = c.cli_auth(&set);
    assert_eq!(out.code, Some(0), "quota set: {out:#?}");

    let mut ws = c.dial(i, "/ws?attempt=1&steer=off", &Dial::token(&c.tenant_token("gone-1", "acme"))).open("gone-1");
    let conn = ws.hello()["conn"].as_u64().expect("hello carries conn");
    let (status, route) = c.route(i, "gone-1");
    assert_eq!((status, route["conn"].as_u64()), (200, Some(conn)), "{route}");

    // The device leaves while the node's peers are frozen: its release waits out the write
    // timeout and is kept for a retry.
    for &k in &peers {
        c.sigstop(k);
    }
    ws.close(1000).expect("the node echoes the close");
    drop(ws);
    let bound = Duration::from_millis(PROPOSE_TIMEOUT_MS) + SLACK;
    wait_until(bound, "the release that did not commit kept for a retry", || {
        match c.metric(i, "gateway_releases_pending") {
            Some(n) if n >= 1.0 => Ok(n),
            other => Err(other),
        }
    });
    for &k in &peers {
        c.sigcont(k);
    }
    let resumed = std::time::Instant::now();

    // Retried every lease/5 once the quorum answers (after an election, if the frozen leader's
    // term was overtaken): the route goes, the floor stays.
    let bound = TIMING.failover_bound() + Duration::from_millis(TIMING.lease_ms / 5 + PROPOSE_TIMEOUT_MS) + SLACK;
    for k in 0..3 {
        let name = c.nodes[k].name.clone();
        wait_until(bound, &format!("gone-1's route released on {name}"), || match c.try_route(k, "gone-1") {
            Ok((404, v)) if v["error"] == "no_route" && !v["floor"].is_null() => Ok(()),
            other => Err(other),
        });
    }
    println!("[device_release_retry] the route was released {:?} after the peers resumed", resumed.elapsed());
    // The retry's round is counted once its answer is in, which may be after the routes were
    // applied. `no_route` when the first try committed after all (its forward reached the frozen
    // leader).
    let retried = |result: &str| c.metric_labeled(i, "gateway_release_retries_total", &format!(r#"result="{result}""#));
    let log = || std::fs::read_to_string(&c.nodes[i].stderr_path).unwrap_or_default();
    wait_until(SLACK, "the retry counted, logged, and nothing left to retry", || {
        let done = retried("released").unwrap_or(0.0) + retried("no_route").unwrap_or(0.0);
        let pending = c.metric(i, "gateway_releases_pending");
        let logged = log().contains("retried releases that did not commit");
        match (done, pending, logged) {
            (1.0, Some(0.0), true) => Ok(()),
            other => Err(other),
        }
    });
    let swept: f64 = (0..3).filter_map(|k| c.metric(k, "gateway_nodes_expired_total")).sum();
    assert_eq!(swept, 0.0, "no sweep deleted the route: no node's lease lapsed");

    // The tenant's one connection is free again.
    let token = c.tenant_token("next-1", "acme");
    let mut next = wait_until(SLACK, "acme's next device accepted", || {
        match c.dial(i, "/ws?attempt=1&steer=off", &Dial::token(&token)) {
            common::ws::Outcome::Open(ws) => Ok(ws),
            common::ws::Outcome::Refused(r) => Err(format!("{} {}", r.status, r.body)),
        }
    });
    assert_eq!(next.hello()["device"], "next-1");
}
