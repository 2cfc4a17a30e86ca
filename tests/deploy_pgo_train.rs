//! `deploy/pgo-train.sh`, the training step of a profile-guided image build
//! (`GATEWAY_IMAGE_PGO=1 deploy/build-image.sh`), run on this build's binary: it must form its
//! three-node cluster, put its device and backend load through it with nothing refused, and see
//! every node exit cleanly on SIGTERM (an instrumented node writes its profile only then).
//! An instrumented build is not made here (that is the image build's own work); the script is the
//! part that would rot silently when a flag or an endpoint it uses changes.

mod common;

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{bin, scrub_env, tail, wait_until, START_BOUND};

/// The training load's length in seconds, short for a test.
const TRAIN_SECS: u64 = 6;
const DEVICES: u64 = 200;

/// The script's process group (it, its nodes, its loaders): killed when the test ends however it
/// ends; on a panic the output dir is kept and the nodes' and the loader's log tails printed.
struct Training {
    child: Child,
    dir: tempfile::TempDir,
    out: PathBuf,
    stderr: PathBuf,
}

impl Training {
    fn start(binary: &str) -> Training {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("train");
        let stderr = dir.path().join("stderr");
        let mut cmd = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/pgo-train.sh"));
        cmd.args([binary, out.to_str().unwrap()])
            .env("PGO_TRAIN_SECS", TRAIN_SECS.to_string())
            .env("PGO_TRAIN_DEVICES", DEVICES.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr).unwrap())
            .process_group(0);
        scrub_env(&mut cmd);
        let child = cmd.spawn().expect("run deploy/pgo-train.sh");
        Training { child, dir, out, stderr }
    }

    /// Waits for the script's end: its exit code and stderr. The bound: three starts, the join and
    /// its wait for live leases (each bounded by the script at 60 s), the load (a device round may
    /// start as the HTTP load ends), and the nodes' exits on SIGTERM (bounded by the script at 60 s).
    fn finish(&mut self) -> (Option<i32>, String) {
        let bound = 3 * START_BOUND + Duration::from_secs(60 + 3 * TRAIN_SECS + 60 + 60);
        let status = wait_until(bound, "deploy/pgo-train.sh to finish", || match self.child.try_wait() {
            Ok(Some(st)) => Ok(st),
            other => Err(format!("{other:?}; stderr so far: {}", fs::read_to_string(&self.stderr).unwrap_or_default())),
        });
        (status.code(), fs::read_to_string(&self.stderr).unwrap())
    }
}

impl Drop for Training {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the group this test created (process_group(0): its id is the child's).
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
        if std::thread::panicking() {
            self.dir.disable_cleanup(true);
            eprintln!("[pgo-train] test failed; kept {}", self.dir.path().display());
            for name in ["n1.log", "n2.log", "n3.log", "steady.log"] {
                eprintln!("----- {name} -----\n{}", tail(&self.out.join(name), 40));
            }
        }
    }
}

#[test]
fn the_training_load_runs_through_a_three_node_cluster_and_every_node_stops_cleanly() {
    let mut training = Training::start(bin());
    let (code, stderr) = training.finish();
    let out = training.out.clone();
    assert_eq!(code, Some(0), "the training run failed:\n{stderr}");
    assert!(stderr.contains("three nodes live"), "{stderr}");
    assert!(stderr.contains("stopped; profiles written: "), "{stderr}");

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

    // Each node logged its clean stop, with no task left running and no panic.
    for name in ["n1", "n2", "n3"] {
        let log = fs::read_to_string(out.join(format!("{name}.log"))).unwrap();
        assert!(log.lines().any(|l| l.ends_with("gateway::node: stopped")), "{name} did not log its stop:\n{log}");
        assert!(!log.contains("stopped with tasks still running"), "{name}:\n{log}");
        assert!(!log.contains("panicked"), "{name} panicked:\n{log}");
    }
}

#[test]
fn a_missing_binary_is_refused_by_name_before_anything_starts() {
    let mut training = Training::start("/nonexistent/gateway");
    let (code, stderr) = training.finish();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no executable at /nonexistent/gateway"), "{stderr}");
    assert!(!training.out.exists(), "nothing was created or started");
}
