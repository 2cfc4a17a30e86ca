//! A session's view of its device's message stream (V5): which sequence numbers this connection
//! has sent, so that `sync` and live pushes together deliver every retained message once, in
//! order, with no gap or duplicate at the seam. The connection has sent exactly `(lo, delivered]`;
//! both start at the stream head announced in `hello`. Payloads were validated as JSON when they
//! were published: frames splice them in as they are.

use std::sync::Arc;

use super::sync_budget::{PagePermit, SyncBudget};
use crate::cluster::Handle;
use crate::machine::StreamRead;
use crate::protocol::{msg_json, ServerFrame};

/// Most messages one page of a sync reads from the store.
const READ_BATCH: usize = 256;

/// Most payload bytes one page of a sync holds (one message at least): a 20-byte `sync` frame
/// costs the node one page of memory at a time, however long the stream.
pub const PAGE_BYTES: usize = 256 << 10;

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
    /// A sync in progress, sent one page at a time.
    syncing: Option<Syncing>,
    /// Live pushes wait for the device's first `sync` (or [`StreamCursor::stop_waiting`]): a
    /// device behind the head must get its backlog before anything newer, and its sync may reach
    /// the node after the first push (then it would ack past what it never got).
    awaiting_sync: bool,
    /// The pushes held meanwhile, for a device that does not sync.
    held: Held,
    /// Most payload bytes held (`send_queue_bytes`: the same budget as the session's queue).
    held_budget: usize,
    /// The node's room for sync pages, shared by every session.
    pages: SyncBudget,
}

/// The next page of a sync: its frames and the budget they hold until written, or no room in
/// the node's budget (the sync stays where it is; ask again after the hint).
pub enum Page {
    Frames(Vec<String>, Option<PagePermit>),
    Busy,
}

#[derive(Default)]
struct Held {
    frames: Vec<(u64, String)>,
    bytes: usize,
    /// Pushes were missed meanwhile (lagged events): read them back from the store.
    missed: bool,
}

/// Where a sync is: the next page reads after `next`; the device asked for everything after
/// `after` (the oldest it asked for while this sync ran).
#[derive(Debug, Clone, Copy)]
struct Syncing {
    next: u64,
    after: u64,
    first: bool,
}

impl StreamCursor {
    pub fn new(
        device: String,
        cluster: Handle,
        acker: Acker,
        head: u64,
        held_budget: usize,
        pages: SyncBudget,
    ) -> StreamCursor {
        StreamCursor {
            device,
            cluster,
            acker,
            lo: head,
            delivered: head,
            acked: 0,
            pending_ack: 0,
            syncing: None,
            awaiting_sync: true,
            held: Held::default(),
            held_budget,
            pages,
        }
    }

    async fn read(&self, after: u64) -> Option<StreamRead> {
        match self.cluster.stream_page(&self.device, after, READ_BATCH, PAGE_BYTES).await {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(device = %self.device, error = %e, "reading the stream failed");
                None
            }
        }
    }

    /// The frame for a message the log just applied; None when it was sent already, when a sync
    /// is in progress (its pages read up to the stream's head, this message included, in order),
    /// or when there is a gap before it (a lagging event subscriber): then a catch-up from the
    /// store starts, and sends it in order.
    pub fn deliver(&mut self, seq: u64, payload: &str) -> Option<String> {
        if self.awaiting_sync {
            let held = &mut self.held;
            held.bytes += payload.len();
            if held.bytes <= self.held_budget {
                held.frames.push((seq, msg_json(seq, payload)));
            }
            return None;
        }
        if seq <= self.delivered || self.syncing.is_some() {
            return None;
        }
        if seq == self.delivered + 1 {
            self.delivered = seq;
            return Some(msg_json(seq, payload));
        }
        self.catch_up();
        None
    }

    /// Sends, from the store, every message after the last one this connection sent (pushes may
    /// have been missed).
    pub fn catch_up(&mut self) {
        if self.awaiting_sync {
            // The first sync reads it all anyway; without one, stop_waiting reads the store.
            self.held.missed = true;
            return;
        }
        let from = self.delivered;
        match &mut self.syncing {
            Some(s) => s.next = s.next.min(from),
            None => self.syncing = Some(Syncing { next: from, after: from, first: false }),
        }
    }

    /// The device sent `{"t":"sync","after":S}`: every retained message after S that this
    /// connection has not sent follows, in order, a page at a time (`sync_gap` first when S is
    /// older than retention). A sync asked for while one runs restarts it from the older point.
    pub fn request_sync(&mut self, after: u64) {
        // What was held is read back in order by this sync (its pages reach the head).
        self.awaiting_sync = false;
        self.held = Held::default();
        match &mut self.syncing {
            Some(s) if after < s.next => *s = Syncing { next: after, after: s.after.min(after), first: true },
            Some(_) => {}
            None => self.syncing = Some(Syncing { next: after, after, first: true }),
        }
    }

    /// Whether live pushes still wait for the device's first sync.
    pub fn awaiting_sync(&self) -> bool {
        self.awaiting_sync
    }

    /// More was held for a device that has not synced than its queue may hold: like a full
    /// queue, the session closes (1013) and the device syncs on its next connection.
    pub fn over_budget(&self) -> bool {
        self.held.bytes > self.held_budget
    }

    /// The device did not sync soon after `hello`: it gets the pushes held meanwhile, then live
    /// ones (read back from the store if some were missed).
    pub fn stop_waiting(&mut self) -> Vec<String> {
        self.awaiting_sync = false;
        let held = std::mem::take(&mut self.held);
        if held.missed {
            self.catch_up();
            return Vec::new();
        }
        let mut out = Vec::new();
        for (seq, frame) in held.frames {
            if seq == self.delivered + 1 {
                self.delivered = seq;
                out.push(frame);
            } else if seq > self.delivered {
                self.catch_up(); // a gap (lagged events): the store has it all, in order
                break;
            }
        }
        out
    }

    /// How long a page refused by the node's budget waits (jittered by `seed`).
    pub fn retry_after(&self, seed: u64) -> std::time::Duration {
        self.pages.retry_after(seed)
    }

    /// Whether a sync has pages left to send.
    pub fn syncing(&self) -> bool {
        self.syncing.is_some()
    }

    /// The next page of the sync in progress (the last page ends it), holding its bytes of the
    /// node's page budget; [`Page::Busy`] when the budget is spent (nothing read, nothing lost).
    pub async fn sync_page(&mut self) -> Page {
        let Some(mut s) = self.syncing else { return Page::Frames(Vec::new(), None) };
        let Some(mut permit) = self.pages.try_page() else { return Page::Busy };
        self.syncing = None;
        let mut out = Vec::new();
        let Some(read) = self.read(s.next).await else {
            // The store could not be read: this sync ends; the device may ask again.
            return Page::Frames(out, None);
        };
        permit.shrink_to(read.messages.iter().map(|(_, m)| m.payload.len()).sum());
        if s.first && read.head.oldest > s.after.saturating_add(1) && read.head.head > s.after {
            out.push(ServerFrame::SyncGap { oldest: read.head.oldest }.to_json());
        }
        s.first = false;
        for (seq, m) in &read.messages {
            if *seq <= self.lo || *seq > self.delivered {
                out.push(msg_json(*seq, &m.payload));
            }
            s.next = *seq;
        }
        self.delivered = self.delivered.max(s.next);
        if read.messages.is_empty() || s.next >= read.head.head {
            self.lo = self.lo.min(s.after);
        } else {
            self.syncing = Some(s);
        }
        Page::Frames(out, Some(permit))
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
