//! `--cluster-advertise host:port`: members recorded under a DNS name (as in a container network or
//! a Kubernetes headless service) replicate, relay joins, elect a new leader after a kill and
//! commit claims, the name resolved at each connection.

mod common;

use common::{reply_node_id, Cluster, Start, TIMING};

#[test]
fn members_advertised_by_dns_name_form_fail_over_and_commit() {
    let named = ["--cluster-advertise", "localhost:{cluster_port}"];
    let mut c = Cluster::new();
    c.spawn_with("n1", Start::Bootstrap, &named);
    c.spawn_with("n2", Start::Join(0), &named);
    // n3 asks n2: the join is relayed to the leader, which then replicates to "localhost:<port>".
    c.spawn_with("n3", Start::Join(1), &named);
    let all = [0, 1, 2];
    let view = c.wait_agreement(&all, TIMING.settle_bound(), "3 voters advertised as localhost", |v| {
        v.members.len() == 3 && v.voters() == 3 && v.all_live()
    });
    for n in &c.nodes {
        let m = view.member(&n.name).unwrap();
        assert_eq!(m.cluster_addr, format!("localhost:{}", n.cluster_port), "{} recorded under its name", n.name);
    }

    let leader_id = view.leader.unwrap();
    let leader = (0..3).find(|&i| c.node_id(i) == leader_id).unwrap();
    let survivors: Vec<usize> = all.into_iter().filter(|&i| i != leader).collect();
    c.kill9(leader);
    c.wait_agreement(&survivors, TIMING.failover_bound(), "a new leader elected over DNS names", |v| {
        v.leader.is_some_and(|l| l != leader_id)
    });
    for &s in &survivors {
        let v = c.claim_accepted(s, &format!("adv-{s}"), 1, 0, 1, TIMING.failover_bound());
        assert_eq!(reply_node_id(&v), Some(c.node_id(s)), "{v}");
    }
}
