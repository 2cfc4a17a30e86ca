//! Hostile devices (issue 10, item 5): what a connected device sends cannot bloat or stall a node.
//! Clients that never read while they flood invalid frames, `sync` requests and receive a publish
//! flood cost the node a bounded number of bytes (≤ 64 MiB for 50 of them); replies never quote the
//! device; `--max-connections` refuses with 503 + Retry-After. Afterwards the node serves a
//! well-behaved device, which receives every acknowledged message.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::raw::{rss_bytes, Raw};
use common::ws::{Dial, Event, Outcome};
use common::{wait_until, Cluster, SLACK};
use serde_json::json;

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

fn wait_connections(c: &Cluster, n: f64, bound: Duration, what: &str) {
    wait_until(bound, what, || match c.metric(0, "gateway_connections") {
        Some(v) if v == n => Ok(()),
        other => Err(other),
    });
}

/// Publishes `count` messages of 60 KB to `device` on node 0, four at a time.
fn publish_backlog(c: &Cluster, device: &str, count: usize) {
    let payload = json!({ "pad": "b".repeat(60_000) });
    std::thread::scope(|s| {
        for part in 0..4 {
            let payload = &payload;
            s.spawn(move || {
                for n in (part..count).step_by(4) {
                    assert_eq!(c.publish(0, device, payload, Some(&format!("{device}-{n}"))).0, 200);
                }
            });
        }
    });
}

/// Messages published to the kicked device: more than the loopback socket buffers hold, so the
/// node's write of its sync blocks.
const BACKLOG: usize = 300;

#[test]
fn a_kick_interrupts_a_write_blocked_on_a_device_that_does_not_read() {
    let mut c = Cluster::new();
    c.spawn("n1", common::Start::Bootstrap);
    let addr = c.public_addr(0);
    let token = c.token("k1", 1);
    // The device connects once (so it has a stream), and is away while its backlog is published.
    drop(c.dial(0, "/ws?attempt=1", &Dial::token(&token)).open("k1"));
    wait_connections(&c, 0.0, SLACK, "k1 gone");
    publish_backlog(&c, "k1", BACKLOG);
    let mut stalled = Raw::open(addr, &token, 2);
    // The node writes the whole backlog into a socket nobody reads: the write blocks.
    assert!(stalled.text(br#"{"t":"sync","after":0}"#));
    std::thread::sleep(Duration::from_millis(500)); // let the pages fill the socket buffers
    let kicked = Instant::now();
    let mut ws = c.dial(0, "/ws?attempt=3", &Dial::token(&token)).open("the takeover");
    ws.hello();
    // Default idle_ms is 60 s: without the kick interrupting it, the blocked write would hold the
    // old session (and its connection) that long.
    let bound = Duration::from_millis(250) + SLACK;
    wait_connections(&c, 1.0, bound, "the stalled session gone");
    assert_eq!(c.metric(0, "gateway_kicks_total"), Some(1.0), "ended as the kick it was (4001)");
    println!("hostile: a write blocked on a non-reading device ended {:?} after the takeover", kicked.elapsed());
    drop(stalled);
}

/// Retained messages behind the paged sync below: ~18 MB.
const SYNC_BACKLOG: usize = 300;
/// What one stalled sync may cost: a page (256 KiB) being written, the store's read of it, and
/// what the allocator keeps around; far below the backlog.
const SYNC_RSS_BOUND: u64 = 16 << 20;

#[test]
fn a_sync_is_sent_a_page_at_a_time() {
    let mut c = Cluster::new();
    c.spawn("n1", common::Start::Bootstrap);
    let (addr, pid) = (c.public_addr(0), c.nodes[0].pid().unwrap());
    let token = c.token("p1", 1);
    drop(c.dial(0, "/ws?attempt=1", &Dial::token(&token)).open("p1"));
    wait_connections(&c, 0.0, SLACK, "p1 gone");
    publish_backlog(&c, "p1", SYNC_BACKLOG);
    let baseline = rss_bytes(pid);
    // A device that asks for its whole backlog, again and again, and never reads.
    let mut stalled = Raw::open(addr, &token, 2);
    for _ in 0..20 {
        assert!(stalled.text(br#"{"t":"sync","after":0}"#));
    }
    let mut peak = baseline;
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(2) {
        peak = peak.max(rss_bytes(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    let growth = peak.saturating_sub(baseline);
    println!(
        "hostile: a stalled sync of {SYNC_BACKLOG} x 60 KB grew the node by {:.1} MiB",
        growth as f64 / (1 << 20) as f64
    );
    assert!(growth <= SYNC_RSS_BOUND, "a sync buffered {growth} bytes (bound {SYNC_RSS_BOUND})");
    drop(stalled);
}
