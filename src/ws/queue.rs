//! A session's bounded queues (its mailbox, and its reader's replies to the writer) that cost
//! nothing while empty: a tokio `mpsc` channel allocates its first 32-slot block and its
//! semaphore up front, ~800 bytes a channel, which two channels per idle session made a tenth of
//! its memory. Here the items live in a `VecDeque` that allocates on the first item and is
//! trimmed when drained; wake-ups are two `Notify`s. Many senders, one receiver; bounded in items.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// A drained queue keeps room for this many items (the common one-at-a-time traffic).
const KEEP: usize = 4;

struct Shared<T> {
    state: Mutex<State<T>>,
    cap: usize,
    /// An item was queued, or the last sender went.
    readable: Notify,
    /// An item was taken, or the receiver went.
    writable: Notify,
}

struct State<T> {
    items: VecDeque<T>,
    senders: usize,
    receiver: bool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the oldest item and tells a sender waiting for room.
    fn take(&self) -> Option<T> {
        let mut state = self.lock();
        let item = state.items.pop_front()?;
        if state.items.is_empty() && state.items.capacity() > KEEP {
            state.items.shrink_to(KEEP);
        }
        drop(state);
        self.writable.notify_one();
        Some(item)
    }
}

/// Why [`Sender::try_send`] did not queue the item (which it hands back).
#[derive(Debug, PartialEq, Eq)]
pub enum TrySendError<T> {
    /// `cap` items are queued.
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

/// A queue of at most `cap` items (at least one).
pub fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State { items: VecDeque::new(), senders: 1, receiver: true }),
        cap: cap.max(1),
        readable: Notify::new(),
        writable: Notify::new(),
    });
    (Sender(Arc::clone(&shared)), Receiver(shared))
}

pub struct Sender<T>(Arc<Shared<T>>);

impl<T> Sender<T> {
    /// Queues `item` unless the queue is full or the receiver is gone.
    pub fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        let mut state = self.0.lock();
        if !state.receiver {
            return Err(TrySendError::Closed(item));
        }
        if state.items.len() >= self.0.cap {
            return Err(TrySendError::Full(item));
        }
        state.items.push_back(item);
        drop(state);
        self.0.readable.notify_one();
        Ok(())
    }

    /// Queues `item`, waiting for room; hands it back if the receiver is gone.
    pub async fn send(&self, mut item: T) -> Result<(), T> {
        loop {
            let room = self.0.writable.notified();
            tokio::pin!(room);
            // Registered before the check, so a take between the check and the wait is not lost.
            room.as_mut().enable();
            match self.try_send(item) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Closed(back)) => return Err(back),
                Err(TrySendError::Full(back)) => item = back,
            }
            room.await;
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.0.lock().senders += 1;
        Sender(Arc::clone(&self.0))
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.senders -= 1;
        let last = state.senders == 0;
        drop(state);
        if last {
            self.0.readable.notify_one();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").field("cap", &self.0.cap).finish_non_exhaustive()
    }
}

pub struct Receiver<T>(Arc<Shared<T>>);

impl<T> Receiver<T> {
    /// The oldest item, if one is queued.
    pub fn try_recv(&mut self) -> Option<T> {
        self.0.take()
    }

    /// The oldest item, waiting for one; `None` once every sender is gone and the queue is
    /// drained. Cancel-safe: an item is taken only when this returns it.
    pub async fn recv(&mut self) -> Option<T> {
        loop {
            let ready = self.0.readable.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            if let Some(item) = self.0.take() {
                return Some(item);
            }
            if self.0.lock().senders == 0 {
                return None;
            }
            ready.await;
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let items = {
            let mut state = self.0.lock();
            state.receiver = false;
            std::mem::take(&mut state.items)
        };
        self.0.writable.notify_waiters();
        // Dropped outside the lock (an item's drop may take other locks).
        drop(items);
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").field("cap", &self.0.cap).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn bounded_in_order_and_room_is_waited_for() {
        let (tx, mut rx) = bounded(2);
        assert_eq!(tx.try_send(1), Ok(()));
        assert_eq!(tx.try_send(2), Ok(()));
        assert_eq!(tx.try_send(3), Err(TrySendError::Full(3)));
        // A sender waiting for room gets it when the receiver takes an item.
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(3).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "send did not wait for room");
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(tokio::time::timeout(WAIT, waiting).await.unwrap().unwrap(), Ok(()));
        assert_eq!(rx.try_recv(), Some(2));
        assert_eq!(rx.try_recv(), Some(3));
        assert_eq!(rx.try_recv(), None);
    }

    #[tokio::test]
    async fn recv_waits_and_ends_with_the_last_sender() {
        let (tx, mut rx) = bounded::<u32>(4);
        let tx2 = tx.clone();
        let got = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(v) = rx.recv().await {
                got.push(v);
            }
            got
        });
        tokio::task::yield_now().await;
        tx.try_send(7).unwrap();
        drop(tx);
        tx2.send(8).await.unwrap();
        drop(tx2);
        assert_eq!(tokio::time::timeout(WAIT, got).await.unwrap().unwrap(), vec![7, 8]);
    }

    #[tokio::test]
    async fn a_gone_receiver_refuses_and_releases_waiting_senders() {
        let (tx, rx) = bounded(1);
        tx.try_send(Box::new(1)).unwrap();
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(Box::new(2)).await }
        });
        tokio::task::yield_now().await;
        drop(rx);
        assert_eq!(tokio::time::timeout(WAIT, waiting).await.unwrap().unwrap(), Err(Box::new(2)));
        assert_eq!(tx.try_send(Box::new(3)), Err(TrySendError::Closed(Box::new(3))));
    }

    #[test]
    fn a_drained_queue_gives_its_room_back() {
        let (tx, mut rx) = bounded(64);
        for i in 0..64 {
            tx.try_send(i).unwrap();
        }
        assert!(tx.0.lock().items.capacity() >= 64);
        while rx.try_recv().is_some() {}
        assert!(tx.0.lock().items.capacity() <= KEEP);
    }
}
