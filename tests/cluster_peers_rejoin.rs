//! The bootstrap guard (`serve --peers`) when a member's volume is lost: the wiped node restarts
//! with an empty data dir and no `--join`, finds its peers in a cluster and joins it (under a new
//! id, once the operator removed its old identity, which it names) instead of bootstrapping a
//! second cluster; a claim through it lands in the one cluster.

mod common;

use std::time::Duration;

use common::{wait_until, Cluster, Start, TIMING};

/// Node `i`'s stderr since the harness's `n`th spawn of it.
fn log_of_spawn(c: &Cluster, i: usize, n: u32) -> String {
    let all = std::fs::read_to_string(&c.nodes[i].stderr_path).unwrap_or_default();
    let marker = format!("===== harness: spawn #{n} of {}:", c.nodes[i].name);
    all.split_once(&marker).map(|(_, rest)| rest.to_string()).unwrap_or_default()
}

#[test]
fn wiped_node_with_peers_joins_its_cluster_instead_of_bootstrapping() {
    let (mut c, view) = Cluster::form(3, &[]);
    let cluster_id = view.cluster_id.clone();
    let old_id = c.node_id(0);
    let peers = format!("{},{}", c.nodes[1].cluster_addr_str(), c.nodes[2].cluster_addr_str());

    // n1's volume is lost; it comes back as a bootstrapping node (no --join) with the guard.
    c.kill9(0);
    c.wipe(0);
    c.nodes[0].start = Start::Bootstrap;
    c.nodes[0].extra_args = vec!["--peers".into(), peers, "--peers-wait-ms".into(), "3000".into()];
    c.start(0);
    let new_id = c.node_id(0);
    assert_ne!(new_id, old_id, "a wiped data dir yields a new id");

    // Its old identity is still a member under its name: the guard says so and names the fix.
    let hint = format!("--node {old_id}");
    let log = wait_until(Duration::from_secs(10), "n1 to name its old identity", || {
        let log = log_of_spawn(&c, 0, 2);
        if log.contains("bootstrap guard") && log.contains("old identity") && log.contains(&hint) {
            Ok(log)
        } else {
            Err(log)
        }
    });
    assert!(log.contains(&format!("belongs to cluster {cluster_id}")), "guard names the cluster it joins:\n{log}");
    assert!(!log.contains("bootstrapped a one-node cluster"), "a wiped node with peers must not bootstrap:\n{log}");
    let n1 = c.try_status(0).expect("n1 status while it waits");
    assert!(n1["cluster_id"].is_null(), "n1 is in no cluster until it joins: {n1}");

    // The operator removes the old identity; n1 joins by itself, without a restart.
    // (n2 and n3 may still be electing a leader if n1 led.)
    let via = c.nodes[1].cluster_addr_str();
    let old = old_id.to_string();
    wait_until(TIMING.settle_bound(), "leave of n1's old identity", || {
        let out = c.cli_auth(&["leave", "--cluster", &via, "--node", &old]);
        match out.code {
            Some(0) => Ok(()),
            _ if out.stderr.contains("no_leader") => Err(out),
            _ => panic!("leave the old identity: {out:#?}"),
        }
    });
    let back =
        c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), "n1 back in the one cluster under its new id", |v| {
            v.members.len() == 3 && v.voters() == 3 && v.all_live() && v.member("n1").is_some_and(|m| m.id == new_id)
        });
    assert_eq!(back.cluster_id, cluster_id, "n1 joined the running cluster, not a new one");
    assert!(back.member_by_id(old_id).is_none());
    let log = log_of_spawn(&c, 0, 2);
    assert!(!log.contains("bootstrapped a one-node cluster"), "no bootstrap at any point:\n{log}");

    // A claim through n1 lands in the one cluster: every node routes the device to its conn.
    let claimed = c.claim_accepted(0, "dev-wiped-peers", 77, 1, 1, TIMING.settle_bound());
    assert_eq!(claimed["result"], "accepted", "{claimed}");
    for i in [1, 2] {
        wait_until(
            TIMING.settle_bound(),
            &format!("{} routes dev-wiped-peers to conn 77", c.nodes[i].name),
            || match c.try_route(i, "dev-wiped-peers")? {
                (200, r) if r["conn"].as_u64() == Some(77) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
    }
}
