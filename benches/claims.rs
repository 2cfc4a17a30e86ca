//! Claim throughput of a real three-process cluster: `cargo bench --bench claims`
//! (`CLAIMS_BENCH_C=1,256` runs only those concurrencies; `CLAIMS_BENCH_ROUNDS=3` runs each
//! concurrency's claim rows and references three times in turn, and the summaries give medians).
//!
//! Starts three `gateway` processes on loopback ephemeral ports with production timing (n1
//! bootstraps, n2/n3 start `--standby` and are joined with the CLI; `GATEWAY_BENCH_BIN` runs
//! another build), prints the machine's floor (fsync, loopback round trip), then for each
//! concurrency C (1, 8, 64, 256) runs
//! C tasks that loop `POST /v1/devices/{id}/claim` on fresh devices for `CLAIMS_BENCH_SECS` seconds
//! (default 5; ids count up per task, or come in random key order with `CLAIMS_BENCH_IDS=random`;
//! `CLAIMS_BENCH_HELD=N` claims a fleet of N devices first, unmeasured, so that the runs claim
//! against a state of that size),
//! once sending every claim to the leader and once spreading them over all three nodes
//! (followers forward to the leader). Every node's `/metrics` is scraped before and after each run
//! to show how claims were folded into log entries and fsyncs (the leader's), how many context
//! switches each claim cost and how many snapshots the nodes built, and each process's CPU time
//! is read from `/proc` to print CPU microseconds per request on the leader, the two followers
//! together and this loader.
//!
//! A publish phase follows: for each C, C tasks loop `POST /v1/devices/{id}/messages` with a small
//! JSON body for the same duration, each task on its own device claimed during the claims phase
//! (publishing needs a stream, which the first claim creates), again via the leader and via all
//! nodes. `HttpClient` has no way to add request headers, so publishes carry no `Idempotency-Key`
//! (valid: the key is optional). A route-lookup phase follows the same way: C tasks loop
//! `GET /v1/devices/{id}/route` on those devices (a read of the node's own applied state, no
//! write). Prints figures only, asserts nothing.
//!
//! Side by side in the same run, when PostgreSQL's server binaries and `pgbench` are installed
//! (`support::postgres`): a throwaway PostgreSQL in the same temp dir, default durability, gets
//! the seed design's claim transaction from `pgbench -c C` after each C's gateway rows (`pg`); a
//! summary prints gateway/PostgreSQL per C against issue 11's goal. A second throwaway PostgreSQL
//! with a synchronous standby (a commit waits for the standby's flush too, as a claim waits for a
//! second node's) gets the same runs (`pg-sb`) and a summary of its own, without a goal:
//! the like-for-like durability reference. `CLAIMS_BENCH_PG_STANDBY=0` leaves it out.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway::http::HttpClient;
use serde_json::{json, Value};
use support::postgres::{self, Postgres, Setup};
use support::{loadavg, median, scrape, Cluster, ThreadCpu};

const CONCURRENCY: [usize; 4] = [1, 8, 64, 256];
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);
const LEASE_MS: &str = "10000";

fn main() {
    let secs: u64 = std::env::var("CLAIMS_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let cluster = Cluster::form(&rt, "claims", 3, &["--lease-ms", LEASE_MS]);
    let leader = cluster.leader().unwrap_or_else(|e| panic!("no leader: {e}"));
    let floor = support::floor(500);
    let support::Floor { fsync_us, fsync3_us, over_us, over3_us, rtt_us, quorum_us, halt_poll_ns, .. } = floor;
    let all: Vec<String> = cluster.nodes.iter().map(|n| n.cluster_addr.clone()).collect();
    println!(
        "cluster up in {:?}: leader {leader}, nodes {all:?}, {} s per run, device ids {}, {} cpus, \
         loadavg {}; floor: {}",
        cluster.started.elapsed(),
        secs,
        if random_ids() { "in random order" } else { "counting up per task" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
        floor.describe()
    );

    let standby = std::env::var("CLAIMS_BENCH_PG_STANDBY").map_or(true, |v| v != "0");
    // The standby reference only beside the single one (without PostgreSQL, one line says so).
    let mut pgs: Vec<Postgres> = Postgres::start("claims", Setup::Single).into_iter().collect();
    if standby && !pgs.is_empty() {
        pgs.extend(Postgres::start("claims", Setup::SyncStandby));
    }

    // A short warm-up so the first measured run does not pay for connection setup and page faults.
    rt.block_on(run(&cluster.secret, &all, 8, Duration::from_secs(1), "warmup", &Op::Claim));
    for pg in &pgs {
        pg.run(8, 0, 1);
    }

    // `CLAIMS_BENCH_HELD=N`: a fleet of N devices claimed first (256 clients via the leader, not
    // measured), so that every run claims against a state of that size, as a cluster holding a
    // real fleet does (each snapshot writes the whole state).
    let held: u64 = std::env::var("CLAIMS_BENCH_HELD").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let (mut filled, fill_started) = (0, std::time::Instant::now());
    while filled < held {
        let r = rt.block_on(run(
            &cluster.secret,
            std::slice::from_ref(&leader),
            256,
            Duration::from_secs(5),
            &format!("held{filled}"),
            &Op::Claim,
        ));
        assert!(r.ok > 0, "no claim accepted while filling the held fleet: {:?}", r.errors);
        filled += r.ok;
        println!("held fleet: {filled} of {held} devices claimed in {:.0?}", fill_started.elapsed());
    }

    // Devices claimed at least once (one per claiming task), reused as publish targets.
    let mut claimed: Vec<String> = Vec::new();
    let mut refs: Vec<(&Postgres, Vec<postgres::PgRun>)> = pgs.iter().map(|p| (p, Vec::new())).collect();
    let rounds = std::env::var("CLAIMS_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1usize).max(1);
    let rows = table(&rt, &cluster, &all, (secs, rounds), Op::Claim, &mut claimed, &mut refs);
    // Prints the gateway/PostgreSQL summaries; the servers are stopped before the publish phase.
    let report = |setup: Setup| {
        let (pg, runs) = refs.iter().find(|(p, _)| p.setup == setup)?;
        let mut json = pg.report(runs);
        json["vs_gateway"] = json!(summary(setup, &rows, runs));
        Some(json)
    };
    let (postgres, postgres_sync_standby) = (report(Setup::Single), report(Setup::SyncStandby));
    drop(refs);
    drop(pgs);
    claimed.sort();
    claimed.dedup();
    let mut none = Vec::new();
    let claimed = Arc::new(claimed);
    let publish = table(&rt, &cluster, &all, (secs, 1), Op::Publish(claimed.clone()), &mut none, &mut []);
    let route = table(&rt, &cluster, &all, (secs, 1), Op::Route(claimed), &mut none, &mut []);
    println!(
        "{}",
        json!({"bench": "claims", "fsync_us": fsync_us, "fsync3_us": fsync3_us, "over_us": over_us, "over3_us": over3_us, "over_paced_us": floor.paced_us, "over_paced_cpu_us": floor.paced_cpu_us, "rtt_us": rtt_us, "quorum_us": quorum_us, "halt_poll_ns": halt_poll_ns, "secs_per_run": secs, "random_ids": random_ids(), "lease_ms": LEASE_MS.parse::<u64>().unwrap_or(0),
               "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()), "runs": rows,
               "publish": publish, "publish_idempotency_key": false, "route": route, "postgres": postgres,
               "postgres_sync_standby": postgres_sync_standby})
    );
    drop(cluster);
}

/// `CLAIMS_BENCH_IDS=random`: fresh devices in random key order (see [`DeviceIds`]).
fn random_ids() -> bool {
    std::env::var("CLAIMS_BENCH_IDS").is_ok_and(|v| v == "random")
}

/// The fresh device ids of task `t` in the run tagged `tag`: `b{tag}-{t}-{n}` by default, so each
/// task's claims land next to each other in the state's key order (256 tasks: 256 places); with
/// `random`, `b{tag}-{hex}` where the hex is a 64-bit mix of `t` and `n` (splitmix64's
/// finalizer, a bijection, so every id is still fresh), which scatters them over the whole table
/// as a fleet of unrelated devices would.
struct DeviceIds {
    tag: String,
    t: usize,
    random: bool,
}

impl DeviceIds {
    fn nth(&self, n: u64) -> String {
        if !self.random {
            return format!("b{}-{}-{n}", self.tag, self.t);
        }
        let mut z = ((self.t as u64) << 40 | n).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        format!("b{}-{:016x}", self.tag, z ^ (z >> 31))
    }
}

/// `CLAIMS_BENCH_C` (e.g. `1,256`), or every level of [`CONCURRENCY`].
fn concurrency() -> Vec<usize> {
    match std::env::var("CLAIMS_BENCH_C") {
        Ok(list) => list.split(',').filter_map(|c| c.trim().parse().ok()).collect(),
        Err(_) => CONCURRENCY.to_vec(),
    }
}

/// Which request a table's runs send.
enum Op {
    Claim,
    /// Publish to these devices (all claimed before); task `t` uses `devices[t % len]`.
    Publish(Arc<Vec<String>>),
    /// Look up these devices' routes (all claimed before), task `t` on `devices[t % len]`.
    Route(Arc<Vec<String>>),
}

impl Op {
    /// The devices a publish or a route lookup goes to.
    fn devices(&self) -> Option<&Arc<Vec<String>>> {
        match self {
            Op::Claim => None,
            Op::Publish(devices) | Op::Route(devices) => Some(devices),
        }
    }
}

/// Prints a titled table, one row per (C, round, via), and returns the rows as JSON. Claim runs
/// add the devices they claimed to `claimed`; in each round, a C's gateway rows are followed by a
/// run of each PostgreSQL reference in `pgs`, printed as its row (`pg`, `pg-sb`) and kept in its
/// list. Each run lasts `secs`; `rounds` rounds per C, one after the other.
fn table(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    all: &[String],
    (secs, rounds): (u64, usize),
    op: Op,
    claimed: &mut Vec<String>,
    pgs: &mut [(&Postgres, Vec<postgres::PgRun>)],
) -> Vec<Value> {
    let (title, unit, per_fsync) = match &op {
        Op::Claim => ("claim", "claims/s", "claims/fsync"),
        Op::Publish(devices) => {
            assert!(!devices.is_empty(), "no claimed devices to publish to");
            ("publish", "publish/s", "writes/fsync")
        }
        Op::Route(devices) => {
            assert!(!devices.is_empty(), "no claimed devices to look up");
            ("route lookup", "lookups/s", "writes/fsync")
        }
    };
    let header = format!(
        "{:>3} | {:<6} | {:>9} | {:>7} | {:>7} | {:>12} | {:>13} | {:>15} | {:>14} | {:>9} | {}",
        "C",
        "via",
        unit,
        "p50 ms",
        "p99 ms",
        "cmds/entry",
        "entries/fsync",
        per_fsync,
        "cpu us L F ld",
        "sw L F",
        "errors"
    );
    println!("\n{title}\n{header}\n{}", "-".repeat(header.len() + 8));
    let mut rows = Vec::new();
    for (c, round) in concurrency().into_iter().flat_map(|c| (1..=rounds).map(move |r| (c, r))) {
        for via in ["leader", "all"] {
            let leader = cluster.leader().unwrap_or_else(|e| panic!("no leader before run: {e}"));
            let targets = if via == "leader" { vec![leader.clone()] } else { all.to_vec() };
            let before_all = scrape_nodes(rt, cluster);
            let load_before = loadavg();
            let cpu_before = cpu(cluster, &leader);
            let threads_before = nodes_pids(cluster, &leader).map(|pids| ThreadCpu::read(&pids));
            // Fresh devices in every round: a device id from an earlier round has a floor.
            let tag = if round == 1 { format!("{c}{via}") } else { format!("{c}{via}r{round}") };
            let r = rt.block_on(run(&cluster.secret, &targets, c, Duration::from_secs(secs), &tag, &op));
            claimed.extend(r.claimed.iter().cloned());
            let cpu_after = cpu(cluster, &leader);
            let by_thread = threads_before.map(|before| ThreadCpu::since(&before));
            let after_all = scrape_nodes(rt, cluster);
            let none = HashMap::new();
            let before = before_all.get(&leader).unwrap_or(&none);
            let after = after_all.get(&leader).unwrap_or(&none);
            let (sw_before, sw_after) = (switches(&before_all, &leader), switches(&after_all, &leader));
            let leader_after = cluster.leader().unwrap_or_else(|e| format!("? ({e})"));
            let d = |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
            let (fsyncs, entries) = (d("gateway_log_fsyncs_total"), d("gateway_log_entries_total"));
            let (cmds, batches) = (d("gateway_proposed_commands_total"), d("gateway_proposed_batches_total"));
            let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
            let rate = r.ok as f64 / r.elapsed.as_secs_f64();
            let errors = if r.errors.is_empty() {
                "0".to_string()
            } else {
                r.errors.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(" ")
            };
            // Snapshots every node built during the run: each writes the whole state.
            let snapshots: f64 = after_all
                .iter()
                .map(|(node, m)| {
                    let built =
                        |m: &HashMap<String, f64>| m.get("gateway_snapshots_built_total").copied().unwrap_or(0.0);
                    built(m) - before_all.get(node).map_or(0.0, built)
                })
                .sum();
            let mut note = String::new();
            if snapshots > 0.0 {
                note += &format!(" ({snapshots} snapshots built)");
            }
            if rounds > 1 {
                note += &format!(" (round {round})");
            }
            if leader_after != leader {
                note += &format!(" (leader changed {leader} -> {leader_after})");
            }
            if let Some(devices) = op.devices() {
                if devices.len() < c {
                    note += &format!(" (only {} claimed devices: tasks share)", devices.len());
                }
            }
            // CPU microseconds per completed request: the leader, the two followers, the loader.
            let per = |i: usize| (cpu_after[i].saturating_sub(cpu_before[i])) as f64 / (r.ok.max(1) as f64);
            let cpu_per = [per(0), per(1), per(2)];
            let sw_per = [0, 1].map(|i| (sw_after[i] - sw_before[i]) / (r.ok.max(1) as f64));
            println!(
                "{c:>3} | {via:<6} | {rate:>9.0} | {:>7.2} | {:>7.2} | {:>12.2} | {:>13.2} | {:>15.2} | {:>4.0} {:>4.0} {:>4.0} | {:>4.1} {:>4.1} | {errors}{note}",
                r.p50_ms,
                r.p99_ms,
                ratio(cmds, batches),
                ratio(entries, fsyncs),
                ratio(cmds, fsyncs),
                cpu_per[0],
                cpu_per[1],
                cpu_per[2],
                sw_per[0],
                sw_per[1],
            );
            let (count_key, rate_key, per_fsync_key) = match &op {
                Op::Claim => ("claims", "claims_per_s", "claims_per_fsync"),
                Op::Publish(_) => ("publishes", "publishes_per_s", "writes_per_fsync"),
                Op::Route(_) => ("lookups", "lookups_per_s", "writes_per_fsync"),
            };
            rows.push(json!({
                "c": c, "round": round, "via": via, "secs": r.elapsed.as_secs_f64(), count_key: r.ok, rate_key: rate,
                "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "max_ms": r.max_ms,
                "leader_delta": {
                    "log_fsyncs": fsyncs, "log_entries": entries,
                    "proposed_commands": cmds, "proposed_batches": batches,
                    "claims_accepted": d("gateway_claims_total{result=\"accepted\"}"),
                },
                "commands_per_entry": ratio(cmds, batches), "entries_per_fsync": ratio(entries, fsyncs),
                per_fsync_key: ratio(cmds, fsyncs),
                "cpu_us_per_op": {"leader": cpu_per[0], "followers": cpu_per[1], "loader": cpu_per[2]},
                "cpu_us_per_op_by_thread": {"leader": per_op(&by_thread[0], r.ok), "followers": per_op(&by_thread[1], r.ok)},
                "switches_per_op": {"leader": sw_per[0], "followers": sw_per[1]},
                "snapshots_built": snapshots,
                "errors": r.errors, "leader": leader, "leader_after": leader_after,
                "loadavg_before": load_before, "loadavg_after": loadavg(),
            }));
        }
        for (pg, runs) in pgs.iter_mut() {
            let r = pg.run(c, round, secs);
            println!("{}{}", r.line, if rounds > 1 { format!(" (round {round})") } else { String::new() });
            runs.push(r);
        }
    }
    rows
}

/// Gateway claims/s over PostgreSQL's per C, printed and returned as JSON: each round's gateway
/// rows over that round's PostgreSQL run, and with several rounds the medians (each ratio's median
/// over the rounds, not a ratio of medians) and every round's leader ratio. Issue 11's goal
/// (against [`Setup::Single`]): ≥ 1× at 1 and 8 clients, ≥ 10× at 256.
fn summary(setup: Setup, gateway: &[Value], pg: &[postgres::PgRun]) -> Vec<Value> {
    let rate = |c: usize, round: usize, via: &str| {
        let row = gateway.iter().find(|r| r["c"] == c && r["round"] == round && r["via"] == via);
        row.and_then(|r| r["claims_per_s"].as_f64()).unwrap_or(f64::NAN)
    };
    let (title, pg_name) = match setup {
        Setup::Single => ("PostgreSQL", "postgres"),
        Setup::SyncStandby => ("PostgreSQL with a synchronous standby", "pg-sb"),
    };
    let header = format!(
        "{:>3} | {:>14} | {:>11} | {:>10} | {:>14} | {:>11} | {:>7} | rounds, leader / {}",
        "C",
        "gateway leader",
        "gateway all",
        pg_name,
        format!("leader / {}", setup.label()),
        format!("all / {}", setup.label()),
        "goal",
        setup.label()
    );
    let rounds = pg.iter().map(|p| p.round).max().unwrap_or(1);
    let what = if rounds > 1 { format!(", medians of {rounds} rounds") } else { String::new() };
    println!("\nclaims/s against {title}, side by side{what}\n{header}\n{}", "-".repeat(header.len() + 4));
    let mut cs: Vec<usize> = pg.iter().map(|p| p.c).collect();
    cs.dedup();
    let mut out = Vec::new();
    for c in cs {
        let runs: Vec<&postgres::PgRun> = pg.iter().filter(|p| p.c == c).collect();
        let column = |f: &dyn Fn(&postgres::PgRun) -> f64| median(runs.iter().map(|p| f(p)).collect());
        let by_leader: Vec<f64> = runs.iter().map(|p| rate(c, p.round, "leader") / p.claims_per_s).collect();
        let (l, a) = (column(&|p| rate(c, p.round, "leader")), column(&|p| rate(c, p.round, "all")));
        let (ratio_l, ratio_a) = (median(by_leader.clone()), column(&|p| rate(c, p.round, "all") / p.claims_per_s));
        let pg_rate = column(&|p| p.claims_per_s);
        let goal = match (setup, c) {
            (Setup::Single, 1 | 8) => Some(1.0),
            (Setup::Single, 256) => Some(10.0),
            _ => None,
        };
        let each: Vec<String> = by_leader.iter().map(|r| format!("{r:.2}x")).collect();
        println!(
            "{c:>3} | {l:>14.0} | {a:>11.0} | {pg_rate:>10.0} | {ratio_l:>13.2}x | {ratio_a:>10.2}x | {:>7} | {}",
            goal.map_or("-".to_string(), |g| format!(">= {g}x")),
            each.join(" ")
        );
        out.push(json!({"c": c, "gateway_leader": l, "gateway_all": a, "postgres": pg_rate,
                        "ratio_leader": ratio_l, "ratio_all": ratio_a, "goal": goal,
                        "rounds": runs.len(), "ratio_leader_rounds": by_leader}));
    }
    out
}

/// Every node's `/metrics`, by cluster address.
fn scrape_nodes(rt: &tokio::runtime::Runtime, cluster: &Cluster) -> HashMap<String, HashMap<String, f64>> {
    cluster.nodes.iter().map(|n| (n.cluster_addr.clone(), rt.block_on(scrape(&n.cluster_addr)))).collect()
}

/// Context switches so far (voluntary and involuntary, every thread, ended ones included: each
/// node's `gateway_process_*_context_switches_total`): the leader, both followers together. A
/// thread hand-off costs a switch on each side, so this counts hand-offs per request.
fn switches(nodes: &HashMap<String, HashMap<String, f64>>, leader: &str) -> [f64; 2] {
    let mut out = [0.0; 2];
    for (addr, m) in nodes {
        let count = |kind: &str| m.get(&format!("gateway_process_{kind}_context_switches_total")).copied();
        let total = count("voluntary").unwrap_or(0.0) + count("involuntary").unwrap_or(0.0);
        out[usize::from(addr != leader)] += total;
    }
    out
}

/// The pids of the leader and of the two followers.
fn nodes_pids(cluster: &Cluster, leader: &str) -> [Vec<u32>; 2] {
    let pids =
        |lead: bool| cluster.nodes.iter().filter(|n| (n.cluster_addr == leader) == lead).map(|n| n.pid).collect();
    [pids(true), pids(false)]
}

/// CPU microseconds a request by thread name (`device`, `cluster`, `raft-log`, the rest).
fn per_op(by_thread: &BTreeMap<String, u64>, ops: u64) -> BTreeMap<String, f64> {
    by_thread.iter().map(|(name, us)| (name.clone(), *us as f64 / ops.max(1) as f64)).collect()
}

/// CPU time used so far (µs): the leader, both followers together, this loader.
fn cpu(cluster: &Cluster, leader: &str) -> [u64; 3] {
    let mut out = [0u64; 3];
    for n in &cluster.nodes {
        let used = support::cpu_us(n.pid).unwrap_or(0);
        out[if n.cluster_addr == leader { 0 } else { 1 }] += used;
    }
    out[2] = support::cpu_us(0).unwrap_or(0);
    out
}

/// What one timed run measured from the client side.
struct RunResult {
    ok: u64,
    elapsed: Duration,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Non-200 answers by status, and transport failures by kind.
    errors: BTreeMap<String, u64>,
    /// Claim runs: the first device each task claimed (if any).
    claimed: Vec<String>,
}

/// C tasks, each with its own pooled client, until `dur` passes: claiming fresh devices of their
/// own, publishing `{"n": i}` to their own already-claimed device, or looking up that device's
/// route. Task `t` sends its n-th request to `targets[(t + n) % len]`.
async fn run(secret: &str, targets: &[String], c: usize, dur: Duration, tag: &str, op: &Op) -> RunResult {
    let start = Instant::now();
    let deadline = start + dur;
    let mut handles = Vec::with_capacity(c);
    for t in 0..c {
        let client = HttpClient::new(secret.as_bytes());
        let targets = targets.to_vec();
        let ids = DeviceIds { tag: tag.to_string(), t, random: random_ids() };
        let publish_to = op.devices().map(|devices| devices[t % devices.len()].clone());
        let lookup = matches!(op, Op::Route(_));
        handles.push(tokio::spawn(async move {
            let mut lat_us: Vec<u32> = Vec::new();
            let mut errors: BTreeMap<String, u64> = BTreeMap::new();
            let mut first_claimed: Option<String> = None;
            let mut n: u64 = 0;
            while Instant::now() < deadline {
                let addr = &targets[(t + n as usize) % targets.len()];
                let (path, body) = match (&publish_to, lookup) {
                    (None, _) => (
                        format!("/v1/devices/{}/claim", ids.nth(n)),
                        Some(json!({"conn": ((t as u64) << 40) | n, "epoch": 0, "attempt": 1})),
                    ),
                    (Some(device), false) => (format!("/v1/devices/{device}/messages"), Some(json!({"n": n}))),
                    (Some(device), true) => (format!("/v1/devices/{device}/route"), None),
                };
                let sent = Instant::now();
                let res = match &body {
                    Some(body) => client.post_json(addr, &path, body, CLAIM_TIMEOUT).await,
                    None => client.get(addr, &path, CLAIM_TIMEOUT).await,
                };
                let took = sent.elapsed();
                match res {
                    Ok((status, _)) if status.as_u16() == 200 => {
                        lat_us.push(took.as_micros().min(u32::MAX as u128) as u32);
                        if publish_to.is_none() && first_claimed.is_none() {
                            first_claimed = Some(ids.nth(n));
                        }
                    }
                    Ok((status, body)) => {
                        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let what = v["error"].as_str().unwrap_or("?");
                        *errors.entry(format!("{}/{what}", status.as_u16())).or_default() += 1;
                    }
                    Err(gateway::http::HttpError::Timeout { .. }) => *errors.entry("timeout".into()).or_default() += 1,
                    Err(gateway::http::HttpError::Connect { .. }) => *errors.entry("connect".into()).or_default() += 1,
                    Err(gateway::http::HttpError::Transport { .. }) => {
                        *errors.entry("transport".into()).or_default() += 1
                    }
                }
                n += 1;
            }
            (lat_us, errors, first_claimed)
        }));
    }
    let mut lat: Vec<u32> = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut claimed = Vec::new();
    for h in handles {
        let (l, e, first) = h.await.expect("bench task panicked");
        lat.extend(l);
        claimed.extend(first);
        for (k, v) in e {
            *errors.entry(k).or_default() += v;
        }
    }
    let elapsed = start.elapsed();
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            f64::NAN
        } else {
            lat[((lat.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
        }
    };
    RunResult { ok: lat.len() as u64, elapsed, p50_ms: pct(0.50), p99_ms: pct(0.99), max_ms: pct(1.0), errors, claimed }
}
