//! Handshakes and idle connections against a bare reference, side by side on this machine:
//! `cargo bench --bench handshakes`.
//!
//! The reference is a bare fastwebsockets + hyper 1 server (this bench re-executed with
//! `HANDSHAKES_BENCH_BARE=1`, in its own process so its memory is its own): it upgrades every
//! request and holds the connection, reading frames until the peer goes. Against it, a one-node
//! gateway, the bare relay (three bare servers that replicate a claim and a release with nothing
//! else: the floor with messages, see `relay/mod.rs`) and a three-node gateway cluster (all nodes
//! taking handshakes, `steer=off`):
//!
//! 1. **Handshakes/s**: C tasks (`HANDSHAKES_BENCH_C`, default 64) loop for
//!    `HANDSHAKES_BENCH_SECS` (default 5): connect, send the upgrade (for the gateway a device
//!    token, minted once per task as a device holds its token, and a growing `attempt`), read the
//!    `101` head, then close abortively (RST), so every gateway handshake is one claim and one
//!    release. Admission control is opened wide
//!    (`--admit-rate`, `--overload-commit-ms 0`): this measures capacity, not the shaping.
//! 2. **Idle bytes per connection**: N connections (`HANDSHAKES_BENCH_IDLE`, default 2000) held on
//!    one server process, resident memory before and after, divided by N. The gateway is
//!    measured three times: with raw clients that never read, one connection at a time (as for
//!    the reference); with the project's own client (`gateway::client::device`, which syncs and
//!    answers pings) arriving [`IDLE_IN_FLIGHT`] handshakes at a time, as a fleet arrives through
//!    admission; and with the project's client all at once (admission opened wide), where the
//!    allocator keeps part of the storm's peak (handshakes waiting on their claims) resident.
//!    The node's allocator duty may hand that back (`malloc_trim`, checked every 10 s) before or
//!    after the reading, so each project's-client row waits up to [`TRIM_WAIT`] for the node's
//!    next trim and, if one comes, adds a row read after it (`after the next trim`).
//! 3. **Lease renewals under the flood**: the three nodes' `gateway_lease_renewal_seconds` and
//!    fence counters across their handshake run, i.e. how long the cluster side (Raft, renewals)
//!    took to commit a renewal while the handshakes kept every core busy (a renewal every
//!    `lease/5` = 2 s per node, so a run of 30 s gives ~45 of them).
//!
//! Under the table, each gateway run's server CPU a handshake by thread name (`device`: the
//! handshakes and sessions; `cluster`: Raft, the forwards, the cluster listener, the state apply;
//! `raft-log`: the log writer) beside what the goal of 0.7× the bare server's rate would
//! leave the servers at the CPU the bare run used a handshake. Under it, the floor of three
//! replicas: the least any three-node gateway of this design could cost a handshake here (the
//! bare server's CPU, six bare redb row writes and the run's log flushes at a paced bare flush's CPU;
//! see [`replicas_floor`]) and the best share of the bare server's rate it leaves.
//!
//! With `HANDSHAKES_BENCH_ROUNDS=N` (default 1), N − 1 more rounds follow the table, each the
//! bare server's handshakes, the bare relay's and then the three nodes', back to back, and a line
//! gives every round's ratios and their medians (`rounds_3_nodes` in the JSON line): a shared
//! machine's rate moves from minute to minute, and a median of rounds measured back to back moves
//! less than one.
//!
//! Prints a table and a JSON line; asserts nothing.

mod relay;
mod support;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::{loadavg, rss, Cluster, ThreadCpu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BARE_ROLE: &str = "HANDSHAKES_BENCH_BARE";
/// How long a project's-client idle row waits for the node's next allocator trim: the duty's
/// check period (10 s, `node::allocator`) and some slack.
const TRIM_WAIT: Duration = Duration::from_secs(12);

/// Handshakes in flight at once while the project's client fills a node with idle devices.
const IDLE_IN_FLIGHT: usize = 32;
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// The goal for three nodes: this share of the bare server's handshake rate.
const GOAL_SHARE: f64 = 0.7;
const NODE_ARGS: [&str; 8] =
    ["--admit-rate", "1000000", "--admit-burst", "100000", "--overload-commit-ms", "0", "--lease-ms", "10000"];

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    if std::env::var_os(BARE_ROLE).is_some() {
        return bare::serve();
    }
    if let Ok(role) = std::env::var(relay::ROLE) {
        return relay::serve(role);
    }
    let secs = env_or("HANDSHAKES_BENCH_SECS", 5);
    let conc = env_or("HANDSHAKES_BENCH_C", 64) as usize;
    let idle = env_or("HANDSHAKES_BENCH_IDLE", 2000) as usize;
    let rounds = env_or("HANDSHAKES_BENCH_ROUNDS", 1).max(1) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let floor = support::floor(500);
    let support::Floor { fsync_us, fsync3_us, over_us, over3_us, rtt_us, quorum_us, halt_poll_ns, .. } = floor;
    println!(
        "handshakes: C={conc}, {secs} s per run, {idle} idle connections, {rounds} round(s) of bare and three nodes, \
         {} cpus, loadavg {}; floor: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
        floor.describe()
    );
    let header = format!(
        "{:<28} | {:>12} | {:>7} | {:>7} | {:>6} | {:>11} | {:>5} | {:>14} | {:>6} | errors",
        "server", "handshakes/s", "p50 ms", "p99 ms", "ratio", "cpu us S ld", "sw S", "idle B/conn", "ratio"
    );
    println!("{header}\n{}", "-".repeat(header.len() + 8));
    let mut rows = Vec::new();

    // The reference: idle connections first, on a fresh process (memory freed by churn would be
    // reused and understate them), then handshakes.
    // Kept until the rounds are done (killed on drop, also on panic).
    let (child, addr) = bare::spawn();
    let child = KillOnDrop(child);
    let bare_targets = vec![Target { addr, secret: None, steer: false, fresh: false }];
    let (bare_bytes, bare_fixed) = rt.block_on(idle_raw(&bare_targets, child.0.id(), idle, "bare"));
    let hs = rt.block_on(handshakes(&bare_targets, &[child.0.id()], conc, secs, "bare"));
    let bare_rate = hs.rate();
    let bare_cpu = hs.cpu_per();
    rows.push(row("bare fastwebsockets", &hs, Some(bare_bytes), bare_rate, bare_bytes));
    // Where each gateway run's CPU went, printed under the table.
    let mut splits = Vec::new();

    // Idle connections on fresh one-node gateways: raw clients, then the project's client.
    let one = |rt: &tokio::runtime::Runtime| {
        let c = Cluster::form(rt, "handshakes", 1, &NODE_ARGS);
        let t = vec![Target {
            addr: c.nodes[0].public_addr.parse().expect("node address"),
            secret: Some(c.device_secret.clone()),
            steer: false,
            fresh: false,
        }];
        (c, t)
    };
    let (c, t) = one(&rt);
    let (raw, node_fixed) = rt.block_on(idle_raw(&t, c.nodes[0].pid, idle, "raw"));
    let hs = rt.block_on(handshakes(&t, &[c.nodes[0].pid], conc, secs, "c1"));
    rows.push(row("gateway 1 node, raw idle", &hs, Some(raw), bare_rate, bare_bytes));
    splits.push(split("gateway 1 node", &hs, bare_cpu));
    // The same node with steering on, as real devices connect: every handshake after a device's
    // first reads its route and floor before the claim, from the row cache (placement keeps it here).
    let steered: Vec<Target> = t.iter().map(|t| Target { steer: true, ..t.clone() }).collect();
    let hs = rt.block_on(handshakes(&steered, &[c.nodes[0].pid], conc, secs, "c1s"));
    rows.push(row("gateway 1 node, steer on", &hs, None, bare_rate, bare_bytes));
    // Steering on with a device that never connected before each time: placement finds no row
    // in the cache and reads the store (the loader also mints a token a handshake: see `ld`).
    let first: Vec<Target> = steered.iter().map(|t| Target { fresh: true, ..t.clone() }).collect();
    let hs = rt.block_on(handshakes(&first, &[c.nodes[0].pid], conc, secs, "c1f"));
    rows.push(row("  same, new devices", &hs, None, bare_rate, bare_bytes));
    drop(c);
    for (name, tag, in_flight) in
        [("gateway 1 node, client idle", "client", IDLE_IN_FLIGHT), ("  same, all at once", "burst", idle)]
    {
        let (c, t) = one(&rt);
        let (held, trimmed) = rt.block_on(idle_client(&t, &c.nodes[0], idle, tag, in_flight));
        rows.push(row(name, &Run::default(), Some(held), bare_rate, bare_bytes));
        if let Some(after) = trimmed {
            rows.push(row("    after the next trim", &Run::default(), Some(after), bare_rate, bare_bytes));
        }
        drop(c);
    }

    // The floor with messages: three bare processes replicating a claim and a release (`relay`).
    let relay = relay::spawn();
    let relay_targets: Vec<Target> =
        relay.addrs.iter().map(|&addr| Target { addr, secret: None, steer: false, fresh: false }).collect();
    let counted = relay.counts();
    let hs = rt.block_on(handshakes(&relay_targets, &relay.pids, conc, secs, "relay"));
    // The processes write their counts every 100 ms: wait for the run's last ones.
    std::thread::sleep(Duration::from_millis(300));
    let now = relay.counts();
    let [entries, commands, flushes]: [u64; 3] = std::array::from_fn(|i| now[i].saturating_sub(counted[i]));
    let relay_rate = hs.rate();
    rows.push(row("bare relay, 3 processes", &hs, None, bare_rate, bare_bytes));
    splits.push(split("bare relay, 3 processes", &hs, bare_cpu).map(|line| {
        format!(
            "{line}; {commands} commands in {entries} entries ({:.1} an entry), {:.2} log flushes a handshake over the three",
            commands as f64 / entries.max(1) as f64,
            flushes as f64 / hs.ok.max(1) as f64
        )
    }));

    // Handshakes on a three-node cluster, every node taking its share.
    let c = Cluster::form(&rt, "handshakes", 3, &NODE_ARGS);
    let t: Vec<Target> = c
        .nodes
        .iter()
        .map(|n| Target {
            addr: n.public_addr.parse().expect("node address"),
            secret: Some(c.device_secret.clone()),
            steer: false,
            fresh: false,
        })
        .collect();
    let scrape_all = |rt: &tokio::runtime::Runtime| {
        rt.block_on(futures_util::future::join_all(c.nodes.iter().map(|n| support::scrape(&n.cluster_addr))))
    };
    let before = scrape_all(&rt);
    let pids: Vec<u32> = c.nodes.iter().map(|n| n.pid).collect();
    let hs = rt.block_on(handshakes(&t, &pids, conc, secs, "c3"));
    let after = scrape_all(&rt);
    rows.push(row("gateway 3 nodes", &hs, None, bare_rate, bare_bytes));
    splits.push(split("gateway 3 nodes", &hs, bare_cpu));
    // More rounds: the bare server, the bare relay, then the three nodes, back to back, each one's ratio.
    let mut paired = vec![Paired { bare_rate, relay_rate, rate: hs.rate(), server_us: hs.cpu_per().map(|(s, _)| s) }];
    for r in 2..=rounds {
        let b = rt.block_on(handshakes(&bare_targets, &[child.0.id()], conc, secs, &format!("bare{r}")));
        let m = rt.block_on(handshakes(&relay_targets, &relay.pids, conc, secs, &format!("relay{r}")));
        let g = rt.block_on(handshakes(&t, &pids, conc, secs, &format!("c3r{r}")));
        let server_us = g.cpu_per().map(|(s, _)| s);
        paired.push(Paired { bare_rate: b.rate(), relay_rate: m.rate(), rate: g.rate(), server_us });
    }
    drop(c);
    drop(relay);
    drop(child);
    splits.iter().flatten().for_each(|line| println!("{line}"));
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!(
        "resident before any connection (fresh processes, settled): the bare server {:.1} MiB, a one-node gateway \
         {:.1} MiB ({:.2}x); the idle B/conn column is the growth past these",
        mib(bare_fixed),
        mib(node_fixed),
        node_fixed as f64 / bare_fixed.max(1) as f64
    );
    let renewals = Renewals::between(&before, &after);
    println!("{renewals}");
    let floor3 = replicas_floor(&hs, &renewals, bare_cpu, conc, floor.paced_cpu_us);
    if let Some((line, _)) = &floor3 {
        println!("{line}");
    }
    let rounds_json = Paired::report(&paired);
    println!(
        "{}",
        json!({"bench": "handshakes", "fsync_us": fsync_us, "fsync3_us": fsync3_us, "over_us": over_us, "over3_us": over3_us, "over_paced_us": floor.paced_us, "over_paced_cpu_us": floor.paced_cpu_us, "rtt_us": rtt_us, "quorum_us": quorum_us, "halt_poll_ns": halt_poll_ns, "concurrency": conc, "secs_per_run": secs,
               "idle": idle, "idle_rss_before": {"bare": bare_fixed, "gateway_1_node": node_fixed}, "rows": rows, "renewals_3_nodes": renewals.json(), "floor_3_replicas": floor3.map(|(_, v)| v),
               "rounds_3_nodes": rounds_json})
    );
}

/// Prints one table row and returns it as JSON.
fn row(name: &str, hs: &Run, idle_bytes: Option<u64>, bare_rate: f64, bare_bytes: u64) -> serde_json::Value {
    let ratio = |a: f64, b: f64| if b > 0.0 && a > 0.0 { format!("{:.2}", a / b) } else { "-".into() };
    let rate = hs.rate();
    let errors = hs.errors.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(" ");
    println!(
        "{name:<28} | {:>12} | {:>7} | {:>7} | {:>6} | {:>11} | {:>5} | {:>14} | {:>6} | {}",
        if hs.ok > 0 { format!("{rate:.0}") } else { "-".into() },
        hs.pct(0.50).map_or("-".into(), |v| format!("{v:.2}")),
        hs.pct(0.99).map_or("-".into(), |v| format!("{v:.2}")),
        ratio(rate, bare_rate),
        hs.cpu_per().map_or("-".into(), |(s, l)| format!("{s:.0} {l:.0}")),
        hs.switches_per().map_or("-".into(), |s| format!("{s:.1}")),
        idle_bytes.map_or("-".into(), |b| b.to_string()),
        ratio(idle_bytes.unwrap_or(0) as f64, bare_bytes as f64),
        if errors.is_empty() { "0" } else { &errors }
    );
    let (server_cpu, loader_cpu) = hs.cpu_per().unzip();
    json!({"server": name, "handshakes_per_s": rate, "p50_ms": hs.pct(0.5), "p99_ms": hs.pct(0.99),
           "server_cpu_us_per_handshake": server_cpu, "loader_cpu_us_per_handshake": loader_cpu,
           "server_switches_per_handshake": hs.switches_per(),
           "server_cpu_us_per_handshake_by_thread": hs.by_thread.iter().map(|(n, us)| (n.clone(), *us as f64 / hs.ok.max(1) as f64)).collect::<BTreeMap<_, _>>(),
           "idle_bytes_per_conn": idle_bytes, "errors": hs.errors})
}

/// Where a gateway run's server CPU went, by thread name (µs a handshake, every process together),
/// and what [`GOAL_SHARE`] of the bare server's rate would leave the servers: at the bare run's
/// CPU a handshake (server and loader together, `bare`) the machine made its rate; at the same
/// CPU use, 0.7× that rate is `(bare server + bare loader) / 0.7` a handshake, less this run's
/// loader. None without handshakes.
fn split(name: &str, hs: &Run, bare: Option<(f64, f64)>) -> Option<String> {
    let (_, loader) = hs.cpu_per()?;
    let per = |us: u64| us as f64 / hs.ok as f64;
    // Threads under half a microsecond a handshake (the main thread, the state hold timer) are left out.
    let mut parts: Vec<(&String, &u64)> =
        hs.by_thread.iter().filter(|(n, us)| n.as_str() != ThreadCpu::REST && per(**us) >= 0.5).collect();
    parts.sort_by(|a, b| b.1.cmp(a.1));
    let rest = hs.by_thread.get(ThreadCpu::REST).copied().unwrap_or(0);
    let listed = parts.iter().map(|(n, us)| format!("{n} {:.0}", per(**us))).collect::<Vec<_>>().join(", ");
    let budget = bare.map_or(String::new(), |(s, l)| {
        format!(
            "; {GOAL_SHARE}x the bare server's rate at its CPU use leaves the servers {:.0} us a handshake beside this loader's {loader:.0}",
            (s + l) / GOAL_SHARE - loader
        )
    });
    Some(format!("{name}, server CPU us a handshake by thread: {listed}, the rest {:.0}{budget}", per(rest)))
}

/// Starts this bench again as a server process with `env` (its role); returns the child and the
/// first line it prints (its addresses).
fn respawn(env: &[(&str, &std::ffi::OsStr)]) -> (Child, String) {
    use std::io::BufRead;
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.envs(env.iter().copied()).stdout(Stdio::piped()).stdin(Stdio::null());
    let mut child = cmd.spawn().expect("spawn a server process");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read its address");
    (child, line)
}

/// A child process killed (and reaped) when dropped, also on panic.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One round of the bare server's handshakes, the bare relay's and then the three nodes' (the
/// first round is the table's rows, about a minute apart; the others back to back).
struct Paired {
    bare_rate: f64,
    relay_rate: f64,
    rate: f64,
    server_us: Option<f64>,
}

impl Paired {
    /// Prints the rounds' ratios and their medians (with more than one round) and returns them as JSON.
    fn report(rounds: &[Paired]) -> serde_json::Value {
        let share = |rate: fn(&Paired) -> f64, of: fn(&Paired) -> f64| -> Vec<f64> {
            rounds.iter().map(|p| if of(p) > 0.0 { rate(p) / of(p) } else { 0.0 }).collect()
        };
        let (ratios, relay) = (share(|p| p.rate, |p| p.bare_rate), share(|p| p.relay_rate, |p| p.bare_rate));
        // The three nodes against the least three processes of this design (the relay) can do.
        let of_relay = share(|p| p.rate, |p| p.relay_rate);
        let server: Vec<f64> = rounds.iter().filter_map(|p| p.server_us).collect();
        let (median_ratio, median_us) = (support::median(ratios.clone()), support::median(server.clone()));
        let (median_relay, median_of_relay) = (support::median(relay.clone()), support::median(of_relay.clone()));
        if rounds.len() > 1 {
            let list =
                |v: &[f64], digits: usize| v.iter().map(|x| format!("{x:.digits$}")).collect::<Vec<_>>().join(", ");
            println!(
                "gateway 3 nodes over {} rounds (the bare server, the bare relay, then the three nodes): ratios {}, \
                 median {:.2}x (goal {GOAL_SHARE}x); the bare relay's {}, median {:.2}x; the three nodes' rate over the \
                 relay's {}, median {:.2}; server CPU us a handshake {}, median {:.0}",
                rounds.len(),
                list(&ratios, 2),
                median_ratio,
                list(&relay, 2),
                median_relay,
                list(&of_relay, 2),
                median_of_relay,
                list(&server, 0),
                median_us
            );
        }
        json!({"bare_rates": rounds.iter().map(|p| p.bare_rate).collect::<Vec<_>>(),
               "rates": rounds.iter().map(|p| p.rate).collect::<Vec<_>>(), "ratios": ratios,
               "relay_rates": rounds.iter().map(|p| p.relay_rate).collect::<Vec<_>>(), "relay_ratios": relay,
               "median_relay_ratio": median_relay, "of_relay": of_relay, "median_of_relay": median_of_relay,
               "server_cpu_us_per_handshake": server, "median_ratio": median_ratio,
               "median_server_cpu_us_per_handshake": median_us})
    }
}

/// Rows a handshake writes over three replicas: its claim and its release, each applied on all three.
const REPLICA_ROWS: f64 = 6.0;

/// The least three replicas of this design could cost the servers a handshake on this machine,
/// at the three-node run's batching (`raft`: its commands an entry and its flushes), with none
/// of the gateway's own work: the bare server's CPU (the upgrade itself, on the same hyper and
/// fastwebsockets), [`REPLICA_ROWS`] bare redb row writes in transactions of the run's commands
/// an entry, and the run's log flushes a handshake at a bare flush's CPU (`flush`, the floor
/// probe's [`support::Floor::paced_cpu_us`]: flushes as far apart as a node's under this load;
/// back-to-back ones cost less on some filesystems). Beside it, the best share of the bare
/// server's rate that floor allows at the bare run's CPU use and this run's loader (the same
/// reckoning as [`split`]'s budget). None without both runs' handshakes.
fn replicas_floor(
    hs: &Run,
    raft: &Renewals,
    bare: Option<(f64, f64)>,
    held: usize,
    flush: f64,
) -> Option<(String, serde_json::Value)> {
    let ((bare_s, bare_ld), (_, loader)) = (bare?, hs.cpu_per()?);
    let per_entry = (raft.commands / raft.entries.max(1.0)).round().max(1.0) as usize;
    let row = support::replica::row_us(per_entry, (20_000 / per_entry).max(200), held, 3);
    let flushes = raft.fsyncs / hs.ok as f64;
    let floor = bare_s + REPLICA_ROWS * row + flushes * flush;
    let best = (bare_s + bare_ld) / (floor + loader);
    let pace = support::PACE.as_millis();
    let line = format!(
        "gateway 3 nodes, the floor of three replicas at this run's batching: the bare server's {bare_s:.0} us \
         + {REPLICA_ROWS} bare row writes of {row:.1} us (transactions of {per_entry}) + {flushes:.2} log flushes of \
         {flush:.0} us CPU (one every {pace} ms) = {floor:.0} us a handshake: at most {best:.2}x the bare server's rate beside this loader's \
         {loader:.0} us (goal {GOAL_SHARE}x)"
    );
    let json = json!({"bare_server_us": bare_s, "row_us": row, "rows": REPLICA_ROWS, "commands_per_entry": per_entry,
                      "flush_cpu_us": flush, "flushes_per_handshake": flushes, "us_per_handshake": floor,
                      "best_share": best});
    Some((line, json))
}

/// The three nodes' lease renewals during their handshake run (`gateway_lease_renewal_seconds`,
/// summed over the nodes): how long the cluster side took to commit them while every core was
/// busy with handshakes. Buckets are powers of two, so a quantile is a bucket's upper bound.
struct Renewals {
    count: f64,
    sum_s: f64,
    /// (upper bound in seconds, renewals at or below it), ascending.
    buckets: Vec<(f64, f64)>,
    fences: f64,
    /// Raft writes across the nodes in the run: commands, log entries (proposed batches), fsyncs.
    commands: f64,
    entries: f64,
    fsyncs: f64,
    /// What the followers forwarded to the leader: commands, and the requests that carried them.
    forwarded: [f64; 2],
    /// Where the accepted handshakes' `hello` heads came from, over the nodes: answered by the
    /// claim's own apply (the leader's), read back (a follower's).
    heads: [f64; 2],
}

impl Renewals {
    const METRIC: &'static str = "gateway_lease_renewal_seconds";

    fn between(before: &[HashMap<String, f64>], after: &[HashMap<String, f64>]) -> Renewals {
        let delta = |key: &str| -> f64 {
            after.iter().zip(before).map(|(a, b)| a.get(key).unwrap_or(&0.0) - b.get(key).unwrap_or(&0.0)).sum()
        };
        let prefix = format!("{}_bucket{{le=\"", Self::METRIC);
        let mut bounds: Vec<(f64, String)> = after[0]
            .keys()
            .filter_map(|k| Some((k.strip_prefix(&prefix)?.strip_suffix("\"}")?.parse().ok()?, k.clone())))
            .collect();
        bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        Renewals {
            count: delta(&format!("{}_count", Self::METRIC)),
            sum_s: delta(&format!("{}_sum", Self::METRIC)),
            buckets: bounds.into_iter().map(|(le, k)| (le, delta(&k))).collect(),
            fences: delta("gateway_fence_events_total"),
            // Only a leader's local writes count as proposed batches; every node syncs its log.
            commands: delta("gateway_proposed_commands_total"),
            entries: delta("gateway_proposed_batches_total"),
            fsyncs: delta("gateway_log_fsyncs_total"),
            forwarded: ["commands", "batches"].map(|k| delta(&format!("gateway_forwarded_{k}_total"))),
            heads: ["claim", "read"].map(|r| delta(&format!("gateway_handshake_stream_heads_total{{result=\"{r}\"}}"))),
        }
    }

    /// The upper bound (ms) of the bucket holding quantile `q`.
    fn quantile_ms(&self, q: f64) -> Option<f64> {
        let want = (self.count * q).ceil().max(1.0);
        self.buckets.iter().find(|(_, n)| *n >= want).map(|(le, _)| le * 1000.0)
    }

    fn json(&self) -> serde_json::Value {
        json!({"count": self.count, "mean_ms": self.mean_ms(), "p50_le_ms": self.quantile_ms(0.5),
               "p99_le_ms": self.quantile_ms(0.99), "max_le_ms": self.quantile_ms(1.0), "fences": self.fences,
               "commands": self.commands, "entries": self.entries, "fsyncs_all_nodes": self.fsyncs,
               "forwarded": {"commands": self.forwarded[0], "requests": self.forwarded[1]},
               "stream_heads": {"claim": self.heads[0], "read": self.heads[1]}})
    }

    fn mean_ms(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum_s / self.count * 1000.0)
    }
}

impl std::fmt::Display for Renewals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        write!(
            f,
            "gateway 3 nodes, lease renewals during the run: {} committed, mean {} ms, p50 <= {} ms, p99 <= {} ms, \
             max <= {} ms; fences {}; raft: {} commands in {} entries ({:.1} per entry), {} fsyncs on the three nodes, {} forwarded in {} requests ({:.1} a request); \
             hello heads: {} from the claim, {} read",
            self.count,
            self.mean_ms().map_or("-".into(), |v| format!("{v:.1}")),
            ms(self.quantile_ms(0.5)),
            ms(self.quantile_ms(0.99)),
            ms(self.quantile_ms(1.0)),
            self.fences,
            self.commands,
            self.entries,
            self.commands / self.entries.max(1.0),
            self.fsyncs,
            self.forwarded[0],
            self.forwarded[1],
            self.forwarded[0] / self.forwarded[1].max(1.0),
            self.heads[0],
            self.heads[1]
        )
    }
}

#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    /// Device secret: a token is minted for each device (the gateway); None for the bare server.
    secret: Option<String>,
    /// Whether the node may steer the device (`steer=on`, what real devices send: placement reads
    /// the device's route and floor before the claim); `steer=off` skips that read.
    steer: bool,
    /// Whether every handshake is a device's first (a new id, its token minted for it), as when
    /// a fleet first connects: the node holds no row for it, so placement reads the store.
    fresh: bool,
}

impl Target {
    /// The `Authorization` header line for `device` (a token valid for an hour), or none for the
    /// bare server. Minted once per device, as a device holds its token across reconnects: the
    /// loader's CPU counts against the goal, and minting is not the servers' work.
    fn auth(&self, device: &str) -> String {
        match &self.secret {
            Some(s) => {
                let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                let token = gateway::token::mint(s.as_bytes(), device, 0, exp + 3600).expect("mint token");
                format!("Authorization: Bearer {token}\r\n")
            }
            None => String::new(),
        }
    }

    /// The upgrade request with `auth` (from [`Target::auth`]).
    fn request(&self, auth: &str, attempt: u64) -> String {
        format!(
            "GET /ws?attempt={attempt}&steer={} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{auth}\r\n",
            if self.steer { "on" } else { "off" },
            self.addr
        )
    }
}

#[derive(Default)]
struct Run {
    ok: u64,
    elapsed: Duration,
    lat_us: Vec<u64>,
    errors: BTreeMap<String, u64>,
    /// CPU time (user + system) over the run: the server's processes together, this loader.
    cpu_us: (u64, u64),
    /// Context switches of the server's threads over the run (every process together).
    switches: u64,
    /// The servers' CPU time (µs) over the run by thread name, every process together; what the
    /// threads alive at the end do not account for under [`ThreadCpu::REST`].
    by_thread: BTreeMap<String, u64>,
}

impl Run {
    fn rate(&self) -> f64 {
        if self.elapsed.is_zero() {
            0.0
        } else {
            self.ok as f64 / self.elapsed.as_secs_f64()
        }
    }

    /// CPU microseconds per handshake: the server's processes together, the loader.
    fn cpu_per(&self) -> Option<(f64, f64)> {
        (self.ok > 0).then(|| (self.cpu_us.0 as f64 / self.ok as f64, self.cpu_us.1 as f64 / self.ok as f64))
    }

    /// Context switches of the server's threads per handshake: each is a thread that waited
    /// (parked, or blocked on a lock or the disk) or was preempted, what the hand-offs between
    /// runtimes, the blocking pool and the log writer cost beyond their CPU share.
    fn switches_per(&self) -> Option<f64> {
        (self.ok > 0).then(|| self.switches as f64 / self.ok as f64)
    }

    fn pct(&self, q: f64) -> Option<f64> {
        let n = self.lat_us.len();
        (n > 0).then(|| self.lat_us[((n - 1) as f64 * q).round() as usize] as f64 / 1000.0)
    }
}

/// Connects and upgrades: the open stream once the `101` head is read, or why not.
async fn upgrade(t: &Target, request: &str) -> Result<TcpStream, String> {
    let mut s = tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(t.addr))
        .await
        .map_err(|_| "connect_timeout".to_string())?
        .map_err(|_| "connect".to_string())?;
    s.write_all(request.as_bytes()).await.map_err(|_| "write".to_string())?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(STEP_TIMEOUT, s.read(&mut buf))
            .await
            .map_err(|_| "read_timeout".to_string())?
            .map_err(|_| "read".to_string())?;
        if n == 0 {
            return Err("eof".into());
        }
        head.extend_from_slice(&buf[..n]);
    }
    match head.get(9..12) {
        Some(b"101") => Ok(s),
        Some(code) => Err(String::from_utf8_lossy(code).into_owned()),
        None => Err("short".into()),
    }
}

/// C tasks looping handshake + abortive close for `secs` over `targets` (task i on i mod n),
/// with the CPU time the server's processes `pids` and this loader used meanwhile and the
/// server's context switches.
async fn handshakes(targets: &[Target], pids: &[u32], conc: usize, secs: u64, tag: &str) -> Run {
    let cpu = || (pids.iter().map(|p| support::cpu_us(*p).unwrap_or(0)).sum::<u64>(), support::cpu_us(0).unwrap_or(0));
    let switches = || pids.iter().map(|p| support::switches(*p)).sum::<u64>();
    let cpu_before = cpu();
    let switches_before = switches();
    let threads_before = ThreadCpu::read(pids);
    let until = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let tasks: Vec<_> = (0..conc)
        .map(|i| {
            let t = targets[i % targets.len()].clone();
            let device = format!("hs-{tag}-{i}");
            let auth = t.auth(&device);
            tokio::spawn(async move {
                let mut run = Run::default();
                let mut attempt = 0;
                while Instant::now() < until {
                    attempt += 1;
                    let req = if t.fresh {
                        t.request(&t.auth(&format!("{device}-{attempt}")), 1)
                    } else {
                        t.request(&auth, attempt)
                    };
                    let t0 = Instant::now();
                    match upgrade(&t, &req).await {
                        Ok(s) => {
                            run.lat_us.push(t0.elapsed().as_micros() as u64);
                            run.ok += 1;
                            // A zero linger resets at once (it is a non-zero one that blocks on drop).
                            #[allow(deprecated)]
                            let _ = s.set_linger(Some(Duration::ZERO));
                        }
                        Err(e) => *run.errors.entry(e).or_default() += 1,
                    }
                }
                run
            })
        })
        .collect();
    let mut all = Run::default();
    for t in tasks {
        let r = t.await.expect("handshake task");
        all.ok += r.ok;
        all.lat_us.extend(r.lat_us);
        for (k, v) in r.errors {
            *all.errors.entry(k).or_default() += v;
        }
    }
    all.elapsed = start.elapsed();
    all.by_thread = ThreadCpu::since(&threads_before);
    let cpu_after = cpu();
    all.switches = switches().saturating_sub(switches_before);
    all.cpu_us = (cpu_after.0.saturating_sub(cpu_before.0), cpu_after.1.saturating_sub(cpu_before.1));
    all.lat_us.sort_unstable();
    all
}

/// Resident memory of `pid` once it has settled (two readings 300 ms apart within 1 %).
async fn settled_rss(pid: u32) -> u64 {
    let mut last = rss(pid);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = rss(pid);
        if now.abs_diff(last) * 100 <= last {
            return now;
        }
        last = now;
    }
    last
}

/// Holds `n` raw upgraded connections that never read; bytes of `pid`'s RSS per connection, and
/// its settled RSS before the first (what the process holds for itself).
async fn idle_raw(targets: &[Target], pid: u32, n: usize, tag: &str) -> (u64, u64) {
    let before = settled_rss(pid).await;
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let t = &targets[i % targets.len()];
        match upgrade(t, &t.request(&t.auth(&format!("idle-{tag}-{i}")), 1)).await {
            Ok(s) => held.push(s),
            Err(e) => panic!("idle connection {i}: {e}"),
        }
    }
    let after = settled_rss(pid).await;
    drop(held);
    (after.saturating_sub(before) / n as u64, before)
}

/// Holds `n` devices on the project's client, started so that at most `in_flight` are still
/// connecting at any time; bytes of the node's RSS per connection once settled, and again after
/// the node's next allocator trim if one comes within [`TRIM_WAIT`].
async fn idle_client(
    targets: &[Target],
    node: &support::NodeProc,
    n: usize,
    tag: &str,
    in_flight: usize,
) -> (u64, Option<u64>) {
    use gateway::client::device::{Device, DeviceConfig, Event, MemoryStore};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let pid = node.pid;
    let trims = || async { support::scrape(&node.cluster_addr).await.get("gateway_allocator_trims_total").copied() };
    let before = settled_rss(pid).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let up = Arc::new(AtomicUsize::new(0));
    let secret = targets[0].secret.clone().expect("a gateway target");
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in 0..n {
        while i.saturating_sub(up.load(Ordering::Relaxed)) >= in_flight {
            assert!(Instant::now() < deadline, "only {} of {i} devices connected", up.load(Ordering::Relaxed));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let t = &targets[i % targets.len()];
        let device = format!("idlec-{tag}-{i}");
        let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let token = gateway::token::mint(secret.as_bytes(), &device, 0, exp + 3600).expect("mint token");
        let cfg = DeviceConfig::new(&format!("ws://{}", t.addr), &device, &token, 0);
        let (up, stop) = (up.clone(), stop.clone());
        tokio::spawn(async move {
            let events = move |e: Event| {
                if matches!(e, Event::Connected { .. }) {
                    up.fetch_add(1, Ordering::Relaxed);
                }
            };
            Device::new(cfg, Box::new(MemoryStore::new(0))).run(events, stop).await
        });
    }
    while up.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "only {} of {n} devices connected", up.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Read before the memory settles: a trim while it settles is the next trim too.
    let trims_then = trims().await;
    let after = settled_rss(pid).await;
    let until = Instant::now() + TRIM_WAIT;
    let mut trimmed = None;
    // A build without the metric has nothing to wait for.
    while trims_then.is_some() && trimmed.is_none() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if trims().await > trims_then {
            trimmed = Some(settled_rss(pid).await.saturating_sub(before) / n as u64);
        }
    }
    stop.cancel();
    (after.saturating_sub(before) / n as u64, trimmed)
}

/// The reference server.
mod bare {
    use super::*;
    use fastwebsockets::{upgrade, OpCode, WebSocketError};
    use http_body_util::Empty;
    use hyper::body::{Bytes, Incoming};
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper::{Request, Response};
    use hyper_util::rt::TokioIo;
    /// Starts this bench as the bare server; returns the child and its address.
    pub fn spawn() -> (Child, SocketAddr) {
        let (child, line) = super::respawn(&[(BARE_ROLE, "1".as_ref())]);
        (child, line.trim().parse().expect("bare server address"))
    }

    async fn hold(fut: upgrade::UpgradeFut) -> Result<(), WebSocketError> {
        let mut ws = fut.await?;
        loop {
            let frame = ws.read_frame().await?;
            if frame.opcode == OpCode::Close {
                return Ok(());
            }
        }
    }

    async fn handle(mut req: Request<Incoming>) -> Result<Response<Empty<Bytes>>, WebSocketError> {
        let (response, fut) = upgrade::upgrade(&mut req)?;
        tokio::spawn(async move {
            let _ = hold(fut).await;
        });
        Ok(response)
    }

    pub fn serve() {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            println!("{}", listener.local_addr().expect("addr"));
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                tokio::spawn(async move {
                    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(handle));
                    let _ = conn.with_upgrades().await;
                });
            }
        });
    }
}
