//! The applied device rows kept in memory ([`RowCache`]), bounded in bytes. A handshake that
//! may steer its device reads the device's route and floor before the claim (placement); from
//! the `devices` table that was a read transaction on the blocking pool, two hand-offs between
//! threads, and it cost one node about a third more CPU per handshake than the claim alone (README,
//! Benchmarks). The cache answers it on the worker instead; a device it does not hold is read
//! from the table, now in place (`cluster::Handle::route_in_place`).
//!
//! It is written through, never filled by a read: each apply puts the rows it changed when it
//! ends (committed, or held open for the next apply: `store::held`), under the apply's lock, so
//! entries follow the log in order; an open or an install clears it and puts the rows its scan
//! reads until the budget is full (the first in key order: putting every row of a million-device
//! state, and evicting all but the last few percent, took a fifth of an open's time). A row not
//! held (never written since the open, or evicted) is read from the table. A held row is the
//! applied one, as of the last apply that finished: the answer `StateDb::route` gives at that
//! moment (the held transaction's rows, else the table's). So the next apply, which runs under
//! the same lock, reads a device's row from here too when it is held (a reconnecting device's
//! claim, a release), and walks the table only for the others.

use std::sync::Arc;

use quick_cache::sync::Cache;
use quick_cache::Weighter;

use super::state::RouteAndFloor;

/// Bytes one entry is weighed at besides its device id: the id's shared allocation (its two
/// counts; the held transaction's copy of a changed row shares it, `store::held`), the route and
/// floor (72), quick_cache's slot (and its share of the ghost entries it keeps of evicted ids) and
/// the hash table, with the growth of its vectors. Measured as glibc's in-use bytes (`mallinfo2`,
/// `uordblks + hblkhd`) around filling a cache with three times the rows its budget holds, in a
/// release build: 0.57–0.60 × budgets of 1 to 64 MiB at 16-, 24- and 36-byte ids. The table is
/// presized from this figure and its vectors grow by doubling, so the figure steps: at 360 (before
/// the ids were shared, when 360 measured 0.94–0.96 × at 16-byte ids) shared ids took a 1 MiB
/// budget at 16-byte ids to 1.00 ×.
pub(super) const ENTRY_BYTES: usize = 376;

/// A typical device id's length, in the middle of the 16–36 bytes [`ENTRY_BYTES`] was measured
/// at: it only presizes the cache's table (`bytes / (ENTRY_BYTES + TYPICAL_ID_BYTES)` items); the
/// weights bound what it holds.
const TYPICAL_ID_BYTES: usize = 24;

/// What the cache weighs: an entry's bytes, its device id included.
#[derive(Clone, Copy)]
struct Bytes;

impl Weighter<Arc<str>, RouteAndFloor> for Bytes {
    fn weight(&self, device: &Arc<str>, _: &RouteAndFloor) -> u64 {
        RowCache::weight_of(device)
    }
}

/// device → its applied route and floor, for the rows written or scanned since the open, up to
/// a budget in bytes (the coldest go first).
pub(super) struct RowCache {
    rows: Cache<Arc<str>, RouteAndFloor, Bytes>,
}

impl RowCache {
    /// A cache holding at most `bytes` of entries (at 16- to 36-byte ids, `bytes` / 392–412 rows).
    pub(super) fn new(bytes: usize) -> Self {
        let items = bytes / (ENTRY_BYTES + TYPICAL_ID_BYTES);
        RowCache { rows: Cache::with_weighter(items.max(1), bytes.max(1) as u64, Bytes) }
    }

    /// The applied route and floor of `device`, if held.
    pub(super) fn get(&self, device: &str) -> Option<RouteAndFloor> {
        self.rows.get(device)
    }

    /// Records `device`'s applied row (both None: it has none). The id may be shared with the
    /// held transaction's copy of the row (`store::held`).
    pub(super) fn put(&self, device: impl Into<Arc<str>>, row: RouteAndFloor) {
        self.rows.insert(device.into(), row);
    }

    /// The bytes it holds at most, as weighed.
    pub(super) fn budget(&self) -> u64 {
        self.rows.capacity()
    }

    /// What an entry for `device` weighs.
    pub(super) fn weight_of(device: &str) -> u64 {
        (device.len() + ENTRY_BYTES) as u64
    }

    /// Forgets every row (before an install replaces the table).
    pub(super) fn clear(&self) {
        self.rows.clear();
    }

    /// Every row held.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (Arc<str>, RouteAndFloor)> + '_ {
        self.rows.iter()
    }

    /// The bytes held, as weighed.
    #[cfg(test)]
    pub(super) fn weight(&self) -> u64 {
        self.rows.weight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{Floor, Route};

    fn row(node: u64) -> RouteAndFloor {
        let floor = Floor { max_version: node, max_epoch: 0, max_attempt: node, last_node: node };
        (Some(Route { node, conn: node, version: node }), Some(floor))
    }

    #[test]
    fn a_row_put_is_answered_replaced_by_the_next_and_forgotten_by_a_clear() {
        let cache = RowCache::new(1 << 20);
        assert_eq!(cache.get("d1"), None, "a row never put is not held");
        cache.put("d1", row(1));
        assert_eq!(cache.get("d1"), Some(row(1)));
        cache.put("d1", row(2));
        assert_eq!(cache.get("d1"), Some(row(2)), "the later apply's row answers");
        cache.put("d1", (None, None));
        assert_eq!(cache.get("d1"), Some((None, None)), "a deleted row is held as having none");
        cache.clear();
        assert_eq!(cache.get("d1"), None);
    }

    #[test]
    fn the_cache_holds_no_more_than_its_budget_in_bytes() {
        let budget = 64 << 10;
        let cache = RowCache::new(budget);
        let id = |i: usize| format!("device-{i:029}"); // 36 bytes, the longest ids the docs size for
        let n = 10 * budget / (ENTRY_BYTES + 36);
        for i in 0..n {
            cache.put(id(i), row(i as u64));
            assert!(cache.weight() <= budget as u64, "{} bytes held after {i} rows, budget {budget}", cache.weight());
        }
        let held = (0..n).filter(|i| cache.get(&id(*i)).is_some()).count();
        assert!(held > 0 && held <= budget / (ENTRY_BYTES + 36), "{held} of {n} rows held in {budget} bytes");
        // The latest rows are the ones a reconnecting device asks for next.
        assert_eq!(cache.get(&id(n - 1)), Some(row(n as u64 - 1)));
    }
}
