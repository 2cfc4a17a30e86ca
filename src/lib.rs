//! gateway: one binary that runs a cluster of WebSocket device gateways on an embedded,
//! Raft-replicated store (openraft + redb) — no external database.
//!
//! # Codemap
//! The domain, then the layers under and above it:
//! - [`machine`] the replicated state machine as domain code: one type per command with its own
//!   reply (`Claim` → `ClaimReply`, …), the rules (claims and floors, leases, sweeps, drains,
//!   streams, the scale-in lock and declared capacity) over a small [`machine::Tables`]
//!   interface, the apply events, and the cluster event log apply records.
//! - [`store`] the node's files: `log/` (the Raft log and vote in checksummed segment files) and
//!   the redb schema of `state.redb`, whose tables are listed once (`store::schema`) for open,
//!   snapshot dump, install and clear.
//! - [`raft`] openraft adapters: type config, log store (with its in-memory tail, which the
//!   leader's replication reads) and state machine over `store`, HTTP
//!   network client, the receiving side of Raft RPC.
//! - [`view`] `ClusterView`: the applied members, leases and ring every decision reads.
//! - [`cluster`] the typed port [`cluster::Handle`] (claim, release, publish, ack, renew, route,
//!   stream, membership, status) over the batching proposer (followers forward to the leader),
//!   blocking-pool reads and openraft; `ClusterWatch`, the view on a watch channel.
//! - [`ws`] the public listener: admission, placement, handshake, sessions and their registry.
//! - [`api`] the cluster listener: Raft RPC, admin API, route lookup, claims, publishes, metrics,
//!   the status page (`/ui`: ring, members, events; the cluster secret, Basic auth on its GETs),
//!   the cluster event log and scale-in lock endpoints, the capacity signals and scaling hint;
//!   the cluster secret reaches all of it, a backend secret publishes and reads routes only.
//! - [`answer`] HTTP answers and the one mapping from a write's reply or error to status, reason
//!   and `Retry-After`, shared by [`ws`] and [`api`].
//! - [`node`] composition root: data dir, identity, secrets, stores, Raft, handle, listeners and
//!   duties (lease renewal, the leader's extend/sweep), the failure detector (suspicion, prompt
//!   elections), lifecycle (start, drain, fencing), and
//!   the allocator trim that hands a burst's freed heap back.
//! - [`server`] the accept loop both listeners share (HTTP/1, upgrades, header deadline, the TLS
//!   handshake under that deadline), request ids (`x-request-id`, a span per request), the
//!   access line, and which runtime serves a cluster connection (`spill`).
//! - [`tls`] rustls (ring) configurations from PEM files: each listener's, reloaded on SIGHUP or
//!   a changed file without touching open connections; the node's peer client (cluster CA,
//!   its own certificate for mutual TLS) and the CLI's.
//! - [`upstream`] device → backend delivery of `up` frames: in-flight bounds, one deadline per
//!   up, safe retries within a retry budget, a circuit breaker per endpoint (pure `breaker` and
//!   `budget`); the session only hands ups over and writes the answers.
//! - [`ring`] virtual-node consistent hash over live nodes, on the `hashring` crate.
//! - [`protocol`] every device wire frame and the close codes (shared by server and client).
//! - [`token`] device tokens (HS256 JWT): mint and verify; [`secrets`] secret files and env.
//! - [`wire`] JSON bodies of the admin API (status report, join/leave, membership).
//! - [`config`] flags/env/TOML → validated `Config`, and back to TOML for `check-config`; [`cli`]
//!   the command line; [`codec`] the only place that names bincode; [`clock`] the wall clock;
//!   [`http`] the pooled HTTP client; [`metrics`] the Prometheus registry.
//! - [`client`] the reconnecting device client: full-jitter backoff, dial, policy, `Device`.
//! - [`tools`] beside the server: the admin client, `gateway bench` (load tool), `plan-storm`,
//!   `probe` (the health check of the scratch image), the bootstrap guard (`serve --peers`: ask
//!   the peers before a fresh data dir bootstraps; join their cluster when one exists).
//!
//! # Architecture invariants
//! Checked on the source text by `tests/tidy.rs`:
//! - `machine` imports nothing of the crate but itself and no runtime crate (tokio, hyper,
//!   openraft, redb, …), and reads no clock: the leader's proposer stamps `at_ms` into commands.
//!   `ring`, `codec`, `config`, `protocol` likewise; `view` imports only `machine` and `ring`.
//! - `store` imports only `machine` and `codec`: it knows redb and the domain's values, not
//!   openraft. `raft` sits under `cluster` (never the reverse) and above `store`.
//! - `ws` and `api` see the cluster only through `cluster` (the port) and `view`: no `store`,
//!   `raft`, proposer, raw `Command` or crate-wide `Reply`; nor do `node::{duties, detector,
//!   lifecycle}`.
//! - `upstream` imports only `config`, `metrics` and `protocol`: the session hands it ups and
//!   writes its answers; it never sees the cluster, and never logs a payload.
//! - `tls` imports only `config` and `metrics`; `server` only `tls` and `metrics`.
//! - `client` imports only `protocol`; `tools` import no server module (`node`, `ws`, `api`,
//!   `cluster`, `raft`, `store`).
//! - No source file over 600 lines.
//!
//! Also: every redb call runs on the blocking pool; only the Raft state-machine adapter publishes
//! `ClusterView` and apply events; every task a node spawns is tracked and has a span.

pub mod answer;
pub mod api;
pub mod cli;
pub mod client;
pub mod clock;
pub mod cluster;
pub mod codec;
pub mod config;
pub mod http;
pub mod machine;
pub mod metrics;
pub mod node;
pub mod protocol;
pub mod raft;
pub mod ring;
pub mod secrets;
pub mod server;
pub mod store;
pub mod tls;
pub mod token;
pub mod tools;
pub mod upstream;
pub mod view;
pub mod wire;
pub mod ws;
