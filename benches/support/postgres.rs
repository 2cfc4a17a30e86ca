//! The PostgreSQL references of the claims bench: a throwaway PostgreSQL server in the bench's temp
//! dir (so on the disk the gateway nodes write to), listening on 127.0.0.1 only, driven by
//! `pgbench` with a claim transaction that mirrors the gateway's claim rule; alone ([`Setup::Single`],
//! issue 11's reference) or with a synchronous standby ([`Setup::SyncStandby`]). Stopped and removed
//! on drop, also on panic. Absent binaries are a skip, not a failure.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::procfs::{child_cpu_us, children, stat};
use super::{free_port, loadavg};

/// The seed design's claim as one pgbench transaction on a fresh device (random over 10^15, so
/// every claim, like every gateway claim in the bench, is a device's first): row lock on the floor,
/// compare-and-upsert of the floor `(epoch, attempt)` with the version bumped, upsert of the route
/// with that version, a notify of the new route, commit.
const CLAIM_SQL: &str = r"\set dev random(1, 1000000000000000)
\set node random(1, 3)
\set conn random(1, 1000000000000)
\set epoch 0
\set attempt 1
BEGIN;
SELECT max_epoch, max_attempt, max_version FROM floors WHERE device = 'd' || :dev FOR UPDATE;
INSERT INTO floors AS f (device, max_epoch, max_attempt, max_version, last_node)
    VALUES ('d' || :dev, :epoch, :attempt, 1, :node)
    ON CONFLICT (device) DO UPDATE
        SET max_epoch = excluded.max_epoch, max_attempt = excluded.max_attempt,
            max_version = f.max_version + 1, last_node = excluded.last_node
        WHERE (f.max_epoch, f.max_attempt) < (excluded.max_epoch, excluded.max_attempt)
    RETURNING max_version AS version \gset
INSERT INTO routes (device, node, conn, version) VALUES ('d' || :dev, :node, :conn, :version)
    ON CONFLICT (device) DO UPDATE SET node = excluded.node, conn = excluded.conn, version = excluded.version;
SELECT pg_notify('routes', 'd' || :dev || ' ' || :node || ' ' || :conn || ' ' || :version);
COMMIT;
";

/// The gateway's tables: floors, routes, and routes by node (the gateway's per-node index).
const SCHEMA_SQL: &str = "
CREATE TABLE floors (device text PRIMARY KEY, max_epoch bigint NOT NULL, max_attempt bigint NOT NULL,
                     max_version bigint NOT NULL, last_node int NOT NULL);
CREATE TABLE routes (device text PRIMARY KEY, node int NOT NULL, conn bigint NOT NULL, version bigint NOT NULL);
CREATE INDEX routes_node ON routes (node);
";

/// Durability as shipped (both are PostgreSQL's defaults, given explicitly so the log shows them).
pub const DURABILITY: [(&str, &str); 2] = [("fsync", "on"), ("synchronous_commit", "on")];

/// Which PostgreSQL a reference runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Setup {
    /// One server: the seed design's database, and issue 11's reference.
    Single,
    /// The same server with a synchronous standby: a second server on this machine, cloned by
    /// `pg_basebackup` and streaming from it, named in `synchronous_standby_names = '*'`. With
    /// `synchronous_commit = on` a commit returns once the standby has flushed it as well: a claim
    /// that survives the loss of either machine, as a gateway claim returns once a second node
    /// has flushed it. What a "gateways + PostgreSQL" tier runs when it must not lose a claim.
    SyncStandby,
}

impl Setup {
    /// The label of its rows (`via` in the claim table).
    pub fn label(self) -> &'static str {
        match self {
            Setup::Single => "pg",
            Setup::SyncStandby => "pg-sb",
        }
    }

    fn json_via(self) -> &'static str {
        match self {
            Setup::Single => "postgres",
            Setup::SyncStandby => "postgres_sync_standby",
        }
    }
}

/// The standby of a [`Setup::SyncStandby`] reference.
struct Standby {
    data: PathBuf,
    child: Child,
}

/// A running throwaway server, and its standby if it has one. Dropping it stops both (`pg_ctl
/// stop -m fast`, then SIGKILL) and removes their directory.
pub struct Postgres {
    pub setup: Setup,
    dir: PathBuf,
    data: PathBuf,
    bin: PathBuf,
    port: u16,
    /// `setpriv` prefix that runs a server binary as the `postgres` user when we are root
    /// (PostgreSQL refuses to run as root); empty otherwise.
    as_owner: Vec<String>,
    child: Option<Child>,
    pub version: String,
    /// The postmaster's auxiliary processes (see [`Postgres::settle`]).
    auxiliary: Vec<u32>,
    standby: Option<Standby>,
}

/// One pgbench run.
pub struct PgRun {
    pub c: usize,
    pub round: usize,
    pub claims_per_s: f64,
    pub line: String,
    pub json: Value,
}

impl Postgres {
    /// Starts a server (and for [`Setup::SyncStandby`] its standby) in a new directory under the
    /// temp dir, or prints why not and returns `None`.
    pub fn start(tag: &str, setup: Setup) -> Option<Postgres> {
        let Some(bin) = find_bin() else {
            println!("postgres reference: skipped (apt-get install postgresql)");
            return None;
        };
        let as_owner = match owner_prefix() {
            Ok(p) => p,
            Err(why) => {
                println!("postgres reference: skipped ({why})");
                return None;
            }
        };
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("gateway-bench-{tag}-pg-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&dir).expect("create postgres temp dir");
        let mut pg = Postgres {
            setup,
            data: dir.join("data"),
            dir,
            bin,
            port: free_port(),
            as_owner,
            child: None,
            version: String::new(),
            auxiliary: Vec::new(),
            standby: None,
        };
        if !pg.as_owner.is_empty() {
            let out = Command::new("chown").arg("postgres:").arg(&pg.dir).output().expect("run chown");
            assert!(out.status.success(), "chown postgres {}: {out:?}", pg.dir.display());
        }
        // initdb's own fsyncs only make the fresh cluster crash-safe; the server below runs with
        // full durability.
        let out = pg
            .owner_cmd("initdb")
            .arg("-D")
            .arg(&pg.data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
            .output()
            .expect("run initdb");
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        pg.child = Some(pg.spawn_server(&pg.data, pg.port, "postgres.log"));
        let start = Instant::now();
        while pg.psql("SELECT 1").is_err() {
            if let Some(st) = pg.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("postgres exited during startup: {st}");
            }
            assert!(start.elapsed() < super::SETTLE_BOUND, "postgres not ready on 127.0.0.1:{}", pg.port);
            std::thread::sleep(Duration::from_millis(100));
        }
        pg.psql(SCHEMA_SQL).unwrap_or_else(|e| panic!("schema: {e}"));
        fs::write(pg.dir.join("claim.sql"), CLAIM_SQL).expect("write claim.sql");
        pg.version = pg.psql("SHOW server_version").unwrap_or_default();
        let sync = pg.psql("SHOW wal_sync_method").unwrap_or_default();
        // The launchers start once recovery is done, maybe after the first connection.
        let start = Instant::now();
        while pg.auxiliary.len() < AUXILIARY.len() && start.elapsed() < super::SETTLE_BOUND {
            std::thread::sleep(Duration::from_millis(20));
            pg.auxiliary = pg.postmaster().map(auxiliary).unwrap_or_default();
        }
        let mut standby = String::new();
        if setup == Setup::SyncStandby {
            match pg.add_standby() {
                Ok(port) => standby = format!(", synchronous standby on 127.0.0.1:{port} (same disk)"),
                Err(why) => {
                    println!("postgres reference with a synchronous standby: skipped ({why})");
                    return None;
                }
            }
        }
        pg.settle();
        println!(
            "postgres reference ({}): PostgreSQL {} ({}), 127.0.0.1:{}{standby}, data in {}, fsync=on \
             synchronous_commit=on wal_sync_method={sync}, pgbench -M prepared, one fresh device per transaction",
            setup.label(),
            pg.version,
            pg.bin.display(),
            pg.port,
            pg.data.display()
        );
        Some(pg)
    }

    /// `pgbench -c c -T secs` of [`CLAIM_SQL`]; the row is printed by the caller in the claim table.
    pub fn run(&self, c: usize, round: usize, secs: u64) -> PgRun {
        let load_before = loadavg();
        let wal_before = self.wal_syncs();
        let cpu_before = (self.server_cpu_us(), child_cpu_us());
        let prefix = self.dir.join(format!("c{c}"));
        let threads = c.min(std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
        let mut cmd = self.client_cmd("pgbench");
        cmd.args(["-n", "-M", "prepared", "-c", &c.to_string(), "-j", &threads.to_string()])
            .args(["-T", &secs.to_string(), "-l"])
            .arg(format!("--log-prefix={}", prefix.display()))
            .arg("-f")
            .arg(self.dir.join("claim.sql"))
            .arg("postgres");
        let out = cmd.output().expect("run pgbench");
        let stdout = String::from_utf8_lossy(&out.stdout);
        self.settle();
        let cpu_after = (self.server_cpu_us(), child_cpu_us());
        let wal_syncs = self.wal_syncs().zip(wal_before).map(|(a, b)| a - b);
        let field = |key: &str| -> Option<f64> {
            let line = stdout.lines().find(|l| l.starts_with(key))?;
            line[key.len()..].split_whitespace().next()?.parse().ok()
        };
        let tps = field("tps = ").unwrap_or(f64::NAN);
        let xacts = field("number of transactions actually processed: ").unwrap_or(0.0);
        let failed = field("number of failed transactions: ").unwrap_or(0.0);
        let latency_avg_ms = field("latency average = ").unwrap_or(f64::NAN);
        let mut lat = transaction_latencies_us(&self.dir, &format!("c{c}."));
        lat.sort_unstable();
        let pct = |p: f64| match lat.len() {
            0 => f64::NAN,
            n => lat[((n - 1) as f64 * p).round() as usize] as f64 / 1000.0,
        };
        let per = |d: u64| d as f64 / xacts.max(1.0);
        let cpu = (per(cpu_after.0.saturating_sub(cpu_before.0)), per(cpu_after.1.saturating_sub(cpu_before.1)));
        let per_sync = wal_syncs.map_or(f64::NAN, |s| if s > 0 { xacts / s as f64 } else { f64::NAN });
        let mut errors = String::new();
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            errors = format!("pgbench {}: {}", out.status, stderr.lines().last().unwrap_or(""));
        } else if failed > 0.0 {
            errors = format!("failed:{failed}");
        }
        let line = format!(
            "{c:>3} | {:<6} | {tps:>9.0} | {:>7.2} | {:>7.2} | {:>12} | {:>13} | {per_sync:>15.2} | {:>4.0} {:>4} {:>4.0} | {:>9} | {}",
            self.setup.label(),
            pct(0.5),
            pct(0.99),
            "-",
            "-",
            cpu.0,
            "-",
            cpu.1,
            "-",
            if errors.is_empty() { "0" } else { &errors },
        );
        let json = json!({
            "c": c, "round": round, "via": self.setup.json_via(), "threads": threads, "secs": secs, "claims": xacts, "claims_per_s": tps,
            "latency_avg_ms": latency_avg_ms, "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": pct(1.0),
            "failed": failed, "wal_syncs": wal_syncs, "claims_per_wal_sync": per_sync,
            "cpu_us_per_op": {"server": cpu.0, "loader": cpu.1}, "errors": errors,
            "loadavg_before": load_before, "loadavg_after": loadavg(),
        });
        PgRun { c, round, claims_per_s: tps, line, json }
    }

    /// The reference's figures as JSON: version, setup, durability and the runs.
    pub fn report(&self, runs: &[PgRun]) -> Value {
        let durability: serde_json::Map<String, Value> =
            DURABILITY.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        json!({"version": self.version, "setup": self.setup.json_via(), "durability": durability,
               "runs": runs.iter().map(|r| r.json.clone()).collect::<Vec<_>>()})
    }

    /// Starts a server on `data` listening on 127.0.0.1:`port`, logging to `log` in our directory.
    fn spawn_server(&self, data: &Path, port: u16, log: &str) -> Child {
        let log = File::create(self.dir.join(log)).expect("create postgres log");
        let mut cmd = self.owner_cmd("postgres");
        cmd.arg("-D").arg(data);
        let settings = [
            ("listen_addresses", "127.0.0.1".to_string()),
            ("port", port.to_string()),
            ("unix_socket_directories", self.dir.display().to_string()),
            // A standby needs at least its primary's.
            ("max_connections", "300".to_string()),
        ];
        let durability = DURABILITY.iter().map(|(k, v)| (*k, v.to_string()));
        for (k, v) in settings.into_iter().chain(durability) {
            cmd.arg("-c").arg(format!("{k}={v}"));
        }
        cmd.stdout(Stdio::from(log.try_clone().expect("dup log"))).stderr(Stdio::from(log));
        cmd.spawn().expect("spawn postgres")
    }

    /// Clones the running server into a standby (`pg_basebackup -R`: streaming from it), starts
    /// it, names it synchronous and waits until the server reports it `sync`; its port.
    fn add_standby(&mut self) -> Result<u16, String> {
        if !self.bin.join("pg_basebackup").is_file() {
            return Err(format!("no pg_basebackup in {}", self.bin.display()));
        }
        let data = self.dir.join("standby");
        let out = self
            .owner_cmd("pg_basebackup")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres"])
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .map_err(|e| format!("run pg_basebackup: {e}"))?;
        if !out.status.success() {
            return Err(format!("pg_basebackup: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let port = free_port();
        let child = self.spawn_server(&data, port, "standby.log");
        let standby = self.standby.insert(Standby { data, child });
        if let Some(st) = standby.child.try_wait().ok().flatten() {
            return Err(format!("the standby exited at once: {st}"));
        }
        self.psql("ALTER SYSTEM SET synchronous_standby_names = '*'")?;
        self.psql("SELECT pg_reload_conf()")?;
        let start = Instant::now();
        while self.psql("SELECT sync_state FROM pg_stat_replication").as_deref() != Ok("sync") {
            if let Some(st) = self.standby.as_mut().and_then(|s| s.child.try_wait().ok().flatten()) {
                return Err(format!("the standby exited: {st}; standby.log ends: {}", self.log_tail("standby.log", 5)));
            }
            if start.elapsed() > super::SETTLE_BOUND {
                let tail = self.log_tail("standby.log", 5);
                return Err(format!("the standby was not in sync within the settle bound; standby.log ends: {tail}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(port)
    }

    /// A server binary, as the `postgres` user when we are root, working in our directory.
    fn owner_cmd(&self, name: &str) -> Command {
        let mut cmd = match self.as_owner.split_first() {
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest).arg(self.bin.join(name));
                cmd
            }
            None => Command::new(self.bin.join(name)),
        };
        cmd.current_dir(&self.dir).stdin(Stdio::null());
        scrub_pg_env(&mut cmd);
        cmd
    }

    /// A client binary connected to the server over 127.0.0.1 (as whoever runs the bench).
    fn client_cmd(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(name));
        scrub_pg_env(&mut cmd);
        let port = self.port.to_string();
        cmd.current_dir(&self.dir).stdin(Stdio::null()).args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"]);
        cmd
    }

    /// Runs `sql` with `psql` (stop at the first error); stdout, unaligned and tuples only.
    fn psql(&self, sql: &str) -> Result<String, String> {
        let out = self
            .client_cmd("psql")
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", "postgres", "-c", sql])
            .output()
            .map_err(|e| format!("run psql: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// WAL syncs so far (`pg_stat_wal.wal_sync`, PostgreSQL 14+): commits a sync paid for.
    fn wal_syncs(&self) -> Option<u64> {
        self.psql("SELECT wal_sync FROM pg_stat_wal").ok()?.parse().ok()
    }

    fn postmaster(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// CPU time of the whole server so far (µs): the postmaster, its live children (auxiliary
    /// processes, backends) and the exited backends it has reaped (`cutime`/`cstime`); and the
    /// standby's, if any. `cpu_seconds_of` counts a process alone, so this reads
    /// `/proc/<pid>/stat` itself.
    fn server_cpu_us(&self) -> u64 {
        let standby = self.standby.as_ref().map(|s| s.child.id());
        let tree = |pm: u32| {
            stat(pm).map_or(0, |s| s.cpu_ticks)
                + children(pm).iter().filter_map(|&p| stat(p)).map(|s| s.cpu_ticks).sum::<u64>()
        };
        self.postmaster().into_iter().chain(standby).map(tree).sum::<u64>() * 10_000
    }

    /// Waits (up to [`BACKEND_EXIT_BOUND`]) until the postmaster's only children are its auxiliary
    /// processes (the checkpointer, walwriter, ...): every backend that served the last run (or the
    /// setup's psql) has exited and been reaped, so its CPU time is in the postmaster's `cutime`
    /// and not in a process that could be reaped between the reads of [`server_cpu_us`]. A backend
    /// read in the middle of its exit was counted in neither: C = 1 runs showed 3–16 µs of server
    /// CPU per claim against ~400 µs in the runs beside them. An exiting backend cannot be told by
    /// its title (its memory, and so its title, is gone before it is a zombie), so what is waited
    /// for is the set of auxiliary processes, by title, once the server is up.
    ///
    /// [`server_cpu_us`]: Postgres::server_cpu_us
    fn settle(&self) {
        let Some(pm) = self.postmaster() else { return };
        let start = Instant::now();
        // The walsender serving a standby lives as long as the standby's connection, whatever its pid.
        let waiting = || children(pm).into_iter().any(|p| !self.auxiliary.contains(&p) && !is_walsender(p));
        while waiting() && start.elapsed() < BACKEND_EXIT_BOUND {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// How long [`Postgres::settle`] waits for the last run's backends to exit and be reaped: they
/// normally go within a second; past this the CPU reading is taken anyway.
const BACKEND_EXIT_BOUND: Duration = Duration::from_secs(10);

/// Titles of the postmaster's long-lived children (PostgreSQL 13–17): `postgres: checkpointer`, ...
const AUXILIARY: [&str; 5] =
    ["checkpointer", "background writer", "walwriter", "autovacuum launcher", "logical replication launcher"];

/// The postmaster's children whose title names an auxiliary process (a walsender, which lives as
/// long as its standby's connection, is told by its title when [`Postgres::settle`] looks).
fn auxiliary(pm: u32) -> Vec<u32> {
    children(pm)
        .into_iter()
        .filter(|&p| AUXILIARY.iter().any(|a| title(p).starts_with(&format!("postgres: {a}"))))
        .collect()
}

/// Whether `pid` is a walsender (`postgres: walsender ...`).
fn is_walsender(pid: u32) -> bool {
    title(pid).starts_with("postgres: walsender")
}

/// A process's title (its command line); empty once it is exiting.
fn title(pid: u32) -> String {
    String::from_utf8_lossy(&fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()).into_owned()
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // The logs' tails before our own shutdown adds to them.
        if std::thread::panicking() {
            for log in ["postgres.log", "standby.log"].into_iter().filter(|l| self.dir.join(l).is_file()) {
                eprintln!("----- {log} (tail) -----\n{}", self.log_tail(log, 20));
            }
        }
        // The server first (its walsender waits for the standby to flush the last WAL, then it
        // exits), then the standby.
        if let Some(child) = self.child.take() {
            self.stop(&self.data, child);
        }
        if let Some(Standby { data, child }) = self.standby.take() {
            self.stop(&data, child);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Postgres {
    /// The last `lines` lines of `log` in our directory, one string.
    fn log_tail(&self, log: &str, lines: usize) -> String {
        let text = fs::read_to_string(self.dir.join(log)).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// `pg_ctl stop -m fast` on `data`, then SIGKILL if its postmaster is still there after 5 s.
    fn stop(&self, data: &Path, mut child: Child) {
        let _ = self
            .owner_cmd("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(data)
            .args(["-m", "fast", "-w", "-t", "30"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let start = Instant::now();
        while matches!(child.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `CLAIMS_BENCH_PG_BIN` (a directory), else the newest `/usr/lib/postgresql/<ver>/bin` (Debian's
/// layout) holding every binary the reference runs.
fn find_bin() -> Option<PathBuf> {
    let complete = |d: &Path| ["initdb", "pg_ctl", "postgres", "pgbench", "psql"].iter().all(|b| d.join(b).is_file());
    if let Some(d) = std::env::var_os("CLAIMS_BENCH_PG_BIN") {
        return Some(PathBuf::from(d)).filter(|d| complete(d));
    }
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let ver = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((ver, e.path().join("bin")))
        })
        .filter(|(_, d)| complete(d))
        .collect();
    found.sort();
    found.pop().map(|(_, d)| d)
}

/// Root must hand the server to the `postgres` user (`setpriv` execs, so the child we hold is the
/// postmaster itself); anyone else runs it as themselves.
fn owner_prefix() -> Result<Vec<String>, String> {
    let status = fs::read_to_string("/proc/self/status").map_err(|e| format!("read /proc/self/status: {e}"))?;
    let euid = status.lines().find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().nth(1)?.parse::<u32>().ok());
    if euid != Some(0) {
        return Ok(Vec::new());
    }
    let id = |flag: &str| {
        let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    match (id("-u"), id("-g")) {
        (Some(uid), Some(gid)) => Ok(vec![
            "setpriv".into(),
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--clear-groups".into(),
            "--".into(),
        ]),
        _ => Err("running as root and there is no postgres user to run the server as".into()),
    }
}

/// The environment must not point the tools at another server or add options.
fn scrub_pg_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PG") {
            cmd.env_remove(k);
        }
    }
}

/// Per-transaction latencies (µs, third field) from pgbench's `-l` logs `<prefix><pid>[.<thread>]`,
/// which are removed once read.
fn transaction_latencies_us(dir: &Path, prefix: &str) -> Vec<u64> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for e in entries.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with(prefix)) {
        let text = fs::read_to_string(e.path()).unwrap_or_default();
        out.extend(text.lines().filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok()));
        let _ = fs::remove_file(e.path());
    }
    out
}
