//! Lease arithmetic never trusts a wall clock that can step (issue 9): the leader's wall clock
//! jumping five minutes ahead expires nobody, and jumping five minutes back does not stop sweeps.
//! Leases run on cluster time — leaders' stamps extrapolated on monotonic clocks — and the wall
//! clock (stepped here through the binary's test hook) only seeds a fresh cluster's first stamp.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, TIMING};

const STEP_MS: i64 = 5 * 60 * 1000;

#[test]
fn stepping_the_leaders_wall_clock_neither_expires_nodes_nor_stops_sweeps() {
    let (mut c, view) = Cluster::form(3, &[]);
    let leader = (0..3).find(|&i| c.node_id(i) == view.leader.unwrap()).unwrap();
    let names: Vec<String> = c.nodes.iter().map(|n| n.name.clone()).collect();

    // Forward: with wall-clock stamps every lease would look 5 minutes old at the next sweep.
    c.step_wall_clock(leader, STEP_MS);
    // The window is the scenario: several sweep periods and renewals must pass with nobody lost.
    let window = Duration::from_millis(TIMING.lease_ms / 2 + 4 * TIMING.sweep_ms);
    let start = Instant::now();
    while start.elapsed() < window {
        let v = c.view(leader).expect("the leader answers status");
        assert!(v.all_live() && v.ring_live == names, "after a +5 min step: {v:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, _) = c.claim(leader, "clock-d1", 1, 0, 1);
    assert_eq!(status, 200, "claims still commit");
    println!("clock: +5 min on the leader, {window:?} later every node is live");

    // Backward: with wall-clock stamps a dead node would look alive for 5 more minutes.
    c.step_wall_clock(leader, -STEP_MS);
    let f = (0..3).find(|&i| i != leader).unwrap();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != f).collect();
    c.kill9(f);
    let killed = Instant::now();
    c.wait_agreement(&survivors, TIMING.expiry_bound(), &format!("{} expired after a -5 min step", names[f]), |v| {
        v.member(&names[f]).is_some_and(|m| m.state == "expired")
    });
    println!(
        "clock: -5 min on the leader, a killed follower still expired after {:?} (bound {:?})",
        killed.elapsed(),
        TIMING.expiry_bound()
    );
    // The leader's status reports leases in cluster time, not on its stepped wall clock.
    let s = c.status_json(leader);
    let me = s["members"].as_array().unwrap().iter().find(|m| m["name"] == names[leader].as_str()).unwrap();
    let remaining = me["lease_remaining_ms"].as_i64().unwrap();
    assert!((0..=TIMING.lease_ms as i64).contains(&remaining), "lease_remaining_ms {remaining}");
}
