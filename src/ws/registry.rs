//! The node's own table of live device sessions (hyper stops tracking upgraded connections), so
//! kicks, drains and fencing can reach a connection by id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

/// What a session is told to do from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Send a close frame with this code and reason, then end.
    Close { code: u16, reason: String },
    /// Send `goaway`, then close 1001.
    Goaway { reason: String },
}

#[derive(Debug)]
struct Entry {
    device: String,
    tx: mpsc::Sender<Control>,
    /// The route version its claim got; None while the claim is pending.
    version: Option<u64>,
}

/// One registered session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub conn: u64,
    pub device: String,
    pub version: Option<u64>,
}

/// Live sessions by connection id.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    inner: Arc<Mutex<HashMap<u64, Entry>>>,
}

/// Removes its session from the registry when dropped.
#[derive(Debug)]
pub struct Registration {
    registry: Registry,
    conn: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.conn);
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a session; its control channel has room for a few commands (only the first close matters).
    pub fn register(&self, conn: u64, device: &str) -> (Registration, mpsc::Sender<Control>, mpsc::Receiver<Control>) {
        let (tx, rx) = mpsc::channel(4);
        self.lock().insert(conn, Entry { device: device.to_string(), tx: tx.clone(), version: None });
        (Registration { registry: self.clone(), conn }, tx, rx)
    }

    /// Tells one session to do `ctl`; false if it is gone.
    pub fn send(&self, conn: u64, ctl: Control) -> bool {
        let tx = self.lock().get(&conn).map(|e| e.tx.clone());
        tx.is_some_and(|tx| tx.try_send(ctl).is_ok())
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_lives_until_dropped() {
        let r = Registry::default();
        let (reg, _tx, mut rx) = r.register(7, "d1");
        assert_eq!(r.sessions(), vec![Session { conn: 7, device: "d1".to_string(), version: None }]);
        r.accepted(7, 3);
        assert_eq!(r.sessions()[0].version, Some(3));
        assert!(r.send(7, Control::Close { code: 4001, reason: "superseded".into() }));
        assert_eq!(rx.try_recv().unwrap(), Control::Close { code: 4001, reason: "superseded".into() });
        assert!(!r.send(8, Control::Goaway { reason: "drain".into() }));
        drop(reg);
        assert!(r.is_empty());
        assert!(!r.send(7, Control::Goaway { reason: "drain".into() }));
    }
}
