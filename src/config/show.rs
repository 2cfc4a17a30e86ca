//! The configuration in force as a config file: every key with the value `serve` would use, so
//! `gateway check-config` can print it and an operator can feed it back with `--config`. Secret
//! *values* never live in [`Config`] (only the files they are read from), so nothing here can
//! print one.

use super::{Config, FileConfig, Start};

impl Config {
    /// Every key of the file format, set to the value in force (defaults and derived values
    /// filled in); keys without a value (no name, no advertised address, ...) stay unset.
    pub fn effective(&self) -> FileConfig {
        let (t, d) = (&self.timing, &self.device);
        let (join, standby) = match &self.start {
            Start::Bootstrap => (None, false),
            Start::Standby => (None, true),
            Start::Join(addr) => (Some(addr.clone()), false),
        };
        let mut out = FileConfig {
            log_format: Some(self.log_format),
            name: self.name.clone(),
            listen: Some(self.listen),
            cluster_listen: Some(self.cluster_listen),
            cluster_advertise: self.cluster_advertise.clone(),
            data_dir: Some(self.data_dir.clone()),
            public_url: Some(self.public_url()),
            join,
            standby: Some(standby),
            peers: (!self.peers.is_empty()).then(|| self.peers.clone()),
            peers_wait_ms: Some(self.peers_wait_ms),
            cluster_secret_file: self.cluster_secret_file.clone(),
            device_secret_file: self.device_secret_file.clone(),
            backend_secret_file: self.backend_secret_file.clone(),
            tls_cert_file: None,
            tls_key_file: None,
            cluster_tls_cert_file: None,
            cluster_tls_key_file: None,
            cluster_tls_ca_file: None,
            cluster_tls_client_auth: None,
            lease_ms: Some(t.lease_ms),
            sweep_ms: Some(t.sweep_ms),
            election_timeout_ms: Some(t.election_timeout_ms),
            heartbeat_ms: Some(t.heartbeat_ms),
            max_voters: Some(t.max_voters),
            snapshot_logs: Some(t.snapshot_logs),
            store_cache_mib: Some((self.store_cache_bytes >> 20) as u64),
            cluster_admit_rate: self.cluster_budget.map(|b| b.0),
            cluster_admit_burst: self.cluster_budget.map(|b| b.1),
            propose_timeout_ms: Some(t.propose_timeout_ms),
            ping_ms: Some(d.ping_ms),
            idle_ms: Some(d.idle_ms),
            admit_rate: Some(d.admit_rate),
            admit_burst: Some(d.admit_burst),
            source_rate: Some(d.source_rate),
            source_burst: Some(d.source_burst),
            device_reconnects: Some(d.device_reconnects),
            device_reconnect_window_ms: Some(d.device_reconnect_window_ms),
            handshake_timeout_ms: Some(d.handshake_timeout_ms),
            overload_commit_ms: Some(d.overload_commit_ms),
            header_read_timeout_ms: Some(d.header_read_timeout_ms),
            max_message_bytes: Some(d.max_message_bytes),
            send_queue: Some(d.send_queue),
            send_queue_bytes: Some(d.send_queue_bytes),
            sync_buffer_bytes: Some(d.sync_buffer_bytes),
            max_connections: Some(d.max_connections),
            device_nice: Some(d.device_nice),
            drain_rate: Some(d.drain_rate),
            drain_timeout_ms: Some(d.drain_timeout_ms),
            retain_count: Some(d.retain_count),
            retain_ms: Some(d.retain_ms),
            max_payload_bytes: Some(d.max_payload_bytes),
            idempotency_ms: Some(d.idempotency_ms),
            idempotency_keys: Some(d.idempotency_keys),
            capacity_connections: Some(self.scaling.capacity_connections),
            scale_out_utilization: Some(self.scaling.scale_out_utilization),
            scale_in_utilization: Some(self.scaling.scale_in_utilization),
            scale_in_after_ms: Some(self.scaling.scale_in_after_ms),
            scale_out_accept_share: Some(self.scaling.scale_out_accept_share),
            scale_out_cpu: Some(self.scaling.scale_out_cpu),
            upstream: Some(self.upstream.effective()),
        };
        self.tls.fill(&mut out);
        out
    }

    /// [`Config::effective`] as TOML text.
    pub fn effective_toml(&self) -> String {
        toml::to_string(&self.effective()).unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }
}
