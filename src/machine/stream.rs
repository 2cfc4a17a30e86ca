//! Per-device message streams (design §6, V5): a publish appends the next seq (or answers the
//! seq its idempotency key already got), retention drops by count and age (both carried in the
//! command: apply reads no config and no clock), an ack trims what the device confirmed. A
//! publish to a device that never connected has no stream. Idempotency keys live for their own
//! window and count bound, independent of acks and retention: a retry within the window is a
//! duplicate even after its message was delivered and trimmed.

use serde::{Deserialize, Serialize};

use super::tenant::{consume, Exhausted};
use super::types::NodeId;
use super::{Apply, Ctx, Event, Tables};

/// One retained message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub at_ms: u64,
    /// The payload as JSON text.
    pub payload: String,
    pub key: Option<String>,
}

/// A stream's bounds: messages `oldest..=head` are retained (`oldest = head + 1` when none is);
/// `keys` idempotency keys are remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub head: u64,
    pub oldest: u64,
    pub keys: u64,
}

impl Default for Head {
    /// A stream that never had a message.
    fn default() -> Head {
        Head { head: 0, oldest: 1, keys: 0 }
    }
}

/// An idempotency key's use: the seq its publish got, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyUse {
    pub seq: u64,
    pub at_ms: u64,
}

/// What a reader gets: the bounds, and the retained messages after a cursor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamRead {
    pub head: Head,
    pub messages: Vec<(u64, Message)>,
}

/// A message to push to the connection that holds the device's route, as applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub node: NodeId,
    pub conn: u64,
    pub device: String,
    pub seq: u64,
    pub payload: String,
}

/// Appends a message to a known device's stream (idempotent per `key` for `keep_key_ms`), then
/// trims the stream to `keep_count` messages and to those newer than `at_ms - keep_age_ms`, and
/// the device's keys to those used within `keep_key_ms`, at most `max_keys` of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publish {
    pub device: String,
    pub payload: String,
    pub key: Option<String>,
    pub at_ms: u64,
    pub keep_count: u64,
    pub keep_age_ms: u64,
    pub keep_key_ms: u64,
    pub max_keys: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PublishReply {
    /// The message's seq; `duplicate` when the idempotency key was seen before (nothing changed).
    Published { seq: u64, duplicate: bool },
    /// The device never connected: there is no stream to publish to.
    NoSuchDevice,
    /// The device's tenant used its publish allowance for this period: nothing changed.
    QuotaExhausted(Exhausted),
}

impl Apply for Publish {
    type Reply = PublishReply;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<PublishReply, T::Error> {
        let t = &mut *cx.tables;
        let device = self.device.as_str();
        if t.floor(device)?.is_none() {
            return Ok(PublishReply::NoSuchDevice);
        }
        if let Some(key) = &self.key {
            match t.idempotent(device, key)? {
                Some(used) if used.at_ms.saturating_add(self.keep_key_ms) >= self.at_ms => {
                    return Ok(PublishReply::Published { seq: used.seq, duplicate: true });
                }
                _ => {}
            }
        }
        let mut h = t.head(device)?.unwrap_or_default();
        if let Some(tenant) = t.device_tenant(device)? {
            // The consumption id: a retry with the same key consumes once.
            let id = match &self.key {
                Some(k) => format!("{device}:{k}"),
                None => format!("{device}#{}", h.head + 1),
            };
            if let Err(e) = consume(t, &tenant, &id, self.at_ms)? {
                return Ok(PublishReply::QuotaExhausted(e));
            }
        }
        h.head += 1;
        let msg = Message { at_ms: self.at_ms, payload: self.payload.clone(), key: self.key.clone() };
        t.put_message(device, h.head, &msg)?;
        if let Some(key) = &msg.key {
            if let Some(expired) = t.idempotent(device, key)? {
                t.remove_idempotent(device, key, expired)?;
                h.keys -= 1;
            }
            t.put_idempotent(device, key, KeyUse { seq: h.head, at_ms: self.at_ms })?;
            h.keys += 1;
        }
        // Keys: those used within the window, the newest `max_keys` of them.
        let key_cutoff = self.at_ms.saturating_sub(self.keep_key_ms);
        while let Some((key, used)) = t.oldest_key(device)? {
            if used.at_ms >= key_cutoff && h.keys <= self.max_keys {
                break;
            }
            t.remove_idempotent(device, &key, used)?;
            h.keys -= 1;
        }
        let cutoff = self.at_ms.saturating_sub(self.keep_age_ms);
        while h.oldest <= h.head {
            let count = h.head - h.oldest + 1;
            let expired = t.message(device, h.oldest)?.is_some_and(|m| m.at_ms < cutoff);
            if count <= self.keep_count && !expired {
                break;
            }
            t.remove_message(device, h.oldest)?;
            h.oldest += 1;
        }
        t.put_head(device, &h)?;
        if let Some(r) = t.route(device)? {
            let seq = h.head;
            cx.events.push(Event::Published(Delivery {
                node: r.node,
                conn: r.conn,
                device: self.device.clone(),
                seq,
                payload: msg.payload,
            }));
        }
        Ok(PublishReply::Published { seq: h.head, duplicate: false })
    }
}

/// The device has every message up to `seq`: trim them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub device: String,
    pub seq: u64,
}

impl Apply for Ack {
    type Reply = u64;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<u64, T::Error> {
        let t = &mut *cx.tables;
        let device = self.device.as_str();
        let mut h = t.head(device)?.unwrap_or_default();
        let upto = self.seq.min(h.head);
        let mut trimmed = 0;
        while h.oldest <= upto {
            t.remove_message(device, h.oldest)?;
            h.oldest += 1;
            trimmed += 1;
        }
        if trimmed > 0 {
            t.put_head(device, &h)?;
        }
        Ok(trimmed)
    }
}
