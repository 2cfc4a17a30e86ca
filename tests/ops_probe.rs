//! `gateway probe URL` through the real binary, as a container health check runs it: exit 0 on a
//! 2xx (a ready node's `/readyz`), 1 on anything else — another status, a closed port, a server
//! that never answers (within `--timeout-ms`) — and 64 for a URL it cannot fetch (not http://).
//! Also: a SIGHUP (`systemctl reload`) to a node without TLS leaves it serving.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, wait_until, Cluster};

#[test]
fn probe_exits_zero_only_on_a_2xx_answer() {
    let (mut c, _) = Cluster::form(1, &[]);
    let cluster = c.nodes[0].cluster_addr_str();

    let out = c.cli(&["probe", &format!("http://{cluster}/readyz")]);
    assert_eq!(out.code, Some(0), "a ready node: {out:#?}");
    assert!(out.stdout.contains("200"), "{out:#?}");
    let out = c.cli(&["probe", &format!("http://{cluster}/healthz"), "--timeout-ms", "5000"]);
    assert_eq!(out.code, Some(0), "{out:#?}");

    // Answers that are not 2xx: 401 (the status path needs the secret), 404.
    for path in ["/cluster/status", "/no-such-path"] {
        let out = c.cli(&["probe", &format!("http://{cluster}{path}")]);
        assert_eq!(out.code, Some(1), "{path}: {out:#?}");
        assert!(out.stderr.contains("answered 40"), "{path}: {out:#?}");
    }

    // Nobody listening.
    let closed = free_port();
    let out = c.cli(&["probe", &format!("http://127.0.0.1:{closed}/readyz")]);
    assert_eq!(out.code, Some(1), "a closed port: {out:#?}");

    // A server that accepts (the kernel's backlog does) but never answers: the deadline holds.
    let silent = common::listen_local();
    let url = format!("http://{}/readyz", silent.local_addr().unwrap());
    let started = Instant::now();
    let out = c.cli(&["probe", &url, "--timeout-ms", "300"]);
    assert_eq!(out.code, Some(1), "a silent server: {out:#?}");
    assert!(out.stderr.contains("no whole answer within"), "{out:#?}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());

    // SIGHUP (`systemctl reload`) on a node without TLS is logged and ignored: it keeps serving.
    c.signal(0, "HUP");
    let log = c.nodes[0].stderr_path.clone();
    wait_until(Duration::from_secs(5), "the SIGHUP logged", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("sighup: no TLS certificates to reload").then_some(()).ok_or(())
    });
    assert!(c.is_running(0), "SIGHUP stopped the node");
    let out = c.cli(&["probe", &format!("http://{cluster}/readyz")]);
    assert_eq!(out.code, Some(0), "still ready after SIGHUP: {out:#?}");

    // Not something it fetches: usage errors.
    for url in [format!("https://{cluster}/readyz"), "readyz".to_string()] {
        let out = c.cli(&["probe", &url]);
        assert_eq!(out.code, Some(64), "{url}: {out:#?}");
    }
}
