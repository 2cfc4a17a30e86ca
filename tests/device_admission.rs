//! Admission (V4): a burst of handshakes against `--admit-rate 5 --admit-burst 4` admits at most
//! `burst + rate·T`; every refusal is a 429 with `Retry-After` ≥ 1 and is counted; admission runs
//! before authentication; once tokens refill, a real device connects.

mod common;

use std::time::{Duration, Instant};

use common::ws::{Dial, Outcome};
use common::{http, wait_until, Cluster, SLACK};

const RATE: f64 = 5.0;
const BURST: u64 = 4;
const FIRED: usize = 40;

#[test]
fn burst_is_bounded_by_the_token_bucket_and_refusals_are_429_with_retry_after() {
    let (c, _) = Cluster::form(1, &["--admit-rate", "5", "--admit-burst", "4"]);
    let addr = c.public_addr(0);

    // No token on purpose: admission runs before the token is parsed, so admitted ones get 401.
    let started = Instant::now();
    let mut replies = Vec::with_capacity(FIRED);
    for _ in 0..FIRED {
        let r = http::request(addr, "GET", "/ws?attempt=1", &[], None, http::REQUEST_TIMEOUT)
            .unwrap_or_else(|e| panic!("handshake request: {e:#}"));
        replies.push(r);
    }
    let elapsed = started.elapsed();
    let limited: Vec<&http::Response> = replies.iter().filter(|r| r.status == 429).collect();
    let admitted: Vec<&http::Response> = replies.iter().filter(|r| r.status != 429).collect();
    let limit = BURST as f64 + RATE * elapsed.as_secs_f64() + 1.0;
    println!(
        "[device_admission] {FIRED} requests in {elapsed:?}: {} admitted (limit {limit:.1}), {} refused with 429",
        admitted.len(),
        limited.len()
    );
    assert!(admitted.len() as f64 <= limit, "admitted {} > burst + rate·T + 1 = {limit:.1}", admitted.len());
    // The bucket starts full and nothing else used this node's public listener.
    assert!(admitted.len() as u64 >= BURST, "a full bucket admits at least the burst: {} admitted", admitted.len());
    for r in &admitted {
        assert_eq!((r.status, r.json()["error"].as_str()), (401, Some("missing_token")), "admitted: {}", r.text());
    }
    for r in &limited {
        assert_eq!(r.json()["error"], "rate_limited", "429 body: {}", r.text());
        let ra: Option<u64> = r.header("retry-after").and_then(|v| v.parse().ok());
        assert!(ra.is_some_and(|s| s >= 1), "429 without Retry-After >= 1: {:?}", r.headers);
    }
    let counted = c.metric_labeled(0, "gateway_handshakes_total", r#"result="rate_limited""#);
    assert_eq!(counted, Some(limited.len() as f64), "rate_limited handshakes counted by the node");
    let missing = c.metric_labeled(0, "gateway_handshakes_total", r#"result="missing_token""#);
    assert_eq!(missing, Some(admitted.len() as f64), "admitted ones refused by auth and counted");

    // Once a token refills (1/rate s), a real device gets in: poll until admitted, not a blind sleep.
    let token = c.token("d1", 0);
    let bound = Duration::from_secs_f64(1.0 / RATE) + SLACK;
    let waited = Instant::now();
    let mut ws = wait_until(bound, "a real device admitted after the burst", || {
        match c.dial(0, "/ws?attempt=1", &Dial::token(&token)) {
            Outcome::Open(ws) => Ok(ws),
            Outcome::Refused(r) if r.status == 429 => Err(format!("{r:?}")),
            Outcome::Refused(r) => panic!("after the burst the device was refused with {r:?}"),
        }
    });
    let hello = ws.hello();
    println!("[device_admission] real device admitted {:?} after the burst: {hello}", waited.elapsed());
    assert_eq!(hello["route_version"].as_u64(), Some(1), "{hello}");
}
