//! Per-device message streams (design §6, V5): `streams` (device, seq) → message, `stream_heads`
//! device → {head, oldest}, `idempotency` (device, key) → seq. Retention is bounded by count and
//! age, both carried in the command (apply reads no config and no clock); an ack trims what the
//! device confirmed.

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::codec::{decode, encode};
use crate::raft::types::Reply;

pub const STREAMS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("streams");
pub const HEADS: TableDefinition<&str, &[u8]> = TableDefinition::new("stream_heads");
pub const IDEMPOTENCY: TableDefinition<(&str, &str), u64> = TableDefinition::new("idempotency");

/// One retained message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub at_ms: u64,
    /// The payload as JSON text.
    pub payload: String,
    pub key: Option<String>,
}

/// A stream's bounds: messages `oldest..=head` are retained (`oldest = head + 1` when none is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub head: u64,
    pub oldest: u64,
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
    pub node: u64,
    pub conn: u64,
    pub device: String,
    pub seq: u64,
    pub payload: String,
}

/// A publish as applied.
pub struct Publish<'a> {
    pub device: &'a str,
    pub payload: String,
    pub key: Option<String>,
    pub at_ms: u64,
    pub keep_count: u64,
    pub keep_age_ms: u64,
}

/// The stream tables of one apply transaction.
pub struct StreamTables<'t> {
    streams: Table<'t, (&'static str, u64), &'static [u8]>,
    heads: Table<'t, &'static str, &'static [u8]>,
    idem: Table<'t, (&'static str, &'static str), u64>,
}

impl<'t> StreamTables<'t> {
    pub fn open(txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(StreamTables {
            streams: txn.open_table(STREAMS)?,
            heads: txn.open_table(HEADS)?,
            idem: txn.open_table(IDEMPOTENCY)?,
        })
    }

    fn head(&self, device: &str) -> Result<Head, StoreError> {
        Ok(self.heads.get(device)?.map(|v| decode(v.value())).transpose()?.unwrap_or(Head { head: 0, oldest: 1 }))
    }

    /// Appends a message (or answers the seq a retried key already got), then applies retention.
    pub fn publish(&mut self, p: Publish<'_>) -> Result<Reply, StoreError> {
        if let Some(key) = &p.key {
            if let Some(seq) = self.idem.get((p.device, key.as_str()))? {
                return Ok(Reply::Published { seq: seq.value(), duplicate: true });
            }
        }
        let mut h = self.head(p.device)?;
        h.head += 1;
        let msg = Message { at_ms: p.at_ms, payload: p.payload, key: p.key };
        self.streams.insert((p.device, h.head), encode(&msg)?.as_slice())?;
        if let Some(key) = &msg.key {
            self.idem.insert((p.device, key.as_str()), h.head)?;
        }
        let cutoff = p.at_ms.saturating_sub(p.keep_age_ms);
        while h.oldest <= h.head {
            let count = h.head - h.oldest + 1;
            let old: Option<Message> =
                self.streams.get((p.device, h.oldest))?.map(|v| decode(v.value())).transpose()?;
            let expired = old.as_ref().is_some_and(|m| m.at_ms < cutoff);
            if count <= p.keep_count && !expired {
                break;
            }
            self.drop_message(p.device, h.oldest, old)?;
            h.oldest += 1;
        }
        self.heads.insert(p.device, encode(&h)?.as_slice())?;
        Ok(Reply::Published { seq: h.head, duplicate: false })
    }

    /// The device has everything up to `seq`: trim it.
    pub fn ack(&mut self, device: &str, seq: u64) -> Result<Reply, StoreError> {
        let mut h = self.head(device)?;
        let upto = seq.min(h.head);
        let mut trimmed = 0;
        while h.oldest <= upto {
            let old: Option<Message> = self.streams.get((device, h.oldest))?.map(|v| decode(v.value())).transpose()?;
            self.drop_message(device, h.oldest, old)?;
            h.oldest += 1;
            trimmed += 1;
        }
        if trimmed > 0 {
            self.heads.insert(device, encode(&h)?.as_slice())?;
        }
        Ok(Reply::Count(trimmed))
    }

    fn drop_message(&mut self, device: &str, seq: u64, msg: Option<Message>) -> Result<(), StoreError> {
        self.streams.remove((device, seq))?;
        if let Some(key) = msg.and_then(|m| m.key) {
            self.idem.remove((device, key.as_str()))?;
        }
        Ok(())
    }
}

/// Reads a stream's bounds and up to `limit` retained messages with seq > `after`.
pub fn read<T>(
    streams: &T,
    heads: &impl ReadableTable<&'static str, &'static [u8]>,
    device: &str,
    after: u64,
    limit: usize,
) -> Result<StreamRead, StoreError>
where
    T: ReadableTable<(&'static str, u64), &'static [u8]>,
{
    let head = heads.get(device)?.map(|v| decode(v.value())).transpose()?.unwrap_or(Head { head: 0, oldest: 1 });
    let mut messages = Vec::new();
    if limit > 0 && after < head.head {
        for row in streams.range((device, after.saturating_add(1))..=(device, head.head))? {
            let (k, v) = row?;
            messages.push((k.value().1, decode(v.value())?));
            if messages.len() >= limit {
                break;
            }
        }
    }
    Ok(StreamRead { head, messages })
}
