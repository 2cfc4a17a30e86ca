//! The `steady` and `storm` runs: set up (secrets, tokens, pids, sources), start the devices,
//! wait for them, trigger the storm, sample server memory, shut down, build the report.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

use super::report::{ModelComparison, NodeMemory, Report, StormReport};
use super::stats::{self, Kind};
use super::sys;
use super::{device_config, events, BenchArgs, BenchError, CommonArgs, Recorder, Scenario};
use crate::client::device::{Device, MemoryStore};
use crate::http::HttpClient;
use crate::secrets;
use crate::tools::admin::Admin;
use crate::tools::plan::{Admission, Jitter, StormModel};
use crate::wire::StatusReport;

const WINDOW_US: u64 = 250_000;
const CALL: Duration = Duration::from_secs(5);

enum Trigger {
    /// This process drains or kills `node`.
    Act { node: String, action: Action },
    /// Another process kills one of these nodes (name → pid) within `bound`.
    Exit { pids: BTreeMap<String, u32>, bound: Duration },
}

enum Action {
    Drain { addr: String },
    Kill { pid: u32 },
}

/// A storm once it started: the node, the devices on it then, the cluster as it was just before.
struct Fired {
    event: &'static str,
    node: String,
    affected: HashSet<u32>,
    plan: Option<StatusReport>,
    trigger_us: u64,
}

/// One memory sample of a node: (rss, connections).
type Sample = BTreeMap<String, (Option<u32>, &'static str, Option<u64>, Option<u64>)>;

struct Ctx {
    c: CommonArgs,
    admin: Option<(Admin, HttpClient, String)>,
    pids: BTreeMap<String, u32>,
}

impl Ctx {
    /// Per node: pid, where the RSS came from, RSS, live connections.
    async fn sample(&self) -> Sample {
        let mut out = Sample::new();
        let members = match &self.admin {
            Some((admin, _, cluster)) => match admin.status(cluster).await {
                Ok(s) => s.members.into_iter().map(|m| (m.name, Some(m.cluster_addr), Some(m.connections))).collect(),
                Err(e) => {
                    eprintln!("bench: status from {cluster}: {e}");
                    Vec::new()
                }
            },
            None => self.pids.keys().map(|n| (n.clone(), None, None)).collect::<Vec<_>>(),
        };
        for (name, addr, status_conns) in members {
            let metrics = match (&self.admin, &addr) {
                (Some((_, http, _)), Some(addr)) => match http.get(addr, "/metrics", CALL).await {
                    Ok((st, body)) if st.is_success() => Some(String::from_utf8_lossy(&body).into_owned()),
                    _ => None,
                },
                _ => None,
            };
            let m = |k: &str| metrics.as_deref().and_then(|t| sys::metric(t, k)).map(|v| v as u64);
            let pid = self.pids.get(&name).copied();
            let (source, rss) = match (pid.and_then(sys::rss), m("gateway_process_resident_memory_bytes")) {
                (Some(r), _) => ("proc", Some(r)),
                (None, Some(r)) => ("metrics", Some(r)),
                (None, None) => ("n/a", None),
            };
            // The live gauge when /metrics has it; status counts lag by up to a lease renewal.
            let conns = m("gateway_connections").or(status_conns);
            out.insert(name, (pid, source, rss, conns));
        }
        out
    }
}

fn memory(before: &Sample, after: &Sample) -> Vec<NodeMemory> {
    after
        .iter()
        .map(|(name, &(pid, source, rss_after, conns_after))| {
            let (rss_before, conns_before) = before.get(name).map_or((None, None), |b| (b.2, b.3));
            let per = match (rss_before, rss_after, conns_before, conns_after) {
                (Some(rb), Some(ra), Some(cb), Some(ca)) if ca > cb => Some((ra as f64 - rb as f64) / (ca - cb) as f64),
                _ => None,
            };
            NodeMemory {
                node: name.clone(),
                pid,
                source: source.to_string(),
                rss_before_bytes: rss_before,
                rss_after_bytes: rss_after,
                connections_before: conns_before,
                connections_after: conns_after,
                bytes_per_connection: per.map(|b| b.round()),
            }
        })
        .collect()
}

/// What `gateway plan-storm` predicts for this storm: the affected devices coming back through the
/// survivors' admission buckets (their share of the cluster budget once the node is gone, when a
/// budget is set; else each node's own bucket), with the devices' own backoff (full jitter, a
/// first reconnect within `base`, `Retry-After: 1`), and when the node that died led, the
/// election its claims wait for ([`leader_died`]).
fn model(
    c: &CommonArgs,
    status: &StatusReport,
    event: &str,
    node: &str,
    devices: u32,
    measured: [Option<u64>; 3],
) -> Option<ModelComparison> {
    let survivors = status.ring.live.iter().filter(|n| *n != node).count() as u32;
    let device = device_config(c, 0, "", &[]);
    let (base_ms, cap_ms) = (device.base.as_millis() as u64, device.cap.as_millis() as u64);
    if devices == 0 || survivors == 0 {
        return None;
    }
    let (admission, flags) = match status.admission_budget {
        Some(b) => {
            let flags = format!("--cluster-rate {} --cluster-burst {}", b.rate_per_s, b.burst);
            (Admission::cluster_budget(b.rate_per_s, b.burst, survivors), flags)
        }
        None => {
            let a = status.admission?;
            let (rate, burst) = (a.rate_per_s.round() as u64, u64::from(a.burst));
            (
                Admission::TokenBucket { milli_rate_per_s: rate * 1000, burst, nodes: survivors },
                format!("--rate {rate} --burst {burst}"),
            )
        }
    };
    if matches!(admission, Admission::TokenBucket { milli_rate_per_s: 0, .. }) {
        return None;
    }
    let leader = status.leader.as_ref().map(|l| l.name.as_str());
    let election_ms = if leader_died(event, node, leader) { status.config.soonest_election_ms() } else { 0 };
    let flags = match election_ms {
        0 => flags,
        ms => format!("{flags} --election-ms {ms}"),
    };
    let storm = StormModel {
        devices,
        admission,
        election_ms,
        slot_ms: 10,
        base_ms,
        cap_ms,
        jitter: Jitter::Full,
        initial_jitter: true,
        retry_after_s: 1,
        paced: true,
        seed: 1,
        max_seconds: 86_400,
    };
    let predicted = crate::tools::plan::simulate(&storm).ok()?;
    let command =
        format!("plan-storm --devices {devices} --nodes {survivors} {flags} --base-ms {base_ms} --cap-ms {cap_ms}");
    Some(ModelComparison::new(command, &predicted, measured))
}

/// Whether the storm's claims wait for an election: `node`, the cluster's `leader` before the
/// event, died (`kill` or `exit`; a draining leader hands over first). The model then waits the
/// soonest a voter may elect by design, as if the leader's last heartbeat came at its death
/// (`Timing::soonest_election_ms`, the prompt election without its jitter): the model's floor, so
/// what the jitter and the vote add shows in the measured/model ratio.
fn leader_died(event: &str, node: &str, leader: Option<&str>) -> bool {
    event != "drain" && leader == Some(node)
}

/// Polls `done` every 50 ms until it holds or `bound` passes; true if it held.
async fn wait_for(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + bound;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        sleep(Duration::from_millis(50)).await;
    }
}

/// Drains or kills `node`: the storm's start.
async fn fire(ctx: &Ctx, rec: &Recorder, node: String, action: Action) -> Result<Fired, BenchError> {
    let event = match action {
        Action::Drain { .. } => "drain",
        Action::Kill { .. } => "kill",
    };
    let affected: HashSet<u32> = rec.on_node(&node).into_iter().collect();
    if affected.is_empty() {
        eprintln!("bench: no device of this process is connected to {node} (per node: {:?})", rec.per_node());
    }
    // The storm the model is given: the survivors and their admission, as the cluster says.
    let plan = match &ctx.admin {
        Some((admin, _, cluster)) => admin.status(cluster).await.ok(),
        None => None,
    };
    rec.reset_waits();
    let trigger_us = rec.now_us();
    eprintln!("bench: {event} {node} with {} devices on it", affected.len());
    match action {
        Action::Drain { addr } => {
            let (admin, _, _) = ctx.admin.as_ref().expect("checked when parsing");
            admin.drain(&addr).await.map_err(|e| BenchError::Runtime(format!("drain {node}: {e}")))?;
        }
        Action::Kill { pid } => sys::kill9(pid)?,
    }
    Ok(Fired { event, node, affected, plan, trigger_us })
}

/// Holds the devices until one of `pids` exits. The storm starts at the last check (every 10 ms)
/// that saw every node alive, with the devices that were on the dead node then, and the last
/// status read before it (refreshed every 5 s: an operator may change admission meanwhile).
async fn await_exit(
    ctx: &Ctx,
    rec: &Recorder,
    pids: &BTreeMap<String, u32>,
    bound: Duration,
) -> Result<Fired, BenchError> {
    let latest: Arc<Mutex<Option<StatusReport>>> = Arc::default();
    let refresher = ctx.admin.clone().map(|(admin, _, cluster)| {
        let latest = latest.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(s) = admin.status(&cluster).await {
                    *latest.lock().expect("status") = Some(s);
                }
                sleep(Duration::from_secs(5)).await;
            }
        })
    });
    let end = Instant::now() + bound;
    let (mut seen, mut nodes) = rec.nodes();
    let mut alive_us = None;
    let dead = loop {
        let t = rec.now_us();
        let fresh = (rec.changes() != seen).then(|| rec.nodes());
        if let Some((name, _)) = pids.iter().find(|(_, &pid)| !sys::alive(pid)) {
            break name.clone();
        }
        if let Some((c, v)) = fresh {
            (seen, nodes) = (c, v);
        }
        alive_us = Some(t);
        if Instant::now() >= end {
            break String::new();
        }
        sleep(Duration::from_millis(10)).await;
    };
    if let Some(r) = refresher {
        r.abort();
    }
    let Some(trigger_us) = alive_us.filter(|_| !dead.is_empty()) else {
        return Err(BenchError::Runtime(if dead.is_empty() {
            format!("--await-exit: no node exited within {} s", bound.as_secs())
        } else {
            format!("--await-exit: {dead} was not running when the devices were held")
        }));
    };
    rec.reset_waits();
    let affected: HashSet<u32> =
        (0..nodes.len() as u32).filter(|&i| nodes[i as usize].as_deref() == Some(dead.as_str())).collect();
    eprintln!("bench: {dead} exited with {} devices on it", affected.len());
    let plan = latest.lock().expect("status").take();
    Ok(Fired { event: "exit", node: dead, affected, plan, trigger_us })
}

pub async fn run(args: BenchArgs) -> Result<Report, BenchError> {
    let (c, secs, storm, timeout, hold_after) = match args.scenario {
        Scenario::Steady { common, secs } => (common, secs, None, 0, 0),
        Scenario::Storm { common, kill, drain, kill_pid, await_exit, await_secs, timeout_secs, hold_after_secs } => {
            let storm = (kill, drain, kill_pid, await_exit.then_some(await_secs));
            (common, 0, Some(storm), timeout_secs, hold_after_secs)
        }
    };
    if c.devices == 0 {
        return Err(BenchError::Usage("--devices must be at least 1".into()));
    }
    let cfg_err = |e: crate::secrets::SecretError| BenchError::Config(e.to_string());
    let device_secret =
        secrets::cli_device_secret(c.device_secret_file.as_deref(), &c.secret.data_dir).map_err(cfg_err)?;
    // --ca-file: the devices dial wss:// and the cluster calls go over https with it.
    let tls = c.secret.tls().map_err(|e| BenchError::Config(e.to_string()))?;
    let admin = match &c.cluster {
        Some(cluster) => {
            let s = secrets::cli_cluster_secret(c.secret.cluster_secret_file.as_deref(), &c.secret.data_dir)
                .map_err(cfg_err)?;
            let http = HttpClient::with_tls(&s, tls.clone());
            Some((Admin::new(http.clone()), http, cluster.clone()))
        }
        None => None,
    };
    let kill_name = storm.as_ref().and_then(|s| s.0.clone());
    let pids = sys::pids(&c.pid_file, &c.pid, kill_name.as_deref())?;
    let trigger = match storm {
        None => None,
        Some((_, _, _, Some(await_secs))) => {
            if pids.is_empty() {
                return Err(BenchError::Usage(
                    "--await-exit: give the nodes' pids (--pid NAME=PID or --pid-file)".into(),
                ));
            }
            Some(Trigger::Exit { pids: pids.clone(), bound: Duration::from_secs(await_secs) })
        }
        Some((Some(node), _, kill_pid, None)) => {
            let pid = kill_pid.or_else(|| pids.get(&node).copied()).ok_or_else(|| {
                BenchError::Usage(format!("--kill {node}: give its pid (--kill-pid, --pid {node}=PID or --pid-file)"))
            })?;
            Some(Trigger::Act { node, action: Action::Kill { pid } })
        }
        Some((None, Some(node), _, None)) => {
            let Some((admin, _, cluster)) = &admin else {
                return Err(BenchError::Usage("--drain needs --cluster".into()));
            };
            let st = admin.status(cluster).await.map_err(|e| BenchError::Runtime(e.to_string()))?;
            let m = st.members.iter().find(|m| m.name == node).ok_or_else(|| {
                let names: Vec<_> = st.members.iter().map(|m| m.name.as_str()).collect();
                BenchError::Usage(format!("--drain {node}: no such member (members: {})", names.join(", ")))
            })?;
            let addr = m.cluster_addr.clone();
            Some(Trigger::Act { node, action: Action::Drain { addr } })
        }
        Some((None, None, _, None)) => {
            return Err(BenchError::Usage("storm needs --kill, --drain or --await-exit".into()))
        }
    };
    if let Some(limit) = sys::open_files_limit() {
        if u64::from(c.devices) + 64 > limit {
            eprintln!(
                "bench: warning: {} devices but the open-files limit is {limit}; split over processes",
                c.devices
            );
        }
    }
    let sources: Vec<IpAddr> = sys::sources(c.sources, &c.nodes);
    let exp = crate::clock::now_ms() / 1000 + 86_400;
    let mut tokens = Vec::with_capacity(c.devices as usize);
    for i in 0..c.devices {
        let id = format!("{}-{}", c.prefix, c.first + i);
        tokens.push(
            crate::token::mint(&device_secret, &id, 0, exp).map_err(|e| BenchError::Usage(format!("{id}: {e}")))?,
        );
    }
    let ctx = Ctx { c, admin, pids };
    let c = &ctx.c;
    let n = c.devices;
    let before = ctx.sample().await;

    // Devices, spawned by a pacer (--ramp), and the progress line.
    let cap = device_config(c, 0, "", &[]).cap;
    let rec = Recorder::new(n as usize, cap);
    let stop = CancellationToken::new();
    let spawner: JoinHandle<Vec<JoinHandle<()>>> = {
        let (rec, stop, c, sources, tls) = (rec.clone(), stop.clone(), c.clone(), sources.clone(), tls.clone());
        tokio::spawn(async move {
            let t0 = Instant::now();
            let mut handles = Vec::with_capacity(n as usize);
            for (i, token) in (0..n).zip(tokens) {
                if c.ramp > 0 {
                    tokio::time::sleep_until(t0 + Duration::from_secs_f64(f64::from(i) / f64::from(c.ramp))).await;
                }
                if stop.is_cancelled() {
                    break;
                }
                let mut cfg = device_config(&c, i, &token, &sources);
                cfg.tls = tls.clone();
                let dev = Device::new(cfg, Box::new(MemoryStore::new(0)));
                let (ev, stop) = (events(rec.clone(), i), stop.clone());
                handles.push(tokio::spawn(async move {
                    dev.run(ev, stop).await;
                }));
            }
            handles
        })
    };
    let progress_stop = CancellationToken::new();
    let progress = {
        let (rec, ps) = (rec.clone(), progress_stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tokio::select! { _ = ps.cancelled() => return, _ = tick.tick() => {} }
                eprintln!(
                    "bench {:>5.1}s: connected {}/{n} (ever {}), attempts {}, failures {}",
                    rec.now_us() as f64 / 1e6,
                    rec.up.load(Ordering::Relaxed),
                    rec.ever.load(Ordering::Relaxed),
                    rec.attempts.load(Ordering::Relaxed),
                    rec.failures.load(Ordering::Relaxed)
                );
            }
        })
    };

    let all = wait_for(Duration::from_secs(c.connect_timeout_secs), || rec.ever.load(Ordering::Relaxed) == n).await;
    let connected = rec.ever.load(Ordering::Relaxed);
    if !all {
        eprintln!("bench: only {connected}/{n} devices connected within {} s", c.connect_timeout_secs);
    }
    let mut storm_report = None;
    let after;
    match trigger {
        None => {
            sleep(Duration::from_secs(secs)).await;
            after = ctx.sample().await;
        }
        Some(t) => {
            after = ctx.sample().await;
            let fired = match t {
                Trigger::Act { node, action } => fire(&ctx, &rec, node, action).await?,
                Trigger::Exit { pids, bound } => await_exit(&ctx, &rec, &pids, bound).await?,
            };
            let Fired { event, node, affected, plan, trigger_us } = fired;
            // Watch the survivors' rings drop the node, from outside, while the devices re-home.
            let converged = {
                let (admin, plan, node, rec) = (ctx.admin.clone(), plan.clone(), node.clone(), rec.clone());
                tokio::spawn(async move {
                    let (admin, _, _) = admin?;
                    let survivors: Vec<String> =
                        plan?.members.into_iter().filter(|m| m.name != node).map(|m| m.cluster_addr).collect();
                    let deadline = Instant::now() + Duration::from_secs(timeout);
                    while Instant::now() < deadline {
                        let mut out = 0;
                        for addr in &survivors {
                            if admin.status(addr).await.is_ok_and(|s| !s.ring.live.contains(&node)) {
                                out += 1;
                            }
                        }
                        if out == survivors.len() {
                            return Some(rec.now_us().saturating_sub(trigger_us) / 1000);
                        }
                        sleep(Duration::from_millis(50)).await;
                    }
                    None
                })
            };
            let done = wait_for(Duration::from_secs(timeout), || {
                rec.up.load(Ordering::Relaxed) == n
                    && rec.with_log(|log| stats::rehome_delays(log, trigger_us, &affected).len()) == affected.len()
            })
            .await;
            let end_us = rec.now_us();
            let ring_converged_ms = converged.await.ok().flatten();
            let (max_wait, waits_at_cap) = rec.waits();
            storm_report = Some(rec.with_log(|log| {
                let delays = stats::rehome_delays(log, trigger_us, &affected);
                let total = affected.len();
                let others = n - total as u32;
                let measured = [0.5, 0.99, 1.0].map(|f| stats::time_to_fraction(&delays, total, f).map(|us| us / 1000));
                let model = plan.as_ref().and_then(|st| model(c, st, event, &node, total as u32, measured));
                StormReport {
                    event: event.into(),
                    node,
                    trigger_ms: trigger_us / 1000,
                    affected: total as u32,
                    rehomed: delays.len() as u32,
                    t50_ms: stats::time_to_fraction(&delays, total, 0.5).map(|us| us / 1000),
                    t99_ms: stats::time_to_fraction(&delays, total, 0.99).map(|us| us / 1000),
                    t100_ms: stats::time_to_fraction(&delays, total, 1.0).map(|us| us / 1000),
                    delays_ms: delays.iter().map(|us| us / 1000).collect(),
                    others,
                    others_disturbed: stats::disturbed(log, trigger_us, &affected),
                    timed_out: !done,
                    window_ms: WINDOW_US / 1000,
                    windows: stats::windows(log, trigger_us, end_us, WINDOW_US),
                    outcomes: stats::outcomes(log, trigger_us, u64::MAX),
                    ring_converged_ms,
                    max_wait_ms: max_wait.as_millis() as u64,
                    waits_at_cap,
                    model,
                }
            }));
        }
    }
    let connected_at_end = rec.up.load(Ordering::Relaxed);
    let elapsed_ms = rec.now_us() / 1000;
    sleep(Duration::from_secs(hold_after)).await;

    stop.cancel();
    let handles = spawner.await.map_err(|e| BenchError::Runtime(format!("spawner: {e}")))?;
    let joined = tokio::time::timeout(Duration::from_secs(20), async {
        for h in handles {
            let _ = h.await;
        }
    })
    .await;
    if joined.is_err() {
        eprintln!("bench: some devices did not shut down within 20 s");
    }
    progress_stop.cancel();
    let _ = progress.await;

    let report = rec.with_log(|log| {
        let all_us = stats::all_connected_at(log, n as usize);
        Report {
            scenario: if storm_report.is_some() { "storm" } else { "steady" }.into(),
            devices: n,
            prefix: c.prefix.clone(),
            first: c.first,
            sources: sources.len() as u32,
            connected,
            connected_at_end,
            all_connected_ms: all_us.map(|us| us / 1000),
            connect_rate_per_s: all_us.filter(|&us| us > 0).map(|us| (f64::from(n) / (us as f64 / 1e6)).round()),
            attempts: log.iter().filter(|r| r.kind == Kind::Dial).count() as u64,
            accepts: log.iter().filter(|r| matches!(r.kind, Kind::Accept { .. })).count() as u64,
            handshake: stats::latency(log),
            outcomes: stats::outcomes(log, 0, u64::MAX),
            errors: log.iter().filter(|r| r.kind.is_error()).count() as u64,
            memory: memory(&before, &after),
            storm: storm_report,
            elapsed_ms,
        }
    });
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_waits_for_an_election_only_when_the_leader_died() {
        assert!(leader_died("kill", "n1", Some("n1")));
        assert!(leader_died("exit", "n1", Some("n1")));
        // A follower's death, a drain (the leader hands over first), or no leader known: none.
        assert!(!leader_died("kill", "n2", Some("n1")));
        assert!(!leader_died("drain", "n1", Some("n1")));
        assert!(!leader_died("kill", "n1", None));
    }
}
