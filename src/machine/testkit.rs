//! The harness the rule tests run on, generic over the backend: the domain runs every rule test
//! on [`MemTables`], and `store` runs the very same tests on redb (with reopen and snapshot
//! install doing real I/O there), so both backends are held to one specification.

use std::collections::{BTreeMap, BTreeSet};

use super::tables::mem::MemTables;
use super::*;

/// A backend the rules can be applied on.
pub trait Backend: Sized {
    fn fresh() -> Self;
    /// Applies one entry at `index` in one transaction, on node `local` (see [`Ctx::local`]).
    fn apply(
        &mut self,
        state: &mut State,
        index: u64,
        input: Input,
        local: Option<NodeId>,
        events: &mut Vec<Event>,
    ) -> Vec<Reply>;
    fn route(&self, device: &str) -> (Option<Route>, Option<Floor>);
    fn stream(&self, device: &str, after: u64, limit: usize) -> StreamRead;
    /// Every row of every table.
    fn dump(&self) -> MemTables;
    /// Closes and reopens the backend; the state it loads back.
    fn reopen(self) -> (Self, State);
    /// Replaces this backend's whole state with a snapshot of `from`'s; the state it loads.
    fn install(&mut self, from: &Self) -> State;
}

/// The reference backend: maps, with the last applied state kept as if persisted.
#[derive(Clone, Default)]
pub struct MemBackend {
    tables: MemTables,
    saved: State,
}

impl Backend for MemBackend {
    fn fresh() -> Self {
        MemBackend::default()
    }

    fn apply(
        &mut self,
        state: &mut State,
        index: u64,
        input: Input,
        local: Option<NodeId>,
        events: &mut Vec<Event>,
    ) -> Vec<Reply> {
        let replies = match super::apply(state, &mut self.tables, index, input, local, events) {
            Ok(r) => r,
            Err(never) => match never {},
        };
        self.saved = state.clone();
        replies
    }

    fn route(&self, device: &str) -> (Option<Route>, Option<Floor>) {
        (self.tables.routes.get(device).cloned(), self.tables.floors.get(device).cloned())
    }

    fn stream(&self, device: &str, after: u64, limit: usize) -> StreamRead {
        let head = self.tables.heads.get(device).copied().unwrap_or_default();
        let messages = self
            .tables
            .messages
            .range((device.to_string(), after.saturating_add(1))..)
            .take_while(|((d, seq), _)| d == device && *seq <= head.head)
            .take(limit)
            .map(|((_, seq), m)| (*seq, m.clone()))
            .collect();
        StreamRead { head, messages }
    }

    fn dump(&self) -> MemTables {
        self.tables.clone()
    }

    fn reopen(self) -> (Self, State) {
        let state = self.saved.clone();
        (self, state)
    }

    fn install(&mut self, from: &Self) -> State {
        *self = from.clone();
        self.saved.clone()
    }
}

/// A state machine on backend `B`: the state `apply` left, the last log index used and the term
/// the next entries are proposed in.
pub struct Sm<B> {
    pub b: B,
    pub state: State,
    pub index: u64,
    pub term: u64,
    /// Every event the applies emitted, in order.
    pub events: Vec<Event>,
    /// The node applying (None: replies carry nothing node-local).
    pub local: Option<NodeId>,
}

impl<B: Backend> Sm<B> {
    /// An empty state machine (no membership).
    pub fn empty() -> Self {
        Self::empty_on(B::fresh())
    }

    /// [`Sm::empty`] on backend `b`.
    pub fn empty_on(b: B) -> Self {
        Sm { b, state: State::default(), index: 0, term: 1, events: Vec::new(), local: None }
    }

    /// A state machine whose first entry makes nodes 1, 2, 3 voters, and whose leader (term 1)
    /// extended the leases, as every leader does before it sweeps.
    pub fn new() -> Self {
        Self::new_on(B::fresh())
    }

    /// [`Sm::new`] on backend `b`.
    pub fn new_on(b: B) -> Self {
        let mut sm = Self::empty_on(b);
        sm.membership(&[1, 2, 3]);
        sm.new_term();
        sm
    }

    /// The next term's leader takes over: its first entry extends the leases.
    pub fn new_term(&mut self) -> Reply {
        self.term += 1;
        self.one(ExtendLeases { at_ms: 0, lease_ms: 0 }.into())
    }

    fn push(&mut self, input: Input) -> Vec<Reply> {
        self.index += 1;
        self.b.apply(&mut self.state, self.index, input, self.local, &mut self.events)
    }

    pub fn membership(&mut self, voters: &[NodeId]) {
        let members: BTreeMap<NodeId, Member> = voters
            .iter()
            .map(|&id| {
                (
                    id,
                    Member {
                        name: format!("n{id}").into(),
                        cluster_addr: format!("127.0.0.1:{id}").into(),
                        ..Default::default()
                    },
                )
            })
            .collect();
        let voters: BTreeSet<NodeId> = voters.iter().copied().collect();
        assert!(self.push(Input::Membership { members, voters }).is_empty());
    }

    /// Applies one entry holding `cmds`; returns one reply per command.
    pub fn entry(&mut self, cmds: Vec<Command>) -> Vec<Reply> {
        let n = cmds.len();
        let replies = self.push(Input::Commands { term: self.term, cmds: std::sync::Arc::new(cmds) });
        assert_eq!(replies.len(), n);
        replies
    }

    pub fn one(&mut self, cmd: Command) -> Reply {
        self.entry(vec![cmd]).pop().unwrap()
    }

    pub fn lease(&self, node: NodeId) -> Option<NodeLease> {
        self.state.nodes.get(&node).cloned()
    }

    pub fn route(&self, device: &str) -> (Option<Route>, Option<Floor>) {
        self.b.route(device)
    }

    pub fn read(&self, device: &str, after: u64, limit: usize) -> StreamRead {
        self.b.stream(device, after, limit)
    }

    /// The whole state — in memory and in the tables — for "changed nothing" comparisons; all
    /// but cluster time, which every stamped command advances.
    pub fn everything(&self) -> (State, MemTables) {
        (State { clock_ms: 0, ..self.state.clone() }, self.b.dump())
    }

    /// Reopens the backend and checks it loads the same state.
    pub fn reopen(self) -> Self {
        let Sm { b, state, index, term, events, local } = self;
        let (b, loaded) = b.reopen();
        assert_eq!(loaded, state, "the reopened backend loads a different state");
        Sm { b, state: loaded, index, term, events, local }
    }

    /// A copy made through a snapshot (dump, encode, install on a fresh backend).
    pub fn install_copy(&self) -> Self {
        let mut copy = Self::empty();
        copy.install_from(self);
        copy
    }

    /// Installs a snapshot of `other` over this state machine.
    pub fn install_from(&mut self, other: &Self) {
        self.state = self.b.install(&other.b);
        (self.index, self.term) = (other.index, other.term);
    }
}

pub fn claim(device: &str, node: NodeId, conn: u64, epoch: u64, attempt: u64) -> Command {
    Claim { device: device.into(), node, conn, epoch, attempt }.into()
}

pub fn renew(node: NodeId, at_ms: u64, lease_ms: u64) -> Command {
    Renew { node, at_ms, lease_ms, connections: 0, draining: false, incarnation: 0 }.into()
}

pub fn sweep(at_ms: u64, grace_ms: u64, candidates: &[NodeId]) -> Command {
    Sweep { at_ms, grace_ms, candidates: candidates.to_vec() }.into()
}

pub fn drain(node: NodeId, at_ms: u64) -> Command {
    Drain { node, at_ms }.into()
}

pub fn extend(at_ms: u64, lease_ms: u64) -> Command {
    ExtendLeases { at_ms, lease_ms }.into()
}

pub fn suspect(node: NodeId, at_ms: u64, hold_ms: u64) -> Command {
    Suspect { node, at_ms, hold_ms }.into()
}

/// A publish that keeps every message and every key.
fn publish_all(device: &str, payload: &str, key: Option<&str>, at_ms: u64) -> Publish {
    let max = u64::MAX;
    Publish {
        device: device.into(),
        payload: payload.into(),
        key: key.map(Into::into),
        at_ms,
        keep_count: max,
        keep_age_ms: max,
        keep_key_ms: max,
        max_keys: max,
    }
}

pub fn publish(
    device: &str,
    payload: &str,
    key: Option<&str>,
    at_ms: u64,
    keep_count: u64,
    keep_age_ms: u64,
) -> Command {
    Publish { keep_count, keep_age_ms, ..publish_all(device, payload, key, at_ms) }.into()
}

/// A publish that keeps every message, and keys for `keep_key_ms`, at most `max_keys`.
pub fn publish_keyed(device: &str, payload: &str, key: &str, at_ms: u64, keep_key_ms: u64, max_keys: u64) -> Command {
    Publish { keep_key_ms, max_keys, ..publish_all(device, payload, Some(key), at_ms) }.into()
}

pub fn ack(device: &str, seq: u64) -> Command {
    Ack { device: device.into(), seq }.into()
}

pub fn accepted(version: u64, superseded: Option<(NodeId, u64)>) -> Reply {
    Reply::Claim(ClaimReply::Accepted {
        version,
        superseded: superseded.map(|(node, conn)| Superseded { node, conn }),
        head: None,
    })
}

pub fn stale(floor_epoch: u64, floor_attempt: u64) -> Reply {
    Reply::Claim(ClaimReply::Stale { floor_epoch, floor_attempt })
}

pub fn not_live() -> Reply {
    Reply::Claim(ClaimReply::NodeNotLive)
}

pub fn swept(expired: &[NodeId], routes_deleted: u64) -> Reply {
    Reply::Sweep(Swept { expired: expired.to_vec(), routes_deleted })
}

pub fn published(seq: u64, duplicate: bool) -> Reply {
    Reply::Publish(PublishReply::Published { seq, duplicate })
}

pub fn route(node: NodeId, conn: u64, version: u64) -> Option<Route> {
    Some(Route { node, conn, version })
}

pub fn floor(max_version: u64, max_epoch: u64, max_attempt: u64, last_node: NodeId) -> Option<Floor> {
    Some(Floor { max_version, max_epoch, max_attempt, last_node })
}

/// Declares one `#[test]` per generic rule test (and one proptest per property) for `$backend`.
macro_rules! backend_tests {
    ($backend:ty) => {
        use $crate::machine::{props, scale_tests, stream_tests, tenant_tests, tests};
        $crate::machine::testkit::backend_tests!(@each $backend, tests:
            claim_accept_supersede_stale_and_epoch_order,
            claim_replay_is_idempotent,
            claim_by_node_without_live_lease_is_refused_and_changes_nothing,
            sweep_never_deletes_a_floor,
            duplicate_sweep_changes_nothing,
            sweep_before_lease_and_grace_lapse_changes_nothing,
            renewal_never_shortens_a_lease,
            extend_leases_pushes_unexpired_leases_and_never_shortens,
            renew_from_non_member_changes_nothing,
            forget_removes_lease_and_routes_but_not_floors,
            ring_version_changes_exactly_with_the_live_set,
            state_survives_reopen,
            drain_sticks_until_a_new_incarnation_renews,
            a_restarted_process_first_renewal_releases_its_predecessors_routes_once,
            apply_emits_the_events_nodes_act_on,
            a_sweep_applies_only_in_the_term_that_extended_leases,
            a_dead_node_is_extended_once_however_often_leadership_changes,
            a_suspect_leaves_the_ring_keeps_its_routes_and_rejoins_after_the_hold,
            cluster_time_is_the_newest_stamp_applied,
            the_admission_budget_is_replicated_and_survives_a_reopen,
        );
        $crate::machine::testkit::backend_tests!(@each $backend, stream_tests:
            publish_needs_a_known_device_then_seqs_count_up_and_reads_page,
            idempotency_keys_dedupe_within_their_window_whatever_was_trimmed,
            idempotency_keys_expire_after_their_window_and_are_bounded_per_device,
            retention_by_count_and_age_moves_oldest_and_spares_other_devices,
            ack_trims_up_to_min_of_seq_and_head_idempotently_and_never_moves_head,
            snapshot_round_trip_keeps_streams_and_idempotency,
            a_claim_applied_by_its_own_node_answers_the_stream_head,
        );
        $crate::machine::testkit::backend_tests!(@each $backend, tenant_tests:
            a_tenant_at_its_connection_cap_is_refused_and_others_are_not,
            a_publish_quota_counts_each_consumption_once_and_renews_each_period,
            tenants_survive_a_reopen_and_a_snapshot,
        );
        $crate::machine::testkit::backend_tests!(@each $backend, scale_tests:
            the_event_log_records_each_change_with_its_trigger_counts_and_ring,
            the_event_log_keeps_the_newest_events_only,
            one_scale_in_at_a_time_and_the_lock_lapses_unless_extended,
            a_scale_in_keeps_a_quorum_of_healthy_voters,
            a_scale_in_needs_the_remaining_capacity_unless_forced,
            a_node_publishes_its_connection_limit_and_forgetting_it_clears_it,
        );
        proptest::proptest! {
            #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

            #[test]
            fn prop_routes_follow_model_and_v1_v2(entries in props::entries()) {
                props::routes_follow_model::<$backend>(&entries);
            }

            #[test]
            fn prop_lease_until_never_decreases(
                ops in proptest::collection::vec((proptest::prelude::any::<bool>(), 0..10_000u64, 1..5_000u64), 1..=30)
            ) {
                props::lease_until_never_decreases::<$backend>(&ops);
            }

            #[test]
            fn prop_snapshot_round_trip(before in props::entries(), after in props::entries_short()) {
                props::snapshot_round_trip::<$backend>(before, after);
            }

            #[test]
            fn prop_streams_match_a_model(entries in props::stream_entries()) {
                props::streams_match_a_model::<$backend>(entries);
            }
        }
    };
    (@each $backend:ty, $module:ident: $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                $module::$name::<$backend>();
            }
        )*
    };
}
pub(crate) use backend_tests;
