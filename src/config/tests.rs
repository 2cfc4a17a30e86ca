use super::*;

#[test]
fn flags_beat_file_beats_defaults() {
    let file: FileConfig = toml::from_str("lease_ms = 12000\nsweep_ms = 500\nname = \"from-file\"").unwrap();
    let flags = FileConfig { lease_ms: Some(9000), ..Default::default() };
    let cfg = Config::merge(flags, file).unwrap();
    assert_eq!(cfg.timing.lease_ms, 9000);
    assert_eq!(cfg.timing.sweep_ms, 500);
    assert_eq!(cfg.timing.election_timeout_ms, Timing::default().election_timeout_ms);
    assert_eq!(cfg.name.as_deref(), Some("from-file"));
    assert_eq!(cfg.start, Start::Bootstrap);
}

#[test]
fn a_voter_elects_no_sooner_than_the_lease_and_a_heartbeat_after_its_leader_died() {
    // With the defaults: openraft's leader lease (2 × 1 s) and a heartbeat (250 ms).
    assert_eq!(Timing::default().soonest_election_ms(), 2_250);
    let fast = Timing { election_timeout_ms: 400, heartbeat_ms: 100, ..Timing::default() };
    assert_eq!(fast.soonest_election_ms(), 900);
}

#[test]
fn a_handshake_waits_out_an_election_by_default() {
    let cfg = Config::merge(FileConfig::default(), FileConfig::default()).unwrap();
    assert_eq!(cfg.device.handshake_timeout_ms, 4 * cfg.timing.election_timeout_ms + 1_000);
    let fast = FileConfig {
        election_timeout_ms: Some(100),
        heartbeat_ms: Some(40),
        lease_ms: Some(1000),
        ..Default::default()
    };
    assert_eq!(Config::merge(fast, FileConfig::default()).unwrap().device.handshake_timeout_ms, 3_000);
    let set = FileConfig { handshake_timeout_ms: Some(700), ..Default::default() };
    assert_eq!(Config::merge(set, FileConfig::default()).unwrap().device.handshake_timeout_ms, 700);
}

#[test]
fn example_config_is_valid() {
    let file: FileConfig = toml::from_str(include_str!("../../deploy/gateway.example.toml")).unwrap();
    let cfg = Config::merge(FileConfig::default(), file).unwrap();
    assert_eq!(cfg.timing, Timing::default(), "the example documents the defaults");
    let defaults = Config::merge(FileConfig::default(), FileConfig::default()).unwrap();
    assert_eq!(cfg.device, defaults.device, "the example documents the defaults");
    assert_eq!(cfg.store_cache_bytes, defaults.store_cache_bytes, "the example documents the defaults");
    assert_eq!(cfg.upstream, defaults.upstream, "the example documents the defaults");
    assert_eq!(cfg.scaling, defaults.scaling, "the example documents the defaults");
}

#[test]
fn refuses_bad_values_and_unknown_keys() {
    assert!(toml::from_str::<FileConfig>("leese_ms = 1").is_err());
    for bad in [
        "max_voters = 4",
        "max_voters = 9",
        "election_timeout_ms = 100\nheartbeat_ms = 100",
        "sweep_ms = 0",
        "lease_ms = 4000\nelection_timeout_ms = 1000",
        "max_payload_bytes = 1048577",
        "election_timeout_ms = 2305843009213693952\nlease_ms = 9223372036854775807",
        "election_timeout_ms = 4611686018427387904",
        "retain_ms = 1099511627777",
        "max_payload_bytes = 1048576\nsend_queue_bytes = 1048576",
        "send_queue_bytes = 1000",
        "device_nice = 20",
        "device_nice = -1",
        "max_payload_bytes = 1",
        "cluster_listen = \"0.0.0.0:7070\"",
        "listen = \"0.0.0.0:8080\"",
        "cluster_advertise = \"0.0.0.0:7070\"",
        "cluster_advertise = \"gw-1\"",
        "scale_in_utilization = 0.8",
        "scale_out_utilization = 0.2",
        "scale_out_accept_share = 0",
        "cluster_advertise = \"gw_1:7070\"",
        "cluster_advertise = \"gw-1:0\"",
        "cluster_advertise = \"http://gw-1:7070\"",
        "cluster_advertise = \"-gw:7070\"",
        "public_url = \"gw-1:8080\"",
        "public_url = \"ftp://gw-1:8080\"",
        "public_url = \"ws://\"",
        "public_url = \"ws://gw 1:8080\"",
    ] {
        let file: FileConfig = toml::from_str(bad).unwrap();
        assert!(Config::merge(FileConfig::default(), file).is_err(), "{bad} accepted");
    }
    let max = FileConfig { max_payload_bytes: Some(MAX_PAYLOAD_LIMIT), ..Default::default() };
    let cfg = Config::merge(max, FileConfig::default()).unwrap();
    assert_eq!(cfg.device.send_queue_bytes, 2 * MAX_PAYLOAD_LIMIT, "the queue follows the payload limit");
    let both = FileConfig { join: Some("x:1".into()), standby: Some(true), ..Default::default() };
    assert!(Config::merge(both, FileConfig::default()).is_err());
}

#[test]
fn a_wildcard_listener_needs_an_advertised_address() {
    let container = "listen = \"0.0.0.0:8080\"\npublic_url = \"ws://gw-1.example.net:8080\"\n\
                     cluster_listen = \"0.0.0.0:7070\"\ncluster_advertise = \"gateway-0.gateway.ns.svc:7070\"";
    let cfg = Config::merge(FileConfig::default(), toml::from_str(container).unwrap()).unwrap();
    assert_eq!(cfg.cluster_addr(), "gateway-0.gateway.ns.svc:7070");
    let default = Config::merge(FileConfig::default(), FileConfig::default()).unwrap();
    assert_eq!(default.cluster_addr(), "127.0.0.1:7070", "without it, the listen address");
    for ok in ["10.0.0.7:7070", "[fd00::7]:7070", "localhost:1", "n1:65535"] {
        assert!(is_host_port(ok), "{ok}");
    }
    for ok in ["ws://gw-1:8080", "wss://gw.example.net/devices", "https://[fd00::7]:443", "ws://127.0.0.1:8001"] {
        assert!(is_public_url(ok), "{ok}");
    }
}

#[test]
fn the_effective_configuration_reads_back_as_the_same_configuration() {
    let file: FileConfig = toml::from_str(
        "log_format = \"json\"\nname = \"n7\"\nlease_ms = 12000\njoin = \"n1:7070\"\nadmit_rate = 2.5\n\
         store_cache_mib = 32\ncluster_admit_rate = 40.5\ncluster_admit_burst = 7\nsync_buffer_bytes = 1048576\n\
         cluster_listen = \"0.0.0.0:7070\"\ncluster_advertise = \"n7:7070\"",
    )
    .unwrap();
    let cfg = Config::merge(FileConfig::default(), file).unwrap();
    assert_eq!(cfg.log_format, LogFormat::Json);
    let text = cfg.effective_toml();
    let again = Config::merge(FileConfig::default(), toml::from_str(&text).unwrap()).unwrap();
    assert_eq!((again.timing, again.device), (cfg.timing.clone(), cfg.device.clone()), "{text}");
    assert_eq!((again.start, again.log_format, again.name), (cfg.start, cfg.log_format, cfg.name), "{text}");
    assert_eq!((again.store_cache_bytes, again.cluster_budget), (cfg.store_cache_bytes, cfg.cluster_budget), "{text}");
    assert_eq!(again.upstream, cfg.upstream, "{text}");
    assert!(text.contains("lease_ms = 12000") && text.contains("handshake_timeout_ms = 5000"), "{text}");
    assert!(toml::from_str::<FileConfig>("log_format = \"xml\"").is_err());
}

#[test]
fn a_cluster_budget_needs_both_halves() {
    let cfg = |rate, burst| {
        let f = FileConfig { cluster_admit_rate: rate, cluster_admit_burst: burst, ..Default::default() };
        Config::merge(f, FileConfig::default())
    };
    assert_eq!(cfg(None, None).unwrap().cluster_budget, None);
    assert_eq!(cfg(Some(50.0), Some(10)).unwrap().cluster_budget, Some((50.0, 10)));
    for (rate, burst) in [(Some(50.0), None), (None, Some(10)), (Some(0.0), Some(10)), (Some(50.0), Some(0))] {
        let err = cfg(rate, burst).unwrap_err().to_string();
        assert!(err.contains("cluster_admit_rate"), "{err}");
    }
}

#[test]
fn the_store_cache_is_bounded_and_in_bytes() {
    let cfg = Config::merge(FileConfig::default(), FileConfig::default()).unwrap();
    assert_eq!(cfg.store_cache_bytes, (DEFAULT_STORE_CACHE_MIB << 20) as usize);
    let set = FileConfig { store_cache_mib: Some(16), ..Default::default() };
    assert_eq!(Config::merge(set, FileConfig::default()).unwrap().store_cache_bytes, 16 << 20);
    for bad in [0, (1 << 20) + 1] {
        let f = FileConfig { store_cache_mib: Some(bad), ..Default::default() };
        let err = Config::merge(f, FileConfig::default()).unwrap_err().to_string();
        assert!(err.contains("store_cache_mib"), "{err}");
    }
}

#[test]
fn tls_keys_come_in_complete_sets_and_switch_the_public_url_to_wss() {
    let parse = |text: &str| Config::merge(FileConfig::default(), toml::from_str(text).unwrap());
    let cfg = parse("tls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"").unwrap();
    assert_eq!(cfg.public_url(), "wss://127.0.0.1:8080");
    assert!(cfg.tls.cluster.is_none());
    let both = "cluster_tls_cert_file = \"n.pem\"\ncluster_tls_key_file = \"nk.pem\"\ncluster_tls_ca_file = \"ca.pem\"";
    let cfg = parse(&format!("{both}\ncluster_tls_client_auth = true")).unwrap();
    assert_eq!(cfg.public_url(), "ws://127.0.0.1:8080");
    let cluster = cfg.tls.cluster.clone().unwrap();
    assert!(cluster.client_auth && cluster.ca.to_str() == Some("ca.pem"));
    let again = Config::merge(FileConfig::default(), toml::from_str(&cfg.effective_toml()).unwrap()).unwrap();
    assert_eq!(again.tls, cfg.tls);
    for (bad, says) in [
        ("tls_cert_file = \"c.pem\"", "tls_key_file"),
        ("tls_key_file = \"k.pem\"", "tls_cert_file"),
        ("cluster_tls_cert_file = \"n.pem\"\ncluster_tls_key_file = \"nk.pem\"", "cluster_tls_ca_file"),
        ("cluster_tls_key_file = \"nk.pem\"\ncluster_tls_ca_file = \"ca.pem\"", "cluster_tls_cert_file"),
        ("cluster_tls_client_auth = true", "cluster_tls_client_auth"),
    ] {
        let e = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} must be refused")).to_string();
        assert!(e.contains(says), "{bad:?}: {e}");
    }
}

#[test]
fn peers_guard_a_bootstrap_only() {
    let file: FileConfig = toml::from_str("peers = [\"gateway-1.peers:7070\", \"10.0.0.3:7070\"]").unwrap();
    let cfg = Config::merge(FileConfig::default(), file).unwrap();
    assert_eq!(cfg.peers, ["gateway-1.peers:7070", "10.0.0.3:7070"]);
    assert_eq!(cfg.peers_wait_ms, DEFAULT_PEERS_WAIT_MS);
    assert_eq!(Config::merge(cfg.effective(), FileConfig::default()).unwrap().peers, cfg.peers);
    let with_join = FileConfig { peers: Some(vec!["a:1".into()]), join: Some("b:1".into()), ..Default::default() };
    assert!(Config::merge(with_join, FileConfig::default()).is_err(), "peers and join exclude each other");
    let bad = FileConfig { peers: Some(vec!["no-port".into()]), ..Default::default() };
    assert!(Config::merge(bad, FileConfig::default()).is_err(), "a peer is a host:port");
}
