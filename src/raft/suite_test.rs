//! openraft's storage conformance suite against the real redb-backed stores.

use openraft::testing::{StoreBuilder, Suite};

use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::types::{StorageError, TypeConfig};
use crate::store::log::LogDb;
use crate::store::state::StateDb;

struct RedbBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RedbBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = LogDb::open(dir.path()).expect("open log");
        let (state, loaded) = StateDb::open(dir.path()).expect("open state");
        let (sm, _view) = StateMachine::new(state, loaded, Default::default()).expect("restore state");
        Ok((dir, LogStore::new(log, Default::default(), Default::default()), sm))
    }
}

#[test]
fn redb_storage_passes_openraft_suite() {
    Suite::test_all(RedbBuilder).expect("openraft storage suite");
}
