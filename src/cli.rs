//! The command line (design §7): clap derive, doc comments are the `--help` text.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

use crate::config::FileConfig;
use crate::tools::plan::{Admission, Jitter, StormModel};
pub use crate::tools::SecretArgs;

pub mod upstream;

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
    /// The cluster-wide handshake admission budget, shared evenly by the live nodes.
    #[command(subcommand)]
    Admission(AdmissionCommand),
    /// Tenant quotas: a connection cap and publishes per period, kept as a replicated ledger.
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// Drain a node (as SIGTERM does): refuse handshakes, leave the ring, move its devices away, exit.
    Drain {
        /// Cluster address (host:port) of the node to drain.
        #[arg(long)]
        node: String,
        /// Wait until the node has drained and exited, printing progress.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Mint a device token (HS256 JWT: sub = device id, epoch = install epoch) with the device secret.
    Token {
        /// Device id: 1-128 characters of [A-Za-z0-9._:@-].
        #[arg(long)]
        device: String,
        /// Install epoch; a reinstalled device gets a higher one, so its claims beat the old install's.
        #[arg(long, default_value_t = 0)]
        epoch: u64,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 86_400)]
        ttl: u64,
        /// The device's tenant (1-64 characters of [A-Za-z0-9._-]): its quotas apply.
        #[arg(long)]
        tenant: Option<String>,
        /// Device-token secret file (env GATEWAY_DEVICE_SECRET holds the secret itself).
        #[arg(long, env = "GATEWAY_DEVICE_SECRET_FILE")]
        device_secret_file: Option<PathBuf>,
        /// Data dir whose generated `device.secret` to use when no secret is given.
        #[arg(long, env = "GATEWAY_DATA_DIR", default_value = "gateway-data")]
        data_dir: PathBuf,
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
    /// Model a reconnect storm: attempts, peak load and time until every device is back.
    ///
    /// A pure, seeded, discrete-time model (no network) for capacity planning:
    ///
    /// - Time advances in slots of --slot-ms. Attempt times are rounded up to a slot start and
    ///   every reported time is a slot start, so figures are upper bounds by less than a slot.
    /// - All --devices drop at t = 0. With --initial-jitter on each first attempt is uniform in
    ///   [0, base] (integer ms); with off, everyone attempts in slot 0.
    /// - Device i belongs to node i mod --nodes (round-robin); only that node admits it.
    /// - Admission is either a token bucket per node (--rate, --burst, --nodes): each bucket
    ///   starts full with `burst` tokens and refills continuously at `rate` per second, capped
    ///   at `burst` (accounted exactly in thousandths of a token, so fractions carry over; an
    ///   admission takes a whole token); or a fixed capacity (--per-slot C): at most C
    ///   admissions per slot across the cluster, unused capacity lost.
    /// - Within a slot, devices with the most failures so far are admitted first, until the
    ///   capacity runs out; the rest are refused.
    /// - After its n-th refusal (n = 0 first) a device waits d ms: --jitter none, exactly
    ///   min(cap, base*2^n); --jitter full, uniform in [0, min(cap, base*2^n)]; then
    ///   d = max(d, R s) with R = --retry-after-s, the Retry-After sent on every refusal.
    ///   Its retry falls in the first slot starting at or after t + d, never in the slot that
    ///   refused it.
    /// - `gateway serve` is the token-bucket case (--admit-rate, --admit-burst per node) and
    ///   sends Retry-After = time to its next token rounded up to whole seconds, at least 1:
    ///   that is 1 s for any rate of at least 1/s, hence the default R = 1 with --rate.
    /// - The run ends when every device is connected, or after --max-seconds.
    ///
    /// With --jitter none and --initial-jitter off the result does not depend on --seed.
    /// Output: total attempts and refusals, peak attempts in one slot and in one second, the
    /// times 50 %, 99 % and 100 % of the devices were connected, and when the last one got in.
    #[command(verbatim_doc_comment)]
    PlanStorm(PlanStormArgs),
    /// Load tool: run N simulated devices against a cluster (steady, or a kill/drain storm) and
    /// report connect rate, handshake latency, outcomes, re-homing and server memory.
    Bench(crate::tools::bench::BenchArgs),
}

/// `gateway serve` flags; every one also reads `GATEWAY_<NAME>` and the TOML file given by --config.
/// `gateway admission ...`
#[derive(Debug, Subcommand)]
pub enum AdmissionCommand {
    /// Set the budget: the cluster admits about `rate` handshakes per second (`burst` at once),
    /// each live node `rate / live`, recomputed when the ring changes.
    Set {
        /// Cluster address (host:port) of any member.
        #[arg(long)]
        cluster: String,
        /// Handshakes per second for the whole cluster (0.01 to 1e9).
        #[arg(long)]
        rate: f64,
        /// Handshakes at once for the whole cluster.
        #[arg(long)]
        burst: u32,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Drop the budget: each node goes back to its own --admit-rate and --admit-burst.
    Clear {
        #[arg(long)]
        cluster: String,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Show the budget and the answering node's share.
    Show {
        #[arg(long)]
        cluster: String,
        #[command(flatten)]
        secret: SecretArgs,
    },
}

/// `gateway quota ...`
#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Set a tenant's plan (a new revision; what this period used carries on). Omitted limits
    /// are unlimited.
    Set {
        #[arg(long)]
        cluster: String,
        #[arg(long)]
        tenant: String,
        /// Concurrent connections of the tenant's devices, cluster-wide (403 quota_exhausted beyond).
        #[arg(long)]
        max_connections: Option<u64>,
        /// Publishes to the tenant's devices per period (429 quota_exhausted beyond, until the
        /// period ends; 403 when 0).
        #[arg(long, requires = "period_ms")]
        publishes: Option<u64>,
        /// The period of --publishes, in ms of cluster time (86400000 = a day).
        #[arg(long, requires = "publishes")]
        period_ms: Option<u64>,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Grant a tenant more publishes for the current period, once per --id (a retry counts once).
    Grant {
        #[arg(long)]
        cluster: String,
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        publishes: u64,
        /// An id for this grant (1-64 characters of [A-Za-z0-9._-]), e.g. a ticket number.
        #[arg(long)]
        id: String,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Show a tenant's plan, usage this period and its last ledger entries.
    Show {
        #[arg(long)]
        cluster: String,
        #[arg(long)]
        tenant: String,
        /// Print the JSON answer.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        secret: SecretArgs,
    },
}

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
    /// Cluster listener: Raft RPC, admin API, /metrics [default: 127.0.0.1:7070].
    #[arg(long, env = "GATEWAY_CLUSTER_LISTEN")]
    pub cluster_listen: Option<SocketAddr>,
    /// The host:port other members and the CLI dial to reach this node's cluster listener (a DNS
    /// name is resolved at each connection) [default: --cluster-listen; required when that is a
    /// wildcard such as 0.0.0.0].
    #[arg(long, env = "GATEWAY_CLUSTER_ADVERTISE")]
    pub cluster_advertise: Option<String>,
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
    /// Backend secrets file: one or two secrets, one per line (a rotation overlaps), re-read
    /// every second; they publish and read routes, nothing else [default: <data dir>/backend.secret,
    /// generated]. Env GATEWAY_BACKEND_SECRET holds the secrets themselves, comma-separated.
    #[arg(long, env = "GATEWAY_BACKEND_SECRET_FILE")]
    pub backend_secret_file: Option<PathBuf>,
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
    /// Cluster admission budget committed when this node bootstraps a cluster (as `gateway
    /// admission set --rate`); ignored on an existing cluster. Needs --cluster-admit-burst.
    #[arg(long, env = "GATEWAY_CLUSTER_ADMIT_RATE")]
    pub cluster_admit_rate: Option<f64>,
    /// Burst of that budget, for the whole cluster.
    #[arg(long, env = "GATEWAY_CLUSTER_ADMIT_BURST")]
    pub cluster_admit_burst: Option<u32>,
    /// Page cache of each store database (log, state) in MiB: bounds the store's memory [default: 256].
    #[arg(long, env = "GATEWAY_STORE_CACHE_MIB")]
    pub store_cache_mib: Option<u64>,
    /// Deadline for a write to commit [default: 5000].
    #[arg(long, env = "GATEWAY_PROPOSE_TIMEOUT_MS")]
    pub propose_timeout_ms: Option<u64>,
    /// Ping period for device connections [default: 20000].
    #[arg(long, env = "GATEWAY_PING_MS")]
    pub ping_ms: Option<u64>,
    /// Close a device connection after this long without traffic [default: 60000].
    #[arg(long, env = "GATEWAY_IDLE_MS")]
    pub idle_ms: Option<u64>,
    /// Handshakes admitted per second by this node, before authentication [default: 200].
    #[arg(long, env = "GATEWAY_ADMIT_RATE")]
    pub admit_rate: Option<f64>,
    /// Handshakes admitted at once after a quiet period [default: 400].
    #[arg(long, env = "GATEWAY_ADMIT_BURST")]
    pub admit_burst: Option<u32>,
    /// Handshakes per second from one source address (IPv6 by /64), before the token is read;
    /// 0 = off [default: 0: devices behind a NAT or proxy share an address].
    #[arg(long, env = "GATEWAY_SOURCE_RATE")]
    pub source_rate: Option<f64>,
    /// Handshakes at once from one source address [default: 100].
    #[arg(long, env = "GATEWAY_SOURCE_BURST")]
    pub source_burst: Option<u32>,
    /// Handshakes one device may make per --device-reconnect-window-ms before 429 flapping;
    /// 0 = off [default: 0].
    #[arg(long, env = "GATEWAY_DEVICE_RECONNECTS")]
    pub device_reconnects: Option<u32>,
    /// The window of --device-reconnects [default: 60000].
    #[arg(long, env = "GATEWAY_DEVICE_RECONNECT_WINDOW_MS")]
    pub device_reconnect_window_ms: Option<u64>,
    /// Deadline for a handshake's claim to commit, parked through a leader election
    /// [default: max(3000, 4 × election timeout + 1000)].
    #[arg(long, env = "GATEWAY_HANDSHAKE_TIMEOUT_MS")]
    pub handshake_timeout_ms: Option<u64>,
    /// Claim commit latency (p99 over windows this long) above which the share of handshakes
    /// admitted halves (503 overloaded), recovering 10 % per window below it; 0 = off
    /// [default: handshake timeout / 4].
    #[arg(long, env = "GATEWAY_OVERLOAD_COMMIT_MS")]
    pub overload_commit_ms: Option<u64>,
    /// Deadline for a client to send its request headers [default: 5000].
    #[arg(long, env = "GATEWAY_HEADER_READ_TIMEOUT_MS")]
    pub header_read_timeout_ms: Option<u64>,
    /// Largest message a device may send [default: 65536].
    #[arg(long, env = "GATEWAY_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<usize>,
    /// Commands (pushes, replies) queued per connection; a device whose queue fills is closed
    /// with 1013 and syncs on its next connection [default: 256].
    #[arg(long, env = "GATEWAY_SEND_QUEUE")]
    pub send_queue: Option<usize>,
    /// Payload bytes of pushes queued per connection, at least twice --max-payload-bytes
    /// [default: 1048576, or twice --max-payload-bytes if more].
    #[arg(long, env = "GATEWAY_SEND_QUEUE_BYTES")]
    pub send_queue_bytes: Option<usize>,
    /// Bytes of `sync` pages this node reads and holds at once, all devices together; beyond it a
    /// sync pauses and its device gets sync_busy [default: 16777216, at least 262144].
    #[arg(long, env = "GATEWAY_SYNC_BUFFER_BYTES")]
    pub sync_buffer_bytes: Option<usize>,
    /// Device connections this node holds at once (503 at_capacity beyond) [default: the
    /// open-file limit less 1024].
    #[arg(long, env = "GATEWAY_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Connections told to go away per second while draining [default: 500].
    #[arg(long, env = "GATEWAY_DRAIN_RATE")]
    pub drain_rate: Option<f64>,
    /// Longest a drain waits for devices to leave [default: 30000].
    #[arg(long, env = "GATEWAY_DRAIN_TIMEOUT_MS")]
    pub drain_timeout_ms: Option<u64>,
    /// Messages retained per device stream [default: 1000].
    #[arg(long, env = "GATEWAY_RETAIN_COUNT")]
    pub retain_count: Option<u64>,
    /// Age after which messages leave a stream [default: 86400000].
    #[arg(long, env = "GATEWAY_RETAIN_MS")]
    pub retain_ms: Option<u64>,
    /// Largest payload a backend may publish [default: 65536].
    #[arg(long, env = "GATEWAY_MAX_PAYLOAD_BYTES")]
    pub max_payload_bytes: Option<usize>,
    /// How long a publish's Idempotency-Key is remembered, acked or not [default: 86400000].
    #[arg(long, env = "GATEWAY_IDEMPOTENCY_MS")]
    pub idempotency_ms: Option<u64>,
    /// Most Idempotency-Keys remembered per device, oldest forgotten first [default: 1000].
    #[arg(long, env = "GATEWAY_IDEMPOTENCY_KEYS")]
    pub idempotency_keys: Option<u64>,
    #[command(flatten)]
    pub upstream: upstream::UpstreamArgs,
}

impl ServeArgs {
    /// The flag/env layer of the configuration.
    pub fn to_layer(&self) -> FileConfig {
        FileConfig {
            name: self.name.clone(),
            listen: self.listen,
            cluster_listen: self.cluster_listen,
            cluster_advertise: self.cluster_advertise.clone(),
            data_dir: self.data_dir.clone(),
            public_url: self.public_url.clone(),
            join: self.join.clone(),
            standby: self.standby.then_some(true),
            cluster_secret_file: self.cluster_secret_file.clone(),
            device_secret_file: self.device_secret_file.clone(),
            backend_secret_file: self.backend_secret_file.clone(),
            lease_ms: self.lease_ms,
            sweep_ms: self.sweep_ms,
            election_timeout_ms: self.election_timeout_ms,
            heartbeat_ms: self.heartbeat_ms,
            max_voters: self.max_voters,
            snapshot_logs: self.snapshot_logs,
            store_cache_mib: self.store_cache_mib,
            cluster_admit_rate: self.cluster_admit_rate,
            cluster_admit_burst: self.cluster_admit_burst,
            propose_timeout_ms: self.propose_timeout_ms,
            ping_ms: self.ping_ms,
            idle_ms: self.idle_ms,
            admit_rate: self.admit_rate,
            admit_burst: self.admit_burst,
            source_rate: self.source_rate,
            source_burst: self.source_burst,
            device_reconnects: self.device_reconnects,
            device_reconnect_window_ms: self.device_reconnect_window_ms,
            handshake_timeout_ms: self.handshake_timeout_ms,
            overload_commit_ms: self.overload_commit_ms,
            header_read_timeout_ms: self.header_read_timeout_ms,
            max_message_bytes: self.max_message_bytes,
            send_queue: self.send_queue,
            send_queue_bytes: self.send_queue_bytes,
            sync_buffer_bytes: self.sync_buffer_bytes,
            max_connections: self.max_connections,
            drain_rate: self.drain_rate,
            drain_timeout_ms: self.drain_timeout_ms,
            retain_count: self.retain_count,
            retain_ms: self.retain_ms,
            max_payload_bytes: self.max_payload_bytes,
            idempotency_ms: self.idempotency_ms,
            idempotency_keys: self.idempotency_keys,
            upstream: Some(self.upstream.to_layer()),
        }
    }
}

/// `gateway plan-storm` flags; the model is described in the subcommand's `--help`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("admission").required(true).args(["rate", "per_slot", "cluster_rate"])))]
pub struct PlanStormArgs {
    /// Devices that drop at t = 0.
    #[arg(long)]
    pub devices: u32,
    /// Token bucket: handshakes admitted per second by each node.
    #[arg(long, requires = "burst", value_parser = clap::value_parser!(u64).range(1..))]
    pub rate: Option<u64>,
    /// Token bucket: tokens each node's bucket holds (and starts with).
    #[arg(long, requires = "rate", value_parser = clap::value_parser!(u64).range(1..))]
    pub burst: Option<u64>,
    /// Token bucket: number of nodes, each with its own bucket.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub nodes: u32,
    /// Cluster budget (as `gateway admission set`): handshakes per second for the whole
    /// cluster, each of --nodes buckets refilling at its share, rate / nodes.
    #[arg(long, requires = "cluster_burst", conflicts_with_all = ["rate", "burst"], value_parser = positive_rate)]
    pub cluster_rate: Option<f64>,
    /// Cluster budget: burst for the whole cluster, each bucket holding ceil(burst / nodes).
    #[arg(long, requires = "cluster_rate", value_parser = clap::value_parser!(u32).range(1..))]
    pub cluster_burst: Option<u32>,
    /// Fixed capacity: admissions per slot across the whole cluster.
    #[arg(long, conflicts_with_all = ["rate", "burst", "nodes", "cluster_rate"], value_parser = clap::value_parser!(u64).range(1..))]
    pub per_slot: Option<u64>,
    /// Length of a time step (and of the --per-slot window).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub slot_ms: u64,
    /// Client backoff base.
    #[arg(long, default_value_t = 1000)]
    pub base_ms: u64,
    /// Client backoff cap.
    #[arg(long, default_value_t = 30_000)]
    pub cap_ms: u64,
    /// Retry spread after a refusal.
    #[arg(long, value_enum, default_value_t = JitterArg::Full)]
    pub jitter: JitterArg,
    /// Whether the first reconnect waits uniform [0, base] (on) or happens at t = 0 (off).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub initial_jitter: Switch,
    /// `Retry-After` seconds sent with every refusal, a floor for the wait; 0 = no header
    /// [default: 1 with --rate, as `gateway serve` sends; 0 with --per-slot].
    #[arg(long)]
    pub retry_after_s: Option<u64>,
    /// Seed of the model's random draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop after this much simulated time even if devices are still out.
    #[arg(long, default_value_t = 86_400)]
    pub max_seconds: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A cluster rate as `gateway admission set` takes it: 0.01 to 1e9 handshakes per second.
fn positive_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.01..=1e9).contains(&r) => Ok(r),
        _ => Err("a rate from 0.01 to 1e9 handshakes per second".into()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JitterArg {
    None,
    Full,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

impl PlanStormArgs {
    /// The model these flags describe (clap has already rejected contradictory flags).
    pub fn to_model(&self) -> StormModel {
        let admission = match (self.per_slot, self.cluster_rate, self.rate, self.burst) {
            (Some(per_slot), ..) => Admission::PerSlot { per_slot },
            (None, Some(rate), ..) => Admission::cluster_budget(rate, self.cluster_burst.unwrap_or(1), self.nodes),
            (None, None, rate, burst) => Admission::TokenBucket {
                milli_rate_per_s: rate.unwrap_or(0).saturating_mul(1000),
                burst: burst.unwrap_or(0),
                nodes: self.nodes,
            },
        };
        StormModel {
            devices: self.devices,
            admission,
            slot_ms: self.slot_ms,
            base_ms: self.base_ms,
            cap_ms: self.cap_ms,
            jitter: match self.jitter {
                JitterArg::None => Jitter::None,
                JitterArg::Full => Jitter::Full,
            },
            initial_jitter: self.initial_jitter == Switch::On,
            retry_after_s: self.retry_after_s.unwrap_or(if self.per_slot.is_some() { 0 } else { 1 }),
            seed: self.seed,
            max_seconds: self.max_seconds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_maps_to_the_model() {
        use clap::Parser;

        use crate::tools::plan::{Admission, Jitter};
        let parse = |args: &str| Cli::try_parse_from(format!("gateway plan-storm {args}").split_whitespace());
        let model = |args: &str| match parse(args).unwrap().command {
            Command::PlanStorm(a) => a.to_model(),
            other => panic!("{other:?}"),
        };
        let m = model("--devices 5 --rate 3 --burst 2 --nodes 2");
        assert_eq!(m.admission, Admission::TokenBucket { milli_rate_per_s: 3000, burst: 2, nodes: 2 });
        assert_eq!((m.retry_after_s, m.jitter, m.initial_jitter, m.slot_ms), (1, Jitter::Full, true, 10));
        let m = model("--devices 5 --per-slot 4 --jitter none --initial-jitter off --retry-after-s 2");
        assert_eq!(m.admission, Admission::PerSlot { per_slot: 4 });
        assert_eq!((m.retry_after_s, m.jitter, m.initial_jitter), (2, Jitter::None, false));
        assert_eq!(model("--devices 5 --per-slot 4").retry_after_s, 0);
        // A cluster budget: each node at its share, as the servers split it.
        let m = model("--devices 5 --cluster-rate 500 --cluster-burst 100 --nodes 3");
        assert_eq!(m.admission, Admission::TokenBucket { milli_rate_per_s: 166_667, burst: 34, nodes: 3 });
        for bad in [
            "--rate 3 --burst 2",
            "--devices 5",
            "--devices 5 --rate 3",
            "--devices 5 --rate 3 --burst 2 --per-slot 1",
            "--devices 5 --cluster-rate 500",
            "--devices 5 --cluster-rate 500 --cluster-burst 10 --rate 3 --burst 2",
            "--devices 5 --cluster-rate 0 --cluster-burst 10",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
