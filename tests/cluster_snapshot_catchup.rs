//! A follower that was down while the leader snapshotted and purged its log catches up on restart
//! (through a snapshot install) and serves the same routes.

mod common;

use std::time::Instant;

use common::{reply_node_id, status, wait_until, Cluster, TIMING};

const CLAIMS: u64 = 300;
const WRITERS: u64 = 2;

#[test]
fn restarted_follower_catches_up_after_log_purge() {
    let (mut c, view) = Cluster::form(3, &["--snapshot-logs", "50"]);
    let ids: Vec<u64> = (0..3).map(|i| c.node_id(i)).collect();
    let leader_id = view.leader.unwrap();
    let f = (0..3).rev().find(|&i| ids[i] != leader_id).unwrap();
    let f_name = c.nodes[f].name.clone();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != f).collect();

    let commit_before = c.leader_commit_index(survivors[0]);
    c.kill9(f);

    // Claims through both survivors, from two threads; each writer owns its devices.
    let started = Instant::now();
    let api = c.api();
    let addrs: Vec<_> = survivors.iter().map(|&s| (c.nodes[s].cluster_addr(), ids[s])).collect();
    let handles: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (api, addrs) = (api.clone(), addrs.clone());
            std::thread::spawn(move || {
                let mut accepted = Vec::new(); // (device, node id, conn, version)
                for k in (w..CLAIMS).step_by(WRITERS as usize) {
                    let device = format!("s-d{k}");
                    let (addr, node) = addrs[(k / WRITERS % 2) as usize];
                    let deadline = Instant::now() + TIMING.settle_bound();
                    let mut attempt = 1;
                    // A 503 while the cluster notices the dead node is fine: retry with a newer attempt.
                    loop {
                        match api.try_claim(addr, &device, k, 0, attempt) {
                            Ok((200, v)) => {
                                assert_eq!(reply_node_id(&v), Some(node), "{v}");
                                accepted.push((device, node, k, v["version"].as_u64().unwrap()));
                                break;
                            }
                            other if Instant::now() < deadline => {
                                let _ = other;
                                attempt += 1;
                                std::thread::sleep(std::time::Duration::from_millis(50));
                            }
                            other => panic!("claim {device} never accepted; last: {other:?}"),
                        }
                    }
                }
                accepted
            })
        })
        .collect();
    let accepted: Vec<_> = handles.into_iter().flat_map(|h| h.join().expect("writer panicked")).collect();
    let commit_after = c.leader_commit_index(survivors[0]);
    println!(
        "{} claims in {:?} while {f_name} was down; commit index {commit_before} -> {commit_after}",
        accepted.len(),
        started.elapsed()
    );
    assert!(
        commit_after >= commit_before + 100,
        "expected well over --snapshot-logs 50 entries while {f_name} was down, got {}",
        commit_after - commit_before
    );

    // The leader must have purged the entries the dead follower lacks, so only a snapshot can
    // bring it back.
    let leader_idx = survivors.iter().copied().find(|&s| ids[s] == leader_id).unwrap_or(survivors[0]);
    let purged =
        wait_until(TIMING.settle_bound(), "the leader to purge its log past the follower's last entry", || {
            let s = c.try_status(leader_idx)?;
            match s["purged_index"].as_u64() {
                Some(p) if p > commit_before => Ok(p),
                other => Err(format!("purged_index {other:?}, follower stopped at {commit_before}")),
            }
        });
    println!("leader purged its log up to {purged} (follower stopped at {commit_before})");

    let restarted_at = Instant::now();
    c.start(f);
    wait_until(TIMING.settle_bound(), &format!("{f_name} to apply up to {commit_after} and be live"), || {
        let s = c.try_status(f)?;
        let applied = status::applied_index(&s);
        let live = s["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["id"].as_u64() == Some(ids[f])))
            .map(|m| m["state"].clone());
        if applied >= Some(commit_after) && live == Some("live".into()) {
            Ok(())
        } else {
            Err(format!("applied {applied:?}, own state {live:?}"))
        }
    });
    println!("{f_name} caught up {commit_after} entries and is live after {:?}", restarted_at.elapsed());
    let installed = c.metric(f, "gateway_snapshots_installed_total").unwrap_or(0.0);
    assert!(installed >= 1.0, "{f_name} caught up without installing a snapshot (installed {installed})");
    c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), "all three live again", |v| {
        v.all_live() && v.ring_live.len() == 3
    });

    c.wait_applied(survivors[0], commit_after, TIMING.settle_bound());
    for (device, node, conn, version) in accepted.iter().step_by(7) {
        let (code, v) = c.route(f, device);
        assert_eq!(code, 200, "{device} missing on {f_name}: {v}");
        assert_eq!(
            (reply_node_id(&v), v["conn"].as_u64(), v["version"].as_u64()),
            (Some(*node), Some(*conn), Some(*version)),
            "{device} on {f_name}: {v}"
        );
        assert_eq!(
            c.route(survivors[0], device),
            (code, v),
            "{device}: {f_name} and {} disagree",
            c.nodes[survivors[0]].name
        );
    }
}
