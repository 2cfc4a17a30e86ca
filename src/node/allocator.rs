//! Gives heap memory freed after a burst back to the system. glibc keeps freed pages resident,
//! so a storm of handshakes waiting on their claims leaves its peak behind: 2,000 devices at once
//! held 16–18 KB a connection afterwards, against 7.6 KB when they arrived 32 at a time. Every
//! [`CHECK`] it asks the allocator how much free memory it holds (`mallinfo2`, on the blocking
//! pool) and, past [`should_trim`]'s bound, releases it (`malloc_trim`). The static image is built on
//! a static glibc, so it runs there too; with other C libraries the loop does nothing.
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How often the allocator is asked.
const CHECK: Duration = Duration::from_secs(10);

/// Free bytes below this are never worth a trim.
const MIN_FREE_BYTES: u64 = 8 << 20;

/// Whether `free` bytes held by the allocator, beside `used` bytes in use, should go back: at
/// least [`MIN_FREE_BYTES`], and at least a quarter of what is in use (a node that is merely
/// churning keeps its working room).
pub fn should_trim(free: u64, used: u64) -> bool {
    free >= MIN_FREE_BYTES && free.saturating_mul(4) >= used
}

/// Checks every [`CHECK`] until `cancel`; counts trims and the free bytes they handed back.
pub async fn run(metrics: Arc<Metrics>, cancel: CancellationToken) {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return;
    }
    let mut every = tokio::time::interval(CHECK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = every.tick() => {}
        }
        let Ok(Some(released)) = tokio::task::spawn_blocking(trim_if_worth_it).await else { continue };
        metrics.allocator_trims.inc();
        metrics.allocator_released_bytes.inc_by(released);
        tracing::debug!(released, "allocator: gave freed heap back to the system");
    }
}

/// Trims when [`should_trim`] says so; the free bytes the allocator counted before the trim, if
/// it trimmed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_if_worth_it() -> Option<u64> {
    // SAFETY: mallinfo2 and malloc_trim are glibc's own, thread-safe, and take no pointers.
    let info = unsafe { libc::mallinfo2() };
    let (free, used) = (info.fordblks as u64, info.uordblks as u64);
    if !should_trim(free, used) {
        return None;
    }
    // SAFETY: as above; 0 keeps no padding at the top of the main heap.
    unsafe { libc::malloc_trim(0) };
    Some(free)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_if_worth_it() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_only_a_sizeable_share_of_free_memory() {
        const MIB: u64 = 1 << 20;
        // A storm's leftovers: 20 MiB free beside 30 MiB in use.
        assert!(should_trim(20 * MIB, 30 * MIB));
        // Churn room on a big node: 20 MiB free beside 400 MiB in use is kept.
        assert!(!should_trim(20 * MIB, 400 * MIB));
        // Small change is never worth a trim, however large its share.
        assert!(!should_trim(MIB, 0));
        assert!(should_trim(MIN_FREE_BYTES, 4 * MIN_FREE_BYTES));
        assert!(!should_trim(MIN_FREE_BYTES, 4 * MIN_FREE_BYTES + 1));
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_memory_is_given_back() {
        // 32 MiB freed in 4 KiB holes between live blocks: nothing the heap's top could shed.
        let (mut freed, mut kept) = (Vec::new(), Vec::new());
        for i in 0..8192 {
            freed.push(vec![i as u8; 4096]);
            kept.push(vec![i as u8; 4096]);
        }
        drop(freed);
        let released = trim_if_worth_it().expect("32 MiB freed beside 32 MiB in use is worth a trim");
        assert!(released >= 24 << 20, "released {released} bytes");
        drop(kept);
    }
}
