//! Composition root: data dir → identity and secrets → stores → Raft → proposer, duties and
//! listeners. Wiring only; decisions live in the modules it wires.

pub mod duties;
pub mod identity;
pub mod lifecycle;
pub mod membership;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{self, Api};
use crate::config::{Config, Start};
use crate::http::HttpClient;
use crate::metrics::Metrics;
use crate::proposer::Proposer;
use crate::raft::log_store::LogStore;
use crate::raft::network::Network;
use crate::raft::state_machine::StateMachine;
use crate::raft::types::{Floor, Route};
use crate::raft::types::{Member, Raft};
use crate::store::log::LogDb;
use crate::store::state::StateDb;
use crate::store::streams::StreamRead;
use crate::ws::admission::Admission;
use crate::ws::auth::Verifier;
use crate::ws::registry::Registry;
use crate::ws::session::SessionConfig;
use crate::ws::{self, Gate, Mode, RouteLookup};

/// The device listener's view of the store: point lookups only.
struct StoreLookup(StateDb);

impl RouteLookup for StoreLookup {
    fn lookup(&self, device: &str) -> Result<(Option<Route>, Option<Floor>), String> {
        self.0.route(device).map_err(|e| e.to_string())
    }

    fn stream(&self, device: &str, after: u64, limit: usize) -> Result<StreamRead, String> {
        self.0.stream(device, after, limit).map_err(|e| e.to_string())
    }
}

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
}

/// Runs a node until SIGINT/SIGTERM or until it is removed from the cluster.
pub async fn serve(cfg: Config) -> Result<(), NodeError> {
    std::fs::create_dir_all(&cfg.data_dir)?;
    let (ident, fresh) = identity::load_or_create(&cfg.data_dir, cfg.name.as_deref())?;
    let (cluster_secret, cluster_secret_src) = identity::secret(
        "GATEWAY_CLUSTER_SECRET",
        cfg.cluster_secret_file.as_deref(),
        &cfg.data_dir,
        "cluster.secret",
    )?;
    let (device_secret, device_secret_src) =
        identity::secret("GATEWAY_DEVICE_SECRET", cfg.device_secret_file.as_deref(), &cfg.data_dir, "device.secret")?;
    let member = Member { name: ident.name.clone(), cluster_addr: cfg.cluster_addr(), public_url: cfg.public_url() };
    let span = tracing::info_span!("node", name = %ident.name, id = ident.id);
    let _enter = span.enter();

    let dir = cfg.data_dir.clone();
    let (log_db, (state_db, meta)) =
        tokio::task::spawn_blocking(move || -> Result<_, NodeError> { Ok((LogDb::open(&dir)?, StateDb::open(&dir)?)) })
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))??;
    let committed = Arc::new(AtomicU64::new(0));
    let metrics = Arc::new(Metrics::default());
    let (sm, view) = StateMachine::new(state_db.clone(), meta, metrics.clone());
    let apply_events = sm.events();
    let t = &cfg.timing;
    let raft_config = openraft::Config {
        cluster_name: "gateway".into(),
        heartbeat_interval: t.heartbeat_ms,
        election_timeout_min: t.election_timeout_ms,
        election_timeout_max: t.election_timeout_ms * 2,
        install_snapshot_timeout: 10_000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(t.snapshot_logs),
        max_in_snapshot_log_to_keep: t.snapshot_logs.min(1000),
        ..Default::default()
    }
    .validate()
    .map_err(|e| NodeError::Config(e.to_string()))?;
    let http = HttpClient::new(&cluster_secret);
    let raft = Raft::new(
        ident.id,
        Arc::new(raft_config),
        Network::new(http.clone()),
        LogStore::new(log_db, committed.clone(), metrics.clone()),
        sm,
    )
    .await
    .map_err(|e| NodeError::Raft(e.to_string()))?;

    let cluster_listener = TcpListener::bind(cfg.cluster_listen)
        .await
        .map_err(|source| NodeError::Bind { addr: cfg.cluster_listen, source })?;
    let public_listener =
        TcpListener::bind(cfg.listen).await.map_err(|source| NodeError::Bind { addr: cfg.listen, source })?;

    let stop = CancellationToken::new();
    let drain_requested = CancellationToken::new();
    let (mode_tx, mode) = watch::channel(Mode::Serving);
    let (renewed_tx, renewed_rx) = watch::channel(std::time::Instant::now());
    let tasks = stop.child_token();
    let proposer = Proposer::spawn(
        raft.clone(),
        http.clone(),
        Duration::from_millis(t.propose_timeout_ms),
        metrics.clone(),
        tasks.clone(),
    );
    let api = Arc::new(Api {
        me: ident.id,
        member: member.clone(),
        raft: raft.clone(),
        proposer: proposer.clone(),
        view: view.clone(),
        state: state_db.clone(),
        timing: t.clone(),
        device: cfg.device.clone(),
        secret: Arc::new(cluster_secret.clone()),
        http: http.clone(),
        committed,
        metrics: metrics.clone(),
        stop: stop.clone(),
        mode: mode.clone(),
        drain: drain_requested.clone(),
    });
    let registry = Registry::default();
    let d = &cfg.device;
    let gate = Arc::new(Gate {
        me: ident.id,
        name: ident.name.clone(),
        admission: Admission::new(d.admit_rate, d.admit_burst),
        verifier: Verifier::new(&device_secret),
        view: view.clone(),
        mode: mode.clone(),
        proposer: proposer.clone(),
        routes: Arc::new(StoreLookup(state_db)),
        registry: registry.clone(),
        handshake_timeout: Duration::from_millis(d.handshake_timeout_ms),
        header_read_timeout: Duration::from_millis(d.header_read_timeout_ms),
        session: SessionConfig {
            ping_ms: d.ping_ms,
            idle_ms: d.idle_ms,
            max_message_bytes: d.max_message_bytes,
            send_queue: d.send_queue,
        },
        metrics: metrics.clone(),
        tracker: TaskTracker::new(),
    });
    let mut handles = vec![
        tokio::spawn(api::run(cluster_listener, api, tasks.clone())),
        tokio::spawn(ws::run(public_listener, gate.clone(), tasks.clone())),
        tokio::spawn(ws::enforce_routes(gate.clone(), apply_events, tasks.clone())),
        tokio::spawn(
            duties::Renewer {
                me: ident.id,
                proposer: proposer.clone(),
                view: view.clone(),
                lease_ms: t.lease_ms,
                sessions: registry.clone(),
                mode: mode.clone(),
                renewed: renewed_tx,
                incarnation: rand::random(),
            }
            .run(tasks.clone()),
        ),
        tokio::spawn(duties::leader_loop(
            ident.id,
            raft.clone(),
            proposer.clone(),
            view.clone(),
            t.clone(),
            metrics.clone(),
            tasks.clone(),
        )),
        tokio::spawn(duties::watch_removal(ident.id, view.clone(), stop.clone())),
    ];
    let mode_tx = Arc::new(mode_tx);
    handles.push(tokio::spawn(lifecycle::fence_loop(
        gate.clone(),
        mode_tx.clone(),
        renewed_rx,
        Duration::from_millis(t.lease_ms),
        tasks.clone(),
    )));

    match (&cfg.start, fresh) {
        (Start::Bootstrap, true) => match raft.initialize(BTreeMap::from([(ident.id, member.clone())])).await {
            Ok(()) => tracing::info!("bootstrapped a one-node cluster"),
            Err(e) => tracing::warn!(error = %e, "bootstrap skipped"),
        },
        (Start::Join(addr), _) => {
            let (addr, http, id) = (addr.clone(), http.clone(), ident.id);
            let me = cfg.cluster_addr();
            let cancel = tasks.clone();
            handles.push(tokio::spawn(async move {
                crate::admin::join_until_member(&http, &addr, &me, id, cancel).await;
            }));
        }
        (Start::Standby, true) => tracing::info!("standby: waiting to be added with `gateway join`"),
        _ => {}
    }
    if !fresh && raft.is_initialized().await.map(|i| !i).unwrap_or(false) {
        tracing::info!(
            "this node is not part of a cluster yet: add it with `gateway join --node {}`",
            cfg.cluster_addr()
        );
    }
    println!(
        "gateway {} (id {}) listening: devices on {}, cluster on {} (data {}; cluster secret {}, device secret {})",
        ident.name,
        ident.id,
        member.public_url,
        member.cluster_addr,
        cfg.data_dir.display(),
        cluster_secret_src,
        device_secret_src
    );

    let drain = tokio::select! {
        _ = shutdown_signal() => true,
        _ = drain_requested.cancelled() => true,
        _ = stop.cancelled() => false,
    };
    if drain {
        let cfg = lifecycle::DrainConfig {
            drain_rate: cfg.device.drain_rate,
            drain_timeout: Duration::from_millis(cfg.device.drain_timeout_ms),
        };
        lifecycle::drain(ident.id, &gate, &mode_tx, &proposer, &cfg).await;
        // openraft 0.9 has no leadership transfer, and followers refuse votes while the
        // leader's lease (election_timeout_max) runs: if this node led, the others elect a
        // new leader within about two election timeouts of its exit.
    } else {
        lifecycle::say_goodbye(&gate, Duration::from_secs(1)).await;
    }
    stop.cancel();
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(error = %e, "raft shutdown");
    }
    for h in handles {
        let _ = tokio::time::timeout(Duration::from_secs(2), h).await;
    }
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
