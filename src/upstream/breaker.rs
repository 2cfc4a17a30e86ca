//! A circuit breaker for one upstream endpoint: closed → (N consecutive failures) → open →
//! (after `open_ms`) half-open, where exactly one probe goes through; its success closes the
//! breaker, its failure opens it again. Pure: time comes in as milliseconds, no clock, no I/O.

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed {
        failures: u32,
    },
    Open {
        until_ms: u64,
    },
    /// One probe is out; everyone else is refused until it reports (or, should it never report,
    /// until `until_ms`, when the next caller becomes the probe).
    HalfOpen {
        until_ms: u64,
    },
}

/// The answer to "may a try go to this endpoint now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Yes; `probe` when it is the half-open probe (its report decides the state).
    Yes { probe: bool },
    /// No; the endpoint may be tried again in about this long.
    No { retry_after_ms: u64 },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    state: State,
    failures_to_open: u32,
    open_ms: u64,
}

impl Breaker {
    pub fn new(failures_to_open: u32, open_ms: u64) -> Breaker {
        Breaker { state: State::Closed { failures: 0 }, failures_to_open: failures_to_open.max(1), open_ms }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The gauge value: 0 closed, 1 half-open, 2 open.
    pub fn gauge(&self) -> i64 {
        match self.state {
            State::Closed { .. } => 0,
            State::HalfOpen { .. } => 1,
            State::Open { .. } => 2,
        }
    }

    /// Whether a try may start at `now_ms`. An open breaker whose time is up admits the caller
    /// as its probe (and becomes half-open).
    pub fn admit(&mut self, now_ms: u64) -> Admit {
        match self.state {
            State::Closed { .. } => Admit::Yes { probe: false },
            State::Open { until_ms } | State::HalfOpen { until_ms } if now_ms >= until_ms => {
                self.state = State::HalfOpen { until_ms: now_ms.saturating_add(self.open_ms) };
                Admit::Yes { probe: true }
            }
            State::Open { until_ms } => Admit::No { retry_after_ms: until_ms - now_ms },
            // The probe takes at most a try's timeout: callers come back after a fraction of open_ms.
            State::HalfOpen { until_ms } => {
                Admit::No { retry_after_ms: (self.open_ms / 4).clamp(1, until_ms - now_ms) }
            }
        }
    }

    /// A try admitted by [`Breaker::admit`] succeeded (the endpoint answered, even with a 4xx).
    pub fn success(&mut self, probe: bool) {
        match self.state {
            State::HalfOpen { .. } if probe => self.state = State::Closed { failures: 0 },
            State::Closed { .. } => self.state = State::Closed { failures: 0 },
            // A try admitted before the breaker opened: the probe decides.
            _ => {}
        }
    }

    /// A try admitted by [`Breaker::admit`] failed (connect error, timeout, 5xx).
    pub fn failure(&mut self, probe: bool, now_ms: u64) {
        let open = State::Open { until_ms: now_ms.saturating_add(self.open_ms) };
        match self.state {
            State::HalfOpen { .. } if probe => self.state = open,
            State::Closed { failures } if failures + 1 >= self.failures_to_open => self.state = open,
            State::Closed { failures } => self.state = State::Closed { failures: failures + 1 },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_only() {
        let mut b = Breaker::new(3, 1000);
        b.failure(false, 0);
        b.failure(false, 1);
        b.success(false);
        assert_eq!(b.state(), State::Closed { failures: 0 }, "a success resets the count");
        for t in 0..3 {
            assert_eq!(b.admit(10 + t), Admit::Yes { probe: false });
            b.failure(false, 10 + t);
        }
        assert_eq!(b.state(), State::Open { until_ms: 1012 });
        assert_eq!(b.admit(500), Admit::No { retry_after_ms: 512 });
        assert_eq!(b.gauge(), 2);
    }

    #[test]
    fn half_open_lets_one_probe_through_and_follows_it() {
        let mut b = Breaker::new(1, 1000);
        b.failure(false, 0);
        assert_eq!(b.admit(1000), Admit::Yes { probe: true });
        assert_eq!(b.gauge(), 1);
        assert!(matches!(b.admit(1001), Admit::No { .. }), "a second caller waits for the probe");
        b.failure(true, 1200);
        assert_eq!(b.state(), State::Open { until_ms: 2200 }, "a failed probe opens it again");
        assert_eq!(b.admit(2200), Admit::Yes { probe: true });
        b.success(false);
        assert_eq!(b.state(), State::HalfOpen { until_ms: 3200 }, "only the probe's report decides");
        b.success(true);
        assert_eq!(b.state(), State::Closed { failures: 0 });
        assert_eq!(b.admit(2300), Admit::Yes { probe: false });
    }

    #[test]
    fn a_probe_that_never_reports_is_replaced() {
        let mut b = Breaker::new(1, 1000);
        b.failure(false, 0);
        assert_eq!(b.admit(1000), Admit::Yes { probe: true });
        assert_eq!(b.admit(1999), Admit::No { retry_after_ms: 1 });
        assert_eq!(b.admit(2000), Admit::Yes { probe: true });
    }

    #[test]
    fn late_reports_from_before_the_opening_change_nothing() {
        let mut b = Breaker::new(1, 1000);
        b.failure(false, 0);
        b.failure(false, 5);
        assert_eq!(b.state(), State::Open { until_ms: 1000 }, "a second failure does not extend it");
        b.success(false);
        assert_eq!(b.state(), State::Open { until_ms: 1000 });
    }
}
