//! A dead node is swept even when leadership changes more often than once per lease (issue 9):
//! every new leader extends leases first, but only leases renewed since the previous extension,
//! so a dead member gets one extension at most. Five voters, so a paused leader leaves a quorum.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, Start, SLACK, TIMING};

#[test]
fn a_dead_member_is_swept_while_leaders_keep_changing() {
    let mut c = Cluster::with_args(&["--max-voters", "5"]);
    c.spawn("n1", Start::Bootstrap);
    for k in 2..=5 {
        let i = c.spawn(&format!("n{k}"), Start::Standby);
        c.join(0, i);
    }
    let names: Vec<String> = c.nodes.iter().map(|n| n.name.clone()).collect();
    c.wait_agreement(&[0, 1, 2, 3, 4], TIMING.settle_bound(), "5 live voters", |v| {
        v.voters() == 5 && v.all_live() && v.ring_live == names
    });
    let ids: Vec<u64> = (0..5).map(|i| c.node_id(i)).collect();
    let first = (0..5).find(|&i| Some(ids[i]) == c.view(0).ok().and_then(|v| v.leader)).expect("a leader");
    let dead = (0..5).rev().find(|&i| i != first).unwrap();
    let leader_of = |c: &Cluster| -> Option<usize> {
        let id = (0..5).filter(|&i| i != dead).find_map(|i| c.view(i).ok()?.leader)?;
        (0..5).find(|&j| ids[j] == id)
    };
    c.kill9(dead);
    let killed = Instant::now();
    // One lease, one extension's lease, a sweep, and the elections in between.
    let bound = Duration::from_millis(2 * TIMING.lease_ms + TIMING.sweep_ms + 8 * TIMING.election_timeout_ms) + SLACK;
    // Long enough for the other four to elect a new leader (an openraft election takes up to
    // ~4 election timeouts).
    let pause = Duration::from_millis(4 * TIMING.election_timeout_ms);
    let mut changes = 0;
    let mut last = Some(first);
    loop {
        let alive: Vec<usize> = (0..5).filter(|&i| i != dead).collect();
        let expired = alive
            .iter()
            .all(|&i| c.view(i).is_ok_and(|v| v.member(&names[dead]).is_some_and(|m| m.state == "expired")));
        if expired {
            break;
        }
        assert!(killed.elapsed() < bound, "{} not swept within {bound:?} ({changes} leader changes)", names[dead]);
        // Pause the leader long enough for the others to elect another: leadership changes about
        // every `pause`, far more often than once per lease.
        if let Some(l) = leader_of(&c) {
            if last != Some(l) {
                changes += 1;
                last = Some(l);
            }
            c.sigstop(l);
            std::thread::sleep(pause);
            c.sigcont(l);
        }
        std::thread::sleep(Duration::from_millis(TIMING.election_timeout_ms));
    }
    println!(
        "churn: {} swept {:?} after kill -9 with {changes} leader changes meanwhile (lease {} ms, bound {bound:?})",
        names[dead],
        killed.elapsed(),
        TIMING.lease_ms
    );
    let per_change = killed.elapsed() / changes.max(1);
    assert!(
        changes >= 2 && per_change < Duration::from_millis(TIMING.lease_ms),
        "the scenario needs leadership to change more often than once per lease: {changes} changes"
    );
}
