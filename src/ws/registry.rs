//! The node's own table of live device sessions (hyper stops tracking upgraded connections), so
//! kicks, drains and fencing can reach a connection by id. It holds at most `max_sessions`, and
//! each session's mailbox is bounded in commands and in the payload bytes it holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::queue::{self, TrySendError};

/// What a session is told to do from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Send a close frame with this code and reason, then end.
    Close { code: u16, reason: String },
    /// Send `goaway`, then close 1001.
    Goaway { reason: String },
    /// A message the log applied for this connection's device.
    Deliver { seq: u64, payload: String },
    /// The device asked for its stream after `after` (from the reader).
    Sync { after: u64 },
    /// The device acknowledged up to `seq` (from the reader).
    Ack { seq: u64 },
    /// Pushes may have been missed (the apply events lagged): send what the store has beyond
    /// what this connection sent.
    CatchUp,
}

/// A session's end of its mailbox.
#[derive(Debug)]
pub struct Mailbox {
    pub tx: queue::Sender<Control>,
    pub rx: queue::Receiver<Control>,
    /// Cancelled when the mailbox overflowed (a device not reading): it closes and recovers by
    /// `sync` on its next connection.
    pub overflow: CancellationToken,
    /// Cancelled when a close or goaway was posted: a write blocked on a device that does not
    /// read gives up instead of holding the session until its write timeout.
    pub kicked: CancellationToken,
    /// Payload bytes of the deliveries waiting in `rx` (the session subtracts what it takes).
    pub queued: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct Entry {
    device: String,
    tx: queue::Sender<Control>,
    /// The route version its claim got; None while the claim is pending.
    version: Option<u64>,
    overflow: CancellationToken,
    kicked: CancellationToken,
    queued: Arc<AtomicUsize>,
}

/// One registered session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub conn: u64,
    pub device: String,
    pub version: Option<u64>,
}

/// Live sessions by connection id.
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<Mutex<HashMap<u64, Entry>>>,
    /// The number of sessions, for [`Registry::wait_empty`].
    count: Arc<watch::Sender<usize>>,
    limits: Limits,
}

/// What the registry bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Sessions at once (`--max-connections`).
    pub max_sessions: usize,
    /// Commands one mailbox holds (`--send-queue`).
    pub queue: usize,
    /// Payload bytes of deliveries one mailbox holds (`--send-queue-bytes`).
    pub queue_bytes: usize,
}

/// The registry is full (`--max-connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub max: usize,
}

impl Registry {
    pub fn new(limits: Limits) -> Registry {
        Registry { inner: Arc::default(), count: Arc::new(watch::channel(0).0), limits }
    }
}

/// Removes its session from the registry when dropped.
#[derive(Debug)]
pub struct Registration {
    registry: Registry,
    conn: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut sessions = self.registry.lock();
        sessions.remove(&self.conn);
        self.registry.count.send_replace(sessions.len());
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a session, unless `max_sessions` are registered already.
    pub fn register(&self, conn: u64, device: &str) -> Result<(Registration, Mailbox), Full> {
        let (tx, rx) = queue::bounded(self.limits.queue.max(4));
        let (overflow, kicked, queued) = (CancellationToken::new(), CancellationToken::new(), Arc::default());
        let entry = Entry {
            device: device.to_string(),
            tx: tx.clone(),
            version: None,
            overflow: overflow.clone(),
            kicked: kicked.clone(),
            queued: Arc::clone(&queued),
        };
        let mut sessions = self.lock();
        if sessions.len() >= self.limits.max_sessions {
            return Err(Full { max: self.limits.max_sessions });
        }
        sessions.insert(conn, entry);
        self.count.send_replace(sessions.len());
        drop(sessions);
        Ok((Registration { registry: self.clone(), conn }, Mailbox { tx, rx, overflow, kicked, queued }))
    }

    /// Tells one session to do `ctl`; false if it is gone or its mailbox is full, in commands or
    /// in payload bytes (a full mailbox closes the session: it recovers by `sync`).
    pub fn send(&self, conn: u64, ctl: Control) -> bool {
        let entry =
            self.lock().get(&conn).map(|e| (e.tx.clone(), e.overflow.clone(), e.kicked.clone(), e.queued.clone()));
        let Some((tx, overflow, kicked, queued)) = entry else { return false };
        let bytes = match &ctl {
            Control::Deliver { payload, .. } => payload.len(),
            _ => 0,
        };
        if bytes > 0 && queued.fetch_add(bytes, Ordering::Relaxed) + bytes > self.limits.queue_bytes {
            queued.fetch_sub(bytes, Ordering::Relaxed);
            overflow.cancel();
            return false;
        }
        let kick = matches!(ctl, Control::Close { .. } | Control::Goaway { .. });
        match tx.try_send(ctl) {
            Ok(()) => {
                if kick {
                    kicked.cancel();
                }
                true
            }
            Err(e) => {
                queued.fetch_sub(bytes, Ordering::Relaxed);
                if matches!(e, TrySendError::Full(_)) {
                    overflow.cancel();
                }
                false
            }
        }
    }

    /// Records the route version the session's claim was accepted with.
    pub fn accepted(&self, conn: u64, version: u64) {
        if let Some(e) = self.lock().get_mut(&conn) {
            e.version = Some(version);
        }
    }

    /// Every session registered now.
    pub fn sessions(&self) -> Vec<Session> {
        self.lock().iter().map(|(c, e)| Session { conn: *c, device: e.device.clone(), version: e.version }).collect()
    }

    /// The most sessions this node holds at once (`--max-connections`).
    pub fn max_sessions(&self) -> usize {
        self.limits.max_sessions
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once no session is registered (sessions end by dropping their registration).
    pub async fn wait_empty(&self) {
        let mut count = self.count.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = count.wait_for(|n| *n == 0).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { max_sessions: 2, queue: 4, queue_bytes: 100 };

    #[test]
    fn sessions_and_mailboxes_are_bounded() {
        let r = Registry::new(LIMITS);
        let (_a, mut ma) = r.register(1, "d1").unwrap();
        let (_b, mb) = r.register(2, "d2").unwrap();
        assert_eq!(r.register(3, "d3").unwrap_err(), Full { max: 2 });
        // Bytes: 60 + 40 fit, one more byte overflows the mailbox (and is not queued).
        let deliver = |seq, n| Control::Deliver { seq, payload: "x".repeat(n) };
        assert!(r.send(1, deliver(1, 60)) && r.send(1, deliver(2, 40)));
        assert!(!ma.overflow.is_cancelled());
        assert!(!r.send(1, deliver(3, 1)));
        assert!(ma.overflow.is_cancelled());
        assert_eq!(ma.queued.load(Ordering::Relaxed), 100);
        assert_eq!(ma.rx.try_recv().unwrap(), deliver(1, 60));
        // Commands: four fit, the fifth overflows.
        for seq in 0..4 {
            assert!(r.send(2, Control::Ack { seq }));
        }
        assert!(!mb.overflow.is_cancelled() && !r.send(2, Control::Ack { seq: 9 }) && mb.overflow.is_cancelled());
        // A close posted to a session also tells its writer to stop waiting on a blocked write.
        let (_c, mc) = {
            drop(_a);
            r.register(3, "d3").unwrap()
        };
        assert!(!mc.kicked.is_cancelled());
        assert!(r.send(3, Control::Close { code: 4001, reason: "superseded".into() }));
        assert!(mc.kicked.is_cancelled());
    }

    #[tokio::test]
    async fn registration_lives_until_dropped() {
        let r = Registry::new(Limits { max_sessions: 10, ..LIMITS });
        let (reg, Mailbox { mut rx, .. }) = r.register(7, "d1").unwrap();
        assert_eq!(r.sessions(), vec![Session { conn: 7, device: "d1".to_string(), version: None }]);
        r.accepted(7, 3);
        assert_eq!(r.sessions()[0].version, Some(3));
        assert!(r.send(7, Control::Close { code: 4001, reason: "superseded".into() }));
        assert_eq!(rx.try_recv().unwrap(), Control::Close { code: 4001, reason: "superseded".into() });
        assert!(!r.send(8, Control::Goaway { reason: "drain".into() }));
        let waiting = r.clone();
        let empty = tokio::spawn(async move { waiting.wait_empty().await });
        tokio::task::yield_now().await;
        assert!(!empty.is_finished(), "wait_empty resolved while a session was registered");
        drop(reg);
        tokio::time::timeout(std::time::Duration::from_secs(5), empty).await.unwrap().unwrap();
        assert!(r.is_empty());
        assert!(!r.send(7, Control::Goaway { reason: "drain".into() }));
    }
}
