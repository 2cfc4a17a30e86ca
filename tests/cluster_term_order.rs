//! The term rule of sweeps (issue 9): a sweep that lands in a term ahead of that term's
//! `ExtendLeases` does nothing. The race (a leader re-elected between its check and its proposal,
//! a stale sweep committed by a successor) cannot be timed from outside, so every node runs with
//! the fault hook `GATEWAY_TEST_SWEEP_BEFORE_EXTEND`: each new leader proposes a sweep of every
//! member before it extends leases. The election gap is stretched past the lease (the leader
//! killed, a follower stopped, so no quorum), so when the next leader's sweep commits every lease
//! has lapsed on its clock: without the rule that sweep would expire the survivors and delete
//! their routes. With it, the survivors stay live with their routes and the dead leader is swept
//! only after the one extension it gets.

mod common;

use std::time::{Duration, Instant};

use common::{reply_node_id, Cluster, TIMING};

const HOOK: &str = "GATEWAY_TEST_SWEEP_BEFORE_EXTEND";
const HOOK_LOG: &str = "test fault: swept before this term's ExtendLeases";

/// The hook's log lines of node `i` from byte `from` of its stderr on.
fn hook_lines(c: &Cluster, i: usize, from: usize) -> Vec<String> {
    let log = std::fs::read_to_string(&c.nodes[i].stderr_path).unwrap_or_default();
    log.get(from..).unwrap_or("").lines().filter(|l| l.contains(HOOK_LOG)).map(str::to_string).collect()
}

#[test]
fn a_sweep_ahead_of_its_terms_lease_extension_expires_no_one() {
    let mut c = Cluster::new();
    c.env.push((HOOK.into(), "1".into()));
    let (mut c, view) = c.form_nodes(3);
    let ids: Vec<u64> = (0..3).map(|i| c.node_id(i)).collect();
    let leader_id = view.leader.unwrap();
    let leader = ids.iter().position(|&id| id == leader_id).unwrap();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (a, b) = (survivors[0], survivors[1]);
    let dead = c.nodes[leader].name.clone();

    let mut owned = Vec::new(); // (device, owner, conn, version)
    for k in 0..12u64 {
        let i = (k % 3) as usize;
        let device = format!("t-d{k}");
        let v = c.claim_accepted(i, &device, 100 + k, 0, 1, TIMING.settle_bound());
        owned.push((device, i, 100 + k, v["version"].as_u64().unwrap()));
    }
    let log_len: Vec<usize> =
        (0..3).map(|i| std::fs::metadata(&c.nodes[i].stderr_path).unwrap().len() as usize).collect();

    // The fault: the leader dies and one follower freezes, so nothing commits for longer than a
    // lease (the nemesis's duration, not a wait for a condition).
    c.kill9(leader);
    c.sigstop(b);
    let gap = Duration::from_millis(TIMING.lease_ms + 4 * TIMING.sweep_ms + 500);
    std::thread::sleep(gap);
    c.sigcont(b);
    let resumed = Instant::now();

    let elected = c.wait_agreement(&survivors, TIMING.expiry_bound(), "a new leader after the quorum gap", |v| {
        v.leader.is_some_and(|l| l != leader_id)
    });
    println!("term order: new leader {:?} {:?} after the {gap:?} gap", elected.leader, resumed.elapsed());
    let swept = c.wait_agreement(&survivors, TIMING.expiry_bound(), &format!("{dead} to be swept"), |v| {
        v.member(&dead).is_some_and(|m| m.state == "expired")
    });
    println!("term order: {dead} expired {:?} after quorum came back", resumed.elapsed());

    // The hook ran on the new leader and its sweep, ahead of the extension, expired no one.
    let lines: Vec<String> = survivors.iter().flat_map(|&i| hook_lines(&c, i, log_len[i])).collect();
    let committed: Vec<&String> = lines.iter().filter(|l| l.contains("Ok(")).collect();
    assert!(!committed.is_empty(), "no sweep-before-extend committed on the survivors: {lines:#?}");
    for l in &committed {
        assert!(l.contains("expired: []"), "a sweep ahead of its term's ExtendLeases expired members: {l}");
    }
    println!("term order: {} early sweep(s) committed, none expired anyone", committed.len());

    // The survivors were never expired (an expired node comes back only through a new lease, and
    // its routes would be gone): their routes are all there, the dead leader's are swept.
    for &s in &survivors {
        for i in [a, b] {
            let m = swept.member(&c.nodes[i].name).unwrap();
            assert_ne!(m.state, "expired", "{} expired on {}", c.nodes[i].name, c.nodes[s].name);
        }
        for (device, owner, conn, version) in &owned {
            let (code, v) = c.route(s, device);
            if *owner == leader {
                assert_eq!(code, 404, "{device} of the dead leader still routed on {}: {v}", c.nodes[s].name);
            } else {
                assert_eq!(code, 200, "{device} lost on {}: {v}", c.nodes[s].name);
                assert_eq!(
                    (reply_node_id(&v), v["conn"].as_u64(), v["version"].as_u64()),
                    (Some(ids[*owner]), Some(*conn), Some(*version)),
                    "{device} on {}",
                    c.nodes[s].name
                );
            }
        }
    }
}
