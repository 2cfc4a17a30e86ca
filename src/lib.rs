//! gateway: one binary that runs a cluster of WebSocket device gateways on an embedded,
//! Raft-replicated store (openraft + redb) — no external database.
//!
//! # Codemap
//! - [`config`] flags/env/TOML → validated `Config`; [`cli`] the command line.
//! - [`codec`] the only place that names bincode (version byte + bincode 2).
//! - [`ring`] virtual-node consistent hash over live nodes.
//! - [`store`] redb tables: `log.redb` (Raft log, vote) and `state.redb` (routes, floors, leases,
//!   per-device message streams).
//! - [`raft`] openraft type config, log store, state machine, network client.
//! - [`cluster`] `ClusterView` (applied members, leases, ring) on a watch channel.
//! - [`proposer`] batching proposer: concurrent writes share one log entry; followers forward.
//! - [`api`] the cluster listener: Raft RPC, admin API, route lookup, health.
//! - [`node`] composition root: data dir, identity, secrets, Raft, duties, listeners.
//! - [`protocol`] device wire frames and close codes (shared by server and client).
//! - [`ws`] the public listener: admission, device tokens, placement, handshake, sessions.
//! - [`server`] the accept loop both listeners share (HTTP/1, upgrades, header deadline).
//! - [`admin`] HTTP client for the admin API (used by the CLI).
//! - [`client`] the device client: full-jitter backoff, dial, reconnect policy, `Device` run loop.
//! - [`bench`] `gateway bench`: the load tool (N `client` devices, steady or storm; report).
//! - [`plan`] `plan-storm`: a discrete-time reconnect-storm model for capacity planning (pure).
//!
//! # Architecture invariants
//! - `ring`, `codec` and `config` import nothing of the crate; `ring` does no I/O and reads no clock.
//! - `apply` never reads a clock: the leader's proposer stamps `at_ms` into time-dependent commands.
//! - Every redb call runs on the blocking pool.
//! - Only the state machine publishes `ClusterView`.
//! - `client` imports no server module; `client::backoff` and `plan` do no I/O and read no clock.

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
pub mod token;
pub mod tools;
pub mod view;
pub mod wire;
pub mod ws;
