//! The flags of `gateway serve` (and of `gateway check-config`, which parses them the same way):
//! each also reads `GATEWAY_<FLAG>`; they form the top layer of the configuration.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::config::{FileConfig, LogFormat};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file (keys as in deploy/gateway.example.toml); flags and env override it.
    #[arg(long, env = "GATEWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log lines on stderr: `text` for people or `json` (one object per line) [default: text].
    #[arg(long, env = "GATEWAY_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
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
    /// URL devices use to reach this node [default: ws://<listen>, wss:// with --tls-cert-file].
    #[arg(long, env = "GATEWAY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// On a fresh data dir: ask the member at this cluster address to add this node.
    #[arg(long, env = "GATEWAY_JOIN", conflicts_with = "standby")]
    pub join: Option<String>,
    /// On a fresh data dir: wait to be added with `gateway join`.
    #[arg(long, env = "GATEWAY_STANDBY")]
    pub standby: bool,
    /// Bootstrap guard, on a fresh data dir that would bootstrap: first ask these cluster
    /// addresses (comma-separated) whether they belong to a cluster; if one does, join it through
    /// that member instead of bootstrapping a second cluster.
    #[arg(long, env = "GATEWAY_PEERS", value_delimiter = ',', conflicts_with_all = ["join", "standby"])]
    pub peers: Option<Vec<String>>,
    /// How long the bootstrap guard keeps asking --peers before it bootstraps when none of them
    /// is in a cluster (it bootstraps sooner once every peer answered) [default: 5000].
    #[arg(long, env = "GATEWAY_PEERS_WAIT_MS")]
    pub peers_wait_ms: Option<u64>,
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
    /// Certificate chain (PEM) of the device listener: devices then dial wss:// (public URL
    /// default wss://<listen>). Reloaded on SIGHUP and when the file changes.
    #[arg(long, env = "GATEWAY_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert-file.
    #[arg(long, env = "GATEWAY_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// Certificate chain (PEM) of the cluster listener: members and the CLI dial https://; every
    /// member of a cluster must have cluster TLS. Needs --cluster-tls-key-file and --cluster-tls-ca-file.
    #[arg(long, env = "GATEWAY_CLUSTER_TLS_CERT_FILE")]
    pub cluster_tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --cluster-tls-cert-file.
    #[arg(long, env = "GATEWAY_CLUSTER_TLS_KEY_FILE")]
    pub cluster_tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) that members' certificates chain to.
    #[arg(long, env = "GATEWAY_CLUSTER_TLS_CA_FILE")]
    pub cluster_tls_ca_file: Option<PathBuf>,
    /// Mutual TLS: the cluster listener refuses clients without a certificate from
    /// --cluster-tls-ca-file, and this node presents its cluster certificate to its peers.
    #[arg(long, env = "GATEWAY_CLUSTER_TLS_CLIENT_AUTH")]
    pub cluster_tls_client_auth: bool,
    /// Lease length; nodes renew every lease/5 [default: 10000].
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
    /// Snapshot and purge the log every this many entries, deferred while the entries since the
    /// last snapshot weigh less than it [default: 10000].
    #[arg(long, env = "GATEWAY_SNAPSHOT_LOGS")]
    pub snapshot_logs: Option<u64>,
    /// Cluster admission budget committed when this node bootstraps a cluster (as `gateway
    /// admission set --rate`); ignored on an existing cluster. Needs --cluster-admit-burst.
    #[arg(long, env = "GATEWAY_CLUSTER_ADMIT_RATE")]
    pub cluster_admit_rate: Option<f64>,
    /// Burst of that budget, for the whole cluster.
    #[arg(long, env = "GATEWAY_CLUSTER_ADMIT_BURST")]
    pub cluster_admit_burst: Option<u32>,
    /// Page cache of the state database (`state.redb`) in MiB, plus an eighth of it for the state's
    /// row cache (the device rows placement reads): bounds the store's memory [default: 256].
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
    /// Deadline for a client to send its first bytes, then again for each request head [default: 5000].
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
    /// Scheduling priority (nice) of the device side's threads, 0 (off) to 19; the cluster side
    /// (Raft, lease renewals) keeps the process's own, so it runs first on saturated cores
    /// [default: 10].
    #[arg(long, env = "GATEWAY_DEVICE_NICE", allow_negative_numbers = true)]
    pub device_nice: Option<i32>,
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
    /// Device connections this node is designed to hold: status and metrics report
    /// utilization against it, and `scale-in` checks the nodes that stay can hold the cluster's
    /// connections [default: 0, undeclared].
    #[arg(long, env = "GATEWAY_CAPACITY_CONNECTIONS")]
    pub capacity_connections: Option<u64>,
    /// Scaling hint: scale out at this utilization, of the cluster or of any node [default: 0.75].
    #[arg(long, env = "GATEWAY_SCALE_OUT_UTILIZATION")]
    pub scale_out_utilization: Option<f64>,
    /// Scaling hint: scale in only below this utilization everywhere, sustained [default: 0.30].
    #[arg(long, env = "GATEWAY_SCALE_IN_UTILIZATION")]
    pub scale_in_utilization: Option<f64>,
    /// Scaling hint: how long every signal must stay low before it says scale in [default: 600000].
    #[arg(long, env = "GATEWAY_SCALE_IN_AFTER_MS")]
    pub scale_in_after_ms: Option<u64>,
    /// Scaling hint: scale out when this node accepts handshakes at this share of its admission
    /// rate [default: 0.8].
    #[arg(long, env = "GATEWAY_SCALE_OUT_ACCEPT_SHARE")]
    pub scale_out_accept_share: Option<f64>,
    /// Scaling hint: scale out when this process uses this share of its CPUs [default: 0.7].
    #[arg(long, env = "GATEWAY_SCALE_OUT_CPU")]
    pub scale_out_cpu: Option<f64>,
    #[command(flatten)]
    pub upstream: super::upstream::UpstreamArgs,
}

impl ServeArgs {
    /// The flag/env layer of the configuration.
    pub fn to_layer(&self) -> FileConfig {
        FileConfig {
            log_format: self.log_format,
            name: self.name.clone(),
            listen: self.listen,
            cluster_listen: self.cluster_listen,
            cluster_advertise: self.cluster_advertise.clone(),
            data_dir: self.data_dir.clone(),
            public_url: self.public_url.clone(),
            join: self.join.clone(),
            standby: self.standby.then_some(true),
            peers: self.peers.clone(),
            peers_wait_ms: self.peers_wait_ms,
            cluster_secret_file: self.cluster_secret_file.clone(),
            device_secret_file: self.device_secret_file.clone(),
            backend_secret_file: self.backend_secret_file.clone(),
            tls_cert_file: self.tls_cert_file.clone(),
            tls_key_file: self.tls_key_file.clone(),
            cluster_tls_cert_file: self.cluster_tls_cert_file.clone(),
            cluster_tls_key_file: self.cluster_tls_key_file.clone(),
            cluster_tls_ca_file: self.cluster_tls_ca_file.clone(),
            cluster_tls_client_auth: self.cluster_tls_client_auth.then_some(true),
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
            device_nice: self.device_nice,
            drain_rate: self.drain_rate,
            drain_timeout_ms: self.drain_timeout_ms,
            retain_count: self.retain_count,
            retain_ms: self.retain_ms,
            max_payload_bytes: self.max_payload_bytes,
            idempotency_ms: self.idempotency_ms,
            idempotency_keys: self.idempotency_keys,
            capacity_connections: self.capacity_connections,
            scale_out_utilization: self.scale_out_utilization,
            scale_in_utilization: self.scale_in_utilization,
            scale_in_after_ms: self.scale_in_after_ms,
            scale_out_accept_share: self.scale_out_accept_share,
            scale_out_cpu: self.scale_out_cpu,
            upstream: Some(self.upstream.to_layer()),
        }
    }
}
