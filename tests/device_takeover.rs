//! Takeover across nodes: a newer attempt on another node closes the old connection with 4001 (sent
//! by the node holding it), a late older attempt is fenced on a third node, and placement steers
//! to the route's node with 307 unless that node is reported unreachable (`fallback`).

mod common;

use common::ws::Dial;
use common::{wait_until, Cluster, SLACK};

#[test]
fn newer_attempt_on_another_node_kicks_the_old_connection_and_placement_follows() {
    let (c, _) = Cluster::form(3, &[]);
    let (n1, n2, n3) = (0, 1, 2);
    let n2_id = c.node_id(n2);
    let token = c.token("d1", 0);

    let mut a = c.dial(n1, "/ws?attempt=1&steer=off", &Dial::token(&token)).open("d1 attempt 1 on n1");
    let ha = a.hello();
    assert_eq!((ha["node"].as_str(), ha["route_version"].as_u64()), (Some("n1"), Some(1)), "{ha}");

    let mut b = c.dial(n2, "/ws?attempt=2&steer=off", &Dial::token(&token)).open("d1 attempt 2 on n2");
    let (hello_at, hb) = b.hello_timed();
    assert_eq!((hb["node"].as_str(), hb["route_version"].as_u64()), (Some("n2"), Some(2)), "{hb}");
    let conn_b = hb["conn"].as_u64().unwrap();

    let (closed_at, code, reason) = a.expect_close(SLACK, "n1's connection superseded by n2's claim");
    // n1 kicks when it applies the claim, which may be before n2 has even sent its 101.
    let (sign, gap) = match closed_at.checked_duration_since(hello_at) {
        Some(d) => ("after", d),
        None => ("before", hello_at - closed_at),
    };
    println!(
        "[device_takeover] old connection closed {code} {reason:?} {gap:?} {sign} the new hello (bound {SLACK:?})"
    );
    assert_eq!(code, 4001, "superseded close code");
    let (st, route) = c.route(n1, "d1");
    assert_eq!(
        (st, route["node"]["name"].as_str(), route["conn"].as_u64()),
        (200, Some("n2"), Some(conn_b)),
        "{route}"
    );
    wait_until(SLACK, "gateway_kicks_total >= 1 on n1", || match c.metric(n1, "gateway_kicks_total") {
        Some(k) if k >= 1.0 => Ok(k),
        other => Err(other),
    });
    assert_eq!(c.metric(n2, "gateway_kicks_total"), Some(0.0), "n2 kicked nothing");

    // A late handshake with the older attempt, on a third node: fenced by the floor.
    let r = c.dial(n3, "/ws?attempt=1&steer=off", &Dial::token(&token)).refused("late attempt 1 on n3");
    assert_eq!((r.status, r.error()), (409, "stale_attempt"), "{r:?}");
    assert_eq!((r.body["floor_epoch"].as_u64(), r.body["floor_attempt"].as_u64()), (Some(0), Some(2)), "{r:?}");
    // (n3 serves reads from its own applied state, which may trail the leader's reply by a moment.)
    wait_until(SLACK, "n3 to show the route unchanged on n2", || match c.try_route(n3, "d1") {
        Ok((200, r)) if r["node"]["name"] == "n2" && r["conn"].as_u64() == Some(conn_b) => Ok(()),
        other => Err(format!("{other:?}")),
    });

    // Steering: n1 sends the device to its route's node, n2, keeping the query.
    let r = c.dial(n1, "/ws?attempt=3", &Dial::token(&token)).refused("steered handshake on n1");
    let expected = format!("{}/ws?attempt=3", c.public_url(n2));
    assert_eq!(r.status, 307, "{r:?}");
    assert_eq!(r.header("location"), Some(expected.as_str()), "{r:?}");
    // The body names the URL without the query (which may hold a browser's ?token=).
    let url = format!("{}/ws", c.public_url(n2));
    assert_eq!((r.error(), r.body["location"].as_str()), ("wrong_node", Some(url.as_str())), "{r:?}");
    assert_eq!(c.metric_labeled(n1, "gateway_handshakes_total", r#"result="redirected""#), Some(1.0));

    // The connect endpoint agrees, on any node; with fallback=n2 (by name or id) it never names n2.
    for i in [n1, n3] {
        let p = c.public_get(i, "/v1/placement", Some(&token));
        let v = p.json();
        assert_eq!(p.status, 200, "placement on {}: {v}", c.nodes[i].name);
        assert_eq!((v["device"].as_str(), v["node"].as_str()), (Some("d1"), Some("n2")), "{v}");
        assert_eq!(v["node_id"].as_u64(), Some(n2_id), "{v}");
        assert_eq!(v["url"].as_str(), Some(format!("{}/ws", c.public_url(n2)).as_str()), "{v}");
    }
    for fallback in ["n2".to_string(), n2_id.to_string()] {
        let p = c.public_get(n1, &format!("/v1/placement?fallback={fallback}"), Some(&token));
        let v = p.json();
        assert_eq!(p.status, 200, "{v}");
        assert!(v["node"] != "n2" && v["node_id"].as_u64() != Some(n2_id), "fallback={fallback} still names n2: {v}");
    }

    // A handshake saying n2 was unreachable is never sent back to n2.
    match c.dial(n1, "/ws?attempt=4&fallback=n2", &Dial::token(&token)) {
        common::ws::Outcome::Refused(r) => {
            assert_eq!(r.status, 307, "fallback handshake: {r:?}");
            let loc = r.header("location").unwrap_or_default();
            assert!(loc.starts_with(&format!("{}/ws?", c.public_url(n3))), "fallback=n2 must not point at n2: {r:?}");
            println!("[device_takeover] fallback=n2 steered to n3: {loc}");
        }
        common::ws::Outcome::Open(mut ws) => {
            let h = ws.hello();
            assert_eq!(h["node"], "n1", "{h}");
            println!("[device_takeover] fallback=n2 accepted on n1: {h}");
            // Accepting on n1 takes the device over from n2.
            let (_, code, _) = b.expect_close(SLACK, "n2's connection superseded by the fallback claim on n1");
            assert_eq!(code, 4001);
        }
    }
}
