//! Takeover across nodes: a newer attempt on another node closes the old connection with 4001 (sent
//! by the node holding it), a late older attempt is fenced on a third node, and placement steers
//! to the route's node with 307 unless that node is reported unreachable (`fallback`); a node at
//! its `--max-connections` is left out of placement everywhere once its renewed count shows it,
//! and sends a device on itself before that (`sent_on_full`).

mod common;

use common::ws::Dial;
use common::{wait_until, Cluster, Start, SLACK, TIMING};
use serde_json::Value;

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

/// Member `name`'s row in node `i`'s status.
fn member(c: &Cluster, i: usize, name: &str) -> Value {
    let status = c.status_json(i);
    status["members"].as_array().and_then(|m| m.iter().find(|m| m["name"] == name).cloned()).unwrap_or_default()
}

/// Waits until every node in `all` shows n1's `field` (in its status) at `value`.
fn every_node_shows(c: &Cluster, all: &[usize], field: &str, value: u64) {
    wait_until(TIMING.settle_bound(), &format!("n1's {field} at {value} on every node"), || {
        let seen: Vec<Value> = all.iter().map(|i| member(c, *i, "n1")[field].clone()).collect();
        if seen.iter().all(|v| v.as_u64() == Some(value)) {
            Ok(())
        } else {
            Err(seen)
        }
    });
}

#[test]
fn a_full_node_gets_no_new_devices_and_sends_its_own_on() {
    // n1 holds at most 3; n2 and n3 derive theirs from the open-file limit.
    let mut c = Cluster::new();
    let n1 = c.spawn_with("n1", Start::Bootstrap, &["--max-connections", "3"]);
    for name in ["n2", "n3"] {
        let i = c.spawn(name, Start::Standby);
        c.join(n1, i);
    }
    let (n2, n3) = (1, 2);
    let all = [n1, n2, n3];
    c.wait_agreement(&all, TIMING.settle_bound(), "3 live members", |v| v.members.len() == 3 && v.all_live());
    // Each node publishes its limit after its first renewal; every node applies the same value.
    every_node_shows(&c, &all, "max_connections", 3);
    // n2 publishes the one it derived from its open-file limit (after its own first renewal).
    wait_until(TIMING.settle_bound(), "n2's derived limit applied on n1", || {
        let limit = member(&c, n1, "n2")["max_connections"].clone();
        if limit.as_u64().is_some_and(|m| m > 3) {
            Ok(())
        } else {
            Err(limit)
        }
    });

    // Devices whose ring owner is n1 (while every node holds nothing).
    let owned: Vec<String> = (0..200)
        .map(|k| format!("p{k}"))
        .filter(|d| c.public_get(n2, "/v1/placement", Some(&c.token(d, 0))).json()["node"] == "n1")
        .take(5)
        .collect();
    assert_eq!(owned.len(), 5, "n1 owns about a third of the ring");

    // Fill n1, and wait until its renewed count says so on every node.
    let mut held: Vec<_> = (1..=3)
        .map(|k| {
            let d = format!("f{k}");
            let ws = c.dial(n1, "/ws?attempt=1&steer=off", &Dial::token(&c.token(&d, 0))).open(&d);
            (d, ws)
        })
        .collect();
    every_node_shows(&c, &all, "connections", 3);
    // Placement on every node now leaves n1 out, and a handshake at n1 is steered away from it.
    for d in &owned {
        for i in all {
            let v = c.public_get(i, "/v1/placement", Some(&c.token(d, 0))).json();
            assert!(v["node"] == "n2" || v["node"] == "n3", "{d} placed by {}: {v}", c.nodes[i].name);
        }
    }
    let r = c.dial(n1, "/ws?attempt=1", &Dial::token(&c.token(&owned[0], 0))).refused("a new device at full n1");
    assert_eq!(r.status, 307, "{r:?}");
    assert!(!r.header("location").unwrap_or_default().starts_with(&c.public_url(n1)), "{r:?}");

    // A device reconnecting to n1 (its route, so placement keeps it there) finds n1 full: n1
    // sends it on, adding itself to the fallback list, rather than refusing it with 503.
    let (device, old) = &mut held[0];
    let token = c.token(device, 0);
    let r = c.dial(n1, "/ws?attempt=2&fallback=n3", &Dial::token(&token)).refused("a reconnect at full n1");
    let expected = format!("{}/ws?attempt=2&fallback=n3,n1", c.public_url(n2));
    assert_eq!((r.status, r.header("location")), (307, Some(expected.as_str())), "{r:?}");
    assert_eq!(c.metric_labeled(n1, "gateway_handshakes_total", r#"result="sent_on_full""#), Some(1.0));
    assert_eq!(c.metric_labeled(n1, "gateway_handshakes_total", r#"result="at_capacity""#), None);
    // n2 accepts it (it leaves n1 and n3 out too), and the old connection on n1 is superseded.
    let mut ws = c.dial(n2, "/ws?attempt=2&fallback=n3,n1", &Dial::token(&token)).open("sent on to n2");
    assert_eq!(ws.hello()["node"], "n2");
    let (_, code, _) = old.expect_close(SLACK, "the old connection on n1 superseded");
    assert_eq!(code, 4001);
}
