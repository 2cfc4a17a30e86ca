//! Property tests of the rules, generic over the backend (instantiated by
//! [`super::testkit::backend_tests`]): V1/V2 and the lease/route bookkeeping against a small
//! reference model, lease monotonicity, snapshot install/reopen round trips, and the message
//! streams against a model.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proptest::prelude::*;

use super::stream_tests::{idem, FOREVER};
use super::testkit::*;
use super::tests::sm_with;
use super::*;

const MEMBERS: [NodeId; 3] = [1, 2, 3];

/// A node's lease as the model keeps it.
#[derive(Debug, Clone, Copy)]
struct Lease {
    until: u64,
    state: LeaseState,
    connections: u64,
    incarnation: u64,
    extendable: bool,
    suspect_until: u64,
}

/// The design's §3 table, written as plainly as possible over in-memory maps.
#[derive(Debug, Default)]
struct Model {
    nodes: BTreeMap<NodeId, Lease>,
    routes: BTreeMap<String, Route>,
    floors: BTreeMap<String, Floor>,
    ring_version: u64,
    /// The term the leases were last extended in (`Sm::new` extends in term 1).
    extended_term: u64,
    /// tenant → (plan revision, connection cap)
    plans: BTreeMap<String, (u64, Option<u64>)>,
    /// device → the tenant its last accepted claim named
    device_tenant: BTreeMap<String, String>,
}

impl Model {
    fn live_set(&self) -> BTreeSet<NodeId> {
        self.nodes
            .iter()
            .filter(|(id, l)| l.state == LeaseState::Live && MEMBERS.contains(id))
            .map(|(id, _)| *id)
            .collect()
    }

    fn drop_routes_of(&mut self, node: NodeId) -> u64 {
        let before = self.routes.len();
        self.routes.retain(|_, r| r.node != node);
        (before - self.routes.len()) as u64
    }

    /// Routes whose device's tenant is `tenant`.
    fn connections(&self, tenant: &str) -> u64 {
        self.routes.keys().filter(|d| self.device_tenant.get(*d).map(String::as_str) == Some(tenant)).count() as u64
    }

    fn claim(&mut self, c: Claim, tenant: Option<String>) -> ClaimReply {
        let Claim { device, node, conn, epoch, attempt } = c;
        let floor = self.floors.get(&device).cloned();
        if let Some(f) = &floor {
            if (epoch, attempt) <= (f.max_epoch, f.max_attempt) {
                let holder = self.routes.get(&device).filter(|r| r.node == node && r.conn == conn);
                return match holder {
                    Some(r) if (epoch, attempt) == (f.max_epoch, f.max_attempt) => {
                        ClaimReply::Accepted { version: r.version, superseded: None, head: None }
                    }
                    _ => ClaimReply::Stale { floor_epoch: f.max_epoch, floor_attempt: f.max_attempt },
                };
            }
        }
        if !self.live_set().contains(&node) {
            return ClaimReply::NodeNotLive;
        }
        if let Some(t) = &tenant {
            let holds_slot = self.routes.contains_key(&device) && self.device_tenant.get(&device) == Some(t);
            let cap = self.plans.get(t).and_then(|p| p.1);
            if let Some(cap) = cap.filter(|&cap| !holds_slot && self.connections(t) >= cap) {
                return ClaimReply::QuotaExhausted { limit: cap };
            }
        }
        match &tenant {
            Some(t) => self.device_tenant.insert(device.clone(), t.clone()),
            None => self.device_tenant.remove(&device),
        };
        let version = floor.map_or(0, |f| f.max_version) + 1;
        let old = self.routes.insert(device.clone(), Route { node, conn, version });
        let floor = Floor { max_version: version, max_epoch: epoch, max_attempt: attempt, last_node: node };
        self.floors.insert(device, floor);
        ClaimReply::Accepted { version, superseded: old.map(|r| Superseded { node: r.node, conn: r.conn }), head: None }
    }

    fn renew(&mut self, Renew { node, at_ms, lease_ms, connections, draining, incarnation }: Renew) {
        if MEMBERS.contains(&node) {
            let fresh = Lease {
                until: 0,
                state: LeaseState::Live,
                connections: 0,
                incarnation,
                extendable: true,
                suspect_until: 0,
            };
            let l = self.nodes.entry(node).or_insert(fresh);
            l.until = l.until.max(at_ms + lease_ms);
            // Draining sticks until a renewal from another incarnation (a restart); a
            // suspect rejoins only once its hold has passed.
            let sticky = l.state == LeaseState::Draining && l.incarnation == incarnation;
            let held = l.state == LeaseState::Suspect && at_ms < l.suspect_until;
            l.state = if draining || sticky {
                LeaseState::Draining
            } else if held {
                LeaseState::Suspect
            } else {
                LeaseState::Live
            };
            l.connections = connections;
            l.incarnation = incarnation;
            l.extendable = true;
        }
    }

    fn apply(&mut self, term: u64, cmd: &Command) -> Reply {
        match cmd.clone() {
            Command::Init(_) => Reply::Init(()),
            Command::Claim(c) => Reply::Claim(self.claim(c, None)),
            Command::ClaimTenant(c) => Reply::ClaimTenant(self.claim(c.claim, Some(c.tenant))),
            Command::SetTenantPolicy(p) => {
                let plan = self.plans.entry(p.tenant).or_default();
                *plan = (plan.0 + 1, p.max_connections);
                Reply::SetTenantPolicy(plan.0)
            }
            Command::Release(Release { device, conn }) => {
                let holds = self.routes.get(&device).is_some_and(|r| r.conn == conn);
                if holds {
                    self.routes.remove(&device);
                }
                Reply::Release(holds)
            }
            Command::Renew(r) => {
                self.renew(r);
                Reply::Renew(())
            }
            Command::FirstRenew(FirstRenew(r)) => {
                let previous = MEMBERS.contains(&r.node)
                    && self.nodes.get(&r.node).is_some_and(|l| l.incarnation != r.incarnation);
                let deleted = if previous { self.drop_routes_of(r.node) } else { 0 };
                self.renew(r);
                Reply::FirstRenew(deleted)
            }
            Command::Sweep(Sweep { at_ms, grace_ms, candidates }) => {
                let (mut expired, mut routes_deleted) = (Vec::new(), 0);
                let in_force = term == self.extended_term;
                for node in candidates.into_iter().filter(|_| in_force) {
                    let lapsed = self
                        .nodes
                        .get(&node)
                        .is_some_and(|l| l.state != LeaseState::Expired && l.until + grace_ms < at_ms);
                    if lapsed {
                        routes_deleted += self.drop_routes_of(node);
                        self.nodes.get_mut(&node).unwrap().state = LeaseState::Expired;
                        expired.push(node);
                    }
                }
                Reply::Sweep(Swept { expired, routes_deleted })
            }
            Command::ExtendLeases(ExtendLeases { at_ms, lease_ms }) => {
                self.extended_term = self.extended_term.max(term);
                for l in self.nodes.values_mut().filter(|l| l.state != LeaseState::Expired && l.extendable) {
                    l.until = l.until.max(at_ms + lease_ms);
                    l.extendable = false;
                }
                Reply::ExtendLeases(())
            }
            Command::Drain(Drain { node, .. }) => match self.nodes.get_mut(&node) {
                Some(l) if l.state == LeaseState::Live => {
                    l.state = LeaseState::Draining;
                    Reply::Drain(true)
                }
                _ => Reply::Drain(false),
            },
            Command::Suspect(Suspect { node, at_ms, hold_ms }) => match self.nodes.get_mut(&node) {
                Some(l) if l.state == LeaseState::Live => {
                    l.state = LeaseState::Suspect;
                    l.suspect_until = at_ms + hold_ms;
                    Reply::Suspect(true)
                }
                _ => Reply::Suspect(false),
            },
            Command::ReleaseNode(ReleaseNode { node }) => Reply::ReleaseNode(self.drop_routes_of(node)),
            // The budget touches no route or lease (its rule has its own tests).
            Command::SetAdmission(_) => Reply::SetAdmission(()),
            Command::Forget(Forget { node }) => {
                let n = self.drop_routes_of(node);
                self.nodes.remove(&node);
                Reply::Forget(n)
            }
            // Streams have their own model below; the generator emits none.
            Command::Publish(_) | Command::Ack(_) => unreachable!("not generated"),
            // Grants touch publish quotas only (their rule has its own tests).
            Command::Grant(_)
            | Command::SetCapacity(_)
            | Command::SetMaxConnections(_)
            | Command::BeginScaleIn(_)
            | Command::EndScaleIn(_) => {
                unreachable!("not generated")
            }
        }
    }

    /// Lease rows as the state machine should hold them: `routes` is the real route count.
    fn leases(&self) -> BTreeMap<NodeId, NodeLease> {
        let count = |n: NodeId| self.routes.values().filter(|r| r.node == n).count() as u64;
        self.nodes
            .iter()
            .map(|(&id, l)| {
                let lease = NodeLease {
                    lease_until_ms: l.until,
                    state: l.state,
                    connections: l.connections,
                    routes: count(id),
                    incarnation: l.incarnation,
                    extendable: l.extendable,
                    suspect_until_ms: l.suspect_until,
                };
                (id, lease)
            })
            .collect()
    }
}

fn command() -> impl Strategy<Value = Command> {
    let device = (0..5u8).prop_map(|d| format!("d{d}"));
    prop_oneof![
        3 => (1..=4u64, 0..400u64, 20..150u64, 0..5u64, prop::bool::weighted(0.1), 0..2u64).prop_map(
            |(node, at_ms, lease_ms, connections, draining, incarnation)| {
                Renew { node, at_ms, lease_ms, connections, draining, incarnation }.into()
            }
        ),
        1 => (1..=4u64, 0..400u64, 20..150u64, 0..2u64).prop_map(|(node, at_ms, lease_ms, incarnation)| {
            FirstRenew(Renew { node, at_ms, lease_ms, connections: 0, draining: false, incarnation }).into()
        }),
        6 => (device.clone(), 1..=4u64, 0..4u64, 0..3u64, 0..6u64)
            .prop_map(|(device, node, conn, epoch, attempt)| claim(&device, node, conn, epoch, attempt)),
        3 => (device.clone(), 1..=4u64, 0..4u64, 0..3u64, 0..6u64, prop::sample::select(vec!["ta", "tb"])).prop_map(
            |(device, node, conn, epoch, attempt, tenant)| {
                let claim = Claim { device, node, conn, epoch, attempt };
                ClaimTenant { claim, tenant: tenant.to_string() }.into()
            }
        ),
        1 => (prop::sample::select(vec!["ta", "tb"]), prop::option::of(0..4u64)).prop_map(|(tenant, max_connections)| {
            SetTenantPolicy { tenant: tenant.into(), max_connections, publishes: None, at_ms: 0 }.into()
        }),
        2 => (device, 0..4u64).prop_map(|(device, conn)| Release { device, conn }.into()),
        2 => (0..500u64, 0..20u64, prop::sample::subsequence(vec![1u64, 2, 3, 4], 0..=4))
            .prop_map(|(at_ms, grace_ms, candidates)| Sweep { at_ms, grace_ms, candidates }.into()),
        1 => (0..400u64, 20..150u64).prop_map(|(at_ms, lease_ms)| ExtendLeases { at_ms, lease_ms }.into()),
        1 => (1..=4u64).prop_map(|node| drain(node, 0)),
        1 => (1..=4u64).prop_map(|node| ReleaseNode { node }.into()),
        1 => (1..=4u64).prop_map(|node| Forget { node }.into()),
        1 => (1..=4u64, 0..400u64, 0..100u64).prop_map(|(node, at_ms, hold_ms)| suspect(node, at_ms, hold_ms)),
    ]
}

/// One entry: its commands, and whether a new term starts with it (a new leader, which may or
/// may not have extended the leases yet).
pub type Step = (bool, Vec<Command>);

fn step() -> impl Strategy<Value = Step> {
    (prop::bool::weighted(0.15), prop::collection::vec(command(), 1..=3))
}

/// Up to 60 commands batched into entries of 1 to 3 commands (the proposer batches too).
pub fn entries() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 1..=20)
}

/// A few more entries, applied after a snapshot.
pub fn entries_short() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 1..=8)
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
        let (Command::Claim(Claim { device, node, conn, epoch, attempt })
        | Command::ClaimTenant(ClaimTenant { claim: Claim { device, node, conn, epoch, attempt }, .. })) = cmd
        else {
            return;
        };
        let (Reply::Claim(ClaimReply::Accepted { version, .. })
        | Reply::ClaimTenant(ClaimReply::Accepted { version, .. })) = reply
        else {
            return;
        };
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

    fn state<B: Backend>(&mut self, sm: &Sm<B>) {
        let t = sm.b.dump();
        for (device, route) in &t.routes {
            let (v, _, _, n, c) = self.accepted[device];
            assert_eq!((route.version, route.node, route.conn), (v, n, c), "{device}: route is not the last claim");
            let seen = self.seen.entry(device.clone()).or_default();
            assert!(route.version >= *seen, "{device}: route version went down");
            *seen = route.version;
        }
        // A claim of a device without a floor reads neither its route nor its tenant row.
        for device in t.routes.keys().chain(t.device_tenants.keys()) {
            assert!(t.floors.contains_key(device), "{device}: a route or tenant row without a floor");
        }
        let index: BTreeSet<(NodeId, String)> = t.routes.iter().map(|(d, r)| (r.node, d.clone())).collect();
        assert_eq!(t.node_routes, index, "the node index differs from the routes");
        for (device, floor) in &t.floors {
            let (v, e, a, n, _) = self.accepted[device];
            assert_eq!(floor, &Floor { max_version: v, max_epoch: e, max_attempt: a, last_node: n }, "{device}: floor");
        }
        for (id, lease) in &sm.state.nodes {
            let actual = t.routes.values().filter(|r| r.node == *id).count() as u64;
            assert_eq!(lease.routes, actual, "node {id}: routes count");
        }
    }
}

/// Runs `entries` on a fresh state machine, checking each entry against the model and invariants.
pub fn routes_follow_model<B: Backend>(entries: &[Step]) {
    let mut sm = Sm::<B>::new();
    let mut model = Model { extended_term: sm.term, ..Model::default() };
    let mut inv = Invariants::default();
    for (new_term, cmds) in entries {
        sm.term += u64::from(*new_term);
        let live_before = model.live_set();
        let replies = sm.entry(cmds.clone());
        for (cmd, reply) in cmds.iter().zip(&replies) {
            assert_eq!(reply, &model.apply(sm.term, cmd), "reply to {cmd:?} in term {}", sm.term);
            inv.claim_reply(cmd, reply);
        }
        if model.live_set() != live_before {
            model.ring_version = sm.index;
        }
        inv.state(&sm);
        let t = sm.b.dump();
        assert_eq!(t.routes, model.routes, "routes after {cmds:?}");
        assert_eq!(t.floors, model.floors, "floors after {cmds:?}");
        assert_eq!(sm.state.nodes, model.leases(), "leases after {cmds:?}");
        assert_eq!(sm.state.ring_version, model.ring_version, "ring_version after {cmds:?}");
        assert_eq!(t.device_tenants, model.device_tenant, "device tenants after {cmds:?}");
        for (tenant, row) in &t.tenants {
            assert_eq!(row.connections, model.connections(tenant), "{tenant}'s connections after {cmds:?}");
        }
    }
}

/// Renewals and extensions of one node: lease_until only grows while the node is not expired,
/// and an extension covers exactly the leases renewed since the previous one.
pub fn lease_until_never_decreases<B: Backend>(ops: &[(bool, u64, u64)]) {
    let mut sm = Sm::<B>::new();
    sm.one(renew(2, 0, 1)); // a second lease, renewed once: the first extension pushes it, no later one
    let mut until = 0;
    for &(extend, at_ms, lease_ms) in ops {
        let (before1, before2) = (sm.lease(1), sm.lease(2).unwrap());
        let cmd = if extend { self::extend(at_ms, lease_ms) } else { renew(1, at_ms, lease_ms) };
        sm.one(cmd);
        let Some(l1) = sm.lease(1) else {
            assert!(extend, "a member's renewal created no lease row");
            continue;
        };
        let pushed = !extend || before1.is_some_and(|l| l.extendable);
        assert_eq!(l1.lease_until_ms, if pushed { until.max(at_ms + lease_ms) } else { until });
        until = l1.lease_until_ms;
        let l2 = sm.lease(2).unwrap();
        assert!(l2.lease_until_ms >= before2.lease_until_ms);
        if extend {
            let want =
                if before2.extendable { before2.lease_until_ms.max(at_ms + lease_ms) } else { before2.lease_until_ms };
            assert_eq!(l2.lease_until_ms, want);
            assert!(!l2.extendable);
        }
    }
}

/// dump → encode → install on a fresh backend gives the same state, keeps applying identically,
/// and survives a reopen.
pub fn snapshot_round_trip<B: Backend>(before: Vec<Step>, after: Vec<Step>) {
    let mut sm = Sm::<B>::new();
    for (new_term, cmds) in before {
        sm.term += u64::from(new_term);
        sm.entry(cmds);
    }
    let copy = sm.install_copy();
    assert_eq!(copy.everything(), sm.everything());
    let mut copy = copy.reopen();
    for (new_term, cmds) in &after {
        sm.term += u64::from(*new_term);
        copy.term = sm.term;
        assert_eq!(copy.entry(cmds.clone()), sm.entry(cmds.clone()));
    }
    assert_eq!(copy.everything(), sm.everything());
    let (sm, copy) = (sm.reopen(), copy.reopen());
    assert_eq!(copy.everything(), sm.everything());
}

// ---- message streams against a model ----

#[derive(Debug, Clone)]
pub enum StreamOp {
    Publish { dev: usize, key: Option<u8>, dt: u64, keep_count: u64, keep_age_ms: u64, keep_key_ms: u64, max_keys: u64 },
    Ack { dev: usize, seq: u64 },
}

const DEVICES: [&str; 2] = ["d0", "d1"];

#[derive(Debug, Default, Clone)]
struct Stream {
    head: u64,
    /// (seq, at_ms, payload, key)
    retained: VecDeque<(u64, u64, String, Option<String>)>,
    /// key → (seq, used at)
    keys: BTreeMap<String, (u64, u64)>,
}

impl Stream {
    /// The seq a key got, if it was used within `window` of `now`.
    fn dup(&self, key: &str, now: u64, window: u64) -> Option<u64> {
        self.keys.get(key).filter(|(_, at)| at.saturating_add(window) >= now).map(|(seq, _)| *seq)
    }

    /// Forgets keys used before `now - window`, then the oldest ones beyond `max`.
    fn prune_keys(&mut self, now: u64, window: u64, max: u64) {
        self.keys.retain(|_, (_, at)| *at >= now.saturating_sub(window));
        while self.keys.len() as u64 > max {
            let oldest = self.keys.iter().min_by_key(|(_, (seq, at))| (*at, *seq)).map(|(k, _)| k.clone()).unwrap();
            self.keys.remove(&oldest);
        }
    }
}

fn stream_op() -> impl Strategy<Value = StreamOp> {
    prop_oneof![
        3 => (
            (0..2usize, prop::option::of(0..4u8), 0..60u64),
            (0..6u64, prop_oneof![Just(FOREVER), 0..150u64]),
            (prop_oneof![Just(FOREVER), 0..150u64], prop_oneof![Just(u64::MAX), 0..4u64]),
        )
            .prop_map(|((dev, key, dt), (keep_count, keep_age_ms), (keep_key_ms, max_keys))| StreamOp::Publish {
                dev,
                key,
                dt,
                keep_count,
                keep_age_ms,
                keep_key_ms,
                max_keys
            }),
        1 => (0..2usize, 0..25u64).prop_map(|(dev, seq)| StreamOp::Ack { dev, seq }),
    ]
}

pub fn stream_entries() -> impl Strategy<Value = Vec<Vec<StreamOp>>> {
    prop::collection::vec(prop::collection::vec(stream_op(), 1..4), 1..40)
}

pub fn streams_match_a_model<B: Backend>(entries: Vec<Vec<StreamOp>>) {
    let mut sm = sm_with::<B>(&DEVICES);
    let mut model: [Stream; 2] = Default::default();
    let mut now = 0u64;
    let mut n = 0u64;
    let mut last = [0u64; 2];
    for ops in entries {
        let mut cmds = Vec::new();
        let mut want = Vec::new();
        for op in ops {
            match op {
                StreamOp::Publish { dev, key, dt, keep_count, keep_age_ms, keep_key_ms, max_keys } => {
                    now += dt;
                    n += 1;
                    let key = key.map(|k| format!("k{k}"));
                    let payload = format!("{{\"n\":{n}}}");
                    let (device, at_ms) = (DEVICES[dev].to_string(), now);
                    cmds.push(
                        Publish {
                            device,
                            payload: payload.clone(),
                            key: key.clone(),
                            at_ms,
                            keep_count,
                            keep_age_ms,
                            keep_key_ms,
                            max_keys,
                        }
                        .into(),
                    );
                    let s = &mut model[dev];
                    if let Some(seq) = key.as_deref().and_then(|k| s.dup(k, now, keep_key_ms)) {
                        want.push(published(seq, true));
                        continue;
                    }
                    s.head += 1;
                    if let Some(k) = &key {
                        s.keys.insert(k.clone(), (s.head, now));
                    }
                    s.prune_keys(now, keep_key_ms, max_keys);
                    s.retained.push_back((s.head, now, payload, key));
                    while s.retained.len() as u64 > keep_count
                        || s.retained.front().is_some_and(|m| m.1.saturating_add(keep_age_ms) < now)
                    {
                        s.retained.pop_front();
                    }
                    want.push(published(s.head, false));
                }
                StreamOp::Ack { dev, seq } => {
                    cmds.push(ack(DEVICES[dev], seq));
                    let s = &mut model[dev];
                    let before = s.retained.len();
                    s.retained.retain(|m| m.0 > seq);
                    want.push(Reply::Ack((before - s.retained.len()) as u64));
                }
            }
        }
        let got = sm.entry(cmds.clone());
        assert_eq!(&got, &want, "entry {cmds:?}");
        for (cmd, reply) in cmds.iter().zip(&got) {
            if let (Command::Publish(p), Reply::Publish(PublishReply::Published { seq, duplicate: false })) =
                (cmd, reply)
            {
                let dev = DEVICES.iter().position(|d| *d == p.device).unwrap();
                assert!(*seq > last[dev], "seq {seq} after {} on {}", last[dev], p.device);
                last[dev] = *seq;
            }
        }
        for (d, s) in DEVICES.iter().zip(&model) {
            let r = sm.read(d, 0, usize::MAX);
            let oldest = s.retained.front().map_or(s.head + 1, |m| m.0);
            assert_eq!(r.head, Head { head: s.head, oldest, keys: s.keys.len() as u64 }, "{d}");
            let want: Vec<(u64, Message)> = s
                .retained
                .iter()
                .map(|(seq, at_ms, payload, key)| {
                    (*seq, Message { at_ms: *at_ms, payload: payload.clone(), key: key.clone() })
                })
                .collect();
            assert_eq!(&r.messages, &want, "{d}");
            assert!(r.messages.windows(2).all(|w| w[0].0 < w[1].0), "seqs not increasing on {d}");
            let keys: BTreeMap<String, u64> = s.keys.iter().map(|(k, (seq, _))| (k.clone(), *seq)).collect();
            assert_eq!(idem(&sm, d).into_iter().collect::<BTreeMap<_, _>>(), keys, "{d}");
        }
    }
    let copy = sm.install_copy();
    for d in DEVICES {
        assert_eq!(copy.read(d, 0, usize::MAX), sm.read(d, 0, usize::MAX));
    }
}
