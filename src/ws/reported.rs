//! Members that devices report gone. A device whose connection dropped after serving it dials
//! the node its `hello` named with `?fallback=<the node it lost>`; when a member's process dies,
//! its devices arrive here within the client's first backoff window, well before the cluster has
//! suspected it. Each report is only a hint: the node checks the member's cluster port itself
//! (`node::detector::Gone`) before its admission share counts the member out.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::machine::NodeId;

/// Members named by handshakes since the node's admission duty last looked. Holds member ids
/// only (resolved against the applied membership), so its size is bounded by the membership.
#[derive(Debug, Default)]
pub struct Reported {
    pending: Mutex<BTreeSet<NodeId>>,
    notify: Notify,
}

impl Reported {
    /// Notes that a device could not reach `id`. Cheap and idempotent: a storm's thousands of
    /// reports of one member wake the duty once.
    pub fn add(&self, id: NodeId) {
        let fresh = self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
        if fresh {
            self.notify.notify_one();
        }
    }

    /// The members reported since the last call, waiting for at least one.
    pub async fn take(&self) -> BTreeSet<NodeId> {
        loop {
            let ids = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
            if !ids.is_empty() {
                return ids;
            }
            self.notify.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_made_before_the_duty_waits_are_not_lost_and_are_taken_once() {
        let r = Reported::default();
        r.add(2);
        r.add(2);
        r.add(3);
        assert_eq!(r.take().await, BTreeSet::from([2, 3]));
        let late = tokio::time::timeout(std::time::Duration::from_millis(50), r.take()).await;
        assert!(late.is_err(), "nothing new was reported: {late:?}");
        r.add(2);
        assert_eq!(r.take().await, BTreeSet::from([2]));
    }
}
