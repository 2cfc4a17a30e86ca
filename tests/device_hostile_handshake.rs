//! Hostile handshakes that used to cost a device its connection (issue 10): a request that cannot
//! upgrade is refused before its claim, so the device's live connection and route stay; an
//! `attempt` above 2^53 is refused, so nobody can pin a floor no later attempt can beat.

mod common;

use std::time::Duration;

use common::ws::{Dial, Event};
use common::{http, Cluster, SLACK};

#[test]
fn a_request_that_cannot_upgrade_claims_nothing_and_attempts_are_bounded() {
    let (c, _) = Cluster::form(1, &[]);
    let token = c.token("d1", 0);
    let mut live = c.dial(0, "/ws?attempt=5", &Dial::token(&token)).open("d1 attempt 5");
    let conn = live.hello()["conn"].as_u64().unwrap();

    // A newer attempt with a valid token, but no Sec-WebSocket-Key (or a bad version): 400, and
    // nothing changed — no takeover of the live connection.
    let auth = format!("Bearer {token}");
    for (what, extra) in [
        ("no key", vec![("Sec-WebSocket-Version", "13")]),
        ("version 8", vec![("Sec-WebSocket-Version", "8"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")]),
        ("short key", vec![("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Key", "abc")]),
    ] {
        let mut headers = vec![("Authorization", auth.as_str()), ("Connection", "Upgrade"), ("Upgrade", "websocket")];
        headers.extend(extra);
        let r = http::request(c.public_addr(0), "GET", "/ws?attempt=6&steer=off", &headers, None, SLACK).unwrap();
        assert_eq!((r.status, r.json()["error"].as_str()), (400, Some("not_websocket")), "{what}: {}", r.text());
    }
    let (status, route) = c.route(0, "d1");
    assert_eq!(
        (status, route["conn"].as_u64(), route["floor"]["attempt"].as_u64()),
        (200, Some(conn), Some(5)),
        "{route}"
    );
    // The live connection was not kicked (a 4001 would arrive at once: the claim is local).
    match live.next_event(Duration::from_millis(500)) {
        Event::Timeout | Event::Text(_) | Event::Ping | Event::Pong => {}
        other => panic!("the live connection saw {other:?}"),
    }

    // attempt: at most 2^53.
    let over = format!("/ws?attempt={}&steer=off", (1u64 << 53) + 1);
    let r = c.dial(0, &over, &Dial::token(&token)).refused("attempt 2^53 + 1");
    assert_eq!((r.status, r.error()), (400, "bad_attempt"), "{r:?}");
    let (status, v) = c.claim(0, "d2", 1, 0, (1 << 53) + 1);
    assert_eq!((status, v["error"].as_str()), (400, Some("bad_attempt")), "{v}");
    let (status, route) = c.route(0, "d1");
    assert_eq!((status, route["floor"]["attempt"].as_u64()), (200, Some(5)), "{route}");
    // 2^53 itself is a valid attempt.
    let max = format!("/ws?attempt={}&steer=off", 1u64 << 53);
    let mut newest = c.dial(0, &max, &Dial::token(&token)).open("attempt 2^53");
    assert_eq!(newest.hello()["route_version"].as_u64(), Some(2));
    let (_, code, _) = live.expect_close(SLACK, "the older connection superseded");
    assert_eq!(code, 4001);
}
