//! `gateway bench`: a load tool that runs N simulated devices (the [`crate::client::device`]
//! client) against a cluster and measures connects, handshake latency and, in a storm, re-homing.
//!
//! - [`stats`] the event log and the figures drawn from it (pure);
//! - [`report`] the report, as JSON and as a table;
//! - [`sys`] source addresses, pids, RSS, `/metrics`, SIGKILL;
//! - [`scenario`] the `steady` and `storm` runs.
//!
//! It sends traffic only to the `--nodes` (devices) and `--cluster` (status, drain) it is given.

pub mod report;
pub mod scenario;
pub mod stats;
pub mod sys;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand};
use tokio::time::Instant;

use super::SecretArgs;
use crate::client::device::{DeviceConfig, Event, StopReason};
use stats::{Kind, Rec};

/// `gateway bench <scenario>`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub scenario: Scenario,
}

#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// Connect --devices devices spread over --nodes, hold them --secs seconds, shut them down.
    Steady {
        #[command(flatten)]
        common: CommonArgs,
        /// Seconds to hold the devices once all are connected.
        #[arg(long, default_value_t = 10)]
        secs: u64,
    },
    /// Connect --devices devices, then drain or SIGKILL one node and measure re-homing.
    ///
    /// --kill needs the node's pid: from --kill-pid, --pid NAME=PID or a --pid-file (the tool
    /// cannot learn a pid from the cluster). --drain needs --cluster. --await-exit kills nothing:
    /// it waits for another process to kill one of the nodes whose pids it was given.
    #[command(group(ArgGroup::new("event").required(true).args(["kill", "drain", "await_exit"])))]
    Storm {
        #[command(flatten)]
        common: CommonArgs,
        /// SIGKILL this node (by name).
        #[arg(long)]
        kill: Option<String>,
        /// Drain this node (by name), through the admin API at its cluster address.
        #[arg(long)]
        drain: Option<String>,
        /// The pid to SIGKILL for --kill (overrides --pid/--pid-file).
        #[arg(long, requires = "kill")]
        kill_pid: Option<u32>,
        /// Trigger nothing: hold the devices until one of the nodes whose pid is known
        /// (--pid/--pid-file) exits, killed by someone else, then measure as for --kill from the
        /// last check that saw it alive (every 10 ms). Several loader processes, each with its own
        /// devices, can so measure one kill.
        #[arg(long)]
        await_exit: bool,
        /// With --await-exit: give up (exit 1) if no node exited within this many seconds of the
        /// devices connecting.
        #[arg(long, default_value_t = 3600, requires = "await_exit")]
        await_secs: u64,
        /// Stop measuring this long after the trigger even if devices are still out.
        #[arg(long, default_value_t = 60)]
        timeout_secs: u64,
        /// Keep the devices connected this long after the storm was measured, so that an
        /// observer can read the survivors' connections and memory with every device back.
        #[arg(long, default_value_t = 0)]
        hold_after_secs: u64,
    },
}

/// Flags of every scenario.
#[derive(Debug, Args, Clone)]
pub struct CommonArgs {
    /// Node URLs (ws://host:port, or wss:// with --ca-file), comma-separated; device i starts at
    /// node i mod k.
    #[arg(long, value_delimiter = ',', required = true)]
    pub nodes: Vec<String>,
    /// Cluster address (host:port) of any member: status, connections, drain. Optional for steady.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Devices this process runs.
    #[arg(long)]
    pub devices: u32,
    /// Index of the first device (ids are {prefix}-{first} … {prefix}-{first+devices-1}); split a
    /// large N over processes with disjoint ranges.
    #[arg(long, default_value_t = 0)]
    pub first: u32,
    /// Device id prefix.
    #[arg(long, default_value = "dev")]
    pub prefix: String,
    /// Distinct local source addresses 127.0.1.1, 127.0.1.2, … (0: let the OS pick; only used when
    /// every node is on 127.0.0.0/8).
    #[arg(long, default_value_t = 64)]
    pub sources: u32,
    /// Device-token secret file (env GATEWAY_DEVICE_SECRET holds the secret itself).
    #[arg(long, env = "GATEWAY_DEVICE_SECRET_FILE")]
    pub device_secret_file: Option<PathBuf>,
    #[command(flatten)]
    pub secret: SecretArgs,
    /// Node pids for memory figures and --kill: lines `name pid` (deploy/local-cluster.sh's pids
    /// file) or one bare pid (the --kill node's). Repeatable.
    #[arg(long)]
    pub pid_file: Vec<PathBuf>,
    /// A node pid as NAME=PID. Repeatable.
    #[arg(long)]
    pub pid: Vec<String>,
    /// Start at most this many devices per second (0: all at once).
    #[arg(long, default_value_t = 0)]
    pub ramp: u32,
    /// Device backoff base and cap in ms [default: the client's, 1000 and 30000].
    #[arg(long)]
    pub base_ms: Option<u64>,
    #[arg(long)]
    pub cap_ms: Option<u64>,
    /// Give up waiting for every device to connect after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub connect_timeout_secs: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Runtime(String),
}

/// Shared by every device task: the event log and live counters for the progress line.
pub struct Recorder {
    start: Instant,
    inner: Mutex<Inner>,
    /// Devices connected now / connected at least once.
    pub up: AtomicU32,
    pub ever: AtomicU32,
    pub attempts: AtomicU64,
    pub failures: AtomicU64,
    /// Bumped at every connect and close: a copy of the devices' nodes is stale when it moved.
    changes: AtomicU64,
    /// The longest backoff wait since [`Recorder::reset_waits`], and how many reached the cap.
    max_wait_us: AtomicU64,
    waits_at_cap: AtomicU64,
    cap_us: u64,
}

#[derive(Default)]
struct Inner {
    log: Vec<Rec>,
    node_of: Vec<Option<Arc<str>>>,
    ever: Vec<bool>,
}

impl Recorder {
    /// `cap`: the devices' backoff cap (a wait that long counts as capped).
    pub fn new(devices: usize, cap: Duration) -> Arc<Recorder> {
        Arc::new(Recorder {
            start: Instant::now(),
            inner: Mutex::new(Inner {
                log: Vec::with_capacity(devices * 4),
                node_of: vec![None; devices],
                ever: vec![false; devices],
            }),
            up: AtomicU32::new(0),
            ever: AtomicU32::new(0),
            attempts: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            max_wait_us: AtomicU64::new(0),
            waits_at_cap: AtomicU64::new(0),
            cap_us: cap.as_micros() as u64,
        })
    }

    /// Starts counting backoff waits afresh (at a storm's trigger).
    pub fn reset_waits(&self) {
        self.max_wait_us.store(0, Ordering::Relaxed);
        self.waits_at_cap.store(0, Ordering::Relaxed);
    }

    /// (longest wait, waits at the cap) since the last reset.
    pub fn waits(&self) -> (Duration, u64) {
        let max = Duration::from_micros(self.max_wait_us.load(Ordering::Relaxed));
        (max, self.waits_at_cap.load(Ordering::Relaxed))
    }

    pub fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// Runs `f` over the log so far (under the lock: keep it short).
    pub fn with_log<R>(&self, f: impl FnOnce(&[Rec]) -> R) -> R {
        f(&self.inner.lock().expect("recorder").log)
    }

    /// Devices connected to `node` now (the index in this process).
    pub fn on_node(&self, node: &str) -> Vec<u32> {
        let inner = self.inner.lock().expect("recorder");
        (0..inner.node_of.len() as u32).filter(|&i| inner.node_of[i as usize].as_deref() == Some(node)).collect()
    }

    /// The node each device is connected to now (by index in this process), and the
    /// [`Recorder::changes`] count it is current for.
    pub fn nodes(&self) -> (u64, Vec<Option<Arc<str>>>) {
        let inner = self.inner.lock().expect("recorder");
        (self.changes.load(Ordering::Relaxed), inner.node_of.clone())
    }

    /// Connects and closes so far (see [`Recorder::nodes`]).
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Connected devices per node name.
    pub fn per_node(&self) -> std::collections::BTreeMap<String, u64> {
        let mut m = std::collections::BTreeMap::new();
        for n in self.inner.lock().expect("recorder").node_of.iter().flatten() {
            *m.entry(n.to_string()).or_insert(0) += 1;
        }
        m
    }

    /// Records one event of device `i`; `dial_at` is that device's last `Dialing` instant.
    fn on(&self, i: u32, dial_at: &mut Option<Instant>, e: Event) {
        let now = Instant::now();
        let t_us = (now - self.start).as_micros() as u64;
        let kind = match e {
            Event::Dialing { .. } => {
                *dial_at = Some(now);
                self.attempts.fetch_add(1, Ordering::Relaxed);
                Kind::Dial
            }
            Event::Connected { node, .. } => {
                let latency_us = dial_at.take().map_or(0, |d| (now - d).as_micros() as u64);
                self.up.fetch_add(1, Ordering::Relaxed);
                let mut inner = self.inner.lock().expect("recorder");
                inner.node_of[i as usize] = Some(node.into());
                self.changes.fetch_add(1, Ordering::Relaxed);
                if !std::mem::replace(&mut inner.ever[i as usize], true) {
                    self.ever.fetch_add(1, Ordering::Relaxed);
                }
                inner.log.push(Rec { t_us, device: i, kind: Kind::Accept { latency_us } });
                return;
            }
            Event::Refused { status, reason, .. } => Kind::Outcome(format!("{status} {reason}")),
            Event::Redirected { .. } => Kind::Outcome("307 redirect".into()),
            Event::Stale { .. } => Kind::Outcome("409 stale_attempt".into()),
            Event::Unreachable { stage, .. } => Kind::Outcome(format!("unreachable ({stage})")),
            Event::Closed { code, .. } => {
                self.up.fetch_sub(1, Ordering::Relaxed);
                self.inner.lock().expect("recorder").node_of[i as usize] = None;
                self.changes.fetch_add(1, Ordering::Relaxed);
                Kind::Outcome(format!("closed {code}"))
            }
            Event::Stopped(StopReason::Shutdown) => return,
            Event::Stopped(r) => Kind::Outcome(format!("stopped ({r:?})")),
            Event::Waiting { delay, .. } => {
                let us = delay.as_micros() as u64;
                self.max_wait_us.fetch_max(us, Ordering::Relaxed);
                if us >= self.cap_us {
                    self.waits_at_cap.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            Event::StoreFailed { .. } | Event::Frame(_) | Event::BadFrame { .. } => return,
        };
        if kind.is_error() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.lock().expect("recorder").log.push(Rec { t_us, device: i, kind });
    }
}

/// The event callback for device `i`.
pub fn events(rec: Arc<Recorder>, i: u32) -> impl FnMut(Event) + Send {
    let mut dial_at = None;
    move |e| rec.on(i, &mut dial_at, e)
}

/// The config of device `i` (index within this process): id `{prefix}-{first+i}`, URLs rotated so
/// it starts at node `(first+i) mod k`, source address `i mod sources`.
pub fn device_config(c: &CommonArgs, i: u32, token: &str, sources: &[IpAddr]) -> DeviceConfig {
    let global = c.first + i;
    let id = format!("{}-{global}", c.prefix);
    let mut cfg = DeviceConfig::new(&c.nodes[0], &id, token, 0);
    let k = c.nodes.len();
    cfg.urls = (0..k).map(|j| c.nodes[(global as usize + j) % k].clone()).collect();
    cfg.bind = (!sources.is_empty()).then(|| sources[i as usize % sources.len()]);
    if let Some(ms) = c.base_ms {
        cfg.base = Duration::from_millis(ms);
    }
    if let Some(ms) = c.cap_ms {
        cfg.cap = Duration::from_millis(ms);
    }
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        c: CommonArgs,
    }

    #[test]
    fn devices_rotate_over_nodes_and_sources() {
        let t = T::parse_from([
            "t",
            "--nodes",
            "ws://127.0.0.1:1,ws://127.0.0.1:2,ws://127.0.0.1:3",
            "--devices",
            "9",
            "--first",
            "4",
        ]);
        let src = sys::sources(2, &t.c.nodes);
        let cfg = device_config(&t.c, 0, "tok", &src);
        assert_eq!(cfg.device, "dev-4");
        assert_eq!(cfg.urls, vec!["ws://127.0.0.1:2", "ws://127.0.0.1:3", "ws://127.0.0.1:1"]);
        assert_eq!(cfg.bind.map(|b| b.to_string()).as_deref(), Some("127.0.1.1"));
        assert_eq!(device_config(&t.c, 1, "tok", &src).bind.map(|b| b.to_string()).as_deref(), Some("127.0.1.2"));
        assert_eq!(device_config(&t.c, 1, "tok", &[]).bind, None);
    }

    #[tokio::test]
    async fn the_recorder_tracks_connections_and_latency() {
        let rec = Recorder::new(2, Duration::from_secs(30));
        let mut ev = events(rec.clone(), 1);
        ev(Event::Dialing { url: "u".into(), attempt: 1 });
        ev(Event::Refused { status: 429, reason: "rate_limited".into(), retry_after: None });
        ev(Event::Dialing { url: "u".into(), attempt: 2 });
        let c = Event::Connected { node: "n1".into(), conn: 1, route_version: 1, attempt: 2, after: Duration::ZERO };
        ev(c);
        assert_eq!((rec.up.load(Ordering::Relaxed), rec.ever.load(Ordering::Relaxed)), (1, 1));
        assert_eq!(rec.on_node("n1"), vec![1]);
        ev(Event::Closed { code: 1001, reason: String::new() });
        assert_eq!(rec.up.load(Ordering::Relaxed), 0);
        assert!(rec.on_node("n1").is_empty());
        let o = rec.with_log(|log| stats::outcomes(log, 0, u64::MAX));
        assert_eq!((o["429 rate_limited"], o["101 connected"], o["closed 1001"]), (1, 1, 1));
        assert_eq!(rec.attempts.load(Ordering::Relaxed), 2);
        assert_eq!(rec.failures.load(Ordering::Relaxed), 2);
    }
}
