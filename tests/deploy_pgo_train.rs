//! `deploy/pgo-train.sh`, the training step of a profile-guided image build
//! (`GATEWAY_IMAGE_PGO=1 deploy/build-image.sh`), run on this build's binary: it must form its
//! three-node cluster, put its device and backend load through it with nothing refused, and see
//! every node exit cleanly on SIGTERM (an instrumented node writes its profile only then).
//! An instrumented build is not made here (that is the image build's own work); the script is the
//! part that would rot silently when a flag or an endpoint it uses changes.

mod common;

use std::fs::{self, File};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{bin, wait_until, START_BOUND};

/// The training load's length in seconds, short for a test.
const TRAIN_SECS: u64 = 6;
const DEVICES: u64 = 200;

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/pgo-train.sh")
}

/// Runs the script to its end: exit code, stderr.
fn run(args: &[&str], out_dir: &Path) -> (Option<i32>, String) {
    let err_path = out_dir.with_extension("stderr");
    let mut child = Command::new(script())
        .args(args)
        .env("PGO_TRAIN_SECS", TRAIN_SECS.to_string())
        .env("PGO_TRAIN_DEVICES", DEVICES.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .expect("run deploy/pgo-train.sh");
    // Three starts, the join and its wait for live leases (each bounded by the script at 60 s),
    // the load, and the nodes' drains on SIGTERM (nothing left connected to drain).
    let bound = 3 * START_BOUND + Duration::from_secs(60 + 3 * TRAIN_SECS + 60);
    let status = wait_until(bound, "deploy/pgo-train.sh to finish", || match child.try_wait() {
        Ok(Some(st)) => Ok(st),
        other => Err(format!("{other:?}; stderr so far: {}", fs::read_to_string(&err_path).unwrap_or_default())),
    });
    (status.code(), fs::read_to_string(&err_path).unwrap())
}

#[test]
fn the_training_load_runs_through_a_three_node_cluster_and_every_node_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("train");
    let (code, stderr) = run(&[bin(), out.to_str().unwrap()], &out);
    assert_eq!(code, Some(0), "the training run failed:\n{stderr}");
    assert!(stderr.contains("three nodes live"), "{stderr}");
    assert!(stderr.contains("stopped; profiles written: 0"), "a build without instrumentation writes none: {stderr}");

    // Every device round connected all of its devices.
    let mut rounds = 0;
    for entry in fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("steady-") && name.ends_with(".json") {
            let report: serde_json::Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!(report["connected"], DEVICES, "{name}: {report}");
            rounds += 1;
        }
    }
    assert!(rounds >= 2, "a round of new devices and one of the same devices again: {rounds} reports");

    // The backend load was answered: the load itself fails below 90 % 2xx; here the claims,
    // publishes and lookups must have been answered 200 at that share.
    let load: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out.join("http-load.json")).unwrap()).unwrap();
    let total = load["requests"].as_u64().unwrap();
    let ok = load["by_answer"]["200"].as_u64().unwrap_or(0);
    assert!(total >= 4 && ok * 10 >= total * 9, "{load}");

    // Each node logged its clean stop, and no node logged a panic.
    for name in ["n1", "n2", "n3"] {
        let log = fs::read_to_string(out.join(format!("{name}.log"))).unwrap();
        assert!(log.contains("stopped"), "{name} did not log its stop:\n{log}");
        assert!(!log.contains("panicked"), "{name} panicked:\n{log}");
    }
}

#[test]
fn a_missing_binary_is_refused_by_name_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("train");
    let (code, stderr) = run(&["/nonexistent/gateway", out.to_str().unwrap()], &out);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no executable at /nonexistent/gateway"), "{stderr}");
    assert!(!out.join("n1").exists(), "nothing was started");
}
