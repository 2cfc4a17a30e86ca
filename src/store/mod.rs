//! The files of a node's store: `log/` (the Raft log and vote, segment files: see [`log`]) and
//! `state.redb` (the applied state machine's tables, listed once in `schema`). Knows the domain's
//! value types, not openraft; callers run every function here on the blocking pool or the log's
//! writer thread.

mod held;
mod index;
pub mod kept;
pub mod log;
mod log_redb;
mod rows;
mod schema;
mod segment;
mod snapshot;
pub mod state;
mod txn;

/// Page cache of a database opened by a unit test.
#[cfg(test)]
pub const TEST_CACHE_BYTES: usize = 8 << 20;

use crate::codec::CodecError;

/// Any failure of the embedded store. Fatal to the Raft node when it reaches openraft.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    #[error("log files: {0}")]
    Io(#[from] std::io::Error),
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    #[error("{0}")]
    Corrupt(String),
    /// A file written in a layout this build does not read.
    #[error("{0}")]
    Incompatible(String),
    /// Opening the store's files at `path` failed: the path is what an operator looks at (an
    /// error such as `Is a directory` alone does not say which).
    #[error("{}: {source}", path.display())]
    Open { path: std::path::PathBuf, source: Box<StoreError> },
}

impl StoreError {
    /// A closure for `map_err` naming `path` on an I/O or redb error of opening it (the other
    /// kinds name what they found where themselves).
    pub(crate) fn opening(path: &std::path::Path) -> impl Fn(StoreError) -> StoreError + '_ {
        move |e| match e {
            StoreError::Io(_) | StoreError::Redb(_) => {
                StoreError::Open { path: path.to_path_buf(), source: Box::new(e) }
            }
            other => other,
        }
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Redb(e.into())
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

#[cfg(test)]
mod tests;
