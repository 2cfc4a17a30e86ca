//! The integration-test harness: a cluster of real `gateway` processes on loopback ports picked at
//! run time, so SIGKILL, SIGSTOP and restarts are real. Owns the children: every one is killed on
//! drop, and when a test panics the tail of each node's stderr is printed and the temp dir is kept.
//! One test per `tests/cluster_*.rs` file, so cargo runs them one after another (≤ 4 gateways at once):
//! `cargo test --test 'cluster_*' -- --nocapture` shows the measured failover/expiry times.
#![allow(dead_code)]

pub mod api;
pub mod http;
mod ports;
pub mod proxy;
pub mod raw;
pub mod stall;
pub mod status;
pub mod tls;
pub mod upstream;
pub mod ws;

pub use ports::{free_port, listen_local};

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)] // each test binary uses a different subset
pub use api::{reply_node_id, Api};
#[allow(unused_imports)]
pub use status::View;

/// Timing knobs every test cluster runs with; all bounds in asserts derive from these.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub lease_ms: u64,
    pub sweep_ms: u64,
    pub election_timeout_ms: u64,
    pub heartbeat_ms: u64,
}

/// The lease must be at least 8 election timeouts (the server refuses less: see config.rs).
pub const TIMING: Timing = Timing { lease_ms: 4000, sweep_ms: 250, election_timeout_ms: 400, heartbeat_ms: 100 };

/// Honest slack for a loaded 2-core machine running up to four gateways plus cargo.
pub const SLACK: Duration = Duration::from_secs(3);

impl Timing {
    /// A new leader is expected within election_timeout..2×election_timeout after the old one dies.
    pub fn failover_bound(&self) -> Duration {
        Duration::from_millis(2 * self.election_timeout_ms) + SLACK
    }

    /// A dead node is expired everywhere within lease + one sweep, plus an election when it led:
    /// the new leader's ExtendLeases pushes every lease (the dead leader's too) to its own now +
    /// lease before sweeping. An openraft election takes up to ~4 election timeouts (followers
    /// honour the old leader's lease for election_timeout_max = 2 of them).
    pub fn expiry_bound(&self) -> Duration {
        Duration::from_millis(self.lease_ms + self.sweep_ms + 4 * self.election_timeout_ms) + SLACK
    }

    /// Forming, joining, catching up: generous, these are not the measured properties.
    pub fn settle_bound(&self) -> Duration {
        Duration::from_millis(4 * self.lease_ms) + 2 * SLACK
    }
}

/// How long a process gets to answer `/healthz` after spawn.
pub const START_BOUND: Duration = Duration::from_secs(20);
/// How long one CLI invocation may run before the test fails.
pub const CLI_BOUND: Duration = Duration::from_secs(30);

/// Polls `f` every ~50 ms until it returns `Some`, or panics at the deadline with `what` and the
/// last observed state (the `Err` side of `f`'s result).
pub fn wait_until<T, E: std::fmt::Debug>(bound: Duration, what: &str, mut f: impl FnMut() -> Result<T, E>) -> T {
    let start = Instant::now();
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) => {
                if start.elapsed() >= bound {
                    panic!("timed out after {bound:?} waiting for {what}; last observed: {last:#?}");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How a node process is started the first time (ignored by the binary on restart with a data dir).
#[derive(Debug, Clone)]
pub enum Start {
    Bootstrap,
    Standby,
    /// `--join` via the node at this index.
    Join(usize),
}

#[derive(Debug)]
pub struct CliOutput {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

pub struct Node {
    pub name: String,
    pub public_port: u16,
    pub cluster_port: u16,
    pub root: PathBuf,
    pub data_dir: PathBuf,
    pub stderr_path: PathBuf,
    /// The node's stdout (its one "listening" line), apart from its log.
    pub stdout_path: PathBuf,
    pub start: Start,
    pub extra_args: Vec<String>,
    child: Option<Child>,
    spawns: u32,
}

impl Node {
    pub fn cluster_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.cluster_port))
    }

    pub fn cluster_addr_str(&self) -> String {
        self.cluster_addr().to_string()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => c.try_wait().ok().flatten().is_none(),
            None => false,
        }
    }
}

pub struct Cluster {
    tmp: tempfile::TempDir,
    pub secret: String,
    pub secret_file: PathBuf,
    pub device_secret_file: PathBuf,
    pub nodes: Vec<Node>,
    /// Added to every `serve` of this cluster (e.g. `--snapshot-logs 50`).
    pub extra_args: Vec<String>,
    /// Environment of every `serve` of this cluster (test hooks such as `GATEWAY_TEST_*`).
    pub env: Vec<(String, String)>,
    /// The largest file every `serve` of this cluster may write (`RLIMIT_FSIZE`), with `SIGXFSZ`
    /// ignored: a write past it fails with `EFBIG`, as a write to a full disk fails.
    pub file_size_limit: Option<u64>,
    /// The flush-stall shim every `serve` of this cluster preloads (see [`Cluster::stallable_flushes`]).
    pub flush_stall_shim: Option<PathBuf>,
    /// TLS on every node of this cluster (see [`Cluster::with_tls`]).
    pub tls: Option<ClusterTls>,
}

/// A cluster whose members speak TLS: one node certificate for all (127.0.0.1), the CLI's and the
/// harness's client certificate, mutual TLS on the cluster listener, wss on the device listener.
pub struct ClusterTls {
    pub ca: tls::Ca,
    pub node: tls::Issued,
    pub client: tls::Issued,
    /// Trusts the CA and presents `client`.
    pub config: std::sync::Arc<rustls::ClientConfig>,
}

/// Runs `cmd` with `RLIMIT_FSIZE` at `bytes` and `SIGXFSZ` ignored (an ignored signal stays
/// ignored across `exec`), so that a write past the limit fails with `EFBIG` instead of killing it.
fn limit_file_size(cmd: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
    // SAFETY: between fork and exec the closure calls only setrlimit and signal, which are
    // async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gateway")
}

impl Cluster {
    pub fn new() -> Cluster {
        Cluster::with_args(&[])
    }

    pub fn with_args(extra: &[&str]) -> Cluster {
        let tmp = tempfile::Builder::new().prefix("gateway-it-").tempdir().unwrap();
        let secret = random_hex(32);
        let secret_file = tmp.path().join("cluster.secret");
        let device_secret_file = tmp.path().join("device.secret");
        // Trailing newline on purpose: the binary strips it (contract), as operators' files have one.
        fs::write(&secret_file, format!("{secret}\n")).unwrap();
        fs::write(&device_secret_file, format!("{}\n", random_hex(32))).unwrap();
        Cluster {
            tmp,
            secret,
            secret_file,
            device_secret_file,
            nodes: Vec::new(),
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            file_size_limit: None,
            flush_stall_shim: None,
            tls: None,
        }
    }

    /// A cluster whose nodes serve wss:// and https:// with mutual TLS between members, from a CA
    /// made now; the harness and `cli_auth` dial them with the CA and a client certificate.
    pub fn with_tls(extra: &[&str]) -> Cluster {
        let mut c = Cluster::with_args(extra);
        let ca = tls::Ca::new(&c.dir().join("pki"), "cluster");
        let node = ca.issue("node", 1, "node.test", None);
        let client = ca.issue("client", 2, "client.test", None);
        let config = tls::client(&ca.cert_file, Some(&client));
        c.tls = Some(ClusterTls { ca, node, client, config });
        c
    }

    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// Declares a node (ports and dirs chosen now, reused on every restart) and starts it.
    pub fn spawn(&mut self, name: &str, start: Start) -> usize {
        self.spawn_with(name, start, &[])
    }

    /// `spawn` with extra `serve` args for this node; `{cluster_port}` in them is replaced by the
    /// node's cluster port.
    pub fn spawn_with(&mut self, name: &str, start: Start, args: &[&str]) -> usize {
        let root = self.tmp.path().join(name);
        fs::create_dir_all(&root).unwrap();
        self.nodes.push(Node {
            name: name.to_string(),
            public_port: free_port(),
            cluster_port: free_port(),
            data_dir: root.join("data"),
            stderr_path: root.join("stderr.log"),
            stdout_path: root.join("stdout.log"),
            root,
            start,
            extra_args: Vec::new(),
            child: None,
            spawns: 0,
        });
        let i = self.nodes.len() - 1;
        if let Some(t) = &self.tls {
            http::use_tls(self.nodes[i].cluster_addr(), t.config.clone());
            http::use_tls(SocketAddr::from(([127, 0, 0, 1], self.nodes[i].public_port)), t.config.clone());
        }
        let port = self.nodes[i].cluster_port.to_string();
        self.nodes[i].extra_args = args.iter().map(|a| a.replace("{cluster_port}", &port)).collect();
        self.start(i);
        if matches!(self.nodes[i].start, Start::Bootstrap) {
            // Healthy is not yet serving: a bootstrapped node takes devices once its first lease
            // commits (before that a handshake is 503 not_live, which a loaded machine showed).
            self.wait_ready(i);
        }
        i
    }

    /// Waits for node `i`'s `/readyz` to answer 200: a leader known, its lease live, and serving
    /// (not `starting`: its first lease renewal committed; not draining or fenced).
    pub fn wait_ready(&self, i: usize) {
        let addr = self.nodes[i].cluster_addr();
        wait_until(
            TIMING.settle_bound(),
            &format!("{} /readyz on {addr}", self.nodes[i].name),
            || match http::request(addr, "GET", "/readyz", &[], None, Duration::from_secs(2)) {
                Ok(r) if r.status == 200 => Ok(()),
                Ok(r) => Err(format!("status {}: {}", r.status, r.text())),
                Err(e) => Err(format!("{e:#}")),
            },
        );
    }

    /// Starts node `i` with its recorded ports, data dir and start mode, and waits for `/healthz`.
    pub fn start(&mut self, i: usize) {
        let args = self.serve_args(i);
        let node = &mut self.nodes[i];
        assert!(node.child.is_none() || !node.is_running(), "{} is already running", node.name);
        node.spawns += 1;
        let mut log = OpenOptions::new().create(true).append(true).open(&node.stderr_path).unwrap();
        writeln!(log, "\n===== harness: spawn #{} of {}: gateway {} =====", node.spawns, node.name, args.join(" "))
            .unwrap();
        let out = OpenOptions::new().create(true).append(true).open(&node.stdout_path).unwrap();
        let mut cmd = Command::new(bin());
        cmd.args(&args).stdin(Stdio::null()).stdout(Stdio::from(out)).stderr(Stdio::from(log));
        scrub_env(&mut cmd);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        // Test hook of the node's wall clock: see `step_wall_clock`.
        cmd.env("GATEWAY_TEST_WALL_OFFSET_FILE", node.root.join("wall_offset_ms"));
        if let Some(bytes) = self.file_size_limit {
            limit_file_size(&mut cmd, bytes);
        }
        if let Some(shim) = &self.flush_stall_shim {
            cmd.env("LD_PRELOAD", shim).env(stall::FLAG_ENV, node.root.join("flushes-stalled"));
        }
        node.child = Some(cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", bin())));
        self.wait_healthy(i);
    }

    fn serve_args(&self, i: usize) -> Vec<String> {
        let n = &self.nodes[i];
        let t = TIMING;
        let mut a: Vec<String> = vec!["serve".into()];
        let mut push = |k: &str, v: String| {
            a.push(k.into());
            a.push(v);
        };
        push("--name", n.name.clone());
        push("--listen", format!("127.0.0.1:{}", n.public_port));
        push("--cluster-listen", format!("127.0.0.1:{}", n.cluster_port));
        push("--data-dir", n.data_dir.display().to_string());
        push("--cluster-secret-file", self.secret_file.display().to_string());
        push("--device-secret-file", self.device_secret_file.display().to_string());
        push("--lease-ms", t.lease_ms.to_string());
        push("--sweep-ms", t.sweep_ms.to_string());
        push("--election-timeout-ms", t.election_timeout_ms.to_string());
        push("--heartbeat-ms", t.heartbeat_ms.to_string());
        match &n.start {
            Start::Bootstrap => {}
            Start::Standby => a.push("--standby".into()),
            Start::Join(j) => {
                a.push("--join".into());
                a.push(self.nodes[*j].cluster_addr_str());
            }
        }
        if let Some(t) = &self.tls {
            for (k, v) in [
                ("--tls-cert-file", &t.node.cert),
                ("--tls-key-file", &t.node.key),
                ("--cluster-tls-cert-file", &t.node.cert),
                ("--cluster-tls-key-file", &t.node.key),
                ("--cluster-tls-ca-file", &t.ca.cert_file),
            ] {
                a.push(k.into());
                a.push(v.display().to_string());
            }
            a.push("--cluster-tls-client-auth".into());
        }
        a.extend(self.extra_args.iter().cloned());
        a.extend(n.extra_args.iter().cloned());
        a
    }

    fn wait_healthy(&mut self, i: usize) {
        let addr = self.nodes[i].cluster_addr();
        let name = self.nodes[i].name.clone();
        let start = Instant::now();
        wait_until(START_BOUND, &format!("{name} /healthz on {addr}"), || {
            if let Some(status) = self.nodes[i].child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!(
                    "{name} exited during startup with {status}; stderr tail:\n{}",
                    tail(&self.nodes[i].stderr_path, 40)
                );
            }
            match http::request(addr, "GET", "/healthz", &[], None, Duration::from_secs(2)) {
                Ok(r) if r.status == 200 => Ok(()),
                Ok(r) => Err(format!("status {}: {}", r.status, r.text())),
                Err(e) => Err(format!("{e:#}")),
            }
        });
        println!("[harness] {name} healthy after {:?}", start.elapsed());
    }

    // ---- process control -------------------------------------------------------------------

    /// Makes every node started from now on preload the flush-stall shim ([`stall`]), so that
    /// [`Cluster::stall_flushes`] can hold its `fdatasync` and `fsync` calls.
    pub fn stallable_flushes(&mut self) {
        self.flush_stall_shim = Some(stall::build_shim(self.tmp.path()));
    }

    /// Holds (`true`) or lets go (`false`) every `fdatasync`/`fsync` node `i` calls: its disk
    /// stops answering, as a network volume's I/O pause does. Its threads block in the call.
    pub fn stall_flushes(&self, i: usize, stalled: bool) {
        assert!(self.flush_stall_shim.is_some(), "call stallable_flushes before starting the nodes");
        let flag = self.nodes[i].root.join("flushes-stalled");
        if stalled {
            fs::write(&flag, b"").unwrap();
        } else if let Err(e) = fs::remove_file(&flag) {
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{}: {e}", flag.display());
        }
    }

    /// Steps node `i`'s wall clock to `offset_ms` from the real one (as NTP or an operator would),
    /// effective within ~50 ms; its monotonic clock is untouched.
    pub fn step_wall_clock(&self, i: usize, offset_ms: i64) {
        fs::write(self.nodes[i].root.join("wall_offset_ms"), offset_ms.to_string()).unwrap();
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn signal(&self, i: usize, sig: &str) {
        let pid = self.nodes[i].pid().unwrap_or_else(|| panic!("{} has no process", self.nodes[i].name));
        let st = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().unwrap();
        assert!(st.success(), "kill -{sig} {pid} failed");
    }

    pub fn sigstop(&self, i: usize) {
        self.signal(i, "STOP");
    }

    pub fn sigcont(&self, i: usize) {
        self.signal(i, "CONT");
    }

    pub fn sigterm(&self, i: usize) {
        self.signal(i, "TERM");
    }

    /// Waits for node `i`'s process to exit by itself and returns its status.
    pub fn wait_exit(&mut self, i: usize, bound: Duration) -> ExitStatus {
        let name = self.nodes[i].name.clone();
        let st = wait_until(bound, &format!("{name} to exit"), || {
            match self.nodes[i].child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(st))) => Ok(st),
                other => Err(format!("{other:?}")),
            }
        });
        self.nodes[i].child = None;
        st
    }

    pub fn is_running(&mut self, i: usize) -> bool {
        self.nodes[i].is_running()
    }

    /// Deletes node `i`'s data dir (the process must be stopped).
    pub fn wipe(&mut self, i: usize) {
        assert!(!self.nodes[i].is_running(), "wipe {} while running", self.nodes[i].name);
        let _ = fs::remove_dir_all(&self.nodes[i].data_dir);
    }

    // ---- CLI -------------------------------------------------------------------------------

    /// Runs `gateway <args>` with a deadline, capturing output.
    pub fn cli(&self, args: &[&str]) -> CliOutput {
        run_cli(args)
    }

    /// Runs `gateway <args> --cluster-secret-file <this cluster's secret>` (and, with TLS, the
    /// CA and the client certificate).
    pub fn cli_auth(&self, args: &[&str]) -> CliOutput {
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.push("--cluster-secret-file".into());
        a.push(self.secret_file.display().to_string());
        if let Some(t) = &self.tls {
            for (k, v) in [
                ("--ca-file", &t.ca.cert_file),
                ("--client-cert-file", &t.client.cert),
                ("--client-key-file", &t.client.key),
            ] {
                a.push(k.into());
                a.push(v.display().to_string());
            }
        }
        run_cli(&a.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// `gateway join --cluster <via> --node <node>`; asserts exit 0.
    pub fn join(&self, via: usize, node: usize) -> CliOutput {
        let out = self.cli_auth(&[
            "join",
            "--cluster",
            &self.nodes[via].cluster_addr_str(),
            "--node",
            &self.nodes[node].cluster_addr_str(),
        ]);
        assert_eq!(out.code, Some(0), "join {} via {} failed: {out:#?}", self.nodes[node].name, self.nodes[via].name);
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::thread::panicking() {
            self.tmp.disable_cleanup(true);
            eprintln!("\n[harness] test failed; kept {}", self.tmp.path().display());
            for n in &self.nodes {
                eprintln!(
                    "----- {} stderr (tail of {}) -----\n{}",
                    n.name,
                    n.stderr_path.display(),
                    tail(&n.stderr_path, 60)
                );
            }
        }
    }
}

/// A `gateway` command running in the background (`Cluster::cli_background`).
pub struct BackgroundCli {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    out_path: PathBuf,
    err_path: PathBuf,
    args: String,
}

impl BackgroundCli {
    /// What it printed on stdout so far (it keeps running).
    pub fn stdout_so_far(&self) -> String {
        fs::read_to_string(&self.out_path).unwrap_or_default()
    }

    /// Waits at most `bound` for it to exit (killed and a panic after that).
    pub fn wait(mut self, bound: Duration) -> CliOutput {
        let status = wait_until(bound, &format!("gateway {} to exit", self.args), || {
            self.child.try_wait().unwrap().ok_or_else(|| fs::read_to_string(&self.out_path).unwrap_or_default())
        });
        let out = CliOutput {
            code: status.code(),
            stdout: fs::read_to_string(&self.out_path).unwrap_or_default(),
            stderr: fs::read_to_string(&self.err_path).unwrap_or_default(),
        };
        println!("[cli] gateway {} -> {:?}", self.args, out.code);
        out
    }
}

impl Drop for BackgroundCli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Cluster {
    /// Starts `gateway <args> --cluster-secret-file <secret>` without waiting for it.
    pub fn cli_background(&self, args: &[&str]) -> BackgroundCli {
        let dir = tempfile::tempdir().unwrap();
        let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
        let mut cmd = Command::new(bin());
        cmd.args(args)
            .arg("--cluster-secret-file")
            .arg(&self.secret_file)
            .stdin(Stdio::null())
            .stdout(File::create(&out_path).unwrap())
            .stderr(File::create(&err_path).unwrap());
        scrub_env(&mut cmd);
        let child = cmd.spawn().unwrap();
        BackgroundCli { child, _dir: dir, out_path, err_path, args: args.join(" ") }
    }
}

/// Runs `gateway <args>` with a deadline ([`CLI_BOUND`], killed after it), capturing output; the
/// environment's `GATEWAY_*` settings left out.
pub fn run_cli(args: &[&str]) -> CliOutput {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap());
    scrub_env(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > CLI_BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "gateway {} did not finish within {CLI_BOUND:?}; stdout: {}; stderr: {}",
                args.join(" "),
                fs::read_to_string(&out_path).unwrap_or_default(),
                fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = CliOutput {
        code: status.code(),
        stdout: fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: fs::read_to_string(&err_path).unwrap_or_default(),
    };
    println!("[cli] gateway {} -> {:?} ({:?})", args.join(" "), out.code, start.elapsed());
    out
}

/// Children must not pick up an operator's GATEWAY_* settings from the environment running the tests.
pub fn scrub_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GATEWAY_") {
            cmd.env_remove(k);
        }
    }
}

/// The last `lines` lines of a file (reads at most the last 64 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no file {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A small deterministic PRNG (xorshift64*), seeded per test, for picking nodes and conns.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn seeded_from_time() -> Rng {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        Rng::new(nanos ^ u64::from(std::process::id()))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn random_hex(chars: usize) -> String {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut r = Rng::new(Rng::seeded_from_time().next() ^ call.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (0..chars).map(|_| char::from_digit(r.below(16) as u32, 16).unwrap()).collect()
}

/// URL-safe base64 without padding, for hand-built tokens.
pub fn b64(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}
