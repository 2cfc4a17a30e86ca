//! Sending `up` frames from a device (issue 13): the application hands an id (its own sequence:
//! the backend dedups on `<device>:<id>`) and a payload to an [`Uplink`] and awaits the result.
//! The [`Outbox`] keeps every up until it is acked or given up: it is sent on the connection that
//! is up, resent with the **same id** after an `up_nack` that carries `retry_after_ms` (waiting at
//! least that long, full-jitter backoff on top) or after the connection dropped unanswered, and
//! given up after `max_tries` or its deadline. The outbox is pure: time comes in as `Instant`s.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::backoff::{ceiling, full_jitter, SplitMix64};
use crate::protocol::{ClientFrame, ServerFrame};

/// How one up ended for the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpResult {
    /// The backend took it (2xx); `tries` sends it took.
    Acked { tries: u32 },
    /// A nack that retrying cannot fix (a 4xx from the backend, too large, no upstream).
    Refused { reason: String, status: Option<u16> },
    /// Retryable nacks (or lost connections) until `max_tries` or the deadline; the last reason.
    GaveUp { reason: String, tries: u32 },
    /// The device stopped before an answer.
    Stopped,
}

/// How persistently ups are retried.
#[derive(Debug, Clone)]
pub struct UpConfig {
    /// Sends per up, the first included.
    pub max_tries: u32,
    /// Longest an up is kept from its submission.
    pub deadline: Duration,
    /// Full-jitter backoff added to each nack's `retry_after_ms` (which is the floor).
    pub base: Duration,
    pub cap: Duration,
}

impl Default for UpConfig {
    fn default() -> Self {
        UpConfig {
            max_tries: 5,
            deadline: Duration::from_secs(60),
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
        }
    }
}

pub(crate) struct Submit {
    id: u64,
    payload: Value,
    done: oneshot::Sender<UpResult>,
}

/// The application's handle: clone it freely.
#[derive(Clone)]
pub struct Uplink {
    tx: mpsc::Sender<Submit>,
}

/// The device's end, given to [`super::device::Device::with_uplink`].
pub struct UplinkRx(pub(crate) mpsc::Receiver<Submit>);

impl Uplink {
    /// A handle and the device's end; at most `capacity` submissions wait to be picked up.
    pub fn channel(capacity: usize) -> (Uplink, UplinkRx) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Uplink { tx }, UplinkRx(rx))
    }

    /// Sends the up `id` and waits until it is acked, refused or given up. Reusing an id the
    /// backend has seen is how a retry after a restart stays idempotent.
    pub async fn send(&self, id: u64, payload: Value) -> UpResult {
        let (done, rx) = oneshot::channel();
        if self.tx.send(Submit { id, payload, done }).await.is_err() {
            return UpResult::Stopped;
        }
        rx.await.unwrap_or(UpResult::Stopped)
    }
}

struct Pending {
    payload: Value,
    done: oneshot::Sender<UpResult>,
    tries: u32,
    /// When to send it next; `None` while a send awaits its answer.
    due: Option<Instant>,
    give_up_at: Instant,
    last: String,
}

/// Ups not yet acked or given up, by id.
pub struct Outbox {
    cfg: UpConfig,
    pending: BTreeMap<u64, Pending>,
    rng: SplitMix64,
}

impl Outbox {
    pub fn new(cfg: UpConfig, seed: u64) -> Outbox {
        Outbox { cfg, pending: BTreeMap::new(), rng: SplitMix64::new(seed) }
    }

    pub(crate) fn add(&mut self, s: Submit, now: Instant) {
        let p = Pending {
            payload: s.payload,
            done: s.done,
            tries: 0,
            due: Some(now),
            give_up_at: now + self.cfg.deadline,
            last: String::new(),
        };
        // A second submission of a pending id replaces the first (which is told it stopped).
        if let Some(old) = self.pending.insert(s.id, p) {
            let _ = old.done.send(UpResult::Stopped);
        }
    }

    /// The frames to send now (their ids are then awaiting answers); ups past their deadline
    /// are given up first.
    pub fn due(&mut self, now: Instant) -> Vec<String> {
        let expired: Vec<u64> =
            self.pending.iter().filter(|(_, p)| p.due.is_some() && now >= p.give_up_at).map(|(id, _)| *id).collect();
        for id in expired {
            let p = self.pending.remove(&id).expect("listed");
            let _ = p.done.send(UpResult::GaveUp { reason: format!("deadline ({})", p.last), tries: p.tries });
        }
        let mut out = Vec::new();
        for (id, p) in self.pending.iter_mut().filter(|(_, p)| p.due.is_some_and(|d| d <= now)) {
            p.due = None;
            p.tries += 1;
            out.push(ClientFrame::Up { id: *id, payload: p.payload.clone() }.to_json());
        }
        out
    }

    /// When [`Outbox::due`] has something next.
    pub fn next_due(&self) -> Option<Instant> {
        self.pending.values().filter_map(|p| p.due.map(|d| d.min(p.give_up_at))).min()
    }

    /// Takes an `up_ack` / `up_nack`; other frames are ignored.
    pub fn answer(&mut self, frame: &ServerFrame, now: Instant) {
        let (id, retry) = match frame {
            ServerFrame::UpAck { id } => {
                if let Some(p) = self.pending.remove(id) {
                    let _ = p.done.send(UpResult::Acked { tries: p.tries });
                }
                return;
            }
            ServerFrame::UpNack { id, retry_after_ms, .. } => (*id, *retry_after_ms),
            _ => return,
        };
        let Some(p) = self.pending.get_mut(&id) else { return };
        let ServerFrame::UpNack { reason, status, .. } = frame else { return };
        p.last = reason.clone();
        let done = match retry {
            None => Some(UpResult::Refused { reason: reason.clone(), status: *status }),
            Some(_) if p.tries >= self.cfg.max_tries => {
                Some(UpResult::GaveUp { reason: reason.clone(), tries: p.tries })
            }
            Some(ms) => {
                let jitter =
                    full_jitter(&mut self.rng, ceiling(self.cfg.base, self.cfg.cap, p.tries.saturating_sub(1)));
                let wait = jitter.max(Duration::from_millis(ms));
                p.due = Some(now + wait);
                None
            }
        };
        if let Some(result) = done {
            let p = self.pending.remove(&id).expect("present");
            let _ = p.done.send(result);
        }
    }

    /// The connection dropped: ups awaiting an answer are sent again (same id) on the next one,
    /// unless they have used their tries.
    pub fn disconnected(&mut self, now: Instant) {
        let max = self.cfg.max_tries;
        let spent: Vec<u64> =
            self.pending.iter().filter(|(_, p)| p.due.is_none() && p.tries >= max).map(|(id, _)| *id).collect();
        for id in spent {
            let p = self.pending.remove(&id).expect("listed");
            let _ = p.done.send(UpResult::GaveUp { reason: "connection lost".into(), tries: p.tries });
        }
        for p in self.pending.values_mut().filter(|p| p.due.is_none()) {
            p.last = "connection lost".into();
            p.due = Some(now);
        }
    }

    /// Tells every pending up that the device stopped.
    pub fn stop(&mut self) {
        for (_, p) in std::mem::take(&mut self.pending) {
            let _ = p.done.send(UpResult::Stopped);
        }
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submit(ob: &mut Outbox, id: u64, now: Instant) -> oneshot::Receiver<UpResult> {
        let (done, rx) = oneshot::channel();
        ob.add(Submit { id, payload: serde_json::json!({"i": id}), done }, now);
        rx
    }

    fn nack(id: u64, retry_after_ms: Option<u64>) -> ServerFrame {
        ServerFrame::UpNack { id, reason: "overloaded".into(), retry_after_ms, status: None }
    }

    #[test]
    fn a_nacked_up_is_resent_with_its_id_after_retry_after() {
        let t0 = Instant::now();
        let cfg = UpConfig { base: Duration::from_millis(10), cap: Duration::from_millis(10), ..Default::default() };
        let mut ob = Outbox::new(cfg, 1);
        let mut rx = submit(&mut ob, 7, t0);
        assert_eq!(ob.due(t0), [r#"{"t":"up","id":7,"payload":{"i":7}}"#]);
        assert!(ob.due(t0).is_empty(), "sent once, awaiting its answer");
        ob.answer(&nack(7, Some(500)), t0);
        let next = ob.next_due().unwrap();
        assert!(next >= t0 + Duration::from_millis(500) && next <= t0 + Duration::from_millis(510), "{:?}", next - t0);
        assert!(ob.due(t0 + Duration::from_millis(499)).is_empty());
        assert_eq!(ob.due(next).len(), 1, "the same id again");
        ob.answer(&ServerFrame::UpAck { id: 7 }, next);
        assert_eq!(rx.try_recv().unwrap(), UpResult::Acked { tries: 2 });
        assert!(ob.is_empty());
    }

    #[test]
    fn final_nacks_tries_and_lost_connections() {
        let t0 = Instant::now();
        let mut ob = Outbox::new(UpConfig { max_tries: 2, ..Default::default() }, 1);
        let mut refused = submit(&mut ob, 1, t0);
        let mut lost = submit(&mut ob, 2, t0);
        assert_eq!(ob.due(t0).len(), 2);
        let rejected =
            ServerFrame::UpNack { id: 1, reason: "rejected".into(), retry_after_ms: None, status: Some(422) };
        ob.answer(&rejected, t0);
        assert_eq!(refused.try_recv().unwrap(), UpResult::Refused { reason: "rejected".into(), status: Some(422) });
        ob.disconnected(t0);
        assert_eq!(ob.due(t0).len(), 1, "resent on the next connection");
        ob.answer(&nack(2, Some(1)), t0);
        assert_eq!(lost.try_recv().unwrap(), UpResult::GaveUp { reason: "overloaded".into(), tries: 2 });
        let mut late = submit(&mut ob, 3, t0);
        ob.due(t0 + Duration::from_secs(61));
        assert!(matches!(late.try_recv().unwrap(), UpResult::GaveUp { tries: 0, .. }), "past its deadline");
    }
}
