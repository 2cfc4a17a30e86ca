//! `gateway bench`: a steady run and a drain storm against a three-node cluster, read as JSON.

mod common;

use common::status::leader_name;
use common::{wait_until, Cluster, TIMING};

fn bench(c: &Cluster, scenario: &[&str]) -> serde_json::Value {
    let nodes = (0..c.nodes.len()).map(|i| c.public_url(i)).collect::<Vec<_>>().join(",");
    let cluster = c.nodes[1].cluster_addr_str();
    let dsf = c.device_secret_file.display().to_string();
    let pids: Vec<String> =
        c.nodes.iter().filter_map(|n| n.pid().map(|p| format!("{}={p}", n.name))).collect::<Vec<_>>();
    let mut args = vec!["bench"];
    args.extend_from_slice(scenario);
    args.extend_from_slice(&["--nodes", &nodes, "--cluster", &cluster, "--device-secret-file", &dsf, "--json"]);
    for p in &pids {
        args.extend_from_slice(&["--pid", p]);
    }
    let out = c.cli_auth(&args);
    assert_eq!(out.code, Some(0), "{out:#?}");
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("one JSON object ({e}): {out:#?}"))
}

#[test]
fn steady_then_drain_storm() {
    let (c, _view) = Cluster::form(3, &[]);

    let r = bench(&c, &["steady", "--devices", "50", "--secs", "2", "--prefix", "st"]);
    assert_eq!(r["scenario"], "steady", "{r}");
    assert_eq!(r["connected"], 50, "{r}");
    assert_eq!(r["connected_at_end"], 50, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    assert!(r["accepts"].as_u64() >= Some(50), "{r}");
    assert!(r["connect_rate_per_s"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    assert!(r["handshake"]["p99_ms"].is_number(), "{r}");
    assert_eq!(r["memory"].as_array().map(Vec::len), Some(3), "one memory row per member: {r}");
    for m in r["memory"].as_array().unwrap() {
        assert_eq!(m["source"], "proc", "pids were given: {m}");
        assert!(m["rss_after_bytes"].as_u64().is_some_and(|b| b > 0), "{m}");
    }

    // Placement weighs nodes by the connections their leases last reported: until every node has
    // renewed with the steady run's devices gone, the one that held the most of them looks the
    // busiest and may be given none of the storm's devices (and the drain would then move none).
    wait_until(TIMING.settle_bound(), "every lease to report the steady run's devices gone", || {
        let status = c.try_status(1)?;
        let counts: Vec<u64> = status["members"]
            .as_array()
            .map(|ms| ms.iter().filter_map(|m| m["connections"].as_u64()).collect())
            .unwrap_or_default();
        if counts.len() == 3 && counts.iter().all(|n| *n == 0) {
            Ok(())
        } else {
            Err(format!("connections per member: {counts:?}"))
        }
    });
    let r = bench(&c, &["storm", "--devices", "50", "--drain", "n1", "--timeout-secs", "20", "--prefix", "sd"]);
    assert_eq!(r["scenario"], "storm", "{r}");
    assert_eq!(r["connected"], 50, "{r}");
    let st = &r["storm"];
    assert_eq!(st["event"], "drain", "{st}");
    assert!(st["affected"].as_u64().is_some_and(|a| a > 0), "some devices were on n1: {st}");
    assert_eq!(st["rehomed"], st["affected"], "every affected device re-homed: {st}");
    assert_eq!(st["timed_out"], false, "{st}");
    assert!(st["t100_ms"].is_u64(), "{st}");
    let windows = st["windows"].as_array().expect("windows");
    assert!(!windows.is_empty(), "{st}");
    let accepts: u64 = windows.iter().map(|w| w["accepts"].as_u64().unwrap()).sum();
    assert!(accepts >= st["affected"].as_u64().unwrap(), "the re-homing connects fall in the windows: {st}");
    assert_eq!(r["connected_at_end"], 50, "{r}");
}

/// A leader's death costs its devices the election before any claim commits: the model the storm
/// is compared with waits for it too, so the ratio shows what the cluster adds to the election.
#[test]
fn a_leader_kill_storm_is_modelled_with_its_election() {
    let (c, _view) = Cluster::form(3, &[]);
    let leader = leader_name(&c.status_json(1)).expect("a leader");
    let r = bench(&c, &["storm", "--devices", "30", "--kill", &leader, "--timeout-secs", "30", "--prefix", "lk"]);
    let st = &r["storm"];
    assert_eq!((st["event"].as_str(), st["node"].as_str()), (Some("kill"), Some(leader.as_str())), "{st}");
    assert!(st["affected"].as_u64().is_some_and(|a| a > 0), "some devices were on the leader: {st}");
    assert_eq!(st["rehomed"], st["affected"], "every affected device re-homed: {st}");
    // The soonest a voter may elect by design: the leader's lease (election timeout × 2) and a
    // heartbeat after its last one.
    let election_ms = 2 * TIMING.election_timeout_ms + TIMING.heartbeat_ms;
    let model = &st["model"];
    let command: Vec<&str> = model["command"].as_str().unwrap_or_default().split(' ').collect();
    let election = ["--election-ms".to_string(), election_ms.to_string()];
    assert!(command.windows(2).any(|w| w == election), "{model}");
    assert!(model["t50_ms"].as_u64().is_some_and(|t| t >= election_ms), "nobody connects before it: {model}");
}
