//! openraft's own storage conformance suite, run against the log store and the state machine.

mod common;

use coord_raft_store::storage::{LogStore, StateMachineStore, StoreOptions};
use coord_raft_store::types::{StorageError, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};

struct DataDirBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for DataDirBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, sm) = common::open_store(dir.path(), StoreOptions::default());
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    if let Err(e) = Suite::test_all(DataDirBuilder) {
        panic!("openraft storage suite failed: {e}");
    }
}
