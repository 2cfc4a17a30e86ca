//! openraft adapters and nothing else: the type configuration, the log store and the state-machine
//! adapter over `store`, the HTTP network client, and the RPC service the cluster listener hands
//! Raft messages to. The rules are in `machine`; the redb layout is in `store`.

pub mod log_store;
pub mod network;
pub mod rpc;
pub mod state_machine;
pub mod tail;
pub mod types;

#[cfg(test)]
mod suite_test;

use openraft::{ErrorSubject, ErrorVerb};

use crate::store::StoreError;
use types::StorageError;

/// Runs a store call on the blocking pool; a failure is a `StorageError`, fatal to the node.
async fn blocking<T, F>(subject: ErrorSubject<u64>, verb: ErrorVerb, f: F) -> Result<T, StorageError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    let err: Box<dyn std::error::Error> = match tokio::task::spawn_blocking(f).await {
        Ok(Ok(value)) => return Ok(value),
        Ok(Err(e)) => Box::new(e),
        Err(join) => Box::new(join),
    };
    Err(openraft::StorageIOError::new(subject, verb, openraft::AnyError::from_dyn(&*err, None)).into())
}
