//! The operator CLI: `status` (table and JSON), usage and runtime exit codes, and `leave` of a
//! running node, which then stops by itself.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, status, Cluster, View, SLACK, TIMING};

#[test]
fn status_table_json_exit_codes_and_leave() {
    let (mut c, view) = Cluster::form(2, &[]);
    let cluster = c.nodes[1].cluster_addr_str();

    // --json prints exactly one JSON object, the same view as the HTTP endpoint.
    let out = c.cli_auth(&["status", "--cluster", &cluster, "--json"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("status --json must print one JSON object ({e}): {:?}", out.stdout));
    assert!(json.is_object());
    assert_eq!(View::from_json(&json).as_ref(), Some(&view), "status --json vs /cluster/status");
    assert_eq!(status::node_id(&json), Some(c.node_id(1)), "\"node\" is the node that answered");
    let config = &json["config"];
    assert_eq!(
        (
            config["lease_ms"].as_u64(),
            config["sweep_ms"].as_u64(),
            config["election_timeout_ms"].as_u64(),
            config["heartbeat_ms"].as_u64()
        ),
        (Some(TIMING.lease_ms), Some(TIMING.sweep_ms), Some(TIMING.election_timeout_ms), Some(TIMING.heartbeat_ms)),
        "config in force: {config}"
    );
    for key in ["cluster_id", "term", "commit_index", "applied_index", "last_log_index"] {
        assert!(!json[key].is_null(), "status --json lacks {key}: {json}");
    }

    // Without --json: a human table naming the leader and every member.
    let out = c.cli_auth(&["status", "--cluster", &cluster]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let leader = status::leader_name(&json).expect("a leader");
    assert!(out.stdout.contains(&leader), "table lacks leader {leader}:\n{}", out.stdout);
    for name in ["n1", "n2"] {
        assert!(out.stdout.contains(name), "table lacks member {name}:\n{}", out.stdout);
    }
    assert!(serde_json::from_str::<serde_json::Value>(out.stdout.trim()).is_err(), "without --json, not JSON");

    // Usage errors exit 64; an unreachable cluster is a runtime failure (1).
    for args in [&["join"][..], &["no-such-command"][..], &["status", "--cluster"][..]] {
        let out = c.cli(args);
        assert_eq!(out.code, Some(64), "gateway {args:?} is a usage error: {out:#?}");
        assert!(!out.stderr.trim().is_empty(), "usage error says why on stderr: {out:#?}");
    }
    let nobody = format!("127.0.0.1:{}", free_port());
    let out = c.cli_auth(&["status", "--cluster", &nobody]);
    assert_eq!(out.code, Some(1), "unreachable cluster: {out:#?}");
    // A wrong secret is refused by the server: a runtime failure, not a crash.
    let wrong = c.dir().join("wrong.secret");
    // Long enough to pass the local format check, so the server is the one refusing it.
    std::fs::write(&wrong, "not-the-cluster-secret-at-all\n").unwrap();
    let out = c.cli(&["status", "--cluster", &cluster, "--cluster-secret-file", wrong.to_str().unwrap()]);
    assert_eq!(out.code, Some(1), "wrong secret: {out:#?}");

    // `leave` of a running member (by name): it is removed everywhere and its process exits by itself.
    let via = c.nodes[0].cluster_addr_str();
    let out = c.cli_auth(&["leave", "--cluster", &via, "--node", "n2"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let left_at = Instant::now();
    c.wait_agreement(&[0], TIMING.settle_bound(), "n2 removed", |v| v.members.len() == 1 && v.member("n2").is_none());
    let st = c.wait_exit(1, Duration::from_millis(TIMING.lease_ms) + 2 * SLACK);
    println!("n2 exited {st} {:?} after leave", left_at.elapsed());
}
