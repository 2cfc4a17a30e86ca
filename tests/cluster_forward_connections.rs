//! A follower forwards its writes to the leader over a few pooled connections, however many
//! callers it has: a forward takes one of the bulk queue's lanes (`cluster::forward::MAX_FORWARDS`, six)
//! and the batch keeps its slot until one is free, so what queues while every lane is out goes in
//! the next forward. Before, a batch let its slot go once it was forwarded: a follower with many
//! callers had a forward in flight for every one or two of them, each on a connection of its own,
//! and the HTTP client's pool (eight idle connections a host) closed the rest once they were
//! answered. The handshake bench saw ~420 new follower-to-leader connections a second in a
//! three-node run, every one left in TIME_WAIT for a minute on the follower's side.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{wait_until, Cluster, TIMING};

/// Callers claiming through the follower at once.
const CALLERS: usize = 64;
/// Claims each caller makes, on devices of its own.
const CLAIMS_EACH: usize = 30;
/// Connections to the leader's cluster listener that may be opened during the load. The
/// follower's forwards are at most six at once (and a renewal now and then), but its pool dials
/// whenever it has no idle connection at a checkout and keeps the new one even when the checkout
/// was served by a connection handed back meanwhile: up to eight in use and eight idle before it
/// closes any. The other follower (renewals) shares the count. 63 were opened before the lanes.
const MOST_NEW_CONNECTIONS: usize = 16;

/// Client-side TCP sockets on this machine (any state, TIME_WAIT included) connected to
/// `port` on 127.0.0.1: their local ports.
fn clients_of(port: u16) -> HashSet<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let port_of = |field: &str| u16::from_str_radix(field.rsplit(':').next()?, 16).ok();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut f = line.split_whitespace().skip(1);
            let (local, remote) = (f.next()?, f.next()?);
            // 0100007F is 127.0.0.1 in the kernel's byte order.
            (remote.starts_with("0100007F:") && port_of(remote)? == port).then(|| port_of(local)).flatten()
        })
        .collect()
}

#[test]
fn a_follower_forwards_many_callers_claims_over_a_few_pooled_connections() {
    let (c, view) = Cluster::form(3, &[]);
    let leader = (0..3).find(|&i| Some(c.node_id(i)) == view.leader).expect("a leader");
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let (to, leader_port) = (c.nodes[follower].cluster_addr(), c.nodes[leader].cluster_port);
    // The first forward after the cluster formed: the follower's pool holds a connection.
    c.claim_accepted(follower, "warm", 1, 0, 1, Duration::from_secs(30));
    let before = clients_of(leader_port);

    let api = c.api();
    let started = Instant::now();
    let refused: usize = std::thread::scope(|s| {
        let callers: Vec<_> = (0..CALLERS)
            .map(|k| {
                let api = api.clone();
                s.spawn(move || {
                    let mut refused = 0;
                    for n in 0..CLAIMS_EACH {
                        let device = format!("fwd-{k}-{n}");
                        match api.try_claim(to, &device, 1, 0, 1) {
                            Ok((200, _)) => {}
                            _ => refused += 1,
                        }
                    }
                    refused
                })
            })
            .collect();
        callers.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let claims = CALLERS * CLAIMS_EACH;
    println!("{claims} claims through the follower in {:?}, {refused} not accepted", started.elapsed());
    assert_eq!(refused, 0, "every claim through the follower commits");

    let forwarded = wait_until(Duration::from_secs(10), "the follower's forward counter", || {
        c.metric(follower, "gateway_forwarded_commands_total").filter(|n| *n >= claims as f64).ok_or("not yet")
    });
    let requests = c.metric(follower, "gateway_forwarded_batches_total").unwrap_or(0.0);
    let new: Vec<u16> = clients_of(leader_port).difference(&before).copied().collect();
    println!(
        "{forwarded} commands forwarded in {requests} requests; {} new connections to the leader: {new:?}",
        new.len()
    );
    assert!(
        new.len() <= MOST_NEW_CONNECTIONS,
        "{} new connections to the leader's cluster listener for {claims} claims from {CALLERS} callers \
         (at most {MOST_NEW_CONNECTIONS})",
        new.len()
    );
    assert!(requests < claims as f64, "forwards carried several claims each: {requests} requests for {claims}");
}

/// A forward holds its lane while its leader leads, not while it waits for an answer that will
/// not come: with the leader frozen (SIGSTOP) and forwards to it stuck, the follower gives their
/// lanes back once it sees an election, and a claim made on it then commits within a failover,
/// not after the stuck forwards' deadline (the propose timeout, set long here so that the two
/// are far apart).
#[test]
fn forwards_stuck_on_a_frozen_leader_do_not_hold_up_the_next_leader_s_writes() {
    const PROPOSE_TIMEOUT_MS: u64 = 30_000;
    /// Claims the follower forwards to the frozen leader before it notices, a few apart so that
    /// they go in forwards of their own: more than its lanes and batch slots (6 + 2) when the
    /// machine keeps up, at least one otherwise.
    const STUCK: usize = 10;
    let (c, view) = Cluster::form(3, &["--propose-timeout-ms", &PROPOSE_TIMEOUT_MS.to_string()]);
    let old = view.leader.expect("a leader");
    let leader = (0..3).find(|&i| c.node_id(i) == old).unwrap();
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let to = c.nodes[follower].cluster_addr();
    c.claim_accepted(follower, "warm", 1, 0, 1, Duration::from_secs(30));
    let lanes = |c: &Cluster| c.metric(follower, "gateway_forward_lanes_busy").ok_or("no gauge");

    c.sigstop(leader);
    let api = c.api();
    std::thread::scope(|s| {
        // The most lanes seen busy while the claims went out: the scenario held some.
        let mut busy = 0.0f64;
        for k in 0..STUCK {
            let api = api.clone();
            s.spawn(move || api.try_claim(to, &format!("stuck-{k}"), 1, 0, 1));
            // Scenario pacing: each claim in a forward of its own.
            std::thread::sleep(Duration::from_millis(20));
            busy = busy.max(lanes(&c).unwrap_or(0.0));
        }
        let elected = c
            .wait_agreement(&others, TIMING.failover_bound(), "another leader", |v| v.leader.is_some_and(|l| l != old));
        wait_until(TIMING.failover_bound(), "the follower's forward lanes to be given back", || match lanes(&c) {
            Ok(0.0) => Ok(()),
            other => Err(format!("{other:?} busy")),
        });
        let started = Instant::now();
        let outcome = api.try_claim(to, "after", 1, 0, 1);
        let took = started.elapsed();
        c.sigcont(leader);
        println!(
            "{busy} lanes busy with the leader frozen; new leader {:?}; a claim on the follower then: {:?} in {took:?}",
            elected.leader,
            outcome.as_ref().map(|(status, _)| status)
        );
        assert!(busy >= 1.0, "no forward was stuck on the frozen leader: the scenario did not happen");
        let (status, body) = outcome.expect("the claim is answered");
        assert_eq!(status, 200, "{body}");
        assert!(
            took < TIMING.failover_bound(),
            "a claim on the follower after the election took {took:?} (the propose timeout is {PROPOSE_TIMEOUT_MS} ms)"
        );
    });
}
