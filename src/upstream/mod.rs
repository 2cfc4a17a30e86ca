//! Device → backend delivery (issue 13). A session hands each `up` frame to [`Upstream::submit`],
//! which answers at once (a refusal: no upstream, too large, overloaded) or admits it within the
//! node's and the device's in-flight bounds and delivers it on a tracked task ([`deliver`]): one
//! total deadline, tries bounded by it, retries only when safe and within the [`budget`], a
//! [`breaker`] per endpoint. The answer (`up_ack` / `up_nack`) comes back on the session's lane.
//! Knows no sockets of its own but the upstream's; never logs payloads.

pub mod breaker;
pub mod budget;
mod deliver;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::upstream::UpstreamConfig;
use crate::metrics::{Metrics, ResultLabel, UpstreamLabel};
use crate::protocol::ServerFrame;
use breaker::{Admit, Breaker};
use budget::RetryBudget;

/// How an up ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ack,
    /// `reason` is the metric label and the frame's reason; `retry_after_ms` says whether (and
    /// when) retrying the same id can help; `status` is the upstream's when it answered one.
    Nack {
        reason: &'static str,
        retry_after_ms: Option<u64>,
        status: Option<u16>,
    },
}

impl Outcome {
    fn nack(reason: &'static str, retry_after_ms: Option<u64>) -> Outcome {
        Outcome::Nack { reason, retry_after_ms, status: None }
    }

    fn label(&self) -> &'static str {
        match self {
            Outcome::Ack => "ack",
            Outcome::Nack { reason, .. } => reason,
        }
    }

    /// The frame that answers the up `id`.
    pub fn frame(self, id: u64) -> ServerFrame {
        match self {
            Outcome::Ack => ServerFrame::UpAck { id },
            Outcome::Nack { reason, retry_after_ms, status } => {
                ServerFrame::UpNack { id, reason: reason.to_string(), retry_after_ms, status }
            }
        }
    }
}

/// One endpoint: its URI and its breaker (an open breaker ejects it from the rotation).
struct Target {
    name: String,
    uri: hyper::Uri,
    breaker: Mutex<Breaker>,
}

/// The node's delivery service; shared by every session.
pub struct Upstream {
    cfg: UpstreamConfig,
    targets: Vec<Target>,
    budget: Mutex<RetryBudget>,
    slots: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    client: Client<HttpConnector, Full<Bytes>>,
    next: AtomicUsize,
    epoch: Instant,
    metrics: Arc<Metrics>,
    tasks: TaskTracker,
    stop: CancellationToken,
}

/// A session's side of the service: who it is, its own in-flight bound, and where answers go.
pub struct Lane {
    device: String,
    tenant: Option<String>,
    slots: Arc<Semaphore>,
    /// Boxed: an empty channel still allocates a block of 32 slots, and a `ServerFrame` slot is
    /// large; a box keeps an idle session's lane at 32 pointers.
    replies: mpsc::Sender<Box<Answer>>,
}

/// An up's answer on its way to the device. It holds the up's slot of the device's bound until
/// the session takes it, so the ups in flight plus the answers not yet taken never exceed the
/// lane's capacity: queuing an answer never fails while the session lives.
pub struct Answer {
    pub frame: ServerFrame,
    _slot: OwnedSemaphorePermit,
}

/// What a delivery task holds until its answer is on the lane.
struct Held {
    device: OwnedSemaphorePermit,
    _node: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
    bytes: usize,
}

impl Upstream {
    pub fn new(
        cfg: UpstreamConfig,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
        stop: CancellationToken,
    ) -> Result<Arc<Upstream>, String> {
        let targets = cfg
            .endpoints
            .iter()
            .map(|e| {
                let uri = e.url().parse::<hyper::Uri>().map_err(|err| format!("upstream {}: {err}", e.authority))?;
                let t = Target {
                    name: e.authority.clone(),
                    uri,
                    breaker: Mutex::new(Breaker::new(cfg.breaker_failures, cfg.breaker_open_ms)),
                };
                metrics.upstream_breaker.get_or_create(&UpstreamLabel { upstream: t.name.clone() }).set(0);
                Ok(t)
            })
            .collect::<Result<Vec<_>, String>>()?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // Each try's own timeout bounds the connect as well.
        connector.set_connect_timeout(None);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(64)
            .build(connector);
        Ok(Arc::new(Upstream {
            budget: Mutex::new(RetryBudget::new(cfg.retry_window_ms, cfg.retry_ratio, cfg.retry_min_per_s)),
            slots: Arc::new(Semaphore::new(cfg.max_in_flight)),
            bytes: Arc::new(Semaphore::new(cfg.max_in_flight_bytes)),
            targets,
            client,
            next: AtomicUsize::new(0),
            epoch: Instant::now(),
            metrics,
            tasks,
            stop,
            cfg,
        }))
    }

    /// A lane for one session: answers arrive on the receiver. Its capacity is the device's
    /// in-flight bound, and an up's slot is freed only when the session takes its [`Answer`], so
    /// queuing an answer never waits or fails.
    pub fn lane(&self, device: &str, tenant: Option<String>) -> (Lane, mpsc::Receiver<Box<Answer>>) {
        let n = self.cfg.max_in_flight_per_device;
        let (replies, rx) = mpsc::channel(n);
        (Lane { device: device.to_string(), tenant, slots: Arc::new(Semaphore::new(n)), replies }, rx)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Takes the up `id`: `Some(answer)` when it is refused at once, `None` when it was admitted
    /// and its answer will come on the lane.
    pub fn submit(self: &Arc<Self>, lane: &Lane, id: u64, payload: &serde_json::Value) -> Option<ServerFrame> {
        match self.admit(lane, id, payload) {
            Ok(()) => None,
            Err(outcome) => {
                self.metrics.ups.get_or_create(&ResultLabel { result: outcome.label() }).inc();
                Some(outcome.frame(id))
            }
        }
    }

    fn admit(self: &Arc<Self>, lane: &Lane, id: u64, payload: &serde_json::Value) -> Result<(), Outcome> {
        let cfg = &self.cfg;
        let payload = serde_json::to_string(payload).expect("a parsed JSON value");
        if payload.len() > cfg.max_payload_bytes {
            return Err(Outcome::nack("payload_too_large", None));
        }
        if self.targets.is_empty() {
            return Err(Outcome::nack("no_upstream", None));
        }
        let busy = || Outcome::nack("overloaded", Some(cfg.backoff_cap_ms));
        if self.stop.is_cancelled() {
            return Err(Outcome::nack("shutting_down", Some(cfg.backoff_cap_ms)));
        }
        let device = lane.slots.clone().try_acquire_owned().map_err(|_| busy())?;
        let node = self.slots.clone().try_acquire_owned().map_err(|_| busy())?;
        let bytes = self.bytes.clone().try_acquire_many_owned(payload.len().max(1) as u32).map_err(|_| busy())?;
        let held = Held { device, _node: node, _bytes: bytes, bytes: payload.len() };
        let body = Bytes::from(body(&lane.device, lane.tenant.as_deref(), id, &payload));
        let key = format!("{}:{id}", lane.device);
        self.metrics.ups_in_flight.inc();
        self.metrics.ups_in_flight_bytes.inc_by(held.bytes as i64);
        let (me, replies) = (self.clone(), lane.replies.clone());
        let span = tracing::debug_span!("up", device = %lane.device, id);
        let task = async move {
            // Moved in whole (a block using only some fields would capture only those, and the
            // node's and the bytes' permits would go back at once).
            let Held { device, _node, _bytes, bytes } = held;
            let outcome = tokio::select! {
                o = deliver::deliver(&me, &key, body) => o,
                _ = me.stop.cancelled() => Outcome::nack("shutting_down", Some(me.cfg.backoff_cap_ms)),
            };
            me.metrics.ups.get_or_create(&ResultLabel { result: outcome.label() }).inc();
            if let Outcome::Nack { reason, status, .. } = &outcome {
                tracing::debug!(reason, status, "up nacked");
            }
            me.metrics.ups_in_flight.dec();
            me.metrics.ups_in_flight_bytes.dec_by(bytes as i64);
            drop((_node, _bytes));
            // Fails only when the session is gone: the device retries the same id on its next one.
            let _ = replies.try_send(Box::new(Answer { frame: outcome.frame(id), _slot: device }));
        };
        self.tasks.spawn(tracing::Instrument::instrument(task, span));
        Ok(())
    }

    /// An endpoint a try may go to now (round robin over those whose breaker admits), or how long
    /// until one might.
    fn pick(&self) -> Result<(usize, bool), u64> {
        let now = self.now_ms();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut wait = u64::MAX;
        for k in 0..self.targets.len() {
            let i = (start + k) % self.targets.len();
            let t = &self.targets[i];
            let (admit, gauge) = {
                let mut b = t.breaker.lock().expect("breaker lock");
                (b.admit(now), b.gauge())
            };
            self.breaker_gauge(t, gauge);
            match admit {
                Admit::Yes { probe } => return Ok((i, probe)),
                Admit::No { retry_after_ms } => wait = wait.min(retry_after_ms),
            }
        }
        Err(wait)
    }

    /// Reports a try to its endpoint's breaker.
    fn report(&self, i: usize, probe: bool, ok: bool) {
        let t = &self.targets[i];
        let (before, after) = {
            let mut b = t.breaker.lock().expect("breaker lock");
            let before = b.gauge();
            if ok {
                b.success(probe);
            } else {
                b.failure(probe, self.now_ms());
            }
            (before, b.gauge())
        };
        if before != after {
            match after {
                0 => tracing::info!(upstream = %t.name, "upstream breaker closed"),
                _ => tracing::warn!(upstream = %t.name, open_ms = self.cfg.breaker_open_ms, "upstream breaker opened"),
            }
        }
        self.breaker_gauge(t, after);
    }

    fn breaker_gauge(&self, t: &Target, value: i64) {
        self.metrics.upstream_breaker.get_or_create(&UpstreamLabel { upstream: t.name.clone() }).set(value);
    }
}

/// The JSON body POSTed upstream: `{"device","tenant","id","payload"}`, the payload spliced in as
/// the text it was measured as.
fn body(device: &str, tenant: Option<&str>, id: u64, payload_json: &str) -> Vec<u8> {
    let text = |s: &str| serde_json::to_string(s).expect("a string");
    let tenant = tenant.map_or_else(|| "null".to_string(), text);
    format!(r#"{{"device":{},"tenant":{tenant},"id":{id},"payload":{payload_json}}}"#, text(device)).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_json_with_the_documented_fields() {
        let b = body("d\"1", Some("acme"), 7, r#"{"t":[1,2]}"#);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v, serde_json::json!({"device": "d\"1", "tenant": "acme", "id": 7, "payload": {"t": [1, 2]}}));
        let v: serde_json::Value = serde_json::from_slice(&body("d", None, 1, "3")).unwrap();
        assert_eq!(v["tenant"], serde_json::Value::Null);
    }

    #[test]
    fn outcomes_become_frames() {
        assert_eq!(Outcome::Ack.frame(3), ServerFrame::UpAck { id: 3 });
        let n = Outcome::Nack { reason: "rejected", retry_after_ms: None, status: Some(422) };
        assert_eq!(
            n.frame(4),
            ServerFrame::UpNack { id: 4, reason: "rejected".into(), retry_after_ms: None, status: Some(422) }
        );
    }
}
