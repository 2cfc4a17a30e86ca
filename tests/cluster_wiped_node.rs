//! A wiped node comes back with a new id: joining it under the old name/address clashes with the
//! old member until an operator removes that member with `gateway leave`.

mod common;

use common::{Cluster, Start, TIMING};

#[test]
fn wiped_node_gets_new_id_and_clashes_until_old_member_leaves() {
    let (mut c, view) = Cluster::form(3, &[]);
    let ids: Vec<u64> = (0..3).map(|i| c.node_id(i)).collect();
    let f = (0..3).rev().find(|&i| Some(ids[i]) != view.leader).unwrap();
    let f_name = c.nodes[f].name.clone();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != f).collect();
    let via = survivors[0];
    let old_id = ids[f];

    c.kill9(f);
    c.wipe(f);
    c.nodes[f].start = Start::Standby;
    c.start(f);
    let new_id = c.node_id(f);
    assert_ne!(new_id, old_id, "a wiped data dir must yield a new id");

    // Same name and address, different id: refused, and nothing changes.
    let cluster = c.nodes[via].cluster_addr_str();
    let node = c.nodes[f].cluster_addr_str();
    let out = c.cli_auth(&["join", "--cluster", &cluster, "--node", &node]);
    assert_eq!(out.code, Some(1), "join of a wiped node must clash: {out:#?}");
    let err = out.stderr.to_lowercase();
    assert!(err.contains("clash") || err.contains("conflict"), "stderr should name the clash: {out:#?}");
    let refused = c.wait_agreement(&survivors, TIMING.settle_bound(), "survivors after the refused join", |_| true);
    assert_eq!(refused.member(&f_name).map(|m| m.id), Some(old_id), "old member still there: {refused:#?}");
    assert!(refused.member_by_id(new_id).is_none(), "new id must not have been added: {refused:#?}");
    assert_eq!(refused.members.len(), 3);

    // Remove the old member by id, then the join goes through.
    let out = c.cli_auth(&["leave", "--cluster", &cluster, "--node", &old_id.to_string()]);
    assert_eq!(out.code, Some(0), "leave by id: {out:#?}");
    c.wait_agreement(&survivors, TIMING.settle_bound(), &format!("old {f_name} ({old_id}) removed"), |v| {
        v.members.len() == 2 && v.member_by_id(old_id).is_none()
    });

    c.join(via, f);
    let back = c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), &format!("{f_name} back under its new id"), |v| {
        v.members.len() == 3 && v.voters() == 3 && v.all_live() && v.member(&f_name).is_some_and(|m| m.id == new_id)
    });
    assert!(back.member_by_id(old_id).is_none());
}
