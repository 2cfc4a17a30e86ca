//! openraft's storage conformance suite against the real stores (the segment log, `state.redb`), and the adapter's
//! own persistence across a reopen.

use openraft::testing::log::{StoreBuilder, Suite};

use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::types::TypeConfig;

type StorageError = openraft::StorageError<TypeConfig>;
use crate::store::log::LogDb;
use crate::store::state::StateDb;

struct StoreFiles;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for StoreFiles {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = LogDb::open::<super::types::LogId>(dir.path()).expect("open log");
        let (state, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).expect("open state");
        let (sm, _view) =
            StateMachine::new(state, loaded, None, Default::default(), Default::default()).expect("restore state");
        let log = LogStore::new(log, Default::default(), Default::default()).expect("log writer");
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_pass_openraft_suite() {
    Suite::test_all(StoreFiles).await.expect("openraft storage suite");
}

/// The adapter's own persistence: what openraft asks after a restart (last applied log id,
/// membership) and the view it publishes come back from `state.redb` as they were.
#[tokio::test]
async fn applied_state_and_view_survive_a_reopen() {
    use std::collections::{BTreeMap, BTreeSet};

    use futures_util::stream;
    use openraft::storage::RaftStateMachine;
    use openraft::{EntryPayload, Membership};

    use super::types::{log_id as id, Entry, Request};
    use crate::machine::{Claim, Member, Renew};

    let dir = tempfile::tempdir().unwrap();
    let log_id = |index| id(3, 1, index);
    let members: BTreeMap<u64, Member> = [1, 2]
        .into_iter()
        .map(|id| {
            (
                id,
                Member {
                    name: format!("n{id}").into(),
                    cluster_addr: format!("a{id}").into(),
                    public_url: String::new().into(),
                },
            )
        })
        .collect();
    let membership = Membership::new(vec![BTreeSet::from([1])], members).unwrap();
    let renew = Renew { node: 2, at_ms: 10, lease_ms: 1000, connections: 3, draining: false, incarnation: 1 };
    let claim = Claim { device: "d".into(), node: 2, conn: 7, epoch: 0, attempt: 1 };
    let entries = vec![
        Entry { log_id: log_id(1), payload: EntryPayload::Membership(membership.clone()) },
        Entry {
            log_id: log_id(2),
            payload: EntryPayload::Normal(Request { cmds: vec![renew.into(), claim.into()].into() }),
        },
    ];
    {
        let (db, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
        let (mut sm, _view) = StateMachine::new(db, loaded, None, Default::default(), Default::default()).unwrap();
        sm.apply(stream::iter(entries.into_iter().map(|e| Ok((e, None))))).await.unwrap();
    }
    let (db, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
    let (mut sm, view) = StateMachine::new(db.clone(), loaded, None, Default::default(), Default::default()).unwrap();
    let (last, stored) = sm.applied_state().await.unwrap();
    assert_eq!(last, Some(log_id(2)));
    assert_eq!(stored.log_id(), &Some(log_id(1)));
    assert_eq!(stored.membership(), &membership);
    let view = view.borrow().clone();
    assert_eq!(view.state.voters, BTreeSet::from([1]));
    assert_eq!(view.member(2).map(|m| &*m.name), Some("n2"));
    assert_eq!(view.lease(2).map(|l| (l.lease_until_ms, l.routes)), Some((1010, 1)));
    assert_eq!(view.ring.nodes(), ["n2"]);
    assert_eq!(db.route("d").unwrap().0.map(|r| (r.node, r.conn)), Some((2, 7)));
}

/// The view is stored after every apply, but its watchers (`changed()`) wake only when something
/// other than route counts and the cluster clock changed: claims and releases, nearly every apply
/// of a busy cluster, update what readers borrow without waking the tasks that follow the
/// membership, the leases and the ring.
#[tokio::test]
async fn claims_update_the_view_without_waking_its_watchers() {
    use std::collections::{BTreeMap, BTreeSet};

    use futures_util::stream;
    use openraft::storage::RaftStateMachine;
    use openraft::{EntryPayload, Membership};

    use super::types::{log_id as id, Entry, Request};
    use crate::machine::{Claim, Command, Member, Release, Renew};

    async fn apply(sm: &mut StateMachine, index: &mut u64, payload: EntryPayload<Request, u64, Member>) {
        *index += 1;
        let entry = Entry { log_id: id(3, 1, *index), payload };
        sm.apply(stream::iter([Ok((entry, None))])).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
    let (mut sm, mut view) = StateMachine::new(db, loaded, None, Default::default(), Default::default()).unwrap();
    let mut index = 0;
    let cmds = |cmds: Vec<Command>| EntryPayload::Normal(Request { cmds: cmds.into() });
    let members: BTreeMap<u64, Member> =
        [(1, Member { name: "n1".into(), cluster_addr: "a1".into(), public_url: String::new().into() })].into();
    let membership = Membership::new(vec![BTreeSet::from([1])], members).unwrap();
    apply(&mut sm, &mut index, EntryPayload::Membership(membership)).await;
    let renew = |at_ms, draining| Renew { node: 1, at_ms, lease_ms: 1000, connections: 0, draining, incarnation: 1 };
    apply(&mut sm, &mut index, cmds(vec![renew(10, false).into()])).await;
    assert!(view.has_changed().unwrap(), "a new member and its lease wake the watchers");
    view.borrow_and_update();

    let claim = |device: &str, conn| Claim { device: device.into(), node: 1, conn, epoch: 0, attempt: 1 };
    apply(&mut sm, &mut index, cmds(vec![claim("a", 1).into(), claim("b", 2).into()])).await;
    assert!(!view.has_changed().unwrap(), "claims do not wake the watchers");
    assert_eq!(view.borrow().lease(1).map(|l| l.routes), Some(2), "but readers see their route counts");
    apply(&mut sm, &mut index, cmds(vec![Release { device: "a".into(), conn: 1 }.into()])).await;
    assert!(!view.has_changed().unwrap(), "nor does a release");
    assert_eq!(view.borrow().lease(1).map(|l| l.routes), Some(1));

    apply(&mut sm, &mut index, cmds(vec![renew(20, true).into()])).await;
    assert!(view.has_changed().unwrap(), "a lease that changes wakes them");
    assert_eq!(view.borrow_and_update().lease(1).map(|l| l.state), Some(crate::machine::LeaseState::Draining));
}

/// A snapshot the log policy asks for is deferred while the entries applied since the last one
/// weigh less than that snapshot's bytes (`raft::pace`), and counted as deferred; a forced one
/// (a follower's entries are purged) is never deferred, and nor is the first after a start.
#[tokio::test]
async fn policy_snapshots_wait_until_the_entries_since_weigh_as_much_as_the_last() {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    use futures_util::stream;
    use openraft::storage::RaftStateMachine;
    use openraft::{EntryPayload, Membership, RaftSnapshotBuilder};

    use super::types::{log_id as id, Entry, Request};
    use crate::machine::{Claim, Command, Member, Renew};
    use crate::metrics::Metrics;

    /// Applies one entry; its weight.
    async fn apply(sm: &mut StateMachine, index: &mut u64, payload: EntryPayload<Request, u64, Member>) -> u64 {
        *index += 1;
        let entry = Entry { log_id: id(3, 1, *index), payload };
        let weight = super::tail::weight(&entry) as u64;
        sm.apply(stream::iter([Ok((entry, None))])).await.unwrap();
        weight
    }
    let claims = |from: u64, count: u64| {
        let cmds: Vec<Command> = (from..from + count)
            .map(|n| Claim { device: format!("device-{n}"), node: 1, conn: n, epoch: 0, attempt: 1 }.into())
            .collect();
        EntryPayload::Normal(Request { cmds: cmds.into() })
    };
    let dir = tempfile::tempdir().unwrap();
    let (db, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
    let metrics = Arc::new(Metrics::default());
    let (mut sm, _view) = StateMachine::new(db, loaded, None, metrics.clone(), Default::default()).unwrap();
    let mut index = 0;
    let members: BTreeMap<u64, Member> =
        [(1, Member { name: "n1".into(), cluster_addr: "a1".into(), public_url: String::new().into() })].into();
    let membership = Membership::new(vec![BTreeSet::from([1])], members).unwrap();
    apply(&mut sm, &mut index, EntryPayload::Membership(membership)).await;
    let renew = Renew { node: 1, at_ms: 10, lease_ms: 1 << 40, connections: 0, draining: false, incarnation: 1 };
    apply(&mut sm, &mut index, EntryPayload::Normal(Request { cmds: vec![renew.into()].into() })).await;
    apply(&mut sm, &mut index, claims(0, 300)).await;

    let mut builder = sm.try_create_snapshot_builder(false).await.expect("the first snapshot is never deferred");
    let bytes = builder.build_snapshot().await.unwrap().snapshot.into_inner().len() as u64;
    assert!(bytes > 300 * 20, "a snapshot of 300 devices is {bytes} bytes");

    let mut since = 0;
    let mut deferred = 0;
    let mut next = 300;
    while since < bytes {
        assert!(
            sm.try_create_snapshot_builder(false).await.is_none(),
            "{since} bytes of entries since a snapshot of {bytes}: deferred"
        );
        deferred += 1;
        assert_eq!(metrics.snapshots_deferred.get(), deferred);
        assert!(sm.try_create_snapshot_builder(true).await.is_some(), "a forced snapshot is never deferred");
        since += apply(&mut sm, &mut index, claims(next, 20)).await;
        next += 20;
    }
    assert!(deferred >= 2, "deferred {deferred} times");
    // A deferral still made the applies before it durable: a copy of the file as a crash would
    // leave it (non-durable commits are not in its header) holds the devices claimed after the
    // snapshot and before the last deferral.
    let crashed = tempfile::tempdir().unwrap();
    std::fs::copy(dir.path().join("state.redb"), crashed.path().join("state.redb")).unwrap();
    let (copy, _) = StateDb::open(crashed.path(), crate::store::TEST_CACHE_BYTES).unwrap();
    assert!(copy.route("device-300").unwrap().0.is_some(), "a claim applied before a deferral is durable");
    drop(copy);
    let mut builder =
        sm.try_create_snapshot_builder(false).await.expect("due once the entries since weigh as much as the snapshot");
    let grown = builder.build_snapshot().await.unwrap().snapshot.into_inner().len() as u64;
    assert!(grown > bytes, "the state grew: {grown} bytes after {bytes}");
    assert!(sm.try_create_snapshot_builder(false).await.is_none(), "the new snapshot sets the pace");
}

/// What openraft 0.9 wrote (log entries, the vote, log ids, the applied meta, a stored snapshot),
/// encoded by the 0.9 build of this project, decodes under 0.10 to the same values, and all but
/// the snapshot (whose meta lost its id) encode back to the same bytes: a store written before the
/// upgrade opens after it.
#[test]
fn stores_written_with_openraft_0_9_decode() {
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::{EntryPayload, Membership};
    use serde::de::DeserializeOwned;
    use serde::Serialize;

    use super::state_machine::decode_snapshot;
    use super::types::{log_id, Entry, LogId, Request, StoredMembership, Vote};
    use crate::codec::{decode, encode};
    use crate::machine::{Claim, Member};

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }
    fn same<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(hex: &str, want: T) {
        let bytes = unhex(hex);
        let got: T = decode(&bytes).expect("a 0.9 encoding decodes");
        assert_eq!(got, want);
        assert_eq!(encode(&got).unwrap(), bytes, "encodes back to the 0.9 bytes");
    }
    const MEMBERSHIP: &str = "010201020301026e310b3132372e302e302e313a310777733a2f2f683102026e320b3132372e302e302e313a320777733a2f2f683203026e330b3132372e302e302e313a330777733a2f2f6833";
    let lid = |i| log_id(3, 1, i);
    let members: BTreeMap<u64, Member> = [1, 2, 3]
        .into_iter()
        .map(|id| {
            let m = Member {
                name: format!("n{id}").into(),
                cluster_addr: format!("127.0.0.1:{id}").into(),
                public_url: format!("ws://h{id}").into(),
            };
            (id, m)
        })
        .collect();
    let membership = Membership::new(vec![BTreeSet::from([1, 2])], members).unwrap();
    let claim = Claim { device: "dev-1".into(), node: 2, conn: 7, epoch: 5, attempt: 9 };
    let normal = Entry { log_id: lid(7), payload: EntryPayload::Normal(Request { cmds: vec![claim.into()].into() }) };
    same("01030107010101056465762d3102070509", normal);
    same(
        &format!("0103010802{MEMBERSHIP}"),
        Entry { log_id: lid(8), payload: EntryPayload::Membership(membership.clone()) },
    );
    same("0103010900", Entry { log_id: lid(9), payload: EntryPayload::Blank });
    same("01030101", Vote::new_committed(3, 1));
    same::<Option<LogId>>("0101030109", Some(lid(9)));
    let stored = StoredMembership::new(Some(lid(8)), membership);
    same(&format!("010103010901030108{MEMBERSHIP}"), (Some(lid(9)), stored.clone()));
    let snapshot = unhex(&format!("010103010901030108{MEMBERSHIP}07332d312d392d3103010203"));
    let (meta, data) = decode_snapshot(snapshot).expect("a 0.9 snapshot decodes");
    assert_eq!((meta.last_log_id, meta.last_membership, data), (Some(lid(9)), stored, vec![1, 2, 3]));
}
