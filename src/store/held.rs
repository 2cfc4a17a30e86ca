//! An apply transaction kept open across applies ([`Hold`]). Most entries claim, release and
//! renew: they write device rows, lease rows, the applied meta, and the device-tenant and
//! idempotency tables, which nothing reads from the file between applies but the route lookups
//! ([`super::state::StateDb::route`], which read the held rows first), a dump (which commits
//! first) and an open. Such an apply leaves its transaction open for the next one, for at most
//! [`HOLD_FOR`] and [`HOLD_ROWS`] changed rows; an apply that writes a table read elsewhere (a
//! stream or its head, a tenant's row or ledger, a cluster event), a snapshot's save, an install,
//! a dump and the close commit it, and a thread commits an idle one. A device row that several
//! applies change is then written to its B-tree leaf once, and rows that share a leaf share one
//! copy of it, instead of one leaf copy and checksum per row per apply. A held transaction is not
//! on disk, but neither is a non-durable commit (redb keeps it in this process's memory until the
//! next durable one): a crash replays the log from the last durable commit either way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redb::{Database, Durability, WriteTransaction};

use super::state::DeviceRow;
use super::StoreError;

/// Longest an apply transaction stays open while applies come (a background thread commits an
/// idle one within twice this): bounds the applies a crash loses beyond those a non-durable
/// commit loses anyway, all replayed from the log.
pub const HOLD_FOR: Duration = Duration::from_millis(200);

/// Most device rows a held transaction changes before it commits (one entry's more at most): bounds
/// the held rows (ids of at most 128 bytes, a route and a floor each: about 1 MiB) and redb's dirty
/// pages (a 4 KiB leaf per row at worst, 16 MiB, and the branches above them).
pub const HOLD_ROWS: usize = 4096;

/// `GATEWAY_TEST_STATE_HOLD_MS` (tests and benches, like `GATEWAY_TEST_EVENT_CAPACITY`): another
/// hold in milliseconds; 0 commits every apply.
pub const HOLD_ENV: &str = "GATEWAY_TEST_STATE_HOLD_MS";

/// [`HOLD_FOR`], or [`HOLD_ENV`]'s when set.
pub(super) fn configured() -> Duration {
    let ms = std::env::var(HOLD_ENV).ok().and_then(|v| v.parse().ok());
    ms.map_or(HOLD_FOR, Duration::from_millis)
}

/// An open apply transaction.
pub(super) struct Held {
    pub(super) txn: WriteTransaction,
    opened: Instant,
}

impl Held {
    pub(super) fn begin(db: &Database) -> Result<Held, StoreError> {
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::None)?;
        Ok(Held { txn, opened: Instant::now() })
    }
}

/// The held apply transaction of one `state.redb`, if any, and the device rows it changed. The
/// last handle's drop (the last `StateDb` clone's) commits it and stops the committing thread, so
/// that the file is closed when the database is dropped, as without a hold.
pub(super) struct Hold {
    inner: Arc<Inner>,
}

struct Inner {
    /// Locked for a whole apply (or commit).
    slot: Mutex<Option<Held>>,
    /// The rows the held transaction changed, each as its last apply left it: what route lookups
    /// read first. Locked only to put or read rows, so that a lookup never waits for an apply.
    /// Emptied after every commit (so that a lookup that finds no row here finds it committed).
    rows: Mutex<HashMap<Arc<str>, DeviceRow>>,
    hold_for: Duration,
    closed: AtomicBool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Option<Held>> {
        self.slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn rows(&self) -> MutexGuard<'_, HashMap<Arc<str>, DeviceRow>> {
        self.rows.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Commits the held transaction, if any (the caller holds the slot's lock), then forgets its
    /// rows; on an error the transaction is gone all the same.
    fn commit(&self, slot: &mut Option<Held>) -> Result<(), StoreError> {
        let Some(held) = slot.take() else { return Ok(()) };
        let committed = held.txn.commit();
        self.rows().clear();
        Ok(committed?)
    }
}

impl Hold {
    /// A hold of `hold_for` (zero: none), with its committing thread when it holds at all.
    pub(super) fn start(mut hold_for: Duration) -> Hold {
        let inner = |hold_for, closed| Inner {
            slot: Mutex::new(None),
            rows: Mutex::new(HashMap::new()),
            hold_for,
            closed: AtomicBool::new(closed),
        };
        if !hold_for.is_zero() {
            let inner = Arc::new(inner(hold_for, false));
            let committer = inner.clone();
            match std::thread::Builder::new().name("state-hold".into()).spawn(move || commit_when_due(&committer)) {
                Ok(_) => return Hold { inner },
                Err(e) => {
                    // Without the thread a held transaction would wait for the next apply.
                    tracing::warn!(error = %e, "no thread to commit held applies: every apply commits");
                    hold_for = Duration::ZERO;
                }
            }
        }
        Hold { inner: Arc::new(inner(hold_for, true)) }
    }

    /// The slot, locked: an apply takes its transaction (or begins one) and puts it back or
    /// commits it with [`Hold::commit`].
    pub(super) fn lock(&self) -> MutexGuard<'_, Option<Held>> {
        self.inner.lock()
    }

    /// Whether an apply that wrote no table read outside the applies may leave `held` open with
    /// `more` changed rows besides those held already.
    pub(super) fn keeps(&self, held: &Held, more: usize) -> bool {
        held.opened.elapsed() < self.inner.hold_for && self.inner.rows().len() + more < HOLD_ROWS
    }

    /// Records the rows an apply left in the held transaction (their ids shared with the row
    /// cache's entries).
    pub(super) fn changed(&self, rows: impl IntoIterator<Item = (Arc<str>, DeviceRow)>) {
        self.inner.rows().extend(rows);
    }

    /// Commits the held transaction in `slot` (locked by the caller), if any.
    pub(super) fn commit(&self, slot: &mut Option<Held>) -> Result<(), StoreError> {
        self.inner.commit(slot)
    }

    /// After a failed apply dropped the transaction: its rows are no longer held.
    pub(super) fn forget(&self) {
        self.inner.rows().clear();
    }

    /// A device row as the held transaction changed it (`None`: not changed since the last commit).
    pub(super) fn row(&self, device: &str) -> Option<DeviceRow> {
        self.inner.rows().get(device).cloned()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Relaxed);
        if let Err(e) = self.inner.commit(&mut self.inner.lock()) {
            tracing::warn!(error = %e, "held applies not committed on close: the log replays them");
        }
    }
}

/// Commits a transaction held for the hold's length or longer, checking once per that length,
/// until the hold is closed.
fn commit_when_due(inner: &Inner) {
    // A long hold (tests) still sees its close within a second.
    let tick = inner.hold_for.min(Duration::from_secs(1));
    while !inner.closed.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        let mut slot = inner.lock();
        if slot.as_ref().is_some_and(|h| h.opened.elapsed() >= inner.hold_for) {
            if let Err(e) = inner.commit(&mut slot) {
                // The next apply finds the database refusing writes, which stops the node; the
                // log replays these applies on its next start.
                tracing::error!(error = %e, "committing held applies failed");
            }
        }
    }
}

#[cfg(test)]
#[path = "held_tests.rs"]
mod tests;
