//! The cluster listener's limits in bytes and time, against a real node. What an operator relies
//! on: an admin body over 64 KiB or a request head over 64 KiB is refused by size (it used to read
//! 64 MiB bodies and ~400 KiB heads on every path); a join naming a malformed member is refused
//! without quoting it; and publishes in flight are held to a byte budget — once the node holds
//! its budget of bodies, the next publish is answered `503 busy` at once, a body that does not
//! arrive within the body deadline is answered `408` and gives its share back, and publishing
//! works again. A publish refused (busy, or too large) while its body is still arriving is read
//! to its end first, so the sender reads the refusal instead of a reset; so is a body refused
//! by its caller's secret (401, 403).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::ws::Dial;
use common::{http, random_hex, wait_until, Cluster, SLACK};
use gateway::api::{BODY_READ_TIMEOUT, PUBLISHES_IN_FLIGHT, PUBLISH_OVERHEAD};

#[test]
fn oversized_heads_and_admin_bodies_and_bad_members_are_refused_without_echo() {
    let (c, _) = Cluster::form(1, &[]);
    let addr = c.nodes[0].cluster_addr();
    let bearer = c.bearer();
    let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];

    // An admin body over 64 KiB: refused by size before it is parsed.
    let marker = format!("zz{}", random_hex(8));
    let big = format!(r#"{{"rate": 1, "burst": 1, "pad": "{}"}}"#, marker.repeat(7000));
    assert!(big.len() > 64 << 10);
    for path in ["/cluster/admission", "/cluster/join", "/cluster/scale-in/lock"] {
        let r = http::request(addr, "POST", path, &headers, Some(big.as_bytes()), http::REQUEST_TIMEOUT).unwrap();
        assert_eq!((r.status, r.json()["error"].as_str()), (413, Some("bad_body")), "{path}: {}", r.text());
        assert!(!r.text().contains(&marker), "{path} quotes the body");
    }
    // A head of 200 KiB (hyper's default took ~400 KiB): refused by the listener, `431`, or the
    // connection is reset when the node closes it with the rest of the head unread.
    let huge = "x".repeat(200 << 10);
    let pad = [("Authorization", bearer.as_str()), ("X-Pad", huge.as_str())];
    match http::request(addr, "GET", "/cluster/status", &pad, None, http::REQUEST_TIMEOUT) {
        Ok(r) => assert_eq!(r.status, 431, "a 200 KiB head is served: {}", r.status),
        Err(e) => {
            let e = format!("{e:#}").to_lowercase();
            assert!(e.contains("reset") || e.contains("broken pipe"), "a 200 KiB head: {e}");
        }
    }

    // A join naming a member no node could be configured as: 400 bad_member, nothing echoed,
    // the membership unchanged.
    for member in [
        format!(r#"{{"name": "{marker}<x>", "cluster_addr": "127.0.0.1:9", "public_url": "ws://127.0.0.1:9"}}"#),
        format!(r#"{{"name": "n9", "cluster_addr": "{marker} :9", "public_url": "ws://127.0.0.1:9"}}"#),
        format!(r#"{{"name": "n9", "cluster_addr": "127.0.0.1:9", "public_url": "ws://h/{marker}\r\nX: y"}}"#),
        format!(r#"{{"name": "n9", "cluster_addr": "127.0.0.1:9", "public_url": "ftp://{marker}"}}"#),
    ] {
        let body = format!(r#"{{"id": 99, "member": {member}}}"#);
        let r = http::request(addr, "POST", "/cluster/join", &headers, Some(body.as_bytes()), http::REQUEST_TIMEOUT)
            .unwrap();
        assert_eq!((r.status, r.json()["error"].as_str()), (400, Some("bad_member")), "{member}: {}", r.text());
        assert!(!r.text().contains(&marker), "the refusal quotes the member: {}", r.text());
    }
    let status = c.get(0, "/cluster/status").unwrap().text();
    assert!(!status.contains("n9") && !status.contains(&marker), "a refused member joined: {status}");
}

/// Starts a `POST` to `path` whose body is framed by `framing` (a `content-length` or
/// `transfer-encoding` header) and sends none of it.
fn start_post(addr: std::net::SocketAddr, bearer: &str, path: &str, framing: &str) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: {bearer}\r\n\
         content-type: application/json\r\n{framing}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
    Ok(s)
}

fn messages(device: &str) -> String {
    format!("/v1/devices/{device}/messages")
}

/// Starts a publish that declares a body of `len` bytes and sends none of it.
fn hold_publish(addr: std::net::SocketAddr, bearer: &str, device: &str, len: usize) -> TcpStream {
    start_post(addr, bearer, &messages(device), &format!("content-length: {len}")).expect("a publish started")
}

/// The status line of the answer on `s`, within `timeout`.
fn answer_status(s: &mut TcpStream, timeout: Duration) -> Option<u16> {
    s.set_read_timeout(Some(timeout)).ok()?;
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf[..n]);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// A `POST` to `path` of `len` bytes whose body is sent in `parts` with `pause` between them
/// (`chunked`: one chunk per part, otherwise after a `Content-Length`), then the status of its
/// answer; an error when the node reset the connection before the body was sent.
fn slow_post(
    addr: std::net::SocketAddr,
    bearer: &str,
    path: &str,
    len: usize,
    chunked: bool,
    pause: Duration,
) -> Result<u16, String> {
    const PARTS: usize = 8;
    let framing = if chunked { "transfer-encoding: chunked".to_string() } else { format!("content-length: {len}") };
    let mut s = start_post(addr, bearer, path, &framing)?;
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(len - 10));
    for part in body.as_bytes().chunks(len.div_ceil(PARTS)) {
        std::thread::sleep(pause);
        let sent =
            if chunked { [format!("{:x}\r\n", part.len()).as_bytes(), part, b"\r\n"].concat() } else { part.to_vec() };
        s.write_all(&sent).map_err(|e| format!("sending the body: {e}"))?;
    }
    if chunked {
        s.write_all(b"0\r\n\r\n").map_err(|e| format!("ending the body: {e}"))?;
    }
    answer_status(&mut s, http::REQUEST_TIMEOUT).ok_or_else(|| "no answer".to_string())
}

#[test]
fn publishes_in_flight_are_held_to_a_byte_budget() {
    let payload_limit = 1024;
    let (c, _) = Cluster::form(1, &["--max-payload-bytes", &payload_limit.to_string()]);
    let addr = c.nodes[0].cluster_addr();
    let bearer = c.bearer();
    let token = c.token("budget-dev", 0);
    let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&token)).open("the device");
    assert_eq!(ws.hello()["device"], "budget-dev");
    let publish = || {
        let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
        http::request(
            addr,
            "POST",
            "/v1/devices/budget-dev/messages",
            &headers,
            Some(b"{\"n\":1}"),
            http::REQUEST_TIMEOUT,
        )
        .unwrap()
    };
    assert_eq!(publish().status, 200, "a publish before the budget is held");
    assert_eq!(ws.next_text(Duration::from_secs(5) + SLACK, "the first publish")["seq"], 1);

    // Publishes of the largest payload, each waiting for its body: together the whole budget.
    let started = Instant::now();
    let mut held: Vec<TcpStream> =
        (0..PUBLISHES_IN_FLIGHT).map(|_| hold_publish(addr, &bearer, "budget-dev", payload_limit)).collect();
    // The node reads each head and charges it (a publish sent meanwhile could take a share and
    // have a held one refused); then the next publish is refused at once.
    let budget = PUBLISHES_IN_FLIGHT * (payload_limit + PUBLISH_OVERHEAD);
    wait_until(SLACK, "the held publishes to hold the whole budget", || {
        match c.metric(0, "gateway_publish_bytes_in_flight") {
            Some(b) if b as usize == budget => Ok(()),
            other => Err(format!("{other:?} of {budget} bytes held")),
        }
    });
    let refused = publish();
    let waited = started.elapsed();

    assert!(waited < BODY_READ_TIMEOUT, "holding the budget took {waited:?}: the first held bodies timed out");
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["error"], "busy", "{}", refused.text());
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(refused.text().contains(&budget.to_string()), "names the budget: {}", refused.text());
    assert!(c.metric_labeled(0, "gateway_publishes_total", "result=\"busy\"").unwrap_or(0.0) >= 1.0);
    // A backend on a slow link is still sending its body when the node refuses it: it reads the
    // refusal (and retries), not a reset connection and a broken pipe halfway through its body.
    let slow = slow_post(addr, &bearer, &messages("budget-dev"), payload_limit, false, Duration::from_millis(100));
    assert_eq!(slow, Ok(503), "a publish refused while its body was still being sent");
    let slow = slow_post(addr, &bearer, &messages("budget-dev"), 2 * payload_limit, false, Duration::from_millis(100));
    assert_eq!(slow, Ok(413), "a publish over the payload limit, refused while its body was still being sent");

    // Bodies that never arrive are answered 408 at the deadline, and give their share back.
    let timed_out = held.iter_mut().filter_map(|s| answer_status(s, BODY_READ_TIMEOUT + SLACK)).collect::<Vec<_>>();
    assert_eq!(timed_out.len(), PUBLISHES_IN_FLIGHT, "every held publish is answered");
    assert!(timed_out.iter().all(|s| *s == 408), "{timed_out:?}");
    assert_eq!(c.metric(0, "gateway_publish_bytes_in_flight"), Some(0.0), "the budget is given back");
    let r = publish();
    assert_eq!(r.status, 200, "publishing works again: {}", r.text());
    assert_eq!(ws.next_text(Duration::from_secs(5) + SLACK, "the publish after the budget")["seq"], 2);
    // Sent chunked (no length to refuse it by), a body over the limit is read to its end too.
    let chunked =
        slow_post(addr, &bearer, &messages("budget-dev"), 2 * payload_limit, true, Duration::from_millis(100));
    assert_eq!(chunked, Ok(413), "a chunked publish over the payload limit, refused while it was still being sent");
    assert_eq!(c.metric(0, "gateway_publish_bytes_in_flight"), Some(0.0), "the refused publish gave its charge back");
}

#[test]
fn a_caller_refused_by_its_secret_reads_the_refusal_not_a_reset() {
    let keys = tempfile::tempdir().unwrap();
    let file = keys.path().join("backend.secret");
    let backend = random_hex(32);
    std::fs::write(&file, format!("{backend}\n")).unwrap();
    let (c, _) = Cluster::form(1, &["--backend-secret-file", file.to_str().unwrap()]);
    let addr = c.nodes[0].cluster_addr();
    let (len, pause) = (16 << 10, Duration::from_millis(100));
    // A backend whose secret was rotated out is still sending its publish when the node refuses
    // it: it reads the 401 (and stops), not a reset connection it would retry as a network fault.
    let rotated_out = format!("Bearer {}", random_hex(32));
    let publish = messages("d1");
    assert_eq!(slow_post(addr, &rotated_out, &publish, len, false, pause), Ok(401), "a publish with a wrong secret");
    assert_eq!(slow_post(addr, &rotated_out, &publish, len, true, pause), Ok(401), "the same, sent chunked");
    // A backend secret used on a path it does not reach, with a body: it reads the 403.
    let bearer = format!("Bearer {backend}");
    assert_eq!(slow_post(addr, &bearer, "/cluster/admission", len, false, pause), Ok(403), "an admin call");
}
