//! The `[upstream]` section: where devices' `up` frames go and the bounds on delivering them
//! (deadline, tries, retry budget, breaker, in-flight limits). Leaf: imports nothing of the crate.

use serde::{Deserialize, Serialize};

use super::{is_host_port, ConfigError, MAX_DURATION_MS};

/// `[upstream]` keys in a TOML file, and the flag/env layer (`--upstream-*`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    pub urls: Option<Vec<String>>,
    pub deadline_ms: Option<u64>,
    pub try_timeout_ms: Option<u64>,
    pub min_try_ms: Option<u64>,
    pub max_tries: Option<u32>,
    pub backoff_base_ms: Option<u64>,
    pub backoff_cap_ms: Option<u64>,
    pub retry_ratio: Option<f64>,
    pub retry_min_per_s: Option<f64>,
    pub retry_window_ms: Option<u64>,
    pub breaker_failures: Option<u32>,
    pub breaker_open_ms: Option<u64>,
    pub max_in_flight: Option<usize>,
    pub max_in_flight_per_device: Option<usize>,
    pub max_in_flight_bytes: Option<usize>,
    pub max_payload_bytes: Option<usize>,
}

/// One upstream endpoint: `http://host:port/path` (https is not supported yet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// `host:port` (port 80 when the URL names none): the breaker's and the metrics' name for it.
    pub authority: String,
    /// The path (and query) the POST goes to, at least `/`.
    pub path: String,
}

impl Endpoint {
    /// Parses `http://host[:port][/path]`; the error says what is wrong without quoting secrets
    /// (a URL may carry credentials: only its shape is described).
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        if url.starts_with("https://") {
            return Err("https:// upstreams are not supported yet (TLS is a separate change): use http://".into());
        }
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(format!("an upstream URL must start with http:// ({} characters given)", url.len()));
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(k) => (&rest[..k], rest[k..].to_string()),
            None => (rest, String::new()),
        };
        let path = if path.starts_with('/') { path } else { format!("/{path}") };
        let authority = if authority.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']')) {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        if authority.contains('@') || !is_host_port(&authority) {
            return Err("an upstream URL needs a host[:port] without credentials: http://host:port/path".into());
        }
        if path.chars().any(|c| c.is_ascii_control() || c == ' ') {
            return Err("an upstream URL path must not contain spaces or control characters".into());
        }
        Ok(Endpoint { authority, path })
    }

    pub fn url(&self) -> String {
        format!("http://{}{}", self.authority, self.path)
    }
}

/// Delivery of device `up` frames to the backend (`--upstream-*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamConfig {
    /// Where ups are POSTed; empty: ups are nacked `no_upstream`.
    pub endpoints: Vec<Endpoint>,
    /// Total time one up may take, every try and backoff included.
    pub deadline_ms: u64,
    /// Longest one try may take (less when less of the deadline remains).
    pub try_timeout_ms: u64,
    /// A try starts only when at least this much of the deadline remains.
    pub min_try_ms: u64,
    /// Tries per up, the first included.
    pub max_tries: u32,
    /// Full-jitter backoff between tries: uniform in [0, min(cap, base·2^n)].
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
    /// Retries allowed per first try over the window (0.1: at most 10 % more attempts).
    pub retry_ratio: f64,
    /// Retries per second allowed on top of the ratio (so a quiet node can still retry).
    pub retry_min_per_s: f64,
    /// The sliding window of the retry budget.
    pub retry_window_ms: u64,
    /// Consecutive failed tries that open an endpoint's breaker (eject it).
    pub breaker_failures: u32,
    /// How long an open breaker refuses before it lets one probe through.
    pub breaker_open_ms: u64,
    /// Ups in flight on this node, and per device connection (`overloaded` beyond).
    pub max_in_flight: usize,
    pub max_in_flight_per_device: usize,
    /// Payload bytes in flight on this node (`overloaded` beyond).
    pub max_in_flight_bytes: usize,
    /// Largest `up` payload (its JSON text), `payload_too_large` beyond.
    pub max_payload_bytes: usize,
}

impl UpstreamConfig {
    /// The `[upstream]` table that gives this configuration (`gateway check-config`).
    pub fn effective(&self) -> UpstreamFile {
        UpstreamFile {
            urls: Some(self.endpoints.iter().map(Endpoint::url).collect()),
            deadline_ms: Some(self.deadline_ms),
            try_timeout_ms: Some(self.try_timeout_ms),
            min_try_ms: Some(self.min_try_ms),
            max_tries: Some(self.max_tries),
            backoff_base_ms: Some(self.backoff_base_ms),
            backoff_cap_ms: Some(self.backoff_cap_ms),
            retry_ratio: Some(self.retry_ratio),
            retry_min_per_s: Some(self.retry_min_per_s),
            retry_window_ms: Some(self.retry_window_ms),
            breaker_failures: Some(self.breaker_failures),
            breaker_open_ms: Some(self.breaker_open_ms),
            max_in_flight: Some(self.max_in_flight),
            max_in_flight_per_device: Some(self.max_in_flight_per_device),
            max_in_flight_bytes: Some(self.max_in_flight_bytes),
            max_payload_bytes: Some(self.max_payload_bytes),
        }
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            endpoints: Vec::new(),
            deadline_ms: 5_000,
            try_timeout_ms: 2_000,
            min_try_ms: 50,
            max_tries: 3,
            backoff_base_ms: 50,
            backoff_cap_ms: 1_000,
            retry_ratio: 0.1,
            retry_min_per_s: 1.0,
            retry_window_ms: 10_000,
            breaker_failures: 5,
            breaker_open_ms: 5_000,
            max_in_flight: 1_024,
            max_in_flight_per_device: 8,
            max_in_flight_bytes: 16 << 20,
            max_payload_bytes: 16 << 10,
        }
    }
}

impl UpstreamConfig {
    /// `flags` over `file` over the defaults, validated.
    pub fn merge(flags: Option<UpstreamFile>, file: Option<UpstreamFile>) -> Result<UpstreamConfig, ConfigError> {
        let (f, t, d) = (flags.unwrap_or_default(), file.unwrap_or_default(), UpstreamConfig::default());
        let urls = f.urls.filter(|u| !u.is_empty()).or(t.urls).unwrap_or_default();
        let endpoints = urls
            .iter()
            .flat_map(|u| u.split(','))
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(Endpoint::parse)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ConfigError::Invalid(format!("upstream url: {e}")))?;
        let cfg = UpstreamConfig {
            endpoints,
            deadline_ms: f.deadline_ms.or(t.deadline_ms).unwrap_or(d.deadline_ms),
            try_timeout_ms: f.try_timeout_ms.or(t.try_timeout_ms).unwrap_or(d.try_timeout_ms),
            min_try_ms: f.min_try_ms.or(t.min_try_ms).unwrap_or(d.min_try_ms),
            max_tries: f.max_tries.or(t.max_tries).unwrap_or(d.max_tries),
            backoff_base_ms: f.backoff_base_ms.or(t.backoff_base_ms).unwrap_or(d.backoff_base_ms),
            backoff_cap_ms: f.backoff_cap_ms.or(t.backoff_cap_ms).unwrap_or(d.backoff_cap_ms),
            retry_ratio: f.retry_ratio.or(t.retry_ratio).unwrap_or(d.retry_ratio),
            retry_min_per_s: f.retry_min_per_s.or(t.retry_min_per_s).unwrap_or(d.retry_min_per_s),
            retry_window_ms: f.retry_window_ms.or(t.retry_window_ms).unwrap_or(d.retry_window_ms),
            breaker_failures: f.breaker_failures.or(t.breaker_failures).unwrap_or(d.breaker_failures),
            breaker_open_ms: f.breaker_open_ms.or(t.breaker_open_ms).unwrap_or(d.breaker_open_ms),
            max_in_flight: f.max_in_flight.or(t.max_in_flight).unwrap_or(d.max_in_flight),
            max_in_flight_per_device: f
                .max_in_flight_per_device
                .or(t.max_in_flight_per_device)
                .unwrap_or(d.max_in_flight_per_device),
            max_in_flight_bytes: f.max_in_flight_bytes.or(t.max_in_flight_bytes).unwrap_or(d.max_in_flight_bytes),
            max_payload_bytes: f.max_payload_bytes.or(t.max_payload_bytes).unwrap_or(d.max_payload_bytes),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let durations = [
            ("upstream deadline_ms", self.deadline_ms),
            ("upstream try_timeout_ms", self.try_timeout_ms),
            ("upstream min_try_ms", self.min_try_ms),
            ("upstream backoff_base_ms", self.backoff_base_ms),
            ("upstream backoff_cap_ms", self.backoff_cap_ms),
            ("upstream retry_window_ms", self.retry_window_ms),
            ("upstream breaker_open_ms", self.breaker_open_ms),
        ];
        if let Some((key, v)) = durations.iter().find(|(_, v)| *v > MAX_DURATION_MS || *v == 0) {
            return bad(format!("{key} ({v}) must be in 1..={MAX_DURATION_MS}"));
        }
        if self.min_try_ms > self.try_timeout_ms || self.try_timeout_ms > self.deadline_ms {
            return bad(format!(
                "upstream: need min_try_ms ({}) <= try_timeout_ms ({}) <= deadline_ms ({})",
                self.min_try_ms, self.try_timeout_ms, self.deadline_ms
            ));
        }
        if !(1..=10).contains(&self.max_tries) || self.breaker_failures == 0 {
            return bad(format!(
                "upstream max_tries ({}) must be in 1..=10 and breaker_failures ({}) positive",
                self.max_tries, self.breaker_failures
            ));
        }
        if !(0.0..=1.0).contains(&self.retry_ratio) || !(0.0..=1e6).contains(&self.retry_min_per_s) {
            return bad(format!(
                "upstream retry_ratio ({}) must be in 0..=1 and retry_min_per_s ({}) in 0..=1e6",
                self.retry_ratio, self.retry_min_per_s
            ));
        }
        if self.retry_window_ms < 1000 || self.backoff_base_ms > self.backoff_cap_ms {
            return bad("upstream retry_window_ms must be >= 1000 and backoff_base_ms <= backoff_cap_ms".into());
        }
        let limits = [self.max_in_flight, self.max_in_flight_per_device, self.max_payload_bytes];
        if limits.contains(&0) || self.max_in_flight_per_device > self.max_in_flight {
            return bad("upstream max_in_flight, max_in_flight_per_device (<= max_in_flight) and max_payload_bytes must be positive".into());
        }
        if self.max_payload_bytes > 1 << 20 || self.max_in_flight_bytes < self.max_payload_bytes {
            return bad(format!(
                "upstream max_payload_bytes ({}) must be at most 1 MiB and max_in_flight_bytes ({}) at least that",
                self.max_payload_bytes, self.max_in_flight_bytes
            ));
        }
        if self.max_in_flight_bytes > u32::MAX as usize {
            return bad("upstream max_in_flight_bytes must be below 4 GiB".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_http_only() {
        let e = Endpoint::parse("http://127.0.0.1:9000/ingest?x=1").unwrap();
        assert_eq!((e.authority.as_str(), e.path.as_str()), ("127.0.0.1:9000", "/ingest?x=1"));
        assert_eq!(Endpoint::parse("http://backend").unwrap().url(), "http://backend:80/");
        assert_eq!(Endpoint::parse("http://[::1]:81/up").unwrap().authority, "[::1]:81");
        let https = Endpoint::parse("https://backend/up").unwrap_err();
        assert!(https.contains("https:// upstreams are not supported"), "{https}");
        for bad in ["ftp://x/", "backend:80", "http://", "http://user:pw@backend/", "http://a b/", "http://h:1/a b"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_beat_the_file_and_lists_split_on_commas() {
        let file: UpstreamFile = toml::from_str("urls = [\"http://a:1/x\"]\ndeadline_ms = 9000").unwrap();
        let flags = UpstreamFile { urls: Some(vec!["http://b:2/y,http://c:3/z".into()]), ..Default::default() };
        let cfg = UpstreamConfig::merge(Some(flags), Some(file)).unwrap();
        let names: Vec<_> = cfg.endpoints.iter().map(|e| e.authority.as_str()).collect();
        assert_eq!(names, ["b:2", "c:3"]);
        assert_eq!(cfg.deadline_ms, 9000);
        assert_eq!(UpstreamConfig::merge(None, None).unwrap(), UpstreamConfig::default());
        assert!(toml::from_str::<UpstreamFile>("deadline = 1").is_err(), "unknown keys are refused");
    }

    #[test]
    fn refuses_inconsistent_bounds() {
        for bad in [
            "try_timeout_ms = 6000",
            "min_try_ms = 3000",
            "max_tries = 0",
            "retry_ratio = 1.5",
            "max_in_flight_per_device = 2000",
            "max_payload_bytes = 2000000",
            "max_in_flight_bytes = 100",
            "deadline_ms = 0",
            "urls = [\"https://secure/up\"]",
        ] {
            let file: UpstreamFile = toml::from_str(bad).unwrap();
            assert!(UpstreamConfig::merge(None, Some(file)).is_err(), "{bad} accepted");
        }
    }
}
