//! Which runtime serves a connection the cluster listener accepted. Raft's runtime runs on one
//! worker (see `node`'s module doc): a claim whose connection is served there reaches the
//! proposer, Raft's core and the log with no hand-off between threads, and one client's claim
//! costs half the thread wake-ups it cost on two workers. The first [`NEAR`] connections open at
//! a time are served there; every connection past them is served on the cluster API runtime's
//! workers, so that the HTTP work of many clients (a backend's pool, followers' forwards in a
//! storm) spreads over its threads instead of queueing on Raft's one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::runtime::Handle;

/// Connections the cluster listener serves on Raft's runtime at once: a few backends' claims,
/// eight clients' included (benches/LEVERS.md, "Raft's runtime on one worker").
pub const NEAR: usize = 16;

/// Places the cluster listener's connections: the first `limit` open ones on the runtime that
/// accepted them, the rest on `far`.
#[derive(Clone)]
pub struct Spill {
    far: Handle,
    near: Arc<AtomicUsize>,
    limit: usize,
}

/// Where one connection runs.
pub enum Place {
    /// On the accepting runtime; the connection holds its slot until this is dropped.
    Near(Slot),
    /// On the other runtime.
    Far(Handle),
}

/// A connection's slot on the accepting runtime.
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Spill {
    pub fn new(far: Handle, limit: usize) -> Spill {
        Spill { far, near: Arc::default(), limit }
    }

    /// Where the next accepted connection runs.
    pub fn place(&self) -> Place {
        let room = self.near.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < self.limit).then_some(n + 1));
        match room {
            Ok(_) => Place::Near(Slot(self.near.clone())),
            Err(_) => Place::Far(self.far.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_connections_stay_near_and_a_closed_one_gives_its_slot_back() {
        let spill = Spill::new(Handle::current(), 2);
        let (a, b) = (spill.place(), spill.place());
        assert!(matches!((&a, &b), (Place::Near(_), Place::Near(_))));
        assert!(matches!(spill.place(), Place::Far(_)), "a third open connection goes far");
        drop(a);
        let c = spill.place();
        assert!(matches!(c, Place::Near(_)), "a closed connection's slot is free again");
        assert!(matches!(spill.place(), Place::Far(_)));
        drop((b, c));
        assert!(matches!(spill.place(), Place::Near(_)));
    }
}
