//! `gateway check-config` through the real binary: it reads flags, `GATEWAY_*` and the `--config`
//! file exactly as `serve` does, prints the configuration in force as TOML that reads back, shows
//! where secrets come from but never a secret, and refuses a bad configuration with exit 78 and a
//! message naming the key — without starting anything or writing to the data dir.

mod common;

use std::fs::File;
use std::process::{Command, Stdio};

use common::{bin, random_hex, wait_until, CLI_BOUND};

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `gateway check-config <args>` with exactly `env` from the GATEWAY_* family.
fn check(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(bin());
    cmd.arg("check-config").args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GATEWAY_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    cmd.stdout(File::create(&out_path).unwrap()).stderr(File::create(&err_path).unwrap());
    let mut child = cmd.spawn().expect("run gateway check-config");
    // It reads files and prints: no network, no waiting.
    let status = wait_until(CLI_BOUND, "gateway check-config to finish", || match child.try_wait() {
        Ok(Some(st)) => Ok(st),
        other => Err(format!("{other:?}")),
    });
    Out {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap(),
        stderr: std::fs::read_to_string(&err_path).unwrap(),
    }
}

#[test]
fn check_config_prints_the_configuration_in_force_and_refuses_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cluster_secret = random_hex(40);
    let secret_file = dir.path().join("cluster.secret");
    std::fs::write(&secret_file, format!("{cluster_secret}\n")).unwrap();
    let device_secret = random_hex(40);
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"from-file\"\nlease_ms = 12000\nsweep_ms = 700\nlog_format = \"json\"\ndata_dir = \"{}\"\n\
             cluster_secret_file = \"{}\"\n",
            data.display(),
            secret_file.display()
        ),
    )
    .unwrap();
    let cfg = config.display().to_string();

    // Flags over the environment over the file over defaults, as `serve`.
    let out = check(
        &["--config", &cfg, "--lease-ms", "16000", "--name", "from-flag"],
        &[("GATEWAY_SWEEP_MS", "900"), ("GATEWAY_DEVICE_SECRET", &device_secret)],
    );
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    let text = &out.stdout;
    let toml_part: String = text.lines().filter(|l| !l.starts_with('#')).map(|l| format!("{l}\n")).collect();
    let v: toml::Table = toml::from_str(&toml_part).unwrap_or_else(|e| panic!("not TOML ({e}): {text}"));
    assert_eq!(v["name"].as_str(), Some("from-flag"), "a flag beats the file");
    assert_eq!(v["lease_ms"].as_integer(), Some(16000), "a flag beats the file");
    assert_eq!(v["sweep_ms"].as_integer(), Some(900), "the environment beats the file");
    assert_eq!(v["log_format"].as_str(), Some("json"), "from the file");
    assert_eq!(v["election_timeout_ms"].as_integer(), Some(1000), "a default");
    assert_eq!(v["handshake_timeout_ms"].as_integer(), Some(5000), "a derived default");
    assert_eq!(v["cluster_listen"].as_str(), Some("127.0.0.1:7070"));
    assert_eq!(v["device_nice"].as_integer(), Some(10), "the device side yields to the cluster side by default");
    // Where secrets come from, never what they are.
    assert!(text.contains(&format!("cluster secret:  {}", secret_file.display())), "{text}");
    assert!(text.contains("device secret:   $GATEWAY_DEVICE_SECRET"), "{text}");
    assert!(text.contains("(generated on first start)"), "the backend secret is generated later: {text}");
    assert!(!text.contains(&cluster_secret) && !text.contains(&device_secret), "a secret was printed: {text}");
    assert!(!data.exists(), "check-config creates nothing");

    // What it prints is a configuration file `check-config` (and so `serve`) accepts as it is.
    let printed = dir.path().join("printed.toml");
    std::fs::write(&printed, &out.stdout).unwrap();
    let again = check(&["--config", &printed.display().to_string()], &[("GATEWAY_DEVICE_SECRET", &device_secret)]);
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert_eq!(again.stdout, out.stdout, "the printed configuration reads back as itself");

    // Refusals: exit 78, the key named, on stderr.
    for (args, env, key) in [
        (vec!["--config", cfg.as_str(), "--lease-ms", "3000"], vec![], "lease_ms"),
        (vec!["--config", cfg.as_str(), "--max-voters", "4"], vec![], "max_voters"),
        (vec!["--config", cfg.as_str(), "--device-nice", "20"], vec![], "device_nice"),
        (vec!["--config", cfg.as_str()], vec![("GATEWAY_DEVICE_NICE", "-5")], "device_nice"),
        (vec!["--config", cfg.as_str()], vec![("GATEWAY_CLUSTER_LISTEN", "0.0.0.0:7070")], "cluster_advertise"),
        (
            vec!["--config", cfg.as_str(), "--log-format", "json"],
            vec![("GATEWAY_DEVICE_SECRET", "short")],
            "device_secret_file",
        ),
        (
            vec!["--config", cfg.as_str(), "--cluster-secret-file", "/nonexistent/cluster.secret"],
            vec![],
            "cluster_secret_file",
        ),
    ] {
        let out = check(&args, &env);
        assert_eq!(out.code, Some(78), "{args:?} {env:?}: {}{}", out.stdout, out.stderr);
        assert!(out.stderr.contains(key), "{args:?}: the message names {key}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "nothing printed for a refused configuration: {}", out.stdout);
    }
    // A file with an unknown or mistyped key names it too.
    for (content, key) in [
        ("leese_ms = 1\n", "leese_ms"),
        ("lease_ms = \"long\"\n", "lease_ms"),
        ("log_format = \"xml\"\n", "log_format"),
    ] {
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, content).unwrap();
        let out = check(&["--config", &bad.display().to_string()], &[]);
        assert_eq!(out.code, Some(78), "{content}: {}", out.stderr);
        assert!(out.stderr.contains(key), "{content}: {}", out.stderr);
    }
    // A flag clap cannot parse is a usage error (64), naming the flag.
    let out = check(&["--log-format", "xml"], &[]);
    assert_eq!(out.code, Some(64), "{}", out.stderr);
    assert!(out.stderr.contains("--log-format"), "{}", out.stderr);
}
