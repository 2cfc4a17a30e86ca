//! Property tests of the applied state machine: V1/V2 and the lease/route bookkeeping against a
//! small reference model, lease monotonicity, and snapshot install/reopen round trips.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::{install_copy, renew, Sm};
use crate::raft::types::{Command, Floor, LeaseState, NodeId, NodeLease, Reply, Route, Superseded};
use crate::store::state::SnapshotBody;

const MEMBERS: [NodeId; 3] = [1, 2, 3];

/// The design's §3 table, written as plainly as possible over in-memory maps.
#[derive(Debug, Default)]
struct Model {
    /// node → (lease_until_ms, state, connections, incarnation)
    nodes: BTreeMap<NodeId, (u64, LeaseState, u64, u64)>,
    routes: BTreeMap<String, Route>,
    floors: BTreeMap<String, Floor>,
    ring_version: u64,
}

impl Model {
    fn live_set(&self) -> BTreeSet<NodeId> {
        self.nodes.iter().filter(|(id, l)| l.1 == LeaseState::Live && MEMBERS.contains(id)).map(|(id, _)| *id).collect()
    }

    fn drop_routes_of(&mut self, node: NodeId) -> u64 {
        let before = self.routes.len();
        self.routes.retain(|_, r| r.node != node);
        (before - self.routes.len()) as u64
    }

    fn apply(&mut self, cmd: &Command) -> Reply {
        match cmd.clone() {
            Command::Init { .. } => Reply::Done,
            Command::Claim { device, node, conn, epoch, attempt } => {
                let floor = self.floors.get(&device).cloned();
                if let Some(f) = &floor {
                    if (epoch, attempt) <= (f.max_epoch, f.max_attempt) {
                        let holder = self.routes.get(&device).filter(|r| r.node == node && r.conn == conn);
                        return match holder {
                            Some(r) if (epoch, attempt) == (f.max_epoch, f.max_attempt) => {
                                Reply::Accepted { version: r.version, superseded: None }
                            }
                            _ => Reply::Stale { floor_epoch: f.max_epoch, floor_attempt: f.max_attempt },
                        };
                    }
                }
                if !self.live_set().contains(&node) {
                    return Reply::NodeNotLive;
                }
                let version = floor.map_or(0, |f| f.max_version) + 1;
                let old = self.routes.insert(device.clone(), Route { node, conn, version });
                let floor = Floor { max_version: version, max_epoch: epoch, max_attempt: attempt, last_node: node };
                self.floors.insert(device, floor);
                Reply::Accepted { version, superseded: old.map(|r| Superseded { node: r.node, conn: r.conn }) }
            }
            Command::Release { device, conn } => {
                let holds = self.routes.get(&device).is_some_and(|r| r.conn == conn);
                if holds {
                    self.routes.remove(&device);
                }
                Reply::Released(holds)
            }
            Command::Renew { node, at_ms, lease_ms, connections, draining, incarnation } => {
                if MEMBERS.contains(&node) {
                    let l = self.nodes.entry(node).or_insert((0, LeaseState::Live, 0, incarnation));
                    l.0 = l.0.max(at_ms + lease_ms);
                    // Draining sticks until a renewal from another incarnation (a restart).
                    let sticky = l.1 == LeaseState::Draining && l.3 == incarnation;
                    l.1 = if draining || sticky { LeaseState::Draining } else { LeaseState::Live };
                    l.2 = connections;
                    l.3 = incarnation;
                }
                Reply::Done
            }
            Command::Sweep { at_ms, grace_ms, candidates } => {
                let (mut expired, mut routes_deleted) = (Vec::new(), 0);
                for node in candidates {
                    let lapsed =
                        self.nodes.get(&node).is_some_and(|l| l.1 != LeaseState::Expired && l.0 + grace_ms < at_ms);
                    if lapsed {
                        routes_deleted += self.drop_routes_of(node);
                        self.nodes.get_mut(&node).unwrap().1 = LeaseState::Expired;
                        expired.push(node);
                    }
                }
                Reply::Swept { expired, routes_deleted }
            }
            Command::ExtendLeases { at_ms, lease_ms } => {
                for l in self.nodes.values_mut().filter(|l| l.1 != LeaseState::Expired) {
                    l.0 = l.0.max(at_ms + lease_ms);
                }
                Reply::Done
            }
            Command::Drain { node, .. } => match self.nodes.get_mut(&node) {
                Some(l) if l.1 == LeaseState::Live => {
                    l.1 = LeaseState::Draining;
                    Reply::Count(1)
                }
                _ => Reply::Count(0),
            },
            Command::ReleaseNode { node } => Reply::Count(self.drop_routes_of(node)),
            Command::Forget { node } => {
                let n = self.drop_routes_of(node);
                self.nodes.remove(&node);
                Reply::Count(n)
            }
            // Streams have their own tests (store/streams_tests.rs); the generator emits none.
            Command::Publish { .. } | Command::Ack { .. } => unreachable!("not generated"),
        }
    }

    /// Lease rows as the state machine should store them: `routes` is the real route count.
    fn leases(&self) -> Vec<(NodeId, NodeLease)> {
        let count = |n: NodeId| self.routes.values().filter(|r| r.node == n).count() as u64;
        self.nodes
            .iter()
            .map(|(&id, &(lease_until_ms, state, connections, incarnation))| {
                (id, NodeLease { lease_until_ms, state, connections, routes: count(id), incarnation })
            })
            .collect()
    }
}

fn command() -> impl Strategy<Value = Command> {
    let device = (0..5u8).prop_map(|d| format!("d{d}"));
    prop_oneof![
        3 => (1..=4u64, 0..400u64, 20..150u64, 0..5u64, prop::bool::weighted(0.1), 0..2u64).prop_map(
            |(node, at_ms, lease_ms, connections, draining, incarnation)| Command::Renew {
                node,
                at_ms,
                lease_ms,
                connections,
                draining,
                incarnation
            }
        ),
        6 => (device.clone(), 1..=4u64, 0..4u64, 0..3u64, 0..6u64)
            .prop_map(|(device, node, conn, epoch, attempt)| Command::Claim { device, node, conn, epoch, attempt }),
        2 => (device, 0..4u64).prop_map(|(device, conn)| Command::Release { device, conn }),
        2 => (0..500u64, 0..20u64, prop::sample::subsequence(vec![1u64, 2, 3, 4], 0..=4))
            .prop_map(|(at_ms, grace_ms, candidates)| Command::Sweep { at_ms, grace_ms, candidates }),
        1 => (0..400u64, 20..150u64).prop_map(|(at_ms, lease_ms)| Command::ExtendLeases { at_ms, lease_ms }),
        1 => (1..=4u64).prop_map(|node| Command::Drain { node, at_ms: 0 }),
        1 => (1..=4u64).prop_map(|node| Command::ReleaseNode { node }),
        1 => (1..=4u64).prop_map(|node| Command::Forget { node }),
    ]
}

/// Up to 60 commands batched into entries of 1 to 3 commands (the proposer batches too).
fn entries() -> impl Strategy<Value = Vec<Vec<Command>>> {
    prop::collection::vec(prop::collection::vec(command(), 1..=3), 1..=20)
}

/// Checks V1/V2 and the bookkeeping after one entry, independently of the model's replies.
#[derive(Default)]
struct Invariants {
    /// device → (version, epoch, attempt, node, conn) of the last accepted claim
    accepted: BTreeMap<String, (u64, u64, u64, NodeId, u64)>,
    /// device → highest route version ever seen
    seen: BTreeMap<String, u64>,
}

impl Invariants {
    fn claim_reply(&mut self, cmd: &Command, reply: &Reply) {
        let Command::Claim { device, node, conn, epoch, attempt } = cmd else { return };
        let Reply::Accepted { version, .. } = reply else { return };
        let key = (*epoch, *attempt);
        match self.accepted.get(device).copied() {
            // An exact replay of the last accepted claim keeps its version.
            Some((v, e, a, n, c)) if *version == v => {
                assert_eq!((key, *node, *conn), ((e, a), n, c), "version {v} reused by another claim");
            }
            Some((v, e, a, ..)) => {
                assert_eq!(*version, v + 1, "{device}: an accepted claim must bump the version by one");
                assert!(key > (e, a), "{device}: accepted {key:?} not newer than {:?}", (e, a));
            }
            None => assert_eq!(*version, 1, "{device}: first accepted claim"),
        }
        self.accepted.insert(device.clone(), (*version, *epoch, *attempt, *node, *conn));
    }

    fn state(&mut self, sm: &Sm, body: &SnapshotBody) {
        let devices: Vec<&String> = body.routes.iter().map(|(d, _)| d).collect();
        assert!(devices.windows(2).all(|w| w[0] < w[1]), "a device has two routes: {devices:?}");
        for (device, route) in &body.routes {
            let (v, _, _, n, c) = self.accepted[device];
            assert_eq!(
                (route.version, route.node, route.conn),
                (v, n, c),
                "{device}: route is not the last accepted claim"
            );
            let seen = self.seen.entry(device.clone()).or_default();
            assert!(route.version >= *seen, "{device}: route version went down");
            *seen = route.version;
        }
        for (device, floor) in &body.floors {
            let (v, e, a, n, _) = self.accepted[device];
            assert_eq!(floor, &Floor { max_version: v, max_epoch: e, max_attempt: a, last_node: n }, "{device}: floor");
        }
        for (id, lease) in &sm.meta.nodes {
            let actual = body.routes.iter().filter(|(_, r)| r.node == *id).count() as u64;
            assert_eq!(lease.routes, actual, "node {id}: routes count");
        }
        assert_eq!(
            body.nodes,
            sm.meta.nodes.clone().into_iter().collect::<Vec<_>>(),
            "persisted leases differ from meta"
        );
    }
}

/// Runs `entries` on a fresh state machine, checking each entry against the model and invariants.
fn run(entries: &[Vec<Command>]) -> (Sm, Model) {
    let mut sm = Sm::new();
    let mut model = Model::default();
    let mut inv = Invariants::default();
    for cmds in entries {
        let live_before = model.live_set();
        let replies = sm.entry(cmds.clone());
        for (cmd, reply) in cmds.iter().zip(&replies) {
            assert_eq!(reply, &model.apply(cmd), "reply to {cmd:?}");
            inv.claim_reply(cmd, reply);
        }
        if model.live_set() != live_before {
            model.ring_version = sm.index;
        }
        let (_, body) = sm.db.dump().unwrap();
        inv.state(&sm, &body);
        assert_eq!(body.routes, model.routes.clone().into_iter().collect::<Vec<_>>(), "routes after {cmds:?}");
        assert_eq!(body.floors, model.floors.clone().into_iter().collect::<Vec<_>>(), "floors after {cmds:?}");
        assert_eq!(body.nodes, model.leases(), "leases after {cmds:?}");
        assert_eq!(sm.meta.ring_version, model.ring_version, "ring_version after {cmds:?}");
        assert_eq!(body.ring_version, model.ring_version);
    }
    (sm, model)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_routes_follow_model_and_v1_v2(entries in entries()) {
        run(&entries);
    }

    /// Renewals and extensions of one node: lease_until only grows while the node is not expired.
    #[test]
    fn prop_lease_until_never_decreases(
        ops in prop::collection::vec((any::<bool>(), 0..10_000u64, 1..5_000u64), 1..=30)
    ) {
        let mut sm = Sm::new();
        sm.one(renew(2, 0, 1)); // a second lease that ExtendLeases must also push
        let mut until = 0;
        for (extend, at_ms, lease_ms) in ops {
            let before2 = sm.lease(2).unwrap().lease_until_ms;
            let cmd = if extend { Command::ExtendLeases { at_ms, lease_ms } } else { renew(1, at_ms, lease_ms) };
            sm.one(cmd);
            let Some(l1) = sm.lease(1) else {
                prop_assert!(extend, "a member's renewal created no lease row");
                continue;
            };
            prop_assert_eq!(l1.lease_until_ms, until.max(at_ms + lease_ms));
            until = l1.lease_until_ms;
            let l2 = sm.lease(2).unwrap().lease_until_ms;
            prop_assert!(l2 >= before2);
            if extend {
                prop_assert!(l2 >= at_ms + lease_ms);
            }
        }
    }

    /// dump → encode → install on a fresh db gives the same state, keeps applying identically, and
    /// survives a reopen.
    #[test]
    fn prop_snapshot_round_trip(before in entries(), after in prop::collection::vec(prop::collection::vec(command(), 1..=3), 1..=8)) {
        let mut sm = Sm::new();
        for cmds in before {
            sm.entry(cmds);
        }
        let mut copy = install_copy(&sm);
        prop_assert_eq!(copy.state_bytes(), sm.state_bytes());
        prop_assert_eq!(&copy.meta, &sm.meta);
        let mut copy_reopened = copy.reopen();
        prop_assert_eq!(&copy_reopened.meta, &sm.meta);
        for cmds in &after {
            prop_assert_eq!(copy_reopened.entry(cmds.clone()), sm.entry(cmds.clone()));
        }
        prop_assert_eq!(copy_reopened.state_bytes(), sm.state_bytes());
        prop_assert_eq!(&copy_reopened.meta, &sm.meta);
        copy = copy_reopened;
        let sm = sm.reopen();
        let copy = copy.reopen();
        prop_assert_eq!(copy.meta, sm.meta);
    }
}
