//! A node whose disk stops answering (an `fdatasync` that hangs: a network volume's I/O pause, a
//! failing disk) has no error to act on. Before, a leader in that state went on sending
//! heartbeats while its applies hung, so nobody elected another and every node's writes waited
//! for the stall's whole length; and a node in that state kept its devices, to which it could
//! deliver nothing, for as long as the stall lasted. Now a node whose store write has made no
//! progress for `lease / 4` fences (503 to handshakes, 1013 to its devices after `lease / 10`),
//! answers the leader's probes 503 (so it is suspected and leaves the ring) and, when it leads,
//! hands leadership to a voter; when its disk answers again it serves again.
//!
//! The stall is real blocking I/O in the node's own threads: the nodes preload a shim that holds
//! their `fdatasync` and `fsync` calls while a flag file exists (`common::stall`).

mod common;

use std::time::{Duration, Instant};

use common::status::leader_name;
use common::ws::{Dial, Event, Ws};
use common::{wait_until, Cluster, SLACK, TIMING};

/// The stall a node acts on: a store write without progress for a quarter of a lease.
fn stall_bound() -> Duration {
    Duration::from_millis(TIMING.lease_ms / 4)
}

/// From a stall's start to its node's fence: its next store write (a lease renewal reaches every
/// node's log within `lease / 5`), the stall bound, and one tick of the fence loop (`lease / 20`).
fn fence_bound() -> Duration {
    Duration::from_millis(TIMING.lease_ms / 5 + TIMING.lease_ms / 20) + stall_bound()
}

fn leader(c: &Cluster, on: usize) -> Result<usize, String> {
    let s = c.try_status(on)?;
    let name = leader_name(&s).ok_or_else(|| format!("no leader in {s}"))?;
    c.nodes.iter().position(|n| n.name == name).ok_or_else(|| format!("unknown leader {name}"))
}

fn open(c: &Cluster, i: usize, device: &str) -> Ws {
    let mut ws = c.dial(i, "/ws?attempt=1&steer=off", &Dial::token(&c.token(device, 0))).open(device);
    assert_eq!(ws.hello()["node"], c.nodes[i].name.as_str(), "{device} on {}", c.nodes[i].name);
    ws
}

/// No close and no end on `ws` for `quiet`.
fn undisturbed(ws: &mut Ws, what: &str, quiet: Duration) {
    let until = Instant::now() + quiet;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match ws.next_event(left) {
            Event::Timeout | Event::Ping | Event::Pong | Event::Text(_) => {}
            other => panic!("{what} was disturbed: {other:?}"),
        }
    }
}

fn ready(c: &Cluster, i: usize) -> Result<(), String> {
    match c.get(i, "/readyz") {
        Ok(r) if r.status == 200 => Ok(()),
        Ok(r) => Err(format!("{} {}", r.status, r.text())),
        Err(e) => Err(format!("{e:#}")),
    }
}

#[test]
fn a_node_whose_disk_stops_answering_fences_and_a_leader_hands_over() {
    let mut c = Cluster::with_args(&["--propose-timeout-ms", "1000"]);
    c.stallable_flushes();
    let (mut c, _) = c.form_nodes(3);
    let lead = wait_until(TIMING.settle_bound(), "a leader", || leader(&c, 0));
    let followers: Vec<usize> = (0..3).filter(|&i| i != lead).collect();
    let (f, other) = (followers[0], followers[1]);
    let mut on_f = open(&c, f, "on-f");
    let mut on_other = open(&c, other, "on-other");

    // A follower's disk stops: it fences and tells its device to go; the others go on committing
    // and keep their leader and devices.
    c.stall_flushes(f, true);
    let stalled_at = Instant::now();
    let close_bound = fence_bound() + Duration::from_millis(TIMING.lease_ms / 10) + SLACK;
    let (closed_at, code, reason) = on_f.expect_close(close_bound, "the stalled follower's device");
    println!("[ops_store_stall] follower {}: device closed {code} after {:?}", c.nodes[f].name, closed_at - stalled_at);
    assert_eq!((code, reason.as_str()), (1013, "the node's store stopped answering"));
    // It answers the leader's probes 503: suspected, out of the ring, so that its devices are
    // placed on the others.
    let name = c.nodes[f].name.clone();
    c.wait_agreement(&[lead, other], fence_bound() + TIMING.failover_bound(), "the stalled follower suspected", |v| {
        v.member(&name).is_some_and(|m| m.state == "suspect")
    });
    println!("[ops_store_stall] follower {name} suspected {:?} after its disk stalled", stalled_at.elapsed());
    c.claim_accepted(lead, "during-follower-stall", 1, 0, 1, SLACK);
    assert_eq!(leader(&c, lead), Ok(lead), "a follower's stall moves no leadership");
    undisturbed(&mut on_other, "a device of a node whose disk answers", Duration::from_millis(TIMING.lease_ms / 4));

    // Its disk answers again: it serves again.
    c.stall_flushes(f, false);
    let resumed_at = Instant::now();
    wait_until(TIMING.settle_bound(), "the follower ready after its disk answers", || ready(&c, f));
    // Its renewals make the suspect live again (no sooner than a quarter of a lease after the
    // suspicion): it takes devices from then on.
    c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), "the follower live again", |v| {
        v.member(&name).is_some_and(|m| m.state == "live")
    });
    println!("[ops_store_stall] follower ready and live {:?} after its disk answered", resumed_at.elapsed());
    let mut back = open(&c, f, "on-f-again");

    // The leader's disk stops: before, it went on heartbeating while no write could be answered,
    // and the whole cluster waited for its disk. Now it hands leadership over and fences.
    let mut on_lead = open(&c, lead, "on-lead");
    c.stall_flushes(lead, true);
    let stalled_at = Instant::now();
    let survivor_bound = fence_bound() + TIMING.failover_bound();
    let moved = wait_until(survivor_bound, "a survivor elected while the leader's disk is stalled", || {
        match (leader(&c, f), leader(&c, other)) {
            (Ok(a), Ok(b)) if a == b && a != lead => Ok(a),
            seen => Err(seen),
        }
    });
    println!(
        "[ops_store_stall] leader {}: {} leads {:?} after the stall began",
        c.nodes[lead].name,
        c.nodes[moved].name,
        stalled_at.elapsed()
    );
    c.claim_accepted(moved, "during-leader-stall", 1, 0, 1, SLACK);
    println!(
        "[ops_store_stall] a claim through the new leader committed {:?} after the stall began",
        stalled_at.elapsed()
    );
    let (closed_at, code, _) = on_lead.expect_close(close_bound, "the stalled leader's device");
    println!("[ops_store_stall] the stalled leader's device closed {code} after {:?}", closed_at - stalled_at);
    assert_eq!(code, 1013);
    undisturbed(&mut back, "a device of a survivor", Duration::from_millis(TIMING.lease_ms / 4));
    undisturbed(&mut on_other, "a device of a survivor", Duration::from_millis(200));

    c.stall_flushes(lead, false);
    wait_until(TIMING.settle_bound(), "the old leader ready after its disk answers", || ready(&c, lead));
    let old_leader = c.nodes[lead].name.clone();
    c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), "the old leader live again", |v| {
        v.member(&old_leader).is_some_and(|m| m.state == "live")
    });
    let stalls = c.metric(lead, "gateway_store_stalls_total").unwrap_or(0.0);
    assert_eq!(stalls, 1.0, "one stall counted on the old leader");
    assert_eq!(c.metric(f, "gateway_store_stalls_total"), Some(1.0), "and one on the follower");
    assert_eq!(c.metric(other, "gateway_store_stalls_total"), Some(0.0), "none where the disk answered");
    let log = std::fs::read_to_string(&c.nodes[lead].stderr_path).unwrap_or_default();
    assert!(log.contains("the store stopped answering: fencing"), "{}", common::tail(&c.nodes[lead].stderr_path, 20));
    for line in log
        .lines()
        .filter(|l| l.contains("leadership") || l.contains("stopped answering") || l.contains("answers again"))
    {
        println!("[ops_store_stall] {}", line.chars().take(260).collect::<String>());
    }
    let _ = open(&c, lead, "on-lead-again");
    c.kill9(lead);
}
