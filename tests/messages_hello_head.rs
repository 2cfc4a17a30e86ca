//! `hello`'s `stream_head`, wherever the device lands. A claim the node applies itself (a one-node
//! cluster, the leader) answers the head as that apply left it; after a claim forwarded to the
//! leader the node reads it back. `gateway_handshake_stream_heads_total{result}` counts which.

mod common;

use common::status::leader_name;
use common::ws::Dial;
use common::{Cluster, Start, TIMING};
use serde_json::json;

const HEADS: &str = "gateway_handshake_stream_heads_total";

/// (claim, read) heads answered by node `i`, and its accepted handshakes.
fn sources(c: &Cluster, i: usize) -> ([f64; 2], f64) {
    let n = |result: &str| c.metric_labeled(i, HEADS, &format!("result=\"{result}\"")).unwrap_or(0.0);
    let accepted = c.metric_labeled(i, "gateway_handshakes_total", "result=\"accepted\"").unwrap_or(0.0);
    ([n("claim"), n("read")], accepted)
}

#[test]
fn one_node_announces_the_head_its_claim_answered_without_a_read() {
    let mut c = Cluster::new();
    c.spawn("n1", Start::Bootstrap);
    let token = c.token("h1", 1);
    let mut first = c.dial(0, "/ws?attempt=1", &Dial::token(&token)).open("first connection");
    assert_eq!(first.hello()["stream_head"], 0, "a device never claimed before has no stream");
    drop(first);
    for i in 1..=3 {
        assert_eq!(c.publish_ok(&[0], "h1", &json!({ "i": i }), &format!("k{i}")), i);
    }
    let mut second = c.dial(0, "/ws?attempt=2", &Dial::token(&token)).open("second connection");
    assert_eq!(second.hello()["stream_head"], 3);
    let (heads, accepted) = sources(&c, 0);
    assert_eq!(accepted, 2.0);
    assert_eq!(heads, [2.0, 0.0], "one node reads no head back: (claim, read)");
}

#[test]
fn hello_announces_the_same_head_on_the_leader_and_on_a_follower() {
    let (c, _) = Cluster::form(3, &[]);
    let name = leader_name(&c.status_json(0)).expect("a leader");
    let leader = name.trim_start_matches('n').parse::<usize>().expect("a node name n<k>") - 1;
    let follower = (leader + 1) % 3;
    let d = "h3";
    let token = c.token(d, 1);
    let dial = |i: usize, attempt: u64, what: &str| {
        c.dial(i, &format!("/ws?attempt={attempt}&steer=off"), &Dial::token(&token)).open(what)
    };
    assert_eq!(dial(follower, 1, "first, on a follower").hello()["stream_head"], 0);
    for i in 1..=3 {
        assert_eq!(c.publish_ok(&[leader], d, &json!({ "i": i }), &format!("k{i}")), i);
    }
    // The follower holds the messages before the device comes back (its read is of its own store).
    c.wait_applied(follower, c.leader_commit_index(leader), TIMING.settle_bound());
    assert_eq!(dial(follower, 2, "second, on a follower").hello()["stream_head"], 3);
    assert_eq!(c.publish_ok(&[leader], d, &json!({ "i": 4 }), "k4"), 4);
    assert_eq!(dial(leader, 3, "third, on the leader").hello()["stream_head"], 4);
    let still = leader_name(&c.status_json(follower)).as_deref() == Some(name.as_str());
    if still {
        assert_eq!(sources(&c, leader).0, [1.0, 0.0], "the leader's own claim answered its head");
        assert_eq!(sources(&c, follower).0, [0.0, 2.0], "a follower reads the head back");
    } else {
        println!("[hello_head] the leadership moved during the test: the leader's source is not checked");
    }
    for (i, role) in [(leader, "leader"), (follower, "follower")] {
        let (heads, accepted) = sources(&c, i);
        println!("[hello_head] {role} n{}: (claim, read) = {heads:?} for {accepted} accepted", i + 1);
        assert_eq!(heads.iter().sum::<f64>(), accepted, "{role}: one head per accepted handshake");
    }
}
