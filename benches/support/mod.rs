//! What the benches share: a cluster of real `gateway` processes on loopback ephemeral ports
//! (killed on drop, also on panic), `/metrics` scraping, and the machine figures printed beside
//! each result (load average, resident memory of a pid); `postgres` runs the claims bench's
//! PostgreSQL reference; `replica` measures what a replica pays a command with none of the
//! gateway's work (a bare row write; [`Floor::paced_cpu_us`] is a log flush's CPU at a node's pace).

#![allow(dead_code)] // each bench uses its own subset

// The tests' harness hands out loopback ports; the benches use the same code, so that no two of
// a bench's nodes (or a node and PostgreSQL) are given one port.
#[path = "../../tests/common/ports.rs"]
mod ports;
pub mod postgres;
mod procfs;
pub mod replica;

pub use ports::free_port;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gateway::http::HttpClient;
use serde_json::Value;

pub const SETTLE_BOUND: Duration = Duration::from_secs(60);

/// The gateway binary: `GATEWAY_BENCH_BIN` (to compare another build side by side) or this one.
pub fn gateway_bin() -> PathBuf {
    std::env::var_os("GATEWAY_BENCH_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gateway")), PathBuf::from)
}

pub struct NodeProc {
    pub name: String,
    pub cluster_addr: String,
    /// The device listener, `127.0.0.1:port`.
    pub public_addr: String,
    pub pid: u32,
    stderr: PathBuf,
}

/// Owns the temp dir and every child: all are killed on drop (also while panicking); the dir is
/// removed unless a panic is unwinding, in which case it is kept and each node's stderr tail printed.
pub struct Cluster {
    dir: PathBuf,
    pub secret: String,
    pub secret_file: PathBuf,
    /// Device token secret (`--device-secret-file`).
    pub device_secret: String,
    pub device_secret_file: PathBuf,
    pub nodes: Vec<NodeProc>,
    children: Vec<Child>,
    pub started: Instant,
    /// Flags given to every node.
    args: Vec<String>,
}

impl Cluster {
    /// A cluster whose nodes get `args`, then the flags in `BENCH_NODE_ARGS` (whitespace-separated,
    /// to compare settings without editing the bench).
    pub fn new(tag: &str, args: &[&str]) -> Cluster {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("gateway-bench-{tag}-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&dir).expect("create bench temp dir");
        let secret = random_hex(64, nanos as u64);
        let device_secret = random_hex(64, (nanos as u64).rotate_left(17));
        let secret_file = dir.join("cluster.secret");
        let device_secret_file = dir.join("device.secret");
        fs::write(&secret_file, format!("{secret}\n")).expect("write secret");
        fs::write(&device_secret_file, format!("{device_secret}\n")).expect("write device secret");
        #[cfg(unix)]
        for f in [&secret_file, &device_secret_file] {
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions(f, fs::Permissions::from_mode(0o600));
        }
        Cluster {
            dir,
            secret,
            secret_file,
            device_secret,
            device_secret_file,
            nodes: Vec::new(),
            children: Vec::new(),
            started: Instant::now(),
            args: args
                .iter()
                .map(|s| s.to_string())
                .chain(std::env::var("BENCH_NODE_ARGS").unwrap_or_default().split_whitespace().map(String::from))
                .collect(),
        }
    }

    /// Starts `count` nodes: n1 bootstraps, the others start `--standby` and are joined with the
    /// CLI; returns once all are live voters with a leader.
    pub fn form(rt: &tokio::runtime::Runtime, tag: &str, count: usize, args: &[&str]) -> Cluster {
        let mut c = Cluster::new(tag, args);
        for i in 1..=count {
            c.spawn(rt, &format!("n{i}"));
        }
        for i in 1..count {
            let out = c.cli(&["join", "--cluster", &c.nodes[0].cluster_addr, "--node", &c.nodes[i].cluster_addr]);
            assert!(out.0 == Some(0), "join {} failed: {out:?}", c.nodes[i].name);
        }
        let start = Instant::now();
        loop {
            match c.settled(count) {
                Ok(_) => break,
                Err(e) if start.elapsed() > SETTLE_BOUND => panic!("cluster did not settle: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        c
    }

    /// Starts `name` (the first one bootstraps, the others wait `--standby`) and waits for `/healthz`.
    pub fn spawn(&mut self, rt: &tokio::runtime::Runtime, name: &str) {
        let cluster_addr = format!("127.0.0.1:{}", free_port());
        let public_addr = format!("127.0.0.1:{}", free_port());
        let data = self.dir.join(name);
        let stderr = self.dir.join(format!("{name}.log"));
        let log = File::create(&stderr).expect("create node log");
        let mut cmd = Command::new(gateway_bin());
        cmd.args(["serve", "--name", name, "--listen", &public_addr, "--cluster-listen", &cluster_addr])
            .arg("--data-dir")
            .arg(&data)
            .arg("--cluster-secret-file")
            .arg(&self.secret_file)
            .arg("--device-secret-file")
            .arg(&self.device_secret_file)
            .args(&self.args);
        if !self.nodes.is_empty() {
            cmd.arg("--standby");
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::from(log.try_clone().expect("dup log"))).stderr(Stdio::from(log));
        scrub_env(&mut cmd);
        let child = cmd.spawn().expect("spawn gateway");
        let pid = child.id();
        self.children.push(child);
        self.nodes.push(NodeProc {
            name: name.to_string(),
            cluster_addr: cluster_addr.clone(),
            public_addr,
            pid,
            stderr,
        });
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
    pub fn cli(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let mut cmd = Command::new(gateway_bin());
        cmd.args(args).arg("--cluster-secret-file").arg(&self.secret_file).stdin(Stdio::null());
        scrub_env(&mut cmd);
        let out = cmd.output().expect("run gateway CLI");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn status(&self, via: usize) -> Result<Value, String> {
        let (code, out, err) = self.cli(&["status", "--cluster", &self.nodes[via].cluster_addr, "--json"]);
        if code != Some(0) {
            return Err(format!("status exit {code:?}: {err}"));
        }
        serde_json::from_str(&out).map_err(|e| format!("status json: {e}: {out}"))
    }

    /// The leader's cluster address once `count` voters are all live, from n1's point of view.
    pub fn settled(&self, count: usize) -> Result<String, String> {
        let s = self.status(0)?;
        let members = s["members"].as_array().ok_or("no members")?;
        let voters = members.iter().filter(|m| m["role"] == "voter").count();
        let live = members.iter().filter(|m| m["state"] == "live").count();
        if voters != count || live != count || members.len() != count {
            return Err(format!("{voters} voters, {live} live of {}", members.len()));
        }
        self.leader_of(&s)
    }

    pub fn leader(&self) -> Result<String, String> {
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

/// `GET /metrics` (unauthenticated Prometheus text) as series -> value; labels stay in the key.
pub async fn scrape(addr: &str) -> HashMap<String, f64> {
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

pub fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Resident memory of `pid` in bytes (`VmRSS`, the load tool's reading), 0 if unreadable.
pub fn rss(pid: u32) -> u64 {
    gateway::tools::bench::sys::rss(pid).unwrap_or(0)
}

/// Context switches (voluntary and involuntary) of every thread `pid` has now, from
/// `/proc/<pid>/task/*/status`; 0 if unreadable. A thread that ended takes its count with it, so
/// take the difference over a run in which the process keeps its threads (a busy one does).
pub fn switches(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    let count = |status: String| -> u64 {
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        field("voluntary_ctxt_switches:") + field("nonvoluntary_ctxt_switches:")
    };
    tasks.flatten().filter_map(|t| fs::read_to_string(t.path().join("status")).ok()).map(count).sum()
}

/// CPU time (user + system, µs) each thread of `pid` has used so far, with its id and name
/// (`device`, `cluster`, `raft-log`...: a runtime's workers and its blocking pool share its name),
/// from `/proc/<pid>/task/*/stat`.
fn thread_cpu_us(pid: u32) -> Vec<(u32, String, u64)> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let read = |task: fs::DirEntry| -> Option<(u32, String, u64)> {
        let tid = task.file_name().to_str()?.parse().ok()?;
        let stat = fs::read_to_string(task.path().join("stat")).ok()?;
        let (open, close) = (stat.find('(')?, stat.rfind(')')?);
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // Fields 14 and 15 (utime, stime) of proc(5), in USER_HZ (100 Hz) ticks.
        let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        Some((tid, stat[open + 1..close].to_string(), (ticks(14) + ticks(15)) * 10_000))
    };
    tasks.flatten().filter_map(read).collect()
}

/// Where the CPU time of some processes goes by thread name: a reading of every thread's time
/// ([`ThreadCpu::read`]), and what each name used since an earlier reading ([`ThreadCpu::since`]).
pub struct ThreadCpu {
    pids: Vec<u32>,
    /// Per (pid, thread id): the thread's name and its CPU time (µs) so far.
    threads: HashMap<(u32, u32), (String, u64)>,
    /// The processes' own totals (µs), threads that ended included.
    total: u64,
}

impl ThreadCpu {
    /// Under this name [`ThreadCpu::since`] puts the rest: what threads that ended in between
    /// used (a thread that ends takes its time out of `/proc/<pid>/task`, not out of the
    /// process's total), and the gap between the kernel's per-thread and per-process accounting.
    pub const REST: &'static str = "(rest)";

    pub fn read(pids: &[u32]) -> ThreadCpu {
        let threads = pids
            .iter()
            .flat_map(|&p| thread_cpu_us(p).into_iter().map(move |(t, name, us)| ((p, t), (name, us))))
            .collect();
        let total = pids.iter().map(|p| cpu_us(*p).unwrap_or(0)).sum();
        ThreadCpu { pids: pids.to_vec(), threads, total }
    }

    /// CPU time (µs) by thread name from `before` (a reading of the same processes) to now, the
    /// rest under [`ThreadCpu::REST`].
    pub fn since(before: &ThreadCpu) -> std::collections::BTreeMap<String, u64> {
        let now = ThreadCpu::read(&before.pids);
        let mut by_name = std::collections::BTreeMap::<String, u64>::new();
        for (id, (name, us)) in &now.threads {
            let was = before.threads.get(id).map_or(0, |(_, us)| *us);
            *by_name.entry(name.clone()).or_default() += us.saturating_sub(was);
        }
        let listed: u64 = by_name.values().sum();
        by_name.insert(Self::REST.to_string(), now.total.saturating_sub(before.total).saturating_sub(listed));
        by_name
    }
}

/// CPU time (user + system) `pid` used so far, in microseconds; `None` if unreadable. `pid` 0
/// is this process.
pub fn cpu_us(pid: u32) -> Option<u64> {
    let pid = if pid == 0 { "self".to_string() } else { pid.to_string() };
    gateway::metrics::process::cpu_seconds_of(&pid).map(|s| (s * 1e6) as u64)
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
pub fn random_hex(chars: usize, seed: u64) -> String {
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

/// The median (the mean of the middle two of an even count); NaN for none, or when any is NaN (a
/// failed run must not leave the median to the others).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        _ if v.iter().any(|x| x.is_nan()) => f64::NAN,
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The physical floor of a claim on this machine, printed beside the results, in microseconds.
pub struct Floor {
    /// The median 4 KiB append + fdatasync, one writer.
    pub fsync_us: f64,
    /// The same with three writers at once, each on its own file: what the three nodes of a
    /// bench cluster pay, sharing one disk, when a claim makes each of them flush.
    pub fsync3_us: f64,
    /// The median 4 KiB overwrite of a zero-filled file + fdatasync, one writer: how the Raft
    /// log's segments (and PostgreSQL's WAL) are written, with no file size to record.
    pub over_us: f64,
    /// The same with three writers at once.
    pub over3_us: f64,
    /// The median CPU time of one of the one-writer overwrites + fdatasync (the probe thread's
    /// clock, user and system): what a replica's flush of one entry costs its cores, in
    /// microseconds; the wait for the disk is not CPU.
    pub over_cpu_us: f64,
    /// The median one-writer overwrite + fdatasync with one every [`PACE`], as a node's log
    /// writer flushes under load, instead of back to back: a filesystem may add work to a flush
    /// that follows a clock tick (ext4 without a journal writes the file's inode, whose
    /// modification time moved, in the same `fdatasync`: README, "A log flush on a filesystem
    /// without a journal").
    pub paced_us: f64,
    /// The CPU time of one of those paced flushes, as [`Floor::over_cpu_us`] (the sleep before
    /// each is not counted).
    pub paced_cpu_us: f64,
    /// The median one-byte TCP round trip over loopback (no Nagle).
    pub rtt_us: f64,
    /// The median bare replicated write (see [`quorum_probe`]): a client's request to a leader
    /// thread, which sends it to two follower threads and flushes its own file while they flush
    /// theirs, and answers once its flush and one follower's answer are in. The least a 1-client
    /// claim can take here, with none of the gateway's work: the hops and the parallel flush.
    pub quorum_us: f64,
    /// How long an idle vCPU polls before it halts (`guest_halt_poll_ns` of Linux's `haltpoll`
    /// idle driver), when the guest has that driver: at 0 every wake-up of a thread on an idle vCPU
    /// is an exit to the host, which doubled PostgreSQL's one-client claim here (README,
    /// "One client's ratio depends on how the host idles its vCPUs").
    pub halt_poll_ns: Option<u64>,
}

impl Floor {
    /// The floor as the benches print it.
    pub fn describe(&self) -> String {
        format!(
            "fdatasync p50 {:.0} us appending, {:.0} us overwriting (three writers at once: {:.0} and {:.0} us; \
             one overwrite every {} ms: {:.0} us, {:.0} us CPU against {:.0} back to back), \
             loopback round trip p50 {:.0} us, bare replicated write p50 {:.0} us, vCPU halt polling {}",
            self.fsync_us,
            self.over_us,
            self.fsync3_us,
            self.over3_us,
            PACE.as_millis(),
            self.paced_us,
            self.paced_cpu_us,
            self.over_cpu_us,
            self.rtt_us,
            self.quorum_us,
            self.halt_poll_ns.map_or("n/a".to_string(), |ns| format!("{ns} ns"))
        )
    }
}

/// How far apart [`Floor::paced_us`]'s flushes are: about how often a bench node's log writer
/// flushes in a three-node handshake run (~500 flushes a second each).
pub const PACE: Duration = Duration::from_millis(2);

/// Flushes the paced probe makes (half a second at [`PACE`]).
const PACED_ROUNDS: usize = 250;

/// `writers` threads, each writing 4 KiB and calling fdatasync `rounds` times on a file of its
/// own in the directory the nodes write to (appending, or over a file zero-filled and synced
/// first), sleeping `pace` before each when given; every call's latency and the CPU time the
/// calling thread spent in it, in microseconds.
fn fsync_probe(writers: usize, rounds: usize, overwrite: bool, pace: Option<Duration>) -> Vec<(f64, f64)> {
    let start = std::sync::Barrier::new(writers);
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..writers)
            .map(|w| {
                let start = &start;
                scope.spawn(move || {
                    let mut log = ProbeFile::new(&format!("fsync-{w}"), overwrite.then_some(rounds));
                    start.wait();
                    (0..rounds)
                        .map(|_| {
                            if let Some(pace) = pace {
                                std::thread::sleep(pace);
                            }
                            let cpu = replica::thread_cpu_us();
                            let t = Instant::now();
                            log.flush_block();
                            let us = t.elapsed().as_secs_f64() * 1e6;
                            (us, replica::thread_cpu_us() - cpu)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().flat_map(|t| t.join().expect("fsync probe thread")).collect()
    })
}

/// Measures [`Floor`]: `rounds` of each probe.
pub fn floor(rounds: usize) -> Floor {
    use std::io::Write;
    let latency = |v: &[(f64, f64)]| v.iter().map(|(us, _)| *us).collect::<Vec<f64>>();
    let cpu = |v: &[(f64, f64)]| v.iter().map(|(_, cpu)| *cpu).collect::<Vec<f64>>();
    let fsync = latency(&fsync_probe(1, rounds, false, None));
    let fsync3 = latency(&fsync_probe(3, rounds, false, None));
    let over_probe = fsync_probe(1, rounds, true, None);
    let over3 = latency(&fsync_probe(3, rounds, true, None));
    let paced = fsync_probe(1, PACED_ROUNDS, true, Some(PACE));

    let listener = TcpListener::bind("127.0.0.1:0").expect("bind echo");
    let addr = listener.local_addr().expect("echo addr");
    let echo = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept echo");
        let mut b = [0u8; 1];
        while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {}
    });
    let mut s = std::net::TcpStream::connect(addr).expect("connect echo");
    s.set_nodelay(true).expect("nodelay");
    let mut b = [1u8; 1];
    let rtt: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            s.write_all(&b).expect("echo write");
            s.read_exact(&mut b).expect("echo read");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    drop(s);
    let _ = echo.join();
    Floor {
        fsync_us: median(fsync),
        fsync3_us: median(fsync3),
        over_us: median(latency(&over_probe)),
        over3_us: median(over3),
        over_cpu_us: median(cpu(&over_probe)),
        paced_us: median(latency(&paced)),
        paced_cpu_us: median(cpu(&paced)),
        rtt_us: median(rtt),
        quorum_us: median(quorum_probe(rounds)),
        halt_poll_ns: std::fs::read_to_string("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
            .ok()
            .and_then(|v| v.trim().parse().ok()),
    }
}

/// A probe's file in the directory the nodes write to, removed when dropped: empty (each block is
/// appended) or, with `Some(blocks)`, zero-filled that far and synced first, so that each block
/// overwrites (a Raft log segment's and PostgreSQL's WAL's writes: no file size to record).
struct ProbeFile {
    file: File,
    path: PathBuf,
}

impl ProbeFile {
    fn new(name: &str, zero_filled: Option<usize>) -> ProbeFile {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("gateway-bench-{name}-{}", std::process::id()));
        let mut file = File::create(&path).expect("create probe file");
        if let Some(blocks) = zero_filled {
            file.write_all(&vec![0u8; 4096 * blocks]).expect("zero-fill probe");
            file.sync_all().expect("sync probe");
            file.rewind().expect("rewind probe");
        }
        ProbeFile { file, path }
    }

    /// Writes the next 4 KiB block and `fdatasync`s.
    fn flush_block(&mut self) {
        use std::io::Write;
        self.file.write_all(&[0x5au8; 4096]).expect("write probe");
        self.file.sync_data().expect("fdatasync probe");
    }
}

impl Drop for ProbeFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The bare replicated write, `rounds` times, each latency in microseconds. Four threads over
/// loopback TCP (no Nagle), as a one-client claim crosses three nodes: the client sends 64 bytes
/// to the leader; the leader sends them to both followers, then overwrites and `fdatasync`s a 4 KiB
/// block of its own file; each follower reads, does the same on its own file and answers 8 bytes
/// (read on the leader by a thread per follower, as a node's network does); the leader answers
/// the client once its own flush and the first follower answer of that round are in.
fn quorum_probe(rounds: usize) -> Vec<f64> {
    use std::io::Write;
    use std::net::TcpStream;
    use std::sync::mpsc;
    let pair = || {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind probe");
        let a = TcpStream::connect(listener.local_addr().expect("probe addr")).expect("connect probe");
        let (b, _) = listener.accept().expect("accept probe");
        for s in [&a, &b] {
            s.set_nodelay(true).expect("nodelay");
        }
        (a, b)
    };
    let (mut client, mut leader_in) = pair();
    let (answered, answers) = mpsc::channel::<u64>();
    let mut to_followers = Vec::new();
    let mut threads = Vec::new();
    for f in 0..2 {
        let (leader_end, mut follower_end) = pair();
        let mut reader = leader_end.try_clone().expect("clone probe socket");
        to_followers.push(leader_end);
        let mut log = ProbeFile::new(&format!("quorum-f{f}"), Some(rounds));
        threads.push(std::thread::spawn(move || {
            let mut req = [0u8; 64];
            while follower_end.read_exact(&mut req).is_ok() {
                log.flush_block();
                if follower_end.write_all(&req[..8]).is_err() {
                    break;
                }
            }
        }));
        let answered = answered.clone();
        threads.push(std::thread::spawn(move || {
            let mut ans = [0u8; 8];
            while reader.read_exact(&mut ans).is_ok() {
                if answered.send(u64::from_le_bytes(ans)).is_err() {
                    break;
                }
            }
        }));
    }
    drop(answered);
    let mut leader_log = ProbeFile::new("quorum-l", Some(rounds));
    threads.push(std::thread::spawn(move || {
        let mut req = [0u8; 64];
        while leader_in.read_exact(&mut req).is_ok() {
            for f in &mut to_followers {
                f.write_all(&req).expect("probe append");
            }
            leader_log.flush_block();
            let round = u64::from_le_bytes(req[..8].try_into().expect("8 bytes"));
            // Answers of earlier rounds (the slower follower's) come first; skip them.
            while answers.recv().is_ok_and(|r| r != round) {}
            leader_in.write_all(&req[..8]).expect("probe answer");
        }
        // The readers hold clones of these sockets: shut them, so that the followers see the end.
        for f in &to_followers {
            let _ = f.shutdown(std::net::Shutdown::Both);
        }
    }));
    let lat = (0..rounds as u64)
        .map(|round| {
            let mut req = [0u8; 64];
            req[..8].copy_from_slice(&round.to_le_bytes());
            let t = Instant::now();
            client.write_all(&req).expect("probe request");
            client.read_exact(&mut req[..8]).expect("probe reply");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    drop(client);
    for t in threads {
        let _ = t.join();
    }
    lat
}
