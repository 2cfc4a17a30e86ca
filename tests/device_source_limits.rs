//! Limits before the node's admission (issue 12, item 2), in fixed memory: one source address
//! flooding handshakes gets 429 `source_rate_limited` past its own budget while another source is
//! still admitted, and a device that reconnects more than `--device-reconnects` times per window
//! gets 429 `flapping` with a Retry-After until its next reconnect.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::ws::Dial;
use common::{Cluster, Start};

/// A handshake from `source` (a loopback address of this machine): the status and Retry-After.
fn handshake_from(source: &str, addr: SocketAddr, token: &str, attempt: u64) -> (u16, Option<u64>, String) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stream = rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{source}:0").parse().unwrap()).unwrap();
        s.connect(addr).await.unwrap().into_std().unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "GET /ws?attempt={attempt}&steer=off HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    (&stream).write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && (&stream).read(&mut b).unwrap_or(0) == 1 {
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
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
