//! The pure part of `gateway bench`: the event log the devices write, and the figures drawn from it
//! (percentiles, per-window counts, time until a fraction of devices is back). No I/O, no clock.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

/// What one device did at `t_us` (microseconds since the bench started).
#[derive(Debug, Clone, PartialEq)]
pub struct Rec {
    pub t_us: u64,
    pub device: u32,
    pub kind: Kind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// A handshake started (`Event::Dialing`).
    Dial,
    /// 101 and `hello` (`Event::Connected`); `latency_us` from the attempt's `Dialing`.
    Accept { latency_us: u64 },
    /// Any other outcome of an attempt or a connection: `"429 rate_limited"`, `"307 redirect"`,
    /// `"closed 1001"`, `"unreachable (connect)"`…
    Outcome(String),
}

impl Kind {
    /// Outcomes that are not part of a normal connect (a redirect is normal, so is a drain's goaway
    /// close during a storm; everything else counts as an error in a steady run).
    pub fn is_error(&self) -> bool {
        match self {
            Kind::Outcome(r) => !r.starts_with("307"),
            _ => false,
        }
    }
}

/// Nearest-rank percentile of a sorted slice (`q` in 0..=100); `None` when empty.
pub fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    // The epsilon keeps 99.9 % of 1000 at rank 999 despite 0.999 * 1000 = 999.0000000000001.
    let rank = ((q / 100.0) * sorted.len() as f64 - 1e-9).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Handshake latency figures in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Latency {
    pub count: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// Latency of every successful attempt in `log`.
pub fn latency(log: &[Rec]) -> Latency {
    let mut v: Vec<u64> = log
        .iter()
        .filter_map(|r| if let Kind::Accept { latency_us } = r.kind { Some(latency_us) } else { None })
        .collect();
    v.sort_unstable();
    let ms = |x: Option<u64>| x.map(|us| (us as f64 / 1000.0 * 100.0).round() / 100.0);
    Latency {
        count: v.len(),
        p50_ms: ms(percentile(&v, 50.0)),
        p99_ms: ms(percentile(&v, 99.0)),
        p999_ms: ms(percentile(&v, 99.9)),
        max_ms: ms(v.last().copied()),
    }
}

/// Counts of outcomes by reason (connects included as `"101 connected"`) among records in [from, to).
pub fn outcomes(log: &[Rec], from_us: u64, to_us: u64) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for r in log.iter().filter(|r| r.t_us >= from_us && r.t_us < to_us) {
        let key = match &r.kind {
            Kind::Dial => continue,
            Kind::Accept { .. } => "101 connected",
            Kind::Outcome(reason) => reason.as_str(),
        };
        *m.entry(key.to_string()).or_insert(0) += 1;
    }
    m
}

/// One window of a storm: `t_ms` is its start relative to the trigger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Window {
    pub t_ms: u64,
    pub attempts: u64,
    pub accepts: u64,
    /// Outcomes other than a connect or a redirect (refusals, unreachable, closes).
    pub failures: u64,
}

/// Windows of `width_us` from `from_us` up to (and including the one holding) `to_us`.
pub fn windows(log: &[Rec], from_us: u64, to_us: u64, width_us: u64) -> Vec<Window> {
    let width = width_us.max(1);
    let n = (to_us.saturating_sub(from_us) / width + 1) as usize;
    let mut w: Vec<Window> =
        (0..n).map(|k| Window { t_ms: k as u64 * width / 1000, attempts: 0, accepts: 0, failures: 0 }).collect();
    for r in log.iter().filter(|r| r.t_us >= from_us && r.t_us <= to_us) {
        let slot = &mut w[((r.t_us - from_us) / width) as usize];
        match &r.kind {
            Kind::Dial => slot.attempts += 1,
            Kind::Accept { .. } => slot.accepts += 1,
            k if k.is_error() => slot.failures += 1,
            _ => {}
        }
    }
    w
}

/// For each device of `affected`, the delay from `trigger_us` to its first connect after that
/// instant, sorted; devices not back are missing.
pub fn rehome_delays(log: &[Rec], trigger_us: u64, affected: &HashSet<u32>) -> Vec<u64> {
    let mut seen = HashSet::new();
    let mut v = Vec::new();
    for r in log.iter().filter(|r| r.t_us >= trigger_us) {
        if matches!(r.kind, Kind::Accept { .. }) && affected.contains(&r.device) && seen.insert(r.device) {
            v.push(r.t_us - trigger_us);
        }
    }
    v.sort_unstable();
    v
}

/// Devices outside `affected` that did anything at or after `trigger_us` (a close, a dial, a
/// refusal, a connect): a storm should leave them alone.
pub fn disturbed(log: &[Rec], trigger_us: u64, affected: &HashSet<u32>) -> u32 {
    let moved: HashSet<u32> =
        log.iter().filter(|r| r.t_us >= trigger_us && !affected.contains(&r.device)).map(|r| r.device).collect();
    moved.len() as u32
}

/// When `frac` (0..=1) of `total` devices were back, from sorted delays; `None` if never.
pub fn time_to_fraction(sorted_delays: &[u64], total: usize, frac: f64) -> Option<u64> {
    if total == 0 {
        return Some(0);
    }
    let k = ((frac * total as f64).ceil() as usize).max(1);
    sorted_delays.get(k - 1).copied()
}

/// The instant every device in 0..n had connected at least once (µs), if it happened.
pub fn all_connected_at(log: &[Rec], n: usize) -> Option<u64> {
    let mut seen = HashSet::new();
    for r in log {
        if matches!(r.kind, Kind::Accept { .. }) && seen.insert(r.device) && seen.len() == n {
            return Some(r.t_us);
        }
    }
    (n == 0).then_some(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t_ms: u64, device: u32, kind: Kind) -> Rec {
        Rec { t_us: t_ms * 1000, device, kind }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 50.0), Some(500));
        assert_eq!(percentile(&v, 99.0), Some(990));
        assert_eq!(percentile(&v, 99.9), Some(999));
        assert_eq!(percentile(&v, 100.0), Some(1000));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[7], 99.9), Some(7));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1, 2, 3, 4], 50.0), Some(2));
    }

    #[test]
    fn latency_in_ms_from_accepts_only() {
        let log = vec![
            rec(0, 0, Kind::Dial),
            rec(1, 0, Kind::Accept { latency_us: 1500 }),
            rec(2, 1, Kind::Accept { latency_us: 2500 }),
            rec(3, 2, Kind::Outcome("429 rate_limited".into())),
        ];
        let l = latency(&log);
        assert_eq!((l.count, l.p50_ms, l.p99_ms, l.max_ms), (2, Some(1.5), Some(2.5), Some(2.5)));
        assert_eq!(latency(&[]), Latency::default());
    }

    #[test]
    fn windows_split_by_width_and_count_kinds() {
        let log = vec![
            rec(999, 0, Kind::Dial), // before the trigger: left out
            rec(1000, 0, Kind::Dial),
            rec(1249, 1, Kind::Dial),
            rec(1250, 0, Kind::Outcome("429 rate_limited".into())),
            rec(1300, 1, Kind::Outcome("307 redirect".into())),
            rec(1600, 1, Kind::Accept { latency_us: 10 }),
        ];
        let w = windows(&log, 1_000_000, 1_600_000, 250_000);
        assert_eq!(
            w,
            vec![
                Window { t_ms: 0, attempts: 2, accepts: 0, failures: 0 },
                Window { t_ms: 250, attempts: 0, accepts: 0, failures: 1 },
                Window { t_ms: 500, attempts: 0, accepts: 1, failures: 0 },
            ]
        );
        let o = outcomes(&log, 1_000_000, u64::MAX);
        assert_eq!(o["429 rate_limited"], 1);
        assert_eq!(o["307 redirect"], 1);
        assert_eq!(o["101 connected"], 1);
    }

    #[test]
    fn rehoming_counts_first_connect_after_the_trigger_of_affected_devices() {
        let log = vec![
            rec(10, 0, Kind::Accept { latency_us: 1 }), // before
            rec(110, 0, Kind::Accept { latency_us: 1 }),
            rec(120, 5, Kind::Accept { latency_us: 1 }), // not affected
            rec(150, 1, Kind::Accept { latency_us: 1 }),
            rec(170, 0, Kind::Accept { latency_us: 1 }), // second connect: ignored
        ];
        let affected: HashSet<u32> = [0, 1, 2].into();
        let d = rehome_delays(&log, 100_000, &affected);
        assert_eq!(d, vec![10_000, 50_000]);
        assert_eq!(time_to_fraction(&d, 3, 0.5), Some(50_000));
        assert_eq!(time_to_fraction(&d, 3, 0.3), Some(10_000));
        assert_eq!(time_to_fraction(&d, 3, 1.0), None, "device 2 never came back");
        assert_eq!(time_to_fraction(&d, 0, 1.0), Some(0));
        assert_eq!(all_connected_at(&log, 2), Some(120_000));
        assert_eq!(all_connected_at(&log, 4), None);
    }

    #[test]
    fn disturbed_counts_other_devices_that_moved_after_the_trigger() {
        let log = vec![
            rec(10, 5, Kind::Outcome("closed 1006".into())),  // before the trigger
            rec(110, 0, Kind::Outcome("closed 1006".into())), // affected
            rec(120, 6, Kind::Outcome("closed 4001".into())),
            rec(130, 6, Kind::Dial),
            rec(140, 7, Kind::Dial),
        ];
        let affected: HashSet<u32> = [0].into();
        assert_eq!(disturbed(&log, 100_000, &affected), 2);
        assert_eq!(disturbed(&log, 200_000, &affected), 0);
    }
}
