//! SIGTERM the leader: it drains, hands leadership to the most caught-up voter (openraft 0.10's
//! leader transfer) and exits, so the survivors have a leader before it is gone instead of waiting
//! out its lease and an election timeout, and writes go on.

mod common;

use std::time::Instant;

use common::{reply_node_id, Cluster, SLACK, TIMING};

#[test]
fn a_draining_leader_hands_leadership_over_before_it_exits() {
    let (mut c, view) = Cluster::form(3, &[]);
    let old = view.leader.expect("a leader");
    let ids: Vec<u64> = (0..3).map(|i| c.node_id(i)).collect();
    let leader = ids.iter().position(|&id| id == old).expect("leader is one of ours");
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    c.claim_accepted(survivors[0], "h-before", 1, 0, 1, TIMING.settle_bound());

    c.sigterm(leader);
    let status = c.wait_exit(leader, TIMING.settle_bound());
    let exited = Instant::now();
    assert!(status.success(), "the leader drains and exits cleanly: {status:?}");
    let log = std::fs::read_to_string(&c.nodes[leader].stderr_path).unwrap_or_default();
    let line = log.lines().find(|l| l.contains("handed leadership over")).unwrap_or_else(|| {
        panic!("the leader logged no handover:\n{}", common::tail(&c.nodes[leader].stderr_path, 20))
    });
    let to: u64 = line
        .split("to=")
        .nth(1)
        .and_then(|s| s.split(|ch: char| !ch.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no target in {line}"));
    assert!(to != old && ids.contains(&to), "handed to a survivor: {line}");

    // The survivors follow the node it named (elected before the old leader exited; no lease to
    // wait out), and a write commits through each.
    let agreed = c.wait_agreement(&survivors, TIMING.failover_bound(), "survivors to follow the new leader", |v| {
        v.leader == Some(to)
    });
    println!("handover: survivors agree on {:?} {:?} after the old leader exited", agreed.leader, exited.elapsed());
    for (k, &i) in survivors.iter().enumerate() {
        let started = Instant::now();
        let v = c.claim_accepted(i, &format!("h-after-{k}"), 2, 0, 1, SLACK);
        assert_eq!(reply_node_id(&v), Some(ids[i]));
        println!("first write on {} after the handover took {:?}", c.nodes[i].name, started.elapsed());
    }
}
