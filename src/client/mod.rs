//! The device side of the protocol (design §4 "Client reconnect"): the pure full-jitter
//! [`backoff`] schedule, the pure reconnect [`policy`], one handshake ([`dial`]) and the
//! reconnecting [`device`] that ties them together, reporting every decision as an event, and
//! the [`uplink`] that sends a device's `up` frames until they are acked.
//! Architecture invariant: `client` imports no server module (at most `protocol`/`codec`).

pub mod backoff;
pub mod device;
pub mod dial;
pub mod policy;
pub mod uplink;
