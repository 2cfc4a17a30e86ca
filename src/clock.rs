//! The wall clock, read in one place. Only the leader's reading ends up in the log (stamped into
//! time-dependent commands by the proposer); `machine` never reads a clock.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch on this node's wall clock.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
