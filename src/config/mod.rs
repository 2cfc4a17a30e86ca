//! Configuration: flags, then environment (`GATEWAY_*`), then a TOML file, then defaults, merged
//! into one validated [`Config`]. Leaf module: imports nothing of the crate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod show;
pub mod tls;
pub mod upstream;
mod validate;

/// The largest `max_payload_bytes` allowed. A published message is one Raft log entry that every
/// node writes and fsyncs, and lease renewals wait behind the entries in flight: at 16 MiB a few
/// publishes held renewals for seconds and fenced nodes (tests/cluster_big_entries.rs). One such
/// entry fits in a Raft append ([`crate::http::MAX_APPEND_BYTES`]) with room to spare.
pub const MAX_PAYLOAD_LIMIT: usize = 1 << 20;

/// Most payload bytes one page of a device's `sync` reads and holds (`ws::stream::PAGE_BYTES`;
/// `node` checks that the two agree).
pub const SYNC_PAGE_BYTES: usize = 256 << 10;

/// The longest duration any `*_ms` setting may have.
pub const MAX_DURATION_MS: u64 = 1 << 40;

/// File descriptors kept out of `max_connections` when it is derived from the open-file limit:
/// Raft and admin connections, redb, logs.
pub const FD_RESERVE: usize = 1024;

impl DeviceConfig {
    /// `max_connections`, or the open-file limit (`soft`) less [`FD_RESERVE`] when it is 0.
    pub fn connection_limit(&self, soft: u64) -> usize {
        match self.max_connections {
            0 => usize::try_from(soft).unwrap_or(usize::MAX).saturating_sub(FD_RESERVE).max(1),
            n => n,
        }
    }
}

/// Every key a TOML config file may hold (`deploy/gateway.example.toml` documents each one).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub log_format: Option<LogFormat>,
    pub name: Option<String>,
    pub listen: Option<SocketAddr>,
    pub cluster_listen: Option<SocketAddr>,
    pub cluster_advertise: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub public_url: Option<String>,
    pub join: Option<String>,
    pub standby: Option<bool>,
    pub peers: Option<Vec<String>>,
    pub peers_wait_ms: Option<u64>,
    pub cluster_secret_file: Option<PathBuf>,
    pub device_secret_file: Option<PathBuf>,
    pub backend_secret_file: Option<PathBuf>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub cluster_tls_cert_file: Option<PathBuf>,
    pub cluster_tls_key_file: Option<PathBuf>,
    pub cluster_tls_ca_file: Option<PathBuf>,
    pub cluster_tls_client_auth: Option<bool>,
    pub lease_ms: Option<u64>,
    pub sweep_ms: Option<u64>,
    pub election_timeout_ms: Option<u64>,
    pub heartbeat_ms: Option<u64>,
    pub max_voters: Option<usize>,
    pub snapshot_logs: Option<u64>,
    pub store_cache_mib: Option<u64>,
    pub cluster_admit_rate: Option<f64>,
    pub cluster_admit_burst: Option<u32>,
    pub propose_timeout_ms: Option<u64>,
    pub ping_ms: Option<u64>,
    pub idle_ms: Option<u64>,
    pub admit_rate: Option<f64>,
    pub admit_burst: Option<u32>,
    pub source_rate: Option<f64>,
    pub source_burst: Option<u32>,
    pub device_reconnects: Option<u32>,
    pub device_reconnect_window_ms: Option<u64>,
    pub handshake_timeout_ms: Option<u64>,
    pub overload_commit_ms: Option<u64>,
    pub header_read_timeout_ms: Option<u64>,
    pub max_message_bytes: Option<usize>,
    pub send_queue: Option<usize>,
    pub send_queue_bytes: Option<usize>,
    pub sync_buffer_bytes: Option<usize>,
    pub max_connections: Option<usize>,
    pub device_nice: Option<i32>,
    pub drain_rate: Option<f64>,
    pub drain_timeout_ms: Option<u64>,
    pub retain_count: Option<u64>,
    pub retain_ms: Option<u64>,
    pub max_payload_bytes: Option<usize>,
    pub idempotency_ms: Option<u64>,
    pub idempotency_keys: Option<u64>,
    pub capacity_connections: Option<u64>,
    pub scale_out_utilization: Option<f64>,
    pub scale_in_utilization: Option<f64>,
    pub scale_in_after_ms: Option<u64>,
    pub scale_out_accept_share: Option<f64>,
    pub scale_out_cpu: Option<f64>,
    /// The `[upstream]` table (device `up` delivery).
    pub upstream: Option<upstream::UpstreamFile>,
}

/// Timing knobs of the cluster core; reported by `status --json` under `config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timing {
    /// How long a node's lease lasts after a renewal; nodes renew every `lease_ms / 5`.
    pub lease_ms: u64,
    /// How often the leader sweeps lapsed leases.
    pub sweep_ms: u64,
    /// Minimum election timeout; the maximum is twice this.
    pub election_timeout_ms: u64,
    pub heartbeat_ms: u64,
    /// Voters in the cluster (odd, 1..=7); later members join as learners.
    pub max_voters: usize,
    /// Build a snapshot (and purge the log) after this many entries, deferred while the entries
    /// since the last one weigh less than it (`raft::pace`).
    pub snapshot_logs: u64,
    /// Deadline for one proposed write to commit.
    pub propose_timeout_ms: u64,
}

impl Timing {
    /// openraft's `election_timeout_max`, which is also its leader lease: a voter refuses votes
    /// this long after its last AppendEntries.
    pub fn election_timeout_max_ms(&self) -> u64 {
        self.election_timeout_ms * 2
    }

    /// The soonest a voter whose leader died may start an election, after the leader's last
    /// heartbeat: the leader lease every voter honours, and a heartbeat more (another voter may
    /// have heard from the leader that much later). `node::detector::prompt_election_after` adds
    /// its jitter; `gateway bench` models a leader's death with it.
    pub fn soonest_election_ms(&self) -> u64 {
        self.election_timeout_max_ms() + self.heartbeat_ms
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_ms: 10_000,
            sweep_ms: 1_000,
            election_timeout_ms: 1_000,
            heartbeat_ms: 250,
            max_voters: 3,
            snapshot_logs: 10_000,
            propose_timeout_ms: 5_000,
        }
    }
}

/// Device-listener knobs; reported by `status --json` under `config` beside [`Timing`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceConfig {
    /// The server pings every connection this often.
    pub ping_ms: u64,
    /// A connection with no traffic from the device for this long is closed.
    pub idle_ms: u64,
    /// Handshakes admitted per second by this node's token bucket (before authentication).
    pub admit_rate: f64,
    /// Token bucket size: handshakes admitted at once after a quiet period.
    pub admit_burst: u32,
    /// Handshakes per second from one source address (an IPv6 source by its /64), before the
    /// token is read; 0 turns it off (the default: devices behind one NAT, a proxy or the load
    /// tool share an address).
    pub source_rate: f64,
    pub source_burst: u32,
    /// Handshakes one device may make per `device_reconnect_window_ms` before a 429 `flapping`
    /// (Retry-After until its next one); 0 turns it off (the default).
    pub device_reconnects: u32,
    pub device_reconnect_window_ms: u64,
    /// Deadline for a handshake's claim to commit (503 after it).
    pub handshake_timeout_ms: u64,
    /// Claim commit latency whose p99 shrinks admission (AIMD); 0 = off.
    pub overload_commit_ms: u64,
    /// Deadline for a client to send its first bytes, then again for each request head (slowloris
    /// guard).
    pub header_read_timeout_ms: u64,
    /// Largest message a device may send (close 1009 above it).
    pub max_message_bytes: usize,
    /// Commands (messages to push, replies) queued for one connection; a device whose queue
    /// fills is closed with 1013 and recovers by `sync` on its next connection.
    pub send_queue: usize,
    /// Payload bytes of messages queued for one connection (the same overflow rule); at least
    /// twice `max_payload_bytes` [default: 1 MiB, or twice `max_payload_bytes` if more].
    pub send_queue_bytes: usize,
    /// Bytes of `sync` pages this node reads and holds at once, all devices together (one page,
    /// [`SYNC_PAGE_BYTES`], at least); a page beyond it waits and the device is told `sync_busy`.
    pub sync_buffer_bytes: usize,
    /// Device connections one node holds at once (`503 at_capacity` beyond); 0 derives it from
    /// the process's open-file limit (the soft limit less [`FD_RESERVE`]).
    pub max_connections: usize,
    /// The scheduling priority (nice, 0 to 19) of the device side's threads: handshakes,
    /// sessions, their blocking pool. The cluster side (Raft, renewals, the leader's duties)
    /// stays at the process's own priority, so when the cores are saturated it runs first and a
    /// disconnect wave or a reconnect storm waits instead of the lease. 0 turns it off.
    #[serde(default)]
    pub device_nice: i32,
    /// Connections told to go away per second while draining.
    pub drain_rate: f64,
    /// Longest a drain waits for its devices to leave before releasing the rest.
    pub drain_timeout_ms: u64,
    /// Messages retained per device stream (older ones are dropped; a device syncing from
    /// before them gets `sync_gap`).
    pub retain_count: u64,
    /// Messages older than this are dropped from a stream when the next one is published.
    pub retain_ms: u64,
    /// Largest message payload a backend may publish (JSON text).
    pub max_payload_bytes: usize,
    /// How long a publish's `Idempotency-Key` is remembered (a retry within it is a duplicate,
    /// whether or not its message was acked or trimmed).
    pub idempotency_ms: u64,
    /// Most idempotency keys remembered per device (the oldest are forgotten first).
    pub idempotency_keys: u64,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            ping_ms: 20_000,
            idle_ms: 60_000,
            admit_rate: 200.0,
            admit_burst: 400,
            source_rate: 0.0,
            source_burst: 100,
            device_reconnects: 0,
            device_reconnect_window_ms: 60_000,
            handshake_timeout_ms: 3_000,
            overload_commit_ms: 750,
            header_read_timeout_ms: 5_000,
            max_message_bytes: 64 * 1024,
            send_queue: 256,
            send_queue_bytes: 1 << 20,
            sync_buffer_bytes: 16 << 20,
            max_connections: 0,
            device_nice: 10,
            drain_rate: 500.0,
            drain_timeout_ms: 30_000,
            retain_count: 1000,
            retain_ms: 86_400_000,
            max_payload_bytes: 64 * 1024,
            idempotency_ms: 86_400_000,
            idempotency_keys: 1_000,
        }
    }
}

/// Capacity and the scaling hint (`status`, `watch`, `gateway_scaling_hint`): this node's designed
/// capacity and the marks the hint compares the signals with. Reported by `status --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalingConfig {
    /// Device connections this node is designed to hold (0: undeclared, no utilization). Below
    /// `max_connections`: it is what you plan with, not the hard stop.
    pub capacity_connections: u64,
    /// Scale out when the cluster's utilization (connections / declared capacity of the live
    /// nodes), or any one node's, reaches this.
    pub scale_out_utilization: f64,
    /// Scale in only when the cluster and every node stay below this, and the cluster minus one
    /// node would stay below `scale_out_utilization`, for `scale_in_after_ms`.
    pub scale_in_utilization: f64,
    pub scale_in_after_ms: u64,
    /// Scale out when this node accepts new connections at this share of its admission rate.
    pub scale_out_accept_share: f64,
    /// Scale out when this process uses this share of the CPUs it may run on (scale in needs it
    /// below `scale_in_utilization` too).
    pub scale_out_cpu: f64,
}

impl Default for ScalingConfig {
    fn default() -> Self {
        ScalingConfig {
            capacity_connections: 0,
            scale_out_utilization: 0.75,
            scale_in_utilization: 0.30,
            scale_in_after_ms: 600_000,
            scale_out_accept_share: 0.8,
            scale_out_cpu: 0.7,
        }
    }
}

/// How the node writes its log to stderr: text for people, JSON lines (tracing-subscriber's JSON
/// formatter) for log pipelines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err("expected text or json".into()),
        }
    }
}

/// How this node enters a cluster when its data dir is fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Bootstrap a one-node cluster.
    Bootstrap,
    /// Wait to be added with `gateway join`.
    Standby,
    /// Ask the member at this cluster address to add us, retrying until we are a voter.
    Join(String),
}

/// The validated configuration of `gateway serve`.
#[derive(Debug, Clone)]
pub struct Config {
    pub log_format: LogFormat,
    pub name: Option<String>,
    pub listen: SocketAddr,
    pub cluster_listen: SocketAddr,
    /// The `host:port` other members and the CLI dial (default: `cluster_listen`).
    pub cluster_advertise: Option<String>,
    pub data_dir: PathBuf,
    pub public_url: Option<String>,
    pub start: Start,
    /// The bootstrap guard: cluster addresses asked, before a fresh data dir bootstraps, whether
    /// they already belong to a cluster (then this node joins it instead), and for how long.
    pub peers: Vec<String>,
    pub peers_wait_ms: u64,
    pub cluster_secret_file: Option<PathBuf>,
    pub device_secret_file: Option<PathBuf>,
    pub backend_secret_file: Option<PathBuf>,
    /// TLS on the device and cluster listeners (plain text when unset).
    pub tls: tls::TlsConfig,
    pub timing: Timing,
    pub device: DeviceConfig,
    pub scaling: ScalingConfig,
    /// Page cache of each redb database (log and state), in bytes: redb keeps read pages and
    /// the pages of non-durable commits there; with the state's row cache (an eighth of this) it
    /// bounds the store's share of the node's memory.
    pub store_cache_bytes: usize,
    /// The cluster admission budget (handshakes/s, burst) a bootstrapping node commits once the
    /// cluster forms, as `gateway admission set` would; ignored on an existing cluster.
    pub cluster_budget: Option<(f64, u32)>,
    pub upstream: upstream::UpstreamConfig,
}

/// Default `peers_wait_ms`: how long a guarded bootstrap keeps asking its peers.
pub const DEFAULT_PEERS_WAIT_MS: u64 = 5000;

/// Default `store_cache_mib`: `state.redb`'s page cache, plus an eighth for the state's row cache
/// (`store::state::ROW_CACHE_SHARE`), so the state holds at most 1 1/8 × this (the log's files
/// are not cached by the node: see `store::log`).
pub const DEFAULT_STORE_CACHE_MIB: u64 = 256;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {source}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Reads a TOML config file.
pub fn load_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.into(), source: Box::new(source) })
}

impl Config {
    /// Merges `flags` (clap already folded the environment into them) over `file` over defaults.
    pub fn merge(flags: FileConfig, file: FileConfig) -> Result<Config, ConfigError> {
        let d = Timing::default();
        let timing = Timing {
            lease_ms: flags.lease_ms.or(file.lease_ms).unwrap_or(d.lease_ms),
            sweep_ms: flags.sweep_ms.or(file.sweep_ms).unwrap_or(d.sweep_ms),
            election_timeout_ms: flags
                .election_timeout_ms
                .or(file.election_timeout_ms)
                .unwrap_or(d.election_timeout_ms),
            heartbeat_ms: flags.heartbeat_ms.or(file.heartbeat_ms).unwrap_or(d.heartbeat_ms),
            max_voters: flags.max_voters.or(file.max_voters).unwrap_or(d.max_voters),
            snapshot_logs: flags.snapshot_logs.or(file.snapshot_logs).unwrap_or(d.snapshot_logs),
            propose_timeout_ms: flags.propose_timeout_ms.or(file.propose_timeout_ms).unwrap_or(d.propose_timeout_ms),
        };
        let dd = DeviceConfig::default();
        let mut device = DeviceConfig {
            ping_ms: flags.ping_ms.or(file.ping_ms).unwrap_or(dd.ping_ms),
            idle_ms: flags.idle_ms.or(file.idle_ms).unwrap_or(dd.idle_ms),
            admit_rate: flags.admit_rate.or(file.admit_rate).unwrap_or(dd.admit_rate),
            admit_burst: flags.admit_burst.or(file.admit_burst).unwrap_or(dd.admit_burst),
            source_rate: flags.source_rate.or(file.source_rate).unwrap_or(dd.source_rate),
            source_burst: flags.source_burst.or(file.source_burst).unwrap_or(dd.source_burst),
            device_reconnects: flags.device_reconnects.or(file.device_reconnects).unwrap_or(dd.device_reconnects),
            device_reconnect_window_ms: flags
                .device_reconnect_window_ms
                .or(file.device_reconnect_window_ms)
                .unwrap_or(dd.device_reconnect_window_ms),
            // A claim parks through a leader election (the proposer waits for the next leader):
            // by default long enough for an openraft election (up to ~4 election timeouts).
            handshake_timeout_ms: flags.handshake_timeout_ms.or(file.handshake_timeout_ms).unwrap_or(
                dd.handshake_timeout_ms.max(timing.election_timeout_ms.saturating_mul(4).saturating_add(1_000)),
            ),
            overload_commit_ms: 0, // derived below from the handshake timeout
            header_read_timeout_ms: flags
                .header_read_timeout_ms
                .or(file.header_read_timeout_ms)
                .unwrap_or(dd.header_read_timeout_ms),
            max_message_bytes: flags.max_message_bytes.or(file.max_message_bytes).unwrap_or(dd.max_message_bytes),
            send_queue: flags.send_queue.or(file.send_queue).unwrap_or(dd.send_queue),
            send_queue_bytes: flags.send_queue_bytes.or(file.send_queue_bytes).unwrap_or_else(|| {
                let payload = flags.max_payload_bytes.or(file.max_payload_bytes).unwrap_or(dd.max_payload_bytes);
                dd.send_queue_bytes.max(payload.saturating_mul(2))
            }),
            sync_buffer_bytes: flags.sync_buffer_bytes.or(file.sync_buffer_bytes).unwrap_or(dd.sync_buffer_bytes),
            max_connections: flags.max_connections.or(file.max_connections).unwrap_or(dd.max_connections),
            device_nice: flags.device_nice.or(file.device_nice).unwrap_or(dd.device_nice),
            drain_rate: flags.drain_rate.or(file.drain_rate).unwrap_or(dd.drain_rate),
            drain_timeout_ms: flags.drain_timeout_ms.or(file.drain_timeout_ms).unwrap_or(dd.drain_timeout_ms),
            retain_count: flags.retain_count.or(file.retain_count).unwrap_or(dd.retain_count),
            retain_ms: flags.retain_ms.or(file.retain_ms).unwrap_or(dd.retain_ms),
            max_payload_bytes: flags.max_payload_bytes.or(file.max_payload_bytes).unwrap_or(dd.max_payload_bytes),
            idempotency_ms: flags.idempotency_ms.or(file.idempotency_ms).unwrap_or(dd.idempotency_ms),
            idempotency_keys: flags.idempotency_keys.or(file.idempotency_keys).unwrap_or(dd.idempotency_keys),
        };
        // A p99 commit above a quarter of the handshake deadline leaves little room for anything
        // else a handshake waits on (a forward, an election): shed before the deadline is hit.
        device.overload_commit_ms =
            flags.overload_commit_ms.or(file.overload_commit_ms).unwrap_or(device.handshake_timeout_ms / 4);
        let ds = ScalingConfig::default();
        let scaling = ScalingConfig {
            capacity_connections: flags
                .capacity_connections
                .or(file.capacity_connections)
                .unwrap_or(ds.capacity_connections),
            scale_out_utilization: flags
                .scale_out_utilization
                .or(file.scale_out_utilization)
                .unwrap_or(ds.scale_out_utilization),
            scale_in_utilization: flags
                .scale_in_utilization
                .or(file.scale_in_utilization)
                .unwrap_or(ds.scale_in_utilization),
            scale_in_after_ms: flags.scale_in_after_ms.or(file.scale_in_after_ms).unwrap_or(ds.scale_in_after_ms),
            scale_out_accept_share: flags
                .scale_out_accept_share
                .or(file.scale_out_accept_share)
                .unwrap_or(ds.scale_out_accept_share),
            scale_out_cpu: flags.scale_out_cpu.or(file.scale_out_cpu).unwrap_or(ds.scale_out_cpu),
        };
        let tls = tls::TlsConfig::merge(&flags, &file)?;
        let join = flags.join.or(file.join);
        let standby = flags.standby.or(file.standby).unwrap_or(false);
        let start = match (join, standby) {
            (Some(_), true) => return Err(ConfigError::Invalid("--join and --standby exclude each other".into())),
            (Some(addr), false) => Start::Join(addr),
            (None, true) => Start::Standby,
            (None, false) => Start::Bootstrap,
        };
        let peers = flags.peers.or(file.peers).unwrap_or_default();
        if !peers.is_empty() && start != Start::Bootstrap {
            return Err(ConfigError::Invalid(
                "peers guards a bootstrap: it does not go with --join or --standby".into(),
            ));
        }
        let cache_mib = flags.store_cache_mib.or(file.store_cache_mib).unwrap_or(DEFAULT_STORE_CACHE_MIB);
        if !(1..=1 << 20).contains(&cache_mib) {
            return Err(ConfigError::Invalid(format!("store_cache_mib ({cache_mib}) must be in 1..=1048576")));
        }
        let cfg = Config {
            log_format: flags.log_format.or(file.log_format).unwrap_or_default(),
            name: flags.name.or(file.name),
            listen: flags.listen.or(file.listen).unwrap_or_else(|| "127.0.0.1:8080".parse().expect("literal")),
            cluster_listen: flags
                .cluster_listen
                .or(file.cluster_listen)
                .unwrap_or_else(|| "127.0.0.1:7070".parse().expect("literal")),
            cluster_advertise: flags.cluster_advertise.or(file.cluster_advertise),
            data_dir: flags.data_dir.or(file.data_dir).unwrap_or_else(|| PathBuf::from("gateway-data")),
            public_url: flags.public_url.or(file.public_url),
            start,
            peers,
            peers_wait_ms: flags.peers_wait_ms.or(file.peers_wait_ms).unwrap_or(DEFAULT_PEERS_WAIT_MS),
            cluster_secret_file: flags.cluster_secret_file.or(file.cluster_secret_file),
            device_secret_file: flags.device_secret_file.or(file.device_secret_file),
            backend_secret_file: flags.backend_secret_file.or(file.backend_secret_file),
            tls,
            timing,
            device,
            scaling,
            store_cache_bytes: (cache_mib << 20) as usize,
            cluster_budget: match (
                flags.cluster_admit_rate.or(file.cluster_admit_rate),
                flags.cluster_admit_burst.or(file.cluster_admit_burst),
            ) {
                (None, None) => None,
                (Some(rate), Some(burst)) if (0.01..=1e9).contains(&rate) && burst > 0 => Some((rate, burst)),
                (rate, burst) => {
                    return Err(ConfigError::Invalid(format!(
                        "cluster_admit_rate ({rate:?}) and cluster_admit_burst ({burst:?}) go together: a rate \
                         from 0.01 to 1e9 handshakes/s and a burst of at least 1"
                    )))
                }
            },
            upstream: upstream::UpstreamConfig::merge(flags.upstream, file.upstream)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The cluster address other members and the CLI use to reach this node.
    pub fn cluster_addr(&self) -> String {
        self.cluster_advertise.clone().unwrap_or_else(|| self.cluster_listen.to_string())
    }

    /// The URL devices use, defaulting to the public listener (`wss://` with TLS).
    pub fn public_url(&self) -> String {
        let scheme = if self.tls.device.is_some() { "wss" } else { "ws" };
        self.public_url.clone().unwrap_or_else(|| format!("{scheme}://{}", self.listen))
    }
}

pub use validate::{is_cluster_addr, is_host_port, is_node_name, is_public_url};

#[cfg(test)]
mod tests;
