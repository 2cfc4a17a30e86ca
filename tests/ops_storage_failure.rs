//! A node whose store fails to write (a full disk, a file past its size limit, an I/O error)
//! stops its Raft: it can no longer commit or apply. It must not stay up and ready while its
//! devices wait on a node that will never deliver to them again and its peers keep its lease
//! until it lapses. It tells its devices to go (goaway), says why, and exits 1 at once, for a
//! supervisor to restart it and its peers to find its port refusing. Started again with room, it
//! replays its log: nothing it acknowledged is lost.
//!
//! The failure is real, from the kernel: the node runs with `RLIMIT_FSIZE` and `SIGXFSZ` ignored,
//! so the write that would grow a file past the limit fails with `EFBIG`.

mod common;

use std::time::{Duration, Instant};

use common::api::publish_at;
use common::ws::{Dial, Event};
use common::{http, Cluster, SLACK};
use serde_json::json;

/// The largest file the node may write: room for a few dozen publishes of [`PAYLOAD`] bytes.
const LIMIT: u64 = 3 << 20;
const PAYLOAD: usize = 60_000;

#[test]
fn a_node_whose_store_cannot_write_tells_its_devices_and_exits() {
    let mut c = Cluster::new();
    c.file_size_limit = Some(LIMIT);
    let (mut c, _) = c.form_nodes(1);
    let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token("d1", 0))).open("d1");
    ws.hello();
    // Publishes go to another device, claimed once (a stream needs a claim) and not connected: d1
    // has nothing to read but what the node tells it when it stops.
    c.claim_accepted(0, "big-1", 1, 0, 1, SLACK);

    let (accepted, refused_at) = publish_until_refused(&c, "big-1");

    // The node tells its device to go, then exits 1 with the cause: soon, not at a lease's end.
    let bound = Duration::from_secs(4) + SLACK;
    expect_goaway(&mut ws, "d1", bound);
    let status = c.wait_exit(0, bound);
    println!("[ops_storage_failure] exited {:?} after the refused publish: {status:?}", refused_at.elapsed());
    assert_eq!(status.code(), Some(1), "a node whose Raft stopped exits 1");
    let log = std::fs::read_to_string(&c.nodes[0].stderr_path).unwrap_or_default();
    let tail = || common::tail(&c.nodes[0].stderr_path, 15);
    assert!(
        log.contains("Raft stopped: this node can no longer commit or apply"),
        "it says what happened:\n{}",
        tail()
    );
    assert!(log.contains("File too large"), "and why:\n{}", tail());
    assert!(log.contains("gateway: raft: stopped on a fatal error"), "its last line:\n{}", tail());

    // With room again it starts from its data dir, and every acknowledged publish is there.
    c.file_size_limit = None;
    c.start(0);
    c.wait_ready(0);
    let mut big = c.dial(0, "/ws?attempt=2", &Dial::token(&c.token("big-1", 0))).open("big-1");
    let head = big.hello()["stream_head"].as_u64().expect("hello carries stream_head");
    assert!(head >= accepted, "{accepted} publishes acknowledged, the stream's head at {head}");
}

/// `device`'s next frame, within `bound`, is a `goaway`.
fn expect_goaway(ws: &mut common::ws::Ws, device: &str, bound: Duration) {
    match ws.next_event(bound) {
        Event::Text(t) => assert_eq!(t["t"], "goaway", "{device} is told to go: {t}"),
        other => panic!("{device} expected a goaway, got {other:?}"),
    }
}

/// Publishes of [`PAYLOAD`] bytes to `device` until one fails; how many were acknowledged, and when
/// the first failed.
fn publish_until_refused(c: &Cluster, device: &str) -> (u64, Instant) {
    let blob = "x".repeat(PAYLOAD);
    let (bearer, addr) = (c.bearer(), c.nodes[0].cluster_addr());
    let most = 2 * LIMIT / PAYLOAD as u64;
    let mut accepted = 0u64;
    loop {
        assert!(accepted < most, "{most} publishes of {PAYLOAD} bytes fit in files of {LIMIT} bytes");
        match publish_at(addr, &bearer, device, &json!({ "blob": blob, "n": accepted }), None, http::REQUEST_TIMEOUT) {
            Ok((200, _)) => accepted += 1,
            // Refused, or no answer from a node already on its way out.
            failed @ (Ok((503, _)) | Err(_)) => {
                println!("[ops_storage_failure] publish {} failed: {failed:?}", accepted + 1);
                return (accepted, Instant::now());
            }
            other => panic!("publish {}: {other:?}", accepted + 1),
        }
    }
}

/// Seconds between two devices' goaways in the drain below: far longer than the bound on the
/// exit, so a drain that went on after the failure is told apart.
const DRAIN_PACE_SECS: u64 = 20;

#[test]
fn a_store_failure_during_a_drain_ends_the_drain_at_once() {
    let rate = format!("{}", 1.0 / DRAIN_PACE_SECS as f64);
    let timeout = (2 * DRAIN_PACE_SECS * 1000).to_string();
    let mut c = Cluster::with_args(&["--drain-rate", &rate, "--drain-timeout-ms", &timeout]);
    c.file_size_limit = Some(LIMIT);
    let (mut c, _) = c.form_nodes(1);
    let mut devices: Vec<_> = ["d1", "d2"]
        .iter()
        .map(|d| {
            let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token(d, 0))).open(d);
            ws.hello();
            ws
        })
        .collect();
    c.claim_accepted(0, "big-1", 1, 0, 1, SLACK);

    // A drain paced at one device every DRAIN_PACE_SECS: the first is told to go at once, the
    // second only that long after.
    c.sigterm(0);
    common::wait_until(SLACK, "n1 draining", || match c.get(0, "/readyz") {
        Ok(r) if r.json()["mode"] == "draining" => Ok(()),
        other => Err(other.map(|r| r.text())),
    });
    let (_, refused_at) = publish_until_refused(&c, "big-1");

    // Both devices are told to go and the node exits 1, without waiting for the drain's pace.
    let bound = Duration::from_secs(4) + SLACK;
    assert!(bound < Duration::from_secs(DRAIN_PACE_SECS), "the bound tells the drain's pace apart");
    for (ws, d) in devices.iter_mut().zip(["d1", "d2"]) {
        expect_goaway(ws, d, bound);
    }
    let status = c.wait_exit(0, bound);
    println!("[ops_storage_failure] draining, exited {:?} after the refused publish: {status:?}", refused_at.elapsed());
    assert_eq!(status.code(), Some(1), "a node whose Raft stopped during its drain exits 1");
    let log = std::fs::read_to_string(&c.nodes[0].stderr_path).unwrap_or_default();
    assert!(
        log.contains("Raft stopped: this node can no longer commit or apply"),
        "{}",
        common::tail(&c.nodes[0].stderr_path, 15)
    );
}
