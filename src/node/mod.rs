//! Composition root: data dir → identity and secrets → stores → Raft → cluster handle, duties and
//! listeners. [`build`] assembles a node (nothing runs yet), [`Node::run`] starts every task on one
//! tracker, each in its own span, waits for a stop and winds down. Wiring only; decisions live in
//! the modules it wires (`lifecycle` for start and stop).
//!
//! Two sides: the device side (public listener, handshakes, sessions) on the process's runtime,
//! the cluster side (Raft's core and replication, the cluster listener, the proposer, renewals,
//! the leader's duties and the fence) on runtimes of its own ([`ClusterRuntime`]). A storm of
//! device handshakes then queues behind itself only: on one shared runtime, 57,000 devices
//! reconnecting after a leader kill kept the new leader's AppendEntries from being answered within
//! openraft's deadline (one heartbeat) for half a minute, nothing committed, and every survivor
//! fenced. The cluster side's runtime runs on one worker, so that a write passes from the
//! cluster listener to the proposer, Raft's core and back without waking a second thread; the
//! cluster listener's connections past its first few are served on a second runtime of two
//! workers (`crate::server::spill`).

pub mod allocator;
pub mod detector;
pub mod disk;
pub mod duties;
pub mod identity;
pub mod lifecycle;
pub mod priority;
pub mod quorum;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::api::{self, Api};
use crate::clock::ClusterClock;
use crate::cluster::proposer::Proposer;
use crate::cluster::{Handle, Parts};
use crate::config::{Config, LogFormat};
use crate::http::HttpClient;
use crate::machine::Member;
use crate::metrics::Metrics;
use crate::raft::log_store::LogStore;
use crate::raft::network::Network;
use crate::raft::state_machine::StateMachine;
use crate::raft::types::{LogId, Raft};
use crate::secrets;
use crate::store::log::LogDb;
use crate::store::state::StateDb;
use crate::tls::{ServerFiles, ServerTls};
use crate::token::Verifier;
use crate::upstream::Upstream;
use crate::ws::admission::{Admission, Keyed};
use crate::ws::overload::Overload;
use crate::ws::registry::{Limits, Registry};
use crate::ws::session::SessionConfig;
use crate::ws::sync_budget::SyncBudget;
use crate::ws::{self, Gate, Mode};

// The config's floor for --sync-buffer-bytes is one sync page as the sessions read it.
const _: () = assert!(crate::config::SYNC_PAGE_BYTES == crate::ws::stream::PAGE_BYTES);

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{0}")]
    Config(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("raft: {0}")]
    Raft(String),
    #[error("{0}")]
    Guard(#[from] crate::tools::bootguard::GuardError),
}

impl From<secrets::SecretError> for NodeError {
    fn from(e: secrets::SecretError) -> Self {
        NodeError::Config(e.to_string())
    }
}

/// Runs a node until SIGINT/SIGTERM, a drain request, or its removal from the cluster.
pub async fn serve(cfg: Config) -> Result<(), NodeError> {
    let node = build(cfg).await?;
    let span = tracing::info_span!("node", name = %node.cluster.member().name, id = node.cluster.me());
    node.run().instrument(span).await
}

/// A node assembled and bound, not yet running.
pub struct Node {
    cfg: Config,
    /// The data dir was created now (bootstrap decides on it).
    fresh: bool,
    cluster: Handle,
    gate: Arc<Gate>,
    api: Arc<Api>,
    events: crate::raft::events::EventReceiver,
    mode: watch::Sender<Mode>,
    renewed: (watch::Sender<std::time::Instant>, watch::Receiver<std::time::Instant>),
    public: TcpListener,
    cluster_listener: TcpListener,
    /// TLS of the public and the cluster listener, when configured.
    tls: (Option<Arc<ServerTls>>, Option<Arc<ServerTls>>),
    http: HttpClient,
    /// The cluster side's client (Raft RPCs, forwarded writes, probes), whose connections live on
    /// the cluster runtime.
    cluster_http: HttpClient,
    cluster_rt: ClusterRuntime,
    metrics: Arc<Metrics>,
    /// Where the secrets came from, for the start-up line.
    secret_sources: [String; 3],
    tasks: TaskTracker,
    /// Cancelled to stop every task.
    stop: CancellationToken,
    drain_requested: CancellationToken,
}

/// Opens the data dir, the stores and Raft (which starts its own tasks, as does the proposer),
/// binds both listeners and wires the handle, the device gate and the API. Listeners, duties and
/// sessions start in [`Node::run`].
pub async fn build(cfg: Config) -> Result<Node, NodeError> {
    // TLS files first: a refused one leaves no data dir behind.
    let tls_error = |e: crate::tls::TlsError| NodeError::Config(format!("invalid configuration: {e}"));
    let device_tls = cfg
        .tls
        .device
        .as_ref()
        .map(|f| ServerTls::load("public", ServerFiles::device(f)))
        .transpose()
        .map_err(tls_error)?;
    let cluster_tls = cfg
        .tls
        .cluster
        .as_ref()
        .map(|c| ServerTls::load("cluster", ServerFiles::cluster(c)))
        .transpose()
        .map_err(tls_error)?;
    let peer_client = cluster_tls.as_ref().map(|t| t.peer_client()).transpose().map_err(tls_error)?;
    identity::create_data_dir(&cfg.data_dir)?;
    if let Some(device) = disk::journalless_ext4(&cfg.data_dir) {
        tracing::warn!(data = %cfg.data_dir.display(), %device, "the data directory is on ext4 without a journal: \
            each Raft log flush also writes the segment file's inode when its modification time moved (one more \
            disk round trip on about half the flushes under load); a journaled ext4 or XFS avoids it");
    }
    let (ident, fresh) = identity::load_or_create(&cfg.data_dir, cfg.name.as_deref())?;
    let dir = &cfg.data_dir;
    let (cluster_secret, cluster_src) =
        secrets::secret("GATEWAY_CLUSTER_SECRET", cfg.cluster_secret_file.as_deref(), dir, "cluster.secret")?;
    let (device_secret, device_src) =
        secrets::secret("GATEWAY_DEVICE_SECRET", cfg.device_secret_file.as_deref(), dir, "device.secret")?;
    let (backend_secrets, backend_src) = secrets::BackendSecrets::load(cfg.backend_secret_file.as_deref(), dir)?;
    let member = Member {
        name: ident.name.as_str().into(),
        cluster_addr: cfg.cluster_addr().into(),
        public_url: cfg.public_url().into(),
    };

    let (dir, cache) = (cfg.data_dir.clone(), cfg.store_cache_bytes);
    let (log_db, (state_db, loaded)) = tokio::task::spawn_blocking(move || -> Result<_, NodeError> {
        Ok((LogDb::open::<LogId>(&dir)?, StateDb::open(&dir, cache)?))
    })
    .await
    .map_err(|e| NodeError::Raft(e.to_string()))??;
    let committed = Arc::new(AtomicU64::new(0));
    let metrics = Arc::new(Metrics::with_data_dir(&cfg.data_dir));
    let clock = Arc::new(ClusterClock::default());
    let (mut sm, view) = StateMachine::new(state_db.clone(), loaded, Some(ident.id), metrics.clone(), clock.clone())?;
    let events = sm.events();
    let t = &cfg.timing;
    let raft_config = openraft::Config {
        cluster_name: "gateway".into(),
        heartbeat_interval: t.heartbeat_ms,
        election_timeout_min: t.election_timeout_ms,
        election_timeout_max: t.election_timeout_max_ms(),
        install_snapshot_timeout: 10_000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(t.snapshot_logs),
        max_in_snapshot_log_to_keep: t.snapshot_logs.min(1000),
        ..Default::default()
    }
    .validate()
    .map_err(|e| NodeError::Config(e.to_string()))?;
    let http = HttpClient::with_tls(&cluster_secret, peer_client.clone());
    let cluster_http = HttpClient::with_tls(&cluster_secret, peer_client);
    let log = LogStore::new(log_db, committed.clone(), metrics.clone()).map_err(|e| NodeError::Raft(e.to_string()))?;
    let cluster_rt = ClusterRuntime::new()?;
    // Raft spawns its core and replication tasks on the runtime it is created on.
    let network = Network::new(cluster_http.clone());
    let raft = cluster_rt
        .handle()
        .spawn(async move { Raft::new(ident.id, Arc::new(raft_config), network, log, sm).await })
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?
        .map_err(|e| NodeError::Raft(e.to_string()))?;

    let cluster_listener = crate::server::bind(cfg.cluster_listen)
        .map_err(|source| NodeError::Bind { addr: cfg.cluster_listen, source })?;
    let public = crate::server::bind(cfg.listen).map_err(|source| NodeError::Bind { addr: cfg.listen, source })?;

    let (stop, drain_requested, tasks) = (CancellationToken::new(), CancellationToken::new(), TaskTracker::new());
    let (mode_tx, mode) = watch::channel(Mode::Starting);
    let propose_timeout = Duration::from_millis(t.propose_timeout_ms);
    let proposer = {
        let _cluster_side = cluster_rt.handle().enter();
        Proposer::spawn(
            raft.clone(),
            cluster_http.clone(),
            propose_timeout,
            metrics.clone(),
            clock.clone(),
            tasks.clone(),
            stop.clone(),
        )
    };
    let cluster = Handle::new(Parts {
        me: ident.id,
        member,
        raft,
        proposer,
        state: state_db,
        view,
        timing: t.clone(),
        committed,
        clock,
    });
    let d = &cfg.device;
    let max_sessions = d.connection_limit(open_file_limit());
    let admission = Arc::new(Admission::new(d.admit_rate, d.admit_burst, max_sessions));
    let api = Arc::new(Api {
        cluster: cluster.clone(),
        admission: admission.clone(),
        device: cfg.device.clone(),
        secret: Arc::new(cluster_secret),
        backend: backend_secrets,
        http: http.clone(),
        metrics: metrics.clone(),
        stop: stop.clone(),
        mode: mode.clone(),
        drain: drain_requested.clone(),
        ui_events: Arc::default(),
        scaling: Arc::default(),
        tasks: tasks.clone(),
        publishes: crate::api::PublishBudget::new(cfg.device.max_payload_bytes),
    });
    let upstream =
        Upstream::new(cfg.upstream.clone(), metrics.clone(), tasks.clone(), stop.clone()).map_err(NodeError::Config)?;
    let gate = Arc::new(Gate {
        cluster: cluster.clone(),
        admission,
        reported: Default::default(),
        overload: Overload::new(Duration::from_millis(d.overload_commit_ms), std::time::Instant::now()),
        sources: (d.source_rate > 0.0).then(|| Keyed::new(d.source_rate, d.source_burst, KEYED_WIDTH)),
        devices: (d.device_reconnects > 0).then(|| {
            let per_s = f64::from(d.device_reconnects) * 1000.0 / d.device_reconnect_window_ms as f64;
            Keyed::new(per_s, d.device_reconnects, KEYED_WIDTH)
        }),
        verifier: Verifier::new(&device_secret),
        mode,
        registry: Registry::new(Limits { max_sessions, queue: d.send_queue, queue_bytes: d.send_queue_bytes }),
        handshake_timeout: Duration::from_millis(d.handshake_timeout_ms),
        header_read_timeout: Duration::from_millis(d.header_read_timeout_ms),
        session: SessionConfig {
            ping_ms: d.ping_ms,
            idle_ms: d.idle_ms,
            max_message_bytes: d.max_message_bytes,
            send_queue: d.send_queue,
            send_queue_bytes: d.send_queue_bytes,
            pings_sent: metrics.pings_sent.clone(),
            pongs_received: metrics.pongs_received.clone(),
        },
        sync_pages: SyncBudget::new(d.sync_buffer_bytes, metrics.sync_pages.clone()),
        upstream,
        metrics: metrics.clone(),
        unreleased: ws::unreleased::Unreleased::new(ws::unreleased::max_bytes(max_sessions)),
        tasks: tasks.clone(),
    });
    Ok(Node {
        fresh,
        cluster,
        gate,
        api,
        events,
        mode: mode_tx,
        renewed: watch::channel(std::time::Instant::now()),
        public,
        cluster_listener,
        tls: (device_tls, cluster_tls),
        http,
        cluster_http,
        cluster_rt,
        metrics,
        secret_sources: [cluster_src, device_src, backend_src],
        tasks,
        stop,
        drain_requested,
        cfg,
    })
}

impl Node {
    /// Starts every task, joins or bootstraps as configured, and runs until a stop; then drains
    /// (or says goodbye when removed), stops Raft and waits for the tasks. Fails when the
    /// bootstrap guard refuses to start.
    pub async fn run(self) -> Result<(), NodeError> {
        let Node { cfg, fresh, cluster, gate, api, events, mode, renewed, public, cluster_listener, tls, .. } = self;
        let (tasks, stop, t) = (self.tasks, self.stop, &cfg.timing);
        let spawn = |name: &'static str, task: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>| {
            tasks.spawn(task.instrument(tracing::info_span!("task", name)));
        };
        let cluster_side = self.cluster_rt.handle().clone();
        let spawn_cluster =
            |name: &'static str, task: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>| {
                tasks.spawn_on(task.instrument(tracing::info_span!("task", name)), &cluster_side);
            };
        let conns = TaskTracker::new();
        let ui_events = api::ui::events::record(cluster.clone(), api.ui_events.clone(), stop.clone());
        spawn("ui-events", Box::pin(ui_events));
        let scaling = api::scaling::follow(
            cluster.watch(),
            cfg.scaling.clone(),
            api.scaling.clone(),
            self.metrics.clone(),
            stop.clone(),
        );
        spawn("scaling", Box::pin(scaling));
        let handshakes = self.metrics.tls_handshakes.clone();
        let on = |t: &Option<Arc<ServerTls>>| {
            t.clone().map(|config| crate::server::Tls { config, handshakes: handshakes.clone() })
        };
        let (public_tls, cluster_tls) = (on(&tls.0), on(&tls.1));
        let cluster_scheme = if cluster_tls.is_some() { "https://" } else { "" };
        // Always: it also keeps SIGHUP from stopping a node without TLS.
        let reloading: Vec<_> = [tls.0, tls.1].into_iter().flatten().collect();
        let reloads = self.metrics.tls_reloads.clone();
        spawn("tls-reload", Box::pin(crate::tls::reload::run(reloading, reloads, stop.clone())));
        let spill = Some(self.cluster_rt.spill());
        let cluster_api = api::run(cluster_listener, cluster_tls, api, conns.clone(), stop.clone(), spill);
        spawn_cluster("cluster-listener", Box::pin(cluster_api));
        spawn("public-listener", Box::pin(ws::run(public, public_tls, gate.clone(), conns.clone(), stop.clone())));
        spawn("enforce-routes", Box::pin(ws::enforce_routes(gate.clone(), events, stop.clone())));
        let every = Duration::from_millis(t.lease_ms / 5);
        spawn("retry-releases", Box::pin(ws::unreleased::retry(gate.clone(), every, stop.clone())));
        let renewer = duties::Renewer {
            cluster: cluster.clone(),
            view: cluster.watch(),
            lease_ms: t.lease_ms,
            sessions: gate.registry.clone(),
            mode: mode.subscribe(),
            renewed: renewed.0,
            incarnation: rand::random(),
            capacity_connections: cfg.scaling.capacity_connections,
            max_connections: gate.registry.max_sessions() as u64,
            metrics: self.metrics.clone(),
        };
        spawn_cluster("renewer", Box::pin(renewer.run(stop.clone())));
        spawn_cluster(
            "leader-duties",
            Box::pin(duties::leader_loop(cluster.clone(), t.clone(), self.metrics.clone(), stop.clone())),
        );
        let suspect =
            detector::suspect_loop(cluster.clone(), self.cluster_http, t.clone(), self.metrics.clone(), stop.clone());
        spawn_cluster("suspect", Box::pin(suspect));
        let elect = detector::prompt_election_loop(cluster.clone(), t.clone(), stop.clone());
        spawn_cluster("prompt-election", Box::pin(elect));
        spawn("allocator", Box::pin(allocator::run(self.metrics.clone(), stop.clone())));
        spawn("watch-removal", Box::pin(duties::watch_removal(cluster.me(), cluster.watch(), stop.clone())));
        let local = (cfg.device.admit_rate, cfg.device.admit_burst);
        let heartbeat = Duration::from_millis(t.heartbeat_ms.max(10));
        let admission = duties::follow_admission(gate.clone(), local, cluster.watch(), heartbeat, stop.clone());
        spawn("admission", Box::pin(admission));
        let lease = Duration::from_millis(t.lease_ms);
        let mode = Arc::new(mode);
        let serve = lifecycle::serve_once_renewed(mode.clone(), renewed.1.clone(), stop.clone());
        spawn_cluster("serve-once-renewed", Box::pin(serve));
        let fence = lifecycle::fence_loop(gate.clone(), mode.clone(), renewed.1, lease, tasks.clone(), stop.clone());
        tasks.spawn_on(fence.instrument(tracing::info_span!("task", name = "fence")), self.cluster_rt.fence());
        match lifecycle::start(&cluster, &cfg, fresh, self.http, stop.clone()).await {
            Ok(Some(join)) => spawn("join", join),
            Ok(None) => {}
            Err(e) => {
                stop.cancel();
                cluster.shutdown().await;
                tasks.close();
                conns.close();
                let _ = tokio::time::timeout(Duration::from_secs(2), tasks.wait()).await;
                return Err(e.into());
            }
        }
        if cfg.device.device_nice > 0 {
            tracing::info!(
                device_nice = cfg.device.device_nice,
                "device threads run at a lower priority than the cluster side's (--device-nice)"
            );
        }
        let [cluster_src, device_src, backend_src] = &self.secret_sources;
        let m = cluster.member();
        let cluster_at = format!("{cluster_scheme}{}", m.cluster_addr);
        if cfg.log_format == LogFormat::Json {
            // A container runtime merges stdout into the log stream: keep every line JSON there.
            tracing::info!(
                node = %m.name, id = cluster.me(), devices = %m.public_url, cluster = %cluster_at,
                data = %cfg.data_dir.display(), cluster_secret = %cluster_src, device_secret = %device_src,
                backend_secrets = %backend_src, "listening"
            );
        } else {
            println!(
                "gateway {} (id {}) listening: devices on {}, cluster on {} (data {}; cluster secret {cluster_src}, device secret {device_src}, backend secrets {backend_src})",
                m.name,
                cluster.me(),
                m.public_url,
                cluster_at,
                cfg.data_dir.display(),
            );
        }

        let (drain, fatal) = tokio::select! {
            _ = shutdown_signal() => (true, None),
            _ = self.drain_requested.cancelled() => (true, None),
            _ = stop.cancelled() => (false, None),
            why = cluster.fatal() => (false, Some(why)),
        };
        let drain_cfg = lifecycle::DrainConfig {
            drain_rate: cfg.device.drain_rate,
            drain_timeout: Duration::from_millis(cfg.device.drain_timeout_ms),
            quorum: quorum::Check { every: heartbeat, lease: Duration::from_millis(t.election_timeout_max_ms()) },
        };
        let fatal = match fatal {
            Some(why) => Some(lifecycle::stop_failed(&gate, &mode, why).await),
            // Raft may also stop on its own during a drain, which then has no write to wait for
            // and no reason to pace its devices out.
            None => tokio::select! {
                _ = lifecycle::stop(&gate, &mode, drain.then_some(&drain_cfg)) => None,
                why = cluster.fatal() => Some(lifecycle::stop_failed(&gate, &mode, why).await),
            },
        };
        stop.cancel();
        cluster.shutdown().await;
        tasks.close();
        conns.close();
        if tokio::time::timeout(Duration::from_secs(2), async { tokio::join!(tasks.wait(), conns.wait()) })
            .await
            .is_err()
        {
            tracing::warn!(tasks = tasks.len(), connections = conns.len(), "stopped with tasks still running");
        }
        tracing::info!("stopped");
        match fatal {
            Some(why) => Err(NodeError::Raft(format!("stopped on a fatal error: {why}"))),
            None => Ok(()),
        }
    }
}

/// The cluster side's runtimes (see the module doc): Raft's, on [`CLUSTER_WORKERS`], the
/// cluster listener's spill, on [`SPILL_WORKERS`], and the fence's, on one worker that touches no
/// store, so that a store write that hangs (a disk that stopped answering) cannot keep the node
/// from fencing (`lifecycle::fence_loop`). Shut down in the background when dropped: a runtime may
/// not be dropped (blocking) inside the device runtime's tasks.
struct ClusterRuntime(Option<Runtimes>);

struct Runtimes {
    raft: tokio::runtime::Runtime,
    spill: tokio::runtime::Runtime,
    fence: tokio::runtime::Runtime,
}

/// Worker threads of Raft's runtime (Raft, the proposer, the duties and the cluster listener's
/// first connections). One: on two, a one-client claim cost each node about twice the thread
/// wake-ups, each worker waking the other for work it then found gone (benches/LEVERS.md,
/// "Raft's runtime on one worker"). Its blocking pool (redb) is separate.
const CLUSTER_WORKERS: usize = 1;

/// Worker threads of the runtime serving the cluster listener's connections past its first
/// [`crate::server::spill::NEAR`]: many clients' HTTP work.
const SPILL_WORKERS: usize = 2;

impl ClusterRuntime {
    fn new() -> Result<ClusterRuntime, NodeError> {
        let runtime = |workers, name| {
            tokio::runtime::Builder::new_multi_thread().worker_threads(workers).thread_name(name).enable_all().build()
        };
        Ok(ClusterRuntime(Some(Runtimes {
            raft: runtime(CLUSTER_WORKERS, "cluster")?,
            spill: runtime(SPILL_WORKERS, "cluster-api")?,
            fence: runtime(1, "fence")?,
        })))
    }

    fn runtimes(&self) -> &Runtimes {
        self.0.as_ref().expect("the cluster runtimes live as long as the node")
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.runtimes().raft.handle()
    }

    /// Where the cluster listener serves its connections past the first few.
    fn spill(&self) -> crate::server::spill::Spill {
        crate::server::spill::Spill::new(self.runtimes().spill.handle().clone(), crate::server::spill::NEAR)
    }

    /// Where the fence runs.
    fn fence(&self) -> &tokio::runtime::Handle {
        self.runtimes().fence.handle()
    }
}

impl Drop for ClusterRuntime {
    fn drop(&mut self) {
        if let Some(Runtimes { raft, spill, fence }) = self.0.take() {
            raft.shutdown_background();
            spill.shutdown_background();
            fence.shutdown_background();
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Buckets per row of the per-source and per-device limiters: 2 × 4096 buckets of 40 bytes, ~320 KiB each.
const KEYED_WIDTH: usize = 4096;

/// The process's soft limit of open files (`/proc/self/limits`), or 1024 when it cannot be read.
fn open_file_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let soft = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok());
    match soft {
        Some(n) => n,
        None if limits.contains("Max open files") => u64::MAX, // "unlimited"
        None => 1024,
    }
}
