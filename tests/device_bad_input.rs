//! Bad input on the public listener: every bad token is a 401 with its reason, a missing attempt
//! or a plain GET a 400, a slowloris connection is closed after the header read timeout, and after
//! the upgrade binary frames close 1008, oversized messages 1009, unknown frames get an error and
//! the connection stays. The node survives all of it.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::ws::{Dial, Event};
use common::{b64, Cluster, SLACK};
use gateway::token::{mint, DeviceClaims};

const HEADER_READ_TIMEOUT_MS: u64 = 500;
const MAX_MESSAGE_BYTES: usize = 1024;

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// Opens a TCP connection, sends `prefix`, and measures how long until the server closes it.
fn closed_after(addr: std::net::SocketAddr, prefix: &[u8], bound: Duration) -> (Duration, Vec<u8>) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).unwrap();
    s.set_read_timeout(Some(bound)).unwrap();
    let started = Instant::now();
    s.write_all(prefix).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (started.elapsed(), got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (started.elapsed(), got),
            Err(e) => panic!(
                "connection (sent {:?}) still open after {:?} (bound {bound:?}): {e}; got {:?}",
                String::from_utf8_lossy(prefix),
                started.elapsed(),
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

#[test]
fn bad_tokens_bad_requests_and_bad_frames_are_refused_and_the_node_survives() {
    let (mut c, _) =
        Cluster::form(1, &["--header-read-timeout-ms", "500", "--max-message-bytes", &MAX_MESSAGE_BYTES.to_string()]);
    let secret = c.device_secret();
    let far = unix_now() + 3600;
    let good = c.token("d1", 0);

    // ---- 401s, with their reasons ------------------------------------------------------------
    let other_secret = mint(b"another-secret-of-enough-length!!", "d1", 0, far).unwrap();
    let expired = mint(&secret, "d1", 0, unix_now() - 3600).unwrap();
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT"}"#),
        b64(format!(r#"{{"sub":"d1","epoch":0,"exp":{far}}}"#).as_bytes())
    );
    let bad_device = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &DeviceClaims { sub: "bad id!".into(), epoch: 0, exp: far, nbf: None, tenant: None },
        &jsonwebtoken::EncodingKey::from_secret(&secret),
    )
    .unwrap();
    let cases: Vec<(&str, Dial, &str)> = vec![
        ("no token", Dial::anonymous(), "missing_token"),
        ("garbage", Dial::token("garbage"), "invalid_token"),
        ("three garbage parts", Dial::token("not.a.token"), "invalid_token"),
        ("another secret", Dial::token(&other_secret), "invalid_token"),
        ("expired", Dial::token(&expired), "token_expired"),
        ("alg none", Dial::token(&none), "invalid_token"),
        ("5000 chars", Dial::token(&"a".repeat(5000)), "token_too_long"),
        ("bad device id", Dial::token(&bad_device), "bad_device_id"),
    ];
    for (what, how, reason) in &cases {
        let r = c.dial(0, "/ws?attempt=1", how).refused(what);
        assert_eq!((r.status, r.error()), (401, *reason), "{what}: {r:?}");
    }
    // Authentication comes before the attempt and upgrade checks.
    let r = c.dial(0, "/ws", &Dial::token("garbage")).refused("bad token and no attempt");
    assert_eq!((r.status, r.error()), (401, "invalid_token"), "{r:?}");
    let p = c.public_get(0, "/ws?attempt=1", None);
    assert_eq!((p.status, p.json()["error"].as_str()), (401, Some("missing_token")), "{}", p.text());

    // ---- 400s ----------------------------------------------------------------------------------
    for q in ["/ws", "/ws?attempt=", "/ws?attempt=abc", "/ws?attempt=-1"] {
        let r = c.dial(0, q, &Dial::token(&good)).refused(q);
        assert_eq!((r.status, r.error()), (400, "bad_attempt"), "{q}: {r:?}");
    }
    let p = c.public_get(0, "/ws?attempt=1", Some(&good));
    assert_eq!((p.status, p.json()["error"].as_str()), (400, Some("not_websocket")), "{}", p.text());
    for reason in ["invalid_token", "token_expired", "token_too_long", "bad_attempt", "not_websocket"] {
        let n = c.metric_labeled(0, "gateway_handshakes_total", &format!("result=\"{reason}\""));
        assert!(n.is_some_and(|n| n >= 1.0), "{reason} counted: {n:?}");
    }
    // No refusal touched the device's state.
    let (st, v) = c.route(0, "d1");
    assert_eq!((st, v["floor"].is_null()), (404, true), "refused handshakes must not claim: {v}");

    // ---- slowloris -------------------------------------------------------------------------------
    let bound = Duration::from_millis(HEADER_READ_TIMEOUT_MS) + SLACK;
    let (took, got) = closed_after(c.public_addr(0), b"GET /ws?attempt=1 HTTP/1.1\r\nHost: x\r\n", bound);
    println!(
        "[device_bad_input] half-sent headers closed after {took:?} (header_read_timeout {HEADER_READ_TIMEOUT_MS} ms); \
         server sent {:?}",
        String::from_utf8_lossy(&got)
    );

    // A connection that sends nothing at all never finishes its headers either.
    let (took, _) = closed_after(c.public_addr(0), b"", bound);
    println!("[device_bad_input] silent connection closed after {took:?}");

    // ---- after the upgrade ---------------------------------------------------------------------
    // Checks of the close codes are tallied over several connections (the server's close frame
    // races its own teardown, see the end) and asserted after the node's health.
    let mut problems: Vec<String> = Vec::new();
    let mut attempt = 0;
    let mut open = |device: &str| {
        attempt += 1;
        let t = c.token(device, 0);
        let mut ws = c.dial(0, &format!("/ws?attempt={attempt}"), &Dial::token(&t)).open(device);
        ws.hello();
        ws
    };
    let mut ws = open("d-chat");
    ws.send_text(r#"{"t":"ping"}"#).unwrap();
    let v = ws.next_text(SLACK, "pong");
    assert_eq!(v["t"], "pong", "{v}");
    ws.send_text(r#"{"t":"x"}"#).unwrap();
    let v = ws.next_text(SLACK, "error for an unknown frame");
    assert_eq!(v["t"], "error", "{v}");
    ws.send_text(r#"{"t":"ping"}"#).unwrap();
    let v = ws.next_text(SLACK, "pong after an unknown frame: the connection stays");
    assert_eq!(v["t"], "pong", "{v}");
    // A message of exactly the limit is not over it.
    let pad = MAX_MESSAGE_BYTES - r#"{"t":"ping","pad":""}"#.len();
    let at_limit = format!(r#"{{"t":"ping","pad":"{}"}}"#, "x".repeat(pad));
    assert_eq!(at_limit.len(), MAX_MESSAGE_BYTES);
    ws.send_text(&at_limit).unwrap();
    match ws.next_event(SLACK) {
        Event::Text(v) => println!("[device_bad_input] a {MAX_MESSAGE_BYTES}-byte message was answered {v}"),
        other => problems.push(format!(
            "a message of exactly --max-message-bytes ({MAX_MESSAGE_BYTES} bytes) must be accepted, got {other:?}"
        )),
    }

    // The limit is on messages, not frames: a message over it sent in small fragments is too big too.
    let mut ws = open("d-fragments");
    let big = format!(r#"{{"t":"ping","pad":"{}"}}"#, "x".repeat(4 * MAX_MESSAGE_BYTES));
    // The server may close mid-message, so later fragments can fail to send: the close is what counts.
    let _ = ws.send_text_fragmented(&big, MAX_MESSAGE_BYTES / 4);
    match ws.next_event(SLACK) {
        Event::Close { code: 1009, .. } => {}
        other => problems.push(format!(
            "a {}-byte message in {}-byte fragments (limit {MAX_MESSAGE_BYTES}) must close 1009, got {other:?}",
            big.len(),
            MAX_MESSAGE_BYTES / 4
        )),
    }

    const TRIES: usize = 8;
    let big = format!(r#"{{"t":"ping","pad":"{}"}}"#, "x".repeat(MAX_MESSAGE_BYTES));
    for (what, want) in [("binary frame", 1008u16), ("oversized message", 1009)] {
        let mut seen = std::collections::BTreeMap::<String, usize>::new();
        for k in 0..TRIES {
            let mut ws = open(&format!("d-bad-{want}-{k}"));
            match want {
                1008 => ws.send_binary(b"\x00\x01").unwrap(),
                _ => ws.send_text(&big).unwrap(),
            }
            let ev = match ws.next_event(SLACK) {
                Event::Close { code, reason } => format!("close {code} {reason:?}"),
                other => format!("{other:?}"),
            };
            *seen.entry(ev).or_default() += 1;
        }
        println!("[device_bad_input] {what} x{TRIES}: {seen:?}");
        let good = seen.iter().filter(|(k, _)| k.starts_with(&format!("close {want} "))).map(|(_, n)| n).sum::<usize>();
        if good != TRIES {
            problems.push(format!("{what}: expected close {want} on all {TRIES} connections, saw {seen:?}"));
        }
    }

    // ---- the node survived ---------------------------------------------------------------------
    assert!(c.is_running(0), "n1 died");
    let h = c.get(0, "/healthz").unwrap();
    assert_eq!(h.status, 200, "{}", h.text());
    assert_eq!(c.public_get(0, "/healthz", None).status, 200);
    assert!(problems.is_empty(), "contract violations after the upgrade: {problems:#?}");
}
