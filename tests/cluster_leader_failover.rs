//! kill -9 the leader: a new leader is elected within the election bound (the survivors notice the
//! dead leader's port and elect once its lease allows), writes continue, and every claim accepted
//! before the kill survives.

mod common;

use std::time::Instant;

use common::{reply_node_id, Cluster, TIMING};

#[test]
fn leader_killed_new_leader_elected_and_no_claim_lost() {
    let (mut c, view) = Cluster::form(3, &[]);
    let leader_id = view.leader.unwrap();
    let ids: Vec<u64> = (0..3).map(|i| c.node_id(i)).collect();
    let leader = ids.iter().position(|&id| id == leader_id).expect("leader is one of ours");
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();

    // Claims on every node, the leader included. Routes owned by the survivors must still be served
    // after failover; the dead leader's own routes will be swept once its lease lapses, but their
    // floors must survive (checked with a stale claim below).
    let mut accepted = Vec::new(); // (device, claimed on, conn, attempt, version)
    for k in 0..30u64 {
        let i = (k % 3) as usize;
        let device = format!("f-d{k}");
        let conn = 1000 + k;
        let v = c.claim_accepted(i, &device, conn, 0, 7, TIMING.settle_bound());
        assert_eq!(reply_node_id(&v), Some(ids[i]), "claim reply names the receiving node: {v}");
        accepted.push((device, i, conn, 7u64, v["version"].as_u64().unwrap()));
    }

    c.kill9(leader);
    let killed_at = Instant::now();
    let new_view = c.wait_agreement(&survivors, TIMING.failover_bound(), "survivors to agree on a new leader", |v| {
        v.leader.is_some_and(|l| l != leader_id)
    });
    let failover = killed_at.elapsed();
    println!(
        "failover: new leader {:?} after {failover:?} (bound {:?}, election timeout {} ms)",
        new_view.leader,
        TIMING.failover_bound(),
        TIMING.election_timeout_ms
    );
    assert!(survivors.iter().any(|&i| Some(ids[i]) == new_view.leader), "new leader is a survivor");
    // The survivors saw the leader's cluster port refuse connections (its process is gone) and
    // started the election as soon as its lease allowed, not a random election timeout later.
    common::wait_until(TIMING.settle_bound(), "a survivor to notice the dead leader's port", || {
        let noticed = survivors.iter().any(|&i| {
            std::fs::read_to_string(&c.nodes[i].stderr_path)
                .is_ok_and(|log| log.contains("leader's cluster port refuses connections"))
        });
        if noticed {
            Ok(())
        } else {
            Err("no survivor logged it")
        }
    });

    // Writes continue, through both survivors.
    for (k, &i) in survivors.iter().enumerate() {
        let device = format!("after-{k}");
        let started = Instant::now();
        let v = c.claim_accepted(i, &device, 1, 0, 1, TIMING.failover_bound());
        assert_eq!(reply_node_id(&v), Some(ids[i]));
        println!("first write on {} after failover took {:?}", c.nodes[i].name, started.elapsed());
    }

    // Every claim accepted before the kill is still there (once each survivor has applied what the
    // new leader committed).
    let commit = c.leader_commit_index(survivors[0]);
    for &s in &survivors {
        c.wait_applied(s, commit, TIMING.settle_bound());
    }
    for (device, on, conn, attempt, version) in &accepted {
        for &s in &survivors {
            if *on != leader {
                let (code, v) = c.route(s, device);
                assert_eq!(code, 200, "{device} lost on {}: {v}", c.nodes[s].name);
                assert_eq!(
                    (reply_node_id(&v), v["conn"].as_u64(), v["version"].as_u64()),
                    (Some(ids[*on]), Some(*conn), Some(*version)),
                    "{device} on {}: {v}",
                    c.nodes[s].name
                );
            } else {
                // Route may have been swept with the dead leader's lease; the floor may not.
                let (code, v) = c.claim(s, device, 99, 0, *attempt);
                assert_eq!(
                    code, 409,
                    "replaying {device}'s accepted attempt must be stale on {}: {v}",
                    c.nodes[s].name
                );
                assert_eq!(v["error"], "stale_attempt", "{v}");
                assert_eq!((v["floor_epoch"].as_u64(), v["floor_attempt"].as_u64()), (Some(0), Some(*attempt)), "{v}");
            }
        }
    }
}
