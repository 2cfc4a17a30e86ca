//! Releases that did not commit, kept for a retry. A closing connection releases its device's
//! route (`Release`, which deletes the route only while it still names that connection), and so
//! does a handshake whose claim's outcome is unknown. When that write fails (no leader, the write
//! timeout, a failed forward) while the node keeps its lease, no sweep ever comes: the route would
//! name this node for as long as it lives, send route lookups to a device that is gone and hold
//! one of its tenant's connections. The node keeps such releases here, bounded in bytes, and
//! proposes them again every lease/5 while it serves or drains, until each commits. A retry
//! cannot delete a newer route (the connection check). A process that dies loses the list; its
//! successor's first lease renewal releases every route the dead one left (`FirstRenew`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;

use super::{Gate, Mode};
use crate::cluster::ProposeError;
use crate::metrics::ResultLabel;

/// Most bytes the kept releases weigh ([`weight`]): about 50,000 releases of 48-byte device ids,
/// more than twice the connections a process can hold (its open-file limit).
pub const MAX_BYTES: usize = 4 << 20;

/// Releases proposed at once on a retry: one full batch of the proposer.
const RETRY_BATCH: usize = 1024;

/// What a kept release weighs: its device id, the id's box, the connection id and the queue's slot.
fn weight(device: &str) -> usize {
    device.len() + 32
}

/// The kept releases, oldest first.
#[derive(Debug, Default)]
pub struct Unreleased {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    items: VecDeque<(Box<str>, u64)>,
    bytes: usize,
    /// Releases refused since the last retry because the list was full.
    dropped: u64,
}

impl Unreleased {
    /// Keeps a release for a retry; false when the list is at its bound (the release is dropped).
    pub fn push(&self, device: &str, conn: u64) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.bytes + weight(device) > MAX_BYTES {
            inner.dropped += 1;
            return false;
        }
        inner.bytes += weight(device);
        inner.items.push_back((device.into(), conn));
        true
    }

    /// Takes up to `n` releases, oldest first, and how many were dropped since the last take.
    fn take(&self, n: usize) -> (Vec<(Box<str>, u64)>, u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let n = n.min(inner.items.len());
        let taken: Vec<_> = inner.items.drain(..n).collect();
        inner.bytes -= taken.iter().map(|(d, _)| weight(d)).sum::<usize>();
        (taken, std::mem::take(&mut inner.dropped))
    }

    /// Releases kept.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Keeps a release that did not commit for [`retry`], unless the node is stopping.
pub fn keep(g: &Gate, device: &str, conn: u64, error: &ProposeError) {
    if matches!(error, ProposeError::Stopped) {
        return;
    }
    if g.unreleased.push(device, conn) {
        tracing::debug!(%device, conn, %error, "release did not commit; kept for a retry");
    } else {
        g.metrics.release_retries.get_or_create(&ResultLabel { result: "dropped" }).inc();
    }
    g.metrics.releases_pending.set(g.unreleased.len() as i64);
}

/// Proposes the kept releases again every `every` while the node serves or drains (a starting
/// node has none, a fenced one cannot commit), at most a batch at a time; a release that fails
/// again is kept again; one Raft refused is not (`refused`).
pub async fn retry(gate: Arc<Gate>, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !matches!(*gate.mode.borrow(), Mode::Serving | Mode::Draining) || gate.unreleased.is_empty() {
            continue;
        }
        let (batch, dropped) = gate.unreleased.take(RETRY_BATCH);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                max_bytes = MAX_BYTES,
                "releases that did not commit were dropped: the list kept for retries was full; \
                 their routes stay until their devices claim again or this node's next process starts"
            );
        }
        let answers = join_all(batch.iter().map(|(device, conn)| gate.cluster.release(device, *conn))).await;
        let (mut released, mut no_route, mut failed, mut refused) = (0u64, 0u64, 0u64, 0u64);
        let mut error = None;
        for ((device, conn), answer) in batch.iter().zip(answers) {
            match answer {
                Ok(true) => released += 1,
                Ok(false) => no_route += 1,
                Err(ProposeError::Stopped) => return,
                Err(e @ ProposeError::Rejected(_)) => {
                    refused += 1;
                    error.get_or_insert(e);
                }
                Err(e) => {
                    failed += 1;
                    if !gate.unreleased.push(device, *conn) {
                        gate.metrics.release_retries.get_or_create(&ResultLabel { result: "dropped" }).inc();
                    }
                    error.get_or_insert(e);
                }
            }
        }
        let pending = gate.unreleased.len();
        gate.metrics.releases_pending.set(pending as i64);
        for (result, n) in [("released", released), ("no_route", no_route), ("failed", failed), ("refused", refused)] {
            gate.metrics.release_retries.get_or_create(&ResultLabel { result }).inc_by(n);
        }
        let error = error.map(|e| e.summary()).unwrap_or_default();
        tracing::info!(released, no_route, failed, refused, pending, error, "retried releases that did not commit");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_releases_are_bounded_in_bytes_and_taken_oldest_first() {
        let list = Unreleased::default();
        let device = "d".repeat(1000);
        let fits = MAX_BYTES / weight(&device);
        for conn in 0..fits as u64 {
            assert!(list.push(&device, conn), "release {conn} fits");
        }
        assert!(!list.push(&device, 0), "past the bound the release is dropped");
        assert!(!list.push(&"e".repeat(MAX_BYTES), 0), "one release heavier than the bound is dropped");
        assert_eq!(list.len(), fits);
        let (taken, dropped) = list.take(3);
        assert_eq!(dropped, 2, "the drops are counted once");
        assert_eq!(taken.iter().map(|(_, c)| *c).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(list.push(&device, 7), "room again after a take");
        let (rest, dropped) = list.take(usize::MAX);
        assert_eq!((rest.len(), dropped), (fits - 2, 0));
        assert_eq!(rest.last().map(|(_, c)| *c), Some(7), "a release kept again goes last");
        assert!(list.is_empty());
        assert_eq!(list.inner.lock().unwrap().bytes, 0, "the byte count follows the takes");
    }
}
