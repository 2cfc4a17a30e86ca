//! The queue of apply events from the state machine to its one consumer (the device side's
//! `ws::enforce_routes`), bounded in events and in bytes while the consumer lags. Past either
//! bound an event is dropped and the consumer is told it lagged: it reconciles its sessions with
//! the routes and catches them up from the streams, as it does after a snapshot.
//!
//! A `tokio::sync::broadcast` channel did this before, but it keeps its last `capacity` events
//! whether or not they were read: every publish's event carries its payload, so after a burst of
//! large publishes 4096 payloads stayed allocated (256 MiB at the default 64 KiB payload limit,
//! 4 GiB at 1 MiB). Here an event is freed once it is read.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use crate::machine::Event;

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

struct Shared {
    /// Events and bytes queued and not yet read.
    events: AtomicUsize,
    bytes: AtomicUsize,
    /// Events dropped since the consumer was last told.
    missed: AtomicU64,
    max_events: usize,
    max_bytes: usize,
}

/// The state machine's end. Sends never wait; without a consumer they are dropped.
pub struct EventSender {
    tx: mpsc::UnboundedSender<(Event, usize)>,
    shared: Arc<Shared>,
}

/// The consumer's end.
pub struct EventReceiver {
    rx: mpsc::UnboundedReceiver<(Event, usize)>,
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
            s.missed.fetch_add(1, Ordering::AcqRel);
            return;
        }
        s.events.fetch_add(1, Ordering::AcqRel);
        s.bytes.fetch_add(w, Ordering::AcqRel);
        if self.tx.send((ev, w)).is_err() {
            // No consumer (any more): nothing is queued.
            s.events.fetch_sub(1, Ordering::AcqRel);
            s.bytes.fetch_sub(w, Ordering::AcqRel);
        }
    }
}

impl EventReceiver {
    /// The next event; `Lagged(n)` first when `n` events were dropped since the last call
    /// (the queue still holds some: the one that filled it), `Closed` once the sender is gone.
    pub async fn recv(&mut self) -> Result<Event, RecvError> {
        let missed = self.shared.missed.swap(0, Ordering::AcqRel);
        if missed > 0 {
            return Err(RecvError::Lagged(missed));
        }
        let (ev, w) = self.rx.recv().await.ok_or(RecvError::Closed)?;
        self.shared.events.fetch_sub(1, Ordering::AcqRel);
        self.shared.bytes.fetch_sub(w, Ordering::AcqRel);
        Ok(ev)
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
        assert_eq!(rx.recv().await, Err(RecvError::Lagged(40 - kept)));
        for seq in 0..kept {
            assert_eq!(rx.recv().await, Ok(published(seq, 64 << 10)));
        }
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
        assert_eq!(rx.recv().await, Err(RecvError::Lagged(3)));
        assert_eq!(rx.recv().await, Ok(Event::Installed));
        assert_eq!(rx.recv().await, Ok(Event::Installed));
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
