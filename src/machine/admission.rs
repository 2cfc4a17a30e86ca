//! The cluster's admission budget (issue 12): handshakes per second for the whole cluster. Each
//! live node enforces its share, the budget divided by the live nodes at the log index where the
//! ring last changed, so the cluster admits about the budget whether three nodes serve or two.

use serde::{Deserialize, Serialize};

use super::{Apply, Ctx, Tables};

/// Handshakes per second (in thousandths, so the state stays exact) and the burst, cluster-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    pub milli_rate: u64,
    pub burst: u32,
}

impl Budget {
    /// The budgets a cluster accepts: 0.01 to 10^9 handshakes a second, a burst of 1 to 10^9.
    /// What the admin API refuses, the state machine ignores too (a forwarded command is not
    /// checked on the way in), so a rate of 0 can never reach a node's token bucket.
    pub fn is_valid(&self) -> bool {
        (10..=1_000_000_000_000).contains(&self.milli_rate) && (1..=1_000_000_000).contains(&self.burst)
    }

    /// Handshakes per second, cluster-wide.
    pub fn rate(&self) -> f64 {
        self.milli_rate as f64 / 1000.0
    }

    /// One node's share when `live` nodes serve: the rate divided evenly, and the burst divided
    /// rounding up (at least one handshake).
    pub fn share(&self, live: usize) -> (f64, u32) {
        let live = live.max(1);
        let burst = u32::try_from(live).map_or(1, |n| self.burst.div_ceil(n).max(1));
        (self.rate() / live as f64, burst)
    }
}

/// Sets the cluster's admission budget; `None` goes back to each node's own `--admit-rate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAdmission {
    pub budget: Option<Budget>,
}

impl Apply for SetAdmission {
    type Reply = ();

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<(), T::Error> {
        // An out-of-range budget leaves the one in force (see `Budget::is_valid`).
        if self.budget.is_none_or(|b| b.is_valid()) {
            cx.state.admission = self.budget;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_divide_the_budget_among_the_live_nodes() {
        let b = Budget { milli_rate: 300_000, burst: 10 };
        assert_eq!(b.share(3), (100.0, 4));
        assert_eq!(b.share(2), (150.0, 5));
        assert_eq!(b.share(0), (300.0, 10));
        assert_eq!(Budget { milli_rate: 500, burst: 1 }.share(3), (0.5 / 3.0, 1));
    }
}
