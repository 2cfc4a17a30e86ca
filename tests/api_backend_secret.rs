//! The backend credential (issue 10, item 7): a backend secret publishes and reads routes, and
//! reaches nothing else (no Raft RPC, membership, propose, drain or admin claim: 403); two secrets
//! are accepted at once while a rotation overlaps, and a change to the file takes effect without a
//! restart; an unusable file keeps the previous secrets. Without a flag the node generates one in
//! its data dir (0600, the dir 0700).

mod common;

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::api::publish_at;
use common::http::{request, REQUEST_TIMEOUT};
use common::{random_hex, tail, wait_until, Cluster, SLACK};
use serde_json::{json, Value};

/// The node re-reads the file at most once a second.
const RELOAD_BOUND: Duration = Duration::from_secs(1).saturating_add(SLACK);

fn call(addr: SocketAddr, secret: &str, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let bearer = format!("Bearer {secret}");
    let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
    let r = request(addr, method, path, &headers, Some(body), REQUEST_TIMEOUT).unwrap();
    (r.status, r.json())
}

fn publish(addr: SocketAddr, secret: &str, n: u64) -> u16 {
    let bearer = format!("Bearer {secret}");
    publish_at(addr, &bearer, "d1", &json!({ "n": n }), None, REQUEST_TIMEOUT).unwrap().0
}

#[test]
fn a_backend_secret_publishes_and_reads_routes_and_reaches_nothing_else() {
    let keys = tempfile::tempdir().unwrap();
    let file = keys.path().join("backend.secret");
    let (a, b) = (random_hex(32), random_hex(32));
    fs::write(&file, format!("{a}\n")).unwrap();
    let (c, view) = Cluster::form(3, &["--backend-secret-file", file.to_str().unwrap()]);
    let follower = (0..3).find(|&i| Some(c.node_id(i)) != view.leader).unwrap();
    let leader = (0..3).find(|&i| Some(c.node_id(i)) == view.leader).unwrap();
    assert_eq!(c.claim(follower, "d1", 1, 0, 1).0, 200);

    for i in [follower, leader] {
        let addr = c.nodes[i].cluster_addr();
        assert_eq!(publish(addr, &a, i as u64), 200, "a backend publishes on {}", c.nodes[i].name);
        let (status, route) = call(addr, &a, "GET", "/v1/devices/d1/route", b"");
        assert_eq!(status, 200, "a backend reads routes: {route}");
        let me = c.node_id(i);
        let refused = [
            ("POST", format!("/raft/v2/append?target={me}")),
            ("POST", format!("/raft/v2/vote?target={me}")),
            ("POST", format!("/raft/v2/snapshot?target={me}")),
            ("POST", "/cluster/propose/v2".to_string()),
            ("GET", "/cluster/status".to_string()),
            ("POST", "/cluster/join".to_string()),
            ("POST", "/cluster/leave".to_string()),
            ("POST", "/cluster/drain".to_string()),
            ("POST", format!("/cluster/removed?target={me}")),
            ("POST", "/v1/devices/d1/claim".to_string()),
        ];
        for (method, path) in &refused {
            let (status, body) = call(addr, &a, method, path, b"{}");
            assert_eq!((status, body["error"].as_str()), (403, Some("forbidden")), "{method} {path}: {body}");
        }
        let (status, body) = call(addr, &b, "POST", "/v1/devices/d1/messages", b"{}");
        assert_eq!((status, body["error"].as_str()), (401, Some("unauthorized")), "{body}");
    }
    // The refused calls changed nothing: still three live members, nobody drained or removed.
    c.wait_agreement(&[0, 1, 2], common::TIMING.settle_bound(), "three live members", |v| {
        v.members.len() == 3 && v.all_live()
    });
    let (status, _) = call(c.nodes[leader].cluster_addr(), &c.secret, "GET", "/cluster/status", b"");
    assert_eq!(status, 200, "the cluster secret still reaches everything");

    // Rotation: both secrets for a while, then the new one only — no restart.
    let addr = c.nodes[follower].cluster_addr();
    fs::write(&file, format!("{a}\n{b}\n")).unwrap();
    wait_until(RELOAD_BOUND, "the new backend secret accepted", || match publish(addr, &b, 10) {
        200 => Ok(()),
        other => Err(other),
    });
    assert_eq!(publish(addr, &a, 11), 200, "the old secret still works while the rotation overlaps");
    fs::write(&file, format!("{b}\n")).unwrap();
    wait_until(RELOAD_BOUND, "the old backend secret refused", || match publish(addr, &a, 12) {
        401 => Ok(()),
        other => Err(other),
    });
    assert_eq!(publish(addr, &b, 13), 200);

    // An unusable file (a half-written secret) keeps the previous secrets, and the log says so.
    fs::write(&file, "short\n").unwrap();
    let log = c.nodes[follower].stderr_path.clone();
    wait_until(RELOAD_BOUND, "a warning about the unusable file", || {
        // Each call lets the node look at the file again.
        let status = publish(addr, &b, 14);
        let text = tail(&log, 200);
        if status == 200 && text.contains("kept the previous backend secrets") {
            Ok(())
        } else {
            Err(status)
        }
    });
    assert!(!tail(&log, 2000).contains(&b), "a secret was written to the log");
}

#[test]
fn a_node_generates_a_private_backend_secret_by_default() {
    let (c, _) = Cluster::form(1, &[]);
    let data = &c.nodes[0].data_dir;
    assert_eq!(fs::metadata(data).unwrap().permissions().mode() & 0o777, 0o700, "the data dir is private");
    let file = data.join("backend.secret");
    assert_eq!(fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let secret = fs::read_to_string(&file).unwrap().trim().to_string();
    let addr = c.nodes[0].cluster_addr();
    assert_eq!(c.claim(0, "d1", 1, 0, 1).0, 200);
    assert_eq!(publish(addr, &secret, 1), 200);
    let (status, _) = call(addr, &secret, "GET", "/cluster/status", b"");
    assert_eq!(status, 403);
}
