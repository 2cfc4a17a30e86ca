//! Overload-driven admission (issue 12, item 4): AIMD on the share of handshakes admitted, driven
//! by claim commit latency and this node's apply lag (committed entries not yet applied: above
//! [`APPLY_LAG_ENTRIES`], a handshake counts as a slow sample, since the node would serve its
//! device from a state that is behind). Each window (as long as the threshold, at least 250 ms) in which more
//! than 1 % of the handshakes' claims took longer than the threshold (p99 above it) halves the
//! share, down to 5 % (so claims keep measuring the store); a window without that adds 10 %, up
//! to all. Refused handshakes get 503 `overloaded` + Retry-After. An election is not overload:
//! a new Raft term drops the window and admits everything again, and a claim that began in an
//! older term is not a sample (claims park while the cluster has no leader; after a leader's death
//! they had halved the share for seconds past the election, and a 1,490-device storm's last
//! devices backed off 13 s instead of 4), nor is the apply lag in a term's first window. Nor is a
//! handshake shed while the node's admission paces its refusals (see [`Overload::admit`]): the
//! operator's rate is then the pace. Each window that changes the share is told once
//! ([`Overload::take_shift`]) for the log. Pure over an injected `Instant` and term: it reads no
//! clock of its own.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Apply lag, in log entries, above which a handshake counts as slow. With two batches in flight
/// (the proposer's `MAX_IN_FLIGHT`) a node that keeps up is at most a few entries behind between
/// a commit and its apply; 64 entries (up to 64 × 1024 commands) is a state machine that has
/// fallen behind the log, not a moment's scheduling.
pub const APPLY_LAG_ENTRIES: u64 = 64;

/// The smallest share admitted: probes that tell when latency comes back.
pub const MIN_SHARE: f64 = 0.05;
const DECREASE: f64 = 0.5;
const INCREASE: f64 = 0.1;

/// A window that changed the admitted share: lowered it, or brought it back to all. For the log
/// line that tells an operator why handshakes are shed ([`Overload::take_shift`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shift {
    pub from: f64,
    pub to: f64,
    /// The closing window's samples: claims and apply-lag readings, and how many of each were slow.
    pub samples: u64,
    pub slow_commits: u64,
    pub lagging: u64,
}

#[derive(Debug)]
struct Window {
    share: f64,
    started: Instant,
    samples: u64,
    slow_commits: u64,
    lagging: u64,
    shift: Option<Shift>,
    /// Fractional admissions owed: each handshake adds `share`, one admission spends 1.
    credit: f64,
    /// The newest Raft term seen (`observe_term`), and when this node first saw it.
    term: u64,
    term_seen: Instant,
}

impl Window {
    /// Admitting everything, with no sample yet, from `now` in `term`.
    fn fresh(now: Instant, term: u64) -> Window {
        Window {
            share: 1.0,
            started: now,
            samples: 0,
            slow_commits: 0,
            lagging: 0,
            shift: None,
            credit: 0.0,
            term,
            term_seen: now,
        }
    }
}

/// The controller; `threshold` zero turns it off.
#[derive(Debug)]
pub struct Overload {
    threshold: Duration,
    window: Duration,
    w: Mutex<Window>,
}

impl Overload {
    pub fn new(threshold: Duration, now: Instant) -> Overload {
        let window = threshold.max(Duration::from_millis(250));
        Overload { threshold, window, w: Mutex::new(Window::fresh(now, 0)) }
    }

    /// Closes the windows that ended by `now`: the one with samples decides down or up; each
    /// later one, empty, adds [`INCREASE`].
    fn roll(&self, w: &mut Window, now: Instant) {
        let elapsed = now.saturating_duration_since(w.started);
        if elapsed < self.window {
            return;
        }
        let slow = w.slow_commits + w.lagging;
        let overloaded = slow > 0 && slow * 100 > w.samples;
        let from = w.share;
        w.share = if overloaded { (w.share * DECREASE).max(MIN_SHARE) } else { (w.share + INCREASE).min(1.0) };
        let empty = (elapsed.as_nanos() / self.window.as_nanos()).saturating_sub(1).min(10) as f64;
        w.share = (w.share + INCREASE * empty).min(1.0);
        if w.share < from || (w.share >= 1.0 && from < 1.0) {
            let (samples, slow_commits, lagging) = (w.samples, w.slow_commits, w.lagging);
            w.shift = Some(Shift { from, to: w.share, samples, slow_commits, lagging });
        }
        let into_current = Duration::from_nanos((elapsed.as_nanos() % self.window.as_nanos()) as u64);
        w.started = now - into_current;
        (w.samples, w.slow_commits, w.lagging) = (0, 0, 0);
    }

    /// A claim took `latency` to commit (or did not commit within it).
    pub fn observe(&self, latency: Duration, now: Instant) {
        if self.threshold.is_zero() {
            return;
        }
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        self.roll(&mut w, now);
        w.samples += 1;
        w.slow_commits += u64::from(latency > self.threshold);
    }

    /// The Raft term as this node sees it now. A newer one than before (an election happened)
    /// forgives the slow samples and the lowered share: they were the election's.
    pub fn observe_term(&self, term: u64, now: Instant) {
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        if term > w.term {
            let from = w.share;
            *w = Window::fresh(now, term);
            if from < 1.0 {
                w.shift = Some(Shift { from, to: 1.0, samples: 0, slow_commits: 0, lagging: 0 });
            }
        }
    }

    /// The node was `lag` entries behind the log when a handshake came: a slow sample above
    /// [`APPLY_LAG_ENTRIES`], a fast one otherwise. No sample in the first window of a term: a
    /// new leader commits at once what the election held back, and every node applies that
    /// backlog (after a leader's `kill -9` under 30,000 devices, the survivors' first window of the
    /// new term found 16 and 42 handshakes behind the log and nothing else slow, and halved).
    pub fn observe_apply_lag(&self, lag: u64, now: Instant) {
        if self.threshold.is_zero() {
            return;
        }
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_duration_since(w.term_seen) < self.window {
            return;
        }
        self.roll(&mut w, now);
        w.samples += 1;
        w.lagging += u64::from(lag > APPLY_LAG_ENTRIES);
    }

    /// `Ok` to go on, or `Err(retry_after_secs)` for a 503 `overloaded`. `paced`: the node's
    /// admission is pacing its refusals ([`super::admission::Admission::pacing`]), so this
    /// handshake most likely came on the turn it was promised, and the node admits at the rate
    /// the operator gave it, which `plan-storm` models: it is not shed. Shedding a device that
    /// waited for its turn throws the turn away and sends the device into exponential backoff;
    /// in a leader kill under 30,000 devices that left the last re-homed devices 30 s out (4.8×
    /// the model at 100 %, against 1.2× with no shedding). Overload control sheds what admission
    /// lets through unpaced. `paced` is asked only when the share is below all: at full share a
    /// handshake costs no look at admission.
    pub fn admit(&self, now: Instant, paced: impl FnOnce() -> bool) -> Result<(), u64> {
        if self.threshold.is_zero() {
            return Ok(());
        }
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        self.roll(&mut w, now);
        if w.share >= 1.0 || paced() {
            return Ok(());
        }
        w.credit = (w.credit + w.share).min(1.0);
        if w.credit >= 1.0 - 1e-9 {
            w.credit -= 1.0;
            Ok(())
        } else {
            Err(self.window.as_secs().max(1))
        }
    }

    /// The last change of the share that no one took yet: a lowered share, or all admitted again.
    pub fn take_shift(&self) -> Option<Shift> {
        self.w.lock().unwrap_or_else(|p| p.into_inner()).shift.take()
    }

    /// The share of handshakes admitted now (1.0: not overloaded).
    pub fn share(&self, now: Instant) -> f64 {
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        self.roll(&mut w, now);
        w.share
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(500);

    fn admitted(o: &Overload, n: usize, now: Instant) -> usize {
        (0..n).filter(|_| o.admit(now, || false).is_ok()).count()
    }

    #[test]
    fn an_election_is_not_overload() {
        let t0 = Instant::now();
        let o = Overload::new(T, t0);
        o.observe_term(3, t0);
        // Claims parked while the leader was gone: two windows of slow samples halve the share twice.
        o.observe(T * 4, t0);
        o.observe(T * 4, t0 + T);
        assert_eq!(o.share(t0 + 2 * T), 0.25);
        // The same term again changes nothing; a new one (the election) admits everything again.
        o.observe_term(3, t0 + 2 * T);
        assert_eq!(o.share(t0 + 2 * T), 0.25);
        o.observe_term(4, t0 + 2 * T);
        assert_eq!(o.share(t0 + 2 * T), 1.0);
        assert_eq!(o.take_shift().map(|s| (s.from, s.to)), Some((0.25, 1.0)), "the log is told it is all again");
        assert_eq!(admitted(&o, 100, t0 + 2 * T), 100);
        // Slow commits in the new term are load again.
        o.observe(T * 4, t0 + 2 * T);
        assert_eq!(o.share(t0 + 3 * T), 0.5);
        // An older term (a stale reading) forgives nothing.
        o.observe_term(3, t0 + 3 * T);
        assert_eq!(o.share(t0 + 3 * T), 0.5);
    }

    #[test]
    fn slow_commits_halve_the_share_and_fast_ones_bring_it_back() {
        let t0 = Instant::now();
        let o = Overload::new(T, t0);
        assert_eq!(admitted(&o, 100, t0), 100, "not overloaded: everything passes");
        // One window with its p99 above the threshold: the share halves, then halves again.
        for k in 0..50 {
            o.observe(if k % 10 == 0 { T * 2 } else { T / 10 }, t0);
        }
        assert_eq!(o.share(t0 + T), 0.5);
        assert_eq!(admitted(&o, 100, t0 + T), 50);
        o.observe(T * 3, t0 + T);
        assert_eq!(o.share(t0 + 2 * T), 0.25);
        assert_eq!(admitted(&o, 100, t0 + 2 * T), 25);
        // It never sheds everything.
        for k in 2..20 {
            o.observe(T * 3, t0 + k * T);
        }
        assert_eq!(o.share(t0 + 20 * T), MIN_SHARE);
        assert_eq!(admitted(&o, 100, t0 + 20 * T), 5);
        assert_eq!(o.admit(t0 + 20 * T, || false), Err(1));
        assert_eq!(o.admit(t0 + 20 * T, || true), Ok(()), "a paced handshake came on its turn");
        // Fast windows (or none at all) add 10 % each: all back within 10 windows.
        o.observe(T / 10, t0 + 20 * T);
        assert!((o.share(t0 + 21 * T) - 0.15).abs() < 1e-9);
        assert_eq!(o.share(t0 + 31 * T), 1.0);
        assert_eq!(admitted(&o, 100, t0 + 31 * T), 100);
    }

    #[test]
    fn an_apply_lag_shrinks_admission_like_slow_commits() {
        let t0 = Instant::now();
        let o = Overload::new(T, t0);
        o.observe_term(5, t0);
        // The term's first window: what the election held back is applied now, no sample.
        for _ in 0..50 {
            o.observe(T / 10, t0);
            o.observe_apply_lag(APPLY_LAG_ENTRIES * 4, t0 + T / 2);
        }
        assert_eq!(o.share(t0 + T), 1.0);
        // Fast commits, but the node is far behind the log: the share halves.
        for _ in 0..50 {
            o.observe(T / 10, t0 + T);
            o.observe_apply_lag(APPLY_LAG_ENTRIES * 4, t0 + T);
        }
        assert_eq!(o.share(t0 + 2 * T), 0.5);
        // A few entries behind is normal: it recovers.
        for _ in 0..50 {
            o.observe_apply_lag(3, t0 + 2 * T);
        }
        assert!((o.share(t0 + 3 * T) - 0.6).abs() < 1e-9);
        // Off (threshold zero): lag changes nothing.
        let off = Overload::new(Duration::ZERO, t0);
        off.observe_apply_lag(u64::MAX, t0);
        assert_eq!(off.share(t0 + T), 1.0);
    }

    #[test]
    fn a_lowered_share_says_which_samples_were_slow_and_the_return_to_all_is_told_once() {
        let t0 = Instant::now();
        let o = Overload::new(T, t0);
        assert_eq!(o.take_shift(), None);
        let t1 = t0 + T; // past the first window, where apply lag is no sample
        assert_eq!(o.share(t1), 1.0);
        assert_eq!(o.take_shift(), None, "a window at all that stays at all is not told");
        for k in 0..40 {
            o.observe(if k < 3 { T * 2 } else { T / 10 }, t1);
            o.observe_apply_lag(if k < 2 { APPLY_LAG_ENTRIES + 1 } else { 0 }, t1);
        }
        let lowered = Shift { from: 1.0, to: 0.5, samples: 80, slow_commits: 3, lagging: 2 };
        assert_eq!(o.share(t1 + T), 0.5);
        assert_eq!(o.take_shift(), Some(lowered));
        assert_eq!(o.take_shift(), None, "taken once");
        // Recovering windows are not told until everything is admitted again.
        o.observe(T / 10, t1 + T);
        assert!((o.share(t1 + 2 * T) - 0.6).abs() < 1e-9);
        assert_eq!(o.take_shift(), None);
        assert_eq!(o.share(t1 + 6 * T), 1.0);
        let back = o.take_shift().expect("back to all");
        assert_eq!((back.to, back.samples), (1.0, 0));
        assert!(back.from < 1.0);
        assert_eq!(o.share(t1 + 9 * T), 1.0);
        assert_eq!(o.take_shift(), None);
    }

    #[test]
    fn a_p99_within_the_threshold_changes_nothing_and_zero_turns_it_off() {
        let t0 = Instant::now();
        let o = Overload::new(T, t0);
        for k in 0..200 {
            o.observe(if k == 0 { T * 2 } else { T / 2 }, t0); // 0.5 % slow
        }
        assert_eq!(o.share(t0 + T), 1.0);
        let off = Overload::new(Duration::ZERO, t0);
        off.observe(Duration::from_secs(60), t0);
        assert_eq!(admitted(&off, 10, t0 + Duration::from_secs(1)), 10);
    }
}
