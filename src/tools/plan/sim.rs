//! The storm simulation itself. Devices that are interchangeable (same slot, node and failure
//! count) travel as one `Group`, so jitter `none` costs per slot, not per device; full jitter
//! splits a refused group into one draw per device.

use std::time::Duration;

use super::{Admission, Jitter, PlanError, StormModel, StormReport};
use crate::client::backoff::{ceiling, Entropy, SplitMix64};

/// How far ahead of the current slot a run may schedule; bounds the calendar's memory
/// (24 bytes per slot).
const MAX_SLOTS_AHEAD: u64 = 1 << 22;

/// Token amounts are kept in thousandths, so a refill of `rate_per_s · slot_ms / 1000` tokens
/// per slot is exact in integers.
const MILLI: u64 = 1000;

#[derive(Debug, Clone, Copy)]
struct Group {
    failures: u32,
    node: u32,
    count: u32,
}

/// A ring of per-slot buckets covering every slot a retry can land in.
struct Calendar {
    slots: Vec<Vec<Group>>,
}

impl Calendar {
    fn push(&mut self, slot: u64, g: Group) {
        let len = self.slots.len() as u64;
        let v = &mut self.slots[(slot % len) as usize];
        match v.last_mut() {
            Some(last) if last.failures == g.failures && last.node == g.node => last.count += g.count,
            _ => v.push(g),
        }
    }
}

/// The server side: how many admissions a node has left in the current slot.
enum Gate {
    Buckets {
        milli_tokens: Vec<u64>,
        refilled_at: Vec<u64>,
        refill_per_slot: u64,
        full: u64,
        /// Per node, when (µs since the drop) the last token promised to a refused device comes,
        /// as `ws::admission` paces refusals.
        promised_us: Vec<f64>,
        /// µs per token.
        token_us: f64,
    },
    PerSlot {
        per_slot: u64,
        left: u64,
    },
}

impl Gate {
    fn begin_slot(&mut self) {
        if let Gate::PerSlot { per_slot, left } = self {
            *left = *per_slot;
        }
    }

    fn available(&mut self, node: u32, slot: u64) -> u64 {
        match self {
            Gate::Buckets { milli_tokens, refilled_at, refill_per_slot, full, .. } => {
                let k = node as usize;
                let elapsed = slot - refilled_at[k];
                let refill = refill_per_slot.saturating_mul(elapsed);
                milli_tokens[k] = milli_tokens[k].saturating_add(refill).min(*full);
                refilled_at[k] = slot;
                milli_tokens[k] / MILLI
            }
            Gate::PerSlot { left, .. } => *left,
        }
    }

    fn take(&mut self, node: u32, admitted: u64) {
        match self {
            Gate::Buckets { milli_tokens, .. } => milli_tokens[node as usize] -= admitted * MILLI,
            Gate::PerSlot { left, .. } => *left -= admitted,
        }
    }

    /// A paced refusal at `at_us` on `node` (whose bucket holds less than a token): the wait
    /// until the first token not yet promised, which is now promised to this device.
    fn promise(&mut self, node: u32, at_us: f64) -> Option<f64> {
        let Gate::Buckets { milli_tokens, promised_us, token_us, .. } = self else { return None };
        let k = node as usize;
        let short = (MILLI - milli_tokens[k].min(MILLI)) as f64 / MILLI as f64;
        let turn = (at_us + short * *token_us).max(promised_us[k]);
        promised_us[k] = turn + *token_us;
        Some(turn - at_us)
    }
}

/// Runs the model (see the module docs) and returns its figures.
pub fn simulate(m: &StormModel) -> Result<StormReport, PlanError> {
    let nodes = validate(m)?;
    let max_delay_ms = m.cap_ms.max(m.base_ms).max(m.retry_after_s.saturating_mul(1000)).max(longest_turn_ms(m, nodes));
    let ahead = max_delay_ms.div_ceil(m.slot_ms).max(1);
    if ahead > MAX_SLOTS_AHEAD {
        return Err(PlanError::TooManySlots {
            delay_ms: max_delay_ms,
            slot_ms: m.slot_ms,
            slots: ahead,
            max: MAX_SLOTS_AHEAD,
        });
    }
    let mut cal = Calendar { slots: vec![Vec::new(); ahead as usize + 1] };
    let mut rng = SplitMix64::new(m.seed);
    schedule_first_attempts(m, nodes, &mut cal, &mut rng);

    let mut gate = match m.admission {
        Admission::TokenBucket { milli_rate_per_s, burst, .. } => Gate::Buckets {
            milli_tokens: vec![burst.saturating_mul(MILLI); nodes as usize],
            refilled_at: vec![0; nodes as usize],
            refill_per_slot: milli_rate_per_s.saturating_mul(m.slot_ms) / 1000,
            full: burst.saturating_mul(MILLI),
            promised_us: vec![0.0; nodes as usize],
            token_us: 1e9 / milli_rate_per_s as f64,
        },
        Admission::PerSlot { per_slot } => Gate::PerSlot { per_slot, left: per_slot },
    };
    let (base, cap) = (Duration::from_millis(m.base_ms), Duration::from_millis(m.cap_ms));
    let retry_after_ms = m.retry_after_s.saturating_mul(1000);
    let n = u64::from(m.devices);
    let thresholds = [n.div_ceil(2), (n * 99).div_ceil(100), n];
    let mut reached: [Option<u64>; 3] = if n == 0 { [Some(0); 3] } else { [None; 3] };
    let mut r = StormReport {
        devices: m.devices,
        connected: 0,
        total_attempts: 0,
        refusals: 0,
        slot_ms: m.slot_ms,
        peak_attempts_per_slot: 0,
        peak_slot_at_ms: 0,
        peak_attempts_per_s: 0,
        p50_connected_ms: None,
        p99_connected_ms: None,
        all_connected_ms: None,
        last_connect_ms: None,
        simulated_ms: 0,
    };
    let last_slot = m.max_seconds.saturating_mul(1000) / m.slot_ms;
    let election_at = m.election_ms.div_ceil(m.slot_ms) * m.slot_ms;
    let (mut second, mut in_second) = (0u64, 0u64);
    let mut connected = 0u64;
    let mut slot = 0u64;
    while connected < n && slot <= last_slot {
        let at_ms = slot * m.slot_ms;
        r.simulated_ms = at_ms;
        let idx = (slot % cal.slots.len() as u64) as usize;
        let mut groups = std::mem::take(&mut cal.slots[idx]);
        if !groups.is_empty() {
            let attempts: u64 = groups.iter().map(|g| u64::from(g.count)).sum();
            r.total_attempts += attempts;
            if attempts > r.peak_attempts_per_slot {
                r.peak_attempts_per_slot = attempts;
                r.peak_slot_at_ms = at_ms;
            }
            if at_ms / 1000 != second {
                (second, in_second) = (at_ms / 1000, 0);
            }
            in_second += attempts;
            r.peak_attempts_per_s = r.peak_attempts_per_s.max(in_second);

            // Per node, most failures first; merge groups that became identical.
            groups.sort_unstable_by(|a, b| a.node.cmp(&b.node).then(b.failures.cmp(&a.failures)));
            gate.begin_slot();
            let mut i = 0;
            while i < groups.len() {
                let mut g = groups[i];
                i += 1;
                while i < groups.len() && groups[i].node == g.node && groups[i].failures == g.failures {
                    g.count += groups[i].count;
                    i += 1;
                }
                let admitted = gate.available(g.node, slot).min(u64::from(g.count));
                gate.take(g.node, admitted);
                connected += admitted;
                if admitted > 0 {
                    // Admitted during an election: connected once it ends.
                    let in_at = at_ms.max(election_at);
                    r.last_connect_ms = Some(in_at);
                    for (t, at) in thresholds.iter().zip(reached.iter_mut()) {
                        if at.is_none() && connected >= *t {
                            *at = Some(in_at);
                        }
                    }
                }
                let refused = g.count - admitted as u32;
                if refused == 0 {
                    continue;
                }
                r.refusals += u64::from(refused);
                let ceil_ms = ceiling(base, cap, g.failures).as_millis() as u64;
                let next = Group { failures: g.failures.saturating_add(1), node: g.node, count: 1 };
                let retry_slot = |delay_ms: u64| slot + delay_ms.max(retry_after_ms).div_ceil(m.slot_ms).max(1);
                match m.jitter {
                    _ if m.paced && matches!(gate, Gate::Buckets { .. }) => {
                        // Each refused device waits for the token promised to it, rounded up to
                        // the client's whole milliseconds.
                        for _ in 0..refused {
                            let wait_us = gate.promise(g.node, (at_ms * 1000) as f64).unwrap_or(0.0);
                            let wait_ms = (wait_us / 1000.0).ceil().max(1.0) as u64;
                            cal.push(slot + wait_ms.div_ceil(m.slot_ms).max(1), next);
                        }
                    }
                    Jitter::None => cal.push(retry_slot(ceil_ms), Group { count: refused, ..next }),
                    Jitter::Full => {
                        for _ in 0..refused {
                            cal.push(retry_slot(rng.uniform_inclusive(ceil_ms)), next);
                        }
                    }
                }
            }
        }
        groups.clear();
        cal.slots[idx] = groups;
        slot += 1;
    }
    r.connected = connected as u32;
    if connected > 0 {
        r.simulated_ms = r.simulated_ms.max(election_at);
    }
    [r.p50_connected_ms, r.p99_connected_ms, r.all_connected_ms] = reached;
    Ok(r)
}

/// The longest wait a paced refusal can name: a node's schedule holds at most one turn per device
/// waiting for it (a device refused again has had its earlier turn), plus the next token.
fn longest_turn_ms(m: &StormModel, nodes: u32) -> u64 {
    match m.admission {
        Admission::TokenBucket { milli_rate_per_s, .. } if m.paced => {
            let waiting = u64::from(m.devices.div_ceil(nodes)) + 2;
            waiting.saturating_mul(1_000_000).div_ceil(milli_rate_per_s)
        }
        _ => 0,
    }
}

/// Checks the model's numbers; returns the node count.
fn validate(m: &StormModel) -> Result<u32, PlanError> {
    let nonzero = |v: u64, name| if v == 0 { Err(PlanError::Zero { name }) } else { Ok(()) };
    nonzero(m.slot_ms, "slot_ms")?;
    if m.election_ms > m.max_seconds.saturating_mul(1000) {
        return Err(PlanError::ElectionPastEnd { election_ms: m.election_ms, max_seconds: m.max_seconds });
    }
    match m.admission {
        Admission::TokenBucket { milli_rate_per_s, burst, nodes } => {
            nonzero(milli_rate_per_s, "rate")?;
            nonzero(burst, "burst")?;
            nonzero(u64::from(nodes), "nodes")?;
            Ok(nodes)
        }
        Admission::PerSlot { per_slot } => nonzero(per_slot, "per_slot").map(|()| 1),
    }
}

/// Slot 0 for everyone, or each device's own draw in `[0, base_ms]`; device `i` → node `i mod nodes`.
fn schedule_first_attempts(m: &StormModel, nodes: u32, cal: &mut Calendar, rng: &mut SplitMix64) {
    if m.initial_jitter {
        for i in 0..m.devices {
            let at_ms = rng.uniform_inclusive(m.base_ms);
            cal.push(at_ms.div_ceil(m.slot_ms), Group { failures: 0, node: i % nodes, count: 1 });
        }
    } else {
        for node in 0..nodes.min(m.devices) {
            let count = m.devices / nodes + u32::from(node < m.devices % nodes);
            cal.push(0, Group { failures: 0, node, count });
        }
    }
}
