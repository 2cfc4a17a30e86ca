//! Stopping the whole cluster: one node at a time with the leader last (a host's shutdown, an
//! operator's `systemctl stop` on each), then all at once (`docker compose down`). The last node
//! standing has no quorum for its drain's writes (`Drain`, `ReleaseNode`) nor anyone to hand its
//! leadership to. It must find that out from its peers' refused cluster ports and exit 0 at once,
//! not wait out the write timeout for each write and a leader lease for the hand-over (12 s with
//! the defaults; a container runtime's grace period ends in a SIGKILL). The cluster then starts
//! again from its data dirs: every member live, writes commit through each.

mod common;

use std::time::{Duration, Instant};

use common::{reply_node_id, Cluster, SLACK, TIMING};

/// The write timeout the nodes run with: a node that waited it out even once is past the bound.
const PROPOSE_TIMEOUT_MS: u64 = 8_000;

/// A stopping node with no quorum left: its two writes and the hand-over each end after two quorum
/// checks a heartbeat apart (each probe bounded by a heartbeat), or after a leader lease unacknowledged
/// plus those checks; then it exits.
fn lone_stop_bound() -> Duration {
    Duration::from_millis(2 * TIMING.election_timeout_ms * 2 + 8 * TIMING.heartbeat_ms) + SLACK
}

#[test]
fn a_whole_cluster_stops_without_waiting_for_a_quorum_and_starts_again() {
    assert!(lone_stop_bound() < Duration::from_millis(PROPOSE_TIMEOUT_MS), "the bound tells a wait apart");
    let timeout = PROPOSE_TIMEOUT_MS.to_string();
    let (mut c, view) = Cluster::form(3, &["--propose-timeout-ms", &timeout]);
    let leader_id = view.leader.expect("a leader");
    let ids: Vec<u64> = (0..3).map(|i| c.node_id(i)).collect();
    let leader = ids.iter().position(|&id| id == leader_id).expect("the leader is one of ours");
    for i in 0..3 {
        c.claim_accepted(i, &format!("before-{i}"), 1, 0, 1, SLACK);
    }

    // One at a time, the leader last: each follower drains with the quorum still there.
    for i in (0..3).filter(|&i| i != leader) {
        c.sigterm(i);
        let status = c.wait_exit(i, TIMING.settle_bound());
        assert!(status.success(), "{} drains and exits cleanly: {status:?}", c.nodes[i].name);
    }
    let sent = Instant::now();
    c.sigterm(leader);
    let status = c.wait_exit(leader, lone_stop_bound());
    let took = sent.elapsed();
    assert!(status.success(), "the last node exits cleanly: {status:?}");
    let log = std::fs::read_to_string(&c.nodes[leader].stderr_path).unwrap_or_default();
    let tail = || common::tail(&c.nodes[leader].stderr_path, 20);
    assert!(
        log.contains("draining: no quorum left") && log.contains("2 of 3 voters' cluster ports refuse connections"),
        "the last node says why it did not commit its drain:\n{}",
        tail()
    );
    assert!(log.contains("drained, but no quorum left for ReleaseNode"), "{}", tail());
    println!("the last node (the leader) exited {took:?} after its SIGTERM");

    // The same data dirs start again as the same cluster: every member live, writes commit.
    for i in 0..3 {
        c.start(i);
    }
    let names: Vec<String> = c.nodes.iter().map(|n| n.name.clone()).collect();
    c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), "all three live again, under one leader", |v| {
        v.leader.is_some() && v.all_live() && v.ring_live == names
    });
    for (i, id) in ids.iter().enumerate() {
        let v = c.claim_accepted(i, &format!("after-{i}"), 2, 0, 1, TIMING.settle_bound());
        assert_eq!(reply_node_id(&v), Some(*id));
    }

    // All at once.
    let sent = Instant::now();
    for i in 0..3 {
        c.sigterm(i);
    }
    for i in 0..3 {
        let left = lone_stop_bound().saturating_sub(sent.elapsed());
        let status = c.wait_exit(i, left);
        assert!(status.success(), "{} exits cleanly: {status:?}", c.nodes[i].name);
    }
    println!("all three exited within {:?} of their SIGTERMs", sent.elapsed());

    // Nothing was left writing into a stopped Raft (openraft logs an error for each such caller).
    for n in &c.nodes {
        let log = std::fs::read_to_string(&n.stderr_path).unwrap_or_default();
        let stray: Vec<&str> =
            log.lines().filter(|l| l.contains("ERROR proposer:") && l.contains("raft stopped")).collect();
        assert!(stray.is_empty(), "{}: writes outlived Raft:\n{}", n.name, stray.join("\n"));
    }
}
