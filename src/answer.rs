//! HTTP answers, and the ONE mapping from what a write answered — a typed reply or a
//! [`ProposeError`] — to status, `{"error": "<reason>", ...}` body and `Retry-After`. The device
//! handshake and the cluster listener's API both answer through here, so a refusal reads the
//! same wherever it comes from. Reasons are fixed strings; messages name no client input.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::cluster::ProposeError;
use crate::machine::{ClaimReply, PublishReply, Superseded};

pub type Resp = Response<Full<Bytes>>;

/// A JSON answer.
pub fn json<T: Serialize>(status: StatusCode, body: &T) -> Resp {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .expect("static response parts")
}

/// A refusal: status, reason, extra JSON fields, optional Retry-After seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: StatusCode,
    pub reason: &'static str,
    pub fields: Map<String, Value>,
    pub retry_after: Option<u64>,
}

impl Refusal {
    pub fn new(status: StatusCode, reason: &'static str) -> Refusal {
        Refusal { status, reason, fields: Map::new(), retry_after: None }
    }

    /// `503 <reason>` with `Retry-After: 1`.
    pub fn unavailable(reason: &'static str) -> Refusal {
        Refusal::new(StatusCode::SERVICE_UNAVAILABLE, reason).retry_after(1)
    }

    /// Adds a human-readable `"message"`.
    pub fn message(self, message: impl std::fmt::Display) -> Refusal {
        self.field("message", message.to_string())
    }

    pub fn field(mut self, key: &str, value: impl Into<Value>) -> Refusal {
        self.fields.insert(key.to_string(), value.into());
        self
    }

    pub fn retry_after(mut self, secs: u64) -> Refusal {
        self.retry_after = Some(secs);
        self
    }

    pub fn response(&self) -> Resp {
        let mut body = Map::new();
        body.insert("error".into(), self.reason.into());
        body.extend(self.fields.clone());
        let mut resp = json(self.status, &body);
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(hyper::header::RETRY_AFTER, secs.into());
        }
        resp
    }
}

/// A write that did not get a reply: `503 unavailable` + `Retry-After`, whatever the cause (no
/// leader, timeout, a failed forward, Raft refusing or stopped), so a client moves on or retries.
/// The write may still commit: claims are released by their caller, publishes are retried with
/// the same `Idempotency-Key`. The message is [`ProposeError::summary`], never the detail (a
/// failed forward's text names the leader's internal address, which is not for devices or
/// backends): that goes to the node's log at debug level.
pub fn write_error(e: &ProposeError) -> Refusal {
    tracing::debug!(error = %e, "a write got no reply");
    Refusal::unavailable("unavailable").message(e.summary())
}

/// [`write_error`] with the detail, for the admin endpoints (callers holding the cluster secret).
pub fn operator_write_error(e: &ProposeError) -> Refusal {
    Refusal::unavailable("unavailable").message(e)
}

/// An accepted claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    pub version: u64,
    pub superseded: Option<Superseded>,
    /// The device's stream head, when this node applied the claim itself (`ClaimReply`).
    pub head: Option<u64>,
}

/// A claim's outcome: accepted, or `409 stale_attempt` naming the floor, `503 not_live`, or the
/// write's error.
pub fn claim(outcome: Result<ClaimReply, ProposeError>) -> Result<Accepted, Refusal> {
    match outcome {
        Ok(ClaimReply::Accepted { version, superseded, head }) => Ok(Accepted { version, superseded, head }),
        Ok(ClaimReply::Stale { floor_epoch, floor_attempt }) => {
            Err(Refusal::new(StatusCode::CONFLICT, "stale_attempt")
                .field("floor_epoch", floor_epoch)
                .field("floor_attempt", floor_attempt))
        }
        Ok(ClaimReply::NodeNotLive) => Err(Refusal::unavailable("not_live").message("this node holds no live lease")),
        Ok(ClaimReply::QuotaExhausted { limit }) => Err(Refusal::new(StatusCode::FORBIDDEN, "quota_exhausted")
            .field("limit", limit)
            .message("the device's tenant holds its maximum of concurrent connections")),
        Err(e) => Err(write_error(&e)),
    }
}

/// A publish's outcome: `(seq, duplicate)`, or `404 unknown_device`, or `quota_exhausted` — 429
/// with `Retry-After` until the period ends, 403 when the tenant's allowance is zero (nothing to
/// wait for) — or the write's error.
pub fn publish(outcome: Result<PublishReply, ProposeError>) -> Result<(u64, bool), Refusal> {
    match outcome {
        Ok(PublishReply::Published { seq, duplicate }) => Ok((seq, duplicate)),
        Ok(PublishReply::NoSuchDevice) => Err(Refusal::new(StatusCode::NOT_FOUND, "unknown_device")
            .message("this device has never connected: no stream to publish to")),
        Ok(PublishReply::QuotaExhausted(e)) if e.allowance == 0 => {
            Err(Refusal::new(StatusCode::FORBIDDEN, "quota_exhausted")
                .field("allowance", 0)
                .field("period_end_ms", e.period_end_ms)
                .message("the device's tenant has no publish allowance"))
        }
        Ok(PublishReply::QuotaExhausted(e)) => Err(Refusal::new(StatusCode::TOO_MANY_REQUESTS, "quota_exhausted")
            .field("allowance", e.allowance)
            .field("period_end_ms", e.period_end_ms)
            .field("retry_after_ms", e.retry_after_ms)
            .retry_after(e.retry_after_ms.div_ceil(1000).max(1))
            .message("the device's tenant used its publishes for this period")),
        Err(e) => Err(write_error(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Exhausted;

    fn body(r: &Refusal) -> Value {
        serde_json::to_value(r.fields.clone())
            .map(|mut v| {
                v["error"] = r.reason.into();
                v
            })
            .unwrap()
    }

    #[test]
    fn one_mapping_for_every_claim_outcome() {
        let accepted = ClaimReply::Accepted { version: 3, superseded: None, head: Some(7) };
        assert_eq!(claim(Ok(accepted)), Ok(Accepted { version: 3, superseded: None, head: Some(7) }));
        let stale = claim(Ok(ClaimReply::Stale { floor_epoch: 2, floor_attempt: 9 })).unwrap_err();
        assert_eq!((stale.status, stale.retry_after), (StatusCode::CONFLICT, None));
        assert_eq!(body(&stale), serde_json::json!({"error": "stale_attempt", "floor_epoch": 2, "floor_attempt": 9}));
        let not_live = claim(Ok(ClaimReply::NodeNotLive)).unwrap_err();
        assert_eq!(
            (not_live.status, not_live.reason, not_live.retry_after),
            (StatusCode::SERVICE_UNAVAILABLE, "not_live", Some(1))
        );
        let timeout = claim(Err(ProposeError::Timeout(5000))).unwrap_err();
        assert_eq!(
            (timeout.status, timeout.reason, timeout.retry_after),
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable", Some(1))
        );
        let rejected = claim(Err(ProposeError::Rejected("raft stopped".into()))).unwrap_err();
        assert_eq!(
            (rejected.status, rejected.reason, rejected.retry_after),
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable", Some(1))
        );
    }

    #[test]
    fn a_failed_write_never_names_the_leaders_address() {
        let inner = "request to 10.9.8.7:7001 failed: connection reset";
        for e in [ProposeError::Forward(inner.into()), ProposeError::Rejected(inner.into())] {
            for r in [claim(Err(e.clone())).unwrap_err(), publish(Err(e.clone())).unwrap_err()] {
                let said = r.fields["message"].to_string();
                assert!(!said.contains("10.9.8.7"), "{said}");
                assert!(said.contains("raft") || said.contains("leader"), "{said}");
            }
        }
    }

    #[test]
    fn refusal_response_carries_reason_fields_and_retry_after() {
        let r = Refusal::unavailable("draining").response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[hyper::header::RETRY_AFTER], "1");
        assert_eq!(r.headers()[hyper::header::CONTENT_TYPE], "application/json");
        let unknown = publish(Ok(PublishReply::NoSuchDevice)).unwrap_err();
        assert_eq!((unknown.status, unknown.reason), (StatusCode::NOT_FOUND, "unknown_device"));
        assert_eq!(publish(Ok(PublishReply::Published { seq: 4, duplicate: true })), Ok((4, true)));
    }

    #[test]
    fn quota_refusals_say_whether_waiting_helps() {
        let cap = claim(Ok(ClaimReply::QuotaExhausted { limit: 2 })).unwrap_err();
        assert_eq!((cap.status, cap.reason, cap.retry_after), (StatusCode::FORBIDDEN, "quota_exhausted", None));
        let e = Exhausted { allowance: 5, period_end_ms: 60_000, retry_after_ms: 2_500 };
        let later = publish(Ok(PublishReply::QuotaExhausted(e))).unwrap_err();
        assert_eq!((later.status, later.retry_after), (StatusCode::TOO_MANY_REQUESTS, Some(3)));
        assert_eq!(later.fields["period_end_ms"], 60_000);
        let never = publish(Ok(PublishReply::QuotaExhausted(Exhausted { allowance: 0, ..e }))).unwrap_err();
        assert_eq!((never.status, never.retry_after), (StatusCode::FORBIDDEN, None));
    }
}
