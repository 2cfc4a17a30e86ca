//! The node's budget for `sync` pages (issue 12): every page a session reads from the store holds
//! its bytes of the budget (`--sync-buffer-bytes`) from the read until its frames are written, so
//! a reconnect storm in which every device syncs its backlog reads at most budget / page size
//! pages at once and holds at most the budget in memory, however many devices sync. A page that
//! finds no room is not read: the session tells its device `sync_busy` with a retry hint and
//! resumes the same sync itself after it; nothing retained is skipped or dropped.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::stream::PAGE_BYTES;
use crate::metrics::ResultLabel;

/// The budget is counted in KiB (a semaphore counts at most `u32` permits).
const UNIT: usize = 1024;

/// Base of the retry hint: a page is written in well under this on a device that reads.
pub const RETRY_BASE_MS: u64 = 100;

/// Shared by every session of the node; cheap to clone.
#[derive(Clone, Debug)]
pub struct SyncBudget {
    sem: Arc<Semaphore>,
    units: usize,
    /// `gateway_sync_pages_total{result="read"|"busy"}`.
    pages: Family<ResultLabel, Counter>,
}

/// Room for one page; released (to the budget) on drop.
#[derive(Debug)]
pub struct PagePermit(OwnedSemaphorePermit);

impl SyncBudget {
    /// A budget of `bytes` (at least one page), counting pages in `pages`.
    pub fn new(bytes: usize, pages: Family<ResultLabel, Counter>) -> SyncBudget {
        let units = bytes.max(PAGE_BYTES) / UNIT;
        SyncBudget { sem: Arc::new(Semaphore::new(units)), units, pages }
    }

    /// Room for one page of at most [`PAGE_BYTES`], or None when the budget is spent.
    pub fn try_page(&self) -> Option<PagePermit> {
        let permit = self.sem.clone().try_acquire_many_owned((PAGE_BYTES / UNIT) as u32).ok().map(PagePermit);
        let result = if permit.is_some() { "read" } else { "busy" };
        self.pages.get_or_create(&ResultLabel { result }).inc();
        permit
    }

    /// Bytes held by pages now (read or being written).
    #[cfg(test)]
    fn in_use_bytes(&self) -> usize {
        (self.units - self.sem.available_permits()) * UNIT
    }

    /// How long a refused page waits: the base, scaled by how many pages the budget holds
    /// (a small budget drains in fewer page writes), with ±50 % jitter from `seed`.
    pub fn retry_after(&self, seed: u64) -> Duration {
        let pages = (self.units * UNIT / PAGE_BYTES).max(1) as u64;
        let base = RETRY_BASE_MS.max(RETRY_BASE_MS * 8 / pages);
        let jitter = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54; // 0..1024
        Duration::from_millis(base / 2 + base * jitter / 1024)
    }
}

impl PagePermit {
    /// Gives back what the page did not use (it read `used` bytes), keeping at least one unit.
    pub fn shrink_to(&mut self, used: usize) {
        let keep = used.div_ceil(UNIT).max(1) as u32;
        let held = self.0.num_permits() as u32;
        if keep < held {
            drop(self.0.split((held - keep) as usize));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_hold_the_budget_until_dropped() {
        let b = SyncBudget::new(2 * PAGE_BYTES, Family::default());
        let first = b.try_page().expect("room for a page");
        let mut second = b.try_page().expect("room for a second page");
        assert!(b.try_page().is_none(), "a third page exceeds the budget");
        assert_eq!(b.in_use_bytes(), 2 * PAGE_BYTES);
        // A page that read 10 KB gives the rest back; with the first gone, a page fits beside it.
        second.shrink_to(10_000);
        assert_eq!(b.in_use_bytes(), PAGE_BYTES + 10 * UNIT);
        assert!(b.try_page().is_none(), "246 KiB free: still no room for a page");
        drop(first);
        let third = b.try_page().expect("room once the first page is written");
        assert_eq!(b.in_use_bytes(), PAGE_BYTES + 10 * UNIT);
        drop((second, third));
        assert_eq!(b.in_use_bytes(), 0);
    }

    #[test]
    fn a_budget_below_a_page_still_reads_one() {
        let b = SyncBudget::new(1, Family::default());
        assert!(b.try_page().is_some());
    }

    #[test]
    fn retry_hints_are_jittered_around_the_base() {
        let b = SyncBudget::new(64 * PAGE_BYTES, Family::default());
        let hints: Vec<u64> = (0..64).map(|s| b.retry_after(s).as_millis() as u64).collect();
        assert!(hints.iter().all(|h| (RETRY_BASE_MS / 2..=RETRY_BASE_MS * 3 / 2).contains(h)), "{hints:?}");
        assert!(hints.iter().any(|h| *h != hints[0]), "jittered: {hints:?}");
        // One page of budget: waits longer (8x the base), still bounded.
        let small = SyncBudget::new(PAGE_BYTES, Family::default()).retry_after(7).as_millis() as u64;
        assert!((RETRY_BASE_MS * 4..=RETRY_BASE_MS * 12).contains(&small), "{small}");
    }
}
