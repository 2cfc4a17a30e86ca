//! How long the store's write in progress has gone without progress ([`StoreWrites`]): the Raft
//! log's writer marks each of its operations, and the state machine each apply (and each entry
//! applied) and each sync. A write that does not end (a disk that stopped answering: an
//! `fdatasync` that hangs, a network volume's I/O pause) holds no error to report, so the fence
//! loop reads the longest such wait instead (`node::lifecycle::fence_loop`, on a runtime no store
//! write can hold). Exported at each scrape as `gateway_store_write_seconds{part}` (0 when none
//! runs).

use std::fmt::Error as FmtError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::PartLabel;

/// A part of the store whose writes are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The Raft log's writer thread: appends (one `fdatasync` each group), truncations, purges,
    /// vote saves.
    Log,
    /// The state machine: applies of committed entries, and the syncs that make them durable.
    State,
}

impl Part {
    pub fn name(self) -> &'static str {
        match self {
            Part::Log => "log",
            Part::State => "state",
        }
    }
}

const PARTS: [Part; 2] = [Part::Log, Part::State];

/// A store write without progress for `lease / STALL_LEASE_DIVISOR` is a stall
/// ([`StoreWrites::stalled`]).
pub const STALL_LEASE_DIVISOR: u32 = 4;

/// When each part's write in progress began or last made progress (microseconds after `epoch`,
/// plus one; 0 when none runs). Each part runs one write at a time: the log's on its writer
/// thread, the state's in openraft's state machine task.
#[derive(Debug)]
pub struct StoreWrites {
    epoch: Instant,
    began: [AtomicU64; 2],
    /// The fence loop's verdict ([`StoreWrites::mark_stalled`]).
    stalled: AtomicBool,
}

impl Default for StoreWrites {
    fn default() -> Self {
        StoreWrites { epoch: Instant::now(), began: Default::default(), stalled: AtomicBool::new(false) }
    }
}

impl StoreWrites {
    /// Marks a write of `part` as running until the returned guard drops.
    pub fn begin(self: &Arc<Self>, part: Part) -> Running {
        let running = Running { writes: self.clone(), part };
        running.progress();
        running
    }

    /// How long `part`'s write in progress has gone without progress, if one runs.
    pub fn running(&self, part: Part) -> Option<Duration> {
        match self.began[part as usize].load(Ordering::Relaxed) {
            0 => None,
            since => Some(self.epoch.elapsed().saturating_sub(Duration::from_micros(since - 1))),
        }
    }

    /// The write in progress that has gone longest without progress, with its part, when that
    /// is a quarter of `lease` or more: a stall, as the fence loop judges it.
    pub fn stalled(&self, lease: Duration) -> Option<(Part, Duration)> {
        self.oldest().filter(|&(_, waited)| waited >= lease / STALL_LEASE_DIVISOR)
    }

    /// The fence loop's verdict: while it holds, the node is fenced, answers the leader's probes
    /// `503` (so that it is suspected and its devices are placed elsewhere) and does not renew its
    /// lease (a renewal would make a suspect live again).
    pub fn mark_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::Relaxed);
    }

    pub fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// The write in progress that has gone longest without progress, with its part.
    pub fn oldest(&self) -> Option<(Part, Duration)> {
        PARTS.iter().filter_map(|&p| self.running(p).map(|d| (p, d))).max_by_key(|&(_, d)| d)
    }
}

/// A write in progress; it ends when this drops.
pub struct Running {
    writes: Arc<StoreWrites>,
    part: Part,
}

impl Running {
    /// The write moved on (an entry applied): the wait counts from now.
    pub fn progress(&self) {
        let w = &self.writes;
        let now = u64::try_from(w.epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1) + 1;
        w.began[self.part as usize].store(now, Ordering::Relaxed);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.writes.began[self.part as usize].store(0, Ordering::Relaxed);
    }
}

/// `gateway_store_write_seconds{part}`, read at each scrape.
#[derive(Debug)]
pub struct Collect(pub Arc<StoreWrites>);

impl Collector for Collect {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), FmtError> {
        let family = Family::<PartLabel, Gauge<f64, AtomicU64>>::default();
        for p in PARTS {
            let secs = self.0.running(p).map_or(0.0, |d| d.as_secs_f64());
            family.get_or_create(&PartLabel { part: p.name() }).set(secs);
        }
        let help = "Time since the store's write in progress last made progress (0 when none runs), by part";
        family.encode(encoder.encode_descriptor("store_write_seconds", help, None, family.metric_type())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_runs_until_its_guard_drops_and_the_oldest_is_reported() {
        let w = Arc::new(StoreWrites::default());
        assert_eq!(w.oldest(), None);
        let log = w.begin(Part::Log);
        std::thread::sleep(Duration::from_millis(20));
        let state = w.begin(Part::State);
        let (part, ran) = w.oldest().expect("two writes run");
        assert_eq!(part, Part::Log);
        assert!(ran >= Duration::from_millis(20), "{ran:?}");
        assert!(w.running(Part::State).unwrap() < ran);
        // Progress restarts the wait.
        log.progress();
        assert_eq!(w.oldest().map(|(p, _)| p), Some(Part::State));
        drop(log);
        assert_eq!(w.running(Part::Log), None);
        assert_eq!(w.oldest().map(|(p, _)| p), Some(Part::State));
        assert_eq!(w.stalled(Duration::from_secs(3600)), None, "far from a quarter of an hour");
        assert_eq!(w.stalled(Duration::ZERO).map(|(p, _)| p), Some(Part::State));
        drop(state);
        assert_eq!(w.oldest(), None);
    }
}
