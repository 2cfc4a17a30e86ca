//! The device side of the protocol (design §4 "Client reconnect"). For now only the pure
//! full-jitter [`backoff`] schedule; the reconnecting connection will live beside it.
//! Architecture invariant: `client` imports no server module (at most `protocol`/`codec`).

pub mod backoff;
