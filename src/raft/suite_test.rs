//! openraft's storage conformance suite against the real redb-backed stores, and the adapter's
//! own persistence across a reopen.

use openraft::testing::{StoreBuilder, Suite};

use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::types::{StorageError, TypeConfig};
use crate::store::log::LogDb;
use crate::store::state::StateDb;

struct RedbBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RedbBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = LogDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).expect("open log");
        let (state, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).expect("open state");
        let (sm, _view) =
            StateMachine::new(state, loaded, Default::default(), Default::default()).expect("restore state");
        Ok((dir, LogStore::new(log, Default::default(), Default::default()), sm))
    }
}

#[test]
fn redb_storage_passes_openraft_suite() {
    Suite::test_all(RedbBuilder).expect("openraft storage suite");
}

/// The adapter's own persistence: what openraft asks after a restart (last applied log id,
/// membership) and the view it publishes come back from `state.redb` as they were.
#[tokio::test]
async fn applied_state_and_view_survive_a_reopen() {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::storage::RaftStateMachine;
    use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership};

    use super::types::{Entry, Request};
    use crate::machine::{Claim, Member, Renew};

    let dir = tempfile::tempdir().unwrap();
    let log_id = |index| LogId::new(CommittedLeaderId::new(3, 1), index);
    let members: BTreeMap<u64, Member> = [1, 2]
        .into_iter()
        .map(|id| (id, Member { name: format!("n{id}"), cluster_addr: format!("a{id}"), public_url: String::new() }))
        .collect();
    let membership = Membership::new(vec![BTreeSet::from([1])], members);
    let renew = Renew { node: 2, at_ms: 10, lease_ms: 1000, connections: 3, draining: false, incarnation: 1 };
    let claim = Claim { device: "d".into(), node: 2, conn: 7, epoch: 0, attempt: 1 };
    let entries = vec![
        Entry { log_id: log_id(1), payload: EntryPayload::Membership(membership.clone()) },
        Entry { log_id: log_id(2), payload: EntryPayload::Normal(Request { cmds: vec![renew.into(), claim.into()] }) },
    ];
    {
        let (db, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
        let (mut sm, _view) = StateMachine::new(db, loaded, Default::default(), Default::default()).unwrap();
        let responses = sm.apply(entries).await.unwrap();
        assert_eq!(responses.iter().map(|r| r.replies.len()).collect::<Vec<_>>(), [0, 2]);
    }
    let (db, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
    let (mut sm, view) = StateMachine::new(db.clone(), loaded, Default::default(), Default::default()).unwrap();
    let (last, stored) = sm.applied_state().await.unwrap();
    assert_eq!(last, Some(log_id(2)));
    assert_eq!(stored.log_id(), &Some(log_id(1)));
    assert_eq!(stored.membership(), &membership);
    let view = view.borrow().clone();
    assert_eq!(view.state.voters, BTreeSet::from([1]));
    assert_eq!(view.member(2).map(|m| m.name.as_str()), Some("n2"));
    assert_eq!(view.lease(2).map(|l| (l.lease_until_ms, l.routes)), Some((1010, 1)));
    assert_eq!(view.ring.nodes(), ["n2"]);
    assert_eq!(db.route("d").unwrap().0.map(|r| (r.node, r.conn)), Some((2, 7)));
}
