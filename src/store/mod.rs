//! redb files and their layout: `log.redb` (Raft log + vote) and `state.redb` (the applied state
//! machine). Two files because redb allows one writer per database. Callers run every function
//! here on the blocking pool.

pub mod log;
pub mod state;
pub mod streams;

use crate::codec::CodecError;

/// Any failure of the embedded store. Fatal to the Raft node when it reaches openraft.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    #[error("{0}")]
    Corrupt(String),
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

impl StoreError {
    /// Wraps the error the way openraft expects from a storage call.
    pub fn into_raft(
        self,
        subject: openraft::ErrorSubject<u64>,
        verb: openraft::ErrorVerb,
    ) -> openraft::StorageError<u64> {
        openraft::StorageIOError::new(subject, verb, openraft::AnyError::new(&self)).into()
    }
}

#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod streams_tests;
