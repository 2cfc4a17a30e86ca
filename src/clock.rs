//! Clocks, read in one place. [`ClusterClock`] is the time leases and retention run on: the
//! `at_ms` leaders stamp into commands, extrapolated on this node's monotonic clock from the
//! newest stamp it applied, so a stepped wall clock (NTP, an operator, a VM resume) cannot expire
//! nodes or stall sweeps. The wall clock only seeds cluster time once, for a cluster's first stamp.
//! `machine` never reads a clock.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Tests only: a file holding a signed number of milliseconds added to the wall clock, read again
/// at most every [`OFFSET_REFRESH`], so a test can step a running node's wall clock.
pub const TEST_WALL_OFFSET_ENV: &str = "GATEWAY_TEST_WALL_OFFSET_FILE";
const OFFSET_REFRESH: Duration = Duration::from_millis(50);

/// Milliseconds since the Unix epoch on this node's wall clock.
pub fn now_ms() -> u64 {
    let wall = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    wall.saturating_add_signed(test_offset_ms())
}

fn test_offset_ms() -> i64 {
    static CACHE: Mutex<Option<(Instant, i64)>> = Mutex::new(None);
    let Some(path) = std::env::var_os(TEST_WALL_OFFSET_ENV) else { return 0 };
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    match *cache {
        Some((read, offset)) if read.elapsed() < OFFSET_REFRESH => offset,
        _ => {
            let offset = std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
            *cache = Some((Instant::now(), offset));
            offset
        }
    }
}

/// Cluster time on this node: the newest stamp applied plus the monotonic time since.
#[derive(Debug, Default)]
pub struct ClusterClock {
    /// (cluster ms, when this node reached it); none before the first stamp.
    anchor: Mutex<Option<(u64, Instant)>>,
}

impl ClusterClock {
    /// Cluster time now: never goes backwards on this node. Before any stamp was applied (a
    /// fresh cluster) it is the wall clock.
    pub fn now_ms(&self) -> u64 {
        match *self.lock() {
            Some((ms, at)) => ms.saturating_add(at.elapsed().as_millis() as u64),
            None => now_ms(),
        }
    }

    /// The applied state reached cluster time `ms` (its newest stamp). Stamps are taken before
    /// they commit, so this node's own extrapolation may already be ahead: it never moves back.
    pub fn observe(&self, ms: u64) {
        if ms == 0 {
            return;
        }
        let mut anchor = self.lock();
        let now = anchor.map_or(0, |(at_ms, at)| at_ms.saturating_add(at.elapsed().as_millis() as u64));
        *anchor = Some((ms.max(now), Instant::now()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(u64, Instant)>> {
        self.anchor.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_time_follows_stamps_and_never_goes_back() {
        let clock = ClusterClock::default();
        let wall = now_ms();
        assert!(clock.now_ms() >= wall, "before any stamp: the wall clock");
        clock.observe(1_000);
        let t1 = clock.now_ms();
        assert!((1_000..1_000 + 5_000).contains(&t1), "{t1}");
        // An older stamp (applied late) does not move it back.
        clock.observe(10);
        assert!(clock.now_ms() >= t1);
        // A newer one moves it forward.
        clock.observe(50_000);
        assert!(clock.now_ms() >= 50_000);
        // It advances with the monotonic clock between stamps.
        let before = clock.now_ms();
        std::thread::sleep(Duration::from_millis(20));
        assert!(clock.now_ms() >= before + 20);
    }
}
