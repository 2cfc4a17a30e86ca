//! `--log-format json`: every line a node writes to stderr is one JSON object with a level and
//! fields; every request carries a request id — the caller's when it is plain, a generated one
//! otherwise — in its log lines and in the `x-request-id` answer; and neither a device token nor
//! the cluster secret (nor a refused request id) ever reaches the log, even at debug level. In the
//! default text format an access line reads plain (`path=/ws status=101`) in its request's span.

mod common;

use std::time::Duration;

use common::ws::Dial;
use common::{http, random_hex, Cluster, SLACK};
use serde_json::Value;

/// The request span's id on a log line (the current span, or any span of the list).
fn request_id(line: &Value) -> Option<&str> {
    let spans = line["spans"].as_array().into_iter().flatten().chain(std::iter::once(&line["span"]));
    spans.filter_map(|s| s["request_id"].as_str()).next()
}

/// The access line of a request: message "request" with these path and status.
fn access<'a>(lines: &'a [Value], path: &str, status: u64) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["fields"]["message"] == "request" && l["fields"]["path"] == path)
        .filter(|l| l["fields"]["status"].as_u64() == Some(status))
        .collect()
}

#[test]
fn json_logs_carry_request_ids_and_never_a_secret() {
    let mut c = Cluster::with_args(&["--log-format", "json"]);
    // Everything the gateway logs at debug: the more lines, the more chances for a leak to show.
    c.env.push(("GATEWAY_LOG".into(), "debug,openraft=info,hyper=info,hyper_util=info,h2=info".into()));
    let (mut c, _) = c.form_nodes(1);
    let addr = c.nodes[0].cluster_addr();
    let bearer = c.bearer();

    // A device: token in the header, then in the query (as browsers send it), then a forged one.
    let token = c.token("json-dev", 0);
    let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&token)).open("header token");
    assert_eq!(ws.hello()["device"], "json-dev");
    let mut ws2 = c.dial(0, &format!("/ws?attempt=2&token={token}"), &Dial::anonymous()).open("query token");
    assert_eq!(ws2.hello()["device"], "json-dev");
    let forged = format!("{}x", &token[..token.len() - 1]);
    let refused = c.dial(0, "/ws?attempt=3", &Dial::token(&forged)).refused("forged token");
    assert_eq!(refused.status, 401);
    let hs_id = refused.header("x-request-id").expect("a refused handshake has a request id").to_string();
    drop((ws, ws2));

    // Admin calls with the cluster secret: a plain caller id is kept and answered back.
    let set = |id: &str| {
        let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json"), ("x-request-id", id)];
        let body = br#"{"rate": 1000, "burst": 2000}"#;
        http::request(addr, "POST", "/cluster/admission", &headers, Some(body), http::REQUEST_TIMEOUT).unwrap()
    };
    let r = set("ops-json-test-1");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-request-id"), Some("ops-json-test-1"));
    // An id that is not plain (here it even quotes the secret) is replaced, never echoed.
    let hostile = format!("<x> {}", c.secret);
    let r = set(&hostile);
    assert_eq!(r.status, 200, "{}", r.text());
    let replaced = r.header("x-request-id").expect("answered with an id").to_string();
    assert!(replaced.len() == 16 && replaced.bytes().all(|b| b.is_ascii_hexdigit()), "{replaced}");
    // A body with a field the endpoint does not take is refused without quoting it (serde's own
    // message would: "unknown field `...`").
    // Every admin endpoint that takes JSON, with a field of the wrong type (serde's message would
    // quote its value: `invalid type: string "..."`) or one it does not take.
    let marker = format!("zz{}", random_hex(8));
    let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
    for (path, bad) in [
        ("/cluster/admission", format!(r#"{{"rate": 1, "burst": 1, "{marker}": 1}}"#)),
        ("/v1/devices/ops-dev/claim", format!(r#"{{"conn": "{marker}", "attempt": 1}}"#)),
        ("/cluster/join", format!(r#"{{"name": 7, "cluster_addr": "{marker}"}}"#)),
        ("/cluster/promote", format!(r#"{{"node": "{marker}"}}"#)),
        ("/cluster/scale-in/lock", format!(r#"{{"node": "{marker}"}}"#)),
        ("/cluster/scale-in/unlock", format!(r#"{{"node": "{marker}"}}"#)),
    ] {
        let r = http::request(addr, "POST", path, &headers, Some(bad.as_bytes()), http::REQUEST_TIMEOUT).unwrap();
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert!(r.text().contains("bad_json") && !r.text().contains(&marker), "{path}: {}", r.text());
    }
    // Data plane: a publish that lands logs at debug level, one refused at info.
    assert_eq!(c.publish(0, "json-dev", &serde_json::json!({"n": 1}), None).0, 200);
    assert_eq!(c.publish(0, "never-connected", &serde_json::json!({"n": 1}), None).0, 404);
    let out = c.cli_auth(&["status", "--cluster", &c.nodes[0].cluster_addr_str()]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    // A wrong secret is refused; it must not be logged either.
    let wrong = random_hex(32);
    let r = http::request(
        addr,
        "GET",
        "/cluster/status",
        &[("Authorization", &format!("Bearer {wrong}"))],
        None,
        http::REQUEST_TIMEOUT,
    )
    .unwrap();
    assert_eq!(r.status, 401);

    // Stop the node (a drain logs too), then read everything it wrote to stderr.
    c.sigterm(0);
    assert!(c.wait_exit(0, Duration::from_secs(30) + SLACK).success());
    let text = std::fs::read_to_string(&c.nodes[0].stderr_path).unwrap();
    let mut lines = Vec::new();
    for line in text.lines() {
        // The harness's own marker before each spawn (and its blank line) is not the node's output.
        if line.is_empty() || line.starts_with("===== harness: spawn") {
            continue;
        }
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object() && v["timestamp"].is_string(), "{line}");
        assert!(v["fields"]["message"].is_string(), "every line has a message: {line}");
        lines.push(v);
    }
    println!("[ops_json_logs] {} JSON lines on stderr", lines.len());
    // The start line is a log line too (a container runtime merges stdout into the same stream).
    let stdout = std::fs::read_to_string(&c.nodes[0].stdout_path).unwrap();
    assert!(stdout.is_empty(), "nothing but JSON lines, on stderr: {stdout}");
    assert!(lines.iter().any(|l| l["fields"]["message"] == "listening" && l["fields"]["node"] == "n1"));
    assert!(lines.len() >= 20, "the node logged: {text}");

    // The admin call's access line carries the caller's id; the replaced one carries the new id.
    let admission = access(&lines, "/cluster/admission", 200);
    let ids: Vec<&str> = admission.iter().filter_map(|l| request_id(l)).collect();
    assert!(ids.contains(&"ops-json-test-1"), "{admission:#?}");
    assert!(ids.contains(&replaced.as_str()), "{admission:#?}");
    assert!(admission.iter().all(|l| l["level"] == "INFO"), "admin calls log at info: {admission:#?}");
    let published = access(&lines, "/v1/devices/json-dev/messages", 200);
    assert!(published.len() == 1 && published[0]["level"] == "DEBUG", "{published:#?}");
    let refused = access(&lines, "/v1/devices/never-connected/messages", 404);
    assert!(refused.len() == 1 && refused[0]["level"] == "INFO", "{refused:#?}");
    // The handshakes' access lines (debug level) carry ids; the refused one is the id it answered.
    let upgraded = access(&lines, "/ws", 101);
    assert_eq!(upgraded.len(), 2, "two upgrades logged");
    assert!(upgraded.iter().all(|l| request_id(l).is_some_and(|id| id.len() == 16)), "{upgraded:#?}");
    let refusals = access(&lines, "/ws", 401);
    assert_eq!(refusals.iter().filter_map(|l| request_id(l)).collect::<Vec<_>>(), [hs_id.as_str()]);
    assert_eq!(access(&lines, "/cluster/status", 401).len(), 1);

    // No secret anywhere: the token (and its signature alone), the cluster secret, the wrong
    // secret, the refused request id.
    let signature = token.rsplit('.').next().unwrap();
    for (what, needle) in [
        ("device token", token.as_str()),
        ("token signature", signature),
        ("forged token", forged.as_str()),
        ("cluster secret", c.secret.as_str()),
        ("wrong secret", wrong.as_str()),
        ("refused body's field", marker.as_str()),
    ] {
        assert!(!text.contains(needle), "the {what} appears in the log");
    }
    assert!(!text.contains("<x>"), "the refused request id appears in the log");
}

/// The default text format: an access line reads `path=/ws status=101` as an operator greps it
/// (no quotes), inside a `request{...}` span whose `request_id` is the caller's plain id, or the
/// generated one the answer's `x-request-id` gave.
#[test]
fn text_access_lines_read_plain_with_the_answered_request_id() {
    let mut c = Cluster::with_args(&[]);
    c.env.push(("GATEWAY_LOG".into(), "debug,openraft=info,hyper=info,hyper_util=info,h2=info".into()));
    let (mut c, _) = c.form_nodes(1);
    let addr = c.nodes[0].cluster_addr();
    let health = |headers: &[(&str, &str)]| {
        let r = http::request(addr, "GET", "/healthz", headers, None, http::REQUEST_TIMEOUT).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        r.header("x-request-id").expect("answered with an id").to_string()
    };
    assert_eq!(health(&[("x-request-id", "ops-text-1")]), "ops-text-1");
    let generated = health(&[]);
    assert!(generated.len() == 16 && generated.bytes().all(|b| b.is_ascii_hexdigit()), "{generated}");
    let token = c.token("text-dev", 0);
    let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&token)).open("handshake");
    assert_eq!(ws.hello()["device"], "text-dev");
    drop(ws);

    c.sigterm(0);
    assert!(c.wait_exit(0, Duration::from_secs(30) + SLACK).success());
    let text = std::fs::read_to_string(&c.nodes[0].stderr_path).unwrap();
    let access = |id: &str| {
        let span = format!("request_id={id}}}");
        text.lines().filter(|l| l.contains(&span) && l.contains(" request method=GET ")).collect::<Vec<_>>()
    };
    for id in ["ops-text-1", generated.as_str()] {
        let lines = access(id);
        assert!(lines.len() == 1 && lines[0].contains(" path=/healthz status=200 "), "{id}: {lines:#?}");
    }
    let upgraded: Vec<&str> = text.lines().filter(|l| l.contains(" path=/ws status=101 ")).collect();
    assert_eq!(upgraded.len(), 1, "{text}");
    assert!(!text.contains("path=\""), "no access line quotes its path");
}
