//! TLS everywhere (issue 14): three members with mutual TLS on the cluster listener (Raft RPC,
//! joins, forwarded writes over https) and wss on the device listener form a cluster, elect, and
//! take a device; the CLI reads status over https with the CA and a client certificate. Refused:
//! a client without a certificate or with one from another CA, a CLI or device that does not
//! trust the cluster's CA, plain text on either listener — and none of that disturbs the node.
//! `gateway probe` and `gateway bench` speak TLS with the same flags.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{tls, wait_until, Cluster, SLACK};

#[test]
fn a_mutual_tls_cluster_forms_serves_wss_and_refuses_strangers() {
    let (c, view) = Cluster::with_tls(&[]).form_nodes(3);
    assert_eq!(view.voters(), 3, "{view:?}");
    let t = c.tls.as_ref().unwrap();

    // Every member advertises wss://, and a device connects over wss with the CA.
    let status = c.status_json(1);
    for m in status["members"].as_array().unwrap() {
        assert!(m["public_url"].as_str().unwrap().starts_with("wss://127.0.0.1:"), "{m}");
    }
    let token = c.token("d1", 0);
    let trust = tls::client(&t.ca.cert_file, None);
    let url = format!("{}/ws?steer=off", c.public_url(2));
    let (mut ws, hello) = tls::dial(&url, &token, Some(&trust)).unwrap_or_else(|e| panic!("wss dial: {e}"));
    assert_eq!(hello.node, "n3", "{:?}", hello.frame);
    tls::answers_ping(&mut ws).unwrap();
    // The claim was forwarded to the leader and committed over https: the route shows on n1.
    let (st, route) = c.route(0, "d1");
    assert_eq!((st, route["node"]["name"].as_str()), (200, Some("n3")), "{route}");

    // The CLI over https with the CA and a client certificate.
    let https = format!("https://{}", c.nodes[0].cluster_addr_str());
    let out = c.cli_auth(&["status", "--cluster", &https, "--json"]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(json["members"].as_array().map(Vec::len), Some(3), "{json}");

    // Refused at the TLS layer: no client certificate; one from another CA; a CLI that does not
    // trust the cluster's CA. Each exits 1 without an answer.
    let other = tls::Ca::new(&c.dir().join("pki-other"), "other");
    let stranger = other.issue("stranger", 9, "stranger.test", None);
    let secret = c.secret_file.display().to_string();
    let (ca, other_ca) = (t.ca.cert_file.display().to_string(), other.cert_file.display().to_string());
    let (cert, key) = (stranger.cert.display().to_string(), stranger.key.display().to_string());
    let failed_before = c.metric_labeled(0, "gateway_tls_handshakes_total", "listener=\"cluster\",result=\"failed\"");
    let base = ["status", "--cluster", &https, "--json", "--cluster-secret-file", &secret];
    for (what, extra) in [
        ("no client certificate", vec!["--ca-file", &ca]),
        (
            "a client certificate from another CA",
            vec!["--ca-file", &ca, "--client-cert-file", &cert, "--client-key-file", &key],
        ),
        ("a CLI trusting another CA", vec!["--ca-file", &other_ca]),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra).collect();
        let out = c.cli(&args);
        assert_eq!(out.code, Some(1), "{what}: {out:#?}");
        assert!(out.stdout.trim().is_empty(), "{what}: no status printed: {out:#?}");
        println!("[tls_cluster] {what}: {}", out.stderr.trim());
    }
    wait_until(SLACK, "the three refused handshakes counted", || {
        let failed = c.metric_labeled(0, "gateway_tls_handshakes_total", "listener=\"cluster\",result=\"failed\"");
        match failed.unwrap_or(0.0) >= failed_before.unwrap_or(0.0) + 3.0 {
            true => Ok(()),
            false => Err((failed_before, failed)),
        }
    });
    let out = c.cli_auth(&["status", "--cluster", &c.nodes[0].cluster_addr_str()]);
    assert_eq!(out.code, Some(0), "host:port with --ca-file dials https: {out:#?}");
    // The health check of the image: `gateway probe` with the node's CA and certificate.
    let (node_cert, node_key) = (t.node.cert.display().to_string(), t.node.key.display().to_string());
    let ready = format!("{https}/readyz");
    let probe = ["probe", &ready, "--ca-file", &ca, "--client-cert-file", &node_cert, "--client-key-file", &node_key];
    let out = c.cli(&probe);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let out = c.cli(&probe[..4]);
    assert_eq!(out.code, Some(1), "a probe without a client certificate is refused: {out:#?}");

    // A device that does not trust the CA, or has no TLS at all, gets no connection.
    let e = tls::dial(&url, &token, Some(&tls::client(&other.cert_file, None))).err().expect("untrusted CA");
    assert!(e.starts_with("tls:"), "{e}");
    let e = tls::dial(&url, &token, None).err().expect("wss without a CA");
    assert!(e.starts_with("tls:"), "{e}");
    let plain = url.replacen("wss://", "ws://", 1);
    assert!(tls::dial(&plain, &token, None).is_err(), "plain ws to a TLS listener must not connect");

    // Plain HTTP on both listeners: no HTTP answer, the connection is closed.
    for addr in [c.nodes[0].cluster_addr(), c.public_addr(0)] {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5) + SLACK)).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        assert!(!got.starts_with(b"HTTP/"), "{addr}: plain HTTP answered: {:?}", String::from_utf8_lossy(&got));
    }
    // None of it disturbed the node or the open device connection.
    tls::answers_ping(&mut ws).unwrap();
    assert_eq!(c.view(0).map(|v| v.members.len()), Ok(3));

    // The load tool over wss (placement redirects carry wss:// URLs) with --ca-file.
    let nodes = (0..3).map(|i| c.public_url(i)).collect::<Vec<_>>().join(",");
    let (dsf, cluster) = (c.device_secret_file.display().to_string(), c.nodes[1].cluster_addr_str());
    let args = ["bench", "steady", "--devices", "20", "--secs", "1", "--nodes", &nodes, "--cluster", &cluster];
    let out = c.cli_auth(&[&args[..], &["--device-secret-file", &dsf, "--json"]].concat());
    assert_eq!(out.code, Some(0), "{out:#?}");
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!((r["connected"].as_u64(), r["errors"].as_u64()), (Some(20), Some(0)), "{r}");
}
