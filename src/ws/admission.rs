//! Admission control (V4): one token bucket per node, consulted before anything of a handshake is
//! parsed. In any window of length T it admits at most `burst + rate·T` handshakes. A refusal
//! names a time to come back, and the node's refusals are paced: the k-th device refused while
//! the bucket is empty is told the k-th token to come, `k / rate` after the next one, so the
//! refused come back at the rate the bucket admits instead of together (`retry_after_ms` in the
//! 429's body; `Retry-After` rounds it up to whole seconds, at least 1). Pure over an injected
//! `Instant`, so it reads no clock of its own.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest wait a refusal names (an hour): what a bucket that cannot refill answers.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// A rate that is not a positive number refills nothing (and refusals wait [`MAX_WAIT`]).
fn refill_rate(rate_per_s: f64) -> f64 {
    if rate_per_s > 0.0 {
        rate_per_s
    } else {
        0.0
    }
}

/// A token bucket: starts full with `burst` tokens and refills `rate` tokens per second.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_per_s: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
    /// When the last token promised to a refused client comes ([`TokenBucket::try_take_paced`]);
    /// at or before `last` when no promise is outstanding. Tokens spilled over a full bucket
    /// free no turn: they may be the tokens of clients that come late (their timers, the
    /// network, a client that reads only the whole-second `Retry-After`), and such a client
    /// still takes a token when it comes. Had the spill freed its turn for another, both would
    /// come for one token and one be refused again, and a burst of late clients would cascade.
    /// A turn nobody comes for is a token lost, and the schedule frees itself as time passes it.
    promised_until: Instant,
}

impl TokenBucket {
    /// `rate_per_s` > 0 and `burst` ≥ 1 (validated by the config).
    pub fn new(rate_per_s: f64, burst: u32, now: Instant) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket { rate_per_s: refill_rate(rate_per_s), burst, tokens: burst, last: now, promised_until: now }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate_per_s).min(self.burst);
        self.last = self.last.max(now);
    }

    /// New rate and burst from `now` on; the tokens left carry over, capped at the new burst.
    pub fn reconfigure(&mut self, rate_per_s: f64, burst: u32, now: Instant) {
        self.refill(now);
        self.rate_per_s = refill_rate(rate_per_s);
        self.burst = f64::from(burst.max(1));
        self.tokens = self.tokens.min(self.burst);
    }

    /// Takes one token, or answers how long until one is available.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        // A client back exactly when it was told finds a whole token but for the float error of
        // the refill (far below 1e-9 of a token); the debt carries over as a tiny negative balance.
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(self.wait())
        }
    }

    /// Takes one token, or promises the refused client a token of its own: the first one not
    /// yet promised to another, so a burst of refusals is told `1/rate` apart. The wait is at
    /// most `longest`, itself at most [`MAX_WAIT`] (a promise beyond it is not booked: the client
    /// is told `longest`).
    pub fn try_take_paced(&mut self, now: Instant, longest: Duration) -> Result<(), Duration> {
        let wait = match self.try_take(now) {
            Ok(()) => return Ok(()),
            Err(wait) => wait,
        };
        let Some(next) = now.checked_add(wait) else { return Err(longest) };
        let slot = next.max(self.promised_until);
        let wait = slot.saturating_duration_since(now);
        // (A bucket that cannot refill waits MAX_WAIT, at least `longest`: no promise.)
        if wait >= longest {
            return Err(longest);
        }
        self.promised_until = slot.checked_add(secs_up(1.0 / self.rate_per_s)).unwrap_or(slot);
        Err(wait)
    }

    /// Whether a refused client was promised a turn that has not come yet at `now`: the bucket
    /// is what sets the pace, and a client it lets through most likely came on its turn.
    pub fn pacing(&self, now: Instant) -> bool {
        self.promised_until > now
    }

    /// How long until the next token (after a refill).
    /// Never panics: a rate of 0 (or one too small to refill within `MAX_WAIT`) waits `MAX_WAIT`.
    fn wait(&self) -> Duration {
        secs_up(((1.0 - self.tokens) / self.rate_per_s).max(0.0))
    }
}

/// `secs` rounded up to whole nanoseconds (a turn is never early for its token), at most
/// [`MAX_WAIT`]; NaN and infinity give `MAX_WAIT`.
fn secs_up(secs: f64) -> Duration {
    let ns = (secs * 1e9).ceil();
    if ns.is_finite() && ns < MAX_WAIT.as_nanos() as f64 {
        Duration::from_nanos(ns.max(0.0) as u64)
    } else {
        MAX_WAIT
    }
}

/// The node's admission gate, shared by every handshake.
#[derive(Debug)]
pub struct Admission {
    bucket: Mutex<TokenBucket>,
    /// The most devices that can be waiting for this node: its connection limit. A refusal
    /// names no wait longer than admitting that many takes at the current rate.
    capacity: usize,
}

impl Admission {
    /// `capacity`: the node's connection limit (see [`Admission::admit`]).
    pub fn new(rate_per_s: f64, burst: u32, capacity: usize) -> Admission {
        Admission { bucket: Mutex::new(TokenBucket::new(rate_per_s, burst, Instant::now())), capacity }
    }

    /// Changes the rate and burst (a new share of the cluster budget); the tokens left carry
    /// over, capped at the new burst.
    pub fn set(&self, rate_per_s: f64, burst: u32) {
        let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        bucket.reconfigure(rate_per_s, burst, Instant::now());
    }

    /// The rate and burst in force.
    pub fn current(&self) -> (f64, u32) {
        let bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        (bucket.rate_per_s, bucket.burst as u32)
    }

    /// `Ok` to go on with the handshake, or `Err(wait)` for a 429: the token promised to this
    /// client ([`TokenBucket::try_take_paced`]). No wait is longer than admitting `capacity`
    /// devices takes at the current rate (clients that ignore their wait and retry at once each
    /// book a slot too; the bound keeps them from pushing the others' waits out without end).
    pub fn admit(&self) -> Result<(), Duration> {
        let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let longest = secs_up(self.capacity as f64 / bucket.rate_per_s).max(Duration::from_secs(1));
        bucket.try_take_paced(Instant::now(), longest)
    }

    /// Whether this node's refusals are paced right now ([`TokenBucket::pacing`]): the
    /// handshakes it admits hold turns, at the rate the operator gave it.
    pub fn pacing(&self) -> bool {
        self.bucket.lock().unwrap_or_else(|p| p.into_inner()).pacing(Instant::now())
    }
}

/// Token buckets per key (a source address, a device) in fixed memory: two rows of `width`
/// buckets, a key hashed to one bucket in each (count-min style). A key is admitted when both of
/// its buckets have a token, and takes one from each; keys that share a bucket only make each
/// other stricter, and one flooding key empties only its own two buckets, so the others (which
/// share both with it rarely: about (flooders / width)^2) are not starved. Memory: 2 × `width`
/// buckets however many keys there are.
#[derive(Debug)]
pub struct Keyed {
    rows: Mutex<Vec<TokenBucket>>,
    width: usize,
}

impl Keyed {
    /// Every key at most `burst + rate_per_s × T` in any window T.
    pub fn new(rate_per_s: f64, burst: u32, width: usize) -> Keyed {
        let now = Instant::now();
        let width = width.max(1);
        Keyed { rows: Mutex::new(vec![TokenBucket::new(rate_per_s, burst, now); 2 * width]), width }
    }

    /// `Ok`, or `Err(retry_after_secs)` when `key`'s buckets are empty.
    pub fn admit(&self, key: &[u8]) -> Result<(), u64> {
        self.admit_at(key, Instant::now()).map_err(retry_after_secs)
    }

    fn admit_at(&self, key: &[u8], now: Instant) -> Result<(), Duration> {
        let slots = [0u64, 1].map(|row| {
            let h = xxhash_rust::xxh3::xxh3_64_with_seed(key, row + 1);
            row as usize * self.width + (h % self.width as u64) as usize
        });
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        for &s in &slots {
            rows[s].refill(now);
        }
        let wait = slots.iter().map(|&s| &rows[s]).filter(|b| b.tokens < 1.0).map(TokenBucket::wait).max();
        if let Some(wait) = wait {
            return Err(wait);
        }
        for &s in &slots {
            rows[s].tokens -= 1.0;
        }
        Ok(())
    }
}

/// `Retry-After` in whole seconds: rounded up, never 0 (a client must not retry at once).
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs_f64().ceil() as u64).max(1)
}

/// The same wait in whole milliseconds for the 429's body: rounded up (a client that waits it is
/// never early for its token), never 0.
pub fn retry_after_ms(wait: Duration) -> u64 {
    u64::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn starts_full_then_refills_at_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3, t0);
        for _ in 0..3 {
            assert!(b.try_take(t0).is_ok());
        }
        let wait = b.try_take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert!(b.try_take(t0 + Duration::from_millis(99)).is_err());
        assert!(b.try_take(t0 + Duration::from_millis(100)).is_ok());
        // A long idle period refills only up to the burst.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(b.try_take(later).is_ok());
        }
        assert!(b.try_take(later).is_err());
    }

    #[test]
    fn a_bucket_that_cannot_refill_refuses_with_the_longest_wait_and_does_not_panic() {
        let t0 = Instant::now();
        for rate in [0.0, 1e-300, -1.0, f64::NAN] {
            let mut b = TokenBucket::new(rate, 1, t0);
            assert!(b.try_take(t0).is_ok());
            assert_eq!(b.try_take(t0 + Duration::from_secs(1)), Err(MAX_WAIT), "rate {rate}");
        }
    }

    #[test]
    fn keyed_buckets_limit_each_key_and_a_flooder_starves_no_other_key() {
        let t0 = Instant::now();
        let others = |k: &Keyed| (0..1000u32).filter(|i| k.admit_at(&i.to_be_bytes(), t0).is_ok()).count();
        let calm = others(&Keyed::new(1.0, 3, 4096));
        let k = Keyed::new(1.0, 3, 4096);
        for _ in 0..3 {
            assert!(k.admit_at(b"10.0.0.1", t0).is_ok());
        }
        assert_eq!(k.admit_at(b"10.0.0.1", t0), Err(Duration::from_secs(1)));
        // With 10.0.0.1 empty, 1,000 other sources fare as they do without it, but for the few
        // that share one of its two buckets.
        let flooded = others(&k);
        assert!(calm >= 990, "{calm} of 1000 sources admitted in a calm table");
        assert!(flooded + 3 >= calm, "{flooded} admitted beside the flooder, {calm} without it");
        // (The buckets were created just after t0.)
        assert!(k.admit_at(b"10.0.0.1", t0 + Duration::from_secs(2)).is_ok(), "refilled at the rate");
    }

    #[test]
    fn a_new_share_applies_from_now_and_caps_the_tokens_left() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 10, t0);
        b.reconfigure(2.0, 3, t0);
        for _ in 0..3 {
            assert!(b.try_take(t0).is_ok());
        }
        // Empty: the next token comes at the new rate (0.5 s), not the old one (0.1 s).
        assert_eq!(b.try_take(t0), Err(Duration::from_millis(500)));
        assert!(b.try_take(t0 + Duration::from_millis(500)).is_ok());
    }

    #[test]
    fn refusals_are_told_turns_one_token_apart_and_each_turn_finds_its_token() {
        let t0 = Instant::now();
        let (rate, longest) = (10.0, Duration::from_secs(60));
        let mut b = TokenBucket::new(rate, 2, t0);
        for _ in 0..2 {
            assert!(b.try_take_paced(t0, longest).is_ok());
        }
        // Five devices refused at once: the next token (0.1 s), then one token later each.
        let waits: Vec<Duration> = (0..5).map(|_| b.try_take_paced(t0, longest).unwrap_err()).collect();
        let ms: Vec<u128> = waits.iter().map(|w| w.as_micros().div_ceil(1000)).collect();
        assert_eq!(ms, [100, 200, 300, 400, 500]);
        // Each back exactly at its turn gets in; nobody is refused twice.
        for w in &waits {
            assert_eq!(b.try_take_paced(t0 + *w, longest), Ok(()), "back after {w:?}");
        }
        // Unpaced, all five would have been told the same 0.1 s, and four refused again then.
        let mut plain = TokenBucket::new(rate, 2, t0);
        let _ = (plain.try_take(t0), plain.try_take(t0));
        let told: Vec<Duration> = (0..5).map(|_| plain.try_take(t0).unwrap_err()).collect();
        assert!(told.iter().all(|w| *w == told[0]), "{told:?}");
        let again = told.iter().filter(|w| plain.try_take(t0 + **w).is_err()).count();
        assert_eq!(again, 4);
    }

    #[test]
    fn a_late_client_costs_only_itself_a_second_refusal() {
        let t0 = Instant::now();
        let longest = Duration::from_secs(60);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = TokenBucket::new(10.0, 1, t0);
        assert!(b.try_take_paced(t0, longest).is_ok());
        let turns: Vec<Duration> = (0..5).map(|_| b.try_take_paced(t0, longest).unwrap_err()).collect();
        assert_eq!(turns.iter().map(Duration::as_millis).collect::<Vec<_>>(), [100, 200, 300, 400, 500]);
        // The first comes 250 ms late, after the second's and third's turns; its token spilled.
        assert!(b.try_take_paced(at(200), longest).is_ok());
        assert!(b.try_take_paced(at(300), longest).is_ok());
        let again = b.try_take_paced(at(350), longest).unwrap_err();
        // It is told the turn after the last one promised, not one of theirs.
        assert_eq!(at(350) + again, at(600));
        for ms in [400, 500, 600] {
            assert!(b.try_take_paced(at(ms), longest).is_ok(), "the one due at {ms} ms");
        }
    }

    #[test]
    fn the_bucket_paces_from_its_first_promise_until_the_last_promised_turn_has_come() {
        let t0 = Instant::now();
        let longest = Duration::from_secs(60);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = TokenBucket::new(10.0, 1, t0);
        assert!(b.try_take_paced(t0, longest).is_ok());
        assert!(!b.pacing(t0), "a token taken is not pacing: nobody was refused");
        let turns: Vec<Duration> = (0..3).map(|_| b.try_take_paced(t0, longest).unwrap_err()).collect();
        assert_eq!(turns.iter().map(Duration::as_millis).collect::<Vec<_>>(), [100, 200, 300]);
        for ms in [100, 200, 300] {
            assert!(b.pacing(at(ms)), "turns are still to come at {ms} ms");
            assert!(b.try_take_paced(at(ms), longest).is_ok());
        }
        assert!(!b.pacing(at(400)), "every promised turn has come");
    }

    #[test]
    fn no_turn_is_further_out_than_the_longest_wait() {
        let t0 = Instant::now();
        let longest = Duration::from_secs(1);
        let mut b = TokenBucket::new(10.0, 1, t0);
        assert!(b.try_take_paced(t0, longest).is_ok());
        // Clients that retry at once (ignoring their turn) each book one: after ten, every
        // refusal is told the longest wait, and booking stops there.
        let waits: Vec<Duration> = (0..50).map(|_| b.try_take_paced(t0, longest).unwrap_err()).collect();
        assert!(waits.iter().all(|w| *w <= longest), "{waits:?}");
        assert!(waits[10..].iter().all(|w| *w == longest), "{waits:?}");
        // The node's bound: admitting its connection limit at its rate, at least 1 s.
        let a = Admission::new(100.0, 1, 500);
        assert!(a.admit().is_ok());
        let last = (0..2000).map(|_| a.admit().unwrap_err()).max().unwrap();
        assert!(last <= Duration::from_secs(5) && last > Duration::from_millis(4900), "{last:?}");
    }

    #[test]
    fn retry_after_is_whole_seconds_and_never_zero() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    proptest! {
        /// Devices refused by an empty bucket, each back at (or after, by less than the burst's
        /// worth of tokens) the turn it was told, all get in on that return.
        #[test]
        fn every_device_back_on_its_turn_is_admitted(
            rate in 1u32..5000,
            burst in 1u32..50,
            refused in 1usize..300,
            late_ns in proptest::collection::vec(0u64..1_000_000, 300),
        ) {
            let (t0, longest) = (Instant::now(), MAX_WAIT);
            let mut b = TokenBucket::new(f64::from(rate), burst, t0);
            for _ in 0..burst {
                prop_assert!(b.try_take_paced(t0, longest).is_ok());
            }
            // A device late by up to burst − 1 turns: the bucket holds its token meanwhile.
            let most_late_ns = 1e9 / f64::from(rate) * f64::from(burst - 1) * 0.99;
            let mut back: Vec<Instant> = (0..refused)
                .map(|k| {
                    let late = Duration::from_nanos((late_ns[k] as f64 / 1e6 * most_late_ns) as u64);
                    t0 + b.try_take_paced(t0, longest).unwrap_err() + late
                })
                .collect();
            back.sort();
            for (k, at) in back.iter().enumerate() {
                prop_assert!(b.try_take_paced(*at, longest).is_ok(), "device {k} of {refused} refused again at its turn");
            }
        }

        /// V4: in every window of length T the bucket admits at most burst + rate·T.
        #[test]
        fn never_admits_more_than_burst_plus_rate_times_window(
            rate in 1u32..500,
            burst in 1u32..50,
            gaps_us in proptest::collection::vec(0u64..20_000, 1..400),
            window_ms in 1u64..2_000,
        ) {
            let t0 = Instant::now();
            let mut b = TokenBucket::new(f64::from(rate), burst, t0);
            let mut now = t0;
            let mut admitted = Vec::new();
            for gap in gaps_us {
                now += Duration::from_micros(gap);
                if b.try_take(now).is_ok() {
                    admitted.push(now);
                }
            }
            let window = Duration::from_millis(window_ms);
            let limit = f64::from(burst) + f64::from(rate) * window.as_secs_f64();
            for (i, start) in admitted.iter().enumerate() {
                let in_window = admitted[i..].iter().take_while(|t| **t - *start <= window).count();
                prop_assert!(in_window as f64 <= limit + 1e-6, "{in_window} admitted in {window:?}, limit {limit}");
            }
        }
    }
}
