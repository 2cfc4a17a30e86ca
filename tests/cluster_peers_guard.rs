//! The bootstrap guard (`serve --peers`) on a first-ever start and on a restart: peers where nothing
//! listens → it bootstraps once `--peers-wait-ms` ran out, saying so (also when a start stopped
//! before it bootstrapped left an identity but no cluster); a restart with a data dir that holds a
//! cluster ignores the peers (no wait); peers in two different clusters → refused with exit 78.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, http, wait_until, Cluster, Start, SLACK, TIMING};

/// Node `i`'s stderr since the harness's `n`th spawn of it.
fn log_of_spawn(c: &Cluster, i: usize, n: u32) -> String {
    let all = std::fs::read_to_string(&c.nodes[i].stderr_path).unwrap_or_default();
    let marker = format!("===== harness: spawn #{n} of {}:", c.nodes[i].name);
    all.split_once(&marker).map(|(_, rest)| rest.to_string()).unwrap_or_default()
}

fn wait_ready(c: &Cluster, i: usize, bound: Duration) {
    let addr = c.nodes[i].cluster_addr();
    wait_until(bound, &format!("{} /readyz", c.nodes[i].name), || {
        match http::request(addr, "GET", "/readyz", &[], None, Duration::from_secs(2)) {
            Ok(r) if r.status == 200 => Ok(()),
            Ok(r) => Err(format!("status {}", r.status)),
            Err(e) => Err(format!("{e:#}")),
        }
    });
}

#[test]
fn guard_bootstraps_after_its_window_skips_on_restart_and_refuses_two_clusters() {
    let mut c = Cluster::new();

    // First-ever start: nothing listens on the peers' addresses.
    let wait_ms: u64 = 1500;
    let silent = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    let started = Instant::now();
    let wait_arg = wait_ms.to_string();
    c.spawn_with("n1", Start::Bootstrap, &["--peers", &silent, "--peers-wait-ms", &wait_arg]);
    let took = started.elapsed();
    let log = log_of_spawn(&c, 0, 1);
    assert!(log.contains("bootstrap guard: no cluster in the data dir"), "guard announces itself:\n{log}");
    assert!(log.contains("no peer is in a cluster yet"), "guard prints its progress:\n{log}");
    assert!(
        log.contains("no peer answered as a member within peers_wait_ms: bootstrapping")
            && log.contains("bootstrapped a one-node cluster"),
        "guard says why it bootstraps:\n{log}"
    );
    let window = Duration::from_millis(wait_ms);
    assert!(took >= window, "silent peers: the guard waits its whole window ({window:?}), ready after {took:?}");
    assert!(took <= window + 2 * SLACK, "bootstrap within the window plus start-up slack; took {took:?}");
    // Ready means a leader and a live lease; the new leader records the cluster id right after
    // extending the leases, in an entry of its own that may commit a moment later.
    let first = wait_until(TIMING.settle_bound(), "n1 to record its cluster id", || match c.view(0) {
        Ok(v) if !v.cluster_id.is_empty() => Ok(v),
        other => Err(format!("{other:?}")),
    });
    println!("first start with silent peers: ready after {took:?} (window {window:?})");

    // A restart with its data dir ignores --peers, even with a long window.
    let id = c.node_id(0);
    let long_wait: u64 = 60_000;
    c.kill9(0);
    c.nodes[0].extra_args = vec!["--peers".into(), silent.clone(), "--peers-wait-ms".into(), long_wait.to_string()];
    let restarted = Instant::now();
    c.start(0);
    wait_ready(&c, 0, Duration::from_millis(long_wait / 4));
    let took = restarted.elapsed();
    assert!(took < Duration::from_millis(long_wait / 4), "restart must not wait for peers: {took:?}");
    let log = log_of_spawn(&c, 0, 2);
    assert!(log.contains("peers not asked"), "restart says it ignores peers:\n{log}");
    assert!(!log.contains("bootstrap guard"), "restart must not probe:\n{log}");
    assert_eq!(c.node_id(0), id, "same member after the restart");
    assert_eq!(c.view(0).expect("n1 view").cluster_id, first.cluster_id);
    println!("restart with --peers and a {long_wait} ms window: ready after {took:?}");

    // A data dir with an identity but no cluster (a start stopped before it bootstrapped): still
    // guarded, so the start finishes by itself. n0 first ran as a standby, then as a guarded bootstrap.
    let n0 = c.spawn("n0", Start::Standby);
    c.kill9(n0);
    c.nodes[n0].start = Start::Bootstrap;
    c.nodes[n0].extra_args = vec!["--peers".into(), silent.clone(), "--peers-wait-ms".into(), wait_arg.clone()];
    let restarted = Instant::now();
    c.start(n0);
    wait_ready(&c, n0, window + 2 * SLACK);
    let took = restarted.elapsed();
    let log = log_of_spawn(&c, n0, 2);
    assert!(took >= window, "guarded: waits its window on a data dir without a cluster ({took:?})");
    assert!(log.contains("bootstrap guard: no cluster in the data dir"), "guard runs:\n{log}");
    assert!(log.contains("bootstrapped a one-node cluster"), "and bootstraps:\n{log}");
    c.kill9(n0);

    // A second, separate cluster; a fresh node whose peers are one member of each is refused.
    let n2 = c.spawn("n2", Start::Bootstrap);
    let other = c.view(n2).expect("n2 view");
    assert_ne!(other.cluster_id, first.cluster_id);
    let peers = format!("{},{}", c.nodes[0].cluster_addr_str(), c.nodes[n2].cluster_addr_str());
    let dir = c.dir().join("n3-data");
    let (listen, cluster) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let secret = c.secret_file.display().to_string();
    let device = c.device_secret_file.display().to_string();
    let lease = TIMING.lease_ms.to_string();
    let election = TIMING.election_timeout_ms.to_string();
    let heartbeat = TIMING.heartbeat_ms.to_string();
    let out = c.cli(&[
        "serve",
        "--name",
        "n3",
        "--listen",
        &listen,
        "--cluster-listen",
        &cluster,
        "--data-dir",
        &dir.display().to_string(),
        "--cluster-secret-file",
        &secret,
        "--device-secret-file",
        &device,
        "--lease-ms",
        &lease,
        "--election-timeout-ms",
        &election,
        "--heartbeat-ms",
        &heartbeat,
        "--peers",
        &peers,
        "--peers-wait-ms",
        "3000",
    ]);
    assert_eq!(out.code, Some(78), "peers in two clusters: refused as a configuration error: {out:#?}");
    assert!(out.stderr.contains("different clusters"), "the refusal names the problem: {out:#?}");
    for id in [&first.cluster_id, &other.cluster_id] {
        assert!(out.stderr.contains(id.as_str()), "the refusal names cluster {id}: {out:#?}");
    }
    assert!(!out.stderr.contains("bootstrapped a one-node cluster"), "{out:#?}");
}
