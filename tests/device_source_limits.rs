//! Limits before the node's admission (issue 12, item 2), in fixed memory: one source address
//! flooding handshakes gets 429 `source_rate_limited` past its own budget while another source is
//! still admitted, and a device that reconnects more than `--device-reconnects` times per window
//! gets 429 `flapping` with a Retry-After until its next reconnect.

mod common;

use std::net::SocketAddr;
use std::time::Instant;

use common::raw;
use common::ws::Dial;
use common::{Cluster, Start};

/// A handshake from `source` (a loopback address of this machine): the status and Retry-After.
fn handshake_from(source: &str, addr: SocketAddr, token: &str, attempt: u64) -> (u16, Option<u64>, String) {
    let stream = raw::connect(addr, Some(source), None);
    let (status, head) = raw::upgrade(&stream, addr, token, attempt);
    let retry = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after:").map(|v| v.trim().to_string()))
        .and_then(|v| v.parse().ok());
    (status, retry, head)
}

#[test]
fn a_flooding_source_is_limited_and_starves_no_other_source() {
    let args = ["--source-rate", "2", "--source-burst", "5", "--admit-rate", "1000", "--admit-burst", "1000"];
    let mut c = Cluster::with_args(&args);
    c.spawn("n1", Start::Bootstrap);
    let addr = c.public_addr(0);
    let started = Instant::now();
    let mut admitted = 0;
    let mut limited = 0;
    for k in 0..20 {
        let (status, retry, head) = handshake_from("127.0.0.2", addr, &c.token(&format!("flood-{k}"), 1), 1);
        match status {
            101 => admitted += 1,
            429 => {
                assert!(head.contains("source_rate_limited") || retry.is_some(), "{head}");
                assert!(retry.is_some_and(|s| s >= 1), "{head}");
                limited += 1;
            }
            other => panic!("flood-{k}: {other} {head}"),
        }
    }
    let took = started.elapsed().as_secs_f64();
    println!("source limits: 127.0.0.2 admitted {admitted} of 20 in {took:.2}s, {limited} refused");
    assert!(admitted as f64 <= 5.0 + 2.0 * took + 1.0, "admitted {admitted} in {took:.2}s");
    assert!(limited > 0);
    // Another source is not starved by the flood.
    for k in 0..5 {
        let (status, _, head) = handshake_from("127.0.0.3", addr, &c.token(&format!("calm-{k}"), 1), 1);
        assert_eq!(status, 101, "calm-{k}: {head}");
    }
    assert!(c.metric_labeled(0, "gateway_handshakes_total", r#"result="source_rate_limited""#) >= Some(1.0));
}

#[test]
fn a_flapping_device_waits_for_its_next_reconnect() {
    let args = ["--device-reconnects", "3", "--device-reconnect-window-ms", "60000"];
    let mut c = Cluster::with_args(&args);
    c.spawn("n1", Start::Bootstrap);
    let token = c.token("flappy", 1);
    for attempt in 1..=3 {
        let mut ws = c.dial(0, &format!("/ws?attempt={attempt}"), &Dial::token(&token)).open("within the limit");
        ws.hello();
    }
    let r = c.dial(0, "/ws?attempt=4", &Dial::token(&token)).refused("the fourth reconnect in a minute");
    assert_eq!((r.status, r.error()), (429, "flapping"), "{r:?}");
    // One reconnect per 20 s: the next is ~20 s away.
    assert!(r.retry_after().is_some_and(|s| (15..=20).contains(&s)), "{r:?}");
    // Other devices are not affected.
    let mut other = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token("steady", 1))).open("another device");
    other.hello();
}
