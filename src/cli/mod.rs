//! The command line (design §7): clap derive, doc comments are the `--help` text.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

use crate::tools::plan::{Admission, Jitter, StormModel};
pub use crate::tools::SecretArgs;

mod serve;
pub mod upstream;
pub use serve::ServeArgs;

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
    /// Read the configuration exactly as `serve` would (flags, GATEWAY_* environment, --config
    /// file, defaults), check it and its secret sources, and print the configuration in force as
    /// TOML (secret values are never printed); exit 78 naming the key when it is refused.
    CheckConfig(Box<ServeArgs>),
    /// GET an http:// URL (e.g. http://127.0.0.1:7070/readyz) and exit 0 on a 2xx answer, 1
    /// otherwise: a health check for images without a shell or an HTTP client.
    Probe {
        /// The URL to fetch: http://host:port/path, or https:// with --ca-file.
        url: String,
        /// Give up (exit 1) after this long: connect, send and the whole answer.
        #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
        timeout_ms: u64,
        /// CA certificates (PEM) to trust for an https:// URL [env: the node's own
        /// GATEWAY_CLUSTER_TLS_CA_FILE, so a container health check needs no extra setting].
        #[arg(long, env = "GATEWAY_CLUSTER_TLS_CA_FILE")]
        ca_file: Option<PathBuf>,
        /// Client certificate (PEM) for a listener with mutual TLS [env: GATEWAY_CLUSTER_TLS_CERT_FILE].
        #[arg(long, env = "GATEWAY_CLUSTER_TLS_CERT_FILE", requires_all = ["client_key_file", "ca_file"])]
        client_cert_file: Option<PathBuf>,
        /// Private key (PEM) of --client-cert-file [env: GATEWAY_CLUSTER_TLS_KEY_FILE].
        #[arg(long, env = "GATEWAY_CLUSTER_TLS_KEY_FILE", requires = "client_cert_file")]
        client_key_file: Option<PathBuf>,
    },
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
    /// Remove a node serially: lock (refused while another scale-in runs, when the voters left
    /// would not keep a quorum, or when the nodes that stay lack the capacity), drain it, wait for
    /// zero connections and routes on it, remove it from the membership. Prints each step.
    ScaleIn {
        /// Cluster address (host:port) of any member.
        #[arg(long)]
        cluster: String,
        /// Name or id of the node to remove.
        #[arg(long)]
        node: String,
        /// Go ahead even if the remaining nodes' declared capacity is below the connections.
        #[arg(long)]
        force: bool,
        /// The scale-in lock lapses this long after this command last extended it (if it dies).
        #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(300..=3_600_000))]
        lock_ttl_ms: u64,
        /// Give up (releasing the lock) if the node still holds routes after this long.
        #[arg(long, default_value_t = 600_000, value_parser = clap::value_parser!(u64).range(1..))]
        timeout_ms: u64,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Print the replicated cluster event log: membership and ring changes with their trigger,
    /// connections and routes at the time, live nodes before and after, ring version.
    Events {
        #[arg(long)]
        cluster: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Keep polling and print new events as they are recorded.
        #[arg(long)]
        follow: bool,
        /// Start after this event seq.
        #[arg(long, default_value_t = 0)]
        after: u64,
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
    /// - With --paced on (the default with a token bucket), a node refusing a device promises
    ///   it the first token not yet promised to another: the next token for the first refusal,
    ///   one token (1/rate) later for each after it; the device waits exactly until then
    ///   (rounded up to whole ms). A device whose token went to a first attempt is refused
    ///   again and promised a later one.
    /// - With --paced off (or --per-slot), after its n-th refusal (n = 0 first) a device waits
    ///   d ms: --jitter none, exactly min(cap, base*2^n); --jitter full, uniform in
    ///   [0, min(cap, base*2^n)]; then d = max(d, R s) with R = --retry-after-s, the
    ///   Retry-After sent on every refusal.
    /// - Either way, a retry falls in the first slot starting at or after t + d, never in the
    ///   slot that refused it.
    /// - `gateway serve` is the token-bucket case (--admit-rate, --admit-burst per node) and
    ///   paces its refusals so (`retry_after_ms` in the 429's body), and the project's client
    ///   keeps its turn: --paced on. Its Retry-After header is that wait rounded up to whole
    ///   seconds, at least 1 (so 1 s for a turn within a second: the default R = 1 with
    ///   --rate), which is what --paced off models for a client that reads only the header.
    /// - --election-ms E models a leader's death: no handshake completes before E (rounded up
    ///   to a slot start), because every claim waits for the new leader. Admission runs as
    ///   before meanwhile, and a device admitted earlier is connected at E (its claim waits;
    ///   a server's --handshake-timeout-ms, 5 s by default, outlasts a default election). With
    ///   the default timing a voter may elect 2.25 s after the leader's last heartbeat at the
    ///   soonest (election timeout x 2 + heartbeat): `gateway bench` gives the model that.
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
    /// Whether refusals are paced (token buckets only): each refused device is told its own
    /// turn at its node's bucket and comes back then, as `gateway serve` and the project's client
    /// do. `off` models a client that reads only `Retry-After` (--retry-after-s and --jitter).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub paced: Switch,
    /// `Retry-After` seconds sent with every unpaced refusal, a floor for the wait; 0 = no
    /// header [default: 1 with --rate, as `gateway serve` sends; 0 with --per-slot].
    #[arg(long)]
    pub retry_after_s: Option<u64>,
    /// A leader's death: no handshake completes before this many ms after the drop (the
    /// election); 0 = none.
    #[arg(long, default_value_t = 0)]
    pub election_ms: u64,
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
            paced: self.paced == Switch::On && self.per_slot.is_none(),
            election_ms: self.election_ms,
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
        assert_eq!(
            (m.retry_after_s, m.jitter, m.initial_jitter, m.slot_ms, m.paced),
            (1, Jitter::Full, true, 10, true)
        );
        assert!(!model("--devices 5 --rate 3 --burst 2 --paced off").paced);
        assert_eq!((m.election_ms, model("--devices 5 --rate 3 --burst 2 --election-ms 2250").election_ms), (0, 2250));
        let m = model("--devices 5 --per-slot 4 --jitter none --initial-jitter off --retry-after-s 2");
        assert_eq!(m.admission, Admission::PerSlot { per_slot: 4 });
        assert_eq!((m.retry_after_s, m.jitter, m.initial_jitter), (2, Jitter::None, false));
        assert_eq!(model("--devices 5 --per-slot 4").retry_after_s, 0);
        assert!(!model("--devices 5 --per-slot 4").paced, "a fixed capacity has no bucket to pace");
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
