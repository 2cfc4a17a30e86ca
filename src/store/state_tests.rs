//! Unit tests of the applied state machine (design §3): claims, sweeps, leases, ring version and
//! durability, driven through `StateDb::apply` with real openraft entries. The property tests
//! (V1/V2 against a model, lease monotonicity, snapshot round trip) live in `state_props.rs`.

use std::collections::{BTreeMap, BTreeSet};

use tempfile::TempDir;

use super::state::{Meta, StateDb};
use crate::codec::encode;
use crate::raft::types::{
    Command, Entry, Floor, LeaseState, LogId, Member, NodeId, NodeLease, Reply, Request, Route, SnapshotMeta,
    Superseded,
};

#[path = "state_props.rs"]
mod state_props;

pub(super) fn log_id(index: u64) -> LogId {
    openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index)
}

/// A state machine in a temp dir plus the meta `apply` returned last and the last log index used.
pub(super) struct Sm {
    pub dir: TempDir,
    pub db: StateDb,
    pub meta: Meta,
    pub index: u64,
}

impl Sm {
    /// An empty state machine (no membership).
    pub fn empty() -> Sm {
        // tmpfs when there is one: fsyncs on create/close/snapshot dominate the runtime otherwise.
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
        let (db, meta) = StateDb::open(dir.path()).unwrap();
        assert_eq!(meta, Meta::default());
        Sm { dir, db, meta, index: 0 }
    }

    /// A state machine whose first entry makes nodes 1, 2, 3 voters.
    pub fn new() -> Sm {
        let mut sm = Sm::empty();
        sm.membership(&[1, 2, 3]);
        sm
    }

    fn push(&mut self, payload: openraft::EntryPayload<crate::raft::types::TypeConfig>) -> Vec<Reply> {
        self.index += 1;
        let entry = Entry { log_id: log_id(self.index), payload };
        let (mut resp, meta) = self.db.apply(&self.meta, vec![entry]).unwrap();
        assert_eq!(meta.last_applied, Some(log_id(self.index)));
        self.meta = meta;
        assert_eq!(resp.len(), 1);
        resp.pop().unwrap().replies
    }

    pub fn membership(&mut self, voters: &[NodeId]) {
        let nodes: BTreeMap<NodeId, Member> = voters
            .iter()
            .map(|&id| {
                (id, Member { name: format!("n{id}"), cluster_addr: format!("127.0.0.1:{id}"), ..Default::default() })
            })
            .collect();
        let m = openraft::Membership::new(vec![voters.iter().copied().collect::<BTreeSet<_>>()], nodes);
        assert!(self.push(openraft::EntryPayload::Membership(m)).is_empty());
    }

    /// Applies one entry holding `cmds`; returns one reply per command.
    pub fn entry(&mut self, cmds: Vec<Command>) -> Vec<Reply> {
        let n = cmds.len();
        let replies = self.push(openraft::EntryPayload::Normal(Request { cmds }));
        assert_eq!(replies.len(), n);
        replies
    }

    pub fn one(&mut self, cmd: Command) -> Reply {
        self.entry(vec![cmd]).pop().unwrap()
    }

    pub fn lease(&self, node: NodeId) -> Option<NodeLease> {
        self.meta.nodes.get(&node).cloned()
    }

    pub fn route(&self, device: &str) -> (Option<Route>, Option<Floor>) {
        self.db.route(device).unwrap()
    }

    /// The whole persisted state except `last_applied`, as comparable bytes.
    pub fn state_bytes(&self) -> Vec<u8> {
        let (meta, body) = self.db.dump().unwrap();
        encode(&(meta.membership, body)).unwrap()
    }

    /// Drops the database, reopens it on the same dir and checks it loads the same meta.
    pub fn reopen(self) -> Sm {
        let Sm { dir, db, meta, index } = self;
        drop(db);
        let (db, loaded) = StateDb::open(dir.path()).unwrap();
        assert_eq!(loaded, meta, "reopened state.redb loads a different meta");
        Sm { dir, db, meta: loaded, index }
    }
}

pub(super) fn claim(device: &str, node: NodeId, conn: u64, epoch: u64, attempt: u64) -> Command {
    Command::Claim { device: device.into(), node, conn, epoch, attempt }
}

pub(super) fn renew(node: NodeId, at_ms: u64, lease_ms: u64) -> Command {
    Command::Renew { node, at_ms, lease_ms, connections: 0, draining: false, incarnation: 0 }
}

pub(super) fn sweep(at_ms: u64, grace_ms: u64, candidates: &[NodeId]) -> Command {
    Command::Sweep { at_ms, grace_ms, candidates: candidates.to_vec() }
}

fn accepted(version: u64, superseded: Option<(NodeId, u64)>) -> Reply {
    Reply::Accepted { version, superseded: superseded.map(|(node, conn)| Superseded { node, conn }) }
}

fn stale(floor_epoch: u64, floor_attempt: u64) -> Reply {
    Reply::Stale { floor_epoch, floor_attempt }
}

fn route(node: NodeId, conn: u64, version: u64) -> Option<Route> {
    Some(Route { node, conn, version })
}

fn floor(max_version: u64, max_epoch: u64, max_attempt: u64, last_node: NodeId) -> Option<Floor> {
    Some(Floor { max_version, max_epoch, max_attempt, last_node })
}

fn swept(expired: &[NodeId], routes_deleted: u64) -> Reply {
    Reply::Swept { expired: expired.to_vec(), routes_deleted }
}

#[test]
fn claim_accept_supersede_stale_and_epoch_order() {
    let mut sm = Sm::new();
    sm.entry(vec![renew(1, 1000, 10_000), renew(2, 1000, 10_000), renew(3, 1000, 10_000)]);
    assert_eq!(sm.one(claim("d", 1, 10, 1, 1)), accepted(1, None));
    assert_eq!(sm.route("d"), (route(1, 10, 1), floor(1, 1, 1, 1)));
    assert_eq!(sm.one(claim("d", 2, 20, 1, 2)), accepted(2, Some((1, 10))));
    assert_eq!(sm.route("d"), (route(2, 20, 2), floor(2, 1, 2, 2)));
    let before = sm.state_bytes();
    // Equal, lower attempt, lower epoch with a higher attempt: all stale, naming the floor.
    for (node, conn, e, a) in [(3, 30, 1, 2), (1, 10, 1, 1), (3, 31, 0, 99), (2, 20, 1, 2 - 1)] {
        assert_eq!(sm.one(claim("d", node, conn, e, a)), stale(1, 2), "claim ({e}, {a}) on {node}/{conn}");
    }
    assert_eq!(sm.state_bytes(), before, "a stale claim changed state");
    // A higher epoch wins even with a lower attempt.
    assert_eq!(sm.one(claim("d", 3, 30, 2, 0)), accepted(3, Some((2, 20))));
    assert_eq!(sm.route("d"), (route(3, 30, 3), floor(3, 2, 0, 3)));
    assert_eq!(sm.one(claim("d", 1, 10, 1, 100)), stale(2, 0));
    let counts: Vec<u64> = (1..=3).map(|n| sm.lease(n).unwrap().routes).collect();
    assert_eq!(counts, [0, 0, 1]);
}

#[test]
fn claim_replay_is_idempotent() {
    let mut sm = Sm::new();
    sm.one(renew(1, 0, 10_000));
    sm.one(renew(2, 0, 10_000));
    assert_eq!(sm.one(claim("d", 1, 7, 3, 4)), accepted(1, None));
    assert_eq!(sm.one(claim("d", 2, 8, 3, 5)), accepted(2, Some((1, 7))));
    let before = sm.state_bytes();
    // The exact replay (e.g. a forwarded proposal applied twice), also twice in one batch.
    assert_eq!(sm.one(claim("d", 2, 8, 3, 5)), accepted(2, None));
    assert_eq!(sm.entry(vec![claim("d", 2, 8, 3, 5), claim("d", 2, 8, 3, 5)]), [accepted(2, None), accepted(2, None)]);
    assert_eq!(sm.state_bytes(), before, "a replayed claim changed state");
    assert_eq!(sm.lease(2).unwrap().routes, 1);
    // The same (epoch, attempt) on another conn or node is not a replay.
    assert_eq!(sm.one(claim("d", 2, 9, 3, 5)), stale(3, 5));
    assert_eq!(sm.one(claim("d", 1, 8, 3, 5)), stale(3, 5));
    // The next real claim gets exactly the next version.
    assert_eq!(sm.one(claim("d", 1, 9, 3, 6)), accepted(3, Some((2, 8))));
}

#[test]
fn claim_by_node_without_live_lease_is_refused_and_changes_nothing() {
    let mut sm = Sm::new();
    sm.one(renew(1, 0, 100));
    sm.one(renew(2, 0, 10_000));
    sm.one(renew(4, 0, 10_000)); // not a member: no lease
    assert_eq!(sm.one(claim("held", 2, 1, 1, 1)), accepted(1, None));
    assert_eq!(sm.one(Command::Drain { node: 2, at_ms: 50 }), Reply::Count(1));
    assert_eq!(sm.one(sweep(200, 0, &[1])), swept(&[1], 0));
    let before = sm.state_bytes();
    let meta_before = sm.meta.nodes.clone();
    // 3: never renewed; 4: not a member; 2: draining; 1: expired.
    for node in [3, 4, 2, 1] {
        assert_eq!(sm.one(claim("fresh", node, 5, 1, 1)), Reply::NodeNotLive, "node {node}");
        assert_eq!(sm.one(claim("held", node, 5, 9, 9)), Reply::NodeNotLive, "node {node}");
    }
    assert_eq!(sm.state_bytes(), before);
    assert_eq!(sm.meta.nodes, meta_before);
    assert_eq!(sm.route("fresh"), (None, None));
    assert_eq!(sm.route("held"), (route(2, 1, 1), floor(1, 1, 1, 2)));
    // The refused claims raised no floor: the same (epoch, attempt) is accepted once live.
    sm.one(renew(3, 0, 10_000));
    assert_eq!(sm.one(claim("held", 3, 5, 9, 9)), accepted(2, Some((2, 1))));
    assert_eq!(sm.one(claim("fresh", 3, 5, 1, 1)), accepted(1, None));
}

#[test]
fn sweep_never_deletes_a_floor() {
    let mut sm = Sm::new();
    sm.one(renew(1, 0, 100));
    sm.one(renew(2, 0, 1000));
    sm.entry(vec![claim("d0", 1, 1, 1, 5), claim("d1", 1, 2, 2, 3), claim("d2", 2, 3, 1, 1)]);
    let floors: Vec<_> = ["d0", "d1"].iter().map(|d| sm.route(d).1).collect();
    assert_eq!(sm.one(sweep(200, 10, &[1, 2])), swept(&[1], 2));
    assert_eq!(sm.lease(1).map(|l| (l.state, l.routes)), Some((LeaseState::Expired, 0)));
    assert_eq!(sm.lease(2).map(|l| (l.state, l.routes)), Some((LeaseState::Live, 1)));
    assert_eq!(sm.route("d0"), (None, floors[0].clone()));
    assert_eq!(sm.route("d1"), (None, floors[1].clone()));
    assert_eq!(sm.route("d2").0, route(2, 3, 1));
    // Late claims stay fenced by the floor, on any live node.
    assert_eq!(sm.one(claim("d0", 2, 9, 1, 5)), stale(1, 5));
    assert_eq!(sm.one(claim("d0", 2, 9, 1, 4)), stale(1, 5));
    assert_eq!(sm.one(claim("d1", 2, 9, 1, 9)), stale(2, 3));
    // A newer claim is accepted and its version continues from the floor.
    assert_eq!(sm.one(claim("d0", 2, 9, 1, 6)), accepted(2, None));
    // The same holds after ReleaseNode and Release: routes go, floors stay.
    assert_eq!(sm.one(Command::ReleaseNode { node: 2 }), Reply::Count(2));
    assert_eq!(sm.route("d0"), (None, floor(2, 1, 6, 2)));
    assert_eq!(sm.one(claim("d0", 2, 9, 1, 6)), stale(1, 6));
}

#[test]
fn duplicate_sweep_changes_nothing() {
    let mut sm = Sm::new();
    sm.one(renew(1, 0, 100));
    sm.one(renew(2, 0, 1000));
    sm.entry(vec![claim("a", 1, 1, 1, 1), claim("b", 2, 1, 1, 1)]);
    assert_eq!(sm.one(sweep(200, 0, &[1, 2])), swept(&[1], 1));
    let (before, meta) = (sm.state_bytes(), sm.meta.clone());
    assert_eq!(sm.one(sweep(200, 0, &[1, 2])), swept(&[], 0));
    assert_eq!(sm.entry(vec![sweep(200, 0, &[1, 1]), sweep(300, 0, &[1, 3, 4])]), [swept(&[], 0), swept(&[], 0)]);
    assert_eq!(sm.state_bytes(), before);
    assert_eq!((sm.meta.nodes.clone(), sm.meta.ring_version), (meta.nodes, meta.ring_version));
}

#[test]
fn sweep_before_lease_and_grace_lapse_changes_nothing() {
    let mut sm = Sm::new();
    sm.one(renew(1, 0, 100)); // lease_until 100
    sm.one(claim("a", 1, 1, 1, 1));
    let before = sm.state_bytes();
    // lease_until + grace < at_ms is required: 100 + 10 < 110 is false.
    for (at, grace) in [(50, 0), (100, 0), (105, 10), (110, 10)] {
        assert_eq!(sm.one(sweep(at, grace, &[1])), swept(&[], 0), "sweep at {at} grace {grace}");
    }
    assert_eq!(sm.state_bytes(), before);
    // A renewal that committed before a sweep proposed with stale candidates keeps the node.
    sm.one(renew(1, 90, 100)); // lease_until 190
    let before = sm.state_bytes();
    assert_eq!(sm.one(sweep(150, 10, &[1])), swept(&[], 0));
    assert_eq!(sm.state_bytes(), before);
    assert_eq!(sm.route("a").0, route(1, 1, 1));
    assert_eq!(sm.one(sweep(201, 10, &[1])), swept(&[1], 1));
}

#[test]
fn renewal_never_shortens_a_lease() {
    let mut sm = Sm::new();
    sm.one(renew(1, 1000, 500));
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 1500);
    sm.one(renew(1, 900, 500)); // earlier at_ms
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 1500);
    sm.one(renew(1, 1000, 100)); // shorter lease
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 1500);
    sm.one(renew(1, 1200, 500));
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 1700);
    let sm = sm.reopen();
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 1700);
}

#[test]
fn extend_leases_pushes_unexpired_leases_and_never_shortens() {
    let mut sm = Sm::new();
    sm.entry(vec![renew(1, 0, 1700), renew(2, 0, 5000), renew(3, 0, 100)]);
    assert_eq!(sm.one(sweep(500, 0, &[3])), swept(&[3], 0));
    sm.one(Command::Drain { node: 2, at_ms: 600 });
    sm.one(Command::ExtendLeases { at_ms: 2000, lease_ms: 1000 });
    let leases: Vec<_> = (1..=3).map(|n| sm.lease(n).map(|l| (l.lease_until_ms, l.state)).unwrap()).collect();
    assert_eq!(leases, [(3000, LeaseState::Live), (5000, LeaseState::Draining), (100, LeaseState::Expired)]);
    sm.one(Command::ExtendLeases { at_ms: 100, lease_ms: 100 }); // an older leader's extension
    assert_eq!(sm.lease(1).unwrap().lease_until_ms, 3000);
    let sm = sm.reopen();
    assert_eq!(sm.lease(2).unwrap().lease_until_ms, 5000);
}

#[test]
fn renew_from_non_member_changes_nothing() {
    let mut sm = Sm::new();
    sm.one(renew(1, 0, 1000));
    let (before, meta) = (sm.state_bytes(), sm.meta.clone());
    assert_eq!(
        sm.one(Command::Renew { node: 9, at_ms: 10, lease_ms: 1000, connections: 3, draining: false, incarnation: 0 }),
        Reply::Done
    );
    assert_eq!(sm.state_bytes(), before);
    assert_eq!((sm.meta.nodes.clone(), sm.meta.ring_version), (meta.nodes, meta.ring_version));
    assert_eq!(sm.one(claim("d", 9, 1, 1, 1)), Reply::NodeNotLive);
}

#[test]
fn forget_removes_lease_and_routes_but_not_floors() {
    let mut sm = Sm::new();
    sm.entry(vec![renew(1, 0, 1000), renew(2, 0, 1000)]);
    sm.entry(vec![claim("a", 1, 1, 1, 4), claim("b", 1, 2, 1, 1), claim("c", 2, 3, 1, 1)]);
    let floor_a = sm.route("a").1;
    assert_eq!(sm.one(Command::Forget { node: 1 }), Reply::Count(2));
    assert!(sm.lease(1).is_none());
    assert_eq!(sm.route("a"), (None, floor_a));
    assert_eq!(sm.route("c").0, route(2, 3, 1));
    assert_eq!(sm.one(claim("a", 2, 5, 1, 4)), stale(1, 4));
    let sm = sm.reopen();
    assert!(sm.lease(1).is_none(), "the forgotten lease row came back from disk");
    let (_, body) = sm.db.dump().unwrap();
    assert_eq!(body.nodes.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [2]);
    assert_eq!(body.routes.iter().map(|(d, _)| d.as_str()).collect::<Vec<_>>(), ["c"]);
}

#[test]
fn ring_version_changes_exactly_with_the_live_set() {
    let mut sm = Sm::new();
    assert_eq!(sm.meta.ring_version, 0);
    let mut expect = 0;
    let mut step = |sm: &mut Sm, cmd: Command, changes: bool| {
        sm.one(cmd.clone());
        if changes {
            expect = sm.index;
        }
        assert_eq!(sm.meta.ring_version, expect, "after {cmd:?}");
    };
    step(&mut sm, renew(1, 0, 100), true); // a new live node
    step(&mut sm, renew(1, 10, 100), false); // a plain renewal
    step(&mut sm, renew(2, 0, 1000), true);
    step(&mut sm, claim("d", 1, 1, 1, 1), false);
    step(&mut sm, Command::Release { device: "d".into(), conn: 1 }, false);
    step(&mut sm, Command::ExtendLeases { at_ms: 0, lease_ms: 10 }, false);
    step(&mut sm, sweep(50, 0, &[1, 2]), false); // nothing lapsed
    step(&mut sm, Command::Drain { node: 2, at_ms: 60 }, true);
    step(&mut sm, Command::Drain { node: 2, at_ms: 60 }, false);
    step(
        &mut sm,
        Command::Renew { node: 3, at_ms: 0, lease_ms: 100, connections: 0, draining: true, incarnation: 0 },
        false,
    );
    step(&mut sm, sweep(500, 0, &[1]), true); // 1 expires
    step(&mut sm, sweep(500, 0, &[3]), false); // 3 was draining: not in the live set
    step(&mut sm, renew(9, 0, 100), false); // not a member
    step(&mut sm, renew(1, 600, 100), true); // back from expired
    step(&mut sm, Command::Forget { node: 1 }, true);
    step(&mut sm, renew(3, 700, 100), true);
    sm.membership(&[1, 2]); // 3 leaves the membership, so the live set
    assert_eq!(sm.meta.ring_version, sm.index);
    let sm = sm.reopen();
    assert_eq!(sm.meta.ring_version, sm.index);
}

#[test]
fn meta_survives_reopen() {
    let mut sm = Sm::new();
    sm.entry(vec![Command::Init { cluster_id: "c1".into() }, renew(1, 0, 1000), renew(2, 5, 1000)]);
    sm.entry(vec![claim("a", 1, 1, 1, 1), claim("b", 2, 1, 1, 1), Command::Init { cluster_id: "c2".into() }]);
    sm.one(Command::Drain { node: 2, at_ms: 9 });
    assert_eq!(sm.meta.cluster_id.as_deref(), Some("c1"));
    let bytes = sm.state_bytes();
    let sm = sm.reopen();
    assert_eq!(sm.meta.last_applied, Some(log_id(sm.index)));
    assert_eq!(sm.meta.membership.membership().voter_ids().collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(sm.meta.nodes[&2].state, LeaseState::Draining);
    assert_eq!(sm.state_bytes(), bytes);
    assert_eq!(sm.route("a").0, route(1, 1, 1));
}

/// Builds a snapshot the way the snapshot builder does and installs it into a fresh StateDb.
pub(super) fn install_copy(sm: &Sm) -> Sm {
    let (meta, body) = sm.db.dump().unwrap();
    let data = encode(&body).unwrap();
    let smeta =
        SnapshotMeta { last_log_id: meta.last_applied, last_membership: meta.membership, snapshot_id: "t".into() };
    let mut copy = Sm::empty();
    copy.meta = copy.db.install(&smeta, &data).unwrap();
    copy.index = sm.index;
    copy
}

#[test]
fn drain_sticks_until_a_new_incarnation_renews() {
    let mut sm = Sm::new();
    let renew_as = |incarnation: u64, draining: bool| Command::Renew {
        node: 1,
        at_ms: 10,
        lease_ms: 1000,
        connections: 0,
        draining,
        incarnation,
    };
    sm.one(renew_as(7, false));
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Live);
    sm.one(Command::Drain { node: 1, at_ms: 20 });
    // A renewal from the same process that raced the drain (sent as not draining) keeps it out.
    sm.one(renew_as(7, false));
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Draining, "a stale renewal undid a drain");
    // A restarted process (new incarnation) is live again.
    sm.one(renew_as(8, false));
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Live);
    // An expired node of the same process comes back when it renews (paused and resumed).
    sm.one(Command::Sweep { at_ms: 5_000, grace_ms: 0, candidates: vec![1] });
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Expired);
    sm.one(Command::Renew { node: 1, at_ms: 6_000, lease_ms: 1000, connections: 0, draining: false, incarnation: 8 });
    assert_eq!(sm.lease(1).unwrap().state, LeaseState::Live);
}
