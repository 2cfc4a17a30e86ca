//! Prometheus metrics (`GET /metrics` on the cluster listener, unauthenticated). Counters are
//! bumped where the event happens; Raft gauges are read from openraft's metrics at scrape time;
//! [`process`] reads the `gateway_process_*` figures from `/proc/self` at each scrape.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

pub mod disk;
pub mod process;
pub mod tenants;
pub mod writes;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// Why something happened (a suspicion's `silent` or `refused`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// A part of the store (`log`, `state`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartLabel {
    pub part: &'static str,
}

/// A TLS event on one listener (`public`, `cluster`): a handshake's or a certificate reload's result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TlsLabel {
    pub listener: &'static str,
    pub result: &'static str,
}

/// An upstream endpoint, by `host:port`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabel {
    pub upstream: String,
}

/// Every metric a node exports.
pub struct Metrics {
    registry: Registry,
    /// Durable log appends (one fsync each).
    pub log_fsyncs: Counter,
    /// Entries written by those appends.
    pub log_entries: Counter,
    /// Append streams a leader opened to this node (`/raft/v2/stream`, upgraded).
    pub raft_append_streams: Counter,
    /// Commands handed to the Raft log by this node's proposer, and the entries that carried them.
    pub proposed_commands: Counter,
    pub proposed_batches: Counter,
    /// Commands this node forwarded to the leader (a follower's writes), and the forwards (one
    /// request each) that carried them.
    pub forwarded_commands: Counter,
    pub forwarded_batches: Counter,
    /// Forwards to the leader holding one of this node's forward lanes now.
    pub forward_lanes_busy: Gauge,
    /// Times this leader's proposer held a write back (for `LEASE_RETRY`, 10 ms) because openraft
    /// refused it for want of a valid leader lease (just elected, or cut off from its quorum).
    pub propose_lease_waits: Counter,
    /// Commands the proposer dropped unwritten because their caller had stopped waiting.
    pub propose_abandoned: Counter,
    /// Claims by result (`accepted`, `stale`, `not_live`, `error`).
    pub claims: Family<ResultLabel, Counter>,
    /// Snapshots this node built from its state, and snapshots it installed from a leader.
    pub snapshots_built: Counter,
    pub snapshots_installed: Counter,
    /// Snapshots the log policy asked for that this node deferred (`raft::pace`).
    pub snapshots_deferred: Counter,
    /// Device handshakes by result (`accepted`, `redirected`, or the refusal reason).
    pub handshakes: Family<ResultLabel, Counter>,
    /// Accepted handshakes by where `hello`'s stream head came from: `claim` (this node applied
    /// its own claim and the apply answered it) or `read` (a claim forwarded to the leader: read
    /// back from this node's store after the answer).
    pub stream_heads: Family<ResultLabel, Counter>,
    /// Placement's reads of a device's route and floor (a steered handshake, `/v1/placement`) by
    /// where they were answered: `cache` (the store's row cache, in memory) or `store` (a read
    /// transaction on the blocking pool: a device whose row the cache does not hold).
    pub placement_reads: Family<ResultLabel, Counter>,
    /// Backend publishes by result (`published`, `duplicate`, or the refusal reason such as
    /// `quota_exhausted`).
    pub publishes: Family<ResultLabel, Counter>,
    /// `sync` pages by result: `read`, or `busy` (the node's page budget was spent).
    pub sync_pages: Family<ResultLabel, Counter>,
    /// Time for a handshake's claim to commit.
    pub claim_seconds: Histogram,
    /// From sending a lease renewal to its commit, for those that committed (the fence counts
    /// from the send of the last one).
    pub renewal_seconds: Histogram,
    /// This node's admission bucket: its share of the cluster budget, or its own flags.
    pub admission_rate: Gauge<f64, AtomicU64>,
    pub admission_burst: Gauge,
    /// Members this node counts out of its admission share on its own evidence (devices report
    /// them gone and their cluster port refuses), before the ring drops them.
    pub admission_gone: Gauge,
    /// Permille of handshakes the overload control admits (1000: not overloaded).
    pub admitted_share: Gauge,
    /// Connections this node closed because a newer claim took the device over (4001).
    pub kicks: Counter,
    /// WebSocket pings sent to devices, and pongs received from them.
    pub pings_sent: Counter,
    pub pongs_received: Counter,
    /// Connections told to go away by a drain.
    pub drained: Counter,
    /// Releases that did not commit, kept for a retry (`ws::unreleased`); the retries by result:
    /// `released`, `no_route` (the route no longer named the connection), `failed` (kept again
    /// unless tried `MAX_TRIES` times), `refused` (by Raft; not kept); and the releases dropped
    /// (the list was full, or tried `MAX_TRIES` times).
    pub releases_pending: Gauge,
    pub release_retries: Family<ResultLabel, Counter>,
    pub releases_dropped: Counter,
    /// Allocator trims after a burst, and the free heap bytes they handed back (node::allocator).
    pub allocator_trims: Counter,
    pub allocator_released_bytes: Counter,
    /// Times the device side fell behind the apply events (sessions then caught up from the store).
    pub event_lags: Counter,
    /// Times this node fenced itself: no lease renewal committed, or its store stalled.
    pub fence_events: Counter,
    /// The store's writes in progress, timed (read by the fence loop; exported at each scrape).
    pub store_writes: std::sync::Arc<writes::StoreWrites>,
    /// Stalls of this node's store: a write without progress for a quarter of a lease (its disk
    /// stopped answering).
    pub store_stalls: Counter,
    /// Live device connections on this node.
    pub connections: Gauge,
    /// Nodes this node swept as leader.
    pub nodes_expired: Counter,
    /// Members this node suspected as leader, by why: `silent` (no answer for an election
    /// timeout) or `refused` (their cluster port refused two probes in a row: the process is gone).
    pub suspicions: Family<ReasonLabel, Counter>,
    /// Members whose applied state is `suspect` (out of the ring, lease and routes kept).
    pub suspect_nodes: Gauge,
    pub raft_term: Gauge,
    pub raft_is_leader: Gauge,
    pub raft_last_log_index: Gauge,
    pub raft_applied_index: Gauge,
    pub raft_commit_index: Gauge,
    pub raft_apply_lag: Gauge,
    pub members: Gauge,
    pub live_nodes: Gauge,
    pub routes: Gauge,
    pub ring_version: Gauge,
    /// Device `up` frames (intents) by how they were answered (`ack`, or the nack reason).
    pub ups: Family<ResultLabel, Counter>,
    /// Tries sent upstream by result (`ok`, `client_error`, `server_error`, `unavailable`,
    /// `connect_error`, `timeout`, `transport_error`): attempts, as opposed to intents.
    pub upstream_attempts: Family<ResultLabel, Counter>,
    /// Tries after the first, and retries the budget refused.
    pub upstream_retries: Counter,
    pub upstream_budget_exhausted: Counter,
    /// Ups that reached their deadline.
    pub upstream_deadline_exceeded: Counter,
    /// Per endpoint: 0 closed, 1 half-open, 2 open (ejected).
    pub upstream_breaker: Family<UpstreamLabel, Gauge>,
    /// Ups in flight on this node, and their payload bytes.
    pub ups_in_flight: Gauge,
    pub ups_in_flight_bytes: Gauge,
    /// Bytes of the node's publish budget held by publishes being read or answered (each its
    /// body plus 1 KiB; `api::messages::Budget`), refreshed by each scrape.
    pub publish_bytes_in_flight: Gauge,
    /// Per-tenant usage, refreshed by each scrape from the applied state.
    pub tenants: tenants::TenantGauges,
    /// This node's declared capacity and its utilization (connections / capacity; 0 undeclared).
    pub capacity_connections: Gauge,
    pub utilization: Gauge<f64, AtomicU64>,
    /// All connections / the declared capacity of the live nodes (0 when none declared one).
    pub cluster_utilization: Gauge<f64, AtomicU64>,
    /// New connections this node accepted per second (moving average).
    pub new_connections_per_s: Gauge<f64, AtomicU64>,
    /// The scaling hint: 1 scale out, 0 steady, -1 scale in.
    pub scaling_hint: Gauge,
    /// TLS handshakes on the listeners by result (`ok`, `failed`, `timeout`).
    pub tls_handshakes: Family<TlsLabel, Counter>,
    /// Certificate reloads by result (`ok`, `error`: the old certificate stays in use).
    pub tls_reloads: Family<TlsLabel, Counter>,
}

impl Metrics {
    /// The metrics of a node whose data directory is `dir`: its filesystem's room as well.
    pub fn with_data_dir(dir: &std::path::Path) -> Metrics {
        let mut m = Metrics::default();
        m.registry.register_collector(Box::new(disk::DataDir(dir.to_path_buf())));
        m
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gateway");
        let m = Metrics {
            registry: Registry::default(),
            log_fsyncs: Counter::default(),
            log_entries: Counter::default(),
            raft_append_streams: Counter::default(),
            proposed_commands: Counter::default(),
            proposed_batches: Counter::default(),
            forwarded_commands: Counter::default(),
            forwarded_batches: Counter::default(),
            forward_lanes_busy: Gauge::default(),
            propose_lease_waits: Counter::default(),
            propose_abandoned: Counter::default(),
            claims: Family::default(),
            nodes_expired: Counter::default(),
            suspicions: Family::default(),
            suspect_nodes: Gauge::default(),
            handshakes: Family::default(),
            stream_heads: Family::default(),
            placement_reads: Family::default(),
            publishes: Family::default(),
            sync_pages: Family::default(),
            admitted_share: Gauge::default(),
            admission_rate: Gauge::default(),
            admission_burst: Gauge::default(),
            admission_gone: Gauge::default(),
            tls_handshakes: Family::default(),
            tls_reloads: Family::default(),
            claim_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            renewal_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            kicks: Counter::default(),
            pings_sent: Counter::default(),
            pongs_received: Counter::default(),
            connections: Gauge::default(),
            drained: Counter::default(),
            releases_pending: Gauge::default(),
            release_retries: Family::default(),
            releases_dropped: Counter::default(),
            allocator_trims: Counter::default(),
            allocator_released_bytes: Counter::default(),
            event_lags: Counter::default(),
            fence_events: Counter::default(),
            store_writes: Default::default(),
            store_stalls: Counter::default(),
            snapshots_built: Counter::default(),
            snapshots_installed: Counter::default(),
            snapshots_deferred: Counter::default(),
            raft_term: Gauge::default(),
            raft_is_leader: Gauge::default(),
            raft_last_log_index: Gauge::default(),
            raft_applied_index: Gauge::default(),
            raft_commit_index: Gauge::default(),
            raft_apply_lag: Gauge::default(),
            members: Gauge::default(),
            live_nodes: Gauge::default(),
            routes: Gauge::default(),
            ring_version: Gauge::default(),
            ups: Family::default(),
            upstream_attempts: Family::default(),
            upstream_retries: Counter::default(),
            upstream_budget_exhausted: Counter::default(),
            upstream_deadline_exceeded: Counter::default(),
            upstream_breaker: Family::default(),
            ups_in_flight: Gauge::default(),
            ups_in_flight_bytes: Gauge::default(),
            publish_bytes_in_flight: Gauge::default(),
            tenants: tenants::TenantGauges::default(),
            capacity_connections: Gauge::default(),
            utilization: Gauge::default(),
            cluster_utilization: Gauge::default(),
            new_connections_per_s: Gauge::default(),
            scaling_hint: Gauge::default(),
        };
        m.admitted_share.set(1000);
        registry.register("log_fsyncs", "Durable Raft log appends (one fsync each)", m.log_fsyncs.clone());
        registry.register("log_entries", "Raft log entries written", m.log_entries.clone());
        registry.register(
            "raft_append_streams",
            "Append streams a leader opened to this node (pipelined replication)",
            m.raft_append_streams.clone(),
        );
        registry.register(
            "proposed_commands",
            "Commands proposed by this node's leader proposer",
            m.proposed_commands.clone(),
        );
        registry.register(
            "proposed_batches",
            "Log entries (batches) proposed by this node",
            m.proposed_batches.clone(),
        );
        registry.register(
            "forwarded_commands",
            "Commands this node forwarded to the leader and had answered",
            m.forwarded_commands.clone(),
        );
        registry.register(
            "forwarded_batches",
            "Forwards (one request to the leader each) that carried them",
            m.forwarded_batches.clone(),
        );
        registry.register(
            "forward_lanes_busy",
            "Forwards to the leader in flight on one of this node's forward lanes (a forward to a leader since replaced gives its lane back)",
            m.forward_lanes_busy.clone(),
        );
        registry.register(
            "propose_abandoned",
            "Commands dropped unwritten from the proposer's queue: their caller had stopped waiting (timed out, or gone)",
            m.propose_abandoned.clone(),
        );
        registry.register(
            "propose_lease_waits",
            "Writes this leader held back 10 ms because Raft refused them for want of a valid leader lease",
            m.propose_lease_waits.clone(),
        );
        registry.register("claims", "Route claims by result", m.claims.clone());
        registry.register("handshakes", "Device handshakes by result", m.handshakes.clone());
        registry.register(
            "handshake_stream_heads",
            "Accepted handshakes by where hello's stream head came from (claim, read)",
            m.stream_heads.clone(),
        );
        registry.register(
            "placement_reads",
            "Placement's route and floor reads by where they were answered (cache, store)",
            m.placement_reads.clone(),
        );
        registry.register("publishes", "Backend publishes by result", m.publishes.clone());
        registry.register("sync_pages", "Device sync pages by result (read, busy)", m.sync_pages.clone());
        registry.register("claim_seconds", "Claim commit latency in handshakes", m.claim_seconds.clone());
        registry.register(
            "lease_renewal_seconds",
            "From sending this node's lease renewal to its commit (renewals that committed)",
            m.renewal_seconds.clone(),
        );
        registry.register(
            "admission_rate_per_s",
            "Handshakes per second this node admits: its share of the cluster budget, or --admit-rate",
            m.admission_rate.clone(),
        );
        registry.register("admission_burst", "This node's admission burst", m.admission_burst.clone());
        registry.register(
            "admission_gone_members",
            "Live members this node counts out of its admission share: devices report them gone and their cluster port refuses connections here",
            m.admission_gone.clone(),
        );
        registry.register(
            "admitted_share_permille",
            "Permille of handshakes admitted by the overload control (1000: not overloaded)",
            m.admitted_share.clone(),
        );
        registry.register("kicks", "Connections closed with 4001 (superseded)", m.kicks.clone());
        registry.register("pings_sent", "WebSocket pings sent to devices (every --ping-ms)", m.pings_sent.clone());
        registry.register("pongs_received", "WebSocket pongs received from devices", m.pongs_received.clone());
        registry.register(
            "event_lags",
            "Times the device side fell behind the apply events (sessions caught up from the store)",
            m.event_lags.clone(),
        );
        registry.register("drained", "Connections sent goaway by a drain", m.drained.clone());
        registry.register(
            "releases_pending",
            "Releases of closed connections' routes that did not commit, kept for a retry",
            m.releases_pending.clone(),
        );
        registry.register(
            "release_retries",
            "Retried releases by result (released, no_route, failed, refused)",
            m.release_retries.clone(),
        );
        registry.register(
            "releases_dropped",
            "Releases that did not commit and are not retried: the list kept for retries was full, or they failed every try",
            m.releases_dropped.clone(),
        );
        registry.register(
            "allocator_trims",
            "Times freed heap was handed back to the system after a burst",
            m.allocator_trims.clone(),
        );
        registry.register(
            "allocator_released_bytes",
            "Free heap bytes handed back to the system by allocator trims",
            m.allocator_released_bytes.clone(),
        );
        registry.register(
            "fence_events",
            "Self-fencing events (no renewal committed, or the store stalled)",
            m.fence_events.clone(),
        );
        registry.register(
            "store_stalls",
            "Stalls of the store: a write without progress for a quarter of a lease (the disk stopped answering)",
            m.store_stalls.clone(),
        );
        registry.register("connections", "Live device connections", m.connections.clone());
        registry.register("snapshots_built", "Snapshots built from this node's state", m.snapshots_built.clone());
        registry.register("snapshots_installed", "Snapshots installed from a leader", m.snapshots_installed.clone());
        registry.register(
            "snapshots_deferred",
            "Snapshots the log policy asked for and this node deferred: the entries applied since its last one weighed less than it",
            m.snapshots_deferred.clone(),
        );
        registry.register("nodes_expired", "Nodes expired by sweeps this node proposed", m.nodes_expired.clone());
        registry.register("suspicions", "Members this node suspected as leader, by reason", m.suspicions.clone());
        registry.register("suspect_nodes", "Members in state suspect (out of the ring)", m.suspect_nodes.clone());
        registry.register("raft_term", "Current Raft term", m.raft_term.clone());
        registry.register("raft_is_leader", "1 if this node leads", m.raft_is_leader.clone());
        registry.register("raft_last_log_index", "Last log index", m.raft_last_log_index.clone());
        registry.register("raft_applied_index", "Last applied index", m.raft_applied_index.clone());
        registry.register("raft_commit_index", "Last known committed index", m.raft_commit_index.clone());
        registry.register("raft_apply_lag", "Committed but not yet applied entries", m.raft_apply_lag.clone());
        registry.register("members", "Raft members (voters and learners)", m.members.clone());
        registry.register("live_nodes", "Nodes in the ring", m.live_nodes.clone());
        registry.register("routes", "Device routes in the applied state", m.routes.clone());
        registry.register("ring_version", "Log index of the last live-set change", m.ring_version.clone());
        registry.register_collector(Box::new(process::ProcessCollector));
        registry.register_collector(Box::new(m.tenants.clone()));
        registry.register_collector(Box::new(writes::Collect(m.store_writes.clone())));
        registry.register("tls_handshakes", "TLS handshakes by listener and result", m.tls_handshakes.clone());
        registry.register("tls_reloads", "Certificate reloads by listener and result", m.tls_reloads.clone());
        registry.register("ups", "Device up frames (intents) by answer: ack or the nack reason", m.ups.clone());
        registry.register("upstream_attempts", "Tries sent to the upstream by result", m.upstream_attempts.clone());
        registry.register("upstream_retries", "Upstream tries after the first", m.upstream_retries.clone());
        registry.register(
            "upstream_retry_budget_exhausted",
            "Retries the retry budget refused",
            m.upstream_budget_exhausted.clone(),
        );
        registry.register(
            "upstream_deadline_exceeded",
            "Ups that reached their deadline",
            m.upstream_deadline_exceeded.clone(),
        );
        registry.register(
            "upstream_breaker_state",
            "Upstream breaker: 0 closed, 1 half-open, 2 open (ejected)",
            m.upstream_breaker.clone(),
        );
        registry.register("ups_in_flight", "Device ups in flight on this node", m.ups_in_flight.clone());
        registry.register("ups_in_flight_bytes", "Payload bytes of ups in flight", m.ups_in_flight_bytes.clone());
        registry.register(
            "publish_bytes_in_flight",
            "Bytes of the publish budget held by publishes in flight",
            m.publish_bytes_in_flight.clone(),
        );
        registry.register(
            "capacity_connections",
            "Device connections this node is designed to hold (0: undeclared)",
            m.capacity_connections.clone(),
        );
        registry.register(
            "utilization",
            "This node's connections / its declared capacity (0: undeclared); the HPA target",
            m.utilization.clone(),
        );
        registry.register(
            "cluster_utilization",
            "All connections / the declared capacity of the live nodes (0: none declared)",
            m.cluster_utilization.clone(),
        );
        registry.register(
            "new_connections_per_s",
            "New device connections accepted per second here (moving average)",
            m.new_connections_per_s.clone(),
        );
        registry.register("scaling_hint", "Scaling hint: 1 scale out, 0 steady, -1 scale in", m.scaling_hint.clone());
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}
