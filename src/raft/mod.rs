//! openraft adapters and nothing else: the type configuration, the log store and the state-machine
//! adapter over `store`, the network client (HTTP, and the pipelined append stream), and the RPC service the cluster listener hands
//! Raft messages to. The rules are in `machine`; the redb layout is in `store`.

pub mod events;
pub mod log_store;
pub mod network;
mod pace;
pub mod rpc;
pub mod state_machine;
pub mod stream;
pub mod tail;
pub mod types;

#[cfg(test)]
mod suite_test;

use crate::store::StoreError;

/// Runs a store call on the blocking pool; a failure is an I/O error naming `what` (openraft
/// treats a storage error as fatal to the node).
async fn blocking<T, F>(what: &'static str, f: F) -> Result<T, std::io::Error>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(std::io::Error::other(format!("{what}: {e}"))),
        Err(join) => Err(std::io::Error::other(format!("{what}: {join}"))),
    }
}

/// Runs `f` in place when `here` (a small state apply, see `state_machine::in_place`), on the
/// blocking pool otherwise; a failure is an I/O error naming `what`, as for [`blocking`].
async fn apply_on<T, F>(here: bool, what: &'static str, f: F) -> Result<T, std::io::Error>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    if here {
        return f().map_err(|e| std::io::Error::other(format!("{what}: {e}")));
    }
    blocking(what, f).await
}
