//! Log entries are bounded in bytes (issue 10): with `--max-payload-bytes` at its maximum (1 MiB),
//! many concurrent publishes of that size through a follower — more than the 64 MiB RPC body limit in all —
//! commit, every node keeps up, and nobody fences. Before, one batch (and the follower's forward
//! of it, and the leader's append of it) outgrew the limit: 413, resent forever, nothing committed.

mod common;

use std::time::{Duration, Instant};

use common::api::publish_at;
use common::{Cluster, TIMING};
use serde_json::json;

const PUBLISHES: usize = 80;
/// The configured maximum (`gateway::config::MAX_PAYLOAD_LIMIT`).
const MAX_PAYLOAD: usize = 1 << 20;

#[test]
fn megabyte_publishes_past_the_rpc_limit_all_commit_through_a_follower() {
    let max = MAX_PAYLOAD.to_string();
    let (c, view) = Cluster::form(3, &["--max-payload-bytes", &max]);
    let follower = (0..3).find(|&i| Some(c.node_id(i)) != view.leader).unwrap();
    let (status, _) = c.claim(follower, "big", 1, 0, 1);
    assert_eq!(status, 200);
    let (addr, bearer) = (c.nodes[follower].cluster_addr(), c.bearer());
    // {"pad":"…"} is 10 bytes around the string: the body is exactly at the limit.
    let body = json!({ "pad": "x".repeat(MAX_PAYLOAD - 10) });
    assert_eq!(serde_json::to_vec(&body).unwrap().len(), MAX_PAYLOAD);
    const { assert!(PUBLISHES * MAX_PAYLOAD > 64 << 20, "the scenario must exceed one RPC body") };
    let started = Instant::now();
    // Like a client would: a 503 (the write may or may not have committed) is retried with the
    // same Idempotency-Key until a deadline, so each message lands exactly once either way.
    let deadline = started + Duration::from_secs(90);
    let answers: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..PUBLISHES)
            .map(|k| {
                let (bearer, body) = (&bearer, &body);
                s.spawn(move || {
                    let key = format!("big-{k}");
                    loop {
                        let answer = publish_at(addr, bearer, "big", body, Some(&key), Duration::from_secs(60));
                        if !matches!(answer, Ok((503, _))) || Instant::now() > deadline {
                            return answer;
                        }
                        std::thread::sleep(Duration::from_millis(200));
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let failed: Vec<_> = answers.iter().filter(|a| !matches!(a, Ok((200, _)))).collect();
    println!("big entries: {PUBLISHES} x {MAX_PAYLOAD} B through a follower in {:?}", started.elapsed());
    assert!(failed.is_empty(), "{} publishes failed, e.g. {:?}", failed.len(), failed.first());
    let mut seqs: Vec<u64> = answers.iter().map(|a| a.as_ref().unwrap().1["seq"].as_u64().unwrap()).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=PUBLISHES as u64).collect::<Vec<_>>());
    // Every node applies it all, and stays live (no fencing while the big entries replicated).
    let commit = c.leader_commit_index(follower);
    for i in 0..3 {
        c.wait_applied(i, commit, TIMING.settle_bound());
    }
    c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), "all live", |v| v.all_live());
    let fences: f64 = (0..3).filter_map(|i| c.metric(i, "gateway_fence_events_total")).sum();
    assert_eq!(fences, 0.0, "a node fenced itself");
}
