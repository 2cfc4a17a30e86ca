//! The command line (design §7): clap derive, doc comments are the `--help` text.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::FileConfig;

/// gateway: a cluster of WebSocket device gateways on an embedded Raft-replicated store.
#[derive(Debug, Parser)]
#[command(name = "gateway", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a gateway node. A fresh data dir without --join/--standby bootstraps a one-node cluster.
    Serve(Box<ServeArgs>),
    /// Add the running node at --node (its cluster address) to the cluster at --cluster.
    Join {
        /// Cluster address (host:port) of any member.
        #[arg(long)]
        cluster: String,
        /// Cluster address (host:port) of the node to add (started with --standby).
        #[arg(long)]
        node: String,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Remove a member for good (by name or id).
    Leave {
        #[arg(long)]
        cluster: String,
        /// Name or id of the member to remove.
        #[arg(long)]
        node: String,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Show leader, term, indexes, members with their leases, route counts and the ring.
    Status {
        #[arg(long)]
        cluster: String,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Redraw the status view about every 250 ms until interrupted.
    Watch {
        #[arg(long)]
        cluster: String,
        /// Redraw period in milliseconds.
        #[arg(long, default_value_t = 250)]
        interval_ms: u64,
        #[command(flatten)]
        secret: SecretArgs,
    },
}

/// Where the CLI finds the cluster secret.
#[derive(Debug, Args, Clone)]
pub struct SecretArgs {
    /// File holding the cluster secret (trailing newline stripped).
    #[arg(long, env = "GATEWAY_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Data dir of a local node whose generated `cluster.secret` to use when no secret is given.
    #[arg(long, env = "GATEWAY_DATA_DIR", default_value = "gateway-data")]
    pub data_dir: PathBuf,
}

/// `gateway serve` flags; every one also reads `GATEWAY_<NAME>` and the TOML file given by --config.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file (keys as in deploy/gateway.example.toml); flags and env override it.
    #[arg(long, env = "GATEWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Unique node name in the cluster (default: derived from the node id).
    #[arg(long, env = "GATEWAY_NAME")]
    pub name: Option<String>,
    /// Public listener for devices [default: 127.0.0.1:8080].
    #[arg(long, env = "GATEWAY_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Cluster listener: Raft RPC, admin API, /metrics [default: 127.0.0.1:7070]. It is also the
    /// address other members use to reach this node.
    #[arg(long, env = "GATEWAY_CLUSTER_LISTEN")]
    pub cluster_listen: Option<SocketAddr>,
    /// Data dir (Raft log, state, identity, generated secrets) [default: ./gateway-data].
    #[arg(long, env = "GATEWAY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// URL devices use to reach this node [default: ws://<listen>].
    #[arg(long, env = "GATEWAY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// On a fresh data dir: ask the member at this cluster address to add this node.
    #[arg(long, env = "GATEWAY_JOIN", conflicts_with = "standby")]
    pub join: Option<String>,
    /// On a fresh data dir: wait to be added with `gateway join`.
    #[arg(long, env = "GATEWAY_STANDBY")]
    pub standby: bool,
    /// Cluster secret file (env GATEWAY_CLUSTER_SECRET holds the secret itself).
    #[arg(long, env = "GATEWAY_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Device-token secret file (env GATEWAY_DEVICE_SECRET holds the secret itself).
    #[arg(long, env = "GATEWAY_DEVICE_SECRET_FILE")]
    pub device_secret_file: Option<PathBuf>,
    /// Lease length; nodes renew every lease/3 [default: 10000].
    #[arg(long, env = "GATEWAY_LEASE_MS")]
    pub lease_ms: Option<u64>,
    /// Sweep period of the leader [default: 1000].
    #[arg(long, env = "GATEWAY_SWEEP_MS")]
    pub sweep_ms: Option<u64>,
    /// Minimum election timeout; the maximum is twice it [default: 1000].
    #[arg(long, env = "GATEWAY_ELECTION_TIMEOUT_MS")]
    pub election_timeout_ms: Option<u64>,
    /// Raft heartbeat interval [default: 250].
    #[arg(long, env = "GATEWAY_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// Number of voters (odd, up to 7); later members are learners [default: 3].
    #[arg(long, env = "GATEWAY_MAX_VOTERS")]
    pub max_voters: Option<usize>,
    /// Snapshot and purge the log every this many entries [default: 10000].
    #[arg(long, env = "GATEWAY_SNAPSHOT_LOGS")]
    pub snapshot_logs: Option<u64>,
    /// Deadline for a write to commit [default: 5000].
    #[arg(long, env = "GATEWAY_PROPOSE_TIMEOUT_MS")]
    pub propose_timeout_ms: Option<u64>,
}

impl ServeArgs {
    /// The flag/env layer of the configuration.
    pub fn to_layer(&self) -> FileConfig {
        FileConfig {
            name: self.name.clone(),
            listen: self.listen,
            cluster_listen: self.cluster_listen,
            data_dir: self.data_dir.clone(),
            public_url: self.public_url.clone(),
            join: self.join.clone(),
            standby: self.standby.then_some(true),
            cluster_secret_file: self.cluster_secret_file.clone(),
            device_secret_file: self.device_secret_file.clone(),
            lease_ms: self.lease_ms,
            sweep_ms: self.sweep_ms,
            election_timeout_ms: self.election_timeout_ms,
            heartbeat_ms: self.heartbeat_ms,
            max_voters: self.max_voters,
            snapshot_logs: self.snapshot_logs,
            propose_timeout_ms: self.propose_timeout_ms,
        }
    }
}
