//! The cluster listener refuses requests without the right bearer secret with 401
//! `{"error":"unauthorized"}`, and such requests change nothing.

mod common;

use common::http;
use common::{status, Cluster, TIMING};
use std::time::Duration;

#[test]
fn unauthenticated_requests_are_refused_and_change_nothing() {
    let (c, _) = Cluster::form(2, &[]);
    let v = c.claim_accepted(0, "d1", 11, 0, 1, TIMING.settle_bound());
    let d1_version = v["version"].as_u64().unwrap();
    let both = [0, 1];
    let before = c.wait_agreement(&both, TIMING.settle_bound(), "agreement before", |_| true);
    let terms_before: Vec<_> = both.iter().map(|&i| status::term(&c.status_json(i))).collect();
    let routes_before: Vec<_> = both.iter().map(|&i| c.route(i, "d1")).collect();
    assert!(routes_before.iter().all(|(code, _)| *code == 200), "{routes_before:?}");

    let n2_addr = c.nodes[1].cluster_addr_str();
    let n2_id = c.node_id(1);
    // Bodies that would do damage if the secret were not checked first.
    let claim = r#"{"conn":666,"epoch":0,"attempt":999}"#.to_string();
    let leave = format!(r#"{{"node":"{n2_id}"}}"#);
    let join = format!(r#"{{"node":"{n2_addr}","addr":"{n2_addr}"}}"#);
    let vote = r#"{"vote":{"leader_id":{"term":999,"node_id":1},"committed":false},"last_log_id":null}"#.to_string();
    let requests: Vec<(&str, &str, String)> = vec![
        ("POST", "/raft/v2/append", "garbage".into()),
        ("POST", "/raft/v2/vote", vote),
        ("POST", "/raft/v2/snapshot", String::new()),
        ("POST", "/cluster/join", join),
        ("POST", "/cluster/leave", leave),
        ("POST", "/v1/devices/d1/claim", claim),
        ("GET", "/cluster/status", String::new()),
        ("GET", "/v1/devices/d1/route", String::new()),
    ];
    let secret = c.secret.clone();
    let wrong: Vec<Option<String>> = vec![
        None,
        Some("Bearer wrong".into()),
        Some(format!("Bearer {}", &secret[..secret.len() - 1])),
        Some(format!("Bearer {secret}x")),
        Some(secret.clone()),
        Some(format!("Basic {secret}")),
        Some("Bearer ".into()),
    ];
    for i in both {
        for (method, path, body) in &requests {
            for auth in &wrong {
                let mut headers = vec![("Content-Type", "application/json")];
                if let Some(a) = auth {
                    headers.push(("Authorization", a.as_str()));
                }
                let body = (!body.is_empty()).then_some(body.as_bytes());
                let r = http::request(c.nodes[i].cluster_addr(), method, path, &headers, body, http::REQUEST_TIMEOUT)
                    .unwrap_or_else(|e| panic!("{method} {path} on {}: {e:#}", c.nodes[i].name));
                assert_eq!(
                    r.status,
                    401,
                    "{method} {path} on {} with {auth:?}: {} {}",
                    c.nodes[i].name,
                    r.status,
                    r.text()
                );
                assert_eq!(r.json()["error"], "unauthorized", "{method} {path} with {auth:?}: body {}", r.text());
            }
        }
    }

    // Unauthenticated endpoints stay open.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let r = http::request(c.nodes[0].cluster_addr(), "GET", path, &[], None, Duration::from_secs(5)).unwrap();
        assert_ne!(r.status, 401, "{path} must not need the secret");
    }
    let r = http::request(c.nodes[0].cluster_addr(), "GET", "/healthz", &[], None, Duration::from_secs(5)).unwrap();
    assert_eq!(r.status, 200);

    // Nothing changed: same membership, leader, ring, terms and route. (The commit index is not
    // compared: lease renewals advance it all the time; the route and the floor below cover claims.)
    let after = c.wait_agreement(&both, TIMING.settle_bound(), "agreement after", |_| true);
    assert_eq!(after, before, "membership/leader/ring changed");
    let terms_after: Vec<_> = both.iter().map(|&i| status::term(&c.status_json(i))).collect();
    assert_eq!(terms_after, terms_before, "term changed (an unauthenticated vote was honoured?)");
    let routes_after: Vec<_> = both.iter().map(|&i| c.route(i, "d1")).collect();
    assert_eq!(routes_after, routes_before, "route changed");
    // The refused claim at attempt 999 did not move the floor: attempt 2 is still newer.
    let v = c.claim_accepted(1, "d1", 12, 0, 2, TIMING.settle_bound());
    assert_eq!(v["version"].as_u64(), Some(d1_version + 1), "{v}");
}
