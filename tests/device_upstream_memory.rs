//! Memory stays bounded when the backend stops answering and many devices keep sending (issue 13):
//! 100 devices (GATEWAY_TEST_UP_DEVICES=1000 for the full fleet: too heavy for the suite
//! on two cores) each send rounds of ups with 2 KB payloads to a backend that never answers. The
//! node's in-flight ups never exceed --upstream-max-in-flight (sampled from its gauge), every up
//! is answered (up_nack overloaded at once beyond the bounds, or at its deadline), and the node's
//! RSS grows less than a bound derived from the limits: in-flight ups × (payload + a per-up
//! allowance for its task, request and upstream connection) + allocator slack.

mod common;

use std::time::{Duration, Instant};

use common::raw::rss_bytes;
use common::upstream::{Behave, Upstream};
use common::ws::{Dial, Ws};
use common::{wait_until, Cluster, SLACK};
use serde_json::json;

const MAX_IN_FLIGHT: u64 = 200;
const PER_DEVICE: u64 = 4;
const PAYLOAD_BYTES: usize = 2048;
const DEADLINE_MS: u64 = 2000;
const ROUNDS: u64 = 5;
/// Per in-flight up beyond its payload: the task, the request, an upstream connection and its
/// buffers (hyper's default read buffer is up to ~400 KB but starts at 8 KB).
const PER_UP_ALLOWANCE: u64 = 64 << 10;
/// Allocator and runtime slack (arenas, the metrics registry's new series).
const SLACK_BYTES: u64 = 24 << 20;

#[test]
fn a_silent_backend_and_many_senders_keep_memory_bounded() {
    let devices: usize = std::env::var("GATEWAY_TEST_UP_DEVICES").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let backend = Upstream::start(Behave::Hang);
    let (mif, per, dl) = (MAX_IN_FLIGHT.to_string(), PER_DEVICE.to_string(), DEADLINE_MS.to_string());
    let url = backend.url();
    let args = [
        "--upstream-url",
        url.as_str(),
        "--upstream-max-in-flight",
        &mif,
        "--upstream-max-in-flight-per-device",
        &per,
        "--upstream-deadline-ms",
        &dl,
        "--upstream-try-timeout-ms",
        "1000",
        "--upstream-breaker-failures",
        "1000000",
        "--admit-rate",
        "1000",
        "--admit-burst",
        "2000",
    ];
    let (c, _) = Cluster::form(1, &args);
    let pid = c.nodes[0].pid().expect("running");
    let secret = c.device_secret();
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600;
    let mut fleet: Vec<Ws> = (0..devices)
        .map(|k| {
            let device = format!("m{k}");
            let token = gateway::token::mint(&secret, &device, 0, exp).unwrap();
            let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&token)).open(&device);
            ws.hello();
            ws
        })
        .collect();
    let in_flight = || c.metric(0, "gateway_ups_in_flight").unwrap_or(-1.0) as i64;
    wait_until(SLACK, "a settled node", || if in_flight() == 0 { Ok(()) } else { Err(in_flight()) });
    let baseline = rss_bytes(pid);
    let blob = "x".repeat(PAYLOAD_BYTES);
    let (mut peak_rss, mut peak_in_flight, mut answered, mut overloaded) = (baseline, 0i64, 0u64, 0u64);
    let started = Instant::now();
    for round in 0..ROUNDS {
        // Each device sends twice its bound: half of it is refused at once, and the node's bound
        // refuses most of the rest.
        let sending = Instant::now();
        let overloaded_before = overloaded;
        for ws in &fleet {
            for k in 0..2 * PER_DEVICE {
                ws.send_json(&json!({"t": "up", "id": round * 100 + k, "payload": {"blob": blob}})).expect("send");
            }
        }
        let sent_in = sending.elapsed();
        peak_in_flight = peak_in_flight.max(in_flight());
        peak_rss = peak_rss.max(rss_bytes(pid));
        let bound = Duration::from_millis(DEADLINE_MS) + SLACK;
        for ws in fleet.iter_mut() {
            let deadline = Instant::now() + bound;
            let mut got = 0;
            while got < 2 * PER_DEVICE {
                let v = ws.next_text(deadline.saturating_duration_since(Instant::now()), "up answers");
                if v["t"] == "up_nack" || v["t"] == "up_ack" {
                    got += 1;
                    overloaded += u64::from(v["reason"] == "overloaded");
                }
                peak_in_flight = peak_in_flight.max(if got % 4 == 0 { in_flight() } else { 0 });
            }
            answered += got;
        }
        peak_rss = peak_rss.max(rss_bytes(pid));
        // Sent faster than any up could end (the backend never answers): at most the node's bound
        // was admitted this round, the rest refused at once.
        let admitted = 2 * PER_DEVICE * devices as u64 - (overloaded - overloaded_before);
        if sent_in < Duration::from_millis(1000) {
            assert!(admitted <= MAX_IN_FLIGHT, "round {round}: {admitted} admitted, bound {MAX_IN_FLIGHT}");
        }
    }
    let grown = peak_rss.saturating_sub(baseline);
    let limit = MAX_IN_FLIGHT * (PAYLOAD_BYTES as u64 + PER_UP_ALLOWANCE) + SLACK_BYTES;
    println!(
        "[upstream] {devices} devices, {answered} ups answered ({overloaded} overloaded) in {:?} against a silent backend: \
         peak in flight {peak_in_flight} (bound {MAX_IN_FLIGHT}), RSS {} MiB -> peak {} MiB (+{} KiB, bound +{} KiB)",
        started.elapsed(),
        baseline >> 20,
        peak_rss >> 20,
        grown >> 10,
        limit >> 10
    );
    assert_eq!(answered, ROUNDS * devices as u64 * 2 * PER_DEVICE, "every up answered");
    assert!(peak_in_flight <= MAX_IN_FLIGHT as i64, "in flight {peak_in_flight} > {MAX_IN_FLIGHT}");
    assert!(grown <= limit, "RSS grew {grown} bytes, more than {limit}");
    assert!(backend.count() as u64 <= 3 * MAX_IN_FLIGHT * ROUNDS, "requests to the backend stay bounded too");
}
