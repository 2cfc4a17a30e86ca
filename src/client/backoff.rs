//! Full-jitter reconnect backoff (design §4): `random(0, base)` before the first reconnect,
//! `max(random(0, min(cap, base·2^n)), Retry-After)` after the n-th refusal, reset once stable.
//! Pure: no I/O, no clock, no tokio. Randomness comes from an injected [`Entropy`] source, by
//! default a seeded [`SplitMix64`], so a schedule is reproducible from its seed.

use std::time::Duration;

/// The largest `Retry-After` [`parse_retry_after`] returns: 2^31 s (about 68 years), the
/// saturation value HTTP caches use for delta-seconds (RFC 9111 §1.2.2). Any value this large
/// still adds to an `Instant` without overflow.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(1 << 31);

/// The shortest wait a paced refusal is taken at, whatever the server says: a node that
/// answered 0 in a loop must not have its devices redial it thousands of times a second.
pub const MIN_PACED_WAIT: Duration = Duration::from_millis(1);

/// A source of uniformly distributed 64-bit words.
pub trait Entropy {
    fn next_u64(&mut self) -> u64;

    /// Uniform in `[0, max]` (both ends included). Uses the multiply-shift reduction: the bias
    /// is below `(max + 1) / 2^64`, far under anything a backoff or a model can observe.
    fn uniform_inclusive(&mut self, max: u64) -> u64 {
        let span = u128::from(max) + 1;
        ((u128::from(self.next_u64()) * span) >> 64) as u64
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, fast generator whose stream is fixed by this
/// code alone, unlike `rand`'s `StdRng`, whose algorithm may change between versions.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }
}

impl Entropy for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// `min(cap, base·2^failures)`, saturating: never overflows or panics, whatever `failures` is.
pub fn ceiling(base: Duration, cap: Duration, failures: u32) -> Duration {
    let mut d = base;
    // Once `d` reaches `cap` (or saturates at Duration::MAX) more doublings change nothing, so
    // the loop runs at most ~100 times even for failures = u32::MAX.
    for _ in 0..failures {
        if d >= cap || d.is_zero() {
            break;
        }
        d = d.saturating_mul(2);
    }
    d.min(cap)
}

/// Uniform in `[0, ceiling]` at nanosecond resolution (ceilings above ~584 years are clamped to
/// `u64::MAX` ns).
pub fn full_jitter(rng: &mut impl Entropy, ceiling: Duration) -> Duration {
    let max_ns = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.uniform_inclusive(max_ns))
}

/// One device's reconnect schedule. The caller sleeps for what each method returns.
#[derive(Debug, Clone)]
pub struct Backoff<R: Entropy = SplitMix64> {
    base: Duration,
    cap: Duration,
    failures: u32,
    rng: R,
}

impl Backoff<SplitMix64> {
    /// A schedule drawing from `SplitMix64::new(seed)`; give each device its own seed.
    pub fn new(base: Duration, cap: Duration, seed: u64) -> Backoff<SplitMix64> {
        Backoff::with_rng(base, cap, SplitMix64::new(seed))
    }
}

impl<R: Entropy> Backoff<R> {
    pub fn with_rng(base: Duration, cap: Duration, rng: R) -> Backoff<R> {
        Backoff { base, cap, failures: 0, rng }
    }

    /// The wait before the first reconnect after a drop: uniform in `[0, base]`, so a fleet
    /// dropped at once does not come back at once. Does not count as a failure.
    pub fn first_reconnect(&mut self) -> Duration {
        full_jitter(&mut self.rng, self.base)
    }

    /// The wait after a refusal (429/503, or a connect error, which passes `None`):
    /// `max(uniform[0, min(cap, base·2^n)], retry_after)` with `n` the refusals so far; then
    /// `n += 1` (saturating). `Retry-After` is a floor, never the wait itself, so clients told
    /// the same value still spread out.
    pub fn after_refusal(&mut self, retry_after: Option<Duration>) -> Duration {
        let jittered = full_jitter(&mut self.rng, ceiling(self.base, self.cap, self.failures));
        self.failures = self.failures.saturating_add(1);
        jittered.max(retry_after.unwrap_or(Duration::ZERO))
    }

    /// The wait after a refusal that named the client's turn (a paced 429): that wait, at
    /// least [`MIN_PACED_WAIT`]; counts as a refusal like [`Backoff::after_refusal`], so the
    /// backoff has grown should the next refusal not be paced.
    pub fn after_paced_refusal(&mut self, wait: Duration) -> Duration {
        self.failures = self.failures.saturating_add(1);
        wait.clamp(MIN_PACED_WAIT, MAX_RETRY_AFTER)
    }

    /// Call once a connection stayed up long enough to count as stable: the next refusal
    /// starts again from `base`.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Sets `n`: the next refusal waits as the `n`-th would.
    pub fn set_failures(&mut self, n: u32) {
        self.failures = n;
    }

    /// Refusals since the last reset (the `n` in `base·2^n`).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The jitter window of a first reconnect.
    pub fn base(&self) -> Duration {
        self.base
    }
}

/// Parses a `Retry-After` value in delta-seconds (`1*DIGIT`, surrounding blanks allowed).
/// An HTTP-date, a sign, a fraction or garbage gives `None` (the caller then relies on its own
/// backoff). Values above [`MAX_RETRY_AFTER`], including ones too long for a `u64`, saturate.
pub fn parse_retry_after(v: &str) -> Option<Duration> {
    let digits = v.trim_matches([' ', '\t']);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs = digits.parse::<u64>().unwrap_or(u64::MAX);
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_millis(1000);
    const CAP: Duration = Duration::from_millis(30_000);

    /// Entropy that always draws 0, i.e. the lowest jitter.
    struct Zero;
    impl Entropy for Zero {
        fn next_u64(&mut self) -> u64 {
            0
        }
    }

    /// Entropy that always draws the top of the range.
    struct Max;
    impl Entropy for Max {
        fn next_u64(&mut self) -> u64 {
            u64::MAX
        }
    }

    #[test]
    fn first_reconnect_is_within_base() {
        let mut b = Backoff::new(BASE, CAP, 7);
        for _ in 0..10_000 {
            assert!(b.first_reconnect() <= BASE);
        }
        assert_eq!(b.failures(), 0, "the first reconnect is not a refusal");
    }

    #[test]
    fn refusal_n_is_within_its_ceiling() {
        for seed in 0..200 {
            let mut b = Backoff::new(BASE, CAP, seed);
            for n in 0..12u32 {
                let ceil = CAP.min(BASE * 2u32.pow(n));
                assert_eq!(ceiling(BASE, CAP, n), ceil);
                let d = b.after_refusal(None);
                assert!(d <= ceil, "seed {seed} n {n}: {d:?} > {ceil:?}");
                assert_eq!(b.failures(), n + 1);
            }
        }
    }

    #[test]
    fn extreme_draws_hit_both_ends_of_the_range() {
        let mut lo = Backoff::with_rng(BASE, CAP, Zero);
        let mut hi = Backoff::with_rng(BASE, CAP, Max);
        assert_eq!(lo.first_reconnect(), Duration::ZERO);
        assert_eq!(hi.first_reconnect(), BASE);
        let his: Vec<u64> = (0..7).map(|_| hi.after_refusal(None).as_millis() as u64).collect();
        assert_eq!(his, [1000, 2000, 4000, 8000, 16_000, 30_000, 30_000]);
        assert_eq!(lo.after_refusal(None), Duration::ZERO);
    }

    #[test]
    fn retry_after_is_a_floor() {
        let floor = Duration::from_secs(2);
        let mut b = Backoff::with_rng(BASE, CAP, Zero);
        for _ in 0..20 {
            assert_eq!(b.after_refusal(Some(floor)), floor, "jitter drew 0, the floor holds");
        }
        for seed in 0..100 {
            let mut b = Backoff::new(BASE, CAP, seed);
            for _ in 0..20 {
                assert!(b.after_refusal(Some(floor)) >= floor);
            }
        }
        // A floor above the cap wins too: the server knows better than the client's cap.
        let mut b = Backoff::with_rng(BASE, CAP, Max);
        assert_eq!(b.after_refusal(Some(Duration::from_secs(60))), Duration::from_secs(60));
    }

    #[test]
    fn reset_returns_to_base() {
        let mut b = Backoff::with_rng(BASE, CAP, Max);
        for _ in 0..5 {
            b.after_refusal(None);
        }
        assert_eq!(b.failures(), 5);
        b.reset();
        assert_eq!(b.failures(), 0);
        assert_eq!(b.after_refusal(None), BASE, "the ceiling is base again");
    }

    #[test]
    fn huge_failure_counts_stay_at_the_cap() {
        let mut b = Backoff::with_rng(BASE, CAP, Max);
        for _ in 0..10_000 {
            assert!(b.after_refusal(None) <= CAP);
        }
        assert_eq!(b.after_refusal(None), CAP);
        assert_eq!(ceiling(BASE, CAP, u32::MAX), CAP);
        assert_eq!(ceiling(Duration::from_nanos(1), Duration::MAX, u32::MAX), Duration::MAX);
        assert_eq!(ceiling(Duration::MAX, Duration::MAX, 3), Duration::MAX);
        assert_eq!(ceiling(Duration::ZERO, CAP, u32::MAX), Duration::ZERO);
        // failures itself saturates instead of wrapping back to 0.
        let mut b = Backoff::with_rng(BASE, CAP, Max);
        b.failures = u32::MAX - 1;
        b.after_refusal(None);
        b.after_refusal(None);
        assert_eq!(b.failures(), u32::MAX);
        assert_eq!(b.after_refusal(None), CAP);
        // A ceiling beyond u64 nanoseconds does not panic either.
        let mut b = Backoff::with_rng(Duration::MAX, Duration::MAX, Max);
        assert_eq!(b.after_refusal(None), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn draws_are_uniform_enough() {
        // Mean of uniform[0, c] is c/2 with standard deviation c/sqrt(12); over 100k draws the
        // standard error of the mean is c·0.0009, so ±1 % of c is more than 10 standard errors.
        let draws = 100_000u32;
        let mut b = Backoff::new(BASE, CAP, 42);
        let mean = (0..draws).map(|_| b.first_reconnect().as_secs_f64()).sum::<f64>() / f64::from(draws);
        assert!((mean - 0.5).abs() < 0.01, "mean first reconnect {mean} s, expected 0.5 s");

        let mut rng = SplitMix64::new(9);
        let mut below_quarter = 0u32;
        let mut sum = 0.0;
        for _ in 0..draws {
            let d = full_jitter(&mut rng, CAP).as_secs_f64();
            sum += d;
            below_quarter += u32::from(d < 7.5);
        }
        let mean = sum / f64::from(draws);
        assert!((mean - 15.0).abs() < 0.3, "mean {mean} s, expected 15 s");
        let frac = f64::from(below_quarter) / f64::from(draws);
        assert!((frac - 0.25).abs() < 0.01, "{frac} of draws below cap/4, expected 0.25");
    }

    #[test]
    fn same_seed_same_schedule() {
        let run = |seed| {
            let mut b = Backoff::new(BASE, CAP, seed);
            (0..10).map(|_| b.after_refusal(None)).collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
        // The stream is pinned: SplitMix64's published first output for seed 0.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn parses_delta_seconds_only() {
        let s = |n| Some(Duration::from_secs(n));
        assert_eq!(parse_retry_after("2"), s(2));
        assert_eq!(parse_retry_after(" 2 "), s(2));
        assert_eq!(parse_retry_after("\t120"), s(120));
        assert_eq!(parse_retry_after("0"), s(0));
        assert_eq!(parse_retry_after("007"), s(7));
        for bad in ["", " ", "-1", "+1", "1.5", "2s", "abc", "1 2", "Wed, 21 Oct 2015 07:28:00 GMT", "٣"] {
            assert_eq!(parse_retry_after(bad), None, "{bad:?}");
        }
        assert_eq!(parse_retry_after("2147483648"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("99999999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("18446744073709551616"), Some(MAX_RETRY_AFTER), "past u64");
        assert_eq!(parse_retry_after(&"9".repeat(400)), Some(MAX_RETRY_AFTER));
    }
}
