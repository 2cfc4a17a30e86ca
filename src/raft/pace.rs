//! When a snapshot the log policy asks for is worth what it costs.
//!
//! openraft asks for a snapshot every `--snapshot-logs` entries. A snapshot writes the whole state
//! (every device row, about a microsecond each on every node, and a transient copy of the state in
//! memory), so at a fixed entry count a large state would spend more on its snapshots than on the
//! commands between them: at a million devices and one claim an entry, ~100 µs a claim. A policy
//! snapshot is therefore deferred while the entries this node applied since its last snapshot
//! weigh less, in bytes ([`super::tail::weight`]: about what their commands hold in memory and a
//! fixed 128 bytes each, roughly four times a device's row in a snapshot at one claim an entry),
//! than that snapshot; openraft asks again `--snapshot-logs` entries later. Snapshot work is then
//! bounded by the weight of the entries applied, whatever the size of the state, and the log
//! between snapshots holds entries of about the state's weight. Never deferred: the first
//! snapshot after a start (the pace starts at zero: a restart of a large node costs one), and one
//! openraft forces (at startup, when its log is purged and no snapshot is stored). A lagging
//! follower gets the stored snapshot and then the entries since it, as before, but those can now be
//! a state's worth. A deferral still commits the applied state durably, as the snapshot's save
//! would have: a crash replays no more of the log than before, and redb reuses the pages that the
//! non-durable applies freed.

use std::sync::{Arc, Mutex, MutexGuard};

/// The last snapshot this node built or installed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Last {
    /// [`Pace::applied`] when it was taken.
    at: u64,
    /// Its size in bytes.
    bytes: u64,
    /// Snapshots installed so far.
    installs: u64,
}

/// The state as a snapshot builder found it: see [`Pace::mark`].
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    at: u64,
    installs: u64,
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
    pub fn mark(&self) -> Mark {
        Mark { at: self.applied, installs: self.last().installs }
    }

    /// A snapshot of `bytes` was built from the state at `mark` or later. A build that began
    /// before an install and ended after it changes nothing: the installed snapshot is the last.
    pub fn built(&self, mark: Mark, bytes: usize) {
        let mut last = self.last();
        if mark.installs == last.installs {
            *last = Last { at: mark.at, bytes: bytes as u64, installs: last.installs };
        }
    }

    /// A snapshot of `bytes` from the leader replaced the state.
    pub fn installed(&self, bytes: usize) {
        let mut last = self.last();
        *last = Last { at: self.applied, bytes: bytes as u64, installs: last.installs + 1 };
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
        // A build that began before the install and ended after it does not replace it, even
        // with nothing applied between the two.
        builder.built(mark, 10);
        assert_eq!(pace.due(false), Err(5_000));
        let tied = pace.mark();
        pace.installed(4_000);
        pace.built(tied, 10);
        assert_eq!(pace.due(false), Err(4_000));
        pace.applied(4_000);
        assert_eq!(pace.due(false), Ok(()));
    }
}
