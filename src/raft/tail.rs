//! The log's tail in memory: the last entries appended, bounded in entries and in bytes, so that
//! the leader's replication streams (one read per follower per entry) copy what they send from
//! memory instead of reading and decoding it from the log's files on its writer thread. The log
//! on disk stays the truth: a range the tail does not hold whole is read from there.

use std::collections::VecDeque;

use openraft::EntryPayload;

use super::types::Entry;

/// Most entries kept.
pub const MAX_ENTRIES: usize = 4096;
/// Most bytes kept (by [`weight`]): a full tail of the largest batches is 16 MiB.
pub const MAX_BYTES: usize = 16 << 20;

/// About how many bytes an entry holds in memory: its commands' weights, or a fixed size.
pub fn weight(e: &Entry) -> usize {
    const FIXED: usize = 128;
    FIXED
        + match &e.payload {
            EntryPayload::Normal(r) => r.cmds.iter().map(|c| c.weight()).sum(),
            EntryPayload::Membership(m) => 256 * m.nodes().count(),
            EntryPayload::Blank => 0,
        }
}

/// Consecutive entries, oldest first.
#[derive(Debug, Default)]
pub struct Tail {
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
}

impl Tail {
    /// Keeps `e`, just appended. An entry that does not follow the last one kept starts afresh
    /// (the tail is always one run of consecutive indexes).
    /// Answers the entry's [`weight`].
    pub fn push(&mut self, e: &Entry) -> usize {
        if self.entries.back().is_some_and(|(last, _)| last.log_id.index + 1 != e.log_id.index) {
            self.clear();
        }
        let w = weight(e);
        self.entries.push_back((e.clone(), w));
        self.bytes += w;
        while self.entries.len() > MAX_ENTRIES || (self.bytes > MAX_BYTES && !self.entries.is_empty()) {
            self.pop_front();
        }
        w
    }

    /// Entries `start..=end`, if the tail holds every one of them.
    pub fn get(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let first = self.entries.front()?.0.log_id.index;
        let last = self.entries.back()?.0.log_id.index;
        if start < first || end > last || start > end {
            return None;
        }
        let from = (start - first) as usize;
        let to = (end - first) as usize;
        Some(self.entries.range(from..=to).map(|(e, _)| e.clone()).collect())
    }

    /// Forgets entries with index >= `from` (a conflicting suffix was deleted).
    pub fn truncate(&mut self, from: u64) {
        while self.entries.back().is_some_and(|(e, _)| e.log_id.index >= from) {
            if let Some((_, w)) = self.entries.pop_back() {
                self.bytes -= w;
            }
        }
    }

    /// Forgets entries with index <= `upto` (purged).
    pub fn purge(&mut self, upto: u64) {
        while self.entries.front().is_some_and(|(e, _)| e.log_id.index <= upto) {
            self.pop_front();
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    fn pop_front(&mut self) {
        if let Some((_, w)) = self.entries.pop_front() {
            self.bytes -= w;
        }
    }

    #[cfg(test)]
    fn bounds(&self) -> Option<(u64, u64)> {
        Some((self.entries.front()?.0.log_id.index, self.entries.back()?.0.log_id.index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{Claim, Command};
    use crate::raft::types::log_id;
    use crate::raft::types::Request;

    fn entry(index: u64, device_bytes: usize) -> Entry {
        let claim = Claim { device: "d".repeat(device_bytes), node: 1, conn: index, epoch: 0, attempt: 1 };
        Entry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Normal(Request { cmds: vec![Command::Claim(claim)].into() }),
        }
    }

    #[test]
    fn serves_whole_ranges_only() {
        let mut t = Tail::default();
        for i in 5..=9 {
            t.push(&entry(i, 4));
        }
        let got: Vec<u64> = t.get(6, 8).unwrap().iter().map(|e| e.log_id.index).collect();
        assert_eq!(got, [6, 7, 8]);
        assert!(t.get(4, 6).is_none(), "starts before the tail");
        assert!(t.get(8, 10).is_none(), "ends after it");
        assert!(t.get(7, 6).is_none());
        assert_eq!(t.get(9, 9).unwrap()[0], entry(9, 4));
    }

    #[test]
    fn follows_truncate_purge_and_gaps() {
        let mut t = Tail::default();
        for i in 1..=6 {
            t.push(&entry(i, 4));
        }
        t.truncate(5);
        assert_eq!(t.bounds(), Some((1, 4)));
        // A new entry 5 (another term's) replaces the deleted one.
        let mut other = entry(5, 8);
        other.log_id = log_id(2, 2, 5);
        t.push(&other);
        assert_eq!(t.get(5, 5).unwrap()[0], other);
        t.purge(2);
        assert_eq!(t.bounds(), Some((3, 5)));
        // An entry that does not follow (a snapshot installed meanwhile) starts afresh.
        t.push(&entry(42, 4));
        assert_eq!(t.bounds(), Some((42, 42)));
        t.truncate(0);
        assert_eq!((t.bounds(), t.bytes), (None, 0));
    }

    #[test]
    fn stays_within_its_bounds() {
        let mut t = Tail::default();
        for i in 1..=(MAX_ENTRIES as u64 + 10) {
            t.push(&entry(i, 1));
        }
        assert_eq!(t.entries.len(), MAX_ENTRIES);
        assert_eq!(t.bounds(), Some((11, MAX_ENTRIES as u64 + 10)));
        // Large entries: the byte bound cuts first, from the oldest.
        let big = MAX_BYTES / 4;
        for i in 1..=10 {
            t.push(&entry(MAX_ENTRIES as u64 + 10 + i, big));
        }
        assert!(t.bytes <= MAX_BYTES, "{} bytes", t.bytes);
        assert_eq!(t.bounds().unwrap().1, MAX_ENTRIES as u64 + 20);
        let mut lone = Tail::default();
        lone.push(&entry(1, 2 * MAX_BYTES));
        assert_eq!(lone.bounds(), None, "a single entry over the bound is not kept");
    }
}
