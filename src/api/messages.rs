//! `POST /v1/devices/{id}/messages`: a backend publishes a JSON payload to a device's stream
//! through Raft (batched like claims); the reply carries its `seq`. An `Idempotency-Key` makes a
//! retry return the same `seq` without a second delivery.

use std::sync::Arc;

use hyper::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{bad_json, error, Api};
use crate::answer::{self, Refusal, Resp};
use crate::machine::Publish;
use crate::metrics::ResultLabel;
use crate::token::valid_device_id;

/// Publishes a node holds at once when each is `max_payload_bytes` long (more when shorter).
pub const PUBLISHES_IN_FLIGHT: usize = 64;

/// What a publish costs besides its body: the request, the command, its reply.
pub const PUBLISH_OVERHEAD: usize = 1024;

/// The bytes of publish bodies a node holds at once, from the moment it starts reading one until
/// it answers: `PUBLISHES_IN_FLIGHT × (max_payload_bytes + PUBLISH_OVERHEAD)` (4.06 MiB by
/// default). A publish is charged its `Content-Length` (or the payload limit, sent chunked) plus
/// the overhead before its body is read; when the budget is spent it is refused at once with
/// `503 busy` and `Retry-After`, so backends that send faster than the log commits cost the node a
/// bounded number of bytes, not a queue of bodies per open connection. The charge ends with the
/// answer: a publish answered `503` on its propose timeout may still wait in the proposer's queue
/// and commit later (or be dropped from it unwritten); that queue is bounded in bytes of its own
/// (`crate::cluster::proposer::QUEUED_BYTES`).
pub struct Budget {
    bytes: Arc<Semaphore>,
    total: usize,
}

impl Budget {
    pub fn new(max_payload_bytes: usize) -> Budget {
        let total = PUBLISHES_IN_FLIGHT * (max_payload_bytes + PUBLISH_OVERHEAD);
        Budget { bytes: Arc::new(Semaphore::new(total)), total }
    }

    /// Bytes held by publishes in flight.
    pub fn in_use(&self) -> usize {
        self.total - self.bytes.available_permits()
    }

    /// The charge for a body of `declared` bytes, held until dropped; `503 busy` when the node
    /// already holds its budget.
    pub fn charge(&self, declared: usize) -> Result<OwnedSemaphorePermit, Refusal> {
        let n = u32::try_from(declared + PUBLISH_OVERHEAD).unwrap_or(u32::MAX);
        self.bytes.clone().try_acquire_many_owned(n).map_err(|_| {
            let msg = format!("this node holds its {} bytes of publishes in flight; retry", self.total);
            Refusal::unavailable("busy").message(msg)
        })
    }
}

/// Idempotency keys: 1-128 printable ASCII characters.
fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

pub async fn publish(api: &Api, device: &str, key: Option<String>, body: &[u8]) -> Resp {
    if !valid_device_id(device) {
        return error(StatusCode::BAD_REQUEST, "bad_device_id", "device ids are 1-128 characters of [A-Za-z0-9._:@-]");
    }
    if let Some(k) = key.as_deref().filter(|k| !valid_key(k)) {
        let msg = format!("Idempotency-Key must be 1-128 printable ASCII characters, got {} bytes", k.len());
        return error(StatusCode::BAD_REQUEST, "bad_idempotency_key", msg);
    }
    if body.len() > api.device.max_payload_bytes {
        let msg = format!("payload of {} bytes exceeds max_payload_bytes {}", body.len(), api.device.max_payload_bytes);
        return error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", msg);
    }
    // Validated and re-serialized compactly: the stored text is spliced into `{"t":"msg",...}`.
    let payload = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => v.to_string(),
        Err(e) => return bad_json(&e),
    };
    let publish = Publish {
        device: device.to_string(),
        payload,
        key,
        at_ms: 0,
        keep_count: api.device.retain_count,
        keep_age_ms: api.device.retain_ms,
        keep_key_ms: api.device.idempotency_ms,
        max_keys: api.device.idempotency_keys,
    };
    // An unavailable answer may still commit: retry with the same Idempotency-Key.
    let outcome = answer::publish(api.cluster.publish(publish).await);
    let result = match &outcome {
        Ok((_, false)) => "published",
        Ok((_, true)) => "duplicate",
        Err(refusal) => refusal.reason,
    };
    api.metrics.publishes.get_or_create(&ResultLabel { result }).inc();
    match outcome {
        Ok((seq, duplicate)) => {
            answer::json(StatusCode::OK, &serde_json::json!({"device": device, "seq": seq, "duplicate": duplicate}))
        }
        Err(refusal) => refusal.response(),
    }
}
