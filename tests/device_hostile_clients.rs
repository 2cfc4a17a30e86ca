//! Hostile devices (issue 10, item 5): what a connected device sends cannot bloat or stall a node.
//! Clients that never read while they flood invalid frames, `sync` requests and receive a publish
//! flood cost the node a bounded number of bytes (≤ 64 MiB for 50 of them); replies never quote the
//! device; `--max-connections` refuses with 503 + Retry-After. Afterwards the node serves a
//! well-behaved device, which receives every acknowledged message.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::ws::{Dial, Event, Outcome};
use common::{wait_until, Cluster, SLACK};
use serde_json::json;

/// A WebSocket client built by hand on a blocking socket: it upgrades, then only writes.
struct Raw {
    stream: TcpStream,
}

impl Raw {
    fn open(addr: SocketAddr, token: &str, attempt: u64) -> Raw {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!(
            "GET /ws?attempt={attempt}&steer=off HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).unwrap();
        // Read the 101 head byte by byte (never past it: what follows is left unread on purpose).
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(stream.read(&mut byte).unwrap(), 1, "closed during the upgrade: {head:?}");
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
        stream.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
        Raw { stream }
    }

    /// Writes one masked text frame; false once the node stopped taking bytes (or closed).
    fn text(&mut self, payload: &[u8]) -> bool {
        let mut frame = vec![0x81u8];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        frame.extend_from_slice(&[0, 0, 0, 0]); // a zero mask: the payload goes as is
        frame.extend_from_slice(payload);
        self.stream.write_all(&frame).is_ok()
    }
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

const HOSTILE: usize = 50;
const FRAMES: usize = 300;
const FRAME_BYTES: usize = 60_000;
/// Devices among the hostile ones that also get a publish flood and ask for syncs.
const FLOODED: usize = 10;
const PUBLISHED: usize = 40;
const PAYLOAD_BYTES: usize = 20_000;
/// `--send-queue-bytes`: the flooded sessions overflow after about 13 pushes they do not read.
const QUEUE_BYTES: &str = "262144";
const RSS_BOUND: u64 = 64 << 20;

#[test]
fn non_reading_clients_under_a_flood_cost_bounded_memory_and_lose_nothing() {
    let mut c =
        Cluster::with_args(&["--admit-rate", "1000", "--admit-burst", "1000", "--send-queue-bytes", QUEUE_BYTES]);
    c.spawn("n1", common::Start::Bootstrap);
    let addr = c.public_addr(0);
    let pid = c.nodes[0].pid().unwrap();

    let tokens: Vec<String> = (0..HOSTILE).map(|k| c.token(&format!("h{k}"), 1)).collect();
    let mut raws: Vec<Raw> = tokens.iter().map(|t| Raw::open(addr, t, 1)).collect();
    let baseline = rss_bytes(pid);

    // Sample the node's RSS all along.
    let peak = Arc::new(AtomicU64::new(baseline));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_bytes(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };

    // Messages for the flooded devices, each acknowledged by the cluster (seq returned).
    let payload = json!({ "pad": "p".repeat(PAYLOAD_BYTES) });
    let publisher = {
        let bearer = c.bearer();
        let cluster_addr = c.nodes[0].cluster_addr();
        let payload = payload.clone();
        std::thread::spawn(move || {
            let mut acked = vec![0u64; FLOODED];
            for n in 0..PUBLISHED {
                for (d, last) in acked.iter_mut().enumerate() {
                    let key = format!("h{d}-{n}");
                    let device = format!("h{d}");
                    let deadline = Duration::from_secs(30);
                    match common::api::publish_at(cluster_addr, &bearer, &device, &payload, Some(&key), deadline) {
                        Ok((200, v)) => *last = v["seq"].as_u64().unwrap(),
                        other => panic!("publish {device} #{n}: {other:?}"),
                    }
                }
            }
            acked
        })
    };

    // Every hostile client floods invalid JSON (and the flooded ones sync requests) without reading.
    let junk = vec![b'{'; FRAME_BYTES];
    let sync = br#"{"t":"sync","after":0}"#;
    std::thread::scope(|s| {
        for (k, raw) in raws.iter_mut().enumerate() {
            let junk = &junk;
            s.spawn(move || {
                for _ in 0..FRAMES {
                    if !raw.text(junk) || (k < FLOODED && !raw.text(sync)) {
                        break; // the node stopped reading this client
                    }
                }
            });
        }
    });
    let acked = publisher.join().unwrap();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let growth = peak.load(Ordering::Relaxed).saturating_sub(baseline);
    println!(
        "hostile: {HOSTILE} non-reading clients x {FRAMES} x {FRAME_BYTES} B invalid frames, {FLOODED} of them also \
         {PUBLISHED} x {PAYLOAD_BYTES} B published + sync floods: RSS {} MiB -> peak +{:.1} MiB",
        baseline >> 20,
        growth as f64 / (1 << 20) as f64
    );
    assert!(growth <= RSS_BOUND, "RSS grew by {growth} bytes (bound {RSS_BOUND})");
    assert!(c.nodes[0].is_running(), "the node died");
    drop(raws);

    // A well-behaved device on a flooded id gets every acknowledged message.
    let mut ws = c.dial(0, "/ws?attempt=2", &Dial::token(&c.token("h0", 1))).open("h0 after the flood");
    ws.hello();
    ws.send_json(&json!({"t": "sync", "after": 0})).unwrap();
    let mut seen = Vec::new();
    let bound = Duration::from_secs(30);
    let started = Instant::now();
    while seen.last() != Some(&acked[0]) {
        assert!(started.elapsed() < bound, "got {} of {} messages", seen.len(), acked[0]);
        match ws.next_event(bound) {
            Event::Text(v) if v["t"] == "msg" => seen.push(v["seq"].as_u64().unwrap()),
            Event::Text(_) | Event::Ping | Event::Pong => {}
            other => panic!("h0: {other:?} after {} messages", seen.len()),
        }
    }
    assert_eq!(seen, (1..=acked[0]).collect::<Vec<_>>(), "acknowledged messages lost or reordered");
}

#[test]
fn replies_never_quote_the_device() {
    let mut c = Cluster::new();
    c.spawn("n1", common::Start::Bootstrap);
    let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token("q1", 1))).open("q1");
    ws.hello();
    let marker = "QUOTED-MARKER";
    for frame in [
        format!(r#"{{"t":"{marker}"}}"#),
        format!(r#"{{"t":"sync","after":"{marker}"}}"#),
        format!(r#"{{"t":"ack","seq":1,"{marker}":{}}}"#, "9".repeat(2000)),
        format!("{marker} is not json"),
        format!(r#"{{"t":"{}"}}"#, marker.repeat(1000)),
    ] {
        ws.send_text(&frame).unwrap();
        let reply = ws.next_text(Duration::from_secs(5), "the error reply");
        let text = reply.to_string();
        assert_eq!(reply["t"], "error", "{text}");
        assert!(!text.contains(marker) && text.len() <= 128, "the reply quotes the device: {text}");
    }
}

#[test]
fn max_connections_refuses_with_503_and_retry_after() {
    let mut c = Cluster::with_args(&["--max-connections", "2"]);
    c.spawn("n1", common::Start::Bootstrap);
    let mut a = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token("m1", 1))).open("m1");
    let _b = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token("m2", 1))).open("m2");
    let r = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token("m3", 1))).refused("m3 over the cap");
    assert_eq!((r.status, r.error()), (503, "at_capacity"), "{r:?}");
    assert!(r.retry_after().is_some(), "{r:?}");
    assert_eq!(c.metric_labeled(0, "gateway_handshakes_total", r#"result="at_capacity""#), Some(1.0));
    a.close(1000).unwrap();
    wait_until(SLACK, "room for m3 once m1 left", || {
        match c.dial(0, "/ws?attempt=2", &Dial::token(&c.token("m3", 1))) {
            Outcome::Open(_) => Ok(()),
            Outcome::Refused(r) => Err(r.status),
        }
    });
}
