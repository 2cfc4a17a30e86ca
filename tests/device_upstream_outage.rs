//! Device → backend delivery when the backend is down, failing, hanging or ejected (issue 13):
//! - down (connection refused) and failing (503) with the breaker out of the way: every up is
//!   nacked within its deadline, and the backend sees at most 1.1 × the intents plus the retry
//!   budget's floor (min retries/s × the windows the run spans), though each up may try 3 times;
//! - the breaker opens after N consecutive failures (ups then nacked at once, with retry_after_ms,
//!   reaching no backend), half-opens after breaker_open_ms, and its probe closes it; of two
//!   backends the failing one is ejected after 3 failures while the other takes every up;
//! - a hanging backend never holds an up past its deadline: each nack arrives within
//!   deadline + slack, the slack derived from the knobs (one scheduling quantum per try) plus the
//!   loaded machine's allowance.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::upstream::{Behave, Upstream};
use common::ws::{Dial, Ws};
use common::{free_port, wait_until, Cluster, SLACK};
use serde_json::{json, Value};

const DEADLINE_MS: u64 = 1500;
const TRY_MS: u64 = 600;
const WINDOW_MS: u64 = 10_000;
const MIN_PER_S: f64 = 0.2;

fn up(ws: &Ws, id: u64) {
    ws.send_json(&json!({"t": "up", "id": id, "payload": {"i": id}})).expect("send up");
}

/// Up answers by id, with when each arrived, until `n` arrived.
fn answers(ws: &mut Ws, n: usize, bound: Duration) -> BTreeMap<u64, (Instant, Value)> {
    let deadline = Instant::now() + bound;
    let mut got = BTreeMap::new();
    while got.len() < n {
        let v = ws.next_text(deadline.saturating_duration_since(Instant::now()), "up answers");
        if v["t"] == "up_ack" || v["t"] == "up_nack" {
            got.insert(v["id"].as_u64().unwrap(), (Instant::now(), v));
        }
    }
    got
}

fn node(url: &str, extra: &[&str]) -> (Cluster, Vec<Ws>) {
    let (d, t) = (DEADLINE_MS.to_string(), TRY_MS.to_string());
    let mut args = vec![
        "--upstream-url",
        url,
        "--upstream-deadline-ms",
        &d,
        "--upstream-try-timeout-ms",
        &t,
        "--upstream-max-tries",
        "3",
        "--upstream-retry-window-ms",
        "10000",
    ];
    args.extend_from_slice(extra);
    let (c, _) = Cluster::form(1, &args);
    let devices = (0..4)
        .map(|k| {
            let device = format!("d{k}");
            let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token(&device, 0))).open(&device);
            ws.hello();
            ws
        })
        .collect();
    (c, devices)
}

/// Sends `per_device` ups from each device in waves of 4 (the default per-device bound is 8) and
/// checks each answer: a nack, within the deadline plus slack of its send. Returns the intents.
fn outage(devices: &mut [Ws], per_device: u64, what: &str) -> u64 {
    let bound = Duration::from_millis(DEADLINE_MS) + SLACK;
    let mut worst = Duration::ZERO;
    for wave in 0..per_device / 4 {
        let sent = Instant::now();
        for ws in devices.iter() {
            for k in 0..4 {
                up(ws, wave * 4 + k);
            }
        }
        for ws in devices.iter_mut() {
            for (id, (at, v)) in answers(ws, 4, bound) {
                assert_eq!(v["t"], "up_nack", "{what}: up {id} answered {v}");
                assert!(v["retry_after_ms"].is_u64(), "{what}: an outage is retryable: {v}");
                worst = worst.max(at - sent);
            }
        }
    }
    println!("[upstream] {what}: slowest nack {worst:?} after its send (deadline {DEADLINE_MS} ms)");
    per_device / 4 * 4 * devices.len() as u64
}

/// attempts <= 1.1 × intents + the budget's floor over the windows `elapsed` spans.
fn assert_budget(attempts: u64, intents: u64, elapsed: Duration, what: &str) {
    let windows = (elapsed.as_millis() as u64 / WINDOW_MS + 2) as f64; // a run overlaps this many windows
    let floor = MIN_PER_S * WINDOW_MS as f64 / 1000.0 * windows;
    let bound = 1.1 * intents as f64 + floor;
    println!(
        "[upstream] {what}: {attempts} attempts for {intents} intents (ratio {:.3}; bound {bound:.0} = 1.1 x intents + floor {floor:.0}) in {elapsed:?}",
        attempts as f64 / intents as f64
    );
    assert!(attempts as f64 <= bound, "{what}: {attempts} attempts for {intents} intents exceed {bound}");
}

#[test]
fn an_outage_costs_at_most_a_tenth_more_attempts_and_answers_within_the_deadline() {
    // Connection refused: nothing listens on the port.
    let dead = format!("http://127.0.0.1:{}/ingest", free_port());
    let floor = MIN_PER_S.to_string();
    let budget = ["--upstream-breaker-failures", "1000000", "--upstream-retry-min-per-s", &floor];
    let (c, mut devices) = node(&dead, &budget);
    let started = Instant::now();
    let intents = outage(&mut devices, 48, "connection refused");
    let attempts = wait_until(SLACK, "attempt counters", || c.metric(0, "gateway_upstream_attempts_total").ok_or(()));
    let refused = c.metric_labeled(0, "gateway_upstream_attempts_total", "result=\"connect_error\"").unwrap_or(0.0);
    assert_eq!(attempts, refused, "every attempt was a connect error");
    assert_budget(attempts as u64, intents, started.elapsed(), "connection refused");
    assert!(c.metric(0, "gateway_upstream_retry_budget_exhausted_total").unwrap_or(0.0) > 0.0, "the budget was hit");
    drop((devices, c));

    // 503: counted by the backend itself.
    let backend = Upstream::start(Behave::Status(503));
    let (c, mut devices) = node(&backend.url(), &budget);
    let started = Instant::now();
    let intents = outage(&mut devices, 48, "503");
    assert_budget(backend.count() as u64, intents, started.elapsed(), "503");
    assert_eq!(c.metric(0, "gateway_ups_total").unwrap_or(0.0) as u64, intents, "every intent counted once");
}

#[test]
fn the_breaker_opens_then_a_probe_closes_it() {
    let backend = Upstream::start(Behave::Status(503));
    let (c, mut devices) =
        node(&backend.url(), &["--upstream-breaker-failures", "3", "--upstream-breaker-open-ms", "1000"]);
    let state = || c.metric(0, "gateway_upstream_breaker_state").unwrap_or(-1.0);
    let ws = &mut devices[0];
    // Failing tries open it: ups go on until one is nacked circuit_open.
    let mut id = 0;
    // The breaker opened after the last failing up was sent: that send time is a lower bound.
    let mut last_sent = Instant::now();
    let opened_after = loop {
        id += 1;
        assert!(id < 50, "the breaker never opened");
        let sent = Instant::now();
        up(ws, id);
        let (_, v) = answers(ws, 1, Duration::from_millis(DEADLINE_MS) + SLACK).remove(&id).unwrap();
        if v["reason"] == "circuit_open" {
            let wait = v["retry_after_ms"].as_u64().expect("circuit_open says when");
            assert!(wait <= 1000, "{v}");
            break last_sent;
        }
        last_sent = sent;
    };
    assert_eq!(state(), 2.0, "open");
    // While open: answered at once, and the backend sees nothing.
    let before = backend.count();
    let t0 = Instant::now();
    up(ws, 100);
    let (_, v) = answers(ws, 1, SLACK).remove(&100).unwrap();
    println!("[upstream] circuit_open nack after {:?}", t0.elapsed());
    assert_eq!(v["reason"], "circuit_open", "{v}");
    assert_eq!(backend.count(), before, "an open breaker sends nothing");
    // Healthy again; once open_ms has passed, one probe goes through and closes it. Until then
    // every up is refused at once.
    backend.set(Behave::Ok);
    let closed = wait_until(Duration::from_millis(1000) + SLACK, "a probe to close the breaker", || {
        id += 1;
        let sent = Instant::now();
        up(ws, id);
        let (_, v) = answers(ws, 1, SLACK).remove(&id).unwrap();
        if v["t"] == "up_ack" {
            return Ok(sent);
        }
        assert_eq!(v["reason"], "circuit_open", "{v}");
        Err(v)
    });
    let open_for = closed - opened_after;
    println!("[upstream] breaker open for at most {open_for:?} (breaker_open_ms 1000), closed by its probe");
    assert!(open_for >= Duration::from_millis(1000), "half-open only after open_ms: {open_for:?}");
    assert_eq!(state(), 0.0, "closed");
    up(ws, 1000);
    assert_eq!(answers(ws, 1, SLACK)[&1000].1["t"], "up_ack");
}

#[test]
fn a_hanging_upstream_never_holds_an_up_past_its_deadline() {
    let backend = Upstream::start(Behave::Hang);
    // A budget that allows every retry: each up makes its 3 tries and the last ends at the deadline.
    let generous =
        ["--upstream-breaker-failures", "1000000", "--upstream-retry-ratio", "1", "--upstream-retry-min-per-s", "1000"];
    let (c, mut devices) = node(&backend.url(), &generous);
    // A try ends at its timeout; the last one at the deadline. Slack: a scheduling quantum per
    // try (3 × 50 ms) for the timers, plus the loaded machine's allowance for the frame's way back.
    let slack = Duration::from_millis(3 * 50) + SLACK;
    let bound = Duration::from_millis(DEADLINE_MS) + slack;
    let mut worst = Duration::ZERO;
    for round in 0..3 {
        let sent = Instant::now();
        for ws in devices.iter() {
            for k in 0..4 {
                up(ws, round * 4 + k);
            }
        }
        for ws in devices.iter_mut() {
            for (id, (at, v)) in answers(ws, 4, bound) {
                assert_eq!(v["t"], "up_nack", "up {id}: {v}");
                let took = at - sent;
                assert!(took <= bound, "up {id} answered after {took:?} (bound {bound:?}): {v}");
                worst = worst.max(took);
            }
        }
    }
    let exceeded = c.metric(0, "gateway_upstream_deadline_exceeded_total").unwrap_or(0.0);
    println!("[upstream] hanging backend: slowest nack {worst:?} (deadline {DEADLINE_MS} ms, try {TRY_MS} ms); {exceeded} deadline_exceeded");
    assert!(worst >= Duration::from_millis(DEADLINE_MS), "the backend really hung, to the deadline: {worst:?}");
    assert!(exceeded >= 48.0, "every up reached its deadline: {exceeded}");
    assert_eq!(c.metric(0, "gateway_ups_in_flight").unwrap_or(-1.0), 0.0, "nothing left in flight");
}

#[test]
fn a_failing_upstream_among_several_is_ejected_and_the_others_take_its_ups() {
    let bad = Upstream::start(Behave::Status(503));
    let good = Upstream::start(Behave::Ok);
    let urls = format!("{},{}", bad.url(), good.url());
    let (c, mut devices) = node(&urls, &["--upstream-breaker-failures", "3", "--upstream-breaker-open-ms", "60000"]);
    let ws = &mut devices[0];
    let bound = Duration::from_millis(DEADLINE_MS) + SLACK;
    // Round robin: ups that meet the failing backend are retried on the healthy one (within the
    // budget); after 3 consecutive failures the failing one is ejected and gets nothing more.
    let mut acked = 0;
    for id in 1..=40 {
        up(ws, id);
        let v = answers(ws, 1, bound).remove(&id).unwrap().1;
        acked += usize::from(v["t"] == "up_ack");
    }
    let bad_tries = bad.count();
    let label = format!("upstream=\"{}\"", bad.addr);
    let ejected = c.metric_labeled(0, "gateway_upstream_breaker_state", &label);
    println!(
        "[upstream] ejection: {acked}/40 acked, the failing backend saw {bad_tries} tries, the healthy one {}",
        good.count()
    );
    assert_eq!(ejected, Some(2.0), "the failing backend is ejected (open)");
    assert!(bad_tries <= 3 + 1, "no traffic to it once ejected: {bad_tries}");
    assert!(acked >= 40 - bad_tries, "only ups whose retry the budget refused may fail: {acked}/40");
    for id in 41..=50 {
        up(ws, id);
        assert_eq!(answers(ws, 1, bound)[&id].1["t"], "up_ack", "the healthy backend takes every up");
    }
    assert_eq!(bad.count(), bad_tries, "still ejected");
}
