//! `gateway serve --upstream-*` flags: delivery of device `up` frames to the backend. Each also
//! reads `GATEWAY_UPSTREAM_*` and the TOML file's `[upstream]` table (keys without the prefix).

use clap::Args;

use crate::config::upstream::UpstreamFile;

#[derive(Debug, Default, Args)]
pub struct UpstreamArgs {
    /// Backend URL devices' `up` frames are POSTed to (http:// only; repeat the flag or give a
    /// comma list for several: each has its own breaker, and an ejected one is skipped)
    /// [default: none: ups are nacked no_upstream].
    #[arg(long = "upstream-url", id = "upstream_url", env = "GATEWAY_UPSTREAM_URL", value_delimiter = ',')]
    pub urls: Vec<String>,
    /// Total time one up may take, tries and backoffs included [default: 5000].
    #[arg(long = "upstream-deadline-ms", id = "upstream_deadline_ms", env = "GATEWAY_UPSTREAM_DEADLINE_MS")]
    pub deadline_ms: Option<u64>,
    /// Longest single try (less when less of the deadline remains) [default: 2000].
    #[arg(long = "upstream-try-timeout-ms", id = "upstream_try_timeout_ms", env = "GATEWAY_UPSTREAM_TRY_TIMEOUT_MS")]
    pub try_timeout_ms: Option<u64>,
    /// No try starts with less than this left of the deadline [default: 50].
    #[arg(long = "upstream-min-try-ms", id = "upstream_min_try_ms", env = "GATEWAY_UPSTREAM_MIN_TRY_MS")]
    pub min_try_ms: Option<u64>,
    /// Tries per up, the first included (1-10) [default: 3].
    #[arg(long = "upstream-max-tries", id = "upstream_max_tries", env = "GATEWAY_UPSTREAM_MAX_TRIES")]
    pub max_tries: Option<u32>,
    /// Full-jitter backoff base between tries [default: 50].
    #[arg(
        long = "upstream-backoff-base-ms",
        id = "upstream_backoff_base_ms",
        env = "GATEWAY_UPSTREAM_BACKOFF_BASE_MS"
    )]
    pub backoff_base_ms: Option<u64>,
    /// Backoff cap [default: 1000].
    #[arg(long = "upstream-backoff-cap-ms", id = "upstream_backoff_cap_ms", env = "GATEWAY_UPSTREAM_BACKOFF_CAP_MS")]
    pub backoff_cap_ms: Option<u64>,
    /// Retry budget: retries per first try over the window [default: 0.1].
    #[arg(long = "upstream-retry-ratio", id = "upstream_retry_ratio", env = "GATEWAY_UPSTREAM_RETRY_RATIO")]
    pub retry_ratio: Option<f64>,
    /// Retry budget: retries per second allowed on top of the ratio [default: 1].
    #[arg(
        long = "upstream-retry-min-per-s",
        id = "upstream_retry_min_per_s",
        env = "GATEWAY_UPSTREAM_RETRY_MIN_PER_S"
    )]
    pub retry_min_per_s: Option<f64>,
    /// Retry budget: the sliding window [default: 10000].
    #[arg(
        long = "upstream-retry-window-ms",
        id = "upstream_retry_window_ms",
        env = "GATEWAY_UPSTREAM_RETRY_WINDOW_MS"
    )]
    pub retry_window_ms: Option<u64>,
    /// Consecutive failed tries that open an upstream's breaker [default: 5].
    #[arg(
        long = "upstream-breaker-failures",
        id = "upstream_breaker_failures",
        env = "GATEWAY_UPSTREAM_BREAKER_FAILURES"
    )]
    pub breaker_failures: Option<u32>,
    /// How long an open breaker refuses before one probe goes through [default: 5000].
    #[arg(
        long = "upstream-breaker-open-ms",
        id = "upstream_breaker_open_ms",
        env = "GATEWAY_UPSTREAM_BREAKER_OPEN_MS"
    )]
    pub breaker_open_ms: Option<u64>,
    /// Ups in flight on this node (nack overloaded beyond) [default: 1024].
    #[arg(long = "upstream-max-in-flight", id = "upstream_max_in_flight", env = "GATEWAY_UPSTREAM_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Ups in flight per device connection (nack overloaded beyond) [default: 8].
    #[arg(
        long = "upstream-max-in-flight-per-device",
        id = "upstream_max_in_flight_per_device",
        env = "GATEWAY_UPSTREAM_MAX_IN_FLIGHT_PER_DEVICE"
    )]
    pub max_in_flight_per_device: Option<usize>,
    /// Payload bytes in flight on this node (nack overloaded beyond) [default: 16777216].
    #[arg(
        long = "upstream-max-in-flight-bytes",
        id = "upstream_max_in_flight_bytes",
        env = "GATEWAY_UPSTREAM_MAX_IN_FLIGHT_BYTES"
    )]
    pub max_in_flight_bytes: Option<usize>,
    /// Largest up payload, its JSON text (nack payload_too_large beyond) [default: 16384].
    #[arg(
        long = "upstream-max-payload-bytes",
        id = "upstream_max_payload_bytes",
        env = "GATEWAY_UPSTREAM_MAX_PAYLOAD_BYTES"
    )]
    pub max_payload_bytes: Option<usize>,
}

impl UpstreamArgs {
    /// The flag/env layer of the `[upstream]` section.
    pub fn to_layer(&self) -> UpstreamFile {
        UpstreamFile {
            urls: (!self.urls.is_empty()).then(|| self.urls.clone()),
            deadline_ms: self.deadline_ms,
            try_timeout_ms: self.try_timeout_ms,
            min_try_ms: self.min_try_ms,
            max_tries: self.max_tries,
            backoff_base_ms: self.backoff_base_ms,
            backoff_cap_ms: self.backoff_cap_ms,
            retry_ratio: self.retry_ratio,
            retry_min_per_s: self.retry_min_per_s,
            retry_window_ms: self.retry_window_ms,
            breaker_failures: self.breaker_failures,
            breaker_open_ms: self.breaker_open_ms,
            max_in_flight: self.max_in_flight,
            max_in_flight_per_device: self.max_in_flight_per_device,
            max_in_flight_bytes: self.max_in_flight_bytes,
            max_payload_bytes: self.max_payload_bytes,
        }
    }
}
