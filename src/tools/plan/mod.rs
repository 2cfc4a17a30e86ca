//! Reconnect-storm planner (`gateway plan-storm`): a pure, seeded, discrete-time model of N
//! devices dropped at t = 0 coming back through the server's admission, for capacity planning.
//! No I/O and no clock; uses only [`crate::client::backoff`] for the client's schedule and
//! [`crate::machine::Budget::share`] for a cluster budget's split, the servers' own rule.
//!
//! # The model
//! - Time advances in slots of `slot_ms`. Every attempt time is rounded **up** to the start of
//!   a slot, and every reported time is the start of a slot, so figures are upper bounds by less
//!   than one slot.
//! - All `devices` drop at t = 0. With initial jitter each draws its first attempt uniformly in
//!   `[0, base_ms]` (integer ms); without, all attempt in slot 0.
//! - Device `i` belongs to node `i mod nodes` (round-robin), and only that node admits it.
//! - Admission, per slot:
//!   - token bucket: each node's bucket starts full with `burst` tokens and refills
//!     continuously at `rate` tokens/s, capped at `burst`. The refill is accounted in
//!     thousandths of a token at each slot (exactly for a whole rate; a fractional one, such as
//!     a cluster budget's share, loses under a thousandth of a token per slot), so fractional
//!     tokens carry over; an admission takes one whole token.
//!   - cluster budget (`--cluster-rate R --cluster-burst B`, as `gateway admission set`): the
//!     same buckets, each node at its share as the servers compute it: `R / nodes` tokens/s and
//!     `ceil(B / nodes)` (at least 1) tokens, so the cluster admits ≈ R whatever `--nodes`.
//!   - fixed capacity: at most `per_slot` admissions per slot across the cluster; unused
//!     capacity does not carry over.
//! - Within a slot, attempts are admitted most-failures-first (devices that have waited
//!   longest), until capacity runs out; the rest are refused.
//! - Unpaced, a device refused for the n-th time (n = 0 first) waits `d` ms: with jitter `none`,
//!   exactly `min(cap, base·2^n)`; with `full`, uniform in `[0, min(cap, base·2^n)]`; then
//!   `d = max(d, retry_after)`. Its next attempt falls in the first slot starting at or after
//!   `t + d`, and never in the slot that refused it.
//! - Paced refusals (`paced`, token buckets only; what `gateway serve` and the project's client
//!   do): a node refusing a device promises it the first token not yet promised to another, the
//!   next token for the first refusal and `1/rate` later for each one after it, and the device
//!   waits exactly until then (rounded up to whole ms), with no jitter. A device refused again
//!   (its token went to a first attempt) is promised a later one.
//! - Unpaced, Retry-After: `retry_after_s` whole seconds on every refusal (0 = no header), a
//!   floor under the backoff: what a client that reads only the header does. `ws::admission`
//!   sends its wait rounded up to whole seconds, at least 1.
//! - A leader's death (`election_ms`, 0 = none): no handshake completes before `election_ms`
//!   (rounded up to a slot start), because every claim waits for the new leader. Admission runs
//!   as before meanwhile (each node's bucket is its own), and a device admitted earlier is
//!   connected at that time; its claim does not time out (a server's claim waits up to
//!   `--handshake-timeout-ms`, 5 s by default, longer than a default election).
//! - The run stops when every device is connected or after `max_seconds` of simulated time.
//!
//! With jitter `none` and no initial jitter nothing is random: the seed does not matter.

mod sim;
#[cfg(test)]
mod tests;

use std::fmt::Write as _;

use serde::Serialize;

pub use sim::simulate;

/// How the cluster admits handshakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A token bucket per node: `burst` tokens, refilled at `milli_rate_per_s / 1000` tokens/s
    /// (thousandths: a cluster budget divided among the nodes is rarely a whole rate).
    TokenBucket { milli_rate_per_s: u64, burst: u64, nodes: u32 },
    /// At most `per_slot` admissions per slot across the cluster.
    PerSlot { per_slot: u64 },
}

impl Admission {
    /// `nodes` buckets, each at its share of a cluster budget of `rate_per_s` handshakes per
    /// second and `burst` (as the servers split it).
    pub fn cluster_budget(rate_per_s: f64, burst: u32, nodes: u32) -> Admission {
        let budget = crate::machine::Budget { milli_rate: (rate_per_s * 1000.0).round() as u64, burst };
        let (rate, burst) = budget.share(nodes.max(1) as usize);
        Admission::TokenBucket { milli_rate_per_s: (rate * 1000.0).round() as u64, burst: u64::from(burst), nodes }
    }
}

/// The client's retry spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Jitter {
    /// Wait exactly `min(cap, base·2^n)`.
    None,
    /// Wait uniform in `[0, min(cap, base·2^n)]`.
    Full,
}

/// Everything the simulation depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StormModel {
    pub devices: u32,
    pub admission: Admission,
    pub slot_ms: u64,
    pub base_ms: u64,
    pub cap_ms: u64,
    pub jitter: Jitter,
    pub initial_jitter: bool,
    /// The `Retry-After` floor sent with every refusal; 0 = none. Unpaced refusals only.
    pub retry_after_s: u64,
    /// Refusals name each device's turn at its node's bucket (the servers' pacing).
    pub paced: bool,
    /// No handshake completes before this (ms after the drop; a leader's election), 0 = none.
    pub election_ms: u64,
    pub seed: u64,
    pub max_seconds: u64,
}

/// The simulation's figures; times are ms since the drop, at slot resolution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StormReport {
    pub devices: u32,
    pub connected: u32,
    /// Every handshake attempt, admitted or refused.
    pub total_attempts: u64,
    pub refusals: u64,
    pub slot_ms: u64,
    /// The most attempts that fell in one slot, and the start of the first such slot.
    pub peak_attempts_per_slot: u64,
    pub peak_slot_at_ms: u64,
    /// The most attempts in one whole second `[k s, (k+1) s)`.
    pub peak_attempts_per_s: u64,
    /// When at least 50 %, 99 % and 100 % of the devices were connected (rounded up to a
    /// whole device); `None` if that was not reached within `max_seconds`.
    pub p50_connected_ms: Option<u64>,
    pub p99_connected_ms: Option<u64>,
    pub all_connected_ms: Option<u64>,
    /// The slot of the last admission (equals `all_connected_ms` when every device got in).
    pub last_connect_ms: Option<u64>,
    /// Simulated time when the run stopped.
    pub simulated_ms: u64,
}

/// A model the planner refuses to run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("{name} must be at least 1")]
    Zero { name: &'static str },
    #[error("a delay of {delay_ms} ms is {slots} slots of {slot_ms} ms, more than {max} a run can schedule ahead; use a larger --slot-ms")]
    TooManySlots { delay_ms: u64, slot_ms: u64, slots: u64, max: u64 },
    #[error("an election of {election_ms} ms does not end within the run's {max_seconds} s")]
    ElectionPastEnd { election_ms: u64, max_seconds: u64 },
}

impl StormReport {
    /// A small table for the terminal.
    pub fn render(&self) -> String {
        let t = |v: Option<u64>| v.map_or_else(|| "not reached".to_string(), fmt_ms);
        let mut out = String::new();
        let rows = [
            ("devices", self.devices.to_string()),
            ("connected", self.connected.to_string()),
            ("total attempts", self.total_attempts.to_string()),
            ("refusals", self.refusals.to_string()),
            (
                "peak attempts / slot",
                format!(
                    "{} (slot of {} ms at {})",
                    self.peak_attempts_per_slot,
                    self.slot_ms,
                    fmt_ms(self.peak_slot_at_ms)
                ),
            ),
            ("peak attempts / s", self.peak_attempts_per_s.to_string()),
            ("50 % connected at", t(self.p50_connected_ms)),
            ("99 % connected at", t(self.p99_connected_ms)),
            ("100 % connected at", t(self.all_connected_ms)),
            ("last device in at", t(self.last_connect_ms)),
            ("simulated", fmt_ms(self.simulated_ms)),
        ];
        for (k, v) in rows {
            let _ = writeln!(out, "{k:<22} {v}");
        }
        out
    }
}

fn fmt_ms(ms: u64) -> String {
    format!("{}.{:03} s", ms / 1000, ms % 1000)
}
