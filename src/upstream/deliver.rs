//! One up's delivery: tries within one total deadline, each bounded by what remains of it;
//! retries only after connect errors, timeouts and 502/503/504, never after a 4xx, at most
//! `max_tries`, with full-jitter backoff, each retry taken from the retry budget first.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{header, Request, StatusCode};
use rand::Rng;
use tokio::time::{timeout, Instant};

use super::{Outcome, Upstream};
use crate::metrics::ResultLabel;

/// Most of an upstream's answer body read (and dropped) so that its connection can be reused.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// How one try ended.
#[derive(Debug)]
enum Try {
    Answered { status: StatusCode, retry_after_ms: Option<u64> },
    Connect,
    Timeout,
    Transport,
}

impl Try {
    fn label(&self) -> &'static str {
        match self {
            Try::Answered { status, .. } if status.is_success() => "ok",
            Try::Answered { status, .. } if status.is_client_error() => "client_error",
            Try::Answered { status, .. } if retryable_status(*status) => "unavailable",
            Try::Answered { .. } => "server_error",
            Try::Connect => "connect_error",
            Try::Timeout => "timeout",
            Try::Transport => "transport_error",
        }
    }
}

fn retryable_status(s: StatusCode) -> bool {
    matches!(s.as_u16(), 502..=504)
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Delivers `body` with `Idempotency-Key: key` and says how it ended.
pub(super) async fn deliver(up: &Upstream, key: &str, body: Bytes) -> Outcome {
    let cfg = &up.cfg;
    let deadline = Instant::now() + ms(cfg.deadline_ms);
    let later = Some(cfg.backoff_cap_ms);
    let mut tries = 0u32;
    loop {
        // A retry costs budget; refused, the up ends with what the last try said.
        if tries > 0 {
            let granted = up.budget.lock().expect("budget lock").withdraw(up.now_ms());
            if !granted {
                up.metrics.upstream_budget_exhausted.inc();
                return Outcome::nack("retry_budget_exhausted", later);
            }
        }
        let (i, probe) = match up.pick() {
            Ok(p) => p,
            Err(wait_ms) => return Outcome::nack("circuit_open", Some(wait_ms.max(1))),
        };
        if tries == 0 {
            up.budget.lock().expect("budget lock").deposit(up.now_ms());
        } else {
            up.metrics.upstream_retries.inc();
        }
        tries += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let limit = remaining.min(ms(cfg.try_timeout_ms));
        let result = attempt(up, i, key, body.clone(), limit).await;
        up.metrics.upstream_attempts.get_or_create(&ResultLabel { result: result.label() }).inc();
        let failed = !matches!(result, Try::Answered { status, .. } if !status.is_server_error());
        up.report(i, probe, !failed);
        if failed {
            tracing::debug!(upstream = %up.targets[i].name, try_n = tries, result = result.label(), "upstream try failed");
        }
        let gave_up = match result {
            Try::Answered { status, .. } if status.is_success() => return Outcome::Ack,
            Try::Answered { status, retry_after_ms } if status.is_client_error() => {
                // 429 says when; any other 4xx will not change on a retry.
                let retry =
                    (status == StatusCode::TOO_MANY_REQUESTS).then(|| retry_after_ms.unwrap_or(cfg.backoff_cap_ms));
                return Outcome::Nack { reason: "rejected", retry_after_ms: retry, status: Some(status.as_u16()) };
            }
            Try::Answered { status, .. } if !retryable_status(status) => {
                return Outcome::Nack {
                    reason: "upstream_error",
                    retry_after_ms: later,
                    status: Some(status.as_u16()),
                };
            }
            Try::Answered { status, .. } => {
                Outcome::Nack { reason: "upstream_unavailable", retry_after_ms: later, status: Some(status.as_u16()) }
            }
            Try::Timeout if Instant::now() + ms(cfg.min_try_ms) >= deadline => {
                up.metrics.upstream_deadline_exceeded.inc();
                return Outcome::nack("deadline_exceeded", later);
            }
            Try::Timeout => Outcome::nack("upstream_timeout", later),
            Try::Connect | Try::Transport => Outcome::nack("upstream_unavailable", later),
        };
        if tries >= cfg.max_tries {
            return gave_up;
        }
        // Full jitter; no retry starts unless the deadline still covers the backoff and a
        // minimal try after it.
        let ceiling = cfg.backoff_base_ms.saturating_mul(1 << (tries - 1).min(20)).min(cfg.backoff_cap_ms);
        let backoff = ms(rand::thread_rng().gen_range(0..=ceiling));
        if Instant::now() + backoff + ms(cfg.min_try_ms) > deadline {
            if matches!(gave_up, Outcome::Nack { reason: "upstream_timeout", .. }) {
                up.metrics.upstream_deadline_exceeded.inc();
                return Outcome::nack("deadline_exceeded", later);
            }
            return gave_up;
        }
        tokio::time::sleep(backoff).await;
    }
}

/// One POST to endpoint `i`, all of it (connect, answer, body) within `limit`.
async fn attempt(up: &Upstream, i: usize, key: &str, body: Bytes, limit: Duration) -> Try {
    let req = Request::post(up.targets[i].uri.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(Full::new(body));
    let Ok(req) = req else { return Try::Transport };
    let call = async {
        let resp = match up.client.request(req).await {
            Ok(r) => r,
            Err(e) if e.is_connect() => return Try::Connect,
            Err(_) => return Try::Transport,
        };
        let status = resp.status();
        let retry_after_ms = resp
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| s.saturating_mul(1000));
        // Read the answer so that the connection goes back to the pool; a huge one is not kept.
        match Limited::new(resp.into_body(), MAX_ANSWER_BYTES).collect().await {
            Ok(_) => Try::Answered { status, retry_after_ms },
            Err(_) if status.is_success() => Try::Answered { status, retry_after_ms },
            Err(_) => Try::Transport,
        }
    };
    timeout(limit, call).await.unwrap_or(Try::Timeout)
}
