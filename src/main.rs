//! Shell: parse the command line, start telemetry, run, map the error to an exit code
//! (0 ok, 64 usage, 78 bad config, 1 runtime failure).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gateway::cli::{Cli, Command, SecretArgs, ServeArgs};
use gateway::config::{self, Config, ConfigError, FileConfig, LogFormat};
use gateway::http::HttpClient;
use gateway::node::{self, NodeError};
use gateway::secrets::{self, SecretError};
use gateway::tools::admin::{Admin, AdminError};

const EXIT_USAGE: u8 = 64;
const EXIT_CONFIG: u8 = 78;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                _ => ExitCode::from(EXIT_USAGE),
            };
        }
    };
    // `serve` and `check-config` read their configuration first: it says how to log.
    let cfg = match &cli.command {
        Command::Serve(args) | Command::CheckConfig(args) => match load_config(args) {
            Ok(cfg) => Some(cfg),
            Err(f) => return exit(f, LogFormat::Text),
        },
        _ => None,
    };
    let format = cfg.as_ref().map_or(LogFormat::Text, |c| c.log_format);
    init_tracing(format);
    // `serve`: this runtime is the device side's, at its own priority (`node::priority`).
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let (Command::Serve(_), Some(cfg)) = (&cli.command, &cfg) {
        let nice = cfg.device.device_nice;
        builder.thread_name("device").on_thread_start(move || node::priority::lower_this_thread(nice));
    }
    let rt = builder.enable_all().build().expect("tokio runtime");
    match rt.block_on(run(cli, cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => exit(f, format),
    }
}

/// Log lines go to stderr, as text (colours only on a terminal) or as one JSON object per line.
fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GATEWAY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(true).init(),
    }
}

/// Reports a failure (as a log line when the log is JSON, so that every stderr line parses) and
/// maps it to its exit code.
fn exit(f: Failure, format: LogFormat) -> ExitCode {
    let (code, msg) = match f {
        Failure::Usage(msg) => (EXIT_USAGE, msg),
        Failure::Config(msg) => (EXIT_CONFIG, msg),
        Failure::Runtime(msg) => (1, msg),
    };
    match format {
        LogFormat::Json => tracing::error!(exit_code = code, error = %msg, "gateway stopped"),
        LogFormat::Text => eprintln!("gateway: {msg}"),
    }
    ExitCode::from(code)
}

/// The configuration `serve` runs with: flags and `GATEWAY_*` (clap folds them together) over the
/// `--config` file over defaults.
fn load_config(args: &ServeArgs) -> Result<Config, Failure> {
    let file = match &args.config {
        Some(path) => config::load_file(path)?,
        None => FileConfig::default(),
    };
    Ok(Config::merge(args.to_layer(), file)?)
}

/// `gateway check-config`: the configuration was read and validated like `serve`'s; check the
/// secret sources as a start would (generating nothing) and print what is in force.
fn check_config(cfg: &Config) -> Result<(), Failure> {
    let dir = &cfg.data_dir;
    let named = |what: &str, r: Result<String, SecretError>| {
        r.map_err(|e| Failure::Config(format!("invalid configuration: {what}: {e}")))
    };
    let cluster = named(
        "cluster_secret_file (or GATEWAY_CLUSTER_SECRET)",
        secrets::inspect("GATEWAY_CLUSTER_SECRET", cfg.cluster_secret_file.as_deref(), dir, "cluster.secret"),
    )?;
    let device = named(
        "device_secret_file (or GATEWAY_DEVICE_SECRET)",
        secrets::inspect("GATEWAY_DEVICE_SECRET", cfg.device_secret_file.as_deref(), dir, "device.secret"),
    )?;
    let backend = named(
        "backend_secret_file (or GATEWAY_BACKEND_SECRET)",
        secrets::inspect_backend(cfg.backend_secret_file.as_deref(), dir),
    )?;
    gateway::tls::check(&cfg.tls).map_err(|e| Failure::Config(format!("invalid configuration: {e}")))?;
    println!("# gateway check-config: the configuration `gateway serve` would run with (valid).");
    println!("# Secrets are read from (values never shown):");
    println!("#   cluster secret:  {cluster}");
    println!("#   device secret:   {device}");
    println!("#   backend secrets: {backend}");
    print!("{}", cfg.effective_toml());
    Ok(())
}

enum Failure {
    Usage(String),
    Config(String),
    Runtime(String),
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Failure::Config(e.to_string())
    }
}

impl From<NodeError> for Failure {
    fn from(e: NodeError) -> Self {
        match e {
            NodeError::Config(m) => Failure::Config(m),
            // The peers name two clusters: a configuration to fix.
            e @ NodeError::Guard(_) => Failure::Config(e.to_string()),
            other => Failure::Runtime(other.to_string()),
        }
    }
}

impl From<SecretError> for Failure {
    fn from(e: SecretError) -> Self {
        Failure::Config(e.to_string())
    }
}

impl From<AdminError> for Failure {
    fn from(e: AdminError) -> Self {
        Failure::Runtime(e.to_string())
    }
}

fn admin(secret: &SecretArgs) -> Result<Admin, Failure> {
    let s = secrets::cli_cluster_secret(secret.cluster_secret_file.as_deref(), &secret.data_dir)?;
    let tls = secret.tls().map_err(|e| Failure::Config(e.to_string()))?;
    Ok(Admin::new(HttpClient::with_tls(&s, tls)))
}

async fn run(cli: Cli, cfg: Option<Config>) -> Result<(), Failure> {
    match cli.command {
        Command::Serve(_) => node::serve(cfg.expect("serve reads its configuration first")).await?,
        Command::CheckConfig(_) => check_config(cfg.as_ref().expect("check-config reads the configuration first"))?,
        Command::Probe { url, timeout_ms, ca_file, client_cert_file, client_key_file } => {
            use gateway::tools::probe::{probe, ProbeError};
            let identity = client_cert_file.as_deref().zip(client_key_file.as_deref());
            let tls = ca_file
                .map(|ca| gateway::tls::client_config(&ca, identity))
                .transpose()
                .map_err(|e| Failure::Config(e.to_string()))?;
            match probe(&url, Duration::from_millis(timeout_ms), tls).await {
                Ok(status) => println!("{url}: {status}"),
                Err(e @ ProbeError::BadUrl(_)) => return Err(Failure::Usage(e.to_string())),
                Err(e) => return Err(Failure::Runtime(e.to_string())),
            }
        }
        Command::Join { cluster, node, secret } => {
            let admin = admin(&secret)?;
            let out = admin.join(&cluster, &node, &mut |line| println!("{line}")).await?;
            if !out.changed && out.role == "voter" {
                println!("membership unchanged");
            }
            print_membership(&out.membership);
        }
        Command::Leave { cluster, node, secret } => {
            let admin = admin(&secret)?;
            let out = admin.leave(&cluster, &node).await?;
            println!("removed {} ({node})", out.removed);
            print_membership(&out.membership);
        }
        Command::Status { cluster, json, secret } => {
            let report = admin(&secret)?.status(&cluster).await?;
            if json {
                println!("{}", serde_json::to_string(&report).expect("plain struct"));
            } else {
                print!("{}", report.render());
            }
        }
        Command::PlanStorm(args) => {
            let report =
                gateway::tools::plan::simulate(&args.to_model()).map_err(|e| Failure::Config(e.to_string()))?;
            if args.json {
                println!("{}", serde_json::to_string(&report).expect("plain struct"));
            } else {
                print!("{}", report.render());
            }
        }
        Command::Bench(args) => {
            use gateway::tools::bench::{scenario, BenchError, Scenario};
            let json = match &args.scenario {
                Scenario::Steady { common, .. } | Scenario::Storm { common, .. } => common.json,
            };
            let report = scenario::run(args).await.map_err(|e| match e {
                BenchError::Usage(m) => Failure::Usage(m),
                BenchError::Config(m) => Failure::Config(m),
                BenchError::Runtime(m) => Failure::Runtime(m),
            })?;
            if json {
                println!("{}", serde_json::to_string(&report).expect("plain struct"));
            } else {
                print!("{}", report.render());
            }
        }
        Command::Admission(cmd) => {
            use gateway::cli::AdmissionCommand as A;
            let (cluster, secret, change) = match cmd {
                A::Set { cluster, rate, burst, secret } => (cluster, secret, Some(Some((rate, burst)))),
                A::Clear { cluster, secret } => (cluster, secret, Some(None)),
                A::Show { cluster, secret } => (cluster, secret, None),
            };
            let admin = admin(&secret)?;
            if let Some(budget) = change {
                admin.set_admission(&cluster, budget).await?;
                match budget {
                    Some((rate, burst)) => println!("cluster budget set: {rate}/s, burst {burst} (committed)"),
                    None => println!("cluster budget cleared (committed)"),
                }
                return Ok(());
            }
            let report = admin.status(&cluster).await?;
            match report.admission_budget {
                Some(b) => println!("cluster budget: {}/s, burst {}", b.rate_per_s, b.burst),
                None => println!("cluster budget: none (each node uses its own --admit-rate)"),
            }
            if let Some(a) = report.admission {
                println!("{}: {:.2}/s, burst {}", report.node.name, a.rate_per_s, a.burst);
            }
        }
        Command::Quota(cmd) => quota(cmd).await?,
        Command::Drain { node, wait, secret } => {
            let admin = admin(&secret)?;
            admin.drain(&node).await?;
            println!("{node}: draining");
            if wait {
                admin.wait_drained(&node, &mut |line| println!("{line}")).await?;
            }
        }
        Command::ScaleIn { cluster, node, force, lock_ttl_ms, timeout_ms, secret } => {
            let job = gateway::tools::scale::ScaleIn {
                cluster,
                node,
                force,
                lock_ttl: Duration::from_millis(lock_ttl_ms),
                timeout: Duration::from_millis(timeout_ms),
            };
            admin(&secret)?.scale_in(&job, &mut |line| println!("{line}")).await?;
        }
        Command::Events { cluster, json, follow, after, secret } => {
            let every = follow.then_some(Duration::from_millis(500));
            let mut print = |e: &gateway::wire::EventView| {
                if json {
                    println!("{}", serde_json::to_string(e).expect("plain struct"));
                } else {
                    println!("{}", e.render());
                }
            };
            let admin = admin(&secret)?;
            tokio::select! {
                r = admin.print_events(&cluster, after, every, &mut print) => { r?; }
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Command::Token { device, epoch, ttl, tenant, device_secret_file, data_dir } => {
            let secret = secrets::cli_device_secret(device_secret_file.as_deref(), &data_dir)?;
            let exp = gateway::clock::now_ms() / 1000 + ttl;
            let claims = gateway::token::DeviceClaims { sub: device, epoch, exp, nbf: None, tenant };
            match gateway::token::mint_claims(&secret, &claims) {
                Ok(token) => println!("{token}"),
                Err(e) => return Err(Failure::Usage(e.to_string())),
            }
        }
        Command::Watch { cluster, interval_ms, secret } => {
            let admin = admin(&secret)?;
            let mut tick = tokio::time::interval(Duration::from_millis(interval_ms.max(50)));
            loop {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                    _ = tick.tick() => {}
                }
                let screen = match admin.status(&cluster).await {
                    Ok(r) => r.render(),
                    Err(e) => format!("{cluster}: {e}\n"),
                };
                // Clear the screen and home the cursor, then redraw.
                print!("\x1b[2J\x1b[H{}", screen);
                use std::io::Write;
                let _ = std::io::stdout().flush();
            }
        }
    }
    Ok(())
}

fn print_membership(m: &gateway::wire::MembershipSummary) {
    let fmt = |v: &[(u64, String)]| v.iter().map(|(id, n)| format!("{n} ({id})")).collect::<Vec<_>>().join(", ");
    println!("membership: voters [{}]; learners [{}]", fmt(&m.voters), fmt(&m.learners));
}

/// `gateway quota set|grant|show`.
async fn quota(cmd: gateway::cli::QuotaCommand) -> Result<(), Failure> {
    use gateway::cli::QuotaCommand as Q;
    match cmd {
        Q::Set { cluster, tenant, max_connections, publishes, period_ms, secret } => {
            let plan =
                serde_json::json!({"max_connections": max_connections, "publishes": publishes, "period_ms": period_ms});
            let v = admin(&secret)?.set_quota(&cluster, &tenant, &plan).await?;
            println!("{tenant}: plan revision {} committed", v["revision"]);
        }
        Q::Grant { cluster, tenant, publishes, id, secret } => {
            let v = admin(&secret)?.grant(&cluster, &tenant, &id, publishes).await?;
            let what = if v["duplicate"] == true { "already granted (counted once)" } else { "granted" };
            println!("{tenant}: {publishes} publishes {what}; allowance this period {}", v["usage"]["allowance"]);
        }
        Q::Show { cluster, tenant, json, secret } => {
            let v = admin(&secret)?.quota(&cluster, &tenant).await?;
            if json {
                println!("{v}");
                return Ok(());
            }
            let u = &v["usage"];
            let or_unlimited =
                |x: &serde_json::Value| if x.is_null() { "unlimited".to_string() } else { x.to_string() };
            println!("tenant {tenant} (plan revision {})", u["revision"]);
            println!("  connections {} of {}", u["connections"], or_unlimited(&u["max_connections"]));
            if u["publishes"].is_null() {
                println!("  publishes   unlimited");
            } else {
                println!(
                    "  publishes   {} used of {} ({} + {} granted) in period {} of {} ms, ending at {} ms",
                    u["used"],
                    u["allowance"],
                    u["publishes"],
                    u["granted"],
                    u["period"],
                    u["period_ms"],
                    u["period_end_ms"]
                );
            }
            let ledger = v["ledger"].as_array().map(Vec::as_slice).unwrap_or_default();
            println!("  ledger, the last {} entries by period then id:", ledger.len());
            for e in ledger {
                println!(
                    "    period {} {:<8} {:>4} rev {} at {} ms  {}",
                    e["period"],
                    e["kind"].as_str().unwrap_or(""),
                    e["publishes"],
                    e["revision"],
                    e["at_ms"],
                    e["id"].as_str().unwrap_or("")
                );
            }
        }
    }
    Ok(())
}
