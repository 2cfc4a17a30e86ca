//! The rules a merged configuration must satisfy; each refusal names the key it is about.

use std::net::SocketAddr;

use super::{Config, ConfigError, MAX_DURATION_MS, MAX_PAYLOAD_LIMIT, SYNC_PAGE_BYTES};

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let (t, d) = (&self.timing, &self.device);
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let sc = &self.scaling;
        if !(sc.scale_in_utilization > 0.0
            && sc.scale_in_utilization < sc.scale_out_utilization
            && sc.scale_out_utilization <= 10.0)
        {
            return bad(format!(
                "scale_in_utilization ({}) and scale_out_utilization ({}): need 0 < in < out <= 10",
                sc.scale_in_utilization, sc.scale_out_utilization
            ));
        }
        if !(sc.scale_out_cpu > sc.scale_in_utilization && sc.scale_out_cpu <= 1.0) {
            return bad(format!("scale_out_cpu ({}) must be in (scale_in_utilization, 1]", sc.scale_out_cpu));
        }
        if !(sc.scale_out_accept_share > 0.0 && sc.scale_out_accept_share <= 1.0) {
            return bad(format!("scale_out_accept_share ({}) must be in (0, 1]", sc.scale_out_accept_share));
        }
        if sc.scale_in_after_ms > super::MAX_DURATION_MS {
            return bad(format!("scale_in_after_ms ({}) is too long", sc.scale_in_after_ms));
        }
        if let Some(name) = self.name.as_deref().filter(|n| !is_node_name(n)) {
            return bad(format!("name {name:?}: use 1-64 characters of [A-Za-z0-9._-]"));
        }
        if let Some(url) = self.public_url.as_deref().filter(|u| !is_public_url(u)) {
            return bad(format!(
                "public_url: expected ws://, wss://, http:// or https:// and a host, at most {MAX_PUBLIC_URL} printable \
                 ASCII characters, got {} characters that are not",
                url.len()
            ));
        }
        match &self.cluster_advertise {
            Some(addr) if !is_host_port(addr) => {
                return bad(format!(
                    "cluster_advertise: expected host:port (a DNS name, an IPv4 address or a [IPv6] address, port \
                     1-65535), got {} characters that are not",
                    addr.len()
                ))
            }
            None if self.cluster_listen.ip().is_unspecified() => {
                return bad(format!(
                    "cluster_listen {} is a wildcard address other members cannot dial: set cluster_advertise \
                     (--cluster-advertise host:port)",
                    self.cluster_listen
                ))
            }
            _ => {}
        }
        for peer in &self.peers {
            if !is_cluster_addr(peer) {
                return bad(format!("peers: expected host:port cluster addresses, got {peer:?}"));
            }
        }
        if self.peers_wait_ms > MAX_DURATION_MS {
            return bad(format!("peers_wait_ms ({}) is too long", self.peers_wait_ms));
        }
        if self.public_url.is_none() && self.listen.ip().is_unspecified() {
            return bad(format!(
                "listen {} is a wildcard address devices cannot be sent to: set public_url (--public-url ws://host:port)",
                self.listen
            ));
        }
        let durations = [
            ("lease_ms", t.lease_ms),
            ("sweep_ms", t.sweep_ms),
            ("election_timeout_ms", t.election_timeout_ms),
            ("heartbeat_ms", t.heartbeat_ms),
            ("propose_timeout_ms", t.propose_timeout_ms),
            ("ping_ms", d.ping_ms),
            ("idle_ms", d.idle_ms),
            ("handshake_timeout_ms", d.handshake_timeout_ms),
            ("overload_commit_ms", d.overload_commit_ms),
            ("header_read_timeout_ms", d.header_read_timeout_ms),
            ("drain_timeout_ms", d.drain_timeout_ms),
            ("retain_ms", d.retain_ms),
            ("idempotency_ms", d.idempotency_ms),
            ("device_reconnect_window_ms", d.device_reconnect_window_ms),
        ];
        // Time arithmetic (deadlines, lease ends, the rules below) then never overflows.
        if let Some((key, v)) = durations.iter().find(|(_, v)| *v > MAX_DURATION_MS) {
            return bad(format!("{key} ({v}) must be at most {MAX_DURATION_MS} (2^40 ms, about 34 years)"));
        }
        if t.max_voters == 0 || t.max_voters > 7 || t.max_voters % 2 == 0 {
            return bad(format!("max_voters = {}: must be odd, 1 to 7", t.max_voters));
        }
        if t.heartbeat_ms == 0 || t.election_timeout_ms < 2 * t.heartbeat_ms {
            return bad(format!(
                "election_timeout_ms ({}) must be at least twice heartbeat_ms ({})",
                t.election_timeout_ms, t.heartbeat_ms
            ));
        }
        if t.lease_ms < 3 * t.heartbeat_ms || t.lease_ms < 300 {
            return bad(format!("lease_ms ({}) must be >= 300 and >= 3 x heartbeat_ms", t.lease_ms));
        }
        // A node fences itself when no renewal committed for 4/5 of a lease; renewals go out every
        // lease/5 and an openraft election can take up to ~4 election timeouts (followers
        // honour the old leader's lease for 2 of them): 0.6 x 8 = 4.8 election timeouts of room.
        // A shorter lease fences every node during an ordinary failover.
        if t.lease_ms < 8 * t.election_timeout_ms {
            return bad(format!(
                "lease_ms ({}) must be at least 8 x election_timeout_ms ({}), or an election fences every node",
                t.lease_ms, t.election_timeout_ms
            ));
        }
        if t.sweep_ms == 0 || t.sweep_ms > t.lease_ms {
            return bad(format!("sweep_ms ({}) must be in 1..=lease_ms", t.sweep_ms));
        }
        if !(0..=19).contains(&d.device_nice) {
            return bad(format!(
                "device_nice ({}) must be 0 (off) to 19: it lowers the device side's priority below the cluster side's",
                d.device_nice
            ));
        }
        if d.ping_ms == 0 || d.idle_ms <= d.ping_ms {
            return bad(format!("idle_ms ({}) must be greater than ping_ms ({})", d.idle_ms, d.ping_ms));
        }
        if !(0.01..=1e9).contains(&d.admit_rate) || d.admit_burst == 0 {
            return bad(format!(
                "admit_rate ({}) must be in 0.01..=1e9 and admit_burst ({}) positive",
                d.admit_rate, d.admit_burst
            ));
        }
        if d.source_rate != 0.0 && !((0.01..=1e9).contains(&d.source_rate) && d.source_burst > 0) {
            return bad(format!(
                "source_rate ({}) must be 0 (off) or in 0.01..=1e9, with source_burst ({}) positive",
                d.source_rate, d.source_burst
            ));
        }
        if d.device_reconnects > 0 && d.device_reconnect_window_ms < 1000 {
            return bad(format!("device_reconnect_window_ms ({}) must be at least 1000", d.device_reconnect_window_ms));
        }
        if !(0.01..=1e9).contains(&d.drain_rate) {
            return bad(format!("drain_rate ({}) must be in 0.01..=1e9", d.drain_rate));
        }
        if d.retain_count == 0 || d.retain_ms == 0 {
            return bad("retain_count and retain_ms must be positive".into());
        }
        if !(2..=MAX_PAYLOAD_LIMIT).contains(&d.max_payload_bytes) {
            return bad(format!(
                "max_payload_bytes ({}) must be in 2..={MAX_PAYLOAD_LIMIT}: a message is a Raft log entry every node \
                 writes and fsyncs, and lease renewals queue behind it; keep larger objects elsewhere and publish a reference",
                d.max_payload_bytes
            ));
        }
        if d.handshake_timeout_ms == 0 || d.header_read_timeout_ms == 0 || d.send_queue == 0 {
            return bad("handshake_timeout_ms, header_read_timeout_ms and send_queue must be positive".into());
        }
        if !(SYNC_PAGE_BYTES..=1 << 40).contains(&d.sync_buffer_bytes) {
            return bad(format!(
                "sync_buffer_bytes ({}) must be in {SYNC_PAGE_BYTES}..=1099511627776 (one sync page at least)",
                d.sync_buffer_bytes
            ));
        }
        if d.send_queue_bytes < 2 * d.max_payload_bytes {
            return bad(format!(
                "send_queue_bytes ({}) must be at least twice max_payload_bytes ({})",
                d.send_queue_bytes, d.max_payload_bytes
            ));
        }
        if !(128..=16 << 20).contains(&d.max_message_bytes) {
            return bad(format!("max_message_bytes ({}) must be in 128..=16777216", d.max_message_bytes));
        }
        if t.snapshot_logs == 0 || t.propose_timeout_ms == 0 {
            return bad("snapshot_logs and propose_timeout_ms must be positive".into());
        }
        Ok(())
    }
}

/// A node name: 1-64 characters of `[A-Za-z0-9._-]`.
pub fn is_node_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// The longest `public_url`.
pub const MAX_PUBLIC_URL: usize = 512;

/// A URL devices are sent to (it goes into redirects' `Location`): a ws, wss, http or https URL
/// with a host, of at most [`MAX_PUBLIC_URL`] printable ASCII characters.
pub fn is_public_url(s: &str) -> bool {
    let rest = ["ws://", "wss://", "http://", "https://"].iter().find_map(|scheme| s.strip_prefix(scheme));
    s.len() <= MAX_PUBLIC_URL
        && s.bytes().all(|b| (0x21..=0x7e).contains(&b))
        && rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/'))
}

/// A member's cluster address: `host:port`, or `http[s]://host:port`.
pub fn is_cluster_addr(s: &str) -> bool {
    is_host_port(s.strip_prefix("https://").or_else(|| s.strip_prefix("http://")).unwrap_or(s))
}

/// `host:port` a peer can dial: a DNS name (letters, digits, `-`, `.`), an IPv4 address or a
/// bracketed IPv6 address, and a port in 1..=65535.
pub fn is_host_port(s: &str) -> bool {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return addr.port() != 0 && !addr.ip().is_unspecified();
    }
    let Some((host, port)) = s.rsplit_once(':') else { return false };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    port_ok && host_ok
}
