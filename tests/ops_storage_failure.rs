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

    let blob = "x".repeat(PAYLOAD);
    let (bearer, addr) = (c.bearer(), c.nodes[0].cluster_addr());
    let most = 2 * LIMIT / PAYLOAD as u64;
    let mut accepted = 0u64;
    let refused_at = loop {
        assert!(accepted < most, "{most} publishes of {PAYLOAD} bytes fit in files of {LIMIT} bytes");
        match publish_at(addr, &bearer, "big-1", &json!({ "blob": blob, "n": accepted }), None, http::REQUEST_TIMEOUT) {
            Ok((200, _)) => accepted += 1,
            // Refused, or no answer from a node already on its way out.
            failed @ (Ok((503, _)) | Err(_)) => {
                println!("[ops_storage_failure] publish {} failed: {failed:?}", accepted + 1);
                break Instant::now();
            }
            other => panic!("publish {}: {other:?}", accepted + 1),
        }
    };

    // The node tells its device to go, then exits 1 with the cause: soon, not at a lease's end.
    let bound = Duration::from_secs(4) + SLACK;
    match ws.next_event(bound) {
        Event::Text(t) => assert_eq!(t["t"], "goaway", "the device is told to go: {t}"),
        other => panic!("d1 expected a goaway, got {other:?}"),
    }
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
