//! Forming a cluster with `gateway join`: every node agrees (replicated over append streams), and
//! joining a member again is a no-op.

mod common;

use common::{Cluster, Start, TIMING};

#[test]
fn three_nodes_form_and_agree_and_rejoin_is_a_noop() {
    let mut c = Cluster::new();
    c.spawn("n1", Start::Bootstrap);
    c.spawn("n2", Start::Standby);
    c.spawn("n3", Start::Standby);

    for i in [1, 2] {
        let out = c.join(0, i);
        assert!(!out.stdout.trim().is_empty(), "join prints progress and the final membership: {out:#?}");
    }

    let all = [0, 1, 2];
    let view = c.wait_agreement(&all, TIMING.settle_bound(), "3 voters, all live, same ring on every node", |v| {
        v.members.len() == 3 && v.voters() == 3 && v.all_live() && v.ring_live == ["n1", "n2", "n3"]
    });
    // Every member's id is the id that node reports for itself, and its address is the one it listens on.
    for i in all {
        let id = c.node_id(i);
        let m = view.member(&c.nodes[i].name).unwrap();
        assert_eq!(m.id, id, "member row for {} vs its own id", m.name);
        assert_eq!(m.cluster_addr, c.nodes[i].cluster_addr_str(), "cluster_addr of {}", m.name);
    }
    // Replication reached both followers over pipelined append streams, not one HTTP request per
    // append: a node counts the streams leaders opened to it.
    let streamed: Vec<f64> =
        all.iter().map(|&i| c.metric(i, "gateway_raft_append_streams_total").unwrap_or(0.0)).collect();
    assert!(streamed.iter().filter(|&&n| n >= 1.0).count() >= 2, "append streams opened to each node: {streamed:?}");
    let mut ids = view.ids();
    ids.dedup();
    assert_eq!(ids.len(), 3, "ids are unique: {view:#?}");

    // Joining a member again (through a different node, too) is a no-op.
    for (via, node) in [(0, 1), (1, 2)] {
        let out = c.join(via, node);
        let said = format!("{}{}", out.stdout, out.stderr).to_lowercase();
        assert!(said.contains("already"), "re-join should say the node is already a member: {out:#?}");
    }
    let after = c.wait_agreement(&all, TIMING.settle_bound(), "agreement after re-join", |_| true);
    assert_eq!(after.members, view.members, "re-join changed membership");
    assert_eq!(after.ring_version, view.ring_version, "re-join changed the ring");
}
