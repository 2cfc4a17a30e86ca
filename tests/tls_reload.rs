//! Certificate reload on the device listener (issue 14): after SIGHUP, and after a file change
//! alone, new handshakes get the new certificate while an open wss connection stays up; a broken
//! replacement is refused (counted, old certificate kept). A TCP connection that never says hello
//! is closed by the handshake deadline, and garbage instead of a hello is counted, not fatal.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{tls, wait_until, Cluster, Start, SLACK};

/// A whole poll period plus slack: a changed file is picked up within it.
const RELOAD_BOUND: Duration = Duration::from_secs(4);

#[test]
fn certificates_reload_without_dropping_connections_and_silent_clients_time_out() {
    let mut c = Cluster::with_args(&[]);
    let ca = tls::Ca::new(&c.dir().join("pki"), "device");
    let first = ca.issue("device", 1, "first.test", None);
    let (cert, key) = (first.cert.display().to_string(), first.key.display().to_string());
    let args = ["--tls-cert-file", &cert, "--tls-key-file", &key, "--header-read-timeout-ms", "1000"];
    c.spawn_with("n1", Start::Bootstrap, &args);
    let addr = c.public_addr(0);
    let trust = tls::client(&ca.cert_file, None);
    let url = format!("wss://{addr}");
    let seen = || tls::peer_certificate(addr, &trust);
    assert!(seen().unwrap() == first.der, "the configured certificate is served");
    let metric = |labels: &str| c.metric_labeled(0, "gateway_tls_reloads_total", labels).unwrap_or(0.0);

    // A client that opens TCP and sends nothing is closed by the deadline (1 s here).
    let mut silent = std::net::TcpStream::connect(addr).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(1) + SLACK)).unwrap();
    let t = Instant::now();
    let n = silent.read(&mut [0u8; 64]);
    let waited = t.elapsed();
    assert!(matches!(n, Ok(0)) || n.is_err() && waited < Duration::from_secs(1) + SLACK, "{n:?} after {waited:?}");
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(1) + SLACK, "closed after {waited:?}");
    let timeouts = "listener=\"public\",result=\"timeout\"";
    wait_until(SLACK, "the timeout counted", || match c.metric_labeled(0, "gateway_tls_handshakes_total", timeouts) {
        Some(v) if v >= 1.0 => Ok(()),
        other => Err(other),
    });
    // Garbage where a ClientHello belongs: closed, counted, nothing else happens.
    let mut junk = std::net::TcpStream::connect(addr).unwrap();
    junk.set_read_timeout(Some(SLACK)).unwrap();
    junk.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5, 0xff, 0xff]).unwrap();
    let mut buf = Vec::new();
    let _ = junk.read_to_end(&mut buf);
    let failed = "listener=\"public\",result=\"failed\"";
    wait_until(SLACK, "the failed hello counted", || {
        match c.metric_labeled(0, "gateway_tls_handshakes_total", failed) {
            Some(v) if v >= 1.0 => Ok(()),
            other => Err(other),
        }
    });

    // An open wss connection, made with the first certificate.
    let token = c.token("d1", 0);
    let (mut ws, _) = tls::dial(&url, &token, Some(&trust)).unwrap();

    // A new certificate and SIGHUP: new handshakes see it. (Same key: one file changes, so the
    // poll can never catch half a pair; the log says which trigger reloaded.)
    let first_key = std::fs::read_to_string(&first.key).unwrap();
    let second = ca.issue("device", 2, "second.test", Some(&first_key));
    c.signal(0, "HUP");
    wait_until(RELOAD_BOUND, "the second certificate after SIGHUP", || match seen() {
        Ok(der) if der == second.der => Ok(()),
        other => Err(other.map(|d| d.len())),
    });
    let log = &c.nodes[0].stderr_path;
    wait_until(SLACK, "a reload by SIGHUP logged and counted", || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let by_hup = text.lines().any(|l| l.contains("tls certificate reloaded") && l.contains("why=\"sighup\""));
        match (by_hup, metric("listener=\"public\",result=\"ok\"")) {
            (true, n) if n >= 1.0 => Ok(()),
            other => Err(other),
        }
    });
    tls::answers_ping(&mut ws).expect("the open connection survives the reload");

    // A changed certificate file alone (same key) is picked up by the poll.
    let third = ca.issue("device", 3, "third.test", Some(&first_key));
    wait_until(RELOAD_BOUND, "the third certificate without a signal", || match seen() {
        Ok(der) if der == third.der => Ok(()),
        other => Err(other.map(|d| d.len())),
    });
    assert_eq!(metric("listener=\"public\",result=\"error\""), 0.0, "no reload has failed yet");

    // A broken replacement: refused and counted, the third certificate stays in use.
    tls::write_atomically(&third.cert, b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n");
    wait_until(RELOAD_BOUND, "the broken file's reload counted as an error", || {
        match metric("listener=\"public\",result=\"error\"") {
            v if v >= 1.0 => Ok(()),
            v => Err(v),
        }
    });
    c.signal(0, "HUP");
    wait_until(SLACK, "the SIGHUP reload of the broken file refused too", || {
        match metric("listener=\"public\",result=\"error\"") {
            v if v >= 2.0 => Ok(()),
            v => Err(v),
        }
    });
    assert!(seen().unwrap() == third.der, "the last good certificate is still served");
    tls::answers_ping(&mut ws).expect("the open connection survives a refused reload");
    let (_ws2, hello) = tls::dial(&url, &c.token("d2", 0), Some(&trust)).unwrap();
    assert_eq!(hello.node, "n1");
}
