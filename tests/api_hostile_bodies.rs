//! The admin and publish APIs' JSON bodies, fuzzed against a real node: valid bodies, mutations
//! of them (unknown fields, values of the wrong type or out of range, truncation, deep nesting,
//! huge strings, bytes that are not UTF-8) and noise. What an operator relies on: every answer is
//! a success or a 4xx with a JSON reason (never a 5xx, never a dropped connection), no answer and
//! no log line quotes what was sent, and the node stays healthy and keeps taking valid calls.
//!
//! Endpoints that would make the node act on the network or on itself (join, leave, drain) are
//! left out: a random valid body there would dial an arbitrary address or stop the node.
//! `HOSTILE_BODIES_CASES` sets the number of bodies per endpoint (default 60); the seed is
//! printed, and `HOSTILE_BODIES_SEED` replays a run.

mod common;

use std::time::Duration;

use common::{http, random_hex, Cluster, SLACK};
use serde_json::Value;

/// xorshift64*: deterministic from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A body for an endpoint whose valid bodies are `valid`; anything it invents names `marker`.
fn body(rng: &mut Rng, valid: &[&str], marker: &str) -> Vec<u8> {
    let base = rng.pick(valid).to_string();
    let odd_values = [
        format!("\"{marker}\""),
        "-1".into(),
        "1.5".into(),
        "1e308".into(),
        "18446744073709551616".into(),
        "null".into(),
        "true".into(),
        format!("[\"{marker}\"]"),
        format!("{{\"{marker}\": 1}}"),
    ];
    match rng.below(10) {
        // As is: it must be taken (200) or refused for a reason (4xx).
        0 => base.into_bytes(),
        // An unknown field whose name is the marker.
        1 => base.replacen('{', &format!("{{\"{marker}\": 1, "), 1).into_bytes(),
        // Every value replaced by an odd one.
        2 => {
            let v: Value = serde_json::from_str(&base).expect("valid template");
            let mut out = serde_json::Map::new();
            for k in v.as_object().expect("an object").keys() {
                let odd: Value = serde_json::from_str(rng.pick(&odd_values).as_str()).expect("odd value");
                out.insert(k.clone(), odd);
            }
            Value::Object(out).to_string().into_bytes()
        }
        // Cut anywhere.
        3 => {
            let cut = rng.below(base.len());
            base.as_bytes()[..cut].to_vec()
        }
        // Nested deeper than a parser should follow.
        4 => format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
        // A long string holding the marker.
        5 => format!("{{\"id\": \"{}\", \"publishes\": 1}}", marker.repeat(2000)).into_bytes(),
        // Bytes that are not UTF-8, around the marker.
        6 => [b"{\"".as_slice(), &[0xff, 0xfe], marker.as_bytes(), b"\": 1}"].concat(),
        // Not an object at all.
        7 => rng
            .pick(&[format!("\"{marker}\""), "[]".into(), "null".into(), "".into(), "42".into()])
            .clone()
            .into_bytes(),
        // A duplicated key, the second with an odd value.
        8 => {
            let odd = rng.pick(&odd_values).clone();
            let key = base.split('"').nth(1).unwrap_or("rate").to_string();
            base.replacen('{', &format!("{{\"{key}\": {odd}, "), 1).into_bytes()
        }
        // Noise.
        _ => (0..rng.below(300)).map(|_| rng.next() as u8).chain(marker.bytes()).collect(),
    }
}

#[test]
fn hostile_admin_and_publish_bodies_get_reasons_and_change_nothing_else() {
    let seed: u64 = std::env::var("HOSTILE_BODIES_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from_str_radix(&random_hex(15), 16).unwrap_or(1) | 1);
    let cases: usize = std::env::var("HOSTILE_BODIES_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    println!("[api_hostile_bodies] seed {seed} (HOSTILE_BODIES_SEED replays), {cases} bodies per endpoint");
    let mut rng = Rng(seed);
    let (mut c, _) = Cluster::form(1, &[]);
    let addr = c.nodes[0].cluster_addr();
    let bearer = format!("Bearer {}", c.secret);
    let marker = format!("zqx{}", random_hex(10));

    let endpoints: [(&str, &[&str]); 4] = [
        ("/cluster/admission", &[r#"{"rate": 500, "burst": 50}"#, r#"{"clear": true}"#]),
        (
            "/cluster/tenants/fuzz-tenant",
            &[r#"{"max_connections": 5, "publishes": 10, "period_ms": 60000}"#, r#"{"max_connections": 1}"#, "{}"],
        ),
        ("/cluster/tenants/fuzz-tenant/grants", &[r#"{"id": "g-1", "publishes": 3}"#]),
        ("/v1/devices/fuzz-device/messages", &[r#"{"n": 1}"#, r#"{"text": "hello", "list": [1, 2]}"#]),
    ];
    let mut statuses = std::collections::BTreeMap::<(String, u16), u32>::new();
    let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
    for (path, valid) in endpoints {
        if path.ends_with("/grants") {
            // The fuzzed plans may have left the tenant without a publish quota to grant on.
            let plan = br#"{"publishes": 10, "period_ms": 60000}"#;
            let r = http::request(
                addr,
                "POST",
                "/cluster/tenants/fuzz-tenant",
                &headers,
                Some(plan),
                http::REQUEST_TIMEOUT,
            );
            assert_eq!(r.unwrap().status, 200);
        }
        // Each valid body first: taken (publishes: to a device that never connected, refused).
        for sent in valid {
            let r = http::request(addr, "POST", path, &headers, Some(sent.as_bytes()), http::REQUEST_TIMEOUT).unwrap();
            let expected = if path.starts_with("/v1/") { 404 } else { 200 };
            assert_eq!(r.status, expected, "{path} {sent}: {}", r.text());
        }
        for case in 0..cases {
            let sent = body(&mut rng, valid, &marker);
            let r = http::request(addr, "POST", path, &headers, Some(&sent), http::REQUEST_TIMEOUT)
                .unwrap_or_else(|e| panic!("{path} case {case} (seed {seed}): no answer: {e:#}"));
            let text = r.text();
            let shown = String::from_utf8_lossy(&sent).chars().take(120).collect::<String>();
            assert!(r.status < 500, "{path} case {case} (seed {seed}) body {shown:?}: {} {text}", r.status);
            assert!(!text.contains(&marker), "{path} case {case} (seed {seed}): the answer quotes the body: {text}");
            if r.status != 200 {
                let v: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{path} case {case}: a refusal that is not JSON ({e}): {text}"));
                assert!(v["error"].is_string(), "{path} case {case}: no reason: {text}");
            }
            *statuses.entry((path.to_string(), r.status)).or_default() += 1;
        }
    }
    println!("[api_hostile_bodies] answers by endpoint and status: {statuses:?}");
    // Every endpoint refused some bodies for a reason: the fuzzing reached the handlers.
    for (path, _) in endpoints {
        let refused = statuses.iter().any(|((p, s), _)| p == path && (400..500).contains(s));
        assert!(refused, "{path} refused nothing: {statuses:?}");
    }

    // Still healthy, still taking valid calls, and nothing it logged quotes a body.
    let health = http::request(addr, "GET", "/healthz", &[], None, http::REQUEST_TIMEOUT).unwrap();
    assert_eq!(health.status, 200);
    let body = br#"{"rate": 1000, "burst": 100}"#;
    let r = http::request(addr, "POST", "/cluster/admission", &headers, Some(body), http::REQUEST_TIMEOUT).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    c.sigterm(0);
    assert!(c.wait_exit(0, Duration::from_secs(30) + SLACK).success(), "the node drains and exits cleanly");
    let log = std::fs::read_to_string(&c.nodes[0].stderr_path).unwrap();
    assert!(!log.contains(&marker), "the node's log quotes a body");
    assert!(!log.contains("panicked"), "the node panicked");
}
