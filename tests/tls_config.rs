//! TLS settings are checked before anything starts (issue 14): a key without its certificate, a
//! missing or unreadable file, a file that is not PEM, a key that does not match its certificate,
//! cluster TLS without a CA each stop `check-config` and `serve` with exit 78 naming the problem;
//! a good set is printed as file paths only, never key material.

mod common;

use common::{tls, Cluster};

#[test]
fn tls_files_are_checked_before_start_and_never_printed() {
    let c = Cluster::new();
    let ca = tls::Ca::new(&c.dir().join("pki"), "cfg");
    let good = ca.issue("node", 1, "node.test", None);
    let other = ca.issue("other", 2, "other.test", None);
    let junk = c.dir().join("junk.pem");
    std::fs::write(&junk, "this is not PEM\n").unwrap();
    let data = c.dir().join("data").display().to_string();
    let p = |p: &std::path::Path| p.display().to_string();
    let (cert, key, ca_file, other_key, junk) =
        (p(&good.cert), p(&good.key), p(&ca.cert_file), p(&other.key), p(&junk));
    let missing = p(&c.dir().join("missing.pem"));

    for (args, says) in [
        (vec!["--tls-key-file", &key], "tls_key_file needs tls_cert_file"),
        (vec!["--tls-cert-file", &cert], "tls_cert_file needs tls_key_file"),
        (vec!["--tls-cert-file", &missing, "--tls-key-file", &key], "cannot read certificate file"),
        (vec!["--tls-cert-file", &cert, "--tls-key-file", &missing], "cannot read key file"),
        (vec!["--tls-cert-file", &junk, "--tls-key-file", &key], "no CERTIFICATE"),
        (vec!["--tls-cert-file", &cert, "--tls-key-file", &junk], "no PRIVATE KEY"),
        (vec!["--tls-cert-file", &cert, "--tls-key-file", &other_key], "with key"),
        (vec!["--cluster-tls-cert-file", &cert, "--cluster-tls-key-file", &key], "cluster_tls_ca_file"),
        (vec!["--cluster-tls-client-auth"], "cluster_tls_client_auth needs cluster TLS"),
        (
            vec!["--cluster-tls-cert-file", &cert, "--cluster-tls-key-file", &key, "--cluster-tls-ca-file", &junk],
            "CA file",
        ),
    ] {
        for command in ["check-config", "serve"] {
            let mut a = vec![command, "--data-dir", &data];
            a.extend(args.iter().copied());
            let out = c.cli(&a);
            assert_eq!(out.code, Some(78), "{a:?}: {out:#?}");
            assert!(out.stderr.contains(says), "{a:?} must say {says:?}: {}", out.stderr);
        }
    }

    let out = c.cli(&[
        "check-config",
        "--data-dir",
        &data,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--cluster-tls-cert-file",
        &cert,
        "--cluster-tls-key-file",
        &key,
        "--cluster-tls-ca-file",
        &ca_file,
        "--cluster-tls-client-auth",
    ]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    for line in [
        format!("tls_key_file = \"{key}\""),
        format!("cluster_tls_ca_file = \"{ca_file}\""),
        "cluster_tls_client_auth = true".to_string(),
        "public_url = \"wss://127.0.0.1:8080\"".to_string(),
    ] {
        assert!(out.stdout.contains(&line), "{line} in:\n{}", out.stdout);
    }
    assert!(!out.stdout.contains("BEGIN") && !out.stderr.contains("BEGIN"), "no PEM printed: {out:#?}");
    assert!(!std::path::Path::new(&data).exists(), "check-config writes nothing");
}
