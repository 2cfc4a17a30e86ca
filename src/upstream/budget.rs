//! The retry budget (as linkerd's and finagle's): over a sliding window, retries may be at most
//! `ratio` × first tries plus `min_per_s` × the window, so an upstream outage costs at most
//! about (1 + ratio) × the intents, however many tries each up may make. Pure: time comes in as
//! milliseconds.
//!
//! Why not `tower::retry::budget::TpsBudget`: it reads `Instant::now()` itself (so its rule
//! cannot be unit-tested on a clock we step) and would bring tower's middleware stack for ~60
//! lines of arithmetic; the rule is the same.

/// Slots the window is divided into: the window slides by `window / SLOTS`.
const SLOTS: usize = 10;

#[derive(Debug, Clone)]
pub struct RetryBudget {
    slot_ms: u64,
    ratio: f64,
    /// Retries the window allows whatever the traffic (`min_per_s` × window).
    floor: f64,
    /// Per slot: (slot number, first tries, retries).
    slots: [(u64, u64, u64); SLOTS],
}

impl RetryBudget {
    pub fn new(window_ms: u64, ratio: f64, min_per_s: f64) -> RetryBudget {
        let slot_ms = (window_ms / SLOTS as u64).max(1);
        let floor = min_per_s * (slot_ms * SLOTS as u64) as f64 / 1000.0;
        RetryBudget { slot_ms, ratio, floor, slots: [(u64::MAX, 0, 0); SLOTS] }
    }

    fn slot(&mut self, now_ms: u64) -> &mut (u64, u64, u64) {
        let n = now_ms / self.slot_ms;
        let s = &mut self.slots[(n % SLOTS as u64) as usize];
        if s.0 != n {
            *s = (n, 0, 0);
        }
        s
    }

    /// (first tries, retries) within the window ending at `now_ms`.
    pub fn totals(&self, now_ms: u64) -> (u64, u64) {
        let n = now_ms / self.slot_ms;
        let live = self.slots.iter().filter(|s| s.0 != u64::MAX && s.0 <= n && n - s.0 < SLOTS as u64);
        live.fold((0, 0), |(f, r), s| (f + s.1, r + s.2))
    }

    /// Records a first try.
    pub fn deposit(&mut self, now_ms: u64) {
        self.slot(now_ms).1 += 1;
    }

    /// Takes one retry from the budget if the window allows it.
    pub fn withdraw(&mut self, now_ms: u64) -> bool {
        let (firsts, retries) = self.totals(now_ms);
        if (retries + 1) as f64 > self.ratio * firsts as f64 + self.floor {
            return false;
        }
        self.slot(now_ms).2 += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_stay_within_a_tenth_of_first_tries_plus_the_floor() {
        let mut b = RetryBudget::new(10_000, 0.1, 0.0);
        for t in 0..1000 {
            b.deposit(t);
        }
        let granted = (0..1000).filter(|t| b.withdraw(1000 + t)).count();
        assert_eq!(granted, 100, "10 % of 1000 first tries");
        let mut floor = RetryBudget::new(10_000, 0.1, 1.0);
        assert_eq!((0..100).filter(|t| floor.withdraw(*t)).count(), 10, "1/s over a 10 s window, no traffic");
    }

    #[test]
    fn the_window_slides() {
        let mut b = RetryBudget::new(10_000, 0.5, 0.0);
        for _ in 0..10 {
            b.deposit(0);
        }
        assert_eq!((0..10).filter(|_| b.withdraw(500)).count(), 5);
        assert_eq!(b.totals(9_999), (10, 5));
        assert!(!b.withdraw(9_999));
        // 10 s later the deposits and withdrawals of slot 0 have left the window.
        assert_eq!(b.totals(10_000), (0, 0));
        assert!(!b.withdraw(10_000), "nothing to retry against");
        b.deposit(10_000);
        b.deposit(10_001);
        assert!(b.withdraw(10_002));
        assert!(!b.withdraw(10_003));
    }

    #[test]
    fn any_sequence_keeps_the_bound_over_every_window() {
        // A deterministic pseudo-random mix of firsts and retry requests over 60 s.
        let (mut b, mut x) = (RetryBudget::new(10_000, 0.1, 1.0), 7u64);
        let mut events = Vec::new();
        for t in (0..60_000).step_by(3) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            match x >> 62 {
                0 => {
                    b.deposit(t);
                    events.push((t, true));
                }
                _ => {
                    if b.withdraw(t) {
                        events.push((t, false));
                    }
                }
            }
        }
        // Over every aligned window: retries <= 0.1 x firsts + 10 (the floor).
        for start in (0..60_000).step_by(1_000) {
            let inside = events.iter().filter(|(t, _)| (start..start + 10_000).contains(t));
            let (firsts, retries) =
                inside.fold((0, 0), |(f, r), (_, first)| if *first { (f + 1, r) } else { (f, r + 1) });
            assert!(
                retries as f64 <= 0.1 * firsts as f64 + 10.0,
                "window at {start}: {retries} retries, {firsts} firsts"
            );
        }
    }
}
