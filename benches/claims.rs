//! Claim throughput of a real three-process cluster: `cargo bench --bench claims`.
//!
//! Starts three `gateway` processes on loopback ephemeral ports with production timing (n1
//! bootstraps, n2/n3 start `--standby` and are joined with the CLI), then for each concurrency C runs
//! C tasks that loop `POST /v1/devices/{id}/claim` on fresh devices for `CLAIMS_BENCH_SECS` seconds
//! (default 5), once sending every claim to the leader and once spreading them over all three nodes
//! (followers forward to the leader). The leader's `/metrics` is scraped before and after each run
//! to show how claims were folded into log entries and fsyncs.
//!
//! A publish phase follows: for each C, C tasks loop `POST /v1/devices/{id}/messages` with a small
//! JSON body for the same duration, each task on its own device claimed during the claims phase
//! (publishing needs a stream, which the first claim creates), again via the leader and via all
//! nodes. `HttpClient` has no way to add request headers, so publishes carry no `Idempotency-Key`
//! (valid: the key is optional). Prints figures only, asserts nothing.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway::http::HttpClient;
use serde_json::{json, Value};

const CONCURRENCY: [usize; 3] = [1, 8, 64];
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);
const SETTLE_BOUND: Duration = Duration::from_secs(60);
const LEASE_MS: &str = "10000";

fn main() {
    let secs: u64 = std::env::var("CLAIMS_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let mut cluster = Cluster::new();
    for name in ["n1", "n2", "n3"] {
        cluster.spawn(&rt, name);
    }
    for i in 1..3 {
        let out = cluster.cli(&[
            "join",
            "--cluster",
            &cluster.nodes[0].cluster_addr,
            "--node",
            &cluster.nodes[i].cluster_addr,
        ]);
        assert!(out.0 == Some(0), "join {} failed: {out:?}", cluster.nodes[i].name);
    }
    let start = Instant::now();
    let leader = loop {
        match cluster.settled() {
            Ok(leader) => break leader,
            Err(e) if start.elapsed() > SETTLE_BOUND => panic!("cluster did not settle: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let all: Vec<String> = cluster.nodes.iter().map(|n| n.cluster_addr.clone()).collect();
    println!(
        "cluster up in {:?}: leader {leader}, nodes {all:?}, {} s per run, {} cpus, loadavg {}",
        cluster.started.elapsed(),
        secs,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );

    // A short warm-up so the first measured run does not pay for connection setup and page faults.
    rt.block_on(run(&cluster.secret, &all, 8, Duration::from_secs(1), "warmup", &Op::Claim));

    // Devices claimed at least once (one per claiming task), reused as publish targets.
    let mut claimed: Vec<String> = Vec::new();
    let rows = table(&rt, &cluster, &all, secs, Op::Claim, &mut claimed);
    claimed.sort();
    claimed.dedup();
    let mut none = Vec::new();
    let publish = table(&rt, &cluster, &all, secs, Op::Publish(Arc::new(claimed)), &mut none);
    println!(
        "{}",
        json!({"bench": "claims", "secs_per_run": secs, "lease_ms": LEASE_MS.parse::<u64>().unwrap_or(0),
               "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()), "runs": rows,
               "publish": publish, "publish_idempotency_key": false})
    );
    drop(cluster);
}

/// Which request a table's runs send.
enum Op {
    Claim,
    /// Publish to these devices (all claimed before); task `t` uses `devices[t % len]`.
    Publish(Arc<Vec<String>>),
}

/// Prints a titled table, one row per (C, via), and returns the rows as JSON. Claim runs add the
/// devices they claimed to `claimed`.
fn table(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    all: &[String],
    secs: u64,
    op: Op,
    claimed: &mut Vec<String>,
) -> Vec<Value> {
    let (title, unit, per_fsync) = match &op {
        Op::Claim => ("claim", "claims/s", "claims/fsync"),
        Op::Publish(devices) => {
            assert!(!devices.is_empty(), "no claimed devices to publish to");
            ("publish", "publish/s", "writes/fsync")
        }
    };
    let header = format!(
        "{:>3} | {:<6} | {:>9} | {:>7} | {:>7} | {:>12} | {:>13} | {:>15} | {}",
        "C", "via", unit, "p50 ms", "p99 ms", "cmds/entry", "entries/fsync", per_fsync, "errors"
    );
    println!("\n{title}\n{header}\n{}", "-".repeat(header.len() + 8));
    let mut rows = Vec::new();
    for c in CONCURRENCY {
        for via in ["leader", "all"] {
            let leader = cluster.leader().unwrap_or_else(|e| panic!("no leader before run: {e}"));
            let targets = if via == "leader" { vec![leader.clone()] } else { all.to_vec() };
            let before = rt.block_on(scrape(&leader));
            let load_before = loadavg();
            let tag = format!("{c}{via}");
            let r = rt.block_on(run(&cluster.secret, &targets, c, Duration::from_secs(secs), &tag, &op));
            claimed.extend(r.claimed.iter().cloned());
            let after = rt.block_on(scrape(&leader));
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
            let mut note = String::new();
            if leader_after != leader {
                note = format!(" (leader changed {leader} -> {leader_after})");
            }
            if let Op::Publish(devices) = &op {
                if devices.len() < c {
                    note += &format!(" (only {} claimed devices: tasks share)", devices.len());
                }
            }
            println!(
                "{c:>3} | {via:<6} | {rate:>9.0} | {:>7.2} | {:>7.2} | {:>12.2} | {:>13.2} | {:>15.2} | {errors}{note}",
                r.p50_ms,
                r.p99_ms,
                ratio(cmds, batches),
                ratio(entries, fsyncs),
                ratio(cmds, fsyncs),
            );
            let (count_key, rate_key, per_fsync_key) = match &op {
                Op::Claim => ("claims", "claims_per_s", "claims_per_fsync"),
                Op::Publish(_) => ("publishes", "publishes_per_s", "writes_per_fsync"),
            };
            rows.push(json!({
                "c": c, "via": via, "secs": r.elapsed.as_secs_f64(), count_key: r.ok, rate_key: rate,
                "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "max_ms": r.max_ms,
                "leader_delta": {
                    "log_fsyncs": fsyncs, "log_entries": entries,
                    "proposed_commands": cmds, "proposed_batches": batches,
                    "claims_accepted": d("gateway_claims_total{result=\"accepted\"}"),
                },
                "commands_per_entry": ratio(cmds, batches), "entries_per_fsync": ratio(entries, fsyncs),
                per_fsync_key: ratio(cmds, fsyncs),
                "errors": r.errors, "leader": leader, "leader_after": leader_after,
                "loadavg_before": load_before, "loadavg_after": loadavg(),
            }));
        }
    }
    rows
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
/// own, or publishing `{"n": i}` to their own already-claimed device. Task `t` sends its n-th
/// request to `targets[(t + n) % len]`.
async fn run(secret: &str, targets: &[String], c: usize, dur: Duration, tag: &str, op: &Op) -> RunResult {
    let start = Instant::now();
    let deadline = start + dur;
    let mut handles = Vec::with_capacity(c);
    for t in 0..c {
        let client = HttpClient::new(secret.as_bytes());
        let targets = targets.to_vec();
        let prefix = format!("b{tag}-{t}");
        let publish_to = match op {
            Op::Claim => None,
            Op::Publish(devices) => Some(devices[t % devices.len()].clone()),
        };
        handles.push(tokio::spawn(async move {
            let mut lat_us: Vec<u32> = Vec::new();
            let mut errors: BTreeMap<String, u64> = BTreeMap::new();
            let mut first_claimed: Option<String> = None;
            let mut n: u64 = 0;
            while Instant::now() < deadline {
                let addr = &targets[(t + n as usize) % targets.len()];
                let (path, body) = match &publish_to {
                    None => (
                        format!("/v1/devices/{prefix}-{n}/claim"),
                        json!({"conn": ((t as u64) << 40) | n, "epoch": 0, "attempt": 1}),
                    ),
                    Some(device) => (format!("/v1/devices/{device}/messages"), json!({"n": n})),
                };
                let sent = Instant::now();
                let res = client.post_json(addr, &path, &body, CLAIM_TIMEOUT).await;
                let took = sent.elapsed();
                match res {
                    Ok((status, _)) if status.as_u16() == 200 => {
                        lat_us.push(took.as_micros().min(u32::MAX as u128) as u32);
                        if publish_to.is_none() && first_claimed.is_none() {
                            first_claimed = Some(format!("{prefix}-{n}"));
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

/// `GET /metrics` (unauthenticated Prometheus text) as series -> value; labels stay in the key.
async fn scrape(addr: &str) -> HashMap<String, f64> {
    let client = HttpClient::new(b"unused");
    let (status, body) =
        client.get(addr, "/metrics", Duration::from_secs(5)).await.unwrap_or_else(|e| panic!("scrape {addr}: {e}"));
    assert!(status.is_success(), "scrape {addr}: {status}");
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0").local_addr().expect("local addr").port()
}

struct NodeProc {
    name: String,
    cluster_addr: String,
    stderr: PathBuf,
}

/// Owns the temp dir and every child: all are killed on drop (also while panicking); the dir is
/// removed unless a panic is unwinding, in which case it is kept and each node's stderr tail printed.
struct Cluster {
    dir: PathBuf,
    secret: String,
    secret_file: PathBuf,
    nodes: Vec<NodeProc>,
    children: Vec<Child>,
    started: Instant,
}

impl Cluster {
    fn new() -> Cluster {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("gateway-bench-claims-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&dir).expect("create bench temp dir");
        let secret = random_hex(64, nanos as u64);
        let secret_file = dir.join("cluster.secret");
        fs::write(&secret_file, format!("{secret}\n")).expect("write secret");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions(&secret_file, fs::Permissions::from_mode(0o600));
        }
        Cluster { dir, secret, secret_file, nodes: Vec::new(), children: Vec::new(), started: Instant::now() }
    }

    /// Starts `name` (the first one bootstraps, the others wait `--standby`) and waits for `/healthz`.
    fn spawn(&mut self, rt: &tokio::runtime::Runtime, name: &str) {
        let cluster_addr = format!("127.0.0.1:{}", free_port());
        let listen = format!("127.0.0.1:{}", free_port());
        let data = self.dir.join(name);
        let stderr = self.dir.join(format!("{name}.log"));
        let log = File::create(&stderr).expect("create node log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
        cmd.args(["serve", "--name", name, "--listen", &listen, "--cluster-listen", &cluster_addr])
            .arg("--data-dir")
            .arg(&data)
            .arg("--cluster-secret-file")
            .arg(&self.secret_file)
            .args(["--lease-ms", LEASE_MS]);
        if !self.nodes.is_empty() {
            cmd.arg("--standby");
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::from(log.try_clone().expect("dup log"))).stderr(Stdio::from(log));
        scrub_env(&mut cmd);
        self.children.push(cmd.spawn().expect("spawn gateway"));
        self.nodes.push(NodeProc { name: name.to_string(), cluster_addr: cluster_addr.clone(), stderr });
        let client = HttpClient::new(self.secret.as_bytes());
        let start = Instant::now();
        loop {
            if let Ok(Some(st)) = self.children.last_mut().expect("just pushed").try_wait() {
                panic!("{name} exited during startup: {st}");
            }
            let r = rt.block_on(client.get(&cluster_addr, "/healthz", Duration::from_secs(2)));
            if matches!(r, Ok((s, _)) if s.as_u16() == 200) {
                break;
            }
            assert!(start.elapsed() < SETTLE_BOUND, "{name} not healthy on {cluster_addr}: {r:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `gateway <args> --cluster-secret-file F`: (exit code, stdout, stderr).
    fn cli(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
        cmd.args(args).arg("--cluster-secret-file").arg(&self.secret_file).stdin(Stdio::null());
        scrub_env(&mut cmd);
        let out = cmd.output().expect("run gateway CLI");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn status(&self, via: usize) -> Result<Value, String> {
        let (code, out, err) = self.cli(&["status", "--cluster", &self.nodes[via].cluster_addr, "--json"]);
        if code != Some(0) {
            return Err(format!("status exit {code:?}: {err}"));
        }
        serde_json::from_str(&out).map_err(|e| format!("status json: {e}: {out}"))
    }

    /// The leader's cluster address once three voters are all live, from n1's point of view.
    fn settled(&self) -> Result<String, String> {
        let s = self.status(0)?;
        let members = s["members"].as_array().ok_or("no members")?;
        let voters = members.iter().filter(|m| m["role"] == "voter").count();
        let live = members.iter().filter(|m| m["state"] == "live").count();
        if voters != 3 || live != 3 || members.len() != 3 {
            return Err(format!("{voters} voters, {live} live of {}", members.len()));
        }
        self.leader_of(&s)
    }

    fn leader(&self) -> Result<String, String> {
        self.leader_of(&self.status(0)?)
    }

    fn leader_of(&self, s: &Value) -> Result<String, String> {
        let id = s["leader"]["id"].as_u64().ok_or("no leader")?;
        let members = s["members"].as_array().ok_or("no members")?;
        let m = members.iter().find(|m| m["id"].as_u64() == Some(id)).ok_or("leader not a member")?;
        m["cluster_addr"].as_str().map(str::to_string).ok_or_else(|| "leader has no cluster_addr".to_string())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("[bench] failed; kept {}", self.dir.display());
            for n in &self.nodes {
                eprintln!("----- {} ({}) -----\n{}", n.name, n.stderr.display(), tail(&n.stderr, 40));
            }
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Children must not pick up GATEWAY_* settings from the environment running the bench.
fn scrub_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GATEWAY_") {
            cmd.env_remove(k);
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else { return String::new() };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(32 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `chars` hex digits from a seeded xorshift64* (a bench secret, not a production one).
fn random_hex(chars: usize, seed: u64) -> String {
    let mut x = (seed ^ u64::from(std::process::id()).rotate_left(32)) | 1;
    (0..chars)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            char::from_digit((x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 60) as u32, 16).expect("nibble")
        })
        .collect()
}
