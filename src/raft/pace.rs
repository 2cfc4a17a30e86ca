//! When a snapshot the log policy asks for is worth what it costs.
//!
//! openraft asks for a snapshot every `--snapshot-logs` entries. A snapshot writes the whole state
//! (every device row, about a microsecond each on every node, and a transient copy of the state in
//! memory), so at a fixed entry count a large state would spend more on its snapshots than on the
//! commands between them: at a million devices and one claim an entry, ~100 µs a claim. A policy
//! snapshot is therefore deferred while the entries this node applied since its last snapshot
//! weigh less, in bytes ([`super::tail::weight`]: their commands and a fixed overhead each), than
//! that snapshot; openraft asks again `--snapshot-logs` entries later. Snapshot work is then at
//! most about one byte written per byte of entries applied, whatever the size of the state, and
//! the log between snapshots holds about as many bytes of entries as the state has. A snapshot a
//! follower needs (its entries purged: openraft forces it) is never deferred, nor the first one
//! after a start. A deferral still commits the applied state durably, as the snapshot's save
//! would have: a crash replays no more of the log than before, and redb reuses the pages that
//! the non-durable applies freed.

use std::sync::{Arc, Mutex, MutexGuard};

/// The last snapshot this node built or installed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Last {
    /// [`Pace::applied`] when it was taken.
    at: u64,
    /// Its size in bytes.
    bytes: u64,
}

/// The weight of what this node applied and where the last snapshot stood. Cloned into each
/// snapshot builder, which records what it built.
#[derive(Debug, Default, Clone)]
pub struct Pace {
    applied: u64,
    last: Arc<Mutex<Last>>,
}

impl Pace {
    fn last(&self) -> MutexGuard<'_, Last> {
        self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts entries of `weight` (summed [`super::tail::weight`]) as applied.
    pub fn applied(&mut self, weight: u64) {
        self.applied = self.applied.saturating_add(weight);
    }

    /// Whether a snapshot should be built now: always when `force`d, else once the entries
    /// applied since the last one weigh at least as much as it. `Err` carries the weight still
    /// missing.
    pub fn due(&self, force: bool) -> Result<(), u64> {
        let last = *self.last();
        let since = self.applied - last.at;
        match force || since >= last.bytes {
            true => Ok(()),
            false => Err(last.bytes - since),
        }
    }

    /// A mark of the state as it stands, for [`Pace::built`]: a builder made now dumps this
    /// state or a later one.
    pub fn mark(&self) -> u64 {
        self.applied
    }

    /// A snapshot of `bytes` was built from the state at `mark` or later. An older mark than the
    /// last snapshot's (a build that finished after an install) changes nothing.
    pub fn built(&self, mark: u64, bytes: usize) {
        let mut last = self.last();
        if mark >= last.at {
            *last = Last { at: mark, bytes: bytes as u64 };
        }
    }

    /// A snapshot of `bytes` from the leader replaced the state.
    pub fn installed(&self, bytes: usize) {
        *self.last() = Last { at: self.applied, bytes: bytes as u64 };
    }
}

#[cfg(test)]
mod tests {
    use super::Pace;

    #[test]
    fn defers_until_the_commands_since_weigh_as_much_as_the_last_snapshot() {
        let mut pace = Pace::default();
        assert_eq!(pace.due(false), Ok(()), "the first snapshot after a start is never deferred");
        pace.applied(500);
        let builder = pace.clone();
        let mark = builder.mark();
        pace.applied(100); // applied while the builder dumps
        builder.built(mark, 1_000);
        assert_eq!(pace.due(false), Err(900), "100 of the 1,000 bytes applied since");
        assert_eq!(pace.due(true), Ok(()), "a forced snapshot is never deferred");
        pace.applied(899);
        assert_eq!(pace.due(false), Err(1));
        pace.applied(1);
        assert_eq!(pace.due(false), Ok(()));

        pace.installed(5_000);
        assert_eq!(pace.due(false), Err(5_000), "an installed snapshot counts as the last one");
        // A build that began before the install and ended after it does not replace it.
        builder.built(mark, 10);
        assert_eq!(pace.due(false), Err(5_000));
        pace.applied(5_000);
        assert_eq!(pace.due(false), Ok(()));
    }
}
