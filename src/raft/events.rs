//! The queue of apply events from the state machine to its one consumer (the device side's
//! `ws::enforce_routes`), bounded in events and in bytes while the consumer lags. Past either
//! bound an event is dropped and the consumer is told it lagged, in order (after the events
//! queued before the drop, which wakes it if it waits): it reconciles its sessions with the
//! routes and catches them up from the streams, as it does after a snapshot.
//!
//! A `tokio::sync::broadcast` channel did this before, but it keeps its last `capacity` events
//! whether or not they were read: every publish's event carries its payload, so after a burst of
//! large publishes 4096 payloads stayed allocated (256 MiB at the default 64 KiB payload limit,
//! 4 GiB at 1 MiB). Here an event is freed once it is read.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use crate::machine::{Event, NodeId};

/// Most events queued for a consumer that lags.
pub const MAX_EVENTS: usize = 4096;

/// Most bytes (by [`weight`]) queued for a consumer that lags: 256 publishes of the default
/// 64 KiB payload limit, 16 of the largest (1 MiB).
pub const MAX_EVENT_BYTES: usize = 16 << 20;

/// What an event costs while queued: its payload and device id, the nodes it names, itself.
pub fn weight(ev: &Event) -> usize {
    std::mem::size_of::<Event>()
        + match ev {
            Event::Published(d) => d.payload.len() + d.device.len(),
            Event::Swept { nodes } => nodes.len() * std::mem::size_of::<u64>(),
            Event::Superseded { .. } | Event::Installed => 0,
        }
}

/// Whether `ev` concerns the sessions of node `me` (all events when no node is named).
pub fn concerns(ev: &Event, me: Option<NodeId>) -> bool {
    let Some(me) = me else { return true };
    match ev {
        Event::Published(d) => d.node == me,
        Event::Superseded { node, .. } => *node == me,
        Event::Swept { nodes } => nodes.contains(&me),
        Event::Installed => true,
    }
}

struct Shared {
    /// Events and bytes queued and not yet read.
    events: AtomicUsize,
    bytes: AtomicUsize,
    /// Events dropped since the consumer was last told.
    missed: AtomicU64,
    max_events: usize,
    max_bytes: usize,
}

/// What the queue carries: an event and its weight, or the news that events were dropped after
/// the ones before it (not counted in either bound; one at a time).
enum Item {
    Event(Event, usize),
    Lagged,
}

/// The state machine's end. Sends never wait; without a consumer they are dropped.
pub struct EventSender {
    tx: mpsc::UnboundedSender<Item>,
    shared: Arc<Shared>,
}

/// The consumer's end.
pub struct EventReceiver {
    rx: mpsc::UnboundedReceiver<Item>,
    shared: Arc<Shared>,
}

/// A queue holding at most `max_events` events and `max_bytes` bytes unread.
pub fn channel(max_events: usize, max_bytes: usize) -> (EventSender, EventReceiver) {
    let shared = Arc::new(Shared {
        events: AtomicUsize::new(0),
        bytes: AtomicUsize::new(0),
        missed: AtomicU64::new(0),
        max_events,
        max_bytes,
    });
    let (tx, rx) = mpsc::unbounded_channel();
    (EventSender { tx, shared: shared.clone() }, EventReceiver { rx, shared })
}

impl EventSender {
    /// Queues `ev`, or drops it (and counts it missed) when the queue is at either bound. One
    /// sender (the state machine's applies run one at a time), so check-then-add does not race.
    pub fn send(&self, ev: Event) {
        let s = &self.shared;
        let w = weight(&ev);
        if s.events.load(Ordering::Acquire) >= s.max_events || s.bytes.load(Ordering::Acquire) + w > s.max_bytes {
            // The first drop since the consumer last heard of one queues the news.
            if s.missed.fetch_add(1, Ordering::AcqRel) == 0 {
                let _ = self.tx.send(Item::Lagged);
            }
            return;
        }
        s.events.fetch_add(1, Ordering::AcqRel);
        s.bytes.fetch_add(w, Ordering::AcqRel);
        if self.tx.send(Item::Event(ev, w)).is_err() {
            // No consumer (any more): nothing is queued.
            s.events.fetch_sub(1, Ordering::AcqRel);
            s.bytes.fetch_sub(w, Ordering::AcqRel);
        }
    }
}

impl EventReceiver {
    /// The next event; `Lagged(n)` where `n` events were dropped (after every event queued
    /// before the first of them), `Closed` once the sender is gone.
    pub async fn recv(&mut self) -> Result<Event, RecvError> {
        match self.rx.recv().await.ok_or(RecvError::Closed)? {
            Item::Event(ev, w) => {
                self.shared.events.fetch_sub(1, Ordering::AcqRel);
                self.shared.bytes.fetch_sub(w, Ordering::AcqRel);
                Ok(ev)
            }
            // Taking the count re-arms the news for the next drop.
            Item::Lagged => Err(RecvError::Lagged(self.shared.missed.swap(0, Ordering::AcqRel).max(1))),
        }
    }

    /// Bytes queued and not yet read.
    pub fn queued_bytes(&self) -> usize {
        self.shared.bytes.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Delivery;

    fn published(seq: u64, bytes: usize) -> Event {
        Event::Published(Delivery { node: 1, conn: 2, device: "d".into(), seq, payload: "x".repeat(bytes) })
    }

    #[tokio::test]
    async fn a_lagging_consumer_holds_at_most_the_byte_bound_and_is_told_what_it_missed() {
        let max = 1 << 20;
        let (tx, mut rx) = channel(MAX_EVENTS, max);
        // 64 KiB payloads: about 16 fit, the rest of 40 are dropped.
        for seq in 0..40 {
            tx.send(published(seq, 64 << 10));
            assert!(rx.queued_bytes() <= max, "{} bytes queued", rx.queued_bytes());
        }
        let kept = (max / weight(&published(0, 64 << 10))) as u64;
        // The kept ones first, in order, then the news of what was dropped after them.
        for seq in 0..kept {
            assert_eq!(rx.recv().await, Ok(published(seq, 64 << 10)));
        }
        assert_eq!(rx.recv().await, Err(RecvError::Lagged(40 - kept)));
        assert_eq!(rx.queued_bytes(), 0, "read events are freed");
        // Room again, and nothing more to report.
        tx.send(published(99, 10));
        assert_eq!(rx.recv().await, Ok(published(99, 10)));
        drop(tx);
        assert_eq!(rx.recv().await, Err(RecvError::Closed));
    }

    #[tokio::test]
    async fn the_event_bound_applies_to_small_events_too() {
        let (tx, mut rx) = channel(2, MAX_EVENT_BYTES);
        for _ in 0..5 {
            tx.send(Event::Installed);
        }
        assert_eq!(rx.recv().await, Ok(Event::Installed));
        assert_eq!(rx.recv().await, Ok(Event::Installed));
        assert_eq!(rx.recv().await, Err(RecvError::Lagged(3)));
        // A drop after the news was taken is news again.
        for _ in 0..3 {
            tx.send(Event::Installed);
        }
        assert_eq!(rx.recv().await, Ok(Event::Installed));
        assert_eq!(rx.recv().await, Ok(Event::Installed));
        assert_eq!(rx.recv().await, Err(RecvError::Lagged(1)));
    }

    #[test]
    fn only_what_concerns_the_node_is_queued() {
        assert!(concerns(&published(1, 1), Some(1)) && !concerns(&published(1, 1), Some(7)));
        assert!(concerns(&published(1, 1), None), "no node named: everything");
        assert!(!concerns(&Event::Superseded { node: 2, conn: 3 }, Some(1)));
        assert!(concerns(&Event::Swept { nodes: vec![4, 1] }, Some(1)));
        assert!(!concerns(&Event::Swept { nodes: vec![4] }, Some(1)));
        assert!(concerns(&Event::Installed, Some(1)));
    }

    #[test]
    fn without_a_consumer_nothing_is_queued() {
        let (tx, rx) = channel(MAX_EVENTS, MAX_EVENT_BYTES);
        let shared = rx.shared.clone();
        drop(rx);
        tx.send(published(1, 1000));
        assert_eq!((shared.events.load(Ordering::Acquire), shared.bytes.load(Ordering::Acquire)), (0, 0));
    }
}
