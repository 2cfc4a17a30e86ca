//! The node's own table of live device sessions (hyper stops tracking upgraded connections), so
//! kicks, drains and fencing can reach a connection by id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

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
}

#[derive(Debug)]
struct Entry {
    device: String,
    tx: mpsc::Sender<Control>,
    /// The route version its claim got; None while the claim is pending.
    version: Option<u64>,
    /// Cancelled when the session's queue overflowed (a device not reading): it closes and
    /// recovers by `sync` on its next connection.
    overflow: CancellationToken,
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
}

impl Default for Registry {
    fn default() -> Self {
        Registry { inner: Arc::default(), count: Arc::new(watch::channel(0).0) }
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

    /// Registers a session whose queue holds `capacity` commands (messages to deliver included).
    pub fn register(
        &self,
        conn: u64,
        device: &str,
        capacity: usize,
    ) -> (Registration, mpsc::Sender<Control>, mpsc::Receiver<Control>, CancellationToken) {
        let (tx, rx) = mpsc::channel(capacity.max(4));
        let overflow = CancellationToken::new();
        let entry = Entry { device: device.to_string(), tx: tx.clone(), version: None, overflow: overflow.clone() };
        let mut sessions = self.lock();
        sessions.insert(conn, entry);
        self.count.send_replace(sessions.len());
        drop(sessions);
        (Registration { registry: self.clone(), conn }, tx, rx, overflow)
    }

    /// Tells one session to do `ctl`; false if it is gone or its queue is full (a full queue
    /// closes the session: it recovers by `sync`).
    pub fn send(&self, conn: u64, ctl: Control) -> bool {
        let entry = self.lock().get(&conn).map(|e| (e.tx.clone(), e.overflow.clone()));
        let Some((tx, overflow)) = entry else { return false };
        match tx.try_send(ctl) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                overflow.cancel();
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
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

    #[tokio::test]
    async fn registration_lives_until_dropped() {
        let r = Registry::default();
        let (reg, _tx, mut rx, _overflow) = r.register(7, "d1", 4);
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
