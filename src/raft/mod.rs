//! Raft: openraft types, the redb-backed log store and state machine, and the HTTP network client.

pub mod log_store;
pub mod network;
pub mod state_machine;
pub mod types;

#[cfg(test)]
mod suite_test;
