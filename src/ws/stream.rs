//! A session's view of its device's message stream (V5): which sequence numbers this connection
//! has sent, so that `sync` and live pushes together deliver every retained message once, in
//! order, with no gap or duplicate at the seam. The connection has sent exactly `(lo, delivered]`;
//! both start at the stream head announced in `hello`. Payloads were validated as JSON when they
//! were published: frames splice them in as they are.

use std::sync::Arc;

use crate::cluster::Handle;
use crate::machine::StreamRead;
use crate::protocol::{msg_json, ServerFrame};

/// Most messages read from the store at once.
const READ_BATCH: usize = 1024;

/// Proposes an ack (trims the stream up to that seq).
pub type Acker = Arc<dyn Fn(String, u64) + Send + Sync>;

pub struct StreamCursor {
    device: String,
    cluster: Handle,
    acker: Acker,
    lo: u64,
    delivered: u64,
    acked: u64,
    pending_ack: u64,
}

impl StreamCursor {
    pub fn new(device: String, cluster: Handle, acker: Acker, head: u64) -> StreamCursor {
        StreamCursor { device, cluster, acker, lo: head, delivered: head, acked: 0, pending_ack: 0 }
    }

    async fn read(&self, after: u64) -> Option<StreamRead> {
        match self.cluster.stream(&self.device, after, READ_BATCH).await {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(device = %self.device, error = %e, "reading the stream failed");
                None
            }
        }
    }

    /// Frames for a message the log just applied.
    pub async fn deliver(&mut self, seq: u64, payload: &str) -> Vec<String> {
        if seq <= self.delivered {
            return Vec::new();
        }
        if seq == self.delivered + 1 {
            self.delivered = seq;
            return vec![msg_json(seq, payload)];
        }
        // A gap (a lagging event subscriber): fill it from the store.
        let mut out = self.fill(self.delivered).await;
        if seq > self.delivered {
            self.delivered = seq;
            out.push(msg_json(seq, payload));
        }
        out
    }

    /// Frames answering `{"t":"sync","after":S}`: every retained message after S that this
    /// connection has not sent, in order (`sync_gap` first when S is older than retention).
    pub async fn sync(&mut self, after: u64) -> Vec<String> {
        let mut out = Vec::new();
        let mut cursor = after;
        let mut first = true;
        loop {
            let Some(read) = self.read(cursor).await else { break };
            if first && read.head.oldest > after.saturating_add(1) && read.head.head > after {
                out.push(ServerFrame::SyncGap { oldest: read.head.oldest }.to_json());
            }
            first = false;
            if read.messages.is_empty() {
                break;
            }
            for (seq, m) in &read.messages {
                if *seq <= self.lo || *seq > self.delivered {
                    out.push(msg_json(*seq, &m.payload));
                }
                cursor = *seq;
            }
            self.delivered = self.delivered.max(cursor);
            if read.messages.len() < READ_BATCH {
                break;
            }
        }
        self.lo = self.lo.min(after);
        out
    }

    async fn fill(&mut self, after: u64) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(read) = self.read(after).await {
            for (seq, m) in read.messages {
                if seq > self.delivered {
                    self.delivered = seq;
                    out.push(msg_json(seq, &m.payload));
                }
            }
        }
        out
    }

    /// The device confirmed everything up to `seq` (proposed later, coalesced).
    pub fn ack(&mut self, seq: u64) {
        self.pending_ack = self.pending_ack.max(seq.min(self.delivered));
    }

    /// Proposes the newest ack if it moved (called on the ping tick).
    pub fn flush_ack(&mut self) {
        if self.pending_ack > self.acked {
            self.acked = self.pending_ack;
            (self.acker)(self.device.clone(), self.acked);
        }
    }
}
