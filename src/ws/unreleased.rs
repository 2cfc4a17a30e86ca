//! Releases that did not commit, kept for a retry. A closing connection releases its device's
//! route (`Release`, which deletes the route only while it still names that connection), and so
//! does a handshake whose claim's outcome is unknown. When that write fails (no leader, the write
//! timeout, a failed forward) while the node keeps its lease, no sweep ever comes: the route would
//! name this node for as long as it lives, send route lookups to a device that is gone and hold
//! one of its tenant's connections. The node keeps such releases here, bounded in bytes, and
//! proposes them again every lease/5 while it serves or drains, until each commits or has been
//! tried [`MAX_TRIES`] times. A retry cannot delete a newer route (the connection check). A process
//! that dies loses the list; its successor's first lease renewal releases every route the dead
//! one left (`FirstRenew`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;

use super::{Gate, Mode};
use crate::cluster::ProposeError;
use crate::metrics::ResultLabel;

/// Most tries of one release (the first included): with the default lease, a write that failed
/// this often while the node served (it renewed its lease meanwhile) for about two minutes is not
/// going to commit.
pub const MAX_TRIES: u32 = 64;

/// Releases proposed at once on a retry: one full batch of the proposer.
const RETRY_BATCH: usize = 1024;

/// What a kept release weighs besides its device id: the id's box, the connection id and the try
/// count, the queue's slot, and the allocator's overhead for the id.
const ENTRY_BYTES: usize = 64;

fn weight(device: &str) -> usize {
    device.len() + ENTRY_BYTES
}

/// The bound for a node that holds at most `max_sessions` connections: two releases of the longest
/// device id for each (every connection ended during one outage, and as many handshakes whose
/// claims' outcome was unknown), and at least 1 MiB. 18,976 connections: 7.3 MB.
pub fn max_bytes(max_sessions: usize) -> usize {
    max_sessions.saturating_mul(2).saturating_mul(crate::token::MAX_DEVICE_ID + ENTRY_BYTES).max(1 << 20)
}

/// Whether a release that failed with `e` is worth trying again: every failure but a refusal
/// (which would refuse again). A forward that found the leader stopping is a failed forward, not
/// this node's stop (`cluster::forward`).
fn retryable(e: &ProposeError) -> bool {
    !matches!(e, ProposeError::Rejected(_))
}

/// One kept release.
#[derive(Debug)]
struct Kept {
    device: Box<str>,
    conn: u64,
    tries: u32,
}

/// The kept releases, oldest first.
#[derive(Debug)]
pub struct Unreleased {
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    items: VecDeque<Kept>,
    bytes: usize,
    /// Releases refused since the last take because the list was full.
    dropped: u64,
}

impl Unreleased {
    pub fn new(max_bytes: usize) -> Unreleased {
        Unreleased { max_bytes, inner: Mutex::default() }
    }

    /// Keeps a release for a retry; false when the list is at its bound (the release is dropped).
    fn push(&self, kept: Kept) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.bytes + weight(&kept.device) > self.max_bytes {
            inner.dropped += 1;
            return false;
        }
        inner.bytes += weight(&kept.device);
        inner.items.push_back(kept);
        true
    }

    /// Takes up to `n` releases, oldest first, and how many were dropped since the last take. The
    /// queue gives its memory back once empty (a spike's thousands of releases are retried once).
    fn take(&self, n: usize) -> (Vec<Kept>, u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let n = n.min(inner.items.len());
        let taken: Vec<_> = inner.items.drain(..n).collect();
        inner.bytes -= taken.iter().map(|k| weight(&k.device)).sum::<usize>();
        if inner.items.is_empty() {
            inner.items.shrink_to_fit();
        }
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

/// Keeps a release that did not commit for [`retry`], unless the node is stopping (its process
/// ends) or Raft refused it.
pub fn keep(g: &Gate, device: &str, conn: u64, error: &ProposeError) {
    if matches!(error, ProposeError::Stopped) {
        return;
    }
    if !retryable(error) {
        tracing::warn!(%device, conn, %error, "a release was refused; its route stays until the device claims again");
        return;
    }
    tracing::debug!(%device, conn, %error, "release did not commit; kept for a retry");
    if !g.unreleased.push(Kept { device: device.into(), conn, tries: 1 }) {
        g.metrics.releases_dropped.inc();
    }
    g.metrics.releases_pending.set(g.unreleased.len() as i64);
}

/// What one retry round came to.
#[derive(Debug, Default)]
struct Round {
    released: u64,
    no_route: u64,
    failed: u64,
    refused: u64,
    gave_up: u64,
    error: Option<String>,
}

/// Proposes the kept releases again every `every` while the node serves or drains (a starting
/// node has none, a fenced one cannot commit), at most a batch at a time; a release that fails
/// again is kept again, unless Raft refused it or it was tried [`MAX_TRIES`] times.
pub async fn retry(gate: Arc<Gate>, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Every tick, not only after a round: a `keep` may have set it from a length a round then
        // changed.
        gate.metrics.releases_pending.set(gate.unreleased.len() as i64);
        if !matches!(*gate.mode.borrow(), Mode::Serving | Mode::Draining) || gate.unreleased.is_empty() {
            continue;
        }
        let (batch, dropped) = gate.unreleased.take(RETRY_BATCH);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                max_bytes = gate.unreleased.max_bytes,
                "releases that did not commit were dropped: the list kept for retries was full; \
                 their routes stay until their devices claim again or this node's next process starts"
            );
        }
        let answers = join_all(batch.iter().map(|k| gate.cluster.release(&k.device, k.conn)));
        let answers = tokio::select! {
            _ = stop.cancelled() => return,
            answers = answers => answers,
        };
        let round = settle(&gate, batch, answers);
        let pending = gate.unreleased.len();
        gate.metrics.releases_pending.set(pending as i64);
        let Round { released, no_route, failed, refused, gave_up, error } = round;
        for (result, n) in [("released", released), ("no_route", no_route), ("failed", failed), ("refused", refused)] {
            gate.metrics.release_retries.get_or_create(&ResultLabel { result }).inc_by(n);
        }
        let error = error.unwrap_or_default();
        tracing::info!(
            released,
            no_route,
            failed,
            refused,
            gave_up,
            pending,
            error,
            "retried releases that did not commit"
        );
    }
}

/// Counts a round's answers and keeps again what failed and may be tried again.
fn settle(gate: &Gate, batch: Vec<Kept>, answers: Vec<Result<bool, ProposeError>>) -> Round {
    let mut round = Round::default();
    for (mut kept, answer) in batch.into_iter().zip(answers) {
        let e = match answer {
            Ok(true) => {
                round.released += 1;
                continue;
            }
            Ok(false) => {
                round.no_route += 1;
                continue;
            }
            Err(e) => e,
        };
        round.error.get_or_insert_with(|| e.summary());
        if !retryable(&e) {
            round.refused += 1;
            continue;
        }
        round.failed += 1;
        kept.tries += 1;
        if kept.tries >= MAX_TRIES {
            round.gave_up += 1;
            gate.metrics.releases_dropped.inc();
        } else if !gate.unreleased.push(kept) {
            gate.metrics.releases_dropped.inc();
        }
    }
    round
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(device: &str, conn: u64) -> Kept {
        Kept { device: device.into(), conn, tries: 1 }
    }

    #[test]
    fn the_kept_releases_are_bounded_in_bytes_and_taken_oldest_first() {
        let list = Unreleased::new(1 << 20);
        let device = "d".repeat(1000);
        let fits = (1 << 20) / weight(&device);
        for conn in 0..fits as u64 {
            assert!(list.push(kept(&device, conn)), "release {conn} fits");
        }
        assert!(!list.push(kept(&device, 0)), "past the bound the release is dropped");
        assert!(!list.push(kept(&"e".repeat(1 << 20), 0)), "one release heavier than the bound is dropped");
        assert_eq!(list.len(), fits);
        let (taken, dropped) = list.take(3);
        assert_eq!(dropped, 2, "the drops are counted once");
        assert_eq!(taken.iter().map(|k| k.conn).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(list.push(kept(&device, 7)), "room again after a take");
        let (rest, dropped) = list.take(usize::MAX);
        assert_eq!((rest.len(), dropped), (fits - 2, 0));
        assert_eq!(rest.last().map(|k| k.conn), Some(7), "a release kept again goes last");
        assert!(list.is_empty());
        let inner = list.inner.lock().unwrap();
        assert_eq!((inner.bytes, inner.items.capacity()), (0, 0), "an empty list holds no memory");
    }

    #[test]
    fn the_bound_holds_two_releases_of_the_longest_id_for_each_connection() {
        let longest = weight(&"d".repeat(crate::token::MAX_DEVICE_ID));
        assert_eq!(longest, 192);
        assert_eq!(max_bytes(18_976), 2 * 18_976 * longest);
        assert_eq!(max_bytes(10), 1 << 20, "at least 1 MiB");
        assert_eq!(max_bytes(usize::MAX), usize::MAX, "no overflow");
    }

    #[test]
    fn only_a_refusal_is_not_retried() {
        for e in
            [ProposeError::NoLeader, ProposeError::Timeout(5), ProposeError::Forward("x".into()), ProposeError::Stopped]
        {
            assert!(retryable(&e), "{e:?}");
        }
        assert!(!retryable(&ProposeError::Rejected("no".into())));
    }
}
